//! Sends and receives as requests: the plain descriptor ([`P2p`]), then prepare (check every
//! operation, order after the dependencies) -> enqueue (one NCCL group, waited until NCCL has
//! enqueued it) -> complete (one CUDA event recorded after the group, an [`NcclCompletion`]).

use super::completion::{Event, NcclCompletion};
use super::engine::NcclEngine;
use super::error::NcclError;
use super::sys;
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::CudaCompletion;
use crate::memory::{MemKind, RawBuf};
use crate::request::{BarrierError, Request, RequestError};
use cudarc::driver::sys as cu;
use std::sync::Arc;

/// Send or receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pKind {
    /// `ncclSend`: the buffer is read.
    Send,
    /// `ncclRecv`: the buffer is written.
    Recv,
}

/// One send or receive of `bytes` bytes from the start of `buf`, to or from rank `peer`.
/// Plain descriptor for [`NcclEngine::submit_raw`].
#[derive(Debug, Clone, Copy)]
pub struct P2p {
    /// Send or receive.
    pub kind: P2pKind,
    /// The buffer (device memory of the engine's GPU).
    pub buf: RawBuf,
    /// Bytes to move (the peer's matching call must use the same count).
    pub bytes: usize,
    /// The other rank (may be this rank: a send to itself needs the matching receive in the
    /// same group).
    pub peer: u32,
}

impl NcclEngine {
    /// Refuses an operation that cannot be right (a peer outside the communicator, a count
    /// past the buffer, memory not on this rank's GPU, a null address) before NCCL is called.
    fn check(&self, op: &P2p) -> Result<(), NcclError> {
        let bad = |m: String| Err(NcclError::InvalidArgument(m));
        if op.peer >= self.cfg.nranks {
            return bad(format!(
                "peer rank {} is outside the communicator (ranks 0..{})",
                op.peer, self.cfg.nranks
            ));
        }
        if op.bytes > op.buf.len {
            return bad(format!(
                "{:?} of {} bytes from a buffer of {} bytes",
                op.kind, op.bytes, op.buf.len
            ));
        }
        let here = MemKind::Device {
            ordinal: self.cfg.ordinal,
        };
        if op.bytes > 0 && op.buf.kind != here {
            return bad(format!(
                "NCCL buffers must be device memory of GPU {} (this rank's), not {} memory",
                self.cfg.ordinal, op.buf.kind
            ));
        }
        if op.bytes > 0 && op.buf.addr == 0 {
            return bad("null buffer address".into());
        }
        Ok(())
    }

