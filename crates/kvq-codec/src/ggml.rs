//! llama.cpp's block formats, byte for byte: `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `iq4_nl`
//! (ggml-common.h; methods.md §5.3). Every block holds 32 consecutive elements of a row; a row of
//! `head_dim` (a multiple of 32) is `head_dim/32` blocks, and one codec block is one row.
//!
//! | type | bytes | layout (f16 little-endian) | value of element j | bits/elem |
//! |---|---|---|---|---|
//! | q8_0 | 34 | `d`, `qs[32]` (i8) | `d·qs[j]` | 8.5 |
//! | q4_0 | 18 | `d`, `qs[16]` | `d·(n_j − 8)` | 4.5 |
//! | q4_1 | 20 | `d`, `m`, `qs[16]` | `d·n_j + m` | 5.0 |
//! | q5_0 | 22 | `d`, `qh[4]`, `qs[16]` | `d·(n_j + 16·h_j − 16)` | 5.5 |
//! | q5_1 | 24 | `d`, `m`, `qh[4]`, `qs[16]` | `d·(n_j + 16·h_j) + m` | 6.0 |
//! | iq4_nl | 18 | `d`, `qs[16]` | `d·IQ4_NL_VALUES[n_j]` | 4.5 |
//!
//! `n_j` is the low nibble of `qs[j]` for `j < 16` and the high nibble of `qs[j−16]` otherwise;
//! `h_j` is bit `j` of `qh` read as a little-endian u32. The bits per element are the same at
//! every head size.
//!
//! The quantizers follow llama.cpp's reference quantizers (`quantize_row_*_ref` in
//! ggml-quants.c) operation for operation in f32: the same scale (`amax/127`; the signed
//! largest-magnitude value over −8 or −16; `(max−min)/15` or `/31`), the same reciprocal, the
//! same truncating `+ 0.5` rounding and clamps, and f16 round-to-nearest-even of the stored
//! scale, so their blocks equal llama.cpp's. `iq4_nl` follows `quantize_row_iq4_nl_impl` with
//! llama.cpp's KV-cache settings (one 32-element block, no importance weights, weights `x²`,
//! `ntry = 7` scale candidates). The one deviation: this code never fuses a multiply and an add,
//! while a llama.cpp build that lets the C compiler contract them into FMAs (GCC's default with
//! `-march=native`) can pick a different scale when two candidates tie to the last bit.
//!
//! The block functions ([`GgmlType::quantize_block`], [`GgmlType::dequantize_block`],
//! [`GgmlType::dequantize_row`]) are public so that GGUF weights use the same implementation.

use crate::levels::{self, CodeLayout, LevelFormat, LevelTable, MapLayout};
use crate::simd::RowFormat;
use crate::uniform::{out_of_f16_range, read_f16};
use crate::{check_finite, Codec, CodecError};
use half::f16;

/// Elements per block in every format here.
pub const QK: usize = 32;

/// The 16 levels of `iq4_nl` (llama.cpp's `kvalues_iq4nl`).
pub const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One of llama.cpp's 32-element block formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    /// 8-bit symmetric.
    Q8_0,
    /// 4-bit symmetric (offset 8).
    Q4_0,
    /// 4-bit with a minimum.
    Q4_1,
    /// 5-bit symmetric (offset 16).
    Q5_0,
    /// 5-bit with a minimum.
    Q5_1,
    /// 4-bit non-linear levels ([`IQ4_NL_VALUES`]).
    Iq4Nl,
}

/// A block split into `x_j = d·level_j + m`.
struct Levels {
    d: f32,
    m: f32,
    level: [i8; QK],
}

