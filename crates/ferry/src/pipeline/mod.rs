//! Double/triple buffering: stream a large source through K slots while the previous chunks
//! are computed and their results copied back. The seed's loop (load batch N+1, compute batch
//! N, write back batch N-1, all at once), correct by construction.
//!
//! A [`Source`] (host memory of any kind, a strided [`Layout`] over it, or a file range read
//! through a [`FileEngine`] chunk by chunk) is cut into
//! [`Chunk`]s of [`PipelineConfig::chunk_bytes`]; chunk `i` goes to slot `i % K`
//! ([`PipelineConfig::slots`], K >= 1: 2 is double, 3 triple buffering). For each chunk:
//! 1. *upload*: the engine copies it into its input slot, once the slot's previous reader
//!    (the compute of chunk `i - K`) has finished;
//! 2. *compute*: the user's stage runs on the input slot and may write an output slot, once
//!    the upload is done and the output slot's previous download (chunk `i - K`) has finished;
//! 3. *download* (when a [`Dest`] is given): the engine copies the output slot's first
//!    [`OutLen`] bytes to the destination, after the compute.
//!
//! Each arrow is a dependency between requests, never a wait of the submitting thread: on the
//! GPU ([`CudaPipeline`]) an event waited on by a stream (`cuStreamWaitEvent`), the stage
//! enqueues its kernels on the pipeline's compute stream, and uploads run ahead by K-1 chunks,
//! so the copy engines and the SMs are busy at once. On the CPU ([`CpuPipeline`]) the three
//! steps run on three lane threads, each in order like a stream, the copies on any
//! [`Engine`](crate::Engine) (a [`CpuEngine`](crate::CpuEngine)) and the stage a closure. The
//! submitting thread waits only to bound the work queued ahead ([`PipelineConfig::depth`]
//! chunks), on a chunk `depth` behind the newest, and at the end.
//!
//! The slots belong to the pipeline; a stage sees its chunk's slots only for the call (GPU:
//! device addresses valid for the work it enqueues on the compute stream; CPU: slices), so no
//! caller code can reach a slot while a copy or an earlier chunk's compute still uses it: the
//! reuse order above is the pipeline's, not the caller's care. `run` borrows the source and
//! the destination, and returns (or unwinds, if the stage panics) only once every request it
//! made has completed.
//!
//! Errors: the first failure in chunk order stops the pipeline: a stage error (GPU: returned
//! while enqueueing; CPU: returned by the closure) is [`PipelineError::Stage`] with the chunk
//! and the stage's own error; a failed copy is [`PipelineError::Copy`] with the chunk and the
//! step. Nothing more is submitted, everything in flight is waited for, every request's result
//! is observed (the engine's next barrier does not report them again), and the pipeline and
//! the engine stay usable.
//!
//! A [`Timeline`] of every chunk's upload, compute and download (GPU: CUDA events; CPU: the
//! clock) is kept on request ([`PipelineConfig::timeline`]) and exported as Chrome trace JSON.
//!
//! ```
//! use ferry::pipeline::{CpuPipeline, Dest, OutLen, PipelineConfig, Source};
//! let engine = ferry::CpuEngine::new(2)?;
//! let src: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
//! let mut dst = vec![0u8; src.len()];
//! let cfg = PipelineConfig::new(16 << 10, 3).output(OutLen::Same);
//! let mut p = CpuPipeline::new(&engine, cfg)?;
//! p.run(Source::new(&src), Some(Dest::new(&mut dst)), |_c, input: &[u8], out: &mut [u8]| {
//!     for (o, i) in out.iter_mut().zip(input) {
//!         *o = i.wrapping_mul(2);
//!     }
//!     Ok::<(), std::convert::Infallible>(())
//! })?;
//! assert!(dst.iter().zip(&src).all(|(d, s)| *d == s.wrapping_mul(2)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bounce;
mod core;
mod cpu;
mod cuda;
mod timeline;

pub use cpu::CpuPipeline;
pub use cuda::{CudaPipeline, GpuChunk};
pub use timeline::{ChunkTimes, Span, Timeline, TimelineClock};

use crate::engine::SubmitError;
use crate::file::{FileEngine, FileHandle, IoOp};
use crate::layout::Layout;
use crate::memory::{Memory, MemoryMut, RawBuf};
use crate::request::{Request, RequestError};
use std::marker::PhantomData;
use thiserror::Error;

