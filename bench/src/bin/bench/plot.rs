//! The report's plots: SVG files next to `docs/benchmarks.md`, drawn with plotters' SVG backend
//! (text is left to the SVG viewer, so no fonts are needed here).
//!
//! Each function writes `$BENCH_PLOTS_DIR/<name>.svg` (default `docs/plots`) and returns the
//! Markdown line that shows it, so a plot sits beside the table it was drawn from.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

const WIDTH: u32 = 900;
const ROW: u32 = 34;
const P50: RGBColor = RGBColor(31, 119, 180);
const P99: RGBColor = RGBColor(214, 39, 40);

/// One bar of a comparison: its label and the p50 / p99 of what was measured.
pub struct Bar {
    pub label: String,
    pub p50: Duration,
    pub p99: Duration,
}

impl Bar {
    pub fn new(label: impl Into<String>, p50: Duration, p99: Duration) -> Bar {
        Bar {
            label: label.into(),
            p50,
            p99,
        }
    }
}

fn dir() -> PathBuf {
    std::env::var_os("BENCH_PLOTS_DIR").map_or_else(|| PathBuf::from("docs/plots"), PathBuf::from)
}

/// Where `name` goes, and the Markdown that embeds it (relative to `docs/`).
fn target(name: &str, title: &str) -> Result<(PathBuf, String)> {
    let dir = dir();
    std::fs::create_dir_all(&dir)?;
    let md = format!("![{title}](plots/{name}.svg)\n");
    Ok((dir.join(format!("{name}.svg")), md))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).max(0.1)
}

/// The log axis' range: a decade below the smallest bar to a little past the largest whisker.
fn span(bars: &[Bar]) -> (f64, f64) {
    let low = bars.iter().map(|b| ms(b.p50)).fold(f64::MAX, f64::min);
    let high = bars.iter().map(|b| ms(b.p99)).fold(0.0, f64::max);
    let floor = 10f64.powf(low.log10().floor() - 1.0).max(0.1);
    (floor, (high * 1.6).max(floor * 10.0))
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a plot: {e:?}")
}

/// Horizontal bars on a log scale: each bar is the p50, its whisker reaches the p99. A log axis
/// because the alternatives differ by orders of magnitude (28 ms against 30 s).
pub fn bars(name: &str, title: &str, unit: &str, bars: &[Bar]) -> Result<String> {
    if bars.is_empty() {
        return Ok(String::new());
    }
    let (path, md) = target(name, title)?;
    draw_bars(&path, title, unit, bars)?;
    Ok(md)
}

fn draw_bars(path: &std::path::Path, title: &str, unit: &str, bars: &[Bar]) -> Result<()> {
    let height = 110 + ROW * bars.len() as u32;
    let root = SVGBackend::new(&path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (lo, hi) = span(bars);
    let rows = bars.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d((lo..hi).log_scale(), (0..rows - 1).into_segmented())
        .map_err(plot_err)?;
    let label = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) => bars
            .get((rows - 1 - i) as usize)
            .map_or_else(String::new, |b| b.label.clone()),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(format!("{unit} (log scale); bar: p50, whisker: p99"))
        .label_style(("sans-serif", 14))
        .x_label_formatter(&|v| format!("{v}"))
        .y_label_formatter(&label)
        .y_labels(bars.len())
        .draw()
        .map_err(plot_err)?;
    for (i, b) in bars.iter().enumerate() {
        let row = rows - 1 - i as i32;
        draw_bar(&mut chart, row, lo, b)?;
    }
    root.present().map_err(plot_err)
}

type BarChart<'a> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<
        plotters::coord::combinators::LogCoord<f64>,
        plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordi32>,
    >,
>;

fn draw_bar(chart: &mut BarChart<'_>, row: i32, lo: f64, b: &Bar) -> Result<()> {
    let (p50, p99) = (ms(b.p50), ms(b.p99).max(ms(b.p50)));
    let mut bar = Rectangle::new(
        [
            (lo, SegmentValue::Exact(row)),
            (p50, SegmentValue::Exact(row + 1)),
        ],
        P50.mix(0.8).filled(),
    );
    bar.set_margin(7, 7, 0, 0);
    let whisker = PathElement::new(
        vec![
            (p50, SegmentValue::CenterOf(row)),
            (p99, SegmentValue::CenterOf(row)),
        ],
        P99.stroke_width(3),
    );
    let tip = Circle::new((p99, SegmentValue::CenterOf(row)), 4, P99.filled());
    chart.draw_series(std::iter::once(bar)).map_err(plot_err)?;
    chart
        .draw_series(std::iter::once(whisker))
        .map_err(plot_err)?;
    chart.draw_series(std::iter::once(tip)).map_err(plot_err)?;
    Ok(())
}

/// One line of a growth plot: its label and (x, y) points.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

impl Line {
    pub fn new(label: impl Into<String>) -> Line {
        Line {
            label: label.into(),
            points: Vec::new(),
        }
    }

    /// A point at `size`, its cost in milliseconds.
    pub fn push(&mut self, size: usize, cost: Duration) {
        self.points.push((size as f64, cost.as_secs_f64() * 1000.0));
    }
}

/// Lines on log-log axes, for how a cost grows with size (a slope of 1 is linear growth).
pub fn growth(
    name: &str,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Line],
) -> Result<String> {
    let (path, md) = target(name, title)?;
    let root = SVGBackend::new(&path, (WIDTH, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let all = || lines.iter().flat_map(|l| l.points.iter());
    let x_hi = all().map(|p| p.0).fold(1.0, f64::max) * 2.0;
    let y_lo = all().map(|p| p.1).fold(f64::MAX, f64::min).max(1e-9) / 2.0;
    let y_hi = all().map(|p| p.1).fold(0.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((1.0..x_hi).log_scale(), (y_lo..y_hi).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .x_label_formatter(&|v| format!("{v}"))
        .y_label_formatter(&|v| format!("{v}"))
        .draw()
        .map_err(plot_err)?;
    for (i, l) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(l.points.clone(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(l.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        let dots = l.points.iter().map(|p| Circle::new(*p, 4, color.filled()));
        chart.draw_series(dots).map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_plot_is_an_svg_with_every_label_and_a_bar_per_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.svg");
        let bars = [
            Bar::new(
                "agent",
                Duration::from_millis(28),
                Duration::from_millis(105),
            ),
            Bar::new(
                "Sentinel",
                Duration::from_millis(1306),
                Duration::from_millis(1417),
            ),
        ];
        draw_bars(&path, "failover", "ms", &bars).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(
            svg.contains("\nagent\n") && svg.contains("\nSentinel\n"),
            "{svg}"
        );
        assert_eq!(svg.matches("<circle").count(), 2, "one p99 tip per bar");
    }

    #[test]
    fn the_log_axis_starts_a_decade_below_the_smallest_bar() {
        let bars = [Bar::new(
            "a",
            Duration::from_millis(28),
            Duration::from_millis(105),
        )];
        assert_eq!(span(&bars), (1.0, 105.0 * 1.6));
    }
}
