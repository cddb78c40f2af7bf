//! Uniform integer quantizers: `int2|int3|int4[-g32|-g64|-g128]` and `int8`, and the engine that
//! KIVI ([`crate::kivi`]) reuses.
//!
//! Every group of values is mapped to `b`-bit codes with `x̂ = scale·code + offset`:
//!
//! * **asymmetric** groups store an f16 `scale` and an f16 `min` (`offset = min`); codes run over
//!   `0..=2^b−1`, `scale = (max−min)/(2^b−1)`, `code = clamp(round((x−min)/scale))`;
//! * **symmetric** groups store only an f16 `scale = absmax/(2^(b−1)−1)`; a code holds
//!   `q + 2^(b−1)` for `q = round(x/scale)` (so `offset = −2^(b−1)·scale`).
//!
//! The stored f16 parameters are rounded outward (minimum down, scale up) and the codes are
//! computed from those rounded values, so every element lies within half a step (`scale/2`, the
//! stored scale) of its reconstruction, up to f32 rounding.
//!
//! A block is the parameter table (one entry per group, in group order; 4 bytes asymmetric:
//! scale then min, 2 bytes symmetric: scale; f16 little-endian) followed by the codes of each of
//! its rows in turn, each row `b·head_dim/8` bytes packed least significant bit first
//! ([`crate::bits`]). Two groupings exist:
//!
//! * [`Grouping::PerToken`]: one row per block, a group is `group` consecutive channels;
//! * [`Grouping::PerChannel`]: `tokens` rows per block, a group is one channel over those rows.
//!
//! Schemes built here (`d` = head_dim):
//!
//! | scheme | grouping | zero point | bits per element |
//! |---|---|---|---|
//! | `int{b}-g{g}` | per token, groups of `g` | asymmetric | `b + 32/g` (int4-g64: 4.5) |
//! | `int8` keys | per channel over 32 tokens | symmetric | `8 + 16/32 = 8.5` |
//! | `int8` values | per token, one group of `d` | symmetric | `8 + 16/d` (8.125 at d = 128) |
//!
//! Values must fit in f16 (`|x| ≤ 65504`); larger ones cannot be given a finite f16 scale and
//! are rejected with [`CodecError::NonFinite`], as the `f16` scheme rejects them.

use crate::levels::{self, ChannelBlocks, CodeLayout, LevelFormat, MapLayout};
use crate::simd::{
    self, axpy_codes, decode_codes, decode_rows, dot_codes, CodeRun, GroupParams, RowFormat,
};
use crate::{bits, check_finite, Codec, CodecError, Role};
use half::f16;

/// The smallest f16 that is `≥ x` (directed rounding; `+inf` above the f16 range).
pub fn f16_at_least(x: f64) -> f16 {
    let nearest = f16::from_f64(x);
    if nearest.to_f64() >= x {
        return nearest;
    }
    let b = nearest.to_bits();
    f16::from_bits(match b {
        0x8000 => 0x0001,
        _ if b & 0x8000 == 0 => b + 1,
        _ => b - 1,
    })
}

/// The largest f16 that is `≤ x` (directed rounding; `−inf` below the f16 range).
pub fn f16_at_most(x: f64) -> f16 {
    -f16_at_least(-x)
}

/// Reads a little-endian f16 at byte `at` of `bytes` as f32.
#[inline]
pub fn read_f16(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The error for a block whose parameters do not fit in f16: it names the element of largest
/// magnitude, which is the one out of range.
pub fn out_of_f16_range(rows: &[f32], head_dim: usize) -> CodecError {
    let (i, value) = rows
        .iter()
        .copied()
        .enumerate()
        .fold((0, 0.0f32), |best, (i, v)| {
            if v.abs() > best.1.abs() {
                (i, v)
            } else {
                best
            }
        });
    CodecError::NonFinite {
        row: i / head_dim,
        channel: i % head_dim,
        value,
    }
}

/// How a group's codes map back to values: `x̂ = scale·(code − zero_code) + min`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Affine {
    /// Real value per code step.
    pub scale: f32,
    /// Real value of `zero_code` (the group minimum, or 0 for symmetric groups).
    pub min: f32,
    /// The code that stands for `min` (0, or `2^(b−1)` for symmetric groups).
    pub zero_code: f32,
}

