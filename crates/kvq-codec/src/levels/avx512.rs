//! The AVX-512 kernels of the parent module (F/BW/DQ/VNNI/VBMI/VBMI2): scores of 16 rows at
//! a time, transposed from the row layout or read from an interleaved block ([`Rows`],
//! [`Blocks`]), as `vpdpbusd` of cut codes against the query's i8 slots ([`QuerySlots`]); the
//! value sums per tile of [`TILE_ROWS`] rows against the weights rounded per tile, head and
//! map, 4 rows interleaved per lane ([`accumulate_tile`]); and the codes' decoders
//! ([`Decoder`]).

use super::{
    Ahead, CodeLayout, LevelFormat, Tile, GROUP, INTERLEAVED_ROWS, MAP_WORDS, MAX_GROUPS,
    QUERY_MAP, TILE_ROWS,
};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// `$pass!(H, B)` for a pass over `heads` heads (`H` = 1 to 4, and 4 for more) and codes of
/// `bits` bits (`B` = 1, 2, 3 or 5, and 4 for any other): the kernels are compiled for each
/// pair, their loops unrolled for it.
macro_rules! for_heads_and_bits {
    ($heads:expr, $bits:expr, $pass:ident) => {
        match $heads {
            1 => for_heads_and_bits!(@bits 1, $bits, $pass),
            2 => for_heads_and_bits!(@bits 2, $bits, $pass),
            3 => for_heads_and_bits!(@bits 3, $bits, $pass),
            _ => for_heads_and_bits!(@bits 4, $bits, $pass),
        }
    };
    (@bits $h:literal, $bits:expr, $pass:ident) => {
        match $bits {
            1 => $pass!($h, 1),
            2 => $pass!($h, 2),
            3 => $pass!($h, 3),
            5 => $pass!($h, 5),
            _ => $pass!($h, 4),
        }
    };
}

/// Heads whose sums one pass keeps in registers.
pub const SUM_HEADS: usize = 4;

/// Heads whose scores one pass keeps in registers.
const SCORE_HEADS: usize = 4;

/// The queries of a [`score_tile`] call as it reads them, found once per call: read for
/// every tile, their terms took 6% of a 3-bit cache's score kernel.
#[derive(Default)]
pub struct QuerySlots {
    heads: Vec<QuerySlot>,
}

/// One query's i8 slots ([`super::quantize_query`], or KIVI's block queries).
#[derive(Clone, Copy)]
struct QuerySlot {
    /// Where the slots begin.
    at: *const f32,
    /// Its groups' `σ·Σ codes` summed, and their `Σ q` summed (where `one_scale`: only
    /// the one-map form reads them).
    sums: [f32; 2],
    /// Whether every group has the first one's scale `σ`.
    one_scale: bool,
}

impl QuerySlots {
    /// Reads the slots of queries `0..heads` of a run `width` channels wide (`slot(h)`).
    ///
    /// # Safety
    /// `slot(h)` points to [`super::query_slots`]`(width)` values, which must stay valid
    /// and unchanged for as long as [`score_tile`] is given these slots.
    pub unsafe fn read(&mut self, width: usize, heads: usize, slot: impl Fn(usize) -> *const f32) {
        self.heads.clear();
        self.heads.extend((0..heads).map(|h| {
            let at = slot(h);
            let maps = std::slice::from_raw_parts(at.add(width / 4), QUERY_MAP * (width / GROUP));
            let groups = maps.chunks_exact(QUERY_MAP);
            // (The sums are skipped for KIVI's block queries, a scale per group: summed
            // for every 32-row block they were 8% of kivi4's scores.)
            let one_scale = groups.clone().all(|m| m[0] == maps[0]);
            let sums = if one_scale {
                groups.fold([0.0; 2], |[a, b], m| [a + m[1], b + m[2]])
            } else {
                [0.0; 2]
            };
            QuerySlot {
                at,
                sums,
                one_scale,
            }
        }));
    }
}

/// Where cut `k` (0..8) of a 2- or 3-bit group finds its bits ([`Decoder::plane_levels`]):
/// its low bit pair, bits `2·(k mod 4)` of each byte of low plane `k/4`, stays in place
/// but for `k mod 4 = 3`, shifted down to bits 4–5; its high bit, bit `k` of each byte of
/// the high plane, stays in place where that is clear of the pair within the low 6 bits
/// (k = 1..5), else comes from the high plane shifted left by 2 (k = 0: bit 2) or right
/// by 6 (k = 6, 7: bits 0, 1).
#[derive(Clone, Copy)]
struct PlaneCut {
    /// Whether the low plane is shifted right by 2 first.
    low_shifted: bool,
    /// The pair's lowest bit in the index.
    pair_at: usize,
    /// The high plane as is (0), shifted left by 2 (1) or right by 6 (2).
    high_plane: usize,
    /// The high bit in the index.
    high_at: usize,
}

/// [`PlaneCut`] of cut `k`.
const fn plane_cut(k: usize) -> PlaneCut {
    let (high_plane, high_at) = match k {
        0 => (1, 2),
        6 | 7 => (2, k - 6),
        _ => (0, k),
    };
    PlaneCut {
        low_shifted: k % 4 == 3,
        pair_at: if k % 4 == 3 { 4 } else { 2 * (k % 4) },
        high_plane,
        high_at,
    }
}

/// Where 1-bit cut `k` (0..8), bit `k` of each byte, lies in its table index
/// ([`Decoder::bit_levels`]): in place, but bits 6 and 7 shifted down by 2.
const fn bit_at(k: usize) -> usize {
    if k < 6 {
        k
    } else {
        k - 2
    }
}

/// Vectors of 16 rows in a tile.
const VECTORS: usize = TILE_ROWS / 16;

/// A 64-byte constant as a vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
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

/// Reads one format's rows: code streams of 128 channels (two masked loads, and for q4_0
/// a byte permutation that drops the scales),
/// byte levels for 2- and 3-bit sums (a byte permutation that puts the bytes of codes
/// `8k..8k+8` in qword `k`, per-byte bit shifts, a mask), and the maps (gathered per 16
/// rows, or collected per row by a byte permutation of its first 128 bytes and regrouped).
pub struct Decoder {
    format: LevelFormat,
    /// Byte of chunk 0's stream source, and bytes from one chunk's source to the next.
    stream_at: usize,
    stream_step: usize,
    /// Masks of the two 64-byte loads of a 128-channel chunk, and of a 64-channel tail.
    stream_load: [__mmask64; 2],
    tail_load: [__mmask64; 2],
    /// llama.cpp blocks: the permutation of the two loads that leaves the nibble bytes.
    compact: Option<__m512i>,
    /// 5-bit llama.cpp blocks: the bytes per block and where in a block its fifth bits are.
    high: Option<(usize, usize)>,
    /// Bytes from a chunk's source to its second 64 channels, the mask that loads 64
    /// channels, and the pair permutation (see `pair_permute`) of such loads.
    half_step: usize,
    half_load: __mmask64,
    nibble_pairs: __m512i,
    /// The pair permutations of byte levels 0..32 and 32..64 (see `pair_permute`).
    level_pairs: [__m512i; 2],
    code_mask: __m512i,
    table: Option<__m512i>,
    /// The table over 64 entries, entry `i` the level of code `i mod 16`: a `vpermb`
    /// through it takes 4-bit codes from bits 0–3 of a byte without masking bits 4–5.
    table64: Option<__m512i>,
    /// 1- to 3-bit codes (bit planes): per cut, the level of each 6-bit index in which
    /// [`bit_at`] or [`plane_cut`] places the cut's bits (the other index bits ignored).
    plane_cuts: [__m512i; 8],
    permute: __m512i,
    shifts: __m512i,
    /// The map of each group (no division in the kernels).
    map_of: [u8; MAX_GROUPS],
    /// Whether the maps are gathered per 16 rows (at most two f16 words per row, or words
    /// past a row's first 128 bytes) rather than collected per row and regrouped
    /// (measured faster from three words on).
    gather: bool,
    /// Byte permutation (over the row's bytes 0..128) that collects the map words.
    words: __m512i,
    row_lo: __mmask64,
    row_hi: __mmask64,
    maps: usize,
}

