//! Vector kernels shared by the codecs' fused loops: dot products and scaled accumulation of
//! f32 queries/accumulators with rows stored as f32, f16 or bf16 bytes. AVX2/FMA/F16C paths
//! are chosen at run time; the scalar paths give the same results within float rounding.
//!
//! Besides float rows, the kernels here read packed integer codes (`bits` ∈ {1, 2, 3, 4, 8}
//! per code, least significant bit first as [`crate::bits`] writes them): as plain integers
//! ([`dot_codes`], [`axpy_codes`]) or through a table of up to 16 levels ([`dot_lut`],
//! [`axpy_lut`]). The crate-internal `avx2` helpers (code unpacking, table lookup, horizontal sum) serve the
//! codecs' own block kernels. [`force_scalar`] runs a closure on the scalar paths, so tests can
//! compare both.

use half::{bf16, f16};
use std::cell::Cell;

thread_local! {
    static SCALAR_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every vector kernel of this crate disabled on the calling thread (the scalar
/// fallbacks run instead), then restores the previous setting.
pub fn force_scalar<R>(f: impl FnOnce() -> R) -> R {
    let before = SCALAR_ONLY.with(|s| s.replace(true));
    let result = f();
    SCALAR_ONLY.with(|s| s.set(before));
    result
}

/// Whether the AVX2/FMA/F16C kernels may run: the CPU has them and [`force_scalar`] is not in
/// effect on this thread.
#[inline]
pub fn use_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        return !SCALAR_ONLY.with(Cell::get);
    }
    false
}

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
    if use_avx2() && q.len().is_multiple_of(8) {
        // SAFETY: the CPU supports AVX2, FMA and F16C; lengths are checked by the slicing.
        return unsafe { avx2::dot(format, q, row) };
    }
    (0..q.len()).map(|i| q[i] * load(format, row, i)).sum()
}

/// `acc[i] += w·row[i]` over `acc.len()` elements of `row`.
#[inline]
pub fn axpy(format: RowFormat, w: f32, row: &[u8], acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() && acc.len().is_multiple_of(8) {
        // SAFETY: as in `dot`.
        return unsafe { avx2::axpy(format, w, row, acc) };
    }
    for (i, a) in acc.iter_mut().enumerate() {
        *a += w * load(format, row, i);
    }
}

/// `scores[t] = Σ q[i]·row_t[i]` for consecutive rows of `q.len()` elements in `rows`.
pub fn dot_rows(format: RowFormat, q: &[f32], rows: &[u8], scores: &mut [f32]) {
    let row_bytes = rows.len() / scores.len().max(1);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() && q.len().is_multiple_of(8) {
        // SAFETY: AVX2/FMA/F16C are present; every access is bounds-checked by slicing.
        return unsafe { avx2::dot_rows(format, q, rows, row_bytes, scores) };
    }
    for (s, row) in scores.iter_mut().zip(rows.chunks_exact(row_bytes)) {
        *s = dot(format, q, row);
    }
}

/// `acc[i] += Σ_t weights[t]·row_t[i]` for consecutive rows of `acc.len()` elements in `rows`.
pub fn axpy_rows(format: RowFormat, weights: &[f32], rows: &[u8], acc: &mut [f32]) {
    let row_bytes = rows.len() / weights.len().max(1);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() && acc.len().is_multiple_of(8) {
        // SAFETY: as in `dot_rows`.
        return unsafe { avx2::axpy_rows(format, weights, rows, row_bytes, acc) };
    }
    for (&w, row) in weights.iter().zip(rows.chunks_exact(row_bytes)) {
        axpy(format, w, row, acc);
    }
}

/// Heads a group kernel keeps in registers at once.
const GROUP_MAX: usize = 8;

