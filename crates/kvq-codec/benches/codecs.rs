//! Encode, fused score and fused accumulate of every scheme at head_dim 128 over 4096 tokens,
//! in elements per second; `f16` is the baseline in the same run.
//!
//! `cargo bench -p kvq-codec --bench codecs` (about a second per scheme and operation).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvq_codec::{build_codec, scheme_names, Calibration, Codec, OakenThresholds, Role, SchemeKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use std::hint::black_box;
use std::time::Duration;

const HEAD_DIM: usize = 128;
const TOKENS: usize = 4096;

/// Gaussian rows whose channels differ in magnitude (as real keys do).
fn rows() -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let channel_scale: Vec<f32> = (0..HEAD_DIM)
        .map(|_| 10f32.powf(rng.gen_range(-0.5..0.5)))
        .collect();
    (0..TOKENS * HEAD_DIM)
        .map(|i| channel_scale[i % HEAD_DIM] * rng.sample::<f32, _>(StandardNormal))
        .collect()
}

/// Oaken's thresholds from the data's 2/47/53/98% quantiles.
fn calibration(rows: &[f32]) -> Calibration {
    let mut sorted = rows.to_vec();
    sorted.sort_by(f32::total_cmp);
    let q = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
    Calibration {
        oaken_thresholds: Some(OakenThresholds {
            lo_outer: q(0.02),
            lo_inner: q(0.47),
            hi_inner: q(0.53),
            hi_outer: q(0.98),
        }),
        ..Default::default()
    }
}

/// The codec for `name` at head_dim 128.
fn codec(name: &str, role: Role, calibration: &Calibration) -> Box<dyn Codec> {
    let kind = SchemeKind::parse(name).unwrap();
    build_codec(kind, role, HEAD_DIM, calibration, 1).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn encode_all(codec: &dyn Codec, rows: &[f32], bytes: &mut [u8]) {
    let per_block = codec.block_tokens() * codec.head_dim();
    for (block_rows, block) in rows
        .chunks_exact(per_block)
        .zip(bytes.chunks_exact_mut(codec.block_bytes()))
    {
        codec.encode(block_rows, block).unwrap();
    }
}

fn bench_codecs(c: &mut Criterion) {
    let rows = rows();
    let calibration = calibration(&rows);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let query: Vec<f32> = (0..HEAD_DIM).map(|_| rng.sample(StandardNormal)).collect();
    let weights: Vec<f32> = (0..TOKENS).map(|_| rng.gen_range(0.0..1.0)).collect();

    let mut names = scheme_names();
    names.retain(|n| n != "f16");
    names.insert(0, "f16".into());

    let mut encode = c.benchmark_group("encode");
    encode.throughput(Throughput::Elements((TOKENS * HEAD_DIM) as u64));
    for name in &names {
        let keys = codec(name, Role::Key, &calibration);
        let mut bytes = vec![0u8; TOKENS / keys.block_tokens() * keys.block_bytes()];
        encode.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| encode_all(keys.as_ref(), black_box(&rows), &mut bytes))
        });
    }
    encode.finish();

    let mut score = c.benchmark_group("score");
    score.throughput(Throughput::Elements((TOKENS * HEAD_DIM) as u64));
    for name in &names {
        let keys = codec(name, Role::Key, &calibration);
        let mut bytes = vec![0u8; TOKENS / keys.block_tokens() * keys.block_bytes()];
        encode_all(keys.as_ref(), &rows, &mut bytes);
        let mut prepared = vec![0.0f32; keys.query_len()];
        keys.prepare_query(&query, &mut prepared);
        let mut scores = vec![0.0f32; TOKENS];
        score.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| keys.score(black_box(&prepared), black_box(&bytes), &mut scores))
        });
    }
    score.finish();

    let mut accumulate = c.benchmark_group("accumulate");
    accumulate.throughput(Throughput::Elements((TOKENS * HEAD_DIM) as u64));
    for name in &names {
        let values = codec(name, Role::Value, &calibration);
        let mut bytes = vec![0u8; TOKENS / values.block_tokens() * values.block_bytes()];
        encode_all(values.as_ref(), &rows, &mut bytes);
        let mut acc = vec![0.0f32; values.accumulator_len()];
        accumulate.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                acc.fill(0.0);
                values.accumulate(black_box(&weights), black_box(&bytes), &mut acc)
            })
        });
    }
    accumulate.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = bench_codecs
}
criterion_main!(benches);
