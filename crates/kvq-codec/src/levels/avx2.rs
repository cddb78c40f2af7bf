//! The integer group kernels for CPUs with AVX2 but without the AVX-512 kernels' instructions
//! (AVX2-only x86, AVX-512 without VNNI/VBMI), for 4-bit codes without a table (`q4_0`, `q4_1`,
//! `int4-g*`) in the row layout: `vpmaddubsw` multiplies 32 u8 codes by i8 values into 16-bit
//! pair sums, where the float kernels decode and multiply 8 values per instruction.
//!
//! They compute what the AVX-512 kernels compute, with the same roundings (the parent module's
//! doc states them and their bounds): the prepared query's i8 copy ([`super::quantize_query`]),
//! and per tile of [`TILE_ROWS`] rows, head and map the weights times the rows' scales rounded to
//! i8 against their largest magnitude.
//!
//! * Scores, a row at a time: each 64-channel pair of groups is one 32-byte load whose low and
//!   high nibbles, interleaved by 32-bit words, fall in the query's byte order; four heads'
//!   `vpmaddubsw` + `vpmaddwd` sums are reduced together by `vphaddd` into one lane per head
//!   and group.
//! * Sums, a group of 32 channels at a time: two rows' bytes interleaved (a `vpermq` and a
//!   `vpshufb`, then the nibbles split), so that `vpmaddubsw` with the two rows' weights adds each
//!   channel's pair of products into one 16-bit lane; 8 row pairs fit 16 bits
//!   (`8·2·15·127 < 2¹⁵`) before the lanes widen to 32 bits.

use super::{CodeLayout, LevelFormat, GROUP, MAP_WORDS, QUERY_MAP, TILE_ROWS};
use crate::simd::Ahead;
use std::cell::RefCell;

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

/// Whether these kernels take `format` on this thread: [`available`], and 4-bit codes without
/// a table in a format the AVX-512 kernels support.
pub fn takes(format: &LevelFormat) -> bool {
    let nibbles = match format.codes {
        CodeLayout::Packed { bits, .. } => bits == 4,
        CodeLayout::Nibbles { high_at, .. } => high_at.is_none(),
    };
    available() && nibbles && format.table.is_none() && format.supported()
}

/// Where a format keeps what the kernels read, worked out once per thread and format.
struct Plan {
    format: LevelFormat,
    /// Byte offset within a row of each group's 16 code bytes.
    groups_at: Vec<usize>,
    /// Byte offset within a row of each map word.
    words_at: Vec<usize>,
    /// The sums kernel's slot of each channel: slot `32g + 8s + i` of a head holds i16
    /// element `k = 2i + s mod 2` of its group's vector `s / 2`, stream position `2k + s / 2`.
    slot_of: Vec<i32>,
}

