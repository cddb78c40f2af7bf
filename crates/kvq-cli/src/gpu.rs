//! `kvq gpu-info` and `kvq bench attention --device cuda`: the CUDA backend (kvq-gpu) from the
//! command line. Without CUDA both say so and exit 0, so one binary serves CPU-only machines.

use anyhow::{bail, Result};
use kvq_codec::{build_codec, Calibration, KvSpec, OakenThresholds, Role, SchemeKind};
use kvq_gpu::{layouts, libraries, CacheShape, Gpu, PagedKernels, Tuning};

/// Arguments of `kvq gpu-info`.
#[derive(clap::Args)]
pub struct Args {}

/// Prints the device, the CUDA libraries found, and the result of the self-test kernel.
pub fn info(_: Args) -> Result<()> {
    let libs = libraries();
    println!(
        "libcuda:  {}",
        if libs.cuda { "found" } else { "not found" }
    );
    println!(
        "libnvrtc: {}",
        if libs.nvrtc { "found" } else { "not found" }
    );
    let gpu = match Gpu::open() {
        Ok(g) => g,
        Err(why) => {
            println!("no GPU available ({why}); kvq runs on the CPU");
            return Ok(());
        }
    };
    let i = gpu.info()?;
    println!("device:   {}", i.name);
    println!(
        "memory:   {:.1} GiB total, {:.1} GiB free",
        gib(i.total_bytes),
        gib(i.free_bytes)
    );
    println!(
        "compute capability {}.{}, {} multiprocessors",
        i.capability.0, i.capability.1, i.multiprocessors
    );
    let err = gpu.self_test()?;
    if err == 0.0 {
        println!("self-test: NVRTC compile, launch and f16 round trip OK");
        Ok(())
    } else {
        bail!("self-test kernel gave wrong results (largest error {err})")
    }
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Options of the CUDA attention benchmark (parsed by `bench attention`).
pub struct BenchOptions {
    /// Schemes.
    pub specs: Vec<KvSpec>,
    /// Sequences per batch.
    pub batches: Vec<usize>,
    /// Tokens per sequence.
    pub contexts: Vec<usize>,
    /// Query heads.
    pub q_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Timed repetitions (median reported).
    pub iters: usize,
    /// Print JSON instead of a table.
    pub json: bool,
}

/// The tunings to time: `KVQ_GPU_TUNINGS` as `blocks_per_sm:min_blocks` pairs separated by
/// commas (e.g. `8:3,16:3,8:4`), or by default `8:3,16:3`.
fn tunings_from_env() -> Result<Vec<Tuning>> {
    let spec = std::env::var("KVQ_GPU_TUNINGS").unwrap_or_else(|_| "8:3,16:3".into());
    spec.split(',')
        .map(|p| {
            let (a, b) = p.split_once(':').ok_or_else(|| {
                anyhow::anyhow!("KVQ_GPU_TUNINGS: expected bps:min_blocks, got {p}")
            })?;
            Ok(Tuning {
                blocks_per_sm: a.trim().parse()?,
                min_blocks: b.trim().parse()?,
            })
        })
        .collect()
}

/// The calibration of a scheme for the benchmark's rows (uniform in [-1, 1)): Oaken's
/// thresholds are the quantiles of that distribution; other schemes need none.
fn bench_calibration(kind: SchemeKind) -> Calibration {
    if kind != SchemeKind::Oaken {
        return Calibration::default();
    }
    let mut grid: Vec<f32> = (0..4096).map(|i| (i as f32 + 0.5) / 2048.0 - 1.0).collect();
    Calibration {
        oaken_thresholds: Some(OakenThresholds::from_samples(&mut grid)),
        ..Calibration::default()
    }
}

/// Decode attention over a synthetic paged cache on the GPU, for each scheme, batch, context
/// and kernel tuning, with the device-copy bandwidth measured in the same run.
pub fn bench_attention(o: BenchOptions) -> Result<()> {
    let gpu = match Gpu::open() {
        Ok(g) => g,
        Err(why) => {
            println!("--device cuda: no GPU available ({why})");
            return Ok(());
        }
    };
    let info = gpu.info()?;
    let sms = info.multiprocessors as usize;
    let copy = gpu.copy_bandwidth(1 << 30)?;
    let page_tokens = 64;
    let shape = CacheShape {
        kv_heads: o.kv_heads,
        q_heads: o.q_heads,
        head_dim: o.head_dim,
        page_tokens,
    };
    let tunings = tunings_from_env()?;
    let s = gpu.stream().clone();
    let mut rows = Vec::new();
    for spec in &o.specs {
        let kc = build_codec(spec.k, Role::Key, o.head_dim, &bench_calibration(spec.k), 1)?;
        let vc = build_codec(
            spec.v,
            Role::Value,
            o.head_dim,
            &bench_calibration(spec.v),
            2,
        )?;
        let (kl, vl) = layouts(spec.k, spec.v, kc.as_ref(), vc.as_ref())?;
        let per_token = o.kv_heads as f64
            * (kc.block_bytes() as f64 / kc.block_tokens() as f64
                + vc.block_bytes() as f64 / vc.block_tokens() as f64);
        let kernels: Vec<PagedKernels> = tunings
            .iter()
            .map(|&t| PagedKernels::new(&gpu, shape, kl.clone(), vl.clone(), t))
            .collect::<Result<_>>()?;
        for &batch in &o.batches {
            for &ctx in &o.contexts {
                let k0 = &kernels[0];
                let pages_per_seq = ctx.div_ceil(page_tokens);
                // Sequences' pages interleaved across the pool, as a shared pool would hold them.
                let table: Vec<i32> = (0..batch)
                    .flat_map(|b| (0..pages_per_seq).map(move |p| (p * batch + b) as i32))
                    .collect();
                let mut pool = s.alloc_zeros::<u8>(batch * pages_per_seq * k0.page_bytes())?;
                let dtable = s.clone_htod(&table)?;
                let chunk = ctx.min(2048);
                let n = batch * chunk * o.kv_heads * o.head_dim;
                let mut kbuf = s.alloc_zeros::<f32>(n)?;
                let mut vbuf = s.alloc_zeros::<f32>(n)?;
                let mut pos = 0;
                while pos < ctx {
                    k0.fill_uniform(&gpu, &mut kbuf, 2 * pos as u64 + 1)?;
                    k0.fill_uniform(&gpu, &mut vbuf, 2 * pos as u64 + 2)?;
                    k0.encode(
                        &gpu,
                        &mut pool,
                        &dtable,
                        pages_per_seq,
                        batch,
                        pos,
                        chunk,
                        &kbuf,
                        &vbuf,
                    )?;
                    pos += chunk;
                }
                drop((kbuf, vbuf));
                let dlens = s.clone_htod(&vec![ctx as i32; batch])?;
                let mut q = s.alloc_zeros::<f32>(batch * o.q_heads * o.head_dim)?;
                k0.fill_uniform(&gpu, &mut q, 99)?;
                let mut out = s.alloc_zeros::<f32>(q.len())?;
                let scale = 1.0 / (o.head_dim as f32).sqrt();
                let bytes = batch as f64 * ctx as f64 * per_token;
                for (t, k) in tunings.iter().zip(&kernels) {
                    let mut scratch = k.scratch(&gpu, batch, ctx, sms)?;
                    let mut run = || {
                        k.attend(
                            &gpu,
                            &pool,
                            &dtable,
                            pages_per_seq,
                            &dlens,
                            batch,
                            &q,
                            scale,
                            &mut scratch,
                            &mut out,
                        )
                    };
                    for _ in 0..3 {
                        run()?;
                    }
                    let mut times = (0..o.iters)
                        .map(|_| gpu.time(&mut run))
                        .collect::<Result<Vec<f64>>>()?;
                    let ms = kvq_gpu::median(&mut times);
                    let gbs = bytes / (ms * 1e-3) / 1e9;
                    rows.push(serde_json::json!({
                        "kv": spec.name(), "batch": batch, "ctx": ctx, "q_heads": o.q_heads, "kv_heads": o.kv_heads,
                        "head_dim": o.head_dim, "tuning": t.label(),
                        "ms": ms, "bytes_read": bytes, "gb_per_s": gbs, "copy_gb_per_s": copy / 1e9,
                        "pct_of_copy": 100.0 * gbs * 1e9 / copy, "device": info.name,
                    }));
                }
            }
        }
    }
    if o.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!(
            "{}: device copy {:.0} GB/s (read + write)",
            info.name,
            copy / 1e9
        );
        println!(
            "{:<10} {:>5} {:>7} {:>8} {:>9} {:>11} {:>8} {:>6}",
            "kv", "batch", "ctx", "tuning", "ms", "MB read", "GB/s", "%copy"
        );
        for r in &rows {
            println!(
                "{:<10} {:>5} {:>7} {:>8} {:>9.4} {:>11.1} {:>8.0} {:>6.1}",
                r["kv"].as_str().unwrap_or(""),
                r["batch"],
                r["ctx"],
                r["tuning"].as_str().unwrap_or(""),
                r["ms"].as_f64().unwrap_or(0.0),
                r["bytes_read"].as_f64().unwrap_or(0.0) / 1e6,
                r["gb_per_s"].as_f64().unwrap_or(0.0),
                r["pct_of_copy"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}
