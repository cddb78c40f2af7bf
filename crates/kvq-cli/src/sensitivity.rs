//! `kvq sensitivity`: the quality cost of quantizing one layer's K or V alone.

use crate::args::{read_tokens, ModelArgs, ProfileArgs};
use crate::compare::progress_bar;
use anyhow::{bail, Context, Result};
use kvq_cache::CacheOptions;
use kvq_calib::sensitivity::{self, layer_elements, measure, SensitivityReport, Settings};
use kvq_calib::ModelIdentity;
use kvq_codec::SchemeKind;
use std::path::PathBuf;

/// Arguments of `kvq sensitivity`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    profile: ProfileArgs,
    /// Scheme(s) to try on one layer's K or V at a time, comma-separated (`kvq tune` chooses
    /// among them)
    #[arg(long, value_name = "KIND[,KIND...]")]
    kv: String,
    /// Text to measure on
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Tokens per chunk
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Chunks to score
    #[arg(long, default_value_t = 4)]
    chunks: usize,
    /// Print the report as JSON (the input of `kvq tune --report`)
    #[arg(long)]
    json: bool,
    /// Also write a bar chart (PNG) of the KL divergence per layer
    #[arg(long, value_name = "OUT.png")]
    plot: Option<PathBuf>,
}

/// Runs the per-layer measurement and prints the report.
pub fn run(args: Args) -> Result<()> {
    let kinds = args
        .kv
        .split(',')
        .map(|s| SchemeKind::parse(s.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    if kinds.is_empty() || args.chunks == 0 {
        bail!("--kv needs at least one scheme and --chunks must be positive");
    }
    let identity = ModelIdentity::of(&args.model.open()?)?;
    let (model, tokenizer) = args.model.load()?;
    let c = &model.config;
    let tokens = read_tokens(&args.text, &tokenizer, args.ctx)?;
    let chunks = args.chunks.min(tokens.len() / args.ctx);
    let settings = Settings {
        ctx: args.ctx,
        chunks,
        calibration: args.profile.calibration(c.layers)?,
        options: CacheOptions::default(),
    };
    let bar = progress_bar(kinds.len() * chunks, "sensitivity", "chunks")?;
    bar.set_message(format!("({} layers × K/V per chunk)", c.layers));
    let (reference_ppl, schemes) = measure(
        &model,
        &tokens,
        tokenizer.bos_id(),
        &kinds,
        &settings,
        |k, n| bar.set_position((k * chunks + n) as u64),
    )?;
    bar.finish_and_clear();
    let report = SensitivityReport {
        format: sensitivity::FORMAT.into(),
        model: identity,
        text: args.text.display().to_string(),
        ctx: args.ctx,
        chunks,
        profile: args
            .profile
            .profile
            .as_ref()
            .map(|p| p.display().to_string()),
        reference_ppl,
        layer_elements: layer_elements(&c.layer_shapes(), args.ctx),
        most_sensitive: sensitivity::most_sensitive(&schemes, 5),
        schemes,
    };
    if let Some(path) = &args.plot {
        sensitivity::chart(&report, path).map_err(anyhow::Error::msg)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "16-bit cache: PPL {reference_ppl:.4} ({chunks} chunks of {})",
        args.ctx
    );
    for s in &report.schemes {
        println!(
            "{} (K {:.3}, V {:.3} bits/element): KLD / Δppl per layer",
            s.scheme, s.k_bits, s.v_bits
        );
        for l in &s.layers {
            println!(
                "  layer {:2}  K {:.5} / {:+.4}   V {:.5} / {:+.4}",
                l.layer, l.k.kld, l.k.dppl, l.v.kld, l.v.dppl
            );
        }
    }
    println!("most sensitive:");
    for line in &report.most_sensitive {
        println!("  {line}");
    }
    if let Some(path) = &args.plot {
        println!("chart: {}", path.display());
    }
    Ok(())
}

/// Reads a report written by `kvq sensitivity --json` (bare, or wrapped by
/// scripts/record.sh under `result`).
pub fn read_report(path: &std::path::Path) -> Result<SensitivityReport> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    if let Some(inner) = v.get_mut("result") {
        v = inner.take();
    }
    if v.get("format").and_then(|f| f.as_str()) != Some(sensitivity::FORMAT) {
        bail!(
            "{} is not a report of `kvq sensitivity --json`",
            path.display()
        );
    }
    serde_json::from_value(v).with_context(|| format!("reading the report {}", path.display()))
}
