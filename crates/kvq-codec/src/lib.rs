//! # kvq-codec
//!
//! The quantization schemes of kvq's KV cache. A [`Codec`] turns a block of K or V rows
//! (`block_tokens × head_dim` f32 values) into a fixed number of bytes and back, and computes
//! attention's two inner loops directly on those bytes:
//!
//! * [`Codec::score`]: `q·k_t` for every key row of a run of encoded blocks;
//! * [`Codec::accumulate`]: `acc += Σ_t w_t·v_t` over a run of encoded value blocks.
//!
//! Neither writes decoded rows to memory. Their group forms ([`Codec::score_group`],
//! [`Codec::accumulate_group`]), which attention uses for the query heads that share a KV head,
//! decode at most a few dozen rows at a time into an L1-resident tile and run register-blocked
//! kernels on it, each row decoded once for the whole group: integer `vpdpbusd` kernels on
//! 8-bit levels where the codec has a [`levels::LevelFormat`] and the CPU has AVX-512 VNNI
//! ([`levels`]), float kernels otherwise ([`tile`]). A cache keeps such codecs in
//! [`interleaved`] blocks, 16 rows in the order the integer kernels read them.
//!
//! Codecs know nothing of models, files or threads: a codec
//! is built from a [`SchemeKind`] (parsed from the names of design.md §4.1), a head size, a
//! [`Role`] (keys or values) and optional [`Calibration`] data.
//!
//! Every codec reports its exact storage cost ([`Codec::bits_per_element`]), counting every scale,
//! minimum, norm, outlier index and value it stores.
//!
//! Non-finite input (NaN, ±inf) is rejected by [`Codec::encode`] with [`CodecError::NonFinite`]:
//! a KV row that holds one is a bug upstream, and no scheme can represent it faithfully.

pub mod bits;
pub mod float;
pub mod fp8;
pub mod ggml;
pub mod interleaved;
pub mod kivi;
pub mod levels;
pub mod lloyd_max;
pub mod normalized;
pub mod oaken;
pub mod registry;
pub mod rotation;
pub mod simd;
pub mod tile;
pub mod turbo;
pub mod uniform;

pub use registry::{build_codec, scheme_names, KvSpec, SchemeKind};

/// Whether a codec stores keys or values; several schemes treat them differently
/// (per-channel keys, per-token values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Key rows (scored against the query).
    Key,
    /// Value rows (accumulated with the softmax weights).
    Value,
}

/// Offline statistics for one layer and one role, as `kvq calibrate` records them.
/// Every field is optional: schemes that need one report a clear error when it is missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Calibration {
    /// Oaken's four thresholds for the 4/90/6 split.
    pub oaken_thresholds: Option<OakenThresholds>,
    /// FP8 scale (real value per FP8 unit) shared by every row of this layer and role.
    pub fp8_scale: Option<f32>,
    /// Typical absolute magnitude of each channel (length `head_dim`).
    pub channel_scales: Option<Vec<f32>>,
    /// Channels that carry outliers, most extreme first (TurboQuant's fractional rates).
    pub outlier_channels: Option<Vec<usize>>,
    /// Mean of each channel (length `head_dim`), the fixed offset that
    /// [`normalized::ChannelNorm`] subtracts before quantizing.
    pub channel_means: Option<Vec<f32>>,
    /// Asks [`build_codec`] to wrap the codec in [`normalized::ChannelNorm`] (centering by
    /// `channel_means`, scaling by the channels' standard deviation from `channel_scales` and
    /// `channel_means`). Set by the caller, not by a profile: `kvq --key-norm` sets it on the
    /// key side only.
    pub channel_norm: bool,
}

/// Oaken's per-layer thresholds on signed values: `lo_outer < lo_inner < hi_inner < hi_outer`.
/// Values `≤ lo_outer` or `≥ hi_outer` are outer outliers (4%), values strictly between
/// `lo_inner` and `hi_inner` are inner (6%), the rest is the middle group (90%).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OakenThresholds {
    /// 2% quantile.
    pub lo_outer: f32,
    /// 47% quantile.
    pub lo_inner: f32,
    /// 53% quantile.
    pub hi_inner: f32,
    /// 98% quantile.
    pub hi_outer: f32,
}

