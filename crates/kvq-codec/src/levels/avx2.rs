//! The integer group kernels for CPUs with AVX2 but without the AVX-512 kernels' instructions
//! (AVX2-only x86, AVX-512 without VNNI/VBMI), for every level format the AVX-512 kernels take
//! in the row layout, and runs of them ([`score_segments`]). Two paths:
//!
//! * **Nibbles** (4-bit codes without a table: `q4_0`, `q4_1`, `int4-g*`): `vpmaddubsw`
//!   multiplies 32 u8 codes by i8 values into 16-bit pair sums.
//! * **Levels** (1- to 3-bit codes, 4-bit codes through a table and 5-bit codes: `int3-g*`,
//!   `int2-g*`, `iq4_nl`, `turbo2`–`turbo4`, `q5_0`, `q5_1`, TurboQuant's runs): each row's
//!   codes are decoded to 16-bit levels less the format's center (bit windows by `vpshufb`,
//!   shifted by a `vpmullw`; a table looked up by `vpshufb`; fifth bits spread by `vpshufb` and
//!   compared), and `vpmaddwd` multiplies 16 of them at a time. A table's levels reach 255,
//!   where `vpmaddubsw`'s 16-bit pair sums would saturate.
//!
//! They compute what the AVX-512 kernels compute, with the same roundings (the parent module's
//! doc states them and their bounds): the prepared query's i8 copy ([`super::quantize_query`]),
//! and per tile of [`TILE_ROWS`] rows, head and map the weights times the rows' scales rounded to
//! i8 against their largest magnitude; the integer sums are exact.
//!
//! * Scores, a row at a time: a pair of groups at a time, one group per 128-bit lane, four
//!   heads' sums reduced together by `vphaddd` into one lane per head and group. The nibbles of
//!   a pair's 32 bytes meet query bytes put in their order once per call.
//! * Sums, a group (nibbles) or 16 channels (levels) at a time: two rows interleaved, so that
//!   one multiply-add with the two rows' weights adds each channel's pair of products in one
//!   lane; 8 row pairs of nibbles fit 16 bits (`8·2·15·127 < 2¹⁵`) before the lanes widen to
//!   32 bits, levels sum in 32 bits from the start.
//!
//! [`blocks`] holds the same kernels for the cache's interleaved blocks of 2- to 4-bit codes
//! (16 rows a block, each kernel's vectors as it loads them), with these roundings.

use super::{
    ChannelBlocks, CodeLayout, LevelFormat, LevelSegment, GROUP, MAP_WORDS, QUERY_MAP, TILE_ROWS,
};
use crate::simd::Ahead;
use std::cell::RefCell;

pub mod blocks;

/// Query heads per pass over a tile.
const HEADS: usize = 4;

/// Whether these kernels run on this thread: the CPU has AVX2/FMA/F16C (within the ISA limit,
/// [`crate::simd::use_avx2`]), the AVX-512 kernels do not run, and the integer kernels are
/// enabled ([`super::set_enabled`]).
pub fn available() -> bool {
    super::ENABLED.load(std::sync::atomic::Ordering::Relaxed)
        && crate::simd::use_avx2()
        && !super::available()
}

/// Whether these kernels take `format` on this thread: [`available`], and a format the AVX-512
/// kernels support whose center is a whole level (128 for a table) and, for 1- to 3-bit codes,
/// whose rows hold at least 16 bytes.
pub fn takes(format: &LevelFormat) -> bool {
    available() && format.supported() && path(format).is_some()
}

/// How the kernels read a format's codes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// 4-bit codes without a table: `vpmaddubsw` on the nibbles.
    Nibbles,
    /// Other codes: decoded to 16-bit levels less the center, `vpmaddwd`.
    Levels,
}

/// The path for `format`, if either takes it.
fn path(format: &LevelFormat) -> Option<Path> {
    let center = format.center();
    let whole_center = center.fract() == 0.0 && (0.0..=255.0).contains(&center);
    let table_fits = format
        .table
        .is_none_or(|_| center == 128.0 && format.maps.min_at.is_none());
    match (format.codes, format.table) {
        (CodeLayout::Nibbles { high_at: None, .. }, None)
        | (CodeLayout::Packed { bits: 4, .. }, None) => Some(Path::Nibbles),
        (CodeLayout::Packed { bits, .. }, _) if bits < 4 && format.row_bytes < 16 => None,
        _ => (whole_center && table_fits).then_some(Path::Levels),
    }
}

/// Where a format keeps what the kernels read, worked out once per thread and format.
///
/// Both paths keep their integer sums in channel order; the levels path decodes a pair of
/// groups `p` to four vectors whose vector `j`, lane `8h + l` holds channel `64p + 32h + 8j + l`.
struct Plan {
    format: LevelFormat,
    path: Path,
    /// Per group, the byte offset within a row of the 16 bytes the kernels load: its 16 code
    /// bytes (4-bit codes), or 16 bytes that hold its codes (narrower ones).
    groups_at: Vec<usize>,
    /// Byte offset within a row of each map word.
    words_at: Vec<usize>,
    /// Where all map words lie within 16 bytes of a row: the offset of those bytes, and the
    /// `vpshufb` indices that put the words in order (the rest zero).
    words_window: Option<(usize, [u8; 16])>,
    /// 5-bit codes: per group, the byte offset within a row of its fifth bits.
    fifths_at: Vec<usize>,
    /// Levels from 1- to 3-bit codes: per pair of groups and vector, the `vpshufb` indices that
    /// put each lane's two bytes (the second `0x80` where the code lies in the first) in place.
    windows: Vec<[u8; 32]>,
}

impl Plan {
    fn new(format: &LevelFormat) -> Self {
        let path = path(format).expect("a format the kernels take");
        let groups = format.width / GROUP;
        let bits = format.code_bits() as usize;
        // Where each group's codes (5-bit codes: their nibbles) begin, and the 16 bytes loaded
        // for them.
        let code_at = |g: usize| format.stream_byte(GROUP * bits.min(4) / 8 * g);
        let load_at = |g: usize| {
            if bits >= 4 {
                code_at(g)
            } else {
                code_at(g).min(format.row_bytes - 16)
            }
        };
        let mut windows = Vec::new();
        if path == Path::Levels && bits < 4 {
            for p in 0..groups / 2 {
                for j in 0..4 {
                    let mut window = [0u8; 32];
                    for lane in 0..16 {
                        let (g, at) = (2 * p + lane / 8, 8 * j + lane % 8);
                        let bit = bits * at;
                        let byte = code_at(g) - load_at(g) + bit / 8;
                        window[2 * lane] = byte as u8;
                        window[2 * lane + 1] = if bit % 8 + bits > 8 {
                            byte as u8 + 1
                        } else {
                            0x80
                        };
                    }
                    windows.push(window);
                }
            }
        }
        let words_at: Vec<usize> = (0..format.map_words())
            .map(|k| format.map_word_at(k))
            .collect();
        let first_word = words_at.iter().copied().min().unwrap_or(0);
        let words_window = (format.row_bytes >= 16)
            .then(|| first_word.min(format.row_bytes - 16))
            .filter(|&from| words_at.iter().all(|&at| at + 2 <= from + 16))
            .map(|from| {
                let mut indices = [0x80u8; 16];
                for (k, &at) in words_at.iter().enumerate() {
                    indices[2 * k] = (at - from) as u8;
                    indices[2 * k + 1] = (at - from + 1) as u8;
                }
                (from, indices)
            });
        let fifths_at = match format.codes {
            CodeLayout::Nibbles {
                block_bytes,
                high_at: Some(high_at),
                ..
            } => (0..groups).map(|g| block_bytes * g + high_at).collect(),
            _ => Vec::new(),
        };
        Self {
            format: *format,
            path,
            fifths_at,
            groups_at: (0..groups).map(load_at).collect(),
            words_at,
            words_window,
            windows,
        }
    }
}

/// A thread's scratch: its plans (up to [`super::PER_FORMAT`]), a tile's maps, the sums
/// kernel's integer sums and the score kernel's queries.
#[derive(Default)]
struct Scratch {
    plans: Vec<Plan>,
    /// Map word `k` of row `r` (f16 scales, then minimums) at `r·MAP_WORDS + k`.
    words: Vec<u16>,
    /// The same as f32; 0 for rows past the tile's end.
    maps: Vec<f32>,
    /// The sums kernel's integer sums, `width` slots per head, and its decoded levels.
    #[cfg(target_arch = "x86_64")]
    sums: kernels::Sums,
    /// The score kernel's queries, [`HEADS`] per entry.
    #[cfg(target_arch = "x86_64")]
    queries: Vec<kernels::Queries>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A tile of rows as the kernels take it.
#[cfg(target_arch = "x86_64")]
struct Tile<'a> {
    /// Index of the first row in the call.
    first: usize,
    rows: &'a [u8],
    /// Map word `k` of row `r` as f32 at `r·MAP_WORDS + k`.
    maps: &'a [f32],
}

