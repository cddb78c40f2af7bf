//! # kvq-eval
//!
//! Measures what a KV-cache scheme costs in quality, with the cache in the loop: every scored
//! token attends to the stored, compressed K/V.
//!
//! * [`mod@perplexity`]: llama.cpp's `llama-perplexity` procedure — non-overlapping chunks of
//!   `ctx` tokens, the first token of each replaced by BOS, only the second half scored;
//!   [`perplexity_many`] runs several schemes on the same chunks and compares each scored
//!   token's distribution with a reference cache's ([`kld`]: KL divergence, top-1 agreement).
//! * [`retrieval`]: passkey retrieval in a prose haystack at chosen lengths and depths.
//! * [`compare`]: the side-by-side table of several schemes (Markdown, JSON, Pareto front);
//!   [`plot`]: its PNG plots.

/// Tokens run through the model per forward call when a chunk or prompt is prefilled
/// (llama.cpp's `n_ubatch`): sliding-window layers then hold their window and this many
/// tokens, not the whole prompt.
pub const PREFILL_TOKENS: usize = 512;

pub mod compare;
pub mod kld;
pub mod perplexity;
pub mod plot;
pub mod retrieval;

pub use perplexity::{perplexity, perplexity_many, CacheSetup, KldReport, PplOptions, PplReport};
