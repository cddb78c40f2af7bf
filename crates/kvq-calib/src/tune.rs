//! Per-layer scheme choice under a budget, assuming that the KL divergences of the layers'
//! K and V choices add up (measure the chosen policy to see how far that holds).
//!
//! The choice is a multiple-choice knapsack solved exactly by dynamic programming over the
//! total bit cost, in units of 1/[`UNITS`] bit per element of one item (one layer's K or V),
//! weighted by the item's share of the cache's elements.

/// Cost units per bit per element.
pub const UNITS: f64 = 256.0;

/// One candidate for one item: its bits per element and its (measured) KL divergence.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Bits per element.
    pub bits: f64,
    /// KL divergence when this item alone uses the candidate.
    pub kld: f64,
}

/// What to meet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// Total (additive) KL divergence at most this, with the fewest bits.
    MaxKld(f64),
    /// Average bits per element at most this, with the lowest total KL divergence.
    Bits(f64),
}

/// A chosen candidate per item, with its predicted totals.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// Index of the chosen candidate of each item.
    pub picks: Vec<usize>,
    /// Weighted average bits per element (from the rounded costs).
    pub bits: f64,
    /// Sum of the items' KL divergences.
    pub kld: f64,
}

/// Integer cost of each candidate of each item; weights are normalized to a mean of 1.
fn costs(items: &[Vec<Candidate>], weights: &[f64]) -> Vec<Vec<usize>> {
    let mean = weights.iter().sum::<f64>() / weights.len() as f64;
    items
        .iter()
        .zip(weights)
        .map(|(c, w)| {
            c.iter()
                .map(|c| (c.bits * w / mean * UNITS).round() as usize)
                .collect()
        })
        .collect()
}

/// The value of a set of picks: (average bits, total KL divergence).
pub fn evaluate(items: &[Vec<Candidate>], weights: &[f64], picks: &[usize]) -> (f64, f64) {
    let cost = costs(items, weights);
    let units: usize = cost.iter().zip(picks).map(|(c, &p)| c[p]).sum();
    let kld = items.iter().zip(picks).map(|(c, &p)| c[p].kld).sum();
    (units as f64 / UNITS / items.len() as f64, kld)
}

