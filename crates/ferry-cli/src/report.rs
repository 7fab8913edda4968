//! Terminal output of `ferry bench`: aligned tables and a summary.

use crate::bench::{Kind, Report, Row};
use crate::sizes::format_size;

fn fmt_fig(kind: Kind, v: f64) -> String {
    match kind {
        Kind::Bandwidth if v >= 100.0 => format!("{v:.0}"),
        Kind::Bandwidth => format!("{v:.2}"),
        Kind::Latency if v >= 10.0 => format!("{v:.1}"),
        Kind::Latency => format!("{v:.3}"),
    }
}

/// How the row was timed: every clock its series used, ferry's first (`events`, `host`,
/// `events/host`).
fn clock(r: &Row) -> String {
    let mut names: Vec<&str> = vec![];
    for s in &r.series {
        if !names.contains(&s.clock.short()) {
            names.push(s.clock.short());
        }
    }
    names.join("/")
}

/// ferry's CPU cost: CPU seconds per GB moved, or the waiting thread's share of the wait.
fn cpu_cell(s: &crate::bench::Series) -> String {
    match (s.cpu_s_per_gb, s.wait_cpu_share) {
        (_, Some(x)) => format!("{:.0}% wait", x * 100.0),
        (Some(x), None) => format!("{x:.3} s/GB"),
        (None, None) => "-".into(),
    }
}

/// Renders rows of one kind as an aligned table.
pub fn table(rows: &[&Row], kind: Kind) -> String {
    let u = kind.unit();
    let ratio_head = match kind {
        Kind::Bandwidth => "ratio".to_string(),
        Kind::Latency => "ratio (time)".to_string(),
    };
    let head = vec![
        "test".to_string(),
        "size".into(),
        "payload".into(),
        format!("ferry {u}"),
        "(min..max)".into(),
        "better baseline".into(),
        format!("base {u}"),
        ratio_head,
        "link".into(),
        "caller (ratio)".into(),
        "cpu".into(),
        "clock".into(),
        "ok".into(),
    ];
    let mut cells = vec![head];
    for r in rows.iter().filter(|r| r.kind == kind) {
        let (f, b) = (r.ferry(), r.baseline());
        let range = |lo: f64, hi: f64| format!("{}..{}", fmt_fig(kind, lo), fmt_fig(kind, hi));
        let verified = r.series.iter().all(|s| s.verified);
        cells.push(vec![
            r.test.clone(),
            format_size(r.size_bytes),
            format_size(r.payload_bytes),
            f.map_or("-".into(), |s| fmt_fig(kind, s.median)),
            f.map_or("-".into(), |s| match kind {
                Kind::Bandwidth => range(s.worst, s.best),
                Kind::Latency => range(s.best, s.worst),
            }),
            r.best_baseline.clone(),
            b.map_or("-".into(), |s| fmt_fig(kind, s.median)),
            format!("{:.2}", r.ratio),
            r.link_limit_fraction
                .map_or("-".into(), |x| format!("{:.0}%", x * 100.0)),
            r.caller.as_ref().map_or("-".into(), |c| {
                format!("{} ({:.2})", fmt_fig(kind, c.ferry.median), c.ratio)
            }),
            f.map_or("-".into(), cpu_cell),
            clock(r),
            if verified { "yes".into() } else { "NO".into() },
        ]);
    }
    // Columns with no figure in any row on this machine (link, caller and cpu without a GPU)
    // are left out rather than shown as a column of dashes.
    let optional = ["link", "caller (ratio)", "cpu"];
    let empty: Vec<usize> = (0..cells[0].len())
        .filter(|&c| optional.contains(&cells[0][c].as_str()))
        .filter(|&c| cells.len() > 1 && cells[1..].iter().all(|r| r[c] == "-"))
        .collect();
    for row in &mut cells {
        for &c in empty.iter().rev() {
            row.remove(c);
        }
    }
    let widths: Vec<usize> = (0..cells[0].len())
        .map(|c| {
            cells
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, row) in cells.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, v)| {
                if c == 0 || c == 4 {
                    format!("{v:<w$}", w = widths[c])
                } else {
                    format!("{v:>w$}", w = widths[c])
                }
            })
            .collect();
        out += line.join("  ").trim_end();
        out.push('\n');
        if i == 0 {
            out += &"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1));
            out.push('\n');
        }
    }
    out
}

