//! Exact memory accounting: the bytes a cache configuration allocates, by the same rules the
//! pool follows (pages per sequence, full-precision rows reserved per sequence).

use crate::pool::write_tokens;
use crate::pool::{flushable, full_row_format, head_page_bytes};
use crate::{CacheError, CacheOptions, LayerShape, Policy};
use kvq_codec::float::FloatFormat;
use kvq_codec::{Calibration, Codec, OakenThresholds, Role, SchemeKind};

/// Pages one sequence of `ctx` tokens holds at most in a layer of `shape`, whose codecs encode
/// `flush_tokens` tokens at a time.
pub fn pages_per_sequence(
    shape: &LayerShape,
    flush_tokens: usize,
    options: &CacheOptions,
    ctx: usize,
) -> usize {
    let stored = ctx.saturating_sub(options.sink_tokens);
    let encoded = flushable(stored, options.hot_window, flush_tokens);
    let global = encoded.div_ceil(options.page_tokens);
    match shape.window {
        None => global,
        // Live positions span at most window − 1 old tokens plus one appended run; pages are
        // aligned, so that span touches at most one page more than its length needs.
        Some(window) => global.min(
            (window - 1)
                .saturating_add(options.max_append_tokens)
                .div_ceil(options.page_tokens)
                + 1,
        ),
    }
}

/// Bytes of a configuration, in total and per layer.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryReport {
    /// Bytes allocated by the cache: pages plus reserved full-precision rows.
    pub bytes: usize,
    /// `8 · bytes` over the K and V elements the cache holds (every token for global layers,
    /// at most the window for sliding-window layers).
    pub bits_per_element: f64,
    /// Bytes of pages.
    pub page_bytes: usize,
    /// Bytes of full-precision rows (sinks and hot window, reserved per sequence).
    pub full_row_bytes: usize,
    /// K and V elements held.
    pub elements: usize,
    /// Bytes of each layer.
    pub layer_bytes: Vec<usize>,
}

/// Calibration used only to size codecs (Oaken needs thresholds to be built): sizes do not
/// depend on calibration values.
pub fn sizing_calibration() -> Calibration {
    Calibration {
        oaken_thresholds: Some(OakenThresholds {
            lo_outer: -1.0,
            lo_inner: -0.1,
            hi_inner: 0.1,
            hi_outer: 1.0,
        }),
        ..Calibration::default()
    }
}

fn sizing_codec(
    kind: SchemeKind,
    role: Role,
    head_dim: usize,
    options: &CacheOptions,
) -> Result<Box<dyn Codec>, CacheError> {
    let calibration = sizing_calibration();
    Ok(crate::pool::cache_codec(
        kind,
        role,
        head_dim,
        &calibration,
        0,
        options,
    )?)
}

/// Computes the memory of `batch` sequences of `ctx` tokens under `policy`. A context, batch,
/// layer count, KV head count, head size or sliding window of 0, or a size beyond `usize`, is
/// an error.
pub fn plan(
    shapes: &[LayerShape],
    policy: &Policy,
    options: &CacheOptions,
    ctx: usize,
    batch: usize,
) -> Result<MemoryReport, CacheError> {
    if ctx == 0 || batch == 0 {
        return Err(CacheError::Config(format!(
            "a cache of {batch} × {ctx} tokens: the batch and the context must be at least 1"
        )));
    }
    if shapes.is_empty() {
        return Err(CacheError::Config(
            "a cache needs at least one layer".into(),
        ));
    }
    let overflow = || {
        CacheError::Config(format!(
            "a cache of {batch} × {ctx} tokens: its byte count overflows"
        ))
    };
    let product = |factors: &[usize]| {
        factors
            .iter()
            .try_fold(1usize, |p, &f| p.checked_mul(f))
            .ok_or_else(overflow)
    };
    let mut report = MemoryReport {
        bytes: 0,
        bits_per_element: 0.0,
        page_bytes: 0,
        full_row_bytes: 0,
        elements: 0,
        layer_bytes: Vec::with_capacity(shapes.len()),
    };
    for (l, shape) in shapes.iter().enumerate() {
        shape.check(l)?;
        let schemes = policy
            .layers
            .get(l)
            .ok_or_else(|| CacheError::Config(format!("policy has no entry for layer {l}")))?;
        let k = sizing_codec(schemes.k, Role::Key, shape.head_dim, options)?;
        let v = sizing_codec(schemes.v, Role::Value, shape.head_dim, options)?;
        let flush = lcm(write_tokens(k.as_ref()), write_tokens(v.as_ref()));
        let per_head = |c: &dyn Codec| head_page_bytes(c, options.page_tokens);
        let page_bytes = shape.kv_heads * (per_head(k.as_ref()) + per_head(v.as_ref()));
        let pages = pages_per_sequence(shape, flush, options, ctx);
        let full_bytes_per_row = match full_row_format(schemes.k, schemes.v) {
            FloatFormat::F32 => 4,
            FloatFormat::F16 | FloatFormat::Bf16 => 2,
        };
        let rows = options.sink_tokens + options.hot_window + flush;
        let held = shape.window.map_or(ctx, |w| w.min(ctx));
        let layer_pages = product(&[batch, pages, page_bytes])?;
        let full = product(&[
            batch,
            2,
            shape.kv_heads,
            rows,
            shape.head_dim,
            full_bytes_per_row,
        ])?;
        let layer = layer_pages.checked_add(full).ok_or_else(overflow)?;
        let elements = product(&[batch, held, 2, shape.kv_heads, shape.head_dim])?;
        report.page_bytes = report
            .page_bytes
            .checked_add(layer_pages)
            .ok_or_else(overflow)?;
        report.full_row_bytes = report
            .full_row_bytes
            .checked_add(full)
            .ok_or_else(overflow)?;
        report.elements = report.elements.checked_add(elements).ok_or_else(overflow)?;
        report.layer_bytes.push(layer);
    }
    report.bytes = report
        .page_bytes
        .checked_add(report.full_row_bytes)
        .ok_or_else(overflow)?;
    report.bits_per_element = 8.0 * report.bytes as f64 / report.elements.max(1) as f64;
    Ok(report)
}

pub(crate) fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}
