//! The command line: clap's argument types and the checks that run before any work.
//!
//! [`validate`] turns an argument vector into a [`Plan`] without touching files or measuring
//! anything (the fuzz target and the property tests call it with arbitrary vectors);
//! [`preflight`] then checks what the plan needs of this machine: memory for the largest size
//! of each test ([`memory_needed`]), and that every output path can be written. Both run before
//! the first measurement, so a bad input costs nothing.

use crate::bench::{self, BenchConfig, BenchError, EngineSel, Kind, Method, Needs, TestInfo};
use crate::plot::{Format, PlotError};
use crate::sizes::{format_size, parse_sizes, Sizes};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The most samples (and warm-up calls) per series `--samples` (`--warmup`) accepts: each
/// sample lasts at least a millisecond, so this is ten seconds a series or more (4,294,967,295
/// once asked for 34 GB of sample slots and aborted).
pub const MAX_SAMPLES: i64 = 10_000;
/// The most worker threads `--threads` accepts.
pub const MAX_THREADS: usize = ferry::CpuConfig::THREADS_MAX;

/// `ferry`'s arguments.
#[derive(Debug, Parser)]
#[command(
    name = "ferry",
    version,
    about = "Move bytes between host memory, GPUs and files on DMA engines: inspect and measure"
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// `ferry`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Show CPU cores, CPU engine defaults and the GPU section.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Measure ferry's engines against plain baselines (bandwidth and submit+wait latency).
    #[command(after_long_help = bench::METHOD)]
    Bench(BenchArgs),
    /// Load a file or a safetensors checkpoint into GPU (or host) memory through ferry's file
    /// engine, and report what ran: bytes, seconds, GB/s, the I/O path and why, the page cache.
    Load(crate::load::LoadArgs),
    /// Load a file or checkpoint into --device, then write it from there to DST (the reverse
    /// path: device -> file), and report both.
    Save(crate::load::SaveArgs),
    /// Re-plot a saved `ferry bench --json` file.
    Plot {
        /// The JSON file.
        json: PathBuf,
        /// Output FILE.svg or FILE.png (repeat for both).
        #[arg(long, value_name = "FILE", required = true)]
        plot: Vec<PathBuf>,
    },
}

/// `ferry bench`'s arguments.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// List the tests (with why a test cannot run here) and exit.
    #[arg(long)]
    pub list: bool,
    /// Tests to run, comma separated (default: every test available here). See --list.
    #[arg(long = "test", value_name = "NAMES")]
    pub tests: Option<String>,
    /// Engines whose tests run: cpu, cuda or all.
    #[arg(long, default_value = "all", value_parser = |s: &str| s.parse::<EngineSel>().map_err(|e| e.to_string()))]
    pub engine: EngineSel,
    /// Sizes of bandwidth tests: a doubling range `4K..1G` or a list `4K,1M,256M` (K/M/G = 2^10/2^20/2^30).
    #[arg(long, value_name = "SIZES", allow_hyphen_values = true)]
    pub sizes: Option<Sizes>,
    /// Sizes of latency tests (default 4,64,1K,4K,16K,64K), same syntax as --sizes.
    #[arg(long, value_name = "SIZES", allow_hyphen_values = true)]
    pub latency_sizes: Option<Sizes>,
    /// CPU engine worker threads, 1 to 1024 (default: one per core); the threaded baseline
    /// uses as many.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// Timed samples per series, 1 to 10,000 (median, min and max are reported).
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=MAX_SAMPLES))]
    pub samples: u32,
    /// Untimed warm-up calls per series, at most 10,000.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(..=MAX_SAMPLES))]
    pub warmup: u32,
    /// Write every result as JSON (schema: README, "ferry bench JSON schema").
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Plot bandwidth against size into FILE.svg or FILE.png (repeat for both).
    #[arg(long, value_name = "FILE")]
    pub plot: Vec<PathBuf>,
    /// Write the timeline of the tests that have one (pipeline, cuda-pipeline: one more run
    /// each) as Chrome trace JSON (open in Perfetto or chrome://tracing); with several, FILE
    /// gets the last and FILE.TEST-SIZE.json each.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Draw the last timeline as a Gantt chart into FILE.svg or FILE.png (repeat for both).
    #[arg(long, value_name = "FILE")]
    pub gantt: Vec<PathBuf>,
    /// Print the method (how each figure is measured; also at the end of --help) before the
    /// tables.
    #[arg(long, short)]
    pub verbose: bool,
}