impl GgmlType {
    /// The type's llama.cpp name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Iq4Nl => "iq4_nl",
        }
    }

    /// Bytes of one 32-element block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 34,
            Self::Q4_0 | Self::Iq4Nl => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
        }
    }

    /// Whether blocks store a minimum `m`.
    fn has_min(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q5_1)
    }

    /// Encodes 32 values into one block (`block_bytes` long), as llama.cpp's reference
    /// quantizer does. Non-finite input gives an unspecified (but memory-safe) block.
    pub fn quantize_block(self, x: &[f32], out: &mut [u8]) {
        assert_eq!(x.len(), QK, "a ggml block holds {QK} values");
        let mut n = [0u8; QK];
        match self {
            Self::Q8_0 => {
                let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = reciprocal(d);
                write_f16(out, 0, d);
                for (q, &v) in out[2..34].iter_mut().zip(x) {
                    *q = ((v * id).round() as i8) as u8;
                }
                return;
            }
            Self::Q4_0 | Self::Q5_0 => {
                let nmid = if self == Self::Q4_0 { 8.0 } else { 16.0 };
                let d = signed_absmax(x) / -nmid;
                let id = reciprocal(d);
                write_f16(out, 0, d);
                let (offset, top) = (nmid + 0.5, 2.0 * nmid - 1.0);
                for (n, &v) in n.iter_mut().zip(x) {
                    *n = f32::from((v * id + offset) as i8).min(top) as u8;
                }
            }
            Self::Q4_1 | Self::Q5_1 => {
                let (min, max) = x
                    .iter()
                    .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                let top = if self == Self::Q4_1 { 15.0 } else { 31.0 };
                let d = (max - min) / top;
                let id = reciprocal(d);
                write_f16(out, 0, d);
                write_f16(out, 2, min);
                for (n, &v) in n.iter_mut().zip(x) {
                    let scaled = (v - min) * id + 0.5;
                    *n = if self == Self::Q4_1 {
                        f32::from(scaled as i8).min(top) as u8
                    } else {
                        scaled as u8
                    };
                }
            }
            Self::Iq4Nl => {
                let d = iq4_nl_scale(x);
                write_f16(out, 0, d);
                let id = reciprocal(d);
                for (n, &v) in n.iter_mut().zip(x) {
                    *n = iq4_nl_index(id * v);
                }
            }
        }
        let qs_at = self.block_bytes() - QK / 2;
        for j in 0..QK / 2 {
            out[qs_at + j] = (n[j] & 0x0F) | ((n[j + QK / 2] & 0x0F) << 4);
        }
        if matches!(self, Self::Q5_0 | Self::Q5_1) {
            let qh = n
                .iter()
                .enumerate()
                .fold(0u32, |qh, (j, &n)| qh | (u32::from(n >> 4) & 1) << j);
            out[qs_at - 4..qs_at].copy_from_slice(&qh.to_le_bytes());
        }
    }

    /// Splits a block into its scale, minimum and integer levels.
    #[inline]
    fn levels(self, block: &[u8]) -> Levels {
        let d = read_f16(block, 0);
        let m = if self.has_min() {
            read_f16(block, 2)
        } else {
            0.0
        };
        let mut level = [0i8; QK];
        if self == Self::Q8_0 {
            for (l, &b) in level.iter_mut().zip(&block[2..34]) {
                *l = b as i8;
            }
            return Levels { d, m, level };
        }
        let qs_at = self.block_bytes() - QK / 2;
        let mut n = [0u8; QK];
        for (j, &byte) in block[qs_at..qs_at + QK / 2].iter().enumerate() {
            n[j] = byte & 0x0F;
            n[j + QK / 2] = byte >> 4;
        }
        if matches!(self, Self::Q5_0 | Self::Q5_1) {
            let qh = u32::from_le_bytes(block[qs_at - 4..qs_at].try_into().unwrap());
            for (j, n) in n.iter_mut().enumerate() {
                *n |= (((qh >> j) & 1) << 4) as u8;
            }
        }
        let zero = match self {
            Self::Q4_0 => 8,
            Self::Q5_0 => 16,
            _ => 0,
        };
        if self == Self::Iq4Nl {
            for (l, &n) in level.iter_mut().zip(&n) {
                *l = IQ4_NL_VALUES[usize::from(n)];
            }
        } else {
            for (l, &n) in level.iter_mut().zip(&n) {
                *l = n as i8 - zero;
            }
        }
        Levels { d, m, level }
    }

    /// Decodes one block into 32 values.
    pub fn dequantize_block(self, block: &[u8], out: &mut [f32]) {
        let Levels { d, m, level } = self.levels(block);
        for (x, &l) in out[..QK].iter_mut().zip(&level) {
            *x = d * f32::from(l) + m;
        }
    }

    /// Decodes a run of blocks (`out.len()` a multiple of 32 values) with the vector kernels
    /// where the CPU has them (AVX-512 for Q4_0 and Q8_0, AVX2 for all), else block by block
    /// as [`GgmlType::dequantize_block`]; the kernels may round `d·level + m` once where it
    /// rounds twice.
    pub fn dequantize_row(self, blocks: &[u8], out: &mut [f32]) {
        assert_eq!(blocks.len() / self.block_bytes() * QK, out.len());
        #[cfg(target_arch = "x86_64")]
        if crate::simd::use_avx2() {
            if crate::simd::use_avx512() && matches!(self, GgmlType::Q4_0 | GgmlType::Q8_0) {
                // SAFETY: AVX-512F/DQ are present; `blocks` holds one block per 32 outputs.
                unsafe { avx512::dequantize(self, blocks, out) };
                return;
            }
            // SAFETY: AVX2/FMA/F16C are present; `blocks` holds one block per 32 outputs.
            unsafe { avx2::dequantize(self, blocks, out) };
            return;
        }
        self.dequantize_blocks(blocks, out);
    }

    /// [`GgmlType::dequantize_row`] block by block, without vector kernels.
    fn dequantize_blocks(self, blocks: &[u8], out: &mut [f32]) {
        for (block, xs) in blocks
            .chunks_exact(self.block_bytes())
            .zip(out.chunks_exact_mut(QK))
        {
            self.dequantize_block(block, xs);
        }
    }
}

