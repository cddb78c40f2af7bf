//! The page pool, sequences and their block tables.

use crate::memory::{self, lcm};
use crate::{CacheError, LayerShape, Policy};
use kvq_codec::float::{FloatCodec, FloatFormat};
use kvq_codec::levels::INTERLEAVED_ROWS;
use kvq_codec::{build_codec, check_finite, Calibration, Codec, Role, SchemeKind};

/// Identifies a live sequence of a [`KvCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(pub u32);

/// Options shared by every layer of a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheOptions {
    /// Tokens per page; a multiple of every codec's `block_tokens`.
    pub page_tokens: usize,
    /// Newest tokens kept in 16-bit floats before they are encoded (0 allowed).
    pub hot_window: usize,
    /// First tokens of a sequence kept in 16-bit floats for good (attention sinks).
    pub sink_tokens: usize,
    /// Longest run of tokens appended in one call (the prefill chunk); sliding-window layers
    /// are sized for their window plus one such run.
    pub max_append_tokens: usize,
    /// Seed of the codecs' random rotations.
    pub seed: u64,
    /// Whether codecs whose rows the CPU's integer kernels read keep them in those kernels'
    /// order ([`kvq_codec::interleaved`], when pages hold whole interleaved blocks); off for
    /// pages that another reader takes as rows (the GPU kernels).
    pub interleave: bool,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            page_tokens: 64,
            hot_window: 0,
            sink_tokens: 0,
            max_append_tokens: 512,
            seed: 0x6b7671,
            interleave: true,
        }
    }
}

/// Asks Linux to back `arena` with transparent huge pages (2 MiB) before it is touched:
/// attention walks the cache span by span, one TLB entry per 4 KiB page otherwise. At 32K
/// context the fastest of three interleaved rounds moved 0–5% (kivi4 11%) and single rounds up
/// to 17% (bench/results/hugepages/). Advice only: where the kernel declines it, or off Linux,
/// nothing changes.
fn advise_huge_pages(arena: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let first = arena.as_ptr() as usize;
        let (start, end) = (
            first.next_multiple_of(PAGE),
            (first + arena.len()) / PAGE * PAGE,
        );
        if end > start {
            // SAFETY: the range lies within `arena`, and the advice changes none of its bytes.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = arena;
}

/// A run of consecutive positions of one layer, stored either compressed (in a page, or in
/// pages that follow each other in the arena, read with the layer's codecs) or in full
/// precision (sinks and hot window, read with the view's `full_codec`). The rows of one KV
/// head are contiguous.
#[derive(Clone, Copy)]
pub struct RowSpan<'a> {
    /// Position of the first row.
    pub first_pos: usize,
    /// Rows in the span.
    pub tokens: usize,
    rows: Rows<'a>,
}

#[derive(Clone, Copy)]
enum Rows<'a> {
    /// Pages `page..` of the pool's arenas (several after [`RowSpan::joined`]).
    Page {
        arenas: Arenas<'a>,
        page: usize,
        k_len: usize,
        v_len: usize,
    },
    Full {
        k: &'a [Vec<u8>],
        v: &'a [Vec<u8>],
        len: usize,
    },
}

impl<'a> RowSpan<'a> {
    /// A span of `tokens` full-precision rows of `row_bytes` each, kept per head in `k` and `v`.
    fn full(
        k: &'a [Vec<u8>],
        v: &'a [Vec<u8>],
        first_pos: usize,
        tokens: usize,
        row_bytes: usize,
    ) -> Self {
        let rows = Rows::Full {
            k,
            v,
            len: tokens * row_bytes,
        };
        Self {
            first_pos,
            tokens,
            rows,
        }
    }

