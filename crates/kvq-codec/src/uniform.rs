//! PLACEHOLDER — to be replaced by the real implementation.
#![allow(unused)]
use crate::{Calibration, Codec, CodecError, Role};

/// Placeholder.
pub struct IntCodec;
impl IntCodec {
    pub fn new(bits: u8, group: usize, head_dim: usize) -> Result<Self, CodecError> {
        todo!()
    }
}
impl Codec for IntCodec {
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
/// Placeholder.
pub struct Int8Codec;
impl Int8Codec {
    pub fn new(role: Role, head_dim: usize) -> Result<IntCodec, CodecError> {
        todo!()
    }
}
