//! Oaken (ISCA 2025; methods.md §1), the online half: per-layer thresholds profiled offline
//! ([`OakenThresholds`], from [`Calibration::oaken_thresholds`]), per-token scales computed online.
//!
//! ## Groups
//! Each element is classified by threshold compares only ([`OakenThresholds::group_of`]):
//! outer (`x ≤ lo_outer` or `x ≥ hi_outer`, ≈4%), inner (`lo_inner < x < hi_inner`, ≈6%),
//! middle (the rest, ≈90%). The middle and outer groups are **group-shifted**: a value on the
//! low side (`x ≤ lo_inner`, resp. `x ≤ lo_outer`) becomes `x' = x − lo_inner` (resp.
//! `x − lo_outer`), one on the high side `x' = x − hi_inner` (resp. `x − hi_outer`); the branch
//! says which threshold to add back. (The reference code picks the branch by the sign of `x`;
//! that is the same whenever `lo_inner < 0 < hi_inner`, and the side rule stays exact otherwise.)
//!
//! * **middle — 4 bits.** Per token, `lo = min(0, min x')` and `hi = max(0, max x')` (f16,
//!   rounded outward so they always cover the values). The 16 codes form a uniform mid-rise grid
//!   whose zero crossing is a code boundary: codes `< z` are the low branch, codes `≥ z` the high
//!   branch, level `(q − z + ½)·step`, with `z = clamp(round(16·(−lo)/(hi − lo)), 1, 15)` and
//!   `step = max(−lo/z, hi/(16 − z))` (≤ the 15-step asymmetric grid's step when both branches are
//!   present). Putting the branch in the code keeps every middle error within `step/2`; a plain
//!   asymmetric grid would reconstruct values next to the inner band on the wrong side of it.
//! * **outer and inner — 5 bits = sign + 4-bit magnitude.** The magnitude (`|x'|` for outer,
//!   `|x|` for inner) is quantized on `q·M/15`, `q = 0..15`, with `M` the token's largest
//!   magnitude in that group (f16, rounded up); the sign bit is the branch (outer) or the sign
//!   (inner). Error ≤ `M/30`.
//!
//! ## Fused dense-and-sparse layout (one token per block)
//! ```text
//! bytes 0..8            f16 middle lo, f16 middle hi, f16 outer M, f16 inner M
//! next  S = ⌈d/64⌉      u8 per 64-element span: number of sparse entries of that span
//! next  d/2             dense 4-bit codes, element i in byte i/2, low nibble first (bits::pack):
//!                       the middle code, or the outlier's 4-bit magnitude
//! next  K = d/8         sparse entries, sorted by element, one byte each:
//!                       bits 0–5 index within its 64-element span, bit 6 group (1 outer,
//!                       0 inner), bit 7 sign (1 = low branch / negative); unused bytes are 0
//! ```
//! The fixed outlier capacity `K = d/8` (12.5%, against the 10% the thresholds aim at) keeps
//! [`Codec::block_bytes`] fixed. A token with more outliers keeps the outer ones with the largest
//! `|x'|` first, then the inner ones farthest from both inner thresholds. The rest are demoted to
//! the middle group: a demoted outer value stays on its branch and widens the token's middle range
//! (its error is then within half a middle step, like any middle value); a demoted inner value is
//! reconstructed at the middle level next to its nearer inner threshold (error ≤ half the inner
//! band + half a middle step).
//!
//! Exact bits per element, `(8 + S + d/2 + d/8)·8/d`: **6.125** at d = 64 (49 bytes),
//! **5.625** at d = 128 (90 bytes), **5.375** at d = 256 (172 bytes). (The paper's "4.4 bits"
//! counts neither the outliers' dense slots, nor the scales, nor spare capacity.)
//!
//! [`Codec::score`] and [`Codec::accumulate`] work on the bytes: a 16-entry table of middle
//! levels per token, a pass over the dense nibbles, then a correction at each sparse entry.
//! The group kernels of attention do the same with 8-bit integer products where the CPU has
//! AVX-512 VNNI (`OakenCodec::score_vnni`, `OakenCodec::accumulate_vnni`): a middle level is
//! affine in its code but for a jump of `hi_inner − lo_inner` at the zero code, so the dense
//! part is two integer dot products (codes, and flags `code ≥ z`).

use crate::levels::{self, CodeLayout, LevelFormat, MapLayout};
use crate::{check_finite, simd, Calibration, Codec, CodecError, OakenThresholds};
use half::f16;

/// Elements addressed by one sparse entry's 6-bit index.
pub const SPAN: usize = 64;
/// Bytes of per-token scale metadata (four f16).
const META_BYTES: usize = 8;
const GROUP_BIT: u8 = 1 << 6;
const SIGN_BIT: u8 = 1 << 7;

/// Oaken's three magnitude groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OakenGroup {
    /// `x ≤ lo_outer` or `x ≥ hi_outer` (≈4%).
    Outer,
    /// Everything else (≈90%).
    Middle,
    /// `lo_inner < x < hi_inner` (≈6%).
    Inner,
}

impl OakenThresholds {
    /// Profiles thresholds from one layer's K (or V) values, as `oaken_preprocess_activation.py`
    /// does: `lo_outer` and `lo_inner` are the 2% and 47% quantiles with "lower" interpolation,
    /// `hi_inner` and `hi_outer` the 53% and 98% quantiles with "higher" interpolation (rank
    /// `q·(n − 1)` in f64, rounded down resp. up). Reorders `values`.
    ///
    /// Panics if `values` is empty or holds NaN.
    pub fn from_samples(values: &mut [f32]) -> Self {
        assert!(!values.is_empty(), "Oaken thresholds need samples");
        assert!(values.iter().all(|v| !v.is_nan()), "Oaken samples hold NaN");
        let last = (values.len() - 1) as f64;
        let mut at = |rank: f64| -> f32 {
            *values
                .select_nth_unstable_by(rank as usize, f32::total_cmp)
                .1
        };
        Self {
            lo_outer: at((0.02 * last).floor()),
            lo_inner: at((0.47 * last).floor()),
            hi_inner: at((0.53 * last).ceil()),
            hi_outer: at((0.98 * last).ceil()),
        }
    }

    /// The group of `x` (threshold compares only).
    #[inline]
    pub fn group_of(&self, x: f32) -> OakenGroup {
        if x <= self.lo_outer || x >= self.hi_outer {
            OakenGroup::Outer
        } else if x > self.lo_inner && x < self.hi_inner {
            OakenGroup::Inner
        } else {
            OakenGroup::Middle
        }
    }
}

/// Oaken's online quantizer for one layer and role (see the module documentation).
pub struct OakenCodec {
    thresholds: OakenThresholds,
    head_dim: usize,
    outlier_capacity: usize,
}

/// The sizes of an Oaken row that the kernels' loops run over: constants in a kernel
/// instantiated for one head size and capacity ([`OakenCodec::shape`]), so that its loops
/// over spans, chunks and slots unroll.
#[derive(Clone, Copy)]
struct Shape {
    head_dim: usize,
    capacity: usize,
}

impl Shape {
    fn spans(self) -> usize {
        self.head_dim.div_ceil(SPAN)
    }

    fn dense_offset(self) -> usize {
        META_BYTES + self.spans()
    }

    fn sparse_offset(self) -> usize {
        self.dense_offset() + self.head_dim / 2
    }

    fn block_bytes(self) -> usize {
        self.sparse_offset() + self.capacity
    }
}

/// The middle group's grid for one token.
#[derive(Clone, Copy, Debug)]
struct MiddleGrid {
    /// First code of the high branch.
    zero_code: usize,
    step: f32,
}

impl MiddleGrid {
    fn new(lo: f32, hi: f32) -> Self {
        if hi - lo <= 0.0 {
            return Self {
                zero_code: 8,
                step: 0.0,
            };
        }
        let zero_code = round_up_ties(16.0 * -lo / (hi - lo)).clamp(1, 15);
        let step = (-lo / zero_code as f32).max(hi / (16 - zero_code) as f32);
        Self { zero_code, step }
    }

    /// Shifted value of code `q`.
    fn level(&self, q: usize) -> f32 {
        (q as f32 - self.zero_code as f32 + 0.5) * self.step
    }

    /// Code of shifted value `shifted` on the high (`true`) or low branch.
    fn code(&self, shifted: f32, high: bool) -> u8 {
        let steps = |v: f32| {
            if self.step > 0.0 {
                (v / self.step).floor().max(0.0) as usize
            } else {
                0
            }
        };
        let z = self.zero_code;
        let q = if high {
            z + steps(shifted).min(15 - z)
        } else {
            z - 1 - steps(-shifted).min(z - 1)
        };
        q as u8
    }
}

/// How one element is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Slot {
    /// Middle group: shifted value and branch.
    Middle { shifted: f32, high: bool },
    /// Sparse entry: group bit (outer), sign bit, magnitude.
    Outlier {
        outer: bool,
        negative: bool,
        magnitude: f32,
    },
}

/// Per-token tables read from a block's metadata.
struct TokenTables {
    /// Reconstructed value of each middle code (threshold added back).
    middle: [f32; 16],
    outliers: OutlierTable,
}

/// A sparse entry's value is `base[k] + magnitude·step[k]`, `k` its group and sign bits
/// (`entry >> 6`: inner/outer, then positive/negative), without a branch.
struct OutlierTable {
    base: [f32; 4],
    step: [f32; 4],
}

#[inline]
fn f16_at(row: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32()
}

/// `x.round()` for `0 ≤ x < 2²³` without a call to libm (every row's decode computes one).
fn round_up_ties(x: f32) -> usize {
    let whole = x as usize;
    whole + usize::from(x - whole as f32 >= 0.5)
}

/// The grids and outlier steps of 16 rows.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Default)]
struct RowScales {
    /// [`MiddleGrid::zero_code`] of each row.
    zero_codes: [u32; 16],
    /// [`MiddleGrid::step`] of each row.
    steps: [f32; 16],
    /// The outer and inner groups' steps (`M/15`) of each row.
    outlier_steps: [[f32; 16]; 2],
}

#[cfg(target_arch = "x86_64")]
impl RowScales {
    /// Row `r`'s grid.
    fn grid(&self, r: usize) -> MiddleGrid {
        MiddleGrid {
            zero_code: self.zero_codes[r] as usize,
            step: self.steps[r],
        }
    }
}

