//! The engine's fast paths beyond the plain driver copies of `exec`: copies between pageable
//! host memory and the device go through the staged pinned ring ([`super::paths::staged`]) on one
//! background thread per direction, and long segment lists go through the gatherer
//! ([`super::paths::gather`]: an SM kernel, the driver's batched copy, or one call per segment, by
//! measurement), and short-run strided plans go to the SM copier ([`super::paths::strided`]). All are
//! created on first use.

pub(crate) mod batch;
pub(crate) mod calls;
pub mod gather;
pub mod split;
pub mod staged;
pub mod strided;
pub(crate) mod transpose;

use super::completion::mark::{BatchCopy, Issue, Issued};
use super::CudaError;
use crate::engine::SubmitError;
use crate::memory::MemKind;
use crate::op::Step;
use crate::plan::Plan;
use crate::request::{Request, RequestError, Signal};
use calls::End;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};
use gather::{Gatherer, List, Segment, Strategy};
use split::Splitter;
use staged::{Stager, StagingConfig};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use strided::SmCopier;

/// What a staged job moves.
pub(crate) enum StagedWork {
    /// The program's copy plans, one after the other.
    Plans(Vec<Plan>),
    /// One segment list (`segs[range]`) between buffers of these lengths.
    Segments {
        segs: Arc<[Segment]>,
        range: std::ops::Range<usize>,
        dst_len: usize,
        src_len: usize,
    },
}

/// One staged job, run on the direction's staging thread. It is `Send` by its fields (no
/// `unsafe impl`, so that a field that is not makes this fail to compile): the buffers are
/// plain addresses, which `Engine::submit_raw`'s contract keeps valid and unshared until the
/// request (completed by the staging thread through `signal`) completes.
pub(crate) struct StagedTask {
    pub dir: staged::Direction,
    pub stream: Arc<CudaStream>,
    /// The stream is in use by this job until it is dropped (requests submitted on it
    /// meanwhile record their events at submit: `completion/mark.rs`).
    pub _foreign: super::completion::mark::Foreign,
    pub dst: u64,
    pub src: u64,
    pub work: StagedWork,
    pub after: Vec<Request>,
    pub signal: Arc<Signal>,
}

type Worker = (Sender<StagedTask>, JoinHandle<()>);
type Cell<T> = Arc<OnceLock<Result<T, CudaError>>>;

pub(crate) struct Paths {
    ctx: Arc<CudaContext>,
    staging: StagingConfig,
    stager: Cell<Stager>,
    gatherer: Cell<Gatherer>,
    /// The gatherer leaves the SMs to the caller's kernels (`CudaConfig::compute_busy`).
    leave_sms: bool,
    sm: OnceLock<Result<SmCopier, CudaError>>,
    split: OnceLock<Result<Splitter, CudaError>>,
    workers: Mutex<[Option<Worker>; 2]>,
}

impl Paths {
    pub(crate) fn new(ctx: Arc<CudaContext>, staging: StagingConfig, leave_sms: bool) -> Paths {
        Paths {
            ctx,
            staging,
            stager: Arc::default(),
            gatherer: Arc::default(),
            leave_sms,
            sm: OnceLock::new(),
            split: OnceLock::new(),
            workers: Mutex::new([None, None]),
        }
    }

