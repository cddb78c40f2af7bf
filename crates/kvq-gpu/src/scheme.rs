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
    /// TurboQuant, keys: the query preparation `M` (`prepared = M·q`), values: the map back
    /// from the accumulator (`out = Mᵀ·acc`); `M` is Π (mse, `d × d`) or Π stacked on the
    /// (scaled) QJL matrix S (prod, `2d × d`), row-major, read from the codec itself.
    rotation: Option<Vec<f32>>,
    /// Length of the prepared query and of the value accumulator: `d`, or `2d` for
    /// TurboQuant-prod (rotated coordinates, then sketch coordinates).
    logical: usize,
    /// TurboQuant-prod: the factor of a row's QJL signs besides its weight `n·γ` in the score (keys) or
    /// in the accumulator (values), read from the codec.
    qjl_scale: f32,
    /// Oaken: thresholds (lo_outer, lo_inner, hi_inner, hi_outer) and sparse capacity.
    oaken: [f32; 4],
    capacity: usize,
}

const KIND_F16: u32 = 0;
const KIND_BF16: u32 = 1;
const KIND_Q8_0: u32 = 2;
const KIND_Q4_0: u32 = 3;
const KIND_UNI_TOKEN: u32 = 4;
const KIND_UNI_CHANNEL: u32 = 5;
const KIND_TURBO: u32 = 6;
const KIND_FP8: u32 = 7;
const KIND_PROD: u32 = 8;
const KIND_OAKEN: u32 = 9;
/// Oaken: elements addressed by one sparse entry's 6-bit index, and the per-token scale bytes.
const OAKEN_SPAN: usize = 64;
const OAKEN_META: usize = 8;

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
        let plain = |kind, block_tokens, bits, group, symmetric| {
            Self::plain(codec, kind, block_tokens, bits, group, symmetric)
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
            SchemeKind::Kivi { bits, group: 32 } => match role {
                Role::Key => plain(KIND_UNI_CHANNEL, 32, u32::from(bits), d, false),
                Role::Value => plain(KIND_UNI_TOKEN, 1, u32::from(bits), 32, false),
            },
            SchemeKind::Turbo { half_bits } => Self::turbo(half_bits, false, role, codec)?,
            SchemeKind::TurboProd { bits } => Self::turbo(2 * (bits - 1), true, role, codec)?,
            SchemeKind::Oaken => Self::oaken(codec)?,
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

    /// A layout of `bits`-bit codes in groups of `group` with no table, rotation or sparse
    /// part; the special layouts start from it.
    fn plain(
        codec: &dyn Codec,
        kind: u32,
        block_tokens: usize,
        bits: u32,
        group: usize,
        symmetric: bool,
    ) -> Self {
        let d = codec.head_dim();
        Self {
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
            logical: d,
            qjl_scale: 0.0,
            oaken: [0.0; 4],
            capacity: 0,
        }
    }

    /// TurboQuant-mse at `half_bits / 2` bits, or TurboQuant-prod (`prod`) with `half_bits / 2`
    /// mse bits before the QJL sign bit.
    fn turbo(half_bits: u8, prod: bool, role: Role, codec: &dyn Codec) -> Result<Self> {
        let d = codec.head_dim();
        let bits = u32::from(half_bits / 2);
        let (seg0, b0, b1) = if half_bits % 2 == 1 {
            (d / 2, bits + 1, bits)
        } else {
            (d, bits, bits)
        };
        let lowest = if prod { 1 } else { 2 };
        ensure!(
            (lowest..=4).contains(&b0) && (lowest..=4).contains(&b1),
            "turbo rates below 2 bits have no kernel"
        );
        // The working width; a prepared query starts with it (the CPU's integer kernels append
        // their own slots, which the device does not use).
        let logical = codec.accumulator_len();
        ensure!(
            logical == if prod { 2 * d } else { d } && codec.query_len() >= logical,
            "{}: unexpected working width {logical} (a calibrated layout?)",
            codec.name()
        );
        // The matrix from the codec itself, one unit vector at a time: keys take column i of
        // the query preparation from prepare_query(e_i); values take row i of the map back
        // from finish(e_i) (Π, and the QJL matrix below it for prod, as the codec scales it).
        let mut rotation = vec![0f32; logical * d];
        match role {
            Role::Key => {
                let (mut e, mut col) = (vec![0f32; d], vec![0f32; codec.query_len()]);
                for i in 0..d {
                    e.fill(0.0);
                    e[i] = 1.0;
                    codec.prepare_query(&e, &mut col);
                    for (j, &x) in col[..logical].iter().enumerate() {
                        rotation[j * d + i] = x;
                    }
                }
            }
            Role::Value => {
                let mut e = vec![0f32; logical];
                for (i, row) in rotation.chunks_exact_mut(d).enumerate() {
                    e.fill(0.0);
                    e[i] = 1.0;
                    codec.finish(&e, row);
                }
            }
        }
        // Prod: a row of norm 1, QJL weight 1 and every sign +1 scores 1 on the first sketch
        // coordinate and adds 1 to it, times the factor the codec applies there.
        let qjl_scale = if prod {
            let mut block = vec![0u8; codec.block_bytes()];
            let gamma = 2 + d * b0 as usize / 8;
            let one = half::f16::ONE.to_le_bytes();
            block[..2].copy_from_slice(&one);
            block[gamma..gamma + 2].copy_from_slice(&one);
            block[gamma + 2..].fill(0xFF);
            match role {
                Role::Key => {
                    let mut q = vec![0f32; codec.query_len()];
                    q[d] = 1.0;
                    let mut score = [0f32];
                    codec.score(&q, &block, &mut score);
                    score[0]
                }
                Role::Value => {
                    let mut acc = vec![0f32; logical];
                    codec.accumulate(&[1.0], &block, &mut acc);
                    acc[d]
                }
            }
        } else {
            0.0
        };
        let mut lut = vec![0f32; 32];
        let mut bounds = vec![0f32; 30];
        for (s, b) in [b0, b1].into_iter().enumerate() {
            let book = sphere_codebook(d, b);
            lut[16 * s..16 * s + book.centroids().len()].copy_from_slice(book.centroids());
            bounds[15 * s..15 * s + book.boundaries().len()].copy_from_slice(book.boundaries());
        }
        let kind = if prod { KIND_PROD } else { KIND_TURBO };
        Ok(Self {
            seg0,
            b0,
            b1,
            lut,
            bounds,
            rotation: Some(rotation),
            logical,
            qjl_scale,
            ..Self::plain(codec, kind, 1, b0, d, false)
        })
    }

    /// Oaken: the thresholds are read back through the codec's own decoder (kvq-codec's
    /// documented layout): with zero scales every middle code decodes to its branch's inner
    /// threshold, and an outer entry of magnitude code 0 to its outer threshold.
    fn oaken(codec: &dyn Codec) -> Result<Self> {
        let d = codec.head_dim();
        ensure!(
            d.is_multiple_of(128),
            "the oaken kernels need head_dim a multiple of 128, got {d}"
        );
        let spans = d.div_ceil(OAKEN_SPAN);
        let sparse = OAKEN_META + spans + d / 2;
        let bb = codec.block_bytes();
        ensure!(
            bb > sparse + 3 && bb - sparse <= d,
            "oaken block of {bb} bytes is not the documented layout"
        );
        let mut block = vec![0u8; bb];
        block[OAKEN_META] = 2; // two entries in span 0
        block[OAKEN_META + spans] = 0x80; // element 0: code 0 (low branch), element 1: code 8
        block[sparse] = 2 | 0x40; // element 2: outer, high side
        block[sparse + 1] = 3 | 0x40 | 0x80; // element 3: outer, low side
        let mut rows = vec![0f32; d];
        codec.decode(&block, &mut rows);
        let t = [rows[3], rows[0], rows[1], rows[2]];
        ensure!(
            t.iter().all(|x| x.is_finite()) && t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3],
            "oaken thresholds read back out of order: {t:?}"
        );
        Ok(Self {
            b0: 4,
            b1: 4,
            oaken: t,
            capacity: bb - sparse,
            ..Self::plain(codec, KIND_OAKEN, 1, 4, d, false)
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
            KIND_OAKEN => OAKEN_META + d.div_ceil(OAKEN_SPAN) + d / 2 + self.capacity,
            KIND_PROD => 2 + d * self.b0 as usize / 8 + 2 + d / 8,
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

    /// The query's preparation matrix (row-major, [`Self::logical_dim`] × head_dim) when the
    /// layout stores rotated coordinates: Π, or Π stacked on the QJL matrix for TurboQuant-prod.
    /// Values are accumulated in the same coordinates and mapped back by its transpose.
    pub fn rotation(&self) -> Option<&[f32]> {
        self.rotation.as_deref()
    }

    /// Length of the prepared query and of the value accumulator (head_dim, or twice it for
    /// TurboQuant-prod).
    pub fn logical_dim(&self) -> usize {
        self.logical
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
            "struct {name} {{ enum {{ KIND = {}, BT = {}, BB = {}, BITS = {}, GROUP = {}, SYM = {}, SEG0 = {}, B0 = {}, B1 = {}, LD = {}, CAP = {} }};\n\
             static constexpr float QJL = {:e}f, LO_OUTER = {:e}f, LO_INNER = {:e}f, HI_INNER = {:e}f, HI_OUTER = {:e}f;\n\
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
            self.b1,
            self.logical,
            self.capacity,
            self.qjl_scale,
            self.oaken[0],
            self.oaken[1],
            self.oaken[2],
            self.oaken[3]
        );
        s
    }
}
