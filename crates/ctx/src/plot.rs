//! The replay plot: prompt tokens per model call with and without the
//! engine, as an SVG file.
//!
//! `plotters` with its SVG backend only and no font feature: text is written
//! as SVG `<text>` elements (sized by plotters' built-in estimate), so the
//! binary needs no font files or system libraries.

use std::path::Path;

use anyhow::{Context, bail};
use plotters::prelude::*;

/// What a replay plot shows. Series are indexed by model call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlotData {
    /// The chart's caption (e.g. the transcript's file name).
    pub title: String,
    /// Prompt tokens of each model call as the engine sent it.
    pub with_engine: Vec<u64>,
    /// Prompt tokens of each model call with the whole transcript re-sent.
    pub without_engine: Vec<u64>,
    /// Call indexes at which a compaction happened.
    pub compactions: Vec<usize>,
    /// Call indexes at which a proactive prune happened.
    pub prunes: Vec<usize>,
    /// Call indexes whose request broke the prompt cache: cached content
    /// re-sent at the full price.
    pub cache_breaks: Vec<usize>,
    /// Call indexes that found the cache expired (an idle gap longer than
    /// its lifetime): uncached whatever the engine did.
    pub cache_expired: Vec<usize>,
    /// The compaction threshold, in tokens.
    pub threshold: Option<u64>,
    /// The model's context window, in tokens.
    pub context_length: Option<u64>,
}

const WIDTH: u32 = 960;
const HEIGHT: u32 = 540;
const WITH_COLOR: RGBColor = RGBColor(31, 119, 180);
const WITHOUT_COLOR: RGBColor = RGBColor(214, 39, 40);
const COMPACTION_COLOR: RGBColor = RGBColor(44, 160, 44);
const PRUNE_COLOR: RGBColor = RGBColor(148, 103, 189);
const CACHE_BREAK_COLOR: RGBColor = RGBColor(227, 119, 194);
const CACHE_EXPIRED_COLOR: RGBColor = RGBColor(23, 190, 207);
const THRESHOLD_COLOR: RGBColor = RGBColor(255, 127, 14);
const WINDOW_COLOR: RGBColor = RGBColor(90, 90, 90);

/// Legend labels, also what the tests look for.
pub const WITH_LABEL: &str = "with engine";
/// See [`WITH_LABEL`].
pub const WITHOUT_LABEL: &str = "without engine";

/// Writes the plot of `data` to `path` as SVG. Fails (without writing) when
/// both series are empty: there is nothing to plot.
pub fn write_svg(path: &Path, data: &PlotData) -> anyhow::Result<()> {
    if data.with_engine.is_empty() && data.without_engine.is_empty() {
        bail!(
            "nothing to plot for {}: both token series are empty",
            path.display()
        );
    }
    let calls = data.with_engine.len().max(data.without_engine.len());
    let peak = data
        .with_engine
        .iter()
        .chain(&data.without_engine)
        .copied()
        .chain(data.threshold)
        .chain(data.context_length)
        .max()
        .unwrap_or(0);
    // Headroom above the highest line so the legend and the caps show.
    let y_max = (peak + peak / 10).max(1);
    let x_max = calls.saturating_sub(1).max(1);

    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)
        .with_context(|| format!("drawing {}", path.display()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&data.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0..x_max, 0..y_max)
        .with_context(|| format!("drawing {}", path.display()))?;
    chart
        .configure_mesh()
        .x_desc("model call")
        .y_desc("prompt tokens")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .with_context(|| format!("drawing the axes of {}", path.display()))?;

    let vertical = |x: usize, color: RGBColor| {
        PathElement::new(vec![(x, 0), (x, y_max)], color.stroke_width(1))
    };
    let horizontal =
        |y: u64, color: RGBColor| PathElement::new(vec![(0, y), (x_max, y)], color.stroke_width(1));
    let legend = |color: RGBColor| {
        move |(x, y): (i32, i32)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
    };

    for (series, label, color) in [
        (&data.without_engine, WITHOUT_LABEL, WITHOUT_COLOR),
        (&data.with_engine, WITH_LABEL, WITH_COLOR),
    ] {
        if series.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(
                series.iter().enumerate().map(|(i, &v)| (i, v)),
                color.stroke_width(2),
            ))
            .with_context(|| format!("drawing the {label} series"))?
            .label(label)
            .legend(legend(color));
    }
    for (marks, label, color) in [
        (&data.compactions, "compaction", COMPACTION_COLOR),
        (&data.prunes, "prune", PRUNE_COLOR),
        (&data.cache_breaks, "cache broke", CACHE_BREAK_COLOR),
        (&data.cache_expired, "cache expired", CACHE_EXPIRED_COLOR),
    ] {
        if marks.is_empty() {
            continue;
        }
        chart
            .draw_series(
                marks
                    .iter()
                    .filter(|&&x| x <= x_max)
                    .map(|&x| vertical(x, color)),
            )
            .with_context(|| format!("drawing the {label} markers"))?
            .label(label)
            .legend(legend(color));
    }
    for (level, label, color) in [
        (data.threshold, "threshold", THRESHOLD_COLOR),
        (data.context_length, "context window", WINDOW_COLOR),
    ] {
        if let Some(y) = level {
            chart
                .draw_series(std::iter::once(horizontal(y, color)))
                .with_context(|| format!("drawing the {label} line"))?
                .label(label)
                .legend(legend(color));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .with_context(|| format!("drawing the legend of {}", path.display()))?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("ctx-plot-{}-{name}.svg", std::process::id()))
    }

    #[test]
    fn writes_an_svg_with_both_series_markers_and_legend() {
        let path = temp("small");
        let data = PlotData {
            title: "coding-session.json".into(),
            with_engine: vec![1200, 9000, 24000, 8000, 15000],
            without_engine: vec![1200, 9000, 24000, 31000, 38000],
            compactions: vec![3],
            prunes: vec![2],
            cache_breaks: vec![3],
            cache_expired: vec![4],
            threshold: Some(24000),
            context_length: Some(32000),
        };
        write_svg(&path, &data).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for text in [
            WITH_LABEL,
            WITHOUT_LABEL,
            "compaction",
            "prune",
            "cache broke",
            "cache expired",
            "threshold",
            "context window",
            "model call",
            "prompt tokens",
            "coding-session.json",
        ] {
            assert!(svg.contains(text), "missing {text}");
        }
        assert!(svg.matches("<polyline").count() >= 2);
    }

    #[test]
    fn one_call_and_one_series_still_plot() {
        let path = temp("one");
        let data = PlotData {
            title: "t".into(),
            with_engine: vec![500],
            ..PlotData::default()
        };
        write_svg(&path, &data).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.contains(WITH_LABEL));
        assert!(!svg.contains(WITHOUT_LABEL));
        assert!(!svg.contains("threshold"));
    }

    #[test]
    fn empty_series_are_an_error_and_write_nothing() {
        let path = temp("empty");
        let err = write_svg(&path, &PlotData::default()).unwrap_err();
        assert!(err.to_string().contains("nothing to plot"), "{err}");
        assert!(!path.exists());
    }
}