    /// Submits sends and receives as one group (one request), to start after `after`: a CUDA
    /// engine's request becomes a `cuStreamWaitEvent` (no host round trip, e.g. a copy into
    /// the buffer that is then sent), any other request is waited here; a failed dependency
    /// fails this request without starting it. Checks every operation first; nothing is
    /// started when one is refused.
    ///
    /// Which calls block: this call waits (up to the timeout) until NCCL has enqueued the
    /// group; the first exchange with a peer also sets up the connection to it, which needs
    /// the peer to post its side.
    ///
    /// # Safety
    /// 1. Each buffer is valid for reads (`Send`) or writes (`Recv`) of `bytes` bytes, of the
    ///    kind it claims, until the returned request completes.
    /// 2. Nothing else writes a sent buffer, or reads or writes a received one, until then.
    pub unsafe fn submit_raw(&self, ops: &[P2p], after: &[&Request]) -> Result<Request, NcclError> {
        for op in ops {
            self.check(op)?;
        }
        let mut events = Vec::new();
        for dep in after {
            let c = dep.completion();
            let known = match c.as_any().downcast_ref::<CudaCompletion>() {
                // A lazy CUDA request records its event now (`cuda/completion/mark.rs`).
                Some(cc) => cc.event_to_wait().map(|e| events.extend(e)),
                None => c.wait(),
            };
            if let Err(e) = known {
                let req = Request::ready(Err(RequestError::Dependency(Box::new(e))));
                self.inflight.track(&req);
                return Ok(req);
            }
        }
        if ops.is_empty() {
            return Ok(Request::ready(Ok(())));
        }
        let lib = self.comm.lib;
        let mut st = self.comm.lock();
        if let Some(why) = &*st {
            return Err(NcclError::Aborted(why.clone()));
        }
        self.comm.bind()?;
        for e in events {
            // SAFETY: our live stream; a live event held by the dependency's request, which the
            // caller holds until this call returns (the wait is enqueued by then).
            driver::check("cuStreamWaitEvent", unsafe {
                cu::cuStreamWaitEvent(self.stream.cu_stream(), e, 0)
            })?;
        }
        let stream = self.stream.cu_stream() as *mut std::ffi::c_void;
        // SAFETY: no arguments; opens a group closed below on every path.
        let r = unsafe { (lib.group_start)() };
        if r != sys::SUCCESS {
            return Err(NcclError::nccl("ncclGroupStart", r, None));
        }
        let mut first_err = None;
        for op in ops {
            // SAFETY: the communicator is live (not aborted, lock held) and ours; the stream
            // belongs to its device; each buffer holds `bytes` bytes of this device's memory
            // (checked) and stays valid until the request completes (1, 2).
            let (call, r) = unsafe {
                match op.kind {
                    P2pKind::Send => (
                        "ncclSend",
                        (lib.send)(
                            op.buf.addr as *const _,
                            op.bytes,
                            sys::UINT8,
                            op.peer as i32,
                            self.comm.raw,
                            stream,
                        ),
                    ),
                    P2pKind::Recv => (
                        "ncclRecv",
                        (lib.recv)(
                            op.buf.addr as *mut _,
                            op.bytes,
                            sys::UINT8,
                            op.peer as i32,
                            self.comm.raw,
                            stream,
                        ),
                    ),
                }
            };
            if r != sys::SUCCESS && r != sys::IN_PROGRESS && first_err.is_none() {
                first_err = Some(NcclError::nccl(call, r, Some((lib, self.comm.raw))));
            }
        }
        // SAFETY: closes the group opened above.
        let r = unsafe { (lib.group_end)() };
        if let Some(e) = first_err {
            // The group may have enqueued nothing or part; make sure nothing runs on.
            self.comm.wait_ready_locked(
                &mut st,
                "ncclGroupEnd",
                "a failed group to settle",
                self.cfg.timeout,
            )?;
            // SAFETY: our live stream.
            let _ = unsafe { cu::cuStreamSynchronize(self.stream.cu_stream()) };
            return Err(e);
        }
        if r != sys::SUCCESS && r != sys::IN_PROGRESS {
            return Err(NcclError::nccl(
                "ncclGroupEnd",
                r,
                Some((lib, self.comm.raw)),
            ));
        }
        let what = describe(self.cfg.rank, ops);
        self.comm.wait_ready_locked(
            &mut st,
            "ncclGroupEnd",
            &format!("NCCL to enqueue {what}"),
            self.cfg.timeout,
        )?;
        let ev = Event::new()?;
        // SAFETY: a live event and stream of this context.
        if let Err(e) = driver::check("cuEventRecord", unsafe {
            cu::cuEventRecord(ev.raw(), self.stream.cu_stream())
        }) {
            // SAFETY: our live stream; the work must end before the buffers are handed back.
            let _ = unsafe { cu::cuStreamSynchronize(self.stream.cu_stream()) };
            return Err(e.into());
        }
        drop(st);
        let c = NcclCompletion::new(
            ev,
            Arc::clone(&self.comm),
            what,
            self.cfg.timeout,
            self.waker_tx.clone(),
        );
        let req = Request::new(c);
        self.inflight.track(&req);
        Ok(req)
    }
}

/// What a group does, for messages: `send 8 B 0->1, recv 4 B 1->0`.
pub(super) fn describe(rank: u32, ops: &[P2p]) -> String {
    let parts: Vec<String> = ops
        .iter()
        .map(|o| match o.kind {
            P2pKind::Send => format!("send {} B {rank}->{}", o.bytes, o.peer),
            P2pKind::Recv => format!("recv {} B {}->{rank}", o.bytes, o.peer),
        })
        .collect();
    parts.join(", ")
}

impl crate::engine::Backend for NcclEngine {
    /// One group of sends and receives ([`NcclEngine::submit_raw`]'s `ops`), started after the
    /// requests given (its `after`).
    type Work = (Vec<P2p>, Vec<Request>);
    fn name(&self) -> String {
        NcclEngine::name(self)
    }
    /// [`NcclEngine::submit_raw`]; its refusal an [`NcclError`] in
    /// [`SubmitError::Backend`](crate::SubmitError::Backend).
    unsafe fn submit_work(
        &self,
        (ops, after): (Vec<P2p>, Vec<Request>),
    ) -> Result<Request, crate::SubmitError> {
        let after: Vec<&Request> = after.iter().collect();
        // SAFETY: forwarded with the caller's guarantees (Backend::submit_work's, which are
        // `submit_raw`'s for each operation's buffer).
        unsafe { self.submit_raw(&ops, &after) }
            .map_err(|e| crate::SubmitError::Backend(crate::request::BackendError::new(e)))
    }
    fn barrier(&self) -> Result<(), BarrierError> {
        NcclEngine::barrier(self)
    }
}
