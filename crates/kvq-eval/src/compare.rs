//! The side-by-side comparison of several schemes on one model and text: its report, the
//! Pareto front of quality against size, and the Markdown table.

use crate::retrieval::{Cell, RetrievalOptions};
use serde::Serialize;
use std::fmt::Write;

/// Everything measured for one scheme.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SchemeResult {
    /// The scheme (`--kv` spelling).
    pub kv: String,
    /// Cache bits per element at the perplexity context (what the measurement used; all
    /// metadata, sinks and hot window counted).
    pub bits_per_element: f64,
    /// Cache bits per element at [`CompareReport::bytes_ctx`].
    pub bits_per_element_at_ctx: f64,
    /// Cache bytes of one sequence at [`CompareReport::bytes_ctx`].
    pub kv_bytes: usize,
    /// Perplexity.
    pub ppl: f64,
    /// Standard error of the perplexity.
    pub ppl_stderr: f64,
    /// Change of perplexity against the 16-bit cache, in percent.
    pub delta_ppl_percent: f64,
    /// Mean KL divergence against the 16-bit cache (nats).
    pub kld: f64,
    /// 99th percentile of the per-token KL divergence.
    pub kld_p99: f64,
    /// Share of tokens whose top-1 prediction matches the 16-bit cache's.
    pub top1_agree: f64,
    /// Retrieval accuracy over every cell, when retrieval ran.
    pub retrieval: Option<f64>,
    /// Retrieval accuracy per length and depth.
    pub retrieval_cells: Vec<Cell>,
}

/// The comparison of several schemes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompareReport {
    /// Model file.
    pub model: String,
    /// Perplexity text.
    pub text: String,
    /// Tokens per perplexity chunk.
    pub ctx: usize,
    /// Chunks scored.
    pub chunks: usize,
    /// Tokens scored per scheme.
    pub tokens: usize,
    /// Context at which `kv_bytes` is stated.
    pub bytes_ctx: usize,
    /// Perplexity with the 16-bit cache.
    pub ppl_f16: f64,
    /// Retrieval text and settings, when retrieval ran.
    pub retrieval_text: Option<String>,
    /// Retrieval settings, when retrieval ran.
    pub retrieval_options: Option<RetrievalOptions>,
    /// What the 16-bit baseline retrieves, when retrieval ran.
    pub retrieval_baseline: Option<String>,
    /// One entry per scheme, in the order given.
    pub schemes: Vec<SchemeResult>,
    /// Indices of the schemes on the Pareto front of (bits per element, mean KLD).
    pub pareto: Vec<usize>,
    /// The command line that produced the report.
    pub command: String,
}

/// Indices of the points not dominated when both coordinates are to be minimized: no other
/// point is at most as large in both and smaller in one. Sorted by the first coordinate.
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let dominated = |i: usize| {
        let (x, y) = points[i];
        points
            .iter()
            .any(|&(a, b)| a <= x && b <= y && (a < x || b < y))
    };
    let mut front: Vec<usize> = (0..points.len()).filter(|&i| !dominated(i)).collect();
    front.sort_by(|&a, &b| points[a].0.total_cmp(&points[b].0));
    front
}

/// Bytes in binary units (`12.0 MiB`).
fn human_bytes(bytes: usize) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