/// How to read the figures, printed under the header.
pub const READING: &str = "\
Reading: GB/s = 10^9 payload bytes/s, median of the samples (min..max beside it). ratio =
ferry / the better of the plain baselines measured in the same run on the same buffers (the
baseline column names it): above 1 ferry is faster; for latency rows it is ferry's time over
the baseline's, below 1 ferry is faster. link = ferry's figure as a fraction of the PCIe link.
caller (ratio) = GPU rows: one copy per call through the public API with the default config,
host clock around scope + copy + wait (ratio to raw cuMemcpyAsync + cuStreamSynchronize timed
the same way). cpu = ferry's process CPU seconds per GB moved, or (cuda-wait-cpu) the waiting
thread's CPU time as a share of the wait.
The method: `ferry bench --help`, or `--verbose` to print it here.
Small sizes (below about 64 KiB) fit in cache and show the per-call cost. CPU rows place the
source 64 B into a page and the destination 2 KiB further in (no 4 KiB aliasing between loads
and stores, which made these sizes swing from run to run with where the allocator put them).
";

/// The header printed above the tables: build, host, CPU and GPU models, engine settings.
pub fn header(rep: &Report) -> String {
    let m = &rep.method.settings;
    let e = &rep.cpu_engine;
    let h = &rep.host;
    let unknown = || "unknown".to_string();
    let gpus = gpu_list(&h.gpu_models);
    format!(
        "ferry bench {} (commit {}) on {} | CPU: {}, {} cores | GPU: {}\n\
         CPU engine: {} threads, chunk {}, inline {}, stream {} | warm-up {}, samples {}, median (min..max)\n",
        rep.ferry_version,
        rep.commit.unwrap_or("unknown"),
        h.hostname.clone().unwrap_or_else(unknown),
        h.cpu_model.clone().unwrap_or_else(unknown),
        h.cores,
        gpus,
        e.threads,
        format_size(e.chunk_bytes as u64),
        format_size(e.inline_bytes as u64),
        format_size(e.stream_bytes as u64),
        m.warmup,
        m.samples
    )
}

/// The GPU models in words, equal names counted: `2 x NVIDIA H200, 1 x NVIDIA L4`, or `none`.
pub fn gpu_list(models: &[String]) -> String {
    if models.is_empty() {
        return "none".to_string();
    }
    let mut names: Vec<(&str, usize)> = vec![];
    for g in models {
        match names.iter_mut().find(|(n, _)| n == g) {
            Some((_, k)) => *k += 1,
            None => names.push((g, 1)),
        }
    }
    let parts: Vec<String> = names.iter().map(|(n, k)| format!("{k} x {n}")).collect();
    parts.join(", ")
}

/// Everything printed after a run: header, how to read it (and the method with `verbose`), one
/// table per kind, left-out sizes, the summary per test family.
pub fn render(rep: &Report, verbose: bool) -> String {
    let mut out = header(rep);
    out += READING;
    if verbose {
        out += "\n";
        out += crate::bench::METHOD;
        out += "\n";
    }
    let rows: Vec<&Row> = rep.results.iter().collect();
    for kind in [Kind::Bandwidth, Kind::Latency] {
        if rows.iter().any(|r| r.kind == kind) {
            out.push('\n');
            out += &table(&rows, kind);
        }
    }
    let size_skips: Vec<_> = rep
        .skipped
        .iter()
        .filter(|s| s.test.contains(' '))
        .collect();
    if !size_skips.is_empty() {
        out += "\nleft out:";
        for s in size_skips {
            out += &format!(" {} ({});", s.test, s.reason);
        }
        out.push('\n');
    }
    let tile_vs = tile_vs_contig(rep);
    if !tile_vs.is_empty() {
        out += "\ncpu-tile vs cpu-contig (ferry, same payload):";
        for (size, r) in tile_vs {
            out += &format!(" {} {:.2}x", format_size(size), r);
        }
        out.push('\n');
    }
    out += &summary(&rows, Some(rep.cpu_engine.inline_bytes as u64));
    out
}

