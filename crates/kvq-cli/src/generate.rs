//! `kvq generate`: text generation on a compressed KV cache, streamed to stdout.

use crate::args::{CacheArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use kvq_cache::KvCache;
use kvq_model::sampler::{Sampler, SamplerConfig};
use std::io::{Read, Write};
use std::time::Instant;

/// Arguments of `kvq generate`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    cache: CacheArgs,
    /// Prompt text [default: read from stdin]
    #[arg(long, short)]
    prompt: Option<String>,
    /// Tokens to generate at most
    #[arg(long, short = 'n', default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the k most likely tokens (0 = all)
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sample among the most likely tokens up to this probability mass
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Random seed of the sampler
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Prompt tokens per prefill step
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Print timing and cache statistics to stderr at the end
    #[arg(long, short)]
    verbose: bool,
}

/// Generates and streams tokens.
pub fn run(args: Args) -> Result<()> {
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from stdin")?;
            s
        }
    };
    let (model, tokenizer) = args.model.load()?;
    let c = &model.config;
    let prompt_ids = tokenizer.encode(&prompt, true);
    let total = prompt_ids.len() + args.max_tokens;
    if total > c.context_length {
        bail!(
            "prompt of {} tokens plus {} new tokens exceeds the model's context of {} tokens",
            prompt_ids.len(),
            args.max_tokens,
            c.context_length
        );
    }
    if args.batch == 0 {
        bail!("--batch must be positive");
    }
    let policy = args.cache.policy(c.layers)?;
    let options = args.cache.options(args.batch)?;
    let mut cache = KvCache::new(
        &c.layer_shapes(),
        &policy,
        &args.cache.calibration(c.layers)?,
        options,
        total,
        1,
    )?;
    let seq = cache.add_sequence();
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    });
    let stops = [
        Some(tokenizer.eos_id()),
        tokenizer.token_id("<end_of_turn>"),
    ];

    let t0 = Instant::now();
    let mut hidden = Vec::new();
    for chunk in prompt_ids.chunks(args.batch) {
        hidden = model.forward(&mut cache, seq, chunk, chunk.len() - 1)?;
    }
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    let mut decoder = tokenizer.stream_decoder();
    let t1 = Instant::now();
    let mut generated = 0;
    for _ in 0..args.max_tokens {
        let next = sampler.sample(&model.logits(&hidden));
        if stops.contains(&Some(next)) {
            break;
        }
        generated += 1;
        write!(out, "{}", decoder.push(next))?;
        out.flush()?;
        if generated == args.max_tokens {
            break;
        }
        hidden = model.forward(&mut cache, seq, &[next], 0)?;
    }
    writeln!(out, "{}", decoder.finish())?;
    let decode_s = t1.elapsed().as_secs_f64();
    if args.verbose {
        let (used, pages) = cache.page_usage();
        eprintln!(
            "prompt {} tokens in {:.2} s ({:.1} tok/s); generated {} tokens in {:.2} s ({:.1} tok/s); cache {} ({} of {} pages, {} bytes)",
            prompt_ids.len(),
            prefill_s,
            prompt_ids.len() as f64 / prefill_s,
            generated,
            decode_s,
            generated as f64 / decode_s,
            policy.describe(),
            used,
            pages,
            cache.allocated_bytes()
        );
    }
    Ok(())
}
