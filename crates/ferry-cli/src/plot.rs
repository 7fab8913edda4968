//! `--plot FILE.svg|FILE.png`: one image, a grid of small panels, one per test family (the
//! summary's families, [`crate::report::family`]); a family with more than [`MAX_SERIES`]
//! series gets several panels. Each series is ferry's or one named baseline's, drawn with its
//! own dash and marker (so series that coincide all show) and min..max whiskers at each
//! measured size, and joined only to its neighbouring measured sizes; bandwidth in GB/s,
//! latency in microseconds, log-2 size axes ticked only at the measured sizes. The title names
//! the build (commit) and the CPU and GPU models.

mod draw;

use crate::bench::{Kind, Report, Role};
use crate::report::{family, gpu_list, FAMILIES};
use plotters::prelude::{BitMapBackend, SVGBackend};
use std::path::Path;
use thiserror::Error;

/// The most series one panel holds.
pub const MAX_SERIES: usize = 6;

/// Why a plot was not written.
#[derive(Debug, Error)]
pub enum PlotError {
    /// The file name ends in neither `.svg` nor `.png`.
    #[error("plot file `{0}` must end in .svg or .png")]
    Format(String),
    /// The file name is only the extension (`.svg`, `out/.png`): no name before it.
    #[error("plot file `{0}` has no name before the extension: give e.g. `plot{1}`")]
    NoName(String, String),
    /// A saved JSON file that is not a `ferry bench --json` report.
    #[error("cannot read the results: {0}")]
    Json(String),
    /// No result to plot.
    #[error("nothing to plot: no test was run")]
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

/// A picture's file format, from the file name: the one rule for `--plot` and `--gantt`,
/// checked before a run ([`crate::args::validate`]) and followed when writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `NAME.svg` (any case).
    Svg,
    /// `NAME.png` (any case).
    Png,
}

impl Format {
    /// The format of `path`: its name ends in `.svg` or `.png` (any case) after at least one
    /// character (`.svg` alone is a hidden file without an extension: refused as such).
    pub fn of(path: &Path) -> Result<Format, PlotError> {
        let name = path.display().to_string();
        let lower = |e: &std::ffi::OsStr| e.to_str().map(str::to_ascii_lowercase);
        match path.extension().and_then(lower).as_deref() {
            Some("svg") => return Ok(Format::Svg),
            Some("png") => return Ok(Format::Png),
            _ => {}
        }
        // `Path::extension` of `.svg` is None: the whole name is the extension.
        let dotted = path.file_name().and_then(lower);
        match dotted.as_deref() {
            Some(ext @ (".svg" | ".png")) => Err(PlotError::NoName(name, ext.to_string())),
            _ => Err(PlotError::Format(name)),
        }
    }
}

/// One measured series at one size: ferry's or one baseline's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotSeries {
    /// The series' name (`ferry cpu(2)`, `copy_from_slice`, ...).
    pub name: String,
    /// ferry's series (else a baseline).
    pub ferry: bool,
    /// Median figure (GB/s, or us for latency).
    pub median: f64,
    /// Worst sample's figure.
    pub worst: f64,
    /// Best sample's figure.
    pub best: f64,
}

/// What a plot needs of one result row: the same from a fresh [`Report`] or a saved JSON file.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotRow {
    /// Test name.
    pub test: String,
    /// A latency row (figures in us) rather than a bandwidth row (GB/s).
    pub latency: bool,
    /// The row's size (the x axis): bytes per copy, or per segment for segment lists.
    pub size_bytes: u64,
    /// Every series of the row, ferry's first.
    pub series: Vec<PlotSeries>,
}

/// A picture's content: its title and rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    /// The title: version, commit, CPU and GPU models.
    pub title: String,
    /// The rows, in run order.
    pub rows: Vec<PlotRow>,
}

/// One plotted series: one test's ferry or baseline figures over sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Legend text: `test: series name`.
    pub label: String,
    /// ferry's series (else a baseline).
    pub ferry: bool,
    /// (size in bytes, median, worst, best), by size.
    pub points: Vec<(u64, f64, f64, f64)>,
}

/// One panel of the grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// The panel's caption: the family, `(2/3)` where it takes several panels, and the unit.
    pub title: String,
    /// Latency (us) rather than bandwidth (GB/s).
    pub latency: bool,
    /// The tests drawn, in run order.
    pub tests: Vec<String>,
    /// At most [`MAX_SERIES`] series.
    pub curves: Vec<Curve>,
}

