//! The AVX2 kernels on interleaved blocks ([`Interleaving`], `crate::interleaved`) of 1- to
//! 4-bit codes, without a table (`q4_0`, `q4_1`, `int4-g*`, `int3-g*`, `int2-g*`) or
//! through one (`iq4_nl`, `turbo2`–`turbo4`, TurboQuant's fractional runs; a table of two
//! levels, TurboQuant-prod's QJL signs, is read as its codes 0 and 1, `as_read`), and of
//! KIVI's key blocks ([`ChannelBlocks`], scored under unit scales). The blocks hold each kernel's
//! vectors as it reads them, so that no row's bytes are rearranged and no score is reduced
//! across lanes:
//!
//! * Scores (keys, [`KernelOrder::Scores`]): a vector holds one 32-bit word of 8 rows (a
//!   nibble word, a 2-bit plane of a group, a byte of its 3-bit triplets,
//!   [`Packing::Triplets`], or a group's 32 bits); each *cut* of it, 4 codes of each row one
//!   per byte (the low or high nibbles, a plane's bit pairs, a triplet's codes, a nibble's
//!   bits), meets the
//!   query's matching word broadcast in `vpmaddubsw`; the 16-bit sums add up over a group (8
//!   cuts: `8·2·15·127 < 2¹⁵`) before `vpmaddwd` widens them, and each lane ends as one row's
//!   score, finished and stored 8 rows at a time.
//! * Sums (values, [`KernelOrder::Sums`]): a vector holds a byte of each of 8 channels of a
//!   quad of rows (two channels' nibbles, four channels' bit pairs, a byte of triplets'
//!   two whole codes and bits of two more, or four channels' bits of two quads); against
//!   the quad's 4 rounded weights broadcast, `vpmaddubsw` adds two rows' products per channel,
//!   the 16-bit sums add up over 8 quads (4-bit codes) or a tile, and each head's float sums
//!   of the call (in channel order) are added to its accumulator with the maps' constants at
//!   the end.
//!
//! The roundings are the row kernels' ([`super`]): the query's i8 copy, and per tile of
//! [`TILE_ROWS`] rows, head and map the weights times the rows' scales rounded to i8.

use super::{available, path, HEADS};
use crate::levels::{
    run_slots, ChannelBlocks, CodeLayout, Interleaving, KernelOrder, LevelFormat, Packing, GROUP,
    INTERLEAVED_ROWS, MAP_WORDS, MAX_GROUPS, QUERY_MAP, TILE_ROWS,
};
use crate::simd::Ahead;
use std::cell::RefCell;

/// Whether these kernels read blocks of `runs` in place: [`available`], and every run's format
/// has 4-bit codes, packed 1- or 2-bit codes or packed 3-bit codes in triplets
/// ([`Packing::Triplets`]), without a table or through one (whose levels are centered on 128).
pub fn takes(runs: &[Interleaving]) -> bool {
    let run_fits = |r: &Interleaving| {
        let f = &r.format;
        let codes = match f.codes {
            CodeLayout::Packed { bits: 3, .. } => r.packing == Packing::Triplets,
            CodeLayout::Packed { bits, .. } => matches!(bits, 1 | 2 | 4),
            CodeLayout::Nibbles { high_at, .. } => high_at.is_none(),
        };
        f.supported() && path(f).is_some() && codes
    };
    available() && !runs.is_empty() && runs.iter().all(run_fits)
}