    /// Hands a staged job to its direction's thread (started on first use).
    pub(crate) fn stage(&self, task: StagedTask) -> Result<(), SubmitError> {
        let i = match task.dir {
            staged::Direction::HostToDevice => 0,
            staged::Direction::DeviceToHost => 1,
        };
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        if workers[i].is_none() {
            let (tx, rx) = channel::<StagedTask>();
            let leave_sms = self.leave_sms;
            let (ctx, cfg, stager, gatherer) = (
                Arc::clone(&self.ctx),
                self.staging,
                Arc::clone(&self.stager),
                Arc::clone(&self.gatherer),
            );
            let h = std::thread::Builder::new()
                .name(format!(
                    "ferry-staged-{}",
                    if i == 0 { "h2d" } else { "d2h" }
                ))
                .spawn(move || {
                    for t in rx {
                        // An error or a panic (a bug) fails this request only: the thread
                        // goes on with the next one. Either way every DMA the request issued
                        // has ended before it completes: the stager waits for them before it
                        // returns or unwinds, and a panic outside it is followed by a
                        // synchronization of the stream.
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            run_staged(&ctx, cfg, (&stager, &gatherer, leave_sms), &t)
                        }))
                        .unwrap_or_else(|p| {
                            // Raw, with the context bound: cudarc's `synchronize` returns an
                            // error stored in the context instead of waiting, if one is.
                            if super::sys::driver::bind(&ctx).is_ok() {
                                // SAFETY: the task's live stream, of this context; only waits.
                                let _ = unsafe { sys::cuStreamSynchronize(t.stream.cu_stream()) };
                            }
                            Err(RequestError::Panicked {
                                op: "staged copy".into(),
                                msg: crate::op::panic_message(&p),
                            })
                        });
                        t.signal.complete(r);
                    }
                })
                .map_err(|e| CudaError::Thread(format!("staging thread: {e}")))?;
            workers[i] = Some((tx, h));
        }
        let stopped = || SubmitError::ShutDown("cuda staging thread".into());
        let Some((tx, _)) = &workers[i] else {
            return Err(stopped());
        };
        tx.send(task).map_err(|_| stopped())
    }

    /// The gatherer (made on first use), or why it cannot be made here.
    pub(crate) fn gatherer(&self) -> Result<&Gatherer, CudaError> {
        gatherer(&self.gatherer, &self.ctx, self.leave_sms)
    }

    /// How the engine's queues issue their held copies ([`HeldIssue`]), with this engine's
    /// gatherer.
    pub(crate) fn held_issue(&self) -> Arc<dyn Issue> {
        Arc::new(HeldIssue {
            ctx: Arc::clone(&self.ctx),
            gatherer: Arc::clone(&self.gatherer),
            leave_sms: self.leave_sms,
            host_at_host_address: OnceLock::new(),
        })
    }

    /// The SM copier with its kernels compiled (on first use), or why they cannot be made
    /// (no NVRTC).
    pub(crate) fn sm(&self) -> Result<&SmCopier, CudaError> {
        self.sm
            .get_or_init(|| {
                let c = SmCopier::new(Arc::clone(&self.ctx))?;
                c.compile()?;
                Ok(c)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// [`Path::Sm`](super::route::Path::Sm): each copy step as one SM kernel. False where the
    /// kernels cannot be made here or a launch failed (nothing enqueued then, or the next path
    /// writes the same bytes again in stream order).
    ///
    /// # Safety
    /// As `exec::run_step` for every step; both sides device-accessible by this GPU.
    pub(crate) unsafe fn run_sm(
        &self,
        stream: &Arc<CudaStream>,
        dst: End,
        src: End,
        steps: &[Step],
    ) -> bool {
        let Ok(sm) = self.sm() else {
            return false;
        };
        steps.iter().all(|s| match s {
            // SAFETY: the plan is the program's, checked inside both buffers (1); buffers valid
            // until the request completes (caller); this engine's context and stream (2).
            Step::Copy(p) => unsafe { sm.copy(stream, dst.addr, src.addr, p) }.is_ok(),
            _ => false,
        })
    }

    /// [`Path::Gather`](super::route::Path::Gather): the program as one segment list
    /// ([`segments`]), or a block mapping as it is. False where the gatherer cannot be made or
    /// failed (a failed gather may have enqueued part of the copy; the next path writes the
    /// same bytes again, in stream order).
    ///
    /// # Safety
    /// As `exec::run_step` for every step; `list` was checked against both buffers (the
    /// program's segments, or a mapping by `op::check_blocks`).
    pub(crate) unsafe fn run_gather(
        &self,
        stream: &Arc<CudaStream>,
        dst: End,
        src: End,
        list: List<'_>,
    ) -> bool {
        let Ok(g) = self.gatherer() else {
            return false;
        };
        // SAFETY: the list lies inside both buffers (checked) (3); the buffers are valid until
        // the request completes (2); this engine's context and stream (1).
        unsafe {
            g.copy_checked(
                stream,
                (dst.addr, src.addr),
                list,
                GATHER_STRATEGY,
                Some((dst.kind, src.kind)),
            )
        }
        .is_ok()
    }

    /// [`Path::Split`](super::route::Path::Split): one contiguous copy within this GPU, its
    /// last `sm_bytes` by an SM kernel, the rest by a copy engine. `Ok(false)`: the kernel
    /// cannot be made here (nothing enqueued).
    ///
    /// # Safety
    /// As `exec::run_step` for the program's one step; `stream` is this engine's and its
    /// context current.
    pub(crate) unsafe fn run_split(
        &self,
        stream: &Arc<CudaStream>,
        dst: End,
        src: End,
        steps: &[Step],
        sm_bytes: usize,
    ) -> Result<bool, SubmitError> {
        let [Step::Copy(plan)] = steps else {
            return Ok(false); // the route splits one-copy programs only
        };
        let splitter = self.split.get_or_init(|| {
            Splitter::new(Arc::clone(&self.ctx)).and_then(|s| s.ready().map(|()| s))
        });
        let Ok(splitter) = splitter else {
            return Ok(false); // no NVRTC or no kernel: the copy engine does it all
        };
        let (d, s) = (
            dst.addr + plan.dst_offset() as u64,
            src.addr + plan.src_offset() as u64,
        );
        let cs = stream.cu_stream();
        // SAFETY: the plan's contiguous run lies inside both buffers of this device (3, 2);
        // our stream and current context (1).
        unsafe { splitter.copy(cs, d, s, plan.total_bytes(), sm_bytes) }.map_err(|e| {
            // SAFETY: our live stream: what was enqueued finishes before the error is seen.
            let _ = unsafe { sys::cuStreamSynchronize(cs) };
            SubmitError::from(e)
        })?;
        Ok(true)
    }

    /// Finishes every staged job and stops the staging threads.
    pub(crate) fn shutdown(&self) {
        let workers =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(PoisonError::into_inner));
        for (tx, h) in workers.into_iter().flatten() {
            drop(tx);
            let _ = h.join();
        }
    }
}

/// The gatherer in `cell` (made on first use), or why it cannot be made here.
fn gatherer<'a>(
    cell: &'a OnceLock<Result<Gatherer, CudaError>>,
    ctx: &Arc<CudaContext>,
    leave_sms: bool,
) -> Result<&'a Gatherer, CudaError> {
    cell.get_or_init(|| Ok(Gatherer::new(Arc::clone(ctx))?.leave_sms(leave_sms)))
        .as_ref()
        .map_err(Clone::clone)
}

