//! Integer group kernels: attention's two inner loops on 8-bit levels, with AVX-512 VNNI.
//!
//! A codec whose working rows are small codes under one affine map per group of channels
//! describes where its bytes keep them with a [`LevelFormat`] ([`crate::Codec::level_format`]). The
//! default group kernels ([`crate::tile`]) then decode at most [`TILE_ROWS`] rows at a time
//! into unsigned 8-bit levels, `value = scale·level + offset` with one map per [`GROUP`]
//! channels, and compute with `vpdpbusd`: 64 products of u8 × i8 summed into 16 i32 lanes per
//! instruction, where the float kernels do 16 FMAs.
//!
//! * Scores: the prepared query carries an i8 copy of itself, one scale per 32 channels
//!   ([`quantize_query`], as llama.cpp's q8_0 activations). Sixteen rows are transposed so that
//!   each 32-bit lane holds one row, and each instruction adds 4 channels of 16 rows.
//! * Sums: per tile, head and 32 channels, the weights times the rows' scales are rounded to
//!   i8 against their largest magnitude. Four rows are interleaved byte-wise so that each lane
//!   holds one channel of 4 rows; the offsets' share is summed in f32.
//!
//! Both roundings are to nearest: a score differs from the float kernels' by at most
//! `Σ_g σ_g/2·Σ_{c∈g} |k_c|` (`σ_g` the query's scale of group `g`), one head's sum of channel
//! `c` by at most `τ/2·Σ_t level_tc` per tile (`τ` the weights' scale). A codec whose levels
//! come from a table of reals (TurboQuant's centroids) uses the nearest i8 table
//! ([`LevelTable::nearest`]): each value moves by at most half a table unit times its scale.
//!
//! The kernels need AVX-512 F/BW/DQ/VNNI/VBMI ([`available`]); elsewhere, and after
//! [`set_enabled`]`(false)`, the float kernels run.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Rows decoded per tile.
pub const TILE_ROWS: usize = 64;

/// Channels that share one query scale, one level map and one weight scale.
pub const GROUP: usize = 32;

/// Where a row keeps its codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CodeLayout {
    /// `bits`-bit codes (2, 3 or 4), least significant bit first as [`crate::bits`] packs
    /// them, from byte `at`; the level is the code (or its table entry).
    Packed {
        /// Byte offset of the first code.
        at: usize,
        /// Code width.
        bits: u32,
    },
    /// llama.cpp `q4_0`: per 32 channels a 2-byte scale, then 16 bytes holding channel `j` in
    /// the low nibble of byte `j` and channel `j + 16` in its high nibble.
    Q4_0,
}

/// Where a row keeps the affine map of each group of channels (little-endian f16 values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MapLayout {
    /// Channels per map (a multiple of [`GROUP`]).
    pub channels: usize,
    /// Byte of map 0's scale.
    pub scale_at: usize,
    /// Bytes from one map to the next.
    pub stride: usize,
    /// Byte of map 0's minimum, for `value = scale·level + min`; `None` for
    /// `value = scale·(level − zero)`.
    pub min_at: Option<usize>,
    /// The level that stands for 0 when there is no minimum.
    pub zero: f32,
}

/// Signed 8-bit levels for codes that index a table of reals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LevelTable {
    /// Level of each code.
    pub levels: [i8; 16],
    /// The real value of one level, relative to the row's scale.
    pub unit: f32,
}

impl LevelTable {
    /// The nearest i8 table to `values` (at most 16), scaled so that the largest magnitude is
    /// 127.
    pub fn nearest(values: &[f32]) -> Self {
        assert!(values.len() <= 16);
        let largest = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let unit = if largest > 0.0 { largest / 127.0 } else { 1.0 };
        let mut levels = [0i8; 16];
        for (l, v) in levels.iter_mut().zip(values) {
            *l = (v / unit).round().clamp(-127.0, 127.0) as i8;
        }
        Self { levels, unit }
    }
}

/// How a codec's stored rows (one per token) hold 8-bit levels and their maps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LevelFormat {
    /// Bytes per stored row.
    pub row_bytes: usize,
    /// Channels per row (the codec's working length).
    pub width: usize,
    /// Where the codes are.
    pub codes: CodeLayout,
    /// Where the maps are.
    pub maps: MapLayout,
    /// The table codes index, if any (then the level is `table[code] + 128` and `zero` 128).
    pub table: Option<LevelTable>,
}

impl LevelFormat {
    /// The level the kernels center on: the zero level where there is no minimum, the middle
    /// code otherwise. Rounding errors are then proportional to `level − center`.
    pub fn center(&self) -> f32 {
        match (self.maps.min_at, self.codes) {
            (Some(_), CodeLayout::Packed { bits, .. }) => (1u32 << (bits - 1)) as f32,
            _ => self.maps.zero,
        }
    }

