//! Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p
//! from a seeded generator, so that a seed reproduces a generation.

use rand::{Rng, SeedableRng};

/// Sampling settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            seed: 0,
        }
    }
}

/// A sampler with its random state.
pub struct Sampler {
    config: SamplerConfig,
    rng: rand_chacha::ChaCha8Rng,
}

impl Sampler {
    /// A sampler seeded by `config.seed`.
    pub fn new(config: SamplerConfig) -> Self {
        Self {
            config,
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(config.seed),
        }
    }

    /// Picks the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.config.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut candidates: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        if self.config.top_k > 0 {
            candidates.truncate(self.config.top_k);
        }
        let max = candidates[0].1;
        let mut probs: Vec<f32> = candidates
            .iter()
            .map(|&(_, l)| ((l - max) / self.config.temperature).exp())
            .collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let mut kept = 0;
        let mut mass = 0.0;
        for p in &probs {
            kept += 1;
            mass += p;
            if mass >= self.config.top_p {
                break;
            }
        }
        let r = self.rng.gen::<f32>() * mass;
        let mut acc = 0.0;
        for (i, p) in probs[..kept].iter().enumerate() {
            acc += p;
            if r < acc {
                return candidates[i].0;
            }
        }
        candidates[kept - 1].0
    }
}

/// Index of the largest value (the first on ties).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_reproduce() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 7919) % 101) as f32 / 10.0).collect();
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
            seed: 3,
        });
        assert_eq!(s.sample(&logits), argmax(&logits));
        let cfg = SamplerConfig {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            seed: 42,
        };
        let (mut a, mut b) = (Sampler::new(cfg), Sampler::new(cfg));
        let xs: Vec<u32> = (0..50).map(|_| a.sample(&logits)).collect();
        let ys: Vec<u32> = (0..50).map(|_| b.sample(&logits)).collect();
        assert_eq!(xs, ys);
    }

    #[test]
    fn sampled_frequencies_follow_the_softmax() {
        let logits = [0.0f32, (2.0f32).ln()]; // probabilities 1/3 and 2/3
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 9,
        });
        let n = 30_000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count() as f64 / n as f64;
        assert!((ones - 2.0 / 3.0).abs() < 0.015, "{ones}");
    }

    #[test]
    fn top_p_drops_the_unlikely_tail() {
        let logits = [10.0f32, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: 1,
        });
        assert!((0..1000).all(|_| s.sample(&logits) == 0));
    }
}
