//! Codecs whose blocks are 16 rows of another codec in the integer kernels' order.
//!
//! A cache that attends on the integer kernels ([`crate::levels`]) spends a good part of their
//! time rearranging rows: the score kernel transposes 16 rows' code streams as 32-bit words,
//! the sums interleave 4 rows byte-wise, and both gather each row's scales. [`interleave`]
//! wraps a codec whose rows those kernels read in an [`Interleaved`] codec that stores
//! [`INTERLEAVED_ROWS`] of its rows as one block, their bits permuted into the order the
//! kernel of the role reads ([`Interleaving`]): keys for the scores, values for the sums (whole
//! bytes, but for the bit planes of 2-bit codes and the planes or triplets of 3-bit ones,
//! [`levels::Packing`]). Keys in per-channel blocks (KIVI's, [`ChannelBlocks`]) keep their
//! blocks and maps; their rows are interleaved 16 at a time for the score kernel. The rows'
//! bits, their values and the kernels' results are those of the wrapped codec; only their
//! order in memory changes. Rows of one-row codecs are still encoded one at a time
//! ([`Codec::encode_row`]), so a cache writes each token into its block as it comes.

use crate::levels::{
    self, avx2::blocks as avx2, ChannelBlocks, Interleaving, KernelOrder, INTERLEAVED_ROWS,
};
use crate::{check_finite, simd::Ahead, Codec, CodecError, Role};
use std::cell::RefCell;

thread_local! {
    /// Rows put back in the wrapped codec's order, for the paths without kernels.
    static ROWS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `codec` in interleaved blocks laid out for `role`'s kernel, if the integer kernels read
/// its blocks ([`Layout::of`]); otherwise `codec` itself.
pub fn interleave(codec: Box<dyn Codec>, role: Role) -> Box<dyn Codec> {
    match Layout::of(codec.as_ref(), role) {
        Some(layout) => Box::new(Interleaved::new(codec, layout)),
        None => codec,
    }
}

/// Whether this CPU's integer kernels read `codec`'s blocks for `role` in place once
/// [`interleave`]d (elsewhere they would read them through a copy in row order).
pub fn read_in_place(codec: &dyn Codec, role: Role) -> bool {
    match Layout::of(codec, role) {
        // As the kernels dispatch: the AVX-512 ones where they run, else the AVX2 ones.
        Some(Layout::Rows(runs)) => levels::takes_interleaved(&runs) || avx2::takes(&runs),
        Some(Layout::ChannelBlocks(blocks)) => {
            levels::available() || avx2::takes_channel_blocks(&blocks)
        }
        None => false,
    }
}

/// How [`interleave`] lays out a codec's blocks for a role's kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum Layout {
    /// One-row blocks, [`INTERLEAVED_ROWS`] to a block in the order of their runs'
    /// [`Interleaving`]s (one for a single level format).
    Rows(Vec<Interleaving>),
    /// Keys in per-channel blocks: the maps in place, the rows interleaved 16 at a time
    /// (`interleaved` set).
    ChannelBlocks(ChannelBlocks),
}

impl Layout {
    /// The layout of `codec`'s blocks for `role`'s kernel: one-row blocks with a level format
    /// (one run from channel 0) or runs of them ([`Interleaving::of_runs`]), and keys in
    /// per-channel blocks of whole 16 rows; `None` for the others.
    pub fn of(codec: &dyn Codec, role: Role) -> Option<Self> {
        let order = match role {
            Role::Key => KernelOrder::Scores,
            Role::Value => KernelOrder::Sums,
        };
        let single = codec
            .level_format()
            .map(|format| levels::LevelSegment { first: 0, format });
        let runs = match &single {
            Some(run) => std::slice::from_ref(run),
            None => codec.level_segments(),
        };
        if codec.block_tokens() == 1 && !runs.is_empty() {
            return Interleaving::of_runs(runs, order).map(Self::Rows);
        }
        let channel = codec.channel_blocks().map(|b| ChannelBlocks {
            interleaved: true,
            ..b
        });
        channel
            .filter(|b| role == Role::Key && b.supported())
            .map(Self::ChannelBlocks)
    }

    /// For each bit of a block (bit `8i + j` is bit `j` of byte `i`), the bit of the wrapped
    /// codec's blocks (one after another) that it holds.
    pub fn bit_sources(&self) -> Vec<u32> {
        match self {
            Self::Rows(runs) => Interleaving::bit_sources(runs),
            Self::ChannelBlocks(blocks) => blocks.bit_sources(),
        }
    }
}