    /// Whether the kernels take this format: 2- to 4-bit codes (8-bit caches keep the float
    /// kernels: at that rate the kernels' own rounding would rival the cache's), a width of
    /// whole 64-channel chunks (at most 512), maps over whole groups whose f16 words (at most
    /// [`MAP_WORDS`]) sit in the row's first 128 bytes.
    pub fn supported(&self) -> bool {
        let codes_fit = match self.codes {
            CodeLayout::Packed { at, bits } => {
                matches!(bits, 2..=4) && at + self.width / 8 * bits as usize <= self.row_bytes
            }
            CodeLayout::Q4_0 => self.width / GROUP * 18 <= self.row_bytes,
        };
        let m = self.maps;
        let maps = self.width / m.channels.max(1);
        // Every map word sits in the row's first 128 bytes, and all fit one record.
        let words_fit = |at: usize| at + (maps - 1) * m.stride + 2 <= self.row_bytes.min(128);
        self.width > 0
            && self.width <= 16 * GROUP
            && self.width.is_multiple_of(64)
            && m.channels.is_multiple_of(GROUP)
            && m.channels > 0
            && self.width.is_multiple_of(m.channels)
            && maps * (1 + usize::from(m.min_at.is_some())) <= MAP_WORDS
            && words_fit(m.scale_at)
            && m.min_at.is_none_or(words_fit)
            && codes_fit
    }
}

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the integer kernels on or off for the whole process (`kvq --f32-attention`).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the integer kernels run: the CPU has AVX-512 F/BW/DQ/VNNI/VBMI, they are enabled,
/// and [`crate::simd::force_scalar`] is not in effect.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        ENABLED.load(Ordering::Relaxed)
            && crate::simd::use_avx512()
            && *HAS.get_or_init(|| {
                std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vnni")
                    && std::is_x86_feature_detected!("avx512vbmi")
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// f32 slots that [`quantize_query`] appends to a prepared query of `width` channels.
pub fn query_slots(width: usize) -> usize {
    width / 4 + QUERY_MAP * (width / GROUP)
}

/// Slots per group after the codes: `σ_g`, `σ_g·Σ codes`, `Σ q` (exact).
const QUERY_MAP: usize = 3;

/// Writes the i8 form of `query` (`width` values, a multiple of [`GROUP`]) into `out`
/// ([`query_slots`] long): the codes, four to a slot, then for each group its scale `σ_g`
/// (largest magnitude / 127), `σ_g·Σ codes` and the exact `Σ q`.
pub fn quantize_query(query: &[f32], out: &mut [f32]) {
    let width = query.len();
    assert!(width.is_multiple_of(GROUP) && out.len() == query_slots(width));
    let (codes, maps) = out.split_at_mut(width / 4);
    let mut bytes = vec![0u8; width];
    for (g, (xs, bs)) in query
        .chunks_exact(GROUP)
        .zip(bytes.chunks_exact_mut(GROUP))
        .enumerate()
    {
        let largest = xs.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let scale = largest / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (b, x) in bs.iter_mut().zip(xs) {
            let code = (x * inv).round().clamp(-127.0, 127.0) as i8;
            sum += i32::from(code);
            *b = code as u8;
        }
        maps[QUERY_MAP * g] = scale;
        maps[QUERY_MAP * g + 1] = scale * sum as f32;
        maps[QUERY_MAP * g + 2] = xs.iter().sum();
    }
    for (slot, b) in codes.iter_mut().zip(bytes.chunks_exact(4)) {
        *slot = f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    }
}

/// Writes [`quantize_query`] of the first `width` values of `prepared` into its last
/// [`query_slots`]: the last step of a level codec's [`crate::Codec::prepare_query`].
pub fn finish_query(format: &LevelFormat, prepared: &mut [f32]) {
    let (head, tail) = prepared.split_at_mut(prepared.len() - query_slots(format.width));
    quantize_query(&head[..format.width], tail);
}

/// Decoded levels of a tile and their maps.
#[derive(Default)]
struct Tile {
    /// `TILE_ROWS × width` levels, row-major.
    levels: Vec<u8>,
    /// Scale of group `g` of row `r` at `g·TILE_ROWS + r`.
    scales: Vec<f32>,
    /// Value of the center level ([`LevelFormat::center`]) of group `g` of row `r` at
    /// `g·TILE_ROWS + r` (formats with a minimum only; 0 for the others).
    centers: Vec<f32>,
    /// Each row's map words (f16 scales, then minimums), [`MAP_WORDS`] per row.
    map_words: Vec<u16>,
    /// Rounded weights of the sums, `[head of a pass][group][TILE_ROWS]`.
    weights: Vec<i8>,
    /// Per head and group, 16 lanes of `Σ_t w_t·offset_t`, reduced once per call.
    offset_sums: Vec<f32>,
}

/// Map words kept per row: the scales and minimums of every map must fit.
pub const MAP_WORDS: usize = 8;

impl Tile {
    fn fit(&mut self, width: usize, heads: usize) {
        let groups = width / GROUP;
        self.levels.resize(TILE_ROWS * width, 0);
        self.scales.resize(groups * TILE_ROWS, 0.0);
        self.centers.resize(groups * TILE_ROWS, 0.0);
        self.map_words.resize(TILE_ROWS * MAP_WORDS, 0);
        self.weights.resize(4 * groups * TILE_ROWS, 0);
        self.offset_sums.clear();
        self.offset_sums.resize(heads * groups * 16, 0.0);
    }
}

thread_local! {
    static TILE: RefCell<Tile> = RefCell::new(Tile::default());
}

/// Calls `f(first_row, rows, tile)` for consecutive tiles of `blocks` decoded to levels.
fn for_each_tile(
    format: &LevelFormat,
    heads: usize,
    blocks: &[u8],
    mut f: impl FnMut(usize, usize, &mut Tile),
) {
    assert!(available() && format.supported());
    TILE.with(|tile| {
        let mut tile = tile.borrow_mut();
        tile.fit(format.width, heads);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `available` checked the CPU.
        let decoder = unsafe { avx512::Decoder::new(format) };
        for (i, chunk) in blocks.chunks(TILE_ROWS * format.row_bytes).enumerate() {
            let rows = chunk.len() / format.row_bytes;
            // SAFETY: the format is supported, so every row holds its codes and maps, and the
            // tile is sized for the width.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                decoder.decode(chunk, rows, &mut tile)
            };
            f(i * TILE_ROWS, rows, &mut tile);
        }
    });
}

/// [`crate::Codec::score_group`] with the integer kernels: `queries[h]` are prepared queries
/// whose last [`query_slots`] values came from [`quantize_query`].
pub fn score_group(
    format: &LevelFormat,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
) {
    let slots = query_slots(format.width);
    let quantized: Vec<&[f32]> = queries.iter().map(|q| &q[q.len() - slots..]).collect();
    for_each_tile(format, 0, blocks, |first, rows, tile| {
        // SAFETY: as in `for_each_tile`; each score row holds the tile's rows.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            avx512::score_tile(tile, format, rows, &quantized, scores, first)
        };
    });
}