    /// Whether the rows are encoded with the layer's codecs (else with `full_codec`).
    pub fn compressed(&self) -> bool {
        matches!(self.rows, Rows::Page { .. })
    }
    /// Encoded key rows of KV head `head`.
    pub fn keys(&self, head: usize) -> &'a [u8] {
        match self.rows {
            Rows::Page {
                arenas,
                page,
                k_len,
                ..
            } => &arenas.keys[arenas.at(head, page, arenas.k_head_bytes)..][..k_len],
            Rows::Full { k, len, .. } => &k[head][..len],
        }
    }
    /// Encoded value rows of KV head `head`.
    pub fn values(&self, head: usize) -> &'a [u8] {
        match self.rows {
            Rows::Page {
                arenas,
                page,
                v_len,
                ..
            } => &arenas.values[arenas.at(head, page, arenas.v_head_bytes)..][..v_len],
            Rows::Full { v, len, .. } => &v[head][..len],
        }
    }

    /// `spans` (consecutive spans of a view) with runs of compressed pages that follow each
    /// other in the pool joined, up to `max_tokens` rows per span (a single page may hold
    /// more): fewer, longer runs of contiguous bytes for the kernels. A sequence written alone
    /// gets its pages in order.
    pub fn joined(spans: &[RowSpan<'a>], max_tokens: usize) -> Vec<RowSpan<'a>> {
        let mut out: Vec<RowSpan<'a>> = Vec::with_capacity(spans.len());
        for span in spans {
            let joined = out.last().and_then(|last| last.join(span));
            match (out.last_mut(), joined) {
                (Some(last), Some(j)) if j.tokens <= max_tokens => *last = j,
                _ => out.push(*span),
            }
        }
        out
    }

    /// `self` and `next` as one span, when `next` continues it in positions and in the
    /// arenas: `self` ends a whole page and `next` starts on the page after it.
    fn join(&self, next: &RowSpan<'a>) -> Option<RowSpan<'a>> {
        let (
            Rows::Page {
                arenas,
                page,
                k_len,
                v_len,
            },
            Rows::Page {
                page: next_page,
                k_len: next_k,
                v_len: next_v,
                ..
            },
        ) = (self.rows, next.rows)
        else {
            return None;
        };
        let pages = k_len / arenas.k_head_bytes;
        let whole = k_len == pages * arenas.k_head_bytes && v_len == pages * arenas.v_head_bytes;
        (whole && next_page == page + pages && next.first_pos == self.first_pos + self.tokens)
            .then_some(RowSpan {
                first_pos: self.first_pos,
                tokens: self.tokens + next.tokens,
                rows: Rows::Page {
                    arenas,
                    page,
                    k_len: k_len + next_k,
                    v_len: v_len + next_v,
                },
            })
    }
}

/// A layer pool's arenas as spans read them. Each arena holds every KV head's blocks of
/// every page, head-major: the blocks of head `h`, page `p` start at
/// `(h·pages + p)·head_bytes`, so pages that follow each other in the pool follow each other
/// in every head's rows (attention reads such runs in one go: [`RowSpan::joined`]).
#[derive(Clone, Copy)]
struct Arenas<'a> {
    keys: &'a [u8],
    values: &'a [u8],
    pages: usize,
    k_head_bytes: usize,
    v_head_bytes: usize,
}

impl Arenas<'_> {
    /// Offset of the blocks of `head` in `page`, in an arena of `head_bytes` per page and head.
    fn at(&self, head: usize, page: usize, head_bytes: usize) -> usize {
        block_at(head, page, self.pages, head_bytes)
    }
}

/// Offset of the blocks of `head` in `page` in an arena of `pages` pages of `head_bytes` per
/// head (the layout of [`Arenas`]).
fn block_at(head: usize, page: usize, pages: usize, head_bytes: usize) -> usize {
    (head * pages + page) * head_bytes
}

/// What attention needs to read one layer of one sequence.
pub struct LayerView<'a> {
    /// Codec of the compressed keys.
    pub k_codec: &'a dyn Codec,
    /// Codec of the compressed values.
    pub v_codec: &'a dyn Codec,
    /// Codec of full-precision rows (sinks and hot window).
    pub full_codec: &'a dyn Codec,
    /// KV heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tokens written so far (positions `0..len`).
    pub len: usize,
    /// Rows the codecs keep together (a multiple of both codecs' block sizes): compressed spans
    /// hold whole blocks of it, the last one partly written where the codecs write rows one
    /// by one ([`kvq_codec::Codec::writes_rows`]; the rows past the span hold other bytes).
    pub block_tokens: usize,
    /// The stored rows, in position order; positions released by a sliding window are absent.
    pub spans: Vec<RowSpan<'a>>,
}

