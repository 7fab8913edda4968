//! Snapshot, then write: [`Checkpoint::snapshot`] copies the tensors out of their memory (a
//! GPU's, on the file engine's CUDA engine, into one pinned host allocation) and returns as
//! soon as the caller may change or free them; [`Checkpoint::save_in_background`] then writes
//! the copy to files on a thread of its own ([`save`](fn@super::save)'s writer: parallel,
//! batched, each file replaced whole) and returns the thread's handle (`is_finished` to poll,
//! `join` to wait: the save's result).

use super::error::CheckpointError;
use super::loaded::{Checkpoint, LoadReport, Tensor};
use super::options::{SaveOptions, SaveTensor};
use super::save::{plan_save, SaveReport};
use super::write::{check_tensor, replace_err, store_batches, Opened, Piece, CHUNK_BYTES};
use super::TensorBuffer;
use crate::engine::cpu::CpuEngine;
use crate::engine::Engine;
use crate::file::FileEngine;
use crate::layout::Layout;
use crate::memory::{MemKind, Memory, Region};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Each tensor's place in a snapshot starts at a multiple of this (`O_DIRECT`-friendly).
const SNAP_ALIGN: usize = 4096;

/// [`SaveOptions::snapshot_bytes`] by default: 1 GiB.
const DEFAULT_SNAPSHOT_BYTES: u64 = 1 << 30;

