//! Matrix products with quantized weights, on all cores.
//!
//! * One token (decode): [`QMatrix::matvec`] quantizes the activations to 8 bits in blocks of 32
//!   ([`QActivations`]) and takes integer dot products with the weight blocks as they are
//!   stored, with AVX2 kernels for the types the reference model uses (Q8_0, Q5_0, Q4_K, Q6_K)
//!   and a portable path for the rest.
//! * Many tokens (prefill): [`QMatrix::matmul`] dequantizes tiles of weight rows to f32 once and
//!   multiplies them with every token through `matrixmultiply`'s SGEMM.
//!
//! Work is split over output rows on rayon's pool.

use crate::gguf::TensorType;
use crate::quant::{dequantize_row, QActivations};
use rayon::prelude::*;

/// A weight matrix of `rows × cols` elements (`cols` is the input width), stored as GGUF stores
/// it: row-major blocks of `dtype`.
pub struct QMatrix {
    /// Element type.
    pub dtype: TensorType,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// The raw bytes, `rows · dtype.row_bytes(cols)` long.
    pub data: Vec<u8>,
}

/// Output rows per parallel task of a matrix-vector product.
const MATVEC_ROWS_PER_TASK: usize = 64;
/// Weight rows dequantized per tile of a matrix-matrix product.
const MATMUL_TILE_ROWS: usize = 128;

thread_local! {
    /// Each thread's dequantized weight tile for [`QMatrix::matmul`], kept between tiles and
    /// calls: a fresh one per tile was zeroed first (1% of a prefill's samples).
    static TILE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

impl QMatrix {
    /// Bytes of one weight row.
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols)
    }

    /// The bytes of weight row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    /// Dequantizes weight row `r` into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize_row(self.dtype, self.row(r), out);
    }

    /// A `rows × cols` matrix of random `dtype` blocks, for tests and benchmarks: random bytes
    /// make valid blocks of every type once the f16 scales are tamed (to ±0.05).
    pub fn random(dtype: TensorType, rows: usize, cols: usize, rng: &mut impl rand::Rng) -> Self {
        let mut data: Vec<u8> = (0..rows * dtype.row_bytes(cols))
            .map(|_| rng.gen())
            .collect();
        let (_, block_bytes) = dtype.block();
        let scale_offsets: &[usize] = match dtype {
            TensorType::Q8_0 | TensorType::Q5_0 | TensorType::Q4_0 => &[0],
            TensorType::Q4K => &[0, 2],
            TensorType::Q6K => &[208],
            _ => &[],
        };
        for blk in data.chunks_exact_mut(block_bytes) {
            for &o in scale_offsets {
                let v = half::f16::from_f32(rng.gen_range(-0.05..0.05));
                blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        QMatrix {
            dtype,
            rows,
            cols,
            data,
        }
    }

    /// `y = W·x` for one activation vector (`x.len() == cols`, `y.len() == rows`).
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        let kernel = simd::row_kernel(self.dtype);
        let mut qx = QActivations::default();
        if kernel.is_some() {
            qx.quantize(x);
        }
        y.par_chunks_mut(MATVEC_ROWS_PER_TASK)
            .enumerate()
            .for_each(|(task, ys)| {
                let first = task * MATVEC_ROWS_PER_TASK;
                let mut scratch = Vec::new();
                for (i, yv) in ys.iter_mut().enumerate() {
                    let row = self.row(first + i);
                    *yv = match kernel {
                        // SAFETY: `row_kernel` gives only kernels that this CPU runs.
                        Some(dot) => unsafe { dot(row, &qx) },
                        None => {
                            scratch.resize(self.cols, 0.0);
                            dequantize_row(self.dtype, row, &mut scratch);
                            scratch.iter().zip(x).map(|(a, b)| a * b).sum()
                        }
                    };
                }
            });
    }

    /// `Y = X·Wᵀ` for `tokens` activation rows (`x`: `tokens × cols`, `y`: `tokens × rows`).
    pub fn matmul(&self, x: &[f32], tokens: usize, y: &mut [f32]) {
        if tokens < 4 {
            for (xr, yr) in x.chunks_exact(self.cols).zip(y.chunks_exact_mut(self.rows)) {
                self.matvec(xr, yr);
            }
            return;
        }
        let out = SharedOut(y.as_mut_ptr());
        let tiles = self.rows.div_ceil(MATMUL_TILE_ROWS);
        (0..tiles).into_par_iter().for_each(|tile| {
            let first = tile * MATMUL_TILE_ROWS;
            let n = MATMUL_TILE_ROWS.min(self.rows - first);
            let mut tile_rows = TILE.with(std::cell::Cell::take);
            if tile_rows.len() < n * self.cols {
                tile_rows.resize(n * self.cols, 0.0);
            }
            let w = &mut tile_rows[..n * self.cols];
            for (i, wr) in w.chunks_exact_mut(self.cols).enumerate() {
                self.dequantize_row(first + i, wr);
            }
            // SAFETY: each tile writes only columns first..first+n of every row of `y`, and
            // tiles are disjoint; `y` outlives the parallel loop.
            unsafe {
                matrixmultiply::sgemm(
                    tokens,
                    self.cols,
                    n,
                    1.0,
                    x.as_ptr(),
                    self.cols as isize,
                    1,
                    w.as_ptr(),
                    1,
                    self.cols as isize,
                    0.0,
                    out.get().add(first),
                    self.rows as isize,
                    1,
                );
            }
            TILE.with(|t| t.set(tile_rows));
        });
    }
}