/// Calls `setup(plan, queries)` once for the thread's plan of `format` and its query scratch,
/// then `tile(state, plan, queries, sums, tile, ahead)` for consecutive tiles of `blocks` after
/// decoding their maps (`state` what `setup` returned, `sums` the thread's integer sums); the
/// kernels spread the tile's prefetches over its rows.
#[cfg(target_arch = "x86_64")]
fn for_each_tile<S>(
    format: &LevelFormat,
    blocks: &[u8],
    ahead: &mut Ahead,
    setup: impl FnOnce(&Plan, &mut Vec<kernels::Queries>) -> S,
    mut tile: impl FnMut(&mut S, &Plan, &[kernels::Queries], &mut kernels::Sums, Tile, &mut Ahead),
) {
    assert!(takes(format) && blocks.len().is_multiple_of(format.row_bytes));
    SCRATCH.with(|scratch| {
        let Scratch {
            plans,
            words,
            maps,
            sums,
            queries,
        } = &mut *scratch.borrow_mut();
        let at = super::cached(plans, |p| p.format == *format, || Plan::new(format));
        let plan = &plans[at];
        words.resize(TILE_ROWS * MAP_WORDS, 0);
        maps.resize(TILE_ROWS * MAP_WORDS, 0.0);
        sums.fit(format.width);
        // Table levels in units of the table: the scales carry the unit.
        let unit = format.table.map_or(1.0, |t| t.unit);
        let mut state = setup(plan, queries);
        for (i, rows) in blocks.chunks(TILE_ROWS * format.row_bytes).enumerate() {
            let n = rows.len() / format.row_bytes;
            if let Some((from, indices)) = &plan.words_window {
                // SAFETY: `takes` checked the CPU; each row holds its 16 bytes from `from`.
                unsafe { kernels::window_maps(rows, format, *from, indices, maps, unit) };
            } else {
                for (row, words) in rows
                    .chunks_exact(format.row_bytes)
                    .zip(words.chunks_exact_mut(MAP_WORDS))
                {
                    for (w, &at) in words.iter_mut().zip(&plan.words_at) {
                        *w = u16::from_le_bytes([row[at], row[at + 1]]);
                    }
                }
                words[n * MAP_WORDS..].fill(0);
                // SAFETY: `takes` checked the CPU; both hold whole tiles.
                unsafe { kernels::decode_maps(words, maps, format.maps(), unit) };
            }
            let first = i * TILE_ROWS;
            tile(
                &mut state,
                plan,
                queries,
                sums,
                Tile { first, rows, maps },
                ahead,
            );
        }
    });
}

/// [`crate::Codec::score_group`] with these kernels: `queries[h]` are prepared queries whose
/// last [`super::query_slots`] values came from [`super::quantize_query`]. Prefetches `ahead`
/// as it goes.
pub fn score_group(
    format: &LevelFormat,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let slots = super::query_slots(format.width);
    score_run(format, slots, false, queries, blocks, scores, ahead);
}

/// Whether these kernels take every run of `segments` ([`takes`]).
pub fn takes_segments(segments: &[LevelSegment]) -> bool {
    !segments.is_empty() && segments.iter().all(|s| takes(&s.format))
}

/// [`super::score_segments`] with these kernels: each run scored against its slots of the
/// prepared queries, the first stored, the others added.
pub fn score_segments(
    segments: &[LevelSegment],
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let slots = super::run_slots(segments.iter().map(|s| s.format.width));
    for (k, (s, slots)) in segments.iter().zip(slots).enumerate() {
        score_run(&s.format, slots, k > 0, queries, blocks, scores, ahead);
    }
}

/// Scores of one run of levels whose query slots begin `slots` values before each prepared
/// query's end, stored or (`add`) added.
fn score_run(
    format: &LevelFormat,
    slots: usize,
    add: bool,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let rows = blocks.len() / format.row_bytes;
    assert!(queries.len() == scores.len() && scores.iter().all(|s| s.len() >= rows));
    assert!(queries.iter().all(|q| q.len() >= format.width / 4 + slots));
    assert!(slots >= super::query_slots(format.width));
    #[cfg(target_arch = "x86_64")]
    for_each_tile(
        format,
        blocks,
        ahead,
        |plan, prepared| {
            prepared.clear();
            // SAFETY: `takes` (asserted by `for_each_tile`) checked the CPU; the queries hold
            // their slots.
            prepared.extend(
                queries
                    .chunks(HEADS)
                    .map(|chunk| unsafe { kernels::Queries::new(plan, chunk, slots) }),
            );
            // Where the scores of absent heads go.
            [0f32; TILE_ROWS]
        },
        |sink, plan, prepared, _, tile, ahead| {
            let n = tile.rows.len() / format.row_bytes;
            for (c, q) in prepared.iter().enumerate() {
                let mut out = [sink.as_mut_ptr(); HEADS];
                for (o, s) in out.iter_mut().zip(&mut scores[c * HEADS..]) {
                    *o = s[tile.first..tile.first + n].as_mut_ptr();
                }
                let ahead = if c == 0 {
                    &mut *ahead
                } else {
                    &mut Ahead::none()
                };
                // SAFETY: as above; every row holds its codes (`supported`), and each of `out`
                // takes `n` values.
                unsafe { kernels::score_rows(plan, q, &tile, out, add, false, ahead) };
            }
        },
    );
}

/// [`crate::Codec::accumulate_group`] with these kernels; prefetches `ahead` as it goes.
pub fn accumulate_group(
    format: &LevelFormat,
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    accumulate_run(format, 0, weights, blocks, accs, ahead);
}

/// [`super::accumulate_segments`] with these kernels: each run adds into its channels.
pub fn accumulate_segments(
    segments: &[LevelSegment],
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    for s in segments {
        accumulate_run(&s.format, s.first, weights, blocks, accs, ahead);
    }
}

/// Sums of one run of levels added into channels `first…` of `accs`.
fn accumulate_run(
    format: &LevelFormat,
    first: usize,
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let rows = blocks.len() / format.row_bytes;
    assert!(weights.len() == accs.len() && weights.iter().all(|w| w.len() >= rows));
    assert!(accs.iter().all(|a| a.len() >= first + format.width));
    #[cfg(target_arch = "x86_64")]
    for_each_tile(
        format,
        blocks,
        ahead,
        |_, _| (),
        |_, plan, _, sums, tile, ahead| {
            let n = tile.rows.len() / format.row_bytes;
            for (c, (w, a)) in weights
                .chunks(HEADS)
                .zip(accs.chunks_mut(HEADS))
                .enumerate()
            {
                let w: [&[f32]; HEADS] = std::array::from_fn(|h| {
                    w.get(h).map_or(&[][..], |w| &w[tile.first..tile.first + n])
                });
                let ahead = if c == 0 {
                    &mut *ahead
                } else {
                    &mut Ahead::none()
                };
                let w = &w[..a.len()];
                // SAFETY: `takes` (asserted by `for_each_tile`) checked the CPU; every row
                // holds its codes (`supported`).
                unsafe { kernels::accumulate_rows(plan, w, &tile, sums, a, first, ahead) };
            }
        },
    );
}

/// Whether these kernels take KIVI's key blocks `layout` ([`super::ChannelBlocks`]): rows one
/// after another whose format they take.
pub fn takes_channel_blocks(layout: &ChannelBlocks) -> bool {
    !layout.interleaved && layout.supported() && takes(&layout.rows())
}

