//! The engine's fast paths beyond the plain driver copies of `exec`: copies between pageable
//! host memory and the device go through the staged pinned ring ([`super::staged`]) on one
//! background thread per direction, and long segment lists go through the gatherer
//! ([`super::gather`]: an SM kernel, the driver's batched copy, or one call per segment, by
//! measurement), and short-run strided plans go to the SM copier ([`super::strided`]). All are
//! created on first use.

use super::gather::{Gatherer, Segment, Strategy};
use super::staged::{self, Stager, StagingConfig};
use super::strided::SmCopier;
use crate::op::Step;
use crate::plan::{Plan, PlanKind};
use crate::request::{Request, RequestError, Signal};
use cudarc::driver::{CudaContext, CudaStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;

/// Copies at least this large between pageable memory and the device are staged; smaller ones
/// take the driver's own pageable path (the hand-off to the staging thread and the ring's
/// start-up cost more). Measured on the H200 host (run 24, `ferry bench --test
/// cuda-h2d-pageable,cuda-d2h-pageable --sizes 1M,2M,4M,8M,16M,32M`, batches of 8): host to
/// device, staged / driver = 0.86x at 1 MiB, 1.14x at 2 MiB, 1.35x at 4 MiB; device to host,
/// 1.35x at 1 MiB, 1.58x at 2 MiB (the driver's pageable read-back is the slower of the two).
pub(crate) fn stage_min_bytes(dir: staged::Direction) -> usize {
    match dir {
        staged::Direction::HostToDevice => 2 << 20,
        staged::Direction::DeviceToHost => 1 << 20,
    }
}

/// Programs that would take at least this many driver calls go to the gatherer.
pub(crate) const GATHER_MIN_CALLS: usize = 64;

/// One staged job, run on the direction's staging thread.
pub(crate) struct StagedTask {
    pub dir: staged::Direction,
    pub stream: Arc<CudaStream>,
    pub dst: u64,
    pub src: u64,
    pub plans: Vec<Plan>,
    pub after: Vec<Request>,
    pub signal: Arc<Signal>,
}

// SAFETY: the task holds plain addresses; `Engine::submit_raw`'s contract keeps the memory
// valid and unshared until the request (completed by the staging thread through `signal`)
// completes, so the addresses may move to that thread.
unsafe impl Send for StagedTask {}

type Worker = (Sender<StagedTask>, JoinHandle<()>);

pub(crate) struct Paths {
    ctx: Arc<CudaContext>,
    staging: StagingConfig,
    stager: Arc<OnceLock<Result<Stager, String>>>,
    gatherer: OnceLock<Result<Gatherer, String>>,
    sm: OnceLock<Result<SmCopier, String>>,
    workers: Mutex<[Option<Worker>; 2]>,
}

impl Paths {
    pub(crate) fn new(ctx: Arc<CudaContext>, staging: StagingConfig) -> Paths {
        Paths {
            ctx,
            staging,
            stager: Arc::default(),
            gatherer: OnceLock::new(),
            sm: OnceLock::new(),
            workers: Mutex::new([None, None]),
        }
    }

    /// Hands a staged job to its direction's thread (started on first use).
    pub(crate) fn stage(&self, task: StagedTask) -> Result<(), String> {
        let i = match task.dir {
            staged::Direction::HostToDevice => 0,
            staged::Direction::DeviceToHost => 1,
        };
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        if workers[i].is_none() {
            let (tx, rx) = channel::<StagedTask>();
            let (ctx, cfg, stager) = (
                Arc::clone(&self.ctx),
                self.staging,
                Arc::clone(&self.stager),
            );
            let h = std::thread::Builder::new()
                .name(format!(
                    "ferry-staged-{}",
                    if i == 0 { "h2d" } else { "d2h" }
                ))
                .spawn(move || {
                    for t in rx {
                        // A panic here (a bug) fails this request only: the thread goes on
                        // with the next one, after every DMA the request issued has finished.
                        let r =
                            catch_unwind(AssertUnwindSafe(|| run_staged(&ctx, cfg, &stager, &t)))
                                .unwrap_or_else(|p| {
                                    let _ = t.stream.synchronize();
                                    Err(RequestError::Panicked {
                                        op: "staged copy".into(),
                                        msg: crate::op::panic_message(&p),
                                    })
                                });
                        t.signal.complete(r);
                    }
                })
                .map_err(|e| format!("cannot start the staging thread: {e}"))?;
            workers[i] = Some((tx, h));
        }
        let Some((tx, _)) = &workers[i] else {
            return Err("no staging thread".into());
        };
        tx.send(task)
            .map_err(|_| "the staging thread has stopped".to_string())
    }

    /// The gatherer, compiled on first use; `None` if it cannot be made here.
    pub(crate) fn gatherer(&self) -> Option<&Gatherer> {
        self.gatherer_or_why().ok()
    }

    /// The gatherer, or why it cannot be made here.
    pub(crate) fn gatherer_or_why(&self) -> Result<&Gatherer, String> {
        self.gatherer
            .get_or_init(|| Gatherer::new(Arc::clone(&self.ctx)).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(String::clone)
    }

    /// The SM copier with its kernels compiled (on first use); `None` if they cannot be made
    /// here (no NVRTC).
    pub(crate) fn sm(&self) -> Option<&SmCopier> {
        self.sm_copier().ok()
    }

    /// The SM copier with its kernels compiled (on first use), or why they cannot be made.
    pub(crate) fn sm_copier(&self) -> Result<&SmCopier, String> {
        self.sm
            .get_or_init(|| {
                let c = SmCopier::new(Arc::clone(&self.ctx)).map_err(|e| e.to_string())?;
                c.compile().map_err(|e| e.to_string())?;
                Ok(c)
            })
            .as_ref()
            .map_err(String::clone)
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

fn run_staged(
    ctx: &Arc<CudaContext>,
    cfg: StagingConfig,
    stager: &OnceLock<Result<Stager, String>>,
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
        .get_or_init(|| Stager::new(Arc::clone(ctx), cfg).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| RequestError::Driver {
            call: "staging ring setup",
            msg: e.clone(),
        })?;
    for plan in &t.plans {
        // SAFETY: the addresses and plans come from a job whose submitter guarantees, by
        // `Engine::submit_raw`'s contract, valid and unshared memory until this request
        // completes (1, 2, 4); the program checked each plan against the buffers' lengths; the
        // device memory is this engine's device and the stream this engine's (3).
        unsafe { stager.copy(&t.stream, t.dir, t.dst, t.src, plan) }.map_err(|e| {
            RequestError::Driver {
                call: "staged copy",
                msg: e.to_string(),
            }
        })?;
    }
    Ok(())
}

/// Driver calls `exec::copy_plan` would make for a plan (3-D copies counted as one).
fn calls(p: &Plan) -> usize {
    match p.kind() {
        PlanKind::Contiguous | PlanKind::Pitched2D | PlanKind::Pitched3D => 1,
        PlanKind::Segments => p.counts()[..p.counts().len() - 2].iter().product(),
    }
}

/// The program as a segment list, where it is all copies that would take many driver calls.
pub(crate) fn segment_list(steps: &[Step]) -> Option<Vec<Segment>> {
    let mut n = 0usize;
    let mut runs = 0usize;
    for s in steps {
        match s {
            Step::Copy(p) => {
                n += calls(p);
                runs += p.run_count();
            }
            Step::Segments { range, .. } => {
                n += range.len();
                runs += range.len();
            }
            Step::Fill { .. } => return None,
        }
    }
    if n < GATHER_MIN_CALLS {
        return None;
    }
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
    Some(segs)
}

/// The strategy the engine asks the gatherer for.
pub(crate) const GATHER_STRATEGY: Strategy = Strategy::Auto;
