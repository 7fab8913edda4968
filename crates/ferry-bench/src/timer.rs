//! GPU-side timing of a batch of copies, as nvbandwidth does it: the stream first waits on a
//! latch (`cuStreamWaitValue32` on a flag in mapped host memory), then records a start event;
//! the caller enqueues its copies; then an end event is recorded and the host releases the
//! latch. The copies thus start together, once all are queued, and the events time the GPU's
//! work only: neither the submission of the copies nor the host's wait is in the figure. A
//! watchdog thread opens a latch left closed for [`LATCH_TIMEOUT`] (a call that waited for the
//! stream inside the timed section), and the timing then reports an error instead of hanging.

use crate::error::{check, BaselineError};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use ferry::cuda::MappedBuffer;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Times the work enqueued on one stream between a start and an end event, with the work
/// released together behind a latch, as nvbandwidth does: the stream waits on a flag in mapped
/// host memory (`cuStreamWaitValue32`), records the start event, runs what the caller enqueued,
/// records the end event; the host then opens the latch. A watchdog opens a latch left closed
/// for [`LATCH_TIMEOUT`].
///
/// ```no_run
/// use ferry::cuda::{CudaEngine, Direction, DeviceBuffer, PinnedBuffer};
/// use ferry::EngineExt;
/// use ferry_bench::StreamTimer;
/// let engine = CudaEngine::new(0)?;
/// let timer = StreamTimer::new(0)?;
/// let host = PinnedBuffer::new(1 << 26)?;
/// let mut dev = DeviceBuffer::new(0, 1 << 26)?;
/// let stream = engine.stream(Direction::HostToDevice).clone();
/// engine.scope(|s| -> Result<(), Box<dyn std::error::Error>> {
///     timer.time(&stream, || s.memcpy(&mut dev, &host).map(drop))??;
///     Ok(())
/// })?;
/// println!("{:.1} GB/s", (1u64 << 26) as f64 / timer.seconds()? / 1e9);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct StreamTimer {
    ctx: Arc<CudaContext>,
    latch: Arc<Latch>,
    /// (start, end) events per stream, and how many the last timing used.
    events: Mutex<(Vec<(CudaEvent, CudaEvent)>, usize)>,
}

/// How long the latch may stay closed before the watchdog opens it: a call inside
/// [`StreamTimer::time`] that waited for the stream would otherwise hang for ever.
pub const LATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The flag (in mapped host memory) and the watchdog's view of it.
struct Latch {
    /// Owns the flag's memory for as long as anyone (the watchdog included) may write it.
    mem: MappedBuffer,
    /// The flag's host address, taken once from the exclusively owned buffer.
    ptr: *mut u32,
    /// When the latch was closed, while it is.
    closed_at: Mutex<Option<Instant>>,
    /// The watchdog opened the latch since the last `time`.
    fired: AtomicBool,
}

// SAFETY: the flag is only accessed atomically through `ptr`; the buffer is never lent out.
unsafe impl Send for Latch {}
// SAFETY: as above; shared use only stores and loads the flag atomically.
unsafe impl Sync for Latch {}

