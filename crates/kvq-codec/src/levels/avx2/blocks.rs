//! The AVX2 kernels on interleaved blocks ([`Interleaving`], `crate::interleaved`) of 4-bit
//! codes without a table (`q4_0`, `q4_1`, `int4-g*`). The blocks hold each kernel's vectors
//! as it reads them, so that no row's bytes are rearranged and no score is reduced across
//! lanes:
//!
//! * Scores (keys, [`KernelOrder::Scores`]): a vector holds one 32-bit code word of 8 rows;
//!   `vpmaddubsw` multiplies its low and its high nibbles by the query's words broadcast, the
//!   16-bit sums add up over a group (4 words: `8·2·15·127 < 2¹⁵`) before `vpmaddwd` widens
//!   them, and each lane ends as one row's score, finished and stored 8 rows at a time.
//! * Sums (values, [`KernelOrder::Sums`]): a vector holds 8 stream bytes of a quad of rows;
//!   against the quad's 4 rounded weights broadcast, `vpmaddubsw` adds two rows' products per
//!   channel, the 16-bit sums add up over 8 quads, and each head's float sums are kept in the
//!   kernel's slot order until the call's end puts them in channel order.
//!
//! The roundings are the row kernels' ([`super`]): the query's i8 copy, and per tile of
//! [`TILE_ROWS`] rows, head and map the weights times the rows' scales rounded to i8.

use super::{available, path, Path, HEADS};
use crate::levels::{
    run_slots, Interleaving, KernelOrder, LevelFormat, GROUP, INTERLEAVED_ROWS, MAP_WORDS,
    QUERY_MAP, TILE_ROWS,
};
use crate::simd::Ahead;
use std::cell::RefCell;

/// Whether these kernels read blocks of `runs` in place: [`available`], and every run's format
/// has 4-bit codes without a table.
pub fn takes(runs: &[Interleaving]) -> bool {
    available()
        && !runs.is_empty()
        && runs
            .iter()
            .all(|r| r.format.supported() && path(&r.format) == Some(Path::Nibbles))
}

