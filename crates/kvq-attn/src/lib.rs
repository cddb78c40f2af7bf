//! # kvq-attn
//!
//! Attention over a [`LayerView`] of the compressed cache, for any number of query tokens
//! (prefill) or one (decode). Scores and the value sum are computed by the codecs' group
//! kernels on the stored bytes — at most a small L1 tile of rows is decoded at a time, nothing
//! the size of the cache. Pages that follow each other in the pool are read as one run
//! ([`RowSpan::joined`]); the kernels prefetch the bytes a few KiB ahead into L2, a share at a
//! time, while they compute. The softmax exponentials run in a vector kernel.
//! Work is split over (query, KV head, run of context) items on rayon's pool, in one parallel
//! region: each item keeps an online-softmax state, and the states of a query and KV head
//! merge pairwise as their items finish (rayon's reduce, a tree: one thread merging them all
//! after the last item made the 3- and 4-bit caches' attention 8–12% slower at 16 threads).
//!
//! Grouped-query attention is handled by scoring every query head of a group against the same
//! KV head. Causality and sliding windows are masks on positions.

use kvq_cache::{LayerView, RowSpan};
use kvq_codec::simd::Ahead;
use kvq_codec::{recycle, Codec};
use rayon::prelude::*;

/// What attention needs besides the cache and the queries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Query heads (a multiple of the view's KV heads).
    pub q_heads: usize,
    /// Factor applied to `q·k` before the softmax.
    pub scale: f32,
    /// Sliding window: a query at position `p` sees positions `> p − window`.
    pub window: Option<usize>,
}

/// Softmax state of one query head over part of the context.
struct Partial {
    max: f32,
    sum: f32,
    /// Accumulator of compressed rows, in the value codec's space.
    acc_codec: Vec<f32>,
    /// Accumulator of full-precision rows.
    acc_full: Vec<f32>,
}

impl Partial {
    fn new(acc_len: usize, head_dim: usize) -> Self {
        Self {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc_codec: vec![0.0; acc_len],
            acc_full: vec![0.0; head_dim],
        }
    }

    /// Moves the running maximum up to `max`, rescaling what was summed so far.
    fn rescale(&mut self, max: f32) {
        let factor = (self.max - max).exp();
        if factor != 1.0 {
            self.sum *= factor;
            self.acc_codec.iter_mut().for_each(|x| *x *= factor);
            self.acc_full.iter_mut().for_each(|x| *x *= factor);
        }
        self.max = max;
    }

    fn merge(&mut self, other: Partial) {
        if other.max == f32::NEG_INFINITY {
            return;
        }
        let max = self.max.max(other.max);
        let (a, b) = ((self.max - max).exp(), (other.max - max).exp());
        self.sum = self.sum * a + other.sum * b;
        for (x, y) in self.acc_codec.iter_mut().zip(&other.acc_codec) {
            *x = *x * a + y * b;
        }
        for (x, y) in self.acc_full.iter_mut().zip(&other.acc_full) {
            *x = *x * a + y * b;
        }
        self.max = max;
    }
}

/// One unit of parallel work: a KV head and a run of spans (for one query token).
struct Item {
    kv_head: usize,
    spans: std::ops::Range<usize>,
}

/// Rows `[from, to)` of a span that a query at `pos` may see, or `None`.
fn visible(span: &RowSpan, pos: usize, window: Option<usize>) -> Option<(usize, usize)> {
    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let from = lo.saturating_sub(span.first_pos);
    let to = (pos + 1).saturating_sub(span.first_pos).min(span.tokens);
    (from < to).then_some((from, to))
}

/// The largest of `xs` (−∞ for none), in a form the compiler vectorizes.
fn max_of(xs: &[f32]) -> f32 {
    let larger = |a: f32, b: f32| if b > a { b } else { a };
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = larger(*m, x);
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |a, &b| larger(a, b))
}

