//! `--plot FILE.svg|FILE.png`: bandwidth against size, one solid line per test (ferry) and one
//! dashed line per test (its better baseline at each size), log-2 size axis.

use crate::bench::{Kind, Report};
use crate::sizes::format_size;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::path::Path;
use thiserror::Error;

/// Why a plot was not written.
#[derive(Debug, Error)]
pub enum PlotError {
    /// The file name ends in neither `.svg` nor `.png`.
    #[error("plot file `{0}` must end in .svg or .png")]
    Format(String),
    /// No bandwidth result to plot.
    #[error("nothing to plot: no bandwidth test was run")]
    Empty,
    /// The drawing library failed (e.g. cannot write the file, or no font).
    #[error("cannot draw `{path}`: {message}")]
    Draw {
        /// The file.
        path: String,
        /// plotters' error text.
        message: String,
    },
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// One plotted line: label, points (log2 size, GB/s), dashed or not, colour.
#[derive(Clone)]
struct Line {
    label: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
    color: RGBColor,
}

fn lines(rep: &Report) -> Vec<Line> {
    let mut tests: Vec<&str> = vec![];
    for r in rep.results.iter().filter(|r| r.kind == Kind::Bandwidth) {
        if !tests.contains(&r.test.as_str()) {
            tests.push(&r.test);
        }
    }
    let mut out = vec![];
    for (i, t) in tests.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let rows: Vec<_> = rep.results.iter().filter(|r| r.test == *t).collect();
        let pts = |f: &dyn Fn(&crate::bench::Row) -> Option<f64>| {
            rows.iter()
                .filter_map(|r| Some(((r.payload_bytes as f64).log2(), f(r)?)))
                .collect::<Vec<_>>()
        };
        out.push(Line {
            label: format!("{t}: ferry"),
            points: pts(&|r| r.ferry().map(|s| s.median)),
            dashed: false,
            color,
        });
        out.push(Line {
            label: format!("{t}: better baseline"),
            points: pts(&|r| r.baseline().map(|s| s.median)),
            dashed: true,
            color,
        });
    }
    out
}

/// Writes the plot; the format follows the file extension.
pub fn write(rep: &Report, path: &Path) -> Result<(), PlotError> {
    let name = path.display().to_string();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let lines = lines(rep);
    if lines.is_empty() {
        return Err(PlotError::Empty);
    }
    let size = (1100, 680);
    let res = match ext.as_deref() {
        Some("svg") => draw(SVGBackend::new(path, size).into_drawing_area(), &lines),
        Some("png") => draw(BitMapBackend::new(path, size).into_drawing_area(), &lines),
        _ => return Err(PlotError::Format(name)),
    };
    res.map_err(|message| PlotError::Draw {
        path: name,
        message,
    })
}

/// Registers the embedded DejaVu Sans as "sans-serif" (once): the plots need no system fonts
/// or fontconfig, so the binary runs on bare GPU hosts.
fn register_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font(
            "sans-serif",
            plotters::style::FontStyle::Normal,
            dejavu::sans::regular(),
        )
        .map_err(|_| "the embedded font could not be read".to_string())
    })
    .clone()
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, lines: &[Line]) -> Result<(), String> {
    register_font()?;
    let e = |x: &dyn std::fmt::Display| x.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let ymax = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let ymin = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|&y| y > 0.0)
        .fold(f64::MAX, f64::min);
    // Figures spanning more than 20x (device-to-device next to PCIe) get a log10 y axis, so
    // that every path stays readable.
    let logy = ymin < f64::MAX && ymax / ymin > 20.0;
    let owned: Vec<Line>;
    let lines = if logy {
        owned = lines
            .iter()
            .map(|l| Line {
                points: l
                    .points
                    .iter()
                    .filter(|p| p.1 > 0.0)
                    .map(|&(x, y)| (x, y.log10()))
                    .collect(),
                ..l.clone()
            })
            .collect();
        &owned[..]
    } else {
        lines
    };
    let (x0, x1) = (x0.floor() - 0.25, x1.ceil() + 0.25);
    // Free the top of the plot for the legend (about 22 px per entry of ~560 px).
    let legend_frac = (lines.len() as f64 * 22.0 + 20.0) / 560.0;
    let headroom = 1.05 / (1.0 - legend_frac.min(0.6));
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "ferry bench: bandwidth vs size (median; dashed: better baseline)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(
            x0..x1,
            if logy {
                (ymin.log10().floor())..(ymax.log10() + (ymax / ymin).log10() * (headroom - 1.0))
            } else {
                0.0..(ymax * headroom).max(1e-3)
            },
        )
        .map_err(|x| e(&x))?;
    let ticks = (x1 - x0).floor() as usize + 1;
    chart
        .configure_mesh()
        .x_desc("copy size (bytes, log2 scale)")
        .y_desc(if logy {
            "GB/s (10^9 B/s of payload, log10 scale)"
        } else {
            "GB/s (10^9 B/s of payload)"
        })
        .x_labels(ticks.min(40))
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
                format_size(2f64.powf(x.round()) as u64)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| {
            if logy {
                let v = 10f64.powf(*y);
                if v >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.2}")
                }
            } else {
                format!("{y:.1}")
            }
        })
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(|x| e(&x))?;
    for l in lines {
        let style = ShapeStyle {
            color: l.color.to_rgba(),
            filled: false,
            stroke_width: 2,
        };
        let c = l.color;
        if l.dashed {
            chart
                .draw_series(DashedLineSeries::new(l.points.clone(), 8, 6, style))
                .map_err(|x| e(&x))?
                .label(&l.label)
                .legend(move |(x, y)| {
                    DashedPathElement::new(
                        vec![(x, y), (x + 24, y)],
                        5,
                        3,
                        ShapeStyle {
                            color: c.to_rgba(),
                            filled: false,
                            stroke_width: 2,
                        },
                    )
                });
        } else {
            chart
                .draw_series(LineSeries::new(l.points.clone(), style))
                .map_err(|x| e(&x))?
                .label(&l.label)
                .legend(move |(x, y)| {
                    PathElement::new(
                        vec![(x, y), (x + 24, y)],
                        ShapeStyle {
                            color: c.to_rgba(),
                            filled: false,
                            stroke_width: 2,
                        },
                    )
                });
            chart
                .draw_series(l.points.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(|x| e(&x))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