impl Checkpoint {
    /// Copies `tensors` into host memory this checkpoint owns (pinned where the file engine
    /// has a GPU's engine and a tensor lives on a GPU, else pageable) and returns once every
    /// byte is copied: the caller may then change or free the tensors' memory (a training
    /// step goes on) while the copy is written ([`Checkpoint::save`],
    /// [`Checkpoint::save_in_background`]). Device tensors are copied on the file engine's
    /// engine (at the link's rate), host tensors on CPU threads; [`Checkpoint::report`]'s
    /// `seconds` is the copy (the caller's stall). Errors: [`CheckpointError::BadTensor`]
    /// (bytes that do not match dtype x shape, a device tensor without a GPU engine, a failed
    /// copy), [`CheckpointError::Alloc`].
    pub fn snapshot(
        engine: &FileEngine,
        tensors: &[SaveTensor<'_>],
    ) -> Result<Checkpoint, CheckpointError> {
        let t0 = Instant::now();
        let here = Path::new("<snapshot>");
        let mut places = Vec::with_capacity(tensors.len());
        let mut total = 0usize;
        let mut on_gpu = false;
        let mut names = std::collections::HashSet::with_capacity(tensors.len());
        for t in tensors {
            check_tensor(here, t)?;
            if !names.insert(t.name) {
                return Err(CheckpointError::Duplicate {
                    tensor: t.name.to_string(),
                    first: here.to_path_buf(),
                    second: here.to_path_buf(),
                });
            }
            let len = t.data.raw().len;
            on_gpu |= matches!(t.data.raw().kind, MemKind::Device { .. });
            places.push(total..total + len);
            total = (total + len).next_multiple_of(SNAP_ALIGN);
        }
        let gpu = engine.mover().filter(|_| on_gpu);
        let kind = if gpu.is_some() {
            MemKind::Pinned
        } else {
            MemKind::Pageable
        };
        let mut buf =
            TensorBuffer::new(kind, total.max(1)).map_err(|msg| CheckpointError::Alloc {
                path: here.to_path_buf(),
                bytes: total as u64,
                target: kind.to_string(),
                msg,
            })?;
        let cpu = cpu_engine(engine)?;
        let setup = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for (t, place) in tensors.iter().zip(&places) {
            let by = engine_for(t, gpu, &cpu)?;
            copy_out(by, &mut buf, place.start, t, 0..place.len())?;
        }
        let seconds = t1.elapsed().as_secs_f64();
        let list: Vec<Tensor> = tensors
            .iter()
            .zip(places)
            .map(|(t, p)| Tensor {
                name: t.name.to_string(),
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                file: here.to_path_buf(),
                file_range: p.start as u64..p.end as u64,
                buffer: 0,
                offset: p.start,
                len: p.len(),
                kind,
            })
            .collect();
        let bytes = list.iter().map(|t| t.len as u64).sum();
        Ok(Checkpoint {
            by_name: list
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect::<HashMap<_, _>>(),
            tensors: list,
            buffers: vec![buf],
            metadata: BTreeMap::new(),
            report: LoadReport {
                bytes,
                tensors: tensors.len(),
                files: 0,
                reads: 0,
                allocations: 1,
                seconds,
                setup_seconds: setup,
                io: Default::default(),
                pinned_bytes: if kind == MemKind::Pinned {
                    total as u64
                } else {
                    0
                },
                peak_rss_bytes: LoadReport::process_peak_rss(),
            },
        })
    }

    /// Snapshots `tensors` and writes them to `path` (one file, or a sharded checkpoint for an
    /// index path, as [`save`](fn@super::save) writes them), holding at most
    /// [`SaveOptions::snapshot_bytes`] of host memory (default 1 GiB; pinned where a tensor is
    /// on the file engine's GPU). Returns once every tensor is copied out of its memory (the
    /// caller may then change it) with the handle of the thread that finishes the write
    /// (`join`: the save's result; its [`SaveReport::snapshot_bytes`] is the high-water mark).
    ///
    /// A checkpoint within the bound is [`Checkpoint::snapshot`] then
    /// [`Checkpoint::save_in_background`]: the caller waits for the copy only. A larger one is
    /// streamed through one buffer of the bound: the temporary files are opened, then window
    /// after window of tensor bytes (in file order) is copied into the buffer and written
    /// from it; the caller waits for every window's copy and every window's write but the
    /// last, so the stall grows gracefully with the checkpoint's excess over the bound
    /// (about `(size - bound) / write rate` more) instead of the memory. A tensor larger than
    /// the bound is copied in parts (any byte range of a tensor copies as well as the whole),
    /// so the bound holds for any tensor and the memory never follows the largest one.
    ///
    /// Errors: [`Checkpoint::snapshot`]'s and [`save`](fn@super::save)'s (a failed write
    /// leaves no file, as a save's; a streamed one's come from the call up to its last
    /// window, then from the handle), and [`CheckpointError::Replace`] when the system
    /// refuses the writing thread.
    pub fn snapshot_save(
        engine: Arc<FileEngine>,
        path: impl Into<PathBuf>,
        tensors: &[SaveTensor<'_>],
        opts: SaveOptions,
    ) -> Result<JoinHandle<Result<SaveReport, CheckpointError>>, CheckpointError> {
        let path = path.into();
        let bound = opts
            .snapshot_bytes
            .unwrap_or(DEFAULT_SNAPSHOT_BYTES)
            .clamp(SNAP_ALIGN as u64, usize::MAX as u64) as usize;
        let spawn_err = |e: std::io::Error| replace_err(&path, &e, "starting the writing thread");
        let whole: usize = tensors
            .iter()
            .map(|t| t.data.raw().len.next_multiple_of(SNAP_ALIGN))
            .sum();
        if whole <= bound {
            let snap = Checkpoint::snapshot(&engine, tensors)?;
            let held = snap.buffers().iter().map(|b| b.raw().len as u64).sum();
            let to = path.clone();
            return std::thread::Builder::new()
                .name("ferry-ckpt-write".into())
                .spawn(move || {
                    let mut r = snap.save(&engine, &to, &opts)?;
                    r.snapshot_bytes = held;
                    Ok(r)
                })
                .map_err(spawn_err);
        }
        let here = Path::new("<snapshot>");
        let mut names = std::collections::HashSet::with_capacity(tensors.len());
        for t in tensors {
            check_tensor(here, t)?;
            if !names.insert(t.name) {
                return Err(CheckpointError::Duplicate {
                    tensor: t.name.to_string(),
                    first: path.clone(),
                    second: path.clone(),
                });
            }
        }
        let on_gpu = tensors
            .iter()
            .any(|t| matches!(t.data.raw().kind, MemKind::Device { .. }));
        let gpu = engine.mover().filter(|_| on_gpu);
        let kind = if gpu.is_some() {
            MemKind::Pinned
        } else {
            MemKind::Pageable
        };
        let cpu = cpu_engine(&engine)?;
        let (planned, extra) = plan_save(&path, tensors, &opts)?;
        for t in tensors {
            engine_for(t, gpu, &cpu)?;
        }
        let mut buf = TensorBuffer::new(kind, bound).map_err(|msg| CheckpointError::Alloc {
            path: here.to_path_buf(),
            bytes: bound as u64,
            target: kind.to_string(),
            msg,
        })?;
        let t0 = Instant::now();
        let open = Opened::new(&engine, &planned, &extra)?;
        let heads = planned
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let head: &dyn Memory = &f.head;
                VecDeque::from([Piece {
                    file: i,
                    offset: 0,
                    data: Region::of(head, 0..f.head.len()).expect("the whole header"),
                }])
            })
            .collect();
        let mut io = store_batches(&engine, &open.handles, &open.paths, heads, &opts, |_, _| {
            None
        })?;
        // The window in `buf`: (file, offset in it, range in buf, tensor).
        let mut window: Vec<Span> = Vec::new();
        let mut fill = 0usize;
        for (i, f) in planned.iter().enumerate() {
            let mut at = f.head.len() as u64;
            for t in &f.order {
                let len = t.data.raw().len;
                let mut done = 0;
                while done < len {
                    if fill == bound {
                        io.add(write_window(&engine, &open, &buf, &window, &opts)?);
                        window.clear();
                        fill = 0;
                    }
                    let n = (bound - fill).min(len - done);
                    copy_out(engine_for(t, gpu, &cpu)?, &mut buf, fill, t, done..done + n)?;
                    window.push(Span {
                        file: i,
                        offset: at + done as u64,
                        range: fill..fill + n,
                        tensor: t.name.to_string(),
                    });
                    fill += n;
                    done += n;
                }
                at += len as u64;
            }
        }
        let bytes = planned.iter().map(|p| p.bytes()).sum::<u64>()
            + extra.iter().map(|e| e.1.len() as u64).sum::<u64>();
        let files = planned.len();
        let count = tensors.len();
        drop(planned);
        std::thread::Builder::new()
            .name("ferry-ckpt-write".into())
            .spawn(move || {
                io.add(write_window(&engine, &open, &buf, &window, &opts)?);
                open.finish(&opts)?;
                Ok(SaveReport {
                    bytes,
                    tensors: count,
                    files,
                    seconds: t0.elapsed().as_secs_f64(),
                    synced: opts.fsync,
                    snapshot_bytes: bound as u64,
                    io,
                })
            })
            .map_err(spawn_err)
    }