impl Latch {
    fn flag(&self) -> &AtomicU32 {
        // SAFETY: `ptr` points into `mem` (64 bytes, page-aligned), owned by `self` and never
        // lent out; the host only accesses it atomically (here) and the GPU only reads it.
        unsafe { AtomicU32::from_ptr(self.ptr) }
    }
    fn close(&self) {
        self.flag().store(0, Ordering::Release);
        *self
            .closed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
    fn open(&self) {
        *self
            .closed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.flag().store(1, Ordering::Release);
    }
}

impl std::fmt::Debug for StreamTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTimer")
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

/// Opens the latch even if the enqueueing closure panics or fails, so that the stream never
/// stays blocked.
struct Release<'a>(&'a Latch);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl StreamTimer {
    /// A timer on device `ordinal`: a flag in mapped host memory, two timing events, and a
    /// watchdog thread that opens a latch left closed for [`LATCH_TIMEOUT`]. Errors: no
    /// driver, no device, allocation, event creation or thread start failures.
    pub fn new(ordinal: u32) -> Result<StreamTimer, BaselineError> {
        let ctx = ferry::bench::context(ordinal)?;
        bind(&ctx)?;
        let mut mem = MappedBuffer::new(64)?;
        let ptr = mem.as_mut_ptr().cast::<u32>();
        let latch = Arc::new(Latch {
            mem,
            ptr,
            closed_at: Mutex::new(None),
            fired: AtomicBool::new(false),
        });
        latch.open();
        let weak = Arc::downgrade(&latch);
        std::thread::Builder::new()
            .name("ferry-latch-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(50));
                let Some(l) = weak.upgrade() else { return };
                let late = l
                    .closed_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_some_and(|t| t.elapsed() > LATCH_TIMEOUT);
                if late {
                    l.fired.store(true, Ordering::Release);
                    l.open();
                }
            })
            .map_err(|e| BaselineError::Thread(e.to_string()))?;
        let t = StreamTimer {
            ctx,
            latch,
            events: Mutex::new((Vec::new(), 0)),
        };
        let pair = (t.event()?, t.event()?);
        t.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .push(pair);
        Ok(t)
    }

    /// Whether the latch works on this driver: one empty timing on a stream of the timer's own
    /// (an engine's stream asked for this would be handed to the caller, and the engine would
    /// then record an event per request on it and issue held copies at once, for the rest of
    /// the process: `CudaEngine::stream`).
    pub fn works(&self) -> bool {
        let Ok(stream) = self.ctx.new_stream() else {
            return false;
        };
        self.time(&stream, || ()).is_ok() && self.seconds().is_ok()
    }

    /// Enqueues on `stream`: a wait for the latch, the start event, whatever `enqueue` puts on
    /// the stream, the end event; then releases the latch and returns `enqueue`'s result
    /// without waiting for the work. Read the time with [`StreamTimer::seconds`].
    ///
    /// `enqueue` must only enqueue work on `stream` (ferry's requests submitted on the
    /// engine's stream for this direction, driver calls on the stream): a call that waits for
    /// the stream to progress would wait forever, since the latch opens only after it
    /// returns (the watchdog opens it after [`LATCH_TIMEOUT`], and `seconds` then fails).
    /// Pageable-memory copies are such calls (the driver may wait for the stream while it
    /// stages them), and so is ferry's staged pageable path (its own threads). Calls that wait
    /// for the whole context (loading a module, e.g. the first SM copy of an engine; freeing
    /// memory) wait for the latch as well, from any thread of the process: make those before,
    /// and time from one thread at a time.
    ///
    /// Errors (outer): the stream wait or an event record failed (nothing is left blocked).
    pub fn time<T>(
        &self,
        stream: &CudaStream,
        enqueue: impl FnOnce() -> T,
    ) -> Result<T, BaselineError> {
        self.time_all(&[stream], enqueue)
    }

    /// As [`StreamTimer::time`] for work on several streams released together (e.g. both
    /// directions at once): each stream waits for the one latch and has its own start and end
    /// events; [`StreamTimer::seconds`] is then from the earliest start to the latest end.
    pub fn time_all<T>(
        &self,
        streams: &[&CudaStream],
        enqueue: impl FnOnce() -> T,
    ) -> Result<T, BaselineError> {
        bind(&self.ctx)?;
        let mut evs = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        evs.1 = 0;
        while evs.0.len() < streams.len() {
            let pair = (self.event()?, self.event()?);
            evs.0.push(pair);
        }
        self.latch.fired.store(false, Ordering::Release);
        self.latch.close();
        let release = Release(&self.latch);
        let addr = self.latch.mem.device_ptr();
        let rec = |e: &CudaEvent, stream: &CudaStream| {
            e.record(stream)
                .map_err(|e| BaselineError::driver("cuEventRecord", e.0))
        };
        for (stream, (start, _)) in streams.iter().zip(&evs.0) {
            // SAFETY: `addr` is the device address of the mapped flag, which outlives the wait
            // (the timer owns it; `release` sets it before this function returns); `stream`
            // is a live stream of this context.
            check("cuStreamWaitValue32", unsafe {
                sys::cuStreamWaitValue32_v2(
                    stream.cu_stream(),
                    addr,
                    1,
                    sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                )
            })?;
            rec(start, stream)?;
        }
        let out = enqueue();
        for (stream, (_, end)) in streams.iter().zip(&evs.0) {
            rec(end, stream)?;
        }
        evs.1 = streams.len();
        drop(release);
        Ok(out)
    }

    fn event(&self) -> Result<CudaEvent, BaselineError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| BaselineError::driver("cuEventCreate", e.0))
    }

    /// Seconds from the earliest start event to the latest end event of the last
    /// [`StreamTimer::time`] or [`StreamTimer::time_all`]; waits for the end events first.
    /// Errors: nothing was timed, an event failed, or the watchdog had to open the latch (a
    /// call inside `time` waited for the stream: the figure would be wrong).
    pub fn seconds(&self) -> Result<f64, BaselineError> {
        self.seconds_of(|_| true)
    }

    /// As [`StreamTimer::seconds`] over the streams (by their index in the last `time_all`)
    /// that `keep` names.
    pub(crate) fn seconds_of(&self, keep: impl Fn(usize) -> bool) -> Result<f64, BaselineError> {
        let evs = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let used: Vec<_> = evs.0[..evs.1]
            .iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(_, e)| e)
            .collect();
        let Some((first, _)) = used.first() else {
            return Err(BaselineError::NothingTimed);
        };
        // Milliseconds from the first stream's start to each event (negative for earlier ones).
        let since = |e: &CudaEvent| {
            first
                .elapsed_ms(e)
                .map_err(|e| BaselineError::driver("cuEventElapsedTime", e.0))
        };
        let (mut lo, mut hi) = (0f32, f32::MIN);
        for (start, end) in used {
            lo = lo.min(since(start)?);
            hi = hi.max(since(end)?);
        }
        if self.latch.fired.load(Ordering::Acquire) {
            return Err(BaselineError::Watchdog);
        }
        Ok(f64::from(hi - lo) / 1e3)
    }
}

/// Makes `ctx` current on this thread.
pub(crate) fn bind(ctx: &CudaContext) -> Result<(), BaselineError> {
    ctx.bind_to_thread()
        .map_err(|e| BaselineError::driver("cuCtxSetCurrent", e.0))
}
