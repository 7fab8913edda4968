//! The pipeline on a GPU: uploads and downloads are requests of a
//! [`CudaEngine`] on its copy-engine streams, the stage enqueues its
//! kernels on the pipeline's compute stream, and every order between them is an event waited
//! on by a stream ([`CudaEngine::stream_wait`], a request as a job dependency): the host never
//! waits for a chunk, except to bound the work queued ahead.
//!
//! - Upload of chunk `i` on the engine's host-to-device stream, after the compute of chunk
//!   `i - K` (an event recorded on the compute stream after the stage's work,
//!   [`CudaEngine::record`]).
//! - Compute of chunk `i`: the compute stream waits for the upload's event and for the
//!   download of chunk `i - K`; the stage enqueues; an event is recorded.
//! - Download of chunk `i` on the engine's device-to-host (or device-to-device) stream, after
//!   that event.
//!
//! A pageable source (whole or strided) and a file source ([`Source::file`]) go through
//! [`PipelineConfig::bounce_count`] pinned bounce buffers of a chunk kept by the pipeline (see
//! `bounce.rs`): the submitting thread starts filling the buffer of every next chunk whose buffer
//! is free (its last DMA completed), in chunk order, each time it submits a step, never waiting
//! for a buffer (pageable: a parallel copy on the fill workers, cut as
//! [`PipelineConfig::bounce_fill`] says; file: the file engine's parallel reads straight into it). An upload ahead of its chunk's compute is submitted only once its fill
//! has completed ([`core::Lanes::upload_ready`]), so a fill still running never holds back the
//! computes and downloads of earlier chunks; the upload a compute needs next waits for its fill
//! (by default copying the fill's untaken pieces itself first, [`BounceFill::help`]).
//! The upload is then a pinned DMA ordered on the GPU like any other. Downloads into pageable
//! memory of 1 MiB or more are staged by the engine (see the
//! [engine](crate::cuda::CudaEngine)), their completion signalled by its staging thread, waited
//! for when their output slot is next needed.
//!
//! Timeline (on request): a timing event recorded on the stream of each step after it, and the
//! step's start from the events it follows, or from one more event where they cannot tell
//! (`timing.rs`); waiting for a dependency is never counted as copying. A step completed by a
//! host thread (a staged copy) ends in the timeline when the compute stream next learned of it,
//! later than it did.

use super::bounce::BounceRing;
use super::chunk::{Chunk, Phase};
use super::config::{BounceFill, PipelineConfig};
use super::core::{self, Lanes};
use super::error::{setup, PipelineError, StageError};
use super::report::RunReport;
use super::source::{plan, slot_need, Dest, Source};
use crate::cuda::{CudaCompletion, CudaEngine, DeviceBuffer, InteropError, PinnedBuffer};
use crate::engine::cpu::{CpuConfig, CpuEngine};
use crate::engine::cuda::StagingConfig;
use crate::engine::{Engine, Job};
use crate::layout::Layout;
use crate::memory::{MemKind, Memory, RawBuf};
use crate::request::{Request, RequestError};
use crate::staging::policy::{demoted_fill, FILL_PIECE};
use crate::staging::Filler;
use cudarc::driver::CudaStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use timing::Timing;

mod timing;

/// How long the submitting thread polls a request (`cuEventQuery`) before it sleeps on the
/// request's event. The engine's events are blocking-sync by default, and a thread asleep on
/// one wakes 100-150 us after the event on the H200 host (DESIGN.md): at the end of a run that
/// was 7% of a 64 MiB pipeline (run 30: 0.93x the raw loop, whose final
/// `cuStreamSynchronize` spins). Chunk steps are shorter than this at every size the bench
/// measures (16 MiB: about 330 us), so the last wait of a run polls; a thread that waits
/// longer (huge chunks, a slow stage) sleeps after it, and pays the wake-up once per wait on
/// a run that long.
const SPIN: Duration = Duration::from_millis(2);