    /// Writes this checkpoint to `path` ([`Checkpoint::save`]: one file, or a sharded
    /// checkpoint for an index path) on a thread of its own and returns at once: the handle's
    /// `is_finished` polls, its `join` waits and gives the save's result. Join it before the
    /// process exits: a thread still writing then is stopped with its temporary file left.
    /// Errors: the system refused a thread.
    pub fn save_in_background(
        self,
        engine: Arc<FileEngine>,
        path: impl Into<PathBuf>,
        opts: SaveOptions,
    ) -> std::io::Result<JoinHandle<Result<SaveReport, CheckpointError>>> {
        let path = path.into();
        std::thread::Builder::new()
            .name("ferry-ckpt-write".into())
            .spawn(move || self.save(&engine, &path, &opts))
    }
}

/// A part of a tensor in a streamed snapshot's window.
struct Span {
    file: usize,
    offset: u64,
    range: Range<usize>,
    tensor: String,
}

/// Writes a streamed snapshot's window from `buf` (its spans cut into pieces of at most
/// [`CHUNK_BYTES`]).
fn write_window(
    engine: &FileEngine,
    open: &Opened,
    buf: &TensorBuffer,
    window: &[Span],
    opts: &SaveOptions,
) -> Result<crate::file::IoReport, CheckpointError> {
    let mut queues: Vec<VecDeque<Piece<'_>>> = open.paths.iter().map(|_| VecDeque::new()).collect();
    for s in window {
        let mut at = s.range.start;
        while at < s.range.end {
            let n = CHUNK_BYTES.min(s.range.end - at);
            queues[s.file].push_back(Piece {
                file: s.file,
                offset: s.offset + (at - s.range.start) as u64,
                data: Region::of(buf, at..at + n).expect("a span lies inside the buffer"),
            });
            at += n;
        }
    }
    store_batches(engine, &open.handles, &open.paths, queues, opts, |i, o| {
        window
            .iter()
            .find(|s| s.file == i && o >= s.offset && o < s.offset + s.range.len() as u64)
            .map(|s| s.tensor.clone())
    })
}

