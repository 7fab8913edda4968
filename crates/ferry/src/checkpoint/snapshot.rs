//! Snapshot, then write: [`snapshot`] copies the tensors out of their memory (a GPU's, on the
//! file engine's CUDA engine, into one pinned host allocation) and returns as soon as the
//! caller may change or free them; [`Snapshot::save_in_background`] then writes the copy to
//! files on a thread of its own ([`save`](super::save)'s writer: parallel, batched, each file
//! replaced whole), and the [`SaveHandle`] it returns is polled or waited for its result.

use super::error::CheckpointError;
use super::save::{save, save_sharded, SaveOptions, SaveReport, SaveTensor};
use super::write::check_tensor;
use super::TensorBuffer;
use crate::engine::cpu::CpuEngine;
use crate::engine::Engine;
use crate::file::FileEngine;
use crate::layout::Layout;
use crate::memory::{MemKind, Region};
use safetensors::Dtype;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Each tensor's place in a snapshot starts at a multiple of this (`O_DIRECT`-friendly).
const SNAP_ALIGN: usize = 4096;

/// The tensors of a save, copied out of their memory into host memory the snapshot owns:
/// made by [`snapshot`], written by [`Snapshot::save`] or [`Snapshot::save_in_background`].
#[derive(Debug)]
pub struct Snapshot {
    buf: TensorBuffer,
    /// Name, dtype, shape, byte range in `buf`.
    tensors: Vec<(String, Dtype, Vec<usize>, std::ops::Range<usize>)>,
    seconds: f64,
}

