//! The default group kernels. Codecs that describe their levels ([`Codec::level_format`],
//! [`Codec::level_segments`], and for scores [`Codec::channel_blocks`]) go to the integer
//! kernels of [`crate::levels`] where the CPU has them (AVX-512, or AVX2 for the row layout);
//! codecs whose rows the float kernels
//! read ([`Codec::row_format`]) go to those. Otherwise a run of blocks is decoded,
//! a few rows at a time, into a small f32 tile in the codec's working space
//! ([`Codec::decode_working`]), and the tile is scored and accumulated for every query head of
//! the group by the register-blocked float kernels of [`crate::simd`]. The tile holds at most
//! [`TILE_ROWS`] rows (or one block, if larger) and stays in the L1 cache; nothing the size of
//! the cache is ever decoded.

use crate::levels::LevelSegment;
use crate::simd::{axpy_rows_group, dot_rows_group, f32_bytes, Ahead, RowFormat};
use crate::Codec;
use std::cell::RefCell;

/// Rows decoded per tile (rounded up to whole blocks).
pub const TILE_ROWS: usize = 32;

thread_local! {
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f(first_row, tile)` for consecutive tiles of working rows decoded from `blocks`.
fn for_each_tile<C: Codec + ?Sized>(codec: &C, blocks: &[u8], mut f: impl FnMut(usize, &[f32])) {
    let (width, bt, bb) = (
        codec.working_len(),
        codec.block_tokens(),
        codec.block_bytes(),
    );
    let blocks_per_tile = (TILE_ROWS / bt).max(1);
    TILE.with(|tile| {
        let mut tile = tile.borrow_mut();
        tile.resize(blocks_per_tile * bt * width, 0.0);
        for (i, chunk) in blocks.chunks(blocks_per_tile * bb).enumerate() {
            let rows = chunk.len() / bb * bt;
            let decoded = &mut tile[..rows * width];
            codec.decode_working(chunk, decoded);
            f(i * blocks_per_tile * bt, decoded);
        }
    });
}

/// `f` of the runs of levels that `takes` accepts: the codec's level format as one run from
/// channel 0, or its runs.
fn with_runs<C: Codec + ?Sized, R>(
    codec: &C,
    takes: impl FnOnce(&[LevelSegment]) -> bool,
    f: impl FnOnce(&[LevelSegment]) -> R,
) -> Option<R> {
    let single = codec
        .level_format()
        .map(|format| LevelSegment { first: 0, format });
    let runs = match &single {
        Some(run) => std::slice::from_ref(run),
        None => codec.level_segments(),
    };
    takes(runs).then(|| f(runs))
}

/// Whether the AVX-512 integer kernels take `runs` (supported by contract): the CPU runs them
/// and there are runs.
fn avx512_takes(runs: &[LevelSegment]) -> bool {
    crate::levels::available() && !runs.is_empty()
}

/// [`Codec::score_group`] through decoded tiles.
pub fn score_group<C: Codec + ?Sized>(
    codec: &C,
    queries: &[&[f32]],
    blocks: &[u8],
    scores: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let integer = with_runs(codec, avx512_takes, |runs| {
        crate::levels::score_segments(runs, queries, blocks, scores, ahead)
    });
    if integer.is_some() {
        return;
    }
    let avx2 = with_runs(codec, crate::levels::avx2::takes_segments, |runs| {
        crate::levels::avx2::score_segments(runs, queries, blocks, scores, ahead)
    });
    if avx2.is_some() {
        return;
    }
    if let Some(layout) = codec
        .channel_blocks()
        .filter(|_| crate::levels::available())
    {
        return crate::levels::score_channel_blocks(&layout, queries, blocks, scores, ahead);
    }
    if let Some(layout) = codec
        .channel_blocks()
        .filter(crate::levels::avx2::takes_channel_blocks)
    {
        return crate::levels::avx2::score_channel_blocks(&layout, queries, blocks, scores, ahead);
    }
    if let Some(format) = codec.row_format() {
        // The rows' values only (a prepared query may carry more, for the codec's own kernels).
        let queries: Vec<&[f32]> = queries.iter().map(|q| &q[..codec.head_dim()]).collect();
        return dot_rows_group(format, &queries, blocks, scores, ahead);
    }
    let width = codec.working_len();
    let queries: Vec<&[f32]> = queries.iter().map(|q| &q[..width]).collect();
    for_each_tile(codec, blocks, |first, tile| {
        let rows = tile.len() / width;
        ahead.rows(rows);
        let mut out: Vec<&mut [f32]> = scores
            .iter_mut()
            .map(|s| &mut s[first..first + rows])
            .collect();
        dot_rows_group(
            RowFormat::F32,
            &queries,
            f32_bytes(tile),
            &mut out,
            &mut Ahead::none(),
        );
    });
}

/// [`Codec::accumulate_group`] through decoded tiles.
pub fn accumulate_group<C: Codec + ?Sized>(
    codec: &C,
    weights: &[&[f32]],
    blocks: &[u8],
    accs: &mut [&mut [f32]],
    ahead: &mut Ahead,
) {
    let integer = with_runs(codec, avx512_takes, |runs| {
        crate::levels::accumulate_segments(runs, weights, blocks, accs, ahead)
    });
    if integer.is_some() {
        return;
    }
    let avx2 = with_runs(codec, crate::levels::avx2::takes_segments, |runs| {
        crate::levels::avx2::accumulate_segments(runs, weights, blocks, accs, ahead)
    });
    if avx2.is_some() {
        return;
    }
    if let Some(format) = codec.row_format() {
        let mut accs: Vec<&mut [f32]> = accs
            .iter_mut()
            .map(|a| &mut a[..codec.head_dim()])
            .collect();
        return axpy_rows_group(format, weights, blocks, &mut accs, ahead);
    }
    let width = codec.working_len();
    let mut accs: Vec<&mut [f32]> = accs.iter_mut().map(|a| &mut a[..width]).collect();
    for_each_tile(codec, blocks, |first, tile| {
        let rows = tile.len() / width;
        ahead.rows(rows);
        let w: Vec<&[f32]> = weights.iter().map(|w| &w[first..first + rows]).collect();
        axpy_rows_group(
            RowFormat::F32,
            &w,
            f32_bytes(tile),
            &mut accs,
            &mut Ahead::none(),
        );
    });
}
