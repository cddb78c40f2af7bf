//! Seeded random rotations of `R^d` and Gaussian sketch matrices (TurboQuant, methods.md §2.1).
//!
//! * [`RotationKind::DenseQr`]: `Π = Q` from the QR decomposition of a `d × d` matrix of i.i.d.
//!   N(0,1) entries (modified Gram–Schmidt, run twice for orthogonality to f64 rounding, with
//!   `R`'s diagonal positive, so `Π` is Haar-distributed: the paper's rotation). Stored dense,
//!   `d²` f32; applying it costs `d²` multiply-adds.
//! * [`RotationKind::Hadamard`]: `Π = H·D/√d` with `D` random ±1 signs and `H` the Walsh–Hadamard
//!   matrix (power-of-two `d` only): `d` signs of storage and `d·log₂d` additions per use.
//!
//! Randomness comes from ChaCha20 seeded with a `u64` and a stream number ([`seeded_rng`]), so the
//! same `(seed, stream)` gives the same matrix on every machine.

use crate::simd::{self, Ahead, RowFormat};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};

/// Which random rotation to draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RotationKind {
    /// Dense Haar-random orthogonal matrix from the QR decomposition of a Gaussian matrix.
    DenseQr,
    /// Randomized Walsh–Hadamard transform (random signs, then the normalized transform).
    Hadamard,
}

/// The deterministic random generator for `(seed, stream)`: different streams of one seed are
/// independent.
pub fn seeded_rng(seed: u64, stream: u64) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// A `rows × cols` row-major matrix of i.i.d. N(0,1) entries.
pub fn gaussian_matrix(rows: usize, cols: usize, rng: &mut ChaCha20Rng) -> Vec<f32> {
    (0..rows * cols)
        .map(|_| StandardNormal.sample(rng))
        .collect()
}

/// A random orthogonal map `Π` of `R^dim`.
#[derive(Clone, Debug)]
pub struct Rotation {
    dim: usize,
    form: Form,
}

#[derive(Clone, Debug)]
enum Form {
    /// Row-major `dim × dim` matrix.
    Dense(Vec<f32>),
    /// ±1 signs `D`, applied before the transform.
    Hadamard(Vec<f32>),
}

impl Rotation {
    /// Draws a rotation of `R^dim` from `rng`; `None` for a Hadamard rotation of a `dim` that is
    /// not a power of two.
    pub fn new(kind: RotationKind, dim: usize, rng: &mut ChaCha20Rng) -> Option<Self> {
        let form = match kind {
            RotationKind::DenseQr => Form::Dense(haar_orthogonal(dim, rng)),
            RotationKind::Hadamard => {
                if !dim.is_power_of_two() {
                    return None;
                }
                Form::Hadamard(
                    gaussian_matrix(1, dim, rng)
                        .into_iter()
                        .map(|g| if g < 0.0 { -1.0 } else { 1.0 })
                        .collect(),
                )
            }
        };
        Some(Self { dim, form })
    }

    /// Dimension of the rotated space.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// `out = Π·x`.
    pub fn apply(&self, x: &[f32], out: &mut [f32]) {
        self.apply_group(&[x], &mut [out]);
    }

    /// `outs[h] = Π·xs[h]`, the matrix read once for all of them.
    pub fn apply_group(&self, xs: &[&[f32]], outs: &mut [&mut [f32]]) {
        match &self.form {
            // The matrix's rows as a run of f32 rows for the group kernel: 4 rows per step,
            // their sums reduced together, every vector against each row while it is loaded.
            Form::Dense(m) => simd::dot_rows_group(
                RowFormat::F32,
                xs,
                simd::f32_bytes(m),
                outs,
                &mut Ahead::none(),
            ),
            Form::Hadamard(signs) => {
                for (x, out) in xs.iter().zip(outs.iter_mut()) {
                    for ((o, &v), &s) in out.iter_mut().zip(x.iter()).zip(signs) {
                        *o = v * s;
                    }
                    walsh_hadamard(out);
                }
            }
        }
    }

    /// `out = Πᵀ·y` (the inverse rotation).
    pub fn apply_transpose(&self, y: &[f32], out: &mut [f32]) {
        self.apply_transpose_group(&[y], &mut [out]);
    }

    /// `outs[h] = Πᵀ·ys[h]`, the matrix read once for all of them.
    pub fn apply_transpose_group(&self, ys: &[&[f32]], outs: &mut [&mut [f32]]) {
        match &self.form {
            // `Σ_i y_i·row_i`, summed in registers over the rows by the group kernel.
            Form::Dense(m) => {
                outs.iter_mut().for_each(|o| o.fill(0.0));
                simd::axpy_rows_group(
                    RowFormat::F32,
                    ys,
                    simd::f32_bytes(m),
                    outs,
                    &mut Ahead::none(),
                );
            }
            Form::Hadamard(signs) => {
                for (y, out) in ys.iter().zip(outs.iter_mut()) {
                    out.copy_from_slice(y);
                    walsh_hadamard(out);
                    for (o, &s) in out.iter_mut().zip(signs) {
                        *o *= s;
                    }
                }
            }
        }
    }
}