/// [`MiddleGrid::new`] and the outlier steps of up to 16 rows of `rows` (`block_bytes`
/// apart) at once, with the same operations lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,f16c")]
unsafe fn row_scales(rows: &[u8], block_bytes: usize, scales: &mut RowScales) {
    use std::arch::x86_64::*;
    let n = (rows.len() / block_bytes).min(16);
    // The four f16 of each row's metadata, then each field of the 16 rows as 16 floats.
    let mut meta = [0u64; 16];
    for (r, m) in meta.iter_mut().enumerate().take(n) {
        *m = u64::from_le_bytes(rows[r * block_bytes..][..META_BYTES].try_into().unwrap());
    }
    let halves = [0, 8].map(|r| _mm512_loadu_si512(meta.as_ptr().add(r) as *const _));
    // Fields 0 and 1 (or 2 and 3) of all rows as dwords, then each field's f16 as floats.
    let dwords = |high: bool| {
        let [a, b] = halves
            .map(|h| _mm512_cvtepi64_epi32(if high { _mm512_srli_epi64::<32>(h) } else { h }));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
    };
    let fields = |d: __m512i| {
        [d, _mm512_srli_epi32::<16>(d)].map(|x| _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)))
    };
    let [lo, hi] = fields(dwords(false));
    let [outer, inner] = fields(dwords(true));
    let fifteen = _mm512_set1_ps(15.0);
    let outlier_steps = &mut scales.outlier_steps;
    _mm512_storeu_ps(outlier_steps[0].as_mut_ptr(), _mm512_div_ps(outer, fifteen));
    _mm512_storeu_ps(outlier_steps[1].as_mut_ptr(), _mm512_div_ps(inner, fifteen));
    let zero = _mm512_setzero_ps();
    let negative_lo = _mm512_xor_ps(lo, _mm512_set1_ps(-0.0));
    let width = _mm512_sub_ps(hi, lo);
    // round_up_ties(16·(−lo)/(hi − lo)), clamped to 1..=15.
    let x = _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(16.0), negative_lo), width);
    let whole = _mm512_cvttps_epu32(x);
    let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(
        _mm512_sub_ps(x, _mm512_cvtepu32_ps(whole)),
        _mm512_set1_ps(0.5),
    );
    let rounded = _mm512_mask_add_epi32(whole, up, whole, _mm512_set1_epi32(1));
    let z = _mm512_min_epu32(
        _mm512_max_epu32(rounded, _mm512_set1_epi32(1)),
        _mm512_set1_epi32(15),
    );
    let zf = _mm512_cvtepu32_ps(z);
    let step = _mm512_max_ps(
        _mm512_div_ps(negative_lo, zf),
        _mm512_div_ps(hi, _mm512_sub_ps(_mm512_set1_ps(16.0), zf)),
    );
    // Flat rows: `MiddleGrid::new`'s zero code 8 and step 0.
    let flat = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(width, zero);
    let z = _mm512_mask_mov_epi32(z, flat, _mm512_set1_epi32(8));
    let step = _mm512_mask_mov_ps(step, flat, zero);
    _mm512_storeu_si512(scales.zero_codes.as_mut_ptr() as *mut _, z);
    _mm512_storeu_ps(scales.steps.as_mut_ptr(), step);
}

