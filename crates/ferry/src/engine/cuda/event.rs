//! One event per request: waiting on a request waits on its event only, never on the stream.

use super::driver::{self, check};
use super::wait::{self, Expect};
use super::{memory::DeviceBuffer, WaitMode};
use crate::engine::cuda::DriverError;
use crate::request::{Completion, RequestError, Slot};
use cudarc::driver::{sys, CudaContext};
use std::any::Any;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;

/// An owned CUDA event handle.
pub(crate) struct Event {
    raw: sys::CUevent,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; the driver synchronises concurrent use of one event.
unsafe impl Sync for Event {}

impl Event {
    /// A timing-free event; with `BLOCKING_SYNC` where the mode sleeps in the driver
    /// (`Blocking`, `SpinThenBlock`), so that a waiting thread sleeps; without it for `Spin` and
    /// `Auto` (which sleeps on its own and spins in the driver only for short requests). The
    /// context must be current.
    pub(crate) fn new(mode: WaitMode) -> Result<Event, DriverError> {
        let mut flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        if matches!(mode, WaitMode::Blocking | WaitMode::SpinThenBlock(_)) {
            flags |= sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the caller made a context current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags)
        })?;
        Ok(Event { raw })
    }
    pub(crate) fn raw(&self) -> sys::CUevent {
        self.raw
    }
}

/// Completed events of one engine, reused by later requests (creating an event costs a driver
/// call per request otherwise).
#[derive(Default)]
pub(crate) struct EventPool {
    free: Mutex<Vec<Event>>,
}