/// A stage's own error, kept as it was returned.
pub type StageError = Box<dyn std::error::Error + Send + Sync>;

/// [`PipelineConfig::bounce_count`] keeps at least this many bytes of bounce buffers.
///
/// Measured on the H200 host (run 43, `FERRY_BENCH_BOUNCE=N ferry bench --engine cuda --test
/// cuda-pipeline-pageable,cuda-pipeline-file --sizes 64M,256M`, two rounds; the pinned source
/// moves 43.5 GB/s at 64 MiB, 47 at 256 MiB): with 2 MiB chunks (64 MiB), 5 buffers (K + 2)
/// moved the pageable source at 28.0-28.1 GB/s, 8 (16 MiB) at 35.9-37.9, 12 at 35.5-35.6, 16-32
/// at 32.1-34.7; the file source 22.5-23.9 with 5, 28.8-28.9 with 8, 29.2-33.2 with 12-32.
/// With 8 MiB chunks (256 MiB), 5 or 8 buffers (40-64 MiB) moved 42.7-44.4 GB/s and 12 or
/// more (96 MiB and up) 29.9-43.1, falling with the count: fills beyond some tens of MiB
/// ahead no longer help, and the DMAs slow down as the buffers' bytes leave the CPU's cache.
pub const BOUNCE_AHEAD_BYTES: usize = 16 << 20;
/// [`PipelineConfig::bounce_count`]'s automatic count is at most this many buffers.
pub const BOUNCE_MAX: usize = 32;
/// The most CPU threads that fill a GPU pipeline's bounce buffers from a pageable source, whole
/// or strided, unless [`PipelineConfig::fill_threads`] says otherwise: the automatic count is
/// the staged copies' default worker count
/// ([`StagingConfig::new`](crate::engine::cuda::paths::staged::StagingConfig::new): three quarters of the
/// cores, 1 to 12, so 12 on the 16-core H200 host) capped at this, so 8 there and 1 on a 2-core
/// host. One core copies 8-12 GB/s from cached pageable memory into pinned memory and the DMA
/// reads about 53 GB/s (H200 host, PCIe gen5), so 8 threads keep up with it and leave half of
/// that host's cores to the submitting thread, the caller's program and the file engine's
/// readers.
///
/// More threads are not faster: their bursts of copying share host memory with the DMAs that
/// read the filled buffers, and the uploads slow down while fills run (13% at 64 MiB in run
/// 62's timeline). Measured on the H200 host (runs 63-64 of `bench/results/h200.md`, one
/// machine, `ferry bench --engine cuda --test cuda-pipeline-pageable --sizes 64M,256M`, the
/// pageable and the pinned source timed in turns; five series with 8 and 12 threads, three
/// with 10, two with 4 and 16): the pageable source over the pinned one, 64 MiB in 2 MiB
/// chunks, 0.88-0.89 with 8 threads against 0.82-0.88 with 12 (the staging workers' count,
/// used until then), 0.85-0.88 with 10, 0.68-0.80 with 16, 0.40-0.44 with 4; 256 MiB in 8 MiB
/// chunks, 0.88-0.96 with 8 and 0.81-0.94 with 12. Run 65, another machine, in rounds
/// alternating with 12 threads: 0.85-0.89 against 0.81-0.83 at 64 MiB, 0.83-0.96 against
/// 0.91-0.95 at 256 MiB; run 69, a noisier machine: 0.78-0.88 against 0.50-0.85 at 64 MiB,
/// 0.76-0.82 against 0.44-0.91 at 256 MiB. Fewer threads win with short chunks; with 8 MiB
/// chunks neither count is ahead on every machine, and 8 leaves the host four more cores.
pub const FILL_THREADS: usize = 8;
/// The most fill threads [`PipelineConfig::fill_threads`] may ask for (the staged copies'
/// workers' limit).
pub const FILL_THREADS_MAX: usize = 256;

/// The most slots [`PipelineConfig::slots`] may ask for (a pipeline keeps at most a few
/// chunks in flight; 2^40 once asked for terabytes of slot headers and aborted).
pub const SLOTS_MAX: usize = 1024;