/// The picture's title from what the run recorded; unknown parts say so.
fn title(
    version: &str,
    commit: Option<&str>,
    cpu: Option<&str>,
    cores: Option<u64>,
    gpus: Option<&[String]>,
) -> String {
    let cores = cores.map_or(String::new(), |c| format!(", {c} cores"));
    format!(
        "ferry bench {version} (commit {}) | CPU: {}{cores} | GPU: {}",
        commit.unwrap_or("unknown"),
        cpu.unwrap_or("unknown"),
        gpus.map_or("unknown".to_string(), gpu_list)
    )
}

impl Plot {
    /// The picture of a fresh report.
    pub fn of(rep: &Report) -> Plot {
        let h = &rep.host;
        let rows = rep
            .results
            .iter()
            .map(|r| PlotRow {
                test: r.test.clone(),
                latency: r.kind == Kind::Latency,
                size_bytes: r.size_bytes,
                series: r
                    .series
                    .iter()
                    .map(|s| PlotSeries {
                        name: s.name.clone(),
                        ferry: s.role == Role::Ferry,
                        median: s.median,
                        worst: s.worst,
                        best: s.best,
                    })
                    .collect(),
            })
            .collect();
        Plot {
            title: title(
                rep.ferry_version,
                rep.commit,
                h.cpu_model.as_deref(),
                Some(h.cores as u64),
                Some(&h.gpu_models),
            ),
            rows,
        }
    }

