//! Weight formats of GGUF files: dequantization of every supported type, and the quantized
//! activations ([`QActivations`]) that the integer dot products of [`crate::matmul`] consume.
//!
//! The 32-element llama.cpp blocks (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`) are decoded by
//! `kvq_codec::ggml`, the same code that stores KV blocks in those layouts; the k-quants
//! (`Q4_K`, `Q5_K`, `Q6_K`, 256 elements per super-block) live here.

use crate::gguf::TensorType;
use half::{bf16, f16};
use kvq_codec::ggml::GgmlType;

#[inline]
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Scale and minimum `j` (0..8) of a Q4_K / Q5_K super-block's packed 6-bit table.
#[inline]
pub(crate) fn k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Step and minimum of sub-block `j` of a Q4_K / Q5_K super-block (value = step·q − minimum).
fn k_sub_block(d: f32, dmin: f32, scales: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = k_scale_min(scales, j);
    (d * f32::from(sc), dmin * f32::from(m))
}

/// Q4_K super-block: `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`.
fn dequantize_q4_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (scales, qs) = (&block[4..16], &block[16..144]);
    for chunk in 0..4 {
        let q = &qs[32 * chunk..32 * chunk + 32];
        let (d_lo, min_lo) = k_sub_block(d, dmin, scales, 2 * chunk);
        let (d_hi, min_hi) = k_sub_block(d, dmin, scales, 2 * chunk + 1);
        for l in 0..32 {
            out[64 * chunk + l] = d_lo * f32::from(q[l] & 0x0F) - min_lo;
            out[64 * chunk + 32 + l] = d_hi * f32::from(q[l] >> 4) - min_hi;
        }
    }
}

/// Q5_K super-block: `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`.
fn dequantize_q5_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (scales, qh, qs) = (&block[4..16], &block[16..48], &block[48..176]);
    for chunk in 0..4 {
        let q = &qs[32 * chunk..32 * chunk + 32];
        let (d_lo, min_lo) = k_sub_block(d, dmin, scales, 2 * chunk);
        let (d_hi, min_hi) = k_sub_block(d, dmin, scales, 2 * chunk + 1);
        let (bit_lo, bit_hi) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        for l in 0..32 {
            let hi_lo = if qh[l] & bit_lo != 0 { 16.0 } else { 0.0 };
            let hi_hi = if qh[l] & bit_hi != 0 { 16.0 } else { 0.0 };
            out[64 * chunk + l] = d_lo * (f32::from(q[l] & 0x0F) + hi_lo) - min_lo;
            out[64 * chunk + 32 + l] = d_hi * (f32::from(q[l] >> 4) + hi_hi) - min_hi;
        }
    }
}

