//! FP8 rows: `fp8` (= `fp8-e4m3`, the OCP "FN" variant: bias 7, 3 mantissa bits, max 448, no
//! infinities, NaN = `S.1111.111`) and `fp8-e5m2` (bias 15, 2 mantissa bits, max 57344, IEEE-like
//! infinities and NaNs).
//!
//! Conversion from f32 rounds to nearest, ties to even, and saturates to `±max`: the encoder never
//! produces a NaN or infinity code. A stored element is `x̂ = scale · fp8(code)`.
//!
//! Block = one row. Two layouts, chosen by whether a calibrated scale is given:
//!
//! * **calibrated** (`Some(scale)`, real value per FP8 unit, from a profile): `head_dim` code
//!   bytes. Bits per element: exactly 8.0. Values beyond `scale·max` saturate.
//! * **per-row scale** (`None`): an f16 little-endian scale `amax/max` (rounded up, so nothing
//!   saturates) followed by `head_dim` code bytes. Bits per element: `(8·d + 16)/d`, 8.125 at
//!   d = 128 and 8.0625 at d = 256. A row whose scale exceeds the f16 range is rejected with
//!   [`CodecError::NonFinite`].

use crate::uniform::{f16_at_least, out_of_f16_range, read_f16};
use crate::{check_finite, Codec, CodecError};

/// An FP8 encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Format {
    /// E4M3 "FN": 4 exponent bits, 3 mantissa bits, max 448, no infinities.
    E4M3,
    /// E5M2: 5 exponent bits, 2 mantissa bits, max 57344.
    E5M2,
}

impl Fp8Format {
    /// Mantissa bits.
    fn mantissa_bits(self) -> u32 {
        match self {
            Self::E4M3 => 3,
            Self::E5M2 => 2,
        }
    }

    /// Exponent of the smallest normal number (`1 − bias`).
    fn min_exponent(self) -> i32 {
        match self {
            Self::E4M3 => -6,
            Self::E5M2 => -14,
        }
    }

    /// The (positive) code of the largest finite value.
    fn max_code(self) -> u8 {
        match self {
            Self::E4M3 => 0x7E,
            Self::E5M2 => 0x7B,
        }
    }

    /// The largest finite value.
    pub fn max(self) -> f32 {
        self.decode(self.max_code())
    }

    /// The code of `x`: round to nearest even, saturating to `±max` (NaN saturates too; callers
    /// reject it before).
    pub fn encode(self, x: f32) -> u8 {
        let m = self.mantissa_bits() as i32;
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs();
        // Exponent of `a`'s leading bit, raised to the subnormal exponent below the normal range.
        let exponent = ((a.to_bits() >> 23) as i32 - 127).max(self.min_exponent());
        // `a` in units of the quantum 2^(exponent − m) (an exact power-of-two scaling), rounded.
        let units = (a * pow2(m - exponent)).round_ties_even();
        // Code = (exponent − emin)·2^m + units covers subnormals, normals and the carry of a
        // rounding into the next binade alike.
        let code = (((exponent - self.min_exponent()) as u32) << m) as f32 + units;
        sign | code.min(f32::from(self.max_code())) as u8
    }

    /// The value of `code` (NaN or ±inf for the codes that hold them).
    pub fn decode(self, code: u8) -> f32 {
        let m = self.mantissa_bits();
        let field = i32::from((code & 0x7F) >> m);
        let mantissa = i32::from(code) & ((1 << m) - 1);
        let magnitude = match (self, field, mantissa) {
            (Self::E4M3, 15, 7) => f32::NAN,
            (Self::E5M2, 31, 0) => f32::INFINITY,
            (Self::E5M2, 31, _) => f32::NAN,
            (_, 0, _) => mantissa as f32 * pow2(self.min_exponent() - m as i32),
            _ => ((1 << m) + mantissa) as f32 * pow2(field + self.min_exponent() - 1 - m as i32),
        };
        if code & 0x80 != 0 {
            -magnitude
        } else {
            magnitude
        }
    }
}

/// `2^k` for `k` in f32's normal exponent range.
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// FP8 rows with a calibrated or a per-row scale (see the module documentation).
#[derive(Clone, Debug)]
pub struct Fp8Codec {
    format: Fp8Format,
    head_dim: usize,
    calibrated_scale: Option<f32>,
    values: [f32; 256],
}

