//! Snapshot, then write: [`Checkpoint::snapshot`] copies the tensors out of their memory (a
//! GPU's, on the file engine's CUDA engine, into one pinned host allocation) and returns as
//! soon as the caller may change or free them; [`Checkpoint::save_in_background`] then writes
//! the copy to files on a thread of its own ([`save`](fn@super::save)'s writer: parallel,
//! batched, each file replaced whole) and returns the thread's handle (`is_finished` to poll,
//! `join` to wait: the save's result).

use super::error::CheckpointError;
use super::loaded::{Checkpoint, LoadReport, Tensor};
use super::options::{SaveOptions, SaveTensor};
use super::save::SaveReport;
use super::write::check_tensor;
use super::TensorBuffer;
use crate::engine::cpu::CpuEngine;
use crate::engine::Engine;
use crate::file::FileEngine;
use crate::layout::Layout;
use crate::memory::{MemKind, Region};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Each tensor's place in a snapshot starts at a multiple of this (`O_DIRECT`-friendly).
const SNAP_ALIGN: usize = 4096;

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
        let cpu = CpuEngine::new(engine.config().threads.max(1)).map_err(|e| {
            CheckpointError::BadTensor {
                path: here.to_path_buf(),
                tensor: String::new(),
                msg: format!("no CPU engine for the host copies: {e}"),
            }
        })?;
        let setup = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
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
            by.scope(|s| -> crate::Result<()> {
                Ok(s.copy(&mut buf, &dst, &bytes, &src)?.wait()?)
            })
            .map_err(|e| copy_err(e.to_string()))?;
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
            },
        })
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
