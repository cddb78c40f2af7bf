//! PNG plots of a [`CompareReport`]: KL divergence against bits per element with the Pareto
//! front, and a retrieval heat map (length × depth) per scheme. Text is drawn with DejaVu
//! Sans, embedded from the `dejavu` crate, so no system font is needed.

use crate::compare::CompareReport;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;
use std::error::Error;
use std::path::Path;
use std::sync::Once;

/// A plot that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("plotting {path}: {message}")]
pub struct PlotError {
    /// The file being written.
    pub path: String,
    /// What went wrong.
    pub message: String,
}

const FONT: &str = "sans-serif";

/// Registers the embedded font under the name the plots use (once per process).
fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .unwrap_or_else(|_| panic!("the embedded DejaVu Sans font is a valid font"));
        plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold())
            .unwrap_or_else(|_| panic!("the embedded DejaVu Sans Bold font is a valid font"));
    });
}

fn wrap(path: &Path, r: Result<(), Box<dyn Error>>) -> Result<(), PlotError> {
    r.map_err(|e| PlotError {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Writes the KL divergence (mean, log scale) against bits per element at the perplexity
/// context, one labelled point per scheme, the Pareto front joined and drawn in red. Schemes
/// with a KL divergence of zero (the reference itself) sit on the bottom edge.
pub fn kld_vs_bits(report: &CompareReport, path: &Path) -> Result<(), PlotError> {
    register_font();
    wrap(path, draw_kld_vs_bits(report, path))
}

fn draw_kld_vs_bits(r: &CompareReport, path: &Path) -> Result<(), Box<dyn Error>> {
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let positive = r.schemes.iter().map(|s| s.kld).filter(|&k| k > 0.0);
    let lo = positive.clone().fold(f64::INFINITY, f64::min).min(1e-3) / 3.0;
    let hi = positive.fold(0.0, f64::max).max(lo * 10.0) * 2.0;
    let x_max = r
        .schemes
        .iter()
        .map(|s| s.bits_per_element)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.08;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "KL divergence vs. cache size ({} chunks × {} tokens)",
                r.chunks, r.ctx
            ),
            (FONT, 26),
        )
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..x_max, (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc(format!(
            "bits per element at {} tokens (all metadata counted)",
            r.ctx
        ))
        .y_desc("mean KL divergence vs. f16 cache (nats, log)")
        .label_style((FONT, 17))
        .axis_desc_style((FONT, 19))
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .draw()?;
    let at = |i: usize| {
        let s = &r.schemes[i];
        (s.bits_per_element, s.kld.max(lo))
    };
    let front: Vec<(f64, f64)> = r.pareto.iter().map(|&i| at(i)).collect();
    chart
        .draw_series(LineSeries::new(front, RED.stroke_width(2)))?
        .label("Pareto front")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    for (i, s) in r.schemes.iter().enumerate() {
        let on_front = r.pareto.contains(&i);
        let color = if on_front { RED } else { BLUE };
        let label = if s.kld > 0.0 {
            s.kv.clone()
        } else {
            format!("{} (KLD 0)", s.kv)
        };
        chart.draw_series(std::iter::once(
            EmptyElement::at(at(i))
                + Circle::new((0, 0), 6, color.filled())
                + Text::new(label, (8, -18), (FONT, 16).into_font().color(&BLACK)),
        ))?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 16))
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}

/// Writes one heat map per scheme (rows: prompt lengths, columns: needle depths), each cell
/// coloured from red (0%) to green (100%) and labelled with its accuracy.
pub fn retrieval_heatmaps(report: &CompareReport, path: &Path) -> Result<(), PlotError> {
    register_font();
    wrap(path, draw_heatmaps(report, path))
}

fn draw_heatmaps(r: &CompareReport, path: &Path) -> Result<(), Box<dyn Error>> {
    let opts = r
        .retrieval_options
        .as_ref()
        .ok_or("the report has no retrieval results")?;
    let (nl, nd) = (opts.lengths.len(), opts.depths.len());
    let cols = r.schemes.len().clamp(1, 4);
    let rows = r.schemes.len().div_ceil(cols).max(1);
    let (pw, ph) = (320u32, 110 + 45 * nl as u32);
    let root =
        BitMapBackend::new(path, (pw * cols as u32, ph * rows as u32 + 50)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(50);
    title.draw(&Text::new(
        format!(
            "Passkey retrieval accuracy ({} trials per cell; rows: length in tokens, columns: depth)",
            opts.trials
        ),
        (10, 15),
        (FONT, 20).into_font(),
    ))?;
    let panels = body.split_evenly((rows, cols));
    for (s, panel) in r.schemes.iter().zip(panels) {
        let mut chart = ChartBuilder::on(&panel)
            .caption(&s.kv, (FONT, 20))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(52)
            // A segmented range `a..b` has a segment for every value from a to b inclusive.
            .build_cartesian_2d(
                (0..nd as i32 - 1).into_segmented(),
                (0..nl as i32 - 1).into_segmented(),
            )?;
        let depth = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => opts
                .depths
                .get(*i as usize)
                .map_or(String::new(), |d| format!("{d}%")),
            _ => String::new(),
        };
        let length = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => opts
                .lengths
                .get(*i as usize)
                .map_or(String::new(), |l| l.to_string()),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(nd)
            .y_labels(nl)
            .x_label_formatter(&depth)
            .y_label_formatter(&length)
            .label_style((FONT, 15))
            .draw()?;
        for c in &s.retrieval_cells {
            let (Some(x), Some(y)) = (
                opts.depths.iter().position(|&d| d == c.depth),
                opts.lengths.iter().position(|&l| l == c.length),
            ) else {
                continue;
            };
            let (x, y) = (x as i32, y as i32);
            let a = c.accuracy();
            let fill = RGBColor((220.0 * (1.0 - a)) as u8 + 30, (180.0 * a) as u8 + 40, 60);
            chart.draw_series(std::iter::once(Rectangle::new(
                [
                    (SegmentValue::Exact(x), SegmentValue::Exact(y)),
                    (SegmentValue::Exact(x + 1), SegmentValue::Exact(y + 1)),
                ],
                fill.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{:.0}%", 100.0 * a),
                (SegmentValue::CenterOf(x), SegmentValue::CenterOf(y)),
                (FONT, 17)
                    .into_font()
                    .color(&WHITE)
                    .pos(Pos::new(HPos::Center, VPos::Center)),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::tests::fake_report;

    #[test]
    fn plots_of_a_fake_report_are_png_files() {
        let dir = std::env::temp_dir().join(format!("kvq-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let report = fake_report();
        for (name, draw) in [
            (
                "kld.png",
                kld_vs_bits as fn(&CompareReport, &Path) -> Result<(), PlotError>,
            ),
            ("retrieval.png", retrieval_heatmaps),
        ] {
            let path = dir.join(name);
            draw(&report, &path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert!(bytes.starts_with(b"\x89PNG"), "{name} is not a PNG");
            assert!(bytes.len() > 5_000, "{name} is nearly empty");
        }
        let mut no_retrieval = report;
        no_retrieval.retrieval_options = None;
        assert!(retrieval_heatmaps(&no_retrieval, &dir.join("none.png")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
