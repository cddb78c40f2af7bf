//! Per-channel normalization in front of any codec ([`ChannelNorm`]), for keys.
//!
//! This model's keys carry a few channels with large fixed offsets and 5–62× the RMS of the
//! median channel (design.md §5): a per-token quantizer's step, and TurboQuant's vector norm,
//! are set by them. `ChannelNorm` stores `x = (k − μ) / σ` through an inner codec, with `μ` the
//! calibrated mean of each channel and `σ` its standard deviation around that mean
//! (`√(rms² − μ²)` from the profile's channel RMS and mean), so that every channel reaches the
//! inner codec centered and with unit spread.
//!
//! Attention works on the stored bytes directly:
//!
//! * `q·k = (q∘σ)·x + q·μ`: the prepared query is the inner codec's prepared `q∘σ` followed by
//!   the scalar `q·μ` ([`Codec::query_len`] is the inner one's plus 1), and [`Codec::score`]
//!   adds it back, so scores are exact and can be mixed with full-precision spans. (`q·μ` is
//!   the same for every key of a query, so softmax would ignore it anyway.)
//! * `Σ w_t v_t = σ∘Σ w_t x_t + μ·Σ w_t`: the accumulator is the inner one followed by `Σ w_t`,
//!   and [`Codec::finish`] applies `σ` and `μ`.
//!
//! `μ` and `σ` are per layer and role, shared by every token and held by the codec like Oaken's
//! thresholds (calibration state, not cache contents): the bits per element are exactly the
//! inner codec's.

use crate::simd::Ahead;
use crate::{Calibration, Codec, CodecError};

/// An inner codec applied to channel-normalized rows `(x − μ) / σ`; see the module docs.
pub struct ChannelNorm {
    inner: Box<dyn Codec>,
    means: Vec<f32>,
    scales: Vec<f32>,
}

impl ChannelNorm {
    /// Wraps `inner` with per-channel `means` and `scales` (both `head_dim` long, finite,
    /// scales positive).
    pub fn new(
        inner: Box<dyn Codec>,
        means: Vec<f32>,
        scales: Vec<f32>,
    ) -> Result<Self, CodecError> {
        let d = inner.head_dim();
        let invalid = |why: String| CodecError::InvalidCalibration {
            scheme: inner.name(),
            why,
        };
        if means.len() != d || scales.len() != d {
            return Err(invalid(format!(
                "{} channel means and {} scales for head_dim {d}",
                means.len(),
                scales.len()
            )));
        }
        if means.iter().any(|m| !m.is_finite()) {
            return Err(invalid("channel means must be finite".into()));
        }
        if scales.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(invalid("channel scales must be finite and positive".into()));
        }
        Ok(Self {
            inner,
            means,
            scales,
        })
    }

    /// `μ` and `σ` from `calibration`: its `channel_means`, and the standard deviation
    /// `√(rms² − μ²)` of each channel from `channel_scales` (the channel RMS), floored at 10⁻⁶
    /// of the largest. `scheme` names the codec in errors.
    pub fn statistics(
        calibration: &Calibration,
        head_dim: usize,
        scheme: &str,
    ) -> Result<(Vec<f32>, Vec<f32>), CodecError> {
        let missing = |what: &str| CodecError::MissingCalibration {
            scheme: scheme.to_string(),
            what: what.to_string(),
        };
        let means = calibration
            .channel_means
            .clone()
            .ok_or_else(|| missing("channel means, for channel normalization"))?;
        let rms = calibration
            .channel_scales
            .as_ref()
            .ok_or_else(|| missing("channel RMS, for channel normalization"))?;
        if means.len() != head_dim || rms.len() != head_dim {
            return Err(CodecError::InvalidCalibration {
                scheme: scheme.to_string(),
                why: format!(
                    "{} channel means and {} channel scales for head_dim {head_dim}",
                    means.len(),
                    rms.len()
                ),
            });
        }
        let std: Vec<f32> = rms
            .iter()
            .zip(&means)
            .map(|(&r, &m)| {
                (f64::from(r).powi(2) - f64::from(m).powi(2))
                    .max(0.0)
                    .sqrt() as f32
            })
            .collect();
        let floor = (std.iter().copied().fold(0f32, f32::max) * 1e-6).max(f32::MIN_POSITIVE);
        Ok((means, std.iter().map(|&s| s.max(floor)).collect()))
    }

    /// The inner codec.
    pub fn inner(&self) -> &dyn Codec {
        self.inner.as_ref()
    }
}

