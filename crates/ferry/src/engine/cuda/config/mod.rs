//! The CUDA engine's settings: which device, how waits wait, which stream a copy takes, and
//! which paths are on (staging, SM copies, split device copies).

mod staging;
pub use staging::StagingConfig;

/// How a thread waits for a request.
///
/// Measured on an H200 host (4 KiB pinned host-to-device copy, submitted and waited, median of
/// 2000, run 17 in `bench/results/h200.md`): `Blocking` 23.5 us, `Spin` 7.8 us,
/// `SpinThenBlock(50 us)` 8.4 us (a raw `cuMemcpyAsync` + `cuStreamSynchronize`: about 7.3 us);
/// the sleep and wake-up of a blocking wait cost about 15 us, and 100-150 us per request at
/// 16 MiB-1 GiB (issue 14: 0.80-0.97x the raw submit + sync, `Spin` 1.00x). `Auto` (default)
/// aims at `Spin`'s latency without `Spin`'s busy core on long copies: in run 31 (H200) its
/// caller's view was 0.98-1.00x raw at 16 MiB-1 GiB and its waiting thread used 21% of a 256
/// MiB upload's wait; with the tighter bound and the naps (runs 32-33) 9% of that wait, a 4 KiB
/// request 1.05x raw, and the caller's view 0.97-1.01x raw from 16 MiB up but 0.93-0.98x at
/// 64 KiB-1 MiB (`ferry bench -t cuda-h2d-pinned,cuda-wait-cpu,cuda-latency`). `Auto` and `Spin`
/// record a request's completion event only when something needs it (a later request on its
/// stream, a dependent on another stream, a future): a request waited while it is its stream's
/// last work waits on the stream, as the raw `cuStreamSynchronize` does (the engine's `mark`
/// module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Sleep until shortly before the request's expected end (its bytes over an upper bound on
    /// its path's rate: the PCIe link's payload rate, the device memory), poll (with short naps
    /// for requests of 2 ms or more), then nap in growing sleeps if it is late;
    /// requests expected under 30 us spin. A request submitted on an engine stream with
    /// nothing pending, while no other thread submits to the engine (and not a host-to-device
    /// copy under 1 KiB, which the driver ends sooner), gets a stamp: the stream writes its
    /// number into a word of mapped host memory after it (`cuStreamWriteValue32`), and the
    /// spin and the polls read that word instead of asking the driver, which sees a copy's end
    /// 0.4-0.9 us later (the engine's `stamp` module doc); other requests expected under 30 us
    /// spin in the driver as `Spin` does, longer ones sleep and poll the driver. See the
    /// engine's `wait` module doc.
    #[default]
    Auto,
    /// Sleep until the copy is done (events made with `CU_EVENT_BLOCKING_SYNC`): no CPU used,
    /// 15-150 us of wake-up per request.
    Blocking,
    /// Let the driver spin on the request's event (an event without `BLOCKING_SYNC`, waited
    /// with `cuEventSynchronize`, as `cuStreamSynchronize` waits by default), or on its stream
    /// while it has no event (`cuStreamSynchronize`): one core busy while waiting, the
    /// driver's latency (`Auto`'s stamped requests notice their end sooner).
    Spin,
    /// Poll for up to this long, then sleep as `Blocking` does.
    SpinThenBlock(std::time::Duration),
}

/// How the engine knows that a request is done: the completion policy, one seam between the
/// reference and the tuned machinery (the engine's `mark` module doc).
///
/// Every CUDA test runs under both (`FERRY_TEST_COMPLETION=plain|tuned` in the test suite's
/// `cuda_common`); the tuned one is what the figures in `bench/results/` were measured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompletionPolicy {
    /// The reference: every request records its completion event when it is submitted, and
    /// its wait waits on that event in the [`WaitMode`] chosen. No lazy events, no stamps.
    Plain,
    /// Lazy events (recorded only when something needs them), completion words (stamps) for a
    /// thread submitting alone, and [`WaitMode::Auto`]'s expected-end schedule: the caller's
    /// view of small copies at the raw driver pair's time or better.
    #[default]
    Tuned,
}