/// [`dot_rows`] for several queries: each row is loaded and converted once for all of them.
pub fn dot_rows_group(
    format: RowFormat,
    queries: &[&[f32]],
    rows: &[u8],
    scores: &mut [&mut [f32]],
) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2()
        && queries.len() <= GROUP_MAX
        && queries
            .iter()
            .all(|q| q.len().is_multiple_of(8) && q.len() == queries[0].len())
    {
        // SAFETY: AVX2/FMA/F16C are present; every access is bounds-checked by slicing.
        return unsafe { avx2::dot_rows_group(format, queries, rows, scores) };
    }
    for (q, s) in queries.iter().zip(scores.iter_mut()) {
        dot_rows(format, q, rows, s);
    }
}

/// [`axpy_rows`] for several weight rows: each stored row is loaded and converted once.
pub fn axpy_rows_group(
    format: RowFormat,
    weights: &[&[f32]],
    rows: &[u8],
    accs: &mut [&mut [f32]],
) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2()
        && weights.len() <= GROUP_MAX
        && accs
            .iter()
            .all(|a| a.len().is_multiple_of(8) && a.len() == accs[0].len())
    {
        // SAFETY: as in `dot_rows_group`.
        return unsafe { avx2::axpy_rows_group(format, weights, rows, accs) };
    }
    for (w, a) in weights.iter().zip(accs.iter_mut()) {
        axpy_rows(format, w, rows, a);
    }
}

/// The 8 codes of width `B` packed in `bytes[..B]` (least significant bit first).
#[inline(always)]
fn eight_codes<const B: usize>(bytes: &[u8]) -> [u8; 8] {
    let mut word = [0u8; 8];
    word[..B].copy_from_slice(&bytes[..B]);
    let packed = u64::from_le_bytes(word);
    let mask = (1u64 << B) - 1;
    std::array::from_fn(|k| ((packed >> (B * k)) & mask) as u8)
}

/// Calls `f(i, code)` for the `count` (a multiple of 8) codes of width `B` in `packed`.
#[inline(always)]
fn each_code<const B: usize>(packed: &[u8], count: usize, mut f: impl FnMut(usize, u8)) {
    for (group, bytes) in packed.chunks_exact(B).take(count / 8).enumerate() {
        for (k, code) in eight_codes::<B>(bytes).into_iter().enumerate() {
            f(8 * group + k, code);
        }
    }
}

/// Expands to `$body` with the const `$b` bound to the code width `$bits` (1, 2, 3, 4 or 8).
macro_rules! with_width {
    ($bits:expr, $b:ident => $body:expr) => {
        match $bits {
            1 => {
                const $b: usize = 1;
                $body
            }
            2 => {
                const $b: usize = 2;
                $body
            }
            3 => {
                const $b: usize = 3;
                $body
            }
            4 => {
                const $b: usize = 4;
                $body
            }
            8 => {
                const $b: usize = 8;
                $body
            }
            other => unreachable!("unsupported code width {other}"),
        }
    };
}

/// `Σ_g scales[g] · Σ_{i ∈ g} q[i]·code_i`, where the `q.len()` codes of width `bits` packed in
/// `packed` form `scales.len()` equal groups of a multiple of 8 codes each.
pub fn dot_codes(packed: &[u8], bits: u32, q: &[f32], scales: &[f32]) -> f32 {
    let group = q.len() / scales.len();
    assert!(group.is_multiple_of(8) && group * scales.len() == q.len());
    assert!(packed.len() >= q.len() / 8 * bits as usize);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the CPU supports AVX2/FMA/F16C; `packed` holds all codes (asserted above).
        return with_width!(bits, B => unsafe { avx2::dot_codes::<B>(packed, q, scales, None) });
    }
    let mut sums = vec![0.0f32; scales.len()];
    with_width!(bits, B => each_code::<B>(packed, q.len(), |i, c| {
        sums[i / group] += q[i] * f32::from(c);
    }));
    sums.iter().zip(scales).map(|(d, s)| d * s).sum()
}

