//! Per-layer sensitivity: for each layer, and for K and V separately, only that one is stored
//! with a scheme (every other K and V in 16-bit floats); the KL divergence and the change in
//! perplexity against the all-16-bit cache measure what that layer costs. The report feeds
//! [`crate::tune`]; [`chart`] draws it.

use crate::identity::ModelIdentity;
use kvq_cache::{CacheOptions, LayerSchemes, LayerShape, Policy};
use kvq_codec::{build_codec, Calibration, Role, SchemeKind};
use kvq_eval::{perplexity_many, CacheSetup};
use kvq_model::gemma3::Gemma3;
use kvq_model::ModelError;
use plotters::prelude::*;
use plotters::style::FontStyle;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Format name of sensitivity reports.
pub const FORMAT: &str = "kvq-sensitivity";

/// The cost of quantizing one layer's K or V alone.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Mean KL divergence (nats per token) against the 16-bit cache.
    pub kld: f64,
    /// Perplexity minus the 16-bit cache's perplexity.
    pub dppl: f64,
    /// Share of tokens whose most likely next token is unchanged.
    pub top1_agree: f64,
}

/// The K and V costs of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerCost {
    /// Layer index.
    pub layer: usize,
    /// Keys quantized.
    pub k: Cost,
    /// Values quantized.
    pub v: Cost,
}

/// Every layer's costs under one scheme.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchemeSensitivity {
    /// Scheme name.
    pub scheme: String,
    /// Bits per element of the scheme for keys.
    pub k_bits: f64,
    /// Bits per element of the scheme for values.
    pub v_bits: f64,
    /// One entry per layer.
    pub layers: Vec<LayerCost>,
}

/// What `kvq sensitivity` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SensitivityReport {
    /// Always [`FORMAT`].
    pub format: String,
    /// The model measured.
    pub model: ModelIdentity,
    /// The text measured on.
    pub text: String,
    /// Tokens per chunk.
    pub ctx: usize,
    /// Chunks measured.
    pub chunks: usize,
    /// The profile used, if any.
    pub profile: Option<String>,
    /// Perplexity of the 16-bit cache.
    pub reference_ppl: f64,
    /// Elements each layer holds at `ctx` (the weights of the layers' bits).
    pub layer_elements: Vec<usize>,
    /// One entry per scheme.
    pub schemes: Vec<SchemeSensitivity>,
    /// The most sensitive layers and roles, most sensitive first (by KL divergence).
    pub most_sensitive: Vec<String>,
}

/// Elements a layer holds for a sequence of `ctx` tokens (windowed layers hold their window).
pub fn layer_elements(shapes: &[LayerShape], ctx: usize) -> Vec<usize> {
    shapes
        .iter()
        .map(|s| s.window.map_or(ctx, |w| w.min(ctx)) * s.kv_heads * s.head_dim)
        .collect()
}

/// The policy with `kind` on one layer's K (`role == Key`) or V and 16-bit floats elsewhere.
pub fn single_policy(layers: usize, layer: usize, role: Role, kind: SchemeKind) -> Policy {
    let f16 = LayerSchemes {
        k: SchemeKind::F16,
        v: SchemeKind::F16,
    };
    let mut policy = Policy {
        layers: vec![f16; layers],
    };
    match role {
        Role::Key => policy.layers[layer].k = kind,
        Role::Value => policy.layers[layer].v = kind,
    }
    policy
}

/// Settings of a sensitivity run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Tokens per chunk.
    pub ctx: usize,
    /// Chunks to score.
    pub chunks: usize,
    /// Per-layer (K, V) calibration for the schemes that use it.
    pub calibration: Vec<(Calibration, Calibration)>,
    /// Cache options.
    pub options: CacheOptions,
}