impl Affine {
    /// Real value of code 0, so that `x̂ = scale·code + offset`.
    #[inline]
    pub fn offset(&self) -> f32 {
        self.min - self.zero_code * self.scale
    }

    /// The code of `x` (nearest grid point, clamped to `0..=max_code`; `zero_code` when the
    /// scale is 0).
    #[inline]
    pub fn code(&self, x: f32, max_code: u8) -> u8 {
        if self.scale == 0.0 {
            return self.zero_code as u8;
        }
        ((x - self.min) / self.scale + self.zero_code)
            .round()
            .clamp(0.0, f32::from(max_code)) as u8
    }
}

/// Where a group's zero point comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroPoint {
    /// f16 scale and f16 minimum stored per group (4 bytes); codes `0..=2^b−1`.
    Asymmetric,
    /// f16 scale stored per group (2 bytes); codes hold `q + 2^(b−1)`, `|q| ≤ 2^(b−1)−1`.
    Symmetric,
}

impl ZeroPoint {
    /// Bytes of one group's stored parameters.
    pub fn param_bytes(self) -> usize {
        match self {
            Self::Asymmetric => 4,
            Self::Symmetric => 2,
        }
    }

    /// Fits the parameters of a `bits`-bit group whose values lie in `[lo, hi]`, writes them to
    /// `out` (`param_bytes` long) and returns the affine map of the stored f16 values, or `None`
    /// if they do not fit in f16.
    pub fn fit(self, bits: u32, lo: f32, hi: f32, out: &mut [u8]) -> Option<Affine> {
        let (lo, hi) = (f64::from(lo), f64::from(hi));
        match self {
            Self::Asymmetric => {
                let min = f16_at_most(lo);
                let levels = f64::from((1u32 << bits) - 1);
                let scale = f16_at_least((hi - min.to_f64()) / levels);
                if !(min.is_finite() && scale.is_finite()) {
                    return None;
                }
                out[..2].copy_from_slice(&scale.to_le_bytes());
                out[2..4].copy_from_slice(&min.to_le_bytes());
            }
            Self::Symmetric => {
                let qmax = f64::from((1u32 << (bits - 1)) - 1);
                let scale = f16_at_least(lo.abs().max(hi.abs()) / qmax);
                if !scale.is_finite() {
                    return None;
                }
                out[..2].copy_from_slice(&scale.to_le_bytes());
            }
        }
        Some(self.read(bits, out))
    }

    /// The affine map of the parameters stored at the start of `bytes`.
    #[inline]
    pub fn read(self, bits: u32, bytes: &[u8]) -> Affine {
        let scale = read_f16(bytes, 0);
        match self {
            Self::Asymmetric => Affine {
                scale,
                min: read_f16(bytes, 2),
                zero_code: 0.0,
            },
            Self::Symmetric => Affine {
                scale,
                min: 0.0,
                zero_code: (1u32 << (bits - 1)) as f32,
            },
        }
    }
}

/// Which values share one set of parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// One row per block; a group is `group` consecutive channels of the row.
    PerToken {
        /// Channels per group.
        group: usize,
    },
    /// `tokens` rows per block; a group is one channel over those rows.
    PerChannel {
        /// Rows per block.
        tokens: usize,
    },
}

/// A uniform integer codec: `bits`-bit codes with one affine map per group (see the module
/// documentation for the layout).
#[derive(Clone, Debug)]
pub struct IntCodec {
    name: String,
    head_dim: usize,
    bits: u32,
    zero: ZeroPoint,
    grouping: Grouping,
}

impl IntCodec {
    /// `int{bits}-g{group}`: per-token asymmetric groups of `group` channels, `bits` ∈ 2..=4.
    pub fn new(bits: u8, group: usize, head_dim: usize) -> Result<Self, CodecError> {
        let name = format!("int{bits}-g{group}");
        if !(2..=4).contains(&bits) {
            return Err(CodecError::UnknownScheme {
                name,
                known: "int2, int3, int4 with -g32, -g64 or -g128".into(),
            });
        }
        Self::with_layout(
            name,
            u32::from(bits),
            ZeroPoint::Asymmetric,
            Grouping::PerToken { group },
            head_dim,
        )
    }

