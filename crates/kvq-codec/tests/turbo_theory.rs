//! TurboQuant against its theory (methods.md §2.3–2.4): distortion per unit vector, unbiased
//! inner products for prod, the 2/π bias of 1-bit mse, and what calibration buys.

use kvq_codec::rotation::seeded_rng;
use kvq_codec::turbo::TurboCodec;
use kvq_codec::{Calibration, Codec};
use rand::Rng;
use rand_distr::StandardNormal;

fn gaussian(count: usize, seed: u64) -> Vec<f32> {
    let mut rng = seeded_rng(seed, 7);
    (0..count).map(|_| rng.sample(StandardNormal)).collect()
}

fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn roundtrip(codec: &dyn Codec, row: &[f32]) -> Vec<f32> {
    let mut block = vec![0u8; codec.block_bytes()];
    codec.encode(row, &mut block).unwrap();
    let mut back = vec![0f32; row.len()];
    codec.decode(&block, &mut back);
    back
}

/// `⟨y, x̃⟩` through the fused path: prepare `y` once, score the encoded `x`.
fn estimate(codec: &dyn Codec, x: &[f32], y: &[f32]) -> f32 {
    let mut block = vec![0u8; codec.block_bytes()];
    codec.encode(x, &mut block).unwrap();
    let mut prepared = vec![0f32; codec.query_len()];
    codec.prepare_query(y, &mut prepared);
    let mut score = [0f32];
    codec.score(&prepared, &block, &mut score);
    score[0]
}

fn mean_and_standard_error(samples: &[f64]) -> (f64, f64) {
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let variance = samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (variance / n).sqrt())
}

#[test]
fn mse_distortion_per_unit_vector_matches_the_paper() {
    // Paper: D_mse ≈ 0.36, 0.117, 0.03, 0.009 for b = 1..4.
    let paper = [0.36, 0.117, 0.03, 0.009];
    let vectors = 1500;
    for head_dim in [128, 256] {
        for (bits, want) in (1u8..=4).zip(paper) {
            let codec = TurboCodec::mse(2 * bits, head_dim, 21, &Calibration::default()).unwrap();
            let all = gaussian(vectors * head_dim, u64::from(bits) + head_dim as u64);
            let total: f64 = all
                .chunks_exact(head_dim)
                .map(|v| {
                    let x = unit(v);
                    let back = roundtrip(&codec, &x);
                    x.iter()
                        .zip(&back)
                        .map(|(a, b)| f64::from(a - b).powi(2))
                        .sum::<f64>()
                })
                .sum();
            let measured = total / vectors as f64;
            println!("d={head_dim} b={bits}: D_mse = {measured:.5} (paper {want})");
            assert!(
                (measured / want - 1.0).abs() < 0.15,
                "d={head_dim} b={bits}: {measured} vs {want}"
            );
        }
    }
}

/// Fixed `(x, y)` pairs from two pair seeds, with `⟨y, x⟩` of 0.8 and 0.3 (`‖x‖ = ‖y‖ = 1`).
fn pairs(head_dim: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut out = Vec::new();
    for pair_seed in [1u64, 2] {
        for (k, cos) in [0.8f32, 0.3].into_iter().enumerate() {
            let x = unit(&gaussian(head_dim, pair_seed * 10 + k as u64));
            let z = gaussian(head_dim, pair_seed * 10 + k as u64 + 5);
            let along = dot(&z, &x);
            let orth = unit(
                &z.iter()
                    .zip(&x)
                    .map(|(a, b)| a - along * b)
                    .collect::<Vec<_>>(),
            );
            let y = x
                .iter()
                .zip(&orth)
                .map(|(a, b)| cos * a + (1.0 - cos * cos).sqrt() * b)
                .collect();
            out.push((x, y));
        }
    }
    out
}

/// For each pair, the estimation errors `⟨y, x̃⟩ − ⟨y, x⟩` over codecs drawn with seeds
/// `0..draws` (every pair sees the same draws; each pair's errors are independent across draws).
fn errors_over_draws(
    make: impl Fn(u64) -> TurboCodec,
    pairs: &[(Vec<f32>, Vec<f32>)],
    draws: u64,
) -> Vec<Vec<f64>> {
    let mut errors = vec![Vec::new(); pairs.len()];
    for seed in 0..draws {
        let codec = make(seed);
        for ((x, y), e) in pairs.iter().zip(&mut errors) {
            e.push(f64::from(estimate(&codec, x, y) - dot(x, y)));
        }
    }
    errors
}