impl Plan {
    fn new(format: &LevelFormat) -> Self {
        let mut slot_of = vec![0i32; format.width];
        for slot in 0..format.width {
            let (g, s, i) = (slot / GROUP, slot % GROUP / 8, slot % 8);
            let position = 2 * (2 * i + s % 2) + s / 2;
            slot_of[format.stream_channel(GROUP * g + position)] = slot as i32;
        }
        Self {
            format: *format,
            groups_at: (0..format.width / GROUP)
                .map(|g| format.stream_byte(16 * g))
                .collect(),
            words_at: (0..format.map_words())
                .map(|k| format.map_word_at(k))
                .collect(),
            slot_of,
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
    /// The sums kernel's integer sums, `width` slots per head.
    sums: Vec<i32>,
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
/// then `tile(state, plan, queries, sums, tile)` for consecutive tiles of `blocks` after decoding
/// their maps (`state` what `setup` returned, `sums` the thread's integer sums).
#[cfg(target_arch = "x86_64")]
fn for_each_tile<S>(
    format: &LevelFormat,
    blocks: &[u8],
    ahead: &mut Ahead,
    setup: impl FnOnce(&Plan, &mut Vec<kernels::Queries>) -> S,
    mut tile: impl FnMut(&mut S, &Plan, &[kernels::Queries], &mut [i32], Tile),
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
        sums.resize(HEADS * format.width, 0);
        let mut state = setup(plan, queries);
        for (i, rows) in blocks.chunks(TILE_ROWS * format.row_bytes).enumerate() {
            let n = rows.len() / format.row_bytes;
            ahead.rows(n);
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
            unsafe { kernels::decode_maps(words, maps) };
            let first = i * TILE_ROWS;
            tile(&mut state, plan, queries, sums, Tile { first, rows, maps });
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
    let rows = blocks.len() / format.row_bytes;
    assert!(queries.len() == scores.len() && scores.iter().all(|s| s.len() >= rows));
    let slots = super::query_slots(format.width);
    assert!(queries.iter().all(|q| q.len() >= format.width + slots));
    #[cfg(target_arch = "x86_64")]
    for_each_tile(
        format,
        blocks,
        ahead,
        |_, prepared| {
            prepared.clear();
            // SAFETY: `takes` (asserted by `for_each_tile`) checked the CPU; the queries hold
            // their slots.
            prepared.extend(
                queries
                    .chunks(HEADS)
                    .map(|chunk| unsafe { kernels::Queries::new(format, chunk, slots) }),
            );
            // Where the scores of absent heads go.
            [0f32; TILE_ROWS]
        },
        |sink, plan, prepared, _, tile| {
            let n = tile.rows.len() / format.row_bytes;
            for (c, q) in prepared.iter().enumerate() {
                let mut out = [sink.as_mut_ptr(); HEADS];
                for (o, s) in out.iter_mut().zip(&mut scores[c * HEADS..]) {
                    *o = s[tile.first..tile.first + n].as_mut_ptr();
                }
                // SAFETY: as above; every row holds its codes (`supported`), and each of `out`
                // takes `n` values.
                unsafe { kernels::score_rows(plan, q, &tile, out) };
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
    let rows = blocks.len() / format.row_bytes;
    assert!(weights.len() == accs.len() && weights.iter().all(|w| w.len() >= rows));
    assert!(accs.iter().all(|a| a.len() >= format.width));
    #[cfg(target_arch = "x86_64")]
    for_each_tile(
        format,
        blocks,
        ahead,
        |_, _| (),
        |_, plan, _, sums, tile| {
            let n = tile.rows.len() / format.row_bytes;
            for (w, a) in weights.chunks(HEADS).zip(accs.chunks_mut(HEADS)) {
                let w: [&[f32]; HEADS] = std::array::from_fn(|h| {
                    w.get(h).map_or(&[][..], |w| &w[tile.first..tile.first + n])
                });
                // SAFETY: `takes` (asserted by `for_each_tile`) checked the CPU; every row
                // holds its codes (`supported`).
                unsafe { kernels::accumulate_rows(plan, &w[..a.len()], &tile, sums, a) };
            }
        },
    );
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use super::{Plan, Tile, GROUP, HEADS, QUERY_MAP, TILE_ROWS};
    use crate::levels::{LevelFormat, MAP_WORDS};
    use std::arch::x86_64::*;

    /// Pairs of groups of 32 channels at most ([`LevelFormat::supported`]: 512 channels).
    const MAX_PAIRS: usize = 8;

    /// Up to four heads' i8 queries in the score kernel's order, and their per-group terms.
    pub struct Queries {
        /// Per pair of groups and head, the query bytes that the low (`[0]`) and high (`[1]`)
        /// 32-bit words of the pair's nibbles meet: bytes 0–15 of each group, then 16–31.
        codes: [[[__m256i; 2]; HEADS]; MAX_PAIRS],
        /// Per pair of groups, `σ` of each head (lanes 0–3 the first group, 4–7 the second),
        /// `center·σ·Σ codes`, and the exact `Σ q`.
        terms: [[__m256; 3]; MAX_PAIRS],
        /// The same per head over all groups, for rows with one map (whose queries have one
        /// `σ`).
        totals: [__m128; 3],
    }

    impl Queries {
        /// Reads up to [`HEADS`] prepared queries whose slots begin `slots` values before their
        /// end; missing heads are zero.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn new(format: &LevelFormat, queries: &[&[f32]], slots: usize) -> Self {
            let w = format.width;
            let mut codes = [[[_mm256_setzero_si256(); 2]; HEADS]; MAX_PAIRS];
            let mut terms = [[[0f32; 8]; 3]; MAX_PAIRS];
            let mut totals = [[0f32; HEADS]; 3];
            for (h, query) in queries.iter().enumerate() {
                let s = &query[query.len() - slots..];
                let bytes = s.as_ptr() as *const u8;
                for (p, (codes, terms)) in codes.iter_mut().zip(&mut terms).enumerate() {
                    if p == w / (2 * GROUP) {
                        break;
                    }
                    let first = _mm256_loadu_si256(bytes.add(2 * GROUP * p) as *const _);
                    let second = _mm256_loadu_si256(bytes.add(2 * GROUP * p + GROUP) as *const _);
                    codes[h] = [
                        _mm256_permute2x128_si256::<0x20>(first, second),
                        _mm256_permute2x128_si256::<0x31>(first, second),
                    ];
                    for k in 0..2 {
                        let map = &s[w / 4 + QUERY_MAP * (2 * p + k)..];
                        let group = [map[0], format.center() * map[1], map[2]];
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
                codes,
                terms: terms.map(|t| t.map(|x| _mm256_loadu_ps(x.as_ptr()))),
                totals: totals.map(|x| _mm_loadu_ps(x.as_ptr())),
            }
        }
    }

    /// Each row's map words as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode_maps(words: &[u16], maps: &mut [f32]) {
        const { assert!(MAP_WORDS == 8) };
        for (w, m) in words.chunks_exact(8).zip(maps.chunks_exact_mut(8)) {
            let halves = _mm_loadu_si128(w.as_ptr() as *const _);
            _mm256_storeu_ps(m.as_mut_ptr(), _mm256_cvtph_ps(halves));
        }
    }

    /// Each row's 32 bytes of a pair of groups, split into the 32-bit words of their low and
    /// high nibbles interleaved: in each 128-bit lane (a group), `[0]` holds its bytes 0–7's
    /// codes in the query's order and `[1]` its bytes 8–15's.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_codes(row: *const u8, halves: &[usize], p: usize) -> [__m256i; 2] {
        let (a, b) = (halves[2 * p], halves[2 * p + 1]);
        let v = if b == a + 16 {
            _mm256_loadu_si256(row.add(a) as *const _)
        } else {
            _mm256_loadu2_m128i(row.add(b) as *const _, row.add(a) as *const _)
        };
        let mask = _mm256_set1_epi8(0x0f);
        let low = _mm256_and_si256(v, mask);
        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
        [
            _mm256_unpacklo_epi32(low, high),
            _mm256_unpackhi_epi32(low, high),
        ]
    }

    /// Four heads' integer dots of a row's pair of groups, each head's in 8 lanes: lanes 0–3
    /// sum to its dot with the first group, lanes 4–7 to the second's.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_dots(codes: [__m256i; 2], q: &[[__m256i; 2]; HEADS]) -> [__m256i; HEADS] {
        let ones = _mm256_set1_epi16(1);
        std::array::from_fn(|h| {
            let products = _mm256_add_epi16(
                _mm256_maddubs_epi16(codes[0], q[h][0]),
                _mm256_maddubs_epi16(codes[1], q[h][1]),
            );
            _mm256_madd_epi16(products, ones)
        })
    }

    /// Four heads' lanes summed per 128-bit half: lane `h` of each half holds head `h`'s sum
    /// over that half.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn per_head(d: [__m256i; HEADS]) -> __m256i {
        _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]))
    }

    /// Writes lane `h` of `v` to `out[h][t]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_heads(v: __m128, out: &[*mut f32; HEADS], t: usize) {
        *out[0].add(t) = _mm_cvtss_f32(v);
        *out[1].add(t) = f32::from_bits(_mm_extract_ps::<1>(v) as u32);
        *out[2].add(t) = f32::from_bits(_mm_extract_ps::<2>(v) as u32);
        *out[3].add(t) = f32::from_bits(_mm_extract_ps::<3>(v) as u32);
    }

