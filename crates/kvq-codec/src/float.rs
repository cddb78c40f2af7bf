//! The unquantized baselines: `f32`, `f16` and `bf16`, one row per block, little-endian.

use crate::simd::{self, RowFormat};
use crate::{check_finite, Codec, CodecError};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Storage format of a [`FloatCodec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatFormat {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float (round to nearest even; out-of-range values become ±inf and are
    /// rejected, since they cannot be represented).
    F16,
    /// bfloat16 (round to nearest even).
    Bf16,
}

impl FloatFormat {
    fn row_format(self) -> RowFormat {
        match self {
            Self::F32 => RowFormat::F32,
            Self::F16 => RowFormat::F16,
            Self::Bf16 => RowFormat::Bf16,
        }
    }
}

/// Rows stored as plain floats.
pub struct FloatCodec {
    format: FloatFormat,
    head_dim: usize,
}

impl FloatCodec {
    /// A float codec for rows of `head_dim` elements.
    pub fn new(format: FloatFormat, head_dim: usize) -> Self {
        Self { format, head_dim }
    }
}

impl Codec for FloatCodec {
    fn name(&self) -> String {
        match self.format {
            FloatFormat::F32 => "f32",
            FloatFormat::F16 => "f16",
            FloatFormat::Bf16 => "bf16",
        }
        .into()
    }
    fn head_dim(&self) -> usize {
        self.head_dim
    }
    fn block_tokens(&self) -> usize {
        1
    }
    fn block_bytes(&self) -> usize {
        self.format.row_format().row_bytes(self.head_dim)
    }
    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        check_finite(rows, self.head_dim)?;
        match self.format {
            FloatFormat::F32 => {
                for (o, x) in out.chunks_exact_mut(4).zip(rows) {
                    o.copy_from_slice(&x.to_le_bytes());
                }
            }
            FloatFormat::F16 => {
                // A chunk at a time through `half`'s slice conversion (F16C where the CPU has
                // it): a call per value was 2.3% of a 512-token prefill's samples.
                const CHUNK: usize = 64;
                let mut halves = [f16::ZERO; CHUNK];
                for (c, chunk) in rows.chunks(CHUNK).enumerate() {
                    let halves = &mut halves[..chunk.len()];
                    halves.convert_from_f32_slice(chunk);
                    if let Some(j) = halves.iter().position(|h| h.is_infinite()) {
                        return Err(CodecError::NonFinite {
                            row: 0,
                            channel: CHUNK * c + j,
                            value: chunk[j],
                        });
                    }
                    for (o, h) in out[2 * CHUNK * c..].chunks_exact_mut(2).zip(halves.iter()) {
                        o.copy_from_slice(&h.to_le_bytes());
                    }
                }
            }
            FloatFormat::Bf16 => {
                for (o, x) in out.chunks_exact_mut(2).zip(rows) {
                    o.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
                }
            }
        }
        Ok(())
    }
    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        rows.fill(0.0);
        simd::axpy(self.format.row_format(), 1.0, block, rows);
    }
    fn score(&self, query: &[f32], blocks: &[u8], scores: &mut [f32]) {
        simd::dot_rows(self.format.row_format(), query, blocks, scores);
    }
    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]) {
        simd::axpy_rows(self.format.row_format(), weights, blocks, acc);
    }
    fn row_format(&self) -> Option<RowFormat> {
        Some(self.format.row_format())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunked conversion stores what `f16::from_f32` gives value by value (normals,
    /// subnormals, values that round up to 65504 or under), and names the first value past
    /// f16's range, in any chunk.
    #[test]
    fn f16_rows_match_the_scalar_conversion_and_overflow_is_named() {
        let d = 200;
        let codec = FloatCodec::new(FloatFormat::F16, d);
        let rows: Vec<f32> = (0..d)
            .map(|i| match i % 5 {
                0 => (i as f32 * 0.37).sin() * 3.0,
                1 => 1e-6 * i as f32,
                2 => 65_519.0 - i as f32,
                3 => -1e-8,
                _ => 1.0 / (1 + i) as f32,
            })
            .collect();
        let mut out = vec![0u8; codec.block_bytes()];
        codec.encode(&rows, &mut out).unwrap();
        for (i, x) in rows.iter().enumerate() {
            assert_eq!(
                out[2 * i..2 * i + 2],
                f16::from_f32(*x).to_le_bytes(),
                "{i}: {x}"
            );
        }
        let mut big = rows.clone();
        big[130] = 70_000.0;
        big[190] = -1e9;
        match codec.encode(&big, &mut out) {
            Err(CodecError::NonFinite { channel, value, .. }) => {
                assert_eq!((channel, value), (130, 70_000.0));
            }
            other => panic!("{other:?}"),
        }
    }
}