/// A thread's scratch: the score kernel's queries (per [`HEADS`] heads), the sums kernel's
/// float sums (per head `width` slots) and the constants each head's map adds to its channels.
#[derive(Default)]
struct Scratch {
    #[cfg(target_arch = "x86_64")]
    queries: Vec<kernels::Queries>,
    /// A tile's rounded weights.
    #[cfg(target_arch = "x86_64")]
    rounded: super::kernels::Rounded,
    slots: Vec<f32>,
    constants: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Bytes of a tile's whole blocks.
fn tile_bytes(run: &Interleaving) -> usize {
    TILE_ROWS / INTERLEAVED_ROWS * run.block_bytes()
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
    assert!(takes(runs) && runs.iter().all(|r| r.order == KernelOrder::Scores));
    let block_bytes = runs[0].block_bytes();
    assert!(blocks.len().is_multiple_of(block_bytes));
    let rows = blocks.len() / block_bytes * INTERLEAVED_ROWS;
    assert!(queries.len() == scores.len() && scores.iter().all(|s| s.len() >= rows));
    let slots = run_slots(runs.iter().map(|r| r.format.width));
    #[cfg(target_arch = "x86_64")]
    SCRATCH.with(|scratch| {
        let prepared = &mut scratch.borrow_mut().queries;
        prepared.resize_with(queries.len().div_ceil(HEADS), Default::default);
        for (k, (run, slots)) in runs.iter().zip(slots).enumerate() {
            assert!(queries.iter().all(|q| q.len() >= slots));
            for (q, chunk) in prepared.iter_mut().zip(queries.chunks(HEADS)) {
                // SAFETY: `takes` checked the CPU; each query holds its `slots`.
                unsafe { q.fill(&run.format, chunk, slots) };
            }
            // Where the scores of absent heads go.
            let mut sink = [0f32; TILE_ROWS];
            for (i, tile) in blocks.chunks(tile_bytes(run)).enumerate() {
                let (first, n) = (i * TILE_ROWS, tile.len() / block_bytes * INTERLEAVED_ROWS);
                for (c, q) in prepared.iter().enumerate() {
                    let mut out = [sink.as_mut_ptr(); HEADS];
                    for (o, s) in out.iter_mut().zip(&mut scores[c * HEADS..]) {
                        *o = s[first..first + n].as_mut_ptr();
                    }
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

/// [`crate::levels::accumulate_interleaved`] with these kernels: each run adds into its
/// channels. Prefetches `ahead` as it goes.
pub fn accumulate_interleaved(
    runs: &[Interleaving],
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    assert!(takes(runs) && runs.iter().all(|r| r.order == KernelOrder::Sums));
    let block_bytes = runs[0].block_bytes();
    assert!(blocks.len().is_multiple_of(block_bytes));
    let rows = blocks.len() / block_bytes * INTERLEAVED_ROWS;
    assert!(weights.len() == accs.len() && weights.iter().all(|w| w.len() >= rows));
    #[cfg(target_arch = "x86_64")]
    SCRATCH.with(|scratch| {
        let Scratch {
            slots,
            constants,
            rounded,
            ..
        } = &mut *scratch.borrow_mut();
        let heads = weights.len().next_multiple_of(HEADS);
        for run in runs {
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
                            ahead,
                        )
                    };
                }
            }
            // Slot `16i + 8·nibble + l`: the low (0) or high (1) nibble of stream byte
            // `8i + l`, in group `i / 2`.
            let per_map = format.maps.channels / GROUP;
            for (h, acc) in accs.iter_mut().enumerate() {
                let acc = &mut acc[run.first..run.first + w];
                let constants = &constants[h * MAP_WORDS..];
                for (i, slots) in slots[h * w..][..w].chunks_exact(16).enumerate() {
                    let constant = constants[i / 2 / per_map];
                    for (s, &x) in slots.iter().enumerate() {
                        let position = 16 * i + 2 * (s % 8) + s / 8;
                        acc[format.stream_channel(position)] += x + constant;
                    }
                }
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use super::super::kernels::{nibbles, round_weights, Rounded};
    use super::{
        Ahead, Interleaving, LevelFormat, GROUP, HEADS, INTERLEAVED_ROWS, MAP_WORDS, QUERY_MAP,
    };
    use std::arch::x86_64::*;

    /// Up to four heads' i8 queries as the score kernel takes them.
    #[derive(Default)]
    pub struct Queries {
        /// Per head and 32-bit word of the i8 query, the word in every lane (at
        /// `h·width/4 + k`).
        words: Vec<__m256i>,
        /// Per group: per head `σ_g`, `center·σ_g·Σ codes` and the exact `Σ q`.
        terms: Vec<[[f32; HEADS]; 3]>,
        /// The same per head over all groups, for rows with one map (one `σ` for all).
        totals: [[f32; HEADS]; 3],
    }

    impl Queries {
        /// Reads up to [`HEADS`] prepared queries of `format` whose slots begin `slots`
        /// values before their end; missing heads are zero.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn fill(&mut self, format: &LevelFormat, queries: &[&[f32]], slots: usize) {
            let (w, center) = (format.width, format.center());
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
                    for (i, x) in [map[0], center * map[1], map[2]].into_iter().enumerate() {
                        terms[i][h] = x;
                        self.totals[i][h] += x;
                    }
                }
                // One-map rows' queries have one σ for all groups: not a sum.
                self.totals[0][h] = s[w / 4];
            }
        }
    }

    /// Map word `k` of rows `t…t + 7` of a tile of `run`'s blocks, as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn map_word(run: &Interleaving, tile: &[u8], k: usize, t: usize) -> __m256 {
        let block = tile.as_ptr().add(t / INTERLEAVED_ROWS * run.block_bytes());
        let at = block.add(run.maps_at + 2 * (INTERLEAVED_ROWS * k + t % INTERLEAVED_ROWS));
        _mm256_cvtph_ps(_mm_loadu_si128(at as *const _))
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
        let one_map = format.maps.channels >= format.width;
        match (one_map, format.maps.min_at.is_some()) {
            (true, true) => score_tile_as::<true, true>(run, q, tile, out, add, ahead),
            (true, false) => score_tile_as::<true, false>(run, q, tile, out, add, ahead),
            (false, true) => score_tile_as::<false, true>(run, q, tile, out, add, ahead),
            (false, false) => score_tile_as::<false, false>(run, q, tile, out, add, ahead),
        }
    }

    /// [`score_tile`] for rows with one map or several (`ONE_MAP`), with minimums or without.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn score_tile_as<const ONE_MAP: bool, const MIN: bool>(
        run: &Interleaving,
        q: &Queries,
        tile: &[u8],
        out: [*mut f32; HEADS],
        add: bool,
        ahead: &mut Ahead,
    ) {
        let format = &run.format;
        let (w, count) = (format.width, format.maps());
        let per_map = format.maps.channels / GROUP;
        let center = _mm256_set1_ps(format.center());
        let ones = _mm256_set1_epi16(1);
        let words = q.words.as_ptr();
        let n = tile.len() / run.block_bytes() * INTERLEAVED_ROWS;
        for t in (0..n).step_by(8) {
            ahead.rows(8);
            // Word `j` of the 8 rows at `codes + 64j`.
            let codes = tile
                .as_ptr()
                .add(t / INTERLEAVED_ROWS * run.block_bytes() + run.codes_at)
                .add(4 * (t % INTERLEAVED_ROWS));
            let mut score = [_mm256_setzero_ps(); HEADS];
            let mut dots = [_mm256_setzero_si256(); HEADS];
            for g in 0..w / GROUP {
                let mut sums = [_mm256_setzero_si256(); HEADS];
                for j in 4 * g..4 * g + 4 {
                    let [low, high] = nibbles(_mm256_loadu_si256(codes.add(64 * j) as *const _));
                    for (h, sum) in sums.iter_mut().enumerate() {
                        let word = words.add(h * w / 4 + 2 * j);
                        let products = _mm256_add_epi16(
                            _mm256_maddubs_epi16(low, *word),
                            _mm256_maddubs_epi16(high, *word.add(1)),
                        );
                        *sum = _mm256_add_epi16(*sum, products);
                    }
                }
                let wide = sums.map(|s| _mm256_madd_epi16(s, ones));
                if ONE_MAP {
                    dots = std::array::from_fn(|h| _mm256_add_epi32(dots[h], wide[h]));
                } else {
                    let m = g / per_map;
                    let scale = map_word(run, tile, m, t);
                    let offset = if MIN {
                        _mm256_fmadd_ps(scale, center, map_word(run, tile, count + m, t))
                    } else {
                        _mm256_setzero_ps()
                    };
                    let [sigma, centered, sums] = &q.terms[g];
                    for (h, score) in score.iter_mut().enumerate() {
                        let dot = _mm256_fmsub_ps(
                            _mm256_set1_ps(sigma[h]),
                            _mm256_cvtepi32_ps(wide[h]),
                            _mm256_set1_ps(centered[h]),
                        );
                        *score = _mm256_fmadd_ps(scale, dot, *score);
                        if MIN {
                            *score = _mm256_fmadd_ps(offset, _mm256_set1_ps(sums[h]), *score);
                        }
                    }
                }
            }
            if ONE_MAP {
                let scale = map_word(run, tile, 0, t);
                let [sigma, centered, sums] = &q.totals;
                for (h, score) in score.iter_mut().enumerate() {
                    let dot = _mm256_fmsub_ps(
                        _mm256_set1_ps(sigma[h]),
                        _mm256_cvtepi32_ps(dots[h]),
                        _mm256_set1_ps(centered[h]),
                    );
                    *score = _mm256_mul_ps(scale, dot);
                    if MIN {
                        let offset = _mm256_fmadd_ps(scale, center, map_word(run, tile, 1, t));
                        *score = _mm256_fmadd_ps(offset, _mm256_set1_ps(sums[h]), *score);
                    }
                }
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

    /// Adds up to four heads' weighted sums of a tile of `run`'s blocks (values), `weights`
    /// one slice of the tile's rows per head: the rounded weights' integer sums, 8 quads at a
    /// time, scaled into `slots` (`width` per head, in the kernel's order), and each map's
    /// constant into `constants` ([`MAP_WORDS`] per head).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn sum_tile(
        run: &Interleaving,
        weights: &[&[f32]],
        tile: &[u8],
        slots: &mut [f32],
        constants: &mut [f32],
        rounded: &mut Rounded,
        ahead: &mut Ahead,
    ) {
        let format = &run.format;
        let n = tile.len() / run.block_bytes() * INTERLEAVED_ROWS;
        let word = |k: usize, t: usize| map_word(run, tile, k, t);
        round_weights(format, false, weights, n, word, rounded);
        let (w, stream) = (format.width, format.stream_bytes());
        let per_map = format.maps.channels / GROUP;
        let ones = _mm256_set1_epi16(1);
        // Stream bytes `8i…8i + 7` of rows `t…t + 3` at `quad(t) + 32i`.
        let quad = |t: usize| {
            tile.as_ptr()
                .add(t / INTERLEAVED_ROWS * run.block_bytes() + run.codes_at)
                .add(t % INTERLEAVED_ROWS / 4 * 4 * stream)
        };
        // The tile's prefetches, spread over its chunks.
        let share = n.div_ceil(stream / 8);
        for i in 0..stream / 8 {
            ahead.rows(share);
            let m = 16 * i / GROUP / per_map;
            for from in (0..n).step_by(32) {
                let mut sums = [[_mm256_setzero_si256(); 2]; HEADS];
                for t in (from..n.min(from + 32)).step_by(4) {
                    let v = _mm256_loadu_si256(quad(t).add(32 * i) as *const _);
                    let [low, high] = nibbles(v);
                    for (h, sums) in sums.iter_mut().enumerate() {
                        let four = rounded.weights[h][m].as_ptr().add(t) as *const i32;
                        let weights = _mm256_set1_epi32(four.read_unaligned());
                        sums[0] = _mm256_add_epi16(sums[0], _mm256_maddubs_epi16(low, weights));
                        sums[1] = _mm256_add_epi16(sums[1], _mm256_maddubs_epi16(high, weights));
                    }
                }
                for (h, sums) in sums.iter().enumerate().take(weights.len()) {
                    let step = _mm256_set1_ps(rounded.steps[h][m]);
                    for (nibble, &sum) in sums.iter().enumerate() {
                        let at = slots.as_mut_ptr().add(h * w + 16 * i + 8 * nibble);
                        let sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum, ones));
                        _mm256_storeu_ps(at, _mm256_fmadd_ps(sum, step, _mm256_loadu_ps(at)));
                    }
                }
            }
        }
        for (h, constants) in constants.chunks_exact_mut(MAP_WORDS).enumerate() {
            for (c, &x) in constants.iter_mut().zip(&rounded.constants[h]) {
                *c += x;
            }
        }
    }
}