/// Multi-head attention of `queries` (`n × q_heads × head_dim`, token-major, at `positions`)
/// over the cached rows of `view`, written to `out` (same shape as `queries`).
pub fn attend(
    view: &LayerView,
    queries: &[f32],
    positions: &[usize],
    params: &AttnParams,
    out: &mut [f32],
) {
    let d = view.head_dim;
    let n = positions.len();
    let group = params.q_heads / view.kv_heads;
    assert!(
        group > 0 && group * view.kv_heads == params.q_heads,
        "q_heads ({}) must be a multiple of the view's kv_heads ({})",
        params.q_heads,
        view.kv_heads
    );
    assert_eq!(
        queries.len(),
        n * params.q_heads * d,
        "queries must be n × q_heads × head_dim"
    );
    assert_eq!(out.len(), queries.len());

    // Each group's context (a query token's and a KV head's) split into runs of spans, about
    // four runs per thread over all groups: finer runs were slower at 16 threads
    // (bench/results/session27/).
    let groups = n * view.kv_heads;
    let runs_wanted = (4 * rayon::current_num_threads()).div_ceil(groups.max(1));
    let spans_per_run = view.spans.len().div_ceil(runs_wanted).max(1);
    let runs = view.spans.len().div_ceil(spans_per_run).max(1);

    // One task per group (its query heads lie together in `queries` and `out`): its heads
    // prepared for the key codec (rotated, for example), its runs in parallel, their softmax
    // states merged pairwise as they finish (a tree), and the merged states finished into its
    // heads' outputs.
    let qlen = view.k_codec.query_len();
    out.par_chunks_mut(group * d)
        .zip(queries.par_chunks(group * d))
        .enumerate()
        .for_each(|(g, (out, queries))| {
            let (query, kv_head) = (g / view.kv_heads, g % view.kv_heads);
            let scaled: Vec<f32> = queries.iter().map(|x| x * params.scale).collect();
            let mut prepared = vec![0f32; group * qlen];
            view.k_codec.prepare_queries(&scaled, &mut prepared);
            let heads = Heads {
                scaled: &scaled,
                prepared: &prepared,
            };
            let states = (0..runs)
                .into_par_iter()
                .map(|r| {
                    let item = Item {
                        kv_head,
                        spans: r * spans_per_run..((r + 1) * spans_per_run).min(view.spans.len()),
                    };
                    attend_run(view, heads, positions[query], &item, params)
                })
                .reduce_with(|mut states, others| {
                    for (state, other) in states.iter_mut().zip(others) {
                        state.merge(other);
                    }
                    states
                })
                .expect("every group has at least one run");
            finish(view, &states, out);
        });
}

/// Writes each of `states`' outputs (one query head each) to its `head_dim` values of `out`:
/// the compressed rows' accumulator finished by the value codec (rotated back, for
/// TurboQuant), plus the full-precision rows', divided by the softmax sum.
fn finish(view: &LayerView, states: &[Partial], out: &mut [f32]) {
    let accs: Vec<&[f32]> = states.iter().map(|s| s.acc_codec.as_slice()).collect();
    let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(view.head_dim).collect();
    view.v_codec.finish_group(&accs, &mut outs);
    for (state, o) in states.iter().zip(outs) {
        let inv = if state.sum > 0.0 {
            1.0 / state.sum
        } else {
            0.0
        };
        for (x, f) in o.iter_mut().zip(&state.acc_full) {
            *x = (*x + f) * inv;
        }
    }
}

/// The query heads of one group: scaled by the softmax factor (for full-precision spans), and
/// prepared by the key codec (for compressed ones).
#[derive(Clone, Copy)]
struct Heads<'a> {
    /// `group × head_dim` values.
    scaled: &'a [f32],
    /// `group × query_len` values.
    prepared: &'a [f32],
}