/// The family a test belongs to: the summary's lines and the plot's panels.
pub fn family(test: &str) -> &'static str {
    match test {
        t if t.contains("latency") => "latency",
        t if t.starts_with("cpu-") => "CPU",
        "file-read"
        | "cuda-file-read"
        | "file-read-direct"
        | "cuda-file-read-direct"
        | "cuda-file-read-cufile" => "files",
        t if t == "pipeline" || t.starts_with("cuda-pipeline") => "pipeline",
        "cuda-scatter" | "cuda-scatter-pageable" | "cuda-gather-pageable" => "scattered",
        t if t.starts_with("cuda-tile") || t.starts_with("cuda-transpose") => "strided",
        t if t.starts_with("cuda-d2d")
            || t.starts_with("multi-peer")
            || t.starts_with("multi-nccl") =>
        {
            "device"
        }
        _ => "host<->device",
    }
}

/// Families in the order the summary lists them and the plot draws them.
pub const FAMILIES: [&str; 8] = [
    "host<->device",
    "device",
    "strided",
    "scattered",
    "files",
    "CPU",
    "pipeline",
    "latency",
];

/// Payloads up to this size are called cache-sized: source and destination stay in the CPU's
/// caches, so the row shows the per-call cost, not memory bandwidth.
pub const CACHE_SIZED: u64 = 64 << 10;

/// Why ferry is behind in row `r`, in a few words, where the cause is known: a latency row
/// against a bare `copy_from_slice` of the same few bytes (no request to submit or wait for),
/// a CPU copy at or below the engine's inline threshold `inline` (run on the caller's thread:
/// the request's fixed cost on a tiny copy), a cache-sized CPU copy, a cache-sized CPU
/// pipeline (its 16 chunks so small that handing each between threads costs more than the
/// work, where the sequential loop's small copies run inline on its own thread). None where the
/// cause is not known.
pub fn why_behind(r: &Row, inline: Option<u64>) -> Option<String> {
    let fam = family(&r.test);
    if fam == "latency" && r.best_baseline == "copy_from_slice" {
        return Some("a request's submit+wait against a bare copy_from_slice".into());
    }
    if r.test == "pipeline" && r.payload_bytes <= CACHE_SIZED {
        return Some(format!(
            "cache-sized, chunks of {} or less handed between threads (the loop copies them inline on one)",
            format_size(CACHE_SIZED / 16)
        ));
    }
    if fam != "CPU" || r.kind != Kind::Bandwidth {
        return None;
    }
    match inline {
        Some(i) if r.payload_bytes <= i => Some(format!(
            "at or below the {} inline threshold (a request's fixed cost on a small copy)",
            format_size(i)
        )),
        _ if r.payload_bytes <= CACHE_SIZED => Some(format!(
            "cache-sized, {} or less (per-call cost, not memory bandwidth)",
            format_size(CACHE_SIZED)
        )),
        _ => None,
    }
}

