//! `kvq retrieval`: passkey retrieval in a prose haystack at chosen lengths and depths, for
//! several schemes and the 16-bit cache in the same run.

use crate::args::{CacheArgs, ModelArgs};
use crate::compare::{progress_bar, setups_with_baseline};
use anyhow::{bail, Context, Result};
use kvq_eval::retrieval::{baseline_summary, retrieval, Cell, RetrievalOptions, ANSWER_TOKENS};
use kvq_eval::CacheSetup;
use kvq_model::gemma3::Gemma3;
use kvq_model::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

/// Options of a retrieval run, shared with `kvq compare`.
#[derive(clap::Args, Clone, Debug)]
pub struct RetrievalArgs {
    /// Prompt lengths in tokens, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "1024,2048,4096")]
    pub lengths: Vec<usize>,
    /// Needle depths in percent of the haystack, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "0,25,50,75,100")]
    pub depths: Vec<f64>,
    /// Trials (random pass keys) per length and depth
    #[arg(long, default_value_t = 3)]
    pub trials: usize,
    /// Seed of the random pass keys
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl RetrievalArgs {
    /// Checks the lengths against the model's context and returns the run's options.
    pub fn options(&self, context_length: usize) -> Result<RetrievalOptions> {
        if let Some(&l) = self
            .lengths
            .iter()
            .find(|&&l| l + ANSWER_TOKENS > context_length)
        {
            bail!("length {l} plus {ANSWER_TOKENS} answer tokens exceeds the model's context of {context_length}");
        }
        if self.trials == 0 || self.lengths.is_empty() || self.depths.is_empty() {
            bail!("--trials, --lengths and --depths must not be empty");
        }
        if let Some(d) = self.depths.iter().find(|d| !(0.0..=100.0).contains(*d)) {
            bail!("depth {d} is not between 0 and 100");
        }
        Ok(RetrievalOptions {
            lengths: self.lengths.clone(),
            depths: self.depths.clone(),
            trials: self.trials,
            seed: self.seed,
        })
    }
}

/// Arguments of `kvq retrieval`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    // `--kv` takes a list here: comma-separated KINDs, split specs as k=KIND;v=KIND.
    #[command(flatten)]
    cache: CacheArgs,
    /// Prose to hide the pass key in (e.g. a Project Gutenberg book)
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    #[command(flatten)]
    retrieval: RetrievalArgs,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Tokenizes enough of the prose at `path` for prompts of `max_length` tokens.
pub fn haystack(path: &Path, tokenizer: &Tokenizer, max_length: usize) -> Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // About four characters a token; take twice that and stop at a character boundary.
    let mut end = (max_length * 8).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let tokens = tokenizer.encode_literal(&text[..end], false);
    if tokens.is_empty() {
        bail!("{} holds no text", path.display());
    }
    Ok(tokens)
}

/// Runs retrieval for `setups` with a progress bar; one list of cells per setup.
pub fn run_with_progress(
    model: &Gemma3,
    tokenizer: &Tokenizer,
    text: &Path,
    setups: &[CacheSetup],
    opts: &RetrievalOptions,
) -> Result<Vec<Vec<Cell>>> {
    let max_length = opts.lengths.iter().copied().max().unwrap_or(0);
    let hay = haystack(text, tokenizer, max_length)?;
    let total = opts.lengths.len() * opts.depths.len() * opts.trials * setups.len();
    let bar = progress_bar(total, "retrieval", "answers")?;
    let mut right = 0;
    let cells = retrieval(model, tokenizer, &hay, setups, opts, |i, cell, ok| {
        right += usize::from(ok);
        bar.inc(1);
        bar.set_message(format!(
            "{} tokens, depth {}%, {}: {right} right",
            cell.length,
            cell.depth,
            setups[i].policy.describe()
        ));
    })?;
    bar.finish_and_clear();
    Ok(cells)
}

/// Runs the retrieval test and prints the accuracy per scheme, length and depth.
pub fn run(args: Args) -> Result<()> {
    let (model, tokenizer) = args.model.load()?;
    let c = &model.config;
    let opts = args.retrieval.options(c.context_length)?;
    let setups = setups_with_baseline(&args.cache, c.layers)?;
    let cells = run_with_progress(&model, &tokenizer, &args.text, &setups, &opts)?;
    let baseline = baseline_summary(&cells[0]);
    if args.json {
        let schemes: Vec<_> = setups
            .iter()
            .zip(&cells)
            .map(|(s, cells)| {
                let correct: usize = cells.iter().map(|c| c.correct).sum();
                let trials: usize = cells.iter().map(|c| c.trials).sum();
                serde_json::json!({
                    "kv": s.policy.describe(),
                    "accuracy": correct as f64 / trials.max(1) as f64,
                    "cells": cells,
                })
            })
            .collect();
        let v = serde_json::json!({
            "text": args.text.display().to_string(),
            "options": opts,
            "baseline": baseline,
            "schemes": schemes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{baseline}");
    for (s, cells) in setups.iter().zip(&cells) {
        println!(
            "\n{}: accuracy per length (rows) and depth (columns)",
            s.policy.describe()
        );
        let header: Vec<String> = opts
            .depths
            .iter()
            .map(|d| format!("{:>6}", format!("{d}%")))
            .collect();
        println!("{:>8} {}", "", header.join(""));
        for &length in &opts.lengths {
            let row: Vec<String> = cells
                .iter()
                .filter(|c| c.length == length)
                .map(|c| format!("{:>6}", format!("{}/{}", c.correct, c.trials)))
                .collect();
            println!("{length:>8} {}", row.join(""));
        }
    }
    Ok(())
}