/// Renders the report as Markdown: settings, the table (Pareto-front schemes in bold) and,
/// when retrieval ran, the baseline sentence and a length × depth table per scheme.
pub fn render_markdown(r: &CompareReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# KV-cache scheme comparison\n");
    let _ = writeln!(
        s,
        "Model `{}`, text `{}`: perplexity over {} chunks of {} tokens ({} scored tokens per \
         scheme); KL divergence and top-1 agreement against the 16-bit (f16) cache on the same \
         tokens. Bits per element count every scale, index and hot-window row; \"bits @ {}\" and \
         the bytes are for one sequence of {} tokens. **Bold**: on the Pareto front of bits \
         (at {}) against mean KLD.\n",
        r.model, r.text, r.chunks, r.ctx, r.tokens, r.bytes_ctx, r.bytes_ctx, r.ctx
    );
    let _ = writeln!(
        s,
        "| scheme | bits/elem @ {} | bits/elem @ {} | cache bytes @ {} | PPL | ΔPPL % | KLD mean | KLD p99 | top-1 agree | retrieval |",
        r.ctx, r.bytes_ctx, r.bytes_ctx
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, x) in r.schemes.iter().enumerate() {
        let name = if r.pareto.contains(&i) {
            format!("**{}**", x.kv)
        } else {
            x.kv.clone()
        };
        let retrieval = x
            .retrieval
            .map_or("–".to_string(), |a| format!("{:.0}%", 100.0 * a));
        let _ = writeln!(
            s,
            "| {name} | {:.3} | {:.3} | {} | {:.4} ± {:.3} | {:+.2} | {:.5} | {:.4} | {:.2}% | {retrieval} |",
            x.bits_per_element,
            x.bits_per_element_at_ctx,
            human_bytes(x.kv_bytes),
            x.ppl,
            x.ppl_stderr,
            x.delta_ppl_percent,
            x.kld,
            x.kld_p99,
            100.0 * x.top1_agree,
        );
    }
    if let (Some(text), Some(opts)) = (&r.retrieval_text, &r.retrieval_options) {
        let _ = writeln!(
            s,
            "\n## Passkey retrieval\n\nText `{text}`; {} trials (seeded 5-digit keys, seed {}) \
             per length and depth; accuracy in percent, rows are lengths in tokens, columns \
             needle depths.\n",
            opts.trials, opts.seed
        );
        if let Some(b) = &r.retrieval_baseline {
            let _ = writeln!(s, "{b}\n");
        }
        for x in &r.schemes {
            let _ = writeln!(s, "**{}**\n", x.kv);
            let header: Vec<String> = opts.depths.iter().map(|d| format!("{d}%")).collect();
            let _ = writeln!(s, "| length | {} |", header.join(" | "));
            let _ = writeln!(s, "|---:|{}", "---:|".repeat(opts.depths.len()));
            for &length in &opts.lengths {
                let row: Vec<String> = x
                    .retrieval_cells
                    .iter()
                    .filter(|c| c.length == length)
                    .map(|c| format!("{:.0}", 100.0 * c.accuracy()))
                    .collect();
                let _ = writeln!(s, "| {length} | {} |", row.join(" | "));
            }
            s.push('\n');
        }
    }
    let _ = writeln!(s, "\nCommand: `{}`", r.command);
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn pareto_front_keeps_only_undominated_points() {
        let pts = [
            (16.0, 0.0),
            (8.5, 0.01),
            (4.5, 0.2),
            (4.5, 0.1),
            (5.0, 0.3),
            (2.5, 1.0),
        ];
        // (4.5, 0.2) is dominated by (4.5, 0.1); (5.0, 0.3) by (4.5, 0.1).
        assert_eq!(pareto_front(&pts), vec![5, 3, 1, 0]);
        // Duplicates do not dominate each other.
        assert_eq!(pareto_front(&[(1.0, 1.0), (1.0, 1.0)]), vec![0, 1]);
        assert!(pareto_front(&[]).is_empty());
    }

    /// A small fake report: f16, q4_0 with retrieval cells.
    pub(crate) fn fake_report() -> CompareReport {
        let cell = |length, depth, correct| Cell {
            length,
            depth,
            trials: 2,
            correct,
        };
        let scheme = |kv: &str, bits: f64, ppl: f64, kld: f64, correct: usize| SchemeResult {
            kv: kv.to_string(),
            bits_per_element: bits,
            bits_per_element_at_ctx: bits,
            kv_bytes: (bits * 1024.0 * 1024.0) as usize,
            ppl,
            ppl_stderr: 0.4,
            delta_ppl_percent: 100.0 * (ppl / 17.5 - 1.0),
            kld,
            kld_p99: 10.0 * kld,
            top1_agree: 1.0 - kld,
            retrieval: Some(correct as f64 / 4.0),
            retrieval_cells: vec![
                cell(1024, 0.0, correct / 2),
                cell(1024, 100.0, correct - correct / 2),
            ],
        };
        let schemes = vec![
            scheme("f16", 16.0, 17.5, 0.0, 4),
            scheme("q4_0", 4.5, 19.25, 0.1, 3),
            scheme("int4", 5.0, 24.0, 0.3, 1),
        ];
        CompareReport {
            model: "m.gguf".into(),
            text: "wiki.test.raw".into(),
            ctx: 512,
            chunks: 2,
            tokens: 510,
            bytes_ctx: 32768,
            ppl_f16: 17.5,
            retrieval_text: Some("book.txt".into()),
            retrieval_options: Some(RetrievalOptions {
                lengths: vec![1024],
                depths: vec![0.0, 100.0],
                trials: 2,
                seed: 1,
            }),
            retrieval_baseline: Some("baseline sentence".into()),
            pareto: pareto_front(&[(16.0, 0.0), (4.5, 0.1), (5.0, 0.3)]),
            schemes,
            command: "kvq compare".into(),
        }
    }

    #[test]
    fn markdown_table_of_a_fake_report() {
        let md = render_markdown(&fake_report());
        assert!(md.contains("| **f16** | 16.000 | 16.000 | 16.0 MiB | 17.5000 ± 0.400 | +0.00 | 0.00000 | 0.0000 | 100.00% | 100% |"), "{md}");
        assert!(md.contains("| **q4_0** | 4.500 | 4.500 | 4.5 MiB | 19.2500 ± 0.400 | +10.00 | 0.10000 | 1.0000 | 90.00% | 75% |"), "{md}");
        assert!(md.contains("| int4 | 5.000 |"), "{md}");
        assert!(md.contains("| length | 0% | 100% |"), "{md}");
        assert!(
            md.contains(
                "**q4_0**\n\n| length | 0% | 100% |\n|---:|---:|---:|\n| 1024 | 50 | 100 |"
            ),
            "{md}"
        );
        assert!(md.contains("baseline sentence"));
        assert!(md.ends_with("Command: `kvq compare`\n"));
    }

    #[test]
    fn report_serializes_with_the_documented_keys() {
        let v = serde_json::to_value(fake_report()).unwrap();
        let s = &v["schemes"][1];
        for key in [
            "kv",
            "bits_per_element",
            "kv_bytes",
            "ppl",
            "delta_ppl_percent",
            "kld",
            "kld_p99",
            "top1_agree",
            "retrieval",
        ] {
            assert!(s.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["pareto"], serde_json::json!([1, 0]));
    }
}
