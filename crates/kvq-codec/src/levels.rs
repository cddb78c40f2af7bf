//! Integer group kernels: attention's two inner loops on small integer codes, with AVX-512
//! VNNI.
//!
//! A codec whose working rows are 1- to 5-bit codes under one affine map per group of channels
//! describes where its bytes keep them with a [`LevelFormat`] ([`crate::Codec::level_format`]).
//! The default group kernels ([`crate::tile`]) then compute on the codes with `vpdpbusd`:
//! 64 products of u8 levels × i8 values summed into 16 i32 lanes per instruction, where the
//! float kernels do 16 FMAs. A level is the code or its entry in an i8 table, and
//! `value = scale·level + offset` with one map per [`GROUP`] channels.
//!
//! A row's codes are read as one *code stream* ([`LevelFormat::stream_channel`] says which
//! channel each position holds): the packed codes, or llama.cpp blocks' nibbles with their maps skipped.
//!
//! * Scores: the prepared query carries an i8 copy of itself, one scale per 32 channels
//!   ([`quantize_query`], as llama.cpp's q8_0 activations), in the order the kernel cuts the
//!   codes ([`LevelFormat::query_channel`]). The code streams of 16 rows are transposed as
//!   32-bit words, straight from the cache, so that each lane holds one row; every 4 codes are
//!   then cut out (a mask and a shift for nibbles, per-byte bit shifts with `vpmultishiftqb`
//!   for 1 to 3 bits; 5-bit codes add their fifth bit to the nibble), and each instruction
//!   adds 4 channels of 16 rows.
//! * Sums: per tile of [`TILE_ROWS`] rows, head and map, the weights times the rows' scales
//!   are rounded to i8 against their largest magnitude. Four rows are interleaved byte-wise so
//!   that each lane holds one channel of 4 rows: 4-bit streams straight from the cache (both
//!   nibbles of a byte at once), narrower codes after decoding to bytes.
//!
//! Both roundings are to nearest, and both sides are centered on the format's middle level
//! ([`LevelFormat::center`]): a score differs from the float kernels' by at most
//! `Σ_c σ_g/2·scale·|level_c − center|` (`σ_g` the query's scale of the channel's group), one
//! head's sum of a channel by at most `step/2·Σ_t |level_t − center|` per tile (`step` the
//! weights' scale). A codec whose levels come from a table of reals (TurboQuant's centroids)
//! uses the nearest i8 table ([`LevelTable::nearest`]): each value moves by at most half a
//! table unit times its scale.
//!
//! A cache keeps such rows 16 to a block in the order its role's kernel reads them
//! ([`Interleaving`], [`KernelOrder`]; `crate::interleaved`): the score kernel then loads each
//! vector of words as it lies instead of transposing, the sums load one byte of 4 rows per
//! lane, and 2- and 3-bit codes lie in bit planes that a shift and a mask cut.
//!
//! Rows whose runs of channels use different codes (TurboQuant's fractional rates: two
//! codebooks) are read run by run ([`LevelSegment`], [`score_segments`],
//! [`accumulate_segments`]).
//! Blocks that keep one map per channel for many rows (KIVI's keys, [`ChannelBlocks`]) are
//! scored the same way after folding each block's scales into the query
//! ([`score_channel_blocks`]), their rows interleaved 16 at a time where the cache
//! interleaves ([`ChannelBlocks::interleaving`]); their sums keep the float kernels.
//!
//! The kernels need AVX-512 F/BW/DQ/VNNI/VBMI/VBMI2 ([`available`]); elsewhere [`avx2`]'s
//! kernels take the row layout's formats, their runs and the channel blocks' scores
//! (`vpmaddubsw` on 4-bit codes without a table, `vpmaddwd` on the others' decoded levels),
//! and [`avx2::blocks`] reads the interleaved blocks of 1- to 4-bit codes in place (the
//! cache's layout); the float kernels take the rest, as they take everything after
//! [`set_enabled`]`(false)`.

use crate::simd::Ahead;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

pub mod avx2;

/// Rows per tile: the weights of a tile share one rounding step per head and map.
pub const TILE_ROWS: usize = 64;

/// Channels that share one query scale, one level map and one weight step.
pub const GROUP: usize = 32;

/// Most groups a supported row has (`width ≤ 16·GROUP`, [`LevelFormat::supported`]).
pub const MAX_GROUPS: usize = 16;

/// Map words kept per row: the scales and minimums of every map must fit.
pub const MAP_WORDS: usize = 8;

/// Where a row keeps its codes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CodeLayout {
    /// `bits`-bit codes (1 to 4), least significant bit first as [`crate::bits`] packs
    /// them, from byte `at`; the level is the code (or its table entry).
    Packed {
        /// Byte offset of the first code.
        at: usize,
        /// Code width.
        bits: u32,
    },
    /// llama.cpp's 4- and 5-bit blocks (`q4_0`, `q4_1`, `iq4_nl`, `q5_0`, `q5_1`): per 32
    /// channels a block of `block_bytes` whose 16 bytes from byte `at` hold channel `j` in the
    /// low nibble of byte `j` and channel `j + 16` in its high nibble; for 5-bit codes, bit `j`
    /// of the little-endian u32 at byte `high_at` is channel `j`'s fifth bit.
    Nibbles {
        /// Bytes per block of 32 channels (at most 32).
        block_bytes: usize,
        /// Byte of a block where its nibbles begin.
        at: usize,
        /// Byte of a block where its fifth bits begin (5-bit codes), or `None`.
        high_at: Option<usize>,
    },
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
    /// Bits per code.
    pub fn code_bits(&self) -> u32 {
        match self.codes {
            CodeLayout::Packed { bits, .. } => bits,
            CodeLayout::Nibbles { high_at, .. } => 4 + u32::from(high_at.is_some()),
        }
    }

    /// The channel that position `i` of a row's code stream holds. Packed codes are in
    /// channel order; llama.cpp blocks' stream is their nibble bytes, low nibble first, so that position
    /// `i` of block `b` holds channel `32b + (i mod 32)/2 + 16·(i mod 2)`. Every 32 positions
    /// hold one group of channels.
    pub fn stream_channel(&self, i: usize) -> usize {
        match self.codes {
            CodeLayout::Packed { .. } => i,
            CodeLayout::Nibbles { .. } => 32 * (i / 32) + (i % 32) / 2 + 16 * (i % 2),
        }
    }

    /// The byte of a row that holds byte `i` of its code stream.
    pub fn stream_byte(&self, i: usize) -> usize {
        match self.codes {
            CodeLayout::Packed { at, .. } => at + i,
            CodeLayout::Nibbles {
                block_bytes, at, ..
            } => block_bytes * (i / 16) + at + i % 16,
        }
    }

    /// Bytes of a row's code stream.
    pub fn stream_bytes(&self) -> usize {
        self.width * self.code_bits() as usize / 8
    }

    /// Maps per row.
    pub fn maps(&self) -> usize {
        self.width / self.maps.channels
    }

    /// f16 words of the maps per row: each map's scale, and its minimum if there is one.
    pub fn map_words(&self) -> usize {
        self.maps() * (1 + usize::from(self.maps.min_at.is_some()))
    }

    /// Whether every map word lies in the row's first 128 bytes, where the kernels can collect
    /// a row's words with one permutation of two loads (else they gather them per 16 rows).
    pub fn words_in_first_128_bytes(&self) -> bool {
        (0..self.map_words()).all(|k| self.map_word_at(k) + 2 <= 128)
    }

    /// The byte of a row where map word `k` begins: the maps' scales, then their minimums.
    pub fn map_word_at(&self, k: usize) -> usize {
        let (m, maps) = (self.maps, self.maps());
        match m.min_at {
            Some(min_at) if k >= maps => min_at + (k - maps) * m.stride,
            _ => m.scale_at + k * m.stride,
        }
    }

    /// The channel that byte `i` of the i8 query ([`quantize_query`]) multiplies. The score
    /// kernel takes each group's codes 4 at a time from the stream's 32-bit words: 4
    /// consecutive positions, but for 4- and 5-bit codes the low nibbles of a word's 4 bytes and then
    /// their high nibbles (positions `8w, 8w+2, 8w+4, 8w+6`, then `8w+1, …`).
    pub fn query_channel(&self, i: usize) -> usize {
        let position = if self.code_bits() >= 4 {
            8 * (i / 8) + (i / 4) % 2 + 2 * (i % 4)
        } else {
            i
        };
        self.stream_channel(position)
    }

    /// The level the kernels center on: the zero level where there is no minimum, the middle
    /// code otherwise. Rounding errors are then proportional to `level − center`.
    pub fn center(&self) -> f32 {
        match self.maps.min_at {
            Some(_) => (1u32 << (self.code_bits() - 1)) as f32,
            None => self.maps.zero,
        }
    }

    /// Whether the kernels take this format: 1- to 5-bit codes (8-bit caches keep the float
    /// kernels: at that rate the kernels' own rounding would rival the cache's), a width of
    /// whole 64-channel chunks (at most 512), maps over whole groups with at most
    /// [`MAP_WORDS`] f16 words.
    pub fn supported(&self) -> bool {
        let codes_fit = match self.codes {
            CodeLayout::Packed { at, bits } => {
                matches!(bits, 1..=4) && at + self.width / 8 * bits as usize <= self.row_bytes
            }
            CodeLayout::Nibbles {
                block_bytes,
                at,
                high_at,
            } => {
                (at + 16..=32).contains(&block_bytes)
                    && high_at.is_none_or(|h| h + 4 <= block_bytes)
                    && self.width / GROUP * block_bytes <= self.row_bytes
            }
        };
        let m = self.maps;
        let maps = self.width / m.channels.max(1);
        // Every map word sits in the row, and all fit one record.
        let words_fit = |at: usize| at + (maps - 1) * m.stride + 2 <= self.row_bytes;
        self.width > 0
            && self.row_bytes >= 4
            && self.width <= MAX_GROUPS * GROUP
            && self.width.is_multiple_of(64)
            && m.channels.is_multiple_of(GROUP)
            && m.channels > 0
            && self.width.is_multiple_of(m.channels)
            && self.map_words() <= MAP_WORDS
            && words_fit(m.scale_at)
            && m.min_at.is_none_or(words_fit)
            && codes_fit
    }
}

