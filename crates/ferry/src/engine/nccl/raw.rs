//! NCCL's own send/receive, for baselines: a blocking communicator (`ncclCommInitRank`), plain
//! `ncclSend`/`ncclRecv` in a group, then `cuStreamSynchronize`, as a user writing NCCL calls
//! by hand does. No timeouts: use it only where every rank is known to be there.

use super::config::NcclConfig;
use super::engine::no_multicast;
use super::error::NcclError;
use super::id::NcclId;
use super::sys;
use crate::engine::cuda::sys::driver;
use crate::engine::cuda::CudaError;
use crate::memory::{MemKind, Memory, MemoryMut};
use cudarc::driver::{sys as cu, CudaContext, CudaStream};
use std::sync::Arc;

/// A blocking NCCL communicator and its own stream, for baselines. Each call synchronizes
/// before returning, so the borrows outlive the work and the methods are safe.
pub struct RawNccl {
    lib: &'static sys::Lib,
    comm: sys::Comm,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: u32,
    nranks: u32,
}

// SAFETY: the communicator is used only through `&mut self` methods, by one thread at a time.
unsafe impl Send for RawNccl {}

impl std::fmt::Debug for RawNccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawNccl")
            .field("device", &self.ordinal)
            .finish()
    }
}

impl RawNccl {
    /// Rank `rank` of `nranks` on GPU `ordinal` with `ncclCommInitRank` (blocks until every
    /// rank has joined, with no timeout).
    pub fn new(ordinal: u32, rank: u32, nranks: u32, id: NcclId) -> Result<RawNccl, NcclError> {
        NcclConfig::new(ordinal, rank, nranks, id).validate()?;
        no_multicast();
        let lib = sys::lib().map_err(NcclError::NoLibrary)?;
        let ctx = driver::context(ordinal)?;
        driver::bind(&ctx)?;
        let stream = ctx.new_stream().map_err(|e| {
            CudaError::Driver(crate::cuda::DriverError::from_cudarc("cuStreamCreate", e))
        })?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: valid out-pointer; id by value; the device's context is current.
        let r = unsafe { (lib.comm_init_rank)(&mut comm, nranks as i32, id.raw(), rank as i32) };
        if r != sys::SUCCESS {
            return Err(NcclError::nccl("ncclCommInitRank", r, None));
        }
        Ok(RawNccl {
            lib,
            comm,
            ctx,
            stream,
            ordinal,
            nranks,
        })
    }

    /// `reps` groups of { send the first `bytes` of `send.0` to rank `send.1`, receive `bytes`
    /// from rank `recv.1` into `recv.0` } (either may be absent), then one synchronize.
    pub fn exchange<S, R>(
        &mut self,
        send: Option<(&S, u32)>,
        recv: Option<(&mut R, u32)>,
        bytes: usize,
        reps: usize,
    ) -> Result<(), NcclError>
    where
        S: Memory + ?Sized,
        R: MemoryMut + ?Sized,
    {
        let here = MemKind::Device {
            ordinal: self.ordinal,
        };
        let s = send.map(|(b, p)| (b.raw(), p));
        let r = recv.map(|(b, p)| (b.raw_mut(), p));
        for (b, p) in s.iter().chain(r.iter()) {
            if b.kind != here || b.len < bytes || *p >= self.nranks {
                return Err(NcclError::InvalidArgument(format!(
                    "raw NCCL exchange: buffer {b:?} / peer {p} unusable for {bytes} bytes"
                )));
            }
        }
        driver::bind(&self.ctx)?;
        let st = self.stream.cu_stream() as *mut std::ffi::c_void;
        for _ in 0..reps {
            // SAFETY: a live blocking communicator used by this thread only (&mut self);
            // buffers of this device holding `bytes` (checked), borrowed until after the
            // synchronize below; the group is closed on every path.
            let codes = unsafe {
                let a = (self.lib.group_start)();
                let b = s.map_or(sys::SUCCESS, |(b, p)| {
                    (self.lib.send)(
                        b.addr as *const _,
                        bytes,
                        sys::UINT8,
                        p as i32,
                        self.comm,
                        st,
                    )
                });
                let c = r.map_or(sys::SUCCESS, |(b, p)| {
                    (self.lib.recv)(b.addr as *mut _, bytes, sys::UINT8, p as i32, self.comm, st)
                });
                let d = (self.lib.group_end)();
                [
                    ("ncclGroupStart", a),
                    ("ncclSend", b),
                    ("ncclRecv", c),
                    ("ncclGroupEnd", d),
                ]
            };
            if let Some((call, code)) = codes.into_iter().find(|(_, c)| *c != sys::SUCCESS) {
                // SAFETY: our live stream.
                let _ = unsafe { cu::cuStreamSynchronize(self.stream.cu_stream()) };
                return Err(NcclError::nccl(call, code, Some((self.lib, self.comm))));
            }
        }
        // SAFETY: our live stream.
        driver::check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream.cu_stream())
        })?;
        Ok(())
    }
}

impl Drop for RawNccl {
    fn drop(&mut self) {
        let _ = driver::bind(&self.ctx);
        // SAFETY: our live stream; then the communicator, destroyed once.
        unsafe {
            let _ = cu::cuStreamSynchronize(self.stream.cu_stream());
            let _ = (self.lib.comm_destroy)(self.comm);
        }
    }
}
