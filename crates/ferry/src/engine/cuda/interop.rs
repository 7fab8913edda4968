//! Interop with the caller's own CUDA work: ferry's requests and the caller's streams and
//! events ordered on the GPU, with no host round trip where the request has an event.
//!
//! - [`CudaEngine::stream_wait`]: the caller's stream waits for a ferry request
//!   (`cuStreamWaitEvent` on the request's event). The caller's kernels then read what the
//!   copy wrote, in stream order, while the host goes on.
//! - [`CudaEngine::record`] / [`CudaEngine::after_event`]: a request that completes when the
//!   caller's stream reaches the current point (an event ferry records on it), or when the
//!   caller's event completes. Passed as a dependency ([`Job::after`](crate::Job::after),
//!   [`Scope::submit`](crate::Scope::submit)), it makes a ferry copy start only after the
//!   caller's kernel: the engine turns it into a `cuStreamWaitEvent` on its own stream.
//! - [`CudaEngine::on_stream`]: an [`Engine`] whose copies are ordered in the caller's stream
//!   (as PyTorch's copies on the current stream): each starts after the work the stream holds
//!   when it is submitted, and work the caller enqueues afterwards waits for it. Each copy keeps
//!   its own request, event and error.
//!
//! Requests whose completion is signalled by a host thread have no event a stream can wait
//! on: staged copies (pageable host memory of at least 2 MiB to the device, 1 MiB back, see
//! the [engine](super)), requests of other engines (CPU, file), joins. For those
//! [`CudaEngine::stream_wait`] waits on the calling thread until the request completes and
//! then returns [`StreamWait::Host`] (the stream then needs no wait): correct, not
//! asynchronous. ferry does not block a driver thread instead (`cuLaunchHostFunc` with a
//! function that waits for the request): the driver forbids a host function to wait for work
//! that is not ordered before it, which a staged copy's own DMAs are not.
//!
//! Lifetimes: the safe functions take cudarc's [`CudaStream`] and [`CudaEvent`], borrowed
//! only for the call (the driver captures an event's state when it is waited on, so the
//! caller may record it again or destroy it afterwards), or for the life of the
//! [`StreamEngine`]. The raw-handle functions are `unsafe`, with the same rules written out.

use super::completion::event::{Event, Marked};
use super::sys::driver::{self, check};
use super::CudaCompletion;
use super::CudaEngine;
use super::DeviceBuffer;
use super::Direction;
use crate::engine::cuda::DriverError;
use crate::engine::{Engine, Job, Scope, SubmitError};
use crate::layout::Layout;
use crate::memory::MemKind;
use crate::memory::Memory;
use crate::op::Op;
use crate::request::{BarrierError, Request, RequestError};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use thiserror::Error;

/// How [`CudaEngine::stream_wait`] ordered the stream after the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamWait {
    /// On the GPU: the stream waits for the request's event (no host round trip).
    Event,
    /// The request had already completed successfully: nothing to wait for.
    Done,
    /// The request's completion is signalled by a host thread (a staged copy, another engine's
    /// request): the calling thread waited for it.
    Host,
}

/// Why an interop call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum InteropError {
    /// The request waited for had failed: the stream was not made to wait (its later work
    /// would read what the copy did not write).
    #[error("the request failed: {0}")]
    Request(RequestError),
    /// The stream or event belongs to another device's context than the engine.
    #[error("the stream or event is not of device {engine}'s context")]
    WrongContext {
        /// The engine's device.
        engine: u32,
    },
    /// A driver call failed; the driver's own code is kept.
    #[error(transparent)]
    Driver(#[from] DriverError),
}

impl From<InteropError> for SubmitError {
    fn from(e: InteropError) -> Self {
        match e {
            InteropError::Driver(d) => SubmitError::from(d),
            other => SubmitError::from(super::CudaError::InvalidArgument(other.to_string())),
        }
    }
}

impl From<InteropError> for crate::Error {
    fn from(e: InteropError) -> Self {
        match e {
            InteropError::Request(r) => crate::Error::Request(r),
            InteropError::Driver(d) => crate::Error::Submit(SubmitError::from(d)),
            other => crate::Error::Cuda(super::CudaError::InvalidArgument(other.to_string())),
        }
    }
}

