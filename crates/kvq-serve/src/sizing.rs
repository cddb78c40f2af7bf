//! Turning a cache-memory budget into a page pool, and the page accounting that admits requests.
//!
//! **The rule.** The pool is built as `max_batch` slots of `T` tokens each, `T` the largest
//! length (at most `--max-seq-len`) for which [`memory::plan`]`(T, max_batch)` — pages plus the
//! full-precision rows reserved per sequence, exactly what `kvq memory` prints — fits in the
//! budget. The pages are shared, not tied to slots: a request of `n` tokens (prompt plus
//! `max_tokens`) reserves, in every layer, the pages [`memory::pages_per_sequence`] gives for
//! `n` tokens, and is admitted when every layer still has that many unreserved pages and fewer
//! than `max_batch` sequences run. Short requests thus pack more densely than full-length ones,
//! and a reservation is never exceeded, so the cache never runs out of pages mid-request.

use kvq_cache::memory::{self, pages_per_sequence, sizing_calibration};
use kvq_cache::pool::{cache_codec, write_tokens};
use kvq_cache::{CacheError, CacheOptions, LayerShape, Policy};
use kvq_codec::{Role, SchemeKind};

/// The pool a budget buys and the accounting of its pages.
#[derive(Clone, Debug)]
pub struct CachePlan {
    shapes: Vec<LayerShape>,
    options: CacheOptions,
    /// Tokens each layer's codecs encode at a time.
    flush_tokens: Vec<usize>,
    /// Pages of each layer's pool.
    pub layer_pages: Vec<usize>,
    /// Sequences the pool is built for (`--max-batch`).
    pub slots: usize,
    /// Tokens per slot (`T` of the rule).
    pub slot_tokens: usize,
    /// Bytes the pool allocates (`memory::plan(slot_tokens, slots).bytes`).
    pub bytes: usize,
    /// Bits per cached element of the policy at `--max-seq-len`.
    pub bits_per_element: f64,
    /// Bytes of one `--max-seq-len` sequence with a 16-bit cache over bytes with this policy.
    pub compression_ratio: f64,
}

impl CachePlan {
    /// Sizes the pool for `budget` bytes; fails when not even one sequence of `max_seq_len`
    /// tokens would fit.
    pub fn new(
        shapes: &[LayerShape],
        policy: &Policy,
        options: &CacheOptions,
        max_batch: usize,
        max_seq_len: usize,
        budget: usize,
    ) -> Result<Self, CacheError> {
        if max_batch == 0 || max_seq_len == 0 {
            return Err(CacheError::Config(
                "--max-batch and --max-seq-len must be positive".into(),
            ));
        }
        let bytes_at = |t| memory::plan(shapes, policy, options, t, max_batch).map(|r| r.bytes);
        // Largest slot length that fits: bytes grow with the length, so bisect.
        let (mut lo, mut hi) = (0usize, max_seq_len);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if bytes_at(mid)? <= budget {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let flush_tokens = shapes
            .iter()
            .zip(&policy.layers)
            .map(|(shape, s)| {
                let block = |kind: SchemeKind, role| {
                    let calibration = sizing_calibration();
                    cache_codec(kind, role, shape.head_dim, &calibration, 0, options)
                        .map(|c| write_tokens(c.as_ref()))
                };
                Ok(lcm(block(s.k, Role::Key)?, block(s.v, Role::Value)?))
            })
            .collect::<Result<Vec<_>, CacheError>>()?;
        let mut plan = Self {
            shapes: shapes.to_vec(),
            options: *options,
            flush_tokens,
            layer_pages: Vec::new(),
            slots: max_batch,
            slot_tokens: lo,
            bytes: bytes_at(lo)?,
            bits_per_element: memory::plan(shapes, policy, options, max_seq_len, 1)?
                .bits_per_element,
            compression_ratio: 0.0,
        };
        plan.layer_pages = plan.pages_for(lo).iter().map(|p| p * max_batch).collect();
        let f16 = Policy::uniform(kvq_codec::KvSpec::parse("f16")?, shapes.len());
        let f16_options = CacheOptions {
            hot_window: 0,
            sink_tokens: 0,
            ..*options
        };
        plan.compression_ratio = memory::plan(shapes, &f16, &f16_options, max_seq_len, 1)?.bytes
            as f64
            / memory::plan(shapes, policy, options, max_seq_len, 1)?.bytes as f64;
        let one = memory::plan(shapes, policy, options, max_seq_len, 1)?.bytes;
        if lo == 0 || !plan.fits(&plan.pages_for(max_seq_len), &vec![0; shapes.len()]) {
            return Err(CacheError::Config(format!(
                "--cache-memory of {budget} bytes is too small: one sequence of --max-seq-len {max_seq_len} tokens needs {one} bytes with this scheme (and {max_batch} sequences of 1 token {} bytes); raise --cache-memory or lower --max-seq-len/--max-batch",
                bytes_at(1)?
            )));
        }
        Ok(plan)
    }

    /// Pages one sequence of `tokens` tokens holds at most, per layer.
    pub fn pages_for(&self, tokens: usize) -> Vec<usize> {
        self.shapes
            .iter()
            .zip(&self.flush_tokens)
            .map(|(shape, &flush)| pages_per_sequence(shape, flush, &self.options, tokens))
            .collect()
    }

    /// Whether `need` more pages fit beside `reserved` ones in every layer.
    pub fn fits(&self, need: &[usize], reserved: &[usize]) -> bool {
        need.iter()
            .zip(reserved)
            .zip(&self.layer_pages)
            .all(|((n, r), total)| n + r <= *total)
    }
}

/// How many sequences of `ctx` tokens fit in `budget` bytes under `policy` (the accounting of
/// `kvq memory`, which is linear in the number of sequences).
pub fn sequences_that_fit(
    shapes: &[LayerShape],
    policy: &Policy,
    options: &CacheOptions,
    ctx: usize,
    budget: usize,
) -> Result<usize, CacheError> {
    let one = memory::plan(shapes, policy, options, ctx, 1)?.bytes;
    Ok(budget / one.max(1))
}

fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}