/// Measures every layer's K and V under each of `kinds`; returns the 16-bit cache's perplexity
/// and one entry per kind. `on_chunk` gets (kinds done, chunks done of the current kind).
pub fn measure(
    model: &Gemma3,
    tokens: &[u32],
    bos: u32,
    kinds: &[SchemeKind],
    s: &Settings,
    mut on_chunk: impl FnMut(usize, usize),
) -> Result<(f64, Vec<SchemeSensitivity>), ModelError> {
    let c = &model.config;
    let setup = |policy| CacheSetup {
        policy,
        calibration: s.calibration.clone(),
        options: s.options,
    };
    let reference = setup(single_policy(c.layers, 0, Role::Key, SchemeKind::F16));
    let mut reference_ppl = f64::NAN;
    let mut out = Vec::new();
    for (done, &kind) in kinds.iter().enumerate() {
        let setups: Vec<CacheSetup> = (0..c.layers)
            .flat_map(|l| {
                [Role::Key, Role::Value].map(|r| setup(single_policy(c.layers, l, r, kind)))
            })
            .collect();
        let reports = perplexity_many(
            model,
            tokens,
            bos,
            s.ctx,
            s.chunks,
            Some(&reference),
            &setups,
            |n, _| on_chunk(done, n),
        )?;
        let cost = |i: usize| {
            let r = &reports[i];
            let k = r.kld.as_ref().expect("a reference was run");
            Cost {
                kld: k.kld_mean,
                dppl: r.ppl - k.ppl_reference,
                top1_agree: k.top1_agree,
            }
        };
        reference_ppl = reports[0]
            .kld
            .as_ref()
            .map_or(f64::NAN, |k| k.ppl_reference);
        let layers = (0..c.layers)
            .map(|l| LayerCost {
                layer: l,
                k: cost(2 * l),
                v: cost(2 * l + 1),
            })
            .collect();
        let bits = |role| -> Result<f64, ModelError> {
            let cal = s
                .calibration
                .first()
                .map(|(k, v)| if role == Role::Key { k } else { v });
            let codec = build_codec(
                kind,
                role,
                c.head_dim,
                cal.unwrap_or(&Calibration::default()),
                0,
            )
            .map_err(kvq_cache::CacheError::from)?;
            Ok(codec.bits_per_element())
        };
        out.push(SchemeSensitivity {
            scheme: kind.name(),
            k_bits: bits(Role::Key)?,
            v_bits: bits(Role::Value)?,
            layers,
        });
    }
    Ok((reference_ppl, out))
}

/// The `n` most sensitive (scheme, layer, role) entries by KL divergence, as text.
pub fn most_sensitive(schemes: &[SchemeSensitivity], n: usize) -> Vec<String> {
    let mut all: Vec<(f64, String)> = schemes
        .iter()
        .flat_map(|s| {
            s.layers.iter().flat_map(move |l| {
                [("K", l.k), ("V", l.v)].map(|(role, c)| {
                    (
                        c.kld,
                        format!(
                            "layer {} {role} ({}): KLD {:.5}, Δppl {:+.4}",
                            l.layer, s.scheme, c.kld, c.dppl
                        ),
                    )
                })
            })
        })
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    all.into_iter().take(n).map(|(_, s)| s).collect()
}

const FONT: &str = "sans-serif";

/// Draws a bar chart of the report to a PNG: one panel per scheme, per layer a K and a V bar
/// of the KL divergence. Text uses DejaVu Sans embedded from the `dejavu` crate (as kvq-eval's
/// plots do), so no system font is needed.
pub fn chart(report: &SensitivityReport, path: &Path) -> Result<(), String> {
    static FONTS: std::sync::Once = std::sync::Once::new();
    FONTS.call_once(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .unwrap_or_else(|_| panic!("the embedded DejaVu Sans font is a valid font"));
    });
    draw(report, path).map_err(|e| format!("plotting {}: {e}", path.display()))
}

fn draw(report: &SensitivityReport, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let panels = report.schemes.len().max(1);
    let root = BitMapBackend::new(path, (1100, 360 * panels as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let colors = [RGBColor(31, 119, 180), RGBColor(255, 127, 14)];
    for (area, s) in root.split_evenly((panels, 1)).iter().zip(&report.schemes) {
        let layers = s.layers.len();
        let top = s
            .layers
            .iter()
            .flat_map(|l| [l.k.kld, l.v.kld])
            .fold(0.0, f64::max)
            .max(1e-6)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{}: KL divergence with one layer's K or V quantized ({} × {} tokens)",
                    s.scheme, report.chunks, report.ctx
                ),
                (FONT, 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..layers as f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(layers)
            .x_label_formatter(&|x| format!("{}", (x - 0.5).round() as i64))
            .x_desc("layer")
            .y_desc("KLD (nats/token)")
            .label_style((FONT, 13))
            .draw()?;
        for (i, (role, color)) in [("K", colors[0]), ("V", colors[1])].into_iter().enumerate() {
            chart
                .draw_series(s.layers.iter().map(|l| {
                    let x = l.layer as f64 + 0.1 + 0.4 * i as f64;
                    let v = if i == 0 { l.k.kld } else { l.v.kld };
                    Rectangle::new([(x, 0.0), (x + 0.38, v)], color.filled())
                }))?
                .label(role)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
