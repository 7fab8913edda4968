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
    /// A saved JSON file that is not a `ferry bench --json` report.
    #[error("cannot read the results: {0}")]
    Json(String),
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

/// One colour per test; 16, so that a full GPU run (15 tests) repeats none.
const COLORS: [RGBColor; 16] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(0, 0, 128),
    RGBColor(127, 127, 127),
    RGBColor(0, 100, 0),
    RGBColor(170, 0, 170),
    RGBColor(0, 128, 128),
    RGBColor(204, 153, 0),
    RGBColor(0, 0, 0),
];

/// One plotted line: label, points (log2 size, GB/s), dashed or not, colour.
#[derive(Clone)]
struct Line {
    label: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
    color: RGBColor,
}

/// What a plot needs of one result row: the same from a fresh [`Report`] or a saved JSON file.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotRow {
    /// Test name.
    pub test: String,
    /// The row's size (the x axis): bytes per copy, or per segment for segment lists.
    pub size_bytes: u64,
    /// ferry's median GB/s.
    pub ferry: Option<f64>,
    /// The better baseline's median GB/s.
    pub baseline: Option<f64>,
}

/// The bandwidth rows of a report.
pub fn rows_of(rep: &Report) -> Vec<PlotRow> {
    rep.results
        .iter()
        .filter(|r| r.kind == Kind::Bandwidth)
        .map(|r| PlotRow {
            test: r.test.clone(),
            size_bytes: r.size_bytes,
            ferry: r.ferry().map(|s| s.median),
            baseline: r.baseline().map(|s| s.median),
        })
        .collect()
}

/// The bandwidth rows of a `--json` file (schema `ferry-bench/1`), for re-plotting saved runs.
pub fn rows_from_json(v: &serde_json::Value) -> Result<Vec<PlotRow>, PlotError> {
    let bad = |why: &str| PlotError::Json(why.to_string());
    if v.get("schema").and_then(|s| s.as_str()) != Some("ferry-bench/1") {
        return Err(bad("not a ferry-bench/1 file (field `schema`)"));
    }
    let results = v
        .get("results")
        .and_then(|r| r.as_array())
        .ok_or_else(|| bad("no `results` array"))?;
    let mut out = vec![];
    for r in results {
        if r.get("kind").and_then(|k| k.as_str()) != Some("bandwidth") {
            continue;
        }
        let series = r
            .get("series")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("a row without `series`"))?;
        let best = r
            .get("best_baseline")
            .and_then(|b| b.as_str())
            .unwrap_or_default();
        let median = |pick: &dyn Fn(&serde_json::Value) -> bool| {
            series
                .iter()
                .find(|s| pick(s))
                .and_then(|s| s.get("median")?.as_f64())
        };
        out.push(PlotRow {
            test: r
                .get("test")
                .and_then(|t| t.as_str())
                .ok_or_else(|| bad("a row without `test`"))?
                .to_string(),
            size_bytes: r
                .get("size_bytes")
                .and_then(|p| p.as_u64())
                .ok_or_else(|| bad("a row without `size_bytes`"))?,
            ferry: median(&|s| s.get("role").and_then(|x| x.as_str()) == Some("ferry")),
            baseline: median(&|s| {
                s.get("role").and_then(|x| x.as_str()) == Some("baseline")
                    && s.get("name").and_then(|x| x.as_str()) == Some(best)
            }),
        });
    }
    Ok(out)
}

impl Line {
    /// The stroke of the line and of its legend sample.
    fn style(&self) -> ShapeStyle {
        ShapeStyle {
            color: self.color.to_rgba(),
            filled: false,
            stroke_width: 2,
        }
    }
}

fn lines(rows: &[PlotRow]) -> Vec<Line> {
    let mut tests: Vec<&str> = vec![];
    for r in rows {
        if !tests.contains(&r.test.as_str()) {
            tests.push(&r.test);
        }
    }
    let mut out = vec![];
    for (i, t) in tests.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mine: Vec<&PlotRow> = rows.iter().filter(|r| r.test == *t).collect();
        let pts = |f: &dyn Fn(&PlotRow) -> Option<f64>| {
            mine.iter()
                .filter_map(|r| Some(((r.size_bytes as f64).log2(), f(r)?)))
                .collect::<Vec<_>>()
        };
        out.push(Line {
            label: format!("{t}: ferry"),
            points: pts(&|r| r.ferry),
            dashed: false,
            color,
        });
        out.push(Line {
            label: format!("{t}: better baseline"),
            points: pts(&|r| r.baseline),
            dashed: true,
            color,
        });
    }
    out
}

/// Writes the plot of a report; the format follows the file extension.
pub fn write(rep: &Report, path: &Path) -> Result<(), PlotError> {
    write_rows(&rows_of(rep), path)
}

/// Writes the plot of some rows (e.g. [`rows_from_json`]); the format follows the extension.
pub fn write_rows(rows: &[PlotRow], path: &Path) -> Result<(), PlotError> {
    let name = path.display().to_string();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let lines = lines(rows);
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
        // plotters' error text is a Debug chain; where the file is the cause, say so plainly.
        message: crate::args::writable(path).err().unwrap_or(message),
        path: name,
    })
}

/// Registers the embedded DejaVu Sans as "sans-serif" (once): the plots need no system fonts
/// or fontconfig, so the binary runs on bare GPU hosts.
pub(crate) fn register_font() -> Result<(), String> {
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
    // The legend gets its own column at the right, so it never covers a line.
    let headroom = 1.05;
    let (w, _) = root.dim_in_pixel();
    let (plot_area, legend_area) = root.split_horizontally(w as i32 - 300);
    let mut chart = ChartBuilder::on(&plot_area)
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
                {
                    let lo = ymin.log10().floor();
                    lo..lo + (ymax.log10() - lo) * headroom
                }
            } else {
                0.0..(ymax * headroom).max(1e-3)
            },
        )
        .map_err(|x| e(&x))?;
    let ticks = (x1 - x0).floor() as usize + 1;
    chart
        .configure_mesh()
        .x_desc("size (bytes per copy, or per segment; log2 scale)")
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
        let style = l.style();
        if l.dashed {
            chart
                .draw_series(DashedLineSeries::new(l.points.clone(), 8, 6, style))
                .map_err(|x| e(&x))?;
        } else {
            chart
                .draw_series(LineSeries::new(l.points.clone(), style))
                .map_err(|x| e(&x))?;
            chart
                .draw_series(
                    l.points
                        .iter()
                        .map(|&p| Circle::new(p, 3, l.color.filled())),
                )
                .map_err(|x| e(&x))?;
        }
    }
    // Legend: one sample line and label per series, top to bottom.
    for (i, l) in lines.iter().enumerate() {
        let y = 70 + i as i32 * 22;
        let style = l.style();
        if l.dashed {
            legend_area
                .draw(&DashedPathElement::new(vec![(6, y), (34, y)], 5, 3, style))
                .map_err(|x| e(&x))?;
        } else {
            legend_area
                .draw(&PathElement::new(vec![(6, y), (34, y)], style))
                .map_err(|x| e(&x))?;
        }
        legend_area
            .draw(&Text::new(
                l.label.clone(),
                (42, y - 8),
                ("sans-serif", 14).into_font(),
            ))
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
