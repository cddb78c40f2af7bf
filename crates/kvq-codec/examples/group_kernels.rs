//! Nanoseconds per row of the group kernels (`score_group`, `accumulate_group`) on a run of
//! rows that stays in the L2 cache: the arithmetic of attention without its memory traffic.
//! Best of 15 repetitions, one thread.
//!
//! `cargo run --release -p kvq-codec --example group_kernels -- q4_0 int3 turbo3`
//! (environment: `HEADS`, query heads per KV head, default 4; `SPAN`, rows per call, default
//! 64 as a cache page; `ROWS`, rows in all, default 2048; `ROLE=key` for the key codec;
//! `INTERLEAVE=1` for the codecs in interleaved blocks, as the cache keeps them: then only the
//! role's kernel is timed, the scores for keys and the sums for values, which read them in
//! place; `ISA=avx2` for the kernels of CPUs without AVX-512, `ISA=f32` for the float kernels).

use kvq_codec::simd::Ahead;
use kvq_codec::{build_codec, Calibration, OakenThresholds, Role, SchemeKind};
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (head_dim, rows, heads, span) = (128, env("ROWS", 2048), env("HEADS", 4), env("SPAN", 64));
    match std::env::var("ISA").as_deref() {
        Ok("avx2") => kvq_codec::simd::set_isa_limit(kvq_codec::simd::Isa::Avx2),
        Ok("f32") => kvq_codec::levels::set_enabled(false),
        Ok("avx2-f32") => {
            kvq_codec::simd::set_isa_limit(kvq_codec::simd::Isa::Avx2);
            kvq_codec::levels::set_enabled(false)
        }
        _ => {}
    }
    let role = match std::env::var("ROLE").as_deref() {
        Ok("key") => Role::Key,
        _ => Role::Value,
    };
    let values: Vec<f32> = (0..rows * head_dim)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    // Oaken's thresholds, profiled on the rows themselves.
    let calibration = Calibration {
        oaken_thresholds: Some(OakenThresholds::from_samples(&mut values.clone())),
        ..Calibration::default()
    };
    for name in std::env::args().skip(1) {
        let codec = build_codec(SchemeKind::parse(&name)?, role, head_dim, &calibration, 1)?;
        let interleaved = env("INTERLEAVE", 0) == 1;
        let codec = if interleaved {
            kvq_codec::interleaved::interleave(codec, role)
        } else {
            codec
        };
        let span = span.next_multiple_of(codec.block_tokens());
        let per_block = codec.block_tokens() * head_dim;
        let mut bytes = vec![0u8; rows / codec.block_tokens() * codec.block_bytes()];
        for (v, b) in values
            .chunks_exact(per_block)
            .zip(bytes.chunks_exact_mut(codec.block_bytes()))
        {
            codec.encode(v, b)?;
        }
        let prepared: Vec<Vec<f32>> = (0..heads)
            .map(|h| {
                let q: Vec<f32> = (0..head_dim)
                    .map(|i| ((i + h) % 17) as f32 / 8.0 - 1.0)
                    .collect();
                let mut p = vec![0.0; codec.query_len()];
                codec.prepare_query(&q, &mut p);
                p
            })
            .collect();
        let queries: Vec<&[f32]> = prepared.iter().map(Vec::as_slice).collect();
        let weights: Vec<Vec<f32>> = (0..heads)
            .map(|_| (0..rows).map(|i| (i % 13) as f32 / 13.0).collect())
            .collect();
        let mut scores = vec![vec![0f32; rows]; heads];
        let mut accs = vec![vec![0f32; codec.accumulator_len()]; heads];
        let span_bytes = span / codec.block_tokens() * codec.block_bytes();
        let (mut score_ns, mut sum_ns) = (f64::MAX, f64::MAX);
        let iters = 200;
        // Interleaved blocks only serve their role's kernel (the other reads them row by row).
        let (time_scores, time_sums) = match (interleaved, role) {
            (false, _) => (true, true),
            (true, Role::Key) => (true, false),
            (true, Role::Value) => (false, true),
        };
        for _ in 0..15 {
            let start = Instant::now();
            for _ in 0..iters * time_scores as usize {
                for (s, run) in bytes.chunks(span_bytes).enumerate() {
                    let mut out: Vec<&mut [f32]> = scores
                        .iter_mut()
                        .map(|x| &mut x[s * span..(s + 1) * span])
                        .collect();
                    codec.score_group(&queries, run, &mut out, &mut Ahead::none());
                }
            }
            score_ns = score_ns.min(start.elapsed().as_nanos() as f64 / (iters * rows) as f64);
            let start = Instant::now();
            for _ in 0..iters * time_sums as usize {
                for (s, run) in bytes.chunks(span_bytes).enumerate() {
                    let w: Vec<&[f32]> = weights
                        .iter()
                        .map(|x| &x[s * span..(s + 1) * span])
                        .collect();
                    let mut out: Vec<&mut [f32]> = accs.iter_mut().map(Vec::as_mut_slice).collect();
                    codec.accumulate_group(&w, run, &mut out, &mut Ahead::none());
                }
            }
            sum_ns = sum_ns.min(start.elapsed().as_nanos() as f64 / (iters * rows) as f64);
        }
        let shown = |timed: bool, ns: f64| {
            if timed {
                format!("{ns:6.2} ns/row")
            } else {
                "     - ".to_string()
            }
        };
        println!(
            "{name:12} score {}  accumulate {}",
            shown(time_scores, score_ns),
            shown(time_sums, sum_ns)
        );
    }
    Ok(())
}