    /// `int8`: keys symmetric per channel over blocks of 32 tokens, values symmetric per token.
    pub fn int8(role: Role, head_dim: usize) -> Result<Self, CodecError> {
        let grouping = match role {
            Role::Key => Grouping::PerChannel { tokens: 32 },
            Role::Value => Grouping::PerToken { group: head_dim },
        };
        Self::with_layout("int8".into(), 8, ZeroPoint::Symmetric, grouping, head_dim)
    }

    /// A codec with an explicit layout. `bits` ∈ {2, 3, 4, 8}; head_dim (and a per-token group)
    /// must be a multiple of 8, and head_dim a multiple of the group.
    pub fn with_layout(
        name: String,
        bits: u32,
        zero: ZeroPoint,
        grouping: Grouping,
        head_dim: usize,
    ) -> Result<Self, CodecError> {
        assert!(
            matches!(bits, 2 | 3 | 4 | 8),
            "code width {bits} is not supported"
        );
        let unsupported = |why: String| CodecError::UnsupportedHeadDim {
            scheme: name.clone(),
            head_dim,
            why,
        };
        if head_dim == 0 || !head_dim.is_multiple_of(8) {
            return Err(unsupported(
                "head_dim must be a positive multiple of 8".into(),
            ));
        }
        if let Grouping::PerToken { group } = grouping {
            if group == 0 || !group.is_multiple_of(8) || !head_dim.is_multiple_of(group) {
                return Err(unsupported(format!(
                    "head_dim must be a multiple of the group size {group}"
                )));
            }
        }
        Ok(Self {
            name,
            head_dim,
            bits,
            zero,
            grouping,
        })
    }

    /// Parameter groups per block.
    fn groups(&self) -> usize {
        match self.grouping {
            Grouping::PerToken { group } => self.head_dim / group,
            Grouping::PerChannel { .. } => self.head_dim,
        }
    }

    /// Bytes of the parameter table at the start of a block.
    fn params_bytes(&self) -> usize {
        self.groups() * self.zero.param_bytes()
    }

    /// Bytes of one row's packed codes.
    fn row_code_bytes(&self) -> usize {
        bits::packed_len(self.head_dim, self.bits)
    }

    /// The affine map of group `g` of `block`.
    #[inline]
    fn affine(&self, block: &[u8], g: usize) -> Affine {
        self.zero
            .read(self.bits, &block[g * self.zero.param_bytes()..])
    }

    /// The packed codes of row `t` of `block`.
    #[inline]
    fn row_codes<'a>(&self, block: &'a [u8], t: usize) -> &'a [u8] {
        let n = self.row_code_bytes();
        &block[self.params_bytes() + t * n..][..n]
    }

    /// A per-token row's codes as [`decode_rows`] reads them (`None` for per-channel blocks).
    fn token_run(&self) -> Option<CodeRun> {
        let Grouping::PerToken { group } = self.grouping else {
            return None;
        };
        Some(CodeRun {
            row_bytes: self.block_bytes(),
            codes_at: self.params_bytes(),
            len: self.head_dim,
            bits: self.bits,
            group,
            params: match self.zero {
                ZeroPoint::Asymmetric => GroupParams::ScaleMin,
                ZeroPoint::Symmetric => GroupParams::ScaleZero {
                    zero: (1u32 << (self.bits - 1)) as f32,
                },
            },
        })
    }

    fn max_code(&self) -> u8 {
        ((1u32 << self.bits) - 1) as u8
    }
}

