//! Vector kernels shared by the codecs' fused loops: dot products and scaled accumulation of
//! f32 queries/accumulators with rows stored as f32, f16 or bf16 bytes. AVX2/FMA/F16C paths
//! are chosen at run time; the scalar paths give the same results within float rounding.
//!
//! Besides float rows, the kernels here read packed integer codes (`bits` ∈ {1, 2, 3, 4, 8}
//! per code, least significant bit first as [`crate::bits`] writes them): as plain integers
//! ([`dot_codes`], [`axpy_codes`]) or through a table of up to 16 levels ([`dot_lut`],
//! [`axpy_lut`]). The crate-internal `avx2` helpers (code unpacking, table lookup, horizontal sum) serve the
//! codecs' own block kernels. [`force_scalar`] runs a closure on the scalar paths, so tests can
//! compare both; [`with_isa_limit`] and [`set_isa_limit`] stop the kernels at AVX2 likewise.

use crate::fp8::Fp8Format;
use half::{bf16, f16};
use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

/// The widest vector instructions the kernels may use (never more than the CPU has), in
/// increasing order: [`set_isa_limit`] lowers it for the process (benchmarks of the paths other
/// CPUs take), [`with_isa_limit`] for one closure on one thread (tests of every path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The scalar fallbacks only.
    Scalar = 0,
    /// AVX2, FMA and F16C: the float kernels' 256-bit forms and the AVX2 integer kernels.
    Avx2 = 1,
    /// Everything the CPU has, AVX-512 included.
    Avx512 = 2,
}

static PROCESS_LIMIT: AtomicU8 = AtomicU8::new(Isa::Avx512 as u8);

thread_local! {
    static THREAD_LIMIT: Cell<Isa> = const { Cell::new(Isa::Avx512) };
}

/// Limits the kernels of every thread to `isa` from now on.
pub fn set_isa_limit(isa: Isa) {
    PROCESS_LIMIT.store(isa as u8, Ordering::Relaxed);
}

/// Runs `f` with the kernels of the calling thread limited to `isa` (and to the process's
/// limit), then restores the thread's previous limit.
pub fn with_isa_limit<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    let before = THREAD_LIMIT.with(|s| s.replace(isa));
    let result = f();
    THREAD_LIMIT.with(|s| s.set(before));
    result
}

/// The limit in effect on this thread: the lower of the process's and the thread's.
fn isa_limit() -> Isa {
    let process = match PROCESS_LIMIT.load(Ordering::Relaxed) {
        0 => Isa::Scalar,
        1 => Isa::Avx2,
        _ => Isa::Avx512,
    };
    process.min(THREAD_LIMIT.with(Cell::get))
}

/// Runs `f` with every vector kernel of this crate disabled on the calling thread (the scalar
/// fallbacks run instead), then restores the previous setting.
pub fn force_scalar<R>(f: impl FnOnce() -> R) -> R {
    with_isa_limit(Isa::Scalar, f)
}

/// Whether the AVX2/FMA/F16C kernels may run: the CPU has them and the ISA limit allows them.
#[inline]
pub fn use_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        return isa_limit() >= Isa::Avx2;
    }
    false
}

/// Whether the AVX-512 versions of the group kernels may run (AVX-512F/DQ/VL present, the
/// ISA limit allows them, and [`use_avx2`]; VL lets 256-bit code use all 32 vector registers).
#[inline]
pub fn use_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        use_avx2()
            && isa_limit() >= Isa::Avx512
            && *HAS.get_or_init(|| {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512dq")
                    && std::is_x86_feature_detected!("avx512vl")
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Bytes that a caller reads after the current rows (further on in the run, then the next
/// span of the cache), prefetched into the L2 cache a share at a time while a group kernel
/// works through the run, so that the loads overlap the computation. One burst of prefetches
/// per span stalls the core once its load queue fills; spread over the run, the same
/// prefetches measured 6–15% faster on the compressed caches (one thread) and 11–19% on f16
/// (32K context, bench/results/prefetch/).
pub struct Ahead<'a> {
    bytes: &'a [u8],
    /// Bytes to prefetch once `bytes` are done.
    then: &'a [u8],
    /// Bytes to prefetch per row of the current run.
    row_share: usize,
}

impl<'a> Ahead<'a> {
    /// `bytes` to prefetch over the `rows` rows of the current run.
    pub fn new(bytes: &'a [u8], rows: usize) -> Self {
        Self::chained(bytes, &[], rows)
    }

    /// `bytes`, then `then`, to prefetch over the `rows` rows of the current run.
    pub fn chained(bytes: &'a [u8], then: &'a [u8], rows: usize) -> Self {
        Self {
            bytes,
            then,
            row_share: (bytes.len() + then.len()).div_ceil(rows.max(1)),
        }
    }

    /// Nothing to prefetch.
    pub fn none() -> Self {
        Self::new(&[], 1)
    }

    /// Prefetches the share of `rows` more rows of the current run.
    #[inline]
    pub fn rows(&mut self, rows: usize) {
        self.take(rows.saturating_mul(self.row_share));
    }

    /// Prefetches what is left: kernels that do not spread the prefetches leave it to their
    /// caller.
    pub fn rest(&mut self) {
        self.take(self.bytes.len() + self.then.len());
    }

    #[inline]
    fn take(&mut self, mut n: usize) {
        while n > 0 {
            if self.bytes.is_empty() {
                if self.then.is_empty() {
                    return;
                }
                self.bytes = std::mem::take(&mut self.then);
            }
            let (now, later) = self.bytes.split_at(n.min(self.bytes.len()));
            #[cfg(target_arch = "x86_64")]
            for line in now.chunks(64) {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                // SAFETY: SSE is part of x86-64; a prefetch never faults.
                #[allow(unused_unsafe)]
                unsafe {
                    _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8)
                };
            }
            n -= now.len();
            self.bytes = later;
        }
    }
}

/// Bytes of rows that the float sum kernels read in one block: every chunk of channels of
/// every head reads the block while it stays in the L1 cache.
const L1_BLOCK_BYTES: usize = 16 << 10;

/// A [`RowFormat`] as a type: the group kernels are compiled once per format, so that the
/// per-value conversion is decided at compile time (a runtime match in the inner loops made
/// them several times slower once FP8 joined the formats).
#[cfg(target_arch = "x86_64")]
trait Format {
    const ROW: RowFormat;
}

/// Declares [`Format`] types.
macro_rules! formats {
    ($($name:ident = $value:expr),+ $(,)?) => {
        $(
            #[cfg(target_arch = "x86_64")]
            struct $name;
            #[cfg(target_arch = "x86_64")]
            impl Format for $name {
                const ROW: RowFormat = $value;
            }
        )+
    };
}

formats!(
    AsF32 = RowFormat::F32,
    AsF16 = RowFormat::F16,
    AsBf16 = RowFormat::Bf16,
    AsQ8_0 = RowFormat::Q8_0,
    AsE4M3 = RowFormat::Fp8 { e5m2: false },
    AsE5M2 = RowFormat::Fp8 { e5m2: true },
    AsInt8 = RowFormat::Int8,
    AsU8 = RowFormat::U8,
);

/// Whether rows in `F` keep scales ([`RowFormat::Q8_0`]'s per block, FP8's and int8's per
/// row) that the vector kernels apply after decoding.
#[cfg(target_arch = "x86_64")]
const fn scaled<F: Format>() -> bool {
    matches!(
        F::ROW,
        RowFormat::Q8_0 | RowFormat::Fp8 { .. } | RowFormat::Int8
    )
}

/// `$f::<F>($args)` (in a vector module) with `F` the [`Format`] of the runtime `$format`.
#[cfg(target_arch = "x86_64")]
macro_rules! with_format {
    ($format:expr, $f:ident($($arg:expr),*)) => {
        match $format {
            RowFormat::F32 => $f::<super::AsF32>($($arg),*),
            RowFormat::F16 => $f::<super::AsF16>($($arg),*),
            RowFormat::Bf16 => $f::<super::AsBf16>($($arg),*),
            RowFormat::Q8_0 => $f::<super::AsQ8_0>($($arg),*),
            RowFormat::Fp8 { e5m2: false } => $f::<super::AsE4M3>($($arg),*),
            RowFormat::Fp8 { e5m2: true } => $f::<super::AsE5M2>($($arg),*),
            RowFormat::Int8 => $f::<super::AsInt8>($($arg),*),
            RowFormat::U8 => $f::<super::AsU8>($($arg),*),
        }
    };
}
#[cfg(target_arch = "x86_64")]
use with_format;

/// Storage of a row of floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    /// Little-endian f32.
    F32,
    /// Little-endian IEEE f16.
    F16,
    /// Little-endian bfloat16.
    Bf16,
    /// llama.cpp's q8_0: blocks of 32 values, each an f16 scale `d` then 32 i8 `x`
    /// (value `d·x`). Rows hold whole blocks.
    Q8_0,
    /// A row's f16 scale `s`, then one FP8 code per value (value `s·fp8(code)`): E4M3 "FN", or
    /// E5M2 if `e5m2` ([`crate::fp8`]'s per-row layout).
    Fp8 {
        /// E5M2 codes (else E4M3).
        e5m2: bool,
    },
    /// A row's f16 scale `s`, then one code byte per value (value `s·(code − 128)`: the
    /// symmetric int8 rows of [`crate::uniform`]).
    Int8,
    /// One byte per value, the value itself (0–255): codes whose scales the caller folded into
    /// the query.
    U8,
}

