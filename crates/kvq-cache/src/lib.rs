//! # kvq-cache
//!
//! The paged, compressed KV cache that models write to and attention reads from.
//!
//! * A [`KvCache`] owns one [`pool::LayerPool`] per layer: a fixed number of pages, each page
//!   holding `page_tokens` tokens of K and V for every KV head, encoded by that layer's codecs
//!   (a [`Policy`] gives each layer its own K and V scheme). The pages live in two arenas
//!   (keys, values), head-major, so that pages with consecutive ids hold each head's rows back
//!   to back and attention reads runs of them in one go ([`RowSpan::joined`]). Where the CPU
//!   runs the integer kernels, 2–4-bit codecs are kept in their interleaved blocks of 16 rows
//!   ([`pool::cache_codec`]), written a token at a time.
//! * Each sequence has a block table per layer. The newest tokens (the *hot window*) and the
//!   first few (*sinks*) stay in 16-bit floats; older tokens are encoded into pages as soon as
//!   they leave the hot window (a whole block of them for codecs that encode blocks together,
//!   as KIVI's keys).
//! * Sliding-window layers release the pages that no future query can see.
//! * Forking a sequence shares its pages (copy-on-write: a shared page is copied before it is
//!   written).
//! * [`memory`] computes the bytes a configuration allocates, by the same rules the pool uses.
//!
//! The cache knows nothing of model weights: a model describes its layers with [`LayerShape`].

pub mod memory;
pub mod policy;
pub mod pool;

pub use memory::MemoryReport;
pub use policy::{LayerSchemes, Policy, PolicyError};
pub use pool::{CacheOptions, KvCache, LayerView, RowSpan, SeqId};

/// The cache-relevant shape of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerShape {
    /// Key/value heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Sliding-window length in tokens (`None` for global attention).
    pub window: Option<usize>,
}

impl LayerShape {
    /// An error unless the KV heads, the head size and any sliding window of layer `layer`
    /// are at least 1.
    pub fn check(&self, layer: usize) -> Result<(), CacheError> {
        if self.window == Some(0) || self.kv_heads == 0 || self.head_dim == 0 {
            return Err(CacheError::Config(format!(
                "layer {layer}: KV heads, head size and any sliding window must be at least 1 \
                 ({} heads of {} elements, window {:?})",
                self.kv_heads, self.head_dim, self.window
            )));
        }
        Ok(())
    }
}

/// Errors of the cache; none of them leaves the cache half-updated.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The pool of a layer has no free page.
    #[error("KV cache full: layer {layer} has no free page ({pages} pages of {page_tokens} tokens in use); raise the cache size or shorten the request")]
    Full {
        /// Layer index.
        layer: usize,
        /// Pages in the layer's pool.
        pages: usize,
        /// Tokens per page.
        page_tokens: usize,
    },
    /// A codec rejected a row or could not be built.
    #[error(transparent)]
    Codec(#[from] kvq_codec::CodecError),
    /// A sequence id that is not live.
    #[error("unknown sequence {0:?}")]
    UnknownSequence(SeqId),
    /// A configuration that cannot work.
    #[error("invalid cache configuration: {0}")]
    Config(String),
}