/// The most chunks one run may have: a run plans every chunk before it starts (40 bytes
/// each, so at most 640 MiB of plan), and a run of more is refused with
/// [`PipelineError::Config`] naming the smallest `chunk_bytes` that fits. `chunk_bytes = 1`
/// over a file source of terabytes once asked for the list of every byte and aborted the
/// process out of memory. 2^24 chunks of 64 KiB are 1 TiB.
pub const CHUNKS_MAX: usize = 1 << 24;

/// Settings of a pipeline. Plain struct: [`PipelineConfig::new`] then chained setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Bytes per chunk (the input slots' size); a strided source takes whole rows of its
    /// outermost dimension, as many as fit (at least one).
    pub chunk_bytes: usize,
    /// Slots K (1 to [`SLOTS_MAX`]): chunks in the slots at once.
    pub slots: usize,
    /// Output bytes per chunk (when a [`Dest`] is given).
    pub output: OutLen,
    /// Chunks submitted ahead of the oldest unfinished one before the submitting thread waits
    /// (0: `max(2 K, 4)`).
    pub depth: usize,
    /// Keep a [`Timeline`] of the run. On a GPU that costs the run time: each step is
    /// followed by a timing-enabled CUDA event (and preceded by one where its start cannot be
    /// known from the events it follows: the stream's first step, or a stream that went idle
    /// before the step was begun), and each such record cost the H200 host's streams about
    /// 1.4 us (run 66 of `bench/results/h200.md`: a raw 3-stream loop of 32 chunks of 2 MiB took
    /// 1,677-1,685 us with one after every step, 1,819-1,823 us with one before and after, against
    /// 1,543-1,563 without; the same records of events without timing cost nothing). A step's
    /// span runs from the moment its stream reached it (its previous work and its waits done) to
    /// its end; the wall of a traced run is longer than an untraced one's.
    pub timeline: bool,
    /// Pinned bounce buffers of a chunk for a pageable or file source on a GPU (0: automatic,
    /// [`PipelineConfig::bounce_count`]). More let the fills run further ahead of the uploads,
    /// at a chunk of pinned memory each.
    pub bounce: usize,
    /// How host threads share the fills of those buffers from a contiguous pageable source
    /// ([`BounceFill::ALL`] by default).
    pub bounce_fill: BounceFill,
    /// CPU threads that fill those buffers from a pageable source, whole or strided (0:
    /// automatic, [`PipelineConfig::effective_fill_threads`]; at most [`FILL_THREADS_MAX`]).
    /// Started on the first run that needs them (whole and strided sources each their own set)
    /// and kept by the pipeline, started anew when a run needs larger or more bounce buffers. A
    /// file source's buffers are filled by its file engine's readers instead.
    pub fill_threads: usize,
}

/// How a GPU pipeline fills its bounce buffers from a contiguous pageable source
/// ([`PipelineConfig::bounce_fill`]): each fill is cut into pieces taken by the fill workers,
/// the oldest fill's first, and the submitting thread waits for a fill only when the upload
/// its next compute needs is not yet filled.
///
/// Why (64 MiB through 2 MiB chunks, K = 3, 8 buffers, 12 workers on the H200 host, as
/// measured before [`FILL_THREADS`] became 8): a run
/// queues the fills of chunks 0-7 at once, and its first DMA waits for chunk 0's fill. Cut in
/// 256 KiB pieces, that fill is 8 pieces: 8 workers take it while the other 4 start chunk 1,
/// so it takes one piece's time at 8/12 of the host's copy rate (about 47 GB/s for 12
/// threads: some 65 us) instead of 2 MiB at the full rate (45 us), and nothing is on the
/// copy engine meanwhile. Later, whenever the fills fall behind the DMAs (one core copies
/// 8-12 GB/s, the DMA reads 53 GB/s), the submitting thread spins idle on the fill the next
/// upload needs.
///
/// Measured (H200 host, runs 48-51 of `bench/results/h200.md`, `FERRY_BENCH_FILL` A/B in one
/// machine's calls, `cuda-pipeline-pageable`): on a host whose pageable rows swung 14-37 GB/s
/// from series to series, the median of the series' medians at 64 MiB was 35.2 GB/s with both
/// settings against 22.6 with neither (spread alone 29.7, help alone 30.7), at 256 MiB 34.4
/// against 28.9; the pinned-source pipeline moved 43-47 GB/s there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BounceFill {
    /// Cut every fill into a multiple of the fill workers' count (pieces of 256 KiB at most,
    /// 64 KiB at least), so that a fill queued alone, or first, has every worker at once.
    pub spread: bool,
    /// The submitting thread copies the untaken pieces of the fill it waits for (a core more on
    /// it, and one that is awake) before it waits for the pieces still being copied.
    pub help: bool,
    /// The run's last fills, after which too few bytes are filled to push their lines out of
    /// the copying cores' private caches before their DMAs read them, move those lines to the
    /// shared cache themselves (`CLDEMOTE` on x86-64 CPUs that have it, Sapphire Rapids Xeons
    /// on; nothing elsewhere). On the H200 host (runs 96-104 of `bench/results/h200.md`) the last
    /// 2 MiB uploads of a 64 MiB run took 57-107 us without, 44-52 us with (one 64), as from
    /// pinned memory (45-47 us).
    pub demote_last: bool,
}

