//! `ferry`: the command-line tool. `ferry info` shows what ferry finds on this machine;
//! `ferry bench` measures ferry's engines next to plain baselines.

use clap::{Parser, Subcommand};
use ferry_cli::bench::{self, BenchConfig, EngineSel, Method};
use ferry_cli::sizes::Sizes;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "ferry",
    version,
    about = "Move bytes between host memory, GPUs and files on DMA engines: inspect and measure"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show CPU cores, CPU engine defaults and the GPU section.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Measure ferry's engines against plain baselines (bandwidth and submit+wait latency).
    #[command(after_long_help = bench::METHOD)]
    Bench(BenchArgs),
    /// Re-plot a saved `ferry bench --json` file.
    Plot {
        /// The JSON file.
        json: PathBuf,
        /// Output FILE.svg or FILE.png (repeat for both).
        #[arg(long, value_name = "FILE", required = true)]
        plot: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
struct BenchArgs {
    /// List the tests (with why a test cannot run here) and exit.
    #[arg(long)]
    list: bool,
    /// Tests to run, comma separated (default: every test available here). See --list.
    #[arg(long = "test", value_name = "NAMES")]
    tests: Option<String>,
    /// Engines whose tests run: cpu, cuda or all.
    #[arg(long, default_value = "all", value_parser = |s: &str| s.parse::<EngineSel>().map_err(|e| e.to_string()))]
    engine: EngineSel,
    /// Sizes of bandwidth tests: a doubling range `4K..1G` or a list `4K,1M,256M` (K/M/G = 2^10/2^20/2^30).
    #[arg(long, value_name = "SIZES")]
    sizes: Option<Sizes>,
    /// Sizes of latency tests (default 4,64,1K,4K,16K,64K), same syntax as --sizes.
    #[arg(long, value_name = "SIZES")]
    latency_sizes: Option<Sizes>,
    /// CPU engine worker threads (default: one per core); the threaded baseline uses as many.
    #[arg(long)]
    threads: Option<usize>,
    /// Timed samples per series (median, min and max are reported).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    samples: u32,
    /// Untimed warm-up calls per series.
    #[arg(long, default_value_t = 3)]
    warmup: u32,
    /// Write every result as JSON (schema: README, "ferry bench JSON schema").
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Plot bandwidth against size into FILE.svg or FILE.png (repeat for both).
    #[arg(long, value_name = "FILE")]
    plot: Vec<PathBuf>,
    /// Write the timeline of the tests that have one (pipeline, cuda-pipeline: one more run
    /// each) as Chrome trace JSON (open in Perfetto or chrome://tracing); with several, FILE
    /// gets the last and FILE.<test>-<size>.json each.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Draw the last timeline as a Gantt chart into FILE.svg or FILE.png (repeat for both).
    #[arg(long, value_name = "FILE")]
    gantt: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Info { json } => info(json),
        Cmd::Bench(args) => run_bench(args),
        Cmd::Plot { json, plot } => replot(&json, &plot),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry: error: {e}");
            ExitCode::FAILURE
        }
    }
}

type AnyError = Box<dyn std::error::Error>;

fn info(json: bool) -> Result<(), AnyError> {
    let info = ferry_cli::info::gather();
    if json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print!("{}", ferry_cli::info::render(&info));
    }
    Ok(())
}

fn list() {
    let reg = bench::registry();
    let w = reg.iter().map(|t| t.name.len()).max().unwrap_or(0);
    for t in reg {
        let status = match bench::availability(t.needs) {
            Ok(()) => "available".to_string(),
            Err(why) => format!("unavailable: {why}"),
        };
        println!(
            "{:<w$}  {:<9}  {:<4}  sizes {:<18}  {}\n{:<w$}  {}",
            t.name,
            format!("{:?}", t.kind).to_lowercase(),
            format!("{:?}", t.needs).to_lowercase(),
            t.default_sizes,
            t.description,
            "",
            status
        );
    }
}