impl CudaCompletion {
    /// Makes `stream` wait on the GPU for this request's event (recorded now if the request
    /// had none yet: `completion/mark.rs`); nothing if it is known done.
    ///
    /// # Safety
    /// 1. `stream` is a live stream (or the legacy/per-thread stream handle) of `ctx`, which
    ///    is made current here.
    pub(crate) unsafe fn wait_on(
        &self,
        stream: sys::CUstream,
        ctx: &CudaContext,
    ) -> Result<StreamWait, InteropError> {
        // Marked first: recording a lazy request's event binds the request's own context.
        let mark = self.event_to_wait();
        driver::bind(ctx)?;
        match mark {
            Ok(None) => Ok(StreamWait::Done),
            Err(e) => Err(InteropError::Request(e)),
            Ok(Some(ev)) => {
                // SAFETY: a live stream (1) and a live event, held by `self` for the call; the
                // driver captures the event's last record now, so its later reuse is harmless.
                check("cuStreamWaitEvent", unsafe {
                    sys::cuStreamWaitEvent(stream, ev, 0)
                })?;
                Ok(StreamWait::Event)
            }
        }
    }
}

impl CudaEngine {
    /// Makes the caller's `stream` wait for `req` (a request of any engine), so that work the
    /// caller enqueues on it afterwards sees everything the request wrote. A request of a CUDA
    /// engine with an event: a `cuStreamWaitEvent`, no host round trip ([`StreamWait::Event`]).
    /// A request completed by a host thread (a staged copy of pageable memory, another
    /// engine's request): waits for it here ([`StreamWait::Host`]). May block only then.
    ///
    /// Errors: the request is known to have failed ([`InteropError::Request`]; the stream is
    /// not made to wait), `stream` is of another device ([`InteropError::WrongContext`]), a
    /// driver call failed.
    ///
    /// ```no_run
    /// use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
    /// use ferry::EngineExt;
    /// let engine = CudaEngine::new(0)?;
    /// let compute = engine.context().new_stream()?;
    /// let host = PinnedBuffer::new(1 << 20)?;
    /// let mut dev = DeviceBuffer::new(0, 1 << 20)?;
    /// engine.scope(|s| -> Result<(), ferry::Error> {
    ///     let up = s.memcpy(&mut dev, &host)?;
    ///     engine.stream_wait(&compute, &up)?;
    ///     // ... launch a kernel reading `dev` on `compute` ...
    ///     Ok(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stream_wait(
        &self,
        stream: &CudaStream,
        req: &Request,
    ) -> Result<StreamWait, InteropError> {
        self.same_context(stream.context())?;
        // SAFETY: a live stream of this engine's context, borrowed for the call (1, 2).
        unsafe { self.stream_wait_raw(stream.cu_stream(), req) }
    }

    /// [`CudaEngine::stream_wait`] on a raw stream handle (a stream of another library).
    ///
    /// # Safety
    /// 1. `stream` is a live stream of this engine's device's primary context (the context
    ///    every ferry engine and buffer of the device uses), or a null (legacy default) stream,
    ///    for the duration of the call.
    /// 2. Nothing destroys the stream during the call.
    pub unsafe fn stream_wait_raw(
        &self,
        stream: sys::CUstream,
        req: &Request,
    ) -> Result<StreamWait, InteropError> {
        if let Some(c) = req.completion().as_any().downcast_ref::<CudaCompletion>() {
            // SAFETY: the stream is of this context (1, 2), made current there.
            return unsafe { c.wait_on(stream, &self.ctx) };
        }
        req.completion().wait().map_err(InteropError::Request)?;
        Ok(StreamWait::Host)
    }

    /// A request that completes when the caller's `stream` has finished the work it holds now
    /// (an event of this engine recorded on it). As a dependency of a copy on this engine it is
    /// a `cuStreamWaitEvent` on the GPU: the copy starts after the caller's kernel, the host
    /// does not wait. Its `wait` waits for that point of the stream. The request is not
    /// counted by [`Engine::barrier`] (it is not a copy). Never blocks.
    ///
    /// ```no_run
    /// use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
    /// use ferry::{Engine, EngineExt};
    /// let engine = CudaEngine::new(0)?;
    /// let compute = engine.context().new_stream()?;
    /// let out = DeviceBuffer::new(0, 1 << 20)?;
    /// let mut host = PinnedBuffer::new(1 << 20)?;
    /// // ... a kernel writing `out` enqueued on `compute` ...
    /// let kernel_done = engine.record(&compute)?;
    /// engine.scope(|s| -> ferry::Result<()> {
    ///     let l = ferry::Layout::bytes(1 << 20)?;
    ///     let op = ferry::Op::Copy { dst: l, src: l };
    ///     s.submit(&mut host, Some(&out), op, &[&kernel_done])?.wait()?;
    ///     Ok(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn record(&self, stream: &CudaStream) -> Result<Request, InteropError> {
        self.same_context(stream.context())?;
        // SAFETY: a live stream of this engine's context, borrowed for the call (1, 2).
        unsafe { self.record_raw(stream.cu_stream()) }
    }

    /// [`CudaEngine::record`] on a raw stream handle.
    ///
    /// # Safety
    /// 1. `stream` is a live stream of this engine's device's primary context, or a null
    ///    (legacy default) stream, for the duration of the call.
    /// 2. Nothing destroys the stream during the call (the recorded event needs the stream
    ///    only while it is recorded).
    pub unsafe fn record_raw(&self, stream: sys::CUstream) -> Result<Request, InteropError> {
        driver::bind(&self.ctx)?;
        let ev = self.lane_events().take(self.cfg.wait)?;
        // SAFETY: a live event of this context and a live stream of it (1, 2).
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(ev.raw(), stream)
        })?;
        Ok(Request::from_shared(self.completion(ev)))
    }

    /// A request that completes when the caller's `event` completes (as it was last recorded
    /// before this call): for a copy that must start after a point the caller marked with an
    /// event rather than a stream. ferry makes one of its own marker streams wait for the
    /// event (`cuStreamWaitEvent`) and records its own event there, so the caller may record
    /// `event` again or destroy it as soon as this returns. A marker stream is reused only once
    /// idle, so one far-off event never delays another's marker. Never blocks.
    pub fn after_event(&self, event: &CudaEvent) -> Result<Request, InteropError> {
        // SAFETY: a live event, borrowed for the call (1, 2).
        unsafe { self.after_event_raw(event.cu_event()) }
    }

    /// [`CudaEngine::after_event`] on a raw event handle.
    ///
    /// # Safety
    /// 1. `event` is a live event (of any context of this process) for the duration of the
    ///    call.
    /// 2. Nothing destroys or records it concurrently with the call.
    pub unsafe fn after_event_raw(&self, event: sys::CUevent) -> Result<Request, InteropError> {
        driver::bind(&self.ctx)?;
        let marker = marker_stream(&self.ctx)?;
        // SAFETY: our live marker stream of this context, a live event (1, 2).
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(marker.cu_stream(), event, 0)
        })?;
        // SAFETY: the marker stream is ours and lives in the pool for the process.
        unsafe { self.record_raw(marker.cu_stream()) }
    }

    /// An engine whose copies are ordered in the caller's `stream`: each starts after the work
    /// the stream holds when it is submitted, and the stream's later work starts after it
    /// (see "Where it runs" below). The route (path and copy engine) is decided as for this
    /// engine's own copies; each copy keeps its own request, event and error, and this
    /// engine's barrier counts it. A copy the route stages (pageable host memory of at least
    /// 2 MiB to the device, 1 MiB back) returns from submit only once done: its completion is
    /// signalled by the staging thread, which no stream can wait for.
    ///
    /// Where it runs: a copy whose route is driver calls (`cuMemcpyAsync` and its 2D/3D and
    /// peer forms: every copy between pinned or device memory that no SM kernel serves better)
    /// is enqueued on the caller's stream itself, its dependencies waited for there and its
    /// own event recorded there after it: no extra event, no extra wait. The other routes keep
    /// their own stream: SM-kernel, gather and split routes (their kernels and scratch belong
    /// to the engine's streams) run there after an event recorded on the caller's stream, and
    /// the caller's stream waits for their request (two extra event operations, no host wait);
    /// staged routes as said above. A driver call that fails at submit synchronizes the stream
    /// it ran on (here the caller's) before the error is returned, so that nothing enqueued
    /// still uses the buffers.
    pub fn on_stream<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> Result<StreamEngine<'a>, InteropError> {
        self.same_context(stream.context())?;
        Ok(StreamEngine {
            engine: self,
            stream: stream.cu_stream(),
            _stream: PhantomData,
        })
    }

    /// [`CudaEngine::on_stream`] on a raw stream handle.
    ///
    /// # Safety
    /// 1. `stream` is a live stream of this engine's device's primary context, or a null
    ///    (legacy default) stream.
    /// 2. It stays alive until the returned [`StreamEngine`] is dropped.
    pub unsafe fn on_raw_stream(&self, stream: sys::CUstream) -> StreamEngine<'_> {
        StreamEngine {
            engine: self,
            stream,
            _stream: PhantomData,
        }
    }

    /// The ordering of a copy whose route is not driver calls (SM kernels, gather, split,
    /// staged) around a caller's stream: the submission trunk enqueues it on the engine's
    /// stream (`run`, given its dependencies: `after` and an event recorded on the caller's
    /// stream now), and the caller's stream is made to wait for its request. Nothing is
    /// prepared or routed here: `run` is the trunk's own enqueue of the prepared program.
    ///
    /// # Safety
    /// 1. `stream` is a live stream of this engine's context (or the null stream) until the
    ///    call returns.
    /// 2. `run` is safe to call with the dependencies it is given (the trunk's contract on the
    ///    job's buffers).
    pub(super) unsafe fn around_stream(
        &self,
        stream: sys::CUstream,
        after: &[Request],
        run: impl FnOnce(&[Request]) -> Result<Request, SubmitError>,
    ) -> Result<Request, SubmitError> {
        // SAFETY: a live stream of this context (1).
        let here = unsafe { self.record_raw(stream) }?;
        let deps: Vec<Request> = after.iter().map(Request::share).chain([here]).collect();
        let req = run(&deps)?;
        // SAFETY: as above (1).
        match unsafe { self.stream_wait_raw(stream, &req) } {
            // A failed request: its own error is in `req`; the stream has nothing to wait for
            // (the copy wrote nothing the caller may rely on).
            Ok(_) | Err(InteropError::Request(_)) => {}
            Err(_) => {
                // The stream could not be made to wait: wait here, so that the copy is done
                // before anything the caller enqueues next. Its result stays in `req`.
                let _ = req.completion().wait();
            }
        }
        Ok(req)
    }

    /// The engine's device context, for the caller's own streams, events and kernels
    /// (`engine.context().new_stream()`): the primary context every ferry engine and buffer of
    /// the device shares.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream this engine would run a copy between memory of kinds `dst` and `src` on when
    /// it is not staged (the pipeline times its copies on it).
    pub(crate) fn direction_for(&self, dst: MemKind, src: MemKind) -> Direction {
        super::route::direction(&self.cfg, dst, Some(src))
    }

    /// The event pool of the calling thread's lane (where [`CudaEngine::completion`] returns
    /// the event).
    fn lane_events(&self) -> &super::completion::event::EventPool {
        &self.lane_home().events
    }

    /// The calling thread's lane's [`super::completion::event::Home`].
    fn lane_home(&self) -> &Arc<super::completion::event::Home> {
        &self.lanes.lane(self.lanes.mine()).home
    }

    /// A completion around an event taken from [`CudaEngine::lane_events`].
    fn completion(&self, ev: Event) -> Arc<super::completion::event::Shared> {
        CudaCompletion::new(
            Marked::Event(ev),
            Arc::clone(self.lane_home()),
            (
                self.cfg.wait,
                // Unknown work: no sleep, poll, then nap.
                super::completion::wait::Expect::now(None),
            ),
            Vec::new(),
        )
    }

    fn same_context(&self, ctx: &Arc<CudaContext>) -> Result<(), InteropError> {
        if ctx.cu_ctx() == self.ctx.cu_ctx() {
            Ok(())
        } else {
            Err(InteropError::WrongContext {
                engine: self.cfg.ordinal,
            })
        }
    }
}

