//! The unquantized baselines: `f32`, `f16` and `bf16`, one row per block, little-endian.

use crate::simd::{self, RowFormat};
use crate::{check_finite, Codec, CodecError};
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
        for (i, &x) in rows.iter().enumerate() {
            match self.format {
                FloatFormat::F32 => out[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes()),
                FloatFormat::F16 => {
                    let h = f16::from_f32(x);
                    if h.is_infinite() {
                        return Err(CodecError::NonFinite {
                            row: 0,
                            channel: i,
                            value: x,
                        });
                    }
                    out[2 * i..2 * i + 2].copy_from_slice(&h.to_le_bytes())
                }
                FloatFormat::Bf16 => {
                    out[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f32(x).to_le_bytes())
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
