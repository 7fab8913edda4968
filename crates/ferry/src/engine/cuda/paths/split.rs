//! Device-to-device copies on one GPU split between a copy engine and the SMs: the first part
//! of the range goes to `cuMemcpyDtoDAsync` (a copy engine), the rest to a copy kernel
//! (compiled once per context with NVRTC) on a second stream, both at once; the request's
//! stream waits for the kernel's part before the request completes.
//!
//! Whether this beats the copy engine alone depends on the GPU (both sides share the same
//! memory bandwidth): it is off by default, [`CudaConfig::d2d_sm_share`](crate::engine::cuda::CudaConfig)
//! turns it on for copies of at least `SPLIT_MIN_BYTES` (`route.rs`), and `ferry bench --test
//! cuda-d2d-split` measures it next to `cuMemcpyDtoDAsync` and the kernel alone.

use crate::engine::cuda::sys::driver::{self, check};
use crate::engine::cuda::sys::program::{self, Made};
use crate::engine::cuda::CudaError;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::{Arc, Mutex, PoisonError};

#[cfg(feature = "bench")]
pub use crate::engine::cuda::route::SPLIT_MIN_BYTES;

const KERNEL_SRC: &str = r#"
typedef unsigned long long u64;
extern "C" __global__ void ferry_sm_copy(unsigned char* d, const unsigned char* s, u64 n) {
    u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    if ((((u64)d | (u64)s) & 15) == 0) {
        u64 nv = n / 16;
        uint4* dv = (uint4*)d;
        const uint4* sv = (const uint4*)s;
        u64 i = tid;
        for (; i + 3 * stride < nv; i += 4 * stride) {
            uint4 a = sv[i], b = sv[i + stride], c = sv[i + 2 * stride], e = sv[i + 3 * stride];
            dv[i] = a; dv[i + stride] = b; dv[i + 2 * stride] = c; dv[i + 3 * stride] = e;
        }
        for (; i < nv; i += stride) dv[i] = sv[i];
        for (u64 j = nv * 16 + tid; j < n; j += stride) d[j] = s[j];
    } else {
        for (u64 j = tid; j < n; j += stride) d[j] = s[j];
    }
}
"#;

const BLOCK: u32 = 512;

/// A contiguous copy kernel for one context (compiled on first use).
pub struct SmCopy {
    ctx: Arc<CudaContext>,
    func: Made<CudaFunction>,
    sms: u32,
}

impl std::fmt::Debug for SmCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmCopy").field("sms", &self.sms).finish()
    }
}

fn drv(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver(crate::engine::cuda::DriverError::from_cudarc(call, e))
}

impl SmCopy {
    /// For `ctx`'s device. Cheap: the kernel is compiled on its first use.
    pub fn new(ctx: Arc<CudaContext>) -> Result<SmCopy, CudaError> {
        driver::bind(&ctx)?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))?
            .max(1) as u32;
        Ok(SmCopy {
            ctx,
            func: Made::new(),
            sms,
        })
    }

    fn kernel(&self) -> Result<CudaFunction, CudaError> {
        self.func
            .get(|| Ok(program::program(&self.ctx, KERNEL_SRC, &["ferry_sm_copy"])?.remove(0)))
            .map_err(CudaError::Kernel)
    }

    /// Enqueues a copy of `n` bytes from `src` to `dst` by the kernel on `stream`.
    ///
    /// # Safety
    /// 1. `dst..dst+n` and `src..src+n` are device memory this context can address, valid
    ///    until the stream has passed the copy; nothing else writes either or reads `dst`
    ///    meanwhile; the ranges do not overlap.
    /// 2. `stream` belongs to this context, which is current.
    pub unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        dst: u64,
        src: u64,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let func = self.kernel()?;
        let blocks = (n as u64)
            .div_ceil(BLOCK as u64 * 16)
            .min(self.sms as u64 * 4) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let n = n as u64;
        let mut launch = stream.launch_builder(&func);
        launch.arg(&dst).arg(&src).arg(&n);
        // SAFETY: the arguments match the kernel's signature (two byte pointers, a count); the
        // ranges are valid device memory (1).
        unsafe { launch.launch(cfg) }.map_err(drv("cuLaunchKernel"))?;
        Ok(())
    }
}