impl BounceFill {
    /// 256 KiB pieces; the submitting thread only waits; nothing demoted (the behaviour
    /// before any of the settings).
    pub const PIECES: BounceFill = BounceFill {
        spread: false,
        help: false,
        demote_last: false,
    };
    /// Spread pieces and a helping submitting thread, nothing demoted (the default before
    /// `demote_last`).
    pub const SPREAD_HELP: BounceFill = BounceFill {
        spread: true,
        help: true,
        demote_last: false,
    };
    /// Every setting: the default.
    pub const ALL: BounceFill = BounceFill {
        spread: true,
        help: true,
        demote_last: true,
    };
}

impl Default for BounceFill {
    /// [`BounceFill::ALL`].
    fn default() -> BounceFill {
        BounceFill::ALL
    }
}

impl PipelineConfig {
    /// Chunks of `chunk_bytes` through `slots` slots; output as long as each chunk's input;
    /// no timeline.
    pub fn new(chunk_bytes: usize, slots: usize) -> PipelineConfig {
        PipelineConfig {
            chunk_bytes,
            slots,
            output: OutLen::Same,
            depth: 0,
            timeline: false,
            bounce: 0,
            bounce_fill: BounceFill::default(),
            fill_threads: 0,
        }
    }
    /// Sets the output bytes per chunk.
    pub fn output(mut self, output: OutLen) -> PipelineConfig {
        self.output = output;
        self
    }
    /// Sets how many chunks may be submitted ahead (0: automatic).
    pub fn depth(mut self, chunks: usize) -> PipelineConfig {
        self.depth = chunks;
        self
    }
    /// Keeps a timeline of every run.
    pub fn timeline(mut self, on: bool) -> PipelineConfig {
        self.timeline = on;
        self
    }
    /// Sets the number of bounce buffers (0: automatic).
    pub fn bounce(mut self, buffers: usize) -> PipelineConfig {
        self.bounce = buffers;
        self
    }
    /// Sets how the bounce buffers are filled from a contiguous pageable source.
    pub fn bounce_fill(mut self, fill: BounceFill) -> PipelineConfig {
        self.bounce_fill = fill;
        self
    }
    /// Sets the CPU threads that fill the bounce buffers from a pageable source (0:
    /// automatic).
    ///
    /// ```
    /// use ferry::pipeline::{PipelineConfig, FILL_THREADS};
    /// let cfg = PipelineConfig::new(2 << 20, 3);
    /// assert!((1..=FILL_THREADS).contains(&cfg.effective_fill_threads()));
    /// assert_eq!(cfg.fill_threads(4).effective_fill_threads(), 4);
    /// ```
    pub fn fill_threads(mut self, threads: usize) -> PipelineConfig {
        self.fill_threads = threads;
        self
    }
    /// The fill threads a run from a pageable source starts: [`PipelineConfig::fill_threads`]
    /// where set, else the staged copies' default worker count
    /// ([`StagingConfig::new`](crate::engine::cuda::paths::staged::StagingConfig::new)), at most [`FILL_THREADS`].
    pub fn effective_fill_threads(&self) -> usize {
        match self.fill_threads {
            0 => crate::engine::cuda::paths::staged::StagingConfig::new()
                .get_threads()
                .min(FILL_THREADS),
            n => n,
        }
    }