#[test]
fn prod_inner_product_estimate_is_unbiased() {
    let head_dim = 128;
    let pairs = pairs(head_dim);
    for bits in 2..=4u8 {
        let errors = errors_over_draws(
            |seed| TurboCodec::prod(bits, head_dim, seed).unwrap(),
            &pairs,
            300,
        );
        for ((x, y), e) in pairs.iter().zip(&errors) {
            let (mean, se) = mean_and_standard_error(e);
            println!(
                "turbo{bits}-prod ⟨y,x⟩={:.2}: mean error {mean:+.5} ± {se:.5}",
                dot(x, y)
            );
            assert!(mean.abs() < 3.0 * se, "bits {bits}: mean {mean} vs se {se}");
        }
    }
}

#[test]
fn one_bit_mse_shrinks_inner_products_by_two_over_pi() {
    let head_dim = 128;
    let pairs = pairs(head_dim);
    let none = Calibration::default();
    let errors = errors_over_draws(
        |seed| TurboCodec::mse(2, head_dim, seed, &none).unwrap(),
        &pairs,
        200,
    );
    let mut ratios = Vec::new();
    for ((x, y), e) in pairs.iter().zip(&errors) {
        let truth = f64::from(dot(x, y));
        let (mean, se) = mean_and_standard_error(e);
        let ratio = 1.0 + mean / truth;
        println!(
            "1-bit mse ⟨y,x⟩={truth:.2}: E ratio {ratio:.4} ± {:.4}",
            se / truth
        );
        // The bias is real: far more than 3 standard errors away from unbiased.
        assert!(mean.abs() > 10.0 * se);
        ratios.push(ratio);
    }
    let mean_ratio = ratios.iter().sum::<f64>() / ratios.len() as f64;
    let two_over_pi = 2.0 / std::f64::consts::PI;
    assert!(
        (mean_ratio - two_over_pi).abs() < 0.02,
        "E⟨y,x̃⟩/⟨y,x⟩ = {mean_ratio}, want {two_over_pi}"
    );
}

/// Rows with four channels 30× stronger than the others.
fn rows_with_strong_channels(count: usize, head_dim: usize) -> (Vec<f32>, Vec<usize>) {
    let strong = vec![3, 40, 77, 100];
    let mut rows = gaussian(count * head_dim, 77);
    for row in rows.chunks_exact_mut(head_dim) {
        for &c in &strong {
            row[c] *= 30.0;
        }
    }
    (rows, strong)
}

#[test]
fn outlier_channels_at_the_higher_rate_lower_the_error() {
    let head_dim = 128;
    let (rows, strong) = rows_with_strong_channels(300, head_dim);
    let calibrated = Calibration {
        outlier_channels: Some(strong),
        ..Calibration::default()
    };
    for half_bits in [5, 7] {
        let squared_error = |codec: &TurboCodec| -> f64 {
            rows.chunks_exact(head_dim)
                .map(|row| {
                    let back = roundtrip(codec, row);
                    row.iter()
                        .zip(&back)
                        .map(|(a, b)| f64::from(a - b).powi(2))
                        .sum::<f64>()
                })
                .sum()
        };
        let plain = squared_error(
            &TurboCodec::mse(half_bits, head_dim, 3, &Calibration::default()).unwrap(),
        );
        let split = squared_error(&TurboCodec::mse(half_bits, head_dim, 3, &calibrated).unwrap());
        println!("half_bits {half_bits}: squared error {plain:.1} plain, {split:.1} with outlier channels");
        assert!(split < 0.7 * plain, "{split} vs {plain}");
    }
}

#[test]
fn channel_scales_keep_the_weak_channels() {
    let head_dim = 128;
    let (rows, strong) = rows_with_strong_channels(300, head_dim);
    let scales: Vec<f32> = (0..head_dim)
        .map(|c| if strong.contains(&c) { 30.0 } else { 1.0 })
        .collect();
    let calibrated = Calibration {
        channel_scales: Some(scales),
        ..Calibration::default()
    };
    let weak_channel_error = |codec: &TurboCodec| -> f64 {
        rows.chunks_exact(head_dim)
            .map(|row| {
                let back = roundtrip(codec, row);
                (0..head_dim)
                    .filter(|c| !strong.contains(c))
                    .map(|c| f64::from(row[c] - back[c]).powi(2))
                    .sum::<f64>()
            })
            .sum()
    };
    let plain =
        weak_channel_error(&TurboCodec::mse(6, head_dim, 3, &Calibration::default()).unwrap());
    let scaled = weak_channel_error(&TurboCodec::mse(6, head_dim, 3, &calibrated).unwrap());
    println!("weak-channel squared error: {plain:.1} plain, {scaled:.1} with channel scales");
    assert!(scaled < 0.1 * plain, "{scaled} vs {plain}");
}