/// Which of the engine's streams (and so which copy engine) a copy runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Device to device (also peer copies and fills of device memory).
    DeviceToDevice,
}

/// Settings of a [`CudaEngine`](super::CudaEngine). Plain struct: `CudaConfig::new(ordinal)` then chained setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaConfig {
    /// The device the engine's streams belong to.
    pub ordinal: u32,
    /// How `wait` waits.
    pub wait: WaitMode,
    /// How a request's end is marked and known ([`CompletionPolicy::Tuned`] by default).
    pub completion: CompletionPolicy,
    /// Put every copy on this direction's stream instead of inferring it from the buffers'
    /// kinds (as AML's `aml_dma_cuda_create(kind)`).
    pub direction: Option<Direction>,
    /// How copies between pageable host memory and the device are staged through pinned
    /// buffers; `None` hands them to the driver's own pageable path.
    pub staging: Option<StagingConfig>,
    /// Which copies between device-accessible buffers run on the SMs (a kernel) instead of the
    /// copy engines.
    pub kernel_copies: KernelCopies,
    /// Percent of a contiguous device-to-device copy on this GPU (of at least 8 MiB) done by an
    /// SM copy kernel while a copy engine does the rest (`paths/split.rs`); `None` (default):
    /// copy engine only.
    pub d2d_sm_share: Option<u8>,
    /// Streams per direction in the engine's pool (1 to 256): each submitting thread keeps
    /// one of them (see the [engine's ordering](super#ordering)). Default: the host's cores, up
    /// to 16; lane 0's streams are made with the engine, the others on first use.
    /// `FERRY_CUDA_STREAMS` in [`CudaConfig::from_env`].
    pub streams: usize,
    /// The caller's kernels keep the SMs busy while copies run (a model computing while its KV
    /// cache is swapped): copies leave the SMs to them. Segment lists and block copies take the
    /// copy engines (the driver's batched copy, else one call per segment) instead of the SM
    /// gather kernel, and [`KernelCopies::Auto`] sends nothing to the SMs
    /// ([`KernelCopies::Always`] still does). Default `false`: the SMs are used where they are
    /// much faster (the thresholds in `route.rs`). `FERRY_CUDA_COMPUTE_BUSY` (`0`/`1`) in
    /// [`CudaConfig::from_env`].
    pub compute_busy: bool,
}

