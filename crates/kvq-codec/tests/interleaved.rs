//! Interleaved blocks ([`kvq_codec::interleaved`]) against the codecs they wrap: the same bytes
//! in another order, the same values, and the same kernel results, whole blocks or partly
//! written ones.

use kvq_codec::interleaved::{interleave, runs};
use kvq_codec::levels::{Interleaving, INTERLEAVED_ROWS};
use kvq_codec::simd::Ahead;
use kvq_codec::{build_codec, scheme_names, Calibration, Codec, Role, SchemeKind};
use rand::{Rng, SeedableRng};

/// A scheme's name, a role, a codec of it and the same codec interleaved.
type Wrapped = (String, Role, Box<dyn Codec>, Box<dyn Codec>);

/// Every scheme whose rows the integer kernels read, at every head size and role.
fn wrapped_codecs() -> Vec<Wrapped> {
    let mut all = Vec::new();
    for name in scheme_names().into_iter().filter(|n| n != "oaken") {
        let kind = SchemeKind::parse(&name).unwrap();
        for d in [64, 128, 256] {
            for role in [Role::Key, Role::Value] {
                let build = || build_codec(kind, role, d, &Calibration::default(), 9).ok();
                let (Some(plain), Some(inner)) = (build(), build()) else {
                    continue;
                };
                let wrapped = interleave(inner, role);
                let levels = plain.level_format().is_some_and(|f| f.supported())
                    || !plain.level_segments().is_empty();
                let expected = plain.block_tokens() == 1 && levels;
                assert_eq!(
                    wrapped.block_tokens() == INTERLEAVED_ROWS,
                    expected,
                    "{name} d{d} {role:?}: interleaved exactly when the kernels read its rows"
                );
                if expected {
                    all.push((name.clone(), role, plain, wrapped));
                }
            }
        }
    }
    assert!(all.len() >= 20, "only {} interleaved codecs", all.len());
    all
}

fn random_rows(rows: usize, d: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..rows * d)
        .map(|_| scale * rng.gen_range(-2.0..2.0))
        .collect()
}

/// The rows encoded one by one with `codec` (one-row blocks), row after row.
fn row_bytes(codec: &dyn Codec, rows: &[f32]) -> Vec<u8> {
    let d = codec.head_dim();
    let mut bytes = vec![0u8; rows.len() / d * codec.block_bytes()];
    for (row, out) in rows
        .chunks_exact(d)
        .zip(bytes.chunks_exact_mut(codec.block_bytes()))
    {
        codec.encode(row, out).unwrap();
    }
    bytes
}

/// The rows written into interleaved blocks one at a time, as a cache writes them.
fn written_row_by_row(codec: &dyn Codec, rows: &[f32]) -> Vec<u8> {
    let d = codec.head_dim();
    let (bt, bb) = (codec.block_tokens(), codec.block_bytes());
    let mut blocks = vec![0u8; (rows.len() / d).div_ceil(bt) * bb];
    for (t, row) in rows.chunks_exact(d).enumerate() {
        codec
            .encode_row(row, t % bt, &mut blocks[t / bt * bb..][..bb])
            .unwrap();
    }
    blocks
}

#[test]
fn blocks_are_their_rows_permuted_and_decode_the_same() {
    for (name, role, plain, wrapped) in wrapped_codecs() {
        let d = plain.head_dim();
        let ctx = format!("{name} d{d} {role:?}");
        let sources = Interleaving::bit_sources(&runs(plain.as_ref(), role).unwrap());
        // A permutation of the 16 rows' bits.
        let mut seen = vec![false; sources.len()];
        for &s in &sources {
            assert!(!seen[s as usize], "{ctx}: bit {s} of the rows held twice");
            seen[s as usize] = true;
        }
        assert_eq!(sources.len(), 8 * wrapped.block_bytes(), "{ctx}");
        assert_eq!(
            wrapped.bits_per_element(),
            plain.bits_per_element(),
            "{ctx}"
        );

        let rows = random_rows(2 * INTERLEAVED_ROWS, d, 5, 1.0);
        let plain_bytes = row_bytes(plain.as_ref(), &rows);
        let mut blocks = vec![0u8; 2 * wrapped.block_bytes()];
        for (r, b) in rows
            .chunks_exact(INTERLEAVED_ROWS * d)
            .zip(blocks.chunks_exact_mut(wrapped.block_bytes()))
        {
            wrapped.encode(r, b).unwrap();
        }
        for (block, rows_bytes) in blocks
            .chunks_exact(wrapped.block_bytes())
            .zip(plain_bytes.chunks_exact(wrapped.block_bytes()))
        {
            let bit = |bytes: &[u8], i: usize| (bytes[i / 8] >> (i % 8)) & 1;
            for (i, &s) in sources.iter().enumerate() {
                assert_eq!(bit(block, i), bit(rows_bytes, s as usize), "{ctx}: bit {i}");
            }
        }
        assert_eq!(written_row_by_row(wrapped.as_ref(), &rows), blocks, "{ctx}");

        let decode = |codec: &dyn Codec, bytes: &[u8]| {
            let per_block = codec.block_tokens() * d;
            let mut out = vec![0f32; rows.len()];
            for (b, o) in bytes
                .chunks_exact(codec.block_bytes())
                .zip(out.chunks_exact_mut(per_block))
            {
                codec.decode(b, o);
            }
            out
        };
        assert_eq!(
            decode(wrapped.as_ref(), &blocks),
            decode(plain.as_ref(), &plain_bytes),
            "{ctx}: decoded values"
        );
        let mut working = vec![0f32; rows.len() / d * wrapped.working_len()];
        let mut plain_working = working.clone();
        wrapped.decode_working(&blocks, &mut working);
        plain.decode_working(&plain_bytes, &mut plain_working);
        assert_eq!(working, plain_working, "{ctx}: working rows");
    }
}

