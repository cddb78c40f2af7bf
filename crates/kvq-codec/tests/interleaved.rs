//! Interleaved blocks ([`kvq_codec::interleaved`]) against the codecs they wrap: the same bytes
//! in another order, the same values, and the same kernel results, whole blocks or partly
//! written ones; under each kernel family's layout (the AVX-512 kernels' where the CPU has
//! them, the AVX2 kernels' on any x86 CPU, [`on_every_isa`]).

use kvq_codec::interleaved::{interleave, Layout};
use kvq_codec::levels::INTERLEAVED_ROWS;
use kvq_codec::simd::{with_isa_limit, Ahead, Isa};
use kvq_codec::{build_codec, scheme_names, Calibration, Codec, Role, SchemeKind};
use rand::{Rng, SeedableRng};

/// A scheme's name, a role, a codec of it and the same codec interleaved.
type Wrapped = (String, Role, Box<dyn Codec>, Box<dyn Codec>);

/// Runs `test` under each ISA limit whose kernels lay out and read the blocks their own way:
/// the AVX-512 kernels (where the CPU has them; elsewhere this is the next) and the AVX2 ones.
fn on_every_isa(test: impl Fn(Isa)) {
    for isa in [Isa::Avx512, Isa::Avx2] {
        with_isa_limit(isa, || test(isa));
    }
}

/// Every scheme whose blocks the integer kernels read (one-row blocks with levels, keys in
/// per-channel blocks), at every head size and role.
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
                // The interleaved kernels cut 1- to 4-bit codes: 5-bit runs (q5_0, q5_1) stay
                // row by row.
                let cut = |f: &kvq_codec::levels::LevelFormat| {
                    f.supported() && (1..=4).contains(&f.code_bits())
                };
                let segments = plain.level_segments();
                let levels = plain.level_format().is_some_and(|f| cut(&f))
                    || (!segments.is_empty() && segments.iter().all(|s| cut(&s.format)));
                let rows = plain.block_tokens() == 1 && levels;
                let channel = role == Role::Key && plain.channel_blocks().is_some();
                let expected = rows || channel;
                assert_eq!(
                    Layout::of(plain.as_ref(), role).is_some(),
                    expected,
                    "{name} d{d} {role:?}: interleaved exactly when the kernels read its blocks"
                );
                // Rows go 16 to a block; per-channel blocks keep theirs.
                let tokens = if rows {
                    INTERLEAVED_ROWS
                } else {
                    plain.block_tokens()
                };
                if expected {
                    assert_eq!(wrapped.block_tokens(), tokens, "{name} d{d} {role:?}");
                    assert_eq!(wrapped.writes_rows(), rows, "{name} d{d} {role:?}");
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

/// The rows (whole blocks of `codec`) encoded block by block.
fn encoded(codec: &dyn Codec, rows: &[f32]) -> Vec<u8> {
    let per_block = codec.block_tokens() * codec.head_dim();
    let mut bytes = vec![0u8; rows.len() / per_block * codec.block_bytes()];
    for (block_rows, out) in rows
        .chunks_exact(per_block)
        .zip(bytes.chunks_exact_mut(codec.block_bytes()))
    {
        codec.encode(block_rows, out).unwrap();
    }
    bytes
}

/// The rows written into blocks as a cache writes them: one at a time where the codec writes
/// rows, else whole blocks.
fn written(codec: &dyn Codec, rows: &[f32]) -> Vec<u8> {
    if !codec.writes_rows() {
        return encoded(codec, rows);
    }
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
    on_every_isa(|isa| {
        for (name, role, plain, wrapped) in wrapped_codecs() {
            let d = plain.head_dim();
            let ctx = format!("{name} d{d} {role:?} {isa:?}");
            let sources = Layout::of(plain.as_ref(), role).unwrap().bit_sources();
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

            let rows = random_rows(2 * wrapped.block_tokens(), d, 5, 1.0);
            let plain_bytes = encoded(plain.as_ref(), &rows);
            let blocks = encoded(wrapped.as_ref(), &rows);
            for (block, rows_bytes) in blocks
                .chunks_exact(wrapped.block_bytes())
                .zip(plain_bytes.chunks_exact(wrapped.block_bytes()))
            {
                let bit = |bytes: &[u8], i: usize| (bytes[i / 8] >> (i % 8)) & 1;
                for (i, &s) in sources.iter().enumerate() {
                    assert_eq!(bit(block, i), bit(rows_bytes, s as usize), "{ctx}: bit {i}");
                }
            }
            assert_eq!(written(wrapped.as_ref(), &rows), blocks, "{ctx}");

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
    });
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
    on_every_isa(|isa| {
        for (name, role, plain, wrapped) in wrapped_codecs() {
            // 96 rows (a whole tile of the integer kernels, then half a tile), or whole blocks.
            let rows_n = (6 * INTERLEAVED_ROWS).next_multiple_of(wrapped.block_tokens());
            let d = plain.head_dim();
            let ctx = format!("{name} d{d} {role:?} {isa:?}");
            let rows = random_rows(rows_n, d, 17, 1.0);
            let plain_bytes = encoded(plain.as_ref(), &rows);
            let blocks = written(wrapped.as_ref(), &rows);
            let on_blocks = kernel_results(wrapped.as_ref(), &blocks, rows_n, rows_n, 3);
            let on_rows = kernel_results(plain.as_ref(), &plain_bytes, rows_n, rows_n, 3);
            assert_close(&ctx, "scores", &on_blocks.0, &on_rows.0, 1e-5);
            assert_close(&ctx, "sums", &on_blocks.1, &on_rows.1, 1e-5);
        }
    });
}

/// A partly written block (rows past the written ones hold what an earlier sequence left
/// there, here rows 1000 times larger) reads as the written rows alone: their scores, and sums
/// under zero weights for the rest that round the written rows' weights as finely.
#[test]
fn unwritten_rows_of_a_block_change_nothing() {
    on_every_isa(|isa| {
        let (written_rows, rows_n) = (INTERLEAVED_ROWS + 5, 2 * INTERLEAVED_ROWS);
        let row_codecs = wrapped_codecs().into_iter().filter(|w| w.3.writes_rows());
        for (name, role, plain, wrapped) in row_codecs {
            let d = plain.head_dim();
            let ctx = format!("{name} d{d} {role:?} {isa:?}");
            let mut rows = random_rows(rows_n, d, 23, 1000.0);
            rows[..written_rows * d].copy_from_slice(&random_rows(written_rows, d, 29, 1.0));
            let blocks = written(wrapped.as_ref(), &rows);
            let plain_bytes = encoded(plain.as_ref(), &rows[..written_rows * d]);
            let (scores, sums) = kernel_results(wrapped.as_ref(), &blocks, rows_n, written_rows, 4);
            let (plain_scores, plain_sums) =
                kernel_results(plain.as_ref(), &plain_bytes, written_rows, written_rows, 4);
            assert_close(&ctx, "scores", &scores, &plain_scores, 1e-5);
            assert_close(&ctx, "sums", &sums, &plain_sums, 1e-5);
        }
    });
}
