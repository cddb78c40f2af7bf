//! # kvq-attn
//!
//! Attention over a [`LayerView`] of the compressed cache, for any number of query tokens
//! (prefill) or one (decode). Scores and the value sum are computed by the codecs' fused
//! kernels directly on the stored bytes — nothing is decoded into a buffer the size of the
//! cache. Work is split over (query, KV head, run of context) items on rayon's pool; each item
//! keeps an online-softmax state, and states of the same query and head are merged at the end.
//!
//! Grouped-query attention is handled by scoring every query head of a group against the same
//! KV head. Causality and sliding windows are masks on positions.

use kvq_cache::{LayerView, RowSpan};
use kvq_codec::Codec;
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

/// One unit of parallel work: a query token, a KV head, and a run of spans.
struct Item {
    query: usize,
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
    assert_eq!(
        queries.len(),
        n * params.q_heads * d,
        "queries must be n × q_heads × head_dim"
    );
    assert_eq!(out.len(), queries.len());

    // Split the context into runs of spans so that there are enough items for every thread.
    let threads = rayon::current_num_threads();
    let items_wanted = 4 * threads;
    let base_items = n * view.kv_heads;
    let splits = items_wanted
        .div_ceil(base_items)
        .clamp(1, view.spans.len().max(1));
    let per_split = view.spans.len().div_ceil(splits).max(1);
    let mut items = Vec::with_capacity(base_items * splits);
    for query in 0..n {
        for kv_head in 0..view.kv_heads {
            let mut start = 0;
            while start < view.spans.len() {
                let end = (start + per_split).min(view.spans.len());
                items.push(Item {
                    query,
                    kv_head,
                    spans: start..end,
                });
                start = end;
            }
        }
    }

    let partials: Vec<(usize, usize, Vec<Partial>)> = items
        .par_iter()
        .map(|item| {
            let heads = (0..group).map(|g| {
                let qh = item.kv_head * group + g;
                &queries[(item.query * params.q_heads + qh) * d..][..d]
            });
            let pos = positions[item.query];
            let states = heads
                .map(|q| attend_run(view, q, pos, item, params))
                .collect();
            (item.query, item.kv_head, states)
        })
        .collect();

    let mut merged: Vec<Option<Partial>> = (0..n * params.q_heads).map(|_| None).collect();
    for (query, kv_head, states) in partials {
        for (g, state) in states.into_iter().enumerate() {
            let slot = &mut merged[query * params.q_heads + kv_head * group + g];
            match slot {
                Some(acc) => acc.merge(state),
                None => *slot = Some(state),
            }
        }
    }
    for (slot, o) in merged.into_iter().zip(out.chunks_exact_mut(d)) {
        let state = slot.expect("every query head has at least one item");
        view.v_codec.finish(&state.acc_codec, o);
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

/// Softmax state of one query head over the spans of `item`.
fn attend_run(
    view: &LayerView,
    query: &[f32],
    pos: usize,
    item: &Item,
    params: &AttnParams,
) -> Partial {
    let d = view.head_dim;
    let mut state = Partial::new(view.v_codec.accumulator_len(), d);
    let scaled: Vec<f32> = query.iter().map(|x| x * params.scale).collect();
    let mut prepared = vec![0f32; view.k_codec.query_len()];
    view.k_codec.prepare_query(&scaled, &mut prepared);

    // Scores of every visible block-aligned run, then one softmax pass over them.
    let mut runs = Vec::new();
    let mut scores: Vec<f32> = Vec::new();
    for span in &view.spans[item.spans.clone()] {
        let Some((from, to)) = visible(span, pos, params.window) else {
            continue;
        };
        let (codec, q): (&dyn Codec, &[f32]) = if span.compressed() {
            (view.k_codec, &prepared)
        } else {
            (view.full_codec, &scaled)
        };
        // Whole blocks of both the key and the value codec.
        let align = if span.compressed() {
            view.flush_tokens
        } else {
            1
        };
        let (first, last) = (from / align * align, to.div_ceil(align) * align);
        let bt = codec.block_tokens();
        let keys = &span.keys(item.kv_head)
            [first / bt * codec.block_bytes()..last / bt * codec.block_bytes()];
        let at = scores.len();
        scores.resize(at + (last - first), 0.0);
        codec.score(q, keys, &mut scores[at..]);
        for (r, s) in scores[at..].iter_mut().enumerate() {
            if first + r < from || first + r >= to {
                *s = f32::NEG_INFINITY;
            }
        }
        runs.push((span, first, last, at));
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return state;
    }
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
    }
    state.max = max;
    state.sum = scores.iter().sum();
    for (span, first, last, at) in runs {
        let weights = &scores[at..at + (last - first)];
        let (codec, acc): (&dyn Codec, &mut [f32]) = if span.compressed() {
            (view.v_codec, &mut state.acc_codec)
        } else {
            (view.full_codec, &mut state.acc_full)
        };
        let bt = codec.block_tokens();
        let values = &span.values(item.kv_head)
            [first / bt * codec.block_bytes()..last / bt * codec.block_bytes()];
        codec.accumulate(weights, values, acc);
    }
    state
}