impl Decoder {
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    pub unsafe fn new(format: &LevelFormat) -> Self {
        let b = format.code_bits() as usize;
        let (stream_at, stream_step, stream_load, tail_load, compact) = match format.codes {
            CodeLayout::Packed { at, .. } => (
                at,
                16 * b,
                [first_bytes(16 * b), 0],
                [first_bytes(8 * b), 0],
                None,
            ),
            // Four blocks; stream byte j is byte `at + j mod 16` of block j/16.
            CodeLayout::Nibbles { block_bytes, .. } => (
                0,
                4 * block_bytes,
                [!0, first_bytes(4 * block_bytes - 64)],
                [first_bytes(2 * block_bytes), 0],
                Some(bytes(std::array::from_fn(|j| format.stream_byte(j) as u8))),
            ),
        };
        // Half a chunk: 32 stream bytes, or two llama.cpp blocks.
        let (half_step, nibble_pairs) = match format.codes {
            CodeLayout::Packed { .. } => (8 * b, pair_permute(|b| b)),
            CodeLayout::Nibbles { block_bytes, .. } => {
                (2 * block_bytes, pair_permute(|b| format.stream_byte(b)))
            }
        };
        let maps = format.maps();
        let words: [u8; 64] = std::array::from_fn(|j| {
            let (word, byte) = (j / 2, j % 2);
            let at = if word < format.map_words() {
                format.map_word_at(word)
            } else {
                0
            };
            (at + byte) as u8
        });
        Self {
            format: *format,
            stream_at,
            stream_step,
            stream_load,
            tail_load,
            compact,
            half_step,
            half_load: first_bytes(half_step),
            nibble_pairs,
            level_pairs: [pair_permute(|b| b), pair_permute(|b| 32 + b)],
            // The low four bits of 5-bit codes; their fifth bits come apart.
            code_mask: _mm512_set1_epi8(((1u32 << b.min(4)) - 1) as i8),
            high: match format.codes {
                CodeLayout::Nibbles {
                    block_bytes,
                    high_at: Some(at),
                    ..
                } => Some((block_bytes, at)),
                _ => None,
            },
            table: format.table.map(|t| {
                let biased: [u8; 16] = std::array::from_fn(|i| (t.levels[i] as u8) ^ 0x80);
                _mm512_broadcast_i32x4(_mm_loadu_si128(biased.as_ptr() as *const _))
            }),
            table64: format
                .table
                .map(|t| bytes(std::array::from_fn(|i| (t.levels[i % 16] as u8) ^ 0x80))),
            plane_cuts: std::array::from_fn(|k| {
                let cut = plane_cut(k);
                let high = usize::from(b == 3);
                bytes(std::array::from_fn(|i| {
                    let code = if b == 1 {
                        (i >> bit_at(k)) & 1
                    } else {
                        (i >> cut.pair_at) & 3 | ((i >> cut.high_at) & high) << 2
                    };
                    match format.table {
                        Some(t) => (t.levels[code] as u8) ^ 0x80,
                        None => code as u8,
                    }
                }))
            }),
            // Packed codes: qword k holds the `b` bytes of codes 8k..8k+8; code m sits at
            // bit m·b. 5-bit blocks: byte j holds the byte of channel j's nibble (two
            // blocks from the half's start), shifted by 4 for the high nibbles.
            permute: bytes(std::array::from_fn(|j| match format.codes {
                CodeLayout::Nibbles { .. } => (format.stream_byte(j / 32 * 16 + j % 16)) as u8,
                CodeLayout::Packed { .. } => ((j / 8) * b + (j % 8).min(b - 1)) as u8,
            })),
            shifts: bytes(std::array::from_fn(|j| match format.codes {
                CodeLayout::Nibbles { .. } => (8 * (j % 8) + 4 * (j % 32 / 16)) as u8,
                CodeLayout::Packed { .. } => ((j % 8) * b) as u8,
            })),
            map_of: std::array::from_fn(|g| (g * GROUP / format.maps.channels) as u8),
            gather: format.map_words() <= 2 || !format.words_in_first_128_bytes(),
            words: bytes(words),
            row_lo: first_bytes(format.row_bytes),
            row_hi: first_bytes(format.row_bytes.saturating_sub(64)),
            maps,
        }
    }

    /// The format this decoder reads.
    pub fn format(&self) -> &LevelFormat {
        &self.format
    }

    /// Whether chunk `c` is a 64-channel tail.
    fn is_tail(&self, c: usize) -> bool {
        self.format.width - 128 * c < 128
    }

