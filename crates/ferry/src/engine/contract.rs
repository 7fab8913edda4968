//! The contract every backend keeps: [`Engine`] (submit a [`Job`], get a
//! [`Request`]; a barrier), the job descriptor, and why a submit is refused
//! ([`SubmitError`]).

use crate::memory::{MemKind, RawBuf};
use crate::op::{Op, OpError};
use crate::request::{BackendError, BarrierError, Request};
use thiserror::Error;

/// Why a job was refused at submit. Nothing was started; the engine is still usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The job's operator or layouts are invalid for its buffers.
    #[error(transparent)]
    Op(#[from] OpError),
    /// This engine cannot reach memory of these kinds.
    #[error("engine `{engine}` cannot {}", kinds_message(*dst, *src))]
    Unsupported {
        /// The engine.
        engine: String,
        /// Destination kind.
        dst: MemKind,
        /// Source kind (`None` for fills).
        src: Option<MemKind>,
    },
    /// Source and destination share bytes.
    #[error(transparent)]
    Overlap(#[from] crate::plan::PlanError),
    /// A buffer pointer is null.
    #[error("null buffer address")]
    Null,
    /// The engine has been shut down or its workers are gone.
    #[error("engine `{0}` is shut down")]
    ShutDown(String),
    /// The backend failed while submitting: a driver call (the driver's code kept: match
    /// out-of-memory with `driver_error()`, which the CUDA engine adds to this type), or a
    /// helper the engine needed and could not make (a thread, a peer GPU's context). The
    /// backend's own error is kept whole ([`BackendError::downcast_ref`]).
    #[error(transparent)]
    Backend(BackendError),
}

fn kinds_message(dst: MemKind, src: Option<MemKind>) -> String {
    match src {
        Some(src) => format!("copy {src} memory -> {dst} memory"),
        None => format!("fill {dst} memory"),
    }
}

/// One unit of work: an operator over a destination buffer and an optional source buffer,
/// optionally after other requests. Plain descriptor: required fields in [`Job::copy`] /
/// [`Job::fill`] / [`Job::custom`], options as chained setters.
#[derive(Debug)]
pub struct Job {
    /// Destination buffer.
    pub dst: RawBuf,
    /// Source buffer (`None` for fills).
    pub src: Option<RawBuf>,
    /// What to do.
    pub op: Op,
    /// Requests that must complete before this one starts.
    pub after: Vec<Request>,
}

impl Job {
    /// Copy `src_layout` of `src` to `dst_layout` of `dst`.
    pub fn copy(
        dst: RawBuf,
        dst_layout: crate::Layout,
        src: RawBuf,
        src_layout: crate::Layout,
    ) -> Job {
        Job {
            dst,
            src: Some(src),
            op: Op::Copy {
                dst: dst_layout,
                src: src_layout,
            },
            after: Vec::new(),
        }
    }
    /// Fill every element of `layout` in `dst` with `pattern`.
    pub fn fill(dst: RawBuf, layout: crate::Layout, pattern: &[u8]) -> Job {
        Job {
            dst,
            src: None,
            op: Op::Fill {
                dst: layout,
                pattern: pattern.into(),
            },
            after: Vec::new(),
        }
    }
    /// Run a custom operator over `dst` and `src`.
    pub fn custom(
        dst: RawBuf,
        src: Option<RawBuf>,
        op: std::sync::Arc<dyn crate::Operator>,
    ) -> Job {
        Job {
            dst,
            src,
            op: Op::Custom(op),
            after: Vec::new(),
        }
    }
    /// Start only after `req` completes (a failed dependency fails this job).
    pub fn after(mut self, req: &Request) -> Job {
        self.after.push(req.share());
        self
    }
    /// Checks what can be checked without running the operator: null pointers and overlap of
    /// the two buffers' address ranges (ferry does not copy in place).
    pub fn check(&self) -> Result<(), SubmitError> {
        check_bufs(self.dst, self.src)
    }
}

/// [`Engine::submit_memcpy`]'s default, for an engine's own fallback too: the copy between two
/// [`Layout::bytes`](crate::Layout::bytes)`(len)`, through [`Engine::submit_copy`].
///
/// # Safety
/// As [`Engine::submit_raw`], for `dst` and `src`.
pub(crate) unsafe fn memcpy_by_layouts<E: Engine + ?Sized>(
    engine: &E,
    dst: RawBuf,
    src: RawBuf,
    len: usize,
) -> Result<Request, SubmitError> {
    let l = crate::Layout::bytes(len).map_err(|e| SubmitError::Op(e.into()))?;
    // SAFETY: forwarded with the caller's guarantees.
    unsafe { engine.submit_copy(dst, &l, src, &l) }
}

/// [`Job::check`] of a job over these buffers.
pub(crate) fn check_bufs(dst: RawBuf, src: Option<RawBuf>) -> Result<(), SubmitError> {
    if dst.addr == 0 || src.is_some_and(|s| s.addr == 0) {
        return Err(SubmitError::Null);
    }
    if let Some(src) = src {
        let (d, s) = (dst.range(), src.range());
        if d.start < s.end && s.start < d.end && same_space(dst.kind, src.kind) {
            return Err(crate::plan::PlanError::Overlap { dst: d, src: s }.into());
        }
    }
    Ok(())
}

/// Device pointers of different GPUs may coincide numerically without unified addressing;
/// host and device addresses never share bytes through ferry.
fn same_space(a: MemKind, b: MemKind) -> bool {
    a.host_accessible() == b.host_accessible()
}

/// A DMA engine: takes jobs, returns requests. Implemented by every backend.
///
/// Submission has three steps, as the Linux dmaengine's prep / submit / issue_pending: a job is
/// checked, lowered and routed once (prepare), queued (enqueue), and started (flush).
/// [`Engine::submit_raw`] and [`Engine::submit_copy`] do all three; [`Engine::enqueue`] leaves
/// the start to [`Engine::flush`] where the engine can use the knowledge that more follows. A
/// submit may also run the work to its end on the calling thread and return a done request
/// ([`Engine::inline_bytes`]).
///
/// Which calls block: `submit_raw` never waits for the copy (it may wait briefly for a lock or
/// a free staging slot, as documented by each backend, or run a small copy inline); `barrier`
/// blocks until every request submitted before it completed.
pub trait Engine: Send + Sync {
    /// A short human-readable name (`cpu(4)`, `cuda:0`, ...).
    fn name(&self) -> String;

    /// True when this engine can run jobs between memory of these kinds (`src` is `None` for
    /// fills).
    fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool;

    /// Submits a job and returns its request.
    ///
    /// # Safety
    /// 1. `job.dst` (and `job.src`, if any) must describe memory valid for writes (reads) of
    ///    its whole length, of the kind it claims, until the returned request completes.
    /// 2. No other code may read or write the destination bytes, nor write the source bytes,
    ///    until the request completes.
    unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError>;

    /// [`Engine::submit_raw`] of [`Job::copy`]`(dst, dst_layout, src, src_layout)`, the layouts
    /// borrowed: an engine may run a simple copy without building its job (the CUDA engine
    /// submits one contiguous run so: the host work on the path a small copy's caller waits
    /// for, issue 14). The default builds the job and submits it; the result is the same.
    ///
    /// # Safety
    /// As [`Engine::submit_raw`], for `dst` and `src`.
    unsafe fn submit_copy(
        &self,
        dst: RawBuf,
        dst_layout: &crate::Layout,
        src: RawBuf,
        src_layout: &crate::Layout,
    ) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.submit_raw(Job::copy(dst, *dst_layout, src, *src_layout)) }
    }

    /// [`Engine::submit_copy`] of the first `len` bytes of `src` to the start of `dst` (the
    /// scoped and owned `memcpy`s): an engine may run it without the two layouts (the CPU
    /// engine copies a small one here, issue 32). The default copies between two
    /// [`Layout::bytes`](crate::Layout::bytes)`(len)`; the result is the same, errors included.
    ///
    /// # Safety
    /// As [`Engine::submit_raw`], for `dst` and `src`.
    unsafe fn submit_memcpy(
        &self,
        dst: RawBuf,
        src: RawBuf,
        len: usize,
    ) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { memcpy_by_layouts(self, dst, src, len) }
    }

    /// [`Engine::submit_raw`] of a job that more work follows: prepared and queued as
    /// `submit_raw`'s, its start (or the marking of its end) possibly held until the calling
    /// thread's next [`Engine::flush`] (the Linux dmaengine's `tx_submit` before
    /// `issue_pending`). For a batch: `enqueue` N jobs, then `flush` once, rather than leaving
    /// the engine to guess from its submissions whether more follow. The request is a request
    /// like any: waiting on it, polling it or depending on it never hangs for want of a flush
    /// (a wait before the flush may return later than the job's own end, never earlier).
    /// Default: `submit_raw` (an engine that starts everything at once has nothing to hold).
    ///
    /// # Safety
    /// As [`Engine::submit_raw`].
    unsafe fn enqueue(&self, job: Job) -> Result<Request, SubmitError> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { self.submit_raw(job) }
    }

    /// Issues what the calling thread [enqueued](Engine::enqueue) (the dmaengine's
    /// `issue_pending`): the engine's usual rules hold again for its next submissions. Never
    /// waits for the work to run, only, where a backend's queue is full behind work that has
    /// not run, for room in it (the [CUDA engine's](crate::engine::cuda) streams). Default:
    /// nothing (nothing is held).
    fn flush(&self) {}

    /// Copies without dependencies of at most this many bytes, between memory this engine
    /// supports, complete inside [`Engine::submit_copy`] and `submit_raw`, on the calling
    /// thread: the request comes back done. The CPU engine runs small copies so
    /// ([`CpuConfig::inline_bytes`](super::cpu::CpuConfig::inline_bytes), issue 32). The safe
    /// API's owned copies read it to keep such a copy's buffers where they are (nothing
    /// allocated, shared or tracked); a copy that comes back pending anyway is waited before
    /// they move. Default: 0 (none).
    fn inline_bytes(&self) -> usize {
        0
    }

    /// Waits for every request submitted so far and reports every failure not already seen
    /// through `wait`/`try_wait`, not just the first. May block.
    fn barrier(&self) -> Result<(), BarrierError>;

    /// The memory this engine sits next to (a CUDA engine: its GPU's device memory), if any.
    /// [`MultiplexEngine`](super::multiplex::MultiplexEngine) sends a copy that touches that memory to
    /// this engine rather than to one that reaches it from afar (a peer GPU's engine), so that
    /// copies to several GPUs run on each GPU's own link.
    fn home(&self) -> Option<MemKind> {
        None
    }
}