    /// The picture of a `--json` file (schema `ferry-bench/1`), for re-plotting saved runs;
    /// files written before `commit` and the host's models were recorded plot as well.
    pub fn from_json(v: &serde_json::Value) -> Result<Plot, PlotError> {
        let bad = |why: &str| PlotError::Json(why.to_string());
        if v.get("schema").and_then(|s| s.as_str()) != Some("ferry-bench/1") {
            return Err(bad("not a ferry-bench/1 file (field `schema`)"));
        }
        let results = v
            .get("results")
            .and_then(|r| r.as_array())
            .ok_or_else(|| bad("no `results` array"))?;
        fn str_of<'a>(v: &'a serde_json::Value, k: &str) -> Option<&'a str> {
            v.get(k).and_then(|x| x.as_str())
        }
        let mut rows = vec![];
        for (i, r) in results.iter().enumerate() {
            let latency = match str_of(r, "kind") {
                Some("bandwidth") => false,
                Some("latency") => true,
                _ => continue,
            };
            // Which row is wrong: its place in `results` and its test (cut: a name can be long).
            let test = str_of(r, "test");
            let at = |why: &str| {
                let name: String = test.unwrap_or("?").chars().take(48).collect();
                PlotError::Json(format!("result {} (test `{name}`): {why}", i + 1))
            };
            let test = test.ok_or_else(|| at("no `test`"))?.to_string();
            let series = r
                .get("series")
                .and_then(|s| s.as_array())
                .ok_or_else(|| at("no `series` array"))?;
            let series = series
                .iter()
                .filter_map(|s| {
                    let f = |k: &str| s.get(k).and_then(|x| x.as_f64());
                    let median = f("median")?;
                    Some(PlotSeries {
                        name: str_of(s, "name").unwrap_or("?").to_string(),
                        ferry: str_of(s, "role") == Some("ferry"),
                        median,
                        worst: f("worst").unwrap_or(median),
                        best: f("best").unwrap_or(median),
                    })
                })
                .collect::<Vec<_>>();
            // An empty series list left the x axis without ends (it spun forever).
            if series.is_empty() {
                return Err(at("no series with a `median` (no figure to draw)"));
            }
            // Sizes are drawn on a log axis: 0 (log2: -inf) would make it endless.
            let size_bytes = match r.get("size_bytes").and_then(|p| p.as_u64()) {
                Some(0) => return Err(at("`size_bytes` is 0: sizes are at least 1 byte")),
                Some(n) => n,
                None => return Err(at("no `size_bytes` (a whole number of bytes)")),
            };
            rows.push(PlotRow {
                test,
                latency,
                size_bytes,
                series,
            });
        }
        if rows.is_empty() && !results.is_empty() {
            return Err(bad(
                "no result of kind `bandwidth` or `latency` (nothing to draw)",
            ));
        }
        let host = v.get("host");
        // Files written before the models were recorded: "unknown", not "none".
        let gpus: Option<Vec<String>> = host
            .and_then(|h| h.get("gpu_models"))
            .and_then(|g| g.as_array())
            .map(|g| {
                g.iter()
                    .filter_map(|x| Some(x.as_str()?.to_string()))
                    .collect()
            });
        let title = title(
            str_of(v, "ferry_version").unwrap_or("?"),
            str_of(v, "commit"),
            host.and_then(|h| str_of(h, "cpu_model")),
            host.and_then(|h| h.get("cores")).and_then(|c| c.as_u64()),
            gpus.as_deref(),
        );
        Ok(Plot { title, rows })
    }

    /// The panels: per family (in the summary's order), the family's tests in run order, a
    /// new panel wherever the next test's series would pass [`MAX_SERIES`] (a test with more
    /// keeps ferry's and its first baselines).
    pub fn panels(&self) -> Vec<Panel> {
        let mut out = vec![];
        for fam in FAMILIES {
            let mut tests: Vec<(&str, bool)> = vec![];
            for r in self.rows.iter().filter(|r| family(&r.test) == fam) {
                if !tests.iter().any(|t| t.0 == r.test) {
                    tests.push((&r.test, r.latency));
                }
            }
            let first = out.len();
            for (test, latency) in tests {
                let curves = self.curves(test);
                let fits = out.last().is_some_and(|p: &Panel| {
                    out.len() > first
                        && p.latency == latency
                        && p.curves.len() + curves.len() <= MAX_SERIES
                });
                if !fits {
                    out.push(Panel {
                        title: fam.to_string(),
                        latency,
                        tests: vec![],
                        curves: vec![],
                    });
                }
                let p = out.last_mut().expect("a panel was pushed");
                p.tests.push(test.to_string());
                p.curves.extend(curves);
            }
            let n = out.len() - first;
            for (i, p) in out[first..].iter_mut().enumerate() {
                if n > 1 {
                    p.title += &format!(" ({}/{n})", i + 1);
                }
                p.title += if p.latency {
                    ": us per copy, lower is better"
                } else {
                    ": GB/s"
                };
            }
        }
        out
    }

    /// One test's series: ferry's first, then each baseline by name, at most [`MAX_SERIES`].
    fn curves(&self, test: &str) -> Vec<Curve> {
        let mut out: Vec<Curve> = vec![];
        let mut rows: Vec<&PlotRow> = self.rows.iter().filter(|r| r.test == test).collect();
        rows.sort_by_key(|r| r.size_bytes);
        for r in rows {
            for s in &r.series {
                let label = if s.ferry {
                    format!("{test}: ferry")
                } else {
                    format!("{test}: {}", s.name)
                };
                let i = match out.iter().position(|c| c.label == label) {
                    Some(i) => i,
                    None => {
                        out.push(Curve {
                            label,
                            ferry: s.ferry,
                            points: vec![],
                        });
                        out.len() - 1
                    }
                };
                out[i]
                    .points
                    .push((r.size_bytes, s.median, s.worst, s.best));
            }
        }
        out.sort_by_key(|c| !c.ferry);
        out.truncate(MAX_SERIES);
        out
    }

    /// Writes the picture; the format follows the file extension.
    pub fn write(&self, path: &Path) -> Result<(), PlotError> {
        let name = path.display().to_string();
        let format = Format::of(path)?;
        let panels = self.panels();
        if panels.is_empty() {
            return Err(PlotError::Empty);
        }
        let size = draw::size(panels.len());
        let res = match format {
            Format::Svg => draw::grid(SVGBackend::new(path, size), &self.title, &panels),
            Format::Png => draw::grid(BitMapBackend::new(path, size), &self.title, &panels),
        };
        res.map_err(|message| PlotError::Draw {
            // plotters' error text is a Debug chain; where the file is the cause, say so plainly.
            message: crate::args::writable(path).err().unwrap_or(message),
            path: name,
        })
    }
}