    /// The code stream of 128-channel chunk `c` of the row at `row` (64 channels for a
    /// tail; the bytes past the stream are zero).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn stream(&self, row: *const u8, c: usize) -> __m512i {
        let p = row.add(self.stream_at + c * self.stream_step);
        let [m0, m1] = if self.is_tail(c) {
            self.tail_load
        } else {
            self.stream_load
        };
        let lo = _mm512_maskz_loadu_epi8(m0, p as *const i8);
        match self.compact {
            None => lo,
            Some(idx) => {
                let hi = _mm512_maskz_loadu_epi8(m1, p.wrapping_add(64) as *const i8);
                _mm512_permutex2var_epi8(lo, idx, hi)
            }
        }
    }

    /// The source bytes of channels `64h..64h+64` of chunk `c` (half `h`) of the code
    /// stream that starts at `stream` ([`Rows::stream`]), loaded as they lie.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn half_stream(&self, stream: *const u8, c: usize, half: usize) -> __m512i {
        let p = self.half_at(stream, c, half);
        _mm512_maskz_loadu_epi8(self.half_load, p as *const i8)
    }

    /// Where half `half` of chunk `c` of the stream at `stream` begins.
    #[inline(always)]
    unsafe fn half_at(&self, stream: *const u8, c: usize, half: usize) -> *const u8 {
        stream.add(c * self.stream_step + half * self.half_step)
    }

    /// Levels of the 32 codes of group `g` of 16 transposed `B`-bit streams (dwords
    /// `B·g..B·(g+1)`), 4 codes per vector in [`LevelFormat::query_channel`]'s order, one
    /// row per 32-bit lane. 4-bit codes are a dword's low nibbles, then its high ones (a
    /// mask and a shift: these run beside `vpdpbusd`, where byte shuffles compete with
    /// it, measured); narrower codes are cut 4 at a time out of their dword (or of it and
    /// the next, joined, where they cross) with per-byte bit shifts.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn cut_group<const B: usize>(&self, words: &impl Words, g: usize) -> [__m512i; 8] {
        let mut out = [_mm512_setzero_si512(); 8];
        for (k, o) in out.iter_mut().enumerate() {
            if B >= 4 {
                let word = words.word(4 * g + k / 2);
                let codes = if k % 2 == 0 {
                    word
                } else {
                    _mm512_srli_epi32::<4>(word)
                };
                if B == 4 {
                    *o = self.nibble_level(codes);
                    continue;
                }
                let mut codes = _mm512_and_si512(codes, self.code_mask);
                if B == 5 {
                    // The fifth bits of this cut's channels, `4(k/2) + 16(k mod 2) + i`
                    // of the group (word 16 + g, `Source::words`), to bit 4 of byte i.
                    let control = (0..8).fold(0i64, |c, j| {
                        let bit = 32 * (j / 4) + 4 * (k / 2) + 16 * (k % 2) + j % 4;
                        c | ((((bit + 60) % 64) as i64) << (8 * j))
                    });
                    let high = _mm512_multishift_epi64_epi8(
                        _mm512_set1_epi64(control),
                        words.word(16 + g),
                    );
                    codes = _mm512_or_si512(codes, _mm512_and_si512(high, _mm512_set1_epi8(16)));
                }
                *o = self.level(codes);
                continue;
            }
            let offset = 4 * B * k;
            let (word, within) = (B * g + offset / 32, offset % 32);
            // Selectors of codes 0..4 of the low row and of the high row of each qword.
            let control = |base: usize| {
                (0..8).fold(0i64, |c, j| {
                    c | (((base + (j % 4) * B + 32 * (j / 4)) as i64) << (8 * j))
                })
            };
            let codes = if within + 4 * B > 32 {
                let joined = _mm512_shrdv_epi32(
                    words.word(word),
                    words.word(word + 1),
                    _mm512_set1_epi32(within as i32),
                );
                _mm512_multishift_epi64_epi8(_mm512_set1_epi64(control(0)), joined)
            } else {
                _mm512_multishift_epi64_epi8(_mm512_set1_epi64(control(within)), words.word(word))
            };
            *o = self.level(_mm512_and_si512(codes, self.code_mask));
        }
        out
    }

    /// The levels of codes: themselves, or their table entries plus 128.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn level(&self, codes: __m512i) -> __m512i {
        match self.table {
            Some(t) => _mm512_shuffle_epi8(t, codes),
            None => codes,
        }
    }

    /// The levels of the 4-bit codes in bits 0–3 of each byte of `x`, whatever bits 4–7
    /// hold: one `vpermb` through [`Decoder::table64`] where the format has a table (a
    /// mask and a `vpshufb` before), else the mask.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn nibble_level(&self, x: __m512i) -> __m512i {
        match self.table64 {
            Some(t) => _mm512_permutexvar_epi8(x, t),
            None => _mm512_and_si512(x, _mm512_set1_epi8(0x0f)),
        }
    }

    /// The byte levels of channels `64h..64h+64` of the packed code stream at `stream`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn byte_levels(&self, stream: *const u8, h: usize) -> __m512i {
        let src = self.half_stream(stream, h / 2, h % 2);
        let placed = _mm512_permutexvar_epi8(self.permute, src);
        let codes = _mm512_and_si512(
            _mm512_multishift_epi64_epi8(self.shifts, placed),
            self.code_mask,
        );
        let Some((block_bytes, at)) = self.high else {
            return self.level(codes);
        };
        // The two blocks' fifth bits, one per channel, as a byte mask.
        let p = self.half_at(stream, h / 2, h % 2).add(at);
        let bits = (p as *const u32).read_unaligned() as u64
            | ((p.add(block_bytes) as *const u32).read_unaligned() as u64) << 32;
        let fifth = _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(16));
        self.level(_mm512_or_si512(codes, fifth))
    }

    /// Decodes the maps of `rows` (at most `TILE_ROWS`) into `tile`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2,f16c")]
    pub unsafe fn decode(&self, rows: &[u8], tile: &mut Tile) {
        let rb = self.format.row_bytes;
        let n = rows.len() / rb;
        assert!(n <= TILE_ROWS && tile.map_words.len() >= TILE_ROWS * MAP_WORDS);
        let words = tile.map_words.as_mut_ptr();
        for r in 0..n {
            let row = rows.as_ptr().add(r * rb);
            if !self.gather {
                let lo = _mm512_maskz_loadu_epi8(self.row_lo, row as *const i8);
                let hi = _mm512_maskz_loadu_epi8(self.row_hi, row.wrapping_add(64) as *const i8);
                let record = _mm512_permutex2var_epi8(lo, self.words, hi);
                _mm_storeu_si128(
                    words.add(r * MAP_WORDS) as *mut _,
                    _mm512_castsi512_si128(record),
                );
            }
        }
        if self.gather {
            self.gather_maps(rows, n, tile);
        } else {
            self.regroup_maps(n, tile);
        }
    }

    /// Gathers the rows' maps into per-group vectors of scales and center values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2,f16c")]
    unsafe fn gather_maps(&self, rows: &[u8], n: usize, tile: &mut Tile) {
        let rb = self.format.row_bytes;
        let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for block in (0..n).step_by(16) {
            let mask = first_lanes(n - block);
            let offsets = _mm512_mullo_epi32(
                _mm512_add_epi32(lane, _mm512_set1_epi32(block as i32)),
                _mm512_set1_epi32(rb as i32),
            );
            self.store_maps(block, tile, |k| {
                gather_f16(rows.as_ptr(), offsets, self.format.map_word_at(k), mask)
            });
        }
    }

    /// Turns the rows' map words into per-group vectors of scales and center values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2,f16c")]
    unsafe fn regroup_maps(&self, n: usize, tile: &mut Tile) {
        for block in (0..n).step_by(16) {
            let p = tile.map_words.as_ptr().add(block * MAP_WORDS) as *const __m512i;
            let z = [
                _mm512_loadu_si512(p as *const _),
                _mm512_loadu_si512(p.add(1) as *const _),
                _mm512_loadu_si512(p.add(2) as *const _),
                _mm512_loadu_si512(p.add(3) as *const _),
            ];
            self.store_maps(block, tile, |k| map_word(&z, k));
        }
    }

    /// Stores the scales and center values of 16 rows from `block` on, given their map
    /// words as f32 (`word(k)`: the scales of the maps, then their minimums).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2,f16c")]
    unsafe fn store_maps(&self, block: usize, tile: &mut Tile, word: impl Fn(usize) -> __m512) {
        let m = self.format.maps;
        let unit = _mm512_set1_ps(self.format.table.map_or(1.0, |t| t.unit));
        let center = _mm512_set1_ps(self.format.center());
        for map in 0..self.maps {
            let scale = _mm512_mul_ps(word(map), unit);
            // `min + scale·center`: the value of the center level.
            let center_value = match m.min_at {
                Some(_) => _mm512_fmadd_ps(scale, center, word(self.maps + map)),
                None => _mm512_setzero_ps(),
            };
            let at = map * TILE_ROWS + block;
            _mm512_storeu_ps(tile.scales.as_mut_ptr().add(at), scale);
            _mm512_storeu_ps(tile.centers.as_mut_ptr().add(at), center_value);
        }
    }
}

/// Where the kernels read a tile's codes: rows as the codec stores them ([`Rows`]) or
/// interleaved blocks ([`Blocks`]).
pub trait Source {
    /// Rows in the tile.
    fn rows(&self) -> usize;
    /// The stream words of 128-channel chunk `c` of rows `block..block + 16` (a multiple
    /// of 16), one row per lane: vector `j` holds word `j` of each row's chunk (zero past
    /// the chunk). Rows past the tile repeat its last row; their scores are not stored.
    unsafe fn words<const B: usize>(
        &self,
        decoder: &Decoder,
        block: usize,
        c: usize,
    ) -> Self::Words;
    /// The stream words [`Source::words`] gives.
    type Words: Words;
    /// Levels of the 32 codes of group `local` of a chunk's words, as
    /// [`Decoder::cut_group`] gives them.
    unsafe fn cut<const B: usize>(
        &self,
        decoder: &Decoder,
        words: &Self::Words,
        local: usize,
    ) -> [__m512i; 8];
    /// The stream bytes of half `half` of chunk `c` (4-bit codes) of rows `4k..4k + 4`,
    /// one byte of the 4 rows per 32-bit lane: lane `l` of vector `v` holds the half's
    /// byte `16v + l`. Rows past the tile repeat its last row, under zero weights.
    unsafe fn nibble_quad(
        &self,
        decoder: &Decoder,
        k: usize,
        c: usize,
        half: usize,
    ) -> [__m512i; 2];
    /// The levels of 64-channel slice `half` of rows `8p..8p + 8` (1- to 3-bit codes), as
    /// two quads of 4 rows, one channel of the quad's rows per 32-bit lane: lane `l` of
    /// vector `j` holds channel `16j + l` of the slice. Rows past the tile repeat its last
    /// row, under zero weights.
    unsafe fn level_pair<const B: usize>(
        &self,
        decoder: &Decoder,
        p: usize,
        half: usize,
    ) -> [[__m512i; 4]; 2];
}

/// The stream words of a chunk of 16 rows ([`Source::words`]).
pub trait Words {
    /// Word `j` of each row, one row per lane.
    unsafe fn word(&self, j: usize) -> __m512i;
}

/// A chunk's words transposed in registers; for 5-bit codes, words 16.. hold the fifth
/// bits of the chunk's blocks (one little-endian u32 per block and row).
pub struct RowWords {
    words: [__m512i; 16],
    fifth: [__m512i; 4],
}

impl Words for RowWords {
    #[inline(always)]
    unsafe fn word(&self, j: usize) -> __m512i {
        if j < 16 {
            self.words[j]
        } else {
            self.fifth[j - 16]
        }
    }
}

/// Words as an interleaved block holds them, loaded when used.
pub struct Loaded(*const __m512i);

impl Words for Loaded {
    #[inline(always)]
    unsafe fn word(&self, j: usize) -> __m512i {
        _mm512_loadu_si512(self.0.add(j) as *const _)
    }
}