impl Codec for IntCodec {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn head_dim(&self) -> usize {
        self.head_dim
    }
    fn block_tokens(&self) -> usize {
        match self.grouping {
            Grouping::PerToken { .. } => 1,
            Grouping::PerChannel { tokens } => tokens,
        }
    }
    fn block_bytes(&self) -> usize {
        self.params_bytes() + self.block_tokens() * self.row_code_bytes()
    }

    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        check_finite(rows, self.head_dim)?;
        let d = self.head_dim;
        let pb = self.zero.param_bytes();
        let max_code = self.max_code();
        let mut codes = vec![0u8; rows.len()];
        match self.grouping {
            Grouping::PerToken { group } => {
                for (g, (xs, cs)) in rows
                    .chunks_exact(group)
                    .zip(codes.chunks_exact_mut(group))
                    .enumerate()
                {
                    let (lo, hi) = min_max(xs.iter().copied());
                    let affine = self
                        .zero
                        .fit(self.bits, lo, hi, &mut out[g * pb..(g + 1) * pb])
                        .ok_or_else(|| out_of_f16_range(rows, d))?;
                    for (c, &x) in cs.iter_mut().zip(xs) {
                        *c = affine.code(x, max_code);
                    }
                }
            }
            Grouping::PerChannel { .. } => {
                for ch in 0..d {
                    let column = rows.iter().skip(ch).step_by(d).copied();
                    let (lo, hi) = min_max(column);
                    let affine = self
                        .zero
                        .fit(self.bits, lo, hi, &mut out[ch * pb..(ch + 1) * pb])
                        .ok_or_else(|| out_of_f16_range(rows, d))?;
                    for i in (ch..rows.len()).step_by(d) {
                        codes[i] = affine.code(rows[i], max_code);
                    }
                }
            }
        }
        let (params_len, row_len) = (self.params_bytes(), self.row_code_bytes());
        for (row_codes, packed) in codes
            .chunks_exact(d)
            .zip(out[params_len..].chunks_exact_mut(row_len))
        {
            bits::pack(row_codes, self.bits, packed);
        }
        Ok(())
    }

    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        match self.grouping {
            Grouping::PerToken { .. } => self.decode_working(block, rows),
            Grouping::PerChannel { .. } => {
                let (scales, offsets): (Vec<f32>, Vec<f32>) = (0..self.groups())
                    .map(|c| {
                        let affine = self.affine(block, c);
                        (affine.scale, affine.offset())
                    })
                    .unzip();
                for (t, row) in rows.chunks_exact_mut(self.head_dim).enumerate() {
                    decode_codes(self.row_codes(block, t), self.bits, &scales, &offsets, row);
                }
            }
        }
    }

    /// Per-token rows decode a whole run in one vector call; per-channel blocks one by one.
    fn decode_working(&self, blocks: &[u8], rows: &mut [f32]) {
        match self.token_run() {
            Some(run) => decode_rows(blocks, &run, None, rows, self.head_dim, 0),
            None => {
                let per_block = self.block_tokens() * self.head_dim;
                for (block, out) in blocks
                    .chunks_exact(self.block_bytes())
                    .zip(rows.chunks_exact_mut(per_block))
                {
                    self.decode(block, out);
                }
            }
        }
    }

    /// Per-token groupings append each group's query sum (`Σ q_c` over the group), which the
    /// offset term of [`Codec::score`] needs, and the i8 query of the integer kernels.
    fn query_len(&self) -> usize {
        match self.grouping {
            Grouping::PerToken { .. } => {
                let slots = self
                    .level_format()
                    .map_or(0, |f| levels::query_slots(f.width));
                self.head_dim + self.groups() + slots
            }
            Grouping::PerChannel { .. } => self.head_dim,
        }
    }

    fn prepare_query(&self, query: &[f32], prepared: &mut [f32]) {
        let d = self.head_dim;
        prepared[..d].copy_from_slice(query);
        if let Grouping::PerToken { group } = self.grouping {
            for (sum, qs) in prepared[d..].iter_mut().zip(query.chunks_exact(group)) {
                *sum = qs.iter().sum();
            }
        }
        if let Some(format) = self.level_format() {
            levels::finish_query(&format, prepared);
        }
    }

    /// Symmetric 8-bit rows with one scale (int8's values) go straight to the float kernels.
    fn row_format(&self) -> Option<RowFormat> {
        let one_scale =
            matches!(self.grouping, Grouping::PerToken { group } if group == self.head_dim);
        (self.bits == 8 && self.zero == ZeroPoint::Symmetric && one_scale)
            .then_some(RowFormat::Int8)
    }

    /// 8-bit per-channel blocks (int8's keys): each block's scales fold into an f32 query,
    /// and the float kernels read the code bytes as they are (`RowFormat::U8`); narrower
    /// blocks go to the default ([`Codec::channel_blocks`], else decoded tiles).
    fn score_group(
        &self,
        queries: &[&[f32]],
        blocks: &[u8],
        scores: &mut [&mut [f32]],
        ahead: &mut simd::Ahead,
    ) {
        let (Grouping::PerChannel { tokens }, 8, ZeroPoint::Symmetric) =
            (self.grouping, self.bits, self.zero)
        else {
            return crate::tile::score_group(self, queries, blocks, scores, ahead);
        };
        // The middle code, the zero of symmetric codes (`ZeroPoint::read`).
        let zero = self.zero.read(self.bits, &[0; 2]).zero_code;
        let (d, bb) = (self.head_dim, self.block_bytes());
        // q·k_t = Σ_c (q_c·scale_c)·code_tc − 128·Σ_c q_c·scale_c, per block and head.
        let mut channel_scales = vec![0f32; d];
        let mut scaled = vec![0f32; queries.len() * d];
        let mut biases = vec![0f32; queries.len()];
        // Per-block lists of slices, their allocations reused from block to block.
        let (mut q_rows, mut score_rows): (Vec<&[f32]>, Vec<&mut [f32]>) = (Vec::new(), Vec::new());
        for (b, block) in blocks.chunks_exact(bb).enumerate() {
            let (scale_bytes, rows) = block.split_at(self.params_bytes());
            // The f16 scales as f32, by the vector kernels (`0 + 1·s`).
            channel_scales.fill(0.0);
            simd::axpy(RowFormat::F16, 1.0, scale_bytes, &mut channel_scales);
            for ((q, sq), bias) in queries
                .iter()
                .zip(scaled.chunks_exact_mut(d))
                .zip(&mut biases)
            {
                for ((s, &x), &scale) in sq.iter_mut().zip(q.iter()).zip(&channel_scales) {
                    *s = x * scale;
                }
                *bias = -zero * sq.iter().sum::<f32>();
            }
            let mut block_queries: Vec<&[f32]> = crate::recycle(q_rows);
            block_queries.extend(scaled.chunks_exact(d));
            let mut block_scores: Vec<&mut [f32]> = crate::recycle(score_rows);
            block_scores.extend(
                scores
                    .iter_mut()
                    .map(|s| &mut s[b * tokens..(b + 1) * tokens]),
            );
            simd::dot_rows_group(
                RowFormat::U8,
                &block_queries,
                rows,
                &mut block_scores,
                ahead,
            );
            for (s, bias) in block_scores.iter_mut().zip(&biases) {
                s.iter_mut().for_each(|x| *x += bias);
            }
            (q_rows, score_rows) = (crate::recycle(block_queries), crate::recycle(block_scores));
        }
    }

    /// Per-token groupings: the codes are the levels, each group's map its scale and minimum
    /// (or its scale around the middle code).
    fn level_format(&self) -> Option<LevelFormat> {
        let Grouping::PerToken { group } = self.grouping else {
            return None;
        };
        let (min_at, zero) = match self.zero {
            ZeroPoint::Asymmetric => (Some(2), 0.0),
            ZeroPoint::Symmetric => (None, (1u32 << (self.bits - 1)) as f32),
        };
        Some(LevelFormat {
            row_bytes: self.block_bytes(),
            width: self.head_dim,
            codes: CodeLayout::Packed {
                at: self.params_bytes(),
                bits: self.bits,
            },
            maps: MapLayout {
                channels: group,
                scale_at: 0,
                stride: self.zero.param_bytes(),
                min_at,
                zero,
            },
            table: None,
        })
        .filter(LevelFormat::supported)
    }

    /// Asymmetric 2- to 4-bit per-channel blocks (KIVI's keys).
    fn channel_blocks(&self) -> Option<ChannelBlocks> {
        let Grouping::PerChannel { tokens } = self.grouping else {
            return None;
        };
        Some(ChannelBlocks {
            width: self.head_dim,
            bits: self.bits,
            tokens,
            interleaved: false,
        })
        .filter(|b| self.zero == ZeroPoint::Asymmetric && b.supported())
    }

    fn score(&self, prepared_query: &[f32], blocks: &[u8], scores: &mut [f32]) {
        let d = self.head_dim;
        let (q, group_sums) = prepared_query.split_at(d);
        let bb = self.block_bytes();
        match self.grouping {
            Grouping::PerToken { .. } => {
                // q·k = Σ_g scale_g·(q_g·code_g) + offset_g·Σq_g.
                let mut scales = vec![0.0f32; self.groups()];
                for (block, score) in blocks.chunks_exact(bb).zip(scores.iter_mut()) {
                    let mut bias = 0.0f32;
                    for (g, (scale, &sum)) in scales.iter_mut().zip(group_sums).enumerate() {
                        let affine = self.affine(block, g);
                        *scale = affine.scale;
                        bias += affine.offset() * sum;
                    }
                    *score = dot_codes(self.row_codes(block, 0), self.bits, q, &scales) + bias;
                }
            }
            Grouping::PerChannel { tokens } => {
                // q·k_t = Σ_c (q_c·scale_c)·code_tc + Σ_c q_c·offset_c, per block.
                let mut scaled_q = vec![0.0f32; d];
                for (block, block_scores) in blocks.chunks_exact(bb).zip(scores.chunks_mut(tokens))
                {
                    let mut bias = 0.0f32;
                    for (c, sq) in scaled_q.iter_mut().enumerate() {
                        let affine = self.affine(block, c);
                        *sq = q[c] * affine.scale;
                        bias += q[c] * affine.offset();
                    }
                    for (t, score) in block_scores.iter_mut().enumerate() {
                        *score = dot_codes(self.row_codes(block, t), self.bits, &scaled_q, &[1.0])
                            + bias;
                    }
                }
            }
        }
    }

    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]) {
        let d = self.head_dim;
        let bb = self.block_bytes();
        match self.grouping {
            Grouping::PerToken { .. } => {
                let (mut scales, mut offsets) =
                    (vec![0.0f32; self.groups()], vec![0.0f32; self.groups()]);
                for (block, &w) in blocks.chunks_exact(bb).zip(weights) {
                    for (g, (scale, offset)) in scales.iter_mut().zip(&mut offsets).enumerate() {
                        let affine = self.affine(block, g);
                        *scale = w * affine.scale;
                        *offset = w * affine.offset();
                    }
                    let codes = self.row_codes(block, 0);
                    axpy_codes(codes, self.bits, &scales, &offsets, &mut acc[..d]);
                }
            }
            Grouping::PerChannel { tokens } => {
                // Σ_t w_t·x̂_tc = scale_c·(Σ_t w_t·code_tc) + offset_c·Σ_t w_t, per block.
                let mut weighted_codes = vec![0.0f32; d];
                for (block, block_weights) in blocks.chunks_exact(bb).zip(weights.chunks(tokens)) {
                    weighted_codes.fill(0.0);
                    for (t, &w) in block_weights.iter().enumerate() {
                        axpy_codes(
                            self.row_codes(block, t),
                            self.bits,
                            &[w],
                            &[0.0],
                            &mut weighted_codes,
                        );
                    }
                    let weight_sum: f32 = block_weights.iter().sum();
                    for (c, (a, &wc)) in acc.iter_mut().zip(&weighted_codes).enumerate() {
                        let affine = self.affine(block, c);
                        *a += affine.scale * wc + affine.offset() * weight_sum;
                    }
                }
            }
        }
    }
}