/// `--threads`: 1 to [`MAX_THREADS`], as `ferry load --threads` (1 to 256) also counts: 0 is
/// refused, leaving the option out gives one per core.
fn parse_threads(s: &str) -> Result<usize, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))?;
    match usize::try_from(n) {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!(
            "{n} is not in 1..={MAX_THREADS} (leave --threads out for one per core)"
        )),
    }
}

/// Why the arguments were refused before any work started.
#[derive(Debug, Error)]
pub enum ArgError {
    /// clap refused the arguments (or `--help`/`--version` was asked: see [`clap::Error::exit`]).
    #[error("{0}")]
    Clap(#[from] clap::Error),
    /// A test selection or setting that cannot run.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// A plot or Gantt path with the wrong extension or no name.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// A `FERRY_*` environment variable that does not parse.
    #[error("{0}")]
    Env(String),
    /// A test's largest size needs more memory than the machine has.
    #[error(
        "{test} at {} needs at least {} of {what} memory; {} {}: {hint}",
        format_size(*size),
        format_size(*need),
        format_size(*avail),
        if *what == "host" { "available" } else { "on the device" }
    )]
    Memory {
        /// What to change ("give smaller --sizes", ...).
        hint: &'static str,
        /// Test name.
        test: String,
        /// The size in bytes.
        size: u64,
        /// Bytes it needs.
        need: u64,
        /// "host" or "device".
        what: &'static str,
        /// Bytes available (host: `MemAvailable`; device: the smallest GPU's memory).
        avail: u64,
    },
    /// A file test's largest size does not fit in the temp dir, where its file is written.
    #[error(
        "{test} at {} writes a file of that size in {dir}, which has {} free: give smaller --sizes or set TMPDIR",
        format_size(*size),
        format_size(*avail)
    )]
    Space {
        /// Test name.
        test: String,
        /// The size in bytes.
        size: u64,
        /// The temp dir.
        dir: String,
        /// Bytes free there for this user.
        avail: u64,
    },
    /// An output path that cannot be written.
    #[error("cannot write {path}: {why}")]
    Output {
        /// The path.
        path: String,
        /// Why.
        why: String,
    },
    /// An input file that cannot be read.
    #[error("cannot read {path}: {why}")]
    Input {
        /// The path.
        path: String,
        /// Why.
        why: String,
    },
    /// A `--device` this machine does not have.
    #[error("{0}")]
    Device(String),
}