/// Errors a codec reports instead of panicking.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CodecError {
    /// An input row held NaN or ±inf.
    #[error("non-finite value {value} at row {row}, channel {channel}: KV rows must be finite")]
    NonFinite {
        /// Row within the block.
        row: usize,
        /// Channel within the row.
        channel: usize,
        /// The offending value.
        value: f32,
    },
    /// A scheme name that the registry does not know.
    #[error("unknown KV scheme '{name}'; known schemes: {known}")]
    UnknownScheme {
        /// The name given.
        name: String,
        /// Comma-separated list of valid names.
        known: String,
    },
    /// The scheme cannot be built for this head size.
    #[error("scheme {scheme} does not support head_dim {head_dim}: {why}")]
    UnsupportedHeadDim {
        /// Scheme name.
        scheme: String,
        /// Requested head size.
        head_dim: usize,
        /// Reason.
        why: String,
    },
    /// The scheme needs calibration data that was not given.
    #[error("scheme {scheme} needs calibration data ({what}); run `kvq calibrate --text FILE --out PROFILE` and pass `--profile PROFILE`")]
    MissingCalibration {
        /// Scheme name.
        scheme: String,
        /// What is missing.
        what: String,
    },
    /// Calibration data that cannot be used (wrong length, unordered thresholds, ...).
    #[error("invalid calibration for {scheme}: {why}")]
    InvalidCalibration {
        /// Scheme name.
        scheme: String,
        /// Reason.
        why: String,
    },
}

