//! Raw driver copies, for baselines: what a user writing the driver calls by hand does, with
//! none of ferry's planning, events or staging. `ferry bench` measures ferry next to these in
//! the same run.
//!
//! Each method enqueues its copies on the copier's own streams and waits for them
//! (`cuStreamSynchronize`) before returning, so the borrows of the buffers outlive the copies
//! and the methods are safe.

use crate::error::{check, BaselineError};
use crate::latency::Events;
use crate::timer::{bind, StreamTimer};
use cudarc::driver::{sys, CudaContext, CudaStream};
use ferry::cuda::strided::SmCopier;
use ferry::cuda::DeviceBuffer;
use ferry::{MemKind, Memory, MemoryMut, Plan, RawBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

/// Raw driver copies on one device, for baselines: each method enqueues its copies on the
/// copier's own streams and synchronizes before returning, so the borrows outlive the copies.
pub struct RawCopier {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) streams: [Arc<CudaStream>; 2],
    /// Inside [`RawCopier::timed`]: the methods leave the synchronize to it.
    defer: AtomicBool,
    /// Inside [`RawCopier::timed`]: the streams the methods used (bit i: stream i).
    used: AtomicU8,
    /// The SM copy kernels, made on first use of [`RawCopier::kernel_copy`].
    sm: OnceLock<Result<SmCopier, String>>,
    /// The events of [`RawCopier::copy_waited`], made on its first use.
    pub(crate) events: OnceLock<Result<Events, sys::CUresult>>,
}

impl std::fmt::Debug for RawCopier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawCopier").finish_non_exhaustive()
    }
}

impl RawCopier {
    /// Two streams of their own on device `ordinal`'s primary context.
    pub fn new(ordinal: u32) -> Result<RawCopier, BaselineError> {
        let ctx = ferry::bench::context(ordinal)?;
        let mk = || {
            ctx.new_stream()
                .map_err(|e| BaselineError::driver("cuStreamCreate", e.0))
        };
        let streams = [mk()?, mk()?];
        Ok(RawCopier {
            ctx,
            streams,
            defer: AtomicBool::new(false),
            used: AtomicU8::new(0),
            sm: OnceLock::new(),
            events: OnceLock::new(),
        })
    }

