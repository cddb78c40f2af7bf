//! The pool against its contract: exact memory accounting, faithful storage with sinks and hot
//! windows, copy-on-write forks, sliding-window release, and clean refusal when full.

use kvq_cache::{
    memory, CacheError, CacheOptions, KvCache, LayerShape, LayerView, Policy, RowSpan, SeqId,
};
use kvq_codec::{Codec, KvSpec, Role};
use rand::{Rng, SeedableRng};

fn shapes() -> Vec<LayerShape> {
    vec![
        LayerShape {
            kv_heads: 2,
            head_dim: 64,
            window: Some(24),
        },
        LayerShape {
            kv_heads: 2,
            head_dim: 64,
            window: None,
        },
    ]
}

fn cache(spec: &str, options: CacheOptions, ctx: usize, batch: usize) -> KvCache {
    let policy = Policy::uniform(KvSpec::parse(spec).unwrap(), 2);
    let cal = vec![(memory::sizing_calibration(), memory::sizing_calibration()); 2];
    KvCache::new(&shapes(), &policy, &cal, options, ctx, batch).unwrap()
}

fn rows(tokens: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..tokens * 2 * 64)
        .map(|_| rng.gen_range(-2.0..2.0))
        .collect()
}

fn append(c: &mut KvCache, seq: SeqId, tokens: usize, seed: u64) -> Result<(), CacheError> {
    for layer in 0..2 {
        c.append(
            seq,
            layer,
            &rows(tokens, seed),
            &rows(tokens, seed + 1000),
            tokens,
        )?;
    }
    Ok(())
}

/// Every stored (position, head, key row, value row), decoded.
fn decoded(view: &LayerView) -> Vec<(usize, usize, Vec<f32>, Vec<f32>)> {
    let d = view.head_dim;
    let mut out = Vec::new();
    for span in &view.spans {
        for h in 0..view.kv_heads {
            let (k, v) = view.decode_span(span, h);
            for t in 0..span.tokens {
                let row = t * d..(t + 1) * d;
                out.push((
                    span.first_pos + t,
                    h,
                    k[row.clone()].to_vec(),
                    v[row].to_vec(),
                ));
            }
        }
    }
    out.sort_by_key(|(p, h, _, _)| (*p, *h));
    out
}

#[test]
fn allocated_bytes_equal_the_memory_plan() {
    for spec in ["f16", "q4_0", "kivi2", "turbo3", "int8", "k=q8_0,v=int4"] {
        for (hot, sinks) in [(0, 0), (16, 0), (8, 4)] {
            let options = CacheOptions {
                page_tokens: 32,
                hot_window: hot,
                sink_tokens: sinks,
                max_append_tokens: 16,
                ..Default::default()
            };
            let (ctx, batch) = (100, 3);
            let mut c = cache(spec, options, ctx, batch);
            let seqs: Vec<SeqId> = (0..batch).map(|_| c.add_sequence()).collect();
            for (i, &s) in seqs.iter().enumerate() {
                for chunk in 0..ctx / 10 {
                    append(&mut c, s, 10, (i * 100 + chunk) as u64).unwrap();
                }
            }
            let policy = Policy::uniform(KvSpec::parse(spec).unwrap(), 2);
            let plan = memory::plan(&shapes(), &policy, &options, ctx, batch).unwrap();
            assert_eq!(
                c.allocated_bytes(),
                plan.bytes,
                "{spec} hot {hot} sinks {sinks}"
            );
        }
    }
}