/// One run of a row's working channels that the integer kernels read with one format: rows
/// whose runs use different codes (TurboQuant's fractional rates: two codebooks) are read
/// run by run ([`crate::Codec::level_segments`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LevelSegment {
    /// First channel of the run in the codec's working row (its query and accumulator).
    pub first: usize,
    /// How the stored rows hold the run (`format.width` channels from `first`).
    pub format: LevelFormat,
}

/// f32 slots that [`finish_segment_query`] appends to a prepared query.
pub fn segment_query_slots(segments: &[LevelSegment]) -> usize {
    segments.iter().map(|s| query_slots(s.format.width)).sum()
}

/// Writes each segment's i8 query ([`quantize_query`] of its run of the first values of
/// `prepared`) into the last [`segment_query_slots`] of `prepared`, in the segments' order.
pub fn finish_segment_query(segments: &[LevelSegment], prepared: &mut [f32]) {
    let (head, mut tail) = prepared.split_at_mut(prepared.len() - segment_query_slots(segments));
    for s in segments {
        let (slots, rest) = tail.split_at_mut(query_slots(s.format.width));
        quantize_query(&s.format, &head[s.first..][..s.format.width], slots);
        tail = rest;
    }
}

/// [`crate::Codec::score_group`] over segments: each run is scored by [`score_group`]'s
/// kernel (the first stores, the others add) against its slots of the prepared queries. One
/// segment from channel 0 is [`score_group`] itself.
pub fn score_segments(
    segments: &[LevelSegment],
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let slots = run_slots(segments.iter().map(|s| s.format.width));
    for (k, (s, slots)) in segments.iter().zip(slots).enumerate() {
        score_into(&s.format, slots, queries, blocks, scores, ahead, k > 0);
    }
}

/// For runs of `widths` channels, the query slots each reads from the end of a prepared query:
/// its own ([`query_slots`]) and those of the runs after it ([`finish_segment_query`]'s order).
pub(crate) fn run_slots(
    widths: impl Iterator<Item = usize> + Clone,
) -> impl Iterator<Item = usize> {
    let mut left: usize = widths.clone().map(query_slots).sum();
    widths.map(move |width| {
        let slots = left;
        left -= query_slots(width);
        slots
    })
}

/// [`crate::Codec::accumulate_group`] over segments: each run adds into its channels. One
/// segment from channel 0 is [`accumulate_group`] itself.
pub fn accumulate_segments(
    segments: &[LevelSegment],
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    for s in segments {
        accumulate_into(&s.format, s.first, weights, blocks, accs, ahead);
    }
}

/// Blocks of `tokens` rows of packed `bits`-bit codes that share one affine map per channel,
/// kept before the rows as little-endian f16 pairs `(scale, minimum)`, one per channel:
/// `value = scale·code + minimum` (KIVI's keys, [`crate::Codec::channel_blocks`]).
///
/// Scores fold each block's scales into the query, `q'_c = q_c·scale_c`, round `q'` to i8
/// (one step per 32 channels, as [`quantize_query`]) and run the score kernel on the rows
/// with unit row scales; `Σ_c q_c·(minimum_c + scale_c·center)` is added per block. A score
/// then differs from the exact one by at most `Σ_c σ'_g/2·|code_c − center|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChannelBlocks {
    /// Channels per row.
    pub width: usize,
    /// Code width (2 to 4).
    pub bits: u32,
    /// Rows per block.
    pub tokens: usize,
    /// Whether the rows lie [`INTERLEAVED_ROWS`] at a time in the score kernel's order
    /// ([`ChannelBlocks::interleaving`]; `crate::interleaved`) rather than row after row.
    pub interleaved: bool,
}

impl ChannelBlocks {
    /// Bytes of the maps before a block's rows.
    pub fn header_bytes(&self) -> usize {
        4 * self.width
    }

    /// Bytes per block.
    pub fn block_bytes(&self) -> usize {
        self.header_bytes() + self.tokens * self.rows().row_bytes
    }

    /// The rows as the score kernel reads them: packed codes under unit maps centered on the
    /// middle code (the maps are never read: the kernel's row scales are set to 1).
    pub fn rows(&self) -> LevelFormat {
        LevelFormat {
            row_bytes: self.width / 8 * self.bits as usize,
            width: self.width,
            codes: CodeLayout::Packed {
                at: 0,
                bits: self.bits,
            },
            maps: MapLayout {
                channels: self.width,
                scale_at: 0,
                stride: 0,
                min_at: None,
                zero: (1u32 << self.bits.saturating_sub(1)) as f32,
            },
            table: None,
        }
    }

    /// Whether the kernels take these blocks: 2- to 4-bit codes in rows the score kernel
    /// reads ([`LevelFormat::supported`]), whole interleaved blocks of rows if interleaved.
    pub fn supported(&self) -> bool {
        matches!(self.bits, 2..=4)
            && self.tokens > 0
            && self.rows().supported()
            && (!self.interleaved || self.tokens.is_multiple_of(INTERLEAVED_ROWS))
    }