/// Engines behind a pointer are engines: every call forwarded to the pointee.
macro_rules! forward_engine {
    ($($ptr:ident)::+) => {
        impl<E: Engine + ?Sized> Engine for $($ptr)::+<E> {
            fn name(&self) -> String {
                (**self).name()
            }
            fn supports(&self, dst: MemKind, src: Option<MemKind>) -> bool {
                (**self).supports(dst, src)
            }
            unsafe fn submit_raw(&self, job: Job) -> Result<Request, SubmitError> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).submit_raw(job) }
            }
            unsafe fn submit_copy(
                &self,
                dst: RawBuf,
                dst_layout: &crate::Layout,
                src: RawBuf,
                src_layout: &crate::Layout,
            ) -> Result<Request, SubmitError> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).submit_copy(dst, dst_layout, src, src_layout) }
            }
            unsafe fn submit_memcpy(
                &self,
                dst: RawBuf,
                src: RawBuf,
                len: usize,
            ) -> Result<Request, SubmitError> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).submit_memcpy(dst, src, len) }
            }
            unsafe fn enqueue(&self, job: Job) -> Result<Request, SubmitError> {
                // SAFETY: forwarded with the caller's guarantees.
                unsafe { (**self).enqueue(job) }
            }
            fn flush(&self) {
                (**self).flush()
            }
            fn inline_bytes(&self) -> usize {
                (**self).inline_bytes()
            }
            fn barrier(&self) -> Result<(), BarrierError> {
                (**self).barrier()
            }
            fn home(&self) -> Option<MemKind> {
                (**self).home()
            }
        }
    };
}