#[test]
fn impossible_plans_are_errors_not_wrapped_numbers() {
    let policy = Policy::uniform(KvSpec::parse("q4_0").unwrap(), 2);
    let options = CacheOptions::default();
    let plan =
        |shapes: &[LayerShape], ctx, batch| memory::plan(shapes, &policy, &options, ctx, batch);
    let err = |r: Result<memory::MemoryReport, CacheError>| r.unwrap_err().to_string();
    assert!(err(plan(&shapes(), 0, 1)).contains("at least 1"));
    assert!(err(plan(&shapes(), 100, 0)).contains("at least 1"));
    // Sized without weights, a model of huge shape overflows usize rather than wrapping.
    let huge = vec![
        LayerShape {
            kv_heads: 1 << 20,
            head_dim: 1 << 12,
            window: None,
        };
        2
    ];
    assert!(err(plan(&huge, 1 << 40, 1 << 10)).contains("overflows"));
    assert!(err(plan(&shapes(), usize::MAX, 1)).contains("overflows"));
    let mut zero_window = shapes();
    zero_window[0].window = Some(0);
    assert!(err(plan(&zero_window, 100, 1)).contains("sliding window"));
    // The pool checks shapes by the same rule, before it sizes anything.
    let cal = vec![(memory::sizing_calibration(), memory::sizing_calibration()); 2];
    let built = KvCache::new(&zero_window, &policy, &cal, options, 100, 1);
    assert!(built.err().unwrap().to_string().contains("sliding window"));
    let mut zero_heads = shapes();
    zero_heads[1].kv_heads = 0;
    assert!(err(plan(&zero_heads, 100, 1)).contains("KV heads"));
    assert!(err(plan(&[], 100, 1)).contains("one layer"));
    // The largest plans that fit are still exact: twice the batch, twice the bytes.
    let one = plan(&shapes(), 1 << 20, 1).unwrap().bytes;
    assert_eq!(plan(&shapes(), 1 << 20, 2).unwrap().bytes, 2 * one);
}

#[test]
fn f32_storage_returns_every_row_exactly_with_sinks_and_hot_window() {
    let options = CacheOptions {
        page_tokens: 8,
        hot_window: 5,
        sink_tokens: 3,
        max_append_tokens: 16,
        ..Default::default()
    };
    let mut c = cache("f32", options, 64, 1);
    let s = c.add_sequence();
    let mut written_k = Vec::new();
    for (i, n) in [7usize, 1, 16, 2, 9].into_iter().enumerate() {
        let k = rows(n, i as u64);
        c.append(s, 1, &k, &rows(n, 50 + i as u64), n).unwrap();
        written_k.extend(k);
    }
    let view = c.view(s, 1).unwrap();
    assert_eq!(view.len, 35);
    let got = decoded(&view);
    assert_eq!(got.len(), 35 * 2);
    for (pos, h, k, _) in got {
        assert_eq!(
            k,
            written_k[(pos * 2 + h) * 64..][..64],
            "position {pos} head {h}"
        );
    }
    // The newest 5 tokens and the 3 sinks are not compressed; the rest is in whole pages.
    let spans: Vec<(usize, usize, bool)> = view
        .spans
        .iter()
        .map(|s| (s.first_pos, s.tokens, s.compressed()))
        .collect();
    assert_eq!(spans.first(), Some(&(0, 3, false)));
    assert!(matches!(spans.last(), Some(&(first, n, false)) if first + n == 35 && n >= 5));
}

#[test]
fn quantized_rows_stay_close_and_hot_rows_exact() {
    let options = CacheOptions {
        page_tokens: 32,
        hot_window: 4,
        ..Default::default()
    };
    let mut c = cache("q8_0", options, 64, 1);
    let s = c.add_sequence();
    let k = rows(40, 1);
    c.append(s, 1, &k, &rows(40, 2), 40).unwrap();
    for (pos, h, kr, _) in decoded(&c.view(s, 1).unwrap()) {
        let want = &k[(pos * 2 + h) * 64..][..64];
        let tol = if pos >= 36 {
            2e-3
        } else {
            2.0 / 127.0 * 0.5 + 1e-3
        };
        for (a, b) in kr.iter().zip(want) {
            assert!((a - b).abs() <= tol, "position {pos}: {a} vs {b}");
        }
    }
}