    /// How each [`INTERLEAVED_ROWS`] rows of an interleaved block lie: the rows' codes in the
    /// score kernel's order, nothing else (their maps are the block's).
    pub fn interleaving(&self) -> Interleaving {
        Interleaving {
            format: self.rows(),
            first: 0,
            order: KernelOrder::Scores,
            // KIVI's schemes are 2- and 4-bit: the AVX2 kernels take no 3-bit blocks.
            packing: Packing::Planes,
            codes_at: 0,
            maps_at: 0,
        }
    }

    /// For each bit of an interleaved block, the bit of the block row after row that it
    /// holds: the maps in place, then each 16 rows' codes as [`Interleaving::bit_sources`]
    /// lays them out.
    pub fn bit_sources(&self) -> Vec<u32> {
        let header_bits = 8 * self.header_bytes() as u32;
        let rows_bits = 8 * self.interleaving().block_bytes() as u32;
        let mut rows = Vec::new();
        self.interleaving().code_sources(&mut rows);
        let mut sources: Vec<u32> = (0..header_bits).collect();
        for b in 0..(self.tokens / INTERLEAVED_ROWS) as u32 {
            sources.extend(rows.iter().map(|s| header_bits + b * rows_bits + s));
        }
        sources
    }
}

/// Rows per interleaved block ([`Interleaving`]).
pub const INTERLEAVED_ROWS: usize = 16;

/// Which kernel an interleaved block is laid out for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelOrder {
    /// The score kernel (keys): the 16 rows' code streams as 32-bit words, word `j` of row
    /// `r` at word `16j + r`, so that each vector the kernel reads holds one word of every
    /// row (narrower codes than 4 bits as bit planes in such words,
    /// [`Interleaving::bit_sources`]).
    Scores,
    /// The sums (values): 4-bit streams per quad of rows and 32 stream bytes, one byte of the
    /// 4 rows per 32-bit lane (lane `l` of the quad's vector `v` holds byte `16v + l`);
    /// narrower codes in bit planes of the same lanes ([`Interleaving::bit_sources`]).
    Sums,
}

/// How an interleaved block holds 3-bit codes (the others have one way each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// Bit planes: each group's low bit pairs in two words or vectors, their third bits in a
    /// third ([`Interleaving::bit_sources`]); the AVX-512 kernels cut them by `vpermb`.
    Planes,
    /// Three bytes hold eight codes of a row and lane: byte `u` two whole codes in bits 0–2
    /// (cut `2u`) and 4–6 (cut `2u + 1`), and in bits 3 and 7 bit `2 − u` of cuts 6 and 7.
    /// The AVX2 kernels cut a byte's whole codes with a mask (and a shift) and merge the
    /// other two from the three: ~20 operations per 8 cuts, against ~40 from planes.
    Triplets,
}

impl Packing {
    /// The packing of `bits`-bit codes that this thread's kernels read: triplets of 3-bit
    /// codes for the AVX2 kernels, planes otherwise.
    pub fn for_kernels(bits: u32) -> Self {
        if bits == 3 && avx2::available() {
            Self::Triplets
        } else {
            Self::Planes
        }
    }

    /// The cut and the bit of its code that bit `t` of byte `u` of a triplet holds.
    fn triplet_bit(u: usize, t: usize) -> (usize, usize) {
        match t {
            0..=2 => (2 * u, t),
            4..=6 => (2 * u + 1, t - 4),
            3 => (6, 2 - u),
            _ => (7, 2 - u),
        }
    }
}

/// Blocks of [`INTERLEAVED_ROWS`] rows of a [`LevelFormat`] whose bytes are in the order the
/// integer kernels read them, so that they load their vectors as they lie instead of
/// transposing and interleaving rows (`crate::interleaved`): each map word of the 16 rows
/// together (16 f16 values), then the codes in the [`KernelOrder`], then the rows' other
/// bytes, row after row. The block is a permutation of the 16 rows' bits
/// ([`Interleaving::bit_sources`]), of whole bytes but for the bit planes of 2-bit codes and
/// the planes or triplets ([`Packing`]) of 3-bit ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interleaving {
    /// The rows' format (of one run of their channels, [`LevelSegment`]).
    pub format: LevelFormat,
    /// The run's first channel in the codec's working row.
    pub first: usize,
    /// The kernel the codes are laid out for.
    pub order: KernelOrder,
    /// How 3-bit codes lie ([`Packing::for_kernels`]).
    pub packing: Packing,
    /// Byte of the block where the run's codes begin.
    pub codes_at: usize,
    /// Byte of the block where the run's map words begin.
    pub maps_at: usize,
}

impl Interleaving {
    /// The interleavings of rows read run by run ([`crate::Codec::level_segments`]), sharing
    /// one block: the map words (those the runs share held once), then the runs' codes one
    /// after another. `None` if the kernels do not take a run, or runs share some of their
    /// map words but not all.
    pub fn of_runs(runs: &[LevelSegment], order: KernelOrder) -> Option<Vec<Self>> {
        let rows = INTERLEAVED_ROWS;
        let words = |f: &LevelFormat| (0..f.map_words()).map(|k| f.map_word_at(k)).collect();
        let mut maps: Vec<Vec<usize>> = Vec::new();
        for run in runs {
            let run_words: Vec<usize> = words(&run.format);
            let shares = |w: &Vec<usize>| w.iter().any(|x| run_words.contains(x));
            // The interleaved kernels cut 1- to 4-bit codes; 5-bit runs (q5_0/q5_1) stay row
            // by row.
            let interleavable = run.format.supported() && (1..=4).contains(&run.format.code_bits());
            if !interleavable || maps.iter().any(|w| shares(w) && *w != run_words) {
                return None;
            }
            if !maps.contains(&run_words) {
                maps.push(run_words);
            }
        }
        // The maps first: the kernels read them before a tile's codes.
        let mut maps_at = vec![0];
        for w in &maps {
            maps_at.push(maps_at[maps_at.len() - 1] + 2 * rows * w.len());
        }
        let mut codes_at = maps_at[maps.len()];
        let mut placed = Vec::with_capacity(runs.len());
        for run in runs {
            let map = maps
                .iter()
                .position(|m| *m == words(&run.format))
                .expect("held");
            placed.push(Self {
                format: run.format,
                first: run.first,
                order,
                packing: Packing::for_kernels(run.format.code_bits()),
                codes_at,
                maps_at: maps_at[map],
            });
            codes_at += rows * run.format.stream_bytes();
        }
        Some(placed)
    }

    /// Bytes per block (those of its 16 rows).
    pub fn block_bytes(&self) -> usize {
        INTERLEAVED_ROWS * self.format.row_bytes
    }

    /// Bytes of a row's code stream (of the run).
    pub fn stream_bytes(&self) -> usize {
        self.format.stream_bytes()
    }

    /// For each bit of a block of `runs` (bit `8i + j` is bit `j` of byte `i`), the bit of
    /// the 16 rows (row after row, as the codec stores them) that it holds.
    pub fn bit_sources(runs: &[Interleaving]) -> Vec<u32> {
        let rows = INTERLEAVED_ROWS;
        let rb = runs[0].format.row_bytes;
        let bit_of = |byte: usize, bit: usize| (8 * byte + bit) as u32;
        let mut sources = Vec::with_capacity(8 * runs[0].block_bytes());
        let mut held = vec![false; rb];
        let mut words_held = Vec::new();
        for run in runs {
            let f = &run.format;
            if words_held.contains(&run.maps_at) {
                continue;
            }
            words_held.push(run.maps_at);
            for k in 0..f.map_words() {
                held[f.map_word_at(k)..][..2].fill(true);
                for r in 0..rows {
                    sources.extend((0..16).map(|j| bit_of(r * rb + f.map_word_at(k), j)));
                }
            }
        }
        for run in runs {
            run.code_sources(&mut sources);
            for s in 0..run.format.stream_bytes() {
                held[run.format.stream_byte(s)] = true;
            }
        }
        for r in 0..rows {
            for b in (0..rb).filter(|&b| !held[b]) {
                sources.extend((0..8).map(|j| bit_of(r * rb + b, j)));
            }
        }
        sources
    }