/// A marker stream of `ctx` with nothing pending: one of the pool's, else a new one. Streams
/// live for the process (primary contexts do too), one per marker pending at once.
fn marker_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, DriverError> {
    static POOL: OnceLock<Mutex<Vec<Arc<CudaStream>>>> = OnceLock::new();
    let mut pool = POOL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let idle = pool.iter().find(|s| {
        s.context().cu_ctx() == ctx.cu_ctx()
            // SAFETY: a live stream of the pool; the query only reads its state.
            && unsafe { sys::cuStreamQuery(s.cu_stream()) } == sys::CUresult::CUDA_SUCCESS
    });
    if let Some(s) = idle {
        return Ok(Arc::clone(s));
    }
    let s = ctx
        .new_stream()
        .map_err(|e| DriverError::new("cuStreamCreate", e.0))?;
    pool.push(Arc::clone(&s));
    Ok(s)
}

/// A [`CudaEngine`] whose copies are ordered in a caller's stream; see
/// [`CudaEngine::on_stream`].
pub struct StreamEngine<'a> {
    engine: &'a CudaEngine,
    stream: sys::CUstream,
    _stream: PhantomData<&'a CudaStream>,
}

// SAFETY: the stream handle may be used from any thread (driver handles are thread-safe); it
// stays alive for 'a by construction (borrowed, or by `on_raw_stream`'s contract).
unsafe impl Send for StreamEngine<'_> {}
// SAFETY: as above; `&StreamEngine` only submits through the engine, which is Sync.
unsafe impl Sync for StreamEngine<'_> {}

