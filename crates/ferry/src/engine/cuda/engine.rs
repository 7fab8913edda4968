//! The CUDA engine's public face: making one ([`CudaEngine::with_config`]), its streams and
//! kernels for interop, the [`Engine`] contract (which hands every job to the submission path,
//! `submit.rs`), and its orderly end.

use super::completion;
use super::lanes;
use super::paths;
use super::route;
use super::submit::{Submission, What};
use super::sys::{driver, probe};
use super::{CudaConfig, CudaEngine, CudaError, Direction};
use crate::engine::{Engine, Job, SubmitError};
use crate::memory::{MemKind, RawBuf};
use crate::request::{BarrierError, Request};
use cudarc::driver::{sys as cu, CudaStream};
use std::sync::{Arc, Mutex};

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl CudaEngine {
    /// An engine on device `ordinal` with default settings.
    pub fn new(ordinal: u32) -> Result<CudaEngine, CudaError> {
        CudaEngine::with_config(CudaConfig::new(ordinal))
    }

    /// An engine with the given settings. Errors: [`CudaError::NoDriver`],
    /// [`CudaError::NoDevice`], a failed stream creation.
    pub fn with_config(cfg: CudaConfig) -> Result<CudaEngine, CudaError> {
        let ctx = driver::context(cfg.ordinal)?;
        let paths = paths::Paths::new(
            Arc::clone(&ctx),
            cfg.staging.unwrap_or_default(),
            route::gather_mode(&cfg) == route::Strategy::Dma,
        );
        let issue = paths.held_issue();
        let first = lanes::Lanes::first(&ctx, &issue)?;
        let count = driver::device_count()?;
        let me = ctx.cu_device();
        let can_access = (0..count)
            .map(|j| {
                let Ok(dj) = cudarc::driver::result::device::get(j as i32) else {
                    return false;
                };
                let mut can = 0;
                // SAFETY: valid out-pointer and device handles.
                let r = unsafe { cu::cuDeviceCanAccessPeer(&mut can, me, dj) };
                j != cfg.ordinal && r == cu::CUresult::CUDA_SUCCESS && can != 0
            })
            .collect();
        let rates = completion::wait::Rates::probe(
            me,
            probe::device_info(cfg.ordinal, me).pci_bus_id.as_deref(),
        );
        let waker_tx = completion::event::spawn_waiter(format!("ferry-cuda{}-waiter", cfg.ordinal))
            .map_err(|e| CudaError::Thread(e.to_string()))?;
        Ok(CudaEngine {
            cfg,
            lanes: lanes::Lanes::new(&ctx, (first, issue), cfg.streams, &waker_tx),
            can_access,
            managed_kernels: probe::concurrent_managed_access(me),
            peers: Mutex::new((0..count).map(|_| None).collect()),
            paths,
            rates,
            ctx,
        })
    }

    /// The engine's settings.
    pub fn config(&self) -> CudaConfig {
        self.cfg
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.cfg.ordinal
    }

    /// The stream the calling thread's copies in direction `d` run on (for interop, e.g.
    /// launching kernels ordered with ferry's copies, or timing them with events): the engine
    /// keeps a pool of [`CudaConfig::streams`] streams per direction and each submitting
    /// thread keeps one of them (see [Ordering](crate::engine::cuda#ordering)). Another thread may get
    /// another stream: ask on the thread that submits. From this call on, every request on
    /// that stream records its completion event at submit (the caller's work may follow it on
    /// the stream; see `completion/mark.rs`).
    pub fn stream(&self, d: Direction) -> &Arc<CudaStream> {
        let q = self.lanes.queue(self.lanes.mine(), d);
        q.expose();
        q.stream()
    }

    /// Compiles (NVRTC) and loads this engine's kernels now: the SM copy kernels of
    /// [`KernelCopies`](super::KernelCopies) and the segment-list gather kernel. Otherwise the first copy that needs
    /// one pays for it (2.8-3.1 s on the H200 host in runs 21-22, once per machine with the PTX
    /// cache), which a latency-bound or timed first copy should not. Errors: no NVRTC library, a compile or module-load failure
    /// (the copies then keep to the copy engines and the driver's calls, as without this call).
    ///
    /// ```no_run
    /// let engine = ferry::cuda::CudaEngine::new(0)?;
    /// engine.compile_kernels()?;
    /// # Ok::<(), ferry::cuda::CudaError>(())
    /// ```
    pub fn compile_kernels(&self) -> Result<(), CudaError> {
        self.paths.sm()?;
        let g = self.paths.gatherer()?;
        g.kernel().map(drop).map_err(CudaError::from)
    }

    /// `buf` with its kind as this engine's driver knows it: [`MemKind::Pinned`] where a
    /// [`MemKind::Pageable`] view's whole range is page-locked host memory (allocated pinned or
    /// registered, by ferry or by another library such as PyTorch's `pin_memory`), else `buf`
    /// unchanged. The engine asks this itself before routing a copy where the answer can
    /// change the path; bindings that describe foreign host memory by address (ferry's Python
    /// module) ask it before building a pipeline over it. One driver query
    /// (`cuPointerGetAttributes`, about 0.1-0.2 us on the H200 host); nothing is dereferenced.
    pub fn host_kind(&self, mut buf: RawBuf) -> RawBuf {
        self.refine(&mut buf);
        buf
    }
}

impl Engine for CudaEngine {
    fn name(&self) -> String {
        format!("cuda:{}", self.cfg.ordinal)
    }