/// [`super::score_channel_blocks`] with these kernels: per block and four heads, the queries
/// times the block's channel scales rounded to i8 per group (as the AVX-512 kernels round
/// them), the rows scored under unit maps, and each head's bias `Σ_c q_c·(minimum_c +
/// scale_c·center)` added.
pub fn score_channel_blocks(
    layout: &ChannelBlocks,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    assert!(takes_channel_blocks(layout));
    let (format, header) = (layout.rows(), layout.header_bytes());
    assert!(queries.iter().all(|q| q.len() >= format.width));
    assert!(scores
        .iter()
        .all(|s| s.len() * layout.block_bytes() >= blocks.len() * layout.tokens));
    #[cfg(target_arch = "x86_64")]
    SCRATCH.with(|scratch| {
        let Scratch {
            plans,
            queries: prepared,
            ..
        } = &mut *scratch.borrow_mut();
        let at = super::cached(plans, |p| p.format == format, || Plan::new(&format));
        let plan = &plans[at];
        prepared.clear();
        prepared.resize(queries.len().div_ceil(HEADS), kernels::Queries::zero());
        // Every row's map: scale 1, no minimum (the block's maps are in the queries).
        let maps: [f32; TILE_ROWS * MAP_WORDS] =
            std::array::from_fn(|i| if i % MAP_WORDS == 0 { 1.0 } else { 0.0 });
        let mut sink = [0f32; TILE_ROWS];
        for (b, block) in blocks.chunks_exact(layout.block_bytes()).enumerate() {
            let (block_maps, rows) = block.split_at(header);
            ahead.rows(layout.tokens);
            for ((c, chunk), q) in queries.chunks(HEADS).enumerate().zip(prepared.iter_mut()) {
                // SAFETY: `takes` checked the CPU; the maps hold `width` pairs, each query
                // `width` values.
                let biases = unsafe { q.fill_block(plan, chunk, block_maps) };
                for (i, rows) in rows.chunks(TILE_ROWS * format.row_bytes).enumerate() {
                    let first = b * layout.tokens + i * TILE_ROWS;
                    let n = rows.len() / format.row_bytes;
                    let mut out = [sink.as_mut_ptr(); HEADS];
                    for (o, s) in out.iter_mut().zip(&mut scores[c * HEADS..]) {
                        *o = s[first..first + n].as_mut_ptr();
                    }
                    let tile = Tile {
                        first,
                        rows,
                        maps: &maps,
                    };
                    // SAFETY: as above; each of `out` takes `n` values.
                    let none = &mut Ahead::none();
                    unsafe { kernels::score_rows(plan, q, &tile, out, false, true, none) };
                    for (s, bias) in scores[c * HEADS..].iter_mut().zip(biases) {
                        s[first..first + n].iter_mut().for_each(|x| *x += bias);
                    }
                }
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use super::{Ahead, Path, Plan, Tile, GROUP, HEADS, QUERY_MAP, TILE_ROWS};
    use crate::levels::{CodeLayout, LevelFormat, MAP_WORDS};
    use std::arch::x86_64::*;

    /// Pairs of groups of 32 channels at most ([`crate::levels::LevelFormat::supported`]: 512
    /// channels).
    const MAX_PAIRS: usize = 8;

    /// Up to four heads' queries in the score kernel's order, and their per-group terms.
    #[derive(Clone, Copy)]
    pub struct Queries {
        /// Per pair of groups and head: for nibbles, the i8 query bytes that the low (`[0]`)
        /// and high (`[1]`) nibbles of the pair's 32 code bytes meet; for levels, the i16
        /// query values of each decoded vector's lanes. A group per 128-bit lane.
        codes: [[[__m256i; 4]; HEADS]; MAX_PAIRS],
        /// Per pair of groups, `σ` of each head (lanes 0–3 the first group, 4–7 the second),
        /// `center·σ·Σ codes` (0 for levels, which are centered), and the exact `Σ q`.
        terms: [[__m256; 3]; MAX_PAIRS],
        /// The same per head over all groups, for rows with one map (whose queries have one
        /// `σ`).
        totals: [__m128; 3],
    }

    impl Queries {
        /// Reads up to [`HEADS`] prepared queries whose slots begin `slots` values before their
        /// end; missing heads are zero.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn new(plan: &Plan, queries: &[&[f32]], slots: usize) -> Self {
            let format = &plan.format;
            let w = format.width;
            let center = match plan.path {
                Path::Nibbles => format.center(),
                Path::Levels => 0.0,
            };
            let mut codes = [[[[0u8; 32]; 4]; HEADS]; MAX_PAIRS];
            let mut terms = [[[0f32; 8]; 3]; MAX_PAIRS];
            let mut totals = [[0f32; HEADS]; 3];
            let mut by_channel = [0i8; MAX_PAIRS * 2 * GROUP];
            for (h, query) in queries.iter().enumerate() {
                let s = &query[query.len() - slots..];
                let bytes = std::slice::from_raw_parts(s.as_ptr() as *const u8, w);
                for (i, &b) in bytes.iter().enumerate() {
                    by_channel[format.query_channel(i)] = b as i8;
                }
                for (p, (codes, terms)) in codes.iter_mut().zip(&mut terms).enumerate() {
                    if p == w / (2 * GROUP) {
                        break;
                    }
                    match plan.path {
                        // The query's order within a group (`quantize_query`): per 32-bit word
                        // `k`, the low nibbles of code bytes `4·(k/2)…` for even `k`, their
                        // high nibbles for odd `k`.
                        Path::Nibbles => {
                            let [low, high, ..] = &mut codes[h];
                            for (i, (low, high)) in low.iter_mut().zip(high).enumerate() {
                                let (group, b) = (i / 16, i % 16);
                                let j = 2 * GROUP * p + GROUP * group + 8 * (b / 4) + b % 4;
                                (*low, *high) = (bytes[j], bytes[j + 4]);
                            }
                        }
                        Path::Levels => {
                            for (j, vector) in codes[h].iter_mut().enumerate() {
                                for (lane, pair) in vector.chunks_exact_mut(2).enumerate() {
                                    let c = 2 * GROUP * p + GROUP * (lane / 8) + 8 * j + lane % 8;
                                    pair.copy_from_slice(&i16::from(by_channel[c]).to_le_bytes());
                                }
                            }
                        }
                    }
                    for k in 0..2 {
                        let map = &s[w / 4 + QUERY_MAP * (2 * p + k)..];
                        let group = [map[0], center * map[1], map[2]];
                        for (i, x) in group.into_iter().enumerate() {
                            terms[i][4 * k + h] = x;
                            totals[i][h] += x;
                        }
                    }
                }
                // One-map rows' queries have one σ for all groups: not a sum.
                totals[0][h] = s[w / 4];
            }
            Self {
                codes: codes
                    .map(|c| c.map(|c| c.map(|b| _mm256_loadu_si256(b.as_ptr() as *const _)))),
                terms: terms.map(|t| t.map(|x| _mm256_loadu_ps(x.as_ptr()))),
                totals: totals.map(|x| _mm_loadu_ps(x.as_ptr())),
            }
        }
    }

    impl Queries {
        /// Queries of no head.
        pub fn zero() -> Self {
            // SAFETY: all-zero bits are a valid value of every field.
            unsafe { std::mem::zeroed() }
        }

        /// Makes these the queries of up to [`HEADS`] heads for one block of KIVI's keys
        /// (`maps` its channels' `(scale, minimum)` f16 pairs): `q'_c = q_c·scale_c` rounded to
        /// i8 per group (to nearest, ties to even, against `σ_g` = the group's largest
        /// magnitude / 127); returns each head's `Σ_c q_c·(minimum_c + scale_c·center)`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn fill_block(
            &mut self,
            plan: &Plan,
            queries: &[&[f32]],
            maps: &[u8],
        ) -> [f32; HEADS] {
            let format = &plan.format;
            let (w, center) = (format.width, format.center());
            let nibbles = plan.path == Path::Nibbles;
            let mut biases = [0f32; HEADS];
            // Even channels' bytes, then odd ones', in each 128-bit lane.
            let even_odd = _mm256_setr_epi8(
                0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1,
                3, 5, 7, 9, 11, 13, 15,
            );
            let row_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let mut bias = [_mm256_setzero_ps(); HEADS];
            for g in 0..w / GROUP {
                let (p, half) = (g / 2, g % 2);
                let maps = channel_maps(maps, g);
                let (sigmas, codes, sums) = scaled_groups(queries, g, &maps, center, &mut bias);
                for h in 0..queries.len() {
                    let (sigma, c) = (sigmas[h], codes[h]);
                    let lane = |v: &mut __m256, x: f32| {
                        let mut lanes: [f32; 8] = std::mem::transmute(*v);
                        lanes[4 * half + h] = x;
                        *v = std::mem::transmute::<[f32; 8], __m256>(lanes);
                    };
                    lane(&mut self.terms[p][0], sigma);
                    let codes = &mut self.codes[p][h];
                    if nibbles {
                        let centered = center * sigma * sums[h] as f32;
                        lane(&mut self.terms[p][1], centered);
                        // |code| ≤ 127: the packs do not saturate. In channel order, then the
                        // even channels (the low nibbles' query) and the odd ones.
                        let packed = _mm256_packs_epi16(
                            _mm256_packs_epi32(c[0], c[1]),
                            _mm256_packs_epi32(c[2], c[3]),
                        );
                        let ordered = _mm256_permutevar8x32_epi32(packed, row_order);
                        let split = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(
                            ordered, even_odd,
                        ));
                        // The pair's low nibbles' query (`[0]`): the first group's in the low
                        // lanes, its second's in the high; the high nibbles' likewise.
                        if half == 0 {
                            codes[0] = split;
                            codes[1] = split;
                        } else {
                            codes[0] = _mm256_permute2x128_si256::<0x20>(codes[0], split);
                            codes[1] = _mm256_permute2x128_si256::<0x31>(codes[1], split);
                        }
                    } else {
                        // Vector `j`: channels `8j…8j + 7` of the pair's first group, then of
                        // its second, as i16 (the first group's held as i32 until then).
                        for (j, cj) in c.into_iter().enumerate() {
                            codes[j] = if half == 0 {
                                cj
                            } else {
                                let packed = _mm256_packs_epi32(codes[j], cj);
                                _mm256_permute4x64_epi64::<0b11_01_10_00>(packed)
                            };
                        }
                    }
                }
            }
            for (b, v) in biases.iter_mut().zip(bias) {
                *b = crate::simd::avx2::hsum(v);
            }
            biases
        }
    }

    /// Group `g`'s scales and minimums of KIVI's block `maps` (per channel an f16 scale and
    /// minimum), 8 channels per vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn channel_maps(maps: &[u8], g: usize) -> [[__m256; 4]; 2] {
        let mut out = [[_mm256_setzero_ps(); 4]; 2];
        for k in 0..4 {
            let at = maps[4 * (GROUP * g + 8 * k)..][..32].as_ptr();
            let pairs = _mm256_loadu_si256(at as *const _);
            let halves = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(
                _mm256_and_si256(pairs, _mm256_set1_epi32(0xffff)),
                _mm256_srli_epi32::<16>(pairs),
            ));
            out[0][k] = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
            out[1][k] = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(halves));
        }
        out
    }

    /// Group `g` of up to four heads' `queries` times the block's scales ([`channel_maps`]),
    /// each rounded to i8 (to nearest, ties to even, as AVX-512's `channel_queries`) against
    /// its `σ` = its largest magnitude / 127: returns each head's `σ`, codes (8 channels per
    /// vector) and their sum; adds `q·(minimum + scale·center)` to each head's `bias`. The
    /// heads' reductions share their shuffles.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scaled_groups(
        queries: &[&[f32]],
        g: usize,
        [scales, mins]: &[[__m256; 4]; 2],
        center: f32,
        bias: &mut [__m256; HEADS],
    ) -> ([f32; HEADS], [[__m256i; 4]; HEADS], [i32; HEADS]) {
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        let mut x = [[_mm256_setzero_ps(); 4]; HEADS];
        for ((x, bias), query) in x.iter_mut().zip(bias.iter_mut()).zip(queries) {
            for (k, x) in x.iter_mut().enumerate() {
                let v = _mm256_loadu_ps(query[GROUP * g + 8 * k..][..8].as_ptr());
                *x = _mm256_mul_ps(v, scales[k]);
                *bias = _mm256_fmadd_ps(v, mins[k], *bias);
                *bias = _mm256_fmadd_ps(*x, _mm256_set1_ps(center), *bias);
            }
        }
        let mut largest = [_mm256_setzero_ps(); HEADS];
        for (l, x) in largest.iter_mut().zip(&x) {
            for &v in x {
                *l = _mm256_max_ps(*l, _mm256_and_ps(v, abs));
            }
        }
        // Each head's largest in lane `h`: halves, then pairs, then neighbours.
        let halves = |u: __m256, v: __m256| {
            _mm256_max_ps(
                _mm256_permute2f128_ps::<0x20>(u, v),
                _mm256_permute2f128_ps::<0x31>(u, v),
            )
        };
        let (a, b) = (
            halves(largest[0], largest[2]),
            halves(largest[1], largest[3]),
        );
        let c = _mm256_max_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
        let d = _mm256_max_ps(c, _mm256_permute_ps::<0b01_00_11_10>(c));
        let largest = _mm_movelh_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps::<1>(d));
        let sigma = _mm_div_ps(largest, _mm_set1_ps(127.0));
        let inv = _mm_and_ps(
            _mm_div_ps(_mm_set1_ps(1.0), sigma),
            _mm_cmpgt_ps(sigma, _mm_setzero_ps()),
        );
        let inv: [f32; HEADS] = std::mem::transmute(inv);
        let mut codes = [[_mm256_setzero_si256(); 4]; HEADS];
        let mut totals = [_mm256_setzero_si256(); HEADS];
        for h in 0..HEADS {
            let scale = _mm256_set1_ps(inv[h]);
            for k in 0..4 {
                codes[h][k] = _mm256_cvtps_epi32(_mm256_mul_ps(x[h][k], scale));
                totals[h] = _mm256_add_epi32(totals[h], codes[h][k]);
            }
        }
        let sums = per_head(totals);
        let sums = _mm_add_epi32(
            _mm256_castsi256_si128(sums),
            _mm256_extracti128_si256::<1>(sums),
        );
        let sigma = std::mem::transmute::<__m128, [f32; HEADS]>(sigma);
        (
            sigma,
            codes,
            std::mem::transmute::<__m128i, [i32; HEADS]>(sums),
        )
    }

    /// The sums kernel's scratch.
    #[derive(Default)]
    pub struct Sums {
        /// Integer sums, `width` slots per head.
        sums: Vec<i32>,
        /// A tile's rounded weights.
        rounded: Rounded,
        /// A tile's decoded levels, a row's vectors after another (and a row of zeros).
        levels: Vec<__m256i>,
    }

    impl Sums {
        /// Room for rows of `width` channels.
        pub fn fit(&mut self, width: usize) {
            self.sums.resize(HEADS * width, 0);
            self.levels.resize((TILE_ROWS + 1) * width / 16, unsafe {
                _mm256_setzero_si256()
            });
        }
    }

    /// Each row's map words as f32, its first `scales` words (the scales) times `unit`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_maps(words: &[u16], maps: &mut [f32], scales: usize, unit: f32) {
        const { assert!(MAP_WORDS == 8) };
        let units = scale_units(scales, unit);
        for (w, m) in words.chunks_exact(8).zip(maps.chunks_exact_mut(8)) {
            let halves = _mm_loadu_si128(w.as_ptr() as *const _);
            _mm256_storeu_ps(
                m.as_mut_ptr(),
                _mm256_mul_ps(_mm256_cvtph_ps(halves), units),
            );
        }
    }

    /// [`decode_maps`] straight from the rows, whose map words lie in the 16 bytes from
    /// `from` (`indices` put them in order); rows past the tile's end 0.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn window_maps(
        rows: &[u8],
        format: &LevelFormat,
        from: usize,
        indices: &[u8; 16],
        maps: &mut [f32],
        unit: f32,
    ) {
        const { assert!(MAP_WORDS == 8) };
        let n = rows.len() / format.row_bytes;
        let units = scale_units(format.maps(), unit);
        let indices = _mm_loadu_si128(indices.as_ptr() as *const _);
        for (t, m) in maps.chunks_exact_mut(MAP_WORDS).enumerate().take(n) {
            let bytes = _mm_loadu_si128(rows.as_ptr().add(t * format.row_bytes + from) as *const _);
            let halves = _mm_shuffle_epi8(bytes, indices);
            _mm256_storeu_ps(
                m.as_mut_ptr(),
                _mm256_mul_ps(_mm256_cvtph_ps(halves), units),
            );
        }
        maps[n * MAP_WORDS..].fill(0.0);
    }

    /// `unit` in the lanes of a row's first `scales` map words, 1 in the others.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scale_units(scales: usize, unit: f32) -> __m256 {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_blendv_ps(
            _mm256_set1_ps(1.0),
            _mm256_set1_ps(unit),
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(scales as i32), lanes)),
        )
    }

    /// The 16 bytes at `a` in the low lane and at `b` in the high one.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_pair(row: *const u8, a: usize, b: usize) -> __m256i {
        if b == a + 16 {
            _mm256_loadu_si256(row.add(a) as *const _)
        } else {
            _mm256_loadu2_m128i(row.add(b) as *const _, row.add(a) as *const _)
        }
    }

    /// The low (`[0]`) and high (`[1]`) nibbles of `v`'s bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn nibbles(v: __m256i) -> [__m256i; 2] {
        let mask = _mm256_set1_epi8(0x0f);
        [
            _mm256_and_si256(v, mask),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
        ]
    }

    /// Each row's 32 bytes of a pair of groups (a group per 128-bit lane), split into their
    /// low (`[0]`) and high (`[1]`) nibbles.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_codes(row: *const u8, groups_at: &[usize], p: usize) -> [__m256i; 2] {
        nibbles(load_pair(row, groups_at[2 * p], groups_at[2 * p + 1]))
    }

    /// How [`Decoder`] reads codes: 4-bit codes through a table in llama.cpp's blocks (the
    /// low nibbles channels 0–15, the high ones 16–31) or packed, and 1- to 3-bit codes without
    /// a table or through one.
    pub const BLOCK_TABLE: u8 = 1;
    /// See [`BLOCK_TABLE`].
    pub const PACKED_TABLE: u8 = 2;
    /// See [`BLOCK_TABLE`].
    pub const WINDOWS: u8 = 3;
    /// See [`BLOCK_TABLE`].
    pub const WINDOWS_TABLE: u8 = 4;
    /// 5-bit codes in llama.cpp's blocks: the nibbles as [`BLOCK_TABLE`]'s, bit `j` of the
    /// block's 32-bit word of fifth bits channel `j`'s.
    pub const BLOCK5: u8 = 5;
    /// 1-bit codes through a table (TurboQuant's QJL signs): each lane's byte tested for its
    /// bit, the level picked by a blend.
    pub const SIGNS: u8 = 6;

    /// The [`Decoder`] kind of a format on the levels path.
    pub fn decoder_kind(plan: &Plan) -> u8 {
        let format = &plan.format;
        match (format.code_bits(), format.table.is_some(), format.codes) {
            (5, _, _) => BLOCK5,
            (1, true, _) => SIGNS,
            (4, _, CodeLayout::Nibbles { .. }) => BLOCK_TABLE,
            (4, _, CodeLayout::Packed { .. }) => PACKED_TABLE,
            (_, false, _) => WINDOWS,
            (_, true, _) => WINDOWS_TABLE,
        }
    }

    /// What decodes a row's codes to 16-bit levels less the center.
    #[derive(Clone, Copy)]
    pub struct Decoder<'a> {
        groups_at: &'a [usize],
        fifths_at: &'a [usize],
        /// 1- to 3-bit codes: per pair and vector, the lanes' `vpshufb` windows.
        windows: &'a [[u8; 32]],
        /// Per lane, `2^(8 − shift)` (the code's bit within its window).
        shifts: __m256i,
        mask: __m256i,
        center: __m256i,
        /// The table: 4-bit codes' i8 levels less 128 in each lane; narrower codes' i16
        /// levels less 128, as byte pairs.
        table: __m256i,
        /// 1-bit codes: each lane's bit within its byte, and the levels of codes 0 and 1.
        bits: __m256i,
        signs: [__m256i; 2],
    }

    impl<'a> Decoder<'a> {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn new(plan: &'a Plan) -> Self {
            let format = &plan.format;
            let bits = format.code_bits();
            let shifts: [i16; 16] = std::array::from_fn(|l| 1 << (8 - bits as usize * (l % 8) % 8));
            let table: [u8; 16] = match format.table {
                Some(t) if bits == 4 => t.levels.map(|l| l as u8),
                Some(t) => {
                    std::array::from_fn(|i| i16::from(t.levels[i / 2 % 8]).to_le_bytes()[i % 2])
                }
                None => [0; 16],
            };
            let level = |code: usize| {
                _mm256_set1_epi16(format.table.map_or(0, |t| i16::from(t.levels[code])))
            };
            Self {
                bits: _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128),
                signs: [level(0), level(1)],
                groups_at: &plan.groups_at,
                fifths_at: &plan.fifths_at,
                windows: &plan.windows,
                shifts: _mm256_loadu_si256(shifts.as_ptr() as *const _),
                mask: _mm256_set1_epi16((1 << bits) - 1),
                center: _mm256_set1_epi16(format.center() as i16),
                table: _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const _)),
            }
        }

        /// A row's pair of groups `p` as four vectors of 16 levels (vector `j`, lane `8h + l`:
        /// channel `64p + 32h + 8j + l`), for codes of `KIND`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn pair<const KIND: u8>(&self, row: *const u8, p: usize) -> [__m256i; 4] {
            let v = load_pair(
                row,
                *self.groups_at.get_unchecked(2 * p),
                *self.groups_at.get_unchecked(2 * p + 1),
            );
            if KIND == BLOCK5 {
                // The nibbles (channels 0–15, 16–31 of each group), then each channel's fifth
                // bit: its byte of the group's word spread to the channel's lane, tested.
                let [low, high] = nibbles(v);
                let fifths = |g: usize| {
                    let at = *self.fifths_at.get_unchecked(g);
                    _mm_set1_epi32((row.add(at) as *const i32).read_unaligned())
                };
                let words = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(fifths(2 * p)),
                    fifths(2 * p + 1),
                );
                let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                let fifth = |bytes: __m256i| {
                    let spread = _mm256_shuffle_epi8(words, bytes);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
                    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                };
                let low = _mm256_or_si256(
                    low,
                    fifth(_mm256_setr_epi64x(
                        0,
                        0x0101_0101_0101_0101,
                        0,
                        0x0101_0101_0101_0101,
                    )),
                );
                let high = _mm256_or_si256(
                    high,
                    fifth(_mm256_setr_epi64x(
                        0x0202_0202_0202_0202,
                        0x0303_0303_0303_0303,
                        0x0202_0202_0202_0202,
                        0x0303_0303_0303_0303,
                    )),
                );
                let zero = _mm256_setzero_si256();
                return [
                    _mm256_unpacklo_epi8(low, zero),
                    _mm256_unpackhi_epi8(low, zero),
                    _mm256_unpacklo_epi8(high, zero),
                    _mm256_unpackhi_epi8(high, zero),
                ]
                .map(|x| _mm256_sub_epi16(x, self.center));
            }
            if KIND == BLOCK_TABLE || KIND == PACKED_TABLE {
                // Table levels, looked up by bytes and widened with their signs.
                let [low, high] = nibbles(v).map(|x| _mm256_shuffle_epi8(self.table, x));
                // Channels 0–15 and 16–31 of each group.
                let (first, second) = if KIND == PACKED_TABLE {
                    (
                        _mm256_unpacklo_epi8(low, high),
                        _mm256_unpackhi_epi8(low, high),
                    )
                } else {
                    (low, high)
                };
                let zero = _mm256_setzero_si256();
                let (first_signs, second_signs) = (
                    _mm256_cmpgt_epi8(zero, first),
                    _mm256_cmpgt_epi8(zero, second),
                );
                return [
                    _mm256_unpacklo_epi8(first, first_signs),
                    _mm256_unpackhi_epi8(first, first_signs),
                    _mm256_unpacklo_epi8(second, second_signs),
                    _mm256_unpackhi_epi8(second, second_signs),
                ];
            }
            let windows = self.windows.as_ptr().add(4 * p);
            std::array::from_fn(|j| {
                let window = _mm256_loadu_si256((*windows.add(j)).as_ptr() as *const _);
                let x = _mm256_shuffle_epi8(v, window);
                if KIND == SIGNS {
                    // Lane `l` holds byte `j` of its group, whose bit `l` is its code.
                    let set = _mm256_cmpeq_epi16(_mm256_and_si256(x, self.bits), self.bits);
                    return _mm256_blendv_epi8(self.signs[0], self.signs[1], set);
                }
                let code = _mm256_and_si256(
                    _mm256_srli_epi16::<8>(_mm256_mullo_epi16(x, self.shifts)),
                    self.mask,
                );
                if KIND == WINDOWS_TABLE {
                    // Byte pair `2·code, 2·code + 1` of the table.
                    _mm256_shuffle_epi8(
                        self.table,
                        _mm256_add_epi16(
                            _mm256_mullo_epi16(code, _mm256_set1_epi16(0x0202)),
                            _mm256_set1_epi16(0x0100),
                        ),
                    )
                } else {
                    _mm256_sub_epi16(code, self.center)
                }
            })
        }
    }

    /// Four heads' pair sums (16-bit) of a row's pair of groups: each lane adds 4 products.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_products(codes: [__m256i; 2], q: &[[__m256i; 4]; HEADS]) -> [__m256i; HEADS] {
        std::array::from_fn(|h| {
            _mm256_add_epi16(
                _mm256_maddubs_epi16(codes[0], q[h][0]),
                _mm256_maddubs_epi16(codes[1], q[h][1]),
            )
        })
    }

    /// Four heads' 16-bit lanes summed in pairs to 32 bits.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen(products: [__m256i; HEADS]) -> [__m256i; HEADS] {
        products.map(|x| _mm256_madd_epi16(x, _mm256_set1_epi16(1)))
    }

    /// Four heads' dots (32-bit) with a pair of groups' decoded levels, a group per 128-bit
    /// lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn level_dots(levels: [__m256i; 4], q: &[[__m256i; 4]; HEADS]) -> [__m256i; HEADS] {
        std::array::from_fn(|h| {
            _mm256_add_epi32(
                _mm256_add_epi32(
                    _mm256_madd_epi16(levels[0], q[h][0]),
                    _mm256_madd_epi16(levels[1], q[h][1]),
                ),
                _mm256_add_epi32(
                    _mm256_madd_epi16(levels[2], q[h][2]),
                    _mm256_madd_epi16(levels[3], q[h][3]),
                ),
            )
        })
    }

    /// Four heads' lanes summed per 128-bit half: lane `h` of each half holds head `h`'s sum
    /// over that half.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn per_head(d: [__m256i; HEADS]) -> __m256i {
        _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]))
    }

    /// Writes (or, `add`, adds) `scores[t]`'s lane `h` to `out[h][t]` for the first `n` rows,
    /// four rows at a time through a transpose.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_heads(scores: &[__m128], n: usize, out: &[*mut f32; HEADS], add: bool) {
        let whole = n / 4 * 4;
        for t in (0..whole).step_by(4) {
            let [mut a, mut b, mut c, mut d] =
                [scores[t], scores[t + 1], scores[t + 2], scores[t + 3]];
            _MM_TRANSPOSE4_PS(&mut a, &mut b, &mut c, &mut d);
            for (o, v) in out.iter().zip([a, b, c, d]) {
                let v = if add {
                    _mm_add_ps(_mm_loadu_ps(o.add(t)), v)
                } else {
                    v
                };
                _mm_storeu_ps(o.add(t), v);
            }
        }
        for (t, s) in scores.iter().enumerate().take(n).skip(whole) {
            let lanes: [f32; HEADS] = std::mem::transmute(*s);
            for (o, x) in out.iter().zip(lanes) {
                *o.add(t) = if add { *o.add(t) + x } else { x };
            }
        }
    }

    /// Scores of up to four heads for each of a tile's rows into `out[h][t]`, stored or
    /// (`add`) added; `per_group` where the queries' `σ` differ per group even for rows with
    /// one map.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn score_rows(
        plan: &Plan,
        q: &Queries,
        tile: &Tile,
        out: [*mut f32; HEADS],
        add: bool,
        per_group: bool,
        ahead: &mut Ahead,
    ) {
        let format = &plan.format;
        let one_map = format.maps.channels >= format.width && !per_group;
        macro_rules! by_pairs {
            ($kind:expr, $one:literal, $min:literal) => {
                match format.width / (2 * GROUP) {
                    1 => score_rows_as::<{ $kind }, $one, $min, 1>(plan, q, tile, out, add, ahead),
                    2 => score_rows_as::<{ $kind }, $one, $min, 2>(plan, q, tile, out, add, ahead),
                    4 => score_rows_as::<{ $kind }, $one, $min, 4>(plan, q, tile, out, add, ahead),
                    _ => score_rows_as::<{ $kind }, $one, $min, 0>(plan, q, tile, out, add, ahead),
                }
            };
        }
        macro_rules! by_maps {
            ($kind:expr) => {
                match (one_map, format.maps.min_at.is_some()) {
                    (true, true) => by_pairs!($kind, true, true),
                    (true, false) => by_pairs!($kind, true, false),
                    (false, true) => by_pairs!($kind, false, true),
                    (false, false) => by_pairs!($kind, false, false),
                }
            };
        }
        match (plan.path, decoder_kind(plan)) {
            (Path::Nibbles, _) => by_maps!(NIBBLES),
            (Path::Levels, BLOCK5) => by_maps!(BLOCK5),
            (Path::Levels, SIGNS) => by_maps!(SIGNS),
            (Path::Levels, BLOCK_TABLE) => by_maps!(BLOCK_TABLE),
            (Path::Levels, PACKED_TABLE) => by_maps!(PACKED_TABLE),
            (Path::Levels, WINDOWS) => by_maps!(WINDOWS),
            (Path::Levels, _) => by_maps!(WINDOWS_TABLE),
        }
    }

    /// The score kernel's codes: 4-bit without a table (else a [`Decoder`] kind).
    const NIBBLES: u8 = 0;

    /// Pairs of groups whose 16-bit nibble sums add up without overflow: each lane of a
    /// pair's sums is at most `4·15·127`.
    const PAIRS_PER_SUM: usize = 4;

    /// [`score_rows`] for nibbles or a [`Decoder`] kind of levels (`KIND`), rows with one map
    /// or several (`ONE_MAP`), with minimums or without, and `PAIRS` pairs of groups (0: as
    /// many as the format has, not known when compiled).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn score_rows_as<
        const KIND: u8,
        const ONE_MAP: bool,
        const MIN: bool,
        const PAIRS: usize,
    >(
        plan: &Plan,
        q: &Queries,
        tile: &Tile,
        out: [*mut f32; HEADS],
        add: bool,
        ahead: &mut Ahead,
    ) {
        let (format, groups_at, rows, maps) =
            (&plan.format, &plan.groups_at[..], tile.rows, tile.maps);
        let decoder = Decoder::new(plan);
        let pairs = if PAIRS > 0 {
            PAIRS
        } else {
            format.width / (2 * GROUP)
        };
        let (per_map, count) = (format.maps.channels / GROUP, format.maps() as i32);
        let center = format.center();
        // Per pair, the map word of each half's group: its scale, and its minimum.
        let scale_at: [__m256i; MAX_PAIRS] = std::array::from_fn(|p| {
            let (m0, m1) = ((2 * p / per_map) as i32, ((2 * p + 1) / per_map) as i32);
            _mm256_setr_epi32(m0, m0, m0, m0, m1, m1, m1, m1)
        });
        let min_at = scale_at.map(|i| _mm256_add_epi32(i, _mm256_set1_epi32(count)));
        // Four heads' 32-bit dots with pair `p` of a row, a group per 128-bit lane.
        let pair_dots = |row: *const u8, p: usize| {
            if KIND != NIBBLES {
                level_dots(decoder.pair::<KIND>(row, p), &q.codes[p])
            } else {
                widen(pair_products(pair_codes(row, groups_at, p), &q.codes[p]))
            }
        };
        let n = rows.len() / format.row_bytes;
        let mut scores = [_mm_setzero_ps(); TILE_ROWS];
        for (t, score) in scores.iter_mut().enumerate().take(n) {
            ahead.rows(1);
            let row = rows.as_ptr().add(t * format.row_bytes);
            let words = maps.as_ptr().add(t * MAP_WORDS);
            *score = if ONE_MAP {
                let mut sums = [_mm256_setzero_si256(); HEADS];
                if KIND != NIBBLES {
                    for p in 0..pairs {
                        let d = pair_dots(row, p);
                        sums = std::array::from_fn(|h| _mm256_add_epi32(sums[h], d[h]));
                    }
                } else {
                    // Nibbles: 16-bit sums over up to `PAIRS_PER_SUM` pairs before widening.
                    for first in (0..pairs).step_by(PAIRS_PER_SUM) {
                        let codes = pair_codes(row, groups_at, first);
                        let mut products = pair_products(codes, &q.codes[first]);
                        for p in first + 1..pairs.min(first + PAIRS_PER_SUM) {
                            let more = pair_products(pair_codes(row, groups_at, p), &q.codes[p]);
                            products =
                                std::array::from_fn(|h| _mm256_add_epi16(products[h], more[h]));
                        }
                        let wide = widen(products);
                        sums = std::array::from_fn(|h| _mm256_add_epi32(sums[h], wide[h]));
                    }
                }
                let dots = per_head(sums);
                let dots = _mm_add_epi32(
                    _mm256_castsi256_si128(dots),
                    _mm256_extracti128_si256::<1>(dots),
                );
                let [sigma, centered, sums] = q.totals;
                let scale = _mm_set1_ps(*words);
                let score = _mm_mul_ps(scale, _mm_fmsub_ps(sigma, _mm_cvtepi32_ps(dots), centered));
                if MIN {
                    let offset = _mm_set1_ps(*words * center + *words.add(1));
                    _mm_fmadd_ps(offset, sums, score)
                } else {
                    score
                }
            } else {
                let words = _mm256_loadu_ps(words);
                let mut score = _mm256_setzero_ps();
                for p in 0..pairs {
                    let dots = _mm256_cvtepi32_ps(per_head(pair_dots(row, p)));
                    let [sigma, centered, sums] = q.terms[p];
                    let scale = _mm256_permutevar8x32_ps(words, scale_at[p]);
                    score = _mm256_fmadd_ps(scale, _mm256_fmsub_ps(sigma, dots, centered), score);
                    if MIN {
                        let min = _mm256_permutevar8x32_ps(words, min_at[p]);
                        let offset = _mm256_fmadd_ps(scale, _mm256_set1_ps(center), min);
                        score = _mm256_fmadd_ps(offset, sums, score);
                    }
                }
                _mm_add_ps(
                    _mm256_castps256_ps128(score),
                    _mm256_extractf128_ps::<1>(score),
                )
            };
        }
        store_heads(&scores, n, &out, add);
    }

    /// The largest of `v`'s lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn horizontal_max(v: __m256) -> f32 {
        let x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
        _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)))
    }

    /// The sum of `v`'s lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn horizontal_sum_epi32(v: __m256i) -> i32 {
        let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
        _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32::<1>(x)))
    }

    /// A tile's weights as the sums kernels take them: per head and map the weights times the
    /// rows' scales rounded to i8 against their largest magnitude (rows past the tile's end
    /// 0), the rounding's step, and what the integer sums leave out (`Σ w·offset`, less
    /// `step·center·Σ rounded` where the levels are not centered).
    pub(super) struct Rounded {
        pub weights: [[[i8; TILE_ROWS]; MAP_WORDS]; HEADS],
        pub steps: [[f32; MAP_WORDS]; HEADS],
        pub constants: [[f32; MAP_WORDS]; HEADS],
    }

    impl Default for Rounded {
        fn default() -> Self {
            Self {
                weights: [[[0; TILE_ROWS]; MAP_WORDS]; HEADS],
                steps: [[0.0; MAP_WORDS]; HEADS],
                constants: [[0.0; MAP_WORDS]; HEADS],
            }
        }
    }

    /// [`Rounded`] for up to four heads' `weights` over the `n` rows of a tile of `format`
    /// (`centered`: its codes are decoded less the center), `word(k, t)` the f32 map word `k`
    /// of rows `t…t + 7`. Absent heads' weights are 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn round_weights(
        format: &LevelFormat,
        centered: bool,
        weights: &[&[f32]],
        n: usize,
        word: impl Fn(usize, usize) -> __m256,
        out: &mut Rounded,
    ) {
        let count = format.maps();
        let center = format.center();
        let Rounded {
            weights: rounded,
            steps,
            constants,
        } = out;
        assert!(n <= TILE_ROWS && weights.len() <= HEADS);
        let vectors = n.div_ceil(32) * 4;
        let heads = weights.len();
        *steps = [[0.0; MAP_WORDS]; HEADS];
        *constants = [[0.0; MAP_WORDS]; HEADS];
        // Per head its weights where they fill whole vectors, else a copy padded with zeros.
        // (Written and read through raw pointers: a zeroed array cost a 1 KiB fill per tile.)
        let mut padded = std::mem::MaybeUninit::<[[f32; TILE_ROWS]; HEADS]>::uninit();
        let padded = padded.as_mut_ptr().cast::<f32>();
        let rows: [*const f32; HEADS] = std::array::from_fn(|h| match weights.get(h) {
            Some(w) if n == 8 * vectors => w.as_ptr(),
            Some(w) => {
                let row = padded.add(h * TILE_ROWS);
                std::ptr::copy_nonoverlapping(w[..n].as_ptr(), row, n);
                std::ptr::write_bytes(row.add(n), 0, TILE_ROWS - n);
                row.cast_const()
            }
            None => std::ptr::null(),
        });
        let load = |h: usize, i: usize| _mm256_loadu_ps(rows[h].add(8 * i));
        // Per head the factor to units of 1/127 of its largest weight.
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        let mut to_levels = [_mm256_setzero_ps(); HEADS];
        for (h, to_levels) in to_levels.iter_mut().enumerate().take(heads) {
            let largest_w = horizontal_max((0..vectors).fold(_mm256_setzero_ps(), |l, i| {
                _mm256_max_ps(l, _mm256_and_ps(load(h, i), abs))
            }));
            *to_levels = _mm256_set1_ps(if largest_w > 0.0 {
                127.0 / largest_w
            } else {
                0.0
            });
            steps[h] = [largest_w / 127.0; MAP_WORDS];
        }
        // Rows that some head weighs: the others (the unwritten rows of a partly written
        // block) add nothing, and their scales must not coarsen the rounding.
        let mut live = [_mm256_setzero_ps(); TILE_ROWS / 8];
        for (i, live) in live.iter_mut().enumerate().take(vectors) {
            *live = (0..heads).fold(_mm256_setzero_ps(), |live, h| {
                _mm256_or_ps(
                    live,
                    _mm256_cmp_ps::<_CMP_NEQ_UQ>(load(h, i), _mm256_setzero_ps()),
                )
            });
        }
        // The dwords of two `vpackssdw` + `vpacksswb` results back in row order.
        let row_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for m in 0..count {
            // Each row's scale relative to the tile's largest, and its center's value.
            let mut relative = [_mm256_setzero_ps(); TILE_ROWS / 8];
            let mut offsets = relative;
            let mut largest = _mm256_setzero_ps();
            for (i, (s, o)) in relative
                .iter_mut()
                .zip(&mut offsets)
                .enumerate()
                .take(vectors)
            {
                *s = _mm256_and_ps(word(m, 8 * i), live[i]);
                if format.maps.min_at.is_some() {
                    *o = _mm256_fmadd_ps(*s, _mm256_set1_ps(center), word(count + m, 8 * i));
                }
                largest = _mm256_max_ps(largest, _mm256_and_ps(*s, abs));
            }
            let largest_a = horizontal_max(largest);
            let inv_a = _mm256_set1_ps(if largest_a > 0.0 {
                1.0 / largest_a
            } else {
                0.0
            });
            for s in relative.iter_mut().take(vectors) {
                *s = _mm256_mul_ps(*s, inv_a);
            }
            for absent in rounded.iter_mut().skip(heads) {
                absent[m] = [0; TILE_ROWS];
            }
            for h in 0..heads {
                let (mut codes, mut offset) = (_mm256_setzero_si256(), _mm256_setzero_ps());
                for i in (0..vectors).step_by(4) {
                    let c: [__m256i; 4] = std::array::from_fn(|k| {
                        let levels = _mm256_mul_ps(load(h, i + k), to_levels[h]);
                        _mm256_cvtps_epi32(_mm256_mul_ps(levels, relative[i + k]))
                    });
                    codes = _mm256_add_epi32(
                        codes,
                        _mm256_add_epi32(
                            _mm256_add_epi32(c[0], c[1]),
                            _mm256_add_epi32(c[2], c[3]),
                        ),
                    );
                    // |code| ≤ 127: the packs do not saturate.
                    let bytes = _mm256_packs_epi16(
                        _mm256_packs_epi32(c[0], c[1]),
                        _mm256_packs_epi32(c[2], c[3]),
                    );
                    let at = rounded[h][m].as_mut_ptr().add(8 * i);
                    _mm256_storeu_si256(
                        at as *mut _,
                        _mm256_permutevar8x32_epi32(bytes, row_order),
                    );
                }
                steps[h][m] *= largest_a;
                // Without minimums the offsets are 0: no horizontal sum of zeros.
                if format.maps.min_at.is_some() {
                    for (i, &o) in offsets.iter().enumerate().take(vectors) {
                        offset = _mm256_fmadd_ps(load(h, i), o, offset);
                    }
                    constants[h][m] = crate::simd::avx2::hsum(offset);
                }
                if !centered {
                    let codes = horizontal_sum_epi32(codes) as f32;
                    constants[h][m] -= steps[h][m] * center * codes;
                }
            }
        }
    }

    /// Adds up to four heads' weighted sums of a tile's rows to channels `first…` of `accs`:
    /// the rows' levels times
    /// the [`Rounded`] weights summed in integers into `scratch`'s sums (`width` per head, in
    /// channel order), then scaled.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn accumulate_rows(
        plan: &Plan,
        weights: &[&[f32]],
        tile: &Tile,
        scratch: &mut Sums,
        accs: &mut [&mut [f32]],
        first: usize,
        ahead: &mut Ahead,
    ) {
        let format = &plan.format;
        let n = tile.rows.len() / format.row_bytes;
        // Row `t + i` of map word `k` at `(t + i)·MAP_WORDS + k`.
        let rows_of = _mm256_mullo_epi32(
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            _mm256_set1_epi32(MAP_WORDS as i32),
        );
        let word = |k: usize, t: usize| {
            _mm256_i32gather_ps::<4>(tile.maps.as_ptr().add(t * MAP_WORDS + k), rows_of)
        };
        let centered = plan.path == Path::Levels;
        let rounded = &mut scratch.rounded;
        round_weights(format, centered, weights, n, word, rounded);
        let sums = &mut scratch.sums;
        let levels = &mut scratch.levels;
        match (plan.path, decoder_kind(plan)) {
            (Path::Nibbles, _) => sum_nibbles(plan, &rounded.weights, tile, sums, ahead),
            (Path::Levels, BLOCK5) => {
                sum_levels::<BLOCK5>(plan, rounded, tile, sums, levels, ahead)
            }
            (Path::Levels, SIGNS) => sum_levels::<SIGNS>(plan, rounded, tile, sums, levels, ahead),
            (Path::Levels, BLOCK_TABLE) => {
                sum_levels::<BLOCK_TABLE>(plan, rounded, tile, sums, levels, ahead)
            }
            (Path::Levels, PACKED_TABLE) => {
                sum_levels::<PACKED_TABLE>(plan, rounded, tile, sums, levels, ahead)
            }
            (Path::Levels, WINDOWS) => {
                sum_levels::<WINDOWS>(plan, rounded, tile, sums, levels, ahead)
            }
            (Path::Levels, _) => {
                sum_levels::<WINDOWS_TABLE>(plan, rounded, tile, sums, levels, ahead)
            }
        }
        // acc[c] += step·sum + constant, 8 channels at a time.
        let (w, channels) = (format.width, format.maps.channels);
        for (h, a) in accs.iter_mut().enumerate().take(weights.len()) {
            let (sums, a) = (sums.as_ptr().add(h * w), &mut a[first..first + w]);
            for (m, from) in (0..w).step_by(channels).enumerate() {
                let step = _mm256_set1_ps(rounded.steps[h][m]);
                let constant = _mm256_set1_ps(rounded.constants[h][m]);
                for c in (from..from + channels).step_by(8) {
                    let sum = _mm256_cvtepi32_ps(_mm256_loadu_si256(sums.add(c) as *const _));
                    let at = a.as_mut_ptr().add(c);
                    let value = _mm256_fmadd_ps(step, sum, constant);
                    _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), value));
                }
            }
        }
    }

    /// The integer sums of 4-bit codes without a table: a group at a time, two rows' bytes
    /// interleaved so that `vpmaddubsw` adds each channel's two products.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_nibbles(
        plan: &Plan,
        rounded: &[[[i8; TILE_ROWS]; MAP_WORDS]; HEADS],
        tile: &Tile,
        sums: &mut [i32],
        ahead: &mut Ahead,
    ) {
        let (format, rows) = (&plan.format, tile.rows);
        let n = rows.len() / format.row_bytes;
        let (w, per_map) = (format.width, format.maps.channels / GROUP);
        sums[..HEADS * w].fill(0);
        let packed = matches!(format.codes, CodeLayout::Packed { .. });
        // Bytes `i` and `8 + i` of each lane side by side: two rows' codes of one channel.
        let interleave = _mm256_setr_epi8(
            0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12,
            5, 13, 6, 14, 7, 15,
        );
        let zeros = [0u8; 16];
        // The tile's prefetches, spread over its groups.
        let share = n.div_ceil(plan.groups_at.len());
        for (g, &at) in plan.groups_at.iter().enumerate() {
            ahead.rows(share);
            let m = g / per_map;
            for first in (0..n).step_by(16) {
                let mut acc = [[_mm256_setzero_si256(); 2]; HEADS];
                for t in (first..n.min(first + 16)).step_by(2) {
                    let a = rows.as_ptr().add(t * format.row_bytes + at);
                    let b = if t + 1 < n {
                        rows.as_ptr().add((t + 1) * format.row_bytes + at)
                    } else {
                        zeros.as_ptr()
                    };
                    // Lanes [a 0–7, b 0–7 | a 8–15, b 8–15], then each byte of a next to b's.
                    let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_loadu2_m128i(
                        b as *const _,
                        a as *const _,
                    ));
                    let [low, high] = nibbles(_mm256_shuffle_epi8(v, interleave));
                    for (h, acc) in acc.iter_mut().enumerate() {
                        let pair = (rounded[h][m].as_ptr().add(t) as *const i16).read_unaligned();
                        let wv = _mm256_set1_epi16(pair);
                        acc[0] = _mm256_add_epi16(acc[0], _mm256_maddubs_epi16(low, wv));
                        acc[1] = _mm256_add_epi16(acc[1], _mm256_maddubs_epi16(high, wv));
                    }
                }
                for (h, &[low, high]) in acc.iter().enumerate() {
                    // Lane `i` of `low` holds byte `i`'s low nibble, of `high` its high one:
                    // channels `i` and `16 + i` in llama.cpp's blocks, `2i` and `2i + 1`
                    // packed (then interleaved into channels 0–7, 16–23 and 8–15, 24–31).
                    let (a, b) = if packed {
                        let (a, b) = (
                            _mm256_unpacklo_epi16(low, high),
                            _mm256_unpackhi_epi16(low, high),
                        );
                        (
                            _mm256_permute2x128_si256::<0x20>(a, b),
                            _mm256_permute2x128_si256::<0x31>(a, b),
                        )
                    } else {
                        (low, high)
                    };
                    let at = sums.as_mut_ptr().add(h * w + GROUP * g);
                    for (k, x) in [a, b].into_iter().enumerate() {
                        for (half, part) in
                            [_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x)]
                                .into_iter()
                                .enumerate()
                        {
                            let at = at.add(16 * k + 8 * half) as *mut __m256i;
                            let sum = _mm256_add_epi32(
                                _mm256_loadu_si256(at),
                                _mm256_cvtepi16_epi32(part),
                            );
                            _mm256_storeu_si256(at, sum);
                        }
                    }
                }
            }
        }
    }

    /// The integer sums of decoded levels: the tile's rows decoded into `levels`, then 16
    /// channels at a time two rows' levels interleaved so that `vpmaddwd` adds each channel's
    /// two products.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_levels<const KIND: u8>(
        plan: &Plan,
        rounded: &Rounded,
        tile: &Tile,
        sums: &mut [i32],
        levels: &mut [__m256i],
        ahead: &mut Ahead,
    ) {
        let (format, rows) = (&plan.format, tile.rows);
        let n = rows.len() / format.row_bytes;
        let (w, per_map) = (format.width, format.maps.channels / GROUP);
        let (pairs, vectors) = (w / (2 * GROUP), w / 16);
        let decoder = Decoder::new(plan);
        for t in 0..n {
            ahead.rows(1);
            let row = rows.as_ptr().add(t * format.row_bytes);
            let out = levels.as_mut_ptr().add(t * vectors);
            for p in 0..pairs {
                let decoded = decoder.pair::<KIND>(row, p);
                for (j, v) in decoded.into_iter().enumerate() {
                    _mm256_store_si256(out.add(4 * p + j), v);
                }
            }
        }
        // An odd last row's partner: zero levels (its weights are 0 too).
        levels[n * vectors..(n + 1) * vectors].fill(_mm256_setzero_si256());
        // Per head and map the weights as i16, read as pairs of rows.
        let mut wide = [[[0i16; TILE_ROWS]; MAP_WORDS]; HEADS];
        for (wide, rounded) in wide.iter_mut().zip(&rounded.weights) {
            for (wide, rounded) in wide.iter_mut().zip(rounded).take(format.maps()) {
                for (x, &r) in wide.iter_mut().zip(rounded) {
                    *x = i16::from(r);
                }
            }
        }
        let levels = levels.as_ptr();
        for p in 0..pairs {
            // The weights of each lane's group's map, in its 128-bit half.
            let (m0, m1) = (2 * p / per_map, (2 * p + 1) / per_map);
            let pair_of = |h: usize, r: usize| {
                let at = |m: usize| (wide[h][m].as_ptr() as *const i32).add(r);
                if m0 == m1 {
                    _mm256_set1_epi32(*at(m0))
                } else {
                    _mm256_inserti128_si256::<1>(
                        _mm256_set1_epi32(*at(m0)),
                        _mm_set1_epi32(*at(m1)),
                    )
                }
            };
            for j in 0..4 {
                let v = 4 * p + j;
                let mut acc = [[_mm256_setzero_si256(); 2]; HEADS];
                for (r, t) in (0..n).step_by(2).enumerate() {
                    let a = *levels.add(t * vectors + v);
                    let b = *levels.add((t + 1) * vectors + v);
                    let (low, high) = (_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
                    for (h, acc) in acc.iter_mut().enumerate() {
                        let weights = pair_of(h, r);
                        acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(low, weights));
                        acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(high, weights));
                    }
                }
                // Lanes 0–3 of `acc[0]`, then of `acc[1]`: the first group's channels
                // `8j…8j + 7`; lanes 4–7: the second group's.
                for (h, &[low, high]) in acc.iter().enumerate() {
                    let at = sums.as_mut_ptr().add(h * w + 2 * GROUP * p + 8 * j);
                    let first = _mm256_permute2x128_si256::<0x20>(low, high);
                    let second = _mm256_permute2x128_si256::<0x31>(low, high);
                    _mm256_storeu_si256(at as *mut _, first);
                    _mm256_storeu_si256(at.add(GROUP) as *mut _, second);
                }
            }
        }
    }
}