impl LayerView<'_> {
    /// The rows of KV head `head` in `span`, decoded: (keys, values), each
    /// `span.tokens × head_dim` values. For inspection, calibration and tests; attention reads
    /// the encoded bytes directly.
    pub fn decode_span(&self, span: &RowSpan, head: usize) -> (Vec<f32>, Vec<f32>) {
        let (k_codec, v_codec) = if span.compressed() {
            (self.k_codec, self.v_codec)
        } else {
            (self.full_codec, self.full_codec)
        };
        let decode = |codec: &dyn Codec, bytes: &[u8]| {
            let rows = bytes.len() / codec.block_bytes() * codec.block_tokens();
            let mut out = vec![0f32; rows * self.head_dim];
            for (block, dst) in bytes
                .chunks_exact(codec.block_bytes())
                .zip(out.chunks_exact_mut(codec.block_tokens() * self.head_dim))
            {
                codec.decode(block, dst);
            }
            out.truncate(span.tokens * self.head_dim);
            out
        };
        (
            decode(k_codec, span.keys(head)),
            decode(v_codec, span.values(head)),
        )
    }
}

/// One layer's pool of pages and its codecs.
pub struct LayerPool {
    shape: LayerShape,
    k_codec: Box<dyn Codec>,
    v_codec: Box<dyn Codec>,
    full_codec: FloatCodec,
    /// Tokens encoded together: whole blocks of codecs that encode blocks together, 1 where
    /// both write rows one by one ([`write_tokens`]).
    flush_tokens: usize,
    /// Rows the codecs keep together (a multiple of both codecs' block sizes).
    block_tokens: usize,
    page_tokens: usize,
    k_head_bytes: usize,
    v_head_bytes: usize,
    /// Key and value blocks of every page, head-major ([`Arenas`]).
    keys: Vec<u8>,
    values: Vec<u8>,
    refcount: Vec<u32>,
    free: Vec<u32>,
}

impl LayerPool {
    fn pages(&self) -> usize {
        self.refcount.len()
    }
    fn arenas(&self) -> Arenas<'_> {
        Arenas {
            keys: &self.keys,
            values: &self.values,
            pages: self.pages(),
            k_head_bytes: self.k_head_bytes,
            v_head_bytes: self.v_head_bytes,
        }
    }
    /// Allocated bytes of both arenas.
    fn arena_bytes(&self) -> usize {
        self.keys.len() + self.values.len()
    }
    fn full_row_bytes(&self) -> usize {
        self.full_codec.block_bytes()
    }
    fn release(&mut self, id: u32) {
        self.refcount[id as usize] -= 1;
        if self.refcount[id as usize] == 0 {
            self.free.push(id);
        }
    }
}

/// One layer of one sequence.
#[derive(Clone)]
struct SeqLayer {
    /// Tokens written.
    len: usize,
    /// Tokens encoded into pages (positions `sinks .. sinks + encoded`).
    encoded: usize,
    /// Pages in position order; `pages[0]` holds encoded tokens from `first_page * page_tokens`.
    pages: Vec<u32>,
    first_page: usize,
    /// Full-precision sink rows, per head: `sinks × row` bytes each.
    sink_k: Vec<Vec<u8>>,
    sink_v: Vec<Vec<u8>>,
    /// Full-precision rows not yet encoded (positions `sinks + encoded .. len`), per head.
    stage_k: Vec<Vec<u8>>,
    stage_v: Vec<Vec<u8>>,
}

/// The KV cache of a model: one pool per layer and the live sequences.
pub struct KvCache {
    layers: Vec<LayerPool>,
    options: CacheOptions,
    sequences: Vec<Option<Vec<SeqLayer>>>,
}

impl KvCache {
    /// Builds a cache for `shapes` with `policy`, sized for `batch` sequences of `ctx` tokens
    /// by the rules of [`memory`]. `calibration[l]` holds layer `l`'s (K, V) statistics
    /// (empty calibrations where none was given).
    pub fn new(
        shapes: &[LayerShape],
        policy: &Policy,
        calibration: &[(Calibration, Calibration)],
        options: CacheOptions,
        ctx: usize,
        batch: usize,
    ) -> Result<Self, CacheError> {
        let mut layers = Vec::with_capacity(shapes.len());
        for (l, shape) in shapes.iter().enumerate() {
            let mut pool = Self::empty_pool(l, shape, policy, calibration, &options)?;
            let pages = batch * memory::pages_per_sequence(shape, pool.flush_tokens, &options, ctx);
            let heads = shape.kv_heads;
            pool.keys = vec![0u8; pages * heads * pool.k_head_bytes];
            pool.values = vec![0u8; pages * heads * pool.v_head_bytes];
            advise_huge_pages(&mut pool.keys);
            advise_huge_pages(&mut pool.values);
            pool.refcount = vec![0; pages];
            pool.free = (0..pages as u32).rev().collect();
            layers.push(pool);
        }
        Ok(Self {
            layers,
            options,
            sequences: Vec::new(),
        })
    }

