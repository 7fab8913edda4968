//! `ferry load` and `ferry save`: a file or a safetensors checkpoint into GPU (or host) memory,
//! and back out to a file, through ferry's file engine, with a summary of what ran and why.
//!
//! [`check`] refuses bad input before any work (no such file, not a regular file, a range
//! past the end, a device that is not there, more memory than the machine has, an output that
//! cannot be written); [`run_load`] does the work (for `ferry save`, the load and then the write).

use crate::args::{check_writable, device_memory, file_id, mem_available, ArgError};
use crate::sizes::{format_size, parse_size, SizeError};
use ferry::checkpoint::{
    self, Checkpoint, LoadOptions, LoadReport, Placement, SaveOptions, SaveTensor, Target,
    TensorBuffer, Writer,
};
use ferry::cuda::CudaEngine;
use ferry::file::{CuFileMode, FileConfig, FileEngine, IoReport, OpenMode, ReadPiece, Replacement};
use ferry::memory::{MemKind, Memory};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Where `--device` puts the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// `cuda:N`: GPU N's memory. The GPU is named here once: the file engine is given GPU N's
    /// CUDA engine, and a checkpoint load [`Target::Device`], that engine's GPU.
    Cuda(u32),
    /// `pinned`: page-locked host memory.
    Pinned,
    /// `host` (also `pageable`, `cpu`): pageable host memory.
    Pageable,
}

impl Device {
    /// The checkpoint load's target.
    pub fn target(self) -> Target {
        match self {
            Device::Cuda(_) => Target::Device,
            Device::Pinned => Target::Pinned,
            Device::Pageable => Target::Pageable,
        }
    }
    /// The memory a plain file's bytes are loaded to.
    pub fn kind(self) -> MemKind {
        match self {
            Device::Cuda(ordinal) => MemKind::Device { ordinal },
            Device::Pinned => MemKind::Pinned,
            Device::Pageable => MemKind::Pageable,
        }
    }
}

impl std::fmt::Display for Device {
    /// `cuda:0`, `pinned`, `pageable`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cuda(o) => write!(f, "cuda:{o}"),
            Device::Pinned => f.write_str("pinned"),
            Device::Pageable => f.write_str("pageable"),
        }
    }
}

/// Where `--device` puts the bytes: `cuda:N` (`cuda` alone is `cuda:0`, as PyTorch reads it),
/// `host` (pageable) or `pinned`.
pub fn parse_device(s: &str) -> Result<Device, String> {
    match s {
        "host" | "pageable" | "cpu" => Ok(Device::Pageable),
        "pinned" => Ok(Device::Pinned),
        "cuda" => Ok(Device::Cuda(0)),
        _ => {
            let n = s
                .strip_prefix("cuda:")
                .ok_or_else(|| format!("`{s}` is not cuda, cuda:N, host or pinned"))?;
            n.parse::<u32>()
                .map(Device::Cuda)
                .map_err(|_| format!("`{s}`: the GPU ordinal `{n}` is not a number"))
        }
    }
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// `--select`: a comma-separated list with at least one name (`''` or `,` selected nothing and
/// loaded nothing, successfully).
fn parse_select(s: &str) -> Result<String, String> {
    if select_names(s).next().is_none() {
        return Err("names no tensor: give at least one name".into());
    }
    Ok(s.to_string())
}

/// The tensor names of a `--select` list: comma separated, blanks around them and empty ones
/// dropped.
fn select_names(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|n| !n.is_empty())
}

/// `--offset`: a size, or 0 (the file's start) however written (`0`, `00`, `0K`, `0B`: the
/// sizes' own parser refuses a zero as "at least 1 byte").
fn parse_offset(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Err(SizeError::Zero(_)) => Ok(0),
        r => r.map_err(|e| e.to_string()),
    }
}

/// Options `ferry load` and `ferry save` share.
#[derive(Debug, Clone, clap::Args)]
pub struct IoArgs {
    /// Where the bytes go: cuda:N (cuda: GPU 0), host (pageable) or pinned.
    #[arg(long, default_value = "cuda:0", value_parser = parse_device)]
    pub device: Device,
    /// Treat a .safetensors file as plain bytes.
    #[arg(long)]
    pub raw: bool,
    /// Only these tensors of a checkpoint, comma separated (at least one name).
    #[arg(long, value_name = "NAMES", value_parser = parse_select)]
    pub select: Option<String>,
    /// One allocation per tensor (default: one for the whole checkpoint).
    #[arg(long)]
    pub per_tensor: bool,
    /// Read with O_DIRECT where the filesystem and alignment allow.
    #[arg(long)]
    pub direct: bool,
    /// GPUDirect Storage for device memory: auto (where nvidia-fs makes it real), on (cuFile
    /// wherever it opens, its compatibility mode included) or off (default: FERRY_CUFILE, else
    /// auto).
    #[arg(long, value_name = "auto|on|off")]
    pub cufile: Option<CuFileMode>,
    /// File engine worker threads (default: FERRY_FILE_THREADS, else one per core up to 16).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `ferry load`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// The file: a safetensors checkpoint (.safetensors, or a sharded one's
    /// .safetensors.index.json) or any file (its bytes).
    pub path: PathBuf,
    /// First byte of a plain file to load (K/M/G suffixes; default 0).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_offset)]
    pub offset: Option<u64>,
    /// Bytes of a plain file to load (default: to its end).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_bytes)]
    pub length: Option<u64>,
    /// Read the bytes back and compare them with a plain read of the file.
    #[arg(long)]
    pub verify: bool,
    /// Shared options.
    #[command(flatten)]
    pub io: IoArgs,
}