/// A tile's rows as the codec stores them, one after another.
pub struct Rows<'a> {
    rows: &'a [u8],
    row_bytes: usize,
}

impl<'a> Rows<'a> {
    /// The whole rows of `rows` in `decoder`'s format.
    pub fn new(decoder: &Decoder, rows: &'a [u8]) -> Self {
        let row_bytes = decoder.format.row_bytes;
        Self { rows, row_bytes }
    }

    /// Row `i`, or the last row past the tile.
    fn row(&self, i: usize) -> *const u8 {
        let last = self.rows() - 1;
        self.rows[i.min(last) * self.row_bytes..].as_ptr()
    }
}

impl Source for Rows<'_> {
    fn rows(&self) -> usize {
        self.rows.len() / self.row_bytes
    }

    /// Loads each row's chunk and transposes the 16 rows as 32-bit words.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn words<const B: usize>(
        &self,
        decoder: &Decoder,
        block: usize,
        c: usize,
    ) -> Self::Words {
        let streams: [__m512i; 16] =
            std::array::from_fn(|r| decoder.stream(self.row(block + r), c));
        let mut fifth = [_mm512_setzero_si512(); 4];
        if B == 5 {
            let (block_bytes, at) = decoder.high.expect("5-bit codes have fifth bits");
            let last = self.rows() - 1;
            let offsets: [i32; 16] =
                std::array::from_fn(|r| ((block + r).min(last) * self.row_bytes) as i32);
            let offsets = _mm512_loadu_si512(offsets.as_ptr() as *const _);
            let base = self.rows.as_ptr().add(c * decoder.stream_step + at);
            let blocks = if decoder.is_tail(c) { 2 } else { 4 };
            for (b, word) in fifth[..blocks].iter_mut().enumerate() {
                let at = base.add(b * block_bytes) as *const i32;
                *word = _mm512_i32gather_epi32::<1>(offsets, at as *const _);
            }
        }
        RowWords {
            words: transpose16(&streams),
            fifth,
        }
    }

    /// Loads the half of 4 rows and interleaves them byte-wise (a byte permutation of
    /// each pair, then 16-bit unpacks).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn nibble_quad(
        &self,
        decoder: &Decoder,
        k: usize,
        c: usize,
        half: usize,
    ) -> [__m512i; 2] {
        let half_stream = |i: usize| decoder.half_stream(self.stream(decoder, 4 * k + i), c, half);
        let (s0, s1) = (half_stream(0), half_stream(1));
        let (s2, s3) = (half_stream(2), half_stream(3));
        let p01 = _mm512_permutex2var_epi8(s0, decoder.nibble_pairs, s1);
        let p23 = _mm512_permutex2var_epi8(s2, decoder.nibble_pairs, s3);
        [
            _mm512_unpacklo_epi16(p01, p23),
            _mm512_unpackhi_epi16(p01, p23),
        ]
    }

    type Words = RowWords;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn cut<const B: usize>(
        &self,
        decoder: &Decoder,
        words: &Self::Words,
        local: usize,
    ) -> [__m512i; 8] {
        decoder.cut_group::<B>(words, local)
    }

    /// Decodes each row's slice to byte levels and interleaves each quad's rows byte-wise.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn level_pair<const B: usize>(
        &self,
        decoder: &Decoder,
        p: usize,
        half: usize,
    ) -> [[__m512i; 4]; 2] {
        [
            self.level_quad(decoder, 2 * p, half),
            self.level_quad(decoder, 2 * p + 1, half),
        ]
    }
}

impl Rows<'_> {
    /// Rows `4k..4k + 4` of [`Source::level_pair`]'s slice.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn level_quad(&self, decoder: &Decoder, k: usize, half: usize) -> [__m512i; 4] {
        let levels = |i: usize| decoder.byte_levels(self.stream(decoder, 4 * k + i), half);
        let (r0, r1, r2, r3) = (levels(0), levels(1), levels(2), levels(3));
        let [lo, hi] = decoder.level_pairs;
        let (p01a, p01b) = (
            _mm512_permutex2var_epi8(r0, lo, r1),
            _mm512_permutex2var_epi8(r0, hi, r1),
        );
        let (p23a, p23b) = (
            _mm512_permutex2var_epi8(r2, lo, r3),
            _mm512_permutex2var_epi8(r2, hi, r3),
        );
        [
            _mm512_unpacklo_epi16(p01a, p23a),
            _mm512_unpackhi_epi16(p01a, p23a),
            _mm512_unpacklo_epi16(p01b, p23b),
            _mm512_unpackhi_epi16(p01b, p23b),
        ]
    }
}

impl Rows<'_> {
    /// Where row `i`'s code stream starts (the last row's, past the tile).
    fn stream(&self, decoder: &Decoder, i: usize) -> *const u8 {
        self.row(i).wrapping_add(decoder.stream_at)
    }
}

/// A tile of interleaved blocks ([`super::Interleaving`]): the kernels load their vectors
/// as they lie.
pub struct Blocks<'a> {
    blocks: &'a [u8],
    layout: super::Interleaving,
}

impl<'a> Blocks<'a> {
    /// The whole blocks of `blocks` in `layout`.
    pub fn new(layout: &super::Interleaving, blocks: &'a [u8]) -> Self {
        Self {
            blocks,
            layout: *layout,
        }
    }

    /// The first byte of the block that holds row `i`.
    fn block(&self, i: usize) -> *const u8 {
        self.blocks[i / INTERLEAVED_ROWS * self.layout.block_bytes()..].as_ptr()
    }

    /// The first byte of the run's codes in the block that holds row `i`.
    fn codes(&self, i: usize) -> *const u8 {
        self.block(i).wrapping_add(self.layout.codes_at)
    }

    /// The maps of the tile's rows into `tile`, as [`Decoder::decode`] does for rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2,f16c")]
    pub unsafe fn decode_maps(&self, decoder: &Decoder, tile: &mut Tile) {
        assert!(self.rows() <= TILE_ROWS);
        for block in (0..self.rows()).step_by(INTERLEAVED_ROWS) {
            let maps = self.block(block).add(self.layout.maps_at);
            decoder.store_maps(block, tile, |k| {
                _mm512_cvtph_ps(_mm256_loadu_si256(maps.add(32 * k) as *const _))
            });
        }
    }
}

impl Source for Blocks<'_> {
    fn rows(&self) -> usize {
        self.blocks.len() / self.layout.block_bytes() * INTERLEAVED_ROWS
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn words<const B: usize>(
        &self,
        _decoder: &Decoder,
        block: usize,
        c: usize,
    ) -> Self::Words {
        // A chunk is 4B words (2B for a tail, whose groups read no further).
        Loaded(self.codes(block).add(64 * 4 * B * c) as *const __m512i)
    }

    type Words = Loaded;

    /// 4-bit codes as [`Decoder::cut_group`] cuts them; narrower ones from their bit
    /// planes ([`super::Interleaving::bit_sources`]): a shift and a mask for the low bit
    /// pairs, and for 3 bits a shift and a mask for the high bit.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn cut<const B: usize>(
        &self,
        decoder: &Decoder,
        words: &Self::Words,
        local: usize,
    ) -> [__m512i; 8] {
        debug_assert!(B <= 4, "interleaved blocks hold 1- to 4-bit codes");
        if B == 4 || B == 1 {
            return decoder.cut_group::<B>(words, local);
        }
        let plane = |p: usize| words.word(B * local + p);
        let high = if B == 3 {
            plane(2)
        } else {
            _mm512_setzero_si512()
        };
        decoder.plane_levels::<B>([plane(0), plane(1)], high)
    }

    /// The 1- to 3-bit planes of a pair of quads ([`super::Interleaving::bit_sources`]),
    /// each loaded once: the shifts that cut them are constants.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn level_pair<const B: usize>(
        &self,
        decoder: &Decoder,
        p: usize,
        half: usize,
    ) -> [[__m512i; 4]; 2] {
        let slices = decoder.format.width / 64;
        let pair = p % (INTERLEAVED_ROWS / 8);
        let at = self.codes(8 * p).add(64 * B * (pair * slices + half));
        if B == 1 {
            // One plane for both quads: quad `s`'s code `16j + l` is bit `4s + j` of byte l.
            let levels = decoder.bit_levels(_mm512_loadu_si512(at as *const _));
            return [0, 4].map(|first| std::array::from_fn(|j| levels[first + j]));
        }
        let low = |second: usize| _mm512_loadu_si512(at.add(64 * second) as *const _);
        let high = if B == 3 {
            _mm512_loadu_si512(at.add(128) as *const _)
        } else {
            _mm512_setzero_si512()
        };
        let levels = decoder.plane_levels::<B>([low(0), low(1)], high);
        [0, 4].map(|first| std::array::from_fn(|j| levels[first + j]))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn nibble_quad(
        &self,
        _decoder: &Decoder,
        k: usize,
        c: usize,
        half: usize,
    ) -> [__m512i; 2] {
        let halves = self.layout.stream_bytes() / 32;
        let quad = (k % (INTERLEAVED_ROWS / 4)) * halves + 2 * c + half;
        let at = self.codes(4 * k).add(128 * quad) as *const __m512i;
        [
            _mm512_loadu_si512(at as *const _),
            _mm512_loadu_si512(at.add(1) as *const _),
        ]
    }
}

