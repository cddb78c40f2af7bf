//! `kvq tune`: a per-layer K/V policy that meets a KL-divergence or a bit budget, chosen from a
//! sensitivity report, written to a policy file and measured.

use crate::args::{read_tokens, ModelArgs, ProfileArgs};
use crate::compare::progress_bar;
use crate::sensitivity::read_report;
use anyhow::{bail, Context, Result};
use kvq_cache::{CacheOptions, LayerSchemes, Policy};
use kvq_calib::tune::{choose, Budget, Candidate};
use kvq_calib::{ModelIdentity, PolicyFile};
use kvq_codec::{build_codec, Calibration, KvSpec, Role, SchemeKind};
use kvq_eval::{perplexity_many, CacheSetup};
use std::path::PathBuf;

/// Arguments of `kvq tune`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("budget").required(true).args(["max_kld", "bits"])))]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    profile: ProfileArgs,
    /// Report of `kvq sensitivity --json`
    #[arg(long, value_name = "SENSITIVITY.json")]
    report: PathBuf,
    /// KL-divergence budget (sum of the layers' measured KLD): the fewest bits that meet it
    #[arg(long, value_name = "X")]
    max_kld: Option<f64>,
    /// Bit budget (average bits per element): the lowest KL divergence that meets it
    #[arg(long, value_name = "B")]
    bits: Option<f64>,
    /// Policy file to write
    #[arg(long, value_name = "POLICY")]
    out: PathBuf,
    /// Schemes to choose from [default: the report's schemes and f16]
    #[arg(long, value_name = "KIND[,KIND...]")]
    candidates: Option<String>,
    /// Uniform schemes to measure next to the tuned policy, on the same chunks
    #[arg(long, value_name = "SPEC[;SPEC...]")]
    baselines: Option<String>,
    /// Text to measure the policy on [default: the report's]
    #[arg(long, value_name = "FILE")]
    text: Option<PathBuf>,
    /// Chunks to measure on [default: the report's]
    #[arg(long)]
    chunks: Option<usize>,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Chooses, writes and measures the policy.
