//! A communicator handle: NCCL calls on it are serialized (NCCL does not allow one
//! communicator to be used by two threads at once), an abort is remembered, and the handle is
//! finalized and destroyed when its last user goes.

use super::error::NcclError;
use super::sys;
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::DriverError;
use cudarc::driver::CudaContext;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a wait (for the communicator here, for a request in `completion.rs`) only yields
/// between looks before it sleeps in short steps.
pub(crate) const SPIN_FOR: Duration = Duration::from_millis(10);

pub(crate) struct Comm {
    pub(crate) raw: sys::Comm,
    pub(crate) lib: &'static sys::Lib,
    pub(crate) ctx: Arc<CudaContext>,
    /// `Some(why)` once aborted; the lock also serializes every NCCL call on `raw`.
    state: Mutex<Option<String>>,
}

// SAFETY: the handle is used only under `state`'s lock (or in Drop, by the last owner).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Comm {
    pub(crate) fn new(raw: sys::Comm, lib: &'static sys::Lib, ctx: Arc<CudaContext>) -> Comm {
        Comm {
            raw,
            lib,
            ctx,
            state: Mutex::new(None),
        }
    }

    /// The lock that serializes NCCL calls on this communicator.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<String>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn bind(&self) -> Result<(), DriverError> {
        driver::bind(&self.ctx)
    }

    /// Why the communicator was aborted, if it was.
    pub(crate) fn aborted(&self) -> Option<String> {
        self.lock().clone()
    }

    /// `ncclCommGetAsyncError`: `Ok(true)` when ready, `Ok(false)` while in progress, the error
    /// otherwise. The caller holds the lock.
    fn async_state(&self, call: &'static str) -> Result<bool, NcclError> {
        let mut e = sys::SUCCESS;
        // SAFETY: a live communicator (not aborted: callers check under the lock); `e` is a
        // valid out-pointer.
        let r = unsafe { (self.lib.comm_get_async_error)(self.raw, &mut e) };
        if r != sys::SUCCESS {
            return Err(NcclError::nccl("ncclCommGetAsyncError", r, None));
        }
        match e {
            sys::SUCCESS => Ok(true),
            sys::IN_PROGRESS => Ok(false),
            code => Err(NcclError::nccl(call, code, Some((self.lib, self.raw)))),
        }
    }

    /// The asynchronous error, if any (in progress counts as no error).
    pub(crate) fn check_async(&self, call: &'static str) -> Result<(), NcclError> {
        let st = self.lock();
        if let Some(why) = &*st {
            return Err(NcclError::Aborted(why.clone()));
        }
        self.async_state(call).map(drop)
    }

    /// Polls until the communicator leaves the in-progress state, with the lock held. On an
    /// error or when `timeout` passes, aborts it.
    pub(crate) fn wait_ready_locked(
        &self,
        st: &mut Option<String>,
        call: &'static str,
        what: &str,
        timeout: Duration,
    ) -> Result<(), NcclError> {
        let start = Instant::now();
        loop {
            match self.async_state(call) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.abort_locked(st, &e.to_string());
                    return Err(e);
                }
            }
            if start.elapsed() >= timeout {
                let e = NcclError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                };
                self.abort_locked(st, &e.to_string());
                return Err(e);
            }
            // Enqueueing a group takes tens of microseconds: yield at first, then sleep.
            if start.elapsed() < SPIN_FOR {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    }

    fn abort_locked(&self, st: &mut Option<String>, why: &str) {
        if st.is_some() {
            return;
        }
        let _ = self.bind();
        // SAFETY: a live communicator, not aborted before (checked); no other thread uses it
        // (the lock is held).
        let _ = unsafe { (self.lib.comm_abort)(self.raw) };
        *st = Some(why.to_string());
    }

    /// Aborts the communicator (once): its kernels exit, later calls fail with `Aborted`.
    pub(crate) fn abort(&self, why: &str) {
        let mut st = self.lock();
        self.abort_locked(&mut st, why);
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let mut st = self.lock();
        if st.is_some() {
            return; // ncclCommAbort freed it.
        }
        let _ = self.bind();
        // SAFETY: a live communicator; this is its last owner, so no request uses it.
        let r = unsafe { (self.lib.comm_finalize)(self.raw) };
        let ok = (r == sys::SUCCESS || r == sys::IN_PROGRESS)
            && self
                .wait_ready_locked(
                    &mut st,
                    "ncclCommFinalize",
                    "the communicator to finalize",
                    Duration::from_secs(30),
                )
                .is_ok();
        if ok {
            // SAFETY: finalized and unused; destroyed once.
            let _ = unsafe { (self.lib.comm_destroy)(self.raw) };
        } else {
            self.abort_locked(&mut st, "finalize failed");
        }
    }
}