#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: used only for disjoint writes inside `matmul`.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}
impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! Integer dot products of one weight row with 8-bit activations (AVX2). A Q5_0 kernel
    //! on AVX-512 VNNI (one `vpdpbusd` per block, unsigned weights) was no faster on Zen 4 or
    //! on a Xeon (bench/cpu/NOTES.md, session 24).
    use crate::gguf::TensorType;
    use crate::quant::{k_scale_min, QActivations};
    // The block scales converted by F16C in a register: `half`'s conversion is a function
    // with its own target features that these kernels cannot inline (per Q8_0 block of the LM
    // head a call, a `vzeroupper` and three spilled registers).
    use kvq_codec::simd::{f16_at, hsum, use_avx2};
    use std::arch::x86_64::*;

    /// A row kernel: the dot of one weight row with the quantized activations. Callable only
    /// on a CPU with the features it was chosen for ([`row_kernel`]).
    pub type RowDot = unsafe fn(&[u8], &QActivations) -> f32;

    /// The fastest kernel this CPU runs (within the ISA limit of `kvq_codec::simd`) for rows
    /// of `dtype`, if there is one.
    pub fn row_kernel(dtype: TensorType) -> Option<RowDot> {
        if !use_avx2() {
            return None;
        }
        Some(match dtype {
            TensorType::Q8_0 => dot_q8_0,
            TensorType::Q5_0 => dot_q5_0,
            TensorType::Q4K => dot_q4_k,
            TensorType::Q6K => dot_q6_k,
            _ => return None,
        })
    }

    /// Signed 8-bit dot of 32 pairs, as 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_signed(w: __m256i, x: __m256i) -> __m256i {
        let abs_w = _mm256_sign_epi8(w, w);
        let x_signed = _mm256_sign_epi8(x, w);
        let pairs = _mm256_maddubs_epi16(abs_w, x_signed);
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_x(qx: &QActivations, block: usize) -> __m256i {
        _mm256_loadu_si256(qx.quants.as_ptr().add(32 * block) as *const __m256i)
    }

    /// 32 bytes, byte `i` = 0xFF where bit `i` of `bits` is set.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bytes_from_bits(bits: u32) -> __m256i {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_set_epi64x(
                0x0303030303030303,
                0x0202020202020202,
                0x0101010101010101,
                0,
            ),
        );
        let all_but_one = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        _mm256_cmpeq_epi8(_mm256_or_si256(spread, all_but_one), _mm256_set1_epi64x(-1))
    }

    /// How far ahead of the kernel the weights are asked for, in [`sum_blocks`]. A product
    /// streams its rows (each task's rows are one run of memory); the hardware prefetcher
    /// alone left the LM head at ~13 GB/s per core (Zen 3). The K-quant kernels, bound by
    /// their own work, came out 1–2% slower with it and go without.
    const PREFETCH_BYTES: usize = 4096;

    /// Asks for the cache lines `PREFETCH_BYTES` past those of `bytes` (a prefetch beyond the
    /// weights' end is harmless: prefetches do not fault).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prefetch_ahead(bytes: &[u8]) {
        for offset in (0..bytes.len()).step_by(64) {
            let ahead = bytes.as_ptr().wrapping_add(PREFETCH_BYTES + offset);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
        }
    }

    /// Σ over the row's blocks of `BYTES` bytes of `block(b, bytes)`: a vector of products and
    /// the factor it is scaled by. Two accumulators, even and odd blocks: on one, each block's
    /// FMA would wait for the one before it (4 cycles per block, more than the rest of its work).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_blocks<const BYTES: usize>(
        row: &[u8],
        mut block: impl FnMut(usize, &[u8]) -> (__m256, f32),
    ) -> f32 {
        let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut pairs = row.chunks_exact(2 * BYTES);
        for (p, pair) in pairs.by_ref().enumerate() {
            prefetch_ahead(pair);
            let (dots, scale) = block(2 * p, &pair[..BYTES]);
            even = _mm256_fmadd_ps(dots, _mm256_set1_ps(scale), even);
            let (dots, scale) = block(2 * p + 1, &pair[BYTES..]);
            odd = _mm256_fmadd_ps(dots, _mm256_set1_ps(scale), odd);
        }
        if pairs.remainder().len() == BYTES {
            let (dots, scale) = block(row.len() / BYTES - 1, pairs.remainder());
            even = _mm256_fmadd_ps(dots, _mm256_set1_ps(scale), even);
        }
        hsum(_mm256_add_ps(even, odd))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q8_0(row: &[u8], qx: &QActivations) -> f32 {
        sum_blocks::<34>(row, |b, blk| {
            let w = _mm256_loadu_si256(blk.as_ptr().add(2) as *const __m256i);
            let dots = _mm256_cvtepi32_ps(dot_signed(w, load_x(qx, b)));
            (dots, f16_at(blk.as_ptr()) * qx.scales[b])
        })
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q5_0(row: &[u8], qx: &QActivations) -> f32 {
        let low_mask = _mm_set1_epi8(0x0F);
        sum_blocks::<22>(row, |b, blk| {
            let qh = std::ptr::read_unaligned(blk.as_ptr().add(2) as *const u32);
            let qs = _mm_loadu_si128(blk.as_ptr().add(6) as *const __m128i);
            let lo = _mm_and_si128(qs, low_mask);
            let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low_mask);
            // value = (nibble | fifth_bit << 4) - 16: where the fifth bit is clear, OR 0xF0.
            let missing_bit =
                _mm256_andnot_si256(bytes_from_bits(qh), _mm256_set1_epi8(0xF0u8 as i8));
            let w = _mm256_or_si256(_mm256_set_m128i(hi, lo), missing_bit);
            let dots = _mm256_cvtepi32_ps(dot_signed(w, load_x(qx, b)));
            (dots, f16_at(blk.as_ptr()) * qx.scales[b])
        })
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q4_k(row: &[u8], qx: &QActivations) -> f32 {
        // Two accumulators (low and high nibbles), as in `sum_blocks`.
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut min_sum = 0f32;
        let low_mask = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        for (sb, blk) in row.chunks_exact(144).enumerate() {
            let (d, dmin) = (f16_at(blk.as_ptr()), f16_at(blk.as_ptr().add(2)));
            let scales = &blk[4..16];
            for chunk in 0..4 {
                let q = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * chunk) as *const __m256i);
                let halves = [
                    _mm256_and_si256(q, low_mask),
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask),
                ];
                for (h, w) in halves.into_iter().enumerate() {
                    let j = 2 * chunk + h;
                    let b = 8 * sb + j;
                    let (sc, m) = k_scale_min(scales, j);
                    let pairs = _mm256_maddubs_epi16(w, load_x(qx, b));
                    let dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    let scale = _mm256_set1_ps(d * f32::from(sc) * qx.scales[b]);
                    acc[h] = _mm256_fmadd_ps(dots, scale, acc[h]);
                    min_sum +=
                        dmin * f32::from(m) * (qx.half_sums[2 * b] + qx.half_sums[2 * b + 1]);
                }
            }
        }
        hsum(_mm256_add_ps(acc[0], acc[1])) - min_sum
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q6_k(row: &[u8], qx: &QActivations) -> f32 {
        // Two accumulators (even and odd groups), as in `sum_blocks`.
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut offset_sum = 0f32;
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        for (sb, blk) in row.chunks_exact(210).enumerate() {
            let d = f16_at(blk.as_ptr().add(208));
            for half in 0..2 {
                let ql0 = _mm256_loadu_si256(blk.as_ptr().add(64 * half) as *const __m256i);
                let ql1 = _mm256_loadu_si256(blk.as_ptr().add(64 * half + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(blk.as_ptr().add(128 + 32 * half) as *const __m256i);
                let high = |shift: i32| -> __m256i {
                    let bits = match shift {
                        0 => qh,
                        2 => _mm256_srli_epi16(qh, 2),
                        4 => _mm256_srli_epi16(qh, 4),
                        _ => _mm256_srli_epi16(qh, 6),
                    };
                    _mm256_slli_epi16(_mm256_and_si256(bits, m2), 4)
                };
                let groups = [
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                    _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6)),
                ];
                let sc = &blk[192 + 8 * half..192 + 8 * half + 8];
                for (g, w) in groups.into_iter().enumerate() {
                    let b = 8 * sb + 4 * half + g;
                    let (sc_a, sc_b) = (sc[2 * g] as i8, sc[2 * g + 1] as i8);
                    let pairs = _mm256_maddubs_epi16(w, load_x(qx, b));
                    let scale16 = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(sc_b)),
                        _mm_set1_epi16(i16::from(sc_a)),
                    );
                    let dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, scale16));
                    acc[g % 2] =
                        _mm256_fmadd_ps(dots, _mm256_set1_ps(d * qx.scales[b]), acc[g % 2]);
                    offset_sum += 32.0
                        * d
                        * (f32::from(sc_a) * qx.half_sums[2 * b]
                            + f32::from(sc_b) * qx.half_sums[2 * b + 1]);
                }
            }
        }
        hsum(_mm256_add_ps(acc[0], acc[1])) - offset_sum
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use crate::gguf::TensorType;
    use crate::quant::QActivations;
    pub type RowDot = unsafe fn(&[u8], &QActivations) -> f32;
    pub fn row_kernel(_: TensorType) -> Option<RowDot> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random_matrix(dtype: TensorType, rows: usize, cols: usize, seed: u64) -> QMatrix {
        QMatrix::random(
            dtype,
            rows,
            cols,
            &mut rand::rngs::StdRng::seed_from_u64(seed),
        )
    }

    fn reference_matvec(w: &QMatrix, x: &[f32]) -> Vec<f32> {
        let mut row = vec![0f32; w.cols];
        (0..w.rows)
            .map(|r| {
                w.dequantize_row(r, &mut row);
                row.iter()
                    .zip(x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>() as f32
            })
            .collect()
    }

    #[test]
    fn integer_kernels_match_dequantized_dot_products() {
        for dtype in [
            TensorType::Q8_0,
            TensorType::Q5_0,
            TensorType::Q4K,
            TensorType::Q6K,
            TensorType::Q4_0,
        ] {
            // An even and an odd count of blocks (the kernels take blocks in pairs).
            let (block_elems, _) = dtype.block();
            for cols in [
                2 * block_elems.max(256),
                3 * block_elems.max(256) + block_elems,
            ] {
                let rows = 70;
                let w = random_matrix(dtype, rows, cols, 7);
                let mut rng = rand::rngs::StdRng::seed_from_u64(3);
                let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
                // Integer kernels see 8-bit activations: compare against the exact product
                // with those activations, and loosely against the f32 activations.
                let mut qx = QActivations::default();
                qx.quantize(&x);
                let exact = reference_matvec(&w, &qx.dequantize());
                let norm = exact.iter().map(|v| v.abs()).fold(0f32, f32::max).max(1e-3);
                let mut y = vec![0f32; rows];
                w.matvec(&x, &mut y);
                let tol = if simd::row_kernel(dtype).is_some() {
                    1e-4
                } else {
                    2e-2
                };
                for (r, (a, b)) in y.iter().zip(&exact).enumerate() {
                    assert!(
                        (a - b).abs() <= tol * norm,
                        "{dtype:?} {cols} columns, row {r}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn matmul_equals_repeated_matvec_on_f32_activations() {
        let w = random_matrix(TensorType::Q5_0, 300, 256, 11);
        let tokens = 9;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let x: Vec<f32> = (0..tokens * 256)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let mut y = vec![0f32; tokens * 300];
        w.matmul(&x, tokens, &mut y);
        for t in 0..tokens {
            let exact = reference_matvec(&w, &x[t * 256..(t + 1) * 256]);
            for (a, b) in y[t * 300..(t + 1) * 300].iter().zip(&exact) {
                assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }
    }
}
