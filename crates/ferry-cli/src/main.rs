//! `ferry`: the command-line tool. `ferry info` shows what ferry finds on this machine;
//! `ferry bench` measures ferry's engines against plain baselines; `ferry load` and `ferry save`
//! move a file or a safetensors checkpoint to a GPU (or host memory) and back.

use ferry_cli::args::{self, ArgError, BenchPlan, Plan};
use ferry_cli::bench;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    // `ferry bench`'s ipc-* rows start this program again as their peer process.
    if let Some(code) = bench::ipc::peer_main() {
        return code;
    }
    // Every check that needs no work runs here, before anything is measured or written.
    let plan = match args::validate(std::env::args_os()) {
        Ok(plan) => plan,
        Err(ArgError::Clap(e)) => e.exit(),
        Err(e) => return fail(&e),
    };
    let res = match plan {
        Plan::Info { json } => info(json),
        Plan::List => list(),
        Plan::Bench(plan) => run_bench(&plan),
        Plan::Plot { json, outs } => replot(&json, &outs),
        Plan::Load(a) => {
            let a = *a;
            load(ferry_cli::load::check(
                &a.path, a.offset, a.length, a.verify, None, a.io,
            ))
        }
        Plan::Save(a) => {
            let a = *a;
            let save = Some(
                ferry_cli::load::SaveTo::new(a.dst, a.fsync, a.shard_size)
                    .with(a.writer.writer(), a.snapshot_bytes),
            );
            load(ferry_cli::load::check(
                &a.src, None, None, false, save, a.io,
            ))
        }
    };
    match (res, ferry_cli::signal::caught()) {
        (Ok(()), _) => ExitCode::SUCCESS,
        // A save stopped by Ctrl-C or SIGTERM: its partial file removed, exit as the signal.
        (Err(e), Some(sig)) => {
            fail(&*e);
            ExitCode::from(ferry_cli::signal::exit_status(sig))
        }
        (Err(e), None) => fail(&*e),
    }
}

/// Reports `e` (names from a file in it escaped: [`ferry_cli::load::terminal_text`]).
fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    note(&format!(
        "ferry: error: {}",
        ferry_cli::load::terminal_text(&e.to_string())
    ));
    ExitCode::FAILURE
}

type AnyError = Box<dyn std::error::Error>;

/// Writes `text` to standard output. A reader that went away (`ferry bench --list | head -1`)
/// ends the output quietly; another failure (a full disk) is an error, never a panic (as
/// `print!` would).
fn out(text: &str) -> Result<(), AnyError> {
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write to standard output: {e}").into())
        }
        _ => Ok(()),
    }
}

/// Writes a line to standard error, where a failure has nowhere to be told (no panic, as
/// `eprintln!` would).
fn note(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

fn info(json: bool) -> Result<(), AnyError> {
    let info = ferry_cli::info::gather();
    if json {
        out(&format!("{}\n", serde_json::to_string_pretty(&info)?))
    } else {
        out(&ferry_cli::info::render(&info))
    }
}

/// `bench --list`: one line per test in aligned columns, then why it cannot run here.
fn list() -> Result<(), AnyError> {
    let reg = bench::registry();
    let rows: Vec<[String; 4]> = reg
        .iter()
        .map(|t| {
            [
                t.name.to_string(),
                format!("{:?}", t.kind).to_lowercase(),
                format!("{:?}", t.needs).to_lowercase(),
                format!("sizes {}", t.default_sizes),
            ]
        })
        .collect();
    let w: Vec<usize> = (0..4)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for (t, r) in reg.iter().zip(&rows) {
        let status = match bench::availability(t.needs) {
            Ok(()) => "available".to_string(),
            Err(why) => format!("unavailable: {why}"),
        };
        text += &format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {}\n{:<w0$}  {status}\n",
            r[0],
            r[1],
            r[2],
            r[3],
            t.description,
            "",
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
        );
    }
    out(&text)
}

fn run_bench(plan: &BenchPlan) -> Result<(), AnyError> {
    args::preflight(plan)?;
    if let Some(line) = args::left_out(&plan.skipped) {
        note(&format!("ferry bench: {line}"));
    }
    bench::pipeline::set_trace(plan.trace.is_some() || !plan.gantt.is_empty());
    // Progress on stderr, only on a terminal, and only once the run has lasted 1 s.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let tty = std::io::stderr().is_terminal();
    let t0 = Instant::now();
    let mut shown = false;
    let rep = bench::run(&plan.cfg, &plan.skipped, |done, total, what| {
        if tty && !shown && t0.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(250));
            shown = true;
        }
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(what.to_string());
    });
    bar.finish_and_clear();
    let rep = rep?;
    // The files are written even if the table cannot be shown: the run is not lost.
    let shown = out(&ferry_cli::report::render(&rep, plan.verbose));
    if let Some(path) = &plan.json {
        args::check_writable(path)?;
        std::fs::write(path, serde_json::to_string_pretty(&rep)?)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        note(&format!("wrote {}", path.display()));
    }
    for p in &plan.plot {
        args::check_writable(p)?;
        ferry_cli::plot::write(&rep, p)?;
        note(&format!("wrote {}", p.display()));
    }
    write_traces(plan.trace.as_deref(), &plan.gantt)?;
    shown
}
/// `--trace` and `--gantt`: the timelines the pipeline tests kept.
fn write_traces(trace: Option<&std::path::Path>, gantt: &[PathBuf]) -> Result<(), AnyError> {
    let traces = bench::pipeline::take_traces();
    let Some((last_name, last)) = traces.last() else {
        if trace.is_some() || !gantt.is_empty() {
            note("ferry bench: no test with a timeline ran (pipeline, cuda-pipeline)");
        }
        return Ok(());
    };
    if let Some(path) = trace {
        let write = |p: &std::path::Path, name: &str, t: &ferry::pipeline::Timeline| {
            args::check_writable(p)?;
            std::fs::write(p, t.to_chrome_trace(name))
                .map_err(|e| AnyError::from(format!("cannot write {}: {e}", p.display())))
        };
        write(path, last_name, last)?;
        note(&format!("wrote {}", path.display()));
        if traces.len() > 1 {
            for (name, t) in &traces {
                let p = args::trace_file(path, name);
                write(&p, name, t)?;
                note(&format!("wrote {}", p.display()));
            }
        }
    }
    for p in gantt {
        args::check_writable(p)?;
        ferry_cli::gantt::write(last, last_name, p)?;
        note(&format!("wrote {}", p.display()));
    }
    Ok(())
}

/// `ferry load` and `ferry save`: input checked first (`check`), then the work and its summary.
fn load(job: Result<ferry_cli::load::Job, ArgError>) -> Result<(), AnyError> {
    let job = job?;
    let summary = ferry_cli::load::run_load(&job)?;
    if job.io.json {
        out(&format!("{}\n", serde_json::to_string_pretty(&summary)?))
    } else {
        out(&ferry_cli::load::render(&summary))
    }
}

fn replot(json: &std::path::Path, outs: &[PathBuf]) -> Result<(), AnyError> {
    args::check_outputs(outs.iter().map(|p| ("--plot", p.as_path())))?;
    let text = args::read_report(json)?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", json.display()))?;
    let plot = ferry_cli::plot::Plot::from_json(&v)?;
    for p in outs {
        plot.write(p)?;
        out(&format!("wrote {}\n", p.display()))?;
    }
    Ok(())
}