    /// The bounce buffers a GPU pipeline keeps for a pageable or file source of chunks of
    /// `chunk` bytes: [`PipelineConfig::bounce`] where set, else K + 2 (the fill of chunk
    /// `i + 1`, started right after chunk `i`'s upload is enqueued, then waits only for the DMA
    /// of chunk `i - K - 1`) and at least [`BOUNCE_AHEAD_BYTES`] of them, at most
    /// [`BOUNCE_MAX`]: short chunks' fills then run several chunks ahead, so that one late
    /// fill does not stall the uploads.
    ///
    /// ```
    /// use ferry::pipeline::PipelineConfig;
    /// assert_eq!(PipelineConfig::new(8 << 20, 3).bounce_count(8 << 20), 5);
    /// assert_eq!(PipelineConfig::new(2 << 20, 3).bounce_count(2 << 20), 8);
    /// assert_eq!(PipelineConfig::new(2 << 20, 3).bounce(5).bounce_count(2 << 20), 5);
    /// ```
    pub fn bounce_count(&self, chunk: usize) -> usize {
        if self.bounce > 0 {
            return self.bounce;
        }
        let ahead = BOUNCE_AHEAD_BYTES.div_ceil(chunk.max(1));
        (self.slots + 2).max(ahead.min(BOUNCE_MAX))
    }

    fn check(&self) -> Result<(), PipelineError> {
        if self.chunk_bytes == 0 || self.slots == 0 {
            return Err(PipelineError::Config(
                "chunk_bytes and slots must be at least 1".into(),
            ));
        }
        if self.slots > SLOTS_MAX {
            return Err(PipelineError::Config(format!(
                "slots {} is more than {SLOTS_MAX}",
                self.slots
            )));
        }
        if let OutLen::Ratio { den: 0, .. } = self.output {
            return Err(PipelineError::Config("OutLen::Ratio with den = 0".into()));
        }
        if self.fill_threads > FILL_THREADS_MAX {
            return Err(PipelineError::Config(format!(
                "fill_threads {} is more than {FILL_THREADS_MAX}",
                self.fill_threads
            )));
        }
        Ok(())
    }

    /// The effective depth: at least K (a slot's previous chunk must be in flight).
    fn effective_depth(&self) -> usize {
        if self.depth == 0 {
            (2 * self.slots).max(4)
        } else {
            self.depth.max(self.slots)
        }
    }
}

/// How many output bytes a chunk of `len` input bytes has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutLen {
    /// As many as its input.
    Same,
    /// This many for every chunk (a per-chunk reduction).
    Fixed(usize),
    /// `len * num / den`, rounded up (e.g. f64 in, f32 out: 1/2).
    Ratio {
        /// Numerator.
        num: usize,
        /// Denominator (not 0).
        den: usize,
    },
}

impl OutLen {
    /// Output bytes of a chunk of `len` input bytes; `usize::MAX` where that does not fit (no
    /// slot of it can be allocated: the pipeline reports that as an error).
    ///
    /// ```
    /// use ferry::pipeline::OutLen;
    /// let same = OutLen::Ratio { num: usize::MAX, den: usize::MAX };
    /// assert_eq!(same.of(1 << 20), 1 << 20);
    /// ```
    pub fn of(self, len: usize) -> usize {
        match self {
            OutLen::Same => len,
            OutLen::Fixed(n) => n,
            // In 128 bits: `len * num` in `usize` overflowed for a large numerator (a panic in
            // debug builds, a wrapped, far too short output in release builds).
            OutLen::Ratio { num, den } => {
                usize::try_from((len as u128 * num as u128).div_ceil(den.max(1) as u128))
                    .unwrap_or(usize::MAX)
            }
        }
    }
}

/// What a pipeline reads: host memory of any kind (pageable, pinned, registered, mapped,
/// managed) or device memory, whole or through a strided layout, or a byte range of a file
/// read chunk by chunk through a [`FileEngine`]. Borrowed for the run.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    buf: RawBuf,
    layout: Option<Layout>,
    file: Option<FileSource<'a>>,
    _borrow: PhantomData<&'a [u8]>,
}

/// A file range a [`Source`] reads: each chunk is one [`FileEngine`] load straight into its
/// slot, no buffer of the whole range.
#[derive(Clone, Copy)]
struct FileSource<'a> {
    engine: &'a FileEngine,
    file: &'a FileHandle,
    offset: u64,
}

