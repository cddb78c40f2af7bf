//! TurboQuant (Zandieh et al., arXiv 2504.19874; methods.md §2): a random rotation, then an
//! independent Lloyd-Max scalar quantizer per rotated coordinate.
//!
//! * `turbo2`, `turbo2.5`, `turbo3`, `turbo3.5`, `turbo4` — **TurboQuant-mse** (Algorithm 1):
//!   `n = ‖x‖`, `y = Π·(x/n)`, `idx_j` = nearest centroid of the [`sphere_codebook`] for `y_j`;
//!   stored: the indices and `n`. Decoding is `x̃ = n·Πᵀ c[idx]`.
//! * `turbo2-prod`, `turbo3-prod`, `turbo4-prod` — **TurboQuant-prod** (Algorithm 2): a
//!   `(b−1)`-bit mse stage on `u = x/n`, then the residual `r = u − Πᵀc[idx]` is sketched by one
//!   QJL bit per coordinate, `qjl = sign(S·r)` with `S` a `d × d` matrix of i.i.d. N(0,1), and
//!   `n·γ`, `γ = ‖r‖`, is stored. `x̃ = n·(Πᵀc[idx] + √(π/2)/d·γ·Sᵀqjl)`, and the inner-product estimate
//!   `⟨q, x̃⟩ = n·(⟨Πq, c[idx]⟩ + √(π/2)/d·γ·⟨Sq, qjl⟩)` is unbiased over the draw of `S`.
//!
//! `Π` is the dense Haar rotation (QR of a Gaussian matrix, as in the paper) unless
//! [`TurboCodec::new`] asks for [`RotationKind::Hadamard`]. `Π` and `S` come from the codec's
//! `seed` (ChaCha20, stream = part number for `Π`, a separate stream for `S`).
//!
//! ## Attention on the encoded rows
//! [`Codec::prepare_query`] rotates the query once per step (`Πq`, followed by `Sq` for prod, so
//! [`Codec::query_len`] is `2d` for prod); [`Codec::score`] is then a codebook gather-dot over the
//! packed indices times the stored norm (plus a ±1 dot times `n·γ` for prod) — no key is ever
//! rotated back. [`Codec::accumulate`] sums `w·n·c[idx]` in the rotated space (and `w·n·γ·qjl`
//! in the sketch space for prod: [`Codec::accumulator_len`] is `2d`), and [`Codec::finish`]
//! applies `Πᵀ` (and `√(π/2)/d·Sᵀ`) once.
//!
//! ## Fractional rates (2.5 and 3.5 bits)
//! The paper (§4.3) splits channels into an outlier set quantized with one more bit and a regular
//! set, with two independent TurboQuant instances. Its 2.5-bit example is wrong: 32 channels at
//! 3 bits plus 96 at 2 bits is (96 + 192)/128 = **2.25** bits, not 2.5 (methods.md §2.5). Here
//! the split is always **half the channels at `b+1` bits and half at `b` bits**, which is exactly
//! `b + 0.5` index bits per element:
//! * with [`Calibration::outlier_channels`] (original-space channels, most extreme first): the
//!   first `d/2` listed channels — padded, if the list is shorter, with the unlisted channels in
//!   increasing order — form the high set. Each set is its own TurboQuant instance with its own
//!   rotation of `R^{d/2}`, its own norm, and codebooks for the `d/2`-sphere. The sets are fixed
//!   per layer, so no per-vector index bits are stored; the cost is a second norm.
//! * without it: one instance over all channels, and the **rotated** coordinates (exchangeable
//!   after a random rotation) `0..d/2` get `b+1` bits and `d/2..d` get `b` bits.
//!
//! ## Channel scales
//! With [`Calibration::channel_scales`] `s` (this model's keys have a few channels with 5–62×
//! the median RMS, design.md §5), each row is divided by `s` channel-wise before the norm and the
//! rotation. Scores fold `s` into the prepared query (`q·k = (q∘s)·(k/s)`), and values are
//! multiplied back by `s` in [`Codec::finish`] and [`Codec::decode`].
//!
//! ## Block layout (one token per block, little-endian)
//! For each instance (one, or two for calibrated fractional rates, high set first):
//! `[norm: f16][indices of coordinates 0..: packed LSB-first, see `bits`]` — for fractional
//! uncalibrated rates the `d/2` indices of `b+1` bits come first, then the `d/2` of `b` bits.
//! Prod appends `[n·γ: f16][d QJL sign bits, 1 = +1]` (the norm times `γ`, rounded once, so that
//! the signs are a run with one scale like the indices). Norms and `n·γ` are stored as **f16**; a row
//! whose norm overflows f16 (> 65504 after channel scaling) is rejected as non-finite.
//!
//! Exact bits per element (`head_dim` must be a multiple of 16, so every field is whole bytes):
//!
//! | scheme | formula | d = 64 | d = 128 | d = 256 |
//! |---|---|---|---|---|
//! | `turboB` (B = 2, 3, 4) | `B + 16/d` | B + 0.25 | B + 0.125 | B + 0.0625 |
//! | `turboB.5`, no calibration | `B.5 + 16/d` | B.5 + 0.25 | B.5 + 0.125 | B.5 + 0.0625 |
//! | `turboB.5`, outlier channels | `B.5 + 32/d` | B.5 + 0.5 | B.5 + 0.25 | B.5 + 0.125 |
//! | `turboB-prod` | `B + 32/d` | B + 0.5 | B + 0.25 | B + 0.125 |

