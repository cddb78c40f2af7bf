//! # kvq-eval
//!
//! Measures what a KV-cache scheme costs in quality, with the cache in the loop: every scored
//! token attends to the stored, compressed K/V.
//!
//! * [`perplexity`]: llama.cpp's `llama-perplexity` procedure — non-overlapping chunks of
//!   `ctx` tokens, the first token of each replaced by BOS, only the second half scored.

pub mod perplexity;

pub use perplexity::{perplexity, PplOptions, PplReport};