/// Scores and sums of `heads` random queries and weights (zero from row `live` on) over the
/// first `rows` rows of `bytes` in `codec`.
fn kernel_results(
    codec: &dyn Codec,
    bytes: &[u8],
    rows: usize,
    live: usize,
    seed: u64,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let heads = 4;
    let prepared: Vec<Vec<f32>> = (0..heads)
        .map(|_| {
            let q: Vec<f32> = (0..codec.head_dim())
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let mut p = vec![0f32; codec.query_len()];
            codec.prepare_query(&q, &mut p);
            p
        })
        .collect();
    let queries: Vec<&[f32]> = prepared.iter().map(Vec::as_slice).collect();
    let mut scores = vec![vec![0f32; rows]; heads];
    let mut s_refs: Vec<&mut [f32]> = scores.iter_mut().map(Vec::as_mut_slice).collect();
    codec.score_group(&queries, bytes, &mut s_refs, &mut Ahead::none());
    let weights: Vec<Vec<f32>> = (0..heads)
        .map(|_| {
            (0..rows)
                .map(|t| {
                    if t < live {
                        rng.gen_range(0.0..1.0)
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    let w_refs: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
    let mut accs = vec![vec![0f32; codec.accumulator_len()]; heads];
    let mut a_refs: Vec<&mut [f32]> = accs.iter_mut().map(Vec::as_mut_slice).collect();
    codec.accumulate_group(&w_refs, bytes, &mut a_refs, &mut Ahead::none());
    for s in &mut scores {
        s.truncate(live);
    }
    (scores, accs)
}

fn assert_close(ctx: &str, what: &str, a: &[Vec<f32>], b: &[Vec<f32>], relative: f32) {
    for (h, (x, y)) in a.iter().zip(b).enumerate() {
        let scale = y.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        for (i, (p, q)) in x.iter().zip(y).enumerate() {
            assert!(
                (p - q).abs() <= relative * scale,
                "{ctx}: {what} head {h} [{i}]: {p} vs {q}"
            );
        }
    }
}

#[test]
fn kernels_on_blocks_equal_the_kernels_on_rows() {
    // 96 rows: a whole tile of the integer kernels, then half a tile.
    let rows_n = 6 * INTERLEAVED_ROWS;
    for (name, role, plain, wrapped) in wrapped_codecs() {
        let d = plain.head_dim();
        let ctx = format!("{name} d{d} {role:?}");
        let rows = random_rows(rows_n, d, 17, 1.0);
        let plain_bytes = row_bytes(plain.as_ref(), &rows);
        let blocks = written_row_by_row(wrapped.as_ref(), &rows);
        let on_blocks = kernel_results(wrapped.as_ref(), &blocks, rows_n, rows_n, 3);
        let on_rows = kernel_results(plain.as_ref(), &plain_bytes, rows_n, rows_n, 3);
        assert_close(&ctx, "scores", &on_blocks.0, &on_rows.0, 1e-5);
        assert_close(&ctx, "sums", &on_blocks.1, &on_rows.1, 1e-5);
    }
}

/// A partly written block (rows past the written ones hold what an earlier sequence left
/// there, here rows 1000 times larger) reads as the written rows alone: their scores, and sums
/// under zero weights for the rest that round the written rows' weights as finely.
#[test]
fn unwritten_rows_of_a_block_change_nothing() {
    let (written, rows_n) = (INTERLEAVED_ROWS + 5, 2 * INTERLEAVED_ROWS);
    for (name, role, plain, wrapped) in wrapped_codecs() {
        let d = plain.head_dim();
        let ctx = format!("{name} d{d} {role:?}");
        let mut rows = random_rows(rows_n, d, 23, 1000.0);
        rows[..written * d].copy_from_slice(&random_rows(written, d, 29, 1.0));
        let blocks = written_row_by_row(wrapped.as_ref(), &rows);
        let plain_bytes = row_bytes(plain.as_ref(), &rows[..written * d]);
        let (scores, sums) = kernel_results(wrapped.as_ref(), &blocks, rows_n, written, 4);
        let (plain_scores, plain_sums) =
            kernel_results(plain.as_ref(), &plain_bytes, written, written, 4);
        assert_close(&ctx, "scores", &scores, &plain_scores, 1e-5);
        assert_close(&ctx, "sums", &sums, &plain_sums, 1e-5);
    }
}
