//! Codecs whose blocks are 16 rows of another codec in the integer kernels' order.
//!
//! A cache that attends on the integer kernels ([`crate::levels`]) spends a good part of their
//! time rearranging rows: the score kernel transposes 16 rows' code streams as 32-bit words,
//! the sums interleave 4 rows byte-wise, and both gather each row's scales. [`interleave`]
//! wraps a codec whose rows those kernels read in an [`Interleaved`] codec that stores
//! [`INTERLEAVED_ROWS`] of its rows as one block, their bits permuted into the order the
//! kernel of the role reads ([`Interleaving`]): keys for the scores, values for the sums (whole
//! bytes, but for the bit planes of 2- and 3-bit codes). The rows' bits, their values and the
//! kernels' results are those of the wrapped codec; only their order in memory changes. Rows are still encoded one at a time
//! ([`Codec::encode_row`]), so a cache writes each token into its block as it comes.

use crate::levels::{self, Interleaving, KernelOrder, INTERLEAVED_ROWS};
use crate::{check_finite, simd::Ahead, Codec, CodecError, Role};
use std::cell::RefCell;

thread_local! {
    /// Rows put back in the wrapped codec's order, for the paths without kernels.
    static ROWS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `codec` in interleaved blocks laid out for `role`'s kernel, if the integer kernels read
/// its rows (one row per block, one [`levels::LevelFormat`] or runs of them); otherwise
/// `codec` itself.
pub fn interleave(codec: Box<dyn Codec>, role: Role) -> Box<dyn Codec> {
    match runs(codec.as_ref(), role) {
        Some(runs) => Box::new(Interleaved::new(codec, runs)),
        None => codec,
    }
}

/// How [`interleave`] lays out `codec`'s rows for `role`'s kernel: its level format as one
/// run from channel 0, or its runs ([`Interleaving::of_runs`]); `None` where it does not.
pub fn runs(codec: &dyn Codec, role: Role) -> Option<Vec<Interleaving>> {
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
    (codec.block_tokens() == 1 && !runs.is_empty())
        .then(|| Interleaving::of_runs(runs, order))
        .flatten()
}

/// A codec's rows, [`INTERLEAVED_ROWS`] to a block, in the order of its runs' [`Interleaving`]s.
pub struct Interleaved {
    inner: Box<dyn Codec>,
    /// The runs of the rows' channels (one for a single level format).
    runs: Vec<Interleaving>,
    /// Where each byte of a block's rows (row after row) goes in the block.
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
    /// `inner`'s rows in the blocks of `runs` ([`runs`] of `inner`).
    pub fn new(inner: Box<dyn Codec>, runs: Vec<Interleaving>) -> Self {
        let mut bit_targets = vec![0u32; 8 * runs[0].block_bytes()];
        for (i, source) in Interleaving::bit_sources(&runs).into_iter().enumerate() {
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
            runs,
            targets,
        }
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
        INTERLEAVED_ROWS
    }

    fn block_bytes(&self) -> usize {
        self.runs[0].block_bytes()
    }

    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError> {
        let (d, row_bytes) = (self.head_dim(), self.runs[0].format.row_bytes);
        // Checked here so that an error names the row of the block.
        check_finite(rows, d)?;
        let mut encoded = vec![0u8; self.block_bytes()];
        for (row, bytes) in rows
            .chunks_exact(d)
            .zip(encoded.chunks_exact_mut(row_bytes))
        {
            self.inner.encode(row, bytes)?;
        }
        self.scatter(&encoded, 0, out);
        Ok(())
    }

    fn decode(&self, block: &[u8], rows: &mut [f32]) {
        let (d, row_bytes) = (self.head_dim(), self.runs[0].format.row_bytes);
        self.with_rows(block, |bytes| {
            for (row, out) in bytes.chunks_exact(row_bytes).zip(rows.chunks_exact_mut(d)) {
                self.inner.decode(row, out);
            }
        });
    }

    fn query_len(&self) -> usize {
        self.inner.query_len()
    }

    fn prepare_query(&self, query: &[f32], prepared: &mut [f32]) {
        self.inner.prepare_query(query, prepared);
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
        if levels::available() && self.runs[0].order == KernelOrder::Scores {
            levels::score_interleaved(&self.runs, queries, blocks, scores, ahead);
        } else {
            self.with_rows(blocks, |rows| {
                self.inner.score_group(queries, rows, scores, ahead)
            });
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
        if levels::available() && self.runs[0].order == KernelOrder::Sums {
            levels::accumulate_interleaved(&self.runs, weights, blocks, accs, ahead);
        } else {
            self.with_rows(blocks, |rows| {
                self.inner.accumulate_group(weights, rows, accs, ahead)
            });
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

    fn writes_rows(&self) -> bool {
        true
    }

    fn encode_row(&self, row: &[f32], t: usize, block: &mut [u8]) -> Result<(), CodecError> {
        let row_bytes = self.runs[0].format.row_bytes;
        let mut encoded = vec![0u8; row_bytes];
        self.inner.encode(row, &mut encoded)?;
        self.scatter(&encoded, t * row_bytes, block);
        Ok(())
    }
}