    /// Scores of up to four heads for each of a tile's rows into `out[h][t]`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn score_rows(plan: &Plan, q: &Queries, tile: &Tile, out: [*mut f32; HEADS]) {
        let format = &plan.format;
        let one_map = format.maps.channels >= format.width;
        match (one_map, format.maps.min_at.is_some()) {
            (true, true) => score_rows_as::<true, true>(plan, q, tile, out),
            (true, false) => score_rows_as::<true, false>(plan, q, tile, out),
            (false, true) => score_rows_as::<false, true>(plan, q, tile, out),
            (false, false) => score_rows_as::<false, false>(plan, q, tile, out),
        }
    }

    /// [`score_rows`] for rows with one map or several (`ONE_MAP`), with minimums or without.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn score_rows_as<const ONE_MAP: bool, const MIN: bool>(
        plan: &Plan,
        q: &Queries,
        tile: &Tile,
        out: [*mut f32; HEADS],
    ) {
        let (format, halves, rows, maps) =
            (&plan.format, &plan.groups_at[..], tile.rows, tile.maps);
        let pairs = format.width / (2 * GROUP);
        let (per_map, count) = (format.maps.channels / GROUP, format.maps() as i32);
        let center = format.center();
        // Per pair, the map word of each half's group: its scale, and its minimum.
        let scale_at: [__m256i; MAX_PAIRS] = std::array::from_fn(|p| {
            let (m0, m1) = ((2 * p / per_map) as i32, ((2 * p + 1) / per_map) as i32);
            _mm256_setr_epi32(m0, m0, m0, m0, m1, m1, m1, m1)
        });
        let min_at = scale_at.map(|i| _mm256_add_epi32(i, _mm256_set1_epi32(count)));
        for t in 0..rows.len() / format.row_bytes {
            let row = rows.as_ptr().add(t * format.row_bytes);
            let words = maps.as_ptr().add(t * MAP_WORDS);
            let score = if ONE_MAP {
                let mut sums = [_mm256_setzero_si256(); HEADS];
                for p in 0..pairs {
                    let d = pair_dots(pair_codes(row, halves, p), &q.codes[p]);
                    sums = std::array::from_fn(|h| _mm256_add_epi32(sums[h], d[h]));
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
                    let d = pair_dots(pair_codes(row, halves, p), &q.codes[p]);
                    let dots = _mm256_cvtepi32_ps(per_head(d));
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
            store_heads(score, &out, t);
        }
    }

    /// The sum of `v`'s lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn horizontal_sum_epi32(v: __m256i) -> i32 {
        let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
        _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32::<1>(x)))
    }

    /// Adds up to four heads' weighted sums of a tile's rows to `accs`: per map the weights
    /// times the rows' scales rounded to i8 against their largest magnitude, the products
    /// summed in integers into `sums` (`width` slots per head, the plan's `slot_of[c]` holding
    /// channel `c`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn accumulate_rows(
        plan: &Plan,
        weights: &[&[f32]],
        tile: &Tile,
        sums: &mut [i32],
        accs: &mut [&mut [f32]],
    ) {
        let (format, halves, slot_of) = (&plan.format, &plan.groups_at[..], &plan.slot_of[..]);
        let (rows, maps) = (tile.rows, tile.maps);
        let n = rows.len() / format.row_bytes;
        let (w, heads) = (format.width, weights.len());
        let (count, per_map) = (format.maps(), format.maps.channels / GROUP);
        let center = format.center();
        // Rounded weights per head and map, for whole stores of 32 rows.
        let mut rounded = [[[0i8; TILE_ROWS]; MAP_WORDS]; HEADS];
        let vectors = n.div_ceil(32) * 4;
        // Per head and map: the weights' step, and `Σ w·offset − step·center·Σ rounded`.
        let mut steps = [[0f32; MAP_WORDS]; HEADS];
        let mut constants = [[0f32; MAP_WORDS]; HEADS];
        // Per head the weights, rows past the tile's end 0, and the same in units of 1/127 of
        // the largest (absent heads 0).
        let mut padded = [[0f32; TILE_ROWS]; HEADS];
        let mut levels = [[_mm256_setzero_ps(); TILE_ROWS / 8]; HEADS];
        for (h, wh) in weights.iter().enumerate() {
            padded[h][..n].copy_from_slice(wh);
            let largest_w = wh.iter().fold(0f32, |l, x| l.max(x.abs()));
            let to_levels = _mm256_set1_ps(if largest_w > 0.0 {
                127.0 / largest_w
            } else {
                0.0
            });
            for (i, l) in levels[h].iter_mut().enumerate().take(vectors) {
                *l = _mm256_mul_ps(_mm256_loadu_ps(padded[h].as_ptr().add(8 * i)), to_levels);
            }
            steps[h] = [largest_w / 127.0; MAP_WORDS];
        }
        // Row `t + i` of map word `k` at `(t + i)·MAP_WORDS + k`.
        let rows_of = _mm256_mullo_epi32(
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            _mm256_set1_epi32(MAP_WORDS as i32),
        );
        let word = |k: usize, t: usize| {
            _mm256_i32gather_ps::<4>(maps.as_ptr().add(t * MAP_WORDS + k), rows_of)
        };
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
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
                *s = word(m, 8 * i);
                if format.maps.min_at.is_some() {
                    *o = _mm256_fmadd_ps(*s, _mm256_set1_ps(center), word(count + m, 8 * i));
                }
                largest = _mm256_max_ps(largest, _mm256_and_ps(*s, abs));
            }
            let largest_a = {
                let x = _mm_max_ps(
                    _mm256_castps256_ps128(largest),
                    _mm256_extractf128_ps::<1>(largest),
                );
                let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
                _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)))
            };
            let inv_a = _mm256_set1_ps(if largest_a > 0.0 {
                1.0 / largest_a
            } else {
                0.0
            });
            for s in relative.iter_mut().take(vectors) {
                *s = _mm256_mul_ps(*s, inv_a);
            }
            for h in 0..HEADS {
                let (mut codes, mut offset) = (_mm256_setzero_si256(), _mm256_setzero_ps());
                for i in (0..vectors).step_by(4) {
                    let c: [__m256i; 4] = std::array::from_fn(|k| {
                        _mm256_cvtps_epi32(_mm256_mul_ps(levels[h][i + k], relative[i + k]))
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
                if format.maps.min_at.is_some() {
                    for (i, &o) in offsets.iter().enumerate().take(vectors) {
                        let x = _mm256_loadu_ps(padded[h].as_ptr().add(8 * i));
                        offset = _mm256_fmadd_ps(x, o, offset);
                    }
                }
                steps[h][m] *= largest_a;
                let codes = horizontal_sum_epi32(codes) as f32;
                constants[h][m] = crate::simd::avx2::hsum(offset) - steps[h][m] * center * codes;
            }
        }
        // Every head's lanes, absent heads' weights 0: no branch per head in the loop.
        sums[..HEADS * w].fill(0);
        let mask = _mm256_set1_epi8(0x0f);
        // Bytes `i` and `8 + i` of each lane side by side: two rows' codes of one channel.
        let interleave = _mm256_setr_epi8(
            0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12,
            5, 13, 6, 14, 7, 15,
        );
        let zeros = [0u8; 16];
        for (g, &at) in halves.iter().enumerate() {
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
                    let v = _mm256_shuffle_epi8(v, interleave);
                    let low = _mm256_and_si256(v, mask);
                    let high = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                    for (h, acc) in acc.iter_mut().enumerate() {
                        let pair = (rounded[h][m].as_ptr().add(t) as *const i16).read_unaligned();
                        let wv = _mm256_set1_epi16(pair);
                        acc[0] = _mm256_add_epi16(acc[0], _mm256_maddubs_epi16(low, wv));
                        acc[1] = _mm256_add_epi16(acc[1], _mm256_maddubs_epi16(high, wv));
                    }
                }
                for (h, acc) in acc.iter().enumerate() {
                    for (s, &x) in acc.iter().enumerate() {
                        let even = _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(x));
                        let odd = _mm256_srai_epi32::<16>(x);
                        for (k, part) in [even, odd].into_iter().enumerate() {
                            let at = sums.as_mut_ptr().add(h * w + GROUP * g + 8 * (2 * s + k));
                            let sum = _mm256_add_epi32(_mm256_loadu_si256(at as *const _), part);
                            _mm256_storeu_si256(at as *mut _, sum);
                        }
                    }
                }
            }
        }
        // acc[c] += step·sum + constant, 8 channels at a time.
        for (h, a) in accs.iter_mut().enumerate().take(heads) {
            let sums = sums.as_ptr().add(h * w);
            for c in (0..w).step_by(8) {
                let m = c / format.maps.channels;
                let slots = _mm256_loadu_si256(slot_of.as_ptr().add(c) as *const _);
                let sum = _mm256_cvtepi32_ps(_mm256_i32gather_epi32::<4>(sums, slots));
                let at = a.as_mut_ptr().add(c);
                let value = _mm256_fmadd_ps(
                    _mm256_set1_ps(steps[h][m]),
                    sum,
                    _mm256_set1_ps(constants[h][m]),
                );
                _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), value));
            }
        }
    }
}