/// `ferry save`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct SaveArgs {
    /// The file or checkpoint to load first (into --device).
    pub src: PathBuf,
    /// Where to write it from there: a checkpoint is written as one safetensors file, or as
    /// a sharded one when DST is a folder (its model.safetensors.index.json and shards) or
    /// ends in .safetensors.index.json.
    pub dst: PathBuf,
    /// fsync the file before reporting.
    #[arg(long)]
    pub fsync: bool,
    /// A sharded save's largest shard (K/M/G suffixes; default 5G, as Hugging Face cuts them).
    #[arg(long, value_name = "BYTES", value_parser = parse_size_arg)]
    pub shard_size: Option<u64>,
    /// How a checkpoint's bytes go into the file: `buffered` (parallel pwrites through the
    /// page cache), `direct` (O_DIRECT from aligned windows, the file preallocated; buffered,
    /// with the reason, where the file system refuses it), `hybrid` (both at once: direct from
    /// the end beside buffered writes from the start into the page cache's room before
    /// writeback, each at its own rate) or `auto` (buffered under 64 MiB; direct when fsynced
    /// or from host memory; else, from a GPU, hybrid). The report names the writer used and
    /// why.
    /// Plain files are written buffered.
    #[arg(long, value_name = "WRITER", value_enum, default_value_t = WriterArg::Auto)]
    pub writer: WriterArg,
    /// Save a checkpoint as an asynchronous snapshot does: copied out of the loaded memory
    /// into at most SIZE of host memory (K/M/G suffixes), streamed through two windows of
    /// half of it (one copied while the other is written) when the checkpoint is larger; the
    /// report gives the wait for the copies and the most memory held.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub snapshot_bytes: Option<u64>,
    /// Shared options.
    #[command(flatten)]
    pub io: IoArgs,
}

/// `ferry save --writer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WriterArg {
    /// Chosen per save.
    Auto,
    /// Through the page cache.
    Buffered,
    /// `O_DIRECT`.
    Direct,
    /// `O_DIRECT` beside buffered writes into the page cache's room.
    Hybrid,
}

impl WriterArg {
    /// As [`SaveOptions::writer`] takes it.
    pub fn writer(self) -> Writer {
        match self {
            WriterArg::Auto => Writer::Auto,
            WriterArg::Buffered => Writer::Buffered,
            WriterArg::Direct => Writer::Direct,
            WriterArg::Hybrid => Writer::Hybrid,
        }
    }
}

/// A load or save whose input passed [`check`].
#[derive(Debug, Clone)]
pub struct Job {
    /// The input.
    pub path: PathBuf,
    /// Safetensors (true) or plain bytes.
    pub checkpoint: bool,
    /// Plain files: the byte range.
    pub offset: u64,
    /// Plain files: bytes.
    pub length: u64,
    /// `--verify`.
    pub verify: bool,
    /// `ferry save`: where and how.
    pub save: Option<SaveTo>,
    /// Shared options.
    pub io: IoArgs,
}

/// Where and how `ferry save` writes.
#[derive(Debug, Clone)]
pub struct SaveTo {
    /// The output: a file, or a sharded checkpoint's index (a folder given is resolved to its
    /// `model.safetensors.index.json`).
    pub dst: PathBuf,
    /// `--fsync`.
    pub fsync: bool,
    /// A sharded save (`dst` is an index), with `--shard-size`.
    pub sharded: Option<u64>,
    /// `--writer`: [`SaveOptions::writer`].
    pub writer: Writer,
    /// `--snapshot-bytes`: save through a bounded snapshot.
    pub snapshot_bytes: Option<u64>,
}

impl SaveTo {
    /// `ferry save`'s arguments: a folder as DST is a sharded save into it.
    pub fn new(dst: PathBuf, fsync: bool, shard_size: Option<u64>) -> SaveTo {
        let (dst, sharded) = if dst.is_dir() {
            (dst.join("model.safetensors.index.json"), true)
        } else {
            let index = dst.to_string_lossy().ends_with(".safetensors.index.json");
            (dst, index)
        };
        SaveTo {
            dst,
            fsync,
            sharded: sharded.then(|| shard_size.unwrap_or(5_000_000_000)),
            writer: Writer::Auto,
            snapshot_bytes: None,
        }
    }