/// A CPU engine for the host tensors' copies, as many threads as the file engine's.
fn cpu_engine(engine: &FileEngine) -> Result<CpuEngine, CheckpointError> {
    CpuEngine::new(engine.config().threads.max(1)).map_err(|e| CheckpointError::BadTensor {
        path: PathBuf::from("<snapshot>"),
        tensor: String::new(),
        msg: format!("no CPU engine for the host copies: {e}"),
    })
}

/// The engine that copies `t` out: the GPU's for a device tensor, the CPU's for a host one.
fn engine_for<'e>(
    t: &SaveTensor<'_>,
    gpu: Option<&'e dyn Engine>,
    cpu: &'e CpuEngine,
) -> Result<&'e dyn Engine, CheckpointError> {
    match (t.data.raw().kind, gpu) {
        (MemKind::Device { .. }, Some(g)) => Ok(g),
        (MemKind::Device { ordinal }, None) => Err(CheckpointError::BadTensor {
            path: PathBuf::from("<snapshot>"),
            tensor: t.name.to_string(),
            msg: format!(
                "it is on cuda:{ordinal}: snapshot it with a file engine made by \
                 FileEngine::with_engine and that GPU's CudaEngine"
            ),
        }),
        _ => Ok(cpu),
    }
}

/// Copies bytes `src` of `t` to `buf` at `at`, on `by`.
fn copy_out(
    by: &dyn Engine,
    buf: &mut TensorBuffer,
    at: usize,
    t: &SaveTensor<'_>,
    src: Range<usize>,
) -> Result<(), CheckpointError> {
    if src.is_empty() {
        return Ok(());
    }
    let copy_err = |e: String| CheckpointError::BadTensor {
        path: PathBuf::from("<snapshot>"),
        tensor: t.name.to_string(),
        msg: format!("copying it out failed: {e}"),
    };
    let n = src.len();
    let whole = Layout::bytes(buf.raw().len).map_err(|e| copy_err(e.to_string()))?;
    let dst = whole
        .slice(0, at..at + n, 1)
        .map_err(|e| copy_err(e.to_string()))?;
    let from = Layout::bytes(n).map_err(|e| copy_err(e.to_string()))?;
    // As bytes (a typed source's element size would not match the byte layouts).
    let bytes = Region::of(t.data, src).ok_or_else(|| copy_err("a range outside it".into()))?;
    by.scope(|s| -> crate::Result<()> { Ok(s.copy(buf, &dst, &bytes, &from)?.wait()?) })
        .map_err(|e| copy_err(e.to_string()))
}
