//! Which codec layouts the kernels read, and the NVRTC prelude that describes one to them.
//!
//! A [`RoleLayout`] is derived from a [`SchemeKind`], a [`Role`] and the CPU codec built for them,
//! and is checked against that codec's `block_bytes` and `block_tokens`, so the device reads
//! exactly the bytes the CPU codec writes.

use anyhow::{bail, ensure, Result};
use kvq_codec::lloyd_max::sphere_codebook;
use kvq_codec::{Codec, Role, SchemeKind};
use std::fmt::Write;

/// The device layout of one role (keys or values) of a scheme.
#[derive(Clone, Debug, PartialEq)]
pub struct RoleLayout {
    kind: u32,
    block_tokens: usize,
    block_bytes: usize,
    bits: u32,
    group: usize,
    symmetric: bool,
    /// TurboQuant: coordinates of the first codebook segment, its bits and the second's.
    seg0: usize,
    b0: u32,
    b1: u32,
    /// TurboQuant: centroids and decision boundaries of both segments (16 and 15 each).
    lut: Vec<f32>,
    bounds: Vec<f32>,
    /// TurboQuant: the rotation Π, row-major `d × d` (`prepared = Π·q`).
    rotation: Option<Vec<f32>>,
}

const KIND_F16: u32 = 0;
const KIND_BF16: u32 = 1;
const KIND_Q8_0: u32 = 2;
const KIND_Q4_0: u32 = 3;
const KIND_UNI_TOKEN: u32 = 4;
const KIND_UNI_CHANNEL: u32 = 5;
const KIND_TURBO: u32 = 6;
const KIND_FP8: u32 = 7;

impl RoleLayout {
    /// The layout of `kind` in `role` for `codec` (built by `kvq_codec::build_codec` from the
    /// same kind and role, without calibration except an FP8 scale-free layout). Schemes
    /// without kernels report an error.
    pub fn new(kind: SchemeKind, role: Role, codec: &dyn Codec) -> Result<Self> {
        let d = codec.head_dim();
        ensure!(
            d.is_multiple_of(32) && (32..=256).contains(&d),
            "the GPU kernels need head_dim a multiple of 32 up to 256, got {d}"
        );
        let plain = |kind, block_tokens, bits, group, symmetric| Self {
            kind,
            block_tokens,
            block_bytes: codec.block_bytes(),
            bits,
            group,
            symmetric,
            seg0: d,
            b0: 8,
            b1: 8,
            lut: vec![0.0; 32],
            bounds: vec![0.0; 30],
            rotation: None,
        };
        let layout = match kind {
            SchemeKind::F16 => plain(KIND_F16, 1, 16, d, true),
            SchemeKind::Bf16 => plain(KIND_BF16, 1, 16, d, true),
            SchemeKind::Fp8E4M3 => plain(KIND_FP8, 1, 8, d, true),
            SchemeKind::Q8_0 => plain(KIND_Q8_0, 1, 8, 32, true),
            SchemeKind::Q4_0 => plain(KIND_Q4_0, 1, 4, 32, true),
            SchemeKind::Int8 => match role {
                Role::Key => plain(KIND_UNI_CHANNEL, 32, 8, d, true),
                Role::Value => plain(KIND_UNI_TOKEN, 1, 8, d, true),
            },
            SchemeKind::Int { bits, group } if bits != 3 => plain(
                KIND_UNI_TOKEN,
                1,
                u32::from(bits),
                usize::from(group),
                false,
            ),
            SchemeKind::Kivi { bits } => match role {
                Role::Key => plain(KIND_UNI_CHANNEL, 32, u32::from(bits), d, false),
                Role::Value => plain(KIND_UNI_TOKEN, 1, u32::from(bits), 32, false),
            },
            SchemeKind::Turbo { half_bits } => Self::turbo(half_bits, codec)?,
            other => bail!("scheme {} has no GPU kernel yet", other.name()),
        };
        ensure!(
            codec.block_tokens() == layout.block_tokens && layout.expected_bytes(d) == codec.block_bytes(),
            "{} ({role:?}): the CPU codec's block ({} tokens, {} bytes) is not the layout the kernels read \
             (calibrated layouts are not supported on the GPU)",
            codec.name(),
            codec.block_tokens(),
            codec.block_bytes()
        );
        Ok(layout)
    }