/// The closing summary: per family, the geometric mean of ferry's ratio to the better baseline
/// (and its range), the best fraction of the physical limit where one is known, and the rows
/// where ferry falls short (more than 10% behind the baseline), in words, with why where the
/// cause is known ([`why_behind`]; `inline` is the CPU engine's inline threshold).
pub fn summary(rows: &[&Row], inline: Option<u64>) -> String {
    // The limit is said only where some row measured it (never on a machine without a GPU).
    let any_limit = rows.iter().any(|r| r.link_limit_fraction.is_some());
    let mut out = format!(
        "\nsummary (ratio: geometric mean over sizes of ferry / better baseline, min..max{})\n",
        if any_limit {
            "; limit: best fraction of the PCIe link"
        } else {
            ""
        }
    );
    let w = FAMILIES.iter().map(|f| f.len()).max().unwrap_or(0);
    for fam in FAMILIES {
        let rs: Vec<&&Row> = rows
            .iter()
            .filter(|r| family(&r.test) == fam && r.ratio.is_finite() && r.ratio > 0.0)
            .collect();
        if rs.is_empty() {
            continue;
        }
        let latency = fam == "latency";
        let geo = (rs.iter().map(|r| r.ratio.ln()).sum::<f64>() / rs.len() as f64).exp();
        let lo = rs.iter().map(|r| r.ratio).fold(f64::INFINITY, f64::min);
        let hi = rs.iter().map(|r| r.ratio).fold(0.0, f64::max);
        let limit = rs
            .iter()
            .filter_map(|r| r.link_limit_fraction)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        let limit = match limit {
            Some(x) => format!("  limit {:.0}%", x * 100.0),
            None if any_limit => "  limit not measured".to_string(),
            None => String::new(),
        };
        // Short: ferry more than 10% behind the baseline.
        let short_rows: Vec<&&&Row> = rs
            .iter()
            .filter(|r| {
                if latency {
                    r.ratio > 1.1
                } else {
                    r.ratio < 0.9
                }
            })
            .collect();
        let short: Vec<String> = short_rows
            .iter()
            .map(|r| format!("{} {} ({:.2})", r.test, format_size(r.size_bytes), r.ratio))
            .collect();
        // Why, each known cause once with the number of rows it explains.
        let mut causes: Vec<(String, usize)> = vec![];
        for r in &short_rows {
            if let Some(why) = why_behind(r, inline) {
                match causes.iter_mut().find(|(w, _)| *w == why) {
                    Some((_, k)) => *k += 1,
                    None => causes.push((why, 1)),
                }
            }
        }
        let why = if causes.is_empty() {
            String::new()
        } else {
            let parts: Vec<String> = causes
                .iter()
                .map(|(w, k)| {
                    if *k == short_rows.len() {
                        format!("all {w}")
                    } else {
                        format!("{k} {w}")
                    }
                })
                .collect();
            format!("; why: {}", parts.join("; "))
        };
        let verdict = if short.is_empty() {
            "at or above the baseline everywhere".to_string()
        } else {
            let shown = short.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
            let more = short.len().saturating_sub(4);
            let what = if latency { "slower than" } else { "behind" };
            format!(
                "{what} the baseline in {} of {} rows: {shown}{}{why}",
                short.len(),
                rs.len(),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )
        };
        out += &format!(
            "  {fam:<w$}  ratio {geo:.2} ({lo:.2}..{hi:.2}{}){limit}  {verdict}\n",
            if latency {
                ", time: lower is better"
            } else {
                ""
            }
        );
    }
    out
}

