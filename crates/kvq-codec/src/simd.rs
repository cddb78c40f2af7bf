//! Vector kernels shared by the codecs' fused loops: dot products and scaled accumulation of
//! f32 queries/accumulators with rows stored as f32, f16 or bf16 bytes. AVX2/FMA/F16C paths
//! are chosen at run time; the scalar paths give the same results within float rounding.

use half::{bf16, f16};

/// Storage of a row of floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    /// Little-endian f32.
    F32,
    /// Little-endian IEEE f16.
    F16,
    /// Little-endian bfloat16.
    Bf16,
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    })
}

#[inline]
fn load(format: RowFormat, row: &[u8], i: usize) -> f32 {
    match format {
        RowFormat::F32 => f32::from_le_bytes(row[4 * i..4 * i + 4].try_into().unwrap()),
        RowFormat::F16 => f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32(),
        RowFormat::Bf16 => bf16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32(),
    }
}

/// `Σ q[i]·row[i]` over `q.len()` elements of `row`.
#[inline]
pub fn dot(format: RowFormat, q: &[f32], row: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && q.len().is_multiple_of(8) {
        // SAFETY: the CPU supports AVX2, FMA and F16C; lengths are checked by the slicing.
        return unsafe { avx2::dot(format, q, row) };
    }
    (0..q.len()).map(|i| q[i] * load(format, row, i)).sum()
}

/// `acc[i] += w·row[i]` over `acc.len()` elements of `row`.
#[inline]
pub fn axpy(format: RowFormat, w: f32, row: &[u8], acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && acc.len().is_multiple_of(8) {
        // SAFETY: as in `dot`.
        return unsafe { avx2::axpy(format, w, row, acc) };
    }
    for (i, a) in acc.iter_mut().enumerate() {
        *a += w * load(format, row, i);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::RowFormat;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(format: RowFormat, row: &[u8], i: usize) -> __m256 {
        match format {
            RowFormat::F32 => {
                let s = &row[4 * i..4 * i + 32];
                _mm256_loadu_ps(s.as_ptr() as *const f32)
            }
            RowFormat::F16 => {
                let s = &row[2 * i..2 * i + 16];
                _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr() as *const __m128i))
            }
            RowFormat::Bf16 => {
                let s = &row[2 * i..2 * i + 16];
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.as_ptr() as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(format: RowFormat, q: &[f32], row: &[u8]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 2];
        for (j, i) in (0..q.len()).step_by(8).enumerate() {
            let x = load8(format, row, i);
            acc[j & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), x, acc[j & 1]);
        }
        let v = _mm256_add_ps(acc[0], acc[1]);
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy(format: RowFormat, w: f32, row: &[u8], acc: &mut [f32]) {
        let wv = _mm256_set1_ps(w);
        for i in (0..acc.len()).step_by(8) {
            let p = acc.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(wv, load8(format, row, i), _mm256_loadu_ps(p)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(format: RowFormat, xs: &[f32]) -> Vec<u8> {
        xs.iter()
            .flat_map(|&x| match format {
                RowFormat::F32 => x.to_le_bytes().to_vec(),
                RowFormat::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
                RowFormat::Bf16 => bf16::from_f32(x).to_le_bytes().to_vec(),
            })
            .collect()
    }

    #[test]
    fn vector_paths_equal_scalar_definitions() {
        for format in [RowFormat::F32, RowFormat::F16, RowFormat::Bf16] {
            for n in [8usize, 64, 72, 256, 5] {
                let q: Vec<f32> = (0..n).map(|i| ((i * 31 % 17) as f32 - 8.0) / 3.0).collect();
                let xs: Vec<f32> = (0..n).map(|i| ((i * 13 % 11) as f32 - 5.0) / 7.0).collect();
                let row = encode(format, &xs);
                let exact: f32 = (0..n).map(|i| q[i] * load(format, &row, i)).sum();
                assert!((dot(format, &q, &row) - exact).abs() < 1e-4 * (1.0 + exact.abs()), "{format:?} {n}");
                let mut acc = q.clone();
                axpy(format, 0.5, &row, &mut acc);
                for i in 0..n {
                    assert!((acc[i] - (q[i] + 0.5 * load(format, &row, i))).abs() < 1e-5);
                }
            }
        }
    }
}
