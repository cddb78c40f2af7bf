//! `kvq calibrate`: offline profiling of a model's K and V to a profile file.

use crate::args::{read_tokens, ModelArgs};
use crate::compare::progress_bar;
use anyhow::{bail, Context, Result};
use kvq_calib::profile::{calibrate, CONVERGENCE};
use kvq_calib::ModelIdentity;
use std::path::PathBuf;

/// Arguments of `kvq calibrate`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Calibration text (any UTF-8 text, e.g. WikiText-2 train)
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Profile file to write
    #[arg(long, value_name = "PROFILE")]
    out: PathBuf,
    /// Tokens per sample
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Samples at most (sampling stops earlier once the thresholds move by < 0.1%)
    #[arg(long, default_value_t = 32)]
    max_samples: usize,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Profiles the model and writes the profile.
pub fn run(args: Args) -> Result<()> {
    let g = args.model.open()?;
    let identity = ModelIdentity::of(&g)?;
    let (model, tokenizer) = args.model.load()?;
    if args.ctx < 2 || args.ctx > model.config.context_length || args.max_samples == 0 {
        bail!("--ctx must be between 2 and the model's context length, --max-samples positive");
    }
    let tokens = read_tokens(&args.text, &tokenizer, args.ctx)?;
    let available = (tokens.len() / args.ctx).min(args.max_samples);
    let bar = progress_bar(available, "calibrate", "samples")?;
    let start = std::time::Instant::now();
    let profile = calibrate(
        &model,
        &tokens,
        tokenizer.bos_id(),
        args.ctx,
        available,
        |n, change| {
            bar.set_position(n as u64);
            if change.is_finite() {
                bar.set_message(format!("threshold change {:.4}%", change * 100.0));
            }
        },
    )?;
    bar.finish_and_clear();
    std::fs::write(&args.out, profile.to_file(&identity))
        .with_context(|| format!("writing {}", args.out.display()))?;
    let why = if profile.converged {
        format!("thresholds moved by < {}%", CONVERGENCE * 100.0)
    } else {
        "sample limit".into()
    };
    if args.json {
        let v = serde_json::json!({
            "out": args.out.display().to_string(),
            "samples": profile.samples,
            "ctx": profile.ctx,
            "converged": profile.converged,
            "seconds": start.elapsed().as_secs_f64(),
            "layers": profile.layers,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "wrote {}: {} layers × K/V from {} samples of {} tokens (stopped: {why}) in {:.1} s",
            args.out.display(),
            profile.layers.len(),
            profile.samples,
            profile.ctx,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