use crate::bits;
use crate::levels::{self, CodeLayout, LevelFormat, LevelSegment, LevelTable, MapLayout};
use crate::lloyd_max::{sphere_codebook, Codebook};
use crate::rotation::{gaussian_matrix, seeded_rng, Rotation, RotationKind};
use crate::simd::{self, Ahead};
use crate::{check_finite, Calibration, Codec, CodecError};
use half::f16;
use std::sync::Arc;

/// Stream of the seed's generator that draws the QJL matrix `S` (rotations use streams 0, 1).
const QJL_STREAM: u64 = 1 << 32;

/// Which TurboQuant quantizer a [`TurboCodec`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TurboVariant {
    /// TurboQuant-mse at `half_bits / 2` bits per coordinate (`half_bits` in 2..=8, so 1 to 4
    /// bits; odd values are the fractional rates).
    Mse {
        /// Twice the index bits per coordinate.
        half_bits: u8,
    },
    /// TurboQuant-prod at `bits` bits per coordinate (2..=4): `bits − 1` mse bits + 1 QJL bit.
    Prod {
        /// Index plus sign bits per coordinate.
        bits: u8,
    },
}

/// TurboQuant-mse or TurboQuant-prod for one head size (see the module documentation).
pub struct TurboCodec {
    name: String,
    head_dim: usize,
    parts: Vec<Part>,
    qjl: Option<Qjl>,
    channel_scales: Option<Vec<f32>>,
    block_bytes: usize,
    /// The rows as 8-bit levels, for the single-codebook variants without QJL.
    levels: Option<LevelFormat>,
    /// The runs of one codebook each as 8-bit levels, for the fractional rates, and for prod
    /// its index runs and the QJL signs (empty unless every run is supported).
    segments: Vec<LevelSegment>,
}

/// One TurboQuant instance over a set of channels.
struct Part {
    /// Original channel of each of this instance's input coordinates.
    channels: Vec<usize>,
    rotation: Rotation,
    /// Byte offset of the f16 norm within a row.
    norm_offset: usize,
    /// Where this instance's rotated coordinates start in the prepared query and accumulator.
    coord_offset: usize,
    segments: Vec<Segment>,
}

/// A run of rotated coordinates that share one codebook.
struct Segment {
    /// First rotated coordinate (within the part).
    first: usize,
    /// Number of coordinates (a multiple of 8).
    len: usize,
    codebook: Arc<Codebook>,
    /// The codebook's centroids, padded with zeros to 16 entries (the vector kernels' table).
    lut: [f32; 16],
    /// Byte offset of the packed indices within a row.
    byte_offset: usize,
}

/// The QJL stage of TurboQuant-prod.
struct Qjl {
    /// Row-major `d × d` matrix `S` with i.i.d. N(0,1) entries.
    sketch: Vec<f32>,
    /// Byte offset of the f16 QJL weight `n·γ` (the row's stored norm times `γ = ‖r‖`).
    gamma_offset: usize,
    /// Byte offset of the `d` packed sign bits within a row.
    signs_offset: usize,
}

impl Qjl {
    /// The weight of a row's QJL signs: `n·γ`, the row's norm times its residual's norm.
    fn weight(&self, row: &[u8]) -> f32 {
        read_f16(row, self.gamma_offset)
    }

    /// `outs[h] = S·xs[h]`, the sketch read once for all of them by the group kernel (a scalar
    /// sum per coordinate took ~14 µs per head at `d = 128`, as long as 1K rows of a 3-bit
    /// cache's attention).
    fn sketch(&self, xs: &[&[f32]], outs: &mut [&mut [f32]]) {
        let rows = simd::f32_bytes(&self.sketch);
        simd::dot_rows_group(simd::RowFormat::F32, xs, rows, outs, &mut Ahead::none());
    }

    /// `outs[h] += Sᵀ·ys[h]`, the sketch read once for all of them.
    fn add_transposed(&self, ys: &[&[f32]], outs: &mut [&mut [f32]]) {
        let rows = simd::f32_bytes(&self.sketch);
        simd::axpy_rows_group(simd::RowFormat::F32, ys, rows, outs, &mut Ahead::none());
    }
}

impl Segment {
    fn bits(&self) -> u32 {
        self.codebook.bits()
    }

    fn packed<'a>(&self, row: &'a [u8]) -> &'a [u8] {
        &row[self.byte_offset..self.byte_offset + bits::packed_len(self.len, self.bits())]
    }
}