/// Copies `tensors` into host memory (pinned where the file engine has a GPU's engine and a
/// tensor lives on a GPU, else pageable) and returns once every byte is copied: the caller
/// may then change or free the tensors' memory (a training step goes on) while the snapshot
/// is written. Device tensors are copied on the file engine's engine (at the link's rate),
/// host tensors on CPU threads. Errors: [`CheckpointError::BadTensor`] (bytes that do not
/// match dtype x shape, memory no engine here reaches), [`CheckpointError::Alloc`].
pub fn snapshot(
    engine: &FileEngine,
    tensors: &[SaveTensor<'_>],
) -> Result<Snapshot, CheckpointError> {
    let t0 = Instant::now();
    let here = Path::new("<snapshot>");
    let mut places = Vec::with_capacity(tensors.len());
    let mut total = 0usize;
    let mut on_gpu = false;
    for t in tensors {
        check_tensor(here, t)?;
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
    let mut buf = TensorBuffer::new(kind, total.max(1)).map_err(|msg| CheckpointError::Alloc {
        path: here.to_path_buf(),
        bytes: total as u64,
        target: if gpu.is_some() { "pinned" } else { "pageable" }.into(),
        msg,
    })?;
    let cpu =
        CpuEngine::new(engine.config().threads.max(1)).map_err(|e| CheckpointError::BadTensor {
            path: here.to_path_buf(),
            tensor: String::new(),
            msg: format!("no CPU engine for the host copies: {e}"),
        })?;
    let whole = Layout::bytes(total.max(1)).expect("a non-empty byte layout");
    for (t, place) in tensors.iter().zip(&places) {
        if place.is_empty() {
            continue;
        }
        let by: &dyn Engine = match (t.data.raw().kind, gpu) {
            (MemKind::Device { .. }, Some(g)) => g,
            (MemKind::Device { ordinal }, None) => {
                return Err(CheckpointError::BadTensor {
                    path: here.to_path_buf(),
                    tensor: t.name.to_string(),
                    msg: format!(
                        "it is on cuda:{ordinal}: snapshot it with a file engine made by \
                         FileEngine::with_engine and that GPU's CudaEngine"
                    ),
                })
            }
            _ => &cpu,
        };
        let copy_err = |e: String| CheckpointError::BadTensor {
            path: here.to_path_buf(),
            tensor: t.name.to_string(),
            msg: format!("copying it out failed: {e}"),
        };
        let dst = whole
            .slice(0, place.clone(), 1)
            .map_err(|e| copy_err(e.to_string()))?;
        let src = Layout::bytes(place.len()).map_err(|e| copy_err(e.to_string()))?;
        // As bytes (a typed source's element size would not match the byte layouts).
        let bytes = Region::of(t.data, 0..place.len()).expect("the whole tensor");
        by.scope(|s| -> crate::Result<()> { Ok(s.copy(&mut buf, &dst, &bytes, &src)?.wait()?) })
            .map_err(|e| copy_err(e.to_string()))?;
    }
    Ok(Snapshot {
        buf,
        tensors: tensors
            .iter()
            .zip(places)
            .map(|(t, p)| (t.name.to_string(), t.dtype, t.shape.to_vec(), p))
            .collect(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

impl Snapshot {
    /// Seconds [`snapshot`] took: the caller's stall.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }

    /// Bytes of tensor data it holds.
    pub fn bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.3.len() as u64).sum()
    }

    /// Writes the snapshot to `path` now: a sharded checkpoint when `path` ends in
    /// `.safetensors.index.json` ([`save_sharded`]), else one file ([`save`]).
    pub fn save(
        &self,
        engine: &FileEngine,
        path: impl AsRef<Path>,
        opts: &SaveOptions,
    ) -> Result<SaveReport, CheckpointError> {
        let regions: Vec<Region<'_>> = self
            .tensors
            .iter()
            .map(|t| Region::of(&self.buf, t.3.clone()).expect("a tensor lies in its snapshot"))
            .collect();
        let list: Vec<SaveTensor<'_>> = self
            .tensors
            .iter()
            .zip(&regions)
            .map(|(t, r)| SaveTensor::new(&t.0, t.1, &t.2, r))
            .collect();
        let path = path.as_ref();
        if path.to_string_lossy().ends_with(".safetensors.index.json") {
            save_sharded(engine, path, &list, opts)
        } else {
            save(engine, path, &list, opts)
        }
    }

    /// Writes the snapshot to `path` ([`Snapshot::save`]) on a thread of its own and returns
    /// at once; the [`SaveHandle`] gives the result.
    pub fn save_in_background(
        self,
        engine: Arc<FileEngine>,
        path: impl Into<PathBuf>,
        opts: SaveOptions,
    ) -> SaveHandle {
        let path = path.into();
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let thread = std::thread::Builder::new()
            .name("ferry-ckpt-write".into())
            .spawn(move || {
                let r = self.save(&engine, &path, &opts);
                flag.store(true, Ordering::Release);
                r
            });
        SaveHandle {
            thread: Some(thread),
            done,
        }
    }
}

/// A save running in the background ([`Snapshot::save_in_background`]): polled with
/// [`SaveHandle::is_done`], waited for with [`SaveHandle::wait`]. Dropped unwaited, it waits
/// (the files are complete, or as they were, when the drop returns).
#[derive(Debug)]
pub struct SaveHandle {
    thread: Option<std::io::Result<JoinHandle<Result<SaveReport, CheckpointError>>>>,
    done: Arc<AtomicBool>,
}

impl SaveHandle {
    /// True once the write has ended (well or not).
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire) || matches!(self.thread, Some(Err(_)))
    }

    /// Waits for the write and returns its result.
    pub fn wait(mut self) -> Result<SaveReport, CheckpointError> {
        self.join()
    }

    fn join(&mut self) -> Result<SaveReport, CheckpointError> {
        let fail = |msg: String| CheckpointError::Replace {
            path: PathBuf::new(),
            step: "the background write".into(),
            kind: std::io::ErrorKind::Other,
            msg,
        };
        match self.thread.take() {
            Some(Ok(t)) => t
                .join()
                .unwrap_or_else(|_| Err(fail("its thread panicked".into()))),
            Some(Err(e)) => Err(fail(format!("no thread to write on: {e}"))),
            None => Err(fail("already waited for".into())),
        }
    }
}

impl Drop for SaveHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.join();
        }
    }
}