    /// With `--writer` and `--snapshot-bytes`.
    pub fn with(mut self, writer: Writer, snapshot_bytes: Option<u64>) -> SaveTo {
        self.writer = writer;
        self.snapshot_bytes = snapshot_bytes;
        self
    }
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// The file `ferry load` reads for `path`: a checkpoint's folder resolved as the library
/// resolves it ([`checkpoint::resolve`]: its index, else its safetensors file); any other
/// path as it is.
pub fn resolve_input(path: &Path) -> Result<PathBuf, ArgError> {
    checkpoint::resolve(path).map_err(|e| ArgError::Input {
        path: path.display().to_string(),
        why: match e {
            checkpoint::CheckpointError::Index { msg, .. } => msg,
            other => other.to_string(),
        },
    })
}

fn is_checkpoint(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json")
}

/// Whether a file whose size says 0 yields a byte when read (a file of `/proc`); false when
/// it cannot be opened or read (the load then reports its own error).
fn has_bytes(path: &Path) -> bool {
    let mut b = [0u8; 1];
    std::fs::File::open(path)
        .is_ok_and(|mut f| std::io::Read::read(&mut f, &mut b).is_ok_and(|n| n > 0))
}

/// Checks a load (`save`: the output too) against this machine before any work.
pub fn check(
    path: &Path,
    offset: Option<u64>,
    length: Option<u64>,
    verify: bool,
    save: Option<SaveTo>,
    io: IoArgs,
) -> Result<Job, ArgError> {
    let path = &resolve_input(path)?;
    let bad = |why: String| ArgError::Input {
        path: path.display().to_string(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    if !(ft.is_file() || ft.is_block_device()) {
        return Err(bad(
            "not a regular file (a FIFO or device cannot be loaded)".into(),
        ));
    }
    if ft.is_file() && meta.len() == 0 && has_bytes(path) {
        // /proc's files say 0 bytes and hold more: a load of 0 bytes would succeed (and
        // --verify agree) while the file's content was never read.
        return Err(bad(
            "the file says it holds 0 bytes but has content (as /proc's files do): its size \
             cannot be known before it is read; copy it to a regular file first"
                .into(),
        ));
    }
    let checkpoint = is_checkpoint(path) && !io.raw;
    if checkpoint && (offset.is_some() || length.is_some()) {
        return Err(bad(
            "--offset and --length apply to plain files: add --raw to load a checkpoint's bytes"
                .into(),
        ));
    }
    if !checkpoint && (io.select.is_some() || io.per_tensor) {
        return Err(bad(
            "--select and --per-tensor apply to safetensors checkpoints".into(),
        ));
    }
    let file_len = if ft.is_block_device() {
        std::fs::File::open(path)
            .and_then(|mut f| std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)))
            .map_err(|e| bad(e.to_string()))?
    } else {
        meta.len()
    };
    let offset = offset.unwrap_or(0);
    if offset > file_len {
        return Err(bad(format!(
            "--offset {offset} is past the end of the file ({file_len} bytes)"
        )));
    }
    // At the end: nothing left to load, refused as a zero --length is (an empty file from its
    // start, `--offset 0`, is the whole file and loads).
    if offset == file_len && offset > 0 {
        return Err(bad(format!(
            "--offset {offset} is the end of the file ({file_len} bytes): nothing is left to load"
        )));
    }
    let length = length.unwrap_or(file_len - offset);
    if offset.checked_add(length).is_none_or(|e| e > file_len) {
        return Err(bad(format!(
            "--offset {offset} + --length {length} runs past the end of the file ({file_len} bytes)"
        )));
    }
    // Host memory: the bytes where they go, and with --verify the plain read to compare
    // against (and, for a device, the bytes copied back).
    // A checkpoint: the tensors loaded, only those of --select (a header that cannot be read
    // needs nothing: the load stops on it, before any allocation, and says why).
    let need = if checkpoint {
        checkpoint_bytes(path, io.select.as_deref()).unwrap_or(0)
    } else {
        length
    };
    let host_need = match (io.device, verify) {
        (Device::Cuda(_), false) => 0,
        (_, true) => need.saturating_mul(2),
        (_, false) => need,
    };
    if let Some(avail) = mem_available().filter(|&a| host_need > a) {
        // Only what works here: a GPU is named only where one is found, and only the flag
        // that applies to this input.
        let gpu = !ferry::cuda::probe().devices.is_empty();
        return Err(ArgError::Memory {
            hint: match (checkpoint, gpu) {
                (true, true) => "load less (--select) or into --device cuda:N",
                (true, false) => "load less (--select)",
                (false, true) => "load less (--length) or into --device cuda:N",
                (false, false) => "load less (--length)",
            },
            test: format!("loading {}", path.display()),
            size: need,
            need: host_need,
            what: "host",
            avail,
        });
    }
    match io.device {
        Device::Cuda(n) => {
            let p = ferry::cuda::probe();
            if let Err(why) = &p.driver {
                return Err(ArgError::Device(format!(
                    "--device cuda:{n}: {why} (use --device host; pinned memory needs the \
                     driver too)"
                )));
            }
            if p.devices.is_empty() {
                return Err(ArgError::Device(format!(
                    "--device cuda:{n}: the CUDA driver finds no GPU on this machine (use \
                     --device host)"
                )));
            }
            if n as usize >= p.devices.len() {
                return Err(ArgError::Device(format!(
                    "--device cuda:{n}: this machine has {} GPU(s): cuda:0 to cuda:{}",
                    p.devices.len(),
                    p.devices.len() - 1
                )));
            }
            if let Some(total) = device_memory().filter(|&t| need > t) {
                return Err(ArgError::Memory {
                    hint: "load less (--select, --length) or into --device host",
                    test: format!("loading {}", path.display()),
                    size: need,
                    need,
                    what: "device",
                    avail: total,
                });
            }
        }
        Device::Pinned => {
            if let Err(why) = ferry::cuda::probe().driver {
                return Err(ArgError::Device(format!(
                    "--device pinned needs a CUDA driver: {why} (use --device host)"
                )));
            }
            if ferry::cuda::probe().devices.is_empty() {
                return Err(ArgError::Device(
                    "--device pinned needs a GPU: the CUDA driver finds none on this machine \
                     (use --device host)"
                        .into(),
                ));
            }
        }
        Device::Pageable => {}
    }
    if let Some(to) = &save {
        if to.sharded.is_some() && !checkpoint {
            return Err(ArgError::Output {
                path: to.dst.display().to_string(),
                why: "a sharded save writes a safetensors checkpoint: the input is plain bytes"
                    .into(),
            });
        }
        check_output(&to.dst, path, checkpoint)?;
    }
    Ok(Job {
        path: path.to_path_buf(),
        checkpoint,
        offset,
        length,
        verify,
        save,
        io,
    })
}

/// Bytes of tensor data a load of the checkpoint at `path` moves: the tensors `select` names
/// (every tensor without it), from the headers alone. None where they cannot be read.
fn checkpoint_bytes(path: &Path, select: Option<&str>) -> Option<u64> {
    let fe = FileEngine::new(FileConfig::new().threads(1)).ok()?;
    let names: Option<std::collections::HashSet<&str>> = select.map(|s| select_names(s).collect());
    let entries = checkpoint::entries(&fe, path).ok()?;
    Some(
        entries
            .iter()
            .filter(|(_, t)| names.as_ref().is_none_or(|n| n.contains(t.name.as_str())))
            .map(|(_, t)| t.len())
            .sum(),
    )
}

/// Checks `ferry save`'s output `dst` before any work: a new file in a folder that can be
/// written, or an existing regular file that is not the input (`path`, or one of its shards),
/// whose bytes are replaced whole once the new ones are written ([`Replacement`]).
fn check_output(dst: &Path, path: &Path, checkpoint: bool) -> Result<(), ArgError> {
    let refused = |why: String| ArgError::Output {
        path: dst.display().to_string(),
        why,
    };
    if let Ok(out) = std::fs::metadata(dst) {
        if !out.is_file() {
            return Err(refused(
                "not a regular file: ferry save writes regular files (a device, FIFO or folder is never replaced)"
                    .into(),
            ));
        }
        let inputs = if checkpoint {
            let mut v = shard_paths(path);
            v.push(path.to_path_buf());
            v
        } else {
            vec![path.to_path_buf()]
        };
        let same = |p: &PathBuf| std::fs::metadata(p).is_ok_and(|m| file_id(&m) == file_id(&out));
        if let Some(input) = inputs.iter().find(|p| same(p)) {
            return Err(refused(format!(
                "the output is the input ({}): save to another file",
                input.display()
            )));
        }
    }
    check_writable(dst)
}

type AnyError = Box<dyn std::error::Error>;

/// The file engine a job uses: its threads and `--direct`, and a CUDA engine for a device.
fn engine(job: &Job) -> Result<FileEngine, AnyError> {
    let mut cfg = FileConfig::from_env()?.direct(job.io.direct);
    if let Some(t) = job.io.threads {
        cfg = cfg.threads(t as usize);
    }
    if let Some(m) = job.io.cufile {
        cfg = cfg.cufile(m);
    }
    if cfg.cufile == CuFileMode::On {
        allow_cufile_compat();
    }
    Ok(match job.io.device {
        Device::Cuda(n) => FileEngine::with_engine(cfg, Arc::new(CudaEngine::new(n)?))?,
        _ => FileEngine::new(cfg)?,
    })
}

/// Without `nvidia-fs`, lets cuFile run in its compatibility mode when it is asked for
/// (`--cufile on`, `FERRY_CUFILE=on`): sets `CUFILE_FORCE_COMPAT_MODE=true` unless the caller
/// set it, before `libcufile` is loaded (call it before any engine or thread is made).
pub fn allow_cufile_compat() {
    if !ferry::file::gds_probe().nvidia_fs && std::env::var_os("CUFILE_FORCE_COMPAT_MODE").is_none()
    {
        std::env::set_var("CUFILE_FORCE_COMPAT_MODE", "true");
    }
}

/// How much of `len` bytes at `offset` of `path` is in the page cache now (`mincore` over a
/// read-only mapping): (cached bytes, bytes). None where it cannot be told.
pub fn page_cache(path: &Path, offset: u64, len: u64) -> Option<(u64, u64)> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Some((0, 0));
    }
    let f = std::fs::File::open(path).ok()?;
    let page = 4096u64;
    let start = offset / page * page;
    let span = usize::try_from(offset + len - start).ok()?;
    // SAFETY: a read-only shared mapping of an open file, never dereferenced, unmapped below;
    // `vec` has one byte per page of the span, as mincore writes.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            start as libc::off_t,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        let pages = span.div_ceil(page as usize);
        let mut vec = vec![0u8; pages];
        let r = libc::mincore(p, span, vec.as_mut_ptr());
        libc::munmap(p, span);
        if r != 0 {
            return None;
        }
        let cached = vec.iter().filter(|&&b| b & 1 == 1).count() as u64 * page;
        Some((cached.min(len), len))
    }
}