/// Softmax states of the query heads in `heads` (one group) over the spans of `item`. Spans
/// are the outer loop and heads the inner one, so each span's bytes are read from memory once
/// and reused from cache for every head of the group; each head keeps an online softmax
/// (running maximum, rescaled sums).
fn attend_run(
    view: &LayerView,
    heads: Heads,
    pos: usize,
    item: &Item,
    params: &AttnParams,
) -> Vec<Partial> {
    let d = view.head_dim;
    let group = heads.scaled.len() / d;
    let qlen = view.k_codec.query_len();
    let mut states: Vec<Partial> = (0..group)
        .map(|_| Partial::new(view.v_codec.accumulator_len(), d))
        .collect();
    // The group's queries as the codecs take them: prepared for compressed spans, scaled only
    // for full-precision ones.
    let prepared_heads: Vec<&[f32]> = heads.prepared.chunks_exact(qlen).collect();
    let scaled_heads: Vec<&[f32]> = heads.scaled.chunks_exact(d).collect();
    let mut scores: Vec<f32> = Vec::new();
    // Per-span lists of slices, their allocations reused from span to span.
    let mut score_rows: Vec<&mut [f32]> = Vec::with_capacity(group);
    let mut weight_rows: Vec<&[f32]> = Vec::with_capacity(group);
    let mut acc_rows: Vec<&mut [f32]> = Vec::with_capacity(group);
    // Pages that follow each other in the pool are read in runs of up to `RUN_KEY_BYTES`.
    let key_row_bytes = view.k_codec.block_bytes() / view.k_codec.block_tokens();
    let spans = &RowSpan::joined(
        &view.spans[item.spans.clone()],
        (RUN_KEY_BYTES / key_row_bytes).max(1),
    );
    let codecs = |span: &RowSpan| {
        if span.compressed() {
            (view.k_codec, view.v_codec, view.block_tokens)
        } else {
            (view.full_codec, view.full_codec, 1)
        }
    };
    // The first span's leads, which no earlier kernel prefetched (2–4% at 16 threads on the
    // Xeon, bench/results/session27/lead.txt).
    if let Some(first) = spans.first() {
        let (k_codec, v_codec, _) = codecs(first);
        Ahead::new(lead(first.keys(item.kv_head), k_codec), 1).rest();
        Ahead::new(lead(first.values(item.kv_head), v_codec), 1).rest();
    }
    for (i, span) in spans.iter().enumerate() {
        // Keys load `LEAD_BYTES` before they are scored, values before they are summed,
        // the prefetches spread over the kernels' rows (the kernels leave the rest to this
        // loop): the rest of this span, then the start of the next one.
        let next = spans.get(i + 1);
        let Some((from, to)) = visible(span, pos, params.window) else {
            if let Some(next) = next {
                let (k_codec, v_codec, _) = codecs(next);
                Ahead::new(lead(next.keys(item.kv_head), k_codec), 1).rest();
                Ahead::new(lead(next.values(item.kv_head), v_codec), 1).rest();
            }
            continue;
        };
        let (k_codec, v_codec, align) = codecs(span);
        // Whole blocks of both codecs that cover the visible rows.
        let (first, last) = (from / align * align, to.div_ceil(align) * align);
        let bytes = |c: &dyn Codec| {
            first / c.block_tokens() * c.block_bytes()..last / c.block_tokens() * c.block_bytes()
        };
        let keys = &span.keys(item.kv_head)[bytes(k_codec)];
        let values = &span.values(item.kv_head)[bytes(v_codec)];
        let rows = last - first;
        scores.resize(group * rows, 0.0);
        let queries = if span.compressed() {
            &prepared_heads
        } else {
            &scaled_heads
        };
        let mut head_scores: Vec<&mut [f32]> = recycle(score_rows);
        head_scores.extend(scores.chunks_exact_mut(rows));
        let next_keys = next.map_or(&[][..], |n| lead(n.keys(item.kv_head), codecs(n).0));
        let mut ahead = Ahead::chained(&keys[lead(keys, k_codec).len()..], next_keys, rows);
        k_codec.score_group(queries, keys, &mut head_scores, &mut ahead);
        ahead.rest();
        for (state, s) in states.iter_mut().zip(head_scores.iter_mut()) {
            s[..from - first].fill(f32::NEG_INFINITY);
            s[to - first..].fill(f32::NEG_INFINITY);
            softmax_step(state, s);
        }
        score_rows = recycle(head_scores);
        let mut weights: Vec<&[f32]> = recycle(weight_rows);
        weights.extend(scores.chunks_exact(rows));
        let mut accs: Vec<&mut [f32]> = recycle(acc_rows);
        accs.extend(states.iter_mut().map(|st| {
            if span.compressed() {
                st.acc_codec.as_mut_slice()
            } else {
                st.acc_full.as_mut_slice()
            }
        }));
        let next_values = next.map_or(&[][..], |n| lead(n.values(item.kv_head), codecs(n).1));
        let mut ahead = Ahead::chained(&values[lead(values, v_codec).len()..], next_values, rows);
        v_codec.accumulate_group(&weights, values, &mut accs, &mut ahead);
        ahead.rest();
        (weight_rows, acc_rows) = (recycle(weights), recycle(accs));
    }
    states
}

/// Turns a span's scores into weights against `state`'s reference, raising it (and rescaling
/// what it holds) where needed. The reference is the running largest score or, if larger, the
/// largest of the span's first [`REFERENCE_ROWS`]; a score more than [`EXP_HEADROOM`] above it
/// raises it to the largest of the rest (rare: scores rarely jump so far within a span). One
/// pass over the scores, where finding the span's maximum first took a second one (≈5% of a
/// 3-bit cache's attention at 32K).
fn softmax_step(state: &mut Partial, s: &mut [f32]) {
    let mut reference = state.max.max(max_of(&s[..s.len().min(REFERENCE_ROWS)]));
    if reference == f32::NEG_INFINITY {
        reference = max_of(s);
    }
    if reference > state.max {
        state.rescale(reference);
    }
    let mut done = 0;
    loop {
        let (sum, n) = kvq_codec::simd::exp_shifted_below(&mut s[done..], state.max, EXP_HEADROOM);
        state.sum += sum;
        done += n;
        if done == s.len() {
            return;
        }
        let raised = max_of(&s[done..]);
        let factor = (state.max - raised).exp();
        s[..done].iter_mut().for_each(|w| *w *= factor);
        state.rescale(raised);
    }
}

/// Scores whose largest sets a span's first softmax reference.
const REFERENCE_ROWS: usize = 64;

/// How far a score may exceed the softmax reference: `e^40` keeps the weights' sums far from
/// f32's range over any context.
const EXP_HEADROOM: f32 = 40.0;

/// Key bytes per head that attention reads in one kernel call at most, from pages that follow
/// each other in the pool. Longer runs than a page of 64 tokens took 13–21% off the 3- and
/// 4-bit caches at 32K context, 2 threads (bench/results/runs/).
const RUN_KEY_BYTES: usize = 128 << 10;

/// Bytes the kernels prefetch ahead of what they read: less slowed the 4-bit caches, more
/// the f16 one (bench/results/runs/).
const LEAD_BYTES: usize = 8 << 10;

/// The first [`LEAD_BYTES`] (whole blocks) of `bytes` in `codec`, or all of them.
fn lead<'b>(bytes: &'b [u8], codec: &dyn Codec) -> &'b [u8] {
    let blocks = LEAD_BYTES.div_ceil(codec.block_bytes());
    &bytes[..(blocks * codec.block_bytes()).min(bytes.len())]
}