    fn empty_pool(
        l: usize,
        shape: &LayerShape,
        policy: &Policy,
        calibration: &[(Calibration, Calibration)],
        options: &CacheOptions,
    ) -> Result<LayerPool, CacheError> {
        shape.check(l)?;
        let schemes = policy
            .layers
            .get(l)
            .ok_or_else(|| CacheError::Config(format!("policy has no entry for layer {l}")))?;
        let none = (Calibration::default(), Calibration::default());
        let (k_cal, v_cal) = calibration.get(l).unwrap_or(&none);
        let seed = options.seed ^ (l as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let d = shape.head_dim;
        let k_codec = cache_codec(schemes.k, Role::Key, d, k_cal, seed, options)?;
        let v_codec = cache_codec(schemes.v, Role::Value, d, v_cal, seed ^ 1, options)?;
        let block_tokens = lcm(k_codec.block_tokens(), v_codec.block_tokens());
        if options.page_tokens == 0 || !options.page_tokens.is_multiple_of(block_tokens) {
            return Err(CacheError::Config(format!(
                "page size {} tokens is not a multiple of layer {l}'s codec block of {block_tokens} tokens",
                options.page_tokens
            )));
        }
        let flush_tokens = lcm(
            write_tokens(k_codec.as_ref()),
            write_tokens(v_codec.as_ref()),
        );
        let full_format = full_row_format(schemes.k, schemes.v);
        Ok(LayerPool {
            shape: *shape,
            k_head_bytes: head_page_bytes(k_codec.as_ref(), options.page_tokens),
            v_head_bytes: head_page_bytes(v_codec.as_ref(), options.page_tokens),
            k_codec,
            v_codec,
            full_codec: FloatCodec::new(full_format, shape.head_dim),
            flush_tokens,
            block_tokens,
            page_tokens: options.page_tokens,
            keys: Vec::new(),
            values: Vec::new(),
            refcount: Vec::new(),
            free: Vec::new(),
        })
    }

    /// The options the cache was built with.
    pub fn options(&self) -> &CacheOptions {
        &self.options
    }

    /// Layers in the cache.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Bytes the cache has allocated: every page of every pool, plus the full-precision rows
    /// (sinks and hot window) reserved for each live sequence.
    pub fn allocated_bytes(&self) -> usize {
        let pages: usize = self.layers.iter().map(LayerPool::arena_bytes).sum();
        let rows: usize = self
            .sequences
            .iter()
            .flatten()
            .map(|seq| {
                seq.iter()
                    .map(|sl| {
                        let cap = |v: &Vec<Vec<u8>>| v.iter().map(|r| r.capacity()).sum::<usize>();
                        cap(&sl.sink_k) + cap(&sl.sink_v) + cap(&sl.stage_k) + cap(&sl.stage_v)
                    })
                    .sum::<usize>()
            })
            .sum();
        pages + rows
    }

    /// Pages in use and pages in total, over all layers.
    pub fn page_usage(&self) -> (usize, usize) {
        let total: usize = self.layers.iter().map(LayerPool::pages).sum();
        let free: usize = self.layers.iter().map(|p| p.free.len()).sum();
        (total - free, total)
    }

    /// Starts an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        let layers = self
            .layers
            .iter()
            .map(|pool| {
                let heads = pool.shape.kv_heads;
                let row = pool.full_row_bytes();
                let sinks = self.options.sink_tokens * row;
                let stage = (self.options.hot_window + pool.flush_tokens) * row;
                SeqLayer {
                    len: 0,
                    encoded: 0,
                    pages: Vec::new(),
                    first_page: 0,
                    sink_k: (0..heads).map(|_| Vec::with_capacity(sinks)).collect(),
                    sink_v: (0..heads).map(|_| Vec::with_capacity(sinks)).collect(),
                    stage_k: (0..heads).map(|_| Vec::with_capacity(stage)).collect(),
                    stage_v: (0..heads).map(|_| Vec::with_capacity(stage)).collect(),
                }
            })
            .collect();
        self.insert_sequence(layers)
    }