/// The smallest f16 `≥ x` for `x ≥ 0` (infinite when `x` exceeds f16's range).
fn f16_at_least(x: f32) -> f16 {
    let h = f16::from_f32(x);
    if h.to_f32() < x {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

impl OakenCodec {
    /// Oaken with the thresholds of `calibration` and the default outlier capacity `head_dim/8`.
    pub fn from_calibration(
        calibration: &Calibration,
        head_dim: usize,
    ) -> Result<Self, CodecError> {
        let thresholds =
            calibration
                .oaken_thresholds
                .ok_or_else(|| CodecError::MissingCalibration {
                    scheme: "oaken".into(),
                    what: "per-layer K and V thresholds (OakenThresholds::from_samples over a \
                       profiling run)"
                        .into(),
                })?;
        Self::new(thresholds, head_dim, head_dim / 8)
    }

    /// Oaken with explicit thresholds and a fixed number of sparse entries per token.
    /// `head_dim` must be a positive multiple of 8 and `outlier_capacity ≤ head_dim`.
    pub fn new(
        thresholds: OakenThresholds,
        head_dim: usize,
        outlier_capacity: usize,
    ) -> Result<Self, CodecError> {
        if head_dim == 0 || !head_dim.is_multiple_of(8) || outlier_capacity > head_dim {
            return Err(CodecError::UnsupportedHeadDim {
                scheme: "oaken".into(),
                head_dim,
                why: format!(
                    "needs a positive multiple of 8 and at most head_dim outlier slots \
                     (asked for {outlier_capacity})"
                ),
            });
        }
        let t = thresholds;
        let finite = [t.lo_outer, t.lo_inner, t.hi_inner, t.hi_outer]
            .iter()
            .all(|v| v.is_finite());
        if !(finite
            && t.lo_outer <= t.lo_inner
            && t.lo_inner <= t.hi_inner
            && t.hi_inner <= t.hi_outer)
        {
            return Err(CodecError::InvalidCalibration {
                scheme: "oaken".into(),
                why: format!("thresholds must be finite and ordered lo_outer ≤ lo_inner ≤ hi_inner ≤ hi_outer, got {t:?}"),
            });
        }
        Ok(Self {
            thresholds,
            head_dim,
            outlier_capacity,
        })
    }

    /// Sparse entries per token.
    pub fn outlier_capacity(&self) -> usize {
        self.outlier_capacity
    }

    /// The row's shape: head size `D` and capacity `C` where `D` is not 0 (a kernel
    /// instantiated for that shape, which it must be), else the codec's own.
    #[inline]
    fn shape<const D: usize, const C: usize>(&self) -> Shape {
        if D == 0 {
            Shape {
                head_dim: self.head_dim,
                capacity: self.outlier_capacity,
            }
        } else {
            assert!(self.head_dim == D && self.outlier_capacity == C);
            Shape {
                head_dim: D,
                capacity: C,
            }
        }
    }

    fn dense_offset(&self) -> usize {
        self.shape::<0, 0>().dense_offset()
    }

    fn sparse_offset(&self) -> usize {
        self.shape::<0, 0>().sparse_offset()
    }

    /// How each element of `row` is stored, after the capacity rule.
    fn slots(&self, row: &[f32]) -> Vec<Slot> {
        let t = &self.thresholds;
        let middle = |x: f32| {
            let high = x >= t.hi_inner;
            Slot::Middle {
                shifted: x - if high { t.hi_inner } else { t.lo_inner },
                high,
            }
        };
        let mut slots: Vec<Slot> = row
            .iter()
            .map(|&x| match t.group_of(x) {
                OakenGroup::Middle => middle(x),
                OakenGroup::Outer => {
                    let negative = x <= t.lo_outer;
                    Slot::Outlier {
                        outer: true,
                        negative,
                        magnitude: if negative {
                            t.lo_outer - x
                        } else {
                            x - t.hi_outer
                        },
                    }
                }
                OakenGroup::Inner => Slot::Outlier {
                    outer: false,
                    negative: x < 0.0,
                    magnitude: x.abs(),
                },
            })
            .collect();
        // Priority for the sparse slots: outer by |x'| descending, then inner by distance
        // from the nearer inner threshold, descending.
        let mut outliers: Vec<(bool, f32, usize)> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match *s {
                Slot::Outlier {
                    outer, magnitude, ..
                } => {
                    let x = row[i];
                    let key = if outer {
                        magnitude
                    } else {
                        (x - t.lo_inner).min(t.hi_inner - x)
                    };
                    Some((outer, key, i))
                }
                Slot::Middle { .. } => None,
            })
            .collect();
        if outliers.len() > self.outlier_capacity {
            outliers.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)));
            for &(outer, _, i) in &outliers[self.outlier_capacity..] {
                let x = row[i];
                slots[i] = if outer {
                    middle(x)
                } else {
                    let high = t.hi_inner - x < x - t.lo_inner;
                    Slot::Middle { shifted: 0.0, high }
                };
            }
        }
        slots
    }

    fn tables(&self, row: &[u8]) -> TokenTables {
        let grid = MiddleGrid::new(f16_at(row, 0), f16_at(row, 1));
        let t = &self.thresholds;
        let mut middle = [0f32; 16];
        for (q, m) in middle.iter_mut().enumerate() {
            let threshold = if q >= grid.zero_code {
                t.hi_inner
            } else {
                t.lo_inner
            };
            *m = grid.level(q) + threshold;
        }
        TokenTables {
            middle,
            outliers: self.outlier_table(row),
        }
    }

    fn outlier_table(&self, row: &[u8]) -> OutlierTable {
        self.outlier_steps_table(f16_at(row, 2) / 15.0, f16_at(row, 3) / 15.0)
    }

    /// The outlier table of row `r` of `scales`.
    #[cfg(target_arch = "x86_64")]
    fn scaled_outlier_table(&self, scales: &RowScales, r: usize) -> OutlierTable {
        self.outlier_steps_table(scales.outlier_steps[0][r], scales.outlier_steps[1][r])
    }

    /// The table of a row whose outer and inner steps (`M/15`) are given.
    fn outlier_steps_table(&self, outer_step: f32, inner_step: f32) -> OutlierTable {
        let t = &self.thresholds;
        OutlierTable {
            base: [0.0, t.hi_outer, 0.0, t.lo_outer],
            step: [inner_step, outer_step, -inner_step, -outer_step],
        }
    }

    /// Calls `f(element, dense_code, value)` for each sparse entry of `row`, in element order.
    /// An entry past the row (a corrupt block) is dropped, as the vector paths drop it.
    fn for_each_outlier(
        &self,
        row: &[u8],
        table: &OutlierTable,
        mut f: impl FnMut(usize, u8, f32),
    ) {
        let dense = &row[self.dense_offset()..self.sparse_offset()];
        let mut entries = row[self.sparse_offset()..].iter();
        for (span, &count) in row[META_BYTES..self.dense_offset()].iter().enumerate() {
            for &entry in entries.by_ref().take(usize::from(count)) {
                let i = span * SPAN + usize::from(entry & (GROUP_BIT - 1));
                if i >= self.head_dim {
                    continue;
                }
                let code = (dense[i / 2] >> (4 * (i % 2))) & 15;
                let k = usize::from(entry >> 6);
                f(i, code, table.base[k] + f32::from(code) * table.step[k]);
            }
        }
    }

    /// The 16 middle levels of a row whose grid is `grid`, threshold added back, in one vector
    /// (the same operations as [`MiddleGrid::level`] and [`OakenCodec::tables`]).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn middle_levels(&self, grid: MiddleGrid) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let t = &self.thresholds;
        let codes = _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        );
        let zero_code = _mm512_set1_ps(grid.zero_code as f32);
        let levels = _mm512_mul_ps(
            _mm512_add_ps(_mm512_sub_ps(codes, zero_code), _mm512_set1_ps(0.5)),
            _mm512_set1_ps(grid.step),
        );
        let high = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(codes, zero_code);
        let thresholds =
            _mm512_mask_blend_ps(high, _mm512_set1_ps(t.lo_inner), _mm512_set1_ps(t.hi_inner));
        _mm512_add_ps(levels, thresholds)
    }

    /// [`Codec::decode`] of one row whose grid is `grid`, with AVX-512: the 16 middle levels
    /// in one vector (the same operations as [`MiddleGrid::level`]), the dense nibbles through
    /// it with `vpermps`, then the sparse entries over them.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vl")]
    unsafe fn decode_avx512(
        &self,
        row: &[u8],
        grid: MiddleGrid,
        table: &OutlierTable,
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        assert!(self.head_dim.is_multiple_of(16) && out.len() == self.head_dim);
        let middle = self.middle_levels(grid);
        // Element 2j is the low nibble of dense byte j, 2j + 1 its high nibble.
        let shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
        let dense = row.as_ptr().add(self.dense_offset());
        for j in 0..self.head_dim / 16 {
            let bytes = _mm_loadl_epi64(dense.add(8 * j) as *const __m128i);
            let lanes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes));
            let nibbles = _mm512_and_si512(_mm512_srlv_epi32(lanes, shifts), _mm512_set1_epi32(15));
            let values = _mm512_permutexvar_ps(nibbles, middle);
            _mm512_storeu_ps(out.as_mut_ptr().add(16 * j), values);
        }
        if !self.vector_sparse() {
            self.for_each_outlier(row, table, |i, _, value| out[i] = value);
            return;
        }
        self.for_each_sparse_chunk(
            self.shape::<0, 0>(),
            row,
            table,
            grid,
            |element, value, _, live| {
                _mm512_mask_i32scatter_ps::<4>(out.as_mut_ptr() as *mut _, live, element, value);
            },
        );
    }

    /// [`Codec::decode`] of one row with AVX2: the 16 middle levels in two vectors (the same
    /// operations as [`MiddleGrid::level`] and [`OakenCodec::tables`]), the dense nibbles
    /// through them with `vpermps` and a blend, then the sparse entries over them.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_avx2(&self, row: &[u8], out: &mut [f32]) {
        use std::arch::x86_64::*;
        let d = self.head_dim;
        assert!(d.is_multiple_of(8) && out.len() == d && row.len() >= self.block_bytes());
        // Middle lo and hi, outer and inner M.
        let meta: [f32; 4] =
            std::mem::transmute(_mm_cvtph_ps(_mm_loadl_epi64(row.as_ptr() as *const _)));
        let grid = MiddleGrid::new(meta[0], meta[1]);
        let t = &self.thresholds;
        let zero_code = _mm256_set1_ps(grid.zero_code as f32);
        let levels = |first: f32| {
            let codes = _mm256_add_ps(
                _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
                _mm256_set1_ps(first),
            );
            let shifted = _mm256_mul_ps(
                _mm256_add_ps(_mm256_sub_ps(codes, zero_code), _mm256_set1_ps(0.5)),
                _mm256_set1_ps(grid.step),
            );
            let high = _mm256_cmp_ps::<_CMP_GE_OQ>(codes, zero_code);
            let threshold =
                _mm256_blendv_ps(_mm256_set1_ps(t.lo_inner), _mm256_set1_ps(t.hi_inner), high);
            _mm256_add_ps(shifted, threshold)
        };
        let (low_codes, high_codes) = (levels(0.0), levels(8.0));
        // Element 8k + i is nibble i of dense dword k.
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let dense = row.as_ptr().add(self.dense_offset()) as *const i32;
        for (k, out) in out.chunks_exact_mut(8).enumerate() {
            let word = _mm256_set1_epi32(dense.add(k).read_unaligned());
            let codes = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), _mm256_set1_epi32(15));
            let values = _mm256_blendv_ps(
                _mm256_permutevar8x32_ps(low_codes, codes),
                _mm256_permutevar8x32_ps(high_codes, codes),
                _mm256_castsi256_ps(_mm256_slli_epi32::<28>(codes)),
            );
            _mm256_storeu_ps(out.as_mut_ptr(), values);
        }
        let table = self.outlier_steps_table(meta[2] / 15.0, meta[3] / 15.0);
        self.for_each_outlier(row, &table, |i, _, value| out[i] = value);
    }

    /// Calls `f(elements, values, differences, live lanes)` for the sparse entries of `row`,
    /// 16 at a time ([`Self::vector_sparse`] rows): element `span·64 + index`, its value
    /// `base[k] + code·step[k]` (`code` its dense nibble, `i mod 8` of dense dword `i/8`), and
    /// the value less the middle level of that code on `grid`. Masked
    /// dword loads straight from the row (a copy to the stack first stalled on store
    /// forwarding).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl")]
    unsafe fn for_each_sparse_chunk(
        &self,
        shape: Shape,
        row: &[u8],
        table: &OutlierTable,
        grid: MiddleGrid,
        mut f: impl FnMut(
            std::arch::x86_64::__m512i,
            std::arch::x86_64::__m512,
            std::arch::x86_64::__m512,
            std::arch::x86_64::__mmask16,
        ),
    ) {
        use std::arch::x86_64::*;
        debug_assert!(self.vector_sparse() && row.len() >= shape.block_bytes());
        let capacity = shape.capacity;
        let lanes = |n: usize| -> __mmask16 { ((1u32 << n.min(16)) - 1) as __mmask16 };
        let dense = row.as_ptr().add(shape.dense_offset()) as *const i32;
        let dense_dwords = shape.head_dim / 8;
        let dense_words = [
            _mm512_maskz_loadu_epi32(lanes(dense_dwords), dense),
            _mm512_maskz_loadu_epi32(
                lanes(dense_dwords.saturating_sub(16)),
                dense.wrapping_add(16),
            ),
        ];
        let entries = row.as_ptr().add(shape.sparse_offset()) as *const i32;
        let mut ends = [0u32; 4];
        let mut total = 0;
        for (end, &count) in ends
            .iter_mut()
            .zip(&row[META_BYTES..META_BYTES + shape.spans()])
        {
            total += u32::from(count);
            *end = total;
        }
        let base = _mm512_castps128_ps512(_mm_loadu_ps(table.base.as_ptr()));
        let step = _mm512_castps128_ps512(_mm_loadu_ps(table.step.as_ptr()));
        let middle_levels = self.middle_levels(grid);
        for chunk in 0..capacity.div_ceil(16) {
            let dwords = (capacity / 4 - 4 * chunk).min(4);
            let bytes = _mm_maskz_loadu_epi32(lanes(dwords) as __mmask8, entries.add(4 * chunk));
            let e = _mm512_cvtepu8_epi32(bytes);
            let j = _mm512_add_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(16 * chunk as i32),
            );
            let live = _mm512_cmplt_epu32_mask(j, _mm512_set1_epi32(total as i32));
            let mut span = _mm512_setzero_si512();
            for &end in &ends[..shape.spans() - 1] {
                let past = _mm512_cmpge_epu32_mask(j, _mm512_set1_epi32(end as i32));
                span = _mm512_mask_add_epi32(span, past, span, _mm512_set1_epi32(1));
            }
            let i = _mm512_add_epi32(
                _mm512_and_si512(e, _mm512_set1_epi32(i32::from(GROUP_BIT - 1))),
                _mm512_slli_epi32::<6>(span),
            );
            // (Entries past the row's elements, in a corrupt block, are dropped: the scatter
            // would write past the row.)
            let live = live & _mm512_cmplt_epu32_mask(i, _mm512_set1_epi32(shape.head_dim as i32));
            let word = _mm512_permutex2var_epi32(
                dense_words[0],
                _mm512_srli_epi32::<3>(i),
                dense_words[1],
            );
            let shift = _mm512_slli_epi32::<2>(_mm512_and_si512(i, _mm512_set1_epi32(7)));
            let code = _mm512_and_si512(_mm512_srlv_epi32(word, shift), _mm512_set1_epi32(15));
            let k = _mm512_srli_epi32::<6>(e);
            let value = _mm512_add_ps(
                _mm512_permutexvar_ps(k, base),
                _mm512_mul_ps(_mm512_cvtepi32_ps(code), _mm512_permutexvar_ps(k, step)),
            );
            let middle = _mm512_permutexvar_ps(code, middle_levels);
            f(i, value, _mm512_sub_ps(value, middle), live);
        }
    }

    /// Calls `f(elements, differences, live)` for each sparse slot of up to 16 rows (`rows`,
    /// with `scales` theirs), lane `r` for row `r`: the element of the row's entry in that slot
    /// and the entry's value less the middle level of its dense code, 0 in lanes without an
    /// entry (the values and levels of [`Self::for_each_sparse_chunk`], lane by lane). Rows
    /// across lanes need no horizontal sums; each slot gathers its entries' dense codes.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    unsafe fn for_each_sparse_slot(
        &self,
        shape: Shape,
        rows: &[u8],
        scales: &RowScales,
        mut f: impl FnMut(
            std::arch::x86_64::__m512i,
            std::arch::x86_64::__m512,
            std::arch::x86_64::__mmask16,
        ),
    ) {
        use std::arch::x86_64::*;
        debug_assert!(self.vector_sparse());
        let bb = shape.block_bytes();
        let n = (rows.len() / bb).min(16);
        let rows_live = ((1u32 << n) - 1) as __mmask16;
        let base = rows.as_ptr();
        let zero = _mm512_setzero_si512();
        let row_at = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(bb as i32),
        );
        let at = |offset: usize| _mm512_add_epi32(row_at, _mm512_set1_epi32(offset as i32));
        // Each row's span counts, then where each span's entries end.
        let counts = _mm512_mask_i32gather_epi32::<1>(zero, rows_live, at(META_BYTES), base as _);
        let mut ends = [zero; 4];
        let mut total = zero;
        for (k, end) in ends.iter_mut().enumerate().take(shape.spans()) {
            let count = _mm512_srlv_epi32(counts, _mm512_set1_epi32(8 * k as i32));
            total = _mm512_add_epi32(total, _mm512_and_si512(count, _mm512_set1_epi32(0xff)));
            *end = total;
        }
        let z = _mm512_loadu_si512(scales.zero_codes.as_ptr() as *const _);
        let zf = _mm512_cvtepu32_ps(z);
        let step = _mm512_loadu_ps(scales.steps.as_ptr());
        let [outer, inner] = scales.outlier_steps.map(|s| _mm512_loadu_ps(s.as_ptr()));
        let t = &self.thresholds;
        let mut entries = zero;
        for slot in 0..shape.capacity {
            if slot % 4 == 0 {
                let at = at(shape.sparse_offset() + slot);
                entries = _mm512_mask_i32gather_epi32::<1>(zero, rows_live, at, base as _);
            }
            let e = _mm512_and_si512(
                _mm512_srlv_epi32(entries, _mm512_set1_epi32(8 * (slot % 4) as i32)),
                _mm512_set1_epi32(0xff),
            );
            let s = _mm512_set1_epi32(slot as i32);
            let mut i = _mm512_and_si512(e, _mm512_set1_epi32(i32::from(GROUP_BIT - 1)));
            for &end in &ends[..shape.spans() - 1] {
                let past = _mm512_cmpge_epu32_mask(s, end);
                i = _mm512_mask_add_epi32(i, past, i, _mm512_set1_epi32(SPAN as i32));
            }
            // (Entries past the row's elements, in a corrupt block, are dropped.)
            let live = rows_live
                & _mm512_cmplt_epu32_mask(s, total)
                & _mm512_cmplt_epu32_mask(i, _mm512_set1_epi32(shape.head_dim as i32));
            let dense_at = _mm512_add_epi32(
                at(shape.dense_offset()),
                _mm512_slli_epi32::<2>(_mm512_srli_epi32::<3>(i)),
            );
            let word = _mm512_mask_i32gather_epi32::<1>(zero, live, dense_at, base as _);
            let shift = _mm512_slli_epi32::<2>(_mm512_and_si512(i, _mm512_set1_epi32(7)));
            let code = _mm512_and_si512(_mm512_srlv_epi32(word, shift), _mm512_set1_epi32(15));
            let code_f = _mm512_cvtepi32_ps(code);
            // `base[k] + code·step[k]` of the entry's group and sign (`outlier_steps_table`).
            let outer_entry = _mm512_test_epi32_mask(e, _mm512_set1_epi32(i32::from(GROUP_BIT)));
            let low = _mm512_test_epi32_mask(e, _mm512_set1_epi32(i32::from(SIGN_BIT)));
            let magnitude_step = _mm512_mask_blend_ps(outer_entry, inner, outer);
            let entry_step =
                _mm512_mask_xor_ps(magnitude_step, low, magnitude_step, _mm512_set1_ps(-0.0));
            let entry_base = _mm512_maskz_mov_ps(
                outer_entry,
                _mm512_mask_blend_ps(low, _mm512_set1_ps(t.hi_outer), _mm512_set1_ps(t.lo_outer)),
            );
            let value = _mm512_add_ps(entry_base, _mm512_mul_ps(code_f, entry_step));
            // The middle level of the code (`middle_levels`).
            let high = _mm512_cmpge_epu32_mask(code, z);
            let middle = _mm512_add_ps(
                _mm512_mul_ps(
                    _mm512_add_ps(_mm512_sub_ps(code_f, zf), _mm512_set1_ps(0.5)),
                    step,
                ),
                _mm512_mask_blend_ps(high, _mm512_set1_ps(t.lo_inner), _mm512_set1_ps(t.hi_inner)),
            );
            f(i, _mm512_maskz_sub_ps(live, value, middle), live);
        }
    }
}