impl std::fmt::Debug for FileSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource")
            .field("path", &self.file.path())
            .field("offset", &self.offset)
            .finish()
    }
}

impl<'a> Source<'a> {
    /// All of `mem`, in order.
    pub fn new<M: Memory + ?Sized>(mem: &'a M) -> Source<'a> {
        Source {
            buf: mem.raw(),
            layout: None,
            file: None,
            _borrow: PhantomData,
        }
    }

    /// `len` bytes of `file` from `offset`, each chunk loaded by `engine` (its parallel reads):
    /// on the CPU straight into its input slot, once the slot's previous reader has finished
    /// (waited for on the submitting thread); on the GPU into one of the pipeline's pinned
    /// bounce buffers, then DMAed into the slot (as a pageable source, see [`CudaPipeline`]).
    /// Errors: the range overflows. A file shorter than the range fails the first chunk that
    /// reaches past its end ([`PipelineError::Copy`] of its upload, with the file's error).
    pub fn file(
        engine: &'a FileEngine,
        file: &'a FileHandle,
        offset: u64,
        len: usize,
    ) -> Result<Source<'a>, PipelineError> {
        if offset.checked_add(len as u64).is_none() {
            return Err(PipelineError::Config(format!(
                "file range: offset {offset} + {len} bytes overflows"
            )));
        }
        Ok(Source {
            buf: RawBuf {
                addr: 0,
                len,
                kind: crate::memory::MemKind::Pageable,
            },
            layout: None,
            file: Some(FileSource {
                engine,
                file,
                offset,
            }),
            _borrow: PhantomData,
        })
    }

    /// For a file source: queues chunk `c`'s load into `to` (its input slot, `c.len` bytes)
    /// once `after` (the slot's previous reader) has completed, waited for here. `None` for
    /// memory sources.
    ///
    /// # Safety
    /// 1. `to` is valid for writes of `c.len` bytes, of its kind, until the returned request
    ///    completes, and nothing else reads or writes it until then.
    pub(crate) unsafe fn load(
        &self,
        c: &Chunk,
        to: RawBuf,
        after: Option<&Request>,
    ) -> Option<Result<Request, PipelineError>> {
        let f = self.file?;
        let failed = |e: RequestError| PipelineError::Copy {
            chunk: c.index,
            phase: Phase::Upload,
            source: e,
        };
        Some((|| {
            if let Some(a) = after {
                a.completion()
                    .wait()
                    .map_err(|e| failed(RequestError::Dependency(Box::new(e))))?;
            }
            let to = RawBuf { len: c.len, ..to };
            // SAFETY: the slot is valid and unshared until the request completes (1).
            let (req, _) = unsafe {
                f.engine
                    .submit(f.file, f.offset + c.offset as u64, to, IoOp::Read)
            }
            .map_err(|e| failed(e.into()))?;
            Ok(req)
        })())
    }