/// The levels of a QJL sign bit (0 → −1, 1 → +1) as a lookup table.
const SIGN_LEVELS: [f32; 16] = {
    let mut levels = [0.0f32; 16];
    levels[0] = -1.0;
    levels[1] = 1.0;
    levels
};

fn read_f16(row: &[u8], offset: usize) -> f32 {
    f16::from_le_bytes([row[offset], row[offset + 1]]).to_f32()
}

/// Writes `value` as f16, or reports the channel it came from when f16 cannot hold it.
fn write_f16(row: &mut [u8], offset: usize, value: f32, channel: usize) -> Result<(), CodecError> {
    let h = f16::from_f32(value);
    if !h.is_finite() {
        return Err(CodecError::NonFinite {
            row: 0,
            channel,
            value: h.to_f32(),
        });
    }
    row[offset..offset + 2].copy_from_slice(&h.to_le_bytes());
    Ok(())
}

fn norm64(v: &[f32]) -> f64 {
    v.iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt()
}

fn norm(v: &[f32]) -> f32 {
    norm64(v) as f32
}

fn invalid(scheme: &str, why: String) -> CodecError {
    CodecError::InvalidCalibration {
        scheme: scheme.to_string(),
        why,
    }
}

impl TurboCodec {
    /// TurboQuant-mse at `half_bits / 2` bits (2..=8; `turbo2` … `turbo4` use 4..=8, and 2 gives
    /// the 1-bit quantizer of the paper's bias analysis) with the dense rotation. Uses the
    /// outlier channels (fractional rates) and channel scales of `calibration` when present.
    pub fn mse(
        half_bits: u8,
        head_dim: usize,
        seed: u64,
        calibration: &Calibration,
    ) -> Result<Self, CodecError> {
        Self::new(
            TurboVariant::Mse { half_bits },
            head_dim,
            seed,
            RotationKind::DenseQr,
            calibration,
        )
    }

    /// TurboQuant-prod at `bits` bits (2..=4) with the dense rotation and no calibration.
    pub fn prod(bits: u8, head_dim: usize, seed: u64) -> Result<Self, CodecError> {
        Self::new(
            TurboVariant::Prod { bits },
            head_dim,
            seed,
            RotationKind::DenseQr,
            &Calibration::default(),
        )
    }