fn run_staged(
    ctx: &Arc<CudaContext>,
    cfg: StagingConfig,
    (stager, gather, leave_sms): (&Cell<Stager>, &Cell<Gatherer>, bool),
    t: &StagedTask,
) -> Result<(), RequestError> {
    #[cfg(feature = "fault-injection")]
    if crate::fault::fire(crate::fault::Fault::StagingThreadPanic) {
        panic!("injected panic");
    }
    for dep in &t.after {
        dep.completion()
            .wait()
            .map_err(|e| RequestError::Dependency(Box::new(e)))?;
    }
    let stager = stager
        .get_or_init(|| Ok(Stager::new(Arc::clone(ctx), cfg)?))
        .as_ref()
        .map_err(|e| RequestError::from(e.clone()))?;
    let plans = match &t.work {
        StagedWork::Plans(plans) => plans,
        StagedWork::Segments {
            segs,
            range,
            dst_len,
            src_len,
        } => {
            // A gatherer that cannot be made leaves the device side to one DMA per run.
            let g = gatherer(gather, ctx, leave_sms).ok();
            let (d, s) = ((t.dst, *dst_len), (t.src, *src_len));
            // SAFETY: as for the plans below: the buffers (of these lengths) stay valid and
            // unshared until this request completes (1); the program checked the segments
            // against them and their destinations for overlap (3); this engine's device,
            // stream and gatherer (2).
            return unsafe {
                stager.copy_segments(&t.stream, t.dir, d, s, &segs[range.clone()], g)
            }
            .map_err(RequestError::from);
        }
    };
    for plan in plans {
        // SAFETY: the addresses and plans come from a job whose submitter guarantees, by
        // `Engine::submit_raw`'s contract, valid and unshared memory until this request
        // completes (1, 2, 4); the program checked each plan against the buffers' lengths; the
        // device memory is this engine's device and the stream this engine's (3).
        unsafe { stager.copy(&t.stream, t.dir, t.dst, t.src, plan) }.map_err(RequestError::from)?;
    }
    Ok(())
}

/// The program as one segment list (the route said it is all copies; fills add nothing). A
/// single segment list step is lent as it is, with no copy of the list.
pub(crate) fn segments(steps: &[Step]) -> std::borrow::Cow<'_, [Segment]> {
    if let [Step::Segments { segs, range, .. }] = steps {
        return std::borrow::Cow::Borrowed(&segs[range.clone()]);
    }
    let runs = steps
        .iter()
        .map(|s| match s {
            Step::Copy(p) => p.run_count(),
            Step::Segments { range, .. } => range.len(),
            Step::Fill { .. } => 0,
        })
        .sum();
    let mut segs = Vec::with_capacity(runs);
    for s in steps {
        match s {
            Step::Copy(p) => {
                let run = p.run() as u64;
                p.for_each_run(|d, s| segs.push(Segment::new(d as u64, s as u64, run)));
            }
            Step::Segments {
                segs: list, range, ..
            } => segs.extend_from_slice(&list[range.clone()]),
            Step::Fill { .. } => {}
        }
    }
    std::borrow::Cow::Owned(segs)
}