    fn insert_sequence(&mut self, layers: Vec<SeqLayer>) -> SeqId {
        match self.sequences.iter().position(Option::is_none) {
            Some(i) => {
                self.sequences[i] = Some(layers);
                SeqId(i as u32)
            }
            None => {
                self.sequences.push(Some(layers));
                SeqId(self.sequences.len() as u32 - 1)
            }
        }
    }

    fn seq(&self, id: SeqId) -> Result<&Vec<SeqLayer>, CacheError> {
        self.sequences
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .ok_or(CacheError::UnknownSequence(id))
    }

    /// A new sequence that shares `id`'s pages (copy-on-write) and copies its unencoded rows.
    pub fn fork(&mut self, id: SeqId) -> Result<SeqId, CacheError> {
        let layers = self.seq(id)?.clone();
        for (pool, sl) in self.layers.iter_mut().zip(&layers) {
            for &p in &sl.pages {
                pool.refcount[p as usize] += 1;
            }
        }
        Ok(self.insert_sequence(layers))
    }

    /// Ends a sequence and returns its pages to the pools.
    pub fn release(&mut self, id: SeqId) -> Result<(), CacheError> {
        self.seq(id)?;
        let layers = self.sequences[id.0 as usize].take().expect("checked live");
        for (pool, sl) in self.layers.iter_mut().zip(layers) {
            for p in sl.pages {
                pool.release(p);
            }
        }
        Ok(())
    }

    /// Tokens written to `layer` of sequence `id`.
    pub fn len(&self, id: SeqId, layer: usize) -> Result<usize, CacheError> {
        Ok(self.seq(id)?[layer].len)
    }

    /// Appends `tokens` rows of keys and values (`tokens × kv_heads × head_dim`, token-major)
    /// to `layer` of sequence `id`, at the next positions. On error nothing is changed.
    pub fn append(
        &mut self,
        id: SeqId,
        layer: usize,
        k: &[f32],
        v: &[f32],
        tokens: usize,
    ) -> Result<(), CacheError> {
        self.seq(id)?;
        let pool = &mut self.layers[layer];
        let (heads, d) = (pool.shape.kv_heads, pool.shape.head_dim);
        if k.len() != tokens * heads * d || v.len() != k.len() {
            return Err(CacheError::Config(format!(
                "append of {tokens} tokens to layer {layer} needs {} values each for K and V, got {} and {}",
                tokens * heads * d,
                k.len(),
                v.len()
            )));
        }
        check_finite(k, d)?;
        check_finite(v, d)?;
        let opts = self.options;
        let sl = self.sequences[id.0 as usize]
            .as_mut()
            .expect("checked live")
            .get_mut(layer)
            .expect("layer");
        release_dead_pages(pool, sl, &opts);
        // Pages needed: new pages for the tokens that will be encoded, plus a copy of a shared
        // last page that would be written.
        let stored_after = (sl.len + tokens).saturating_sub(opts.sink_tokens);
        let encoded_after = flushable(stored_after, opts.hot_window, pool.flush_tokens);
        let pages_after = encoded_after.div_ceil(pool.page_tokens);
        let pages_now = sl.encoded.div_ceil(pool.page_tokens);
        let mut needed = pages_after - pages_now;
        let last_shared = !sl.encoded.is_multiple_of(pool.page_tokens)
            && encoded_after > sl.encoded
            && sl
                .pages
                .last()
                .is_some_and(|&p| pool.refcount[p as usize] > 1);
        needed += usize::from(last_shared);
        if needed > pool.free.len() {
            return Err(CacheError::Full {
                layer,
                pages: pool.pages(),
                page_tokens: pool.page_tokens,
            });
        }

        let mut row = vec![0u8; pool.full_row_bytes()];
        for t in 0..tokens {
            let into_sink = sl.len < opts.sink_tokens;
            for h in 0..heads {
                let at = (t * heads + h) * d;
                for (src, sink, stage) in [
                    (k, &mut sl.sink_k[h], &mut sl.stage_k[h]),
                    (v, &mut sl.sink_v[h], &mut sl.stage_v[h]),
                ] {
                    pool.full_codec.encode(&src[at..at + d], &mut row)?;
                    if into_sink { sink } else { stage }.extend_from_slice(&row);
                }
            }
            sl.len += 1;
            if sl.stage_k[0].len() >= (opts.hot_window + pool.flush_tokens) * row.len() {
                flush_block(pool, sl)?;
            }
        }
        debug_assert_eq!(sl.encoded, encoded_after);
        Ok(())
    }