impl OakenCodec {
    /// The dense codes as the integer kernels' query quantization sees them: 4-bit codes cut
    /// a dword's low nibbles, then its high ones, under one query scale per row.
    fn dense_format(&self) -> LevelFormat {
        LevelFormat {
            row_bytes: self.block_bytes(),
            width: self.head_dim,
            codes: CodeLayout::Packed {
                at: self.dense_offset(),
                bits: 4,
            },
            maps: MapLayout {
                channels: self.head_dim,
                scale_at: 0,
                stride: 0,
                min_at: None,
                zero: 0.0,
            },
            table: None,
        }
    }

    /// Whether [`Self::score_vnni`] takes this codec's rows: whole 64-channel chunks up to
    /// 256 and the vector sparse entries.
    fn integer_scores(&self) -> bool {
        self.head_dim.is_multiple_of(64) && self.head_dim <= 256 && self.vector_sparse()
    }

    /// Whether [`Self::decode_avx512`] reads the sparse entries 16 at a time.
    fn vector_sparse(&self) -> bool {
        self.head_dim <= 256
            && self.outlier_capacity <= 32
            && self.outlier_capacity.is_multiple_of(4)
    }

    /// `step·(½ − z) + lo_inner` of 16 rows (`z` their zero codes): the middle level of code
    /// `q` less `step·q + Δ·[q ≥ z]`, the part of a row's values the integer kernels do not
    /// multiply.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn middle_offsets(
        &self,
        step: std::arch::x86_64::__m512,
        z: std::arch::x86_64::__m512i,
    ) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_fmadd_ps(
            step,
            _mm512_sub_ps(_mm512_set1_ps(0.5), _mm512_cvtepu32_ps(z)),
            _mm512_set1_ps(self.thresholds.lo_inner),
        )
    }

    /// [`Codec::score_group`] on the bytes with 8-bit integer dot products, 16 rows at a time.
    /// A middle level is `step·(q − z + ½) + lo_inner + Δ·[q ≥ z]` (`Δ = hi_inner − lo_inner`),
    /// so a row's dense score is `σ·(step·Σ Q·q + Δ·Σ_{q ≥ z} Q) + (step·(½ − z) + lo_inner)·Σ q`
    /// with the i8 query `Q` (scale `σ`, [`levels::quantize_query`]): two `vpdpbusd` per 4
    /// channels, for the codes and for the high-branch flags. Each sparse entry then adds
    /// `σ·Q_i·(value − middle level of its dense code)`, 16 rows at a time, one per lane, slot
    /// by slot ([`Self::for_each_sparse_slot`]; per row, lanes of its entries needed sums across
    /// lanes: 14% slower in L2), the four heads' `Q_i` gathered at once by permutes. The error
    /// against the exact score is the query's rounding, at most `σ/2·Σ |x_i − offset|` (tested
    /// against a plain version of this algorithm).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi,avx512vbmi2,f16c"
    )]
    unsafe fn score_vnni<const D: usize, const C: usize>(
        &self,
        queries: &[&[f32]],
        blocks: &[u8],
        scores: &mut [&mut [f32]],
        ahead: &mut simd::Ahead,
    ) {
        use std::arch::x86_64::*;
        let shape = self.shape::<D, C>();
        let (d, bb) = (shape.head_dim, shape.block_bytes());
        let n = blocks.len() / bb;
        assert!(self.integer_scores() && queries.iter().all(|q| q.len() >= self.query_len()));
        assert!(scores.iter().all(|s| s.len() >= n));
        let t = &self.thresholds;
        let delta = t.hi_inner - t.lo_inner;
        let groups = d / levels::GROUP;
        for h0 in (0..queries.len()).step_by(4) {
            let heads = (queries.len() - h0).min(4);
            let q: [&[f32]; 4] = std::array::from_fn(|h| queries[h0 + h.min(heads - 1)]);
            // The i8 query's dwords, its scale and the exact `Σ q` (levels::quantize_query).
            let codes = |h: usize, i: usize| *(q[h].as_ptr().add(d) as *const i32).add(i);
            let maps = |h: usize, g: usize, k: usize| q[h][d + d / 4 + levels::QUERY_MAP * g + k];
            let sigma: [__m512; 4] = std::array::from_fn(|h| _mm512_set1_ps(maps(h, 0, 0)));
            let sum_q: [__m512; 4] =
                std::array::from_fn(|h| _mm512_set1_ps((0..groups).map(|g| maps(h, g, 2)).sum()));
            // The four heads' i8 query by channel, one dword per channel (head `h` in byte
            // `h`), for the sparse entries.
            let format = self.dense_format();
            let mut by_channel = [0u32; 256];
            for (h, qh) in q.iter().enumerate() {
                let bytes = std::slice::from_raw_parts(qh.as_ptr().add(d) as *const u8, d);
                for (i, &b) in bytes.iter().enumerate() {
                    by_channel[format.query_channel(i)] |= u32::from(b) << (8 * h);
                }
            }
            let mut scales = RowScales::default();
            for block in (0..n).step_by(16) {
                let rows = (n - block).min(16);
                if h0 == 0 {
                    ahead.rows(rows);
                }
                let first = &blocks[block * bb..(block + rows) * bb];
                row_scales(first, bb, &mut scales);
                let z = _mm512_loadu_si512(scales.zero_codes.as_ptr() as *const _);
                let step = _mm512_loadu_ps(scales.steps.as_ptr());
                // `16 − z` in each byte: bit 4 of `code + 16 − z` is `code ≥ z`.
                let flip = _mm512_mullo_epi32(
                    _mm512_sub_epi32(_mm512_set1_epi32(16), z),
                    _mm512_set1_epi32(0x0101_0101),
                );
                let (mut code_dots, mut high_dots) =
                    ([_mm512_setzero_si512(); 4], [_mm512_setzero_si512(); 4]);
                for chunk in 0..d.div_ceil(128) {
                    let dwords = (d / 8 - 16 * chunk).min(16);
                    let lanes = ((1u32 << dwords) - 1) as __mmask16;
                    let loaded: [__m512i; 16] = std::array::from_fn(|r| {
                        let row = first.as_ptr().add(r.min(rows - 1) * bb);
                        _mm512_maskz_loadu_epi32(
                            lanes,
                            row.add(shape.dense_offset() + 64 * chunk) as *const i32,
                        )
                    });
                    let words = levels::transpose16(&loaded);
                    for (j, &word) in words.iter().enumerate().take(dwords) {
                        for half in 0..2 {
                            let cut = _mm512_and_si512(
                                if half == 0 {
                                    word
                                } else {
                                    _mm512_srli_epi32::<4>(word)
                                },
                                _mm512_set1_epi32(0x0f0f_0f0f),
                            );
                            let high = high_branch(cut, flip);
                            let slot = 2 * (16 * chunk + j) + half;
                            for h in 0..4 {
                                let qd = _mm512_set1_epi32(codes(h, slot));
                                code_dots[h] = _mm512_dpbusd_epi32(code_dots[h], cut, qd);
                                high_dots[h] = _mm512_dpbusd_epi32(high_dots[h], high, qd);
                            }
                        }
                    }
                }
                let offset = self.middle_offsets(step, z);
                let mut dense: [__m512; 4] = std::array::from_fn(|h| {
                    let dot = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(code_dots[h]),
                        step,
                        _mm512_mul_ps(_mm512_cvtepi32_ps(high_dots[h]), _mm512_set1_ps(delta)),
                    );
                    _mm512_fmadd_ps(dot, sigma[h], _mm512_mul_ps(offset, sum_q[h]))
                });
                // The rows' sparse corrections per head against the i8 query (in units of
                // `σ`), summed over their entries, slot by slot.
                let mut corrections = [_mm512_setzero_ps(); 4];
                self.for_each_sparse_slot(shape, first, &scales, |element, difference, _| {
                    let codes = gather(by_channel.as_ptr(), d, element);
                    for (h, c) in corrections.iter_mut().enumerate() {
                        // Byte `h`, sign-extended.
                        let code = _mm512_srai_epi32::<24>(_mm512_sllv_epi32(
                            codes,
                            _mm512_set1_epi32(24 - 8 * h as i32),
                        ));
                        *c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(code), difference, *c);
                    }
                });
                for (dense, (c, sigma)) in dense.iter_mut().zip(corrections.iter().zip(&sigma)) {
                    *dense = _mm512_fmadd_ps(*c, *sigma, *dense);
                }
                let mask = ((1u32 << rows) - 1) as __mmask16;
                for h in 0..heads {
                    let out = scores[h0 + h].as_mut_ptr().add(block);
                    _mm512_mask_storeu_ps(out, mask, dense[h]);
                }
            }
        }
    }
}

