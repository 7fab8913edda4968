//! GPU-side timing of a batch of copies, as nvbandwidth does it: the stream first waits on a
//! latch (`cuStreamWaitValue32` on a flag in mapped host memory), then records a start event;
//! the caller enqueues its copies; then an end event is recorded and the host releases the
//! latch. The copies thus start together, once all are queued, and the events time the GPU's
//! work only: neither the submission of the copies nor the host's wait is in the figure.

use super::driver::{self, check};
use super::memory::MappedBuffer;
use super::CudaError;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Times the work enqueued on one stream between a start and an end event, with the work
/// released together behind a latch. See the [module documentation](self).
///
/// ```no_run
/// use ferry::cuda::{CudaEngine, Direction, DeviceBuffer, PinnedBuffer, StreamTimer};
/// use ferry::EngineExt;
/// let engine = CudaEngine::new(0)?;
/// let timer = StreamTimer::new(0)?;
/// let host = PinnedBuffer::new(1 << 26)?;
/// let mut dev = DeviceBuffer::new(0, 1 << 26)?;
/// let stream = engine.stream(Direction::HostToDevice).clone();
/// engine.scope(|s| timer.time(&stream, || s.memcpy(&mut dev, &host).map(drop)))???;
/// println!("{:.1} GB/s", (1u64 << 26) as f64 / timer.seconds()? / 1e9);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct StreamTimer {
    ctx: Arc<CudaContext>,
    flag: MappedBuffer,
    /// The flag's host address, taken once from the exclusively owned buffer.
    flag_ptr: *mut u32,
    start: CudaEvent,
    end: CudaEvent,
}

// SAFETY: the flag is only accessed atomically through `flag_ptr`; the events and context are
// usable from any thread.
unsafe impl Send for StreamTimer {}
// SAFETY: as above; shared use only stores and loads the flag atomically.
unsafe impl Sync for StreamTimer {}

impl std::fmt::Debug for StreamTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTimer")
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

/// Releases the latch even if the enqueueing closure panics or fails, so that the stream never
/// stays blocked.
struct Release<'a>(&'a AtomicU32);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.store(1, Ordering::Release);
    }
}

impl StreamTimer {
    /// A timer on device `ordinal`: a flag in mapped host memory and two timing events.
    /// Errors: no driver, no device, allocation or event creation failures.
    pub fn new(ordinal: u32) -> Result<StreamTimer, CudaError> {
        let ctx = driver::context(ordinal)?;
        driver::bind(&ctx)?;
        let mut flag = MappedBuffer::new(64)?;
        let flag_ptr = flag.as_mut_ptr().cast::<u32>();
        let ev = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| CudaError::Driver {
                    call: "cuEventCreate",
                    msg: driver::error_string(e.0),
                })
        };
        Ok(StreamTimer {
            start: ev()?,
            end: ev()?,
            ctx,
            flag,
            flag_ptr,
        })
    }

    fn flag(&self) -> &AtomicU32 {
        // SAFETY: `flag_ptr` points into the mapped buffer (64 bytes, page-aligned) that `self`
        // owns and never lends out; the host only accesses it atomically (here) and the GPU
        // only reads it (the stream wait).
        unsafe { AtomicU32::from_ptr(self.flag_ptr) }
    }

    /// Enqueues on `stream`: a wait for the latch, the start event, whatever `enqueue` puts on
    /// the stream, the end event; then releases the latch and returns `enqueue`'s result
    /// without waiting for the work. Read the time with [`StreamTimer::seconds`].
    ///
    /// `enqueue` must only enqueue work on `stream` (ferry's requests submitted on the
    /// engine's stream for this direction, driver calls on the stream): a call that waits for
    /// the stream to progress would wait forever, since the latch opens only after it
    /// returns. Pageable-memory copies are such calls (the driver may wait for the stream
    /// while it stages them), and so is ferry's staged pageable path (its own threads).
    ///
    /// Errors (outer): the stream wait or an event record failed (nothing is left blocked).
    pub fn time<T>(
        &self,
        stream: &CudaStream,
        enqueue: impl FnOnce() -> T,
    ) -> Result<T, CudaError> {
        driver::bind(&self.ctx)?;
        let flag = self.flag();
        flag.store(0, Ordering::Release);
        let release = Release(flag);
        let addr = self.flag.device_ptr();
        // SAFETY: `addr` is the device address of the mapped flag, which outlives the wait
        // (the timer owns it; `release` sets it before this function returns); `stream` is a
        // live stream of this context.
        check("cuStreamWaitValue32", unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.cu_stream(),
                addr,
                1,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        })?;
        let rec = |e: &CudaEvent| {
            e.record(stream).map_err(|e| CudaError::Driver {
                call: "cuEventRecord",
                msg: driver::error_string(e.0),
            })
        };
        rec(&self.start)?;
        let out = enqueue();
        rec(&self.end)?;
        drop(release);
        Ok(out)
    }

    /// Seconds between the start and end events of the last [`StreamTimer::time`]; waits
    /// for the end event first.
    pub fn seconds(&self) -> Result<f64, CudaError> {
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(|e| CudaError::Driver {
                call: "cuEventElapsedTime",
                msg: driver::error_string(e.0),
            })?;
        Ok(f64::from(ms) / 1e3)
    }
}