/// A pipeline whose slots are device memory of one GPU and whose stage enqueues work on a
/// compute stream; see the [module documentation](super).
pub struct CudaPipeline<'e> {
    engine: &'e CudaEngine,
    cfg: PipelineConfig,
    compute: Arc<CudaStream>,
    ins: Vec<DeviceBuffer>,
    outs: Vec<DeviceBuffer>,
    /// Pinned bounce buffers and their filling CPU workers, made by the first run from a
    /// pageable or file source (see [`super::bounce`]).
    bounce: Option<Bounce>,
}

/// Pinned buffers of a chunk ([`PipelineConfig::bounce_count`]) and the workers that fill them
/// from pageable memory ([`PipelineConfig::effective_fill_threads`] of them): the staged path's
/// copy on the process's host copy workers ([`Filler`]) for contiguous chunks, a CPU engine for strided ones, each made
/// on first use (a file source's chunks are filled by the file engine's reads and start
/// neither).
struct Bounce {
    ring: BounceRing<PinnedBuffer>,
    /// The engine's staging settings (their stores), with the pipeline's fill threads, for the
    /// fill workers.
    staging: StagingConfig,
    fill: Option<Filler>,
    strided: Option<CpuEngine>,
}

impl Bounce {
    /// A ring of `count` pinned buffers of `bytes`, filled by `threads` workers with the
    /// engine's staging settings `staging` (its stores; the thread count is the pipeline's),
    /// the fill workers started on first use. Reads no environment: a program that wants
    /// `FERRY_STAGING_*` builds its engine's config with `CudaConfig::from_env`.
    fn new(
        count: usize,
        bytes: usize,
        threads: usize,
        staging: StagingConfig,
    ) -> Result<Bounce, PipelineError> {
        let staging = staging.threads(threads);
        let bufs = (0..count)
            .map(|_| PinnedBuffer::new(bytes.max(1)).map_err(setup))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Bounce {
            ring: BounceRing::new(bufs),
            staging,
            fill: None,
            strided: None,
        })
    }

    /// The fill workers for contiguous pageable chunks, started on first use.
    fn filler(&mut self) -> Result<&Filler, PipelineError> {
        if self.fill.is_none() {
            self.fill = Some(
                Filler::new(self.staging.get_threads(), self.staging.non_temporal_h2d)
                    .map_err(setup)?,
            );
        }
        self.fill.as_ref().ok_or_else(|| setup("no fill workers"))
    }

    /// The CPU engine for strided fills, made on first use.
    fn strided(&mut self) -> Result<&CpuEngine, PipelineError> {
        if self.strided.is_none() {
            let cfg = CpuConfig::new(self.staging.get_threads())
                .chunk_bytes(FILL_PIECE)
                .inline_bytes(0);
            self.strided = Some(CpuEngine::with_config(cfg).map_err(setup)?);
        }
        self.strided
            .as_ref()
            .ok_or_else(|| setup("no strided fill engine"))
    }
}

/// Waits for `req`: polls it (`cuEventQuery`) for [`SPIN`], then sleeps on it.
fn spin_wait(mut req: Request) -> Result<(), RequestError> {
    let t = Instant::now();
    while t.elapsed() < SPIN {
        if let Some(r) = req.try_wait() {
            return r;
        }
        std::hint::spin_loop();
    }
    req.wait()
}

impl std::fmt::Debug for CudaPipeline<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPipeline")
            .field("engine", &self.engine.name())
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// What a GPU stage gets for one chunk: device addresses valid for the work it enqueues on
/// [`GpuChunk::stream`], and only for that work (the slots are reused once it has finished).
#[derive(Debug)]
pub struct GpuChunk<'a> {
    chunk: Chunk,
    input: u64,
    output: Option<u64>,
    stream: &'a Arc<CudaStream>,
}