/// The strategy the engine asks the gatherer for.
pub(crate) const GATHER_STRATEGY: Strategy = Strategy::Auto;

/// How a queue's held copies go to the GPU (`completion/mark.rs`'s [`Issue`]): a flush of copies
/// all between memory of the same two kinds is one list, taken by the engine's rule for segment
/// lists. The gather kernel where the gatherer's plan picks it ([`Gatherer::copy_if_kernel`]: many
/// small copies, the SMs free, the kernel made; in a band its measured choice, the batched
/// copy until a block copy has measured it), the copies at offsets from the lowest destination and
/// source addresses (page-locked host memory only where kernels reach it at its host address on
/// every GPU: [`host_memory_at_host_address`](super::sys::probe::host_memory_at_host_address)) and
/// a segment table free (the flush does not wait for another stream's work); else, or where the
/// launch fails, the driver's batched copy as before ([`batch::copy_held`]: a flush of a few
/// copies, large copies, SMs left to the caller, no NVRTC). Every copy's allocation must be one
/// this device's context reaches as page-locked (only the lowest address is asked of the driver),
/// as for the batched copy. On the H100 host a held batch of 4,096 4 KiB device -> device copies
/// took the batched copy 17 ms (0.96 GB/s; the gather kernel 0.05 ms), 4,096 device -> host 2.0 ms
/// (8.5 GB/s; the kernel 47 GB/s), sixth run's block rows.
pub(crate) struct HeldIssue {
    ctx: Arc<CudaContext>,
    gatherer: Cell<Gatherer>,
    leave_sms: bool,
    /// [`host_memory_at_host_address`](super::sys::probe::host_memory_at_host_address), asked
    /// on the first flush that could use it.
    host_at_host_address: OnceLock<bool>,
}

impl HeldIssue {
    /// Enqueues `copies` (every one between memory of kinds `kinds`) with the gather kernel
    /// where the plan picks it; false where it does not or the launch failed (nothing
    /// enqueued that the next path does not write again, in stream order).
    ///
    /// # Safety
    /// As [`Issue::issue`].
    unsafe fn gather(
        &self,
        stream: &Arc<CudaStream>,
        copies: &[BatchCopy],
        kinds: (MemKind, MemKind),
    ) -> bool {
        // A few copies: the plan is a call each, the batched copy does as well.
        if copies.len() <= super::route::AUTO_FEW_SEGMENTS {
            return false;
        }
        let host = |k| matches!(k, MemKind::Pinned | MemKind::Mapped);
        if (host(kinds.0) || host(kinds.1))
            && !*self
                .host_at_host_address
                .get_or_init(super::sys::probe::host_memory_at_host_address)
        {
            return false;
        }
        let Ok(g) = gatherer(&self.gatherer, &self.ctx, self.leave_sms) else {
            return false;
        };
        let (mut dst, mut src) = (u64::MAX, u64::MAX);
        for c in copies {
            dst = dst.min(c.dst);
            src = src.min(c.src);
        }
        let list = List::Copies { copies, dst, src };
        // SAFETY: every copy lies at or above its side's base and is valid until the stream
        // passes it, of these kinds, reached at its own address where the base is (checked by
        // the gatherer; unified addressing and host memory at its host address checked above);
        // the queue's live stream, its context current (this function's contract).
        unsafe { g.copy_if_kernel(stream, (dst, src), list, kinds) }.unwrap_or(false)
    }
}

impl Issue for HeldIssue {
    unsafe fn issue(&self, stream: &Arc<CudaStream>, copies: &[BatchCopy]) -> Issued {
        let kinds = copies.first().map(|c| (c.dst_kind, c.src_kind));
        if let Some(kinds) = kinds.filter(|&k| copies.iter().all(|c| (c.dst_kind, c.src_kind) == k))
        {
            // SAFETY: this function's contract.
            if unsafe { self.gather(stream, copies, kinds) } {
                return Issued {
                    enqueued: copies.len(),
                    ..Issued::default()
                };
            }
        }
        // SAFETY: this function's contract is `copy_held`'s.
        unsafe { batch::copy_held(stream.cu_stream(), copies) }
    }
}

/// The copy plans of a staged program (the route stages programs of copies only).
pub(crate) fn plan_steps(steps: impl IntoIterator<Item = Step>) -> Vec<Plan> {
    steps
        .into_iter()
        .filter_map(|s| match s {
            Step::Copy(p) => Some(p),
            _ => None,
        })
        .collect()
}