    /// The stored rows of `layer` of sequence `id`, for attention.
    pub fn view(&self, id: SeqId, layer: usize) -> Result<LayerView<'_>, CacheError> {
        let sl = &self.seq(id)?[layer];
        let pool = &self.layers[layer];
        let heads = pool.shape.kv_heads;
        let row = pool.full_row_bytes();
        let sinks = sl.len.min(self.options.sink_tokens);
        let mut spans = Vec::with_capacity(sl.pages.len() + 2);
        if sinks > 0 {
            spans.push(RowSpan::full(&sl.sink_k, &sl.sink_v, 0, sinks, row));
        }
        // The blocks of both codecs that hold the rows: the last may be partly written.
        let rows_bytes = |c: &dyn Codec, tokens: usize| {
            tokens.next_multiple_of(pool.block_tokens) / c.block_tokens() * c.block_bytes()
        };
        for (i, &p) in sl.pages.iter().enumerate() {
            let first = (sl.first_page + i) * pool.page_tokens;
            let tokens = pool.page_tokens.min(sl.encoded - first);
            let rows = Rows::Page {
                arenas: pool.arenas(),
                page: p as usize,
                k_len: rows_bytes(pool.k_codec.as_ref(), tokens),
                v_len: rows_bytes(pool.v_codec.as_ref(), tokens),
            };
            spans.push(RowSpan {
                first_pos: sinks + first,
                tokens,
                rows,
            });
        }
        let staged = sl.len - sinks - sl.encoded;
        if staged > 0 {
            spans.push(RowSpan::full(
                &sl.stage_k,
                &sl.stage_v,
                sinks + sl.encoded,
                staged,
                row,
            ));
        }
        Ok(LayerView {
            k_codec: pool.k_codec.as_ref(),
            v_codec: pool.v_codec.as_ref(),
            full_codec: &pool.full_codec,
            kv_heads: heads,
            head_dim: pool.shape.head_dim,
            len: sl.len,
            block_tokens: pool.block_tokens,
            spans,
        })
    }
}

/// Encodes the oldest `flush_tokens` staged rows of every head into the sequence's last page.
fn flush_block(pool: &mut LayerPool, sl: &mut SeqLayer) -> Result<(), CacheError> {
    let (heads, d) = (pool.shape.kv_heads, pool.shape.head_dim);
    let n = pool.flush_tokens;
    let slot = sl.encoded % pool.page_tokens;
    if slot == 0 {
        let page = pool.free.pop().expect("append reserved the pages it needs");
        pool.refcount[page as usize] = 1;
        sl.pages.push(page);
    } else {
        let last = sl.pages.last_mut().expect("a partly filled page");
        if pool.refcount[*last as usize] > 1 {
            let copy = pool.free.pop().expect("append reserved the copy");
            let pages = pool.pages();
            for (arena, bytes) in [
                (&mut pool.keys, pool.k_head_bytes),
                (&mut pool.values, pool.v_head_bytes),
            ] {
                for h in 0..heads {
                    let from = block_at(h, *last as usize, pages, bytes);
                    arena.copy_within(from..from + bytes, block_at(h, copy as usize, pages, bytes));
                }
            }
            pool.refcount[*last as usize] -= 1;
            pool.refcount[copy as usize] = 1;
            *last = copy;
        }
    }
    let (page, pages) = (*sl.pages.last().expect("page") as usize, pool.pages());
    let row = pool.full_row_bytes();
    let mut rows = vec![0f32; n * d];
    for h in 0..heads {
        for (stage, codec, arena, head_bytes) in [
            (
                &mut sl.stage_k[h],
                pool.k_codec.as_ref(),
                &mut pool.keys,
                pool.k_head_bytes,
            ),
            (
                &mut sl.stage_v[h],
                pool.v_codec.as_ref(),
                &mut pool.values,
                pool.v_head_bytes,
            ),
        ] {
            for (t, r) in rows.chunks_exact_mut(d).enumerate() {
                pool.full_codec.decode(&stage[t * row..(t + 1) * row], r);
            }
            stage.drain(..n * row);
            let (bt, bb) = (codec.block_tokens(), codec.block_bytes());
            let head = &mut arena[block_at(h, page, pages, head_bytes)..][..head_bytes];
            if codec.writes_rows() {
                for (t, row) in (slot..).zip(rows.chunks_exact(d)) {
                    codec.encode_row(row, t % bt, &mut head[t / bt * bb..][..bb])?;
                }
            } else {
                for (b, block_rows) in (slot / bt..).zip(rows.chunks_exact(bt * d)) {
                    codec.encode(block_rows, &mut head[b * bb..][..bb])?;
                }
            }
        }
    }
    sl.encoded += n;
    Ok(())
}

