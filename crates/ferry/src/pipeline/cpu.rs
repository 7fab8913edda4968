//! The pipeline on the CPU: three lane threads (upload, compute, download), each running its
//! steps in order as a CUDA stream does, each step starting once the requests it depends on
//! have completed. The copies run on the given engine (a [`CpuEngine`](crate::CpuEngine)
//! splits them across its workers); the stage is a closure run on the compute lane. The lane
//! threads live for one run (`std::thread::scope`): nothing outlives `run`.

use super::chunk::{Chunk, Phase};
use super::config::PipelineConfig;
use super::core::{self, Lanes};
use super::error::{PipelineError, StageError};
use super::report::RunReport;
use super::source::{plan, slot_need, Dest, Source};
use super::timeline::{Timeline, TimelineClock};
use crate::engine::{Engine, Job};
use crate::layout::Layout;
use crate::memory::{MemKind, RawBuf};
use crate::request::{Request, RequestError, Signal};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// A pipeline whose slots are host memory and whose stage is a closure; see the [module
/// documentation](super).
pub struct CpuPipeline<'e> {
    engine: &'e dyn Engine,
    cfg: PipelineConfig,
    ins: Vec<Vec<u8>>,
    outs: Vec<Vec<u8>>,
}

impl std::fmt::Debug for CpuPipeline<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPipeline")
            .field("engine", &self.engine.name())
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// One step for a lane.
struct Task {
    chunk: Chunk,
    slot: usize,
    after: Vec<Request>,
    done: Arc<Signal>,
}

/// What a lane knows beyond its requests' errors, and its times.
#[derive(Default)]
struct Shared {
    /// The full error of a failed step, by (chunk, phase).
    errors: HashMap<(usize, Phase), PipelineError>,
    /// (chunk, phase, start us, end us), when timed.
    times: Vec<(usize, Phase, f64, f64)>,
}

/// A slot of `n` zero bytes, or an error where the memory cannot be had (a huge
/// `chunk_bytes` once aborted the process).
fn zeroed(n: usize) -> Result<Vec<u8>, PipelineError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|e| PipelineError::Setup(format!("cannot allocate a slot of {n} bytes: {e}")))?;
    v.resize(n, 0);
    Ok(v)
}

