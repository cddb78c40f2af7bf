//! Lloyd-Max scalar codebooks for one coordinate of a uniformly random unit vector in
//! `head_dim` dimensions (TurboQuant's rotated coordinates, methods.md §2.2–2.3).
//!
//! The coordinate's density is `f(x) ∝ (1 − x²)^((d−3)/2)` on `[−1, 1]` (exact, not the Gaussian
//! limit). The library computes the codebook itself: in the scaled variable `z = x·√d` the cell
//! masses and first and second moments are integrated by composite 5-point Gauss–Legendre
//! quadrature (sub-intervals of at most 1/8 in `z`; for `d > 256` the support `|z| ≤ √d` is cut at
//! `|z| = 16`, where the density is below `e^{−120}` of its peak), and Lloyd iterations (centroid = the
//! cell's conditional mean, boundaries = midpoints) run until no centroid moves by more than
//! `1e−13` in `z`. The codebook is symmetric, so only the positive half is iterated.
//! Results are cached per `(head_dim, bits)` for the life of the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Largest `|z| = |x|·√d` the integration covers.
const Z_CUT: f64 = 16.0;
/// Widest quadrature sub-interval, in `z`.
const MAX_PANEL: f64 = 0.125;
/// Convergence threshold of the Lloyd iterations, in `z`.
const TOLERANCE: f64 = 1e-13;
/// Upper bound on Lloyd iterations (never reached for bits ≤ 8 in practice).
const MAX_ITERATIONS: usize = 200_000;

/// A symmetric scalar codebook of `2^bits` centroids for the coordinates of a random unit
/// vector in `head_dim` dimensions (values in the vector's own units, not scaled by `√d`).
#[derive(Clone, Debug, PartialEq)]
pub struct Codebook {
    bits: u32,
    head_dim: usize,
    centroids: Vec<f32>,
    boundaries: Vec<f32>,
    mse_per_coordinate: f64,
}

impl Codebook {
    /// Bits per index (`2^bits` centroids).
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// The dimension whose sphere this codebook quantizes.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Centroids in increasing order (`2^bits` values).
    pub fn centroids(&self) -> &[f32] {
        &self.centroids
    }

    /// Decision boundaries in increasing order (`2^bits − 1` midpoints between centroids).
    pub fn boundaries(&self) -> &[f32] {
        &self.boundaries
    }

    /// Expected squared error of one coordinate, `E[(x − c(x))²]`, in the vector's units
    /// (multiply by `head_dim` for the per-unit-vector MSE, TurboQuant's `D_mse`).
    pub fn mse_per_coordinate(&self) -> f64 {
        self.mse_per_coordinate
    }

    /// Index of the centroid nearest to `x`.
    #[inline]
    pub fn index_of(&self, x: f32) -> u8 {
        self.boundaries.partition_point(|&b| b < x) as u8
    }
}

/// Computed codebooks by `(head_dim, bits)`.
type CodebookCache = HashMap<(usize, u32), Arc<Codebook>>;

/// The Lloyd-Max codebook with `2^bits` centroids for one coordinate of a uniformly random unit
/// vector in `head_dim` dimensions; computed once per `(head_dim, bits)` and cached.
///
/// Panics unless `head_dim ≥ 3` and `1 ≤ bits ≤ 8`.
pub fn sphere_codebook(head_dim: usize, bits: u32) -> Arc<Codebook> {
    assert!(head_dim >= 3, "sphere codebooks need head_dim ≥ 3");
    assert!((1..=8).contains(&bits), "codebook bits must be 1..=8");
    static CACHE: OnceLock<Mutex<CodebookCache>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(found) = cache.lock().unwrap().get(&(head_dim, bits)) {
        return Arc::clone(found);
    }
    let computed = Arc::new(compute(head_dim, bits));
    Arc::clone(
        cache
            .lock()
            .unwrap()
            .entry((head_dim, bits))
            .or_insert(computed),
    )
}

/// The scaled density `z ↦ (1 − z²/d)^((d−3)/2)` (unnormalized) on `|z| < √d`.
struct ScaledDensity {
    dim: f64,
    exponent: f64,
    support: f64,
}

/// Integrals of the density times `1`, `z` and `z²` over an interval.
#[derive(Clone, Copy, Default)]
struct Moments {
    mass: f64,
    first: f64,
    second: f64,
}

impl ScaledDensity {
    fn new(head_dim: usize) -> Self {
        let dim = head_dim as f64;
        Self {
            dim,
            exponent: (dim - 3.0) / 2.0,
            support: dim.sqrt().min(Z_CUT),
        }
    }

    fn at(&self, z: f64) -> f64 {
        if self.exponent == 0.0 {
            1.0
        } else {
            (self.exponent * (-z * z / self.dim).ln_1p()).exp()
        }
    }

    /// Moments over `[a, b]` by composite 5-point Gauss–Legendre quadrature.
    fn moments(&self, a: f64, b: f64) -> Moments {
        const NODES: [f64; 5] = [
            0.0,
            -0.538_469_310_105_683_1,
            0.538_469_310_105_683_1,
            -0.906_179_845_938_664,
            0.906_179_845_938_664,
        ];
        const WEIGHTS: [f64; 5] = [
            0.568_888_888_888_888_9,
            0.478_628_670_499_366_47,
            0.478_628_670_499_366_47,
            0.236_926_885_056_189_08,
            0.236_926_885_056_189_08,
        ];
        let mut out = Moments::default();
        if b <= a {
            return out;
        }
        let panels = ((b - a) / MAX_PANEL).ceil().max(1.0) as usize;
        let width = (b - a) / panels as f64;
        for p in 0..panels {
            let mid = a + (p as f64 + 0.5) * width;
            for (node, weight) in NODES.iter().zip(WEIGHTS) {
                let z = mid + node * width / 2.0;
                let w = weight * width / 2.0 * self.at(z);
                out.mass += w;
                out.first += w * z;
                out.second += w * z * z;
            }
        }
        out
    }
}

