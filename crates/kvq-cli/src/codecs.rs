//! `kvq codecs`: every scheme with its exact storage cost.

use anyhow::Result;
use kvq_codec::{build_codec, scheme_names, Role, SchemeKind};

/// Arguments of `kvq codecs`.
#[derive(clap::Args)]
pub struct Args {
    /// Elements per attention head
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Lists every scheme, its bits per element for keys and values, and its block layout.
pub fn run(args: Args) -> Result<()> {
    let sizing = kvq_cache::memory::sizing_calibration();
    let mut rows = Vec::new();
    for name in scheme_names() {
        let kind = SchemeKind::parse(&name)?;
        let k = build_codec(kind, Role::Key, args.head_dim, &sizing, 0);
        let v = build_codec(kind, Role::Value, args.head_dim, &sizing, 0);
        match (k, v) {
            (Ok(k), Ok(v)) => {
                let bits = (k.bits_per_element() + v.bits_per_element()) / 2.0;
                rows.push(serde_json::json!({
                    "name": name,
                    "bits_per_element": bits,
                    "k_bits_per_element": k.bits_per_element(),
                    "v_bits_per_element": v.bits_per_element(),
                    "k_block_tokens": k.block_tokens(), "k_block_bytes": k.block_bytes(),
                    "v_block_tokens": v.block_tokens(), "v_block_bytes": v.block_bytes(),
                }));
            }
            (Err(e), _) | (_, Err(e)) => {
                rows.push(serde_json::json!({"name": name, "error": e.to_string()}))
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<14} {:>8} {:>8} {:>8}   head_dim {}",
        "scheme", "bits", "K bits", "V bits", args.head_dim
    );
    for r in &rows {
        match r.get("error") {
            Some(e) => println!(
                "{:<14} unavailable: {}",
                r["name"].as_str().unwrap_or(""),
                e.as_str().unwrap_or("")
            ),
            None => println!(
                "{:<14} {:>8.4} {:>8.4} {:>8.4}",
                r["name"].as_str().unwrap_or(""),
                r["bits_per_element"].as_f64().unwrap_or(0.0),
                r["k_bits_per_element"].as_f64().unwrap_or(0.0),
                r["v_bits_per_element"].as_f64().unwrap_or(0.0)
            ),
        }
    }
    println!("(bits count every scale, minimum, norm and outlier entry; the cache's hot window and sinks come on top: see `kvq memory`)");
    Ok(())
}