/// Bytes of a [`RowFormat::Q8_0`] block, and values in it.
const Q8_0_BLOCK: (usize, usize) = (34, 32);

impl RowFormat {
    /// Bytes of `values` stored values (a multiple of 32 for q8_0).
    pub fn row_bytes(self, values: usize) -> usize {
        match self {
            RowFormat::F32 => 4 * values,
            RowFormat::F16 | RowFormat::Bf16 => 2 * values,
            RowFormat::Q8_0 => values / Q8_0_BLOCK.1 * Q8_0_BLOCK.0,
            RowFormat::Fp8 { .. } | RowFormat::Int8 => 2 + values,
            RowFormat::U8 => values,
        }
    }

    /// Byte of value `i`'s q8_0 block (its scale), and of the value itself.
    fn q8_0_at(i: usize) -> (usize, usize) {
        let (bytes, values) = Q8_0_BLOCK;
        let block = i / values * bytes;
        (block, block + 2 + i % values)
    }
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
        RowFormat::Q8_0 => {
            let (scale, value) = RowFormat::q8_0_at(i);
            f16::from_le_bytes([row[scale], row[scale + 1]]).to_f32() * f32::from(row[value] as i8)
        }
        RowFormat::Fp8 { e5m2 } => {
            let format = if e5m2 {
                Fp8Format::E5M2
            } else {
                Fp8Format::E4M3
            };
            f16::from_le_bytes([row[0], row[1]]).to_f32() * format.decode(row[2 + i])
        }
        RowFormat::Int8 => {
            f16::from_le_bytes([row[0], row[1]]).to_f32() * (f32::from(row[2 + i]) - 128.0)
        }
        RowFormat::U8 => f32::from(row[i]),
    }
}

/// `values` as the bytes of a [`RowFormat::F32`] row.
pub fn f32_bytes(values: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialized bytes, u8 has alignment 1, and the length is exact.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
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

/// [`dot_rows`] for several queries: each row is loaded and converted once for all of them.
/// The vector kernels prefetch `ahead` as they go.
pub fn dot_rows_group(
    format: RowFormat,
    queries: &[&[f32]],
    rows: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2()
        && queries
            .iter()
            .all(|q| q.len().is_multiple_of(8) && q.len() == queries[0].len())
    {
        if use_avx512() && queries[0].len().is_multiple_of(16) {
            // SAFETY: AVX-512F/DQ/VL are present; lengths are checked inside.
            return unsafe { avx512::dot_rows_group(format, queries, rows, scores, ahead) };
        }
        // SAFETY: AVX2/FMA/F16C are present; lengths are checked inside.
        return unsafe { avx2::dot_rows_group(format, queries, rows, scores, ahead) };
    }
    for (q, s) in queries.iter().zip(scores.iter_mut()) {
        dot_rows(format, q, rows, s);
    }
}

/// [`axpy_rows`] for several weight rows: each stored row is loaded and converted once.
/// The vector kernels prefetch `ahead` as they go.
pub fn axpy_rows_group(
    format: RowFormat,
    weights: &[&[f32]],
    rows: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2()
        && accs
            .iter()
            .all(|a| a.len().is_multiple_of(16) && a.len() == accs[0].len())
    {
        if use_avx512() && accs[0].len().is_multiple_of(64) {
            // SAFETY: as in `dot_rows_group`.
            return unsafe { avx512::axpy_rows_group(format, weights, rows, accs, ahead) };
        }
        // SAFETY: as in `dot_rows_group`.
        return unsafe { avx2::axpy_rows_group(format, weights, rows, accs, ahead) };
    }
    for (w, a) in weights.iter().zip(accs.iter_mut()) {
        axpy_rows(format, w, rows, a);
    }
}

/// `xs[i] = e^(xs[i] − max)` (0 where `xs[i]` is −∞), returning the sum: the softmax step of
/// attention. The vector path's relative error is below 3·10⁻⁷.
pub fn exp_shifted(xs: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if use_avx512() {
        // SAFETY: the CPU supports AVX-512F.
        return unsafe { avx512::exp_shifted_below(xs, max, f32::INFINITY).0 };
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA.
        return unsafe { avx2::exp_shifted_below(xs, max, f32::INFINITY).0 };
    }
    let mut sum = 0.0;
    for x in xs.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    sum
}

/// [`exp_shifted`] of the longest prefix of `xs` whose values are at most `max + headroom`
/// (on the vector paths, whole chunks of 16 or 8 values): the softmax step against a reference that may
/// lie below the largest score, one pass instead of a pass for the maximum first. Returns the
/// sum and the length done; a caller that gets less than `xs.len()` raises the reference.
pub fn exp_shifted_below(xs: &mut [f32], max: f32, headroom: f32) -> (f32, usize) {
    #[cfg(target_arch = "x86_64")]
    if use_avx512() {
        // SAFETY: the CPU supports AVX-512F.
        return unsafe { avx512::exp_shifted_below(xs, max, headroom) };
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA.
        return unsafe { avx2::exp_shifted_below(xs, max, headroom) };
    }
    let n = xs
        .iter()
        .position(|&x| x > max + headroom)
        .unwrap_or(xs.len());
    (exp_shifted(&mut xs[..n], max), n)
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

/// `out[i] = a[g]·code_i + b[g]`: the `out.len()` codes of width `bits` decoded with one
/// affine map per group. Groups are `out.len() / a.len()` codes long: a multiple of 8, or 1
/// (a map per code, as for per-channel parameters).
pub fn decode_codes(packed: &[u8], bits: u32, a: &[f32], b: &[f32], out: &mut [f32]) {
    let group = out.len() / a.len();
    assert!(
        (group == 1 || group.is_multiple_of(8))
            && out.len().is_multiple_of(8)
            && group * a.len() == out.len()
            && b.len() == a.len()
    );
    assert!(packed.len() >= out.len() / 8 * bits as usize);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        if use_avx512() && out.len().is_multiple_of(16) && (group == 1 || group.is_multiple_of(16))
        {
            // SAFETY: AVX-512F/DQ are present; `packed` holds all codes (asserted above).
            return with_width!(bits, B => unsafe { avx512::decode_codes::<B>(packed, a, b, None, out) });
        }
        // SAFETY: as in `dot_codes`.
        return with_width!(bits, B => unsafe { avx2::decode_codes::<B>(packed, a, b, None, out) });
    }
    with_width!(bits, B => each_code::<B>(packed, out.len(), |i, c| {
        out[i] = a[i / group] * f32::from(c) + b[i / group];
    }));
}

/// `out[i] = a·lut[code_i]` over the `out.len()` (a multiple of 8) codes of width `bits` ≤ 4.
pub fn decode_lut(packed: &[u8], bits: u32, lut: &[f32; 16], a: f32, out: &mut [f32]) {
    assert!(bits <= 4 && out.len().is_multiple_of(8));
    assert!(packed.len() >= out.len() / 8 * bits as usize);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        if use_avx512() && out.len().is_multiple_of(16) {
            // SAFETY: AVX-512F/DQ are present; `packed` holds all codes (asserted above).
            return with_width!(bits, B => unsafe {
                avx512::decode_codes::<B>(packed, &[a], &[0.0], Some(lut), out)
            });
        }
        // SAFETY: as in `dot_codes`.
        return with_width!(bits, B => unsafe {
            avx2::decode_codes::<B>(packed, &[a], &[0.0], Some(avx2::Lut::new(lut)), out)
        });
    }
    with_width!(bits, B => each_code::<B>(packed, out.len(), |i, c| {
        out[i] = a * lut[usize::from(c)];
    }));
}

/// Where a stored row keeps the affine maps of its codes' groups (f16 values, little-endian).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GroupParams {
    /// One scale for the whole run at byte `at`: `value = scale·level`.
    Scale {
        /// Byte offset of the scale in the row.
        at: usize,
    },
    /// Group `g`'s scale at byte `4g` and minimum at `4g + 2`: `value = scale·code + min`.
    ScaleMin,
    /// Group `g`'s scale at byte `2g`: `value = scale·(code − zero)`.
    ScaleZero {
        /// The code that stands for 0.
        zero: f32,
    },
}