fn cache_words(c: Option<(u64, u64)>) -> String {
    match c {
        None => "unknown".into(),
        Some((_, 0)) => "nothing to read".into(),
        Some((h, n)) => {
            let pct = h as f64 * 100.0 / n as f64;
            let state = if pct >= 99.0 {
                "warm"
            } else if pct <= 1.0 {
                "cold"
            } else {
                "partly warm"
            };
            format!("{state} ({pct:.0}% of the bytes cached before the load)")
        }
    }
}

/// The transport (`host`, `bounce ring`, `cuFile`, ...) and why, into `v` as `transport` and
/// `transport_reason` (null for host memory).
fn add_transport(v: &mut serde_json::Value, io: &IoReport) {
    v["transport"] = io.transport.to_string().into();
    v["transport_reason"] = io.gds_note.clone().into();
}

/// "O_DIRECT", "buffered" ... with the reasons, in words (the transport's reason apart:
/// [`add_transport`]).
fn path_words(io: &IoReport) -> String {
    let mut s = io.path().to_string();
    if let Some(k) = io.bounce {
        s += &format!(" through {k} bounce buffers");
    }
    if let Some(n) = &io.direct_note {
        let n = n.replace("FileConfig::direct is off", "--direct not given");
        s += &format!("; O_DIRECT not used: {n}");
    }
    s
}

/// How the reads were issued: "io_uring, depth 32" or "threads (why)"; threads chosen because
/// no part could be `O_DIRECT` do not repeat the reason the path line gives.
fn issued_words(io: &IoReport) -> String {
    match (&io.issued, &io.direct_note) {
        (Some(ferry::file::IoIssue::Threads { why }), Some(n))
            if why.strip_prefix("no O_DIRECT part: ") == Some(n.as_str()) =>
        {
            "threads (no O_DIRECT part: see path)".into()
        }
        (i, _) => i
            .as_ref()
            .map_or_else(|| "nothing read".into(), ToString::to_string),
    }
}

fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} [{elapsed}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(bar)
}

/// What was loaded: a checkpoint, or a plain range in one buffer.
enum Loaded {
    Checkpoint(Box<Checkpoint>),
    Raw(TensorBuffer),
}