/// `acc[i] += a[g]·code_i + b[g]` over the `acc.len()` codes of width `bits`, which form
/// `a.len()` (= `b.len()`) equal groups `g` of a multiple of 8 codes each.
pub fn axpy_codes(packed: &[u8], bits: u32, a: &[f32], b: &[f32], acc: &mut [f32]) {
    let group = acc.len() / a.len();
    assert!(group.is_multiple_of(8) && group * a.len() == acc.len() && b.len() == a.len());
    assert!(packed.len() >= acc.len() / 8 * bits as usize);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: as in `dot_codes`.
        return with_width!(bits, B => unsafe { avx2::axpy_codes::<B>(packed, a, b, None, acc) });
    }
    with_width!(bits, B => each_code::<B>(packed, acc.len(), |i, c| {
        acc[i] += a[i / group] * f32::from(c) + b[i / group];
    }));
}

/// `Σ_i q[i]·lut[code_i]` over the `q.len()` (a multiple of 8) codes of width `bits` ≤ 4.
pub fn dot_lut(packed: &[u8], bits: u32, lut: &[f32; 16], q: &[f32]) -> f32 {
    assert!(bits <= 4 && q.len().is_multiple_of(8));
    assert!(packed.len() >= q.len() / 8 * bits as usize);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: as in `dot_codes`.
        return with_width!(bits, B => unsafe {
            avx2::dot_codes::<B>(packed, q, &[1.0], Some(avx2::Lut::new(lut)))
        });
    }
    let mut sum = 0.0f32;
    with_width!(bits, B => each_code::<B>(packed, q.len(), |i, c| {
        sum += q[i] * lut[usize::from(c)];
    }));
    sum
}

/// `acc[i] += a·lut[code_i]` over the `acc.len()` (a multiple of 8) codes of width `bits` ≤ 4.
pub fn axpy_lut(packed: &[u8], bits: u32, lut: &[f32; 16], a: f32, acc: &mut [f32]) {
    assert!(bits <= 4 && acc.len().is_multiple_of(8));
    assert!(packed.len() >= acc.len() / 8 * bits as usize);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: as in `dot_codes`.
        return with_width!(bits, B => unsafe {
            avx2::axpy_codes::<B>(packed, &[a], &[0.0], Some(avx2::Lut::new(lut)), acc)
        });
    }
    with_width!(bits, B => each_code::<B>(packed, acc.len(), |i, c| {
        acc[i] += a * lut[usize::from(c)];
    }));
}

