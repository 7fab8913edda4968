//! A pipeline's settings: [`PipelineConfig`] (chunks, slots, output length, depth, timeline,
//! bounce buffers and how they are filled) and the limits and defaults it is checked against.

use super::error::PipelineError;

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
/// the staging subsystem's default worker count (that of the staged copies, `staging/policy.rs`:
/// three quarters of the cores, 1 to 12, so 12 on the 16-core H200 host) capped at this, so 8 there and 1 on a 2-core
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
    /// Output bytes per chunk (when a [`Dest`](super::Dest) is given).
    pub output: OutLen,
    /// Chunks submitted ahead of the oldest unfinished one before the submitting thread waits
    /// (0: `max(2 K, 4)`).
    pub depth: usize,
    /// Keep a [`Timeline`](super::Timeline) of the run. On a GPU that costs the run time: each step
    /// is followed by a timing-enabled CUDA event (and preceded by one where its start cannot be
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
    /// A whole source's fills run on that many of the process's host copy workers, one set
    /// shared by every pipeline and staged copy and never more threads than the cores (started
    /// on the first run that needs them, where fewer run, and kept for the process); a strided
    /// source's on a CPU engine of that many threads, kept by the pipeline. A file source's
    /// buffers are filled by its file engine's readers instead.
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
    /// The fill threads a run from a pageable source uses: [`PipelineConfig::fill_threads`]
    /// where set, else the staging subsystem's default worker count (that of the staged
    /// copies: three quarters of the cores, 1 to 12), at most [`FILL_THREADS`].
    pub fn effective_fill_threads(&self) -> usize {
        match self.fill_threads {
            0 => crate::staging::policy::default_workers().min(FILL_THREADS),
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

    pub(super) fn check(&self) -> Result<(), PipelineError> {
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
    pub(super) fn effective_depth(&self) -> usize {
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
