//! `kvq serve`: the OpenAI-compatible server of `kvq-serve`, configured from the command line.

use crate::args::{CacheArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use kvq_serve::{ServeConfig, Server};

/// Arguments of `kvq serve`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    cache: CacheArgs,
    /// Sequences decoded together at most
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// Prompt plus generated tokens of one request at most
    #[arg(long, default_value_t = 4096)]
    max_seq_len: usize,
    /// Bytes the KV cache may allocate (suffixes K, M, G, KiB, MiB, GiB)
    #[arg(long, default_value = "512MiB", value_name = "BYTES", value_parser = parse_bytes)]
    cache_memory: usize,
    /// Requests waiting for cache memory at most; more are refused with 429
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Prompt tokens prefilled per scheduler step (between two decode steps)
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Model id clients name in requests [default: the model file's stem]
    #[arg(long)]
    model_name: Option<String>,
}

/// `1234`, `512M`, `2GiB`, … as bytes.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let unit = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1usize,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown unit `{other}` (use K, M or G)")),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("`{s}` is not a byte count"))
}

/// Loads the model and serves until killed.
pub fn run(args: Args) -> Result<()> {
    if args.max_batch == 0 || args.max_seq_len == 0 || args.prefill_chunk == 0 {
        bail!("--max-batch, --max-seq-len and --prefill-chunk must be positive");
    }
    let path = args.model.path()?;
    let model_name = match args.model_name {
        Some(n) => n,
        None => path
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned()),
    };
    let (model, tokenizer) = args.model.load()?;
    let layers = model.config.layers;
    let policy = args.cache.policy(layers)?;
    let scheme = policy.describe();
    let config = ServeConfig {
        model_name: model_name.clone(),
        calibration: args.cache.calibration(layers)?,
        options: args.cache.options(args.prefill_chunk)?,
        policy,
        max_batch: args.max_batch,
        max_seq_len: args.max_seq_len,
        cache_memory: args.cache_memory,
        max_queue: args.max_queue,
        prefill_chunk: args.prefill_chunk,
    };
    let listener = std::net::TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let server = Server::start(model, tokenizer, config, listener)?;
    let plan = server.plan();
    eprintln!(
        "kvq serve: model `{model_name}` on http://{} — cache {} ({} bytes: {} slots of {} tokens, {} pages, {:.3} bits/element, {:.2}x smaller than 16-bit)",
        server.addr(),
        scheme,
        plan.bytes,
        plan.slots,
        plan.slot_tokens,
        plan.layer_pages.iter().sum::<usize>(),
        plan.bits_per_element,
        plan.compression_ratio
    );
    Ok(server.wait()?)
}
