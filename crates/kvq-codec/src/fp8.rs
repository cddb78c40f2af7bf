//! PLACEHOLDER — to be replaced by the real implementation.
#![allow(unused)]
use crate::{Calibration, Codec, CodecError, Role};

/// FP8 format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Format {
    E4M3,
    E5M2,
}

/// Placeholder.
pub struct Fp8Codec;
impl Fp8Codec {
    pub fn new(format: Fp8Format, head_dim: usize, scale: Option<f32>) -> Self {
        todo!()
    }
}
impl Codec for Fp8Codec {
    fn name(&self) -> String {
        todo!()
    }
    fn head_dim(&self) -> usize {
        todo!()
    }
    fn block_tokens(&self) -> usize {
        todo!()
    }
    fn block_bytes(&self) -> usize {
        todo!()
    }
    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        todo!()
    }
    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        todo!()
    }
    fn score(&self, q: &[f32], blocks: &[u8], scores: &mut [f32]) {
        todo!()
    }
    fn accumulate(&self, w: &[f32], blocks: &[u8], acc: &mut [f32]) {
        todo!()
    }
}
