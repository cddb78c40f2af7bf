//! Fused attention over the compressed cache equals plain attention over the decoded rows
//! (softmax written out here), for prefill and decode, grouped-query heads, sliding windows,
//! hot windows and sinks, and any split of the context over threads.

use kvq_attn::{attend, AttnParams};
use kvq_cache::{memory, CacheOptions, KvCache, LayerShape, LayerView, Policy};
use kvq_codec::KvSpec;
use rand::{Rng, SeedableRng};

const D: usize = 64;
const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;

/// Per-head key rows and value rows of one position.
type HeadRows = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// Decoded (position → per-head key and value rows) of a layer view.
fn decoded(view: &LayerView) -> Vec<(usize, HeadRows)> {
    let d = view.head_dim;
    let mut by_pos: std::collections::BTreeMap<usize, HeadRows> = Default::default();
    for span in &view.spans {
        for h in 0..view.kv_heads {
            let (k, v) = view.decode_span(span, h);
            for t in 0..span.tokens {
                let e = by_pos
                    .entry(span.first_pos + t)
                    .or_insert_with(|| (vec![vec![]; KV_HEADS], vec![vec![]; KV_HEADS]));
                e.0[h] = k[t * d..(t + 1) * d].to_vec();
                e.1[h] = v[t * d..(t + 1) * d].to_vec();
            }
        }
    }
    by_pos.into_iter().collect()
}

fn reference(view: &LayerView, q: &[f32], positions: &[usize], params: &AttnParams) -> Vec<f32> {
    let (rows, d) = (decoded(view), view.head_dim);
    let mut out = Vec::new();
    for (i, &pos) in positions.iter().enumerate() {
        for qh in 0..Q_HEADS {
            let kh = qh / (Q_HEADS / KV_HEADS);
            let query = &q[(i * Q_HEADS + qh) * d..][..d];
            let visible: Vec<&(usize, HeadRows)> = rows
                .iter()
                .filter(|(p, _)| *p <= pos && params.window.is_none_or(|w| pos - p < w))
                .collect();
            let scores: Vec<f64> = visible
                .iter()
                .map(|(_, (k, _))| {
                    k[kh]
                        .iter()
                        .zip(query)
                        .map(|(a, b)| f64::from(a * b))
                        .sum::<f64>()
                        * f64::from(params.scale)
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            let mut o = vec![0f64; d];
            for (s, (_, (_, v))) in scores.iter().zip(&visible) {
                for (oi, vi) in o.iter_mut().zip(&v[kh]) {
                    *oi += (s - m).exp() / z * f64::from(*vi);
                }
            }
            out.extend(o.iter().map(|&x| x as f32));
        }
    }
    out
}

fn check(spec: &str, options: CacheOptions, window: Option<usize>, ctx: usize, queries: usize) {
    check_dim(spec, D, options, window, ctx, queries);
}

/// [`check`] at `head_dim`.
fn check_dim(
    spec: &str,
    head_dim: usize,
    options: CacheOptions,
    window: Option<usize>,
    ctx: usize,
    queries: usize,
) {
    check_keys(spec, head_dim, options, window, ctx, queries, |_, _| {});
}

/// [`check_dim`] with the keys edited by `edit(keys, queries)` before they are stored (token
/// after token, `KV_HEADS × head_dim` each; queries likewise, `Q_HEADS × head_dim`).
fn check_keys(
    spec: &str,
    head_dim: usize,
    options: CacheOptions,
    window: Option<usize>,
    ctx: usize,
    queries: usize,
    edit: impl Fn(&mut [f32], &[f32]),
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(ctx as u64 + queries as u64);
    let shape = LayerShape {
        kv_heads: KV_HEADS,
        head_dim,
        window,
    };
    let cal = memory::sizing_calibration();
    let policy = Policy::uniform(KvSpec::parse(spec).unwrap(), 1);
    let mut cache =
        KvCache::new(&[shape], &policy, &[(cal.clone(), cal)], options, ctx, 1).unwrap();
    let seq = cache.add_sequence();
    let n = ctx * KV_HEADS * head_dim;
    let mut k: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let q: Vec<f32> = (0..queries * Q_HEADS * head_dim)
        .map(|_| rng.gen_range(-3.0..3.0))
        .collect();
    edit(&mut k, &q);
    let before = ctx - queries;
    let row = KV_HEADS * head_dim;
    // Appends stay within the cache's `max_append_tokens`, as a model's prefill chunks do.
    for start in (0..before).step_by(64) {
        let end = (start + 64).min(before);
        cache
            .append(
                seq,
                0,
                &k[start * row..end * row],
                &v[start * row..end * row],
                end - start,
            )
            .unwrap();
    }
    cache
        .append(seq, 0, &k[before * row..], &v[before * row..], queries)
        .unwrap();
    let positions: Vec<usize> = (before..ctx).collect();
    let params = AttnParams {
        q_heads: Q_HEADS,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window,
    };
    let view = cache.view(seq, 0).unwrap();
    let want = reference(&view, &q, &positions, &params);
    // Run once on the float kernels and once on the integer ones (where the CPU has them),
    // never concurrently with another test's switch.
    let _serial = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    // Pools of 1, 2 and 7 threads split each KV head's context into different numbers of runs
    // (up to 10 here for one query; one per query for the long prefills), whose softmax states
    // merge in a different order each time.
    for (integer, threads) in [false, true]
        .into_iter()
        .flat_map(|i| [(i, 1), (i, 2), (i, 7)])
    {
        kvq_codec::levels::set_enabled(integer);
        let mut out = vec![0f32; q.len()];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| attend(&view, &q, &positions, &params, &mut out));
        // The integer kernels round queries and weights to i8 (kvq_codec::levels, where the
        // bounds are checked exactly). Here scores move by up to ~0.01 and a weight by up to
        // 1/254 of its tile's largest (tiles of 64 rows: attention joins pages that follow
        // each other), so outputs move by up to 1.24e-2 (measured: turbo3.5 at head_dim 128
        // with a window, a handful of large weights); a masking or merging error moves them
        // by ~0.1.
        let integer_kernels =
            kvq_codec::levels::available() || kvq_codec::levels::avx2::available();
        let tolerance = if integer && integer_kernels {
            1.6e-2
        } else {
            2e-4
        };
        for (i, (a, b)) in out.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() < tolerance,
                "{spec} window {window:?} ctx {ctx} queries {queries} integer {integer} threads {threads}: element {i}: {a} vs {b}"
            );
        }
    }
    kvq_codec::levels::set_enabled(true);
}