impl<'e> CpuPipeline<'e> {
    /// A pipeline whose copies run on `engine`, with its K input slots of
    /// `cfg.chunk_bytes` (and K output slots) allocated now. Errors: a bad setting.
    pub fn new(
        engine: &'e dyn Engine,
        cfg: PipelineConfig,
    ) -> Result<CpuPipeline<'e>, PipelineError> {
        cfg.check()?;
        let out = cfg.output.of(cfg.chunk_bytes);
        let slots = |n: usize| -> Result<Vec<Vec<u8>>, PipelineError> {
            (0..cfg.slots).map(|_| zeroed(n)).collect()
        };
        Ok(CpuPipeline {
            engine,
            cfg,
            ins: slots(cfg.chunk_bytes)?,
            outs: slots(out)?,
        })
    }

    /// The settings.
    pub fn config(&self) -> PipelineConfig {
        self.cfg
    }

    /// Streams `src` through the slots: `stage(chunk, input, output)` runs on each chunk's
    /// input slot (its first `chunk.len` bytes) and writes its output slot (`chunk.out_len`
    /// bytes, empty without a destination), which is then copied to `dst` at
    /// `chunk.out_offset`. Returns once every step of every chunk has completed, or with the
    /// first failure (see the [module documentation](super)); a stage that panics fails its
    /// chunk with [`PipelineError::Panicked`]. Blocks.
    pub fn run<F, E>(
        &mut self,
        src: Source<'_>,
        dst: Option<Dest<'_>>,
        stage: F,
    ) -> Result<RunReport, PipelineError>
    where
        F: FnMut(&Chunk, &[u8], &mut [u8]) -> Result<(), E> + Send,
        E: Into<StageError>,
    {
        let t0 = Instant::now();
        let chunks = plan(&self.cfg, &src, dst.as_ref())?;
        // Slots as large as the largest chunk (a strided source's rows may be larger than
        // `chunk_bytes`): the copies and the stage's slices below rely on it.
        let (need_in, need_out) = slot_need(&chunks);
        for (slots, need) in [(&mut self.ins, need_in), (&mut self.outs, need_out)] {
            for s in slots.iter_mut().filter(|s| s.len() < need) {
                *s = zeroed(need)?;
            }
        }
        let host = |v: &mut Vec<u8>| RawBuf::host(v.as_mut_ptr(), v.len(), MemKind::Pageable);
        let ins: Vec<RawBuf> = self.ins.iter_mut().map(host).collect();
        let outs: Vec<RawBuf> = self.outs.iter_mut().map(host).collect();
        let shared = Mutex::new(Shared::default());
        let timed = self.cfg.timeline.then_some(t0);
        let (k, depth, engine) = (self.cfg.slots, self.cfg.effective_depth(), self.engine);
        let result = std::thread::scope(|s| {
            let (src, dst, ins, outs) = (&src, dst.as_ref(), &ins, &outs);
            let upload = move |c: &Chunk, slot: usize| {
                let to = RawBuf {
                    len: c.len,
                    ..ins[slot]
                };
                // SAFETY: as the copy's below; the lane waited for the slot's last reader.
                if let Some(r) = unsafe { src.load(c, to, None) } {
                    return r?.wait().map_err(|e| PipelineError::Copy {
                        chunk: c.index,
                        phase: Phase::Upload,
                        source: e,
                    });
                }
                let (from, from_l) = src.part(c)?;
                // SAFETY: the source is borrowed for the run, the slot is the pipeline's; the
                // schedule orders this copy after the slot's last reader and before its next
                // one, and the lane waits for the copy before the step completes.
                copy(
                    engine,
                    c,
                    Phase::Upload,
                    to,
                    src.slot_layout(c)?,
                    from,
                    from_l,
                )
            };
            let mut stage = stage;
            let mut failed = false;
            let compute = move |c: &Chunk, slot: usize| {
                if failed {
                    return Err(PipelineError::Copy {
                        chunk: c.index,
                        phase: Phase::Compute,
                        source: RequestError::Aborted("an earlier chunk's stage failed".into()),
                    });
                }
                // SAFETY: the slots are the pipeline's, borrowed by `run`; the schedule runs
                // this step after the chunk's upload into the input slot and after the output
                // slot's previous download, and nothing else touches them meanwhile.
                let (input, output) = unsafe {
                    (
                        std::slice::from_raw_parts(ins[slot].addr as *const u8, c.len),
                        std::slice::from_raw_parts_mut(outs[slot].addr as *mut u8, c.out_len),
                    )
                };
                let r = catch_unwind(AssertUnwindSafe(|| stage(c, input, output)));
                failed = !matches!(r, Ok(Ok(())));
                match r {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(PipelineError::Stage {
                        chunk: c.index,
                        source: e.into(),
                    }),
                    Err(p) => Err(PipelineError::Panicked {
                        chunk: c.index,
                        msg: crate::op::panic_message(&p),
                    }),
                }
            };
            let download = move |c: &Chunk, slot: usize| match dst {
                Some(d) if c.out_len > 0 => {
                    let bytes = Layout::bytes(c.out_len)
                        .map_err(|e| PipelineError::Config(e.to_string()))?;
                    let from = RawBuf {
                        len: c.out_len,
                        ..outs[slot]
                    };
                    // SAFETY: as the upload's; the destination is borrowed for the run.
                    copy(engine, c, Phase::Download, d.part(c), bytes, from, bytes)
                }
                _ => Ok(()),
            };
            let mut lanes = CpuLanes {
                upload: lane(
                    s,
                    "ferry-pipe-up",
                    Phase::Upload,
                    Box::new(upload),
                    &shared,
                    timed,
                )?,
                compute: lane(
                    s,
                    "ferry-pipe-compute",
                    Phase::Compute,
                    Box::new(compute),
                    &shared,
                    timed,
                )?,
                download: lane(
                    s,
                    "ferry-pipe-down",
                    Phase::Download,
                    Box::new(download),
                    &shared,
                    timed,
                )?,
                shared: &shared,
            };
            core::drive(&mut lanes, &chunks, k, depth, dst.is_some())
        });
        result?;
        let times =
            std::mem::take(&mut shared.lock().unwrap_or_else(PoisonError::into_inner).times);
        Ok(RunReport::of(
            &chunks,
            &src,
            t0,
            timed.map(|_| Timeline::build(TimelineClock::Host, &chunks, times)),
        ))
    }
}

