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
            clock(r),
            if verified { "yes".into() } else { "NO".into() },
        ]);
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

/// The header printed above the tables: engine, method settings.
pub fn header(rep: &Report) -> String {
    let m = &rep.method.settings;
    let e = &rep.cpu_engine;
    format!(
        "ferry bench {} | {} cores | CPU engine: {} threads, chunk {}, inline {} | warm-up {}, samples {}, median (min..max)\n",
        rep.ferry_version,
        rep.host.cores,
        e.threads,
        format_size(e.chunk_bytes as u64),
        format_size(e.inline_bytes as u64),
        m.warmup,
        m.samples
    )
}

/// Everything printed after a run: header, method, one table per kind, summary lines.
pub fn render(rep: &Report) -> String {
    let mut out = header(rep);
    out += crate::bench::METHOD;
    out += "\n";
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
