//! How an NCCL request is known done: one event per request ([`Event`], made through the CUDA
//! engine's driver layer), as in the CUDA engine, plus what a collective library needs: while a
//! request waits, the communicator's asynchronous error is polled and the request's deadline
//! checked; an error or a deadline passed aborts the communicator (`ncclCommAbort`, which
//! stops its kernels), so a peer that never arrives fails the request instead of hanging it.

use super::comm::{Comm, SPIN_FOR};
use crate::engine::cuda::sys::driver::check;
use crate::engine::cuda::DriverError;
use crate::request::{Completion, RequestError, Slot};
use cudarc::driver::sys;
use std::any::Any;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

/// How often a spinning wait also checks the communicator's error and the deadline.
const CHECK_EVERY: Duration = Duration::from_millis(1);

/// An owned CUDA event recorded after a request's group: timing-free and without
/// `BLOCKING_SYNC` (waits poll it, [`Inner::wait`]).
pub(crate) struct Event {
    raw: sys::CUevent,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; the driver synchronises concurrent use of one event.
unsafe impl Sync for Event {}

impl Event {
    /// A new event; the context must be current.
    pub(crate) fn new() -> Result<Event, DriverError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the caller made a context current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(Event { raw })
    }
    /// The driver's handle, valid while `self` lives.
    pub(crate) fn raw(&self) -> sys::CUevent {
        self.raw
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// The shared part of an NCCL request.
pub(crate) struct Inner {
    event: Event,
    comm: Arc<Comm>,
    what: String,
    timeout: Duration,
    deadline: Instant,
    /// The result and the futures' wakers (waiters poll the event, never sleep on the slot).
    slot: Slot,
}

impl Inner {
    fn query(&self) -> Result<bool, DriverError> {
        // SAFETY: a live event handle, owned by this request.
        match unsafe { sys::cuEventQuery(self.event.raw()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            c => Err(DriverError::new("cuEventQuery", c)),
        }
    }

    /// After an abort the communicator's kernels exit; the request completes only once they
    /// have, so that its buffers are free when the error is seen.
    fn settle_after_abort(&self, err: RequestError) -> Result<(), RequestError> {
        let _ = self.comm.bind();
        // SAFETY: a live event handle.
        let _ = check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.event.raw())
        });
        self.slot.complete(Err(err))
    }

    /// One look: `Some(result)` once complete (or failed), `None` while in flight.
    pub(crate) fn poll(&self) -> Option<Result<(), RequestError>> {
        if let Some(r) = self.slot.get() {
            return Some(r);
        }
        match self.query() {
            Ok(true) => return Some(self.slot.complete(Ok(()))),
            Ok(false) => {}
            Err(e) => return Some(self.slot.complete(Err(e.into()))),
        }
        if let Some(why) = self.comm.aborted() {
            return Some(self.settle_after_abort(RequestError::Aborted(why)));
        }
        if let Err(e) = self.comm.check_async("ncclCommGetAsyncError") {
            self.comm.abort(&e.to_string());
            return Some(
                self.settle_after_abort(RequestError::Backend(crate::request::BackendError::new(
                    e,
                ))),
            );
        }
        if Instant::now() >= self.deadline {
            let what = format!("{} (communicator aborted)", self.what);
            self.comm.abort(&format!(
                "a request timed out after {:?}: {}",
                self.timeout, self.what
            ));
            return Some(self.settle_after_abort(RequestError::Timeout {
                what,
                after: self.timeout,
            }));
        }
        None
    }

    /// Polls until complete: for the first [`SPIN_FOR`] it only yields between looks at the
    /// event (the communicator's error and the deadline are checked every [`CHECK_EVERY`]), so
    /// that copies of a few milliseconds end when the GPU finishes them; then it sleeps in
    /// short steps, so that a long wait (a slow peer) does not keep a core busy.
    pub(crate) fn wait(&self) -> Result<(), RequestError> {
        let start = Instant::now();
        let mut last_check = start;
        loop {
            if let Some(r) = self.slot.get() {
                return r;
            }
            let now = Instant::now();
            let spinning = now - start < SPIN_FOR;
            if !spinning || now - last_check >= CHECK_EVERY {
                last_check = now;
                if let Some(r) = self.poll() {
                    return r;
                }
            } else {
                match self.query() {
                    Ok(true) => return self.slot.complete(Ok(())),
                    Ok(false) => {}
                    Err(e) => return self.slot.complete(Err(e.into())),
                }
            }
            if spinning {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

/// The completion of one NCCL request (a send, a receive, or a group of them).
pub struct NcclCompletion {
    inner: Arc<Inner>,
    waker_tx: Sender<Arc<Inner>>,
}

impl NcclCompletion {
    pub(crate) fn new(
        event: Event,
        comm: Arc<Comm>,
        what: String,
        timeout: Duration,
        waker_tx: Sender<Arc<Inner>>,
    ) -> NcclCompletion {
        NcclCompletion {
            inner: Arc::new(Inner {
                event,
                comm,
                what,
                timeout,
                deadline: Instant::now() + timeout,
                slot: Slot::new(),
            }),
            waker_tx,
        }
    }
}

impl Completion for NcclCompletion {
    fn wait(&self) -> Result<(), RequestError> {
        self.inner.wait()
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        self.inner.poll()
    }
    fn register_waker(&self, waker: &Waker) {
        if self.inner.slot.register_waker(waker)
            && self.waker_tx.send(Arc::clone(&self.inner)).is_err()
        {
            // The waiter thread is gone: wait here rather than never waking.
            let _ = self.inner.wait();
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The event and the communicator outlive the work: a dropped request still completes
        // (or times out) before its event goes.
        if self.slot.get().is_none() {
            let _ = self.wait();
        }
    }
}

/// The engine's waiter thread for futures: waits requests in registration order and wakes
/// their wakers. Ends when every sender is gone.
pub(crate) fn spawn_waiter(name: String) -> std::io::Result<Sender<Arc<Inner>>> {
    crate::request::spawn_waiter(
        name,
        |inner: &Arc<Inner>| {
            let _ = inner.wait();
        },
        |inner, e| {
            let _ = inner.settle_after_abort(e);
        },
    )
}
