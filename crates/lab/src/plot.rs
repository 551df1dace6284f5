//! SVG plots drawn with `plotters`: iperf3 bandwidth and cumulative transfer over time
//! per arm and phase (the paper's Figs. 10-14, 16-17), and bar charts comparing arms
//! (Figs. 18-20).

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// A named series of (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plot: {e}")
}

/// Line chart of several series.
pub fn lines(path: &Path, title: &str, x: &str, y: &str, series: &[Series]) -> Result<()> {
    draw_lines(path, title, x, y, series, false)
}

/// Line chart with a marker at every measured point (few points per series), legend at
/// the upper left.
pub fn xy(path: &Path, title: &str, x: &str, y: &str, series: &[Series]) -> Result<()> {
    draw_lines(path, title, x, y, series, true)
}

fn draw_lines(
    path: &Path,
    title: &str,
    x: &str,
    y: &str,
    series: &[Series],
    markers: bool,
) -> Result<()> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let xmax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x)
        .y_desc(y)
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        // Reference lines (two points) get no markers.
        if markers && pts.len() > 2 {
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(if markers {
            SeriesLabelPosition::UpperLeft
        } else {
            SeriesLabelPosition::UpperRight
        })
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Grouped bar chart: one group per category, one bar per series; a `None` value (a
/// failed measurement) leaves its bar out rather than drawing a zero.
pub fn bars(
    path: &Path,
    title: &str,
    y: &str,
    categories: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> Result<()> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = categories.len().max(1);
    let k = series.len().max(1);
    let ymin = series
        .iter()
        .flat_map(|s| s.1.iter().flatten().copied())
        .fold(0.0, f64::min)
        * 1.1;
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().flatten().copied())
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n as f64, ymin..ymax)
        .map_err(err)?;
    let cats = categories.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|v| {
            let i = v.floor() as usize;
            if (v - v.floor() - 0.5).abs() < 0.01 {
                cats.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y)
        .draw()
        .map_err(err)?;
    let w = 0.8 / k as f64;
    for (si, (name, vals)) in series.iter().enumerate() {
        let c = COLORS[si % COLORS.len()];
        chart
            .draw_series(vals.iter().enumerate().filter_map(|(ci, v)| {
                let x0 = ci as f64 + 0.1 + si as f64 * w;
                v.map(|v| Rectangle::new([(x0, 0.0), (x0 + w * 0.9, v)], c.filled()))
            }))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed measurement (`None`) is no bar; a measured zero is still drawn.
    #[test]
    fn missing_values_draw_no_bar() {
        let rects = |vals: Vec<Option<f64>>| {
            let path = std::env::temp_dir().join(format!(
                "flowgate-lab-bars-{}-{}.svg",
                std::process::id(),
                vals.iter().flatten().count()
            ));
            let cats = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
            bars(&path, "t", "y", &cats, &[("s".to_owned(), vals)]).expect("plot");
            let svg = std::fs::read_to_string(&path).expect("svg");
            let _ = std::fs::remove_file(&path);
            svg.matches("<rect").count()
        };
        let all = rects(vec![Some(1.0), Some(0.0), Some(2.0)]);
        assert_eq!(rects(vec![Some(1.0), None, Some(2.0)]), all - 1);
    }
}
