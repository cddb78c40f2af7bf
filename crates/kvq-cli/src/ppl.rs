//! `kvq ppl`: perplexity with the compressed cache in the loop, optionally with KL divergence
//! and top-1 agreement against the 16-bit cache run on the same chunks.

use crate::args::{read_tokens, CacheArgs, ModelArgs};
use crate::compare::{f16_reference, progress_bar, setup};
use anyhow::{bail, Result};
use kvq_eval::perplexity_many;
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
    /// Also run the 16-bit (f16) cache on the same chunks and report the KL divergence and
    /// top-1 agreement of every scored token against it
    #[arg(long)]
    kld: bool,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// The tokens of a perplexity text (BOS first) and the chunks of `ctx` it gives, at most
/// `chunks`.
pub fn text_chunks(
    path: &std::path::Path,
    tokenizer: &kvq_model::tokenizer::Tokenizer,
    ctx: usize,
    context_length: usize,
    chunks: usize,
) -> Result<(Vec<u32>, usize)> {
    if ctx < 4 || ctx > context_length {
        bail!("--ctx must be between 4 and the model's context length {context_length}");
    }
    let tokens = read_tokens(path, tokenizer, ctx)?;
    let available = tokens.len() / ctx;
    Ok((tokens, chunks.min(available)))
}

/// Runs the perplexity procedure and prints the result.
pub fn run(args: Args) -> Result<()> {
    let (model, tokenizer) = args.model.load()?;
    let c = &model.config;
    let (tokens, chunks) = text_chunks(
        &args.text,
        &tokenizer,
        args.ctx,
        c.context_length,
        args.chunks,
    )?;
    let scheme = setup(&args.cache, c.layers)?;
    let reference = if args.kld {
        Some(f16_reference(&scheme, c.layers)?)
    } else {
        None
    };
    let mut options = scheme.options;
    options.max_append_tokens = kvq_eval::perplexity::append_tokens(args.ctx);
    let memory = kvq_cache::memory::plan(&c.layer_shapes(), &scheme.policy, &options, args.ctx, 1)?;
    let bar = progress_bar(chunks, "ppl", "chunks")?;
    let start = std::time::Instant::now();
    let report = perplexity_many(
        &model,
        &tokens,
        tokenizer.bos_id(),
        args.ctx,
        chunks,
        reference.as_ref(),
        std::slice::from_ref(&scheme),
        |done, ppl| {
            bar.set_position(done as u64);
            bar.set_message(format!("ppl {:.4}", ppl[0]));
        },
    )?
    .remove(0);
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    let kv = scheme.policy.describe();
    if args.json {
        let mut v = serde_json::json!({
            "kv": kv,
            "ppl": report.ppl,
            "ppl_stderr": report.ppl_stderr,
            "tokens": report.tokens,
            "chunks": report.chunks,
            "ctx": args.ctx,
            "bits_per_element": memory.bits_per_element,
            "kv_bytes": memory.bytes,
            "hot_window": options.hot_window,
            "sinks": options.sink_tokens,
            "seconds": seconds,
            "text": args.text.display().to_string(),
        });
        if let Some(k) = &report.kld {
            v["kld"] = k.kld_mean.into();
            v["kld_p99"] = k.kld_p99.into();
            v["kld_max"] = k.kld_max.into();
            v["top1_agree"] = k.top1_agree.into();
            v["ppl_f16"] = k.ppl_reference.into();
            v["delta_ppl_percent"] = (100.0 * (report.ppl / k.ppl_reference - 1.0)).into();
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{kv}: PPL = {:.4} +/- {:.4} over {} tokens ({} chunks of {}); cache {:.3} bits/element, {} bytes; {:.1} s",
            report.ppl,
            report.ppl_stderr,
            report.tokens,
            report.chunks,
            args.ctx,
            memory.bits_per_element,
            memory.bytes,
            seconds
        );
        if let Some(k) = &report.kld {
            println!(
                "against f16 (PPL {:.4}): ΔPPL {:+.3}%, KLD mean {:.6}, p99 {:.5}, max {:.4}; top-1 agreement {:.3}%",
                k.ppl_reference,
                100.0 * (report.ppl / k.ppl_reference - 1.0),
                k.kld_mean,
                k.kld_p99,
                k.kld_max,
                100.0 * k.top1_agree
            );
        }
    }
    Ok(())
}