    /// Any TurboQuant variant with the chosen rotation. `head_dim` must be a multiple of 16 (and
    /// a power of two for [`RotationKind::Hadamard`]).
    pub fn new(
        variant: TurboVariant,
        head_dim: usize,
        seed: u64,
        rotation: RotationKind,
        calibration: &Calibration,
    ) -> Result<Self, CodecError> {
        let mut name = match variant {
            TurboVariant::Mse { half_bits } if half_bits % 2 == 0 => {
                format!("turbo{}", half_bits / 2)
            }
            TurboVariant::Mse { half_bits } => format!("turbo{}.5", half_bits / 2),
            TurboVariant::Prod { bits } => format!("turbo{bits}-prod"),
        };
        if rotation == RotationKind::Hadamard {
            name.push_str("-hadamard");
        }
        let (index_bits, fractional) = match variant {
            TurboVariant::Mse { half_bits } if (2..=8).contains(&half_bits) => {
                (u32::from(half_bits / 2), half_bits % 2 == 1)
            }
            TurboVariant::Prod { bits } if (2..=4).contains(&bits) => (u32::from(bits) - 1, false),
            _ => {
                return Err(CodecError::UnknownScheme {
                    name,
                    known: crate::scheme_names().join(", "),
                })
            }
        };
        let unsupported = |why: &str| CodecError::UnsupportedHeadDim {
            scheme: name.clone(),
            head_dim,
            why: why.to_string(),
        };
        if head_dim == 0 || !head_dim.is_multiple_of(16) {
            return Err(unsupported("TurboQuant needs a multiple of 16"));
        }
        if rotation == RotationKind::Hadamard && !head_dim.is_power_of_two() {
            return Err(unsupported("the Hadamard rotation needs a power of two"));
        }
        let channel_scales = match &calibration.channel_scales {
            Some(s) if s.len() != head_dim => {
                return Err(invalid(
                    &name,
                    format!("{} channel scales for head_dim {head_dim}", s.len()),
                ))
            }
            Some(s) if s.iter().any(|v| !(v.is_finite() && *v > 0.0)) => {
                return Err(invalid(
                    &name,
                    "channel scales must be finite and positive".into(),
                ))
            }
            other => other.clone(),
        };

        // (channels, bits of the first half of its rotated coordinates, bits of the second half)
        let instances: Vec<(Vec<usize>, u32, u32)> =
            match (&calibration.outlier_channels, fractional) {
                (Some(listed), true) => {
                    let high = high_channel_set(listed, head_dim).map_err(|e| invalid(&name, e))?;
                    let low = (0..head_dim).filter(|c| !high.contains(c)).collect();
                    vec![
                        (high, index_bits + 1, index_bits + 1),
                        (low, index_bits, index_bits),
                    ]
                }
                (_, true) => vec![((0..head_dim).collect(), index_bits + 1, index_bits)],
                (_, false) => vec![((0..head_dim).collect(), index_bits, index_bits)],
            };

        let mut offset = 0;
        let mut parts = Vec::with_capacity(instances.len());
        let mut coord_offset = 0;
        for (number, (channels, first_bits, second_bits)) in instances.into_iter().enumerate() {
            let dim = channels.len();
            let rotation = Rotation::new(rotation, dim, &mut seeded_rng(seed, number as u64))
                .ok_or_else(|| unsupported("the Hadamard rotation needs a power of two"))?;
            let norm_offset = offset;
            offset += 2;
            let halves = if first_bits == second_bits {
                vec![(0, dim, first_bits)]
            } else {
                vec![(0, dim / 2, first_bits), (dim / 2, dim / 2, second_bits)]
            };
            let segments = halves
                .into_iter()
                .map(|(first, len, bits)| {
                    let codebook = sphere_codebook(dim, bits);
                    let mut lut = [0.0f32; 16];
                    lut[..codebook.centroids().len()].copy_from_slice(codebook.centroids());
                    let segment = Segment {
                        first,
                        len,
                        codebook,
                        lut,
                        byte_offset: offset,
                    };
                    offset += bits::packed_len(len, bits);
                    segment
                })
                .collect();
            parts.push(Part {
                channels,
                rotation,
                norm_offset,
                coord_offset,
                segments,
            });
            coord_offset += dim;
        }
        debug_assert_eq!(coord_offset, head_dim);
        let qjl = matches!(variant, TurboVariant::Prod { .. }).then(|| {
            let qjl = Qjl {
                sketch: gaussian_matrix(head_dim, head_dim, &mut seeded_rng(seed, QJL_STREAM)),
                gamma_offset: offset,
                signs_offset: offset + 2,
            };
            offset += 2 + bits::packed_len(head_dim, 1);
            qjl
        });
        // Each run of one codebook: its codes as i8 table levels under the part's norm; for
        // prod, the QJL signs (levels ±1) under the QJL weight, over the sketch coordinates.
        let qjl_run = qjl.as_ref().map(|qjl| LevelSegment {
            first: head_dim,
            format: LevelFormat {
                row_bytes: offset,
                width: head_dim,
                codes: CodeLayout::Packed {
                    at: qjl.signs_offset,
                    bits: 1,
                },
                maps: MapLayout {
                    channels: head_dim,
                    scale_at: qjl.gamma_offset,
                    stride: 0,
                    min_at: None,
                    zero: 128.0,
                },
                table: Some(LevelTable::nearest(&SIGN_LEVELS[..2])),
            },
        });
        let runs: Vec<LevelSegment> = parts
            .iter()
            .flat_map(|part| {
                part.segments.iter().map(move |seg| LevelSegment {
                    first: part.coord_offset + seg.first,
                    format: LevelFormat {
                        row_bytes: offset,
                        width: seg.len,
                        codes: CodeLayout::Packed {
                            at: seg.byte_offset,
                            bits: seg.bits(),
                        },
                        maps: MapLayout {
                            channels: seg.len,
                            scale_at: part.norm_offset,
                            stride: 0,
                            min_at: None,
                            zero: 128.0,
                        },
                        table: Some(LevelTable::nearest(seg.codebook.centroids())),
                    },
                })
            })
            .chain(qjl_run)
            .collect();
        let usable = runs.iter().all(|r| r.format.supported());
        let (levels, segments) = match &runs[..] {
            [run] if usable => (Some(run.format), Vec::new()),
            _ if usable => (None, runs),
            _ => (None, Vec::new()),
        };
        Ok(Self {
            name,
            head_dim,
            parts,
            qjl,
            channel_scales,
            block_bytes: offset,
            levels,
            segments,
        })
    }

    /// `√(π/2)/d`, the QJL estimator's scale. The prepared query carries it on the score side,
    /// [`Codec::finish`] on the value side.
    fn qjl_scale(&self) -> f32 {
        (std::f32::consts::FRAC_PI_2).sqrt() / self.head_dim as f32
    }
}

/// The high set of a calibrated fractional rate: the first `d/2` distinct listed channels,
/// padded with unlisted channels in increasing order, sorted.
fn high_channel_set(listed: &[usize], head_dim: usize) -> Result<Vec<usize>, String> {
    let mut seen = vec![false; head_dim];
    for &c in listed {
        if c >= head_dim {
            return Err(format!("outlier channel {c} ≥ head_dim {head_dim}"));
        }
        if std::mem::replace(&mut seen[c], true) {
            return Err(format!("outlier channel {c} listed twice"));
        }
    }
    let mut high: Vec<usize> = listed
        .iter()
        .copied()
        .chain((0..head_dim).filter(|&c| !seen[c]))
        .take(head_dim / 2)
        .collect();
    high.sort_unstable();
    Ok(high)
}