impl GpuChunk<'_> {
    /// The chunk.
    pub fn chunk(&self) -> &Chunk {
        &self.chunk
    }
    /// Device address of the chunk's input (`chunk().len` bytes, densely packed).
    pub fn input(&self) -> u64 {
        self.input
    }
    /// Device address of the chunk's output slot (`chunk().out_len` bytes are copied to the
    /// destination), or `None` without a destination or output.
    pub fn output(&self) -> Option<u64> {
        self.output
    }
    /// The compute stream: enqueue the chunk's work here, and only here.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<'e> CudaPipeline<'e> {
    /// A pipeline on `engine`'s GPU with a new compute stream and its K input slots of
    /// `cfg.chunk_bytes` (and K output slots) allocated now. Errors: a bad setting, out of
    /// device memory, a failed stream creation.
    pub fn new(
        engine: &'e CudaEngine,
        cfg: PipelineConfig,
    ) -> Result<CudaPipeline<'e>, PipelineError> {
        let compute = engine.context().new_stream().map_err(setup)?;
        CudaPipeline::with_stream(engine, cfg, compute)
    }

    /// As [`CudaPipeline::new`], with the caller's compute stream (of the engine's device).
    pub fn with_stream(
        engine: &'e CudaEngine,
        cfg: PipelineConfig,
        compute: Arc<CudaStream>,
    ) -> Result<CudaPipeline<'e>, PipelineError> {
        cfg.check()?;
        if compute.context().cu_ctx() != engine.context().cu_ctx() {
            return Err(PipelineError::Config(
                "the compute stream is of another device".into(),
            ));
        }
        let slot = |n: usize| DeviceBuffer::new(engine.ordinal(), n).map_err(setup);
        let out = cfg.output.of(cfg.chunk_bytes);
        Ok(CudaPipeline {
            engine,
            cfg,
            ins: (0..cfg.slots)
                .map(|_| slot(cfg.chunk_bytes))
                .collect::<Result<_, _>>()?,
            outs: if out == 0 {
                Vec::new()
            } else {
                (0..cfg.slots)
                    .map(|_| slot(out))
                    .collect::<Result<_, _>>()?
            },
            compute,
            bounce: None,
        })
    }

    /// The settings.
    pub fn config(&self) -> PipelineConfig {
        self.cfg
    }

    /// The compute stream the stage enqueues on.
    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// Streams `src` through the slots: `stage` enqueues each chunk's work on the compute
    /// stream (reading [`GpuChunk::input`], writing [`GpuChunk::output`]) and returns; the
    /// output's first `chunk.out_len` bytes are then copied to `dst` at `chunk.out_offset`.
    /// Returns once every step of every chunk has completed on the GPU, or with the first
    /// failure (see the [module documentation](super)); after a failure, and when the stage
    /// panics (the panic goes on once the work in flight is done), the compute stream is
    /// synchronized, so nothing a failing stage enqueued outlives the run. Blocks.
    pub fn run<F, E>(
        &mut self,
        src: Source<'_>,
        dst: Option<Dest<'_>>,
        stage: F,
    ) -> Result<RunReport, PipelineError>
    where
        F: FnMut(&GpuChunk<'_>) -> Result<(), E>,
        E: Into<StageError>,
    {
        let t0 = Instant::now();
        let chunks = plan(&self.cfg, &src, dst.as_ref())?;
        self.fit_slots(&chunks)?;
        let bounce = match src.file.is_some() || src.buf.kind == MemKind::Pageable {
            true => {
                self.make_bounce(&chunks)?;
                self.bounce.as_mut()
            }
            false => None,
        };
        let timing = match self.cfg.timeline {
            true => Some(Timing::new(&self.compute, chunks.len())?),
            false => None,
        };
        let mut lanes = GpuLanes {
            engine: self.engine,
            compute: &self.compute,
            k: self.cfg.slots,
            ins: self.ins.iter().map(DeviceBuffer::device_ptr).collect(),
            outs: self.outs.iter().map(DeviceBuffer::device_ptr).collect(),
            src: &src,
            dst: dst.as_ref(),
            stage,
            timing,
            bounce,
            chunks: &chunks,
            next_fill: 0,
            fill: self.cfg.bounce_fill,
        };
        // Work a failing (or panicking) stage enqueued is not followed by an event ferry
        // waits for: synchronize the compute stream before the slots can be reused.
        struct SyncUnlessDone<'a>(&'a CudaStream, bool);
        impl Drop for SyncUnlessDone<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    let _ = crate::engine::cuda::sys::driver::sync_stream(self.0);
                }
            }
        }
        let mut guard = SyncUnlessDone(&self.compute, false);
        let depth = self.cfg.effective_depth();
        core::drive(&mut lanes, &chunks, self.cfg.slots, depth, dst.is_some())?;
        guard.1 = true;
        let timeline = match lanes.timing.take() {
            Some(t) => Some(t.finish(&self.compute, &chunks)?),
            None => None,
        };
        Ok(RunReport {
            chunks: chunks.len(),
            bytes_in: src.len() as u64,
            bytes_out: chunks.iter().map(|c| c.out_len as u64).sum(),
            elapsed: t0.elapsed(),
            timeline,
        })
    }
}

