//! Perplexity the way llama.cpp's `llama-perplexity` measures it, optionally with KL divergence
//! and top-1 agreement against a reference cache run on the same chunks.

use crate::kld::{log_sum_exp, percentile, Reference};
use crate::PREFILL_TOKENS;
use kvq_cache::{CacheOptions, KvCache, Policy};
use kvq_codec::Calibration;
use kvq_model::gemma3::Gemma3;
use kvq_model::ModelError;
use rayon::prelude::*;

/// Rows of logits computed at a time (each row holds a whole vocabulary).
const LOGIT_ROWS: usize = 32;

/// Tokens a run over chunks of `ctx` appends to a cache at once ([`PREFILL_TOKENS`] at most):
/// what its caches are sized for.
pub fn append_tokens(ctx: usize) -> usize {
    ctx.min(PREFILL_TOKENS)
}

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

/// One cache configuration: scheme per layer, calibration and options.
#[derive(Clone, Debug)]
pub struct CacheSetup {
    /// The cache's scheme per layer.
    pub policy: Policy,
    /// Per-layer (K, V) calibration.
    pub calibration: Vec<(Calibration, Calibration)>,
    /// Cache options (hot window, sinks, ...).
    pub options: CacheOptions,
}

impl CacheSetup {
    /// A cache for one sequence of up to `ctx` tokens appended at most `append` at a time.
    pub fn build(&self, model: &Gemma3, ctx: usize, append: usize) -> Result<KvCache, ModelError> {
        let mut options = self.options;
        options.max_append_tokens = append;
        let shapes = model.config.layer_shapes();
        Ok(KvCache::new(
            &shapes,
            &self.policy,
            &self.calibration,
            options,
            ctx,
            1,
        )?)
    }

    /// Whether two setups store the same cache (so their results are identical).
    fn same_cache(&self, other: &Self) -> bool {
        self.policy == other.policy && self.options == other.options
    }
}

/// Agreement of a scheme with the reference cache over the scored tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct KldReport {
    /// Mean KL(P_ref ‖ P_scheme) in nats.
    pub kld_mean: f64,
    /// 99th percentile of the per-token KL divergence.
    pub kld_p99: f64,
    /// Largest per-token KL divergence.
    pub kld_max: f64,
    /// Share of scored tokens whose most likely next token matches the reference's.
    pub top1_agree: f64,
    /// Perplexity of the reference cache on the same tokens.
    pub ppl_reference: f64,
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
    /// Comparison with the reference cache, when one was run.
    pub kld: Option<KldReport>,
}

/// Log-softmax probability of `target` in a row of logits.
pub fn log_prob(logits: &[f32], target: usize) -> f64 {
    f64::from(logits[target]) - log_sum_exp(logits)
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
    let setup = CacheSetup {
        policy: opts.policy.clone(),
        calibration: opts.calibration.clone(),
        options: opts.cache,
    };
    let mut reports = perplexity_many(
        model,
        tokens,
        bos,
        opts.ctx,
        opts.chunks,
        None,
        &[setup],
        |done, ppl| on_chunk(done, ppl[0]),
    )?;
    Ok(reports.remove(0))
}

/// Per-scheme accumulators of [`perplexity_many`].
#[derive(Default)]
struct Scores {
    nll: Vec<f64>,
    kld: Vec<f64>,
    agree: usize,
}