/// The optimal choice under `budget` (exact under additivity, bits rounded to 1/256), or
/// `None` when no choice meets it. `weights[i]` is item `i`'s number of elements.
pub fn choose(items: &[Vec<Candidate>], weights: &[f64], budget: Budget) -> Option<Choice> {
    assert_eq!(items.len(), weights.len(), "one weight per item");
    assert!(
        items.iter().all(|c| !c.is_empty() && c.len() < 256),
        "1 to 255 candidates per item"
    );
    let cost = costs(items, weights);
    let max: usize = cost
        .iter()
        .map(|c| c.iter().max().copied().unwrap_or(0))
        .sum();
    // best[c]: the least total KL divergence at total cost exactly c.
    let mut best = vec![f64::INFINITY; max + 1];
    best[0] = 0.0;
    let mut from: Vec<Vec<u8>> = Vec::with_capacity(items.len());
    for (cands, cost) in items.iter().zip(&cost) {
        let mut next = vec![f64::INFINITY; max + 1];
        let mut pick = vec![u8::MAX; max + 1];
        for (c, &b) in best.iter().enumerate().filter(|(_, b)| b.is_finite()) {
            for (j, (cand, &k)) in cands.iter().zip(cost).enumerate() {
                let v = b + cand.kld;
                if v < next[c + k] {
                    next[c + k] = v;
                    pick[c + k] = j as u8;
                }
            }
        }
        best = next;
        from.push(pick);
    }
    let n = items.len() as f64;
    let total = match budget {
        Budget::MaxKld(x) => (0..=max).find(|&c| best[c] <= x)?,
        Budget::Bits(b) => {
            let limit = ((b * n * UNITS) + 1e-6).floor().min(max as f64);
            if limit < 0.0 {
                return None;
            }
            (0..=limit as usize)
                .filter(|&c| best[c].is_finite())
                .min_by(|&a, &b| best[a].total_cmp(&best[b]).then(a.cmp(&b)))?
        }
    };
    let mut picks = vec![0; items.len()];
    let mut c = total;
    for i in (0..items.len()).rev() {
        let j = from[i][c] as usize;
        picks[i] = j;
        c -= cost[i][j];
    }
    let (bits, kld) = evaluate(items, weights, &picks);
    Some(Choice { picks, bits, kld })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of picks, best first by the budget's objective.
    fn brute_force(items: &[Vec<Candidate>], w: &[f64], budget: Budget) -> Option<(f64, f64)> {
        let mut best: Option<(f64, f64)> = None;
        let total: usize = items.iter().map(Vec::len).product();
        for mut code in 0..total {
            let picks: Vec<usize> = items
                .iter()
                .map(|c| {
                    let p = code % c.len();
                    code /= c.len();
                    p
                })
                .collect();
            let (bits, kld) = evaluate(items, w, &picks);
            let (ok, key, old) = match budget {
                Budget::MaxKld(x) => (kld <= x, (bits, kld), best.map(|b| (b.0, b.1))),
                Budget::Bits(b) => (bits <= b + 1e-9, (kld, bits), best.map(|b| (b.1, b.0))),
            };
            if ok && old.is_none_or(|o| key < o) {
                best = Some((bits, kld));
            }
        }
        best
    }

    fn synthetic(seed: u64, n: usize) -> (Vec<Vec<Candidate>>, Vec<f64>) {
        let mut s = seed;
        let mut rnd = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as f64 / (1u64 << 31) as f64
        };
        let bits = [16.0, 8.5, 4.5, 3.0625, 2.0625];
        let items = (0..n)
            .map(|_| {
                let scale = rnd() * 0.1;
                bits.iter()
                    .map(|&b| Candidate {
                        bits: b,
                        kld: if b == 16.0 {
                            0.0
                        } else {
                            scale * (rnd() + 0.2) / b
                        },
                    })
                    .collect()
            })
            .collect();
        let weights = (0..n).map(|i| if i % 3 == 0 { 2.0 } else { 1.0 }).collect();
        (items, weights)
    }

    #[test]
    fn tune_matches_brute_force_on_small_cases() {
        for seed in 0..20 {
            let (items, w) = synthetic(seed, 5);
            for budget in [
                Budget::Bits(3.5),
                Budget::Bits(6.0),
                Budget::Bits(2.0625),
                Budget::MaxKld(0.01),
                Budget::MaxKld(0.05),
                Budget::MaxKld(0.0),
            ] {
                let got = choose(&items, &w, budget);
                let want = brute_force(&items, &w, budget);
                match (got, want) {
                    (Some(g), Some((bits, kld))) => {
                        match budget {
                            Budget::Bits(b) => assert!(g.bits <= b + 1e-9, "{budget:?}: {g:?}"),
                            Budget::MaxKld(x) => assert!(g.kld <= x, "{budget:?}: {g:?}"),
                        }
                        assert!(
                            (g.bits - bits).abs() < 1e-9 || matches!(budget, Budget::Bits(_)),
                            "seed {seed} {budget:?}: bits {} vs brute force {bits}",
                            g.bits
                        );
                        assert!(
                            (g.kld - kld).abs() < 1e-12 || matches!(budget, Budget::MaxKld(_)),
                            "seed {seed} {budget:?}: kld {} vs brute force {kld}",
                            g.kld
                        );
                    }
                    (None, None) => {}
                    (g, w) => panic!("seed {seed} {budget:?}: {g:?} vs brute force {w:?}"),
                }
            }
        }
    }

    #[test]
    fn tune_refuses_an_impossible_budget() {
        let (items, w) = synthetic(7, 4);
        assert_eq!(choose(&items, &w, Budget::Bits(1.0)), None);
        assert_eq!(choose(&items, &w, Budget::MaxKld(-1.0)), None);
    }

    #[test]
    fn tune_spends_bits_on_the_sensitive_item() {
        let c = |bits, kld| Candidate { bits, kld };
        let items = vec![
            vec![c(8.0, 0.0), c(4.0, 0.5)],
            vec![c(8.0, 0.0), c(4.0, 0.01)],
        ];
        let got = choose(&items, &[1.0, 1.0], Budget::Bits(6.0)).unwrap();
        assert_eq!(got.picks, vec![0, 1]);
        assert_eq!(got.bits, 6.0);
    }
}