impl std::fmt::Debug for StreamEngine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamEngine")
            .field("engine", &self.engine.name())
            .field("stream", &self.stream)
            .finish()
    }
}

impl StreamEngine<'_> {
    /// The CUDA engine underneath.
    pub fn engine(&self) -> &CudaEngine {
        self.engine
    }
}

impl Engine for StreamEngine<'_> {
    fn name(&self) -> String {
        format!("{}@stream", self.engine.name())
    }

    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
        self.engine.supports(dst, src)
    }

    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees on the buffers; the stream is live
        // and of the engine's context for 'a (construction).
        unsafe { self.engine.submit_on(job, Some(self.stream)) }
    }

    fn barrier(&self) -> Result<(), BarrierError> {
        self.engine.barrier()
    }

    fn home(&self) -> Option<MemKind> {
        self.engine.home()
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Copies `src_layout` of `src` into `dst_layout` of a device buffer the scope only
    /// shares, after the requests `after` (on a [`CudaEngine`]: GPU
    /// waits, e.g. on [`CudaEngine::record`](crate::cuda::CudaEngine::record) of the compute
    /// stream that last read the buffer). For loops that own their schedule (the seed's loop of
    /// a copy stream, a compute stream and events): one device buffer written again and again
    /// within one scope, each write ordered on the GPU, no host wait.
    ///
    /// Why it is safe with a shared borrow: the scope keeps `dst` allocated until every copy
    /// has completed, and device memory is never Rust memory (a [`DeviceBuffer`] has no
    /// `&[u8]` view), so another reader of the same bytes while a copy writes them (a kernel,
    /// a `to_vec`, another copy) reads unspecified bytes but cannot corrupt the program. That
    /// the readers see the bytes of the right copy is the caller's schedule: the stream that
    /// reads waits for the returned request
    /// ([`CudaEngine::stream_wait`](crate::cuda::CudaEngine::stream_wait)), and the next copy
    /// into the buffer waits for the point after the last reader (`after`).
    pub fn copy_to_device<S>(
        &self,
        dst: &'scope DeviceBuffer,
        dst_layout: &Layout,
        src: &'scope S,
        src_layout: &Layout,
        after: &[&Request],
    ) -> Result<Request, SubmitError>
    where
        S: Memory + ?Sized,
    {
        let op = Op::Copy {
            dst: *dst_layout,
            src: *src_layout,
        };
        crate::engine::safe::check_held(src_layout, crate::engine::safe::elem(src))
            .map_err(crate::op::OpError::Src)?;
        let job = Job {
            dst: dst.raw(),
            src: Some(src.raw()),
            op,
            after: after.iter().map(|r| r.share()).collect(),
        };
        // SAFETY: `dst` and `src` are borrowed for 'scope, which ends only after `scope()` has
        // waited for every request tracked here: both stay allocated while the copy runs (1);
        // `src` cannot be written (shared borrow). `dst` is device memory, which no Rust
        // reference can point into: other readers or writers of its bytes during the copy are
        // device-side races on values the caller orders (see above), not host memory shared
        // with Rust code (2).
        let req = unsafe { self.engine().submit_raw(job)? };
        self.track(&req);
        Ok(req)
    }
}