/// The four 6-bit values of Q6_K element group `l` (0..32) of one 128-element half:
/// elements `l`, `l+32`, `l+64`, `l+96`, each in `0..64` (the stored value is `q − 32`).
#[inline]
pub(crate) fn q6_k_codes(ql: &[u8], qh: &[u8], l: usize) -> [u8; 4] {
    [
        (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
        (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
        (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
        (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
    ]
}

/// Q6_K super-block: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`.
fn dequantize_q6_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 208);
    for half in 0..2 {
        let ql = &block[64 * half..64 * half + 64];
        let qh = &block[128 + 32 * half..128 + 32 * half + 32];
        let sc = &block[192 + 8 * half..192 + 8 * half + 8];
        for l in 0..32 {
            let codes = q6_k_codes(ql, qh, l);
            for (g, &c) in codes.iter().enumerate() {
                let scale = f32::from(sc[2 * g + l / 16] as i8);
                out[128 * half + 32 * g + l] = d * scale * (f32::from(c) - 32.0);
            }
        }
    }
}

/// Dequantizes `row` (the bytes of `out.len()` elements of type `dtype`) into `out`.
pub fn dequantize_row(dtype: TensorType, row: &[u8], out: &mut [f32]) {
    let (block_elems, block_bytes) = dtype.block();
    let blocks = row
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(block_elems));
    match dtype {
        TensorType::F32 => {
            for (b, o) in blocks {
                o[0] = f32::from_le_bytes(b.try_into().unwrap());
            }
        }
        TensorType::F16 => blocks.for_each(|(b, o)| o[0] = f16_at(b, 0)),
        TensorType::Bf16 => {
            blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        TensorType::Q4_0 => GgmlType::Q4_0.dequantize_row(row, out),
        TensorType::Q4_1 => GgmlType::Q4_1.dequantize_row(row, out),
        TensorType::Q5_0 => GgmlType::Q5_0.dequantize_row(row, out),
        TensorType::Q5_1 => GgmlType::Q5_1.dequantize_row(row, out),
        TensorType::Q8_0 => GgmlType::Q8_0.dequantize_row(row, out),
        TensorType::Q4K => blocks.for_each(|(b, o)| dequantize_q4_k(b, o)),
        TensorType::Q5K => blocks.for_each(|(b, o)| dequantize_q5_k(b, o)),
        TensorType::Q6K => blocks.for_each(|(b, o)| dequantize_q6_k(b, o)),
    }
}

/// An activation vector quantized to signed 8 bits in blocks of 32 (llama.cpp's `Q8_0` scheme
/// for activations), with the per-block sums that the k-quant dot products need.
#[derive(Clone, Debug, Default)]
pub struct QActivations {
    /// `quants[32·b + i]`: element `i` of block `b`, in `-127..=127`.
    pub quants: Vec<i8>,
    /// Scale of each block (`x ≈ scale · q`).
    pub scales: Vec<f32>,
    /// `scale · Σ q` over each 16-element half of each block (`[2·b]`, `[2·b + 1]`).
    pub half_sums: Vec<f32>,
}

impl QActivations {
    /// Quantizes `x` (length a multiple of 32), reusing this value's buffers.
    pub fn quantize(&mut self, x: &[f32]) {
        let blocks = x.len() / 32;
        self.quants.resize(x.len(), 0);
        self.scales.resize(blocks, 0.0);
        self.half_sums.resize(2 * blocks, 0.0);
        for b in 0..blocks {
            let xs = &x[32 * b..32 * b + 32];
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let qs = &mut self.quants[32 * b..32 * b + 32];
            for (q, &v) in qs.iter_mut().zip(xs) {
                *q = (v * inv).round() as i8;
            }
            self.scales[b] = scale;
            for h in 0..2 {
                let s: i32 = qs[16 * h..16 * h + 16].iter().map(|&q| i32::from(q)).sum();
                self.half_sums[2 * b + h] = scale * s as f32;
            }
        }
    }

    /// The dequantized activations (for reference paths and tests).
    pub fn dequantize(&self) -> Vec<f32> {
        self.quants
            .iter()
            .enumerate()
            .map(|(i, &q)| f32::from(q) * self.scales[i / 32])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_scale_min_unpacks_six_bit_fields() {
        // j < 4: low 6 bits of scales[j] and scales[j+4]; j >= 4: nibbles of scales[j+4]
        // plus the top two bits of scales[j-4] and scales[j].
        let mut s = [0u8; 12];
        s[1] = 0b11_000101; // sc1 = 5, top bits (3) feed sc5
        s[5] = 0b10_000111; // m1 = 7, top bits (2) feed m5
        s[9] = 0x4A; // sc5 low nibble 0xA, m5 low nibble 0x4
        assert_eq!(k_scale_min(&s, 1), (5, 7));
        assert_eq!(k_scale_min(&s, 5), (0xA | (3 << 4), 0x4 | (2 << 4)));
    }

    #[test]
    fn q6_k_dequantizes_hand_built_block() {
        // Element 0: ql[0] low nibble 5, qh[0] bits 0-1 = 2 -> code 37 -> (37-32)=5;
        // element 64: ql[0] high nibble 1, qh[0] bits 4-5 = 1 -> code 17 -> -15.
        let mut block = [0u8; 210];
        block[0] = 0x15;
        block[128] = 0b0001_0010;
        block[192] = 3; // scale of elements 0..16
        block[192 + 4] = 2; // scale of elements 64..80
        block[208..210].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        let mut out = [0f32; 256];
        dequantize_q6_k(&block, &mut out);
        assert_eq!(out[0], 0.5 * 3.0 * 5.0);
        assert_eq!(out[64], 0.5 * 2.0 * -15.0);
        assert_eq!(out[1], 0.5 * 3.0 * -32.0);
    }

    #[test]
    fn q4_k_dequantizes_hand_built_block() {
        let mut block = [0u8; 144];
        block[0..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        block[4] = 4; // sc0
        block[4 + 4] = 3; // m0
        block[4 + 1] = 8; // sc1
        block[16] = 0x9C; // element 0 low nibble 12, element 32 high nibble 9
        let mut out = [0f32; 256];
        dequantize_q4_k(&block, &mut out);
        assert_eq!(out[0], 0.25 * 4.0 * 12.0 - 3.0);
        assert_eq!(out[32], 0.25 * 8.0 * 9.0);
    }

    #[test]
    fn activation_quantization_is_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 19) as f32 - 9.0) * 0.31)
            .collect();
        let mut q = QActivations::default();
        q.quantize(&x);
        for (i, (a, b)) in x.iter().zip(q.dequantize()).enumerate() {
            assert!((a - b).abs() <= q.scales[i / 32] * 0.5 + 1e-6);
        }
    }
}