/// Runs `ferry load` (and the load half of `ferry save`); returns the summary as JSON.
pub fn run_load(job: &Job) -> Result<serde_json::Value, AnyError> {
    let fe = Arc::new(engine(job)?);
    let (cache, loaded, summary) = load(job, &fe)?;
    let mut out = summary;
    out["page_cache"] = cache_words(cache).into();
    if let Some((h, n)) = cache.filter(|&(_, n)| n > 0) {
        out["page_cache_fraction"] = (h as f64 / n as f64).into();
    }
    if job.verify {
        verify(job, &loaded)?;
        out["verified"] = true.into();
    }
    if let Some(to) = &job.save {
        let (dst, fsync) = (&to.dst, &to.fsync);
        // From here a Ctrl-C or SIGTERM stops the save between batches, which removes its
        // partial files (before, it ends the process: nothing is written yet).
        crate::signal::catch().map_err(|e| format!("cannot catch Ctrl-C during the save: {e}"))?;
        let stop = || crate::signal::caught().is_some();
        let t0 = Instant::now();
        let mut extra = serde_json::Map::new();
        let (bytes, io) = match &loaded {
            Loaded::Checkpoint(ck) => {
                let mut opts = SaveOptions::new().fsync(*fsync).interrupt(stop);
                opts.writer = to.writer;
                // An index path (`to.sharded`) is a sharded save.
                let opts = match to.sharded {
                    Some(limit) => opts.shard_bytes(limit),
                    None => opts,
                };
                let r = match to.snapshot_bytes {
                    Some(b) => {
                        let r = save_snapshot(&fe, ck, dst, opts.snapshot_bytes(b), t0)?;
                        extra.insert("stall_seconds".into(), r.1.into());
                        r.0
                    }
                    None => ck.save(&fe, dst, &opts)?,
                };
                extra.insert("writer".into(), r.writer.name().into());
                extra.insert("writer_note".into(), r.writer_note.clone().into());
                extra.insert("held_bytes".into(), r.snapshot_bytes.into());
                (r.bytes, r.io)
            }
            Loaded::Raw(buf) => {
                extra.insert("writer".into(), "buffered".into());
                extra.insert("writer_note".into(), "plain bytes".into());
                save_raw(&fe, buf, dst, *fsync, &stop)?
            }
        };
        let s = t0.elapsed().as_secs_f64();
        out["save"] = serde_json::json!({
            "path": dst.display().to_string(),
            "bytes": bytes,
            "seconds": s,
            "gb_per_s": bytes as f64 / s.max(1e-12) / 1e9,
            "fsync": fsync,
            "io_path": path_words(&io),
            "issued": issued_words(&io),
        });
        for (k, v) in extra {
            out["save"][k] = v;
        }
        add_transport(&mut out["save"], &io);
    }
    Ok(out)
}

