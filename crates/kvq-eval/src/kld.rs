//! KL divergence and top-1 agreement of a scheme's next-token distributions against the
//! reference (16-bit cache) distributions, row by row, in `f64`.

use kvq_model::sampler::argmax;

/// `ln Σ exp(l)` of a row of logits, computed stably (shifted by the maximum).
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = f64::from(logits.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    max + sum.ln()
}

/// Natural-log softmax of a row of logits: `l_i − ln Σ exp(l)`.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let lse = log_sum_exp(logits);
    logits.iter().map(|&l| f64::from(l) - lse).collect()
}

/// The reference distribution of one token position, prepared once and compared with any
/// number of schemes' logits for the same position.
#[derive(Clone, Debug)]
pub struct Reference {
    log_p: Vec<f64>,
    p: Vec<f64>,
    top1: u32,
}

impl Reference {
    /// Prepares the reference distribution from its logits.
    pub fn new(logits: &[f32]) -> Self {
        let log_p = log_softmax(logits);
        let p = log_p.iter().map(|l| l.exp()).collect();
        Self {
            log_p,
            p,
            top1: argmax(logits),
        }
    }

    /// `KL(P_ref ‖ Q) = Σ p_i (ln p_i − ln q_i)` in nats, where `Q = softmax(logits)` and
    /// `lse = log_sum_exp(logits)` (passed in because callers need it for the likelihood too).
    /// Terms with `p_i = 0` contribute nothing.
    pub fn kl_divergence(&self, logits: &[f32], lse: f64) -> f64 {
        assert_eq!(logits.len(), self.p.len(), "rows of different vocabularies");
        let kl: f64 = self
            .p
            .iter()
            .zip(&self.log_p)
            .zip(logits)
            .filter(|((&p, _), _)| p > 0.0)
            .map(|((&p, &lp), &l)| p * (lp - (f64::from(l) - lse)))
            .sum();
        // Rounding can leave a tiny negative value where the distributions are equal.
        kl.max(0.0)
    }

    /// `ln p(token)` under the reference.
    pub fn log_prob(&self, token: usize) -> f64 {
        self.log_p[token]
    }

    /// Whether `logits` has the same most likely token as the reference (first index on ties).
    pub fn top1_agrees(&self, logits: &[f32]) -> bool {
        argmax(logits) == self.top1
    }
}

/// The `q`-th percentile (`0 ≤ q ≤ 100`) of `values` by the nearest-rank method: the smallest
/// value with at least `q`% of the values at or below it. `NaN` for an empty slice.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn log_softmax_matches_hand_values() {
        // ln(1 + e + e²) = 2.40760596444438
        let lse = 2.407_605_964_444_38;
        assert!(close(log_sum_exp(&[0.0, 1.0, 2.0]), lse));
        let ls = log_softmax(&[0.0, 1.0, 2.0]);
        assert!(close(ls[0], -lse) && close(ls[1], 1.0 - lse) && close(ls[2], 2.0 - lse));
        // Shifting every logit leaves the distribution unchanged; huge logits do not overflow.
        let shifted = log_softmax(&[1000.0, 1001.0, 1002.0]);
        assert!(ls.iter().zip(&shifted).all(|(a, b)| close(*a, *b)));
    }

    #[test]
    fn kl_divergence_matches_hand_values() {
        // P = (1/2, 1/2), Q = (1/4, 3/4): KL = ½ ln 2 + ½ ln(2/3) = ½ ln(4/3) = 0.143841036225890.
        let p = Reference::new(&[0.0, 0.0]);
        let q = [0.0, 3f32.ln()];
        assert!((p.kl_divergence(&q, log_sum_exp(&q)) - 0.143_841_036_225_890).abs() < 1e-7);
        // KL(Q ‖ P) differs: ¼ ln ½ + ¾ ln(3/2) = 0.130812035941137.
        let q_ref = Reference::new(&q);
        assert!((q_ref.kl_divergence(&[0.0, 0.0], 2f64.ln()) - 0.130_812_035_941_137).abs() < 1e-7);
        // Identical rows give exactly zero.
        let row = [0.3f32, -1.2, 4.0, 2.5];
        assert_eq!(
            Reference::new(&row).kl_divergence(&row, log_sum_exp(&row)),
            0.0
        );
    }

    #[test]
    fn kl_divergence_skips_zero_probability_terms() {
        // exp(-1e4) underflows to 0: that token contributes nothing, not NaN.
        let p = Reference::new(&[0.0, -1e4]);
        let kl = p.kl_divergence(&[0.0, 0.0], 2f64.ln());
        assert!((kl - 2f64.ln()).abs() < 1e-9, "{kl}");
    }

    #[test]
    fn top1_agreement() {
        let r = Reference::new(&[0.1, 3.0, 2.9]);
        assert!(r.top1_agrees(&[0.0, 1.0, 0.5]));
        assert!(!r.top1_agrees(&[0.0, 1.0, 1.5]));
        assert!((r.log_prob(1) - log_softmax(&[0.1, 3.0, 2.9])[1]).abs() < 1e-12);
    }

    #[test]
    fn percentile_nearest_rank() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 99.0), 3.0);
        assert!(percentile(&[], 99.0).is_nan());
    }
}