impl Decoder {
    /// The levels of eight vectors of 1-bit codes, vector `k`'s bit `k` of each byte of
    /// `bits`: one `vpermb` each through its table ([`Decoder::plane_cuts`]), bits 6 and
    /// 7 shifted down to 4 and 5 first ([`bit_at`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn bit_levels(&self, bits: __m512i) -> [__m512i; 8] {
        let shifted = _mm512_srli_epi32::<2>(bits);
        std::array::from_fn(|k| {
            let index = if k < 6 { bits } else { shifted };
            _mm512_permutexvar_epi8(index, self.plane_cuts[k])
        })
    }

    /// The levels of a group's eight vectors of `B`-bit codes (2 or 3) from their bit
    /// planes: vector `k`'s low bit pair is bits `2·(k mod 4)` of each byte of `low[k/4]`,
    /// its high bit (3 bits) bit `k` of each byte of `high`. Four shifts (two for 2 bits)
    /// place every cut's bits apart within the low 6 bits of a byte ([`plane_cut`]); for
    /// 3 bits one `vpternlogd` merges the planes; one `vpermb` through the cut's table
    /// ([`Decoder::plane_cuts`]) gives the level, whatever the other index bits hold.
    /// (Shifting each cut's bits down to bits 0–2 took 13 shifts per group for 3 bits and
    /// a mask per cut: the 3-bit scores 6% slower on the Intel host.)
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
    unsafe fn plane_levels<const B: usize>(
        &self,
        low: [__m512i; 2],
        high: __m512i,
    ) -> [__m512i; 8] {
        let lows = [
            low[0],
            low[1],
            _mm512_srli_epi32::<2>(low[0]),
            _mm512_srli_epi32::<2>(low[1]),
        ];
        let highs = [
            high,
            _mm512_slli_epi32::<2>(high),
            _mm512_srli_epi32::<6>(high),
        ];
        std::array::from_fn(|k| {
            let cut = plane_cut(k);
            let pair = lows[k / 4 + 2 * usize::from(cut.low_shifted)];
            let index = if B == 3 {
                // The pair's bits from `pair`, the others from the high plane:
                // `(A & C) | (B & !C)`.
                _mm512_ternarylogic_epi32::<0xE4>(
                    pair,
                    highs[cut.high_plane],
                    _mm512_set1_epi8(3 << cut.pair_at),
                )
            } else {
                pair
            };
            _mm512_permutexvar_epi8(index, self.plane_cuts[k])
        })
    }
}

/// 16 f16 values at `offsets[i] + at` bytes from `base`, as f32 (0 in lanes off `mask`).
/// Reads the 4 bytes that end with the value (or start with it when `at < 2`), so no
/// byte outside a row of at least 4 bytes is touched.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,f16c")]
unsafe fn gather_f16(base: *const u8, offsets: __m512i, at: usize, mask: __mmask16) -> __m512 {
    let from = at.saturating_sub(2);
    let words = _mm512_mask_i32gather_epi32::<1>(
        _mm512_setzero_si512(),
        mask,
        offsets,
        base.add(from) as *const i32,
    );
    let values = if at >= 2 {
        _mm512_srli_epi32::<16>(words)
    } else {
        words
    };
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(values))
}

/// Word `k` of 16 rows' map records (rows 0..4 in `z[0]`, 4..8 in `z[1]`, ...), as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2,f16c")]
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

/// The i8 queries of one block of per-channel maps ([`super::ChannelBlocks`], `maps` its
/// `(scale, minimum)` pairs): per head, `q'_c = q_c·scale_c` rounded to i8 per 32
/// channels (to nearest, ties to even) into the head's [`super::query_slots`] in `out`
/// (byte `i` of each group holding channel `order[i]`; then `σ`, `σ·Σ codes` and 0 per
/// group), and `Σ_c q_c·(minimum_c + scale_c·center)` into `biases[h]`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2,f16c")]
pub unsafe fn channel_queries(
    maps: &[u8],
    center: f32,
    queries: &[&[f32]],
    order: &[u8; GROUP],
    out: &mut [f32],
    biases: &mut [f32],
) {
    let w = maps.len() / 4;
    let slots = super::query_slots(w);
    assert!(w.is_multiple_of(GROUP) && w <= MAX_GROUPS * GROUP);
    assert!(out.len() >= queries.len() * slots && biases.len() >= queries.len());
    assert!(queries.iter().all(|q| q.len() >= w));
    // Scales and minimums of 16 channels per vector (uninitialized: zeroing them costs
    // more than the block's scores at 32 rows).
    let mut scales = [MaybeUninit::<__m512>::uninit(); 2 * MAX_GROUPS];
    let mut mins = scales;
    for j in 0..w / 16 {
        let pairs = _mm512_loadu_si512(maps.as_ptr().add(64 * j) as *const _);
        scales[j].write(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(pairs)));
        mins[j].write(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<
            16,
        >(pairs))));
    }
    let mut idx = [0u8; 64];
    idx[..GROUP].copy_from_slice(order);
    let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
    let center = _mm512_set1_ps(center);
    for (h, q) in queries.iter().enumerate() {
        let slot = out.as_mut_ptr().add(h * slots);
        let mut bias = _mm512_setzero_ps();
        // Four groups at a time, their lane reductions together.
        for g0 in (0..w / GROUP).step_by(4) {
            let mut scaled = [[_mm512_setzero_ps(); 2]; 4];
            let mut largest = [_mm512_setzero_ps(); 4];
            for (gi, (s, l)) in scaled.iter_mut().zip(&mut largest).enumerate() {
                for (k, s) in s.iter_mut().enumerate().filter(|_| g0 + gi < w / GROUP) {
                    let j = 2 * (g0 + gi) + k;
                    let x = _mm512_loadu_ps(q.as_ptr().add(16 * j));
                    *s = _mm512_mul_ps(x, scales[j].assume_init());
                    bias = _mm512_fmadd_ps(x, mins[j].assume_init(), bias);
                    bias = _mm512_fmadd_ps(*s, center, bias);
                    *l = _mm512_max_ps(*l, _mm512_abs_ps(*s));
                }
            }
            // σ = largest / 127 and 1/σ (0 for a zero group), lane g of each.
            let sigma = _mm512_div_ps(max4(largest), _mm512_set1_ps(127.0));
            let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(sigma, _mm512_setzero_ps());
            let inv = _mm512_maskz_div_ps(positive, _mm512_set1_ps(1.0), sigma);
            let mut code_sums = [_mm512_setzero_si512(); 4];
            for (gi, (s, sum)) in scaled.iter().zip(&mut code_sums).enumerate() {
                let g = g0 + gi;
                if g == w / GROUP {
                    break;
                }
                // (Lane `gi` broadcast in a register, not stored and loaded back.)
                let inv = _mm512_permutexvar_ps(_mm512_set1_epi32(gi as i32), inv);
                let codes = s.map(|s| _mm512_cvtps_epi32(_mm512_mul_ps(s, inv)));
                *sum = _mm512_add_epi32(codes[0], codes[1]);
                let bytes = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm512_cvtepi32_epi8(codes[0])),
                    _mm512_cvtepi32_epi8(codes[1]),
                );
                let placed = _mm512_permutexvar_epi8(idx, _mm512_castsi256_si512(bytes));
                let at = (slot as *mut u8).add(GROUP * g);
                _mm256_storeu_si256(at as *mut _, _mm512_castsi512_si256(placed));
            }
            // The groups' slots `σ, σ·Σ codes, 0` from lanes 0–3, stored together.
            let code_terms = _mm512_mul_ps(sigma, _mm512_cvtepi32_ps(add4(code_sums)));
            let order = _mm512_setr_epi32(0, 16, 0, 1, 17, 0, 2, 18, 0, 3, 19, 0, 0, 0, 0, 0);
            let terms = _mm512_maskz_permutex2var_ps(0b0110_1101_1011, sigma, order, code_terms);
            let count = (w / GROUP - g0).min(4);
            let at = slot.add(w / 4 + QUERY_MAP * g0);
            _mm512_mask_storeu_ps(at, ((1u32 << (QUERY_MAP * count)) - 1) as __mmask16, terms);
        }
        biases[h] = _mm512_reduce_add_ps(bias);
    }
}

