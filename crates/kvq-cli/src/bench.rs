//! `kvq bench`: timings reported as ratios against a baseline measured in the same run.
//!
//! * `bench attention`: decode attention over a synthetic cache, for each scheme and the f16
//!   cache, plus the machine's memory-copy bandwidth.
//! * `bench decode`: whole-model prefill and decode on the reference model at given contexts;
//!   the context is filled with synthetic K/V rows (decode cost does not depend on their values)
//!   so that long contexts need no long prefill.

use crate::args::{CacheArgs, IsaArg, ModelArgs};
use anyhow::{bail, Result};
use kvq_attn::{attend, AttnParams};
use kvq_cache::{CacheOptions, KvCache, LayerShape, Policy};
use kvq_codec::{Calibration, KvSpec};
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Arguments of `kvq bench`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Decode attention (one query token) over a synthetic cache, against the f16 cache.
    Attention(AttentionArgs),
    /// Whole-model prefill and decode speed on a model.
    Decode(DecodeArgs),
}

#[derive(clap::Args)]
struct AttentionArgs {
    /// Schemes to time, comma-separated (each KIND or k=KIND;v=KIND with ';')
    #[arg(long, default_value = "q4_0")]
    kv: String,
    /// Context lengths, comma-separated
    #[arg(long, default_value = "32768", value_delimiter = ',')]
    ctx: Vec<usize>,
    /// Query heads
    #[arg(long, default_value_t = 32)]
    q_heads: usize,
    /// KV heads
    #[arg(long, default_value_t = 8)]
    kv_heads: usize,
    /// Elements per head
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Timed repetitions (the median is reported, and in JSON the fastest too). On the CPU the
    /// f16 cache and every scheme take turns within each repetition, so that slow periods of
    /// a shared machine hit all of them alike; "× f16" is the median over the turns of each
    /// turn's time against the f16 cache's
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Print JSON
    #[arg(long)]
    json: bool,
    /// Time the compressed caches with the f32 kernels instead of the 8-bit integer ones
    #[arg(long)]
    f32_attention: bool,
    /// Vector instructions the CPU kernels may use, for every cache of the run: `native` (all
    /// the CPU has), `avx2` (the kernels of a CPU without AVX-512), `scalar`
    #[arg(long, value_enum, default_value_t = IsaArg::Native)]
    isa: IsaArg,
    /// Where to run: `cpu`, or `cuda` (kvq-gpu kernels; see gpu.rs)
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Sequences per batch, comma-separated (`--device cuda` only)
    #[arg(long, default_value = "1", value_delimiter = ',')]
    batch: Vec<usize>,
    /// Tokens per cache page (CPU) [default: 64, or the key block of a KIVI -g128 scheme]
    #[arg(long, value_name = "TOKENS")]
    page_tokens: Option<usize>,
}

#[derive(clap::Args)]
struct DecodeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    cache: CacheArgs,
    /// Context lengths at which to time decode, comma-separated
    #[arg(long, default_value = "512,4096", value_delimiter = ',')]
    ctx: Vec<usize>,
    /// Tokens decoded per measurement
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Also time a real prefill of this many tokens (0: skip)
    #[arg(long, default_value_t = 512)]
    prefill: usize,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Runs a benchmark.