impl GroupParams {
    /// The map `(a, b)` (`value = a·level + b`) of group `g` of `row`.
    #[inline]
    fn read(self, row: &[u8], g: usize) -> (f32, f32) {
        let f16_at = |at: usize| f16::from_le_bytes([row[at], row[at + 1]]).to_f32();
        match self {
            GroupParams::Scale { at } => (f16_at(at), 0.0),
            GroupParams::ScaleMin => (f16_at(4 * g), f16_at(4 * g + 2)),
            GroupParams::ScaleZero { zero } => {
                let scale = f16_at(2 * g);
                (scale, -scale * zero)
            }
        }
    }
}

/// One run of packed codes in every row of a run of stored rows, and how it decodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodeRun {
    /// Bytes per stored row.
    pub row_bytes: usize,
    /// Byte offset of the packed codes within a row.
    pub codes_at: usize,
    /// Codes in the run (a multiple of 8).
    pub len: usize,
    /// Code width in bits (1, 2, 3, 4 or 8; at most 4 with a table).
    pub bits: u32,
    /// Codes per group sharing one affine map (a multiple of 8 dividing `len`).
    pub group: usize,
    /// Where the groups' maps are stored.
    pub params: GroupParams,
}

/// Decodes `run` in every row of `rows`: `out[t·out_stride + out_at + i] = a_g·level_i + b_g`,
/// where `level` is the code itself or its entry in `lut`. The working-space decoder of the
/// per-token codecs: one call per tile instead of one per row.
pub fn decode_rows(
    rows: &[u8],
    run: &CodeRun,
    lut: Option<&[f32; 16]>,
    out: &mut [f32],
    out_stride: usize,
    out_at: usize,
) {
    let n = rows.len() / run.row_bytes;
    assert!(
        run.len.is_multiple_of(8)
            && run.group.is_multiple_of(8)
            && run.len.is_multiple_of(run.group)
    );
    assert!(run.codes_at + run.len / 8 * run.bits as usize <= run.row_bytes);
    assert!(n == 0 || (n - 1) * out_stride + out_at + run.len <= out.len());
    assert!(lut.is_none() || run.bits <= 4);
    #[cfg(target_arch = "x86_64")]
    if use_avx512() && run.group.is_multiple_of(16) {
        // SAFETY: AVX-512F/DQ are present; every row holds its codes and the output its
        // values (asserted above).
        return with_width!(run.bits, B => unsafe {
            avx512::decode_rows::<B>(rows, run, lut, out, out_stride, out_at)
        });
    }
    let group_bytes = run.group / 8 * run.bits as usize;
    for (t, row) in rows.chunks_exact(run.row_bytes).enumerate() {
        let codes = &row[run.codes_at..][..run.len / 8 * run.bits as usize];
        let values = &mut out[t * out_stride + out_at..][..run.len];
        for (g, (packed, o)) in codes
            .chunks_exact(group_bytes)
            .zip(values.chunks_exact_mut(run.group))
            .enumerate()
        {
            let (a, b) = run.params.read(row, g);
            match lut {
                Some(lut) => decode_lut(packed, run.bits, lut, a, o),
                None => decode_codes(packed, run.bits, &[a], &[b], o),
            }
        }
    }
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

/// The two group-kernel drivers of a vector module, around its `score4` (4 rows × one of the
/// query counts `$heads`, `$lanes` channels per step) and `accumulate_chunk` (`$chunk`
/// channels of 1 to 4 heads over all rows) kernels.
#[cfg(target_arch = "x86_64")]
macro_rules! group_drivers {
    ($lanes:literal, $chunk:literal, [$($heads:literal),+], $features:literal) => {
        /// [`super::dot_rows_group`], compiled once per format.
        #[target_feature(enable = $features)]
        pub unsafe fn dot_rows_group(
            format: RowFormat,
            queries: &[&[f32]],
            rows: &[u8],
            scores: &mut [&mut [f32]],
            ahead: &mut super::Ahead,
        ) {
            super::with_format!(format, dot_rows_group_as(queries, rows, scores, ahead))
        }

        /// [`super::dot_rows_group`] for rows in `F`: blocks of 4 rows × up to the most of
        /// `$heads` queries, reduced 8 at a time.
        #[target_feature(enable = $features)]
        unsafe fn dot_rows_group_as<F: super::Format>(
            queries: &[&[f32]],
            rows: &[u8],
            scores: &mut [&mut [f32]],
            ahead: &mut super::Ahead,
        ) {
            let format = F::ROW;
            let (heads, d, n) = (queries.len(), queries[0].len(), scores[0].len());
            let row_bytes = rows.len() / n.max(1);
            assert!(
                d.is_multiple_of($lanes)
                    && row_bytes >= format.row_bytes(d)
                    && queries.iter().all(|q| q.len() == d)
                    && scores.iter().all(|s| s.len() == n)
            );
            let mut t = 0;
            while t + 4 <= n {
                ahead.rows(4);
                let r = rows.as_ptr().add(t * row_bytes);
                let mut h = 0;
                while h < heads {
                    let take = (heads - h).min(*[$($heads),+].iter().max().unwrap());
                    let q = |k: usize| queries[h + k.min(take - 1)].as_ptr();
                    // Lanes 4k..4k+4 of the pair: query h + k's scores.
                    let pairs: [__m256; 2] = match take {
                        $($heads => score4::<F, $heads>(std::array::from_fn(q), d, r, row_bytes),)+
                        _ => unreachable!("a pass takes one of the query counts"),
                    };
                    for k in 0..take {
                        let s = pairs[k / 2];
                        let half = if k % 2 == 0 {
                            _mm256_castps256_ps128(s)
                        } else {
                            _mm256_extractf128_ps(s, 1)
                        };
                        _mm_storeu_ps(scores[h + k][t..t + 4].as_mut_ptr(), half);
                    }
                    h += take;
                }
                t += 4;
            }
            for t in t..n {
                let row = &rows[t * row_bytes..][..row_bytes];
                for (q, s) in queries.iter().zip(scores.iter_mut()) {
                    s[t] = super::dot(format, q, row);
                }
            }
        }

        /// [`super::axpy_rows_group`] for accumulators of a multiple of the chunk: per block
        /// of rows that stays in the L1 cache, the chunk's channels of up to 4 heads at a
        /// time, summed in registers over the block's rows.
        #[target_feature(enable = $features)]
        pub unsafe fn axpy_rows_group(
            format: RowFormat,
            weights: &[&[f32]],
            rows: &[u8],
            accs: &mut [&mut [f32]],
            ahead: &mut super::Ahead,
        ) {
            super::with_format!(format, axpy_rows_group_as(weights, rows, accs, ahead))
        }

        /// [`axpy_rows_group`] for rows in `F`.
        #[target_feature(enable = $features)]
        unsafe fn axpy_rows_group_as<F: super::Format>(
            weights: &[&[f32]],
            rows: &[u8],
            accs: &mut [&mut [f32]],
            ahead: &mut super::Ahead,
        ) {
            let format = F::ROW;
            let (heads, d, n) = (weights.len(), accs[0].len(), weights[0].len());
            let row_bytes = rows.len() / n.max(1);
            assert!(
                d.is_multiple_of($chunk)
                    && row_bytes >= format.row_bytes(d)
                    && row_bytes * n <= rows.len()
                    && weights.iter().all(|w| w.len() == n)
                    && accs.iter().all(|a| a.len() == d)
            );
            let a: Vec<*mut f32> = accs.iter_mut().map(|a| a.as_mut_ptr()).collect();
            let block = (super::L1_BLOCK_BYTES / row_bytes.max(1)).max(4);
            for first in (0..n).step_by(block) {
                let m = block.min(n - first);
                let r = rows.as_ptr().add(first * row_bytes);
                let w = |h: usize| weights[h].as_ptr().add(first);
                let mut h = 0;
                while h < heads {
                    let take = (heads - h).min(4);
                    for i in (0..d).step_by($chunk) {
                        // The first pass over the rows prefetches, a share per chunk.
                        if h == 0 {
                            ahead.rows(m.div_ceil(d / $chunk));
                        }
                        match take {
                            4 => accumulate_chunk::<F, 4>(
                                [w(h), w(h + 1), w(h + 2), w(h + 3)],
                                r,
                                row_bytes,
                                m,
                                i,
                                [a[h], a[h + 1], a[h + 2], a[h + 3]],
                            ),
                            3 => accumulate_chunk::<F, 3>(
                                [w(h), w(h + 1), w(h + 2)],
                                r,
                                row_bytes,
                                m,
                                i,
                                [a[h], a[h + 1], a[h + 2]],
                            ),
                            2 => accumulate_chunk::<F, 2>(
                                [w(h), w(h + 1)],
                                r,
                                row_bytes,
                                m,
                                i,
                                [a[h], a[h + 1]],
                            ),
                            _ => accumulate_chunk::<F, 1>( [w(h)], r, row_bytes, m, i, [a[h]]),
                        }
                    }
                    h += take;
                }
            }
        }
    };
}

/// Two of the private `avx2` module's helpers that the model's weight kernels share (they
/// require a CPU with AVX2, FMA and F16C, and inline into callers with those features).
#[cfg(target_arch = "x86_64")]
pub use avx2::{f16_at, hsum};

/// AVX2/FMA/F16C kernels and the helpers the codecs' block kernels share. Every function
/// requires a CPU with AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::RowFormat;
    use std::arch::x86_64::*;

    /// The sum of the 8 lanes of `v`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// The little-endian f16 at `p` as f32.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `p` must point to two readable bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_at(p: *const u8) -> f32 {
        // The conversion in assembly, so that its input is a whole register: with `_mm_cvtph_ps`
        // LLVM sees that only lane 0 matters and loads the half with `vpinsrw` into whatever
        // register it likes, at times a loop's accumulator, whose chain the scale then joins
        // (the weight kernels' loops ran at ~11 cycles per block). `vmovd` writes all lanes.
        let h = _mm_cvtsi32_si128(i32::from(std::ptr::read_unaligned(p as *const u16)));
        let f: __m128;
        std::arch::asm!(
            "vcvtph2ps {f}, {h}",
            h = in(xmm_reg) h,
            f = lateout(xmm_reg) f,
            options(pure, nomem, nostack, preserves_flags)
        );
        _mm_cvtss_f32(f)
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

    /// [`super::decode_codes`] (and [`super::decode_lut`] with `lut`) for code width `B`;
    /// `packed` must hold `out.len()/8·B` bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_codes<const B: usize>(
        packed: &[u8],
        a: &[f32],
        b: &[f32],
        lut: Option<Lut>,
        out: &mut [f32],
    ) {
        let (mut p, o) = (packed.as_ptr(), out.as_mut_ptr());
        if a.len() == out.len() {
            for i in (0..out.len()).step_by(8) {
                let x = levels(codes8::<B>(p), lut);
                let (av, bv) = (
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                );
                _mm256_storeu_ps(o.add(i), _mm256_fmadd_ps(av, x, bv));
                p = p.add(B);
            }
            return;
        }
        let per_group = out.len() / a.len() / 8;
        let mut i = 0;
        for (&a, &b) in a.iter().zip(b) {
            let (av, bv) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
            for _ in 0..per_group {
                let x = levels(codes8::<B>(p), lut);
                _mm256_storeu_ps(o.add(i), _mm256_fmadd_ps(av, x, bv));
                p = p.add(B);
                i += 8;
            }
        }
    }

    /// 8 values at element `i` of `row`, in `F` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8<F: super::Format>(row: &[u8], i: usize) -> __m256 {
        match F::ROW {
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
            RowFormat::Q8_0 => {
                assert!(row.len() >= RowFormat::q8_0_at(i).1 + 8);
                load8_as::<F>(row.as_ptr(), i)
            }
            RowFormat::Fp8 { .. } | RowFormat::Int8 => {
                assert!(row.len() >= 2 + i + 8);
                load8_as::<F>(row.as_ptr(), i)
            }
            RowFormat::U8 => {
                assert!(row.len() >= i + 8);
                load8_as::<F>(row.as_ptr(), i)
            }
        }
    }

    /// [`super::dot`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(format: RowFormat, q: &[f32], row: &[u8]) -> f32 {
        super::with_format!(format, dot_as(q, row))
    }

    /// [`dot`] of a row in `F`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_as<F: super::Format>(q: &[f32], row: &[u8]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 2];
        for (j, i) in (0..q.len()).step_by(8).enumerate() {
            let x = load8::<F>(row, i);
            acc[j & 1] = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), x, acc[j & 1]);
        }
        hsum(_mm256_add_ps(acc[0], acc[1]))
    }

    /// [`super::dot_rows`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_rows(
        format: RowFormat,
        q: &[f32],
        rows: &[u8],
        row_bytes: usize,
        scores: &mut [f32],
    ) {
        super::with_format!(format, dot_rows_as(q, rows, row_bytes, scores))
    }

    /// [`dot_rows`] of rows in `F`: two rows at a time share the query loads.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_rows_as<F: super::Format>(
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
                acc[j & 1] = _mm256_fmadd_ps(qv, load8::<F>(r0, i), acc[j & 1]);
                acc[2 + (j & 1)] = _mm256_fmadd_ps(qv, load8::<F>(r1, i), acc[2 + (j & 1)]);
            }
            scores[t] = hsum(_mm256_add_ps(acc[0], acc[1]));
            scores[t + 1] = hsum(_mm256_add_ps(acc[2], acc[3]));
            t += 2;
        }
        if t < n {
            scores[t] = dot_as::<F>(q, &rows[t * row_bytes..][..row_bytes]);
        }
    }

    /// [`super::axpy_rows`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_rows(
        format: RowFormat,
        weights: &[f32],
        rows: &[u8],
        row_bytes: usize,
        acc: &mut [f32],
    ) {
        super::with_format!(format, axpy_rows_as(weights, rows, row_bytes, acc))
    }

    /// [`axpy_rows`] of rows in `F`: four rows at a time per load and store of the
    /// accumulator.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_rows_as<F: super::Format>(
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
                    a = _mm256_fmadd_ps(w[k], load8::<F>(r[k], i), a);
                }
                _mm256_storeu_ps(p, a);
            }
            t += 4;
        }
        for k in t..n {
            axpy_as::<F>(weights[k], &rows[k * row_bytes..][..row_bytes], acc);
        }
    }

    /// `e^(x − max)` per lane (`max_log2e` is `max·log₂ e`) as AVX-512's `exp16` computes it:
    /// `2^t` for `t = x·log₂ e − max·log₂ e`, `2^f` (`f = t − round(t)`) by a degree-5
    /// polynomial and `round(t)` added to its exponent; lanes with `t ≤ −125` give 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp8(x: __m256, max_log2e: __m256) -> __m256 {
        let t = _mm256_fmsub_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E), max_log2e);
        let normal = _mm256_cmp_ps::<_CMP_GT_OQ>(t, _mm256_set1_ps(-125.0));
        let whole = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let f = _mm256_sub_ps(t, whole);
        let n = _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(whole));
        let mut p = _mm256_set1_ps(1.327_646_7e-3);
        for c in [
            9.675_541e-3,
            5.550_713_5e-2,
            0.240_221_2,
            0.693_146_94,
            1.000_000_1,
        ] {
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
        }
        let scaled = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), n));
        _mm256_and_ps(scaled, normal)
    }

    /// [`super::exp_shifted_below`] (and with an infinite headroom [`super::exp_shifted`]):
    /// four vectors per step under one check, then 8 values at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp_shifted_below(xs: &mut [f32], max: f32, headroom: f32) -> (f32, usize) {
        let max_log2e = _mm256_set1_ps(max * std::f32::consts::LOG2_E);
        let ceiling = _mm256_set1_ps(max + headroom);
        let over = |x: __m256| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(x, ceiling));
        let mut sums = [_mm256_setzero_ps(); 4];
        let mut done = 0;
        for chunk in xs.chunks_exact_mut(32) {
            let p = chunk.as_mut_ptr();
            let x: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            if x.iter().fold(0, |o, &x| o | over(x)) != 0 {
                break;
            }
            for (i, (&x, sum)) in x.iter().zip(&mut sums).enumerate() {
                let e = exp8(x, max_log2e);
                _mm256_storeu_ps(p.add(8 * i), e);
                *sum = _mm256_add_ps(*sum, e);
            }
            done += 32;
        }
        let mut sum = _mm256_add_ps(
            _mm256_add_ps(sums[0], sums[1]),
            _mm256_add_ps(sums[2], sums[3]),
        );
        for c in xs[done..].chunks_mut(8) {
            // Lanes past the end: −∞, whose exponential is 0.
            let mut lanes = [f32::NEG_INFINITY; 8];
            lanes[..c.len()].copy_from_slice(c);
            let x = _mm256_loadu_ps(lanes.as_ptr());
            if over(x) != 0 {
                return (hsum(sum), done);
            }
            let e = exp8(x, max_log2e);
            _mm256_storeu_ps(lanes.as_mut_ptr(), e);
            c.copy_from_slice(&lanes[..c.len()]);
            sum = _mm256_add_ps(sum, e);
            done += c.len();
        }
        (hsum(sum), done)
    }

    /// 8 values at element `i` of the row at `row`, in `F` (no bounds check).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_as<F: super::Format>(row: *const u8, i: usize) -> __m256 {
        let x = unscaled8_as::<F>(row, i);
        if super::scaled::<F>() {
            _mm256_mul_ps(x, _mm256_set1_ps(scale_as::<F>(row, i)))
        } else {
            x
        }
    }

    /// 8 values at element `i` of the row at `row` before their scale ([`scale_as`]; no bounds
    /// check).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unscaled8_as<F: super::Format>(row: *const u8, i: usize) -> __m256 {
        match F::ROW {
            RowFormat::F32 => _mm256_loadu_ps(row.add(4 * i) as *const f32),
            RowFormat::F16 => _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * i) as *const __m128i)),
            RowFormat::Bf16 => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(row.add(2 * i) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
            }
            RowFormat::Q8_0 => {
                let value = RowFormat::q8_0_at(i).1;
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                    row.add(value) as *const __m128i
                )))
            }
            RowFormat::Fp8 { e5m2 } => {
                let codes = _mm_cvtepu8_epi16(_mm_loadl_epi64(row.add(2 + i) as *const __m128i));
                let (bits, _, nan) = fp8_as_f16(codes, e5m2);
                let nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan));
                _mm256_blendv_ps(_mm256_cvtph_ps(bits), _mm256_set1_ps(f32::NAN), nan)
            }
            RowFormat::Int8 => {
                let codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.add(2 + i) as *const __m128i));
                _mm256_cvtepi32_ps(_mm256_sub_epi32(codes, _mm256_set1_epi32(128)))
            }
            RowFormat::U8 => _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                row.add(i) as *const __m128i
            ))),
        }
    }

    /// The scale of [`unscaled8_as`]'s values from element `i` (of its q8_0 block, or of the
    /// whole row for FP8 and int8; 1 for the formats without one).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scale_as<F: super::Format>(row: *const u8, i: usize) -> f32 {
        match F::ROW {
            RowFormat::Q8_0 => f16_at(row.add(RowFormat::q8_0_at(i).0)),
            RowFormat::Fp8 { e5m2 } => fp8_factor(e5m2) * f16_at(row),
            RowFormat::Int8 => f16_at(row),
            RowFormat::F32 | RowFormat::F16 | RowFormat::Bf16 | RowFormat::U8 => 1.0,
        }
    }

    /// FP8 codes (one per 16-bit lane) as f16 bit patterns, the factor that makes those the
    /// codes' values, and the lanes that hold E4M3's NaN code (all ones): E5M2 is the upper
    /// byte of an f16; E4M3 an f16 with the exponent field's top bit clear, times 2⁸ (the bias
    /// difference).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fp8_as_f16(codes: __m128i, e5m2: bool) -> (__m128i, f32, __m128i) {
        if e5m2 {
            return (
                _mm_slli_epi16(codes, 8),
                fp8_factor(e5m2),
                _mm_setzero_si128(),
            );
        }
        let sign = _mm_slli_epi16(_mm_and_si128(codes, _mm_set1_epi16(0x80)), 8);
        let magnitude = _mm_and_si128(codes, _mm_set1_epi16(0x7F));
        let bits = _mm_or_si128(sign, _mm_slli_epi16(magnitude, 7));
        (
            bits,
            fp8_factor(e5m2),
            _mm_cmpeq_epi16(magnitude, _mm_set1_epi16(0x7F)),
        )
    }

    /// What FP8 codes read as f16 bit patterns ([`fp8_as_f16`]) are multiplied by to give their
    /// values: 2⁸ for E4M3, 1 for E5M2.
    pub const fn fp8_factor(e5m2: bool) -> f32 {
        if e5m2 {
            1.0
        } else {
            256.0
        }
    }

    /// The lane sums of `a[0]`, …, `a[7]`, in that order, as one vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn hsum8(a: [__m256; 8]) -> __m256 {
        let t0 = _mm256_hadd_ps(a[0], a[1]);
        let t1 = _mm256_hadd_ps(a[2], a[3]);
        let t2 = _mm256_hadd_ps(a[4], a[5]);
        let t3 = _mm256_hadd_ps(a[6], a[7]);
        let (u0, u1) = (_mm256_hadd_ps(t0, t1), _mm256_hadd_ps(t2, t3));
        _mm256_add_ps(
            _mm256_permute2f128_ps(u0, u1, 0x20),
            _mm256_permute2f128_ps(u0, u1, 0x31),
        )
    }

    /// Scores of the 4 rows at `rows` (`row_bytes` apart) for the `H` (1 or 2) queries at
    /// `q`: a vector whose lanes `4h..4h+4` are query `h`'s (and a zero one, for the drivers'
    /// pairs). Each row is converted once for both queries; the 8 accumulators are
    /// independent FMA chains.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn score4<F: super::Format, const H: usize>(
        q: [*const f32; H],
        d: usize,
        rows: *const u8,
        row_bytes: usize,
    ) -> [__m256; 2] {
        let row = |k: usize| rows.add(k * row_bytes);
        let mut acc = [_mm256_setzero_ps(); 8];
        // q8_0's block scales multiply the values, once per block and row; the scale of a
        // whole row (FP8, int8) multiplies its scores at the end.
        let blocks = matches!(F::ROW, RowFormat::Q8_0);
        let mut block_scales = [_mm256_setzero_ps(); 4];
        for i in (0..d).step_by(8) {
            let mut x: [__m256; 4] = [
                unscaled8_as::<F>(row(0), i),
                unscaled8_as::<F>(row(1), i),
                unscaled8_as::<F>(row(2), i),
                unscaled8_as::<F>(row(3), i),
            ];
            if blocks {
                if i % super::Q8_0_BLOCK.1 == 0 {
                    for (k, scale) in block_scales.iter_mut().enumerate() {
                        *scale = _mm256_set1_ps(scale_as::<F>(row(k), i));
                    }
                }
                for (x, scale) in x.iter_mut().zip(block_scales) {
                    *x = _mm256_mul_ps(*x, scale);
                }
            }
            for h in 0..H {
                let qv = _mm256_loadu_ps(q[h].add(i));
                for k in 0..4 {
                    acc[4 * h + k] = _mm256_fmadd_ps(qv, x[k], acc[4 * h + k]);
                }
            }
        }
        let mut scores = hsum8(acc);
        // Lane 4h + k holds row k's score: times the row's scale.
        if let Some(scales) = row_scales::<F>(rows, row_bytes) {
            scores = _mm256_mul_ps(scores, scales);
        }
        [scores, _mm256_setzero_ps()]
    }

    /// The scales of the 4 rows at `rows` (`row_bytes` apart) in lanes `k` and `4 + k`, for the
    /// formats with one scale per row (`None` for the others).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row_scales<F: super::Format>(
        rows: *const u8,
        row_bytes: usize,
    ) -> Option<__m256> {
        match F::ROW {
            RowFormat::Fp8 { .. } | RowFormat::Int8 => {
                let s0 = scale_as::<F>(rows, 0);
                let s1 = scale_as::<F>(rows.add(row_bytes), 0);
                let s2 = scale_as::<F>(rows.add(2 * row_bytes), 0);
                let s3 = scale_as::<F>(rows.add(3 * row_bytes), 0);
                Some(_mm256_setr_ps(s0, s1, s2, s3, s0, s1, s2, s3))
            }
            _ => None,
        }
    }

    group_drivers!(8, 16, [1, 2], "avx2,fma,f16c");

    /// `accs[h][i..i+16] += Σ_t w[h][t]·row_t[i..i+16]` for `H` ≤ 4 heads: the 2H
    /// accumulators stay in registers over all rows.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accumulate_chunk<F: super::Format, const H: usize>(
        w: [*const f32; H],
        rows: *const u8,
        row_bytes: usize,
        n: usize,
        i: usize,
        acc: [*mut f32; H],
    ) {
        let mut sum = [[_mm256_setzero_ps(); 2]; H];
        for t in 0..n {
            let row = rows.add(t * row_bytes);
            let x = [load8_as::<F>(row, i), load8_as::<F>(row, i + 8)];
            for h in 0..H {
                let wv = _mm256_broadcast_ss(&*w[h].add(t));
                sum[h][0] = _mm256_fmadd_ps(wv, x[0], sum[h][0]);
                sum[h][1] = _mm256_fmadd_ps(wv, x[1], sum[h][1]);
            }
        }
        for h in 0..H {
            for (k, s) in sum[h].into_iter().enumerate() {
                let a = acc[h].add(i + 8 * k);
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), s));
            }
        }
    }

    /// [`super::axpy`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy(format: RowFormat, w: f32, row: &[u8], acc: &mut [f32]) {
        super::with_format!(format, axpy_as(w, row, acc))
    }

    /// [`axpy`] of a row in `F`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_as<F: super::Format>(w: f32, row: &[u8], acc: &mut [f32]) {
        let wv = _mm256_set1_ps(w);
        for i in (0..acc.len()).step_by(8) {
            let p = acc.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                p,
                _mm256_fmadd_ps(wv, load8::<F>(row, i), _mm256_loadu_ps(p)),
            );
        }
    }
}