/// `ferry save --snapshot-bytes`: `ck`'s tensors snapshotted into bounded host memory and
/// written ([`Checkpoint::snapshot_save`]); returns the save's report and the seconds the
/// call waited (for the copies), from `t0`.
fn save_snapshot(
    fe: &Arc<FileEngine>,
    ck: &Checkpoint,
    dst: &Path,
    opts: SaveOptions,
    t0: Instant,
) -> Result<(checkpoint::SaveReport, f64), AnyError> {
    let regions: Vec<_> = ck
        .tensors()
        .iter()
        .map(|t| ferry::memory::Region::of(&ck.buffers()[t.buffer], t.offset..t.offset + t.len))
        .collect::<Option<_>>()
        .ok_or("a loaded tensor lies outside its buffer")?;
    let tensors: Vec<SaveTensor<'_>> = ck
        .tensors()
        .iter()
        .zip(&regions)
        .map(|(t, r)| SaveTensor::new(&t.name, t.dtype, &t.shape, r))
        .collect();
    let mut opts = opts;
    for (k, v) in ck.metadata() {
        if k != "total_size" {
            opts.metadata.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let h = Checkpoint::snapshot_save(Arc::clone(fe), dst, &tensors, opts)?;
    let stall = t0.elapsed().as_secs_f64();
    let r = h.join().map_err(|_| "the writing thread panicked")??;
    Ok((r, stall))
}

/// Writes `buf` to `dst` beside it and renames it over `dst` once complete: a failed or
/// interrupted write (a full disk, Ctrl-C between its batches) leaves an existing `dst` as it
/// was and no partial file.
fn save_raw(
    fe: &FileEngine,
    buf: &TensorBuffer,
    dst: &Path,
    fsync: bool,
    stop: &dyn Fn() -> bool,
) -> Result<(u64, IoReport), AnyError> {
    let failed = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", dst.display());
    let replacing = Replacement::new(dst).map_err(|e| failed(&e))?;
    let f = fe
        .open(replacing.temp_path(), OpenMode::Create)
        .map_err(|e| failed(&e))?;
    let len = buf.raw().len;
    let mut io = IoReport::default();
    let mut at = 0;
    while at < len {
        if stop() {
            return Err(format!(
                "saving {}: interrupted; the file was not written (nothing was left behind)",
                dst.display()
            )
            .into());
        }
        let n = (256usize << 20).min(len - at);
        let part =
            ferry::memory::Region::of(buf, at..at + n).ok_or("a batch lies in the buffer")?;
        io.add(
            fe.store_from(&f, at as u64, &part)
                .map_err(|e| failed(&e))?,
        );
        at += n;
    }
    if fsync {
        f.sync().map_err(|e| failed(&e))?;
    }
    drop(f);
    replacing.commit(fsync).map_err(|e| failed(&e))?;
    Ok((len as u64, io))
}

/// (cached bytes, bytes) of the page cache before a load: see [`page_cache`].
type Cached = Option<(u64, u64)>;

fn load(job: &Job, fe: &FileEngine) -> Result<(Cached, Loaded, serde_json::Value), AnyError> {
    let target = job.io.device;
    if job.checkpoint {
        let files = shard_paths(&job.path);
        let cache = files.iter().try_fold((0, 0), |(h, n), p| {
            let len = std::fs::metadata(p).ok()?.len();
            page_cache(p, 0, len).map(|(a, b)| (h + a, n + b))
        });
        let mut opts = LoadOptions::new(target.target());
        if job.io.per_tensor {
            opts = opts.placement(Placement::PerTensor);
        }
        if let Some(names) = &job.io.select {
            opts = opts.names(select_names(names));
        }
        let bar = progress_bar(0);
        if let Some(b) = bar.clone() {
            opts = opts.progress(move |done, total| {
                b.set_length(total);
                b.set_position(done);
            });
        }
        let ck = checkpoint::load(fe, &job.path, &opts)?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        let r = ck.report();
        let tensors: Vec<serde_json::Value> = ck
            .tensors()
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name, "dtype": t.dtype.to_string(), "shape": t.shape,
                    "bytes": t.len, "file": t.file.display().to_string(),
                    "file_range": [t.file_range.start, t.file_range.end],
                    "address": format!("{:#x}", ck.view(&t.name).map_or(0, |v| v.raw().addr)),
                })
            })
            .collect();
        let summary = serde_json::json!({
            "path": job.path.display().to_string(), "kind": "safetensors", "device": target.to_string(),
            "bytes": r.bytes, "seconds": r.seconds, "gb_per_s": r.gb_per_s(),
            "setup_seconds": r.setup_seconds, "files": r.files, "reads": r.reads,
            "allocations": r.allocations, "io_path": path_words(&r.io), "issued": issued_words(&r.io),
            "pinned_bytes": r.pinned_bytes, "peak_rss_bytes": r.peak_rss_bytes,
            "tensors": tensors,
        });
        let mut summary = summary;
        add_transport(&mut summary, &r.io);
        return Ok((cache, Loaded::Checkpoint(Box::new(ck)), summary));
    }
    let cache = page_cache(&job.path, job.offset, job.length);
    let t0 = Instant::now();
    let len = usize::try_from(job.length)?;
    let mut buf = TensorBuffer::new(target.kind(), len).map_err(|m| {
        format!(
            "cannot allocate {} of {target} memory: {m}",
            format_size(job.length)
        )
    })?;
    let file = fe.open(&job.path, OpenMode::Read)?;
    let setup = t0.elapsed().as_secs_f64();
    let bar = progress_bar(job.length);
    // With a bar: 32 batches (at least 64 MiB each), the bar moved after each; else one load.
    let batch = match &bar {
        Some(_) => (len / 32).max(64 << 20),
        None => len.max(1),
    };
    let t1 = Instant::now();
    let mut io = IoReport::default();
    let mut at = 0;
    while at < len || (len == 0 && at == 0) {
        let n = batch.min(len - at);
        let p = ReadPiece {
            file: &file,
            offset: job.offset + at as u64,
            at,
            len: n,
        };
        io.add(fe.load_pieces(&mut buf, &[p])?);
        at += n;
        if let Some(b) = &bar {
            b.set_position(at as u64);
        }
        if len == 0 {
            break;
        }
    }
    let seconds = t1.elapsed().as_secs_f64();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut summary = serde_json::json!({
        "path": job.path.display().to_string(), "kind": "raw", "device": target.to_string(),
        "offset": job.offset, "bytes": job.length, "seconds": seconds,
        "gb_per_s": job.length as f64 / seconds.max(1e-12) / 1e9, "setup_seconds": setup,
        "address": format!("{:#x}", buf.raw().addr), "io_path": path_words(&io),
        "issued": issued_words(&io), "pinned_bytes": raw_pinned(fe, &io, &buf),
        "peak_rss_bytes": LoadReport::process_peak_rss(),
    });
    add_transport(&mut summary, &io);
    Ok((cache, Loaded::Raw(buf), summary))
}

/// Pinned bytes a plain load used: the file engine's bounce ring where the bytes went through
/// it pinned, and the buffer itself where it is pinned (as a checkpoint's report counts them).
fn raw_pinned(fe: &FileEngine, io: &IoReport, buf: &TensorBuffer) -> u64 {
    let ring = match io.bounce {
        Some(MemKind::Pinned) => fe.pinned_bytes(),
        _ => 0,
    };
    let own = match buf {
        TensorBuffer::Pinned(_) => buf.raw().len as u64,
        _ => 0,
    };
    ring + own
}

/// The files of a checkpoint: the file itself, or the shards its index names (none where
/// the library cannot read the index, which the load then refuses).
fn shard_paths(path: &Path) -> Vec<PathBuf> {
    if !path.to_string_lossy().ends_with(".json") {
        return vec![path.to_path_buf()];
    }
    let Ok(fe) = FileEngine::new(FileConfig::new().threads(1)) else {
        return Vec::new();
    };
    let mut shards: Vec<PathBuf> = checkpoint::entries(&fe, path)
        .map(|e| e.into_iter().map(|(p, _)| p).collect())
        .unwrap_or_default();
    shards.sort();
    shards.dedup();
    shards
}

/// Host copies of the loaded buffers (device ones copied back).
fn host_copy(b: &TensorBuffer) -> Result<Vec<u8>, AnyError> {
    Ok(match b {
        TensorBuffer::Device(d) => d.to_vec()?,
        other => other.host_bytes().unwrap_or_default().to_vec(),
    })
}

