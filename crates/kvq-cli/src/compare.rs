//! `kvq compare`: several schemes on one model and text — perplexity, KL divergence and top-1
//! agreement against the 16-bit cache, retrieval — written as a table (Markdown, JSON) and
//! PNG plots. Also holds the scheme-list and progress helpers of `ppl` and `retrieval`.

use crate::args::{CacheArgs, ModelArgs};
use crate::ppl::text_chunks;
use crate::retrieval::{run_with_progress, RetrievalArgs};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kvq_cache::{CacheOptions, Policy};
use kvq_codec::{Calibration, KvSpec};
use kvq_eval::compare::{pareto_front, render_markdown, CompareReport, SchemeResult};
use kvq_eval::retrieval::baseline_summary;
use kvq_eval::{perplexity_many, plot, CacheSetup};
use std::path::PathBuf;

/// Arguments of `kvq compare`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    // `--kv` takes a list here: comma-separated KINDs, split specs as k=KIND;v=KIND.
    #[command(flatten)]
    cache: CacheArgs,
    /// Perplexity text
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Folder for compare.md, compare.json and the plots
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Tokens per perplexity chunk
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Perplexity chunks
    #[arg(long, default_value_t = 64)]
    chunks: usize,
    /// Context at which cache bytes are stated [default: the model's context length]
    #[arg(long, value_name = "TOKENS")]
    bytes_ctx: Option<usize>,
    /// Prose for passkey retrieval (no retrieval without it)
    #[arg(long, value_name = "FILE")]
    retrieval_text: Option<PathBuf>,
    #[command(flatten)]
    retrieval: RetrievalArgs,
}

/// A progress bar on stderr over `len` steps of `unit`.
pub fn progress_bar(len: usize, name: &str, unit: &str) -> Result<ProgressBar> {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {name} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}} ({{elapsed}}, eta {{eta}})"
        ))?
        .progress_chars("=> "),
    );
    Ok(bar)
}

/// Splits a `--kv` list into one `CacheArgs` per scheme. Items are comma-separated; a split
/// spec is written `k=A;v=B` (or `k=A,v=B`, whose halves are joined back).
pub fn expand(cache: &CacheArgs) -> Result<Vec<CacheArgs>> {
    let mut specs: Vec<String> = Vec::new();
    for item in cache.kv.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match specs.last_mut() {
            Some(prev)
                if item.starts_with("v=") && prev.starts_with("k=") && !prev.contains("v=") =>
            {
                prev.push(',');
                prev.push_str(item);
            }
            _ => specs.push(item.replace(';', ",")),
        }
    }
    if specs.is_empty() {
        bail!("--kv lists no scheme");
    }
    Ok(specs
        .into_iter()
        .map(|kv| {
            let mut a = cache.clone();
            a.kv = kv;
            a
        })
        .collect())
}

/// The 16-bit reference cache for `scheme`: f16 in every layer, same page size and seed.
pub fn f16_reference(scheme: &CacheSetup, layers: usize) -> Result<CacheSetup> {
    Ok(CacheSetup {
        policy: Policy::uniform(KvSpec::parse("f16")?, layers),
        calibration: vec![(Calibration::default(), Calibration::default()); layers],
        options: CacheOptions {
            hot_window: 0,
            sink_tokens: 0,
            ..scheme.options
        },
    })
}

/// The cache setup of one scheme for a model of `layers` layers.
pub fn setup(cache: &CacheArgs, layers: usize) -> Result<CacheSetup> {
    Ok(CacheSetup {
        policy: cache.policy(layers)?,
        calibration: cache.calibration(layers)?,
        options: cache.options(512)?,
    })
}

/// The f16 baseline followed by every scheme of the `--kv` list that differs from it.
pub fn setups_with_baseline(cache: &CacheArgs, layers: usize) -> Result<Vec<CacheSetup>> {
    let schemes = expand(cache)?
        .iter()
        .map(|a| setup(a, layers))
        .collect::<Result<Vec<_>>>()?;
    let base = f16_reference(&schemes[0], layers)?;
    let mut out = vec![base.clone()];
    out.extend(schemes.into_iter().filter(|s| s.policy != base.policy));
    Ok(out)
}