impl Fp8Codec {
    /// An FP8 codec; `calibrated_scale` (real value per FP8 unit) must be finite and positive.
    pub fn new(
        format: Fp8Format,
        head_dim: usize,
        calibrated_scale: Option<f32>,
    ) -> Result<Self, CodecError> {
        if let Some(s) = calibrated_scale {
            if !(s.is_finite() && s > 0.0) {
                return Err(CodecError::InvalidCalibration {
                    scheme: Self::name_of(format).into(),
                    why: format!("FP8 scale must be finite and positive, got {s}"),
                });
            }
        }
        Ok(Self {
            format,
            head_dim,
            calibrated_scale,
            values: std::array::from_fn(|c| format.decode(c as u8)),
        })
    }

    fn name_of(format: Fp8Format) -> &'static str {
        match format {
            Fp8Format::E4M3 => "fp8",
            Fp8Format::E5M2 => "fp8-e5m2",
        }
    }

    /// Bytes before the codes of a row (the per-row f16 scale, if any).
    fn header_bytes(&self) -> usize {
        if self.calibrated_scale.is_some() {
            0
        } else {
            2
        }
    }

    /// The scale of an encoded row and its codes.
    #[inline]
    fn split<'a>(&self, row: &'a [u8]) -> (f32, &'a [u8]) {
        match self.calibrated_scale {
            Some(s) => (s, row),
            None => (read_f16(row, 0), &row[2..]),
        }
    }
}

impl Codec for Fp8Codec {
    fn name(&self) -> String {
        Self::name_of(self.format).into()
    }
    fn head_dim(&self) -> usize {
        self.head_dim
    }
    fn block_tokens(&self) -> usize {
        1
    }
    fn block_bytes(&self) -> usize {
        self.header_bytes() + self.head_dim
    }

    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        check_finite(rows, self.head_dim)?;
        let scale = match self.calibrated_scale {
            Some(s) => s,
            None => {
                let amax = rows.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let scale = f16_at_least(f64::from(amax) / f64::from(self.format.max()));
                if !scale.is_finite() {
                    return Err(out_of_f16_range(rows, self.head_dim));
                }
                out[..2].copy_from_slice(&scale.to_le_bytes());
                scale.to_f32()
            }
        };
        let codes = &mut out[self.header_bytes()..];
        for (code, &x) in codes.iter_mut().zip(rows) {
            *code = if scale == 0.0 {
                0
            } else {
                self.format.encode(x / scale)
            };
        }
        Ok(())
    }

    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        let (scale, codes) = self.split(block);
        for (x, &code) in rows.iter_mut().zip(codes) {
            *x = scale * self.values[usize::from(code)];
        }
    }

    /// Rows convert eight codes at a time through their f16 bit patterns.
    fn decode_working(&self, blocks: &[u8], rows: &mut [f32]) {
        let vector = crate::simd::use_avx2() && self.head_dim.is_multiple_of(8);
        for (row, out) in blocks
            .chunks_exact(self.block_bytes())
            .zip(rows.chunks_exact_mut(self.head_dim))
        {
            #[cfg(target_arch = "x86_64")]
            if vector {
                let (scale, codes) = self.split(row);
                // SAFETY: the CPU supports AVX2/F16C; `codes` and `out` hold `head_dim` values.
                unsafe { avx2::decode(self.format, scale, codes, out) };
                continue;
            }
            self.decode(row, out);
        }
    }

    /// Rows with their own scale go straight to the float kernels, converted in registers.
    fn row_format(&self) -> Option<crate::simd::RowFormat> {
        let e5m2 = self.format == Fp8Format::E5M2;
        self.calibrated_scale
            .is_none()
            .then_some(crate::simd::RowFormat::Fp8 { e5m2 })
    }

    fn score(&self, query: &[f32], blocks: &[u8], scores: &mut [f32]) {
        let vector = crate::simd::use_avx2() && query.len().is_multiple_of(8);
        for (row, score) in blocks.chunks_exact(self.block_bytes()).zip(scores) {
            let (scale, codes) = self.split(row);
            #[cfg(target_arch = "x86_64")]
            if vector {
                // SAFETY: the CPU supports AVX2/FMA; `codes` holds `query.len()` bytes.
                *score = scale * unsafe { avx2::dot(&self.values, query, codes) };
                continue;
            }
            let dot: f32 = query
                .iter()
                .zip(codes)
                .map(|(q, &code)| q * self.values[usize::from(code)])
                .sum();
            *score = scale * dot;
        }
    }

    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]) {
        let vector = crate::simd::use_avx2() && self.head_dim.is_multiple_of(8);
        for (row, &w) in blocks.chunks_exact(self.block_bytes()).zip(weights) {
            let (scale, codes) = self.split(row);
            let ws = w * scale;
            #[cfg(target_arch = "x86_64")]
            if vector {
                // SAFETY: as in `score`.
                unsafe { avx2::axpy(&self.values, ws, codes, &mut acc[..self.head_dim]) };
                continue;
            }
            for (a, &code) in acc.iter_mut().zip(codes) {
                *a += ws * self.values[usize::from(code)];
            }
        }
    }
}

