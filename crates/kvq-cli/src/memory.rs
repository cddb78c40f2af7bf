//! `kvq memory`: exact cache bytes for a model, context, batch and scheme, from a GGUF file or
//! from shape flags (so that large models can be sized without their weights).

use crate::args::{CacheArgs, ModelArgs};
use anyhow::{bail, Result};
use kvq_cache::LayerShape;
use kvq_model::gemma3::Gemma3Config;

/// Arguments of `kvq memory`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    cache: CacheArgs,
    /// Tokens per sequence
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Sequences
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Layers (with --kv-heads and --head-dim: size a model without its GGUF, e.g. Llama-3-8B: 32 layers, 8 KV heads, head_dim 128)
    #[arg(long, requires_all = ["kv_heads", "head_dim"])]
    layers: Option<usize>,
    /// KV heads per layer
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Elements per head
    #[arg(long)]
    head_dim: Option<usize>,
    /// Sliding window of the windowed layers (with --sliding-pattern)
    #[arg(long)]
    window: Option<usize>,
    /// Every N-th layer is global, the others use --window (Gemma 3: 6)
    #[arg(long, default_value_t = 6)]
    sliding_pattern: usize,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Prints the bytes and bits per element of the cache.
pub fn run(args: Args) -> Result<()> {
    let shapes: Vec<LayerShape> = match (args.layers, args.kv_heads, args.head_dim) {
        (Some(layers), Some(kv_heads), Some(head_dim)) => {
            if args.sliding_pattern == 0 {
                bail!("--sliding-pattern must be positive");
            }
            (0..layers)
                .map(|l| LayerShape {
                    kv_heads,
                    head_dim,
                    window: args
                        .window
                        .filter(|_| !(l + 1).is_multiple_of(args.sliding_pattern)),
                })
                .collect()
        }
        _ => Gemma3Config::from_gguf(&args.model.open()?)?.layer_shapes(),
    };
    let policy = args.cache.policy(shapes.len())?;
    let options = args.cache.options(args.ctx.min(512))?;
    let report = kvq_cache::memory::plan(&shapes, &policy, &options, args.ctx, args.batch)?;
    let f16 = kvq_cache::memory::plan(
        &shapes,
        &kvq_cache::Policy::uniform(kvq_codec::KvSpec::parse("f16")?, shapes.len()),
        &options,
        args.ctx,
        args.batch,
    )?;
    if args.json {
        let v = serde_json::json!({
            "kv": policy.describe(),
            "ctx": args.ctx,
            "batch": args.batch,
            "bytes": report.bytes,
            "bits_per_element": report.bits_per_element,
            "page_bytes": report.page_bytes,
            "full_row_bytes": report.full_row_bytes,
            "elements": report.elements,
            "f16_bytes": f16.bytes,
            "compression_vs_f16": f16.bytes as f64 / report.bytes as f64,
            "layer_bytes": report.layer_bytes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{}: {} bytes ({:.2} MiB) for {} × {} tokens over {} layers; {:.4} bits/element; {:.2}x smaller than f16 ({:.2} MiB)",
            policy.describe(),
            report.bytes,
            report.bytes as f64 / (1 << 20) as f64,
            args.batch,
            args.ctx,
            shapes.len(),
            report.bits_per_element,
            f16.bytes as f64 / report.bytes as f64,
            f16.bytes as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}