/// The reduction by `op` of each of `v`'s 32-bit lanes, in lanes 0–3 (and again in each
/// 128-bit lane).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn reduce4(v: [__m512i; 4], op: impl Fn(__m512i, __m512i) -> __m512i) -> __m512i {
    let pair = |x, y| op(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
    let (a, b) = (pair(v[0], v[1]), pair(v[2], v[3]));
    let c = op(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    let d = op(c, _mm512_shuffle_i32x4::<0b01_00_11_10>(c, c));
    op(d, _mm512_shuffle_i32x4::<0b10_11_00_01>(d, d))
}

/// [`reduce4`] of float lanes by `op`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn reduce4_ps(v: [__m512; 4], op: impl Fn(__m512, __m512) -> __m512) -> __m512 {
    let bits = |x: __m512i, y: __m512i| {
        _mm512_castps_si512(op(_mm512_castsi512_ps(x), _mm512_castsi512_ps(y)))
    };
    _mm512_castsi512_ps(reduce4(v.map(|x| _mm512_castps_si512(x)), bits))
}

/// The largest lane of each of `v`, in lanes 0–3 (and again in each 128-bit lane).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn max4(v: [__m512; 4]) -> __m512 {
    reduce4_ps(v, |x, y| _mm512_max_ps(x, y))
}

/// The sum of each of `v`'s lanes, in lanes 0–3 (and again in each 128-bit lane).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn add4(v: [__m512i; 4]) -> __m512i {
    reduce4(v, |x, y| _mm512_add_epi32(x, y))
}

/// [`add4`] for floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn add4_ps(v: [__m512; 4]) -> __m512 {
    reduce4_ps(v, |x, y| _mm512_add_ps(x, y))
}

/// Transposes 16 rows of 16 i32 lanes: lane `r` of output `j` is lane `j` of input `r`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
pub(crate) unsafe fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
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

/// Scores of the tile's rows for `heads` i8 queries (`slot(h)` points to head `h`'s
/// [`super::query_slots`] values), into `scores[h][first..]` (added to them if `add`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
pub unsafe fn score_tile<S: Source>(
    tile: &Tile,
    decoder: &Decoder,
    rows: &S,
    read: &QuerySlots,
    scores: &mut [&mut [f32]],
    first: usize,
    ahead: &mut Ahead,
    add: bool,
) {
    let (n, heads) = (rows.rows(), read.heads.len());
    assert!(scores.len() >= heads);
    assert!(scores.iter().all(|s| s.len() >= first + n) && n <= TILE_ROWS);
    for h0 in (0..heads).step_by(SCORE_HEADS) {
        let h1 = heads.min(h0 + SCORE_HEADS);
        let (q, s) = (&read.heads[h0..h1], &mut scores[h0..h1]);
        // The one-map form where the rows have one map and the queries one scale
        // (`quantize_query` gives such rows one; KIVI's block queries have one per group):
        // the groups' integer dots add up in the same chains, and each row is finished
        // once, with the groups' query terms summed. A constant in the kernel: as a
        // run-time flag the compiler moved the chains through the stack (int3-g128's
        // scores 5% slower in L2).
        let format = &decoder.format;
        let one_map = format.maps.channels >= format.width && q.iter().all(|h| h.one_scale);
        macro_rules! pass {
            ($h:literal, $b:literal) => {
                if one_map {
                    score_heads::<$h, $b, true, S>(tile, decoder, rows, q, s, first, ahead, add)
                } else {
                    score_heads::<$h, $b, false, S>(tile, decoder, rows, q, s, first, ahead, add)
                }
            };
        }
        for_heads_and_bits!(q.len(), format.code_bits(), pass);
    }
}

/// [`score_tile`] for `H` queries and `B`-bit codes: per 16 rows, the code streams are
/// transposed, cut 4 codes at a time and dotted with each query; per group,
/// `scale·σ·(Σ codes·levels − center·Σ codes) + center_value·Σ q` (with `ONE_MAP`, per
/// row, the groups' dots summed first).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
#[allow(clippy::too_many_arguments)]
unsafe fn score_heads<const H: usize, const B: usize, const ONE_MAP: bool, S: Source>(
    tile: &Tile,
    decoder: &Decoder,
    rows: &S,
    slots: &[QuerySlot],
    scores: &mut [&mut [f32]],
    first: usize,
    ahead: &mut Ahead,
    add: bool,
) {
    let format = &decoder.format;
    let (w, n) = (format.width, rows.rows());
    let center = format.center();
    let has_min = format.maps.min_at.is_some();
    let q: [*const f32; H] = std::array::from_fn(|h| slots[h].at);
    let sums: [[f32; 2]; H] = std::array::from_fn(|h| slots[h].sums);
    let out: [*mut f32; H] = std::array::from_fn(|h| scores[h].as_mut_ptr().add(first));
    for block in (0..n).step_by(16) {
        ahead.rows(16);
        let mut acc = [_mm512_setzero_ps(); H];
        // Two chains of dots per head (even and odd cuts): one `vpdpbusd` issues per cycle
        // and each takes several, measured faster than one chain.
        let mut row_dots = [[_mm512_setzero_si512(); H]; 2];
        for c in 0..w.div_ceil(128) {
            let words = rows.words::<B>(decoder, block, c);
            let groups = if decoder.is_tail(c) { 2 } else { 4 };
            for local in 0..groups {
                let g = 4 * c + local;
                let mut chains = if ONE_MAP {
                    row_dots
                } else {
                    [[_mm512_setzero_si512(); H]; 2]
                };
                let levels = rows.cut::<B>(decoder, &words, local);
                for (k, &level) in levels.iter().enumerate() {
                    for (dot, &qh) in chains[k % 2].iter_mut().zip(&q) {
                        let code = *(qh as *const i32).add(8 * g + k);
                        *dot = _mm512_dpbusd_epi32(*dot, level, _mm512_set1_epi32(code));
                    }
                }
                if ONE_MAP {
                    row_dots = chains;
                    continue;
                }
                let dots: [__m512i; H] =
                    std::array::from_fn(|h| _mm512_add_epi32(chains[0][h], chains[1][h]));
                let at = decoder.map_of[g] as usize * TILE_ROWS + block;
                let scale = _mm512_loadu_ps(tile.scales.as_ptr().add(at));
                let value = _mm512_loadu_ps(tile.centers.as_ptr().add(at));
                for ((a, &qh), &dot) in acc.iter_mut().zip(&q).zip(&dots) {
                    let map = qh.add(w / 4 + QUERY_MAP * g);
                    let x = _mm512_fmsub_ps(
                        _mm512_cvtepi32_ps(dot),
                        _mm512_set1_ps(*map),
                        _mm512_set1_ps(center * *map.add(1)),
                    );
                    *a = _mm512_fmadd_ps(x, scale, *a);
                    if has_min {
                        *a = _mm512_fmadd_ps(value, _mm512_set1_ps(*map.add(2)), *a);
                    }
                }
            }
        }
        if ONE_MAP {
            // `scale·σ·(Σ dots − center·Σ codes) + center_value·Σ q`, the query terms summed
            // over the groups (`σ·Σ codes` and `Σ q` per group in the slots).
            let scale = _mm512_loadu_ps(tile.scales.as_ptr().add(block));
            let value = _mm512_loadu_ps(tile.centers.as_ptr().add(block));
            let row_dots: [__m512i; H] =
                std::array::from_fn(|h| _mm512_add_epi32(row_dots[0][h], row_dots[1][h]));
            for (((a, &qh), &dot), [codes, total]) in
                acc.iter_mut().zip(&q).zip(&row_dots).zip(sums)
            {
                let x = _mm512_fmsub_ps(
                    _mm512_cvtepi32_ps(dot),
                    _mm512_set1_ps(*qh.add(w / 4)),
                    _mm512_set1_ps(center * codes),
                );
                *a = _mm512_mul_ps(x, scale);
                if has_min {
                    *a = _mm512_fmadd_ps(value, _mm512_set1_ps(total), *a);
                }
            }
        }
        // (Whole blocks unmasked: masked stores, one per head, were 9% of the kernel.)
        let mask = first_lanes(n - block);
        for (&out, a) in out.iter().zip(&acc) {
            let at = out.add(block);
            let a = if add {
                _mm512_add_ps(*a, _mm512_maskz_loadu_ps(mask, at))
            } else {
                *a
            };
            if n - block >= 16 {
                _mm512_storeu_ps(at, a);
            } else {
                _mm512_mask_storeu_ps(at, mask, a);
            }
        }
    }
}

