//! # kvq-model
//!
//! Everything about the model and nothing about the cache scheme: GGUF reading ([`gguf`]),
//! quantized weight formats and their matrix products ([`quant`], [`matmul`]), the SentencePiece
//! tokenizer stored in GGUF metadata ([`tokenizer`]), and the architectures — Gemma 3 first
//! ([`gemma3`]). The model writes K/V rows to, and attends through, a cache it does not look
//! inside.

pub mod gemma3;
pub mod gguf;
pub mod matmul;
pub mod quant;
pub mod sampler;
pub mod tokenizer;

/// File name of the reference model (Gemma 3 270M, GGUF Q4_K_M).
pub const REFERENCE_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Where the reference model is expected: `$KVQ_MODEL` when set, else this workspace's
/// `models/` folder, where `scripts/setup-model.sh` puts it. The file may not exist.
pub fn reference_model_path() -> std::path::PathBuf {
    std::env::var_os("KVQ_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../models")
                .join(REFERENCE_MODEL_FILE)
        })
}

/// Errors of a forward pass.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model file is unusable.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// The cache refused a write or a read.
    #[error(transparent)]
    Cache(#[from] kvq_cache::CacheError),
    /// More tokens than the model was trained for.
    #[error("{tokens} tokens exceed the model's context length of {context_length}")]
    ContextOverflow {
        /// Tokens that would be in the sequence.
        tokens: usize,
        /// The model's limit.
        context_length: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
}
