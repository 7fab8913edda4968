//! What the CPU engine finds on this machine, and its defaults.

/// Defaults and limits of the CPU engine on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuProbe {
    /// Logical cores available to this process.
    pub cores: usize,
    /// Worker threads a default engine starts (one per core, at least 1).
    pub default_threads: usize,
}

/// Reads the machine's core count.
pub fn probe() -> CpuProbe {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    CpuProbe {
        cores,
        default_threads: cores,
    }
}