impl OakenCodec {
    /// [`Codec::accumulate_group`] on the bytes with 8-bit integer products, per tile of 64
    /// rows and head: a row's value is `step·q + offset + Δ·[q ≥ z]` plus its sparse entries'
    /// differences from their middle levels, so the sums are `Σ a_t·q_t` (weights `a = w·step`
    /// rounded to i8 against their largest) and `Δ·Σ w_t·[q_t ≥ z_t]` (weights `w` rounded
    /// likewise) by `vpdpbusd` over 4 rows at a time, `Σ w_t·offset_t` in f32 for every channel,
    /// and each sparse entry's `w_t·(value − middle level)` added to its channel in f32.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi,avx512vbmi2,f16c"
    )]
    unsafe fn accumulate_vnni<const D: usize, const C: usize>(
        &self,
        weights: &[&[f32]],
        blocks: &[u8],
        accs: &mut [&mut [f32]],
        ahead: &mut simd::Ahead,
    ) {
        use std::arch::x86_64::*;
        const TILE: usize = 64;
        let shape = self.shape::<D, C>();
        let (d, bb) = (shape.head_dim, shape.block_bytes());
        let n = blocks.len() / bb;
        assert!(self.integer_scores() && weights.iter().all(|w| w.len() >= n));
        assert!(accs.iter().all(|a| a.len() >= d));
        let t = &self.thresholds;
        let delta = t.hi_inner - t.lo_inner;
        // The bytes of 4 rows' 16-byte pieces (one per 128-bit lane) with each byte position's
        // 4 rows in one dword.
        let interleave = _mm512_loadu_si512(
            std::array::from_fn::<u8, 64, _>(|j| (16 * (j % 4) + j / 4) as u8).as_ptr() as *const _,
        );
        // Sums of a tile's low-nibble (even) and high-nibble (odd) channels to 32 channels in
        // order: pairs (low l, high l).
        let pairs = [0, 8].map(|first| {
            _mm512_loadu_si512(
                std::array::from_fn::<i32, 16, _>(|j| (first + j / 2) as i32 + 16 * (j % 2) as i32)
                    .as_ptr() as *const _,
            )
        });
        for h0 in (0..weights.len()).step_by(4) {
            let heads = (weights.len() - h0).min(4);
            let w: [&[f32]; 4] = std::array::from_fn(|h| weights[h0 + h.min(heads - 1)]);
            let mut constant = [_mm512_setzero_ps(); 4];
            // Sparse entries' terms, `[channel][head]`.
            let mut sparse = [[0f32; 4]; 256];
            let mut scales = [RowScales::default(); TILE / 16];
            for tile in (0..n).step_by(TILE) {
                let rows = (n - tile).min(TILE);
                if h0 == 0 {
                    ahead.rows(rows);
                }
                let first = &blocks[tile * bb..(tile + rows) * bb];
                for (b, s) in scales.iter_mut().enumerate().take(rows.div_ceil(16)) {
                    row_scales(&first[16 * b * bb..], bb, s);
                }
                // Per 16 rows: `16 − z` of each row as bytes (a quad's in one dword).
                let mut flips = [0u32; TILE / 4];
                for (b, s) in scales.iter().enumerate().take(rows.div_ceil(16)) {
                    let z = _mm512_loadu_si512(s.zero_codes.as_ptr() as *const _);
                    let flip = _mm512_cvtepi32_epi8(_mm512_sub_epi32(_mm512_set1_epi32(16), z));
                    _mm_storeu_si128(flips.as_mut_ptr().add(4 * b) as *mut _, flip);
                }
                // Per head: both weights rounded to i8 against their largest (4 rows to a
                // dword), their units, and `Σ w·offset`.
                let mut rounded = [[[0i8; TILE]; 2]; 4];
                let mut units = [[0f32; 2]; 4];
                let blocks16 = rows.div_ceil(16);
                let live = |b: usize| ((1u32 << (rows - 16 * b).min(16)) - 1) as __mmask16;
                for (h, wh) in w.iter().enumerate() {
                    let wh = wh.as_ptr().add(tile);
                    let mut by_step = [_mm512_setzero_ps(); TILE / 16];
                    let mut by_one = [_mm512_setzero_ps(); TILE / 16];
                    for b in 0..blocks16 {
                        let s = &scales[b];
                        let x = _mm512_maskz_loadu_ps(live(b), wh.add(16 * b));
                        let step = _mm512_loadu_ps(s.steps.as_ptr());
                        let z = _mm512_loadu_si512(s.zero_codes.as_ptr() as *const _);
                        let offset = self.middle_offsets(step, z);
                        constant[h] = _mm512_fmadd_ps(x, offset, constant[h]);
                        by_step[b] = _mm512_mul_ps(x, step);
                        by_one[b] = x;
                    }
                    for (k, xs) in [by_step, by_one].iter().enumerate() {
                        let largest = xs[..blocks16].iter().fold(_mm512_setzero_ps(), |m, &x| {
                            _mm512_max_ps(m, _mm512_abs_ps(x))
                        });
                        let largest = _mm512_reduce_max_ps(largest);
                        let inv = _mm512_set1_ps(if largest > 0.0 { 127.0 / largest } else { 0.0 });
                        for (b, &x) in xs.iter().enumerate().take(blocks16) {
                            let codes = _mm512_cvtps_epi32(_mm512_mul_ps(x, inv));
                            _mm_storeu_si128(
                                rounded[h][k].as_mut_ptr().add(16 * b) as *mut _,
                                _mm512_cvtepi32_epi8(codes),
                            );
                        }
                        units[h][k] = largest / 127.0 * if k == 1 { delta } else { 1.0 };
                    }
                }
                // Dense: 32 channels (16 bytes of each row) at a time.
                for piece in 0..d / 32 {
                    let mut code_sums = [[_mm512_setzero_si512(); 2]; 4];
                    let mut high_sums = [[_mm512_setzero_si512(); 2]; 4];
                    for (quad, &flip) in flips.iter().enumerate().take(rows.div_ceil(4)) {
                        let row = |j: usize| {
                            let r = (4 * quad + j).min(rows - 1);
                            first
                                .as_ptr()
                                .add(r * bb + shape.dense_offset() + 16 * piece)
                        };
                        let mut x = _mm512_castsi128_si512(_mm_loadu_si128(row(0) as *const _));
                        x = _mm512_inserti32x4::<1>(x, _mm_loadu_si128(row(1) as *const _));
                        x = _mm512_inserti32x4::<2>(x, _mm_loadu_si128(row(2) as *const _));
                        x = _mm512_inserti32x4::<3>(x, _mm_loadu_si128(row(3) as *const _));
                        let x = _mm512_permutexvar_epi8(interleave, x);
                        let flip = _mm512_set1_epi32(flip as i32);
                        let nibble = _mm512_set1_epi32(0x0f0f_0f0f);
                        let cuts = [
                            _mm512_and_si512(x, nibble),
                            _mm512_and_si512(_mm512_srli_epi32::<4>(x), nibble),
                        ];
                        let highs = cuts.map(|c| high_branch(c, flip));
                        for h in 0..4 {
                            let dword = |k: usize| {
                                _mm512_set1_epi32(
                                    (rounded[h][k].as_ptr().add(4 * quad) as *const i32)
                                        .read_unaligned(),
                                )
                            };
                            let (a, b) = (dword(0), dword(1));
                            for c in 0..2 {
                                code_sums[h][c] = _mm512_dpbusd_epi32(code_sums[h][c], cuts[c], a);
                                high_sums[h][c] = _mm512_dpbusd_epi32(high_sums[h][c], highs[c], b);
                            }
                        }
                    }
                    for h in 0..heads {
                        let [a, b] = units[h].map(|u| _mm512_set1_ps(u));
                        let value = |c: usize| {
                            _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(code_sums[h][c]),
                                a,
                                _mm512_mul_ps(_mm512_cvtepi32_ps(high_sums[h][c]), b),
                            )
                        };
                        let (low, high) = (value(0), value(1));
                        let acc = accs[h0 + h].as_mut_ptr().add(32 * piece);
                        for (j, pair) in pairs.iter().enumerate() {
                            let v = _mm512_permutex2var_ps(low, *pair, high);
                            let at = acc.add(16 * j);
                            _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), v));
                        }
                    }
                }
                // Sparse entries: each row's 4 heads' weights times its entries' differences
                // from their middle levels, into `sparse`. A row's entries are added while the
                // next row's are computed: read at once, the scalar loads would wait for the
                // vector stores that wrote them.
                let mut elements = [[0u32; 32]; 2];
                let mut differences = [[0f32; 32]; 2];
                let mut counts = [0usize; 2];
                for r in 0..=rows {
                    if r < rows {
                        let (elements, differences) =
                            (&mut elements[r % 2], &mut differences[r % 2]);
                        let count = &mut counts[r % 2];
                        *count = 0;
                        let table = self.scaled_outlier_table(&scales[r / 16], r % 16);
                        self.for_each_sparse_chunk(
                            shape,
                            &first[r * bb..],
                            &table,
                            scales[r / 16].grid(r % 16),
                            |element, _, difference, live| {
                                let at = *count;
                                _mm512_storeu_si512(elements[at..].as_mut_ptr() as *mut _, element);
                                _mm512_storeu_ps(differences[at..].as_mut_ptr(), difference);
                                *count += (live as u32).count_ones() as usize;
                            },
                        );
                    }
                    if r > 0 {
                        let (p, t) = ((r - 1) % 2, tile + r - 1);
                        let row_weights = _mm_setr_ps(w[0][t], w[1][t], w[2][t], w[3][t]);
                        for (&e, &difference) in
                            elements[p].iter().zip(&differences[p]).take(counts[p])
                        {
                            let at = sparse.as_mut_ptr().add(e as usize) as *mut f32;
                            let term = _mm_mul_ps(_mm_set1_ps(difference), row_weights);
                            _mm_storeu_ps(at, _mm_add_ps(_mm_loadu_ps(at), term));
                        }
                    }
                }
            }
            // The constant and the sparse terms, head by head.
            for h in 0..heads {
                let constant = _mm512_reduce_add_ps(constant[h]);
                for (c, a) in accs[h0 + h][..d].iter_mut().enumerate() {
                    *a += constant + sparse[c][h];
                }
            }
        }
    }
}

/// 1 in each byte of `codes` (4-bit codes, one per byte) that is at least its row's zero code,
/// 0 elsewhere: bit 4 of `code + 16 − z`, `flip` holding `16 − z` in each byte.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn high_branch(
    codes: std::arch::x86_64::__m512i,
    flip: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    _mm512_and_si512(
        _mm512_srli_epi32::<4>(_mm512_add_epi32(codes, flip)),
        _mm512_set1_epi32(0x0101_0101),
    )
}

/// `x[i]` for the 16 indices `i` of `element` (each below `len`, at most 256), by permutes of
/// pairs of vectors and blends on the higher index bits.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn gather(
    x: *const u32,
    len: usize,
    element: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let pairs = len.div_ceil(32);
    let mut picked = [_mm512_setzero_si512(); 8];
    for (p, v) in picked.iter_mut().enumerate().take(pairs) {
        let at = x.add(32 * p) as *const __m512i;
        *v = _mm512_permutex2var_epi32(
            _mm512_loadu_si512(at),
            element,
            _mm512_loadu_si512(at.add(1)),
        );
    }
    // Select by bits 5, 6 and 7 of the index.
    let mut width = pairs;
    let mut bit = 32;
    while width > 1 {
        let upper = _mm512_test_epi32_mask(element, _mm512_set1_epi32(bit));
        for k in 0..width / 2 {
            picked[k] = _mm512_mask_blend_epi32(upper, picked[2 * k], picked[2 * k + 1]);
        }
        width /= 2;
        bit *= 2;
    }
    picked[0]
}

/// Calls an integer kernel of `codec` instantiated for its shape where that is one of the
/// default ones (head size 64, 128 or 256 with capacity `d/8`), else for any shape.
#[cfg(target_arch = "x86_64")]
macro_rules! by_shape {
    ($codec:expr, $kernel:ident($($arg:expr),*)) => {
        match ($codec.head_dim, $codec.outlier_capacity) {
            (64, 8) => $codec.$kernel::<64, 8>($($arg),*),
            (128, 16) => $codec.$kernel::<128, 16>($($arg),*),
            (256, 32) => $codec.$kernel::<256, 32>($($arg),*),
            _ => $codec.$kernel::<0, 0>($($arg),*),
        }
    };
}

impl Codec for OakenCodec {
    fn name(&self) -> String {
        "oaken".into()
    }

    fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn block_tokens(&self) -> usize {
        1
    }

    fn block_bytes(&self) -> usize {
        self.shape::<0, 0>().block_bytes()
    }

    /// The f32 query, then for the integer scores its i8 form ([`levels::quantize_query`]).
    fn query_len(&self) -> usize {
        let slots = if self.integer_scores() {
            levels::query_slots(self.head_dim)
        } else {
            0
        };
        self.head_dim + slots
    }

    fn prepare_query(&self, query: &[f32], prepared: &mut [f32]) {
        prepared[..self.head_dim].copy_from_slice(query);
        if self.integer_scores() {
            levels::finish_query(&self.dense_format(), prepared);
        }
    }