    /// Every pair that involves memory a GPU can address: device memory of this GPU or of a
    /// peer it can access, pinned, mapped, managed, and pageable host memory on one side of a
    /// copy; copies between device memory of any two GPUs of the machine (`cuMemcpyPeerAsync`,
    /// which the driver stages where the two have no direct access). Not: pageable to
    /// pageable, fills of pageable memory (the CPU engine does those), fills of a GPU this one
    /// cannot access.
    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
        route::supports(self.cfg.ordinal, &self.can_access, dst, src)
    }

    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees; no caller stream.
        unsafe { self.submit_on(job, None) }
    }

    /// Submitted as `submit_raw` would (the same checks and errors, the same trunk), without
    /// building the job.
    unsafe fn submit_copy(
        &self,
        dst: RawBuf,
        dst_layout: &crate::Layout,
        src: RawBuf,
        src_layout: &crate::Layout,
    ) -> Result<Request, SubmitError> {
        let s = Submission {
            dst,
            src: Some(src),
            what: What::Copy(dst_layout, src_layout),
            after: &[],
            caller: None,
            more: false,
        };
        // SAFETY: forwarded with the caller's guarantees; no caller stream.
        unsafe { self.submit(s) }
    }

    /// One-run copies between this GPU's memory and page-locked host memory (or managed memory) are
    /// held until [`Engine::flush`], then given to the GPU as one list, as a block copy's list:
    /// many small copies between memory of the same two kinds by the gather kernel while the SMs
    /// are free (not under [`CudaConfig::compute_busy`](super::CudaConfig::compute_busy)), the
    /// kernel made and reaching both sides at their addresses, and one of its segment tables free
    /// (the flush never waits for other work); else one batched copy (`cuMemcpyBatchAsync` where
    /// the driver has it and more than one is held; one call per copy otherwise). They are marked
    /// once: one stamp for all (tuned policy) or an event each (plain). A wait, poll, future or
    /// dependent of one of them, or any other submission on the same stream, issues them at once.
    /// Other work starts at once; under the tuned policy the batch's requests record no events and
    /// no stamps at submit (no later submission records one for them until the flush, which stamps
    /// the last): its end is marked once. [`CudaEngine::flush_batches`] counts the batched copies
    /// and the driver's refusals.
    unsafe fn enqueue(&self, job: Job) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees; no caller stream.
        unsafe { self.submit(Submission::of(&job, None, true)) }
    }

    fn flush(&self) {
        self.flush_lane();
    }

    fn barrier(&self) -> Result<(), BarrierError> {
        self.lanes.barrier()
    }

    /// This GPU's device memory.
    fn home(&self) -> Option<MemKind> {
        Some(MemKind::Device {
            ordinal: self.cfg.ordinal,
        })
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        // Staged copies finish on their threads first; held copies go to the driver.
        self.paths.shutdown();
        self.issue_held();
        // Work in flight finishes before the streams go; requests keep their own events.
        if driver::bind(&self.ctx).is_ok() {
            for s in self.lanes.streams() {
                let _ = driver::sync_stream(s);
            }
        }
    }
}

// The backend-neutral errors of the core, as the CUDA engine fills and reads them: its driver
// errors and its own errors travel as `BackendError`s, and `driver_error()` finds the driver
// call behind any of them.

impl From<crate::cuda::DriverError> for crate::request::RequestError {
    fn from(e: crate::cuda::DriverError) -> Self {
        crate::request::RequestError::Backend(crate::request::BackendError::new(e))
    }
}

impl From<crate::cuda::CudaError> for crate::request::RequestError {
    /// A driver failure as the driver's error itself, anything else as the engine's error.
    fn from(e: crate::cuda::CudaError) -> Self {
        match e {
            crate::cuda::CudaError::Driver(d) => d.into(),
            e => crate::request::RequestError::Backend(crate::request::BackendError::new(e)),
        }
    }
}

impl From<crate::cuda::DriverError> for crate::engine::SubmitError {
    fn from(e: crate::cuda::DriverError) -> Self {
        crate::engine::SubmitError::Backend(crate::request::BackendError::new(e))
    }
}

impl From<crate::cuda::CudaError> for crate::engine::SubmitError {
    /// A driver failure as the driver's error itself, anything else as the engine's error.
    fn from(e: crate::cuda::CudaError) -> Self {
        match e {
            crate::cuda::CudaError::Driver(d) => d.into(),
            e => crate::engine::SubmitError::Backend(crate::request::BackendError::new(e)),
        }
    }
}

/// The CUDA driver call behind a backend error, if one is: a [`DriverError`](super::DriverError) itself, or the
/// one a [`CudaError`] keeps.
fn backend_driver_error(b: &crate::request::BackendError) -> Option<crate::cuda::DriverError> {
    if let Some(d) = b.downcast_ref::<crate::cuda::DriverError>() {
        return Some(*d);
    }
    b.downcast_ref::<crate::cuda::CudaError>()
        .and_then(crate::cuda::CudaError::driver_error)
}

impl crate::request::RequestError {
    /// The failed CUDA driver call behind this error (or behind the failed dependency that
    /// stopped it), if one is: match out-of-memory with [`DriverError::is_out_of_memory`](crate::cuda::DriverError::is_out_of_memory).
    pub fn driver_error(&self) -> Option<crate::cuda::DriverError> {
        match self {
            crate::request::RequestError::Backend(b) => backend_driver_error(b),
            crate::request::RequestError::Dependency(e) => e.driver_error(),
            _ => None,
        }
    }
}

impl crate::engine::SubmitError {
    /// The failed CUDA driver call behind this error, if one is.
    pub fn driver_error(&self) -> Option<crate::cuda::DriverError> {
        match self {
            crate::engine::SubmitError::Backend(b) => backend_driver_error(b),
            _ => None,
        }
    }
}