    /// The elements of `layout` over `mem`, in the layout's order; chunks are whole rows of its
    /// outermost dimension, packed densely in the slots. Errors: the layout reaches outside
    /// `mem`.
    pub fn strided<M: Memory + ?Sized>(
        mem: &'a M,
        layout: Layout,
    ) -> Result<Source<'a>, PipelineError> {
        let buf = mem.raw();
        layout
            .check_buffer(buf.len)
            .map_err(|e| PipelineError::Config(format!("source layout: {e}")))?;
        Ok(Source {
            buf,
            layout: Some(layout),
            file: None,
            _borrow: PhantomData,
        })
    }

    /// Bytes of data the source holds.
    pub fn len(&self) -> usize {
        self.layout.map_or(self.buf.len, |l| l.size_bytes())
    }

    /// True when there is nothing to read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The chunks for input slots of `chunk_bytes` (outputs only `with_output`), and the
    /// bytes of the largest. Errors ([`PipelineError::Config`]): more than [`CHUNKS_MAX`]
    /// chunks (counted before anything is allocated), outputs that together overflow `usize`;
    /// [`PipelineError::Setup`]: no memory for the list.
    pub(crate) fn chunks(
        &self,
        cfg: &PipelineConfig,
        with_output: bool,
    ) -> Result<(Vec<Chunk>, usize), PipelineError> {
        // A chunk is whole rows of a strided source, any bytes of a whole buffer.
        let row = self.layout.map_or(1, |l| l.size_bytes() / l.dims()[0]);
        let (step, total) = match self.layout {
            None => (cfg.chunk_bytes.max(1), self.buf.len),
            // At most the whole source: `(chunk_bytes / row) * row` may overflow otherwise.
            Some(l) => (
                (cfg.chunk_bytes / row).clamp(1, l.dims()[0]) * row,
                l.size_bytes(),
            ),
        };
        let count = total.div_ceil(step);
        if count > CHUNKS_MAX {
            let fits = (total / row).div_ceil(CHUNKS_MAX) * row;
            return Err(PipelineError::Config(format!(
                "chunk_bytes {} cuts {total} bytes into {count} chunks, more than \
                 {CHUNKS_MAX}: chunk_bytes must be at least {fits}",
                cfg.chunk_bytes
            )));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(count)
            .map_err(|e| PipelineError::Setup(format!("the list of {count} chunks: {e}")))?;
        let (mut off, mut out_off) = (0usize, 0usize);
        while off < total {
            let len = step.min(total - off);
            let out_len = if with_output { cfg.output.of(len) } else { 0 };
            out.push(Chunk {
                index: out.len(),
                offset: off,
                len,
                out_offset: out_off,
                out_len,
            });
            off += len;
            out_off = out_off.checked_add(out_len).ok_or_else(|| {
                PipelineError::Config(format!(
                    "the outputs of {total} bytes of input need more than {} bytes",
                    usize::MAX
                ))
            })?;
        }
        Ok((out, step.min(total)))
    }

    /// The source side of chunk `c`'s upload: a buffer and the layout of the chunk in it.
    fn part(&self, c: &Chunk) -> Result<(RawBuf, Layout), PipelineError> {
        let bad = |e: crate::LayoutError| PipelineError::Config(format!("chunk layout: {e}"));
        match self.layout {
            None => {
                let buf = RawBuf {
                    addr: self.buf.addr + c.offset as u64,
                    len: c.len,
                    kind: self.buf.kind,
                };
                Ok((buf, Layout::bytes(c.len).map_err(bad)?))
            }
            Some(l) => {
                let row = l.size_bytes() / l.dims()[0];
                let rows = c.offset / row..(c.offset + c.len) / row;
                Ok((self.buf, l.slice(0, rows, 1).map_err(bad)?))
            }
        }
    }

    /// The dense layout chunk `c` takes in its slot.
    fn slot_layout(&self, c: &Chunk) -> Result<Layout, PipelineError> {
        let bad = |e: crate::LayoutError| PipelineError::Config(format!("chunk layout: {e}"));
        match self.layout {
            None => Layout::bytes(c.len).map_err(bad),
            Some(l) => {
                let row = l.size_bytes() / l.dims()[0];
                let mut dims = [0usize; crate::MAX_DIMS];
                dims[..l.ndim()].copy_from_slice(l.dims());
                dims[0] = c.len / row;
                Layout::contiguous(&dims[..l.ndim()], l.elem_size()).map_err(bad)
            }
        }
    }
}

/// Where a pipeline writes the chunks' outputs, one after the other from its start: host
/// memory of any kind or device memory. Borrowed for the run.
#[derive(Debug)]
pub struct Dest<'a> {
    buf: RawBuf,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Dest<'a> {
    /// All of `mem`.
    pub fn new<M: MemoryMut + ?Sized>(mem: &'a mut M) -> Dest<'a> {
        Dest {
            buf: mem.raw_mut(),
            _borrow: PhantomData,
        }
    }

    /// Chunk `c`'s part of the destination.
    fn part(&self, c: &Chunk) -> RawBuf {
        RawBuf {
            addr: self.buf.addr + c.out_offset as u64,
            len: c.out_len,
            kind: self.buf.kind,
        }
    }
}

/// One chunk of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Its number, from 0.
    pub index: usize,
    /// Byte offset of its data in the source's order (the source's element order for a
    /// strided source).
    pub offset: usize,
    /// Bytes of input.
    pub len: usize,
    /// Byte offset of its output in the destination.
    pub out_offset: usize,
    /// Bytes of output ([`PipelineConfig::output`] of `len`; 0 without a destination).
    pub out_len: usize,
}

/// One of a chunk's three steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Source to input slot.
    Upload,
    /// The stage.
    Compute,
    /// Output slot to destination.
    Download,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Upload => "upload",
            Phase::Compute => "compute",
            Phase::Download => "download",
        })
    }
}

