//! The CPU engine's settings.

use super::probe::probe;

/// The most worker threads a [`CpuEngine`](super::CpuEngine) starts (the CLI's `--threads` limit too).
pub const THREADS_MAX: usize = 1024;

/// Settings of a [`CpuEngine`](super::CpuEngine). Plain struct: `CpuConfig::new(threads)` then chained setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuConfig {
    /// Worker threads. [`CpuConfig::new`] turns 0 into one per core; 0 here (as set by
    /// [`CpuConfig::caller_runs`]) means no workers: the waiting caller runs the work.
    pub threads: usize,
    /// Smallest chunk a copy is split into, in bytes (default 1 MiB).
    pub chunk_bytes: usize,
    /// Copies of at most this many bytes run inline at submit (default 64 KiB).
    pub inline_bytes: usize,
}

impl CpuConfig {
    /// `threads` workers (0: one per core, as the C API's `ferry_dma_cpu_create`) and the
    /// default chunk and inline sizes.
    pub fn new(threads: usize) -> CpuConfig {
        let threads = match threads {
            0 => probe().default_threads,
            n => n,
        };
        CpuConfig {
            threads,
            chunk_bytes: 1 << 20,
            inline_bytes: 64 << 10,
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
}

impl Default for CpuConfig {
    /// One worker per core.
    fn default() -> Self {
        CpuConfig::new(0)
    }
}
