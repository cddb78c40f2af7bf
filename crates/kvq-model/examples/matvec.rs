//! Decode's weight products one kind at a time: for each weight of a layer (and the LM head),
//! the matrix-vector products of every layer in turn, as one decoded token runs them, timed
//! over repetitions. Prints microseconds per token and the rate at which the weights stream,
//! then each weight of layer 0 alone, repeated while it stays in cache ("hot": the kernels'
//! own speed, in nanoseconds per row).
//!
//! `cargo run --release -p kvq-model --example matvec [-- MODEL.gguf]`
//! (environment: `REPS`, tokens to time, default 40; best and median are printed;
//! `SYNTHETIC=1` times random matrices of the reference model's weight types and shapes
//! instead of a model file, for a machine without it).

use kvq_model::gguf::{Gguf, TensorType};
use kvq_model::matmul::QMatrix;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // On a worker of rayon's pool, as `kvq` runs its commands: each product's parallel loop
    // starts inside the pool instead of handing its work over to it.
    rayon::join(run, || ()).0.map_err(|e| e.to_string().into())
}

fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let kinds = if std::env::var_os("SYNTHETIC").is_some() {
        synthetic_weights()
    } else {
        model_weights()?
    };
    time(&kinds, reps);
    Ok(())
}

/// Each weight kind of decode, with its matrix in every layer (the LM head last).
type Weights = Vec<(String, Vec<QMatrix>)>;

const KINDS: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

fn model_weights() -> Result<Weights, Box<dyn std::error::Error + Send + Sync>> {
    let path = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(kvq_model::reference_model_path);
    let g = Gguf::open(&path)?;
    let layers = g.get_usize("gemma3.block_count")?;
    let matrix = |name: &str| -> Result<QMatrix, Box<dyn std::error::Error + Send + Sync>> {
        let t = g.tensor(name)?;
        Ok(QMatrix {
            dtype: t.dtype,
            rows: t.dims[1],
            cols: t.dims[0],
            data: g.tensor_bytes(t).to_vec(),
        })
    };
    let mut kinds: Weights = Vec::new();
    for kind in KINDS {
        let all = (0..layers)
            .map(|l| matrix(&format!("blk.{l}.{kind}.weight")))
            .collect::<Result<Vec<_>, _>>()?;
        kinds.push((kind.to_string(), all));
    }
    kinds.push(("output".into(), vec![matrix("token_embd.weight")?]));
    Ok(kinds)
}

/// Random matrices of the reference model's types and shapes (18 layers; `ffn_down` all
/// Q6_K), their f16 scales kept small so that no product overflows ([`QMatrix::random`]).
fn synthetic_weights() -> Weights {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut random = |dtype, rows, cols| QMatrix::random(dtype, rows, cols, &mut rng);
    let shapes = [
        (TensorType::Q5_0, 1024, 640),
        (TensorType::Q5_0, 256, 640),
        (TensorType::Q8_0, 256, 640),
        (TensorType::Q4K, 640, 1024),
        (TensorType::Q5_0, 2048, 640),
        (TensorType::Q5_0, 2048, 640),
        (TensorType::Q6K, 640, 2048),
    ];
    let mut kinds: Weights = KINDS
        .iter()
        .zip(shapes)
        .map(|(kind, (dtype, rows, cols))| {
            let all = (0..18).map(|_| random(dtype, rows, cols)).collect();
            (kind.to_string(), all)
        })
        .collect();
    kinds.push((
        "output".into(),
        vec![random(TensorType::Q8_0, 262_144, 640)],
    ));
    kinds
}

fn time(kinds: &Weights, reps: usize) {
    println!(
        "{:12} {:>6} {:>10} {:>10} {:>9} {:>8}",
        "weight", "type", "best µs", "median µs", "MiB", "GB/s"
    );
    let (mut best_total, mut median_total) = (0.0, 0.0);
    for (kind, matrices) in kinds {
        let x: Vec<f32> = (0..matrices[0].cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let mut y = vec![0f32; matrices[0].rows];
        let mut times: Vec<f64> = (0..reps + 2)
            .map(|_| {
                let start = Instant::now();
                for m in matrices {
                    m.matvec(&x, &mut y);
                }
                start.elapsed().as_secs_f64() * 1e6
            })
            .skip(2)
            .collect();
        times.sort_by(f64::total_cmp);
        let bytes: usize = matrices.iter().map(|m| m.data.len()).sum();
        let (best, median) = (times[0], times[times.len() / 2]);
        best_total += best;
        median_total += median;
        println!(
            "{:12} {:>6} {:>10.1} {:>10.1} {:>9.1} {:>8.1}",
            kind,
            matrices[0].dtype.name(),
            best,
            median,
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / median / 1e3
        );
    }
    println!(
        "{:12} {:>6} {best_total:>10.1} {median_total:>10.1}",
        "all", ""
    );
    for (kind, matrices) in &kinds[..7] {
        let m = &matrices[0];
        let x: Vec<f32> = (0..m.cols).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut y = vec![0f32; m.rows];
        let start = Instant::now();
        for _ in 0..2000 {
            m.matvec(&x, &mut y);
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / 2000.0;
        println!(
            "hot {kind:12} {us:8.2} µs  {:.1} ns/row",
            us * 1e3 / m.rows as f64
        );
    }
}
