//! [`FileEngine`]: the engine itself (its state, constructors, files, barrier) and the
//! backend contract it keeps ([`Backend`], its work a [`FileJob`]). How one load or store is
//! validated, decided and queued: `submit.rs`.

use super::config::FileConfig;
use super::cufile::EngineGds;
use super::error::{FileError, IoOp};
use super::exec::Pool;
use super::handle::FileHandle;
use super::io::OpenMode;
use super::ring::Ring;
use super::uring;
use crate::engine::cpu::CpuEngine;
use crate::engine::{Backend, Engine, SubmitError};
use crate::memory::RawBuf;
use crate::request::{BackendError, BarrierError, InFlight, Request};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Moves byte ranges between files and buffers. See the [module documentation](super).
pub struct FileEngine {
    pub(super) cfg: FileConfig,
    pub(super) pool: Pool,
    /// The engine that moves bytes between the bounce ring and memory the workers cannot
    /// address (a GPU's).
    pub(super) mover: Option<Arc<dyn Engine>>,
    pub(super) ring: Mutex<Option<Arc<Ring>>>,
    pub(super) inflight: InFlight,
    pub(super) gds: EngineGds,
    /// The CPU engine that copies host tensors into a checkpoint's snapshot: made on the first
    /// snapshot and kept, so that a training loop's saves reuse its threads.
    pub(super) host: OnceLock<CpuEngine>,
}

/// One load or store as a plain descriptor, the file engine's work as a [`Backend`]: `buf`'s
/// bytes from (`Read`) or to (`Write`) `file` at `offset`.
#[derive(Debug, Clone)]
pub struct FileJob {
    /// The file.
    pub file: FileHandle,
    /// Byte offset in the file.
    pub offset: u64,
    /// The buffer: all of it is read into or written from.
    pub buf: RawBuf,
    /// Load (`Read`: file -> memory) or store (`Write`: memory -> file).
    pub op: IoOp,
}

impl std::fmt::Debug for FileEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileEngine")
            .field("cfg", &self.cfg)
            .field("mover", &self.mover.as_ref().map(|e| e.name()))
            .finish()
    }
}

impl FileEngine {
    /// An engine for host buffers. Errors: [`FileError::BadConfig`], [`FileError::Setup`].
    pub fn new(cfg: FileConfig) -> Result<FileEngine, FileError> {
        cfg.check()?;
        uring::require(cfg.uring)?;
        Ok(FileEngine {
            cfg,
            pool: Pool::start(cfg.threads)?,
            mover: None,
            ring: Mutex::new(None),
            inflight: InFlight::new(),
            gds: Default::default(),
            host: OnceLock::new(),
        })
    }

    /// An engine that also reaches the buffers `engine` reaches from bounce buffers: with a
    /// [`CudaEngine`](crate::cuda::CudaEngine), device memory.
    pub fn with_engine(cfg: FileConfig, engine: Arc<dyn Engine>) -> Result<FileEngine, FileError> {
        let mut e = FileEngine::new(cfg)?;
        e.mover = Some(engine);
        Ok(e)
    }

    /// The engine given to [`FileEngine::with_engine`], if any: what a checkpoint load to
    /// device memory takes its GPU from.
    pub(crate) fn mover(&self) -> Option<&dyn Engine> {
        self.mover.as_deref()
    }

    /// The CPU engine for host-to-host copies beside the file I/O (a checkpoint's snapshot of
    /// host tensors), with this engine's thread count: started on the first call, then the same
    /// one. Errors: the CPU engine's, when it cannot start its threads.
    pub(crate) fn host_copier(&self) -> Result<&CpuEngine, crate::Error> {
        if let Some(cpu) = self.host.get() {
            return Ok(cpu);
        }
        let cpu = CpuEngine::new(self.cfg.threads.max(1))?;
        // Two first calls at once: one engine is kept, the other's threads end with it.
        Ok(self.host.get_or_init(|| cpu))
    }

    /// The engine's settings.
    pub fn config(&self) -> FileConfig {
        self.cfg
    }

    /// Opens `path` for this engine: with `O_DIRECT` too if the config asks for it.
    pub fn open(&self, path: impl AsRef<Path>, mode: OpenMode) -> Result<FileHandle, FileError> {
        FileHandle::open(path, mode, self.cfg.direct)
    }

    /// Bounce buffers this engine holds (0 until the first transfer through the ring, then
    /// [`FileConfig::ring_depth`]).
    pub fn bounce_buffers(&self) -> usize {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |r| r.depth)
    }

    /// Pinned host memory this engine holds, in bytes: its bounce ring's, where its buffers
    /// are pinned (an engine made by [`FileEngine::with_engine`] on a machine with a CUDA
    /// driver); 0 until the first transfer through the ring. The bound on the staging memory
    /// of device transfers: [`FileConfig::ring_depth`] (at most the threads) buffers of
    /// [`FileConfig::chunk_bytes`], each with two alignment pages.
    pub fn pinned_bytes(&self) -> u64 {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|r| r.kind == crate::memory::MemKind::Pinned)
            .map_or(0, |r| r.bytes as u64)
    }

    /// Waits for every transfer submitted so far and reports every failure not already seen
    /// through `wait`/`try_wait`. May block.
    pub fn barrier(&self) -> Result<(), BarrierError> {
        self.inflight.barrier()
    }
}

impl Backend for FileEngine {
    type Work = FileJob;
    fn name(&self) -> String {
        match &self.mover {
            Some(m) => format!("file({}, {})", self.cfg.threads, m.name()),
            None => format!("file({})", self.cfg.threads),
        }
    }
    /// [`FileEngine::load`] or [`FileEngine::store`] of raw memory: the same checks, the same
    /// transfer; its refusal a [`FileError`] in [`SubmitError::Backend`].
    unsafe fn submit_work(&self, work: FileJob) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees (Backend::submit_work's, which are
        // `submit`'s for the job's buffer).
        unsafe { self.submit(&work.file, work.offset, work.buf, work.op) }
            .map(|(req, _)| req)
            .map_err(|e| SubmitError::Backend(BackendError::new(e)))
    }
    fn barrier(&self) -> Result<(), BarrierError> {
        FileEngine::barrier(self)
    }
}

impl Drop for FileEngine {
    fn drop(&mut self) {
        // Queued transfers run to the end (their owners may still wait on them), then the
        // workers stop; the ring is freed after the last runner let go of it.
        self.pool.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_copier_per_engine() {
        let e = FileEngine::new(FileConfig {
            threads: 2,
            ..FileConfig::new()
        })
        .unwrap();
        assert!(e.host.get().is_none(), "started before the first snapshot");
        // First calls from two threads at once: both get the one kept engine.
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| e.host_copier().unwrap() as *const CpuEngine as usize);
            let b = s.spawn(|| e.host_copier().unwrap() as *const CpuEngine as usize);
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!(a, b);
        let later = e.host_copier().unwrap();
        assert_eq!(later as *const CpuEngine as usize, a);
        assert_eq!(later.config().threads, 2);
    }
}