/// Runs the perplexity procedure for every setup in `schemes` over the same chunks of `tokens`.
/// With a `reference`, each chunk also runs through the reference cache and every scored
/// token's distribution is compared with the reference's (KL divergence, top-1 agreement),
/// row by row, without keeping logits. `on_chunk` gets the chunks done and every scheme's
/// running perplexity.
#[allow(clippy::too_many_arguments)]
pub fn perplexity_many(
    model: &Gemma3,
    tokens: &[u32],
    bos: u32,
    ctx: usize,
    chunks: usize,
    reference: Option<&CacheSetup>,
    schemes: &[CacheSetup],
    mut on_chunk: impl FnMut(usize, &[f64]),
) -> Result<Vec<PplReport>, ModelError> {
    let chunks = chunks.min(tokens.len() / ctx);
    let vocab = model.config.vocab;
    let first = ctx / 2;
    let build = |s: &CacheSetup| s.build(model, ctx, append_tokens(ctx));
    let mut ref_cache = reference.map(build).transpose()?;
    // Schemes that store exactly what the reference stores reuse its hidden states.
    let mut caches = schemes
        .iter()
        .map(|s| match reference {
            Some(r) if r.same_cache(s) => Ok(None),
            _ => build(s).map(Some),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut scores: Vec<Scores> = schemes.iter().map(|_| Scores::default()).collect();
    let mut ref_nll = Vec::new();
    for chunk in 0..chunks {
        let mut batch = tokens[chunk * ctx..(chunk + 1) * ctx].to_vec();
        batch[0] = bos;
        // The chunk [`PREFILL_TOKENS`] at a time; the hidden states from `first` on.
        let run = |cache: &mut KvCache| -> Result<Vec<f32>, ModelError> {
            let seq = cache.add_sequence();
            let mut hidden = Vec::new();
            for start in (0..ctx).step_by(PREFILL_TOKENS) {
                let piece = &batch[start..ctx.min(start + PREFILL_TOKENS)];
                let from = first.saturating_sub(start).min(piece.len());
                match model.forward(cache, seq, piece, from) {
                    Ok(h) => hidden.extend(h),
                    Err(e) => {
                        cache.release(seq)?;
                        return Err(e);
                    }
                }
            }
            cache.release(seq)?;
            Ok(hidden)
        };
        let ref_hidden = ref_cache.as_mut().map(run).transpose()?;
        let hidden = caches
            .iter_mut()
            .map(|c| match c {
                Some(cache) => run(cache).map(Some),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let h = model.config.hidden;
        let scored = ctx - 1 - first;
        for start in (0..scored).step_by(LOGIT_ROWS) {
            let rows = LOGIT_ROWS.min(scored - start);
            let block = |hs: &[f32]| model.logits(&hs[start * h..(start + rows) * h]);
            let targets = &batch[first + start + 1..first + start + rows + 1];
            let ref_logits = ref_hidden.as_deref().map(block);
            let refs: Option<Vec<Reference>> = ref_logits
                .as_ref()
                .map(|l| l.par_chunks(vocab).map(Reference::new).collect());
            if let Some(refs) = &refs {
                ref_nll.extend(
                    refs.iter()
                        .zip(targets)
                        .map(|(r, &t)| -r.log_prob(t as usize)),
                );
            }
            for (s, hs) in scores.iter_mut().zip(&hidden) {
                let own;
                let logits = match hs {
                    Some(hs) => {
                        own = block(hs);
                        &own
                    }
                    None => ref_logits.as_ref().expect("reused setups have a reference"),
                };
                // Per row: negative log-likelihood, and KL divergence and top-1 agreement.
                let rows: Vec<(f64, Option<(f64, bool)>)> = logits
                    .par_chunks(vocab)
                    .zip(targets)
                    .enumerate()
                    .map(|(i, (row, &t))| {
                        let lse = log_sum_exp(row);
                        let cmp = refs
                            .as_ref()
                            .map(|r| (r[i].kl_divergence(row, lse), r[i].top1_agrees(row)));
                        (lse - f64::from(row[t as usize]), cmp)
                    })
                    .collect();
                for (nll, cmp) in rows {
                    s.nll.push(nll);
                    if let Some((kl, agree)) = cmp {
                        s.kld.push(kl);
                        s.agree += usize::from(agree);
                    }
                }
            }
        }
        let running: Vec<f64> = scores.iter().map(|s| mean(&s.nll).exp()).collect();
        on_chunk(chunk + 1, &running);
    }
    let ppl_reference = mean(&ref_nll).exp();
    Ok(scores
        .into_iter()
        .map(|s| {
            let n = s.nll.len() as f64;
            let m = mean(&s.nll);
            let var = s.nll.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
            let ppl = m.exp();
            let kld = reference.map(|_| KldReport {
                kld_mean: mean(&s.kld),
                kld_p99: percentile(&s.kld, 99.0),
                kld_max: s.kld.iter().copied().fold(0.0, f64::max),
                top1_agree: s.agree as f64 / s.kld.len().max(1) as f64,
                ppl_reference,
            });
            PplReport {
                ppl,
                ppl_stderr: ppl * (var / n).sqrt(),
                tokens: s.nll.len(),
                chunks,
                nll: s.nll,
                kld,
            }
        })
        .collect())
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}