    pub(crate) fn sync(&self, i: usize) -> Result<(), BaselineError> {
        if self.defer.load(Ordering::Relaxed) {
            self.used.fetch_or(1 << i, Ordering::Relaxed);
            return Ok(());
        }
        // SAFETY: a live stream of this copier.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.streams[i].cu_stream())
        })
    }

    /// Runs `f` (calls of this copier) with its copies released together behind `timer`'s
    /// latch on both of the copier's streams and timed by CUDA events, as nvbandwidth does;
    /// returns the seconds from the earliest start event to the latest end event of the streams
    /// that had copies. Every copy
    /// has finished when it returns. Not for concurrent use of one copier from several threads.
    pub fn timed(
        &self,
        timer: &StreamTimer,
        f: impl FnOnce(&RawCopier) -> Result<(), BaselineError>,
    ) -> Result<f64, BaselineError> {
        self.used.store(0, Ordering::Relaxed);
        self.defer.store(true, Ordering::Relaxed);
        let r = timer.time_all(&[&self.streams[0], &self.streams[1]], || f(self));
        self.defer.store(false, Ordering::Relaxed);
        let used = self.used.load(Ordering::Relaxed);
        let synced = self.sync(0).and(self.sync(1));
        r??;
        synced?;
        // Only the streams that had copies: an idle stream's events mark when its own latch
        // wait ended, which may be before the working stream's (H200 run 19: raw rows of one
        // stream 1.07-1.3x slower than ferry's at 1-16 MiB, timed over both streams).
        timer.seconds_of(|i| used == 0 || used & (1 << i) != 0)
    }

    /// `reps` back-to-back copies of the first `bytes` bytes of `src` into `dst`, each one
    /// driver call (`cuMemcpyHtoDAsync`, `cuMemcpyDtoHAsync`, `cuMemcpyDtoDAsync` or
    /// `cuMemcpyAsync` by the buffers' kinds), then one stream synchronize.
    pub fn copy<D, S>(
        &self,
        dst: &mut D,
        src: &S,
        bytes: usize,
        reps: usize,
    ) -> Result<(), BaselineError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        let d = dst.raw_mut();
        self.copies(std::iter::repeat_n(d, reps), src.raw(), bytes)
    }

    /// One copy of the first `bytes` bytes of `src` into each of `dsts`, all issued back to
    /// back, then one stream synchronize: copies released together.
    pub fn copy_into_each<D, S>(
        &self,
        dsts: &mut [D],
        src: &S,
        bytes: usize,
    ) -> Result<(), BaselineError>
    where
        D: MemoryMut,
        S: Memory + ?Sized,
    {
        let ds: Vec<RawBuf> = dsts.iter_mut().map(|d| d.raw_mut()).collect();
        self.copies(ds.into_iter(), src.raw(), bytes)
    }

    fn copies(
        &self,
        dsts: impl Iterator<Item = RawBuf> + Clone,
        s: RawBuf,
        bytes: usize,
    ) -> Result<(), BaselineError> {
        for d in dsts.clone() {
            fits(bytes, d, s)?;
        }
        bind(&self.ctx)?;
        let st = self.streams[0].cu_stream();
        for d in dsts {
            // SAFETY: both ranges lie inside buffers borrowed by the caller until after the
            // synchronize below.
            if let Err(e) = unsafe { copy_call(st, d, s, bytes) } {
                let _ = self.sync(0);
                return Err(e);
            }
        }
        self.sync(0)
    }

    /// Compiles (NVRTC) and loads [`RawCopier::kernel_copy`]'s kernel now, if not yet: call it
    /// before a [`RawCopier::timed`] section that launches it, as loading a module may wait for
    /// the context's streams, which the section's latch holds.
    pub fn sm_ready(&self) -> Result<(), BaselineError> {
        self.sm_copier().map(drop)
    }

    /// The SM copy kernel's copier, made (compiled and loaded) on first use.
    fn sm_copier(&self) -> Result<&SmCopier, BaselineError> {
        self.sm
            .get_or_init(|| {
                let c = SmCopier::new(Arc::clone(&self.ctx)).map_err(|e| e.to_string())?;
                c.compile().map_err(|e| e.to_string())?;
                Ok(c)
            })
            .as_ref()
            .map_err(|msg| BaselineError::Kernel {
                call: "SM copy kernel setup",
                msg: msg.clone(),
            })
    }

    /// `reps` copies of the first `bytes` bytes of `src` into `dst` by a plain kernel launch
    /// each (the SM copy kernel of `ferry::cuda::strided`, one launch per copy, no engine around
    /// it), then one synchronize: the SM baseline for zero-copy (mapped) memory, as
    /// nvbandwidth's SM copies. Both buffers must be device-accessible (not pageable). The
    /// first call of a copier compiles (NVRTC) and loads the kernel, unless
    /// [`RawCopier::sm_ready`] did.
    pub fn kernel_copy<D, S>(
        &self,
        dst: &mut D,
        src: &S,
        bytes: usize,
        reps: usize,
    ) -> Result<(), BaselineError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        let (d, s) = (dst.raw_mut(), src.raw());
        fits(bytes, d, s)?;
        let sm = self.sm_copier()?;
        bind(&self.ctx)?;
        let plan = Plan::contiguous(0, 0, bytes);
        for _ in 0..reps {
            // SAFETY: `bytes` lie inside both buffers (checked above), borrowed until after the
            // synchronize below; the stream is this copier's, of the buffers' context.
            if let Err(e) = unsafe { sm.copy(&self.streams[0], d.addr, s.addr, &plan) } {
                let _ = self.sync(0);
                return Err(BaselineError::Kernel {
                    call: "SM copy kernel",
                    msg: e.to_string(),
                });
            }
        }
        self.sync(0)
    }

    /// Peer copies as a user writes them: for every `(copier, dst, src)`, `bytes` bytes with
    /// `cuMemcpyPeerAsync` on that copier's stream, `reps` rounds, all issued before any is
    /// waited (so copies on different copiers run at once), then each copier synchronizes.
    /// Peer access is enabled first where the devices allow it, as ferry's engine does.
    pub fn peer_all(
        copies: &mut [(&RawCopier, &mut DeviceBuffer, &DeviceBuffer)],
        bytes: usize,
        reps: usize,
    ) -> Result<(), BaselineError> {
        let mut ends = Vec::with_capacity(copies.len());
        for (c, d, s) in copies.iter_mut() {
            if bytes > d.len() || bytes > s.len() {
                return Err(BaselineError::InvalidArgument(format!(
                    "peer copy of {bytes} bytes between buffers of {} and {} bytes",
                    d.len(),
                    s.len()
                )));
            }
            let (dc, sc) = (
                ferry::bench::context(d.ordinal())?,
                ferry::bench::context(s.ordinal())?,
            );
            bind(&c.ctx)?;
            for other in [&dc, &sc] {
                if other.cu_ctx() != c.ctx.cu_ctx() {
                    // SAFETY: the copier's context is current; `other` is a live primary
                    // context. Already enabled, or not possible (no P2P): the copy still works.
                    let _ = unsafe { sys::cuCtxEnablePeerAccess(other.cu_ctx(), 0) };
                }
            }
            ends.push((d.device_ptr(), dc, s.device_ptr(), sc));
        }
        let mut result = Ok(());
        'rounds: for _ in 0..reps {
            for ((c, _, _), (d, dc, s, sc)) in copies.iter().zip(&ends) {
                bind(&c.ctx)?;
                // SAFETY: both ranges lie inside device buffers borrowed until after the
                // synchronizes below; the contexts are those buffers' devices'.
                let r = check("cuMemcpyPeerAsync", unsafe {
                    sys::cuMemcpyPeerAsync(
                        *d,
                        dc.cu_ctx(),
                        *s,
                        sc.cu_ctx(),
                        bytes,
                        c.streams[0].cu_stream(),
                    )
                });
                if let Err(e) = r {
                    result = Err(e);
                    break 'rounds;
                }
            }
        }
        for (c, _, _) in copies.iter() {
            let _ = bind(&c.ctx);
            let r = c.sync(0);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// `reps` rounds of a host-to-device and a device-to-host copy of `bytes` bytes at once,
    /// on two streams, then both synchronized.
    pub fn bidir<A, B, C, D>(
        &self,
        dev_dst: &mut A,
        host_src: &B,
        host_dst: &mut C,
        dev_src: &D,
        bytes: usize,
        reps: usize,
    ) -> Result<(), BaselineError>
    where
        A: MemoryMut + ?Sized,
        B: Memory + ?Sized,
        C: MemoryMut + ?Sized,
        D: Memory + ?Sized,
    {
        let (a, b, c, d) = (
            dev_dst.raw_mut(),
            host_src.raw(),
            host_dst.raw_mut(),
            dev_src.raw(),
        );
        if [a.len, b.len, c.len, d.len].iter().any(|&l| l < bytes) {
            return Err(BaselineError::InvalidArgument(format!(
                "bidirectional copy of {bytes} bytes: a buffer is shorter"
            )));
        }
        bind(&self.ctx)?;
        let (s0, s1) = (self.streams[0].cu_stream(), self.streams[1].cu_stream());
        for _ in 0..reps {
            // SAFETY: ranges inside buffers borrowed until after the synchronizes below.
            let r = unsafe {
                check(
                    "cuMemcpyHtoDAsync",
                    sys::cuMemcpyHtoDAsync_v2(a.addr, b.addr as *const _, bytes, s0),
                )
                .and_then(|()| {
                    check(
                        "cuMemcpyDtoHAsync",
                        sys::cuMemcpyDtoHAsync_v2(c.addr as *mut _, d.addr, bytes, s1),
                    )
                })
            };
            if let Err(e) = r {
                let _ = (self.sync(0), self.sync(1));
                return Err(e);
            }
        }
        self.sync(0)?;
        self.sync(1)
    }

    /// `reps` times: every run of `plan` with the fewest plain driver calls (one
    /// `cuMemcpy2DAsync` for a pitched plan), then one synchronize.
    pub fn copy_plan<D, S>(
        &self,
        dst: &mut D,
        src: &S,
        plan: &Plan,
        reps: usize,
    ) -> Result<(), BaselineError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        let (d, s) = (dst.raw_mut(), src.raw());
        for _ in 0..reps {
            // SAFETY: both buffers are borrowed until after the synchronize below (on every
            // path); `enqueue_plan` refuses a plan reaching outside them; the stream is this
            // copier's, alive as long as it.
            if let Err(e) = unsafe { ferry::bench::enqueue_plan(&self.streams[0], d, s, plan) } {
                let _ = self.sync(0);
                return Err(e.into());
            }
        }
        self.sync(0)
    }

    /// `reps` times: one `cuMemcpyAsync` per segment `(dst_offset, src_offset, len)`, then one
    /// synchronize. What a user with a list of scattered pieces writes by hand.
    pub fn copy_segments<D, S>(
        &self,
        dst: &mut D,
        src: &S,
        segs: &[(usize, usize, usize)],
        reps: usize,
    ) -> Result<(), BaselineError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        let (d, s) = (dst.raw_mut(), src.raw());
        if segs
            .iter()
            .any(|&(a, b, n)| a.saturating_add(n) > d.len || b.saturating_add(n) > s.len)
        {
            return Err(BaselineError::InvalidArgument(
                "a segment reaches outside its buffer".into(),
            ));
        }
        bind(&self.ctx)?;
        let st = self.streams[0].cu_stream();
        for _ in 0..reps {
            for &(a, b, n) in segs {
                // SAFETY: each segment lies inside both buffers (checked above), borrowed
                // until after the synchronize.
                if let Err(e) = check("cuMemcpyAsync", unsafe {
                    sys::cuMemcpyAsync(d.addr + a as u64, s.addr + b as u64, n, st)
                }) {
                    let _ = self.sync(0);
                    return Err(e);
                }
            }
        }
        self.sync(0)
    }
}