/// Writes the picture of a report; the format follows the file extension.
pub fn write(rep: &Report, path: &Path) -> Result<(), PlotError> {
    Plot::of(rep).write(path)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::registry;

    /// A row of `test` at `size` with ferry's series and `baselines` named baselines.
    fn row(test: &str, latency: bool, size: u64, baselines: usize) -> PlotRow {
        let s = |name: String, ferry| PlotSeries {
            name,
            ferry,
            median: 2.0,
            worst: 1.0,
            best: 3.0,
        };
        let mut series = vec![s("ferry".into(), true)];
        series.extend((0..baselines).map(|i| s(format!("base {i}"), false)));
        PlotRow {
            test: test.to_string(),
            latency,
            size_bytes: size,
            series,
        }
    }

    #[test]
    fn every_test_is_in_one_family_and_no_panel_has_more_than_six_series() {
        // Every registered test (as a full GPU run would produce it), 1 to 3 baselines each.
        let mut rows = vec![];
        for (i, t) in registry().iter().enumerate() {
            let latency = t.kind == Kind::Latency;
            for size in [4096, 1 << 20, 1 << 24] {
                rows.push(row(t.name, latency, size, 1 + i % 3));
            }
        }
        let plot = Plot {
            title: String::new(),
            rows,
        };
        let panels = plot.panels();
        for t in registry() {
            let fam = family(t.name);
            assert!(FAMILIES.contains(&fam), "{} in no family", t.name);
            let holding: Vec<&Panel> = panels
                .iter()
                .filter(|p| p.tests.iter().any(|x| x == t.name))
                .collect();
            assert_eq!(holding.len(), 1, "{} in {} panels", t.name, holding.len());
            let p = holding[0];
            assert!(p.title.starts_with(fam), "{} in panel {}", t.name, p.title);
            assert_eq!(p.latency, t.kind == Kind::Latency, "{}", t.name);
            let mine = p.curves.iter().filter(|c| c.label.starts_with(t.name));
            assert!(mine.count() >= 2, "{}: ferry and a baseline", t.name);
        }
        for p in &panels {
            assert!(
                (1..=MAX_SERIES).contains(&p.curves.len()),
                "{}: {} series",
                p.title,
                p.curves.len()
            );
            // Baselines are named, never "better baseline".
            assert!(p.curves.iter().all(|c| !c.label.contains("better")));
        }
        // A family split over several panels says so.
        assert!(panels
            .iter()
            .any(|p| p.title.starts_with("host<->device (1/")));
    }

    #[test]
    fn one_test_with_many_baselines_keeps_ferry_and_the_first_five() {
        let plot = Plot {
            title: String::new(),
            rows: vec![row("cpu-contig", false, 4096, 9)],
        };
        let panels = plot.panels();
        assert_eq!(panels.len(), 1);
        let c = &panels[0].curves;
        assert_eq!(c.len(), MAX_SERIES);
        assert!(c[0].ferry && c[0].label == "cpu-contig: ferry");
        assert_eq!(c[1].label, "cpu-contig: base 0");
    }

    /// A row of size 0 (its log2 is -inf) or without series made the drawing loop forever on
    /// an endless axis: both are refused when the file is read.
    #[test]
    fn rows_of_size_zero_or_without_series_are_refused() {
        let file = |size: u64, series: serde_json::Value| {
            serde_json::json!({
                "schema": "ferry-bench/1",
                "results": [{"test": "cpu-contig", "kind": "bandwidth", "size_bytes": size, "series": series}]
            })
        };
        let one = serde_json::json!([{"name": "ferry", "role": "ferry", "median": 1.0}]);
        assert!(Plot::from_json(&file(4096, one.clone())).is_ok());
        let Err(e) = Plot::from_json(&file(0, one)) else {
            panic!("size 0 accepted")
        };
        assert!(
            e.to_string()
                .contains("result 1 (test `cpu-contig`): `size_bytes` is 0"),
            "{e}"
        );
        let Err(e) = Plot::from_json(&file(4096, serde_json::json!([]))) else {
            panic!("no series accepted")
        };
        assert!(e.to_string().contains("no series"), "{e}");
    }

    #[test]
    fn old_json_without_commit_or_models_plots_with_unknowns() {
        let v = serde_json::json!({
            "schema": "ferry-bench/1",
            "ferry_version": "0.1.0",
            "host": {"cores": 16, "os": "linux", "arch": "x86_64"},
            "results": [
                {"test": "cuda-latency", "kind": "latency", "size_bytes": 4, "series": [
                    {"name": "ferry cuda:0", "role": "ferry", "median": 9.0, "worst": 12.0, "best": 8.0},
                    {"name": "raw", "role": "baseline", "median": 7.0}]},
                {"test": "cuda-d2d", "kind": "bandwidth", "size_bytes": 1048576, "series": [
                    {"name": "ferry", "role": "ferry", "median": 900.0, "worst": 800.0, "best": 950.0}]}
            ]
        });
        let plot = Plot::from_json(&v).unwrap();
        assert_eq!(
            plot.title,
            "ferry bench 0.1.0 (commit unknown) | CPU: unknown, 16 cores | GPU: unknown"
        );
        let panels = plot.panels();
        let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(
            titles,
            ["device: GB/s", "latency: us per copy, lower is better"]
        );
        // A series without min..max: its median stands for both.
        assert_eq!(panels[1].curves[1].points, [(4, 7.0, 7.0, 7.0)]);
        assert_eq!(panels[1].curves[1].label, "cuda-latency: raw");
    }
}