impl EventPool {
    const MAX: usize = 256;
    /// A free event, or a new one (the context must be current).
    pub(crate) fn take(&self, mode: WaitMode) -> Result<Event, DriverError> {
        match self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            Some(e) => Ok(e),
            None => Event::new(mode),
        }
    }
    /// Returns a completed event.
    fn give(&self, e: Event) {
        let mut f = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if f.len() < Self::MAX {
            f.push(e);
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// The shared part of a CUDA request.
pub(crate) struct Inner {
    /// Always `Some` until dropped (then handed back to the pool).
    event: Option<Event>,
    pool: Arc<EventPool>,
    ctx: Arc<CudaContext>,
    mode: WaitMode,
    /// When it was submitted and how long it takes at the least (for [`WaitMode::Auto`]).
    expect: Expect,
    /// The result once known, and the futures' wakers. Waiting threads block in the driver
    /// (`cuEventSynchronize`), not on the slot, so it has no condition variable (and no futex
    /// wake-up is paid per request).
    slot: Slot,
    /// Scratch memory the request's work reads (fill patterns); freed after it completes.
    _keep: Vec<DeviceBuffer>,
}

impl Inner {
    /// Waits for the event (sleeping, or spinning) and records the result.
    pub(crate) fn wait_event(&self, mode: WaitMode) -> Result<(), RequestError> {
        if let Some(r) = self.slot.get() {
            return r;
        }
        let r = match mode {
            // `Blocking` events carry `BLOCKING_SYNC`: the driver sleeps. `Spin` events do not:
            // the driver spins on the event's completion word itself, as `cuStreamSynchronize`
            // does in the default scheduling mode, which notices completion sooner than a loop
            // of `cuEventQuery` calls (each a trip through the driver's locks).
            WaitMode::Blocking | WaitMode::Spin => self.sync(),
            WaitMode::Auto => wait::wait(self.expect, || self.query(), || self.sync()),
            WaitMode::SpinThenBlock(limit) => {
                let start = std::time::Instant::now();
                loop {
                    if let Some(r) = self.query() {
                        break r;
                    }
                    if start.elapsed() >= limit {
                        break self.sync();
                    }
                    std::hint::spin_loop();
                }
            }
        };
        self.slot.complete(r)
    }

    fn raw(&self) -> sys::CUevent {
        self.event.as_ref().map_or(std::ptr::null_mut(), Event::raw)
    }

    /// Blocks in `cuEventSynchronize` (sleeping for events made with `BLOCKING_SYNC`, else
    /// spinning as the context's scheduling flags say).
    fn sync(&self) -> Result<(), RequestError> {
        let _ = driver::bind(&self.ctx);
        // SAFETY: a live event handle.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw())
        })
        .map_err(RequestError::from)
    }

    /// Non-blocking: `None` while the event is pending.
    fn query(&self) -> Option<Result<(), RequestError>> {
        // SAFETY: a live event handle.
        let code = unsafe { sys::cuEventQuery(self.raw()) };
        match code {
            sys::CUresult::CUDA_SUCCESS => Some(Ok(())),
            sys::CUresult::CUDA_ERROR_NOT_READY => None,
            c => Some(Err(DriverError::new("cuEventQuery", c).into())),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Drop synchronizes: the scratch buffers and the event outlive the work.
        let ok = match self.slot.get() {
            Some(r) => r.is_ok(),
            None => self.wait_event(self.mode).is_ok(),
        };
        if let Some(e) = self.event.take() {
            if ok {
                // Complete, so a later record on any stream may reuse it.
                self.pool.give(e);
            }
        }
    }
}

/// The completion of one CUDA request. Recognised by [`super::CudaEngine`] in `Job::after`
/// through [`Completion::as_any`], so that a dependency becomes a `cuStreamWaitEvent`.
pub struct CudaCompletion {
    pub(crate) inner: Arc<Inner>,
    waker_tx: Sender<Arc<Inner>>,
}

impl CudaCompletion {
    pub(crate) fn new(
        event: Event,
        pool: Arc<EventPool>,
        ctx: Arc<CudaContext>,
        (mode, expect): (WaitMode, Expect),
        keep: Vec<DeviceBuffer>,
        waker_tx: Sender<Arc<Inner>>,
    ) -> CudaCompletion {
        CudaCompletion {
            inner: Arc::new(Inner {
                event: Some(event),
                pool,
                ctx,
                mode,
                expect,
                slot: Slot::new(),
                _keep: keep,
            }),
            waker_tx,
        }
    }
    /// The raw event recorded after the request's work.
    pub(crate) fn event(&self) -> sys::CUevent {
        self.inner.raw()
    }
    /// The result, if the request is known to have completed (no driver call).
    pub(crate) fn known(&self) -> Option<Result<(), RequestError>> {
        self.inner.slot.get()
    }
}

impl Completion for CudaCompletion {
    fn wait(&self) -> Result<(), RequestError> {
        self.inner.wait_event(self.inner.mode)
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        if let Some(r) = self.inner.slot.get() {
            return Some(r);
        }
        let r = self.inner.query()?;
        Some(self.inner.slot.complete(r))
    }
    fn register_waker(&self, waker: &Waker) {
        if self.inner.slot.register_waker(waker)
            && self.waker_tx.send(Arc::clone(&self.inner)).is_err()
        {
            // The waiter thread is gone: wait here rather than never waking.
            self.inner.wait_event(self.inner.mode).ok();
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The engine's waiter thread: waits events in the order futures registered them and wakes
/// their wakers. Ends when every sender (the engine and its requests) is gone. It waits as a
/// waiting thread would (the request's own mode: `Auto` sleeps until shortly before the expected
/// end, then polls), so a future wakes as soon as `wait` would return. (It used to wait every
/// request as `Blocking`, paying the 15-150 us wake-up of a `BLOCKING_SYNC` event, and spinning
/// instead on `Spin` events, which carry no `BLOCKING_SYNC`.)
pub(crate) fn spawn_waiter(name: String) -> std::io::Result<Sender<Arc<Inner>>> {
    crate::request::spawn_waiter(name, |inner: &Arc<Inner>| {
        let _ = inner.wait_event(inner.mode);
    })
}