/// A codec's blocks in a [`Layout`]: its rows, [`INTERLEAVED_ROWS`] to a block, in the order
/// of their runs' [`Interleaving`]s, or its per-channel key blocks with interleaved rows.
pub struct Interleaved {
    inner: Box<dyn Codec>,
    layout: Layout,
    /// Where each byte of the wrapped codec's blocks goes in a block.
    targets: Vec<Target>,
}

/// Where a byte of a block's rows goes: a whole byte of the block (codes of 4 bits, maps), or
/// 8 bits anywhere (bit planes of narrower codes).
#[derive(Clone, Copy)]
enum Target {
    Byte(u32),
    Bits([u32; 8]),
}

impl Interleaved {
    /// `inner`'s blocks in `layout` ([`Layout::of`] `inner`).
    pub fn new(inner: Box<dyn Codec>, layout: Layout) -> Self {
        let sources = layout.bit_sources();
        let mut bit_targets = vec![0u32; sources.len()];
        for (i, source) in sources.into_iter().enumerate() {
            bit_targets[source as usize] = i as u32;
        }
        let targets = bit_targets
            .chunks_exact(8)
            .map(|bits| {
                let whole = bits[0] % 8 == 0 && (0..8).all(|j| bits[j] == bits[0] + j as u32);
                if whole {
                    Target::Byte(bits[0] / 8)
                } else {
                    Target::Bits(std::array::from_fn(|j| bits[j]))
                }
            })
            .collect();
        Self {
            inner,
            layout,
            targets,
        }
    }

    /// The wrapped codec's blocks that one block holds.
    fn inner_blocks(&self) -> usize {
        self.block_tokens() / self.inner.block_tokens()
    }

    /// The rows of a run of blocks in the wrapped codec's order.
    fn rows_of(&self, blocks: &[u8], rows: &mut [u8]) {
        let block_bytes = self.block_bytes();
        assert_eq!(rows.len(), blocks.len());
        for (block, out) in blocks
            .chunks_exact(block_bytes)
            .zip(rows.chunks_exact_mut(block_bytes))
        {
            for (row_byte, target) in out.iter_mut().zip(&self.targets) {
                *row_byte = match *target {
                    Target::Byte(at) => block[at as usize],
                    Target::Bits(bits) => bits.iter().enumerate().fold(0, |byte, (j, &at)| {
                        byte | ((block[at as usize / 8] >> (at % 8)) & 1) << j
                    }),
                };
            }
        }
    }

    /// Writes `bytes`, the rows' bytes from byte `first` on, into their places in `block`.
    fn scatter(&self, bytes: &[u8], first: usize, block: &mut [u8]) {
        for (&byte, target) in bytes.iter().zip(&self.targets[first..]) {
            match *target {
                Target::Byte(at) => block[at as usize] = byte,
                Target::Bits(bits) => {
                    for (j, &at) in bits.iter().enumerate() {
                        let (i, mask) = (at as usize / 8, 1u8 << (at % 8));
                        if (byte >> j) & 1 == 1 {
                            block[i] |= mask;
                        } else {
                            block[i] &= !mask;
                        }
                    }
                }
            }
        }
    }

    /// Calls `f` with the rows of `blocks` in the wrapped codec's order.
    fn with_rows<R>(&self, blocks: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
        ROWS.with(|rows| {
            let mut rows = rows.borrow_mut();
            rows.resize(blocks.len(), 0);
            self.rows_of(blocks, &mut rows);
            f(&rows)
        })
    }
}

impl Codec for Interleaved {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn head_dim(&self) -> usize {
        self.inner.head_dim()
    }

    fn block_tokens(&self) -> usize {
        match &self.layout {
            Layout::Rows(_) => INTERLEAVED_ROWS,
            Layout::ChannelBlocks(blocks) => blocks.tokens,
        }
    }