impl SmCopy {
    /// `reps` kernel copies of the first `bytes` bytes of `src` into `dst` on `stream`, then a
    /// synchronize: the kernel alone, as a baseline. Both buffers must be on this device.
    #[cfg(feature = "bench")]
    pub fn copy(
        &self,
        stream: &Arc<CudaStream>,
        dst: &mut crate::engine::cuda::DeviceBuffer,
        src: &crate::engine::cuda::DeviceBuffer,
        bytes: usize,
        reps: usize,
    ) -> Result<(), CudaError> {
        let me = self.ctx.ordinal() as u32;
        if bytes > dst.len() || bytes > src.len() || dst.ordinal() != me || src.ordinal() != me {
            return Err(CudaError::InvalidArgument(format!(
                "SM copy of {bytes} bytes needs two buffers of that size on device {me}"
            )));
        }
        driver::bind(&self.ctx)?;
        for _ in 0..reps {
            // SAFETY: both ranges lie in distinct device buffers of this device (checked),
            // borrowed until after the synchronize below.
            let launched =
                unsafe { self.launch(stream, dst.device_ptr(), src.device_ptr(), bytes) };
            if let Err(e) = launched {
                let _ = driver::sync_stream(stream);
                return Err(e);
            }
        }
        driver::sync_stream(stream).map_err(drv("cuStreamSynchronize"))
    }
}

/// The engine's splitter: the kernel, its stream, and the two events that join it to the
/// request's stream. Serialized by a lock (the events are re-recorded by each split).
pub(crate) struct Splitter {
    sm: SmCopy,
    stream: Arc<CudaStream>,
    events: Mutex<[sys::CUevent; 2]>,
}

// SAFETY: the event handles are used only under the lock; the driver allows any thread.
unsafe impl Send for Splitter {}
// SAFETY: as above.
unsafe impl Sync for Splitter {}

impl Splitter {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Result<Splitter, CudaError> {
        driver::bind(&ctx)?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let mut ev = [std::ptr::null_mut(); 2];
        for e in &mut ev {
            // SAFETY: a valid out-pointer; the context is current.
            check("cuEventCreate", unsafe {
                sys::cuEventCreate(e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            })?;
        }
        Ok(Splitter {
            sm: SmCopy::new(ctx)?,
            stream,
            events: Mutex::new(ev),
        })
    }

    /// Compiles the kernel now (so that a missing NVRTC is found before any split).
    pub(crate) fn ready(&self) -> Result<(), CudaError> {
        self.sm.kernel().map(drop)
    }

    /// Enqueues `n` bytes `src -> dst`: the first `n - sm_bytes` on `stream` (copy engine),
    /// the last `sm_bytes` by the kernel on the splitter's stream, which starts after the work
    /// already on `stream` and which `stream` waits for.
    ///
    /// # Safety
    /// As [`SmCopy::launch`] for the whole range; `stream` belongs to the current context.
    pub(crate) unsafe fn copy(
        &self,
        stream: sys::CUstream,
        dst: u64,
        src: u64,
        n: usize,
        sm_bytes: usize,
    ) -> Result<(), CudaError> {
        let sm_bytes = sm_bytes.min(n);
        let ce = n - sm_bytes;
        let ev = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let side = self.stream.cu_stream();
        // SAFETY: every call gets live events and streams of the current context (the
        // splitter's own, and `stream` by the caller's contract); the ranges are valid by the
        // caller's contract.
        unsafe {
            check("cuEventRecord", sys::cuEventRecord(ev[0], stream))?;
            check("cuStreamWaitEvent", sys::cuStreamWaitEvent(side, ev[0], 0))?;
            self.sm
                .launch(&self.stream, dst + ce as u64, src + ce as u64, sm_bytes)?;
            if ce > 0 {
                check(
                    "cuMemcpyDtoDAsync",
                    sys::cuMemcpyDtoDAsync_v2(dst, src, ce, stream),
                )?;
            }
            check("cuEventRecord", sys::cuEventRecord(ev[1], side))?;
            check(
                "cuStreamWaitEvent",
                sys::cuStreamWaitEvent(stream, ev[1], 0),
            )?;
        }
        Ok(())
    }
}

impl Drop for Splitter {
    fn drop(&mut self) {
        let _ = driver::sync_stream(&self.stream);
        for e in self
            .events
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
        {
            // SAFETY: created by cuEventCreate, destroyed once; no stream uses them any more.
            let _ = unsafe { sys::cuEventDestroy_v2(*e) };
        }
    }
}