/// Serializes the tests that switch the integer kernels (a process-wide setting).
static KERNELS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn decode_and_prefill_match_plain_attention_for_every_kind_of_codec() {
    let opts = CacheOptions {
        page_tokens: 32,
        max_append_tokens: 64,
        ..Default::default()
    };
    for spec in [
        "f16",
        "q4_0",
        "int4",
        "kivi4",
        "turbo3",
        "turbo3-prod",
        "k=q8_0,v=int2",
        "oaken",
        "fp8",
    ] {
        check(spec, opts, None, 300, 1);
        check(spec, opts, None, 200, 40);
        check(spec, opts, Some(50), 300, 1);
        check(spec, opts, Some(50), 150, 33);
    }
    // Head sizes whose runs the integer kernels read: TurboQuant's two codebooks, KIVI's
    // channel blocks of 128 tokens.
    let opts = CacheOptions {
        page_tokens: 128,
        ..opts
    };
    for spec in ["turbo3.5", "turbo2.5", "kivi2-g128"] {
        check_dim(spec, 128, opts, None, 300, 1);
        check_dim(spec, 128, opts, Some(90), 200, 17);
    }
}

#[test]
fn hot_windows_and_sinks_are_attended_in_full_precision() {
    for (hot, sinks) in [(16, 0), (0, 4), (40, 3)] {
        let opts = CacheOptions {
            page_tokens: 32,
            hot_window: hot,
            sink_tokens: sinks,
            max_append_tokens: 64,
            ..Default::default()
        };
        check("kivi2", opts, None, 257, 1);
        check("q4_0", opts, Some(70), 190, 20);
    }
}

#[test]
fn a_score_far_above_the_first_rows_raises_the_softmax_reference() {
    // Token 995 of 1000 (past the first 64 rows of the span the threads take it in): its
    // keys along the query of head 0, so that the score passes the others by ~150, far beyond
    // the headroom of the one-pass softmax (kvq_attn::softmax_step), which must raise its
    // reference instead of overflowing.
    let opts = CacheOptions {
        page_tokens: 128,
        max_append_tokens: 64,
        ..Default::default()
    };
    let (ctx, d) = (1000, D);
    let jump = |k: &mut [f32], q: &[f32]| {
        let norm = q[..d].iter().map(|x| x * x).sum::<f32>().sqrt();
        let row = &mut k[995 * KV_HEADS * d..][..d];
        for (x, &y) in row.iter_mut().zip(&q[..d]) {
            *x = y / norm * 150.0 * (d as f32).sqrt() / norm;
        }
    };
    for spec in ["f16", "q8_0"] {
        check_keys(spec, d, opts, None, ctx, 1, jump);
    }
}