/// A `ferry bench` run whose arguments passed [`validate`].
#[derive(Debug, Clone)]
pub struct BenchPlan {
    /// Tests to run and their settings.
    pub cfg: BenchConfig,
    /// Tests selected but unavailable here: (name, reason).
    pub skipped: Vec<(String, String)>,
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--plot` files.
    pub plot: Vec<PathBuf>,
    /// `--trace`.
    pub trace: Option<PathBuf>,
    /// `--gantt` files.
    pub gantt: Vec<PathBuf>,
    /// `--verbose`: print the method before the tables.
    pub verbose: bool,
}

impl BenchPlan {
    /// The sizes each test will run at (its own sweep or the `--sizes`/`--latency-sizes` one).
    pub fn sizes_of(&self, t: &TestInfo) -> Vec<u64> {
        let own = match t.kind {
            Kind::Bandwidth => self.cfg.sizes.clone(),
            Kind::Latency => self.cfg.latency_sizes.clone(),
        };
        own.unwrap_or_else(|| parse_sizes(t.default_sizes).unwrap_or_default())
    }
}

/// What the command line asks for, checked.
#[derive(Debug, Clone)]
pub enum Plan {
    /// `ferry info [--json]`.
    Info {
        /// JSON instead of text.
        json: bool,
    },
    /// `ferry bench --list`.
    List,
    /// `ferry bench ...`.
    Bench(Box<BenchPlan>),
    /// `ferry load PATH ...`.
    Load(Box<crate::load::LoadArgs>),
    /// `ferry save SRC DST ...`.
    Save(Box<crate::load::SaveArgs>),
    /// `ferry plot JSON --plot FILE...`.
    Plot {
        /// The saved report.
        json: PathBuf,
        /// The pictures to write.
        outs: Vec<PathBuf>,
    },
}

/// Parses and checks an argument vector (the first item is the program name) without doing
/// any work: no file is opened or written and nothing is measured. Environment variables
/// `FERRY_STAGING_*`/`FERRY_FILE_*` are read and checked, and the CUDA driver is probed to
/// tell which tests can run.
pub fn validate<I, T>(argv: I) -> Result<Plan, ArgError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(argv)?;
    match cli.cmd {
        Cmd::Info { json } => Ok(Plan::Info { json }),
        Cmd::Plot { json, plot } => {
            for p in &plot {
                Format::of(p)?;
            }
            Ok(Plan::Plot { json, outs: plot })
        }
        Cmd::Load(a) => Ok(Plan::Load(Box::new(a))),
        Cmd::Save(a) => Ok(Plan::Save(Box::new(a))),
        Cmd::Bench(a) if a.list => {
            // `--list` lists every test, but a name it was given must still be one (was:
            // `--list --test nope` listed and exited 0).
            bench::select(a.tests.as_deref(), a.engine)?;
            Ok(Plan::List)
        }
        Cmd::Bench(a) => validate_bench(a).map(|p| Plan::Bench(Box::new(p))),
    }
}

fn validate_bench(a: BenchArgs) -> Result<BenchPlan, ArgError> {
    for p in a.plot.iter().chain(&a.gantt) {
        Format::of(p)?;
    }
    // The engines read FERRY_STAGING_* and FERRY_FILE_* where they are made; a value that
    // does not parse stops the run here, before anything is measured.
    ferry::cuda::StagingConfig::from_env().map_err(|e| ArgError::Env(e.to_string()))?;
    ferry::file::FileConfig::from_env().map_err(|e| ArgError::Env(e.to_string()))?;
    let sel = bench::select(a.tests.as_deref(), a.engine)?;
    if sel.run.is_empty() {
        // Why each selected test is out: unavailable here, or not of the `--engine` asked.
        let all = bench::select(a.tests.as_deref(), EngineSel::All)?;
        let chosen = |n: &str| sel.skipped.iter().any(|(s, _)| s == n);
        let other: Vec<&str> = (all.run.iter().map(|t| t.name))
            .chain(all.skipped.iter().map(|(n, _)| n.as_str()))
            .filter(|n| !chosen(n))
            .collect();
        let mut why: Vec<String> = left_out(&sel.skipped).into_iter().collect();
        // Only names given with --test: without it, every test of the other engine is out.
        if a.tests.is_some() && !other.is_empty() {
            let engine = match a.engine {
                EngineSel::Cpu => "cpu",
                EngineSel::Cuda => "cuda",
                EngineSel::All => "all",
            };
            why.push(format!(
                "--engine {engine} leaves out {} (not a {engine} test)",
                other.join(", ")
            ));
        }
        if why.is_empty() {
            why.push("no test selected".to_string());
        }
        return Err(BenchError::NothingToRun(why.join("; ")).into());
    }
    Ok(BenchPlan {
        cfg: BenchConfig {
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
        },
        skipped: sel.skipped,
        json: a.json,
        plot: a.plot,
        trace: a.trace,
        gantt: a.gantt,
        verbose: a.verbose,
    })
}

/// "N GPU test(s) left out: why; why" (None when none was).
pub fn left_out(skipped: &[(String, String)]) -> Option<String> {
    if skipped.is_empty() {
        return None;
    }
    let mut reasons: Vec<&str> = skipped.iter().map(|(_, r)| r.as_str()).collect();
    reasons.dedup();
    Some(format!(
        "{} GPU test(s) left out: {}",
        skipped.len(),
        reasons.join("; ")
    ))
}

/// Memory a test needs at one size, at least: (host bytes, device bytes); None where the
/// figure overflows 64 bits. An estimate from the buffers each test allocates (source,
/// destination and reference), so a run refused by [`check_memory`] could not have fit.
pub fn memory_needed(t: &TestInfo, size: u64) -> Option<(u64, u64)> {
    // The scattered-segment tests: `size` is one segment of 100,000 (at most 1 GiB in all).
    let payload = if matches!(
        t.name,
        "cuda-scatter" | "cuda-scatter-pageable" | "cuda-gather-pageable"
    ) {
        let count = (100_000u64).min((1u64 << 30) / size.max(1)).max(1);
        size.checked_mul(count)?
    } else {
        size
    };
    if t.name == "pipeline" {
        // The CPU pipeline row: source, destination and the sequential loop's destination
        // (3x), the pipeline's 3 input and 3 output slots and the loop's 2 chunk buffers (8
        // chunks of 1/16): 3.5x (measured: 3.55x at 256 MiB; 2x before, which let through
        // sizes that could not fit).
        return Some((payload.checked_mul(7)? / 2, 0));
    }
    let (host, device) = match (t.name, t.needs) {
        ("cpu-tile", _) => (3, 0),
        // The file's bytes, the pinned bounce, the poison pattern and the read-back copy.
        ("cuda-file-read" | "cuda-file-read-direct" | "cuda-file-read-cufile", _) => (4, 1),
        ("cuda-tile", _) => (3, 1),
        // Source, reference, pinned staging, and (device -> host) the destination.
        ("cuda-scatter-pageable" | "cuda-gather-pageable", _) => (4, 1),
        (_, Needs::Cpu) => (2, 0),
        (_, Needs::Cuda | Needs::Cuda2 | Needs::Nccl2) if t.kind == Kind::Latency => (2, 1),
        (
            "cuda-d2d"
            | "cuda-transpose"
            | "cuda-transpose-bf16"
            | "cuda-transpose-batched"
            | "cuda-d2d-split",
            _,
        ) => (1, 2),
        _ => (2, 1),
    };
    Some((payload.checked_mul(host)?, payload.checked_mul(device)?))
}

/// Refuses a plan whose largest size of some test needs more memory than `host_avail` (host,
/// e.g. `MemAvailable`) or `device_total` (the smallest GPU's memory); None: not known, not
/// checked.
pub fn check_memory(
    plan: &BenchPlan,
    host_avail: Option<u64>,
    device_total: Option<u64>,
) -> Result<(), ArgError> {
    for t in &plan.cfg.tests {
        for size in plan.sizes_of(t) {
            let (host, device) = memory_needed(t, size).unwrap_or((u64::MAX, u64::MAX));
            let refuse = |need: u64, what, avail: u64| ArgError::Memory {
                hint: if t.kind == Kind::Latency {
                    "give smaller --latency-sizes"
                } else {
                    "give smaller --sizes"
                },
                test: t.name.to_string(),
                size,
                need,
                what,
                avail,
            };
            if let Some(avail) = host_avail.filter(|&a| host > a) {
                return Err(refuse(host, "host", avail));
            }
            if t.needs.is_gpu() {
                if let Some(total) = device_total.filter(|&a| device > a) {
                    return Err(refuse(device, "device", total));
                }
            }
        }
    }
    Ok(())
}

/// Refuses a plan whose file tests write a file larger than `free` bytes (the temp dir's free
/// space; None: not known, not checked).
pub fn check_temp_space(plan: &BenchPlan, dir: &Path, free: Option<u64>) -> Result<(), ArgError> {
    let Some(free) = free else { return Ok(()) };
    for t in plan
        .cfg
        .tests
        .iter()
        .filter(|t| crate::bench::file::owns(t.name))
    {
        if let Some(size) = plan.sizes_of(t).into_iter().find(|&s| s > free) {
            return Err(ArgError::Space {
                test: t.name.to_string(),
                size,
                dir: dir.display().to_string(),
                avail: free,
            });
        }
    }
    Ok(())
}

/// Bytes free for this user in the filesystem holding `dir` (`statvfs`), None where unknown.
pub fn free_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path; `st` is a valid out-pointer, read only
    // after the call succeeded.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut st) == 0).then_some(st)
    }?;
    (st.f_bavail as u64).checked_mul(st.f_frsize as u64)
}

/// `MemAvailable` of `/proc/meminfo` in bytes (None where it cannot be read).
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The smallest GPU's memory in bytes (None without a GPU or where the driver does not say).
pub fn device_memory() -> Option<u64> {
    let p = ferry::cuda::probe();
    p.devices
        .iter()
        .filter_map(|d| d.total_mem)
        .min()
        .map(|m| m as u64)
}

/// Checks that `path` can be written, leaving it as it was, without blocking: an existing
/// file is opened for writing (never truncated, and with `O_NONBLOCK`: a FIFO with no reader is
/// refused, where a plain open would wait for one forever; a FIFO with a reader is kept open,
/// see below); for a new one, a nameless file is made and dropped in its folder. A path ending
/// in `/` names a folder and is refused. A test write is made: zero bytes into an existing
/// file or device (`/dev/full` fails it), one byte into the nameless new file (a full disk
/// fails it). What only the run can show (a disk that fills during it) is found when the
/// output is written.
pub fn check_writable(path: &Path) -> Result<(), ArgError> {
    writable(path).map_err(|why| ArgError::Output {
        path: path.display().to_string(),
        why,
    })
}

/// Write ends of the FIFOs and pipes [`writable`] found a reader on (`--json >(gzip > r.gz)`,
/// `--json /dev/stdout | jq`, a named FIFO), held open until the process exits: closing the
/// check's descriptor could leave the FIFO without a writer, which ends the reader's input
/// (EOF) before the output is written; the output's own open would then wait for a new reader
/// forever.
static HELD_FIFOS: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

/// [`check_writable`]'s test, with why not in words.
pub(crate) fn writable(path: &Path) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let slash = path.as_os_str().as_encoded_bytes().ends_with(b"/");
    // Stat first: what kind of thing the path names decides how it may be opened.
    let meta = match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => return Err("it is a directory".into()),
        _ if slash => return Err("it ends in `/`, which names a folder, not a file".into()),
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.to_string()),
    };
    if let Some(m) = meta {
        let kind = m.file_type();
        if kind.is_socket() {
            return Err("it is a socket, not a file".into());
        }
        // O_NONBLOCK: a FIFO without a reader fails with ENXIO instead of waiting for one
        // (and a device such as a serial line does not wait for its carrier).
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENXIO) if kind.is_fifo() => {
                    "a FIFO with no reader (writing would wait for one)".to_string()
                }
                _ => e.to_string(),
            })?;
        // The test write: zero bytes, which leaves a file as it was but still reaches the
        // device's driver, so `/dev/full` is refused here, before any work.
        (&file)
            .write(&[])
            .map_err(|e| format!("a test write failed: {e}"))?;
        if kind.is_fifo() {
            HELD_FIFOS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(file);
        }
        return Ok(());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!("folder {} does not exist", dir.display()));
    }
    let mut probe = tempfile::tempfile_in(dir)
        .map_err(|e| format!("cannot create files in {}: {e}", dir.display()))?;
    // The test write: one byte into the nameless file, so a full disk is found now.
    probe
        .write_all(b"\n")
        .map_err(|e| format!("a test write in {} failed: {e}", dir.display()))
}

/// A file's (device, inode): the same for every spelling and link of one file.
pub(crate) fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// What an output path names, for telling two spellings of one file apart.
#[derive(Debug, PartialEq)]
enum Identity {
    /// An existing regular file: device and inode (symbolic and hard links included).
    File(u64, u64),
    /// A file still to be made: its folder's canonical path joined with its name.
    New(PathBuf),
}

/// `path`'s [`Identity`]; None for an existing device or FIFO (`/dev/stdout`, `/dev/null`),
/// which may take several outputs one after the other.
fn output_identity(path: &Path) -> Option<Identity> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {
            let (dev, ino) = file_id(&m);
            Some(Identity::File(dev, ino))
        }
        Ok(_) => None,
        Err(_) => {
            let name = path.file_name()?;
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            Some(Identity::New(dir.join(name)))
        }
    }
}

/// Checks a run's output files, each given with its option (`--json`, ...): every one
/// writable ([`check_writable`]) and no file given for two outputs (`--json r.json --trace
/// ./r.json`: the second overwrote the first), compared after resolving links and `.`/`..`.
pub fn check_outputs<'a>(
    outs: impl IntoIterator<Item = (&'a str, &'a Path)>,
) -> Result<(), ArgError> {
    let mut seen: Vec<(&str, Identity)> = Vec::new();
    for (flag, p) in outs {
        check_writable(p)?;
        let Some(id) = output_identity(p) else {
            continue;
        };
        if let Some((first, _)) = seen.iter().find(|(_, s)| *s == id) {
            let why = if *first == flag {
                format!("given twice for {flag}: each output needs its own file")
            } else {
                format!("given for both {first} and {flag}: each output needs its own file")
            };
            return Err(ArgError::Output {
                path: p.display().to_string(),
                why,
            });
        }
        seen.push((flag, id));
    }
    Ok(())
}

