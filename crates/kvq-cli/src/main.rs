//! `kvq`: run language models on compressed KV caches, and measure what the compression costs
//! in quality and saves in memory and time. Each subcommand lives in its own module; this file
//! holds the argument definitions shared by several of them.

mod args;
mod bench;
mod calibrate;
mod codecs;
mod compare;
mod generate;
mod gpu;
mod info;
mod memory;
mod ppl;
mod retrieval;
mod sensitivity;
mod serve;
mod tune;

use clap::{Parser, Subcommand};

/// kvq — compressed KV caches for LLM inference.
#[derive(Parser)]
#[command(name = "kvq", version, about, long_about = None)]
struct Cli {
    /// CPU threads for the parallel work (matrix products, attention, cache filling); by
    /// default one per core, or RAYON_NUM_THREADS where it is set
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A model's architecture, hyperparameters and tensor-type histogram.
    Info(info::Args),
    /// Every KV scheme with its exact bits per element for a head size.
    Codecs(codecs::Args),
    /// Generate text on a compressed KV cache (tokens stream to stdout).
    Generate(generate::Args),
    /// Perplexity over a text file with the cache in the loop (llama-perplexity's procedure).
    Ppl(ppl::Args),
    /// Passkey retrieval at given lengths and depths; --kv takes a list, f16 runs too.
    Retrieval(retrieval::Args),
    /// Several schemes (--kv LIST) on one model and text: table (Markdown, JSON) and PNG plots.
    Compare(compare::Args),
    /// Exact KV-cache bytes for a model, context, batch and scheme.
    Memory(memory::Args),
    /// Offline profiling (Oaken thresholds, FP8 and channel scales, outlier channels) to a profile.
    Calibrate(calibrate::Args),
    /// Per-layer quality cost (KLD, Δppl) of quantizing one layer's K or V alone; JSON, PNG.
    Sensitivity(sensitivity::Args),
    /// A per-layer K/V policy meeting a KLD or bit budget, from a sensitivity report.
    Tune(tune::Args),
    /// Benchmarks: `attention` (kernel on a synthetic cache) and `decode` (whole model).
    Bench(bench::Args),
    /// The CUDA device, libraries found, and a self-test kernel (exits 0 without CUDA).
    GpuInfo(gpu::Args),
    /// OpenAI-compatible server with continuous batching over the compressed cache.
    Serve(serve::Args),
}

fn main() {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`kvq ... | head`).
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    if let Some(threads) = cli.threads {
        // Before any parallel work: the global pool is built once, on first use.
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.into())
            .build_global()
        {
            eprintln!("error: --threads {threads}: {e}");
            std::process::exit(1);
        }
    }
    // Run the command on a worker of rayon's global pool: the parallel loops of every matrix
    // product and attention call (about 150 per decoded token) then start from inside the pool,
    // and the worker that runs the command takes part in them.
    let (result, ()) = rayon::join(|| run(cli), || ());
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Runs one subcommand.
fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info(a) => info::run(a),
        Command::Codecs(a) => codecs::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Ppl(a) => ppl::run(a),
        Command::Memory(a) => memory::run(a),
        Command::Retrieval(a) => retrieval::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Sensitivity(a) => sensitivity::run(a),
        Command::Tune(a) => tune::run(a),
        Command::Bench(a) => bench::run(a),
        Command::GpuInfo(a) => gpu::info(a),
        Command::Serve(a) => serve::run(a),
    }
}