/// Returns to the pool the pages of a sliding-window layer that no query from position
/// `len` on can see (every position `< len + 1 − window`).
fn release_dead_pages(pool: &mut LayerPool, sl: &mut SeqLayer, opts: &CacheOptions) {
    let Some(window) = pool.shape.window else {
        return;
    };
    let first_live = (sl.len + 1).saturating_sub(window);
    let first_live_encoded = first_live.saturating_sub(opts.sink_tokens);
    let dead_pages = (first_live_encoded / pool.page_tokens)
        .saturating_sub(sl.first_page)
        .min(sl.pages.len());
    for p in sl.pages.drain(..dead_pages) {
        pool.release(p);
    }
    sl.first_page += dead_pages;
}

/// The codec a cache keeps `role`'s rows of `kind` with: in the integer kernels' order where
/// this CPU runs them and they read the codec, pages hold whole interleaved blocks and
/// `options` ask for it ([`kvq_codec::interleaved`]; elsewhere the kernels would read the
/// blocks through a copy in row order).
pub fn cache_codec(
    kind: SchemeKind,
    role: Role,
    head_dim: usize,
    calibration: &Calibration,
    seed: u64,
    options: &CacheOptions,
) -> Result<Box<dyn Codec>, kvq_codec::CodecError> {
    let codec = build_codec(kind, role, head_dim, calibration, seed)?;
    let interleave = options.interleave
        && kvq_codec::interleaved::read_in_place(codec.as_ref(), role)
        && options.page_tokens.is_multiple_of(INTERLEAVED_ROWS);
    Ok(if interleave {
        kvq_codec::interleaved::interleave(codec, role)
    } else {
        codec
    })
}

/// Tokens a cache encodes into `codec`'s pages at a time: 1 where it writes blocks row by row
/// ([`Codec::writes_rows`]), whole blocks otherwise.
pub fn write_tokens(codec: &dyn Codec) -> usize {
    if codec.writes_rows() {
        1
    } else {
        codec.block_tokens()
    }
}

/// Bytes of one KV head's `codec` blocks in a page of `page_tokens` tokens (a multiple of its
/// block): what the pool allocates, and what the memory plan counts.
pub(crate) fn head_page_bytes(codec: &dyn Codec, page_tokens: usize) -> usize {
    page_tokens / codec.block_tokens() * codec.block_bytes()
}

/// Format of the full-precision rows (sinks, hot window): f16, or the scheme itself when both
/// K and V are unquantized floats.
pub(crate) fn full_row_format(k: SchemeKind, v: SchemeKind) -> FloatFormat {
    match (k, v) {
        (SchemeKind::F32, SchemeKind::F32 | SchemeKind::F16 | SchemeKind::Bf16)
        | (SchemeKind::F16 | SchemeKind::Bf16, SchemeKind::F32) => FloatFormat::F32,
        (SchemeKind::Bf16, SchemeKind::Bf16) => FloatFormat::Bf16,
        _ => FloatFormat::F16,
    }
}

/// Tokens encoded once `stored` non-sink tokens were written: whole blocks of `flush` tokens
/// that have left the hot window.
pub(crate) fn flushable(stored: usize, hot_window: usize, flush: usize) -> usize {
    stored.saturating_sub(hot_window) / flush * flush
}