/// The file `--trace FILE` gets for the timeline of `run` (`pipeline 1M`) when a run keeps
/// several: `FILE.pipeline-1M.json` beside FILE.
pub fn trace_file(trace: &Path, run: &str) -> PathBuf {
    trace.with_extension(format!("{}.json", run.replace(' ', "-")))
}

/// The per-run files `--trace` writes beside its own ([`trace_file`]): one per size of each
/// test with a timeline, where there are several.
pub fn trace_files(plan: &BenchPlan) -> Vec<PathBuf> {
    let Some(trace) = &plan.trace else {
        return vec![];
    };
    let runs: Vec<String> = (plan.cfg.tests.iter())
        .filter(|t| bench::pipeline::owns(t.name))
        .flat_map(|t| {
            (plan.sizes_of(t).into_iter()).map(move |s| format!("{} {}", t.name, format_size(s)))
        })
        .collect();
    if runs.len() < 2 {
        return vec![];
    }
    runs.iter().map(|r| trace_file(trace, r)).collect()
}

/// Checks what a bench plan needs of this machine before it starts: memory for every test's
/// largest size, room in the temp dir, and every output path ([`check_outputs`], the
/// per-run trace files included).
pub fn preflight(plan: &BenchPlan) -> Result<(), ArgError> {
    let gpu = plan.cfg.tests.iter().any(|t| t.needs.is_gpu());
    check_memory(
        plan,
        mem_available(),
        if gpu { device_memory() } else { None },
    )?;
    let tmp = std::env::temp_dir();
    check_temp_space(plan, &tmp, free_space(&tmp))?;
    let runs = trace_files(plan);
    let outs: [(&str, &[PathBuf]); 5] = [
        ("--json", plan.json.as_slice()),
        ("--plot", &plan.plot),
        ("--trace", plan.trace.as_slice()),
        ("--trace (one file per run)", &runs),
        ("--gantt", &plan.gantt),
    ];
    check_outputs(
        outs.iter()
            .flat_map(|&(flag, ps)| ps.iter().map(move |p| (flag, p.as_path()))),
    )
}

/// The largest saved report `ferry plot` reads.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// Reads a saved report for `ferry plot`: a regular file of at most [`MAX_JSON_BYTES`].
pub fn read_report(path: &Path) -> Result<String, ArgError> {
    use std::io::Read;
    let bad = |why: String| ArgError::Input {
        path: path.display().to_string(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if meta.len() > MAX_JSON_BYTES {
        return Err(bad(format!(
            "{} is larger than a saved report can be ({})",
            format_size(meta.len()),
            format_size(MAX_JSON_BYTES)
        )));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_JSON_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| bad(e.to_string()))?;
    Ok(text)
}