/// For each payload size in both `cpu-tile` and `cpu-contig`: ferry tile GB/s / ferry contiguous GB/s.
pub fn tile_vs_contig(rep: &Report) -> Vec<(u64, f64)> {
    let find = |t: &str, size: u64| {
        rep.results
            .iter()
            .find(|r| r.test == t && r.payload_bytes == size)
            .and_then(|r| r.ferry())
            .map(|s| s.median)
    };
    rep.results
        .iter()
        .filter(|r| r.test == "cpu-tile")
        .filter_map(|r| {
            Some((
                r.payload_bytes,
                find("cpu-tile", r.payload_bytes)? / find("cpu-contig", r.payload_bytes)?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{Clock, Role, Series, Timing};

    fn series(name: &str, role: Role, clock: Clock) -> Series {
        let t = Timing {
            samples_s: vec![1e-3],
            reps: 1,
            median_s: 1e-3,
            min_s: 1e-3,
            max_s: 1e-3,
        };
        Series::new(name, role, Kind::Bandwidth, 1 << 20, t).clocked(clock)
    }

    fn row(test: &str, kind: Kind, size: u64, base: &str, ratio: f64) -> Row {
        let mut r = Row::new(
            test,
            kind,
            size,
            size,
            String::new(),
            vec![
                series("ferry", Role::Ferry, Clock::Host),
                series(base, Role::Baseline, Clock::Host),
            ],
        );
        r.best_baseline = base.to_string();
        r.ratio = ratio;
        r
    }

    /// Issue 33: on a CPU-only machine the link, caller and cpu columns were all "-".
    #[test]
    fn columns_without_data_are_left_out() {
        let cpu = row(
            "cpu-contig",
            Kind::Bandwidth,
            1 << 20,
            "copy_from_slice",
            1.0,
        );
        let t = table(&[&cpu], Kind::Bandwidth);
        let head = t.lines().next().unwrap();
        for gone in ["link", "caller", "cpu "] {
            assert!(!head.contains(gone), "{t}");
        }
        assert!(head.contains("clock") && head.contains("ok"), "{t}");
        let mut gpu = row("cuda-h2d-pinned", Kind::Bandwidth, 1 << 20, "raw", 1.0);
        gpu.link_limit_fraction = Some(0.8);
        let t = table(&[&cpu, &gpu], Kind::Bandwidth);
        let head = t.lines().next().unwrap();
        assert!(head.contains("link") && !head.contains("caller"), "{t}");
        assert!(t.lines().nth(3).unwrap().contains("80%"), "{t}");
    }

    /// Issue 33: "behind in 43 of 64 rows" with no word on why.
    #[test]
    fn behind_says_why_where_known() {
        let lat = row(
            "cpu-latency-queued",
            Kind::Latency,
            4,
            "copy_from_slice",
            30.9,
        );
        let small = row(
            "cpu-contig",
            Kind::Bandwidth,
            4 << 10,
            "copy_from_slice",
            0.5,
        );
        let cached = row("cpu-tile", Kind::Bandwidth, 64 << 10, "row loop", 0.5);
        let big = row("cpu-tile", Kind::Bandwidth, 64 << 20, "row loop", 0.5);
        let text = summary(&[&lat, &small, &cached, &big], Some(16 << 10));
        let line = |fam: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(fam))
                .unwrap()
                .to_string()
        };
        let l = line("latency");
        assert!(
            l.contains("why: all a request's submit+wait against a bare copy_from_slice"),
            "{l}"
        );
        let c = line("CPU");
        assert!(c.contains("behind the baseline in 3 of 3 rows"), "{c}");
        assert!(c.contains("1 at or below the 16K inline threshold"), "{c}");
        assert!(c.contains("1 cache-sized"), "{c}");
        // The 64M row's cause is not known: nothing is said for it.
        assert_eq!(why_behind(&big, Some(16 << 10)), None);
        // The CPU pipeline at 4K (16 chunks of 256 bytes): the hand-off per chunk.
        let pipe = row("pipeline", Kind::Bandwidth, 4 << 10, "sequential", 0.011);
        let pipe_big = row("pipeline", Kind::Bandwidth, 64 << 20, "sequential", 0.5);
        let p = summary(&[&pipe, &pipe_big], Some(16 << 10));
        let p = p.lines().find(|l| l.contains("pipeline")).unwrap();
        assert!(p.contains("behind the baseline in 2 of 2 rows"), "{p}");
        assert!(
            p.contains("why: 1 cache-sized, chunks of 4K or less handed between threads"),
            "{p}"
        );
        assert_eq!(why_behind(&pipe_big, Some(16 << 10)), None);
        let all_fine = row(
            "cpu-contig",
            Kind::Bandwidth,
            64 << 20,
            "copy_from_slice",
            1.0,
        );
        assert!(!summary(&[&all_fine], None).contains("why"));
    }

    #[test]
    fn table_shows_how_each_row_was_timed() {
        let events = Row::new(
            "cuda-d2d",
            Kind::Bandwidth,
            1 << 20,
            1 << 20,
            String::new(),
            vec![
                series("ferry", Role::Ferry, Clock::CudaEvents),
                series("raw", Role::Baseline, Clock::CudaEvents),
            ],
        );
        let mixed = Row::new(
            "cuda-x",
            Kind::Bandwidth,
            1 << 20,
            1 << 20,
            String::new(),
            vec![
                series("ferry", Role::Ferry, Clock::Host),
                series("raw", Role::Baseline, Clock::CudaEvents),
            ],
        );
        assert_eq!(clock(&events), "events");
        assert_eq!(clock(&mixed), "host/events");
        let t = table(&[&events, &mixed], Kind::Bandwidth);
        let head = t.lines().next().unwrap();
        assert!(head.contains("clock"), "{t}");
        assert!(t.lines().nth(2).unwrap().contains(" events "), "{t}");
        assert!(t.lines().nth(3).unwrap().contains(" host/events "), "{t}");
    }
}