fn reciprocal(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn write_f16(out: &mut [u8], at: usize, v: f32) {
    out[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// The first value of largest magnitude, with its sign.
fn signed_absmax(x: &[f32]) -> f32 {
    x.iter()
        .fold((0.0f32, 0.0f32), |(amax, max), &v| {
            if amax < v.abs() {
                (v.abs(), v)
            } else {
                (amax, max)
            }
        })
        .1
}

/// The index of the level of [`IQ4_NL_VALUES`] nearest to `x` (the lower one on ties), by
/// llama.cpp's bisection.
fn iq4_nl_index(x: f32) -> u8 {
    let level = |i: usize| f32::from(IQ4_NL_VALUES[i]);
    if x <= level(0) {
        return 0;
    }
    if x >= level(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < level(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - level(hi - 1) < level(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// llama.cpp's `iq4_nl` scale search for one block: the weighted (`x²`) least-squares scale of
/// the best of 16 candidate level assignments (`max/127` and `(t − 127)/max` for
/// `t = −7..=7`); 0 for an all-but-zero block.
fn iq4_nl_scale(x: &[f32]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < 1e-15 {
        return 0.0;
    }
    // Σ w·q·x and Σ w·q² for the levels q nearest to id·x, w = x², in llama.cpp's order.
    let sums = |id: f32| {
        x.iter().fold((0.0f32, 0.0f32), |(sqx, sq2), &v| {
            let q = f32::from(IQ4_NL_VALUES[usize::from(iq4_nl_index(id * v))]);
            let w = v * v;
            (sqx + w * q * v, sq2 + w * q * q)
        })
    };
    let level0 = f32::from(IQ4_NL_VALUES[0]);
    let (sumqx, sumq2) = sums(1.0 / (-max / level0));
    let mut d = sumqx / sumq2;
    let mut best = d * sumqx;
    for t in -7..=7 {
        let (sumqx, sumq2) = sums((t as f32 + level0) / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Rows stored as llama.cpp blocks (see the module documentation).
#[derive(Clone, Debug)]
pub struct GgmlCodec {
    ty: GgmlType,
    head_dim: usize,
}

impl GgmlCodec {
    /// A codec for rows of `head_dim` elements (a multiple of 32).
    pub fn new(ty: GgmlType, head_dim: usize) -> Result<Self, CodecError> {
        if head_dim == 0 || !head_dim.is_multiple_of(QK) {
            return Err(CodecError::UnsupportedHeadDim {
                scheme: ty.name().into(),
                head_dim,
                why: format!("llama.cpp blocks hold {QK} elements; head_dim must be a multiple"),
            });
        }
        Ok(Self { ty, head_dim })
    }

    fn blocks_per_row(&self) -> usize {
        self.head_dim / QK
    }
}

impl Codec for GgmlCodec {
    fn name(&self) -> String {
        self.ty.name().into()
    }
    fn head_dim(&self) -> usize {
        self.head_dim
    }
    fn block_tokens(&self) -> usize {
        1
    }
    fn block_bytes(&self) -> usize {
        self.blocks_per_row() * self.ty.block_bytes()
    }

    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        check_finite(rows, self.head_dim)?;
        let bb = self.ty.block_bytes();
        for (x, block) in rows.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
            self.ty.quantize_block(x, block);
            let Levels { d, m, .. } = self.ty.levels(block);
            if !(d.is_finite() && m.is_finite()) {
                return Err(out_of_f16_range(rows, self.head_dim));
            }
        }
        Ok(())
    }

    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        self.ty.dequantize_blocks(block, rows);
    }

    /// Types with a minimum append each 32-block's query sum, which the `m` term needs; the
    /// 4- and 5-bit types the i8 query of the integer kernels.
    fn query_len(&self) -> usize {
        let sums = if self.ty.has_min() {
            self.blocks_per_row()
        } else {
            0
        };
        let slots = self
            .level_format()
            .map_or(0, |f| levels::query_slots(f.width));
        self.head_dim + sums + slots
    }

    fn prepare_query(&self, query: &[f32], prepared: &mut [f32]) {
        let d = self.head_dim;
        prepared[..d].copy_from_slice(query);
        if self.ty.has_min() {
            for (sum, qs) in prepared[d..].iter_mut().zip(query.chunks_exact(QK)) {
                *sum = qs.iter().sum();
            }
        }
        if let Some(format) = self.level_format() {
            levels::finish_query(&format, prepared);
        }
    }

    fn level_format(&self) -> Option<LevelFormat> {
        let bb = self.ty.block_bytes();
        // (nibbles, fifth bits, minimum) within a block, the level of 0, the table.
        let (at, high_at, min_at, zero, table) = match self.ty {
            GgmlType::Q4_0 => (2, None, None, 8.0, None),
            GgmlType::Q4_1 => (4, None, Some(2), 0.0, None),
            GgmlType::Q5_0 => (6, Some(2), None, 16.0, None),
            GgmlType::Q5_1 => (8, Some(4), Some(2), 0.0, None),
            GgmlType::Iq4Nl => (
                2,
                None,
                None,
                128.0,
                Some(LevelTable {
                    levels: IQ4_NL_VALUES,
                    unit: 1.0,
                }),
            ),
            GgmlType::Q8_0 => return None,
        };
        Some(LevelFormat {
            row_bytes: self.block_bytes(),
            width: self.head_dim,
            codes: CodeLayout::Nibbles {
                block_bytes: bb,
                at,
                high_at,
            },
            maps: MapLayout {
                channels: QK,
                scale_at: 0,
                stride: bb,
                min_at,
                zero,
            },
            table,
        })
        .filter(LevelFormat::supported)
    }

    fn score(&self, prepared_query: &[f32], blocks: &[u8], scores: &mut [f32]) {
        let (q, block_sums) = prepared_query.split_at(self.head_dim);
        let bb = self.ty.block_bytes();
        #[cfg(target_arch = "x86_64")]
        if crate::simd::use_avx2() {
            for (row, score) in blocks.chunks_exact(self.block_bytes()).zip(scores) {
                // SAFETY: the CPU supports AVX2/FMA/F16C; `row` holds `q.len()/32` blocks.
                *score = unsafe { avx2::score_row(self.ty, q, block_sums, row) };
            }
            return;
        }
        for (row, score) in blocks.chunks_exact(self.block_bytes()).zip(scores) {
            let mut total = 0.0f32;
            for (b, (block, qb)) in row.chunks_exact(bb).zip(q.chunks_exact(QK)).enumerate() {
                let Levels { d, m, level } = self.ty.levels(block);
                let dot: f32 = qb.iter().zip(&level).map(|(q, &l)| q * f32::from(l)).sum();
                total += d * dot;
                if self.ty.has_min() {
                    total += m * block_sums[b];
                }
            }
            *score = total;
        }
    }

    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]) {
        let bb = self.ty.block_bytes();
        #[cfg(target_arch = "x86_64")]
        if crate::simd::use_avx2() {
            for (row, &w) in blocks.chunks_exact(self.block_bytes()).zip(weights) {
                // SAFETY: as in `score`; `acc` holds `head_dim` values.
                unsafe { avx2::accumulate_row(self.ty, w, row, &mut acc[..self.head_dim]) };
            }
            return;
        }
        for (row, &w) in blocks.chunks_exact(self.block_bytes()).zip(weights) {
            for (block, acc_b) in row.chunks_exact(bb).zip(acc.chunks_exact_mut(QK)) {
                let Levels { d, m, level } = self.ty.levels(block);
                let (wd, wm) = (w * d, w * m);
                for (a, &l) in acc_b.iter_mut().zip(&level) {
                    *a += wd * f32::from(l) + wm;
                }
            }
        }
    }

    /// q8_0 rows go straight to the float kernels, converted in registers.
    fn row_format(&self) -> Option<RowFormat> {
        (self.ty == GgmlType::Q8_0).then_some(RowFormat::Q8_0)
    }

    fn decode_working(&self, blocks: &[u8], rows: &mut [f32]) {
        self.ty.dequantize_row(blocks, rows);
    }
}

/// AVX-512 dequantization of the two most used types: a block is two vectors of 16 f32.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{GgmlType, QK};
    use crate::simd::avx2::f16_at;
    use std::arch::x86_64::*;

    /// Dequantizes consecutive Q4_0 or Q8_0 blocks into `out` (32 values per block).
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
    pub unsafe fn dequantize(ty: GgmlType, blocks: &[u8], out: &mut [f32]) {
        let bb = ty.block_bytes();
        assert!(blocks.len() / bb * QK == out.len());
        let nibble = _mm512_set1_epi32(0x0F);
        for (b, block) in blocks.chunks_exact(bb).enumerate() {
            let (p, o) = (block.as_ptr(), out.as_mut_ptr().add(b * QK));
            let d = f16_at(p);
            let dv = _mm512_set1_ps(d);
            if ty == GgmlType::Q8_0 {
                for k in 0..2 {
                    let bytes = _mm_loadu_si128(p.add(2 + 16 * k) as *const __m128i);
                    let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
                    _mm512_storeu_ps(o.add(16 * k), _mm512_mul_ps(dv, x));
                }
            } else {
                // Element j < 16 is the low nibble of byte j, j ≥ 16 the high one; d·(n − 8).
                let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(2) as *const __m128i));
                let low = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, nibble));
                let high = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
                let shift = _mm512_set1_ps(-8.0 * d);
                _mm512_storeu_ps(o, _mm512_fmadd_ps(dv, low, shift));
                _mm512_storeu_ps(o.add(16), _mm512_fmadd_ps(dv, high, shift));
            }
        }
    }
}