impl CudaConfig {
    /// Device `ordinal`, [`WaitMode::Auto`] waits, directions inferred, the default staging. Reads
    /// nothing from the environment ([`CudaConfig::from_env`] does).
    pub fn new(ordinal: u32) -> CudaConfig {
        CudaConfig {
            ordinal,
            wait: WaitMode::Auto,
            completion: CompletionPolicy::Tuned,
            direction: None,
            staging: Some(StagingConfig::new()),
            kernel_copies: KernelCopies::Auto,
            d2d_sm_share: None,
            streams: default_streams(std::thread::available_parallelism().map_or(1, |n| n.get())),
            compute_busy: false,
        }
    }
    /// [`CudaConfig::new`] with the staging tuned from the environment
    /// ([`StagingConfig::from_env`](StagingConfig::from_env): `FERRY_STAGING_*`) and
    /// `FERRY_CUDA_STREAMS` ([`CudaConfig::streams`]) and `FERRY_CUDA_COMPUTE_BUSY`
    /// ([`CudaConfig::compute_busy`]).
    /// Errors: [`ConfigError`](crate::ConfigError) naming a variable whose value does not parse.
    pub fn from_env(ordinal: u32) -> Result<CudaConfig, crate::ConfigError> {
        let mut c = CudaConfig::new(ordinal).staging(Some(StagingConfig::from_env()?));
        crate::env::apply(&crate::env::process, "FERRY_CUDA_STREAMS", &mut c.streams)?;
        let busy = "FERRY_CUDA_COMPUTE_BUSY";
        crate::env::apply(&crate::env::process, busy, &mut c.compute_busy)?;
        Ok(c.streams(c.streams))
    }
    /// Sets the number of streams per direction in the engine's pool (0 counts as 1).
    pub fn streams(mut self, n: usize) -> CudaConfig {
        self.streams = n.max(1);
        self
    }
    /// Says whether the caller's kernels keep the SMs busy while copies run
    /// ([`CudaConfig::compute_busy`]): `true` leaves the SMs to them.
    pub fn compute_busy(mut self, busy: bool) -> CudaConfig {
        self.compute_busy = busy;
        self
    }
    /// Sets which copies run on the SMs ([`KernelCopies`]; default [`KernelCopies::Auto`]).
    pub fn kernel_copies(mut self, k: KernelCopies) -> CudaConfig {
        self.kernel_copies = k;
        self
    }
    /// Splits large device-to-device copies on this GPU: `percent` (1..=100) of the bytes by
    /// an SM copy kernel, the rest by a copy engine, at once. 0 turns it off.
    pub fn d2d_sm_share(mut self, percent: u8) -> CudaConfig {
        self.d2d_sm_share = (percent > 0).then_some(percent.min(100));
        self
    }
    /// Sets the staging of pageable copies (`None`: the driver's own pageable path).
    pub fn staging(mut self, staging: Option<StagingConfig>) -> CudaConfig {
        self.staging = staging;
        self
    }
    /// Sets how `wait` waits.
    pub fn wait_mode(mut self, wait: WaitMode) -> CudaConfig {
        self.wait = wait;
        self
    }
    /// Sets the completion policy ([`CompletionPolicy`]).
    pub fn completion(mut self, policy: CompletionPolicy) -> CudaConfig {
        self.completion = policy;
        self
    }
    /// Forces every copy onto one direction's stream.
    pub fn direction(mut self, d: Direction) -> CudaConfig {
        self.direction = Some(d);
        self
    }
}

/// The default size of an engine's stream pool ([`CudaConfig::streams`]) is the host's core
/// count up to this many streams per direction: one per thread that can submit at the same
/// time. Lanes beyond lane 0 are made only when a thread submits through them. Issue 14 (H200
/// host, 16 cores): eight threads submitting 64 KiB pinned copies through one stream per
/// direction moved 0.52x what eight threads with a raw stream each moved; `ferry bench --test
/// cuda-threads` measures the pool against a raw stream per thread at 1-16 threads.
pub const MAX_DEFAULT_STREAMS: usize = 16;

/// The default pool size on a host with `cores` cores: see [`MAX_DEFAULT_STREAMS`].
pub(crate) fn default_streams(cores: usize) -> usize {
    cores.clamp(1, MAX_DEFAULT_STREAMS)
}

/// Where a [`CudaEngine`](super::CudaEngine) moves copies on the SMs instead of the copy
/// engines. Only copies whose both sides are device-accessible (not pageable host memory, and
/// device memory of the engine's own GPU) can go to the SMs; the others always use the copy
/// engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelCopies {
    /// Strided plans with short runs on the SMs (runs of at most 16 bytes, at least 4,096 of
    /// them; or runs of at most 256 bytes that the copy engines would need 4 or more calls for,
    /// as transposes; the thresholds in `route.rs`, measured on an H200 host); everything else
    /// on the copy engines.
    #[default]
    Auto,
    /// Everything on the copy engines (as before the SM path existed), segment lists and
    /// block copies included.
    Never,
    /// Every copy between device-accessible buffers on the SMs, contiguous ones included: the
    /// zero-copy SM path for mapped host memory (as nvbandwidth's SM copy tests), or to keep the
    /// copy engines free for other work. Fills and segment lists keep their own paths.
    Always,
}