impl Codec for ChannelNorm {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn head_dim(&self) -> usize {
        self.inner.head_dim()
    }

    fn block_tokens(&self) -> usize {
        self.inner.block_tokens()
    }

    fn block_bytes(&self) -> usize {
        self.inner.block_bytes()
    }

    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        crate::check_finite(rows, self.head_dim())?;
        let normalized: Vec<f32> = rows
            .chunks_exact(self.head_dim())
            .flat_map(|row| {
                row.iter()
                    .zip(self.means.iter().zip(&self.scales))
                    .map(|(&x, (&m, &s))| (x - m) / s)
            })
            .collect();
        self.inner.encode(&normalized, out)
    }

    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        self.inner.decode(block, rows);
        for row in rows.chunks_exact_mut(self.head_dim()) {
            for (x, (&m, &s)) in row.iter_mut().zip(self.means.iter().zip(&self.scales)) {
                *x = *x * s + m;
            }
        }
    }

    fn query_len(&self) -> usize {
        self.inner.query_len() + 1
    }

    fn prepare_query(&self, query: &[f32], prepared: &mut [f32]) {
        self.prepare_queries(query, prepared);
    }

    /// The inner codec prepares the scaled queries together.
    fn prepare_queries(&self, queries: &[f32], prepared: &mut [f32]) {
        let (d, inner_len) = (self.head_dim(), self.inner.query_len());
        let scaled: Vec<f32> = queries
            .chunks_exact(d)
            .flat_map(|q| q.iter().zip(&self.scales).map(|(q, s)| q * s))
            .collect();
        let mut inner = vec![0f32; scaled.len() / d * inner_len];
        self.inner.prepare_queries(&scaled, &mut inner);
        for ((query, inner), prepared) in queries
            .chunks_exact(d)
            .zip(inner.chunks_exact(inner_len))
            .zip(prepared.chunks_exact_mut(inner_len + 1))
        {
            prepared[..inner_len].copy_from_slice(inner);
            prepared[inner_len] = query.iter().zip(&self.means).map(|(q, m)| q * m).sum();
        }
    }

    fn score(&self, prepared_query: &[f32], blocks: &[u8], scores: &mut [f32]) {
        let (inner, offset) = prepared_query.split_at(self.inner.query_len());
        self.inner.score(inner, blocks, scores);
        for s in scores.iter_mut() {
            *s += offset[0];
        }
    }

    fn score_group(
        &self,
        queries: &[&[f32]],
        blocks: &[u8],
        scores: &mut [&mut [f32]],
        ahead: &mut Ahead,
    ) {
        let inner_len = self.inner.query_len();
        let inner: Vec<&[f32]> = queries.iter().map(|q| &q[..inner_len]).collect();
        self.inner.score_group(&inner, blocks, scores, ahead);
        for (q, s) in queries.iter().zip(scores.iter_mut()) {
            s.iter_mut().for_each(|x| *x += q[inner_len]);
        }
    }

    fn accumulator_len(&self) -> usize {
        self.inner.accumulator_len() + 1
    }

    fn accumulate_group(
        &self,
        weights: &[&[f32]],
        blocks: &[u8],
        accs: &mut [&mut [f32]],
        ahead: &mut Ahead,
    ) {
        let inner_len = self.inner.accumulator_len();
        let mut inner: Vec<&mut [f32]> = accs.iter_mut().map(|a| &mut a[..inner_len]).collect();
        self.inner
            .accumulate_group(weights, blocks, &mut inner, ahead);
        for (w, a) in weights.iter().zip(accs.iter_mut()) {
            a[inner_len] += w.iter().sum::<f32>();
        }
    }

    /// The inner codec's working space; the group kernels add the mean terms outside it.
    fn working_len(&self) -> usize {
        self.inner.working_len()
    }

    fn decode_working(&self, blocks: &[u8], rows: &mut [f32]) {
        self.inner.decode_working(blocks, rows);
    }

    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]) {
        let (inner, total) = acc.split_at_mut(self.inner.accumulator_len());
        self.inner.accumulate(weights, blocks, inner);
        total[0] += weights.iter().sum::<f32>();
    }

    fn finish(&self, acc: &[f32], out: &mut [f32]) {
        let (inner, total) = acc.split_at(self.inner.accumulator_len());
        self.inner.finish(inner, out);
        for (o, (&m, &s)) in out.iter_mut().zip(self.means.iter().zip(&self.scales)) {
            *o = *o * s + m * total[0];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_codec, Role, SchemeKind};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::StandardNormal;

    /// Keys like this model's: a few channels with large offsets and spreads.
    fn keys(rng: &mut ChaCha8Rng, tokens: usize, d: usize) -> Vec<f32> {
        (0..tokens * d)
            .map(|i| {
                let c = i % d;
                let g: f32 = rng.sample(StandardNormal);
                match c % 29 {
                    3 => 40.0 + 8.0 * g,
                    17 => -25.0 + 3.0 * g,
                    _ => 0.2 * c as f32 / d as f32 + g,
                }
            })
            .collect()
    }

    /// The calibration `kvq calibrate` would record for `rows`, asking for normalization.
    fn calibration_of(rows: &[f32], d: usize) -> Calibration {
        let n = (rows.len() / d) as f64;
        let mut sum = vec![0f64; d];
        let mut sq = vec![0f64; d];
        for row in rows.chunks_exact(d) {
            for (c, &x) in row.iter().enumerate() {
                sum[c] += f64::from(x);
                sq[c] += f64::from(x) * f64::from(x);
            }
        }
        Calibration {
            channel_means: Some(sum.iter().map(|s| (s / n) as f32).collect()),
            channel_scales: Some(sq.iter().map(|s| (s / n).sqrt() as f32).collect()),
            channel_norm: true,
            ..Default::default()
        }
    }

    fn encode_all(codec: &dyn Codec, rows: &[f32]) -> Vec<u8> {
        let per_block = codec.block_tokens() * codec.head_dim();
        let mut bytes = vec![0u8; rows.len() / per_block * codec.block_bytes()];
        for (r, b) in rows
            .chunks_exact(per_block)
            .zip(bytes.chunks_exact_mut(codec.block_bytes()))
        {
            codec.encode(r, b).unwrap();
        }
        bytes
    }

    fn decode_all(codec: &dyn Codec, bytes: &[u8], len: usize) -> Vec<f32> {
        let per_block = codec.block_tokens() * codec.head_dim();
        let mut rows = vec![0f32; len];
        for (b, r) in bytes
            .chunks_exact(codec.block_bytes())
            .zip(rows.chunks_exact_mut(per_block))
        {
            codec.decode(b, r);
        }
        rows
    }

    const SCHEMES: [&str; 6] = ["q4_0", "int4", "turbo4", "turbo2.5", "kivi4", "int3-g32"];

    /// Fused score and accumulate agree with decoding the rows and computing on them, and the
    /// wrapper is what `build_codec` returns when the calibration asks for it.
    #[test]
    fn fused_kernels_match_decode_then_dot() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for name in SCHEMES {
            for d in [64, 128, 256] {
                for role in [Role::Key, Role::Value] {
                    let kind = SchemeKind::parse(name).unwrap();
                    let probe = build_codec(kind, role, d, &Calibration::default(), 3).unwrap();
                    let tokens = 2 * probe.block_tokens().max(32);
                    let rows = keys(&mut rng, tokens, d);
                    let calibration = calibration_of(&rows, d);
                    let codec = build_codec(kind, role, d, &calibration, 3).unwrap();
                    assert_eq!(codec.query_len(), probe.query_len() + 1, "{name}");
                    assert_eq!(codec.bits_per_element(), probe.bits_per_element(), "{name}");
                    let bytes = encode_all(codec.as_ref(), &rows);
                    let decoded = decode_all(codec.as_ref(), &bytes, rows.len());

                    let query: Vec<f32> = (0..d).map(|_| rng.sample(StandardNormal)).collect();
                    let mut prepared = vec![0f32; codec.query_len()];
                    codec.prepare_query(&query, &mut prepared);
                    let mut scores = vec![0f32; tokens];
                    codec.score(&prepared, &bytes, &mut scores);
                    for (t, s) in scores.iter().enumerate() {
                        let k = &decoded[t * d..(t + 1) * d];
                        let exact: f32 = k.iter().zip(&query).map(|(a, b)| a * b).sum();
                        let size: f32 = k.iter().zip(&query).map(|(a, b)| (a * b).abs()).sum();
                        assert!(
                            (s - exact).abs() <= 1e-4 * (1.0 + size),
                            "{name} {role:?} {d} score {t}: {s} vs {exact}"
                        );
                    }

                    let weights: Vec<f32> = (0..tokens).map(|_| rng.gen_range(0.0..1.0)).collect();
                    let mut acc = vec![0f32; codec.accumulator_len()];
                    codec.accumulate(&weights, &bytes, &mut acc);
                    let mut out = vec![0f32; d];
                    codec.finish(&acc, &mut out);
                    for c in 0..d {
                        let exact: f32 = (0..tokens).map(|t| weights[t] * decoded[t * d + c]).sum();
                        let size: f32 = (0..tokens)
                            .map(|t| (weights[t] * decoded[t * d + c]).abs())
                            .sum();
                        assert!(
                            (out[c] - exact).abs() <= 1e-4 * (1.0 + size),
                            "{name} {role:?} {d} accumulate {c}: {} vs {exact}",
                            out[c]
                        );
                    }
                }
            }
        }
    }

    /// Centering removes a large constant offset in a few channels: q4_0's error on such rows
    /// drops by a large factor.
    #[test]
    fn centering_removes_a_channel_offset() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let d = 128;
        let rows: Vec<f32> = (0..256 * d)
            .map(|i| {
                let g: f32 = rng.sample(StandardNormal);
                if i % d == 5 || i % d == 70 {
                    60.0 + 0.5 * g
                } else {
                    g
                }
            })
            .collect();
        let calibration = calibration_of(&rows, d);
        let error = |codec: &dyn Codec| {
            let decoded = decode_all(codec, &encode_all(codec, &rows), rows.len());
            let err: f64 = rows
                .iter()
                .zip(&decoded)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum();
            err / rows.len() as f64
        };
        let plain = build_codec(SchemeKind::Q4_0, Role::Key, d, &Calibration::default(), 0);
        let plain = plain.unwrap();
        let wrapped = build_codec(SchemeKind::Q4_0, Role::Key, d, &calibration, 0).unwrap();
        let (plain, wrapped) = (error(plain.as_ref()), error(wrapped.as_ref()));
        assert!(
            wrapped * 50.0 < plain,
            "mean squared error {wrapped} with ChannelNorm, {plain} without"
        );
    }

    /// Wrong lengths and missing statistics are reported, not panicked on; Oaken refuses.
    #[test]
    fn bad_statistics_are_errors() {
        let d = 64;
        let asks = Calibration {
            channel_norm: true,
            ..Default::default()
        };
        assert!(matches!(
            build_codec(SchemeKind::Q4_0, Role::Key, d, &asks, 0),
            Err(CodecError::MissingCalibration { .. })
        ));
        let short = Calibration {
            channel_means: Some(vec![0.0; d - 1]),
            channel_scales: Some(vec![1.0; d]),
            ..asks.clone()
        };
        assert!(matches!(
            build_codec(SchemeKind::Q4_0, Role::Key, d, &short, 0),
            Err(CodecError::InvalidCalibration { .. })
        ));
        let full = Calibration {
            channel_means: Some(vec![0.0; d]),
            channel_scales: Some(vec![1.0; d]),
            ..asks
        };
        assert!(matches!(
            build_codec(SchemeKind::Oaken, Role::Key, d, &full, 0),
            Err(CodecError::InvalidCalibration { .. })
        ));
        let f16 = build_codec(SchemeKind::F16, Role::Key, d, &full, 0).unwrap();
        assert_eq!(f16.query_len(), d, "full-precision schemes are not wrapped");
        let inner = build_codec(SchemeKind::Q4_0, Role::Key, d, &Calibration::default(), 0);
        assert!(ChannelNorm::new(inner.unwrap(), vec![0.0; d], vec![0.0; d]).is_err());
    }
}