/// Runs Lloyd's algorithm on the positive half of the scaled density and builds the codebook.
fn compute(head_dim: usize, bits: u32) -> Codebook {
    let density = ScaledDensity::new(head_dim);
    let half = 1usize << (bits - 1);
    // Any increasing start converges (the density is log-concave, so the fixed point is unique).
    let mut centroids: Vec<f64> = (0..half)
        .map(|i| (i as f64 + 0.5) * density.support.min(4.0) / half as f64)
        .collect();
    let cell_edges = |c: &[f64]| -> Vec<f64> {
        let mut edges = Vec::with_capacity(half + 1);
        edges.push(0.0);
        edges.extend(c.windows(2).map(|w| (w[0] + w[1]) / 2.0));
        edges.push(density.support);
        edges
    };
    for _ in 0..MAX_ITERATIONS {
        let edges = cell_edges(&centroids);
        let mut largest_move = 0.0f64;
        for (i, c) in centroids.iter_mut().enumerate() {
            let m = density.moments(edges[i], edges[i + 1]);
            if m.mass > 0.0 {
                let next = m.first / m.mass;
                largest_move = largest_move.max((next - *c).abs());
                *c = next;
            }
        }
        if largest_move < TOLERANCE {
            break;
        }
    }
    let edges = cell_edges(&centroids);
    let (mut total_mass, mut distortion) = (0.0, 0.0);
    for (i, &c) in centroids.iter().enumerate() {
        let m = density.moments(edges[i], edges[i + 1]);
        total_mass += m.mass;
        distortion += m.second - 2.0 * c * m.first + c * c * m.mass;
    }
    // `distortion / total_mass` is E[(z − c)²]; x = z/√d.
    let mse_per_coordinate = distortion / total_mass / density.dim;
    let scale = density.dim.sqrt();
    let positive: Vec<f64> = centroids.iter().map(|c| c / scale).collect();
    let full: Vec<f64> = positive
        .iter()
        .rev()
        .map(|c| -c)
        .chain(positive.iter().copied())
        .collect();
    Codebook {
        bits,
        head_dim,
        centroids: full.iter().map(|&c| c as f32).collect(),
        boundaries: full
            .windows(2)
            .map(|w| ((w[0] + w[1]) / 2.0) as f32)
            .collect(),
        mse_per_coordinate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Positive Lloyd-Max centroids of N(0,1) and the MSE per coordinate (methods.md §2.3).
    const GAUSSIAN: [(&[f64], f64); 4] = [
        (&[0.7979], 0.3634),
        (&[0.4528, 1.5104], 0.1175),
        (&[0.2451, 0.7560, 1.3439, 2.1519], 0.0345),
        (
            &[
                0.1284, 0.3880, 0.6568, 0.9423, 1.2562, 1.6180, 2.0690, 2.7326,
            ],
            0.0095,
        ),
    ];

    #[test]
    fn large_head_dim_matches_the_gaussian_table() {
        let d = 4096;
        for (b, (table, mse)) in (1u32..).zip(GAUSSIAN) {
            let cb = sphere_codebook(d, b);
            let scale = (d as f32).sqrt();
            let positive = &cb.centroids()[table.len()..];
            for (&got, &want) in positive.iter().zip(table) {
                let got = f64::from(got * scale);
                assert!(
                    (got / want - 1.0).abs() < 0.02,
                    "b={b}: centroid {got} vs {want}"
                );
            }
            let got_mse = cb.mse_per_coordinate() * d as f64;
            assert!(
                (got_mse / mse - 1.0).abs() < 0.01,
                "b={b}: mse·d {got_mse} vs {mse}"
            );
        }
    }

    #[test]
    fn exact_law_differs_from_gaussian_at_small_head_dim() {
        // At d = 128 the outermost 4-bit centroid is ≈ 2.694/√d, not 2.733/√d (methods.md §2.3).
        let cb = sphere_codebook(128, 4);
        let outer = f64::from(*cb.centroids().last().unwrap()) * 128f64.sqrt();
        assert!((outer - 2.694).abs() < 0.01, "{outer}");
    }

    #[test]
    fn three_dimensions_is_uniform_on_the_interval() {
        // d = 3: the coordinate is uniform on [−1, 1]; 2 bits give centroids ±1/4, ±3/4.
        let cb = sphere_codebook(3, 2);
        for (got, want) in cb.centroids().iter().zip([-0.75f32, -0.25, 0.25, 0.75]) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        // Uniform on a cell of width 1/2: variance (1/2)²/12.
        assert!((cb.mse_per_coordinate() - 1.0 / 48.0).abs() < 1e-9);
    }

    #[test]
    fn index_of_picks_the_nearest_centroid() {
        let cb = sphere_codebook(128, 3);
        for k in 0..=400 {
            let x = -0.4 + 0.002 * k as f32;
            let nearest = cb
                .centroids()
                .iter()
                .enumerate()
                .min_by(|a, b| (a.1 - x).abs().total_cmp(&(b.1 - x).abs()))
                .unwrap()
                .0;
            assert_eq!(cb.index_of(x) as usize, nearest, "x={x}");
        }
    }

    #[test]
    fn cache_returns_the_same_codebook() {
        assert!(Arc::ptr_eq(
            &sphere_codebook(64, 2),
            &sphere_codebook(64, 2)
        ));
    }
}