impl CudaPipeline<'_> {
    /// The device slots, made anew where they are smaller than the largest of `chunks`
    /// (a strided source's rows may be larger than `chunk_bytes`): the uploads, the stage's
    /// kernels and the downloads rely on it.
    fn fit_slots(&mut self, chunks: &[Chunk]) -> Result<(), PipelineError> {
        let (need_in, need_out) = slot_need(chunks);
        let (dev, k) = (self.engine.ordinal(), self.cfg.slots);
        let fit = |slots: &mut Vec<DeviceBuffer>, need: usize| -> Result<(), PipelineError> {
            if need > 0 && (slots.len() < k || slots.iter().any(|b| b.len() < need)) {
                // The old slots go first: every request of an earlier run has completed.
                slots.clear();
                for _ in 0..k {
                    slots.push(DeviceBuffer::new(dev, need).map_err(setup)?);
                }
            }
            Ok(())
        };
        fit(&mut self.ins, need_in)?;
        fit(&mut self.outs, need_out)
    }

    /// The bounce buffers, (re)made to hold the largest of `chunks`
    /// ([`PipelineConfig::bounce_count`] of them).
    fn make_bounce(&mut self, chunks: &[Chunk]) -> Result<(), PipelineError> {
        let need = chunks.iter().map(|c| c.len).max().unwrap_or(0);
        let count = self.cfg.bounce_count(need.max(self.cfg.chunk_bytes));
        let fits = |b: &Bounce| {
            b.ring.slots().len() == count && b.ring.slots().first().is_some_and(|p| p.len() >= need)
        };
        if !self.bounce.as_ref().is_some_and(fits) {
            self.bounce = None;
            let bytes = need.max(self.cfg.chunk_bytes);
            let threads = self.cfg.effective_fill_threads();
            let staging = self.engine.config().staging.unwrap_or_default();
            self.bounce = Some(Bounce::new(count, bytes, threads, staging)?);
        }
        if let Some(b) = self.bounce.as_mut() {
            // Every request of an earlier run completed before it returned.
            b.ring.forget();
        }
        Ok(())
    }
}

struct GpuLanes<'r, F> {
    engine: &'r CudaEngine,
    compute: &'r Arc<CudaStream>,
    k: usize,
    ins: Vec<u64>,
    outs: Vec<u64>,
    src: &'r Source<'r>,
    dst: Option<&'r Dest<'r>>,
    stage: F,
    timing: Option<Timing>,
    bounce: Option<&'r mut Bounce>,
    /// The run's chunks (fills start ahead of the uploads, see [`GpuLanes::top_up`]).
    chunks: &'r [Chunk],
    /// The first chunk whose fill has not been started.
    next_fill: usize,
    /// How contiguous pageable fills are cut and waited for.
    fill: BounceFill,
}

impl<F> Drop for GpuLanes<'_, F> {
    /// Waits for the fills still in flight (a run stopped early): they read the run's source.
    fn drop(&mut self) {
        if let Some(b) = self.bounce.as_deref_mut() {
            b.ring.settle(&mut spin_wait);
        }
    }
}