/// Compares what was loaded with a plain read of the file.
fn verify(job: &Job, loaded: &Loaded) -> Result<(), AnyError> {
    use std::os::unix::fs::FileExt;
    let compare = |file: &Path, offset: u64, got: &[u8], what: &str| -> Result<(), AnyError> {
        let f = std::fs::File::open(file)?;
        let mut want = vec![0u8; got.len()];
        f.read_exact_at(&mut want, offset)?;
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            return Err(format!(
                "verify failed: {what}: byte {i} (file offset {}) is {:#04x}, the file has {:#04x}",
                offset + i as u64,
                got[i],
                want[i]
            )
            .into());
        }
        Ok(())
    };
    match loaded {
        Loaded::Raw(b) => compare(
            &job.path,
            job.offset,
            &host_copy(b)?,
            &job.path.display().to_string(),
        ),
        Loaded::Checkpoint(ck) => {
            let copies = ck
                .buffers()
                .iter()
                .map(host_copy)
                .collect::<Result<Vec<_>, _>>()?;
            for t in ck.tensors() {
                let got = &copies[t.buffer][t.offset..t.offset + t.len];
                compare(
                    &t.file,
                    t.file_range.start,
                    got,
                    &format!("tensor `{}`", t.name),
                )?;
            }
            Ok(())
        }
    }
}

/// `  transport   cuFile (compatibility mode): why` (the reason left out for host memory).
fn transport_line(v: &serde_json::Value) -> String {
    let t = v["transport"].as_str().unwrap_or("");
    match v["transport_reason"].as_str() {
        // The reason starts with the transport's name (`Choice`'s form).
        Some(r) => format!("  transport   {r}\n"),
        None => format!("  transport   {t}\n"),
    }
}

/// The widest cell of the tensor table, in characters (`--json` keeps every name and shape
/// whole).
const CELL_MAX: usize = 96;

/// A table cell: control characters, the invisible ones that reorder or hide text (bidi
/// overrides, zero-width spaces) and backslashes escaped (a tensor's name comes from the
/// file, and must not reach the terminal as escape sequences or line breaks, nor pass for
/// another name), at most [`CELL_MAX`] characters, the middle of a longer one elided.
fn cell(text: &str) -> String {
    let esc: Vec<char> = escaped(text, |c| c.is_control() || c == '\\').collect();
    if esc.len() <= CELL_MAX {
        return esc.into_iter().collect();
    }
    let (head, tail) = ((CELL_MAX - 1).div_ceil(2), (CELL_MAX - 1) / 2);
    esc[..head]
        .iter()
        .chain(&['…'])
        .chain(&esc[esc.len() - tail..])
        .collect()
}

/// An error message for the terminal: control characters other than line breaks, and the
/// invisible ones the summary table's cells escape, written as escapes (`\u{1b}`). Messages
/// quote tensor and shard names from the file, which must not reach the terminal as escape
/// sequences (a retitled window, a cleared screen) nor reorder the text around them.
pub fn terminal_text(text: &str) -> String {
    escaped(text, |c| c.is_control() && c != '\n').collect()
}

/// `text` with the characters `escape` picks, and the [`invisible`] ones, written as escapes
/// (`\u{1b}`): the one escaping of a table cell and of an error message.
fn escaped(text: &str, escape: fn(char) -> bool) -> impl Iterator<Item = char> + '_ {
    text.chars().flat_map(move |c| {
        let e: Vec<char> = if escape(c) || invisible(c) {
            c.escape_default().collect()
        } else {
            vec![c]
        };
        e
    })
}

/// Unicode format characters a terminal shows as nothing while they hide or reorder the text
/// around them: bidi marks, embeddings, overrides and isolates, zero-width spaces and joiners,
/// line and paragraph separators, the byte order mark.
fn invisible(c: char) -> bool {
    matches!(c, '\u{61c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}')
}

/// A duration in units that show it: `0.1311 s` from 0.1 s up (as before), else `12.5 ms`,
/// `12 us`, `0.8 us`.
pub fn human_time(seconds: f64) -> String {
    match seconds {
        s if s >= 0.1 => format!("{s:.4} s"),
        s if s >= 1e-3 => format!("{:.1} ms", s * 1e3),
        s if s >= 10e-6 => format!("{:.0} us", s * 1e6),
        s => format!("{:.1} us", s * 1e6),
    }
}

/// A rate in units that show it: `32.76 GB/s` from 0.1 GB/s up (as before), else MB/s, kB/s
/// or B/s (an 88-byte load was "0.00 GB/s").
pub fn human_rate(gb_per_s: f64) -> String {
    match gb_per_s {
        g if g >= 0.1 => format!("{g:.2} GB/s"),
        g if g >= 1e-4 => format!("{:.1} MB/s", g * 1e3),
        g if g >= 1e-7 => format!("{:.1} kB/s", g * 1e6),
        g => format!("{:.0} B/s", g * 1e9),
    }
}

