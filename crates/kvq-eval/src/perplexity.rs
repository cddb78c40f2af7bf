//! Perplexity the way llama.cpp's `llama-perplexity` measures it.

use kvq_cache::{CacheOptions, KvCache, Policy};
use kvq_codec::Calibration;
use kvq_model::gemma3::Gemma3;
use kvq_model::ModelError;

/// Settings of a perplexity run.
#[derive(Clone, Debug)]
pub struct PplOptions {
    /// Tokens per chunk.
    pub ctx: usize,
    /// Chunks to score (at most as many as the text holds).
    pub chunks: usize,
    /// The cache's scheme per layer.
    pub policy: Policy,
    /// Per-layer (K, V) calibration.
    pub calibration: Vec<(Calibration, Calibration)>,
    /// Cache options (hot window, sinks, ...).
    pub cache: CacheOptions,
}

/// Result of a perplexity run.
#[derive(Clone, Debug, PartialEq)]
pub struct PplReport {
    /// Perplexity over all scored tokens.
    pub ppl: f64,
    /// Standard error of the perplexity (from the spread of per-token log-likelihoods).
    pub ppl_stderr: f64,
    /// Tokens scored.
    pub tokens: usize,
    /// Chunks run.
    pub chunks: usize,
    /// Negative log-likelihood of every scored token, in order.
    pub nll: Vec<f64>,
}

/// Log-softmax probability of `target` in a row of logits.
pub fn log_prob(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    f64::from(logits[target] - max) - sum.ln()
}

/// Runs the perplexity procedure over `tokens` (the tokenized text, BOS first). `on_chunk` is
/// called after each chunk with the number of chunks done and the running perplexity.
pub fn perplexity(
    model: &Gemma3,
    tokens: &[u32],
    bos: u32,
    opts: &PplOptions,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<PplReport, ModelError> {
    let ctx = opts.ctx;
    let chunks = opts.chunks.min(tokens.len() / ctx);
    let shapes = model.config.layer_shapes();
    let mut cache_opts = opts.cache;
    cache_opts.max_append_tokens = ctx;
    let mut cache = KvCache::new(&shapes, &opts.policy, &opts.calibration, cache_opts, ctx, 1)?;
    let first = ctx / 2;
    let mut nll = Vec::with_capacity(chunks * (ctx - 1 - first));
    for chunk in 0..chunks {
        let mut batch = tokens[chunk * ctx..(chunk + 1) * ctx].to_vec();
        batch[0] = bos;
        let seq = cache.add_sequence();
        let hidden = model.forward(&mut cache, seq, &batch, first);
        cache.release(seq)?;
        let logits = model.logits(&hidden?);
        let vocab = model.config.vocab;
        for j in first..ctx - 1 {
            let row = &logits[(j - first) * vocab..(j - first + 1) * vocab];
            nll.push(-log_prob(row, batch[j + 1] as usize));
        }
        let mean = nll.iter().sum::<f64>() / nll.len() as f64;
        on_chunk(chunk + 1, mean.exp());
    }
    let n = nll.len() as f64;
    let mean = nll.iter().sum::<f64>() / n;
    let var = nll.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    let ppl = mean.exp();
    Ok(PplReport {
        ppl,
        ppl_stderr: ppl * (var / n).sqrt(),
        tokens: nll.len(),
        chunks,
        nll,
    })
}