/// AVX2 block kernels: a block's 32 levels are unpacked to four vectors of 8 f32.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{GgmlType, IQ4_NL_VALUES, QK};
    use crate::simd::avx2::{f16_at, hsum, Lut};
    use std::arch::x86_64::*;

    /// The levels of elements `8k..8k+8` of `block`, for `k` = 0..4 (`d·level + m` is the value).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn levels(ty: GgmlType, block: *const u8, lut: Lut) -> [__m256; 4] {
        let mut x = [_mm256_setzero_ps(); 4];
        if ty == GgmlType::Q8_0 {
            for (k, x) in x.iter_mut().enumerate() {
                let bytes = _mm_loadl_epi64(block.add(2 + 8 * k) as *const __m128i);
                *x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
            }
            return x;
        }
        let qs = block.add(ty.block_bytes() - QK / 2);
        let low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qs as *const __m128i));
        let high = _mm256_cvtepu8_epi32(_mm_loadl_epi64(qs.add(8) as *const __m128i));
        let nibble = _mm256_set1_epi32(0x0F);
        // Element j < 16 is the low nibble of qs[j], element j ≥ 16 the high nibble of qs[j−16].
        let mut n = [
            _mm256_and_si256(low, nibble),
            _mm256_and_si256(high, nibble),
            _mm256_srli_epi32(low, 4),
            _mm256_srli_epi32(high, 4),
        ];
        if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
            let qh = std::ptr::read_unaligned(qs.sub(4) as *const u32);
            let shifts = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            for (k, n) in n.iter_mut().enumerate() {
                let bits = _mm256_set1_epi32((qh >> (8 * k)) as i32);
                let bit = _mm256_and_si256(_mm256_srlv_epi32(bits, shifts), _mm256_set1_epi32(1));
                *n = _mm256_or_si256(*n, _mm256_slli_epi32(bit, 4));
            }
        }
        let zero = _mm256_set1_epi32(match ty {
            GgmlType::Q4_0 => 8,
            GgmlType::Q5_0 => 16,
            _ => 0,
        });
        for (x, n) in x.iter_mut().zip(n) {
            *x = if ty == GgmlType::Iq4Nl {
                lut.get(n)
            } else {
                _mm256_cvtepi32_ps(_mm256_sub_epi32(n, zero))
            };
        }
        x
    }

    /// [`IQ4_NL_VALUES`] as f32.
    const IQ4_NL_LEVELS: [f32; 16] = {
        let mut levels = [0.0f32; 16];
        let mut i = 0;
        while i < 16 {
            levels[i] = IQ4_NL_VALUES[i] as f32;
            i += 1;
        }
        levels
    };

    /// `q·k` of one row (`q.len()/32` blocks); `block_sums` holds each 32-block's `Σq` for
    /// types with a minimum.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn score_row(ty: GgmlType, q: &[f32], block_sums: &[f32], row: &[u8]) -> f32 {
        let lut = Lut::new(&IQ4_NL_LEVELS);
        let bb = ty.block_bytes();
        assert!(row.len() >= q.len() / QK * bb);
        let mut total = _mm256_setzero_ps();
        let mut bias = 0.0f32;
        for (b, qb) in q.chunks_exact(QK).enumerate() {
            let block = row.as_ptr().add(b * bb);
            let x = levels(ty, block, lut);
            let qb = qb.as_ptr();
            let mut dot = _mm256_mul_ps(_mm256_loadu_ps(qb), x[0]);
            let mut dot2 = _mm256_mul_ps(_mm256_loadu_ps(qb.add(8)), x[1]);
            dot = _mm256_fmadd_ps(_mm256_loadu_ps(qb.add(16)), x[2], dot);
            dot2 = _mm256_fmadd_ps(_mm256_loadu_ps(qb.add(24)), x[3], dot2);
            total = _mm256_fmadd_ps(
                _mm256_set1_ps(f16_at(block)),
                _mm256_add_ps(dot, dot2),
                total,
            );
            if ty.has_min() {
                bias += f16_at(block.add(2)) * block_sums[b];
            }
        }
        hsum(total) + bias
    }

    /// Dequantizes consecutive blocks: `out[32b..32b+32] = d_b·level + m_b`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dequantize(ty: GgmlType, blocks: &[u8], out: &mut [f32]) {
        let lut = Lut::new(&IQ4_NL_LEVELS);
        for (block, out) in blocks
            .chunks_exact(ty.block_bytes())
            .zip(out.chunks_exact_mut(QK))
        {
            let x = levels(ty, block.as_ptr(), lut);
            let d = _mm256_set1_ps(f16_at(block.as_ptr()));
            let m = _mm256_set1_ps(if ty.has_min() {
                f16_at(block.as_ptr().add(2))
            } else {
                0.0
            });
            for (k, x) in x.into_iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), _mm256_fmadd_ps(d, x, m));
            }
        }
    }

    /// `acc += w·x̂` for one row of `acc.len()/32` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn accumulate_row(ty: GgmlType, w: f32, row: &[u8], acc: &mut [f32]) {
        let lut = Lut::new(&IQ4_NL_LEVELS);
        let bb = ty.block_bytes();
        assert!(row.len() >= acc.len() / QK * bb);
        for b in 0..acc.len() / QK {
            let block = row.as_ptr().add(b * bb);
            let x = levels(ty, block, lut);
            let wd = _mm256_set1_ps(w * f16_at(block));
            let wm = _mm256_set1_ps(if ty.has_min() {
                w * f16_at(block.add(2))
            } else {
                0.0
            });
            let out = acc.as_mut_ptr().add(b * QK);
            for (k, x) in x.into_iter().enumerate() {
                let a = out.add(8 * k);
                _mm256_storeu_ps(
                    a,
                    _mm256_fmadd_ps(wd, x, _mm256_add_ps(_mm256_loadu_ps(a), wm)),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; ty.block_bytes()];
        ty.quantize_block(x, &mut out);
        out
    }

    /// Packs 32 nibbles as llama.cpp does: `qs[j] = n_j | n_{j+16} << 4`.
    fn nibbles(n: &[u8]) -> Vec<u8> {
        (0..16)
            .map(|j| (n[j] & 15) | (n[j + 16] & 15) << 4)
            .collect()
    }

    #[test]
    fn bits_per_element() {
        use GgmlType::*;
        for (ty, bits) in [
            (Q8_0, 8.5),
            (Q4_0, 4.5),
            (Q4_1, 5.0),
            (Q5_0, 5.5),
            (Q5_1, 6.0),
            (Iq4Nl, 4.5),
        ] {
            for d in [64, 128, 256] {
                assert_eq!(GgmlCodec::new(ty, d).unwrap().bits_per_element(), bits);
            }
        }
        assert!(GgmlCodec::new(Q4_0, 48).is_err());
    }

    #[test]
    fn q8_0_block_bytes() {
        // amax 127 → d = 1 (f16 0x3C00); codes round half away from zero: 2.5 → 3, −2.5 → −3.
        let mut x = [0.0f32; 32];
        x[0] = -127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 1.49;
        x[31] = 100.0;
        let mut expected = vec![0x00, 0x3C];
        let mut qs = [0i8; 32];
        qs[0] = -127;
        qs[1] = 3;
        qs[2] = -3;
        qs[3] = 1;
        qs[31] = 100;
        expected.extend(qs.iter().map(|&q| q as u8));
        assert_eq!(quantize(GgmlType::Q8_0, &x), expected);
        // All zeros: d = 0 and zero codes.
        assert_eq!(quantize(GgmlType::Q8_0, &[0.0; 32]), vec![0u8; 34]);
    }

    #[test]
    fn q4_0_block_bytes() {
        // Signed max −8 (first of the two largest magnitudes) → d = 1; n = min(15, ⌊x + 8.5⌋).
        let x: Vec<f32> = [-8.0, 8.0, 0.5, -0.5, 3.4, -3.6, 7.0, 6.5]
            .into_iter()
            .chain(std::iter::repeat(0.0))
            .take(32)
            .collect();
        let mut n = [8u8; 32]; // zeros → ⌊8.5⌋ = 8
        n[..8].copy_from_slice(&[0, 15, 9, 8, 11, 4, 15, 15]);
        let mut expected = vec![0x00, 0x3C];
        expected.extend(nibbles(&n));
        assert_eq!(quantize(GgmlType::Q4_0, &x), expected);
        // Positive largest magnitude flips the scale's sign: max 16 → d = −2 (f16 0xC000).
        let mut y = [0.0f32; 32];
        y[5] = 16.0;
        y[6] = -3.0; // −3·(−1/2) + 8.5 = 10
        let mut n = [8u8; 32];
        n[5] = 0;
        n[6] = 10;
        let mut expected = vec![0x00, 0xC0];
        expected.extend(nibbles(&n));
        assert_eq!(quantize(GgmlType::Q4_0, &y), expected);
    }

    #[test]
    fn q4_1_block_bytes() {
        // min −1 (f16 0xBC00), max 14 → d = 1; n = min(15, ⌊x + 1 + 0.5⌋).
        let mut x = [0.0f32; 32];
        x[0] = -1.0;
        x[1] = 14.0;
        x[17] = 2.5;
        x[18] = 2.49;
        let mut n = [1u8; 32];
        n[0] = 0;
        n[1] = 15;
        n[17] = 4;
        n[18] = 3;
        let mut expected = vec![0x00, 0x3C, 0x00, 0xBC];
        expected.extend(nibbles(&n));
        assert_eq!(quantize(GgmlType::Q4_1, &x), expected);
    }

    #[test]
    fn q5_0_block_bytes() {
        // Signed max −16 → d = 1; n = min(31, ⌊x + 16.5⌋); high bits go to qh.
        let mut x = [0.0f32; 32];
        x[0] = -16.0;
        x[1] = 15.0;
        x[2] = 16.0; // 32.5 → clamped to 31
        x[20] = -0.6; // 15.9 → 15 (high bit 0)
        x[21] = 0.4; // 16.9 → 16 (high bit 1)
        let mut n = [16u8; 32];
        n[0] = 0;
        n[1] = 31;
        n[2] = 31;
        n[20] = 15;
        n[21] = 16;
        let qh: u32 = (0..32).filter(|&j| n[j] >= 16).map(|j| 1u32 << j).sum();
        assert_eq!(qh, 0xFFEF_FFFE);
        let mut expected = vec![0x00, 0x3C];
        expected.extend(qh.to_le_bytes());
        expected.extend(nibbles(&n));
        assert_eq!(quantize(GgmlType::Q5_0, &x), expected);
    }

    #[test]
    fn q5_1_block_bytes() {
        // min 0, max 31 → d = 1, m = 0; n = ⌊x + 0.5⌋.
        let x: Vec<f32> = (0..32)
            .map(|j| j as f32 + if j == 7 { 0.5 } else { 0.0 })
            .collect();
        let mut n: Vec<u8> = (0..32).collect();
        n[7] = 8;
        let qh: u32 = 0xFFFF_0000;
        let mut expected = vec![0x00, 0x3C, 0x00, 0x00];
        expected.extend(qh.to_le_bytes());
        expected.extend(nibbles(&n));
        assert_eq!(quantize(GgmlType::Q5_1, &x), expected);
    }

    #[test]
    fn iq4_nl_block_bytes() {
        // Values exactly on the grid with d = 1: candidate t = 0 (id = −127/max = 1) fits
        // perfectly, so the search must return d = 1 and the grid's own indices.
        let x: Vec<f32> = (0..32).map(|j| f32::from(IQ4_NL_VALUES[j % 16])).collect();
        let mut expected = vec![0x00, 0x3C];
        expected.extend((0..16u8).map(|j| j | j << 4));
        assert_eq!(quantize(GgmlType::Iq4Nl, &x), expected);
        // Zero block: d = 0 and every element takes the level nearest 0 (index 8, value 1).
        let mut expected = vec![0x00, 0x00];
        expected.extend([0x88; 16]);
        assert_eq!(quantize(GgmlType::Iq4Nl, &[0.0; 32]), expected);
    }

    #[test]
    fn iq4_nl_index_is_nearest_level() {
        for i in -1300..1300 {
            let x = i as f32 / 10.0;
            let got = f32::from(IQ4_NL_VALUES[usize::from(iq4_nl_index(x))]);
            let best = IQ4_NL_VALUES
                .iter()
                .map(|&v| (f32::from(v) - x).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((got - x).abs(), best, "{x}");
        }
    }

    #[test]
    fn dequantize_matches_layout_table() {
        // q5_1 block by hand: d = 0.5, m = −2, element 0 has n = 3 + 16 (qh bit 0), element 16
        // has n = 4 (high nibble of qs[0]).
        let mut block = vec![0u8; 24];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(-2.0).to_le_bytes());
        block[4] = 0x01;
        block[8] = 0x43;
        let mut x = [0.0f32; 32];
        GgmlType::Q5_1.dequantize_block(&block, &mut x);
        assert_eq!(
            (x[0], x[16], x[1]),
            (0.5 * 19.0 - 2.0, 0.5 * 4.0 - 2.0, -2.0)
        );
        // q4_0: n = 0 → −8·d.
        let mut block = vec![0u8; 18];
        block[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        block[2] = 0xF0;
        GgmlType::Q4_0.dequantize_block(&block, &mut x);
        assert_eq!((x[0], x[16], x[1]), (-2.0, 7.0 * 0.25, -2.0));
    }

    #[test]
    fn quantization_error_is_bounded() {
        let x: Vec<f32> = (0..32)
            .map(|j| ((j * 37 % 32) as f32 - 15.3) * 0.7)
            .collect();
        use GgmlType::*;
        for (ty, steps) in [
            (Q8_0, 127.0),
            (Q4_0, 8.0),
            (Q4_1, 15.0),
            (Q5_0, 16.0),
            (Q5_1, 31.0),
        ] {
            let block = quantize(ty, &x);
            let mut y = [0.0f32; 32];
            ty.dequantize_block(&block, &mut y);
            let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let step = if ty.has_min() {
                2.0 * amax / steps
            } else {
                amax / steps
            };
            // q4_0 and q5_0 have one level fewer on the side opposite the largest magnitude,
            // so values there may be clipped by up to one step.
            let bound = if matches!(ty, Q4_0 | Q5_0) { 1.0 } else { 0.5 };
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= step * bound * 1.002, "{ty:?}: {a} {b}");
            }
        }
    }
}