    /// On the integer kernels where the CPU has them (`OakenCodec::score_vnni`), else
    /// through decoded tiles.
    fn score_group(
        &self,
        queries: &[&[f32]],
        blocks: &[u8],
        scores: &mut [&mut [f32]],
        ahead: &mut simd::Ahead,
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.integer_scores() && levels::available() {
            // SAFETY: `levels::available` checked the kernels' CPU features.
            return unsafe { by_shape!(self, score_vnni(queries, blocks, scores, ahead)) };
        }
        crate::tile::score_group(self, queries, blocks, scores, ahead);
    }

    /// On the integer kernels where the CPU has them (`OakenCodec::accumulate_vnni`), else
    /// through decoded tiles.
    fn accumulate_group(
        &self,
        weights: &[&[f32]],
        blocks: &[u8],
        accs: &mut [&mut [f32]],
        ahead: &mut simd::Ahead,
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.integer_scores() && levels::available() {
            // SAFETY: `levels::available` checked the kernels' CPU features.
            return unsafe { by_shape!(self, accumulate_vnni(weights, blocks, accs, ahead)) };
        }
        crate::tile::accumulate_group(self, weights, blocks, accs, ahead);
    }

    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        check_finite(rows, self.head_dim)?;
        let slots = self.slots(rows);
        // Largest middle −x' and x', outer |x'| and inner |x|, and the element each came from.
        let mut largest = [0f32; 4];
        let mut widest = [0usize; 4];
        for (i, s) in slots.iter().enumerate() {
            let (value, field) = match *s {
                Slot::Middle { shifted, .. } if shifted < 0.0 => (-shifted, 0),
                Slot::Middle { shifted, .. } => (shifted, 1),
                Slot::Outlier {
                    outer, magnitude, ..
                } => (magnitude, if outer { 2 } else { 3 }),
            };
            if value > largest[field] {
                largest[field] = value;
                widest[field] = i;
            }
        }
        for (field, value) in largest.into_iter().enumerate() {
            let h = f16_at_least(value);
            if !h.is_finite() {
                return Err(CodecError::NonFinite {
                    row: 0,
                    channel: widest[field],
                    value: rows[widest[field]],
                });
            }
            // The middle minimum is stored negated back: rounded outward either way.
            let h = if field == 0 { -h } else { h };
            out[2 * field..2 * field + 2].copy_from_slice(&h.to_le_bytes());
        }
        let grid = MiddleGrid::new(f16_at(out, 0), f16_at(out, 1));
        let outer_step = f16_at(out, 2) / 15.0;
        let inner_step = f16_at(out, 3) / 15.0;
        let magnitude_code = |m: f32, step: f32| {
            if step > 0.0 {
                (m / step).round().min(15.0) as u8
            } else {
                0
            }
        };
        let (sparse_offset, dense_offset) = (self.sparse_offset(), self.dense_offset());
        out[META_BYTES..sparse_offset].fill(0);
        out[sparse_offset..].fill(0);
        let mut next_entry = sparse_offset;
        for (i, s) in slots.iter().enumerate() {
            let code = match *s {
                Slot::Middle { shifted, high } => grid.code(shifted, high),
                Slot::Outlier {
                    outer,
                    negative,
                    magnitude,
                } => {
                    out[next_entry] = (i % SPAN) as u8
                        | if outer { GROUP_BIT } else { 0 }
                        | if negative { SIGN_BIT } else { 0 };
                    next_entry += 1;
                    out[META_BYTES + i / SPAN] += 1;
                    magnitude_code(magnitude, if outer { outer_step } else { inner_step })
                }
            };
            out[dense_offset + i / 2] |= code << (4 * (i % 2));
        }
        Ok(())
    }

    /// The dense codes through the token's table of middle levels (a vector lookup), then
    /// the sparse entries over them.
    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        let tables = self.tables(block);
        let dense = &block[self.dense_offset()..self.sparse_offset()];
        rows.fill(0.0);
        simd::axpy_lut(dense, 4, &tables.middle, 1.0, rows);
        self.for_each_outlier(block, &tables.outliers, |i, _, value| rows[i] = value);
    }

    /// Rows as [`Codec::decode`] gives them, with AVX-512 or AVX2 where the CPU has them (the
    /// attention kernels' tiles).
    fn decode_working(&self, blocks: &[u8], rows: &mut [f32]) {
        let pairs = blocks
            .chunks_exact(self.block_bytes())
            .zip(rows.chunks_exact_mut(self.head_dim));
        #[cfg(target_arch = "x86_64")]
        if simd::use_avx512() && self.head_dim.is_multiple_of(16) {
            let mut scales = RowScales::default();
            for (i, (row, out)) in pairs.enumerate() {
                if i % 16 == 0 {
                    let next = &blocks[i * self.block_bytes()..];
                    // SAFETY: the CPU has AVX-512F/DQ and F16C (with AVX2).
                    unsafe { row_scales(next, self.block_bytes(), &mut scales) };
                }
                let r = i % 16;
                let table = self.scaled_outlier_table(&scales, r);
                // SAFETY: as above (AVX-512F/VL); `row` is one block, `out` one row.
                unsafe { self.decode_avx512(row, scales.grid(r), &table, out) };
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if simd::use_avx2() && self.head_dim.is_multiple_of(8) {
            for (row, out) in pairs {
                // SAFETY: the CPU has AVX2, FMA and F16C; `row` is one block, `out` one row.
                unsafe { self.decode_avx2(row, out) };
            }
            return;
        }
        for (row, out) in pairs {
            self.decode(row, out);
        }
    }

    fn score(&self, prepared_query: &[f32], blocks: &[u8], scores: &mut [f32]) {
        for (row, score) in blocks.chunks_exact(self.block_bytes()).zip(scores) {
            let tables = self.tables(row);
            let dense = &row[self.dense_offset()..self.sparse_offset()];
            let mut total = 0.0f32;
            for (q, &byte) in prepared_query.chunks_exact(2).zip(dense) {
                total += q[0] * tables.middle[usize::from(byte & 15)]
                    + q[1] * tables.middle[usize::from(byte >> 4)];
            }
            self.for_each_outlier(row, &tables.outliers, |i, code, value| {
                total += prepared_query[i] * (value - tables.middle[usize::from(code)]);
            });
            *score = total;
        }
    }

    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]) {
        for (row, &w) in blocks.chunks_exact(self.block_bytes()).zip(weights) {
            let tables = self.tables(row);
            let dense = &row[self.dense_offset()..self.sparse_offset()];
            for (a, &byte) in acc.chunks_exact_mut(2).zip(dense) {
                a[0] += w * tables.middle[usize::from(byte & 15)];
                a[1] += w * tables.middle[usize::from(byte >> 4)];
            }
            self.for_each_outlier(row, &tables.outliers, |i, code, value| {
                acc[i] += w * (value - tables.middle[usize::from(code)]);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rotation::seeded_rng;
    use rand::Rng;
    use rand_distr::StandardNormal;

    /// Gaussian rows with a few channels 8× stronger, like real keys.
    fn sample_rows(count: usize, head_dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = seeded_rng(seed, 3);
        (0..count * head_dim)
            .map(|i| {
                let g: f32 = rng.sample(StandardNormal);
                if i % head_dim % 29 == 5 {
                    8.0 * g
                } else {
                    g
                }
            })
            .collect()
    }

    fn thresholds() -> OakenThresholds {
        OakenThresholds::from_samples(&mut sample_rows(400, 128, 99))
    }

    /// The plain reading of methods.md §1.2.
    fn reference_group(t: &OakenThresholds, x: f32) -> OakenGroup {
        if x <= t.lo_outer || x >= t.hi_outer {
            OakenGroup::Outer
        } else if t.lo_inner < x && x < t.hi_inner {
            OakenGroup::Inner
        } else {
            OakenGroup::Middle
        }
    }

    /// `(element, outer, negative)` of every sparse entry, parsed from the documented layout.
    fn entries(codec: &OakenCodec, block: &[u8]) -> Vec<(usize, bool, bool)> {
        let mut out = Vec::new();
        let mut next = codec.sparse_offset();
        for span in 0..codec.shape::<0, 0>().spans() {
            for _ in 0..block[META_BYTES + span] {
                let e = block[next];
                out.push((
                    span * SPAN + usize::from(e & 63),
                    e & GROUP_BIT != 0,
                    e & SIGN_BIT != 0,
                ));
                next += 1;
            }
        }
        out
    }

    fn encode(codec: &OakenCodec, row: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let mut block = vec![0u8; codec.block_bytes()];
        codec.encode(row, &mut block).unwrap();
        let mut back = vec![0f32; row.len()];
        codec.decode(&block, &mut back);
        (block, back)
    }

    /// Whole rows encoded one block after another.
    fn encode_rows(codec: &OakenCodec, rows: &[f32]) -> Vec<u8> {
        let mut blocks = vec![0u8; rows.len() / codec.head_dim * codec.block_bytes()];
        for (row, block) in rows
            .chunks_exact(codec.head_dim)
            .zip(blocks.chunks_exact_mut(codec.block_bytes()))
        {
            codec.encode(row, block).unwrap();
        }
        blocks
    }

    /// Each of the whole rows `queries` prepared for the kernels.
    fn prepare_queries(codec: &OakenCodec, queries: &[f32]) -> Vec<Vec<f32>> {
        queries
            .chunks_exact(codec.head_dim)
            .map(|q| {
                let mut p = vec![0f32; codec.query_len()];
                codec.prepare_query(q, &mut p);
                p
            })
            .collect()
    }

    #[test]
    fn the_grid_rounds_as_f32_round() {
        let mut rng = seeded_rng(4, 0);
        let ties = (0..=32).map(|i| i as f32 / 2.0);
        // One ulp either side of each tie k + ½.
        let near = (0..16).flat_map(|k| {
            let tie = (k as f32 + 0.5).to_bits();
            [f32::from_bits(tie - 1), f32::from_bits(tie + 1)]
        });
        let random = (0..10_000).map(|_| rng.gen_range(0.0..16.0f32));
        for x in ties.chain(near).chain(random) {
            assert_eq!(round_up_ties(x), x.round() as usize, "{x}");
        }
    }

    #[test]
    fn from_samples_uses_lower_and_higher_quantiles() {
        // 0..1000 shuffled: ranks 19.98, 469.53, 529.47, 979.02.
        let mut values: Vec<f32> = (0..1000).map(|i| ((i * 617) % 1000) as f32).collect();
        let t = OakenThresholds::from_samples(&mut values);
        assert_eq!(
            (t.lo_outer, t.lo_inner, t.hi_inner, t.hi_outer),
            (19.0, 469.0, 530.0, 980.0)
        );
    }

    #[test]
    fn profiled_thresholds_give_the_4_90_6_split_on_fresh_data() {
        let t = thresholds();
        let fresh = sample_rows(400, 128, 5);
        let count = |g| fresh.iter().filter(|&&x| t.group_of(x) == g).count() as f64;
        let n = fresh.len() as f64;
        assert!((count(OakenGroup::Outer) / n - 0.04).abs() < 0.005);
        assert!((count(OakenGroup::Inner) / n - 0.06).abs() < 0.005);
    }

    #[test]
    fn classification_matches_the_reference_and_the_stored_entries() {
        let t = thresholds();
        let mut probes = vec![t.lo_outer, t.lo_inner, t.hi_inner, t.hi_outer, 0.0];
        probes.extend(
            probes
                .clone()
                .iter()
                .flat_map(|&v| [v.next_up(), v.next_down()]),
        );
        for x in probes.iter().chain(&sample_rows(10, 128, 6)) {
            assert_eq!(t.group_of(*x), reference_group(&t, *x), "x={x}");
        }
        for head_dim in [64, 128, 256] {
            // Capacity for every element: nothing is demoted, so entries = reference outliers.
            let codec = OakenCodec::new(t, head_dim, head_dim).unwrap();
            for row in sample_rows(20, head_dim, 7).chunks_exact(head_dim) {
                let (block, _) = encode(&codec, row);
                let want: Vec<(usize, bool, bool)> = row
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &x)| match reference_group(&t, x) {
                        OakenGroup::Outer => Some((i, true, x <= t.lo_outer)),
                        OakenGroup::Inner => Some((i, false, x < 0.0)),
                        OakenGroup::Middle => None,
                    })
                    .collect();
                assert_eq!(entries(&codec, &block), want);
            }
        }
    }

    /// Half a step of each group's grid for one block: (middle, outer, inner).
    fn half_steps(block: &[u8]) -> (f32, f32, f32) {
        let grid = MiddleGrid::new(f16_at(block, 0), f16_at(block, 1));
        (
            grid.step / 2.0,
            f16_at(block, 2) / 30.0,
            f16_at(block, 3) / 30.0,
        )
    }

    #[test]
    fn every_group_is_within_half_a_step() {
        let t = thresholds();
        for head_dim in [64, 128, 256] {
            let codec = OakenCodec::new(t, head_dim, head_dim).unwrap();
            for row in sample_rows(50, head_dim, 8).chunks_exact(head_dim) {
                let (block, back) = encode(&codec, row);
                let (middle, outer, inner) = half_steps(&block);
                // The scales are the group's own range: 4 bits over the shifted middle values.
                let shifted_range = row
                    .iter()
                    .filter(|&&x| reference_group(&t, x) == OakenGroup::Middle)
                    .map(|&x| {
                        if x >= t.hi_inner {
                            x - t.hi_inner
                        } else {
                            x - t.lo_inner
                        }
                    })
                    .fold((0f32, 0f32), |(lo, hi), v| (lo.min(v), hi.max(v)));
                assert!(middle <= (shifted_range.1 - shifted_range.0) / 15.0 * 0.5 * 1.01);
                for (&x, &y) in row.iter().zip(&back) {
                    let bound = match reference_group(&t, x) {
                        OakenGroup::Middle => middle,
                        OakenGroup::Outer => outer,
                        OakenGroup::Inner => inner,
                    };
                    assert!(
                        (x - y).abs() <= bound * 1.0001 + 1e-6,
                        "x={x} decoded {y}, bound {bound}"
                    );
                }
            }
        }
    }

    #[test]
    fn overflow_keeps_the_largest_outer_values_and_demotes_the_rest() {
        let t = OakenThresholds {
            lo_outer: -4.0,
            lo_inner: -0.1,
            hi_inner: 0.1,
            hi_outer: 4.0,
        };
        let codec = OakenCodec::new(t, 64, 2).unwrap();
        let mut row: Vec<f32> = (0..64)
            .map(|i| if i % 2 == 0 { 1.0 } else { -2.0 })
            .collect();
        // Five outer values and two inner ones for two slots.
        for (i, x) in [(3, 5.0), (10, -30.0), (20, 9.0), (40, -4.5), (63, 20.0)] {
            row[i] = x;
        }
        row[7] = 0.01;
        row[8] = -0.08;
        let (block, back) = encode(&codec, &row);
        // The two largest |x'| (−30 and 20) keep their slots.
        assert_eq!(
            entries(&codec, &block),
            [(10, true, true), (63, true, false)]
        );
        let (middle, outer, _) = half_steps(&block);
        for i in [10, 63] {
            assert!((row[i] - back[i]).abs() <= outer * 1.0001, "{i}");
        }
        // Demoted outer values widen the middle range and keep its half-step bound.
        assert!(f16_at(&block, 1) >= 9.0 - t.hi_inner);
        for i in (0..64).filter(|i| ![7, 8, 10, 63].contains(i)) {
            assert!((row[i] - back[i]).abs() <= middle * 1.0001, "{i}");
        }
        // Demoted inner values sit half a middle step beyond their nearer inner threshold.
        assert!((back[7] - (t.hi_inner + middle)).abs() < 1e-5);
        assert!((back[8] - (t.lo_inner - middle)).abs() < 1e-5);
    }

    /// The attention tiles' decode (AVX-512 where the CPU has it) gives `decode`'s values
    /// bit for bit: middle levels, the outliers over them, tokens over capacity included.
    #[test]
    fn working_rows_equal_decoded_rows() {
        for (head_dim, capacity) in [(64, 8), (128, 16), (128, 2), (128, 48), (256, 32)] {
            let codec = OakenCodec::new(thresholds(), head_dim, capacity).unwrap();
            // Gaussian rows, then rows of zeros, of one sign, and of one value (flat grids,
            // one-branch grids).
            let mut rows = sample_rows(36, head_dim, 21);
            rows.extend(std::iter::repeat_n(0.0, head_dim));
            rows.extend((0..head_dim).map(|c| 0.2 + c as f32 * 0.01));
            rows.extend((0..head_dim).map(|c| -0.3 - c as f32 * 0.02));
            rows.extend(std::iter::repeat_n(0.05, head_dim));
            let blocks = encode_rows(&codec, &rows);
            let mut working = vec![f32::NAN; rows.len()];
            codec.decode_working(&blocks, &mut working);
            let mut one = vec![0f32; head_dim];
            for (t, block) in blocks.chunks_exact(codec.block_bytes()).enumerate() {
                codec.decode(block, &mut one);
                let got = &working[t * head_dim..][..head_dim];
                for (c, (a, b)) in got.iter().zip(&one).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "d{head_dim} row {t} channel {c}");
                }
            }
        }
    }

    #[test]
    fn integer_scores_match_the_plain_algorithm_and_the_rounding_bound() {
        if !levels::available() {
            return;
        }
        for (head_dim, capacity) in [(64, 8), (128, 16), (128, 4), (256, 32)] {
            let codec = OakenCodec::new(thresholds(), head_dim, capacity).unwrap();
            assert!(codec.integer_scores());
            // 37 rows (two blocks of 16 and a partial one): Gaussian, then zeros, one-sided
            // and flat rows.
            let mut rows = sample_rows(33, head_dim, 41);
            rows.extend(std::iter::repeat_n(0.0, head_dim));
            rows.extend((0..head_dim).map(|c| 0.2 + c as f32 * 0.01));
            rows.extend((0..head_dim).map(|c| -0.3 - c as f32 * 0.02));
            rows.extend(std::iter::repeat_n(0.05, head_dim));
            let n = rows.len() / head_dim;
            let blocks = encode_rows(&codec, &rows);
            // Five heads: a pass of four and one of one.
            let queries = sample_rows(5, head_dim, 42);
            let prepared = prepare_queries(&codec, &queries);
            let views: Vec<&[f32]> = prepared.iter().map(Vec::as_slice).collect();
            let mut scores = vec![vec![f32::NAN; n]; 5];
            let mut outs: Vec<&mut [f32]> = scores.iter_mut().map(Vec::as_mut_slice).collect();
            codec.score_group(&views, &blocks, &mut outs, &mut simd::Ahead::none());
            for (h, q) in queries.chunks_exact(head_dim).enumerate() {
                // The i8 query, plainly: one scale, the largest magnitude over 127.
                let sigma = q.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                let rounded: Vec<f64> = q
                    .iter()
                    .map(|&x| f64::from((x / sigma).round().clamp(-127.0, 127.0) * sigma))
                    .collect();
                for (t, row) in blocks.chunks_exact(codec.block_bytes()).enumerate() {
                    // Every dense code at its middle level less the row's offset (`step·(½ −
                    // z) + lo_inner`) and each sparse entry's difference from its level against
                    // the rounded query, the offset against the exact one.
                    let tables = codec.tables(row);
                    let grid = MiddleGrid::new(f16_at(row, 0), f16_at(row, 1));
                    let offset = f64::from(grid.step) * (0.5 - grid.zero_code as f64)
                        + f64::from(codec.thresholds.lo_inner);
                    let dense = &row[codec.dense_offset()..codec.sparse_offset()];
                    let middle = |c: usize| {
                        let code = (dense[c / 2] >> (4 * (c % 2))) & 15;
                        f64::from(tables.middle[usize::from(code)])
                    };
                    let sum_q: f64 = q.iter().map(|&x| f64::from(x)).sum();
                    let mut want: f64 = (0..head_dim)
                        .map(|c| rounded[c] * (middle(c) - offset))
                        .sum::<f64>()
                        + offset * sum_q;
                    codec.for_each_outlier(row, &tables.outliers, |i, _, value| {
                        want += rounded[i] * (f64::from(value) - middle(i));
                    });
                    let got = f64::from(scores[h][t]);
                    let size: f64 = (0..head_dim).map(|c| (rounded[c] * middle(c)).abs()).sum();
                    assert!(
                        (got - want).abs() <= 1e-5 * size.max(1.0),
                        "d{head_dim} cap {capacity} head {h} row {t}: {got} vs {want}"
                    );
                    // Against the exact score, the query's rounding: σ/2 per value less the
                    // offset.
                    let mut decoded = vec![0f32; head_dim];
                    codec.decode(row, &mut decoded);
                    let exact: f64 = decoded
                        .iter()
                        .zip(q)
                        .map(|(&x, &y)| f64::from(x) * f64::from(y))
                        .sum();
                    let bound: f64 = (0..head_dim)
                        .map(|c| (middle(c) - offset).abs())
                        .sum::<f64>()
                        * f64::from(sigma)
                        / 2.0;
                    assert!(
                        (got - exact).abs() <= bound + 1e-5 * size.max(1.0),
                        "d{head_dim} head {h} row {t}: {got} vs exact {exact}, bound {bound}"
                    );
                }
            }
        }
    }

    #[test]
    fn integer_sums_match_the_plain_algorithm_and_the_rounding_bound() {
        if !levels::available() {
            return;
        }
        for (head_dim, capacity) in [(64, 8), (128, 16), (128, 4), (256, 32)] {
            let codec = OakenCodec::new(thresholds(), head_dim, capacity).unwrap();
            // 150 rows (two tiles of 64 and a partial one): Gaussian, then zeros, one-sided
            // and flat rows.
            let mut rows = sample_rows(146, head_dim, 51);
            rows.extend(std::iter::repeat_n(0.0, head_dim));
            rows.extend((0..head_dim).map(|c| 0.2 + c as f32 * 0.01));
            rows.extend((0..head_dim).map(|c| -0.3 - c as f32 * 0.02));
            rows.extend(std::iter::repeat_n(0.05, head_dim));
            let n = rows.len() / head_dim;
            let blocks = encode_rows(&codec, &rows);
            // Five heads (a pass of four and one of one), weights of both signs.
            let mut rng = seeded_rng(52, 0);
            let weights: Vec<Vec<f32>> = (0..5)
                .map(|_| (0..n).map(|_| rng.gen_range(-0.2..1.0)).collect())
                .collect();
            let views: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
            let mut accs = vec![vec![0.5f32; head_dim]; 5];
            let mut outs: Vec<&mut [f32]> = accs.iter_mut().map(Vec::as_mut_slice).collect();
            codec.accumulate_group(&views, &blocks, &mut outs, &mut simd::Ahead::none());
            let t = codec.thresholds;
            let delta = f64::from(t.hi_inner - t.lo_inner);
            for (h, w) in weights.iter().enumerate() {
                // Per tile of 64 rows: `w·step` and `w` rounded to i8 against their largest
                // (f32, ties to even as the vector conversion rounds), against the codes and
                // the high-branch flags; `w·offset` and the sparse entries' differences from
                // their middle levels exactly.
                let mut want = vec![0.5f64; head_dim];
                let mut bound = vec![0f64; head_dim];
                let mut exact = vec![0.5f64; head_dim];
                for tile in (0..n).step_by(64) {
                    let rows = tile..n.min(tile + 64);
                    let grid = |r: usize| {
                        let row = &blocks[r * codec.block_bytes()..];
                        MiddleGrid::new(f16_at(row, 0), f16_at(row, 1))
                    };
                    let round = |xs: Vec<f32>| {
                        let largest = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
                        let inv = if largest > 0.0 { 127.0 / largest } else { 0.0 };
                        let codes: Vec<f64> = xs
                            .iter()
                            .map(|&x| f64::from((x * inv).round_ties_even()))
                            .collect();
                        (codes, f64::from(largest / 127.0))
                    };
                    let (by_step, step_unit) =
                        round(rows.clone().map(|r| w[r] * grid(r).step).collect());
                    let (by_one, one_unit) = round(rows.clone().map(|r| w[r]).collect());
                    for (k, r) in rows.clone().enumerate() {
                        let row = &blocks[r * codec.block_bytes()..][..codec.block_bytes()];
                        let g = grid(r);
                        let offset =
                            f64::from(g.step) * (0.5 - g.zero_code as f64) + f64::from(t.lo_inner);
                        let dense = &row[codec.dense_offset()..codec.sparse_offset()];
                        let mut decoded = vec![0f32; head_dim];
                        codec.decode(row, &mut decoded);
                        for c in 0..head_dim {
                            let code = usize::from((dense[c / 2] >> (4 * (c % 2))) & 15);
                            let high = f64::from(u8::from(code >= g.zero_code));
                            want[c] += step_unit * by_step[k] * code as f64
                                + one_unit * delta * by_one[k] * high
                                + f64::from(w[r]) * offset;
                            bound[c] +=
                                step_unit / 2.0 * code as f64 + one_unit * delta / 2.0 * high;
                            exact[c] += f64::from(w[r]) * f64::from(decoded[c]);
                        }
                        let tables = codec.tables(row);
                        codec.for_each_outlier(row, &tables.outliers, |i, code, value| {
                            let middle = f64::from(tables.middle[usize::from(code)]);
                            want[i] += f64::from(w[r]) * (f64::from(value) - middle);
                        });
                    }
                }
                let size = exact.iter().fold(1f64, |m, x| m.max(x.abs()));
                for c in 0..head_dim {
                    let got = f64::from(accs[h][c]);
                    assert!(
                        (got - want[c]).abs() <= 1e-5 * size,
                        "d{head_dim} cap {capacity} head {h} channel {c}: {got} vs {}",
                        want[c]
                    );
                    assert!(
                        (got - exact[c]).abs() <= bound[c] + 1e-5 * size,
                        "d{head_dim} head {h} channel {c}: {got} vs exact {}, bound {}",
                        exact[c],
                        bound[c]
                    );
                }
            }
        }
    }

    #[test]
    fn kernels_for_a_constant_shape_equal_the_run_time_ones_bit_for_bit() {
        if !levels::available() {
            return;
        }
        fn check<const D: usize, const C: usize>() {
            let codec = OakenCodec::new(thresholds(), D, C).unwrap();
            // 45 rows: two blocks of 16 and a partial one, in one tile of the sums.
            let n = 45;
            let rows = sample_rows(n, D, 61);
            let blocks = encode_rows(&codec, &rows);
            let prepared = prepare_queries(&codec, &sample_rows(4, D, 62));
            let queries: Vec<&[f32]> = prepared.iter().map(Vec::as_slice).collect();
            let weights: Vec<Vec<f32>> = (0..4)
                .map(|h| {
                    (0..n)
                        .map(|r| ((r * 7 + h) % 11) as f32 / 11.0 - 0.1)
                        .collect()
                })
                .collect();
            let weights: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
            let run = |constant: bool| {
                let mut scores = vec![vec![0f32; n]; 4];
                let mut sums = vec![vec![0f32; D]; 4];
                let mut s: Vec<&mut [f32]> = scores.iter_mut().map(Vec::as_mut_slice).collect();
                let mut a: Vec<&mut [f32]> = sums.iter_mut().map(Vec::as_mut_slice).collect();
                let ahead = &mut simd::Ahead::none();
                // SAFETY: `levels::available` checked the kernels' CPU features.
                unsafe {
                    if constant {
                        codec.score_vnni::<D, C>(&queries, &blocks, &mut s, ahead);
                        codec.accumulate_vnni::<D, C>(&weights, &blocks, &mut a, ahead);
                    } else {
                        codec.score_vnni::<0, 0>(&queries, &blocks, &mut s, ahead);
                        codec.accumulate_vnni::<0, 0>(&weights, &blocks, &mut a, ahead);
                    }
                }
                let bits = |v: &[Vec<f32>]| -> Vec<u32> {
                    v.iter().flatten().map(|x| x.to_bits()).collect()
                };
                (bits(&scores), bits(&sums))
            };
            assert_eq!(run(true), run(false), "head_dim {D}, capacity {C}");
        }
        check::<64, 8>();
        check::<128, 16>();
        check::<256, 32>();
    }

    #[test]
    fn a_corrupt_sparse_entry_writes_nothing_past_its_row() {
        // head_dim 80: the second span's indices run to 127, past the row. A block whose
        // entries all count as the second span's (more than it holds), one of them at index
        // 63, decodes without touching what follows its row.
        let codec = OakenCodec::new(thresholds(), 80, 8).unwrap();
        let mut block = vec![0u8; codec.block_bytes()];
        codec.encode(&sample_rows(1, 80, 61), &mut block).unwrap();
        block[META_BYTES] = 0;
        block[META_BYTES + 1] = 200;
        block[codec.sparse_offset() + codec.outlier_capacity - 1] = 63;
        let mut decoded = vec![f32::NAN; 160];
        codec.decode_working(&block, &mut decoded[..80]);
        assert!(
            decoded[80..].iter().all(|x| x.is_nan()),
            "written past the row"
        );
        assert!(decoded[..80].iter().all(|x| x.is_finite()));
        // The scalar paths drop it too (they indexed past the dense codes), and score and sum
        // the row they decode. (Which of the corrupt entries that land on one element wins
        // may differ from the vector path's.)
        let mut plain = vec![f32::NAN; 80];
        codec.decode(&block, &mut plain);
        assert!(plain.iter().all(|x| x.is_finite()));
        let query = sample_rows(1, 80, 62);
        let mut prepared = vec![0.0; codec.query_len()];
        codec.prepare_query(&query, &mut prepared);
        let mut score = [0.0f32];
        codec.score(&prepared, &block, &mut score);
        let dot: f32 = query.iter().zip(&plain).map(|(q, x)| q * x).sum();
        assert!(
            (score[0] - dot).abs() <= 1e-3 * (1.0 + dot.abs()),
            "{} vs {dot}",
            score[0]
        );
        let mut acc = vec![0.0f32; codec.accumulator_len()];
        codec.accumulate(&[2.0], &block, &mut acc);
        for (a, x) in acc.iter().zip(&plain) {
            assert!((a - 2.0 * x).abs() <= 1e-4 * (1.0 + x.abs()));
        }
    }

    #[test]
    fn fused_score_and_accumulate_match_decode_then_dot() {
        let t = thresholds();
        for head_dim in [64, 128, 256] {
            let codec = OakenCodec::from_calibration(
                &Calibration {
                    oaken_thresholds: Some(t),
                    ..Calibration::default()
                },
                head_dim,
            )
            .unwrap();
            let rows = sample_rows(6, head_dim, 9);
            let query = sample_rows(1, head_dim, 10);
            let weights = [0.5f32, -1.0, 0.25, 2.0, 0.1, 0.7];
            let mut blocks = Vec::new();
            let mut decoded = Vec::new();
            for row in rows.chunks_exact(head_dim) {
                let (block, back) = encode(&codec, row);
                blocks.extend(block);
                decoded.push(back);
            }
            let mut scores = [0f32; 6];
            codec.score(&query, &blocks, &mut scores);
            let mut acc = vec![0f32; head_dim];
            codec.accumulate(&weights, &blocks, &mut acc);
            for (t, back) in decoded.iter().enumerate() {
                let want: f32 = back.iter().zip(&query).map(|(a, b)| a * b).sum();
                assert!((scores[t] - want).abs() < 1e-3, "{} vs {want}", scores[t]);
            }
            for (c, a) in acc.iter().enumerate() {
                let want: f32 = decoded.iter().zip(&weights).map(|(r, w)| w * r[c]).sum();
                assert!((a - want).abs() < 1e-4, "{a} vs {want}");
            }
        }
    }

    #[test]
    fn bits_per_element_count_scales_counts_and_capacity() {
        let cal = Calibration {
            oaken_thresholds: Some(thresholds()),
            ..Calibration::default()
        };
        for (head_dim, bytes, bits) in [(64, 49, 6.125), (128, 90, 5.625), (256, 172, 5.375)] {
            let codec = OakenCodec::from_calibration(&cal, head_dim).unwrap();
            assert_eq!(codec.outlier_capacity(), head_dim / 8);
            assert_eq!(codec.block_bytes(), bytes);
            assert_eq!(codec.bits_per_element(), bits);
        }
    }

    #[test]
    fn missing_or_bad_calibration_and_non_finite_rows_are_rejected() {
        let err = OakenCodec::from_calibration(&Calibration::default(), 128)
            .err()
            .unwrap();
        assert!(matches!(err, CodecError::MissingCalibration { .. }));
        assert!(err.to_string().contains("kvq calibrate"), "{err}");
        let unordered = OakenThresholds {
            lo_outer: 1.0,
            lo_inner: -1.0,
            hi_inner: 0.5,
            hi_outer: 2.0,
        };
        assert!(matches!(
            OakenCodec::new(unordered, 128, 16),
            Err(CodecError::InvalidCalibration { .. })
        ));
        assert!(OakenCodec::new(thresholds(), 100, 12).is_err());

        let codec = OakenCodec::new(thresholds(), 64, 8).unwrap();
        let mut block = vec![0u8; codec.block_bytes()];
        let mut row = vec![0.3f32; 64];
        row[9] = f32::NAN;
        assert!(matches!(
            codec.encode(&row, &mut block),
            Err(CodecError::NonFinite {
                row: 0,
                channel: 9,
                ..
            })
        ));
        row[9] = f32::INFINITY;
        assert!(matches!(
            codec.encode(&row, &mut block),
            Err(CodecError::NonFinite { channel: 9, .. })
        ));
        row[9] = 1e6; // finite, but its scale does not fit an f16
        assert!(matches!(
            codec.encode(&row, &mut block),
            Err(CodecError::NonFinite { channel: 9, .. })
        ));
    }
}