/// The byte permutation that interleaves two rows' bytes in pairs so that the 16-bit
/// unpacks of two such pairs give 16 consecutive bytes of 4 rows: in 128-bit lane `L`,
/// words 0–3 are bytes `4L..` of 32, words 4–7 bytes `16 + 4L..`; byte `b` of the 32
/// sits at `position(b)` of each row's vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn pair_permute(position: impl Fn(usize) -> usize) -> __m512i {
    bytes(std::array::from_fn(|j| {
        let (lane, word, second) = (j / 16, (j % 16) / 2, j % 2);
        let b = 4 * lane + if word < 4 { word } else { 12 + word };
        (position(b) + 64 * second) as u8
    }))
}

/// Per head of a pass and map: the weights' step, `center·Σ codes` (the centering, in
/// the integer sums) and `Σ w·center_value` (formats with a minimum). Written for the
/// pass's heads and the format's maps before the sums read them; the rest stays
/// uninitialized (zeroing all of it was 6% of the weights' preparation, measured).
struct Rounded {
    /// Maps per row, and the map of each group.
    maps: usize,
    map_of: [u8; MAX_GROUPS],
    steps: [[MaybeUninit<f32>; MAX_GROUPS]; SUM_HEADS],
    centering: [[MaybeUninit<i32>; MAX_GROUPS]; SUM_HEADS],
    center_sums: [[MaybeUninit<f32>; MAX_GROUPS]; SUM_HEADS],
}

/// `accs[h][channel..channel + width] += Σ_t weights[h][first + t]·row_t` over the tile's
/// rows.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
pub unsafe fn accumulate_tile<S: Source>(
    tile: &mut Tile,
    decoder: &Decoder,
    rows: &S,
    first: usize,
    weights: &[&[f32]],
    accs: &mut [&mut [f32]],
    channel: usize,
    ahead: &mut Ahead,
) {
    let format = &decoder.format;
    let (w, n) = (format.width, rows.rows());
    let maps = w / format.maps.channels;
    let center = format.center();
    let has_min = format.maps.min_at.is_some();
    assert!(maps <= MAX_GROUPS && n <= TILE_ROWS);
    assert!(weights.iter().all(|x| x.len() >= first + n));
    assert!(accs.iter().all(|a| a.len() >= channel + w));
    assert!(tile.weights.len() >= SUM_HEADS * maps * TILE_ROWS);
    // Lanes of 16 rows, masked to the tile's rows.
    let masks: [__mmask16; VECTORS] =
        std::array::from_fn(|i| first_lanes(n.saturating_sub(16 * i)));
    // Rows that some head weighs: the others (masked positions, the unwritten rows of a
    // partly written block) add nothing, and their scales must not coarsen the rounding.
    let live: [__mmask16; VECTORS] = std::array::from_fn(|i| {
        weights.iter().fold(0, |live, w| {
            let x = _mm512_maskz_loadu_ps(masks[i], w.as_ptr().wrapping_add(first + 16 * i));
            live | _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(x, _mm512_setzero_ps())
        })
    });
    // Each map's scales over their largest magnitude in the tile.
    // (Only the first `maps` are written and read: zeroing all costs a 4 KiB memset per
    // tile, measured.)
    let mut largest_scale = [0f32; MAX_GROUPS];
    let mut relative_scales = [MaybeUninit::<[__m512; VECTORS]>::uninit(); MAX_GROUPS];
    for (g, relative) in relative_scales.iter_mut().enumerate().take(maps) {
        let s = tile.scales.as_ptr().add(g * TILE_ROWS);
        let loaded: [__m512; VECTORS] =
            std::array::from_fn(|i| _mm512_maskz_loadu_ps(live[i], s.add(16 * i)));
        let largest = loaded.iter().fold(_mm512_setzero_ps(), |m, &r| {
            _mm512_max_ps(m, _mm512_abs_ps(r))
        });
        largest_scale[g] = _mm512_reduce_max_ps(largest);
        let inv = if largest_scale[g] > 0.0 {
            1.0 / largest_scale[g]
        } else {
            0.0
        };
        relative.write(loaded.map(|r| _mm512_mul_ps(r, _mm512_set1_ps(inv))));
    }
    for h0 in (0..weights.len()).step_by(SUM_HEADS) {
        let heads = weights.len().min(h0 + SUM_HEADS) - h0;
        // Each head's weights times the rows' scales, rounded against their largest:
        // `round(127·(w/max w)·(scale/max scale))`, one step per head and map.
        let mut rounded = Rounded {
            maps,
            map_of: decoder.map_of,
            steps: [[MaybeUninit::uninit(); MAX_GROUPS]; SUM_HEADS],
            centering: [[MaybeUninit::uninit(); MAX_GROUPS]; SUM_HEADS],
            center_sums: [[MaybeUninit::uninit(); MAX_GROUPS]; SUM_HEADS],
        };
        // The heads' lane reductions go four at a time (`max4`, `add4`).
        let head_weights = |hh: usize, i: usize| {
            let wp = weights[h0 + hh.min(heads - 1)].as_ptr().add(first);
            _mm512_maskz_loadu_ps(masks[i], wp.wrapping_add(16 * i))
        };
        let largest = max4(std::array::from_fn(|hh| {
            (0..VECTORS).fold(_mm512_setzero_ps(), |m, i| {
                _mm512_max_ps(m, _mm512_abs_ps(head_weights(hh, i)))
            })
        }));
        let mut largest_weights = [0f32; 16];
        _mm512_storeu_ps(largest_weights.as_mut_ptr(), largest);
        let to_levels: [__m512; SUM_HEADS] = std::array::from_fn(|hh| {
            let largest = largest_weights[hh];
            _mm512_set1_ps(if largest > 0.0 { 127.0 / largest } else { 0.0 })
        });
        // Each head's weights in steps of its largest, `127·w/max w`, once for every map.
        let head_levels: [[__m512; VECTORS]; SUM_HEADS] = std::array::from_fn(|hh| {
            std::array::from_fn(|i| _mm512_mul_ps(head_weights(hh, i), to_levels[hh]))
        });
        for g in 0..maps {
            let relative = relative_scales[g].assume_init();
            let mut code_sums = [_mm512_setzero_si512(); SUM_HEADS];
            let mut center_sums = [_mm512_setzero_ps(); SUM_HEADS];
            for hh in 0..heads {
                rounded.steps[hh][g].write(largest_weights[hh] * largest_scale[g] / 127.0);
                if has_min {
                    for i in 0..VECTORS {
                        let at = g * TILE_ROWS + 16 * i;
                        let value = _mm512_loadu_ps(tile.centers.as_ptr().add(at));
                        center_sums[hh] =
                            _mm512_fmadd_ps(head_weights(hh, i), value, center_sums[hh]);
                    }
                }
                let codes: [__m512i; VECTORS] = std::array::from_fn(|i| {
                    _mm512_cvtps_epi32(_mm512_mul_ps(head_levels[hh][i], relative[i]))
                });
                code_sums[hh] = _mm512_add_epi32(
                    _mm512_add_epi32(codes[0], codes[1]),
                    _mm512_add_epi32(codes[2], codes[3]),
                );
                let out = tile.weights.as_mut_ptr().add((hh * maps + g) * TILE_ROWS);
                _mm512_storeu_si512(out as *mut _, low_bytes(codes));
            }
            let (mut codes, mut centers) = ([0i32; 16], [0f32; 16]);
            _mm512_storeu_si512(codes.as_mut_ptr() as *mut _, add4(code_sums));
            if has_min {
                _mm512_storeu_ps(centers.as_mut_ptr(), add4_ps(center_sums));
            }
            for hh in 0..heads {
                rounded.centering[hh][g].write(center as i32 * codes[hh]);
                rounded.center_sums[hh][g].write(centers[hh]);
            }
        }
        let accs = &mut accs[h0..h0 + heads];
        macro_rules! pass {
            ($h:literal, 4) => {
                sums_of_nibbles::<$h, S>(tile, decoder, rows, &rounded, accs, channel, ahead)
            };
            ($h:literal, $b:literal) => {
                sums_of_levels::<$h, $b, S>(tile, decoder, rows, &rounded, accs, channel, ahead)
            };
        }
        for_heads_and_bits!(heads, format.code_bits(), pass);
    }
}