/// Codecs kept in interleaved blocks ([`kvq_codec::interleaved`]) are written a token at a
/// time: every row out of the hot window reads as its codec encodes it, in whole and partly
/// written blocks alike, and no token waits in full precision for its block.
#[test]
fn interleaved_blocks_are_written_row_by_row() {
    for spec in ["q4_0", "turbo4", "int3", "k=turbo3,v=f16"] {
        let options = CacheOptions {
            page_tokens: 32,
            ..Default::default()
        };
        let mut c = cache(spec, options, 64, 1);
        let s = c.add_sequence();
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for (i, n) in [1usize, 7, 20, 2, 9, 1].into_iter().enumerate() {
            let (k, v) = (rows(n, 10 + i as u64), rows(n, 60 + i as u64));
            c.append(s, 1, &k, &v, n).unwrap();
            keys.extend(k);
            values.extend(v);
            let view = c.view(s, 1).unwrap();
            // Interleaved where this CPU's kernels read the key codec's blocks in place.
            let key = KvSpec::parse(spec).unwrap().k;
            let plain =
                kvq_codec::build_codec(key, Role::Key, 64, &memory::sizing_calibration(), 1);
            let interleaved = kvq_codec::interleaved::read_in_place(&*plain.unwrap(), Role::Key);
            assert_eq!(view.k_codec.block_tokens() == 16, interleaved, "{spec}");
            assert!(view.spans.iter().all(|span| span.compressed()), "{spec}");
            let written = keys.len() / 128;
            assert_eq!(view.spans.iter().map(|s| s.tokens).sum::<usize>(), written);
            // Each row as the layer's codec encodes it in a whole block (after the stage's f16
            // rounding).
            let round_trip = |codec: &dyn Codec, row: &[f32]| {
                let mut out = row.to_vec();
                for codec in [view.full_codec, codec] {
                    let block: Vec<f32> = out.repeat(codec.block_tokens());
                    let mut bytes = vec![0u8; codec.block_bytes()];
                    codec.encode(&block, &mut bytes).unwrap();
                    let mut rows = vec![0f32; block.len()];
                    codec.decode(&bytes, &mut rows);
                    out.copy_from_slice(&rows[..64]);
                }
                out
            };
            for (pos, h, k, v) in decoded(&view) {
                let at = (pos * 2 + h) * 64..(pos * 2 + h + 1) * 64;
                let want_k = round_trip(view.k_codec, &keys[at.clone()]);
                let want_v = round_trip(view.v_codec, &values[at]);
                let close =
                    |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
                assert!(close(&k, &want_k), "{spec} key at {pos} of {written}");
                assert!(close(&v, &want_v), "{spec} value at {pos} of {written}");
            }
        }
    }
}

#[test]
fn forks_share_pages_and_copy_before_writing() {
    // Rows of their own, and (where the CPU has the integer kernels) interleaved blocks that
    // the fork shares half written.
    for (spec, page_tokens) in [("f32", 8), ("q4_0", 32), ("turbo3", 32)] {
        fork_case(spec, page_tokens);
    }
}

fn fork_case(spec: &str, page_tokens: usize) {
    let options = CacheOptions {
        page_tokens,
        max_append_tokens: 16,
        ..Default::default()
    };
    let mut c = cache(spec, options, 40, 2);
    let a = c.add_sequence();
    append(&mut c, a, 12, 1).unwrap();
    let before = decoded(&c.view(a, 1).unwrap());
    let used_before = c.page_usage().0;
    let b = c.fork(a).unwrap();
    assert_eq!(c.page_usage().0, used_before, "a fork shares every page");
    append(&mut c, b, 5, 2).unwrap(); // writes into the shared, half-filled page: copied first
    append(&mut c, a, 1, 3).unwrap();
    let after = decoded(&c.view(a, 1).unwrap());
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "the parent's rows are untouched by the child's writes"
    );
    let child = decoded(&c.view(b, 1).unwrap());
    assert_eq!(
        &child[..before.len()],
        &before[..],
        "the child sees the shared prefix"
    );
    assert_ne!(child[before.len()], after[before.len()]);
    c.release(a).unwrap();
    c.release(b).unwrap();
    assert_eq!(c.page_usage().0, 0, "no page leaks after both are released");
    assert!(matches!(c.release(a), Err(CacheError::UnknownSequence(_))));
}

#[test]
fn a_full_pool_refuses_cleanly_and_keeps_what_it_had() {
    let options = CacheOptions {
        page_tokens: 8,
        max_append_tokens: 16,
        ..Default::default()
    };
    let mut c = cache("q4_0", options, 32, 1);
    let s = c.add_sequence();
    append(&mut c, s, 32, 1).unwrap();
    let before = decoded(&c.view(s, 1).unwrap());
    let err = c.append(s, 1, &rows(8, 9), &rows(8, 10), 8).unwrap_err();
    assert!(matches!(err, CacheError::Full { layer: 1, .. }), "{err}");
    assert!(err.to_string().contains("KV cache full"));
    assert_eq!(c.len(s, 1).unwrap(), 32);
    assert_eq!(decoded(&c.view(s, 1).unwrap()), before);
    // Non-finite rows are refused before anything is written.
    let mut bad = rows(1, 3);
    bad[5] = f32::NAN;
    let t = c.add_sequence();
    assert!(c.append(t, 1, &bad, &rows(1, 4), 1).is_err());
    assert_eq!(c.len(t, 1).unwrap(), 0);
}

