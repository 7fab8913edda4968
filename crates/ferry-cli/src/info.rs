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
    /// What the CUDA probe found (driver, devices, peer matrix, nvidia-fs).
    pub cuda: ferry::cuda::CudaProbe,
    /// The NCCL library (name and version) or why it is unusable.
    pub nccl: ferry::engine::nccl::NcclProbe,
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
    let gpu = GpuInfo {
        cuda_engine_in_build: true,
        unavailable_reason: crate::bench::cuda::available().err(),
        cuda: ferry::cuda::probe(),
        nccl: ferry::engine::nccl::probe(),
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
    if let Some(why) = &info.gpu.unavailable_reason {
        s += &format!("  not available: {why}\n");
    }
    let p = &info.gpu.cuda;
    if let Ok(v) = p.driver {
        s += &format!("  CUDA driver          {}.{}\n", v / 1000, (v % 1000) / 10);
    }
    let opt = |o: Option<String>| o.unwrap_or_else(|| "unknown".into());
    for d in &p.devices {
        s += &format!("  GPU {}                {}\n", d.ordinal, d.name);
        s += &format!(
            "    memory             {}\n",
            opt(d.total_mem.map(|m| format_size(m as u64)))
        );
        s += &format!(
            "    copy engines       {}\n",
            opt(d.async_engines.map(|n| n.to_string()))
        );
        s += &format!(
            "    SMs                {}\n",
            opt(d.sm_count.map(|n| n.to_string()))
        );
        s += &format!(
            "    compute capability {}\n",
            opt(d.compute_capability.map(|(a, b)| format!("{a}.{b}")))
        );
        s += &format!(
            "    PCIe               {}\n",
            match (d.pcie_gen, d.pcie_width) {
                (Some(g), Some(w)) => format!("gen {g} x{w}"),
                _ => "not reported".into(),
            }
        );
        s += &format!("    PCI bus id         {}\n", opt(d.pci_bus_id.clone()));
        s += &format!(
            "    NUMA node          {}\n",
            opt(d.numa_node.map(|n| n.to_string()))
        );
        s += &format!(
            "    unified addressing {}\n",
            opt(d.unified_addressing.map(|b| b.to_string()))
        );
        s += &format!(
            "    host registration  {}\n",
            opt(d.host_register.map(|b| b.to_string()))
        );
        s += &format!(
            "    map host memory    {}\n",
            opt(d.can_map_host_memory.map(|b| b.to_string()))
        );
    }
    if p.devices.len() > 1 {
        s += "  peer access (row reads/writes column)\n";
        for (i, row) in p.peer.iter().enumerate() {
            let cells: Vec<&str> = row
                .iter()
                .enumerate()
                .map(|(j, &b)| {
                    if i == j {
                        "-"
                    } else if b {
                        "yes"
                    } else {
                        "no"
                    }
                })
                .collect();
            s += &format!("    GPU {i}: {}\n", cells.join(" "));
        }
    }
    if p.driver.is_ok() {
        s += &format!(
            "  GPUDirect Storage    {}\n",
            if p.nvidia_fs {
                "nvidia-fs module present"
            } else {
                "nvidia-fs module absent: compat path only"
            }
        );
    }
    s += &format!(
        "  NCCL                 {}\n",
        match &info.gpu.nccl.library {
            Ok((lib, v)) => format!("{lib}, version {}.{}.{}", v / 10000, v / 100 % 100, v % 100),
            Err(why) => format!("none ({why})"),
        }
    );
    s
}