/// Enqueues one copy of `bytes` bytes from `s` to `d` on `st` by the plain call for the
/// buffers' kinds: `cuMemcpyHtoDAsync`, `cuMemcpyDtoHAsync`, `cuMemcpyDtoDAsync`, or
/// `cuMemcpyAsync` (managed memory, host to host).
///
/// # Safety
/// 1. The current context is that of `st`, a live stream, and of any device memory here.
/// 2. `d` and `s` are memory of the kinds they claim, valid for `bytes` bytes until the copy
///    has completed.
pub(crate) unsafe fn copy_call(
    st: sys::CUstream,
    d: RawBuf,
    s: RawBuf,
    bytes: usize,
) -> Result<(), BaselineError> {
    let host = |k: MemKind| k.host_accessible() && k != MemKind::Managed;
    // SAFETY: valid ranges and stream (1, 2); the kinds decide which call reads which address
    // as host or device.
    unsafe {
        match (host(d.kind), host(s.kind)) {
            (false, true) => check(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(d.addr, s.addr as *const _, bytes, st),
            ),
            (true, false) => check(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(d.addr as *mut _, s.addr, bytes, st),
            ),
            (false, false) => check(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(d.addr, s.addr, bytes, st),
            ),
            (true, true) => check(
                "cuMemcpyAsync",
                sys::cuMemcpyAsync(d.addr, s.addr, bytes, st),
            ),
        }
    }
}

/// Refuses a copy of `bytes` bytes that does not fit in both buffers.
pub(crate) fn fits(bytes: usize, d: RawBuf, s: RawBuf) -> Result<(), BaselineError> {
    if bytes > d.len || bytes > s.len {
        return Err(BaselineError::InvalidArgument(format!(
            "copy of {bytes} bytes between buffers of {} and {} bytes",
            d.len, s.len
        )));
    }
    Ok(())
}
