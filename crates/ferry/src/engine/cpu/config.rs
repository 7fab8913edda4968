//! The CPU engine's settings.

use super::probe::probe;

/// The most worker threads a [`CpuEngine`](super::CpuEngine) starts (the CLI's `--threads` limit too).
pub(crate) const THREADS_MAX: usize = 1024;

/// Settings of a [`CpuEngine`](super::CpuEngine). Plain struct: `CpuConfig::new(threads)` then chained setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuConfig {
    /// Worker threads. [`CpuConfig::new`] turns 0 into one per core; 0 here (as set by
    /// [`CpuConfig::caller_runs`]) means no workers: the waiting caller runs the work.
    pub threads: usize,
    /// Smallest chunk a copy is split into, in bytes (default: half of `split_bytes`, so that
    /// a copy just larger than it is split in two).
    pub chunk_bytes: usize,
    /// Copies of at most this many bytes run inline at submit (default: `split_bytes`, up to
    /// which a copy runs on one thread anyway: then the caller's, whose cache holds the data,
    /// without a hand-off to a worker).
    pub inline_bytes: usize,
    /// Copies of more than this many bytes are split across the workers and the submitting
    /// thread, which runs its share at submit, one part per core at most; smaller ones run on
    /// one thread (default: [`CpuProbe::split_bytes`](super::CpuProbe::split_bytes), from the
    /// cache size).
    pub split_bytes: usize,
    /// A transpose that writes more than this many bytes writes its destination past the
    /// caches (non-temporal stores, x86_64), which it would only flush out of them, and no
    /// longer reads each destination line in before writing it (default:
    /// [`CpuProbe::stream_bytes`](super::CpuProbe::stream_bytes), a quarter of the last-level
    /// cache; `usize::MAX`: never).
    pub stream_bytes: usize,
}

impl CpuConfig {
    /// The most worker threads an engine may have ([`CpuEngine::new`](crate::CpuEngine::new)
    /// refuses more).
    pub const THREADS_MAX: usize = THREADS_MAX;

    /// `threads` workers (0: one per core, as the C API's `ferry_dma_cpu_create`) and the
    /// default chunk and inline sizes.
    pub fn new(threads: usize) -> CpuConfig {
        let p = probe();
        let threads = match threads {
            0 => p.default_threads,
            n => n,
        };
        CpuConfig {
            threads,
            chunk_bytes: (p.split_bytes / 2).max(1),
            inline_bytes: p.split_bytes,
            split_bytes: p.split_bytes,
            stream_bytes: p.stream_bytes,
        }
    }
    /// No workers: work runs on the caller, in `wait` and `barrier` (and small copies at
    /// submit). For tests and single-threaded programs.
    pub fn caller_runs() -> CpuConfig {
        CpuConfig {
            threads: 0,
            ..CpuConfig::new(1)
        }
    }
    /// Sets the smallest chunk (at least 1 byte).
    pub fn chunk_bytes(mut self, bytes: usize) -> CpuConfig {
        self.chunk_bytes = bytes.max(1);
        self
    }
    /// Sets the inline threshold (0: every copy goes to the workers).
    pub fn inline_bytes(mut self, bytes: usize) -> CpuConfig {
        self.inline_bytes = bytes;
        self
    }
    /// Sets the size above which a transpose writes past the caches (`usize::MAX`: never).
    pub fn stream_bytes(mut self, bytes: usize) -> CpuConfig {
        self.stream_bytes = bytes;
        self
    }
    /// Sets the split threshold (`usize::MAX`: never split a copy; 0: split every copy not
    /// run inline into chunks of at least `chunk_bytes`).
    pub fn split_bytes(mut self, bytes: usize) -> CpuConfig {
        self.split_bytes = bytes;
        self
    }
}

impl Default for CpuConfig {
    /// One worker per core.
    fn default() -> Self {
        CpuConfig::new(0)
    }
}