    /// Appends to `sources` the bits of the rows that the run's codes region holds.
    fn code_sources(&self, sources: &mut Vec<u32>) {
        let (f, rows) = (&self.format, INTERLEAVED_ROWS);
        let (rb, stream, bits) = (f.row_bytes, self.stream_bytes(), f.code_bits() as usize);
        let bit_of = |byte: usize, bit: usize| (8 * byte + bit) as u32;
        // Bit `j` of code `i` of row `r`'s stream, and whole bytes of the stream.
        let code_bit = |r: usize, i: usize, j: usize| {
            let s = i * bits + j;
            bit_of(r * rb + f.stream_byte(s / 8), s % 8)
        };
        let code_byte =
            |r: usize, s: usize| (0..8).map(move |j| bit_of(r * rb + f.stream_byte(s), j));
        match (self.order, bits) {
            (KernelOrder::Scores, 4 | 1) => {
                for word in 0..stream / 4 {
                    for r in 0..rows {
                        sources.extend((0..4).flat_map(|b| code_byte(r, 4 * word + b)));
                    }
                }
            }
            (KernelOrder::Sums, 4) => {
                for quad in 0..rows / 4 {
                    for half in 0..stream / 32 {
                        for byte in 0..32 {
                            let rows = 4 * quad..4 * quad + 4;
                            sources.extend(rows.flat_map(|r| code_byte(r, 32 * half + byte)));
                        }
                    }
                }
            }
            // Bit planes: per group of 32 codes and row, two words of their low bit pairs
            // (cut `k` of the kernel, codes `4k..4k + 4` one per byte, is bits `2k mod 8` of
            // word `k / 4`) and for 3 bits a word of their high bits (bit `k` of byte `b`
            // for code `4k + b`); or three words of triplets ([`Packing::Triplets`], byte `b`
            // of each for codes `4k + b`).
            (KernelOrder::Scores, _) => {
                for group in 0..f.width / GROUP {
                    for plane in 0..bits {
                        for r in 0..rows {
                            for b in 0..4 {
                                for t in 0..8 {
                                    let (k, j) = match (self.packing, plane) {
                                        (Packing::Triplets, u) => Packing::triplet_bit(u, t),
                                        (_, 2) => (t, 2),
                                        (_, w) => (4 * w + t / 2, t % 2),
                                    };
                                    sources.push(code_bit(r, GROUP * group + 4 * k + b, j));
                                }
                            }
                        }
                    }
                }
            }
            // Per pair of quads and 64 codes in triplets ([`Packing::Triplets`]): for each
            // of the three bytes of a triplet 64 bytes, 32 per quad, byte `4l + r` of a quad
            // for its row `r` and the codes `8k + l` of cuts `k`.
            (KernelOrder::Sums, 3) if self.packing == Packing::Triplets => {
                for pair in 0..rows / 8 {
                    for slice in 0..f.width / 64 {
                        for u in 0..3 {
                            for y in 0..64 {
                                let (quad, l, r) = (2 * pair + y / 32, y % 32 / 4, y % 4);
                                for t in 0..8 {
                                    let (k, j) = Packing::triplet_bit(u, t);
                                    let code = 64 * slice + 8 * k + l;
                                    sources.push(code_bit(4 * quad + r, code, j));
                                }
                            }
                        }
                    }
                }
            }
            // Per pair of quads and 64 codes: each quad's low bit pairs (byte `4l + r` holds
            // codes `l, 16 + l, 32 + l, 48 + l` of its row `r`, two bits each), then for 3
            // bits their high bits (the first quad's in the low nibbles); 1-bit codes are
            // that plane alone.
            (KernelOrder::Sums, _) => {
                for pair in 0..rows / 8 {
                    for slice in 0..f.width / 64 {
                        for plane in 0..bits {
                            for y in 0..64 {
                                for t in 0..8 {
                                    let (quad, j, bit) = match (bits, plane) {
                                        (1, _) => (2 * pair + t / 4, t % 4, 0),
                                        (_, 2) => (2 * pair + t / 4, t % 4, 2),
                                        (_, q) => (2 * pair + q, t / 2, t % 2),
                                    };
                                    let r = 4 * quad + y % 4;
                                    sources.push(code_bit(r, 64 * slice + 16 * j + y / 4, bit));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Whether these kernels read interleaved blocks of `runs` in place: [`available`], and any
/// 3-bit codes in bit planes ([`Packing::Planes`]).
pub fn takes_interleaved(runs: &[Interleaving]) -> bool {
    available() && runs.iter().all(|r| r.packing == Packing::Planes)
}

/// [`score_segments`] on a run of interleaved blocks ([`Interleaving::of_runs`] for
/// [`KernelOrder::Scores`]; one run from channel 0 is [`score_group`]).
pub fn score_interleaved(
    runs: &[Interleaving],
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let slots = run_slots(runs.iter().map(|r| r.format.width));
        let mut read = avx512::QuerySlots::default();
        for (k, (run, slots)) in runs.iter().zip(slots).enumerate() {
            assert_eq!(run.order, KernelOrder::Scores);
            read_slots(&mut read, queries, slots, run.format.width);
            for_each_block_tile(run, blocks, |first, rows, tile, decoder| {
                let at = (first, &mut *ahead);
                score_tile(&read, rows, tile, decoder, scores, at, k > 0);
            });
        }
    }
}

/// Reads into `read` the i8 slots of a run `width` channels wide that end each query (its
/// last `slots` values).
#[cfg(target_arch = "x86_64")]
fn read_slots(read: &mut avx512::QuerySlots, queries: &[&[f32]], slots: usize, width: usize) {
    assert!(queries.iter().all(|q| q.len() >= slots) && query_slots(width) <= slots);
    // SAFETY: each query holds `slots ≥ query_slots(width)` values from the pointer on.
    unsafe {
        read.read(width, queries.len(), |h| {
            queries[h][queries[h].len() - slots..].as_ptr()
        })
    };
}

/// Scores one tile of `rows` (from row `first` of the run) against the queries `read` into
/// `scores[h][first..]`, adding to them if `add`; prefetches `ahead` as it goes.
#[cfg(target_arch = "x86_64")]
fn score_tile<S: avx512::Source>(
    read: &avx512::QuerySlots,
    rows: &S,
    tile: &Tile,
    decoder: &avx512::Decoder,
    scores: &mut [&mut [f32]],
    (first, ahead): (usize, &mut Ahead),
    add: bool,
) {
    // SAFETY: the tile's format is supported (`with_scratch`) and its maps decoded, and the
    // slots were read for its width; `score_tile` checks the score rows.
    unsafe { avx512::score_tile(tile, decoder, rows, read, scores, first, ahead, add) };
}

/// [`accumulate_segments`] on a run of interleaved blocks ([`Interleaving::of_runs`] for
/// [`KernelOrder::Sums`]): each run adds into its channels.
pub fn accumulate_interleaved(
    runs: &[Interleaving],
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    for run in runs {
        assert_eq!(run.order, KernelOrder::Sums);
        #[cfg(target_arch = "x86_64")]
        for_each_block_tile(run, blocks, |first, rows, tile, decoder| {
            let channel = run.first;
            // SAFETY: as in `accumulate_into`.
            unsafe {
                avx512::accumulate_tile(tile, decoder, rows, first, weights, accs, channel, ahead)
            };
        });
    }
}

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the integer kernels on or off for the whole process (`kvq --f32-attention`).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the integer kernels run: the CPU has AVX-512 F/BW/DQ/VNNI/VBMI/VBMI2, they are
/// enabled, and [`crate::simd::force_scalar`] is not in effect.
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
                    && std::is_x86_feature_detected!("avx512vbmi2")
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
pub(crate) const QUERY_MAP: usize = 3;

/// Writes the i8 form of `query` (the format's `width` values, in channel order) into `out`
/// ([`query_slots`] long): the codes in [`LevelFormat::query_channel`]'s order, four to a
/// slot, then for each group its scale `σ_g` (largest magnitude / 127), `σ_g·Σ codes` and the
/// exact `Σ q`.
pub fn quantize_query(format: &LevelFormat, query: &[f32], out: &mut [f32]) {
    let width = query.len();
    assert!(width == format.width && out.len() == query_slots(width));
    let (codes, maps) = out.split_at_mut(width / 4);
    let mut bytes = vec![0u8; width];
    // Rows with one map keep one query scale for all groups, so that the score kernel can add
    // the groups' integer dots before converting them (`score_heads`).
    let row_largest = query.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let one_scale = format.maps.channels >= width;
    for (g, (xs, bs)) in query
        .chunks_exact(GROUP)
        .zip(bytes.chunks_exact_mut(GROUP))
        .enumerate()
    {
        let largest = if one_scale {
            row_largest
        } else {
            xs.iter().fold(0.0f32, |m, x| m.max(x.abs()))
        };
        let scale = largest / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut sum = 0i32;
        for (i, b) in bs.iter_mut().enumerate() {
            let x = query[format.query_channel(g * GROUP + i)];
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
    quantize_query(format, &head[..format.width], tail);
}

/// A tile's maps and rounded weights.
#[derive(Default)]
struct Tile {
    /// Scale of map `m` of row `r` at `m·TILE_ROWS + r`.
    scales: Vec<f32>,
    /// Value of the center level ([`LevelFormat::center`]) of map `m` of row `r` at
    /// `m·TILE_ROWS + r` (formats with a minimum only).
    centers: Vec<f32>,
    /// Each row's map words (f16 scales, then minimums), [`MAP_WORDS`] per row.
    map_words: Vec<u16>,
    /// Rounded weights of the sums, `[head of a pass][map][TILE_ROWS]`.
    weights: Vec<i8>,
}

/// A thread's tile, the decoders of the last few formats it read (keys and values usually
/// differ), and the i8 queries and biases of a block of per-channel maps.
#[derive(Default)]
struct Scratch {
    tile: Tile,
    #[cfg(target_arch = "x86_64")]
    decoders: Vec<avx512::Decoder>,
    block_queries: Vec<f32>,
}

/// Per-format states a thread keeps (keys and values usually differ): decoders here, the AVX2
/// kernels' plans.
const PER_FORMAT: usize = 4;

/// The index in `cache` of the entry that `matches` picks, made by `make` first if there is
/// none (the oldest of [`PER_FORMAT`] entries making room).
fn cached<T>(cache: &mut Vec<T>, matches: impl Fn(&T) -> bool, make: impl FnOnce() -> T) -> usize {
    cache.iter().position(matches).unwrap_or_else(|| {
        if cache.len() == PER_FORMAT {
            cache.remove(0);
        }
        cache.push(make());
        cache.len() - 1
    })
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Calls `f(tile, decoder, block_queries)` with the thread's scratch sized for `format`.
#[cfg(target_arch = "x86_64")]
fn with_scratch<R>(
    format: &LevelFormat,
    f: impl FnOnce(&mut Tile, &avx512::Decoder, &mut Vec<f32>) -> R,
) -> R {
    assert!(available() && format.supported());
    SCRATCH.with(|scratch| {
        let Scratch {
            tile,
            decoders,
            block_queries,
        } = &mut *scratch.borrow_mut();
        let groups = format.width / GROUP;
        tile.scales.resize(groups * TILE_ROWS, 0.0);
        tile.centers.resize(groups * TILE_ROWS, 0.0);
        tile.map_words.resize(TILE_ROWS * MAP_WORDS, 0);
        tile.weights.resize(
            avx512::SUM_HEADS * (format.width / format.maps.channels) * TILE_ROWS,
            0,
        );
        // SAFETY: `available` checked the CPU.
        let make = || unsafe { avx512::Decoder::new(format) };
        let at = cached(decoders, |d| d.format() == format, make);
        f(tile, &decoders[at], block_queries)
    })
}

/// Calls `f(first_row, rows, tile, decoder)` for consecutive tiles of `blocks` (whole rows),
/// after decoding each tile's maps.
#[cfg(target_arch = "x86_64")]
fn for_each_tile(
    format: &LevelFormat,
    blocks: &[u8],
    mut f: impl FnMut(usize, &[u8], &mut Tile, &avx512::Decoder),
) {
    with_scratch(format, |tile, decoder, _| {
        for (i, rows) in blocks.chunks(TILE_ROWS * format.row_bytes).enumerate() {
            // SAFETY: the format is supported, so every row holds its codes and maps, and the
            // tile is sized for the width.
            unsafe { decoder.decode(rows, tile) };
            f(i * TILE_ROWS, rows, tile, decoder);
        }
    });
}

/// Calls `f(first_row, rows, tile, decoder)` for consecutive tiles of interleaved `blocks`,
/// after decoding each tile's maps.
#[cfg(target_arch = "x86_64")]
fn for_each_block_tile(
    layout: &Interleaving,
    blocks: &[u8],
    mut f: impl FnMut(usize, &avx512::Blocks, &mut Tile, &avx512::Decoder),
) {
    assert!(blocks.len().is_multiple_of(layout.block_bytes()));
    with_scratch(&layout.format, |tile, decoder, _| {
        let tile_bytes = TILE_ROWS / INTERLEAVED_ROWS * layout.block_bytes();
        for (i, chunk) in blocks.chunks(tile_bytes).enumerate() {
            // The next tile's maps into L1, a tile ahead of their decoding.
            for next in blocks[((i + 1) * tile_bytes).min(blocks.len())..]
                .chunks(layout.block_bytes())
                .take(TILE_ROWS / INTERLEAVED_ROWS)
            {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                // SAFETY: SSE is part of x86-64; a prefetch never faults.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(next[layout.maps_at..].as_ptr() as *const i8)
                };
            }
            let rows = avx512::Blocks::new(layout, chunk);
            // SAFETY: the format is supported (`with_scratch`), so every block holds its
            // codes and maps, and the tile is sized for the width.
            unsafe { rows.decode_maps(decoder, tile) };
            f(i * TILE_ROWS, &rows, tile, decoder);
        }
    });
}

/// [`crate::Codec::score_group`] with the integer kernels: `queries[h]` are prepared queries
/// whose last [`query_slots`] values came from [`quantize_query`].
/// Prefetches `ahead` as it goes, a share per 16 rows.
pub fn score_group(
    format: &LevelFormat,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    score_into(
        format,
        query_slots(format.width),
        queries,
        blocks,
        scores,
        ahead,
        false,
    );
}

/// [`score_group`] for queries whose format's slots begin `slots` values before their end,
/// adding to `scores` if `add`.
fn score_into(
    format: &LevelFormat,
    slots: usize,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
    add: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut read = avx512::QuerySlots::default();
        read_slots(&mut read, queries, slots, format.width);
        for_each_tile(format, blocks, |first, rows, tile, decoder| {
            let rows = avx512::Rows::new(decoder, rows);
            let at = (first, &mut *ahead);
            score_tile(&read, &rows, tile, decoder, scores, at, add);
        });
    }
}

/// [`crate::Codec::score_group`] with the integer kernels for [`ChannelBlocks`]: `queries[h]`
/// begins with the query itself (`width` values). Prefetches `ahead` as it goes.
pub fn score_channel_blocks(
    layout: &ChannelBlocks,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let rows_format = layout.rows();
        let (w, heads, header) = (layout.width, queries.len(), layout.header_bytes());
        let slots = query_slots(w);
        assert!(layout.supported() && queries.iter().all(|q| q.len() >= w));
        assert!(scores
            .iter()
            .all(|s| s.len() * layout.block_bytes() >= blocks.len() * layout.tokens));
        // The byte of each group's i8 query that holds each channel.
        let order: [u8; GROUP] = std::array::from_fn(|i| rows_format.query_channel(i) as u8);
        let interleaving = layout.interleaving();
        let mut read = avx512::QuerySlots::default();
        with_scratch(&rows_format, |tile, decoder, block_queries| {
            tile.scales.fill(1.0);
            // Each head's i8 query slots, then each head's bias.
            block_queries.resize(heads * (slots + 1), 0.0);
            let (prepared, biases) = block_queries.split_at_mut(heads * slots);
            for (b, block) in blocks.chunks_exact(layout.block_bytes()).enumerate() {
                let (maps, rows) = block.split_at(header);
                // SAFETY: the CPU has the kernels (`with_scratch`); `maps` holds `width`
                // pairs and each query `width` values.
                unsafe {
                    avx512::channel_queries(
                        maps,
                        rows_format.center(),
                        queries,
                        &order,
                        prepared,
                        biases,
                    )
                };
                // SAFETY: each head's slots are `slots` values of `prepared`.
                unsafe { read.read(w, heads, |h| prepared[h * slots..].as_ptr()) };
                for (i, tile_rows) in rows.chunks(TILE_ROWS * rows_format.row_bytes).enumerate() {
                    let first = b * layout.tokens + i * TILE_ROWS;
                    // SAFETY: as in `score_group`, with the row scales set to 1 (interleaved
                    // rows are whole blocks: `supported`).
                    unsafe {
                        if layout.interleaved {
                            let rows = avx512::Blocks::new(&interleaving, tile_rows);
                            avx512::score_tile(
                                tile, decoder, &rows, &read, scores, first, ahead, false,
                            )
                        } else {
                            let rows = avx512::Rows::new(decoder, tile_rows);
                            avx512::score_tile(
                                tile, decoder, &rows, &read, scores, first, ahead, false,
                            )
                        }
                    }
                }
                for (s, bias) in scores.iter_mut().zip(biases.iter()) {
                    s[b * layout.tokens..][..layout.tokens]
                        .iter_mut()
                        .for_each(|x| *x += bias);
                }
            }
        });
    }
}

/// [`crate::Codec::accumulate_group`] with the integer kernels; prefetches `ahead` as it
/// goes, a share per 4 rows.
pub fn accumulate_group(
    format: &LevelFormat,
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    accumulate_into(format, 0, weights, blocks, accs, ahead);
}

/// [`accumulate_group`] into channels `channel..channel + width` of the accumulators.
fn accumulate_into(
    format: &LevelFormat,
    channel: usize,
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    #[cfg(target_arch = "x86_64")]
    for_each_tile(format, blocks, |first, rows, tile, decoder| {
        // SAFETY: as in `for_each_tile`; each weight row holds the tile's rows, and
        // `accumulate_tile` checks that each accumulator holds the channels.
        unsafe {
            avx512::accumulate_tile(
                tile,
                decoder,
                &avx512::Rows::new(decoder, rows),
                first,
                weights,
                accs,
                channel,
                ahead,
            )
        };
    });
}

/// Vector helpers other codecs' kernels share.
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::transpose16;

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{with_isa_limit, Isa};
    use crate::{build_codec, Calibration, Codec, Role, SchemeKind};
    use half::f16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The level of channel `c` of `row`, read plainly from the layout.
    fn level(format: &LevelFormat, row: &[u8], c: usize) -> u8 {
        let code = match format.codes {
            CodeLayout::Packed { at, bits } => crate::bits::get(&row[at..], bits, c),
            CodeLayout::Nibbles {
                block_bytes,
                at,
                high_at,
            } => {
                let block = &row[block_bytes * (c / 32)..];
                let byte = block[at + c % 16];
                let nibble = if c % 32 < 16 { byte & 15 } else { byte >> 4 };
                let fifth = high_at.map_or(0, |h| {
                    let bits =
                        u32::from_le_bytes([block[h], block[h + 1], block[h + 2], block[h + 3]]);
                    (bits >> (c % 32) & 1) as u8
                });
                nibble | fifth << 4
            }
        };
        match format.table {
            Some(t) => (t.levels[usize::from(code)] as u8) ^ 0x80,
            None => code,
        }
    }

    /// Interleaved blocks of 3-bit rows in either packing are a permutation of the rows' bits,
    /// and in triplets each code lies where the AVX2 kernels cut it: of byte `u` (vector `u`
    /// of a group's words or a slice's quads) bits 0–2 for cut `2u`, 4–6 for cut `2u + 1`,
    /// and bits 3 and 7 bit `2 − u` of cuts 6 and 7.
    #[test]
    fn triplets_hold_each_code_where_the_avx2_kernels_cut_it() {
        let kind = SchemeKind::parse("int3-g64").unwrap();
        let codec = build_codec(kind, Role::Value, 128, &Calibration::default(), 1).unwrap();
        let format = codec.level_format().unwrap();
        let (rows, rb, w) = (INTERLEAVED_ROWS, format.row_bytes, format.width);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let row_bytes: Vec<u8> = (0..rows * rb).map(|_| rng.gen()).collect();
        let segment = LevelSegment { first: 0, format };
        for order in [KernelOrder::Scores, KernelOrder::Sums] {
            for packing in [Packing::Planes, Packing::Triplets] {
                let run = Interleaving {
                    packing,
                    ..Interleaving::of_runs(&[segment], order).unwrap()[0]
                };
                let sources = Interleaving::bit_sources(&[run]);
                let mut seen = vec![false; 8 * rows * rb];
                for &x in &sources {
                    assert!(!std::mem::replace(&mut seen[x as usize], true), "{order:?}");
                }
                assert!(seen.iter().all(|&x| x), "{order:?} {packing:?}");
                if packing == Packing::Planes {
                    continue;
                }
                let bit = |i: usize| (row_bytes[i / 8] >> (i % 8)) & 1;
                let block: Vec<u8> = sources
                    .chunks_exact(8)
                    .map(|b| (0..8).fold(0, |x, j| x | bit(b[j] as usize) << j))
                    .collect();
                for r in 0..rows {
                    for c in 0..w {
                        // The triplet's first byte, and the cut of the code.
                        let (first, k) = match order {
                            KernelOrder::Scores => {
                                let (g, i) = (c / GROUP, c % GROUP);
                                (4 * (16 * 3 * g + r) + i % 4, i / 4)
                            }
                            KernelOrder::Sums => {
                                let (pair, q, s, j) = (r / 8, r / 4 % 2, c / 64, c % 64);
                                let at = pair * 3 * w + 192 * s + 32 * q + 4 * (j % 8) + r % 4;
                                (at, j / 8)
                            }
                        };
                        // Byte `u` of the triplet: 64 bytes after byte `u − 1`.
                        let byte = |u: usize| block[run.codes_at + first + 64 * u];
                        let code = match k {
                            0..=5 => byte(k / 2) >> (4 * (k % 2)) & 7,
                            _ => {
                                (0..3).fold(0, |x, u| x | (byte(u) >> (4 * k - 21) & 1) << (2 - u))
                            }
                        };
                        let expected = level(&format, &row_bytes[r * rb..][..rb], c);
                        assert_eq!(code, expected, "{order:?} row {r} channel {c}");
                    }
                }
            }
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

    /// `values` (whole blocks of rows) encoded by `codec`, and the bytes decoded to its working
    /// space.
    fn encoded(codec: &dyn Codec, values: &[f32]) -> (Vec<u8>, Vec<f32>) {
        let per_block = codec.block_tokens() * codec.head_dim();
        let mut bytes = vec![0u8; values.len() / per_block * codec.block_bytes()];
        for (v, b) in values
            .chunks_exact(per_block)
            .zip(bytes.chunks_exact_mut(codec.block_bytes()))
        {
            codec.encode(v, b).unwrap();
        }
        let mut working = vec![0f32; values.len() / codec.head_dim() * codec.working_len()];
        codec.decode_working(&bytes, &mut working);
        (bytes, working)
    }

    /// A scheme with a level format: its label, codec, format, encoded rows and their
    /// working-space decoding.
    type LevelCase = (String, Box<dyn Codec>, LevelFormat, Vec<u8>, Vec<f32>);

    /// The integer kernel families this CPU runs, each with the ISA limit that selects it.
    fn integer_kernel_limits() -> Vec<(&'static str, Isa)> {
        let family = |isa| {
            with_isa_limit(isa, || {
                if available() {
                    Some("avx512")
                } else if avx2::available() {
                    Some("avx2")
                } else {
                    None
                }
            })
        };
        let mut out: Vec<(&str, Isa)> = Vec::new();
        for isa in [Isa::Avx512, Isa::Avx2] {
            match family(isa) {
                Some(name) if out.iter().all(|(n, _)| *n != name) => out.push((name, isa)),
                _ => {}
            }
        }
        if out.is_empty() {
            eprintln!("no AVX-512 VNNI/VBMI or AVX2 here: the integer kernels are not used");
        }
        out
    }

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
                    let (bytes, working) = encoded(codec.as_ref(), &values);
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

    /// Per-channel blocks: the scores equal the integer algorithm written plainly (the scaled
    /// query rounded per block, ties to even) and are within `Σ_c σ'_g/2·|code_c − center|` of
    /// the exact dot with the decoded keys.
    #[test]
    fn channel_block_scores_match_the_plain_algorithm_and_the_rounding_bound() {
        for (kernels, isa) in integer_kernel_limits() {
            with_isa_limit(isa, || channel_block_scores_match(kernels));
        }
    }

    fn channel_block_scores_match(kernels: &str) {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let mut checked = 0;
        for name in ["kivi4", "kivi2", "kivi4-g128", "kivi2-g64"] {
            for head_dim in [64, 128, 256] {
                let kind = SchemeKind::parse(name).unwrap();
                let codec =
                    build_codec(kind, Role::Key, head_dim, &Calibration::default(), 0).unwrap();
                let layout = codec
                    .channel_blocks()
                    .expect("KIVI keys have channel blocks");
                let blocks = 3;
                let rows = blocks * layout.tokens;
                let values: Vec<f32> = (0..rows * head_dim)
                    .map(|i| rng.gen_range(-1.0..1.0f32) * (1 + i % 7) as f32)
                    .collect();
                let (bytes, keys) = encoded(codec.as_ref(), &values);
                let heads = 1 + checked % 6;
                let queries: Vec<Vec<f32>> = (0..heads)
                    .map(|_| (0..head_dim).map(|_| rng.gen_range(-1.0..1.0)).collect())
                    .collect();
                let refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                let mut scores = vec![vec![0f32; rows]; heads];
                let mut outs: Vec<&mut [f32]> = scores.iter_mut().map(Vec::as_mut_slice).collect();
                let score = if available() {
                    score_channel_blocks
                } else {
                    assert!(avx2::takes_channel_blocks(&layout), "{kernels}: {name}");
                    avx2::score_channel_blocks
                };
                score(&layout, &refs, &bytes, &mut outs, &mut Ahead::none());
                let center = f64::from(layout.rows().center());
                for (b, block) in bytes.chunks_exact(layout.block_bytes()).enumerate() {
                    let f16_at = |at: usize| {
                        f64::from(f16::from_le_bytes([block[at], block[at + 1]]).to_f32())
                    };
                    let (scales, mins): (Vec<f64>, Vec<f64>) = (0..head_dim)
                        .map(|c| (f16_at(4 * c), f16_at(4 * c + 2)))
                        .unzip();
                    let rows_at = layout.header_bytes();
                    for (h, q) in queries.iter().enumerate() {
                        // The plain algorithm: q' = q·scale, i8 per group, centered codes.
                        let scaled: Vec<f32> =
                            (0..head_dim).map(|c| q[c] * scales[c] as f32).collect();
                        let steps: Vec<f32> = scaled
                            .chunks_exact(GROUP)
                            .map(|g| g.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0)
                            .collect();
                        let q8: Vec<f64> = (0..head_dim)
                            .map(|c| {
                                let s = steps[c / GROUP];
                                let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
                                f64::from((scaled[c] * inv).round_ties_even())
                            })
                            .collect();
                        let bias: f64 = (0..head_dim)
                            .map(|c| f64::from(q[c]) * (mins[c] + scales[c] * center))
                            .sum();
                        for t in 0..layout.tokens {
                            let row = &block[rows_at + t * layout.rows().row_bytes..];
                            let (mut plain, mut exact, mut bound) = (bias, 0f64, 0f64);
                            for c in 0..head_dim {
                                let code = f64::from(crate::bits::get(row, layout.bits, c));
                                let step = f64::from(steps[c / GROUP]);
                                plain += step * q8[c] * (code - center);
                                exact += f64::from(q[c])
                                    * f64::from(keys[(b * layout.tokens + t) * head_dim + c]);
                                bound += step / 2.0 * (code - center).abs();
                            }
                            let got = f64::from(scores[h][b * layout.tokens + t]);
                            let tol = 1e-4 * (1.0 + plain.abs());
                            assert!(
                                (got - plain).abs() <= tol,
                                "{name} d{head_dim} head {h} row {t}: {got} vs plain {plain}"
                            );
                            assert!(
                                (got - exact).abs() <= 1.001 * bound + tol,
                                "{name} d{head_dim}: {got} vs exact {exact}, bound {bound}"
                            );
                        }
                    }
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 12);
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
            "q4_1",
            "iq4_nl",
            "q5_0",
            "q5_1",
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

    /// TurboQuant's fractional rates (one instance with two codebooks, or two instances over
    /// calibrated outlier channels) are read in runs: the runs tile the working row, each
    /// run's format read plainly gives the decoded values within half a table unit, and the
    /// prepared query ends with each run's i8 query.
    #[test]
    fn fractional_turbo_rows_are_read_in_runs() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        for name in ["turbo3.5", "turbo2.5"] {
            for head_dim in [128, 256] {
                for outliers in [false, true] {
                    let cal = Calibration {
                        outlier_channels: outliers
                            .then(|| (0..head_dim).rev().step_by(3).collect()),
                        ..Calibration::default()
                    };
                    let kind = SchemeKind::parse(name).unwrap();
                    let codec = build_codec(kind, Role::Key, head_dim, &cal, 4).unwrap();
                    let segments = codec.level_segments();
                    let case = format!("{name} d{head_dim} outliers {outliers}");
                    assert_eq!(segments.len(), 2, "{case}");
                    assert_eq!(segments[0].first, 0, "{case}");
                    assert_eq!(segments[1].first, segments[0].format.width, "{case}");
                    assert_eq!(
                        segments[1].first + segments[1].format.width,
                        codec.working_len()
                    );
                    let values: Vec<f32> = (0..5 * head_dim)
                        .map(|_| rng.gen_range(-1.0..1.0))
                        .collect();
                    let (bytes, working) = encoded(codec.as_ref(), &values);
                    for s in segments {
                        for (t, row) in bytes.chunks_exact(codec.block_bytes()).enumerate() {
                            for c in 0..s.format.width {
                                let (scale, _) = map(&s.format, row, c);
                                let value = scale * (f64::from(level(&s.format, row, c)) - 128.0);
                                let want =
                                    f64::from(working[t * codec.working_len() + s.first + c]);
                                assert!(
                                    (value - want).abs() <= scale.abs() / 2.0 + 1e-5,
                                    "{case} row {t} channel {c}: {value} vs {want}"
                                );
                            }
                        }
                    }
                    let q: Vec<f32> = (0..head_dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
                    let mut prepared = vec![0f32; codec.query_len()];
                    codec.prepare_query(&q, &mut prepared);
                    let mut slots = prepared.len() - segment_query_slots(segments);
                    for s in segments {
                        let mut want = vec![0f32; query_slots(s.format.width)];
                        quantize_query(
                            &s.format,
                            &prepared[s.first..][..s.format.width],
                            &mut want,
                        );
                        let got = &prepared[slots..][..want.len()];
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{case}"
                        );
                        slots += want.len();
                    }
                }
            }
        }
    }

    /// Formats the kernels cannot read are refused, not read out of bounds.
    #[test]
    fn unsupported_formats_are_refused() {
        let packed = LevelFormat {
            row_bytes: 66,
            width: 128,
            codes: CodeLayout::Packed { at: 2, bits: 4 },
            maps: MapLayout {
                channels: 128,
                scale_at: 0,
                stride: 0,
                min_at: None,
                zero: 8.0,
            },
            table: None,
        };
        assert!(packed.supported());
        let with = |f: &dyn Fn(&mut LevelFormat)| {
            let mut format = packed;
            f(&mut format);
            format.supported()
        };
        assert!(
            !with(&|f| f.codes = CodeLayout::Packed { at: 2, bits: 8 }),
            "8-bit codes"
        );
        assert!(!with(&|f| f.row_bytes = 65), "codes past the row");
        assert!(
            !with(&|f| f.width = 96),
            "a width of part of a 64-channel chunk"
        );
        assert!(
            !with(&|f| f.maps.channels = 48),
            "maps over part of a group"
        );
        assert!(
            !with(&|f| f.maps.channels = 256),
            "a map wider than the row"
        );
        assert!(!with(&|f| f.maps.scale_at = 65), "a scale past the row");
        let many_maps = |f: &mut LevelFormat| {
            f.maps.channels = 32;
            f.maps.stride = 4;
            f.maps.min_at = Some(2);
            f.row_bytes = 128 + 16;
            f.codes = CodeLayout::Packed { at: 16, bits: 4 };
        };
        assert!(with(&many_maps), "4 scales and 4 minimums fit a record");
        assert!(
            !with(&|f| {
                many_maps(f);
                f.width = 256;
                f.row_bytes = 32 + 128;
                f.codes = CodeLayout::Packed { at: 32, bits: 4 };
            }),
            "16 map words do not"
        );
        // Words past a row's first 128 bytes are gathered (q5_0 at head_dim 256).
        assert!(
            with(&|f| {
                f.maps.scale_at = 130;
                f.row_bytes = 200;
            }),
            "a scale past the first 128 bytes"
        );
    }

    /// Each stream's positions, and the query's bytes, are permutations of the channels that
    /// keep every group of 32 together.
    #[test]
    fn streams_and_queries_permute_channels_within_groups() {
        for (name, _, format, ..) in level_codecs(1) {
            let orders: [(&str, &dyn Fn(usize) -> usize); 2] = [
                ("stream", &|i| format.stream_channel(i)),
                ("query", &|i| format.query_channel(i)),
            ];
            for (order, channel) in orders {
                let mut seen = vec![false; format.width];
                for i in 0..format.width {
                    let c = channel(i);
                    assert_eq!(c / GROUP, i / GROUP, "{name} {order}: position {i}");
                    assert!(
                        !std::mem::replace(&mut seen[c], true),
                        "{name} {order}: channel {c} twice"
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
        let codec = build_codec(SchemeKind::Q4_0, Role::Key, 128, &Calibration::default(), 0);
        let format = codec.unwrap().level_format().unwrap();
        let mut slots = vec![0f32; query_slots(128)];
        quantize_query(&format, &q, &mut slots);
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
            for (i, &c) in codes[32 * g..32 * (g + 1)].iter().enumerate() {
                let x = q[format.query_channel(32 * g + i)];
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
        for (kernels, isa) in integer_kernel_limits() {
            with_isa_limit(isa, || integer_scores_match(kernels));
        }
    }

    fn integer_scores_match(kernels: &str) {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let rows = 75; // two whole tiles and a partial one, a partial 16-row block
        let mut checked = 0;
        for (name, codec, format, bytes, _) in level_codecs(rows) {
            let avx2 = avx2::takes(&format);
            if !available() && !avx2 {
                continue;
            }
            checked += 1;
            let name = format!("{kernels}: {name}");
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
                let score = if avx2 { avx2::score_group } else { score_group };
                score(
                    &format,
                    &refs,
                    &bytes,
                    &mut outs,
                    &mut Ahead::new(&bytes, rows),
                );
                for h in 0..heads {
                    let q = &prepared[h][..w];
                    let slots = &prepared[h][prepared[h].len() - query_slots(w)..];
                    let mut codes = vec![0i8; w];
                    let stream = slots[..w / 4]
                        .iter()
                        .flat_map(|s| s.to_bits().to_le_bytes());
                    for (i, b) in stream.enumerate() {
                        codes[format.query_channel(i)] = b as i8;
                    }
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
        assert!(checked > 0, "{kernels}: no format checked");
    }

    /// Sums: equal to the integer algorithm written plainly, and within
    /// `step/2·Σ_t |level_t − center|` per tile of the exact sum.
    #[test]
    fn integer_sums_match_the_plain_algorithm_and_the_rounding_bound() {
        for (kernels, isa) in integer_kernel_limits() {
            with_isa_limit(isa, || integer_sums_match(kernels));
        }
    }

    fn integer_sums_match(kernels: &str) {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let rows = 75;
        let mut checked = 0;
        for (name, codec, format, bytes, _) in level_codecs(rows) {
            let avx2 = avx2::takes(&format);
            if !available() && !avx2 {
                continue;
            }
            checked += 1;
            let name = format!("{kernels}: {name}");
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
                let accumulate = if avx2 {
                    avx2::accumulate_group
                } else {
                    accumulate_group
                };
                accumulate(
                    &format,
                    &refs,
                    &bytes,
                    &mut outs,
                    &mut Ahead::new(&bytes, rows),
                );
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
        assert!(checked > 0, "{kernels}: no format checked");
    }
}