/// [`crate::Codec::accumulate_group`] with the integer kernels.
pub fn accumulate_group(
    format: &LevelFormat,
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
) {
    let groups = format.width / GROUP;
    for_each_tile(format, weights.len(), blocks, |first, rows, tile| {
        // SAFETY: as in `for_each_tile`; each weight row holds the tile's rows and each
        // accumulator `width` values.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            avx512::accumulate_tile(tile, format, first, rows, weights, accs)
        };
    });
    TILE.with(|tile| {
        let tile = tile.borrow();
        for (acc, sums) in accs
            .iter_mut()
            .zip(tile.offset_sums.chunks_exact(groups * 16))
        {
            for (a, lanes) in acc[..format.width]
                .chunks_exact_mut(GROUP)
                .zip(sums.chunks_exact(16))
            {
                let offset: f32 = lanes.iter().sum();
                a.iter_mut().for_each(|x| *x += offset);
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{CodeLayout, LevelFormat, Tile, GROUP, MAP_WORDS, TILE_ROWS};
    use std::arch::x86_64::*;

    /// A 64-byte constant as a vector.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi")]
    unsafe fn bytes(b: [u8; 64]) -> __m512i {
        _mm512_loadu_si512(b.as_ptr() as *const _)
    }

    /// The mask of the first `n` bytes of 64.
    fn first_bytes(n: usize) -> __mmask64 {
        if n >= 64 {
            !0
        } else {
            (1u64 << n) - 1
        }
    }

    /// The mask of the first `n` of 16 lanes.
    fn first_lanes(n: usize) -> __mmask16 {
        if n >= 16 {
            !0
        } else {
            (1u16 << n) - 1
        }
    }

    /// Decodes rows of one [`LevelFormat`] into tiles. Codes: a byte permutation that puts
    /// the bytes of codes `8k..8k+8` in qword `k`, per-byte bit shifts (`vpmultishiftqb`), a
    /// mask, and the table (`vpshufb`). Maps: a byte permutation of
    /// the row's first 128 bytes gathers its f16 words, regrouped per 16 rows.
    pub struct Decoder {
        format: LevelFormat,
        permute: __m512i,
        shifts: __m512i,
        mask: __m512i,
        /// Source bytes per 64 codes, and the mask that loads exactly them.
        chunk_bytes: usize,
        chunk_load: __mmask64,
        /// First code byte.
        codes_at: usize,
        table: Option<__m512i>,
        /// Byte permutation (over the row's bytes 0..128) that gathers the map words.
        words: __m512i,
        row_lo: __mmask64,
        row_hi: __mmask64,
        maps: usize,
    }

    impl Decoder {
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi")]
        pub unsafe fn new(format: &LevelFormat) -> Self {
            let (permute, shifts, bits, chunk_bytes, codes_at): (
                [u8; 64],
                [u8; 64],
                u32,
                usize,
                usize,
            ) = match format.codes {
                // Qword k holds the `bits` bytes of codes 8k..8k+8; code m sits at bit m·bits.
                CodeLayout::Packed { at, bits } => {
                    let b = bits as usize;
                    (
                        std::array::from_fn(|j| ((j / 8) * b + (j % 8).min(b - 1)) as u8),
                        std::array::from_fn(|j| ((j % 8) * b) as u8),
                        bits,
                        8 * b,
                        at,
                    )
                }
                // Two blocks of 18 bytes; qwords 0..4 are block 0's channels 0–7, 8–15
                // (low nibbles of bytes 2–9, 10–17) and 16–23, 24–31 (their high nibbles).
                CodeLayout::Q4_0 => (
                    std::array::from_fn(|j| {
                        let k = j / 8;
                        (18 * (k / 4) + 2 + 8 * (k % 2) + j % 8) as u8
                    }),
                    std::array::from_fn(|j| {
                        (8 * (j % 8) + if (j / 16) % 2 == 1 { 4 } else { 0 }) as u8
                    }),
                    4,
                    36,
                    0,
                ),
            };
            let m = format.maps;
            let maps = format.width / m.channels;
            let words: [u8; 64] = std::array::from_fn(|j| {
                let (word, byte) = (j / 2, j % 2);
                let at = match m.min_at {
                    _ if word < maps => m.scale_at + word * m.stride,
                    Some(min_at) if word < 2 * maps => min_at + (word - maps) * m.stride,
                    _ => 0,
                };
                (at + byte) as u8
            });
            Self {
                format: *format,
                permute: bytes(permute),
                shifts: bytes(shifts),
                mask: _mm512_set1_epi8(((1u32 << bits) - 1) as u8 as i8),
                chunk_bytes,
                chunk_load: first_bytes(chunk_bytes),
                codes_at,
                table: format.table.map(|t| {
                    let biased: [u8; 16] = std::array::from_fn(|i| (t.levels[i] as u8) ^ 0x80);
                    _mm512_broadcast_i32x4(_mm_loadu_si128(biased.as_ptr() as *const _))
                }),
                words: bytes(words),
                row_lo: first_bytes(format.row_bytes),
                row_hi: first_bytes(format.row_bytes.saturating_sub(64)),
                maps,
            }
        }

        /// Decodes the `n ≤ TILE_ROWS` rows of `rows` into `tile`.
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,f16c")]
        pub unsafe fn decode(&self, rows: &[u8], n: usize, tile: &mut Tile) {
            let (w, rb) = (self.format.width, self.format.row_bytes);
            assert!(n <= TILE_ROWS && rows.len() >= n * rb && tile.levels.len() >= n * w);
            assert!(tile.map_words.len() >= TILE_ROWS * MAP_WORDS);
            let levels = tile.levels.as_mut_ptr();
            let words = tile.map_words.as_mut_ptr();
            for r in 0..n {
                let row = rows.as_ptr().add(r * rb);
                let out = levels.add(r * w);
                for c in 0..w / 64 {
                    let p = row.add(self.codes_at + c * self.chunk_bytes);
                    let src = _mm512_maskz_loadu_epi8(self.chunk_load, p as *const i8);
                    let placed = _mm512_permutexvar_epi8(self.permute, src);
                    let mut v = _mm512_and_si512(
                        _mm512_multishift_epi64_epi8(self.shifts, placed),
                        self.mask,
                    );
                    if let Some(t) = self.table {
                        v = _mm512_shuffle_epi8(t, v);
                    }
                    _mm512_storeu_si512(out.add(64 * c) as *mut _, v);
                }
                let lo = _mm512_maskz_loadu_epi8(self.row_lo, row as *const i8);
                let hi = _mm512_maskz_loadu_epi8(self.row_hi, row.wrapping_add(64) as *const i8);
                let record = _mm512_permutex2var_epi8(lo, self.words, hi);
                _mm_storeu_si128(
                    words.add(r * MAP_WORDS) as *mut _,
                    _mm512_castsi512_si128(record),
                );
            }
            self.regroup_maps(n, tile);
        }

        /// Turns the rows' map words into per-group vectors of scales and center values.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,f16c")]
        unsafe fn regroup_maps(&self, n: usize, tile: &mut Tile) {
            let m = self.format.maps;
            let unit = _mm512_set1_ps(self.format.table.map_or(1.0, |t| t.unit));
            let center = _mm512_set1_ps(self.format.center());
            for block in (0..n).step_by(16) {
                let p = tile.map_words.as_ptr().add(block * MAP_WORDS) as *const __m512i;
                let z = [
                    _mm512_loadu_si512(p as *const _),
                    _mm512_loadu_si512(p.add(1) as *const _),
                    _mm512_loadu_si512(p.add(2) as *const _),
                    _mm512_loadu_si512(p.add(3) as *const _),
                ];
                for map in 0..self.maps {
                    let scale = _mm512_mul_ps(map_word(&z, map), unit);
                    // `min + scale·center`: the value of the center level.
                    let center_value = match m.min_at {
                        Some(_) => _mm512_fmadd_ps(scale, center, map_word(&z, self.maps + map)),
                        None => _mm512_setzero_ps(),
                    };
                    for g in map * m.channels / GROUP..(map + 1) * m.channels / GROUP {
                        let at = g * TILE_ROWS + block;
                        _mm512_storeu_ps(tile.scales.as_mut_ptr().add(at), scale);
                        _mm512_storeu_ps(tile.centers.as_mut_ptr().add(at), center_value);
                    }
                }
            }
        }
    }

    /// Word `k` of 16 rows' map records (rows 0..4 in `z[0]`, 4..8 in `z[1]`, ...), as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,f16c")]
    unsafe fn map_word(z: &[__m512i; 4], k: usize) -> __m512 {
        let idx: [u16; 32] = std::array::from_fn(|i| ((i % 8) * MAP_WORDS + k) as u16);
        let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
        let rows_0_8 = _mm512_permutex2var_epi16(z[0], idx, z[1]);
        let rows_8_16 = _mm512_permutex2var_epi16(z[2], idx, z[3]);
        let halves = _mm256_inserti128_si256::<1>(
            _mm512_castsi512_si256(rows_0_8),
            _mm512_castsi512_si128(rows_8_16),
        );
        _mm512_cvtph_ps(halves)
    }

    /// Transposes 16 rows of 16 i32 lanes: lane `r` of output `j` is lane `j` of input `r`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi")]
    unsafe fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
        // Within each 128-bit lane, 4×4 blocks of rows 4i..4i+4.
        let mut u = [_mm512_setzero_si512(); 16];
        for i in 0..4 {
            let t0 = _mm512_unpacklo_epi32(r[4 * i], r[4 * i + 1]);
            let t1 = _mm512_unpackhi_epi32(r[4 * i], r[4 * i + 1]);
            let t2 = _mm512_unpacklo_epi32(r[4 * i + 2], r[4 * i + 3]);
            let t3 = _mm512_unpackhi_epi32(r[4 * i + 2], r[4 * i + 3]);
            u[4 * i] = _mm512_unpacklo_epi64(t0, t2);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t0, t2);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t1, t3);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t1, t3);
        }
        // u[4i + m], 128-bit lane L: rows 4i..4i+4 of column 4L + m. Transpose the lanes.
        let mut out = [_mm512_setzero_si512(); 16];
        for m in 0..4 {
            let v0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u[m], u[4 + m]);
            let v1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u[m], u[4 + m]);
            let v2 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u[8 + m], u[12 + m]);
            let v3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u[8 + m], u[12 + m]);
            out[m] = _mm512_shuffle_i32x4::<0b10_00_10_00>(v0, v2);
            out[4 + m] = _mm512_shuffle_i32x4::<0b11_01_11_01>(v0, v2);
            out[8 + m] = _mm512_shuffle_i32x4::<0b10_00_10_00>(v1, v3);
            out[12 + m] = _mm512_shuffle_i32x4::<0b11_01_11_01>(v1, v3);
        }
        out
    }

    /// Heads whose accumulators a score pass keeps in registers.
    const SCORE_HEADS: usize = 8;

    /// Scores of the tile's `n` rows for every query, into `scores[h][first..first + n]`:
    /// per group, `scale·σ·(Σ codes·levels − center·Σ codes) + center_value·Σ q`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi")]
    pub unsafe fn score_tile(
        tile: &Tile,
        format: &LevelFormat,
        n: usize,
        queries: &[&[f32]],
        scores: &mut [&mut [f32]],
        first: usize,
    ) {
        let w = format.width;
        let center = format.center();
        let has_min = format.maps.min_at.is_some();
        assert!(queries.iter().all(|q| q.len() == super::query_slots(w)));
        assert!(scores.iter().all(|s| s.len() >= first + n) && n <= TILE_ROWS);
        for h0 in (0..queries.len()).step_by(SCORE_HEADS) {
            let heads = &queries[h0..queries.len().min(h0 + SCORE_HEADS)];
            for block in (0..n).step_by(16) {
                let mut acc = [_mm512_setzero_ps(); SCORE_HEADS];
                for half in 0..w / 64 {
                    let mut rows = [_mm512_setzero_si512(); 16];
                    for (r, row) in rows.iter_mut().enumerate() {
                        let p = tile.levels.as_ptr().add((block + r) * w + 64 * half);
                        *row = _mm512_loadu_si512(p as *const _);
                    }
                    let columns = transpose16(&rows);
                    for (a, q) in acc.iter_mut().zip(heads) {
                        let codes = q.as_ptr() as *const i32;
                        for part in 0..2 {
                            let g = 2 * half + part;
                            let mut dot = _mm512_setzero_si512();
                            for j in 0..8 {
                                let qj = _mm512_set1_epi32(*codes.add(8 * g + j));
                                dot = _mm512_dpbusd_epi32(dot, columns[8 * part + j], qj);
                            }
                            let at = g * TILE_ROWS + block;
                            let scale = _mm512_loadu_ps(tile.scales.as_ptr().add(at));
                            let map = q.as_ptr().add(w / 4 + super::QUERY_MAP * g);
                            let x = _mm512_fmsub_ps(
                                _mm512_cvtepi32_ps(dot),
                                _mm512_set1_ps(*map),
                                _mm512_set1_ps(center * *map.add(1)),
                            );
                            *a = _mm512_fmadd_ps(x, scale, *a);
                            if has_min {
                                let value = _mm512_loadu_ps(tile.centers.as_ptr().add(at));
                                *a = _mm512_fmadd_ps(value, _mm512_set1_ps(*map.add(2)), *a);
                            }
                        }
                    }
                }
                let mask = first_lanes(n - block);
                for (h, a) in acc.iter().enumerate().take(heads.len()) {
                    let out = scores[h0 + h].as_mut_ptr().add(first + block);
                    _mm512_mask_storeu_ps(out, mask, *a);
                }
            }
        }
    }

    /// The byte permutation that interleaves two rows' channels in pairs so that the 16-bit
    /// unpacks of two such pairs give 16 consecutive channels of 4 rows: in 128-bit lane `L`,
    /// words 0–3 are channels `base + 4L..`, words 4–7 channels `base + 16 + 4L..`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi")]
    unsafe fn pair_permute(base: usize) -> __m512i {
        bytes(std::array::from_fn(|j| {
            let (lane, word, second) = (j / 16, (j % 16) / 2, j % 2);
            let c = base + 4 * lane + if word < 4 { word } else { 12 + word };
            (c + 64 * second) as u8
        }))
    }

    /// Heads whose integer sums one pass keeps in registers.
    const SUM_HEADS: usize = 4;

    /// Most groups a row may have (`width ≤ 512`).
    const MAX_GROUPS: usize = 16;

    /// Vectors of 16 rows in a tile.
    const VECTORS: usize = TILE_ROWS / 16;

    /// `accs[h] += Σ_t weights[h][first + t]·row_t` over the tile's `n` rows: per group,
    /// `step·(Σ codes·levels − center·Σ codes)` in the accumulators and `Σ w·center_value`
    /// in `tile.offset_sums[(h·groups + g)·16..][..16]`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi")]
    pub unsafe fn accumulate_tile(
        tile: &mut Tile,
        format: &LevelFormat,
        first: usize,
        n: usize,
        weights: &[&[f32]],
        accs: &mut [&mut [f32]],
    ) {
        let w = format.width;
        let groups = w / GROUP;
        let center = format.center();
        let has_min = format.maps.min_at.is_some();
        assert!(groups <= MAX_GROUPS && n <= TILE_ROWS);
        assert!(weights.iter().all(|x| x.len() >= first + n));
        assert!(accs.iter().all(|a| a.len() >= w));
        assert!(tile.offset_sums.len() == weights.len() * groups * 16);
        assert!(tile.weights.len() >= SUM_HEADS * groups * TILE_ROWS);
        // Lanes of 16 rows, masked to the tile's rows.
        let masks: [__mmask16; VECTORS] =
            std::array::from_fn(|i| first_lanes(n.saturating_sub(16 * i)));
        // Each group's scales over its largest magnitude in the tile.
        let mut largest_scale = [0f32; MAX_GROUPS];
        let mut relative_scales = [[_mm512_setzero_ps(); VECTORS]; MAX_GROUPS];
        for g in 0..groups {
            let s = tile.scales.as_ptr().add(g * TILE_ROWS);
            let mut largest = _mm512_setzero_ps();
            for (i, r) in relative_scales[g].iter_mut().enumerate() {
                *r = _mm512_maskz_loadu_ps(masks[i], s.add(16 * i));
                largest = _mm512_max_ps(largest, _mm512_abs_ps(*r));
            }
            largest_scale[g] = _mm512_reduce_max_ps(largest);
            let inv = if largest_scale[g] > 0.0 {
                1.0 / largest_scale[g]
            } else {
                0.0
            };
            for r in relative_scales[g].iter_mut() {
                *r = _mm512_mul_ps(*r, _mm512_set1_ps(inv));
            }
        }
        let (lo, hi) = (pair_permute(0), pair_permute(32));
        let quads = n.div_ceil(4);
        for h0 in (0..weights.len()).step_by(SUM_HEADS) {
            let heads = weights.len().min(h0 + SUM_HEADS) - h0;
            // Each head's weights times the rows' scales, rounded against their largest:
            // `round(127·(w/max w)·(scale/max scale))`, one step per head and group.
            let mut steps = [[0f32; MAX_GROUPS]; SUM_HEADS];
            for (hh, step_h) in steps.iter_mut().enumerate().take(heads) {
                let h = h0 + hh;
                let wp = weights[h].as_ptr().add(first);
                let mut wv = [_mm512_setzero_ps(); VECTORS];
                let mut largest = _mm512_setzero_ps();
                for (i, x) in wv.iter_mut().enumerate() {
                    *x = _mm512_maskz_loadu_ps(masks[i], wp.wrapping_add(16 * i));
                    largest = _mm512_max_ps(largest, _mm512_abs_ps(*x));
                }
                let largest_weight = _mm512_reduce_max_ps(largest);
                let to_levels = _mm512_set1_ps(if largest_weight > 0.0 {
                    127.0 / largest_weight
                } else {
                    0.0
                });
                for g in 0..groups {
                    let step = largest_weight * largest_scale[g] / 127.0;
                    step_h[g] = step;
                    let sums = tile.offset_sums.as_mut_ptr().add((h * groups + g) * 16);
                    let mut offset_sum = _mm512_loadu_ps(sums);
                    let mut code_sum = _mm512_setzero_si512();
                    for (i, &x) in wv.iter().enumerate() {
                        if has_min {
                            let at = g * TILE_ROWS + 16 * i;
                            let value = _mm512_loadu_ps(tile.centers.as_ptr().add(at));
                            offset_sum = _mm512_fmadd_ps(x, value, offset_sum);
                        }
                        let scaled =
                            _mm512_mul_ps(_mm512_mul_ps(x, to_levels), relative_scales[g][i]);
                        let codes = _mm512_cvtps_epi32(scaled);
                        code_sum = _mm512_add_epi32(code_sum, codes);
                        let out = tile
                            .weights
                            .as_mut_ptr()
                            .add((hh * groups + g) * TILE_ROWS + 16 * i);
                        _mm_storeu_si128(out as *mut _, _mm512_cvtepi32_epi8(codes));
                    }
                    // The sums add `step·code·level`; `−step·center·Σ code` centers them.
                    let correction = _mm512_set1_ps(-step * center);
                    offset_sum =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(code_sum), correction, offset_sum);
                    _mm512_storeu_ps(sums, offset_sum);
                }
            }
            for half in 0..w / 64 {
                let mut sums = [[_mm512_setzero_si512(); 4]; SUM_HEADS];
                for k in 0..quads {
                    // Rows past `n` (at most 3) hold stale levels under zero weights.
                    let p = tile.levels.as_ptr().add(4 * k * w + 64 * half);
                    let r0 = _mm512_loadu_si512(p as *const _);
                    let r1 = _mm512_loadu_si512(p.add(w) as *const _);
                    let r2 = _mm512_loadu_si512(p.add(2 * w) as *const _);
                    let r3 = _mm512_loadu_si512(p.add(3 * w) as *const _);
                    let (p01a, p01b) = (
                        _mm512_permutex2var_epi8(r0, lo, r1),
                        _mm512_permutex2var_epi8(r0, hi, r1),
                    );
                    let (p23a, p23b) = (
                        _mm512_permutex2var_epi8(r2, lo, r3),
                        _mm512_permutex2var_epi8(r2, hi, r3),
                    );
                    let x = [
                        _mm512_unpacklo_epi16(p01a, p23a),
                        _mm512_unpackhi_epi16(p01a, p23a),
                        _mm512_unpacklo_epi16(p01b, p23b),
                        _mm512_unpackhi_epi16(p01b, p23b),
                    ];
                    for (hh, s) in sums.iter_mut().enumerate().take(heads) {
                        let wq = tile
                            .weights
                            .as_ptr()
                            .add((hh * groups + 2 * half) * TILE_ROWS + 4 * k);
                        let w0 = _mm512_set1_epi32(std::ptr::read_unaligned(wq as *const i32));
                        let w1 = _mm512_set1_epi32(std::ptr::read_unaligned(
                            wq.add(TILE_ROWS) as *const i32
                        ));
                        s[0] = _mm512_dpbusd_epi32(s[0], x[0], w0);
                        s[1] = _mm512_dpbusd_epi32(s[1], x[1], w0);
                        s[2] = _mm512_dpbusd_epi32(s[2], x[2], w1);
                        s[3] = _mm512_dpbusd_epi32(s[3], x[3], w1);
                    }
                }
                for (hh, s) in sums.iter().enumerate().take(heads) {
                    let acc = accs[h0 + hh].as_mut_ptr().add(64 * half);
                    for (x, &sum) in s.iter().enumerate() {
                        let step = _mm512_set1_ps(steps[hh][2 * half + x / 2]);
                        let a = acc.add(16 * x);
                        let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), step, _mm512_loadu_ps(a));
                        _mm512_storeu_ps(a, v);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_codec, Calibration, Codec, Role, SchemeKind};
    use half::f16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The level of channel `c` of `row`, read plainly from the layout.
    fn level(format: &LevelFormat, row: &[u8], c: usize) -> u8 {
        let code = match format.codes {
            CodeLayout::Packed { at, bits } => crate::bits::get(&row[at..], bits, c),
            CodeLayout::Q4_0 => {
                let byte = row[18 * (c / 32) + 2 + c % 16];
                if c % 32 < 16 {
                    byte & 15
                } else {
                    byte >> 4
                }
            }
        };
        match format.table {
            Some(t) => (t.levels[usize::from(code)] as u8) ^ 0x80,
            None => code,
        }
    }

    /// The map `(scale, offset)` of channel `c` of `row`.
    fn map(format: &LevelFormat, row: &[u8], c: usize) -> (f64, f64) {
        let m = format.maps;
        let at = (c / m.channels) * m.stride;
        let f16_at = |i: usize| f64::from(f16::from_le_bytes([row[i], row[i + 1]]).to_f32());
        let unit = f64::from(format.table.map_or(1.0, |t| t.unit));
        let scale = f16_at(m.scale_at + at) * unit;
        let offset = match m.min_at {
            Some(min_at) => f16_at(min_at + at),
            None => -f64::from(m.zero) * scale,
        };
        (scale, offset)
    }

    /// A scheme with a level format: its label, codec, format, encoded rows and their
    /// working-space decoding.
    type LevelCase = (String, Box<dyn Codec>, LevelFormat, Vec<u8>, Vec<f32>);

    /// Encoded random rows of every scheme with a level format.
    fn level_codecs(rows: usize) -> Vec<LevelCase> {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut out = Vec::new();
        for name in crate::scheme_names() {
            for head_dim in [64, 128, 256] {
                for role in [Role::Key, Role::Value] {
                    let kind = SchemeKind::parse(&name).unwrap();
                    let Ok(codec) = build_codec(kind, role, head_dim, &Calibration::default(), 9)
                    else {
                        continue;
                    };
                    let Some(format) = codec.level_format() else {
                        continue;
                    };
                    let values: Vec<f32> = (0..rows * head_dim)
                        .map(|i| rng.gen_range(-1.0..1.0f32) * if i % 13 == 2 { 9.0 } else { 1.0 })
                        .collect();
                    let mut bytes = vec![0u8; rows * codec.block_bytes()];
                    for (v, b) in values
                        .chunks_exact(head_dim)
                        .zip(bytes.chunks_exact_mut(codec.block_bytes()))
                    {
                        codec.encode(v, b).unwrap();
                    }
                    let mut working = vec![0f32; rows * codec.working_len()];
                    codec.decode_working(&bytes, &mut working);
                    out.push((
                        format!("{name} {role:?} d{head_dim}"),
                        codec,
                        format,
                        bytes,
                        working,
                    ));
                }
            }
        }
        out
    }

    #[test]
    fn the_schemes_with_levels_are_the_integer_and_single_codebook_ones() {
        let names: Vec<String> = level_codecs(1)
            .into_iter()
            .filter(|(n, ..)| n.ends_with("d128") && n.contains("Key"))
            .map(|(n, ..)| n.split(' ').next().unwrap().to_string())
            .collect();
        for want in [
            "q4_0",
            "int4",
            "int3",
            "int2",
            "int4-g128",
            "turbo4",
            "turbo3",
            "turbo2",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} has no level format: {names:?}"
            );
        }
        for not in [
            "int8",
            "q8_0",
            "q4_1",
            "kivi4",
            "turbo3.5",
            "turbo3-prod",
            "fp8",
            "oaken",
        ] {
            assert!(
                !names.iter().any(|n| n == not),
                "{not} should keep the float kernels"
            );
        }
    }

    /// The layouts read plainly give the codec's own decoded values: exactly for integer
    /// codes, within half a table unit for table codes.
    #[test]
    fn formats_describe_the_codecs_bytes() {
        for (name, codec, format, bytes, working) in level_codecs(5) {
            let w = format.width;
            for (t, row) in bytes.chunks_exact(format.row_bytes).enumerate() {
                for c in 0..w {
                    let (scale, offset) = map(&format, row, c);
                    let value = scale * f64::from(level(&format, row, c)) + offset;
                    let want = f64::from(working[t * codec.working_len() + c]);
                    let slack = if format.table.is_some() {
                        scale.abs() / 2.0
                    } else {
                        0.0
                    };
                    assert!(
                        (value - want).abs() <= slack + 1e-5 * (1.0 + want.abs()),
                        "{name} row {t} channel {c}: {value} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn quantized_queries_round_to_nearest_within_half_a_step() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let q: Vec<f32> = (0..128)
            .map(|i| rng.gen_range(-2.0..2.0f32) * (1 + i % 5) as f32)
            .collect();
        let mut slots = vec![0f32; query_slots(128)];
        quantize_query(&q, &mut slots);
        let codes: Vec<i8> = slots[..32]
            .iter()
            .flat_map(|s| s.to_bits().to_le_bytes())
            .map(|b| b as i8)
            .collect();
        for g in 0..4 {
            let xs = &q[32 * g..32 * (g + 1)];
            let largest = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
            let sigma = slots[32 + 3 * g];
            assert_eq!(sigma, largest / 127.0);
            let sum: i32 = codes[32 * g..32 * (g + 1)]
                .iter()
                .map(|&c| i32::from(c))
                .sum();
            assert_eq!(slots[33 + 3 * g], sigma * sum as f32);
            assert_eq!(slots[34 + 3 * g], xs.iter().sum::<f32>());
            for (x, &c) in xs.iter().zip(&codes[32 * g..]) {
                assert!(
                    (x - sigma * f32::from(c)).abs() <= sigma / 2.0 * 1.0001,
                    "{x} {c} {sigma}"
                );
            }
            assert!(codes[32 * g..32 * (g + 1)].iter().any(|c| c.abs() == 127));
        }
    }

    /// Scores: within `Σ_c σ_g/2·scale·|level_c − center|` of the exact dot with the level
    /// values, and equal (to float rounding) to the integer algorithm written plainly.
    #[test]
    fn integer_scores_match_the_plain_algorithm_and_the_rounding_bound() {
        if !available() {
            eprintln!("no AVX-512 VNNI/VBMI here: the integer kernels are not used");
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let rows = 75; // two whole tiles and a partial one, a partial 16-row block
        for (name, codec, format, bytes, _) in level_codecs(rows) {
            let w = format.width;
            for heads in [1, 4, 9] {
                let prepared: Vec<Vec<f32>> = (0..heads)
                    .map(|_| {
                        let q: Vec<f32> = (0..codec.head_dim())
                            .map(|_| rng.gen_range(-1.0..1.0))
                            .collect();
                        let mut p = vec![0f32; codec.query_len()];
                        codec.prepare_query(&q, &mut p);
                        p
                    })
                    .collect();
                let refs: Vec<&[f32]> = prepared.iter().map(Vec::as_slice).collect();
                let mut scores = vec![vec![f32::NAN; rows + 3]; heads];
                let mut outs: Vec<&mut [f32]> = scores.iter_mut().map(|s| &mut s[..rows]).collect();
                score_group(&format, &refs, &bytes, &mut outs);
                for h in 0..heads {
                    let q = &prepared[h][..w];
                    let slots = &prepared[h][prepared[h].len() - query_slots(w)..];
                    let codes: Vec<i8> = slots[..w / 4]
                        .iter()
                        .flat_map(|s| s.to_bits().to_le_bytes())
                        .map(|b| b as i8)
                        .collect();
                    let center = f64::from(format.center());
                    for (t, row) in bytes.chunks_exact(format.row_bytes).enumerate() {
                        let (mut exact, mut plain, mut bound) = (0f64, 0f64, 0f64);
                        for c in 0..w {
                            let (scale, offset) = map(&format, row, c);
                            let centered = scale * (f64::from(level(&format, row, c)) - center);
                            let center_value = scale * center + offset;
                            let sigma = f64::from(slots[w / 4 + 3 * (c / GROUP)]);
                            exact += f64::from(q[c]) * (centered + center_value);
                            plain += sigma * f64::from(codes[c]) * centered
                                + f64::from(q[c]) * center_value;
                            bound += sigma / 2.0 * centered.abs();
                        }
                        let got = f64::from(scores[h][t]);
                        let rounding = 1e-5 * (1.0 + bound * 254.0);
                        assert!(
                            (got - plain).abs() <= rounding,
                            "{name} head {h} row {t}: {got} vs plain {plain}"
                        );
                        assert!(
                            (got - exact).abs() <= bound + rounding,
                            "{name} head {h} row {t}: {got} vs exact {exact} (bound {bound})"
                        );
                    }
                    assert!(
                        scores[h][rows..].iter().all(|s| s.is_nan()),
                        "{name}: wrote past the rows"
                    );
                }
            }
        }
    }

    /// Sums: equal to the integer algorithm written plainly, and within
    /// `step/2·Σ_t |level_t − center|` per tile of the exact sum.
    #[test]
    fn integer_sums_match_the_plain_algorithm_and_the_rounding_bound() {
        if !available() {
            eprintln!("no AVX-512 VNNI/VBMI here: the integer kernels are not used");
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let rows = 75;
        for (name, codec, format, bytes, _) in level_codecs(rows) {
            let w = format.width;
            for heads in [1, 4, 6] {
                let weights: Vec<Vec<f32>> = (0..heads)
                    .map(|_| {
                        (0..rows)
                            .map(|_| rng.gen_range(0.0..1.0f32).powi(3))
                            .collect()
                    })
                    .collect();
                let refs: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
                let mut accs = vec![vec![0.25f32; codec.accumulator_len()]; heads];
                let mut outs: Vec<&mut [f32]> = accs.iter_mut().map(Vec::as_mut_slice).collect();
                accumulate_group(&format, &refs, &bytes, &mut outs);
                let row = |t: usize| &bytes[t * format.row_bytes..][..format.row_bytes];
                let center = f64::from(format.center());
                for h in 0..heads {
                    for (c, &got) in accs[h][..w].iter().enumerate() {
                        let (mut exact, mut plain, mut bound) = (0.25f64, 0.25f64, 0f64);
                        // Sum of the terms' magnitudes, for the f32 rounding of the sums.
                        let mut magnitude = 1.0f64;
                        for first in (0..rows).step_by(TILE_ROWS) {
                            let tile = first..rows.min(first + TILE_ROWS);
                            let largest_w = tile
                                .clone()
                                .map(|t| weights[h][t].abs())
                                .fold(0f32, f32::max);
                            let largest_a = tile
                                .clone()
                                .map(|t| map(&format, row(t), c).0.abs() as f32)
                                .fold(0f32, f32::max);
                            let step = f64::from(largest_w * largest_a / 127.0);
                            for t in tile {
                                let (scale, offset) = map(&format, row(t), c);
                                let centered = f64::from(level(&format, row(t), c)) - center;
                                let wt = f64::from(weights[h][t]);
                                let center_value = scale * center + offset;
                                exact += wt * (scale * centered + center_value);
                                // The kernel's arithmetic, in f32.
                                let to_levels = if largest_w > 0.0 {
                                    127.0 / largest_w
                                } else {
                                    0.0
                                };
                                let relative = scale as f32
                                    * if largest_a > 0.0 {
                                        1.0 / largest_a
                                    } else {
                                        0.0
                                    };
                                let code = (weights[h][t] * to_levels * relative).round_ties_even();
                                let rounded = f64::from(code) * step;
                                plain += rounded * centered + wt * center_value;
                                bound += step / 2.0 * centered.abs();
                                magnitude += wt.abs()
                                    * (scale.abs() * (centered.abs() + 2.0 * center)
                                        + center_value.abs());
                            }
                        }
                        let got = f64::from(got);
                        let rounding = 1e-5 * magnitude;
                        assert!(
                            (got - plain).abs() <= rounding,
                            "{name} head {h} channel {c}: {got} vs plain {plain}"
                        );
                        assert!(
                            (got - exact).abs() <= bound + rounding,
                            "{name} head {h} channel {c}: {got} vs exact {exact} (bound {bound})"
                        );
                    }
                }
            }
        }
    }
}
