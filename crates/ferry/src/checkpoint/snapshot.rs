//! Snapshot, then write: [`Checkpoint::snapshot`] copies the tensors out of their memory (a
//! GPU's, on the file engine's CUDA engine, into one pinned host allocation) and returns as
//! soon as the caller may change or free them; [`Checkpoint::save_in_background`] then writes
//! the copy to files on a thread of its own ([`save`](fn@super::save)'s writer: parallel,
//! batched, each file replaced whole) and returns the thread's handle (`is_finished` to poll,
//! `join` to wait: the save's result).

use super::error::CheckpointError;
use super::kept;
use super::loaded::{Checkpoint, LoadReport, Tensor};
use super::options::{SaveOptions, SaveTensor};
use super::save::{plan_save, SaveReport};
use super::stream::{self, Copier, Part, Stop, Stream, STREAM_ALIGN};
use super::write::{check_tensor, open_for, replace_err};
use super::TensorBuffer;
use crate::file::FileEngine;
use crate::memory::{MemKind, Memory};
use std::collections::{BTreeMap, HashMap};
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
    /// engine (at the link's rate, every copy in flight at once), host tensors on CPU threads.
    /// Host memory kept by an earlier snapshot save ([`SaveOptions::keep_snapshot`]) is taken
    /// over when it fits, else memory is allocated; taken memory is this checkpoint's from
    /// then on (freed with it, not given back), and its buffer may be longer than the tensors
    /// need, the bytes past them an earlier save's. [`Checkpoint::report`]'s `seconds` is the
    /// copy (the caller's stall), `setup_seconds` the allocation, `allocations` 0 where kept
    /// memory served. Errors: [`CheckpointError::BadTensor`] (bytes that do not match dtype x
    /// shape, a device tensor without a GPU engine, a failed copy), [`CheckpointError::Alloc`].
    pub fn snapshot(
        engine: &FileEngine,
        tensors: &[SaveTensor<'_>],
    ) -> Result<Checkpoint, CheckpointError> {
        Checkpoint::snapshot_within(engine, tensors, usize::MAX)
    }

    /// [`Checkpoint::snapshot`], taking kept memory of at most `max` bytes only (a save's
    /// bound).
    fn snapshot_within(
        engine: &FileEngine,
        tensors: &[SaveTensor<'_>],
        max: usize,
    ) -> Result<Checkpoint, CheckpointError> {
        let t0 = Instant::now();
        let here = Path::new("<snapshot>");
        let mut places = Vec::with_capacity(tensors.len());
        let mut total = 0usize;
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
            places.push(total..total + len);
            total = (total + len).next_multiple_of(SNAP_ALIGN);
        }
        let copier = Copier::new(engine, tensors.iter().map(|t| (t.name, t.data.raw().kind)))?;
        let kind = copier.kind();
        let fresh = kept::take(kind, total.max(1), max);
        let allocations = usize::from(fresh.is_none());
        let mut buf = match fresh {
            Some(b) => b,
            None => {
                TensorBuffer::new(kind, total.max(1)).map_err(|msg| CheckpointError::Alloc {
                    path: here.to_path_buf(),
                    bytes: total as u64,
                    target: kind.to_string(),
                    msg,
                })?
            }
        };
        let setup = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let parts: Vec<Part<'_>> = tensors
            .iter()
            .zip(&places)
            .map(|(t, place)| Part {
                at: place.start,
                name: t.name,
                data: t.data,
                src: 0..place.len(),
            })
            .collect();
        copier.copy_all(&mut buf, &parts)?;
        let seconds = t1.elapsed().as_secs_f64();
        let held = buf.raw().len as u64;
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
                allocations,
                seconds,
                setup_seconds: setup,
                io: Default::default(),
                pinned_bytes: if kind == MemKind::Pinned { held } else { 0 },
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
    /// streamed through two windows of half the bound each: the temporary files are opened,
    /// then window after window of the files' bytes (in file order) is copied into one window
    /// on this thread while the other is written by the writing thread; the caller waits for
    /// every copy, and for a write only when both windows are full, so the stall grows
    /// gracefully with the checkpoint's excess over the bound (about `(size - bound) / write
    /// rate` more) instead of the memory, and copies overlap writes. A tensor larger than a
    /// window is copied in parts (any byte range of a tensor copies as well as the whole), so
    /// the bound holds for any tensor and the memory never follows the largest one. The
    /// windows are page-aligned runs of whole file blocks, so the `O_DIRECT` writer
    /// ([`SaveOptions::writer`]) writes them with `O_DIRECT` as they are (a streamed snapshot
    /// never takes the hybrid writer: its tensors may change once copied).
    ///
    /// With [`SaveOptions::keep_snapshot`], the snapshot's memory (or the two windows) is kept
    /// once written and taken by the next snapshot save that fits in it: the stall of a save
    /// within the bound is then the copy alone. Without it, memory kept by earlier saves is
    /// freed first.
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
            .clamp(2 * STREAM_ALIGN as u64, usize::MAX as u64) as usize;
        let spawn_err = |e: std::io::Error| replace_err(&path, &e, "starting the writing thread");
        let whole: usize = tensors
            .iter()
            .map(|t| t.data.raw().len.next_multiple_of(SNAP_ALIGN))
            .sum();
        let keep = opts.keep_snapshot;
        if !keep {
            kept::release();
        }
        // What this save may keep at its end: nothing if a save without the option released
        // the list meanwhile.
        let since = kept::generation();
        if whole <= bound {
            let snap = Checkpoint::snapshot_within(&engine, tensors, bound)?;
            let held = snap.buffers().iter().map(|b| b.raw().len as u64).sum();
            let to = path.clone();
            return std::thread::Builder::new()
                .name("ferry-ckpt-write".into())
                .spawn(move || {
                    let written = snap.save(&engine, &to, &opts);
                    if keep {
                        kept::keep(snap.into_parts().0, since);
                    }
                    let mut r = written?;
                    r.snapshot_bytes = held;
                    Ok(r)
                })
                .map_err(spawn_err);
        }
        let (planned, extra) = plan_save(&path, tensors, &opts)?;
        let copier = Copier::new(&engine, tensors.iter().map(|t| (t.name, t.data.raw().kind)))?;
        let half = (bound / 2 / STREAM_ALIGN * STREAM_ALIGN).max(STREAM_ALIGN);
        let stream = Stream::new(&planned);
        let n = stream.windows(half).clamp(1, 2);
        let free = kept::take_or_make(copier.kind(), half, half, n, || {
            stream::window(copier.kind(), half, n)
        })?;
        let held = free.iter().map(|b| b.raw().len as u64).sum();
        let t0 = Instant::now();
        let bytes = planned.iter().map(|p| p.bytes()).sum::<u64>();
        let target = open_for(&engine, &planned, &extra, &opts, bytes, false)?;
        let bytes = bytes + extra.iter().map(|e| e.1.len() as u64).sum::<u64>();
        let first = planned.first().map(|f| f.path.clone()).unwrap_or_default();
        let (feed, drain) = stream::pipeline(
            free,
            target.open,
            stream.names(),
            &opts,
            keep.then_some(since),
        );
        let (files, count) = (planned.len(), tensors.len());
        let (writer, writer_note, direct) = (target.writer, target.note, target.direct);
        let (synced, to) = (opts.fsync, first.clone());
        let writing = Arc::clone(&engine);
        let h = std::thread::Builder::new()
            .name("ferry-ckpt-write".into())
            .spawn(move || {
                let io = drain.run(direct.as_ref().unwrap_or(&writing))?;
                Ok(SaveReport {
                    bytes,
                    tensors: count,
                    files,
                    seconds: t0.elapsed().as_secs_f64(),
                    synced,
                    snapshot_bytes: held,
                    writer,
                    writer_note,
                    io,
                })
            })
            .map_err(spawn_err)?;
        let claims = stream::Claims::alone(stream.windows(half));
        match feed.fill_all(&stream, half, &claims, &copier, &opts, &first) {
            Ok(left) => {
                if keep {
                    kept::keep(left, since);
                }
                Ok(h)
            }
            Err(Stop::Failed(e)) => {
                // The writing side sees the copying side gone and removes its files.
                let _ = h.join();
                Err(e)
            }
            Err(Stop::WriterGone) => match h.join() {
                Ok(Err(e)) => Err(e),
                Ok(Ok(_)) | Err(_) => Err(stream::panicked(&to)),
            },
        }
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