pub fn run(args: Args) -> Result<()> {
    let report = read_report(&args.report)?;
    let identity = ModelIdentity::of(&args.model.open()?)?;
    if let Some((field, a, b)) = report.model.difference(&identity) {
        bail!("the report was measured on another model ({field}: {a} in the report, {b} here)");
    }
    if let (Some(p), None) = (&report.profile, &args.profile.profile) {
        bail!("the report was measured with --profile {p}; pass a profile here too");
    }
    let (model, tokenizer) = args.model.load()?;
    let c = &model.config;
    let calibration = args.profile.calibration(c.layers)?;

    let kinds: Vec<SchemeKind> = match &args.candidates {
        Some(list) => list
            .split(',')
            .map(|s| SchemeKind::parse(s.trim()))
            .collect::<Result<_, _>>()?,
        None => std::iter::once(Ok(SchemeKind::F16))
            .chain(report.schemes.iter().map(|s| SchemeKind::parse(&s.scheme)))
            .collect::<Result<_, _>>()?,
    };
    let bits_of = |kind, role| -> Result<f64> {
        let cal = calibration
            .first()
            .map_or(Calibration::default(), |(k, v)| {
                if role == Role::Key {
                    k.clone()
                } else {
                    v.clone()
                }
            });
        Ok(build_codec(kind, role, c.head_dim, &cal, 0)?.bits_per_element())
    };
    let mut items: Vec<Vec<Candidate>> = vec![Vec::new(); 2 * c.layers];
    for &kind in &kinds {
        let measured = report.schemes.iter().find(|s| s.scheme == kind.name());
        if measured.is_none() && !kind.is_full_precision() {
            bail!(
                "{} is not in the report; run `kvq sensitivity --kv {}` first",
                kind.name(),
                kind.name()
            );
        }
        for l in 0..c.layers {
            for (i, role) in [Role::Key, Role::Value].into_iter().enumerate() {
                let kld = measured.map_or(0.0, |s| {
                    if i == 0 {
                        s.layers[l].k.kld
                    } else {
                        s.layers[l].v.kld
                    }
                });
                items[2 * l + i].push(Candidate {
                    bits: bits_of(kind, role)?,
                    kld,
                });
            }
        }
    }
    let weights: Vec<f64> = report
        .layer_elements
        .iter()
        .flat_map(|&e| [e as f64; 2])
        .collect();
    let budget = match (args.max_kld, args.bits) {
        (Some(x), _) => Budget::MaxKld(x),
        (_, Some(b)) => Budget::Bits(b),
        _ => unreachable!("clap requires one budget"),
    };
    let choice = choose(&items, &weights, budget).with_context(|| {
        format!(
            "no choice among {} meets {budget:?}",
            args.candidates.as_deref().unwrap_or("the candidates")
        )
    })?;
    let policy = Policy {
        layers: (0..c.layers)
            .map(|l| LayerSchemes {
                k: kinds[choice.picks[2 * l]],
                v: kinds[choice.picks[2 * l + 1]],
            })
            .collect(),
    };
    let note = format!(
        "kvq tune {budget:?} from {}: predicted (additive) KLD {:.5}, {:.4} bits/element",
        args.report.display(),
        choice.kld,
        choice.bits
    );
    std::fs::write(&args.out, PolicyFile::new(&policy, note).to_file(&identity))
        .with_context(|| format!("writing {}", args.out.display()))?;

    // Measure the tuned policy (and the baselines) against the 16-bit cache.
    let text = args
        .text
        .clone()
        .unwrap_or_else(|| PathBuf::from(&report.text));
    let tokens = read_tokens(&text, &tokenizer, report.ctx)?;
    let chunks = args.chunks.unwrap_or(report.chunks);
    let options = CacheOptions {
        max_append_tokens: kvq_eval::perplexity::append_tokens(report.ctx),
        ..CacheOptions::default()
    };
    let setup = |policy| CacheSetup {
        policy,
        calibration: calibration.clone(),
        options,
    };
    let mut named = vec![("tuned".to_string(), setup(policy.clone()))];
    for spec in args
        .baselines
        .iter()
        .flat_map(|b| b.split(';'))
        .filter(|s| !s.trim().is_empty())
    {
        let spec = KvSpec::parse(spec.trim())?;
        named.push((spec.name(), setup(Policy::uniform(spec, c.layers))));
    }
    let reference = setup(Policy::uniform(KvSpec::parse("f16")?, c.layers));
    let setups: Vec<CacheSetup> = named.iter().map(|(_, s)| s.clone()).collect();
    let bar = progress_bar(chunks, "measure", "chunks")?;
    let reports = perplexity_many(
        &model,
        &tokens,
        tokenizer.bos_id(),
        report.ctx,
        chunks,
        Some(&reference),
        &setups,
        |n, _| bar.set_position(n as u64),
    )?;
    bar.finish_and_clear();
    let shapes = c.layer_shapes();
    let mut rows = Vec::new();
    for ((name, s), r) in named.iter().zip(&reports) {
        let mem = kvq_cache::memory::plan(&shapes, &s.policy, &s.options, report.ctx, 1)?;
        let k = r.kld.as_ref().expect("a reference was run");
        rows.push(serde_json::json!({
            "kv": name,
            "bits_per_element": mem.bits_per_element,
            "kld": k.kld_mean,
            "kld_p99": k.kld_p99,
            "top1_agree": k.top1_agree,
            "ppl": r.ppl,
            "ppl_reference": k.ppl_reference,
        }));
    }
    let layers: Vec<_> = PolicyFile::new(&policy, String::new()).layers;
    if args.json {
        let v = serde_json::json!({
            "budget": format!("{budget:?}"),
            "policy_file": args.out.display().to_string(),
            "policy": layers,
            "predicted_kld": choice.kld,
            "predicted_bits": choice.bits,
            "ctx": report.ctx,
            "chunks": chunks,
            "text": text.display().to_string(),
            "profile": args.profile.profile.as_ref().map(|p| p.display().to_string()),
            "results": rows,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "wrote {} ({budget:?}; predicted KLD {:.5} under additivity)",
        args.out.display(),
        choice.kld
    );
    for (l, e) in layers.iter().enumerate() {
        println!("  layer {l:2}: k={} v={}", e.k, e.v);
    }
    for r in &rows {
        println!(
            "{:>24}: {:.4} bits/element, KLD {:.5}, top-1 {:.2}%, PPL {:.4} (16-bit {:.4})",
            r["kv"].as_str().unwrap_or(""),
            r["bits_per_element"].as_f64().unwrap_or(f64::NAN),
            r["kld"].as_f64().unwrap_or(f64::NAN),
            100.0 * r["top1_agree"].as_f64().unwrap_or(f64::NAN),
            r["ppl"].as_f64().unwrap_or(f64::NAN),
            r["ppl_reference"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}