/// AVX2 kernels: each code byte is looked up in the 256-entry value table by a gather, or, to
/// decode rows, converted through the f16 with the same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Fp8Format;
    use crate::simd::avx2::{fp8_as_f16, hsum};
    use std::arch::x86_64::*;

    /// `out[i] = scale·fp8(codes[i])` (`out.len()` a multiple of 8). E5M2 is the upper byte of an
    /// f16; E4M3 is an f16 with the exponent field's top bit clear, times 2⁸ (the bias
    /// difference), except its NaN code.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode(format: Fp8Format, scale: f32, codes: &[u8], out: &mut [f32]) {
        assert!(codes.len() >= out.len() && out.len().is_multiple_of(8));
        let (e5m2, nan) = (format == Fp8Format::E5M2, _mm256_set1_ps(f32::NAN));
        for i in (0..out.len()).step_by(8) {
            let c = _mm_cvtepu8_epi16(_mm_loadl_epi64(codes.as_ptr().add(i) as *const __m128i));
            let (bits, factor, is_nan) = fp8_as_f16(c, e5m2);
            let x = _mm256_mul_ps(_mm256_cvtph_ps(bits), _mm256_set1_ps(factor * scale));
            let is_nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(is_nan));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_blendv_ps(x, nan, is_nan));
        }
    }

    /// The values of the 8 codes at `codes`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values8(values: &[f32; 256], codes: *const u8) -> __m256 {
        let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes as *const __m128i));
        _mm256_i32gather_ps::<4>(values.as_ptr(), idx)
    }

    /// `Σ q[i]·values[codes[i]]` (`q.len()` a multiple of 8, `codes` at least as long).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(values: &[f32; 256], q: &[f32], codes: &[u8]) -> f32 {
        assert!(codes.len() >= q.len());
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..q.len()).step_by(8) {
            let x = values8(values, codes.as_ptr().add(i));
            let sum = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), x, acc0);
            acc0 = acc1;
            acc1 = sum;
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    /// `acc[i] += w·values[codes[i]]` (`acc.len()` a multiple of 8, `codes` at least as long).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy(values: &[f32; 256], w: f32, codes: &[u8], acc: &mut [f32]) {
        assert!(codes.len() >= acc.len());
        let wv = _mm256_set1_ps(w);
        for i in (0..acc.len()).step_by(8) {
            let a = acc.as_mut_ptr().add(i);
            let x = values8(values, codes.as_ptr().add(i));
            _mm256_storeu_ps(a, _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(a)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMATS: [Fp8Format; 2] = [Fp8Format::E4M3, Fp8Format::E5M2];

    /// The vector row decoder gives the table's value for every one of the 256 codes.
    #[test]
    fn row_decoder_equals_the_table_for_every_code() {
        for format in FORMATS {
            let codec = Fp8Codec::new(format, 256, Some(0.5)).unwrap();
            let codes: Vec<u8> = (0..=255u8).collect();
            let (mut vector, mut table) = (vec![0f32; 256], vec![0f32; 256]);
            codec.decode_working(&codes, &mut vector);
            codec.decode(&codes, &mut table);
            for (code, (v, t)) in vector.iter().zip(&table).enumerate() {
                assert!(
                    v == t || (v.is_nan() && t.is_nan()),
                    "{format:?} code {code:#x}: {v} vs {t}"
                );
            }
        }
    }

    #[test]
    fn every_finite_code_round_trips() {
        for f in FORMATS {
            for code in 0..=255u8 {
                let v = f.decode(code);
                if v.is_finite() {
                    assert_eq!(f.encode(v), code, "{f:?} {code:#04x} = {v}");
                }
            }
        }
        // Exactly the documented special codes are non-finite.
        let specials = |f: Fp8Format| (0..=255u8).filter(move |&c| !f.decode(c).is_finite());
        assert_eq!(specials(Fp8Format::E4M3).collect::<Vec<_>>(), [0x7F, 0xFF]);
        assert_eq!(specials(Fp8Format::E5M2).count(), 8);
    }

    #[test]
    fn known_values() {
        let e4 = Fp8Format::E4M3;
        assert_eq!(e4.max(), 448.0);
        assert_eq!(e4.decode(0x38), 1.0);
        assert_eq!(e4.decode(0x01), 2f32.powi(-9));
        assert_eq!(e4.decode(0x08), 2f32.powi(-6));
        assert_eq!(e4.decode(0xC0), -2.0);
        let e5 = Fp8Format::E5M2;
        assert_eq!(e5.max(), 57344.0);
        assert_eq!(e5.decode(0x3C), 1.0);
        assert_eq!(e5.decode(0x01), 2f32.powi(-16));
        assert_eq!(e5.decode(0x7C), f32::INFINITY);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let e4 = Fp8Format::E4M3;
        assert_eq!(e4.encode(448.0), 0x7E);
        assert_eq!(e4.encode(464.0), 0x7E); // tie between 448 and (absent) 480
        assert_eq!(e4.encode(1e30), 0x7E);
        assert_eq!(e4.encode(-1e30), 0xFE);
        assert_eq!(e4.encode(f32::MAX), 0x7E);
        let e5 = Fp8Format::E5M2;
        assert_eq!(e5.encode(61440.0), 0x7B);
        assert_eq!(e5.encode(1e9), 0x7B);
        assert_eq!(e5.encode(-65536.0), 0xFB);
    }

    #[test]
    fn rounds_ties_to_even() {
        let e4 = Fp8Format::E4M3;
        assert_eq!(e4.encode(1.0 + 1.0 / 16.0), 0x38); // 1 | 1.125 → even mantissa 0
        assert_eq!(e4.encode(1.0 + 3.0 / 16.0), 0x3A); // 1.125 | 1.25 → mantissa 2
        assert_eq!(e4.encode(1.0 + 1.0 / 16.0 + 1e-6), 0x39); // just above the tie
        assert_eq!(e4.encode(2f32.powi(-10)), 0x00); // 0 | 2^-9 → 0
        assert_eq!(e4.encode(3.0 * 2f32.powi(-10)), 0x02); // 2^-9 | 2^-8 → 2^-8
        assert_eq!(e4.encode(-3.0 * 2f32.powi(-10)), 0x82);
        // 1.875·2^-7 lies between the largest subnormal 7·2^-9 and the smallest normal 2^-6.
        assert_eq!(e4.encode(7.5 * 2f32.powi(-9)), 0x08);
        assert_eq!(e4.encode(15.5), 0x58); // 15 | 16 → 16 (carry into the next binade)
        let e5 = Fp8Format::E5M2;
        assert_eq!(e5.encode(1.125), 0x3C); // 1 | 1.25 → 1
        assert_eq!(e5.encode(1.375), 0x3E); // 1.25 | 1.5 → 1.5
        assert_eq!(e5.encode(1e-30), 0x00);
    }

    #[test]
    fn layouts_and_bits() {
        let per_row = Fp8Codec::new(Fp8Format::E4M3, 128, None).unwrap();
        assert_eq!(per_row.bits_per_element(), 8.125);
        let calibrated = Fp8Codec::new(Fp8Format::E5M2, 256, Some(0.5)).unwrap();
        assert_eq!(calibrated.bits_per_element(), 8.0);
        assert!(Fp8Codec::new(Fp8Format::E4M3, 128, Some(0.0)).is_err());

        // Per-row: amax 896 → scale 2.0 (f16 0x4000); 896/2 = 448 → 0x7E, -1/2 → 0xB0.
        let c = Fp8Codec::new(Fp8Format::E4M3, 8, None).unwrap();
        let row = [896.0, -1.0, 0.0, 2.0, 4.0, 8.0, 16.0, 32.0];
        let mut block = vec![0u8; c.block_bytes()];
        c.encode(&row, &mut block).unwrap();
        assert_eq!(
            block,
            [0x00, 0x40, 0x7E, 0xB0, 0x00, 0x38, 0x40, 0x48, 0x50, 0x58]
        );
        // Calibrated scale 2: 1000/2 saturates to 448·2.
        let c = Fp8Codec::new(Fp8Format::E4M3, 8, Some(2.0)).unwrap();
        let mut block = vec![0u8; c.block_bytes()];
        c.encode(&[1000.0, -1.0, 0.0, 2.0, 4.0, 8.0, 16.0, 32.0], &mut block)
            .unwrap();
        assert_eq!(block, [0x7E, 0xB0, 0x00, 0x38, 0x40, 0x48, 0x50, 0x58]);
        let mut back = [0.0; 8];
        c.decode(&block, &mut back);
        assert_eq!(back, [896.0, -1.0, 0.0, 2.0, 4.0, 8.0, 16.0, 32.0]);
    }
}
