//! PLACEHOLDER — to be replaced by the real implementation.
#![allow(unused)]
use crate::{Calibration, Codec, CodecError, Role};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Iq4Nl,
}

/// Placeholder.
pub struct GgmlCodec;
impl GgmlCodec {
    pub fn new(t: GgmlType, head_dim: usize) -> Result<Self, CodecError> {
        todo!()
    }
}
impl Codec for GgmlCodec {
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