#[test]
fn sliding_window_layers_recycle_their_pages() {
    let options = CacheOptions {
        page_tokens: 8,
        max_append_tokens: 4,
        ..Default::default()
    };
    let mut c = cache("f16", options, 400, 1);
    let s = c.add_sequence();
    for i in 0..100 {
        append(&mut c, s, 4, i).unwrap();
    }
    let view = c.view(s, 0).unwrap();
    let held: usize = view.spans.iter().map(|sp| sp.tokens).sum();
    assert!(
        (24..=24 + 4 + 8).contains(&held),
        "window layer holds {held} tokens"
    );
    assert_eq!(view.spans.first().unwrap().first_pos + held, 400);
    let global: usize = c.view(s, 1).unwrap().spans.iter().map(|sp| sp.tokens).sum();
    assert_eq!(global, 400);
}

/// Checks that each span of `joined` is a run of consecutive spans of `spans` whose bytes it
/// holds, per head, back to back; returns how many spans each joined one holds.
fn runs_of(joined: &[RowSpan], spans: &[RowSpan], heads: usize) -> Vec<usize> {
    let mut rest = spans;
    joined
        .iter()
        .map(|j| {
            let n = rest
                .iter()
                .position(|s| s.first_pos >= j.first_pos + j.tokens)
                .unwrap_or(rest.len());
            let (run, after) = rest.split_at(n);
            rest = after;
            assert_eq!(run[0].first_pos, j.first_pos);
            assert_eq!(run.iter().map(|s| s.tokens).sum::<usize>(), j.tokens);
            assert!(run.iter().all(|s| s.compressed() == j.compressed()));
            for h in 0..heads {
                assert_eq!(
                    run.iter()
                        .flat_map(|s| s.keys(h))
                        .copied()
                        .collect::<Vec<_>>(),
                    j.keys(h)
                );
                assert_eq!(
                    run.iter()
                        .flat_map(|s| s.values(h))
                        .copied()
                        .collect::<Vec<_>>(),
                    j.values(h)
                );
            }
            n
        })
        .collect()
}

#[test]
fn pages_that_follow_each_other_join_into_runs() {
    let options = CacheOptions {
        page_tokens: 8,
        hot_window: 4,
        sink_tokens: 2,
        max_append_tokens: 16,
        ..Default::default()
    };
    // A sequence written alone: pages in order, joined up to the limit; the partial last
    // page joins its run, sinks and hot rows stay apart.
    let mut c = cache("q4_0", options, 128, 2);
    let a = c.add_sequence();
    for i in 0..5 {
        append(&mut c, a, 13, i).unwrap();
    }
    let view = c.view(a, 1).unwrap();
    let pages = view.spans.len() - 2;
    assert_eq!(pages, (65usize - 2 - 4).div_ceil(8));
    let joined = RowSpan::joined(&view.spans, 24);
    assert_eq!(runs_of(&joined, &view.spans, 2), [1, 3, 3, 2, 1]);
    assert_eq!(
        runs_of(&RowSpan::joined(&view.spans, 1000), &view.spans, 2),
        [1, pages, 1]
    );
    // Two sequences written in turns take pages in turns: nothing joins. A fork shares the
    // pages, and its first write copies the partial last page, which then joins nothing.
    let b = c.add_sequence();
    append(&mut c, b, 8, 7).unwrap();
    append(&mut c, a, 8, 8).unwrap();
    append(&mut c, b, 8, 9).unwrap();
    let vb = c.view(b, 1).unwrap();
    assert!(runs_of(&RowSpan::joined(&vb.spans, 1000), &vb.spans, 2)
        .iter()
        .all(|&n| n == 1));
    let f = c.fork(a).unwrap();
    append(&mut c, f, 3, 10).unwrap();
    let vf = c.view(f, 1).unwrap();
    let runs = runs_of(&RowSpan::joined(&vf.spans, 1000), &vf.spans, 2);
    assert_eq!(runs[runs.len() - 2..], [1, 1], "{runs:?}");
}
