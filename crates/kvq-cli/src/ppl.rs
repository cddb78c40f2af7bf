//! `kvq ppl`: perplexity with the compressed cache in the loop.

use crate::args::{CacheArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kvq_eval::{perplexity, PplOptions};
use std::path::PathBuf;

/// Arguments of `kvq ppl`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    cache: CacheArgs,
    /// Text file to score (any UTF-8 text)
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Tokens per chunk
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Chunks to score (at most what the text holds)
    #[arg(long, default_value_t = 64)]
    chunks: usize,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Runs the perplexity procedure and prints the result.
pub fn run(args: Args) -> Result<()> {
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("reading {}", args.text.display()))?;
    let (model, tokenizer) = args.model.load()?;
    let c = &model.config;
    if args.ctx < 4 || args.ctx > c.context_length {
        bail!(
            "--ctx must be between 4 and the model's context length {}",
            c.context_length
        );
    }
    let tokens = tokenizer.encode(&text, true);
    let available = tokens.len() / args.ctx;
    if available == 0 {
        bail!(
            "{} holds {} tokens, fewer than one chunk of {}",
            args.text.display(),
            tokens.len(),
            args.ctx
        );
    }
    let chunks = args.chunks.min(available);
    let opts = PplOptions {
        ctx: args.ctx,
        chunks,
        policy: args.cache.policy(c.layers)?,
        calibration: args.cache.calibration(c.layers),
        cache: args.cache.options(args.ctx)?,
    };
    let memory =
        kvq_cache::memory::plan(&c.layer_shapes(), &opts.policy, &opts.cache, args.ctx, 1)?;
    let bar = ProgressBar::new(chunks as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} ppl [{bar:30}] {pos}/{len} chunks {msg} ({elapsed}, eta {eta})",
        )?
        .progress_chars("=> "),
    );
    let start = std::time::Instant::now();
    let report = perplexity(&model, &tokens, tokenizer.bos_id(), &opts, |done, ppl| {
        bar.set_position(done as u64);
        bar.set_message(format!("ppl {ppl:.4}"));
    })?;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    if args.json {
        let v = serde_json::json!({
            "kv": opts.policy.describe(),
            "ppl": report.ppl,
            "ppl_stderr": report.ppl_stderr,
            "tokens": report.tokens,
            "chunks": report.chunks,
            "ctx": args.ctx,
            "bits_per_element": memory.bits_per_element,
            "kv_bytes": memory.bytes,
            "hot_window": opts.cache.hot_window,
            "sinks": opts.cache.sink_tokens,
            "seconds": seconds,
            "text": args.text.display().to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{}: PPL = {:.4} +/- {:.4} over {} tokens ({} chunks of {}); cache {:.3} bits/element, {} bytes; {:.1} s",
            opts.policy.describe(),
            report.ppl,
            report.ppl_stderr,
            report.tokens,
            report.chunks,
            args.ctx,
            memory.bits_per_element,
            memory.bytes,
            seconds
        );
    }
    Ok(())
}