/// AVX-512 versions of the group kernels: twice the lanes per instruction, and the
/// accumulation keeps 64 channels of 4 heads in registers, its weights broadcast from memory.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::avx2::hsum8;
    use super::RowFormat;
    use std::arch::x86_64::*;

    /// `e^(x − max)` per lane (`x − max ≤ 60`) as `2^t`, `t = x·log2 e − max_log2e` in one
    /// fused step (`max_log2e = max·log2 e`, computed once by the caller): `2^n·2^f` with
    /// `n = round(t)`, `f = t − n` (`vreduceps`), a degree-5 minimax polynomial for `2^f` on
    /// `|f| ≤ ½` (relative error below 2e-7, plus `t`'s f32 rounding, ~1e-7·|t|, as the
    /// score's own), and `n` added to its exponent bits; lanes with `t ≤ −125` (and −∞) give
    /// 0. Zen 4 issues one 512-bit multiply per cycle, so their count sets the cost: with
    /// [`exp_shifted_below`]'s four vectors per step 10.4 cycles per 16 values in L1, against
    /// 14.6 for the former degree-6 `e^f` with `vrndscaleps` and `vscalefps` one vector at a
    /// time.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    unsafe fn exp16(x: __m512, max_log2e: __m512) -> __m512 {
        let t = _mm512_fmsub_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E), max_log2e);
        let normal = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(t, _mm512_set1_ps(-125.0));
        let f = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEAREST_INT }>(t);
        let n = _mm512_slli_epi32::<23>(_mm512_cvtps_epi32(t));
        let mut p = _mm512_set1_ps(1.327_646_7e-3);
        for c in [
            9.675_541e-3,
            5.550_713_5e-2,
            0.240_221_2,
            0.693_146_94,
            1.000_000_1,
        ] {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
        }
        _mm512_castsi512_ps(_mm512_maskz_add_epi32(normal, _mm512_castps_si512(p), n))
    }

    /// [`super::exp_shifted_below`] (and with an infinite headroom [`super::exp_shifted`]).
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    pub unsafe fn exp_shifted_below(xs: &mut [f32], max: f32, headroom: f32) -> (f32, usize) {
        let max_log2e = _mm512_mul_ps(
            _mm512_set1_ps(max),
            _mm512_set1_ps(std::f32::consts::LOG2_E),
        );
        let ceiling = _mm512_set1_ps(max + headroom);
        // Four vectors per step under one check: their chains overlap (one vector per step
        // took 1.5× as long).
        let mut sums = [_mm512_setzero_ps(); 4];
        let mut done = 0;
        for chunk in xs.chunks_exact_mut(64) {
            let p = chunk.as_mut_ptr();
            let x: [__m512; 4] = std::array::from_fn(|i| _mm512_loadu_ps(p.add(16 * i)));
            let over = x
                .iter()
                .fold(0, |o, &x| o | _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, ceiling));
            if over != 0 {
                break;
            }
            for (i, (&x, sum)) in x.iter().zip(&mut sums).enumerate() {
                let e = exp16(x, max_log2e);
                _mm512_storeu_ps(p.add(16 * i), e);
                *sum = _mm512_add_ps(*sum, e);
            }
            done += 64;
        }
        let mut sum = _mm512_add_ps(
            _mm512_add_ps(sums[0], sums[1]),
            _mm512_add_ps(sums[2], sums[3]),
        );
        for (k, c) in xs[done..].chunks_mut(16).enumerate() {
            let lanes: __mmask16 = if c.len() == 16 {
                !0
            } else {
                (1 << c.len()) - 1
            };
            let x = _mm512_maskz_loadu_ps(lanes, c.as_ptr());
            if _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(lanes, x, ceiling) != 0 {
                return (_mm512_reduce_add_ps(sum), done + 16 * k);
            }
            let e = _mm512_maskz_mov_ps(lanes, exp16(x, max_log2e));
            _mm512_mask_storeu_ps(c.as_mut_ptr(), lanes, e);
            sum = _mm512_add_ps(sum, e);
        }
        (_mm512_reduce_add_ps(sum), xs.len())
    }

    /// 16 values at element `i` of the row at `row` before their scale (`avx2::scale_as`;
    /// no bounds check).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    unsafe fn unscaled16_as<F: super::Format>(row: *const u8, i: usize) -> __m512 {
        match F::ROW {
            RowFormat::F32 => _mm512_loadu_ps(row.add(4 * i) as *const f32),
            RowFormat::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(row.add(2 * i) as *const __m256i)),
            RowFormat::Bf16 => {
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(row.add(2 * i) as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
            }
            RowFormat::Q8_0 => {
                let value = RowFormat::q8_0_at(i).1;
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                    row.add(value) as *const __m128i
                )))
            }
            RowFormat::Fp8 { e5m2 } => {
                let codes = _mm256_cvtepu8_epi16(_mm_loadu_si128(row.add(2 + i) as *const __m128i));
                let magnitude = _mm256_and_si256(codes, _mm256_set1_epi16(0x7F));
                let bits = if e5m2 {
                    _mm256_slli_epi16(codes, 8)
                } else {
                    let sign =
                        _mm256_slli_epi16(_mm256_and_si256(codes, _mm256_set1_epi16(0x80)), 8);
                    _mm256_or_si256(sign, _mm256_slli_epi16(magnitude, 7))
                };
                let x = _mm512_cvtph_ps(bits);
                // E4M3's NaN code (its magnitude all ones) decodes to NaN, as in the codec.
                let nan = if e5m2 {
                    0
                } else {
                    let magnitude = _mm512_cvtepu16_epi32(magnitude);
                    _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7F))
                };
                _mm512_mask_mov_ps(x, nan, _mm512_set1_ps(f32::NAN))
            }
            RowFormat::Int8 => {
                let codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(row.add(2 + i) as *const __m128i));
                _mm512_cvtepi32_ps(_mm512_sub_epi32(codes, _mm512_set1_epi32(128)))
            }
            RowFormat::U8 => _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                row.add(i) as *const __m128i
            ))),
        }
    }

    /// The 16 codes of width `B` (1, 2, 3, 4 or 8) in the `2B` bytes at `p`, least
    /// significant bit first, one per 32-bit lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    unsafe fn codes16<const B: usize>(p: *const u8) -> __m512i {
        if B == 8 {
            return _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
        }
        let word = match B {
            1 => u64::from(std::ptr::read_unaligned(p as *const u16)),
            2 => u64::from(std::ptr::read_unaligned(p as *const u32)),
            3 => {
                u64::from(std::ptr::read_unaligned(p as *const u32))
                    | u64::from(std::ptr::read_unaligned(p.add(4) as *const u16)) << 32
            }
            _ => std::ptr::read_unaligned(p as *const u64),
        };
        let (w0, w1) = (
            (word & ((1 << (8 * B)) - 1)) as i32,
            (word >> (8 * B)) as i32,
        );
        let both = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set1_epi32(w0)),
            _mm256_set1_epi32(w1),
            1,
        );
        let b = B as i32;
        let shifts = _mm512_setr_epi32(
            0,
            b,
            2 * b,
            3 * b,
            4 * b,
            5 * b,
            6 * b,
            7 * b,
            0,
            b,
            2 * b,
            3 * b,
            4 * b,
            5 * b,
            6 * b,
            7 * b,
        );
        _mm512_and_si512(
            _mm512_srlv_epi32(both, shifts),
            _mm512_set1_epi32((1 << B) - 1),
        )
    }

    /// The levels of 16 codes: the codes themselves, or their entries in `table`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    unsafe fn levels16(codes: __m512i, table: Option<__m512>) -> __m512 {
        match table {
            Some(t) => _mm512_permutexvar_ps(codes, t),
            None => _mm512_cvtepi32_ps(codes),
        }
    }

    /// `super::decode_codes` (and `super::decode_lut` with `lut`) for code width `B`, 16
    /// codes at a time; groups are 1 or a multiple of 16 codes long.
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    pub unsafe fn decode_codes<const B: usize>(
        packed: &[u8],
        a: &[f32],
        b: &[f32],
        lut: Option<&[f32; 16]>,
        out: &mut [f32],
    ) {
        let table = lut.map(|l| _mm512_loadu_ps(l.as_ptr()));
        let (mut p, o) = (packed.as_ptr(), out.as_mut_ptr());
        if a.len() == out.len() {
            for i in (0..out.len()).step_by(16) {
                let x = levels16(codes16::<B>(p), table);
                let (av, bv) = (
                    _mm512_loadu_ps(a.as_ptr().add(i)),
                    _mm512_loadu_ps(b.as_ptr().add(i)),
                );
                _mm512_storeu_ps(o.add(i), _mm512_fmadd_ps(av, x, bv));
                p = p.add(2 * B);
            }
            return;
        }
        let per_group = out.len() / a.len() / 16;
        let mut i = 0;
        for (&a, &b) in a.iter().zip(b) {
            let (av, bv) = (_mm512_set1_ps(a), _mm512_set1_ps(b));
            for _ in 0..per_group {
                let x = levels16(codes16::<B>(p), table);
                _mm512_storeu_ps(o.add(i), _mm512_fmadd_ps(av, x, bv));
                p = p.add(2 * B);
                i += 16;
            }
        }
    }

    /// `super::decode_rows` for code width `B` and groups of a multiple of 16 codes.
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    pub unsafe fn decode_rows<const B: usize>(
        rows: &[u8],
        run: &super::CodeRun,
        lut: Option<&[f32; 16]>,
        out: &mut [f32],
        out_stride: usize,
        out_at: usize,
    ) {
        // The loop of `decode_codes`, kept inline: one table load for the whole run and no
        // slicing per group (calling `decode_codes` per group measured 5–10% slower).
        let table = lut.map(|l| _mm512_loadu_ps(l.as_ptr()));
        for (t, row) in rows.chunks_exact(run.row_bytes).enumerate() {
            let mut p = row.as_ptr().add(run.codes_at);
            let o = out.as_mut_ptr().add(t * out_stride + out_at);
            for g in 0..run.len / run.group {
                let (a, b) = run.params.read(row, g);
                let (av, bv) = (_mm512_set1_ps(a), _mm512_set1_ps(b));
                for i in (g * run.group..(g + 1) * run.group).step_by(16) {
                    let x = levels16(codes16::<B>(p), table);
                    _mm512_storeu_ps(o.add(i), _mm512_fmadd_ps(av, x, bv));
                    p = p.add(2 * B);
                }
            }
        }
    }

    /// As `avx2::score4`, 16 channels per step and up to 4 queries (each row converted once for
    /// all of them; the second vector holds queries 2 and 3). Its 16 accumulators and 4 rows
    /// need AVX-512VL: without it, 256-bit code is confined to 16 registers and two
    /// accumulators went through the stack every step.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    unsafe fn score4<F: super::Format, const H: usize>(
        q: [*const f32; H],
        d: usize,
        rows: *const u8,
        row_bytes: usize,
    ) -> [__m256; 2] {
        let row = |k: usize| rows.add(k * row_bytes);
        let mut acc = [_mm512_setzero_ps(); 16];
        // q8_0's block scales multiply the values, once per block and row; the scale of a
        // whole row (FP8, int8) multiplies its scores at the end.
        let blocks = matches!(F::ROW, RowFormat::Q8_0);
        let mut block_scales = [_mm512_setzero_ps(); 4];
        for i in (0..d).step_by(16) {
            let mut x: [__m512; 4] = [
                unscaled16_as::<F>(row(0), i),
                unscaled16_as::<F>(row(1), i),
                unscaled16_as::<F>(row(2), i),
                unscaled16_as::<F>(row(3), i),
            ];
            if blocks {
                if i % super::Q8_0_BLOCK.1 == 0 {
                    for (k, scale) in block_scales.iter_mut().enumerate() {
                        *scale = _mm512_set1_ps(super::avx2::scale_as::<F>(row(k), i));
                    }
                }
                for (x, scale) in x.iter_mut().zip(block_scales) {
                    *x = _mm512_mul_ps(*x, scale);
                }
            }
            for h in 0..H {
                let qv = _mm512_loadu_ps(q[h].add(i));
                for k in 0..4 {
                    acc[4 * h + k] = _mm512_fmadd_ps(qv, x[k], acc[4 * h + k]);
                }
            }
        }
        let mut halves = [[_mm256_setzero_ps(); 8]; 2];
        for (j, a) in acc.iter().enumerate() {
            halves[j / 8][j % 8] =
                _mm256_add_ps(_mm512_castps512_ps256(*a), _mm512_extractf32x8_ps(*a, 1));
        }
        let mut scores = if H <= 2 {
            [hsum8(halves[0]), _mm256_setzero_ps()]
        } else {
            [hsum8(halves[0]), hsum8(halves[1])]
        };
        // Lane 4h + k holds row k's score: times the row's scale.
        if let Some(scales) = super::avx2::row_scales::<F>(rows, row_bytes) {
            scores = [
                _mm256_mul_ps(scores[0], scales),
                _mm256_mul_ps(scores[1], scales),
            ];
        }
        scores
    }

    group_drivers!(
        16,
        64,
        [1, 2, 3, 4],
        "avx512f,avx512dq,avx512vl,avx2,fma,f16c"
    );

    /// As `avx2::accumulate_chunk`, for 64 channels, each row's scales read once (per q8_0
    /// block, or per row).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma,f16c")]
    unsafe fn accumulate_chunk<F: super::Format, const H: usize>(
        w: [*const f32; H],
        rows: *const u8,
        row_bytes: usize,
        n: usize,
        i: usize,
        acc: [*mut f32; H],
    ) {
        let blocks = matches!(F::ROW, RowFormat::Q8_0);
        let mut sum = [[_mm512_setzero_ps(); 4]; H];
        for t in 0..n {
            let row = rows.add(t * row_bytes);
            let mut x: [__m512; 4] = [
                unscaled16_as::<F>(row, i),
                unscaled16_as::<F>(row, i + 16),
                unscaled16_as::<F>(row, i + 32),
                unscaled16_as::<F>(row, i + 48),
            ];
            if super::scaled::<F>() {
                // The second half's block for q8_0, the same scale for a row's.
                let half = if blocks { 32 } else { 0 };
                let scales = [
                    _mm512_set1_ps(super::avx2::scale_as::<F>(row, i)),
                    _mm512_set1_ps(super::avx2::scale_as::<F>(row, i + half)),
                ];
                for (k, x) in x.iter_mut().enumerate() {
                    *x = _mm512_mul_ps(*x, scales[k / 2]);
                }
            }
            for h in 0..H {
                let wv = _mm512_set1_ps(*w[h].add(t));
                for k in 0..4 {
                    sum[h][k] = _mm512_fmadd_ps(wv, x[k], sum[h][k]);
                }
            }
        }
        for h in 0..H {
            for (k, s) in sum[h].into_iter().enumerate() {
                let a = acc[h].add(i + 16 * k);
                _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), s));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of `d` values of `xs` in `format`.
    fn encode(format: RowFormat, xs: &[f32], d: usize) -> Vec<u8> {
        if format == RowFormat::Q8_0 {
            // Plainly: per 32 values the scale that maps the largest magnitude to 127.
            return xs
                .chunks(32)
                .flat_map(|b| {
                    let d = f16::from_f32(b.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0);
                    let codes = b.iter().map(|x| (x / d.to_f32()).round() as i8 as u8);
                    d.to_le_bytes()
                        .into_iter()
                        .chain(codes)
                        .collect::<Vec<u8>>()
                })
                .collect();
        }
        if let RowFormat::Fp8 { e5m2 } = format {
            // Plainly: each row's scale maps its largest magnitude to the format's largest.
            let fp8 = if e5m2 {
                Fp8Format::E5M2
            } else {
                Fp8Format::E4M3
            };
            return xs
                .chunks(d)
                .flat_map(|row| {
                    let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let s = f16::from_f32(amax / fp8.max());
                    let codes = row.iter().map(move |x| fp8.encode(x / s.to_f32()));
                    s.to_le_bytes()
                        .into_iter()
                        .chain(codes)
                        .collect::<Vec<u8>>()
                })
                .collect();
        }
        if format == RowFormat::Int8 {
            // Plainly: each row's scale maps its largest magnitude to 127.
            return xs
                .chunks(d)
                .flat_map(|row| {
                    let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let s = f16::from_f32(amax / 127.0);
                    let codes = row
                        .iter()
                        .map(move |x| ((x / s.to_f32()).round() + 128.0) as u8);
                    s.to_le_bytes()
                        .into_iter()
                        .chain(codes)
                        .collect::<Vec<u8>>()
                })
                .collect();
        }
        xs.iter()
            .flat_map(|&x| match format {
                RowFormat::U8 => vec![(x * 20.0 + 128.0) as u8],
                RowFormat::F32 => x.to_le_bytes().to_vec(),
                RowFormat::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
                RowFormat::Bf16 => bf16::from_f32(x).to_le_bytes().to_vec(),
                RowFormat::Q8_0 | RowFormat::Fp8 { .. } | RowFormat::Int8 => {
                    unreachable!("encoded whole above")
                }
            })
            .collect()
    }

    #[test]
    fn vector_paths_equal_scalar_definitions() {
        for (format, lengths) in [
            (RowFormat::F32, &[8usize, 64, 72, 256, 5][..]),
            (RowFormat::F16, &[8, 64, 72, 256, 5]),
            (RowFormat::Bf16, &[8, 64, 72, 256, 5]),
            (RowFormat::Q8_0, &[32, 64, 96, 256]),
            (RowFormat::Fp8 { e5m2: false }, &[8, 64, 72, 256]),
            (RowFormat::Fp8 { e5m2: true }, &[8, 64, 72, 256]),
            (RowFormat::Int8, &[8, 64, 72, 256]),
            (RowFormat::U8, &[8, 64, 72, 256]),
        ] {
            for &n in lengths {
                let q: Vec<f32> = (0..n).map(|i| ((i * 31 % 17) as f32 - 8.0) / 3.0).collect();
                let xs: Vec<f32> = (0..n).map(|i| ((i * 13 % 11) as f32 - 5.0) / 7.0).collect();
                let row = encode(format, &xs, n);
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
    fn row_decoder_agrees_with_scalar() {
        let lut: [f32; 16] = std::array::from_fn(|i| (i as f32 - 7.3) * 0.37);
        let row_bytes = 96;
        let rows: Vec<u8> = (0..row_bytes * 5)
            .map(|i| (i * 37 + 11) as u8 % 251)
            .collect();
        // Parameters stay finite f16s: clear the high exponent bits of the parameter bytes.
        let rows: Vec<u8> = rows
            .chunks_exact(row_bytes)
            .flat_map(|r| {
                r.iter()
                    .enumerate()
                    .map(|(i, &b)| if i < 16 && i % 2 == 1 { b & 0x3B } else { b })
            })
            .collect();
        for bits in [2u32, 3, 4, 8] {
            for (group, params) in [
                (16, GroupParams::ScaleMin),
                (32, GroupParams::ScaleZero { zero: 4.0 }),
                (8, GroupParams::ScaleMin),
                (64, GroupParams::Scale { at: 2 }),
            ] {
                let run = CodeRun {
                    row_bytes,
                    codes_at: 16,
                    len: 64,
                    bits,
                    group,
                    params,
                };
                let table =
                    (bits <= 4 && matches!(params, GroupParams::Scale { .. })).then_some(&lut);
                let (mut v, mut s) = (vec![0f32; 5 * 70], vec![0f32; 5 * 70]);
                decode_rows(&rows, &run, table, &mut v, 70, 3);
                force_scalar(|| decode_rows(&rows, &run, table, &mut s, 70, 3));
                assert!(
                    v.iter()
                        .zip(&s)
                        .all(|(a, b)| (a - b).abs() <= 1e-5 * (1.0 + b.abs())),
                    "bits {bits} group {group} {params:?}"
                );
                assert!(s.iter().any(|&x| x != 0.0));
            }
        }
    }

    #[test]
    fn exp_below_a_headroom_stops_before_the_first_value_above_it() {
        // Value 40 passes `max + headroom`: the vector paths stop at its chunk (32 or 40),
        // the others at the value (40); what is done is exponentiated, the rest untouched.
        let mut xs: Vec<f32> = (0..100).map(|i| -((i % 11) as f32) * 0.5).collect();
        xs[40] = 20.0;
        for scalar in [false, true] {
            let mut v = xs.clone();
            let mut run = || exp_shifted_below(&mut v, 0.0, 10.0);
            let (sum, done) = if scalar { force_scalar(run) } else { run() };
            assert!(
                (32..=40).contains(&done),
                "scalar {scalar}: stopped at {done}"
            );
            let want: f32 = xs[..done].iter().map(|x| x.exp()).sum();
            assert!((sum - want).abs() <= 1e-5 * want, "{sum} vs {want}");
            for (i, (a, x)) in v.iter().zip(&xs).enumerate() {
                let expected = if i < done { x.exp() } else { *x };
                assert!(
                    (a - expected).abs() <= 1e-6 * (1.0 + expected.abs()),
                    "element {i}"
                );
            }
        }
    }

    #[test]
    fn vector_exp_matches_std() {
        let xs: Vec<f32> = (0..2000)
            .map(|i| -(i as f32) * 0.05 + 0.5)
            .chain([f32::NEG_INFINITY, -87.5, -86.9, 0.0])
            .collect();
        let max = 0.5;
        let mut v = xs.clone();
        let sum = exp_shifted(&mut v, max);
        let mut exact_sum = 0.0f64;
        for (x, e) in xs.iter().zip(&v) {
            let exact = (f64::from(*x) - f64::from(max)).exp();
            exact_sum += exact;
            // The polynomial's 2e-7, and `x·log2 e` rounded in f32 (as the score `x` itself
            // is): an error that grows with the distance from the maximum.
            // (Below e^−86, results may flush to 0.)
            let tolerance = if *x - max < -86.0 {
                1e-37
            } else {
                (3e-7 + 1e-7 * f64::from(max - x)) * exact
            };
            assert!(
                (f64::from(*e) - exact).abs() <= tolerance,
                "exp({x} − {max}): {e} vs {exact}"
            );
        }
        assert!((f64::from(sum) - exact_sum).abs() < 1e-5 * exact_sum);
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
                for groups in [1, n / 8, n / 16, n] {
                    if groups == 0 || n % groups != 0 {
                        continue;
                    }
                    let a: Vec<f32> = (0..groups).map(|g| 0.25 + g as f32).collect();
                    let b: Vec<f32> = (0..groups).map(|g| -(g as f32) / 3.0).collect();
                    let (mut out_v, mut out_s) = (vec![0f32; n], vec![0f32; n]);
                    decode_codes(&packed, bits, &a, &b, &mut out_v);
                    force_scalar(|| decode_codes(&packed, bits, &a, &b, &mut out_s));
                    assert!(
                        out_v.iter().zip(&out_s).all(|(x, y)| close(*x, *y)),
                        "decode_codes {bits} {n} {groups}"
                    );
                }
                if bits <= 4 {
                    let (mut out_v, mut out_s) = (vec![0f32; n], vec![0f32; n]);
                    decode_lut(&packed, bits, &lut, 1.5, &mut out_v);
                    force_scalar(|| decode_lut(&packed, bits, &lut, 1.5, &mut out_s));
                    assert!(
                        out_v.iter().zip(&out_s).all(|(x, y)| close(*x, *y)),
                        "decode_lut {bits} {n}"
                    );
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
        // Rows not a multiple of the 4-row block, and more than one block of rows in L1 (64
        // f32 rows); head counts around the 2- and 4-head blocks.
        for (format, heads, rows) in [
            (RowFormat::F32, 1, 9),
            (RowFormat::F32, 5, 203),
            (RowFormat::F16, 4, 9),
            (RowFormat::F16, 3, 300),
            (RowFormat::Bf16, 8, 9),
            (RowFormat::Bf16, 2, 131),
            (RowFormat::Q8_0, 4, 9),
            (RowFormat::Q8_0, 3, 150),
            (RowFormat::Fp8 { e5m2: false }, 4, 150),
            (RowFormat::Fp8 { e5m2: true }, 5, 9),
            (RowFormat::Int8, 4, 150),
            (RowFormat::U8, 3, 300),
        ] {
            let d = 64;
            let xs: Vec<f32> = (0..rows * d)
                .map(|i| ((i * 13 % 11) as f32 - 5.0) / 7.0)
                .collect();
            let bytes = encode(format, &xs, d);
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
            dot_rows_group(format, &q_refs, &bytes, &mut refs, &mut Ahead::none());
            let mut accs = vec![vec![0.5f32; d]; heads];
            let weights: Vec<Vec<f32>> = (0..heads)
                .map(|h| (0..rows).map(|t| (t + h) as f32 / 10.0).collect())
                .collect();
            let w_refs: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
            let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(Vec::as_mut_slice).collect();
            axpy_rows_group(format, &w_refs, &bytes, &mut acc_refs, &mut Ahead::none());
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
