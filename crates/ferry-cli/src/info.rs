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
    /// `CpuConfig::default().split_bytes`: larger copies are split across threads.
    pub split_bytes: usize,
    /// The per-core (level 2) cache the split threshold comes from, if the system says.
    pub l2_bytes: Option<usize>,
    /// `CpuConfig::default().stream_bytes`: larger transposes write past the caches.
    pub stream_bytes: usize,
    /// The last-level cache the stream threshold comes from, if the system says.
    pub llc_bytes: Option<usize>,
}

/// The GPU section: plain fields only (an absent value is `null`, a reason a string).
#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    /// Whether the CUDA engine is compiled into this build.
    pub cuda_engine_in_build: bool,
    /// Why no GPU is usable, when none is.
    pub unavailable_reason: Option<String>,
    /// The CUDA driver's version (`13.0`), when a driver was found.
    pub driver_version: Option<String>,
    /// One entry per device, by ordinal.
    pub devices: Vec<ferry::cuda::DeviceInfo>,
    /// `peer[i][j]`: device `i` can access memory of device `j` directly.
    pub peer: Vec<Vec<bool>>,
    /// Whether the `nvidia-fs` kernel module (GPUDirect Storage) is loaded.
    pub nvidia_fs: bool,
    /// GPUDirect Storage.
    pub gds: GdsInfo,
    /// The NCCL library.
    pub nccl: NcclInfo,
}

/// GPUDirect Storage (cuFile): used or why not (`ferry::file::gds_probe`).
#[derive(Debug, Clone, Serialize)]
pub struct GdsInfo {
    /// Whether device file loads and stores go through cuFile (by default, `FERRY_CUFILE`
    /// unset).
    pub used: bool,
    /// Why not, when not.
    pub reason: Option<String>,
    /// Whether `libcufile.so.0` loads.
    pub libcufile: bool,
    /// The transport device transfers take by default (`cuFile`, `bounce ring`).
    pub transport: String,
    /// Why (the reason whether used or not).
    pub why: String,
    /// `FERRY_CUFILE` as set (`auto`, `on`, `off`), or its bad value.
    pub ferry_cufile: Option<String>,
    /// The transport and reason under `FERRY_CUFILE`, when it is set to a valid value.
    pub with_ferry_cufile: Option<String>,
}

/// The NCCL library, or why it is unusable.
#[derive(Debug, Clone, Serialize)]
pub struct NcclInfo {
    /// The library's name as it was opened.
    pub library: Option<String>,
    /// Its version (`2.27.3`).
    pub version: Option<String>,
    /// Why it is unusable, when it is.
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
        split_bytes: cfg.split_bytes,
        l2_bytes: probe.l2_bytes,
        stream_bytes: cfg.stream_bytes,
        llc_bytes: probe.llc_bytes,
    };
    let cuda = ferry::cuda::probe();
    let gds = ferry::file::gds_probe();
    let (library, version, nccl_why) = match ferry::engine::nccl::probe().library {
        Ok((lib, v)) => (
            Some(lib),
            Some(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)),
            None,
        ),
        Err(why) => (None, None, Some(why)),
    };
    let gpu = GpuInfo {
        cuda_engine_in_build: true,
        unavailable_reason: crate::bench::cuda::available().err(),
        driver_version: cuda
            .driver
            .as_ref()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        devices: cuda.devices,
        peer: cuda.peer,
        nvidia_fs: cuda.nvidia_fs,
        gds: GdsInfo {
            used: gds.auto.transport.is_cufile(),
            reason: (!gds.auto.transport.is_cufile()).then(|| gds.auto.reason.clone()),
            libcufile: gds.libcufile,
            transport: gds.auto.transport.to_string(),
            why: gds.auto.reason.clone(),
            ferry_cufile: gds.env_mode.as_ref().map(|m| match m {
                Ok(m) => m.to_string(),
                Err(e) => e.to_string(),
            }),
            with_ferry_cufile: matches!(gds.env_mode, Some(Ok(_)))
                .then(|| gds.configured.to_string()),
        },
        nccl: NcclInfo {
            library,
            version,
            unavailable_reason: nccl_why,
        },
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
    s += &format!(
        "    split              above {} (from the L2 cache, {}): split across the workers and the submitting thread\n",
        format_size(c.split_bytes as u64),
        c.l2_bytes.map_or("unknown".into(), |b| format_size(b as u64))
    );
    s += &format!(
        "    stream             above {} (a quarter of the last-level cache, {}): transposes write past the caches\n",
        format_size(c.stream_bytes as u64),
        c.llc_bytes.map_or("unknown".into(), |b| format_size(b as u64))
    );
    let p = &info.gpu;
    s += "\nGPU\n";
    s += &format!(
        "  CUDA engine          {}\n",
        if p.cuda_engine_in_build {
            "in this build"
        } else {
            "not in this build"
        }
    );
    if let Some(why) = &p.unavailable_reason {
        s += &format!("  not available: {why}\n");
    }
    if let Some(v) = &p.driver_version {
        s += &format!("  CUDA driver          {v}\n");
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
        s += &format!(
            "    managed access     {}\n",
            opt(d.concurrent_managed_access.map(|b| b.to_string()))
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
    s += &format!(
        "  nvidia-fs module     {}\n",
        if p.nvidia_fs { "loaded" } else { "not loaded" }
    );
    s += &format!(
        "  libcufile            {}\n",
        if p.gds.libcufile {
            "found"
        } else {
            "not found"
        }
    );
    s += &format!(
        "  GPUDirect Storage    {} for device file loads and stores: {}\n",
        p.gds.transport, p.gds.why
    );
    match (&p.gds.ferry_cufile, &p.gds.with_ferry_cufile) {
        (Some(m), Some(c)) => s += &format!("    with FERRY_CUFILE={m}: {c}\n"),
        (Some(bad), None) => s += &format!("    {bad}: file engines refuse it\n"),
        _ => {}
    }
    s += &format!(
        "  NCCL                 {}\n",
        match (&p.nccl.library, &p.nccl.version, &p.nccl.unavailable_reason) {
            (Some(lib), Some(v), _) => format!("{lib}, version {v}"),
            (_, _, Some(why)) => format!("none ({why})"),
            _ => "none".to_string(),
        }
    );
    s
}