impl Codec for TurboCodec {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn block_tokens(&self) -> usize {
        1
    }

    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        check_finite(rows, self.head_dim)?;
        let scaled: Vec<f32> = match &self.channel_scales {
            Some(s) => rows.iter().zip(s).map(|(x, s)| x / s).collect(),
            None => rows.to_vec(),
        };
        // Rotated-space residual `y − c[idx]` of the (single) instance, for the QJL stage.
        let mut residual = Vec::new();
        for part in &self.parts {
            let dim = part.channels.len();
            let v: Vec<f32> = part.channels.iter().map(|&c| scaled[c]).collect();
            let n = norm(&v);
            let largest = part.channels[(0..dim)
                .max_by(|&a, &b| v[a].abs().total_cmp(&v[b].abs()))
                .unwrap_or(0)];
            write_f16(out, part.norm_offset, n, largest)?;
            // Divide in f64: the norm of a row of subnormals has no finite f32 inverse.
            let n64 = norm64(&v);
            let unit: Vec<f32> = v
                .iter()
                .map(|&x| {
                    if n64 > 0.0 {
                        (f64::from(x) / n64) as f32
                    } else {
                        0.0
                    }
                })
                .collect();
            let mut y = vec![0f32; dim];
            part.rotation.apply(&unit, &mut y);
            for seg in &part.segments {
                let coords = &mut y[seg.first..seg.first + seg.len];
                let codes: Vec<u8> = coords.iter().map(|&c| seg.codebook.index_of(c)).collect();
                let packed_len = bits::packed_len(seg.len, seg.bits());
                bits::pack(
                    &codes,
                    seg.bits(),
                    &mut out[seg.byte_offset..seg.byte_offset + packed_len],
                );
                for (c, code) in coords.iter_mut().zip(codes) {
                    *c -= seg.codebook.centroids()[usize::from(code)];
                }
            }
            residual = y;
        }
        if let Some(qjl) = &self.qjl {
            let d = self.head_dim;
            let mut r = vec![0f32; d];
            self.parts[0].rotation.apply_transpose(&residual, &mut r);
            let weight = read_f16(out, self.parts[0].norm_offset) * norm(&r);
            write_f16(out, qjl.gamma_offset, weight, 0)?;
            let mut sketched = vec![0f32; d];
            qjl.sketch(&[&r], &mut [&mut sketched]);
            let signs: Vec<u8> = sketched.iter().map(|&x| u8::from(x >= 0.0)).collect();
            bits::pack(
                &signs,
                1,
                &mut out[qjl.signs_offset..qjl.signs_offset + bits::packed_len(d, 1)],
            );
        }
        Ok(())
    }

    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        let mut acc = vec![0f32; self.accumulator_len()];
        self.accumulate(&[1.0], block, &mut acc);
        self.finish(&acc, rows);
    }

    /// The rotated query, the QJL sketch of the prod variants, and the i8 form of the rotated
    /// query where the integer kernels apply.
    fn query_len(&self) -> usize {
        self.accumulator_len()
            + self.levels.map_or(0, |f| levels::query_slots(f.width))
            + levels::segment_query_slots(&self.segments)
    }

    fn prepare_query(&self, query: &[f32], prepared: &mut [f32]) {
        self.prepare_queries(query, prepared);
    }

    /// Each part's rotation is read once for all the queries.
    fn prepare_queries(&self, queries: &[f32], prepared: &mut [f32]) {
        let (d, len) = (self.head_dim, self.query_len());
        let scaled: Vec<f32> = match &self.channel_scales {
            Some(s) => queries
                .chunks_exact(d)
                .flat_map(|q| q.iter().zip(s).map(|(q, s)| q * s))
                .collect(),
            None => queries.to_vec(),
        };
        for part in &self.parts {
            let dim = part.channels.len();
            let gathered: Vec<f32> = scaled
                .chunks_exact(d)
                .flat_map(|q| part.channels.iter().map(|&c| q[c]))
                .collect();
            let xs: Vec<&[f32]> = gathered.chunks_exact(dim).collect();
            let mut outs: Vec<&mut [f32]> = prepared
                .chunks_exact_mut(len)
                .map(|p| &mut p[part.coord_offset..part.coord_offset + dim])
                .collect();
            part.rotation.apply_group(&xs, &mut outs);
        }
        if let Some(qjl) = &self.qjl {
            let xs: Vec<&[f32]> = scaled.chunks_exact(d).collect();
            let mut outs: Vec<&mut [f32]> = prepared
                .chunks_exact_mut(len)
                .map(|p| &mut p[d..2 * d])
                .collect();
            qjl.sketch(&xs, &mut outs);
            let scale = self.qjl_scale();
            outs.iter_mut()
                .flat_map(|o| o.iter_mut())
                .for_each(|p| *p *= scale);
        }
        for prepared in prepared.chunks_exact_mut(len) {
            if let Some(format) = &self.levels {
                levels::finish_query(format, prepared);
            }
            if !self.segments.is_empty() {
                levels::finish_segment_query(&self.segments, prepared);
            }
        }
    }

    fn level_format(&self) -> Option<LevelFormat> {
        self.levels
    }

    fn level_segments(&self) -> &[LevelSegment] {
        &self.segments
    }

    fn score(&self, prepared_query: &[f32], blocks: &[u8], scores: &mut [f32]) {
        let d = self.head_dim;
        for (row, score) in blocks.chunks_exact(self.block_bytes).zip(scores) {
            let mut total = 0.0f32;
            for part in &self.parts {
                let mut dot = 0.0f32;
                for seg in &part.segments {
                    let q = &prepared_query[part.coord_offset + seg.first..][..seg.len];
                    dot += simd::dot_lut(seg.packed(row), seg.bits(), &seg.lut, q);
                }
                total += read_f16(row, part.norm_offset) * dot;
            }
            if let Some(qjl) = &self.qjl {
                let sketched = &prepared_query[d..2 * d];
                let signs = &row[qjl.signs_offset..qjl.signs_offset + bits::packed_len(d, 1)];
                let dot = simd::dot_lut(signs, 1, &SIGN_LEVELS, sketched);
                total += qjl.weight(row) * dot;
            }
            *score = total;
        }
    }

    /// Rotated coordinates (`norm·centroid` per part) and, for the QJL variant, the signs
    /// times the residual's weight.
    fn working_len(&self) -> usize {
        self.accumulator_len()
    }

    fn decode_working(&self, blocks: &[u8], rows: &mut [f32]) {
        let (d, width) = (self.head_dim, self.working_len());
        for part in &self.parts {
            for seg in &part.segments {
                let run = simd::CodeRun {
                    row_bytes: self.block_bytes,
                    codes_at: seg.byte_offset,
                    len: seg.len,
                    bits: seg.bits(),
                    group: seg.len,
                    params: simd::GroupParams::Scale {
                        at: part.norm_offset,
                    },
                };
                let at = part.coord_offset + seg.first;
                simd::decode_rows(blocks, &run, Some(&seg.lut), rows, width, at);
            }
        }
        if let Some(qjl) = &self.qjl {
            for (row, out) in blocks
                .chunks_exact(self.block_bytes)
                .zip(rows.chunks_exact_mut(width))
            {
                let signs = &row[qjl.signs_offset..qjl.signs_offset + bits::packed_len(d, 1)];
                let weight = qjl.weight(row);
                simd::decode_lut(signs, 1, &SIGN_LEVELS, weight, &mut out[d..2 * d]);
            }
        }
    }

    fn accumulator_len(&self) -> usize {
        if self.qjl.is_some() {
            2 * self.head_dim
        } else {
            self.head_dim
        }
    }

    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]) {
        let d = self.head_dim;
        for (row, &w) in blocks.chunks_exact(self.block_bytes).zip(weights) {
            for part in &self.parts {
                let scaled_weight = w * read_f16(row, part.norm_offset);
                for seg in &part.segments {
                    let a = &mut acc[part.coord_offset + seg.first..][..seg.len];
                    simd::axpy_lut(seg.packed(row), seg.bits(), &seg.lut, scaled_weight, a);
                }
            }
            if let Some(qjl) = &self.qjl {
                let g = w * qjl.weight(row);
                let signs = &row[qjl.signs_offset..qjl.signs_offset + bits::packed_len(d, 1)];
                simd::axpy_lut(signs, 1, &SIGN_LEVELS, g, &mut acc[d..2 * d]);
            }
        }
    }

    fn finish(&self, acc: &[f32], out: &mut [f32]) {
        self.finish_group(&[acc], &mut [out]);
    }

    /// Each part's rotation is read once for all the accumulators.
    fn finish_group(&self, accs: &[&[f32]], outs: &mut [&mut [f32]]) {
        let d = self.head_dim;
        for part in &self.parts {
            let dim = part.channels.len();
            let ys: Vec<&[f32]> = accs
                .iter()
                .map(|acc| &acc[part.coord_offset..part.coord_offset + dim])
                .collect();
            let mut unrotated = vec![0f32; accs.len() * dim];
            let mut rows: Vec<&mut [f32]> = unrotated.chunks_exact_mut(dim).collect();
            part.rotation.apply_transpose_group(&ys, &mut rows);
            for (out, row) in outs.iter_mut().zip(unrotated.chunks_exact(dim)) {
                for (&c, &v) in part.channels.iter().zip(row) {
                    out[c] = v;
                }
            }
        }
        if let Some(qjl) = &self.qjl {
            let scale = self.qjl_scale();
            // The sums of the signs' weights, in the sketch's coordinates.
            let sketched: Vec<Vec<f32>> = accs
                .iter()
                .map(|acc| acc[d..2 * d].iter().map(|a| a * scale).collect())
                .collect();
            let ys: Vec<&[f32]> = sketched.iter().map(Vec::as_slice).collect();
            qjl.add_transposed(&ys, outs);
        }
        if let Some(scales) = &self.channel_scales {
            for out in outs.iter_mut() {
                for (o, s) in out.iter_mut().zip(scales) {
                    *o *= s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;
    use rand_distr::StandardNormal;

    /// Rows with a spread of norms and one strong channel, like real keys.
    fn sample_rows(count: usize, head_dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = seeded_rng(seed, 99);
        (0..count * head_dim)
            .map(|i| {
                let g: f32 = rng.sample(StandardNormal);
                let strong = if i % head_dim == 3 { 12.0 } else { 1.0 };
                g * strong * (1.0 + (i / head_dim) as f32)
            })
            .collect()
    }

    fn encode_all(codec: &dyn Codec, rows: &[f32]) -> Vec<u8> {
        let d = codec.head_dim();
        let mut blocks = vec![0u8; rows.len() / d * codec.block_bytes()];
        for (row, block) in rows
            .chunks_exact(d)
            .zip(blocks.chunks_exact_mut(codec.block_bytes()))
        {
            codec.encode(row, block).unwrap();
        }
        blocks
    }

    fn every_variant(head_dim: usize) -> Vec<TurboCodec> {
        let outliers = Calibration {
            outlier_channels: Some(vec![3, 1, head_dim - 1]),
            ..Calibration::default()
        };
        let scales = Calibration {
            channel_scales: Some((0..head_dim).map(|c| 0.5 + (c % 7) as f32).collect()),
            ..Calibration::default()
        };
        let none = Calibration::default();
        let mut codecs: Vec<TurboCodec> = (2..=8)
            .map(|h| TurboCodec::mse(h, head_dim, 5, &none).unwrap())
            .collect();
        codecs.extend((2..=4).map(|b| TurboCodec::prod(b, head_dim, 5).unwrap()));
        for h in [5, 7] {
            codecs.push(TurboCodec::mse(h, head_dim, 5, &outliers).unwrap());
        }
        codecs.push(TurboCodec::mse(6, head_dim, 5, &scales).unwrap());
        for variant in [
            TurboVariant::Mse { half_bits: 7 },
            TurboVariant::Prod { bits: 3 },
        ] {
            codecs.push(
                TurboCodec::new(variant, head_dim, 5, RotationKind::Hadamard, &scales).unwrap(),
            );
        }
        codecs
    }

    #[test]
    fn fused_score_and_accumulate_match_decode_then_dot() {
        for head_dim in [64, 128, 256] {
            let rows = sample_rows(5, head_dim, 1);
            let query: Vec<f32> = sample_rows(1, head_dim, 2);
            let weights = [0.1f32, -0.7, 0.3, 0.25, 1.5];
            for codec in every_variant(head_dim) {
                let blocks = encode_all(&codec, &rows);
                let mut prepared = vec![0f32; codec.query_len()];
                codec.prepare_query(&query, &mut prepared);
                let mut scores = [0f32; 5];
                codec.score(&prepared, &blocks, &mut scores);
                let mut acc = vec![0f32; codec.accumulator_len()];
                codec.accumulate(&weights, &blocks, &mut acc);
                let mut fused_sum = vec![0f32; head_dim];
                codec.finish(&acc, &mut fused_sum);

                let mut reference_sum = vec![0f32; head_dim];
                for (t, block) in blocks.chunks_exact(codec.block_bytes()).enumerate() {
                    let mut decoded = vec![0f32; head_dim];
                    codec.decode(block, &mut decoded);
                    let dot: f32 = decoded.iter().zip(&query).map(|(a, b)| a * b).sum();
                    let size = norm(&decoded) * norm(&query);
                    assert!(
                        (scores[t] - dot).abs() <= 1e-5 * size,
                        "{} d={head_dim} row {t}: {} vs {dot}",
                        codec.name(),
                        scores[t]
                    );
                    for (r, v) in reference_sum.iter_mut().zip(&decoded) {
                        *r += weights[t] * v;
                    }
                }
                let size = norm(&reference_sum);
                for (a, b) in fused_sum.iter().zip(&reference_sum) {
                    assert!((a - b).abs() <= 1e-5 * size, "{}", codec.name());
                }
            }
        }
    }

    #[test]
    fn bits_per_element_count_indices_norms_and_gamma() {
        let none = Calibration::default();
        let outliers = Calibration {
            outlier_channels: Some(vec![0]),
            ..Calibration::default()
        };
        for (head_dim, norm_bits) in [(128, 0.125), (256, 0.0625)] {
            for half_bits in 4..=8u8 {
                let rate = f64::from(half_bits) / 2.0;
                let plain = TurboCodec::mse(half_bits, head_dim, 0, &none).unwrap();
                assert_eq!(
                    plain.bits_per_element(),
                    rate + norm_bits,
                    "{}",
                    plain.name()
                );
                let calibrated = TurboCodec::mse(half_bits, head_dim, 0, &outliers).unwrap();
                let norms = if half_bits % 2 == 1 { 2.0 } else { 1.0 };
                assert_eq!(calibrated.bits_per_element(), rate + norms * norm_bits);
            }
            for bits in 2..=4u8 {
                let prod = TurboCodec::prod(bits, head_dim, 0).unwrap();
                assert_eq!(prod.bits_per_element(), f64::from(bits) + 2.0 * norm_bits);
                // The rotated query and its sketch, then the i8 form of each (two runs).
                assert_eq!(
                    prod.query_len(),
                    2 * head_dim + 2 * levels::query_slots(head_dim)
                );
                assert_eq!(prod.accumulator_len(), 2 * head_dim);
            }
        }
        assert_eq!(TurboCodec::mse(5, 128, 0, &none).unwrap().block_bytes(), 42);
        assert_eq!(
            TurboCodec::mse(5, 128, 0, &outliers).unwrap().block_bytes(),
            44
        );
        assert_eq!(TurboCodec::prod(3, 128, 0).unwrap().block_bytes(), 52);
    }

    #[test]
    fn names_follow_the_scheme_table() {
        let none = Calibration::default();
        let names: Vec<String> = (4..=8)
            .map(|h| TurboCodec::mse(h, 64, 0, &none).unwrap().name())
            .chain((2..=4).map(|b| TurboCodec::prod(b, 64, 0).unwrap().name()))
            .collect();
        assert_eq!(
            names,
            [
                "turbo2",
                "turbo2.5",
                "turbo3",
                "turbo3.5",
                "turbo4",
                "turbo2-prod",
                "turbo3-prod",
                "turbo4-prod"
            ]
        );
    }

    #[test]
    fn non_finite_rows_and_norm_overflow_are_rejected() {
        for codec in every_variant(64) {
            let mut out = vec![0u8; codec.block_bytes()];
            let mut row = vec![0.5f32; 64];
            row[5] = f32::NAN;
            assert!(matches!(
                codec.encode(&row, &mut out),
                Err(CodecError::NonFinite {
                    row: 0,
                    channel: 5,
                    ..
                })
            ));
            row[5] = f32::NEG_INFINITY;
            assert!(codec.encode(&row, &mut out).is_err());
            row[5] = 1e6; // finite, but its norm does not fit an f16
            assert!(matches!(
                codec.encode(&row, &mut out),
                Err(CodecError::NonFinite { channel: 5, .. })
            ));
        }
    }

    #[test]
    fn bad_shapes_and_calibration_are_reported() {
        let none = Calibration::default();
        assert!(matches!(
            TurboCodec::mse(6, 72, 0, &none),
            Err(CodecError::UnsupportedHeadDim { .. })
        ));
        assert!(matches!(
            TurboCodec::new(
                TurboVariant::Mse { half_bits: 6 },
                96,
                0,
                RotationKind::Hadamard,
                &none
            ),
            Err(CodecError::UnsupportedHeadDim { .. })
        ));
        assert!(TurboCodec::mse(9, 64, 0, &none).is_err());
        assert!(TurboCodec::prod(5, 64, 0).is_err());
        for bad in [
            Calibration {
                outlier_channels: Some(vec![64]),
                ..Calibration::default()
            },
            Calibration {
                outlier_channels: Some(vec![2, 2]),
                ..Calibration::default()
            },
            Calibration {
                channel_scales: Some(vec![1.0; 63]),
                ..Calibration::default()
            },
            Calibration {
                channel_scales: Some(vec![0.0; 64]),
                ..Calibration::default()
            },
        ] {
            assert!(matches!(
                TurboCodec::mse(5, 64, 0, &bad),
                Err(CodecError::InvalidCalibration { .. })
            ));
        }
    }

    #[test]
    fn same_seed_same_bytes() {
        let rows = sample_rows(1, 128, 3);
        let none = Calibration::default();
        let a = encode_all(&TurboCodec::prod(3, 128, 9).unwrap(), &rows);
        let b = encode_all(&TurboCodec::prod(3, 128, 9).unwrap(), &rows);
        let c = encode_all(&TurboCodec::mse(6, 128, 10, &none).unwrap(), &rows);
        let e = encode_all(&TurboCodec::mse(6, 128, 11, &none).unwrap(), &rows);
        assert_eq!(a, b);
        assert_ne!(c, e);
    }

    #[test]
    fn rows_of_subnormals_encode() {
        for codec in every_variant(64) {
            let mut block = vec![0u8; codec.block_bytes()];
            let row: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 1e-42).collect();
            codec.encode(&row, &mut block).unwrap();
            let mut back = vec![1f32; 64];
            codec.decode(&block, &mut back);
            assert!(back.iter().all(|v| v.abs() < 1e-30), "{}", codec.name());
        }
    }

    #[test]
    fn zero_row_decodes_to_zero() {
        for codec in every_variant(64) {
            let mut block = vec![0u8; codec.block_bytes()];
            codec.encode(&[0.0; 64], &mut block).unwrap();
            let mut back = vec![1f32; 64];
            codec.decode(&block, &mut back);
            assert!(back.iter().all(|&v| v == 0.0), "{}", codec.name());
        }
    }
}