/// The smallest and largest of `values` (`(+inf, −inf)` when empty).
pub fn min_max(values: impl Iterator<Item = f32>) -> (f32, f32) {
    values.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn codec(name: &str, role: Role, head_dim: usize) -> Box<dyn Codec> {
        let kind = crate::SchemeKind::parse(name).unwrap();
        crate::build_codec(kind, role, head_dim, &Default::default(), 0).unwrap()
    }

    #[test]
    fn directed_f16_rounding_brackets_the_input() {
        for x in [
            0.0, 1e-9, -1e-9, 0.1, -0.1, 1000.3, -1000.3, 65504.0, 3.0e-5,
        ] {
            let (lo, hi) = (f16_at_most(x).to_f64(), f16_at_least(x).to_f64());
            assert!(lo <= x && x <= hi, "{x}: {lo} {hi}");
            assert!(hi - lo <= (x.abs() * 1e-3).max(6e-8), "{x}: {lo} {hi}");
        }
        assert_eq!(f16_at_least(1.0), f16::ONE);
        assert_eq!(f16_at_least(1e-9).to_bits(), 0x0001);
        assert_eq!(f16_at_most(1e-9).to_bits(), 0x0000);
        assert!(f16_at_least(70000.0).is_infinite());
    }

    #[test]
    fn exact_bits_per_element() {
        let cases = [
            ("int4-g64", Role::Key, 128, 4.5),
            ("int4-g32", Role::Value, 256, 5.0),
            ("int3-g128", Role::Key, 128, 3.25),
            ("int2-g32", Role::Key, 64, 3.0),
            ("int8", Role::Key, 128, 8.5),
            ("int8", Role::Key, 256, 8.5),
            ("int8", Role::Value, 128, 8.125),
            ("int8", Role::Value, 256, 8.0625),
        ];
        for (name, role, d, bits) in cases {
            let c = codec(name, role, d);
            assert_eq!(c.bits_per_element(), bits, "{name} {role:?} {d}");
        }
        assert_eq!(codec("int3-g32", Role::Key, 128).block_bytes(), 4 * 4 + 48);
    }

    #[test]
    fn group_must_divide_head_dim() {
        assert!(matches!(
            IntCodec::new(4, 128, 64),
            Err(CodecError::UnsupportedHeadDim { .. })
        ));
        assert!(matches!(
            IntCodec::new(4, 32, 100),
            Err(CodecError::UnsupportedHeadDim { .. })
        ));
    }

    #[test]
    fn hand_worked_int2_row() {
        // One group of 32: values 0..=3 repeating plus min 0, max 3 → scale 1, min 0, codes = x.
        let c = IntCodec::new(2, 32, 32).unwrap();
        let row: Vec<f32> = (0..32).map(|i| (i % 4) as f32).collect();
        let mut block = vec![0u8; c.block_bytes()];
        c.encode(&row, &mut block).unwrap();
        // scale 1.0 = 0x3C00, min 0; codes 0,1,2,3 → 0b11_10_01_00 = 0xE4 per byte.
        let mut expected = vec![0x00, 0x3C, 0x00, 0x00];
        expected.extend([0xE4; 8]);
        assert_eq!(block, expected);
    }

    #[test]
    fn out_of_f16_range_is_rejected() {
        let c = IntCodec::new(4, 32, 32).unwrap();
        let mut row = vec![1.0f32; 32];
        row[7] = -1e6;
        let mut block = vec![0u8; c.block_bytes()];
        assert_eq!(
            c.encode(&row, &mut block),
            Err(CodecError::NonFinite {
                row: 0,
                channel: 7,
                value: -1e6
            })
        );
    }

    /// Every element is within half a step (the stored scale) of its reconstruction.
    fn assert_half_step(c: &IntCodec, rows: &[f32]) -> Result<(), TestCaseError> {
        let mut block = vec![0u8; c.block_bytes()];
        c.encode(rows, &mut block).unwrap();
        let mut back = vec![0.0; rows.len()];
        c.decode(&block, &mut back);
        let d = c.head_dim;
        for (i, (&x, &y)) in rows.iter().zip(&back).enumerate() {
            let g = match c.grouping {
                Grouping::PerToken { group } => (i % d) / group,
                Grouping::PerChannel { .. } => i % d,
            };
            let step = c.affine(&block, g).scale;
            let slack = 4.0 * f32::EPSILON * (x.abs() + y.abs()) + 1e-5 * step;
            prop_assert!(
                (x - y).abs() <= step / 2.0 + slack,
                "{}: element {i}: {x} → {y}, step {step}",
                c.name
            );
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn int_groups_stay_within_half_a_step(
            bits in 2u8..=4,
            group in prop::sample::select(vec![32usize, 64, 128]),
            offset in -1000.0f32..1000.0,
            spread in prop::sample::select(vec![1e-6f32, 1e-3, 1.0, 100.0]),
            raw in prop::collection::vec(-1.0f32..1.0, 128),
        ) {
            let c = IntCodec::new(bits, group, 128).unwrap();
            let rows: Vec<f32> = raw.iter().map(|v| offset + spread * v).collect();
            assert_half_step(&c, &rows)?;
        }

        #[test]
        fn int8_stays_within_half_a_step(
            key in any::<bool>(),
            spread in prop::sample::select(vec![1e-6f32, 1.0, 3e4]),
            raw in prop::collection::vec(-1.0f32..1.0, 32 * 64),
        ) {
            let role = if key { Role::Key } else { Role::Value };
            let c = IntCodec::int8(role, 64).unwrap();
            let rows: Vec<f32> = raw[..c.block_tokens() * 64].iter().map(|v| spread * v).collect();
            assert_half_step(&c, &rows)?;
        }
    }
}