forward_engine!(std::sync::Arc);
forward_engine!(Box);

/// The sibling of [`Engine`] for the backends whose work is not a [`Job`]: the same contract
/// (work in, a [`Request`] out, waited, polled, awaited and depended on as any engine's; a
/// flush; a barrier; refusals as [`SubmitError`]s), over their own descriptor.
///
/// An [`Engine`] moves memory to memory, its work a [`Job`]. The other two backends move what
/// a `Job` cannot describe: the file engine
/// ([`FileEngine`](crate::file::FileEngine), work: a [`FileJob`](crate::file::FileJob), a file
/// range and a buffer) and the NCCL engine ([`NcclEngine`](crate::engine::nccl::NcclEngine), work: a
/// group of sends and receives with the requests it starts after). Files stay a backend of
/// their own rather than a memory kind (NIXL's choice): a file range is not addressable, and a
/// [`Job`]'s buffers are, through every engine's checks and layouts; the file engine reaches
/// the memory it cannot address itself through an `Engine`. Refusals are [`SubmitError`]s
/// for every backend (the file and NCCL engines' own errors kept whole in
/// [`SubmitError::Backend`]).
///
/// Engines do not implement it (their [`Engine`] methods of the same names would make every
/// call ambiguous where both traits are imported); its methods are theirs, over a `Job`.
pub trait Backend: Send + Sync {
    /// What one submission describes.
    type Work;

    /// A short human-readable name.
    fn name(&self) -> String;

    /// Submits `work` and returns its request.
    ///
    /// # Safety
    /// The buffers `work` names are valid for the reads and writes it does, of the kinds they
    /// claim, and touched by nothing else, until the request completes (as
    /// [`Engine::submit_raw`] for a [`Job`]).
    unsafe fn submit_work(&self, work: Self::Work) -> Result<Request, SubmitError>;

    /// Issues what the calling thread queued with more work said to follow ([`Engine::flush`]).
    fn flush(&self) {}

    /// Waits for every request submitted so far and reports every failure not already seen.
    fn barrier(&self) -> Result<(), BarrierError>;
}