/// A KV-cache quantization scheme for one head size and role.
///
/// Layout contract: a block holds [`Codec::block_tokens`] rows in exactly
/// [`Codec::block_bytes`] bytes; a run of `n` blocks is `n · block_bytes` contiguous bytes, and
/// the fused kernels take such runs.
pub trait Codec: Send + Sync {
    /// The scheme's canonical name (as in design.md §4.1).
    fn name(&self) -> String;
    /// Elements per row.
    fn head_dim(&self) -> usize;
    /// Rows encoded together into one block (1 for per-token schemes).
    fn block_tokens(&self) -> usize;
    /// Exact bytes of one encoded block.
    fn block_bytes(&self) -> usize;
    /// Exact storage bits per element: every byte of a block, divided by its elements.
    fn bits_per_element(&self) -> f64 {
        (self.block_bytes() * 8) as f64 / (self.block_tokens() * self.head_dim()) as f64
    }
    /// Encodes `block_tokens × head_dim` row-major values into `out` (`block_bytes` long).
    fn encode(&self, rows: &[f32], out: &mut [u8]) -> Result<(), CodecError>;
    /// Decodes one block into `rows` (`block_tokens × head_dim`).
    fn decode(&self, block: &[u8], rows: &mut [f32]);
    /// Length of a prepared query (see [`Codec::prepare_query`]).
    fn query_len(&self) -> usize {
        self.head_dim()
    }
    /// Transforms a query once per step into the form [`Codec::score`] consumes
    /// (for example rotated); the default copies it.
    fn prepare_query(&self, query: &[f32], prepared: &mut [f32]) {
        prepared.copy_from_slice(query);
    }
    /// [`Codec::prepare_query`] for several queries at once: `queries` holds them one after
    /// another (`head_dim` each), `prepared` receives theirs (`query_len` each). The default
    /// prepares them one by one; codecs that rotate queries read their rotation once for all.
    fn prepare_queries(&self, queries: &[f32], prepared: &mut [f32]) {
        let (d, len) = (self.head_dim(), self.query_len());
        for (q, p) in queries.chunks_exact(d).zip(prepared.chunks_exact_mut(len)) {
            self.prepare_query(q, p);
        }
    }
    /// `scores[t] = q·k_t` for every row of the run of blocks in `blocks`;
    /// `scores.len() == blocks.len() / block_bytes · block_tokens`.
    fn score(&self, prepared_query: &[f32], blocks: &[u8], scores: &mut [f32]);
    /// [`Codec::score`] for several prepared queries at once — the query heads that share one
    /// KV head: `scores[h]` receives the scores of `queries[h]`. The default
    /// ([`tile::score_group`]) reads each row once for the whole group: on the integer
    /// kernels, on the float kernels ([`Codec::row_format`]), or decoded into a small
    /// working-space tile.
    /// `ahead` holds the bytes the caller reads next: kernels prefetch them as they go, and
    /// the caller prefetches what they leave ([`simd::Ahead::rest`]).
    fn score_group(
        &self,
        queries: &[&[f32]],
        blocks: &[u8],
        scores: &mut [&mut [f32]],
        ahead: &mut simd::Ahead,
    ) {
        tile::score_group(self, queries, blocks, scores, ahead);
    }
    /// How the codec's blocks keep per-channel maps for the integer score kernels
    /// ([`levels::ChannelBlocks`]; only supported ones), if they do.
    fn channel_blocks(&self) -> Option<levels::ChannelBlocks> {
        None
    }
    /// The row format in which the float kernels read the codec's blocks directly (one row
    /// per block; the first `head_dim` values of queries and accumulators, in the row's own
    /// space), if they do: the group kernels then convert the rows in registers instead of
    /// decoding tiles.
    fn row_format(&self) -> Option<simd::RowFormat> {
        None
    }
    /// Length of the accumulator [`Codec::accumulate`] works in.
    fn accumulator_len(&self) -> usize {
        self.head_dim()
    }
    /// `acc += Σ_t weights[t]·v_t` over every row of the run of blocks in `blocks`, in the
    /// codec's accumulator space; `weights.len()` equals the number of rows.
    fn accumulate(&self, weights: &[f32], blocks: &[u8], acc: &mut [f32]);
    /// [`Codec::accumulate`] for several weight rows at once (one per query head of a group):
    /// `accs[h] += Σ_t weights[h][t]·v_t`. The default reads the rows as
    /// [`Codec::score_group`] does ([`tile::accumulate_group`]), and prefetches `ahead` as it
    /// does.
    fn accumulate_group(
        &self,
        weights: &[&[f32]],
        blocks: &[u8],
        accs: &mut [&mut [f32]],
        ahead: &mut simd::Ahead,
    ) {
        tile::accumulate_group(self, weights, blocks, accs, ahead);
    }
    /// Width of the rows [`Codec::decode_working`] writes.
    fn working_len(&self) -> usize {
        self.head_dim()
    }
    /// Decodes a run of whole blocks into rows of the codec's working space,
    /// `working_len` values per row, such that `score(q)[t] == prepared_q[..working_len]·row_t`
    /// and `accumulate` adds `w·row_t` to `acc[..working_len]`. The default decodes to the
    /// values themselves, the working space of every codec whose prepared query and
    /// accumulator begin with the plain query and values; codecs that work in another space
    /// (rotated coordinates) override it. A codec whose scores or sums have terms outside
    /// its working space (a key mean) overrides the group kernels as well.
    fn decode_working(&self, blocks: &[u8], rows: &mut [f32]) {
        let per_block = self.block_tokens() * self.head_dim();
        for (block, out) in blocks
            .chunks_exact(self.block_bytes())
            .zip(rows.chunks_exact_mut(per_block))
        {
            self.decode(block, out);
        }
    }
    /// How the stored rows hold 8-bit levels, for the integer group kernels ([`levels`]):
    /// `None` (the default) keeps the float kernels. A codec returns only a format that is
    /// [`levels::LevelFormat::supported`], and then appends [`levels::finish_query`]'s slots
    /// to its prepared query.
    fn level_format(&self) -> Option<levels::LevelFormat> {
        None
    }
    /// For rows whose runs of channels hold different levels (TurboQuant's fractional rates),
    /// the runs, each read by the integer kernels on its own; empty (the default) otherwise.
    /// A codec returns runs only if every format is supported, and then appends
    /// [`levels::finish_segment_query`]'s slots to its prepared query.
    fn level_segments(&self) -> &[levels::LevelSegment] {
        &[]
    }
    /// Whether the rows of a block are encoded one at a time ([`Codec::encode_row`]): a cache
    /// then writes a block row by row and reads it partly written (the default: one-row
    /// blocks).
    fn writes_rows(&self) -> bool {
        self.block_tokens() == 1
    }
    /// Encodes row `t` of `block` in place, leaving its other rows as they are (codecs that
    /// [`Codec::writes_rows`]). The default encodes a one-row block.
    fn encode_row(&self, row: &[f32], t: usize, block: &mut [u8]) -> Result<(), CodecError> {
        assert!(
            self.block_tokens() == 1 && t == 0,
            "{} encodes whole blocks",
            self.name()
        );
        self.encode(row, block)
    }
    /// Turns an accumulator into output values (`head_dim` long); the default copies it.
    fn finish(&self, acc: &[f32], out: &mut [f32]) {
        out.copy_from_slice(&acc[..self.head_dim()]);
    }
    /// [`Codec::finish`] for several accumulators at once (`outs[h]` from `accs[h]`). The
    /// default finishes them one by one; codecs that rotate read their rotation once for all.
    fn finish_group(&self, accs: &[&[f32]], outs: &mut [&mut [f32]]) {
        for (acc, out) in accs.iter().zip(outs.iter_mut()) {
            self.finish(acc, out);
        }
    }
}