/// One copy of a chunk on `engine`, waited for.
fn copy(
    engine: &dyn Engine,
    c: &Chunk,
    phase: Phase,
    to: RawBuf,
    to_l: Layout,
    from: RawBuf,
    from_l: Layout,
) -> Result<(), PipelineError> {
    // SAFETY: the callers' (see there): both buffers valid and unshared until the wait below.
    let req = unsafe { engine.submit_raw(Job::copy(to, to_l, from, from_l)) }.map_err(|e| {
        PipelineError::Submit {
            chunk: c.index,
            phase,
            source: e,
        }
    })?;
    req.wait().map_err(|e| PipelineError::Copy {
        chunk: c.index,
        phase,
        source: e,
    })
}

type Work<'a> = Box<dyn FnMut(&Chunk, usize) -> Result<(), PipelineError> + Send + 'a>;

/// Starts a lane thread in `s` that runs `work` for each task, in order, once the task's
/// dependencies have completed; a failed dependency fails the task without running it.
fn lane<'scope, 'env>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    name: &str,
    phase: Phase,
    mut work: Work<'scope>,
    shared: &'scope Mutex<Shared>,
    timed: Option<Instant>,
) -> Result<Sender<Task>, PipelineError> {
    let (tx, rx) = channel::<Task>();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn_scoped(s, move || {
            for t in rx {
                let dep = t
                    .after
                    .iter()
                    .find_map(|d| d.completion().wait().err())
                    .map(|e| RequestError::Dependency(Box::new(e)));
                let r = match dep {
                    Some(e) => Err(e),
                    None => {
                        let start = timed.map(|t0| t0.elapsed().as_secs_f64() * 1e6);
                        let r = work(&t.chunk, t.slot);
                        let mut sh = shared.lock().unwrap_or_else(PoisonError::into_inner);
                        if let (Some(t0), Some(start)) = (timed, start) {
                            let end = t0.elapsed().as_secs_f64() * 1e6;
                            sh.times.push((t.chunk.index, phase, start, end));
                        }
                        r.map_err(|e| {
                            let short = RequestError::Operator {
                                op: format!("pipeline {phase}"),
                                msg: e.to_string(),
                            };
                            sh.errors.insert((t.chunk.index, phase), e);
                            short
                        })
                    }
                };
                t.done.complete(r);
            }
        })
        .map_err(|e| PipelineError::Setup(format!("cannot start a lane thread: {e}")))?;
    Ok(tx)
}

struct CpuLanes<'a> {
    upload: Sender<Task>,
    compute: Sender<Task>,
    download: Sender<Task>,
    shared: &'a Mutex<Shared>,
}

fn send(
    lane: &Sender<Task>,
    c: &Chunk,
    slot: usize,
    after: &[Option<&Request>],
) -> Result<Request, PipelineError> {
    let done = Arc::new(Signal::new());
    let task = Task {
        chunk: *c,
        slot,
        after: after.iter().flatten().map(|r| r.share()).collect(),
        done: Arc::clone(&done),
    };
    lane.send(task)
        .map_err(|_| PipelineError::Setup("a lane thread has stopped".into()))?;
    Ok(Request::new(done))
}

impl Lanes for CpuLanes<'_> {
    fn upload(
        &mut self,
        c: &Chunk,
        slot: usize,
        after: Option<&Request>,
    ) -> Result<Request, PipelineError> {
        send(&self.upload, c, slot, &[after])
    }
    fn compute(
        &mut self,
        c: &Chunk,
        slot: usize,
        upload: &Request,
        out_free: Option<&Request>,
    ) -> Result<Request, PipelineError> {
        send(&self.compute, c, slot, &[Some(upload), out_free])
    }
    fn download(
        &mut self,
        c: &Chunk,
        slot: usize,
        computed: &Request,
    ) -> Result<Request, PipelineError> {
        send(&self.download, c, slot, &[Some(computed)])
    }
    fn explain(&mut self, chunk: usize, phase: Phase, e: RequestError) -> PipelineError {
        let mut sh = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        sh.errors
            .remove(&(chunk, phase))
            .unwrap_or(PipelineError::Copy {
                chunk,
                phase,
                source: e,
            })
    }
}