    fn turbo(half_bits: u8, codec: &dyn Codec) -> Result<Self> {
        let d = codec.head_dim();
        let bits = u32::from(half_bits / 2);
        let (seg0, b0, b1) = if half_bits % 2 == 1 {
            (d / 2, bits + 1, bits)
        } else {
            (d, bits, bits)
        };
        ensure!(
            (2..=4).contains(&b0) && (2..=4).contains(&b1),
            "turbo rates below 2 bits have no kernel"
        );
        // Π from the codec itself: prepare_query(e_i) is column i of Π.
        let mut rotation = vec![0f32; d * d];
        let mut e = vec![0f32; d];
        let mut col = vec![0f32; codec.query_len()];
        for i in 0..d {
            e.fill(0.0);
            e[i] = 1.0;
            codec.prepare_query(&e, &mut col);
            for j in 0..d {
                rotation[j * d + i] = col[j];
            }
        }
        let mut lut = vec![0f32; 32];
        let mut bounds = vec![0f32; 30];
        for (s, b) in [b0, b1].into_iter().enumerate() {
            let book = sphere_codebook(d, b);
            lut[16 * s..16 * s + book.centroids().len()].copy_from_slice(book.centroids());
            bounds[15 * s..15 * s + book.boundaries().len()].copy_from_slice(book.boundaries());
        }
        Ok(Self {
            kind: KIND_TURBO,
            block_tokens: 1,
            block_bytes: codec.block_bytes(),
            bits: b0,
            group: d,
            symmetric: false,
            seg0,
            b0,
            b1,
            lut,
            bounds,
            rotation: Some(rotation),
        })
    }

    /// Bytes of one block by this layout's own rules (checked against the codec).
    fn expected_bytes(&self, d: usize) -> usize {
        let params = if self.symmetric { 2 } else { 4 };
        match self.kind {
            KIND_F16 | KIND_BF16 => 2 * d,
            KIND_FP8 => 2 + d,
            KIND_Q8_0 => d / 32 * 34,
            KIND_Q4_0 => d / 32 * 18,
            KIND_UNI_TOKEN => d / self.group * params + d * self.bits as usize / 8,
            KIND_UNI_CHANNEL => d * params + self.block_tokens * d * self.bits as usize / 8,
            _ => 2 + (self.seg0 * self.b0 as usize + (d - self.seg0) * self.b1 as usize) / 8,
        }
    }

    /// Bytes of one 16-token step that the attention kernel copies into shared memory: 16 rows,
    /// or for channel-wise blocks the per-channel parameters and 16 rows of codes; 0 for
    /// f16/bf16 (read straight from global memory). Must match `Stage<S>` in kernels.cu.
    pub(crate) fn stage_bytes(&self, d: usize) -> usize {
        let params = if self.symmetric { 2 } else { 4 };
        match self.kind {
            KIND_F16 | KIND_BF16 => 0,
            KIND_UNI_CHANNEL => d * params + 16 * d * self.bits as usize / 8,
            _ => 16 * self.block_bytes,
        }
    }

    /// Rows encoded together.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The rotation Π (row-major) when the layout stores rotated coordinates.
    pub fn rotation(&self) -> Option<&[f32]> {
        self.rotation.as_deref()
    }

    /// The C++ struct `name` that the kernels read this layout from.
    pub(crate) fn prelude(&self, name: &str) -> String {
        let list = |v: &[f32]| {
            v.iter()
                .map(|x| format!("{x:e}f"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut s = String::new();
        let _ = writeln!(
            s,
            "__constant__ float {name}_LUT[32] = {{{}}};",
            list(&self.lut)
        );
        let _ = writeln!(
            s,
            "__constant__ float {name}_BND[30] = {{{}}};",
            list(&self.bounds)
        );
        let _ = writeln!(
            s,
            "struct {name} {{ enum {{ KIND = {}, BT = {}, BB = {}, BITS = {}, GROUP = {}, SYM = {}, SEG0 = {}, B0 = {}, B1 = {} }};\n\
             static __device__ __forceinline__ float lut0(int i) {{ return {name}_LUT[i]; }}\n\
             static __device__ __forceinline__ float lut1(int i) {{ return {name}_LUT[16 + i]; }}\n\
             static __device__ __forceinline__ float bnd0(int i) {{ return {name}_BND[i]; }}\n\
             static __device__ __forceinline__ float bnd1(int i) {{ return {name}_BND[15 + i]; }} }};",
            self.kind,
            self.block_tokens,
            self.block_bytes,
            self.bits,
            self.group,
            u32::from(self.symmetric),
            self.seg0,
            self.b0,
            self.b1
        );
        s
    }
}