fn run_bench(a: BenchArgs) -> Result<(), AnyError> {
    if a.list {
        list();
        return Ok(());
    }
    for p in &a.plot {
        let ext = p
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        if !matches!(ext.as_deref(), Some("svg" | "png")) {
            return Err(ferry_cli::plot::PlotError::Format(p.display().to_string()).into());
        }
    }
    // The engines read FERRY_STAGING_* and FERRY_FILE_* where they are made; a value that
    // does not parse stops the run here, before anything is measured.
    ferry::cuda::staged::StagingConfig::from_env()?;
    ferry::file::FileConfig::from_env()?;
    let sel = bench::select(a.tests.as_deref(), a.engine)?;
    if !sel.skipped.is_empty() {
        let mut reasons: Vec<&str> = sel.skipped.iter().map(|(_, r)| r.as_str()).collect();
        reasons.dedup();
        eprintln!(
            "ferry bench: {} GPU test(s) left out: {}",
            sel.skipped.len(),
            reasons.join("; ")
        );
    }
    if sel.run.is_empty() {
        let why = sel
            .skipped
            .first()
            .map_or("no test selected".to_string(), |(_, r)| r.clone());
        return Err(bench::BenchError::NothingToRun(why).into());
    }
    bench::pipeline::set_trace(a.trace.is_some() || !a.gantt.is_empty());
    let cfg = BenchConfig {
        tests: sel.run,
        sizes: a.sizes.map(|s| s.0),
        latency_sizes: a.latency_sizes.map(|s| s.0),
        threads: a
            .threads
            .unwrap_or_else(|| ferry::CpuConfig::default().threads),
        method: Method {
            warmup: a.warmup as usize,
            samples: a.samples as usize,
            ..Method::default()
        },
    };
    // Progress on stderr, only on a terminal, and only once the run has lasted 1 s.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let tty = std::io::stderr().is_terminal();
    let t0 = Instant::now();
    let mut shown = false;
    let rep = bench::run(&cfg, &sel.skipped, |done, total, what| {
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
    print!("{}", ferry_cli::report::render(&rep));
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&rep)?)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    for p in &a.plot {
        ferry_cli::plot::write(&rep, p)?;
        eprintln!("wrote {}", p.display());
    }
    write_traces(a.trace.as_deref(), &a.gantt)
}

/// `--trace` and `--gantt`: the timelines the pipeline tests kept.
fn write_traces(trace: Option<&std::path::Path>, gantt: &[PathBuf]) -> Result<(), AnyError> {
    let traces = bench::pipeline::take_traces();
    let Some((last_name, last)) = traces.last() else {
        if trace.is_some() || !gantt.is_empty() {
            eprintln!("ferry bench: no test with a timeline ran (pipeline, cuda-pipeline)");
        }
        return Ok(());
    };
    if let Some(path) = trace {
        let write = |p: &std::path::Path, name: &str, t: &ferry::pipeline::Timeline| {
            std::fs::write(p, t.to_chrome_trace(name))
                .map_err(|e| format!("cannot write {}: {e}", p.display()))
        };
        write(path, last_name, last)?;
        eprintln!("wrote {}", path.display());
        if traces.len() > 1 {
            for (name, t) in &traces {
                let p = path.with_extension(format!("{}.json", name.replace(' ', "-")));
                write(&p, name, t)?;
                eprintln!("wrote {}", p.display());
            }
        }
    }
    for p in gantt {
        ferry_cli::gantt::write(last, last_name, p)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn replot(json: &std::path::Path, outs: &[PathBuf]) -> Result<(), AnyError> {
    let text = std::fs::read_to_string(json)
        .map_err(|e| format!("cannot read {}: {e}", json.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", json.display()))?;
    let rows = ferry_cli::plot::rows_from_json(&v)?;
    for p in outs {
        ferry_cli::plot::write_rows(&rows, p)?;
        println!("wrote {}", p.display());
    }
    Ok(())
}