/// Runs the comparison and writes the table and plots.
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
    let retrieval_opts = match &args.retrieval_text {
        Some(_) => Some(args.retrieval.options(c.context_length)?),
        None => None,
    };
    let bytes_ctx = args.bytes_ctx.unwrap_or(c.context_length);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let schemes = expand(&args.cache)?
        .iter()
        .map(|a| setup(a, c.layers))
        .collect::<Result<Vec<_>>>()?;
    let reference = f16_reference(&schemes[0], c.layers)?;
    eprintln!(
        "perplexity of {} schemes and the f16 reference over {chunks} chunks of {} tokens",
        schemes.len(),
        args.ctx
    );
    let bar = progress_bar(chunks, "ppl", "chunks")?;
    let reports = perplexity_many(
        &model,
        &tokens,
        tokenizer.bos_id(),
        args.ctx,
        chunks,
        Some(&reference),
        &schemes,
        |done, _| bar.set_position(done as u64),
    )?;
    bar.finish_and_clear();

    let mut retrieval_cells = vec![Vec::new(); schemes.len()];
    let mut retrieval_baseline = None;
    if let (Some(text), Some(opts)) = (&args.retrieval_text, &retrieval_opts) {
        // The baseline runs first; schemes equal to it reuse its answers.
        let setups = setups_with_baseline(&args.cache, c.layers)?;
        let cells = run_with_progress(&model, &tokenizer, text, &setups, opts)?;
        retrieval_baseline = Some(baseline_summary(&cells[0]));
        for (scheme, out) in schemes.iter().zip(retrieval_cells.iter_mut()) {
            let i = setups
                .iter()
                .position(|s| s.policy == scheme.policy)
                .unwrap_or(0);
            *out = cells[i].clone();
        }
    }

    let shapes = c.layer_shapes();
    let mut results = Vec::with_capacity(schemes.len());
    for ((s, r), cells) in schemes.iter().zip(&reports).zip(retrieval_cells) {
        let plan = |ctx: usize, append: usize| {
            let mut o = s.options;
            o.max_append_tokens = append;
            kvq_cache::memory::plan(&shapes, &s.policy, &o, ctx, 1)
        };
        let at_ppl = plan(args.ctx, kvq_eval::perplexity::append_tokens(args.ctx))?;
        let at_ctx = plan(bytes_ctx, 512)?;
        let k = r
            .kld
            .as_ref()
            .context("the comparison runs the reference")?;
        let (correct, trials) = cells
            .iter()
            .fold((0, 0), |(a, b), c| (a + c.correct, b + c.trials));
        results.push(SchemeResult {
            kv: s.policy.describe(),
            bits_per_element: at_ppl.bits_per_element,
            bits_per_element_at_ctx: at_ctx.bits_per_element,
            kv_bytes: at_ctx.bytes,
            ppl: r.ppl,
            ppl_stderr: r.ppl_stderr,
            delta_ppl_percent: 100.0 * (r.ppl / k.ppl_reference - 1.0),
            kld: k.kld_mean,
            kld_p99: k.kld_p99,
            top1_agree: k.top1_agree,
            retrieval: (trials > 0).then(|| correct as f64 / trials as f64),
            retrieval_cells: cells,
        });
    }
    let points: Vec<(f64, f64)> = results
        .iter()
        .map(|r| (r.bits_per_element, r.kld))
        .collect();
    let report = CompareReport {
        model: args.model.path()?.display().to_string(),
        text: args.text.display().to_string(),
        ctx: args.ctx,
        chunks: reports.first().map_or(0, |r| r.chunks),
        tokens: reports.first().map_or(0, |r| r.tokens),
        bytes_ctx,
        ppl_f16: reports
            .first()
            .and_then(|r| r.kld.as_ref())
            .map_or(f64::NAN, |k| k.ppl_reference),
        retrieval_text: args
            .retrieval_text
            .as_ref()
            .map(|p| p.display().to_string()),
        retrieval_options: retrieval_opts,
        retrieval_baseline,
        pareto: pareto_front(&points),
        schemes: results,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let write = |name: &str, contents: String| -> Result<()> {
        let path = args.out.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))
    };
    write("compare.md", render_markdown(&report))?;
    let mut json = serde_json::to_value(&report)?;
    json["machine"] = machine().into();
    write("compare.json", serde_json::to_string_pretty(&json)? + "\n")?;
    plot::kld_vs_bits(&report, &args.out.join("kld_vs_bits.png"))?;
    if report.retrieval_options.is_some() {
        plot::retrieval_heatmaps(&report, &args.out.join("retrieval.png"))?;
    }
    println!("{}", render_markdown(&report));
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

/// The CPU model and core count, for the record.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cache: CacheArgs,
    }

    fn kinds(list: &str) -> Vec<String> {
        let cli = Cli::parse_from(["t", "--kv", list]);
        expand(&cli.cache)
            .unwrap()
            .into_iter()
            .map(|a| a.kv)
            .collect()
    }

    #[test]
    fn scheme_lists_split_on_commas_and_keep_split_specs() {
        assert_eq!(kinds("f16, q4_0,turbo3.5"), ["f16", "q4_0", "turbo3.5"]);
        assert_eq!(kinds("q8_0,k=q8_0;v=q4_0"), ["q8_0", "k=q8_0,v=q4_0"]);
        assert_eq!(kinds("k=q8_0,v=q4_0,int4"), ["k=q8_0,v=q4_0", "int4"]);
    }
}