/// What a completed run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Chunks run.
    pub chunks: usize,
    /// Bytes read from the source.
    pub bytes_in: u64,
    /// Bytes written to the destination.
    pub bytes_out: u64,
    /// Host time from the call to the end of the last chunk.
    pub elapsed: std::time::Duration,
    /// Every chunk's steps, when [`PipelineConfig::timeline`] is set.
    pub timeline: Option<Timeline>,
}

/// Why a pipeline run failed (or could not start). The pipeline and its engine stay usable.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// Bad settings or buffers (zero slots, a destination too short, a layout outside its
    /// buffer).
    #[error("invalid pipeline: {0}")]
    Config(String),
    /// Slots, streams, events or lane threads could not be made.
    #[error("cannot set up the pipeline: {0}")]
    Setup(String),
    /// The stage returned an error on this chunk.
    #[error("the stage failed on chunk {chunk}: {source}")]
    Stage {
        /// The chunk.
        chunk: usize,
        /// The stage's own error.
        source: StageError,
    },
    /// The stage panicked on this chunk (CPU pipelines; a GPU stage's panic unwinds through
    /// `run`, which waits for everything in flight first).
    #[error("the stage panicked on chunk {chunk}: {msg}")]
    Panicked {
        /// The chunk.
        chunk: usize,
        /// The panic message.
        msg: String,
    },
    /// The engine refused a copy.
    #[error("{phase} of chunk {chunk} refused: {source}")]
    Submit {
        /// The chunk.
        chunk: usize,
        /// The step.
        phase: Phase,
        /// The engine's error.
        source: SubmitError,
    },
    /// A copy (or the wait that orders a step after another) failed.
    #[error("{phase} of chunk {chunk} failed: {source}")]
    Copy {
        /// The chunk.
        chunk: usize,
        /// The step.
        phase: Phase,
        /// The request's error.
        source: RequestError,
    },
}

impl PipelineError {
    /// The chunk the failure happened on, if it is a chunk's.
    pub fn chunk(&self) -> Option<usize> {
        match self {
            PipelineError::Stage { chunk, .. }
            | PipelineError::Panicked { chunk, .. }
            | PipelineError::Submit { chunk, .. }
            | PipelineError::Copy { chunk, .. } => Some(*chunk),
            _ => None,
        }
    }
}

/// A run's chunks, checked against its destination (which must hold every output).
fn plan(
    cfg: &PipelineConfig,
    src: &Source<'_>,
    dst: Option<&Dest<'_>>,
) -> Result<Vec<Chunk>, PipelineError> {
    let (chunks, _) = src.chunks(cfg, dst.is_some())?;
    check_dest(&chunks, dst)?;
    Ok(chunks)
}

impl RunReport {
    /// The report of a run of `chunks` over `src` that started at `t0`.
    fn of(
        chunks: &[Chunk],
        src: &Source<'_>,
        t0: std::time::Instant,
        timeline: Option<Timeline>,
    ) -> RunReport {
        RunReport {
            chunks: chunks.len(),
            bytes_in: src.len() as u64,
            bytes_out: chunks.iter().map(|c| c.out_len as u64).sum(),
            elapsed: t0.elapsed(),
            timeline,
        }
    }
}

/// The slot sizes a run's chunks need: (the largest input, the largest output). A strided
/// source's chunk is at least one whole row, which may be more than `chunk_bytes`: the
/// pipelines grow their slots to these before the run (sized to `chunk_bytes` alone, such a
/// chunk was once copied past its slot's end).
pub(crate) fn slot_need(chunks: &[Chunk]) -> (usize, usize) {
    chunks
        .iter()
        .fold((0, 0), |(i, o), c| (i.max(c.len), o.max(c.out_len)))
}

/// Checks a run's buffers against its chunks: the destination holds every output.
fn check_dest(chunks: &[Chunk], dst: Option<&Dest<'_>>) -> Result<(), PipelineError> {
    if let (Some(d), Some(last)) = (dst, chunks.last()) {
        let need = last.out_offset + last.out_len;
        if need > d.buf.len {
            return Err(PipelineError::Config(format!(
                "the destination holds {} bytes, the outputs need {need}",
                d.buf.len
            )));
        }
    }
    Ok(())
}