pub fn run(args: Args) -> Result<()> {
    match args.what {
        What::Attention(a) => attention(a),
        What::Decode(a) => decode(a),
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Bytes per second of a large memory copy on this machine (read + write counted once each:
/// the figure is the bytes copied per second).
pub fn copy_bandwidth() -> f64 {
    let n = 256 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let times: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    n as f64 / median(times)
}

/// A one-layer cache of `ctx` random tokens in pages of `page_tokens`.
fn synthetic_cache(
    spec: KvSpec,
    shape: LayerShape,
    ctx: usize,
    seed: u64,
    page_tokens: usize,
) -> Result<KvCache> {
    let options = CacheOptions {
        max_append_tokens: 1024,
        page_tokens,
        ..CacheOptions::default()
    };
    let mut cal = Calibration::default();
    if matches!(spec.k, kvq_codec::SchemeKind::Oaken)
        || matches!(spec.v, kvq_codec::SchemeKind::Oaken)
    {
        cal = kvq_cache::memory::sizing_calibration();
    }
    let mut cache = KvCache::new(
        &[shape],
        &Policy::uniform(spec, 1),
        &[(cal.clone(), cal)],
        options,
        ctx,
        1,
    )?;
    let seq = cache.add_sequence();
    fill(&mut cache, seq, 0, shape, ctx, seed)?;
    Ok(cache)
}

/// Appends `tokens` random rows to `layer` of `seq`, in runs of at most 1024.
fn fill(
    cache: &mut KvCache,
    seq: kvq_cache::SeqId,
    layer: usize,
    shape: LayerShape,
    tokens: usize,
    seed: u64,
) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut left = tokens;
    while left > 0 {
        let n = left.min(1024);
        let rows = n * shape.kv_heads * shape.head_dim;
        let k: Vec<f32> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let v: Vec<f32> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
        cache.append(seq, layer, &k, &v, n)?;
        left -= n;
    }
    Ok(())
}

fn attention(a: AttentionArgs) -> Result<()> {
    if a.kv_heads == 0 || !a.q_heads.is_multiple_of(a.kv_heads) {
        bail!("--kv-heads must divide --q-heads");
    }
    if a.iters == 0 {
        bail!("--iters must be at least 1");
    }
    if a.ctx.contains(&0) {
        bail!("--ctx values must be at least 1 (attention needs a cached token)");
    }
    let specs: Vec<KvSpec> =
        a.kv.split(',')
            .map(|s| KvSpec::parse(&s.replace(';', ",")))
            .collect::<Result<_, _>>()?;
    if a.device == "cuda" {
        let (batches, contexts, iters) = (a.batch, a.ctx, a.iters);
        let (q_heads, kv_heads, head_dim, json) = (a.q_heads, a.kv_heads, a.head_dim, a.json);
        return crate::gpu::bench_attention(crate::gpu::BenchOptions {
            specs,
            batches,
            contexts,
            q_heads,
            kv_heads,
            head_dim,
            iters,
            json,
        });
    }
    let shape = LayerShape {
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
        window: None,
    };
    let copy = copy_bandwidth();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let queries: Vec<f32> = (0..a.q_heads * a.head_dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let params = AttnParams {
        q_heads: a.q_heads,
        scale: 1.0 / (a.head_dim as f32).sqrt(),
        window: None,
    };
    kvq_codec::levels::set_enabled(!a.f32_attention);
    a.isa.apply();
    let page_tokens = |spec: KvSpec| {
        a.page_tokens
            .unwrap_or_else(|| crate::args::default_page_tokens(&[spec.k, spec.v]))
    };
    // The times of each turn, f16 cache first, and each cache's bytes.
    let time = |ctx: usize| -> Result<Vec<(Vec<f64>, usize)>> {
        let all: Vec<KvSpec> = std::iter::once(KvSpec::parse("f16")?)
            .chain(specs.iter().copied())
            .collect();
        let caches: Vec<KvCache> = all
            .iter()
            .map(|&spec| synthetic_cache(spec, shape, ctx, 1, page_tokens(spec)))
            .collect::<Result<_>>()?;
        let views: Vec<_> = caches
            .iter()
            .map(|c| c.view(kvq_cache::SeqId(0), 0))
            .collect::<Result<_, _>>()?;
        let mut out = vec![0f32; queries.len()];
        let mut times = vec![Vec::with_capacity(a.iters); views.len()];
        for round in 0..=a.iters {
            for (view, t) in views.iter().zip(&mut times) {
                let start = Instant::now();
                attend(view, &queries, &[ctx - 1], &params, &mut out);
                // Round 0 warms up.
                if round > 0 {
                    t.push(start.elapsed().as_secs_f64());
                }
            }
        }
        Ok(times
            .into_iter()
            .zip(&caches)
            .map(|(t, c)| (t, c.allocated_bytes()))
            .collect())
    };
    let fastest = |t: &[f64]| t.iter().copied().fold(f64::INFINITY, f64::min);
    let kernels = if kvq_codec::levels::available() {
        "int8"
    } else if kvq_codec::levels::avx2::available() {
        "int8 (AVX2: the level formats, their interleaved blocks and KIVI's keys), else f32"
    } else {
        "f32"
    };
    let mut rows = Vec::new();
    for &ctx in &a.ctx {
        let timed = time(ctx)?;
        let (base_times, base_bytes) = (&timed[0].0, timed[0].1);
        let base_s = median(base_times.clone());
        for (&spec, &(ref times, bytes)) in specs.iter().zip(&timed[1..]) {
            let s = median(times.clone());
            // The time against the f16 cache's of the same turn: a slow minute slows both.
            let turn_ratio = median(times.iter().zip(base_times).map(|(t, b)| t / b).collect());
            rows.push(serde_json::json!({
                "kv": spec.name(), "ctx": ctx, "q_heads": a.q_heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim,
                "ms": s * 1e3, "baseline_ms": base_s * 1e3, "speedup": base_s / s,
                "turn_ratio": turn_ratio,
                "fastest_ms": fastest(times) * 1e3, "baseline_fastest_ms": fastest(base_times) * 1e3,
                "bytes_read": bytes, "gb_per_s": bytes as f64 / s / 1e9,
                "baseline_bytes_read": base_bytes, "baseline_gb_per_s": base_bytes as f64 / base_s / 1e9,
                "copy_gb_per_s": copy / 1e9, "threads": rayon::current_num_threads(),
                "kernels": kernels, "isa": a.isa.name(),
                "page_tokens": page_tokens(spec),
            }));
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("memory copy: {:.2} GB/s", copy / 1e9);
        println!(
            "{:<14} {:>7} {:>10} {:>10} {:>8} {:>9} {:>9} {:>9}",
            "kv", "ctx", "ms", "f16 ms", "speedup", "× f16", "GB/s", "f16 GB/s"
        );
        for r in &rows {
            println!(
                "{:<14} {:>7} {:>10.3} {:>10.3} {:>8.2} {:>9.3} {:>9.2} {:>9.2}",
                r["kv"].as_str().unwrap_or(""),
                r["ctx"],
                r["ms"].as_f64().unwrap_or(0.0),
                r["baseline_ms"].as_f64().unwrap_or(0.0),
                r["speedup"].as_f64().unwrap_or(0.0),
                r["turn_ratio"].as_f64().unwrap_or(0.0),
                r["gb_per_s"].as_f64().unwrap_or(0.0),
                r["baseline_gb_per_s"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}

fn decode(a: DecodeArgs) -> Result<()> {
    if a.tokens == 0 {
        bail!("--tokens must be at least 1");
    }
    let (model, _) = a.model.load()?;
    let c = &model.config;
    let policy = a.cache.policy(c.layers)?;
    let cal = a.cache.calibration(c.layers)?;
    let mut rows = Vec::new();
    if a.prefill > 0 {
        let options = a.cache.options(a.prefill)?;
        let mut cache = KvCache::new(&c.layer_shapes(), &policy, &cal, options, a.prefill, 1)?;
        let seq = cache.add_sequence();
        let tokens: Vec<u32> = (0..a.prefill as u32).map(|i| 1000 + i % 5000).collect();
        let t = Instant::now();
        let hidden = model.forward(&mut cache, seq, &tokens, a.prefill - 1)?;
        model.logits(&hidden);
        let s = t.elapsed().as_secs_f64();
        rows.push(serde_json::json!({"phase": "prefill", "kv": policy.describe(), "ctx": a.prefill, "tokens": a.prefill, "seconds": s, "tokens_per_s": a.prefill as f64 / s}));
    }
    for &ctx in &a.ctx {
        if ctx + a.tokens > c.context_length {
            bail!(
                "context {ctx} plus {} decoded tokens exceeds the model's {}",
                a.tokens,
                c.context_length
            );
        }
        let options = a.cache.options(1024)?;
        let mut cache = KvCache::new(&c.layer_shapes(), &policy, &cal, options, ctx + a.tokens, 1)?;
        let seq = cache.add_sequence();
        for (l, shape) in c.layer_shapes().into_iter().enumerate() {
            fill(&mut cache, seq, l, shape, ctx, l as u64)?;
        }
        let mut token = 1000u32;
        let t = Instant::now();
        for _ in 0..a.tokens {
            let hidden = model.forward(&mut cache, seq, &[token], 0)?;
            token = kvq_model::sampler::argmax(&model.logits(&hidden));
        }
        let s = t.elapsed().as_secs_f64();
        rows.push(serde_json::json!({
            "phase": "decode", "kv": policy.describe(), "ctx": ctx, "tokens": a.tokens, "seconds": s,
            "tokens_per_s": a.tokens as f64 / s, "kv_bytes": cache.allocated_bytes(),
        }));
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for r in &rows {
            println!(
                "{:<8} {:<10} ctx {:>6}: {:>8.1} tokens/s",
                r["phase"].as_str().unwrap_or(""),
                r["kv"].as_str().unwrap_or(""),
                r["ctx"],
                r["tokens_per_s"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}