/// A thread's scratch: the score kernel's queries (per [`HEADS`] heads), the sums kernel's
/// float sums (per head `width` slots) and the constants each head's map adds to its channels.
#[derive(Default)]
struct Scratch {
    #[cfg(target_arch = "x86_64")]
    queries: Vec<kernels::Queries>,
    /// A tile's rounded weights, and per map broadcast a quad at a time.
    #[cfg(target_arch = "x86_64")]
    rounded: super::kernels::Rounded,
    #[cfg(target_arch = "x86_64")]
    quads: Vec<kernels::QuadWeights>,
    slots: Vec<f32>,
    constants: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The bytes of a block of `runs` and the rows of `blocks`, whole blocks that these kernels
/// read in `order` (panics otherwise).
fn block_rows(runs: &[Interleaving], order: KernelOrder, blocks: &[u8]) -> (usize, usize) {
    assert!(takes(runs) && runs.iter().all(|r| r.order == order));
    let block_bytes = runs[0].block_bytes();
    assert!(blocks.len().is_multiple_of(block_bytes));
    (block_bytes, blocks.len() / block_bytes * INTERLEAVED_ROWS)
}

/// Rows `rows` of up to [`HEADS`] heads' `scores` as the score kernels write them, absent
/// heads into `sink`.
fn outputs(
    scores: &mut [&mut [f32]],
    rows: std::ops::Range<usize>,
    sink: &mut [f32; TILE_ROWS],
) -> [*mut f32; HEADS] {
    let mut out = [sink.as_mut_ptr(); HEADS];
    for (o, s) in out.iter_mut().zip(scores) {
        *o = s[rows.clone()].as_mut_ptr();
    }
    out
}

/// Bytes of a tile's whole blocks.
fn tile_bytes(run: &Interleaving) -> usize {
    TILE_ROWS / INTERLEAVED_ROWS * run.block_bytes()
}

/// `run` as these kernels read it, and the factor of its results: a table of two levels
/// `l₀, l₁` (TurboQuant's QJL signs) is the affine map `unit·(l₁ − l₀)·(code − c)` with
/// `c = −l₀/(l₁ − l₀)`, so its codes 0 and 1 are multiplied as they are, as a format without a
/// table centered on `c` (16-bit sums, no table lookup, no signs), and its results times
/// `unit·(l₁ − l₀)`. Other runs as they are, under 1.
fn as_read(run: &Interleaving) -> (Interleaving, f32) {
    match run.format.table {
        Some(table) if run.format.code_bits() == 1 => {
            let [low, high] = [0, 1].map(|c| f32::from(table.levels[c]));
            let mut read = *run;
            read.format.table = None;
            read.format.maps.zero = -low / (high - low);
            (read, table.unit * (high - low))
        }
        _ => (*run, 1.0),
    }
}

/// [`crate::levels::score_interleaved`] with these kernels: each run scored against its slots
/// of the prepared queries (those of [`crate::levels::quantize_query`]), the first stored, the
/// others added. Prefetches `ahead` as it goes.
pub fn score_interleaved(
    runs: &[Interleaving],
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let (block_bytes, rows) = block_rows(runs, KernelOrder::Scores, blocks);
    assert!(queries.len() == scores.len() && scores.iter().all(|s| s.len() >= rows));
    let slots = run_slots(runs.iter().map(|r| r.format.width));
    #[cfg(target_arch = "x86_64")]
    SCRATCH.with(|scratch| {
        let prepared = &mut scratch.borrow_mut().queries;
        prepared.resize_with(queries.len().div_ceil(HEADS), Default::default);
        for (k, (run, slots)) in runs.iter().zip(slots).enumerate() {
            assert!(queries.iter().all(|q| q.len() >= slots));
            let (run, factor) = &as_read(run);
            for (q, chunk) in prepared.iter_mut().zip(queries.chunks(HEADS)) {
                // SAFETY: `takes` checked the CPU; each query holds its `slots`.
                unsafe { q.fill(&run.format, chunk, slots, *factor) };
            }
            // Where the scores of absent heads go.
            let mut sink = [0f32; TILE_ROWS];
            for (i, tile) in blocks.chunks(tile_bytes(run)).enumerate() {
                let (first, n) = (i * TILE_ROWS, tile.len() / block_bytes * INTERLEAVED_ROWS);
                for (c, q) in prepared.iter().enumerate() {
                    let out = outputs(&mut scores[c * HEADS..], first..first + n, &mut sink);
                    // SAFETY: as above; the tile holds whole blocks of a supported format,
                    // and each of `out` takes its `n` rows.
                    let ahead = if c == 0 {
                        &mut *ahead
                    } else {
                        &mut Ahead::none()
                    };
                    unsafe { kernels::score_tile(run, q, tile, out, k > 0, ahead) };
                }
            }
        }
    });
}

/// Whether these kernels score KIVI's key blocks `layout` ([`ChannelBlocks`]) in place: rows
/// interleaved 16 at a time whose format they take.
pub fn takes_channel_blocks(layout: &ChannelBlocks) -> bool {
    layout.interleaved && layout.supported() && takes(&[layout.interleaving()])
}

/// [`crate::levels::score_channel_blocks`] with these kernels: per block and four heads, the
/// queries times the block's channel scales rounded to i8 per group (as the AVX-512 kernels
/// round them), the rows scored under unit scales, each head's bias `Σ_c q_c·(minimum_c +
/// scale_c·center)` added with the queries' terms. Prefetches `ahead` as it goes.
pub fn score_channel_blocks(
    layout: &ChannelBlocks,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    assert!(takes_channel_blocks(layout));
    let (run, header) = (layout.interleaving(), layout.header_bytes());
    assert!(queries.iter().all(|q| q.len() >= layout.width));
    assert!(scores
        .iter()
        .all(|s| s.len() * layout.block_bytes() >= blocks.len() * layout.tokens));
    #[cfg(target_arch = "x86_64")]
    SCRATCH.with(|scratch| {
        let prepared = &mut scratch.borrow_mut().queries;
        prepared.resize_with(queries.len().div_ceil(HEADS), Default::default);
        let mut sink = [0f32; TILE_ROWS];
        for (b, block) in blocks.chunks_exact(layout.block_bytes()).enumerate() {
            let (maps, rows) = block.split_at(header);
            for (c, (q, chunk)) in prepared.iter_mut().zip(queries.chunks(HEADS)).enumerate() {
                // SAFETY: `takes` checked the CPU; `maps` holds `width` pairs, each query
                // `width` values.
                unsafe { q.fill_block(&run.format, chunk, maps) };
                for (i, tile) in rows.chunks(tile_bytes(&run)).enumerate() {
                    let first = b * layout.tokens + i * TILE_ROWS;
                    let n = tile.len() / run.block_bytes() * INTERLEAVED_ROWS;
                    let out = outputs(&mut scores[c * HEADS..], first..first + n, &mut sink);
                    let ahead = if c == 0 {
                        &mut *ahead
                    } else {
                        &mut Ahead::none()
                    };
                    // SAFETY: as above; the tile holds whole interleaved rows of a supported
                    // format, and each of `out` takes its `n` rows.
                    unsafe { kernels::score_unit_tile(&run, q, tile, out, ahead) };
                }
            }
        }
    });
}

/// [`crate::levels::accumulate_interleaved`] with these kernels: each run adds into its
/// channels. Prefetches `ahead` as it goes.
pub fn accumulate_interleaved(
    runs: &[Interleaving],
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let (block_bytes, rows) = block_rows(runs, KernelOrder::Sums, blocks);
    assert!(weights.len() == accs.len() && weights.iter().all(|w| w.len() >= rows));
    #[cfg(target_arch = "x86_64")]
    SCRATCH.with(|scratch| {
        let Scratch {
            slots,
            constants,
            rounded,
            quads,
            ..
        } = &mut *scratch.borrow_mut();
        let heads = weights.len().next_multiple_of(HEADS);
        for run in runs {
            let (run, factor) = &as_read(run);
            let (format, w) = (&run.format, run.format.width);
            assert!(accs.iter().all(|a| a.len() >= run.first + w));
            slots.clear();
            slots.resize(heads * w, 0.0);
            constants.clear();
            constants.resize(heads * MAP_WORDS, 0.0);
            for (i, tile) in blocks.chunks(tile_bytes(run)).enumerate() {
                let (first, n) = (i * TILE_ROWS, tile.len() / block_bytes * INTERLEAVED_ROWS);
                for (c, chunk) in weights.chunks(HEADS).enumerate() {
                    let chunk: [&[f32]; HEADS] = std::array::from_fn(|h| {
                        chunk.get(h).map_or(&[][..], |x| &x[first..first + n])
                    });
                    let ahead = if c == 0 {
                        &mut *ahead
                    } else {
                        &mut Ahead::none()
                    };
                    // SAFETY: `takes` checked the CPU; the tile holds whole blocks of a
                    // supported format, the scratch `HEADS` heads' slots and constants.
                    unsafe {
                        kernels::sum_tile(
                            run,
                            &chunk[..weights.len().min(HEADS * (c + 1)) - HEADS * c],
                            tile,
                            &mut slots[c * HEADS * w..][..HEADS * w],
                            &mut constants[c * HEADS * MAP_WORDS..][..HEADS * MAP_WORDS],
                            rounded,
                            quads,
                            ahead,
                        )
                    };
                }
            }
            let per_map = format.maps.channels / GROUP;
            for (h, acc) in accs.iter_mut().enumerate() {
                let acc = &mut acc[run.first..run.first + w];
                let (slots, constants) = (&slots[h * w..][..w], &constants[h * MAP_WORDS..]);
                for (g, (acc, slots)) in acc
                    .chunks_exact_mut(GROUP)
                    .zip(slots.chunks_exact(GROUP))
                    .enumerate()
                {
                    let constant = constants[g / per_map];
                    for (a, &x) in acc.iter_mut().zip(slots) {
                        *a += factor * (x + constant);
                    }
                }
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use super::super::kernels::{channel_maps, nibbles, round_weights, scaled_groups, Rounded};
    use super::{
        Ahead, CodeLayout, Interleaving, LevelFormat, GROUP, HEADS, INTERLEAVED_ROWS, MAP_WORDS,
        MAX_GROUPS, QUERY_MAP, TILE_ROWS,
    };
    use std::arch::x86_64::*;

    /// Up to four heads' i8 queries as the score kernel takes them.
    #[derive(Default)]
    pub struct Queries {
        /// Per head and 32-bit word of the i8 query, the word in every lane (at
        /// `h·width/4 + k`).
        words: Vec<__m256i>,
        /// Per group: per head `σ_g`, `−center·σ_g·Σ codes` and the exact `Σ q`.
        terms: Vec<[[f32; HEADS]; 3]>,
        /// The same per head over all groups, for rows with one map (one `σ` for all).
        totals: [[f32; HEADS]; 3],
    }

    impl Queries {
        /// Reads up to [`HEADS`] prepared queries of `format` whose slots begin `slots`
        /// values before their end, their scores to be multiplied by `factor`; missing heads
        /// are zero.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn fill(
            &mut self,
            format: &LevelFormat,
            queries: &[&[f32]],
            slots: usize,
            factor: f32,
        ) {
            // A table's levels are read less their center.
            let center = if format.table.is_some() {
                0.0
            } else {
                format.center()
            };
            let w = format.width;
            self.words.clear();
            self.words.resize(HEADS * w / 4, _mm256_setzero_si256());
            self.terms.clear();
            self.terms.resize(w / GROUP, [[0.0; HEADS]; 3]);
            self.totals = [[0.0; HEADS]; 3];
            for (h, query) in queries.iter().enumerate() {
                let s = &query[query.len() - slots..];
                for (word, x) in self.words[h * w / 4..].iter_mut().zip(&s[..w / 4]) {
                    *word = _mm256_set1_epi32(x.to_bits() as i32);
                }
                for (g, terms) in self.terms.iter_mut().enumerate() {
                    let map = &s[w / 4 + QUERY_MAP * g..];
                    let [sigma, sum, exact] = [map[0], map[1], map[2]].map(|x| factor * x);
                    for (i, x) in [sigma, -center * sum, exact].into_iter().enumerate() {
                        terms[i][h] = x;
                        self.totals[i][h] += x;
                    }
                }
                // One-map rows' queries have one σ for all groups: not a sum.
                self.totals[0][h] = factor * s[w / 4];
            }
        }

        /// Makes these the queries of up to [`HEADS`] heads for one block of KIVI's keys
        /// (`maps` its channels' `(scale, minimum)` f16 pairs) whose rows are `format`:
        /// `q'_c = q_c·scale_c` rounded to i8 per group ([`scaled_groups`]), and each head's
        /// `Σ_c q_c·(minimum_c + scale_c·center)` added to its first group's constant term, so
        /// that the score kernel adds it as it finishes the rows.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn fill_block(&mut self, format: &LevelFormat, queries: &[&[f32]], maps: &[u8]) {
            let (w, center) = (format.width, format.center());
            self.words.resize(HEADS * w / 4, _mm256_setzero_si256());
            self.words[queries.len() * w / 4..].fill(_mm256_setzero_si256());
            self.terms.clear();
            self.terms.resize(w / GROUP, [[0.0; HEADS]; 3]);
            // The i8 codes in channel order, then for nibbles each 8 bytes' even channels and
            // their odd ones (the low and the high nibbles' query words).
            let row_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let even_odd = _mm256_setr_epi8(
                0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, 0, 2, 4, 6, 1, 3, 5, 7, 8,
                10, 12, 14, 9, 11, 13, 15,
            );
            let mut bias = [_mm256_setzero_ps(); HEADS];
            for g in 0..w / GROUP {
                let maps = channel_maps(maps, g);
                let (sigmas, codes, sums) = scaled_groups(queries, g, &maps, center, &mut bias);
                for h in 0..queries.len() {
                    let (sigma, c) = (sigmas[h], codes[h]);
                    self.terms[g][0][h] = sigma;
                    self.terms[g][1][h] = -center * sigma * sums[h] as f32;
                    // |code| ≤ 127: the packs do not saturate.
                    let packed = _mm256_packs_epi16(
                        _mm256_packs_epi32(c[0], c[1]),
                        _mm256_packs_epi32(c[2], c[3]),
                    );
                    let mut bytes = _mm256_permutevar8x32_epi32(packed, row_order);
                    if format.code_bits() == 4 {
                        bytes = _mm256_shuffle_epi8(bytes, even_odd);
                    }
                    for (k, word) in self.words[h * w / 4 + 8 * g..][..8].iter_mut().enumerate() {
                        *word = _mm256_permutevar8x32_epi32(bytes, _mm256_set1_epi32(k as i32));
                    }
                }
            }
            for (h, b) in bias.into_iter().enumerate() {
                self.terms[0][1][h] += crate::simd::avx2::hsum(b);
            }
        }
    }

    /// Map word `k` of rows `t…t + 7` of a tile of `run`'s blocks, as f32; a table's scales
    /// times its unit.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn map_word(run: &Interleaving, tile: &[u8], k: usize, t: usize) -> __m256 {
        let block = tile.as_ptr().add(t / INTERLEAVED_ROWS * run.block_bytes());
        let at = block.add(run.maps_at + 2 * (INTERLEAVED_ROWS * k + t % INTERLEAVED_ROWS));
        let word = _mm256_cvtph_ps(_mm_loadu_si128(at as *const _));
        match run.format.table {
            Some(table) if k < run.format.maps() => _mm256_mul_ps(word, _mm256_set1_ps(table.unit)),
            _ => word,
        }
    }

    /// The format's table (levels less 128, as bytes) in both lanes, or zeros.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn table_of(format: &LevelFormat) -> __m256i {
        let levels = format.table.map_or([0; 16], |t| t.levels.map(|l| l as u8));
        _mm256_broadcastsi128_si256(_mm_loadu_si128(levels.as_ptr() as *const _))
    }

    /// Each head's 32-bit sums `sums[h]` plus the products of `levels` (i8, through a table)
    /// with `weights[h]` (i8) summed per 4 bytes: `vpmaddubsw` on the levels' magnitudes
    /// against the weights with their signs (pairs at most `2·128·127 < 2¹⁵`), widened.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add_signed(sums: &mut [__m256i; HEADS], levels: __m256i, weights: [__m256i; HEADS]) {
        let magnitudes = _mm256_abs_epi8(levels);
        for (sum, w) in sums.iter_mut().zip(weights) {
            let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(w, levels));
            *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        }
    }

    /// [`add_signed`] for `SIGNED` weights; weights ≥ 0 go into `vpmaddubsw` as its unsigned
    /// operand against the levels as they are (pairs at most `2·127·128 < 2¹⁵`), without the
    /// magnitudes and the signs.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add_levels<const SIGNED: bool>(
        sums: &mut [__m256i; HEADS],
        levels: __m256i,
        weights: [__m256i; HEADS],
    ) {
        if SIGNED {
            return add_signed(sums, levels, weights);
        }
        for (sum, w) in sums.iter_mut().zip(weights) {
            let pairs = _mm256_maddubs_epi16(w, levels);
            *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        }
    }

    /// Scores of up to four heads for a tile of `run`'s blocks (keys) into `out[h][t]`,
    /// stored or (`add`) added.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn score_tile(
        run: &Interleaving,
        q: &Queries,
        tile: &[u8],
        out: [*mut f32; HEADS],
        add: bool,
        ahead: &mut Ahead,
    ) {
        let format = &run.format;
        // A table of 1-bit codes (two levels) comes here read as its codes ([`as_read`]).
        debug_assert!(format.table.is_none() || format.code_bits() > 1);
        let one_map = format.maps.channels >= format.width;
        macro_rules! by_bits {
            ($one:literal, $min:literal) => {
                match (format.table.is_some(), format.code_bits()) {
                    (false, 4) => {
                        score_tile_as::<$one, $min, 4, false, false>(run, q, tile, out, add, ahead)
                    }
                    (false, 3) => {
                        score_tile_as::<$one, $min, 3, false, false>(run, q, tile, out, add, ahead)
                    }
                    (false, 2) => {
                        score_tile_as::<$one, $min, 2, false, false>(run, q, tile, out, add, ahead)
                    }
                    (false, _) => {
                        score_tile_as::<$one, $min, 1, false, false>(run, q, tile, out, add, ahead)
                    }
                    (true, 4) => {
                        score_tile_as::<$one, $min, 4, true, false>(run, q, tile, out, add, ahead)
                    }
                    (true, 3) => {
                        score_tile_as::<$one, $min, 3, true, false>(run, q, tile, out, add, ahead)
                    }
                    (true, _) => {
                        score_tile_as::<$one, $min, 2, true, false>(run, q, tile, out, add, ahead)
                    }
                }
            };
        }
        match (one_map, format.maps.min_at.is_some()) {
            (true, true) => by_bits!(true, true),
            (true, false) => by_bits!(true, false),
            (false, true) => by_bits!(false, true),
            (false, false) => by_bits!(false, false),
        }
    }

    /// Scores of up to four heads for a tile of rows in KIVI's key blocks (unit scales, the
    /// queries' `σ` per group, [`Queries::fill_block`]) into `out[h][t]`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn score_unit_tile(
        run: &Interleaving,
        q: &Queries,
        tile: &[u8],
        out: [*mut f32; HEADS],
        ahead: &mut Ahead,
    ) {
        // KIVI's 2- and 4-bit keys ([`super::takes_channel_blocks`]).
        match run.format.code_bits() {
            4 => score_tile_as::<false, false, 4, false, true>(run, q, tile, out, false, ahead),
            _ => score_tile_as::<false, false, 2, false, true>(run, q, tile, out, false, ahead),
        }
    }

    /// The `BITS`-bit codes (1 or 2) at bit `at` of each byte of `plane`, one per byte: a
    /// plane's cut.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn plane_codes<const BITS: usize>(plane: __m256i, at: usize) -> __m256i {
        let codes = _mm256_srl_epi16(plane, _mm_cvtsi32_si128(at as i32));
        _mm256_and_si256(codes, _mm256_set1_epi8((1 << BITS) - 1))
    }

    /// Cut `k` of a group's 1-bit codes, bits `4k…4k + 3` of each 32-bit word of `bits` (those
    /// of channels `4k…4k + 3`, as the query's word `k` holds them) one per byte: byte `k/2`
    /// of the word in its 4 bytes, each byte's own bit kept, and made 0 or 1.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bit_cut(bits: __m256i, k: usize) -> __m256i {
        // Byte `4d + k/2` into the 4 bytes of each word `d` of a 128-bit lane.
        let words = _mm256_setr_epi8(
            0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8,
            12, 12, 12, 12,
        );
        let spread = _mm256_shuffle_epi8(
            bits,
            _mm256_add_epi8(words, _mm256_set1_epi8((k / 2) as i8)),
        );
        let first = 4 * (k % 2);
        let own = _mm256_set1_epi32(i32::from_le_bytes([1, 2, 4, 8].map(|b| b << first)));
        _mm256_min_epu8(_mm256_and_si256(spread, own), _mm256_set1_epi8(1))
    }

    /// Cuts `2P` and `2P + 1` of 3-bit codes in triplets ([`super::Packing::Triplets`]),
    /// `byte(u)` the vector of byte `u` of the triplets: for `P < 3` bits 0–2 and 4–6 of
    /// byte `P` (a mask, a shift and a mask), for `P = 3` bits 3 and 7 of the three bytes
    /// merged into bits 1–3 and 5–7 (three masks, two shifts, two ors), then cut apart.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn triplet_cuts<const P: usize>(byte: impl Fn(usize) -> __m256i) -> [__m256i; 2] {
        let mask = |x: __m256i, m: u8| _mm256_and_si256(x, _mm256_set1_epi8(m as i8));
        let down = |x: __m256i, bits: i32| _mm256_srl_epi16(x, _mm_cvtsi32_si128(bits));
        // The two codes at bits `low…low + 2` and `low + 4…low + 6` of `whole`.
        let (whole, low) = if P < 3 {
            (byte(P), 0)
        } else {
            // Bit `2 − u` of the codes from byte `u`: bits 3 and 7 to 3 − u and 7 − u.
            let second = mask(down(byte(1), 1), 0x44);
            let third = mask(down(byte(2), 2), 0x22);
            let merged = _mm256_or_si256(mask(byte(0), 0x88), _mm256_or_si256(second, third));
            (merged, 1)
        };
        [mask(down(whole, low), 7), mask(down(whole, low + 4), 7)]
    }

    /// The map of each group of `format`'s channels, for the kernels' loops (a `div` per
    /// group in the scores' finish ran 0.5 times per row for q4_0).
    fn group_maps(format: &LevelFormat) -> [usize; MAX_GROUPS] {
        let per_map = format.maps.channels / GROUP;
        // Built without a division per group: it runs once per tile.
        let mut maps = [0; MAX_GROUPS];
        for g in per_map..MAX_GROUPS {
            maps[g] = maps[g - per_map] + 1;
        }
        maps
    }

    /// Groups whose integer sums [`score_tile_as`] keeps before it finishes them.
    const SPAN_GROUPS: usize = 8;

    /// [`score_tile`] for rows with one map or several (`ONE_MAP`), with minimums or without,
    /// and `BITS`-bit codes, without a table or through one (`TABLE`: 32-bit sums of the
    /// levels less 128 by [`add_signed`]); `UNIT`: rows without maps, scaled by 1.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn score_tile_as<
        const ONE_MAP: bool,
        const MIN: bool,
        const BITS: usize,
        const TABLE: bool,
        const UNIT: bool,
    >(
        run: &Interleaving,
        q: &Queries,
        tile: &[u8],
        out: [*mut f32; HEADS],
        add: bool,
        ahead: &mut Ahead,
    ) {
        let format = &run.format;
        let (w, count) = (format.width, format.maps());
        let group_maps = group_maps(format);
        let center = _mm256_set1_ps(format.center());
        let ones = _mm256_set1_epi16(1);
        let table = table_of(format);
        let words = q.words.as_ptr();
        let n = tile.len() / run.block_bytes() * INTERLEAVED_ROWS;
        // Groups under their maps' scales: their integer sums first, then their finish, a
        // span of groups at a time (finished group by group, the sums' registers spill;
        // 12-15% of q4_0's and int4-g64's scores). Unit scales finish as they go.
        let defer = !ONE_MAP && !UNIT;
        let mut wides = [[_mm256_setzero_si256(); HEADS]; SPAN_GROUPS];
        for t in (0..n).step_by(8) {
            ahead.rows(8);
            // Word `j` of the 8 rows (nibble word `j`, or plane `j mod BITS` of group
            // `j / BITS`) at `codes + 64j`.
            let codes = tile
                .as_ptr()
                .add(t / INTERLEAVED_ROWS * run.block_bytes() + run.codes_at)
                .add(4 * (t % INTERLEAVED_ROWS));
            let word = |j: usize| _mm256_loadu_si256(codes.add(64 * j) as *const _);
            let mut score = [_mm256_setzero_ps(); HEADS];
            let mut dots = [_mm256_setzero_si256(); HEADS];
            // Sums `wide` under map `m` and the query's terms `[σ, −centered, sums]` (of a
            // group, or the totals under one map) added into the scores.
            let finish = |m: usize,
                          terms: &[[f32; HEADS]; 3],
                          wide: &[__m256i; HEADS],
                          score: &mut [__m256; HEADS]| {
                let scale = if UNIT {
                    _mm256_set1_ps(1.0)
                } else {
                    map_word(run, tile, m, t)
                };
                let offset = if MIN {
                    _mm256_fmadd_ps(scale, center, map_word(run, tile, count + m, t))
                } else {
                    _mm256_setzero_ps()
                };
                let [sigma, less_centered, sums] = terms;
                for (h, score) in score.iter_mut().enumerate() {
                    let dot = _mm256_fmadd_ps(
                        _mm256_set1_ps(sigma[h]),
                        _mm256_cvtepi32_ps(wide[h]),
                        _mm256_set1_ps(less_centered[h]),
                    );
                    *score = _mm256_fmadd_ps(scale, dot, *score);
                    if MIN {
                        *score = _mm256_fmadd_ps(offset, _mm256_set1_ps(sums[h]), *score);
                    }
                }
            };
            for first in (0..w / GROUP).step_by(SPAN_GROUPS) {
                let span = first..(first + SPAN_GROUPS).min(w / GROUP);
                for g in span.clone() {
                    // Cut `k` of the group meets query word `8g + k`.
                    let mut sums = [_mm256_setzero_si256(); HEADS];
                    let mut add = |k: usize, codes: __m256i| {
                        let query = |h: usize| *words.add(h * w / 4 + 8 * g + k);
                        if TABLE {
                            let levels = _mm256_shuffle_epi8(table, codes);
                            add_signed(&mut sums, levels, std::array::from_fn(query));
                        } else {
                            for (h, sum) in sums.iter_mut().enumerate() {
                                let products = _mm256_maddubs_epi16(codes, query(h));
                                *sum = _mm256_add_epi16(*sum, products);
                            }
                        }
                    };
                    if BITS == 4 {
                        for j in 0..4 {
                            let [low, high] = nibbles(word(4 * g + j));
                            add(2 * j, low);
                            add(2 * j + 1, high);
                        }
                    } else if BITS == 3 {
                        let byte = |u: usize| word(3 * g + u);
                        let mut add_pair = |p: usize, [a, b]: [__m256i; 2]| {
                            add(2 * p, a);
                            add(2 * p + 1, b);
                        };
                        add_pair(0, triplet_cuts::<0>(byte));
                        add_pair(1, triplet_cuts::<1>(byte));
                        add_pair(2, triplet_cuts::<2>(byte));
                        add_pair(3, triplet_cuts::<3>(byte));
                    } else if BITS == 1 {
                        let bits = word(g);
                        for k in 0..8 {
                            add(k, bit_cut(bits, k));
                        }
                    } else {
                        let planes = [word(2 * g), word(2 * g + 1)];
                        for k in 0..8 {
                            add(k, plane_codes::<2>(planes[k / 4], 2 * (k % 4)));
                        }
                    }
                    let wide = if TABLE {
                        sums
                    } else {
                        sums.map(|s| _mm256_madd_epi16(s, ones))
                    };
                    if ONE_MAP {
                        dots = std::array::from_fn(|h| _mm256_add_epi32(dots[h], wide[h]));
                    } else if defer {
                        wides[g - first] = wide;
                    } else {
                        finish(group_maps[g], &q.terms[g], &wide, &mut score);
                    }
                }
                for g in span.filter(|_| defer) {
                    finish(group_maps[g], &q.terms[g], &wides[g - first], &mut score);
                }
            }
            if ONE_MAP {
                finish(0, &q.totals, &dots, &mut score);
            }
            for (o, s) in out.iter().zip(score) {
                let at = o.add(t);
                let s = if add {
                    _mm256_add_ps(_mm256_loadu_ps(at), s)
                } else {
                    s
                };
                _mm256_storeu_ps(at, s);
            }
        }
    }

    /// Per map, quad of a tile and head, the quad's 4 rounded weights in every lane.
    pub type QuadWeights = [[__m256i; HEADS]; TILE_ROWS / 4];

    /// Adds up to four heads' weighted sums of a tile of `run`'s blocks (values), `weights`
    /// one slice of the tile's rows per head: the rounded weights' integer sums scaled into
    /// `slots` (`width` per head, in channel order), and each map's constant into
    /// `constants` ([`MAP_WORDS`] per head). `rounded` and `quads` are scratch.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn sum_tile(
        run: &Interleaving,
        weights: &[&[f32]],
        tile: &[u8],
        slots: &mut [f32],
        constants: &mut [f32],
        rounded: &mut Rounded,
        quads: &mut Vec<QuadWeights>,
        ahead: &mut Ahead,
    ) {
        let format = &run.format;
        let n = tile.len() / run.block_bytes() * INTERLEAVED_ROWS;
        let word = |k: usize, t: usize| map_word(run, tile, k, t);
        // A table's levels are read less their center.
        let centered = format.table.is_some();
        round_weights(format, centered, weights, n, word, rounded);
        // The planes' sums read each quad's weights 16 times per 128 channels: broadcast once.
        let maps = if format.code_bits() < 4 {
            format.maps()
        } else {
            0
        };
        quads.resize(maps, [[_mm256_setzero_si256(); HEADS]; TILE_ROWS / 4]);
        for (m, quads) in quads.iter_mut().enumerate().take(maps) {
            for (q, quad) in quads.iter_mut().enumerate().take(n / 4) {
                for (h, x) in quad.iter_mut().enumerate() {
                    let four = rounded.weights[h][m].as_ptr().add(4 * q) as *const i32;
                    *x = _mm256_set1_epi32(four.read_unaligned());
                }
            }
        }
        let sums = Sums {
            run,
            tile,
            n,
            heads: weights.len(),
            rounded,
            quads,
        };
        // A table's levels meet the weights unsigned where no scale of the tile is negative
        // (TurboQuant's norms never are; iq4_nl's scales may be).
        let signed = centered && any_negative(rounded, weights.len(), format.maps());
        macro_rules! by_bits {
            ($table:literal, $signed:literal) => {
                match format.code_bits() {
                    4 => sums.nibbles::<$table, $signed>(slots, ahead),
                    3 => sums.triplets::<$table, $signed>(slots, ahead),
                    2 => sums.planes::<$table, $signed, 2>(slots, ahead),
                    _ => sums.planes::<$table, $signed, 1>(slots, ahead),
                }
            };
        }
        match (centered, signed) {
            (false, _) => by_bits!(false, true),
            (true, true) => by_bits!(true, true),
            (true, false) => by_bits!(true, false),
        }
        for (h, constants) in constants.chunks_exact_mut(MAP_WORDS).enumerate() {
            for (c, &x) in constants.iter_mut().zip(&rounded.constants[h]) {
                *c += x;
            }
        }
    }

    /// Whether any of the first `heads` heads' rounded weights under the first `maps` maps is
    /// negative (rows past a tile's end are 0). Two vectors per head and map: a byte-wise scan
    /// cost ~25 instructions per row.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn any_negative(rounded: &Rounded, heads: usize, maps: usize) -> bool {
        let mut signs = _mm256_setzero_si256();
        for maps_of_head in &rounded.weights[..heads] {
            for w in &maps_of_head[..maps] {
                for half in w.chunks_exact(32) {
                    let v = _mm256_loadu_si256(half.as_ptr() as *const _);
                    signs = _mm256_or_si256(signs, v);
                }
            }
        }
        _mm256_movemask_epi8(signs) != 0
    }

    /// What [`sum_tile`]'s integer sums read: a tile of `n` rows, `heads` of them present, and
    /// the rounding's steps and broadcast weights.
    struct Sums<'a> {
        run: &'a Interleaving,
        tile: &'a [u8],
        n: usize,
        heads: usize,
        rounded: &'a Rounded,
        quads: &'a [QuadWeights],
    }

    /// 16-bit pair sums added into 32-bit lanes, or (`WIDE`) 32-bit sums as they are.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widened<const WIDE: bool>(sum: __m256i) -> __m256i {
        if WIDE {
            sum
        } else {
            _mm256_madd_epi16(sum, _mm256_set1_epi16(1))
        }
    }

    /// Adds the 8 integer sums `sum` times `step` to the 8 values at `at`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add_scaled(at: *mut f32, sum: __m256i, step: f32) {
        let scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(step));
        _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), scaled));
    }

    impl Sums<'_> {
        /// Adds each head's `sums` of channels `channel…channel + 7` (16-bit pairs, or `WIDE`
        /// 32-bit) times map `m`'s step into `slots`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scale_into<const WIDE: bool>(
            &self,
            sums: &[__m256i; HEADS],
            m: usize,
            slots: &mut [f32],
            channel: usize,
        ) {
            let w = self.run.format.width;
            for (h, &sum) in sums.iter().enumerate().take(self.heads) {
                let at = slots.as_mut_ptr().add(h * w + channel);
                add_scaled(at, widened::<WIDE>(sum), self.rounded.steps[h][m]);
            }
        }

        /// 4-bit codes: per 8 stream bytes (16 channels) 8 quads at a time in 16 bits
        /// (`8·2·15·127 < 2¹⁵`), or through a table (`TABLE`) in 32 ([`add_levels`], `SIGNED`
        /// where the weights may be negative), added up over the tile in 32 bits and scaled
        /// once.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn nibbles<const TABLE: bool, const SIGNED: bool>(
            &self,
            slots: &mut [f32],
            ahead: &mut Ahead,
        ) {
            let table = table_of(&self.run.format);
            let (run, block_bytes) = (self.run, self.run.block_bytes());
            let stream = run.format.stream_bytes();
            let group_maps = group_maps(&run.format);
            let packed = matches!(run.format.codes, CodeLayout::Packed { .. });
            // Stream bytes `8i…8i + 7` of quad `q` of a block at `codes_at + 4q·stream + 32i`.
            let share = self.n.div_ceil(stream / 8);
            for i in 0..stream / 8 {
                ahead.rows(share);
                let m = group_maps[16 * i / GROUP];
                let at = self.tile.as_ptr().add(run.codes_at + 32 * i);
                // Lane `l` of the low (high) sums: stream position `16i + 2l` (`+ 1`).
                let mut tile_sums = [[_mm256_setzero_si256(); HEADS]; 2];
                for first in (0..self.n / INTERLEAVED_ROWS).step_by(2) {
                    let mut sums = [[_mm256_setzero_si256(); HEADS]; 2];
                    for b in first..(first + 2).min(self.n / INTERLEAVED_ROWS) {
                        for q in 0..4 {
                            let codes = at.add(b * block_bytes + 4 * q * stream);
                            let [low, high] = nibbles(_mm256_loadu_si256(codes as *const _));
                            let weight = |h: usize| {
                                let weights = self.rounded.weights[h][m].as_ptr();
                                let four = weights.add(16 * b + 4 * q) as *const i32;
                                _mm256_set1_epi32(four.read_unaligned())
                            };
                            if TABLE {
                                let weights: [__m256i; HEADS] = std::array::from_fn(weight);
                                for (sums, codes) in sums.iter_mut().zip([low, high]) {
                                    let levels = _mm256_shuffle_epi8(table, codes);
                                    add_levels::<SIGNED>(sums, levels, weights);
                                }
                            } else {
                                // Head by head: one broadcast weight live at a time.
                                let [lows, highs] = &mut sums;
                                for (h, (low_sum, high_sum)) in
                                    lows.iter_mut().zip(highs).enumerate()
                                {
                                    let w = weight(h);
                                    *low_sum =
                                        _mm256_add_epi16(*low_sum, _mm256_maddubs_epi16(low, w));
                                    *high_sum =
                                        _mm256_add_epi16(*high_sum, _mm256_maddubs_epi16(high, w));
                                }
                            }
                        }
                    }
                    for (tile_sums, sums) in tile_sums.iter_mut().zip(sums) {
                        for (t, s) in tile_sums.iter_mut().zip(sums) {
                            *t = _mm256_add_epi32(*t, widened::<TABLE>(s));
                        }
                    }
                }
                let w = run.format.width;
                let [lows, highs] = &tile_sums;
                for (h, (&low, &high)) in lows.iter().zip(highs).enumerate().take(self.heads) {
                    let at = slots.as_mut_ptr().add(h * w);
                    let step = self.rounded.steps[h][m];
                    if packed {
                        // Positions are channels: the lanes interleaved.
                        let a = _mm256_unpacklo_epi32(low, high);
                        let b = _mm256_unpackhi_epi32(low, high);
                        add_scaled(
                            at.add(16 * i),
                            _mm256_permute2x128_si256::<0x20>(a, b),
                            step,
                        );
                        add_scaled(
                            at.add(16 * i + 8),
                            _mm256_permute2x128_si256::<0x31>(a, b),
                            step,
                        );
                    } else {
                        // llama.cpp's blocks: each nibble's lanes are 8 channels in a row.
                        add_scaled(at.add(run.format.stream_channel(16 * i)), low, step);
                        add_scaled(at.add(run.format.stream_channel(16 * i + 1)), high, step);
                    }
                }
            }
        }

        /// Per slice of 64 channels, `passes` passes over the tile's quads: pass `p` sums
        /// `CUTS` vectors of 8 channels each, from `64s + channel(p)` on (`sums(s, p, m)`,
        /// `m` their map), and scales them into `slots`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn passes<const TABLE: bool, const CUTS: usize>(
            &self,
            passes: usize,
            channel: impl Fn(usize) -> usize,
            sums: impl Fn(usize, usize, usize) -> [[__m256i; HEADS]; CUTS],
            slots: &mut [f32],
            ahead: &mut Ahead,
        ) {
            let format = &self.run.format;
            let (group_maps, slices) = (group_maps(format), format.width / 64);
            let share = self.n.div_ceil(passes * slices);
            for s in 0..slices {
                for p in 0..passes {
                    ahead.rows(share);
                    let first = 64 * s + channel(p);
                    let m = group_maps[first / GROUP];
                    for (i, sums) in sums(s, p, m).iter().enumerate() {
                        self.scale_into::<TABLE>(sums, m, slots, first + 8 * i);
                    }
                }
            }
        }

        /// 1- or 2-bit codes (`BITS`) in bit planes: per 8 channels (a slice of 64, a half of
        /// its bytes, a bit pair or bit `j` of each byte) the whole tile's quads at once
        /// (`16·2·3·127 < 2¹⁵`). 2-bit codes: each quad's plane of bit pairs, the second quad's
        /// 64 bytes after the first's; 1-bit codes: one plane, the first quad's bits in the
        /// low nibbles. Through a table (`TABLE`), the sums are 32-bit ([`add_levels`],
        /// `SIGNED` as there).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn planes<const TABLE: bool, const SIGNED: bool, const BITS: usize>(
            &self,
            slots: &mut [f32],
            ahead: &mut Ahead,
        ) {
            // Pass `p`: half `p / 4` of the slice's bytes, bit pair or bit `p mod 4`.
            let channel = |p: usize| 16 * (p % 4) + 8 * (p / 4);
            let sums = |s: usize, p: usize, m: usize| {
                let at = 64 * BITS * s + 32 * (p / 4);
                self.tile_sums::<TABLE, SIGNED, 1>(at, m, |pair, q| {
                    let (plane, bit) = if BITS == 2 {
                        (pair.add(64 * q), 2 * (p % 4))
                    } else {
                        (pair, 4 * q + p % 4)
                    };
                    let plane = _mm256_loadu_si256(plane as *const _);
                    [plane_codes::<BITS>(plane, bit)]
                })
            };
            self.passes::<TABLE, 1>(8, channel, sums, slots, ahead);
        }

        /// 3-bit codes in triplets ([`Packing::Triplets`]): per slice of 64 channels and pair
        /// of cuts (8 channels each) the whole tile's quads at once (`16·2·7·127 < 2¹⁵`);
        /// through a table as [`Sums::planes`].
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn triplets<const TABLE: bool, const SIGNED: bool>(
            &self,
            slots: &mut [f32],
            ahead: &mut Ahead,
        ) {
            // Byte `u` of quad `q`'s triplets at `64u + 32q`.
            let byte = |pair: *const u8, q: usize| {
                move |u: usize| _mm256_loadu_si256(pair.add(64 * u + 32 * q) as *const _)
            };
            // Pass `p`: cuts `2p` and `2p + 1`, channels `16p…16p + 15` of the slice.
            let sums = |s: usize, p: usize, m: usize| {
                let at = 192 * s;
                match p {
                    0 => self.tile_sums::<TABLE, SIGNED, 2>(at, m, |pair, q| {
                        triplet_cuts::<0>(byte(pair, q))
                    }),
                    1 => self.tile_sums::<TABLE, SIGNED, 2>(at, m, |pair, q| {
                        triplet_cuts::<1>(byte(pair, q))
                    }),
                    2 => self.tile_sums::<TABLE, SIGNED, 2>(at, m, |pair, q| {
                        triplet_cuts::<2>(byte(pair, q))
                    }),
                    _ => self.tile_sums::<TABLE, SIGNED, 2>(at, m, |pair, q| {
                        triplet_cuts::<3>(byte(pair, q))
                    }),
                }
            };
            self.passes::<TABLE, 2>(4, |p| 16 * p, sums, slots, ahead);
        }

        /// Each head's sums over the tile of `CUTS` vectors of codes per quad, which
        /// `cut(pair, q)` makes for quad `q` of a pair from the pair's codes `at` bytes on,
        /// against map `m`'s weights: 16-bit sums of `vpmaddubsw`, or through a table
        /// (`TABLE`) 32-bit ones ([`add_levels`], `SIGNED` as there).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn tile_sums<const TABLE: bool, const SIGNED: bool, const CUTS: usize>(
            &self,
            at: usize,
            m: usize,
            cut: impl Fn(*const u8, usize) -> [__m256i; CUTS],
        ) -> [[__m256i; HEADS]; CUTS] {
            let table = table_of(&self.run.format);
            let (run, block_bytes) = (self.run, self.run.block_bytes());
            let pair_bytes = run.format.code_bits() as usize * run.format.width;
            let at = self.tile.as_ptr().add(run.codes_at + at);
            let weights = &self.quads[m];
            let mut sums = [[_mm256_setzero_si256(); HEADS]; CUTS];
            let mut add_block = |b: usize| {
                for pair in 0..2 {
                    let codes_of_pair = at.add(b * block_bytes + pair * pair_bytes);
                    for q in 0..2 {
                        let weights = &weights[4 * b + 2 * pair + q];
                        for (sums, codes) in sums.iter_mut().zip(cut(codes_of_pair, q)) {
                            if TABLE {
                                let levels = _mm256_shuffle_epi8(table, codes);
                                add_levels::<SIGNED>(sums, levels, *weights);
                            } else {
                                for (sum, w) in sums.iter_mut().zip(weights) {
                                    let products = _mm256_maddubs_epi16(codes, *w);
                                    *sum = _mm256_add_epi16(*sum, products);
                                }
                            }
                        }
                    }
                }
            };
            // A whole tile's blocks in a loop of constant length, which unrolls.
            let blocks = self.n / INTERLEAVED_ROWS;
            if blocks == TILE_ROWS / INTERLEAVED_ROWS {
                (0..TILE_ROWS / INTERLEAVED_ROWS).for_each(&mut add_block);
            } else {
                (0..blocks).for_each(&mut add_block);
            }
            sums
        }
    }
}