/// The summary in words, with the per-tensor table for a checkpoint.
pub fn render(v: &serde_json::Value) -> String {
    let g = |k: &str| v.get(k).cloned().unwrap_or_default();
    let num = |k: &str| g(k).as_f64().unwrap_or(0.0);
    let bytes = g("bytes").as_u64().unwrap_or(0);
    let mut s = format!(
        "loaded {} ({}) -> {}\n  bytes       {bytes} ({})\n  time        {}, {} (setup {}: header, allocation, open)\n  path        {}\n  page cache  {}\n",
        g("path").as_str().unwrap_or(""),
        g("kind").as_str().unwrap_or(""),
        g("device").as_str().unwrap_or(""),
        format_size(bytes),
        human_time(num("seconds")),
        human_rate(num("gb_per_s")),
        human_time(num("setup_seconds")),
        g("io_path").as_str().unwrap_or(""),
        g("page_cache").as_str().unwrap_or(""),
    );
    if let Some(i) = g("issued").as_str() {
        s += &format!("  issued by   {i}\n");
    }
    s += &transport_line(v);
    if let Some(r) = g("reads").as_u64() {
        s += &format!(
            "  reads       {r} from {} file(s) into {} allocation(s)\n",
            g("files"),
            g("allocations")
        );
    }
    if let Some(a) = g("address").as_str() {
        s += &format!("  address     {a}\n");
    }
    if let Some(p) = g("pinned_bytes").as_u64() {
        let peak = g("peak_rss_bytes")
            .as_u64()
            .map_or_else(|| "unknown".to_string(), format_size);
        s += &format!(
            "  memory      {} pinned (bounce ring and pinned tensors); process peak RSS {peak}\n",
            format_size(p)
        );
    }
    if g("verified").as_bool() == Some(true) {
        s += "  verify      ok: every byte matches a plain read of the file\n";
    }
    if let Some(sv) = v.get("save") {
        s += &format!(
            "saved {}: {} bytes in {}, {}{}\n  path        {}\n",
            sv["path"].as_str().unwrap_or(""),
            sv["bytes"],
            human_time(sv["seconds"].as_f64().unwrap_or(0.0)),
            human_rate(sv["gb_per_s"].as_f64().unwrap_or(0.0)),
            if sv["fsync"].as_bool() == Some(true) {
                ", fsynced"
            } else {
                ""
            },
            sv["io_path"].as_str().unwrap_or(""),
        );
        if let Some(w) = sv["writer"].as_str() {
            s += &format!(
                "  writer      {w} ({})\n",
                sv["writer_note"].as_str().unwrap_or("")
            );
        }
        if let Some(st) = sv["stall_seconds"].as_f64() {
            s += &format!(
                "  snapshot    the copies took {}, at most {} held\n",
                human_time(st),
                format_size(sv["held_bytes"].as_u64().unwrap_or(0))
            );
        }
        if let Some(i) = sv["issued"].as_str() {
            s += &format!("  issued by   {i}\n");
        }
        s += &transport_line(sv);
    }
    if let Some(ts) = g("tensors").as_array() {
        let rows: Vec<[String; 5]> = ts
            .iter()
            .map(|t| {
                [
                    t["name"].as_str().unwrap_or(""),
                    t["dtype"].as_str().unwrap_or(""),
                    &t["shape"].to_string(),
                    &t["bytes"].to_string(),
                    t["address"].as_str().unwrap_or(""),
                ]
                .map(cell)
            })
            .collect();
        let head = ["tensor", "dtype", "shape", "bytes", "address"];
        let w: Vec<usize> = (0..5)
            .map(|c| {
                rows.iter()
                    .map(|r| r[c].chars().count())
                    .chain([head[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for r in std::iter::once(head.map(String::from)).chain(rows) {
            s += &format!(
                "  {:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {}\n",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                w0 = w[0],
                w1 = w[1],
                w2 = w[2],
                w3 = w[3]
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--writer`'s words are the library's writer keys (Python's `writer=` takes the same).
    #[test]
    fn writer_args_are_the_writers_keys() {
        use clap::ValueEnum;
        for a in WriterArg::value_variants() {
            let word = a.to_possible_value().expect("every writer is listed");
            assert_eq!(word.get_name(), a.writer().key());
        }
        assert_eq!(WriterArg::value_variants().len(), Writer::ALL.len());
    }

    /// `--device cuda` is GPU 0, as PyTorch's `"cuda"` (a GPU run of `ferry save ... --device
    /// cuda` was refused).
    #[test]
    fn devices_parse_as_pytorch_names_them() {
        assert_eq!(parse_device("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(parse_device("cuda:3"), Ok(Device::Cuda(3)));
        assert_eq!(parse_device("cpu"), Ok(Device::Pageable));
        assert_eq!(parse_device("pinned"), Ok(Device::Pinned));
        assert!(parse_device("cuda:").is_err());
        assert!(parse_device("gpu")
            .unwrap_err()
            .contains("is not cuda, cuda:N"));
    }

    /// Issue 33: an 88-byte load printed "0.0000 s, 0.00 GB/s".
    #[test]
    fn tiny_loads_print_useful_units() {
        assert_eq!(human_time(0.1311), "0.1311 s");
        assert_eq!(human_time(0.0125), "12.5 ms");
        assert_eq!(human_time(12.4e-6), "12 us");
        assert_eq!(human_time(0.8e-6), "0.8 us");
        assert_eq!(human_rate(32.76), "32.76 GB/s");
        assert_eq!(human_rate(88.0 / 12e-6 / 1e9), "7.3 MB/s");
        assert_eq!(human_rate(88.0 / 5.0 / 1e9), "18 B/s");
        let v = serde_json::json!({"bytes": 88, "seconds": 12e-6, "gb_per_s": 88.0 / 12e-6 / 1e9});
        let text = render(&v);
        assert!(text.contains("12 us, 7.3 MB/s"), "{text}");
        assert!(!text.contains("0.00 GB/s"), "{text}");
    }

    #[test]
    fn cells_are_escaped_and_bounded() {
        assert_eq!(cell("w.0"), "w.0");
        assert_eq!(cell("a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
        // Text that reorders what follows it, or hides, or passes for an escape.
        assert_eq!(cell("w\u{202e}gnp.exe"), "w\\u{202e}gnp.exe");
        assert_eq!(cell("a\u{200b}b"), "a\\u{200b}b");
        assert_eq!(cell("a\\nb"), "a\\\\nb");
        assert_eq!(cell("über.é"), "über.é");
        let long = cell(&"x".repeat(100_000));
        assert_eq!(long.chars().count(), CELL_MAX);
        assert!(long.contains('…'), "{long}");
    }

    /// Rust's formatter refuses a width over 65,535: a tensor name or shape that long once
    /// panicked the table.
    #[test]
    fn a_huge_name_or_shape_renders() {
        let shape: Vec<u64> = vec![1; 100_000];
        let v = serde_json::json!({
            "tensors": [
                {"name": "x".repeat(70_000), "dtype": "F32", "shape": [1], "bytes": 4, "address": "0x1"},
                {"name": "y", "dtype": "F32", "shape": shape, "bytes": 4, "address": "0x2"},
            ]
        });
        let text = render(&v);
        assert!(
            text.lines().all(|l| l.chars().count() < 6 * CELL_MAX),
            "{text}"
        );
        assert!(text.contains("  y  "), "{text}");
    }
}