/// The error of a stream wait for a dependency of `chunk`'s `phase`.
fn waited(chunk: usize, phase: Phase) -> impl FnOnce(InteropError) -> PipelineError {
    move |e| match e {
        InteropError::Request(r) => PipelineError::Copy {
            chunk,
            phase,
            source: r,
        },
        other => setup(other),
    }
}

impl<F, E> GpuLanes<'_, F>
where
    F: FnMut(&GpuChunk<'_>) -> Result<(), E>,
    E: Into<StageError>,
{
    /// Submits a copy of chunk `c` after `after` (the request of the step `dep`: chunk, phase),
    /// timed on the stream it runs on.
    fn copy(
        &mut self,
        c: &Chunk,
        phase: Phase,
        job: Job,
        after: Option<(&Request, (usize, Phase))>,
    ) -> Result<Request, PipelineError> {
        let start = match self.timing.is_some() {
            true => {
                let engine = self.engine;
                let kinds = (job.dst.kind, job.src.map_or(job.dst.kind, |s| s.kind));
                let stream = engine.stream(engine.direction_for(kinds.0, kinds.1));
                if let Some((a, _)) = after {
                    let dep = |e| PipelineError::Copy {
                        chunk: c.index,
                        phase,
                        source: RequestError::Dependency(Box::new(e)),
                    };
                    engine.stream_wait(stream, a).map_err(|e| match e {
                        InteropError::Request(r) => dep(r),
                        other => setup(other),
                    })?;
                }
                let deps: Vec<(usize, Phase)> = after.iter().map(|&(_, d)| d).collect();
                match self.timing.as_mut() {
                    Some(t) => Some((stream, t.begin(stream, &deps)?)),
                    None => None,
                }
            }
            false => None,
        };
        // SAFETY: the source and destination are borrowed for the run and the slots are the
        // pipeline's; `run` returns only after every request completed (core::InFlight); the
        // schedule orders each slot's writes after its last reader's event and before its
        // next reader's wait, so nothing else touches the bytes while this copy runs.
        let req = unsafe { self.engine.submit_raw(job) }.map_err(|e| PipelineError::Submit {
            chunk: c.index,
            phase,
            source: e,
        })?;
        if let (Some(t), Some((stream, start))) = (&mut self.timing, start) {
            if req.completion().as_any().is::<CudaCompletion>() {
                t.end(stream, c.index, phase, start)?;
            } else {
                t.open(stream, c.index, phase, start);
            }
        }
        Ok(req)
    }

    /// Starts filling chunk `c`'s bounce buffer on host threads (pageable: the fill workers;
    /// file: the file engine's reads), once the buffer's last DMA and fill have completed, and
    /// returns without waiting for the fill.
    fn prefetch(&mut self, c: &Chunk) -> Result<(), PipelineError> {
        let failed = |e: RequestError| PipelineError::Copy {
            chunk: c.index,
            phase: Phase::Upload,
            source: RequestError::Dependency(Box::new(e)),
        };
        let Some(bounce) = self.bounce.as_deref_mut() else {
            return Err(setup("no bounce buffers"));
        };
        let buf = bounce.ring.take(c.index, &mut spin_wait).map_err(failed)?;
        let pinned = RawBuf {
            len: c.len,
            ..buf.raw()
        };
        // SAFETY: the bounce buffer is the pipeline's, its last reader and writer have
        // completed (`take`), and nothing reads it before `ready` waited for this fill; `run`
        // waits for every fill before it returns (`GpuLanes`'s drop), so the source outlives it.
        let fill = match unsafe { self.src.load(c, pinned, None) } {
            Some(r) => r?,
            None => {
                let (from, from_l) = self.src.part(c)?;
                let submit = |e| PipelineError::Submit {
                    chunk: c.index,
                    phase: Phase::Upload,
                    source: e,
                };
                if from_l.is_contiguous() && from_l.size_bytes() == c.len {
                    let at = from.addr + from_l.offset() as u64;
                    let workers = bounce.staging.get_threads();
                    let demote = self.fill.demote_last
                        && demoted_fill(c.offset + c.len, self.src.len(), workers);
                    let filler = bounce.filler()?;
                    // SAFETY: as above: `c.len` source bytes from `at` (a contiguous layout
                    // checked within `from` by `part`) and the pinned buffer's first `c.len`.
                    unsafe { filler.queue(pinned.addr, at, c.len, self.fill.spread, demote) }
                        .map_err(|e| submit(crate::SubmitError::ShutDown(e.to_string())))?
                } else {
                    let job = Job::copy(pinned, self.src.slot_layout(c)?, from, from_l);
                    let cpu = bounce.strided()?;
                    // SAFETY: as above.
                    unsafe { cpu.submit_raw(job) }.map_err(submit)?
                }
            }
        };
        bounce.ring.filling(c.index, fill);
        Ok(())
    }

    /// Starts the fills of the next chunks, in order, while their buffers are free (the last
    /// DMA that read each has completed and its last fill was read): never waits. A fill that
    /// cannot be started stops here; that chunk's upload starts it again and reports the error
    /// (the failure is not the chunk being submitted now, whose requests must stay tracked).
    fn top_up(&mut self) {
        while let Some(next) = self.chunks.get(self.next_fill) {
            if !self
                .bounce
                .as_deref()
                .is_some_and(|b| b.ring.is_free(next.index))
            {
                return;
            }
            if self.prefetch(next).is_err() {
                return;
            }
            self.next_fill += 1;
        }
    }

    /// A pinned DMA of chunk `c` from its bounce buffer into `to` after `after`, once its fill
    /// (started ahead by [`GpuLanes::top_up`], or now) completed; then starts the fills whose
    /// buffers are free, which run while this DMA and the steps before it do.
    fn upload_bounced(
        &mut self,
        c: &Chunk,
        to: RawBuf,
        after: Option<&Request>,
    ) -> Result<Request, PipelineError> {
        let failed = |e: RequestError| PipelineError::Copy {
            chunk: c.index,
            phase: Phase::Upload,
            source: e,
        };
        if !self
            .bounce
            .as_ref()
            .is_some_and(|b| b.ring.is_filling(c.index))
        {
            // Fills start in chunk order and every earlier chunk's fill has been read: this is
            // the next fill (waiting for its buffer's last DMA if need be).
            self.prefetch(c)?;
            self.next_fill = self.next_fill.max(c.index + 1);
        }
        // The fills after it queue behind it (the workers take the oldest fill's pieces first).
        self.top_up();
        let Some(Bounce { ring, fill, .. }) = self.bounce.as_deref_mut() else {
            return Err(setup("no bounce buffers"));
        };
        // With `help`, this thread, which has nothing to submit before this upload, copies the
        // fill's untaken pieces itself (a contiguous pageable fill; others have none queued).
        let helper = fill.as_ref().filter(|_| self.fill.help);
        let mut wait = |r: Request| {
            if let Some(f) = helper {
                f.help(&r);
            }
            spin_wait(r)
        };
        let Some(buf) = ring.ready(c.index, &mut wait).map_err(failed)? else {
            return Err(setup("a bounce buffer read before its fill"));
        };
        let pinned = RawBuf {
            len: c.len,
            ..buf.raw()
        };
        let bytes = Layout::bytes(c.len).map_err(|e| PipelineError::Config(e.to_string()))?;
        let mut job = Job::copy(to, bytes, pinned, bytes);
        if let Some(a) = after {
            job = job.after(a);
        }
        let req = self.copy(c, Phase::Upload, job, after.map(|a| (a, self.reader_of(c))))?;
        if let Some(b) = self.bounce.as_deref_mut() {
            b.ring.lend(c.index, &req);
        }
        self.top_up();
        Ok(req)
    }

    /// The step an upload of chunk `c` waits for (when it waits): the last reader of its
    /// slot, the compute of chunk `c - K` (see `core::schedule`).
    fn reader_of(&self, c: &Chunk) -> (usize, Phase) {
        (c.index - self.k, Phase::Compute)
    }

    fn device(&self, addr: u64, len: usize) -> RawBuf {
        RawBuf {
            addr,
            len,
            kind: MemKind::Device {
                ordinal: self.engine.ordinal(),
            },
        }
    }
}

impl<F, E> Lanes for GpuLanes<'_, F>
where
    F: FnMut(&GpuChunk<'_>) -> Result<(), E>,
    E: Into<StageError>,
{
    fn wait(&mut self, req: Request) -> Result<(), RequestError> {
        spin_wait(req)
    }

    /// Not bounced: always. Bounced: starts the fills whose buffers are free, then says whether
    /// chunk `c`'s fill has completed (its upload would not wait for it).
    fn upload_ready(&mut self, c: &Chunk) -> bool {
        if self.bounce.is_none() {
            return true;
        }
        self.top_up();
        self.bounce
            .as_deref()
            .is_some_and(|b| b.ring.is_filled(c.index))
    }

    fn upload(
        &mut self,
        c: &Chunk,
        slot: usize,
        after: Option<&Request>,
    ) -> Result<Request, PipelineError> {
        let to = self.device(self.ins[slot], c.len);
        if self.bounce.is_some() {
            return self.upload_bounced(c, to, after);
        }
        // SAFETY: the slot is the pipeline's; `load` starts the file's load only after the
        // slot's last reader (`after`) and `run` returns only after it completed.
        if let Some(r) = unsafe { self.src.load(c, to, after) } {
            return r;
        }
        let (from, from_l) = self.src.part(c)?;
        let mut job = Job::copy(to, self.src.slot_layout(c)?, from, from_l);
        if let Some(a) = after {
            job = job.after(a);
        }
        self.copy(c, Phase::Upload, job, after.map(|a| (a, self.reader_of(c))))
    }

    fn compute(
        &mut self,
        c: &Chunk,
        slot: usize,
        upload: &Request,
        out_free: Option<&Request>,
    ) -> Result<Request, PipelineError> {
        let cs = self.compute;
        self.engine
            .stream_wait(cs, upload)
            .map_err(waited(c.index, Phase::Upload))?;
        if let Some(d) = out_free {
            self.engine
                .stream_wait(cs, d)
                .map_err(waited(c.index - self.k, Phase::Download))?;
        }
        let start = match &mut self.timing {
            Some(t) => {
                t.close_open(cs)?;
                let out = out_free.map(|_| (c.index - self.k, Phase::Download));
                let deps: Vec<_> = [(c.index, Phase::Upload)].into_iter().chain(out).collect();
                Some(t.begin(cs, &deps)?)
            }
            None => None,
        };
        let g = GpuChunk {
            chunk: *c,
            input: self.ins[slot],
            output: self.outs.get(slot).copied().filter(|_| c.out_len > 0),
            stream: cs,
        };
        (self.stage)(&g).map_err(|e| PipelineError::Stage {
            chunk: c.index,
            source: e.into(),
        })?;
        if let (Some(t), Some(start)) = (&mut self.timing, start) {
            t.end(cs, c.index, Phase::Compute, start)?;
        }
        self.engine.record(cs).map_err(setup)
    }

    fn download(
        &mut self,
        c: &Chunk,
        slot: usize,
        computed: &Request,
    ) -> Result<Request, PipelineError> {
        let (Some(dst), Some(&out)) = (self.dst, self.outs.get(slot)) else {
            return Ok(Request::ready(Ok(())));
        };
        if c.out_len == 0 {
            return Ok(Request::ready(Ok(())));
        }
        let bytes = Layout::bytes(c.out_len).map_err(|e| PipelineError::Config(e.to_string()))?;
        let job = Job::copy(dst.part(c), bytes, self.device(out, c.out_len), bytes).after(computed);
        self.copy(
            c,
            Phase::Download,
            job,
            Some((computed, (c.index, Phase::Compute))),
        )
    }
}
