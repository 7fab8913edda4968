//! Several GPUs behind one engine: one [`CudaEngine`] per GPU in a [`MultiplexEngine`], so
//! that a large transfer between host memory and several devices is striped over every GPU's
//! own link at once (each part on the engine of the GPU it touches: see
//! [`Engine::home`]), and peer copies between any two GPUs (peer access
//! is enabled on first use).
//!
//! ```no_run
//! use ferry::cuda::multi::MultiGpu;
//! use ferry::cuda::{DeviceBuffer, PinnedBuffer};
//! let gpus = MultiGpu::all()?;
//! let n = gpus.count() as usize;
//! let mut host = PinnedBuffer::new(n * (256 << 20))?;
//! host.fill(3);
//! let mut parts: Vec<DeviceBuffer> = (0..n as u32)
//!     .map(|g| DeviceBuffer::new(g, 256 << 20))
//!     .collect::<Result<_, _>>()?;
//! gpus.scatter(&mut parts, &host)?; // part g of `host` to GPU g, all links at once
//! gpus.gather(&mut host, &parts)?; // and back
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::CudaConfig;
use super::CudaEngine;
use super::CudaError;
use super::DeviceBuffer;
use crate::engine::multiplex::MultiplexEngine;
use crate::engine::{Engine, EngineExt};
use crate::layout::Layout;
use crate::memory::{Memory, MemoryMut};
use crate::request::WaitOnDrop;

/// One CUDA engine per GPU behind a [`MultiplexEngine`]. See the [module
/// documentation](self).
pub struct MultiGpu {
    mux: MultiplexEngine,
    count: u32,
}

impl std::fmt::Debug for MultiGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGpu")
            .field("gpus", &self.count)
            .finish()
    }
}

impl MultiGpu {
    /// Every GPU of this machine, default settings. Errors: no driver, no GPU, a failed
    /// engine.
    pub fn all() -> Result<MultiGpu, CudaError> {
        MultiGpu::with_configs(CudaConfig::new)
    }

    /// Every GPU, with the settings `cfg(ordinal)` gives each engine.
    pub fn with_configs(cfg: impl Fn(u32) -> CudaConfig) -> Result<MultiGpu, CudaError> {
        let count = super::sys::driver::device_count()?;
        if count == 0 {
            return Err(CudaError::NoDevice { ordinal: 0, count });
        }
        MultiGpu::on((0..count).map(cfg))
    }

    /// The engines given (one per GPU; equal weights). Copies of at least 64 MiB between
    /// memory no engine calls home (host to host) are split across all of them.
    pub fn on(cfgs: impl IntoIterator<Item = CudaConfig>) -> Result<MultiGpu, CudaError> {
        let mut mux = MultiplexEngine::new();
        let mut count = 0;
        for c in cfgs {
            mux = mux.with(CudaEngine::with_config(c)?, 1.0);
            count += 1;
        }
        if count == 0 {
            return Err(CudaError::InvalidArgument("no GPU given".into()));
        }
        Ok(MultiGpu { mux, count })
    }

    /// Number of GPUs.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The multiplex engine (submit anything to it; it routes by locality, then weight).
    pub fn engine(&self) -> &MultiplexEngine {
        &self.mux
    }

    /// Copies consecutive parts of `src` into `dsts` (part `i` is `dsts[i].len()` bytes, right
    /// after part `i - 1`; an empty one copies nothing), every part on its GPU's engine, all at
    /// once; returns when all are done. Errors: `src` shorter than the parts together; a failed
    /// copy (every failure is reported).
    pub fn scatter<S: Memory + ?Sized>(
        &self,
        dsts: &mut [DeviceBuffer],
        src: &S,
    ) -> Result<(), crate::Error> {
        let total: usize = dsts.iter().map(DeviceBuffer::len).sum();
        if total > src.raw().len {
            return Err(crate::Error::InvalidArgument(format!(
                "scatter of {total} bytes from a buffer of {}",
                src.raw().len
            )));
        }
        self.mux.scope(|s| -> Result<(), crate::Error> {
            let mut off = 0;
            for d in dsts.iter_mut().filter(|d| !d.is_empty()) {
                let n = d.len();
                let l = Layout::bytes(n)?;
                // The scope waits for every request.
                drop(s.copy(d, &l, src, &l.with_offset(off)?)?);
                off += n;
            }
            Ok(())
        })
    }

    /// The reverse of [`scatter`](Self::scatter): `srcs[i]` into part `i` of `dst`, all at once
    /// (an empty source copies nothing).
    pub fn gather<D: MemoryMut + ?Sized>(
        &self,
        dst: &mut D,
        srcs: &[DeviceBuffer],
    ) -> Result<(), crate::Error> {
        let total: usize = srcs.iter().map(DeviceBuffer::len).sum();
        let raw = dst.raw_mut();
        if total > raw.len {
            return Err(crate::Error::InvalidArgument(format!(
                "gather of {total} bytes into a buffer of {}",
                raw.len
            )));
        }
        let mut off = 0;
        // Every copy submitted writes `dst`: whatever stops this loop early (a refused submit, a
        // layout error, an unwind) waits for them before the borrow of `dst` ends. A zero-length
        // source once made `Layout::bytes` fail here and the call return while the copies
        // already submitted still wrote `dst`.
        let mut reqs = WaitOnDrop::default();
        for s in srcs.iter().filter(|s| !s.is_empty()) {
            let l = Layout::bytes(s.len())?;
            let job = crate::Job::copy(raw, l.with_offset(off)?, s.raw(), l);
            off += s.len();
            // SAFETY: `dst` is borrowed mutably and `srcs` shared for this whole call, which
            // waits for every request below before returning or unwinding (`reqs`, also on
            // error); the parts of `dst` are disjoint, so no two copies write the same bytes.
            reqs.push(unsafe { self.mux.submit_raw(job) }?);
        }
        let mut first = Ok(());
        for r in reqs.into_vec() {
            if let Err(e) = r.wait() {
                if first.is_ok() {
                    first = Err(e.into());
                }
            }
        }
        first
    }
}
