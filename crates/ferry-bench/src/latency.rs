//! The parts of one small submit+wait (`ferry bench --test cuda-latency-parts`): a raw copy
//! waited in each of the driver's ways ([`RawCopier::copy_waited`]), and ferry's unsafe submit
//! waited at once ([`submit_raw_and_wait`]), next to the safe API's scope that `cuda-latency`
//! times.

use crate::error::{check, BaselineError};
use crate::raw::{copy_call, fits, RawCopier};
use crate::timer::bind;
use cudarc::driver::{sys, CudaEvent, CudaStream};
use ferry::cuda::CudaEngine;
use ferry::{Engine, Job, Layout, Memory, MemoryMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How [`RawCopier::copy_waited`] waits for its copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawWait {
    /// `cuStreamSynchronize`.
    StreamSync,
    /// `cuEventRecord`, then `cuEventSynchronize` of that event.
    EventSync,
    /// As [`RawWait::EventSync`] with 64 events used in turn, as a pool of events cycles
    /// through requests kept alive.
    EventRing,
    /// `cuEventRecord`, then `cuStreamSynchronize`.
    EventThenStreamSync,
    /// `cuEventRecord`, then `cuEventQuery` in a spinning loop.
    EventQuery,
}

/// Events in the ring of [`RawWait::EventRing`].
const RING: usize = 64;

/// The events of [`RawCopier::copy_waited`] (no timing): one, and a ring used in turn.
pub(crate) struct Events {
    one: CudaEvent,
    ring: Vec<CudaEvent>,
    turn: AtomicUsize,
}

impl Events {
    /// Errors: the driver's code of the failed `cuEventCreate`.
    fn new(c: &RawCopier) -> Result<Events, sys::CUresult> {
        let mk = || {
            c.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(|e| e.0)
        };
        Ok(Events {
            one: mk()?,
            ring: (0..RING).map(|_| mk()).collect::<Result<_, _>>()?,
            turn: AtomicUsize::new(0),
        })
    }

    /// Waits for the work enqueued on `st` so far, as `wait` says.
    fn wait(&self, st: sys::CUstream, wait: RawWait) -> Result<(), BaselineError> {
        let ev = match wait {
            RawWait::EventRing => &self.ring[self.turn.fetch_add(1, Ordering::Relaxed) % RING],
            _ => &self.one,
        };
        let stream_sync = || {
            // SAFETY: a live stream of the current context.
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(st)
            })
        };
        if wait == RawWait::StreamSync {
            return stream_sync();
        }
        // SAFETY: a live event and stream of the current context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(ev.cu_event(), st)
        })?;
        match wait {
            RawWait::EventThenStreamSync => stream_sync(),
            RawWait::EventQuery => loop {
                // SAFETY: a live event.
                match unsafe { sys::cuEventQuery(ev.cu_event()) } {
                    sys::CUresult::CUDA_SUCCESS => return Ok(()),
                    sys::CUresult::CUDA_ERROR_NOT_READY => std::hint::spin_loop(),
                    c => return Err(BaselineError::driver("cuEventQuery", c)),
                }
            },
            // SAFETY: a live event.
            _ => check("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(ev.cu_event())
            }),
        }
    }
}

impl RawCopier {
    /// One copy of the first `bytes` bytes of `src` into `dst` (the plain call for the kinds,
    /// as [`RawCopier::copy`]), enqueued on `stream` (the copier's own when `None`; e.g. an
    /// engine's stream, to see what the stream costs), then waited as `wait` says. The first
    /// call makes the copier's events: make it before timing. Not inside
    /// [`RawCopier::timed`].
    pub fn copy_waited<D, S>(
        &self,
        dst: &mut D,
        src: &S,
        bytes: usize,
        stream: Option<&CudaStream>,
        wait: RawWait,
    ) -> Result<(), BaselineError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        let (d, s) = (dst.raw_mut(), src.raw());
        fits(bytes, d, s)?;
        if stream.is_some_and(|st| st.context().cu_ctx() != self.ctx.cu_ctx()) {
            return Err(BaselineError::InvalidArgument(
                "a stream of another context than the copier's".into(),
            ));
        }
        let events = self
            .events
            .get_or_init(|| Events::new(self))
            .as_ref()
            .map_err(|&code| BaselineError::driver("cuEventCreate", code))?;
        let st = stream.map_or(self.streams[0].cu_stream(), |s| s.cu_stream());
        bind(&self.ctx)?;
        // SAFETY: the copier's context is current and `st` is a live stream of it (checked
        // above); both ranges lie inside buffers borrowed until this returns, after the wait
        // below (or the synchronize on its failure).
        unsafe { copy_call(st, d, s, bytes)? };
        let r = events.wait(st, wait);
        if r.is_err() {
            // The borrows end on return: the copy must be over.
            // SAFETY: a live stream of the current context.
            let _ = unsafe { sys::cuStreamSynchronize(st) };
        }
        r
    }
}

/// ferry's unsafe submit of one copy of `src` into `dst` by `layout` (`Engine::submit_raw` of
/// a `Job::copy`), waited at once: the engine's own cost of a small copy without the safe
/// API's scope around it. If the wait fails, waits for every request of `engine` before it
/// returns, so the borrows outlive the copy.
pub fn submit_raw_and_wait<D, S>(
    engine: &CudaEngine,
    dst: &mut D,
    src: &S,
    layout: Layout,
) -> Result<(), ferry::Error>
where
    D: MemoryMut + ?Sized,
    S: Memory + ?Sized,
{
    submit_raw_parts(engine, dst, src, layout).map(drop)
}

/// [`submit_raw_and_wait`], timed in two parts by the host clock: the submit (`submit_raw`
/// until it returns) and the wait (`Request::wait`), in that order.
pub fn submit_raw_parts<D, S>(
    engine: &CudaEngine,
    dst: &mut D,
    src: &S,
    layout: Layout,
) -> Result<(Duration, Duration), ferry::Error>
where
    D: MemoryMut + ?Sized,
    S: Memory + ?Sized,
{
    let job = Job::copy(dst.raw_mut(), layout, src.raw(), layout);
    let t0 = Instant::now();
    // SAFETY: `dst` is borrowed exclusively and `src` shared until this returns, after the
    // request completed (waited below, or the engine's barrier on a failed wait); the engine
    // refuses a layout reaching outside the buffers.
    let req = unsafe { engine.submit_raw(job) }?;
    let t1 = Instant::now();
    req.wait().map_err(|e| {
        let _ = engine.barrier();
        ferry::Error::from(e)
    })?;
    Ok((t1 - t0, t1.elapsed()))
}