/// AVX2/FMA/F16C kernels and the helpers the codecs' block kernels share. Every function
/// requires a CPU with AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::RowFormat;
    use std::arch::x86_64::*;

    /// The sum of the 8 lanes of `v`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// The little-endian f16 at `p` as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_at(p: *const u8) -> f32 {
        let h = i32::from(std::ptr::read_unaligned(p as *const u16));
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)))
    }

    /// The 8 codes of width `B` (1, 2, 3, 4 or 8) in the `B` bytes at `p`, least significant
    /// bit first, one per 32-bit lane. Reads exactly `B` bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn codes8<const B: usize>(p: *const u8) -> __m256i {
        if B == 8 {
            return _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
        }
        let word = match B {
            1 => u32::from(*p),
            2 => u32::from(std::ptr::read_unaligned(p as *const u16)),
            3 => u32::from(std::ptr::read_unaligned(p as *const u16)) | u32::from(*p.add(2)) << 16,
            _ => std::ptr::read_unaligned(p as *const u32),
        };
        let b = B as i32;
        let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
        let mask = _mm256_set1_epi32((1 << B) - 1);
        _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts),
            mask,
        )
    }

    /// A table of 16 f32 levels held in two registers.
    #[derive(Clone, Copy)]
    pub struct Lut(__m256, __m256);

    impl Lut {
        /// Loads the table.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn new(levels: &[f32; 16]) -> Self {
            Self(
                _mm256_loadu_ps(levels.as_ptr()),
                _mm256_loadu_ps(levels.as_ptr().add(8)),
            )
        }

        /// `levels[idx]` per lane (`idx` in `0..16`).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn get(self, idx: __m256i) -> __m256 {
            let lo = _mm256_permutevar8x32_ps(self.0, idx);
            let hi = _mm256_permutevar8x32_ps(self.1, idx);
            // Bit 3 of the index, moved to the sign bit, picks the upper half.
            _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)))
        }
    }

    /// The levels of 8 codes: the codes themselves, or their entries in `lut`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn levels(codes: __m256i, lut: Option<Lut>) -> __m256 {
        match lut {
            Some(lut) => lut.get(codes),
            None => _mm256_cvtepi32_ps(codes),
        }
    }

    /// [`super::dot_codes`] (and [`super::dot_lut`] with `lut`) for code width `B`; `packed`
    /// must hold `q.len()/8·B` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_codes<const B: usize>(
        packed: &[u8],
        q: &[f32],
        scales: &[f32],
        lut: Option<Lut>,
    ) -> f32 {
        let per_group = q.len() / scales.len() / 8;
        let (mut p, mut qp) = (packed.as_ptr(), q.as_ptr());
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for &s in scales {
            let s = _mm256_set1_ps(s);
            for _ in 0..per_group {
                let x = levels(codes8::<B>(p), lut);
                let sum = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(qp), s), x, acc0);
                // Alternate two accumulators to halve the dependency chain.
                acc0 = acc1;
                acc1 = sum;
                p = p.add(B);
                qp = qp.add(8);
            }
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    /// [`super::axpy_codes`] (and [`super::axpy_lut`] with `lut`, `b = [0]`) for code width
    /// `B`; `packed` must hold `acc.len()/8·B` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_codes<const B: usize>(
        packed: &[u8],
        a: &[f32],
        b: &[f32],
        lut: Option<Lut>,
        acc: &mut [f32],
    ) {
        let per_group = acc.len() / a.len() / 8;
        let (mut p, mut out) = (packed.as_ptr(), acc.as_mut_ptr());
        for (&a, &b) in a.iter().zip(b) {
            let (av, bv) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
            for _ in 0..per_group {
                let x = levels(codes8::<B>(p), lut);
                _mm256_storeu_ps(
                    out,
                    _mm256_fmadd_ps(av, x, _mm256_add_ps(_mm256_loadu_ps(out), bv)),
                );
                p = p.add(B);
                out = out.add(8);
            }
        }
    }

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

    /// [`super::dot`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(format: RowFormat, q: &[f32], row: &[u8]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 2];
        for (j, i) in (0..q.len()).step_by(8).enumerate() {
            let x = load8(format, row, i);
            acc[j & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), x, acc[j & 1]);
        }
        hsum(_mm256_add_ps(acc[0], acc[1]))
    }

    /// [`super::dot_rows`]: two rows at a time share the query loads.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_rows(
        format: RowFormat,
        q: &[f32],
        rows: &[u8],
        row_bytes: usize,
        scores: &mut [f32],
    ) {
        let n = scores.len();
        let mut t = 0;
        while t + 2 <= n {
            let (r0, r1) = (
                &rows[t * row_bytes..][..row_bytes],
                &rows[(t + 1) * row_bytes..][..row_bytes],
            );
            let mut acc = [_mm256_setzero_ps(); 4];
            for (j, i) in (0..q.len()).step_by(8).enumerate() {
                let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                acc[j & 1] = _mm256_fmadd_ps(qv, load8(format, r0, i), acc[j & 1]);
                acc[2 + (j & 1)] = _mm256_fmadd_ps(qv, load8(format, r1, i), acc[2 + (j & 1)]);
            }
            scores[t] = hsum(_mm256_add_ps(acc[0], acc[1]));
            scores[t + 1] = hsum(_mm256_add_ps(acc[2], acc[3]));
            t += 2;
        }
        if t < n {
            scores[t] = dot(format, q, &rows[t * row_bytes..][..row_bytes]);
        }
    }

    /// [`super::axpy_rows`]: four rows at a time per load and store of the accumulator.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_rows(
        format: RowFormat,
        weights: &[f32],
        rows: &[u8],
        row_bytes: usize,
        acc: &mut [f32],
    ) {
        let n = weights.len();
        let mut t = 0;
        while t + 4 <= n {
            let r: [&[u8]; 4] = std::array::from_fn(|k| &rows[(t + k) * row_bytes..][..row_bytes]);
            let w: [__m256; 4] = std::array::from_fn(|k| _mm256_set1_ps(weights[t + k]));
            for i in (0..acc.len()).step_by(8) {
                let p = acc.as_mut_ptr().add(i);
                let mut a = _mm256_loadu_ps(p);
                for k in 0..4 {
                    a = _mm256_fmadd_ps(w[k], load8(format, r[k], i), a);
                }
                _mm256_storeu_ps(p, a);
            }
            t += 4;
        }
        for k in t..n {
            axpy(format, weights[k], &rows[k * row_bytes..][..row_bytes], acc);
        }
    }

    /// [`super::dot_rows_group`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_rows_group(
        format: RowFormat,
        queries: &[&[f32]],
        rows: &[u8],
        scores: &mut [&mut [f32]],
    ) {
        let n = queries.len();
        let d = queries[0].len();
        let row_bytes = rows.len() / scores[0].len().max(1);
        for t in 0..scores[0].len() {
            let row = &rows[t * row_bytes..][..row_bytes];
            let mut acc = [_mm256_setzero_ps(); super::GROUP_MAX];
            for i in (0..d).step_by(8) {
                let x = load8(format, row, i);
                for h in 0..n {
                    let q = &queries[h][i..i + 8];
                    acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr()), x, acc[h]);
                }
            }
            for h in 0..n {
                scores[h][t] = hsum(acc[h]);
            }
        }
    }

    /// [`super::axpy_rows_group`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_rows_group(
        format: RowFormat,
        weights: &[&[f32]],
        rows: &[u8],
        accs: &mut [&mut [f32]],
    ) {
        let n = weights.len();
        let d = accs[0].len();
        let row_bytes = rows.len() / weights[0].len().max(1);
        for t in 0..weights[0].len() {
            let row = &rows[t * row_bytes..][..row_bytes];
            let w: [__m256; super::GROUP_MAX] =
                std::array::from_fn(|h| _mm256_set1_ps(if h < n { weights[h][t] } else { 0.0 }));
            for i in (0..d).step_by(8) {
                let x = load8(format, row, i);
                for h in 0..n {
                    let a = &mut accs[h][i..i + 8];
                    let v = _mm256_fmadd_ps(w[h], x, _mm256_loadu_ps(a.as_ptr()));
                    _mm256_storeu_ps(a.as_mut_ptr(), v);
                }
            }
        }
    }

    /// [`super::axpy`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy(format: RowFormat, w: f32, row: &[u8], acc: &mut [f32]) {
        let wv = _mm256_set1_ps(w);
        for i in (0..acc.len()).step_by(8) {
            let p = acc.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                p,
                _mm256_fmadd_ps(wv, load8(format, row, i), _mm256_loadu_ps(p)),
            );
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
                assert!(
                    (dot(format, &q, &row) - exact).abs() < 1e-4 * (1.0 + exact.abs()),
                    "{format:?} {n}"
                );
                let mut acc = q.clone();
                axpy(format, 0.5, &row, &mut acc);
                for i in 0..n {
                    assert!((acc[i] - (q[i] + 0.5 * load(format, &row, i))).abs() < 1e-5);
                }
            }
        }
    }

    #[test]
    fn code_kernels_agree_with_scalar() {
        let lut: [f32; 16] = std::array::from_fn(|i| (i as f32 - 7.3) * 0.37);
        for bits in [1u32, 2, 3, 4, 8] {
            for n in [8usize, 24, 64, 128] {
                let packed: Vec<u8> = (0..n / 8 * bits as usize)
                    .map(|i| (i * 89 + 17) as u8)
                    .collect();
                let q: Vec<f32> = (0..n).map(|i| ((i * 31 % 17) as f32 - 8.0) / 3.0).collect();
                let scales: Vec<f32> = (0..n / 8).map(|g| 0.5 + g as f32).collect();
                let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + a.abs().max(b.abs()));
                let both = |f: &dyn Fn() -> f32| (f(), force_scalar(f));
                let (v, s) = both(&|| dot_codes(&packed, bits, &q, &scales));
                assert!(close(v, s), "dot_codes {bits} {n}: {v} {s}");
                let (v, s) = both(&|| dot_codes(&packed, bits, &q, &[2.0]));
                assert!(close(v, s), "dot_codes {bits} {n}: {v} {s}");
                let mut acc_v = q.clone();
                axpy_codes(&packed, bits, &scales, &[-1.5; 128][..n / 8], &mut acc_v);
                let mut acc_s = q.clone();
                force_scalar(|| {
                    axpy_codes(&packed, bits, &scales, &[-1.5; 128][..n / 8], &mut acc_s)
                });
                assert!(acc_v.iter().zip(&acc_s).all(|(a, b)| close(*a, *b)));
                if bits <= 4 {
                    let (v, s) = both(&|| dot_lut(&packed, bits, &lut, &q));
                    assert!(close(v, s), "dot_lut {bits} {n}: {v} {s}");
                    let mut acc_v = q.clone();
                    axpy_lut(&packed, bits, &lut, 0.7, &mut acc_v);
                    let mut acc_s = q.clone();
                    force_scalar(|| axpy_lut(&packed, bits, &lut, 0.7, &mut acc_s));
                    assert!(acc_v.iter().zip(&acc_s).all(|(a, b)| close(*a, *b)));
                }
            }
        }
    }

    #[test]
    fn group_kernels_equal_one_query_at_a_time() {
        for format in [RowFormat::F32, RowFormat::F16, RowFormat::Bf16] {
            let (d, rows, heads) = (64, 9, 4);
            let xs: Vec<f32> = (0..rows * d)
                .map(|i| ((i * 13 % 11) as f32 - 5.0) / 7.0)
                .collect();
            let bytes = encode(format, &xs);
            let qs: Vec<Vec<f32>> = (0..heads)
                .map(|h| {
                    (0..d)
                        .map(|i| ((i * 31 + h * 7) % 17) as f32 / 9.0 - 0.9)
                        .collect()
                })
                .collect();
            let q_refs: Vec<&[f32]> = qs.iter().map(Vec::as_slice).collect();
            let mut grouped = vec![vec![0f32; rows]; heads];
            let mut refs: Vec<&mut [f32]> = grouped.iter_mut().map(Vec::as_mut_slice).collect();
            dot_rows_group(format, &q_refs, &bytes, &mut refs);
            let mut accs = vec![vec![0.5f32; d]; heads];
            let weights: Vec<Vec<f32>> = (0..heads)
                .map(|h| (0..rows).map(|t| (t + h) as f32 / 10.0).collect())
                .collect();
            let w_refs: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
            let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(Vec::as_mut_slice).collect();
            axpy_rows_group(format, &w_refs, &bytes, &mut acc_refs);
            for h in 0..heads {
                let mut one = vec![0f32; rows];
                force_scalar(|| dot_rows(format, &qs[h], &bytes, &mut one));
                for (a, b) in grouped[h].iter().zip(&one) {
                    assert!(
                        (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                        "{format:?} head {h}"
                    );
                }
                let mut acc = vec![0.5f32; d];
                force_scalar(|| axpy_rows(format, &weights[h], &bytes, &mut acc));
                for (a, b) in accs[h].iter().zip(&acc) {
                    assert!(
                        (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                        "{format:?} head {h}"
                    );
                }
            }
        }
    }
}