/// The low bytes of the 32-bit lanes of `v` (each within i8), vector after vector: two
/// saturating packs, then a permutation of their dwords back into order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn low_bytes(v: [__m512i; 4]) -> __m512i {
    let words = [
        _mm512_packs_epi32(v[0], v[1]),
        _mm512_packs_epi32(v[2], v[3]),
    ];
    // Dword `j` of 128-bit lane `L` now holds lanes `4L..4L + 4` of vector `j`.
    let bytes = _mm512_packs_epi16(words[0], words[1]);
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_epi32(order, bytes)
}

/// The value of 16 lanes of integer sums of group `g`: `step·(sum − centering) +
/// center_sum`, with the head's figures for the group's map (written for head `hh`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn finish_sum(sum: __m512i, rounded: &Rounded, hh: usize, g: usize) -> __m512 {
    let g = rounded.map_of[g] as usize;
    let centered = _mm512_sub_epi32(
        sum,
        _mm512_set1_epi32(rounded.centering[hh][g].assume_init()),
    );
    _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(centered),
        _mm512_set1_ps(rounded.steps[hh][g].assume_init()),
        _mm512_set1_ps(rounded.center_sums[hh][g].assume_init()),
    )
}

/// Adds `v` to the 16 floats at `a`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn add_to(a: *mut f32, v: __m512) {
    _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), v));
}

/// Each head's rounded weights of the tile for groups `g` and `g + 1`, as 4-row words.
fn pair_weights<const H: usize>(tile: &Tile, rounded: &Rounded, g: usize) -> [[*const i32; 2]; H] {
    std::array::from_fn(|hh| {
        [g, g + 1].map(|g| {
            let at = (hh * rounded.maps + rounded.map_of[g] as usize) * TILE_ROWS;
            tile.weights[at..].as_ptr() as *const i32
        })
    })
}

/// Adds one quad of 4 interleaved rows to each head's sums: `parts[0]` and `parts[1]` are
/// 16 channels each of group `g`, `parts[2]` and `parts[3]` of group `g + 1`, against the
/// heads' rounded weights of rows `4k..4k+4` ([`pair_weights`] of `g`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn add_quad<const H: usize>(
    sums: &mut [[__m512i; 4]; H],
    parts: &[__m512i; 4],
    weights: &[[*const i32; 2]; H],
    k: usize,
) {
    for (s, w) in sums.iter_mut().zip(weights) {
        let [w0, w1] = w.map(|p| _mm512_set1_epi32(std::ptr::read_unaligned(p.add(k))));
        s[0] = _mm512_dpbusd_epi32(s[0], parts[0], w0);
        s[1] = _mm512_dpbusd_epi32(s[1], parts[1], w0);
        s[2] = _mm512_dpbusd_epi32(s[2], parts[2], w1);
        s[3] = _mm512_dpbusd_epi32(s[3], parts[3], w1);
    }
}

/// The integer sums of 4-bit streams, straight from the rows: per 4 rows and 32 stream
/// bytes (64 channels, loaded with llama.cpp blocks' maps in between), the bytes are
/// interleaved (one byte of 4 rows per lane) and both nibbles cut.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn sums_of_nibbles<const H: usize, S: Source>(
    tile: &Tile,
    decoder: &Decoder,
    rows: &S,
    rounded: &Rounded,
    accs: &mut [&mut [f32]],
    channel: usize,
    ahead: &mut Ahead,
) {
    let format = &decoder.format;
    let (w, n) = (format.width, rows.rows());
    // Packed codes alternate channels within a byte; llama.cpp blocks' nibbles are 16 apart.
    let interleave: [__m512i; 2] = [
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
    ];
    let packed = matches!(format.codes, CodeLayout::Packed { .. });
    let acc: [*mut f32; H] = std::array::from_fn(|h| accs[h].as_mut_ptr().add(channel));
    for c in 0..w.div_ceil(128) {
        let halves = if decoder.is_tail(c) { 1 } else { 2 };
        for half in 0..halves {
            let g0 = 4 * c + 2 * half;
            let mut sums = [[_mm512_setzero_si512(); 4]; H];
            let weights = pair_weights::<H>(tile, rounded, g0);
            for k in 0..n.div_ceil(4) {
                if c == 0 && half == 0 {
                    ahead.rows(4);
                }
                let [x0, x1] = rows.nibble_quad(decoder, k, c, half);
                let parts = [
                    decoder.nibble_level(x0),
                    decoder.nibble_level(_mm512_srli_epi16::<4>(x0)),
                    decoder.nibble_level(x1),
                    decoder.nibble_level(_mm512_srli_epi16::<4>(x1)),
                ];
                add_quad(&mut sums, &parts, &weights, k);
            }
            // Stream byte 16g + l holds channels 32g + 2l, +1 (packed) or 32g + l, +16.
            for (hh, s) in sums.iter().enumerate() {
                for j in 0..2 {
                    let g = g0 + j;
                    let low = finish_sum(s[2 * j], rounded, hh, g);
                    let high = finish_sum(s[2 * j + 1], rounded, hh, g);
                    let (first, second) = if packed {
                        (
                            _mm512_permutex2var_ps(low, interleave[0], high),
                            _mm512_permutex2var_ps(low, interleave[1], high),
                        )
                    } else {
                        (low, high)
                    };
                    add_to(acc[hh].add(GROUP * g), first);
                    add_to(acc[hh].add(GROUP * g + 16), second);
                }
            }
        }
    }
}

/// The integer sums of 1- to 3-bit codes (and 5-bit rows): per 8 rows and 64 channels,
/// the codes are decoded to byte levels of two quads, interleaved (one channel of a quad's
/// 4 rows per lane).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vbmi,avx512vbmi2")]
unsafe fn sums_of_levels<const H: usize, const B: usize, S: Source>(
    tile: &Tile,
    decoder: &Decoder,
    rows: &S,
    rounded: &Rounded,
    accs: &mut [&mut [f32]],
    channel: usize,
    ahead: &mut Ahead,
) {
    let (w, n) = (decoder.format.width, rows.rows());
    let acc: [*mut f32; H] = std::array::from_fn(|h| accs[h].as_mut_ptr().add(channel));
    for half in 0..w / 64 {
        let mut sums = [[_mm512_setzero_si512(); 4]; H];
        let weights = pair_weights::<H>(tile, rounded, 2 * half);
        // Pairs of quads: a tile's rows past `n` weigh 0.
        for p in 0..n.div_ceil(8) {
            if half == 0 {
                ahead.rows(8);
            }
            let [x0, x1] = rows.level_pair::<B>(decoder, p, half);
            add_quad(&mut sums, &x0, &weights, 2 * p);
            add_quad(&mut sums, &x1, &weights, 2 * p + 1);
        }
        for (hh, s) in sums.iter().enumerate() {
            for (x, &sum) in s.iter().enumerate() {
                let g = 2 * half + x / 2;
                add_to(
                    acc[hh].add(64 * half + 16 * x),
                    finish_sum(sum, rounded, hh, g),
                );
            }
        }
    }
}