/// In-place normalized Walsh–Hadamard transform (`H/√n`, its own inverse).
fn walsh_hadamard(v: &mut [f32]) {
    let n = v.len();
    let mut half = 1;
    while half < n {
        for start in (0..n).step_by(2 * half) {
            for i in start..start + half {
                let (a, b) = (v[i], v[i + half]);
                v[i] = a + b;
                v[i + half] = a - b;
            }
        }
        half *= 2;
    }
    let norm = 1.0 / (n as f32).sqrt();
    v.iter_mut().for_each(|x| *x *= norm);
}

/// `Q` of the QR decomposition of a Gaussian `dim × dim` matrix, row-major, with `R`'s diagonal
/// positive (Haar measure). Modified Gram–Schmidt over the columns, twice, in f64.
fn haar_orthogonal(dim: usize, rng: &mut ChaCha20Rng) -> Vec<f32> {
    // columns[j] is column j of the Gaussian matrix, orthonormalized in place.
    let mut columns: Vec<Vec<f64>> = (0..dim)
        .map(|_| (0..dim).map(|_| StandardNormal.sample(rng)).collect())
        .collect();
    for j in 0..dim {
        let (done, rest) = columns.split_at_mut(j);
        let col = &mut rest[0];
        for _ in 0..2 {
            for q in done.iter() {
                let dot: f64 = q.iter().zip(col.iter()).map(|(a, b)| a * b).sum();
                col.iter_mut().zip(q).for_each(|(c, a)| *c -= dot * a);
            }
        }
        let norm = col.iter().map(|v| v * v).sum::<f64>().sqrt();
        col.iter_mut().for_each(|v| *v /= norm);
    }
    let mut matrix = vec![0f32; dim * dim];
    for (j, col) in columns.iter().enumerate() {
        for (i, &v) in col.iter().enumerate() {
            matrix[i * dim + j] = v as f32;
        }
    }
    matrix
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix_of(r: &Rotation) -> Vec<Vec<f32>> {
        (0..r.dim())
            .map(|k| {
                let mut e = vec![0f32; r.dim()];
                e[k] = 1.0;
                let mut col = vec![0f32; r.dim()];
                r.apply(&e, &mut col);
                col
            })
            .collect()
    }

    fn assert_orthogonal(r: &Rotation) {
        let cols = matrix_of(r);
        for (a, ca) in cols.iter().enumerate() {
            for (b, cb) in cols.iter().enumerate() {
                let dot: f32 = ca.iter().zip(cb).map(|(x, y)| x * y).sum();
                let want = if a == b { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-5, "({a},{b}): {dot}");
            }
        }
    }

    #[test]
    fn rotations_are_orthogonal_and_transpose_inverts() {
        for kind in [RotationKind::DenseQr, RotationKind::Hadamard] {
            for dim in [16, 64, 128] {
                let r = Rotation::new(kind, dim, &mut seeded_rng(7, 0)).unwrap();
                assert_orthogonal(&r);
                let x: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.37).sin()).collect();
                let (mut y, mut back) = (vec![0f32; dim], vec![0f32; dim]);
                r.apply(&x, &mut y);
                r.apply_transpose(&y, &mut back);
                for (a, b) in x.iter().zip(&back) {
                    assert!((a - b).abs() < 1e-5, "{kind:?} {dim}");
                }
            }
        }
    }

    #[test]
    fn same_seed_same_rotation_other_seed_or_stream_differs() {
        for kind in [RotationKind::DenseQr, RotationKind::Hadamard] {
            let m = |seed, stream| {
                matrix_of(&Rotation::new(kind, 32, &mut seeded_rng(seed, stream)).unwrap())
            };
            assert_eq!(m(3, 0), m(3, 0));
            assert_ne!(m(3, 0), m(4, 0));
            assert_ne!(m(3, 0), m(3, 1));
        }
    }

    #[test]
    fn hadamard_needs_a_power_of_two() {
        assert!(Rotation::new(RotationKind::Hadamard, 96, &mut seeded_rng(0, 0)).is_none());
        assert!(Rotation::new(RotationKind::DenseQr, 96, &mut seeded_rng(0, 0)).is_some());
    }

    #[test]
    fn dense_rotation_spreads_a_basis_vector_evenly() {
        // A Haar rotation maps e_0 to a uniform point of the sphere: its largest coordinate is
        // O(√(log d / d)), far below 1.
        let r = Rotation::new(RotationKind::DenseQr, 256, &mut seeded_rng(1, 0)).unwrap();
        let col = &matrix_of(&r)[0];
        let largest = col.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(largest < 0.3, "{largest}");
    }
}