    fn block_bytes(&self) -> usize {
        self.inner_blocks() * self.inner.block_bytes()
    }

    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        let d = self.head_dim();
        // Checked here so that an error names the row of the block.
        check_finite(rows, d)?;
        let mut encoded = vec![0u8; self.block_bytes()];
        for (block_rows, bytes) in rows
            .chunks_exact(self.inner.block_tokens() * d)
            .zip(encoded.chunks_exact_mut(self.inner.block_bytes()))
        {
            self.inner.encode(block_rows, bytes)?;
        }
        self.scatter(&encoded, 0, out);
        Ok(())
    }

    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        let d = self.head_dim();
        self.with_rows(block, |bytes| {
            for (inner_block, out) in bytes
                .chunks_exact(self.inner.block_bytes())
                .zip(rows.chunks_exact_mut(self.inner.block_tokens() * d))
            {
                self.inner.decode(inner_block, out);
            }
        });
    }

    fn query_len(&self) -> usize {
        self.inner.query_len()
    }

    fn prepare_query(&self, query: &[f32], prepared: &mut [f32]) {
        self.inner.prepare_query(query, prepared);
    }

    fn prepare_queries(&self, queries: &[f32], prepared: &mut [f32]) {
        self.inner.prepare_queries(queries, prepared);
    }

    fn score(&self, prepared_query: &[f32], blocks: &[u8], scores: &mut [f32]) {
        self.with_rows(blocks, |rows| {
            self.inner.score(prepared_query, rows, scores)
        });
    }

    fn score_group(
        &self,
        queries: &[&[f32]],
        blocks: &[u8],
        scores: &mut [&mut [f32]],
        ahead: &mut Ahead,
    ) {
        match &self.layout {
            Layout::Rows(runs)
                if levels::takes_interleaved(runs) && runs[0].order == KernelOrder::Scores =>
            {
                levels::score_interleaved(runs, queries, blocks, scores, ahead);
            }
            Layout::Rows(runs) if avx2::takes(runs) && runs[0].order == KernelOrder::Scores => {
                avx2::score_interleaved(runs, queries, blocks, scores, ahead);
            }
            Layout::ChannelBlocks(layout) if levels::available() => {
                levels::score_channel_blocks(layout, queries, blocks, scores, ahead);
            }
            Layout::ChannelBlocks(layout) if avx2::takes_channel_blocks(layout) => {
                avx2::score_channel_blocks(layout, queries, blocks, scores, ahead);
            }
            _ => self.with_rows(blocks, |rows| {
                self.inner.score_group(queries, rows, scores, ahead)
            }),
        }
    }

    fn channel_blocks(&self) -> Option<ChannelBlocks> {
        match &self.layout {
            Layout::ChannelBlocks(layout) => Some(*layout),
            Layout::Rows(_) => None,
        }
    }

    fn accumulator_len(&self) -> usize {
        self.inner.accumulator_len()
    }

    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]) {
        self.with_rows(blocks, |rows| self.inner.accumulate(weights, rows, acc));
    }

    fn accumulate_group(
        &self,
        weights: &[&[f32]],
        blocks: &[u8],
        accs: &mut [&mut [f32]],
        ahead: &mut Ahead,
    ) {
        match &self.layout {
            Layout::Rows(runs)
                if levels::takes_interleaved(runs) && runs[0].order == KernelOrder::Sums =>
            {
                levels::accumulate_interleaved(runs, weights, blocks, accs, ahead);
            }
            Layout::Rows(runs) if avx2::takes(runs) && runs[0].order == KernelOrder::Sums => {
                avx2::accumulate_interleaved(runs, weights, blocks, accs, ahead);
            }
            _ => self.with_rows(blocks, |rows| {
                self.inner.accumulate_group(weights, rows, accs, ahead)
            }),
        }
    }

    fn working_len(&self) -> usize {
        self.inner.working_len()
    }

    fn decode_working(&self, blocks: &[u8], rows: &mut [f32]) {
        self.with_rows(blocks, |bytes| self.inner.decode_working(bytes, rows));
    }

    fn finish(&self, acc: &[f32], out: &mut [f32]) {
        self.inner.finish(acc, out);
    }

    fn finish_group(&self, accs: &[&[f32]], outs: &mut [&mut [f32]]) {
        self.inner.finish_group(accs, outs);
    }

    fn writes_rows(&self) -> bool {
        matches!(self.layout, Layout::Rows(_))
    }

    fn encode_row(&self, row: &[f32], t: usize, block: &mut [u8]) -> Result<(), CodecError> {
        assert!(self.writes_rows(), "{} encodes whole blocks", self.name());
        let row_bytes = self.inner.block_bytes();
        let mut encoded = vec![0u8; row_bytes];
        self.inner.encode(row, &mut encoded)?;
        self.scatter(&encoded, t * row_bytes, block);
        Ok(())
    }
}
