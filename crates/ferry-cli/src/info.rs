//! `ferry info`: what ferry finds on this machine.

use serde::Serialize;

/// Everything `ferry info` reports (`--json` prints this).
#[derive(Debug, Clone, Serialize)]
pub struct Info {
    /// ferry version.
    pub ferry_version: &'static str,
    /// CPU facts and CPU engine defaults.
    pub cpu: CpuInfo,
    /// GPU section.
    pub gpu: GpuInfo,
}

/// CPU facts and the CPU engine's defaults.
#[derive(Debug, Clone, Serialize)]
pub struct CpuInfo {
    /// Logical cores available to this process (`ferry::engine::cpu::probe()`).
    pub cores: usize,
    /// Worker threads of a default CPU engine.
    pub default_threads: usize,
    /// `CpuConfig::default().chunk_bytes`.
    pub chunk_bytes: usize,
    /// `CpuConfig::default().inline_bytes`.
    pub inline_bytes: usize,
}

/// The GPU section.
#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    /// Whether the CUDA engine is compiled into this build.
    pub cuda_engine_in_build: bool,
    /// Why no GPU is usable, when none is.
    pub unavailable_reason: Option<String>,
}

/// Gathers the report.
pub fn gather() -> Info {
    let probe = ferry::engine::cpu::probe();
    let cfg = ferry::CpuConfig::default();
    let cpu = CpuInfo {
        cores: probe.cores,
        default_threads: cfg.threads,
        chunk_bytes: cfg.chunk_bytes,
        inline_bytes: cfg.inline_bytes,
    };
    // GPU: `ferry::engine::cuda::probe()` goes here once the CUDA engine lands. It will fill:
    // driver version (or why none), and per GPU: name, memory, async copy engines, PCIe
    // generation x width, NUMA node; the peer-access matrix; unified addressing; host
    // registration; nvidia-fs present or cuFile compat mode only.
    let gpu = GpuInfo {
        cuda_engine_in_build: false,
        unavailable_reason: Some(crate::bench::cuda::available().err().unwrap_or_default()),
    };
    Info {
        ferry_version: env!("CARGO_PKG_VERSION"),
        cpu,
        gpu,
    }
}

/// Human-readable report.
pub fn render(info: &Info) -> String {
    use crate::sizes::format_size;
    let c = &info.cpu;
    let mut s = format!("ferry {}\n\nCPU\n", info.ferry_version);
    s += &format!("  cores                {}\n", c.cores);
    s += "  CPU engine defaults (CpuConfig::default())\n";
    s += &format!("    worker threads     {}\n", c.default_threads);
    s += &format!("    chunk              {} (a copy is split into chunks of at least this, one per worker)\n", format_size(c.chunk_bytes as u64));
    s += &format!(
        "    inline             {} (copies up to this size run on the submitting thread)\n",
        format_size(c.inline_bytes as u64)
    );
    s += "\nGPU\n";
    // ---- GPU section: print `ferry::engine::cuda::probe()` here when the CUDA engine lands ----
    if !info.gpu.cuda_engine_in_build {
        s += &format!(
            "  not available: {}\n",
            info.gpu.unavailable_reason.as_deref().unwrap_or("unknown")
        );
    }
    s
}
