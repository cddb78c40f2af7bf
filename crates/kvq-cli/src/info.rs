//! `kvq info`: what a GGUF file holds.

use crate::args::ModelArgs;
use anyhow::Result;
use kvq_model::gemma3::Gemma3Config;

/// Arguments of `kvq info`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Prints the architecture, hyperparameters and tensor types.
pub fn run(args: Args) -> Result<()> {
    let g = args.model.open()?;
    let histogram: Vec<(String, usize)> = g
        .type_histogram()
        .into_iter()
        .map(|(t, n)| (t.name().to_string(), n))
        .collect();
    let config = Gemma3Config::from_gguf(&g);
    let arch = g
        .get_str("general.architecture")
        .unwrap_or("unknown")
        .to_string();
    let name = g.get_str("general.name").unwrap_or("").to_string();
    let params: usize = g.tensors.values().map(|t| t.elements()).sum();
    let bytes: usize = g.tensors.values().map(|t| t.len).sum();
    if args.json {
        let mut v = serde_json::json!({
            "architecture": arch, "name": name, "gguf_version": g.version,
            "tensors": g.tensors.len(), "parameters": params, "tensor_bytes": bytes,
            "tensor_types": histogram.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        });
        if let Ok(c) = &config {
            v["layers"] = c.layers.into();
            v["hidden"] = c.hidden.into();
            v["q_heads"] = c.q_heads.into();
            v["kv_heads"] = c.kv_heads.into();
            v["head_dim"] = c.head_dim.into();
            v["ffn"] = c.ffn.into();
            v["vocab"] = c.vocab.into();
            v["context_length"] = c.context_length.into();
            v["sliding_window"] = c.sliding_window.into();
            v["rope_base_global"] = c.rope_base_global.into();
            v["rope_base_local"] = c.rope_base_local.into();
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("model          {name} ({arch}), GGUF v{}", g.version);
    println!(
        "parameters     {:.1} M in {} tensors, {:.1} MiB",
        params as f64 / 1e6,
        g.tensors.len(),
        bytes as f64 / (1 << 20) as f64
    );
    match &config {
        Ok(c) => {
            println!(
                "layers         {} ({} sliding-window of {} tokens, {} global)",
                c.layers,
                (0..c.layers).filter(|&l| c.is_sliding(l)).count(),
                c.sliding_window,
                (0..c.layers).filter(|&l| !c.is_sliding(l)).count()
            );
            println!("hidden         {}, FFN {}", c.hidden, c.ffn);
            println!(
                "attention      {} query heads, {} KV heads, head_dim {}",
                c.q_heads, c.kv_heads, c.head_dim
            );
            println!("vocabulary     {}", c.vocab);
            println!("context        {} tokens", c.context_length);
            println!(
                "RoPE base      {} global, {} local",
                c.rope_base_global, c.rope_base_local
            );
        }
        Err(e) => println!("not runnable   {e}"),
    }
    println!(
        "tensor types   {}",
        histogram
            .iter()
            .map(|(t, n)| format!("{n} × {t}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