/// Returns the first non-finite value of `rows` as an error.
pub fn check_finite(rows: &[f32], head_dim: usize) -> Result<(), CodecError> {
    match rows.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(CodecError::NonFinite {
            row: i / head_dim,
            channel: i % head_dim,
            value: rows[i],
        }),
    }
}

/// An empty vector with `v`'s allocation, for elements of another lifetime (collecting the
/// emptied vector's iterator into one of the same layout reuses its buffer): lists of slices
/// rebuilt per span or block cost no allocation.
pub fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::StandardNormal;

    fn norm(v: &[f32]) -> f32 {
        v.iter().map(|x| x * x).sum::<f32>().sqrt()
    }

    /// Every scheme's fused `score` and `accumulate` give the same results on the vector paths
    /// as on the scalar ones ([`simd::force_scalar`]), within float rounding.
    #[test]
    fn vector_and_scalar_kernels_agree() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let calibration = Calibration {
            oaken_thresholds: Some(OakenThresholds {
                lo_outer: -2.0,
                lo_inner: -0.08,
                hi_inner: 0.08,
                hi_outer: 2.0,
            }),
            ..Default::default()
        };
        for name in scheme_names() {
            for head_dim in [64, 128, 256] {
                for role in [Role::Key, Role::Value] {
                    let kind = SchemeKind::parse(&name).unwrap();
                    let Ok(codec) = build_codec(kind, role, head_dim, &calibration, 5) else {
                        continue;
                    };
                    let tokens = 3 * codec.block_tokens();
                    let rows: Vec<f32> = (0..tokens * head_dim)
                        .map(|i| {
                            let g: f32 = rng.sample(StandardNormal);
                            g * if i % 7 == 3 { 6.0 } else { 1.0 }
                        })
                        .collect();
                    let per_block = codec.block_tokens() * head_dim;
                    let mut bytes = vec![0u8; 3 * codec.block_bytes()];
                    for (r, b) in rows
                        .chunks_exact(per_block)
                        .zip(bytes.chunks_exact_mut(codec.block_bytes()))
                    {
                        codec.encode(r, b).unwrap();
                    }
                    let mut decoded = vec![0.0f32; rows.len()];
                    for (b, r) in bytes
                        .chunks_exact(codec.block_bytes())
                        .zip(decoded.chunks_exact_mut(per_block))
                    {
                        simd::force_scalar(|| codec.decode(b, r));
                    }

                    let query: Vec<f32> =
                        (0..head_dim).map(|_| rng.sample(StandardNormal)).collect();
                    let mut prepared = vec![0.0f32; codec.query_len()];
                    codec.prepare_query(&query, &mut prepared);
                    let mut vector = vec![0.0f32; tokens];
                    let mut scalar = vec![0.0f32; tokens];
                    codec.score(&prepared, &bytes, &mut vector);
                    simd::force_scalar(|| codec.score(&prepared, &bytes, &mut scalar));
                    for (t, (v, s)) in vector.iter().zip(&scalar).enumerate() {
                        let k = &decoded[t * head_dim..(t + 1) * head_dim];
                        let tolerance = 1e-5 * (1.0 + norm(&prepared[..head_dim]) * norm(k));
                        assert!(
                            (v - s).abs() <= tolerance,
                            "{name} {role:?} {head_dim} score {t}: {v} {s}"
                        );
                    }

                    let weights: Vec<f32> = (0..tokens).map(|_| rng.gen_range(0.0..1.0)).collect();
                    let mut vector = vec![0.5f32; codec.accumulator_len()];
                    let mut scalar = vector.clone();
                    codec.accumulate(&weights, &bytes, &mut vector);
                    simd::force_scalar(|| codec.accumulate(&weights, &bytes, &mut scalar));
                    let largest = scalar.iter().fold(0.0f32, |m, a| m.max(a.abs()));
                    for (i, (v, s)) in vector.iter().zip(&scalar).enumerate() {
                        assert!(
                            (v - s).abs() <= 1e-5 * (1.0 + largest),
                            "{name} {role:?} {head_dim} accumulate {i}: {v} {s}"
                        );
                    }
                }
            }
        }
    }
}
