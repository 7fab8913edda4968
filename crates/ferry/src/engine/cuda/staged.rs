//! Staged copies between pageable host memory and a device, through a ring of pinned buffers.
//!
//! The driver copies pageable memory slowly (about 9-15 GB/s on a PCIe 5.0 host) because it
//! stages through its own small pinned buffers with one CPU thread. A [`Stager`] keeps a ring of
//! large pinned staging buffers per direction and a pool of persistent CPU worker threads: while
//! the copy engine moves chunk `k` between the ring and the device, the workers copy chunk `k+1`
//! between pageable memory and the ring (host -> device), or drain chunk `k-1` (device -> host).
//! The workers take the chunks' parts in order from a shared counter, with no barrier between
//! chunks, and the calling thread issues each chunk's DMA the moment its last part is in: on the
//! H200 host this moved 256 MiB host -> device at 45.8 GB/s against 43.9 for the earlier design
//! (every worker on one chunk, then a barrier), 45.6 against 36.7 with non-temporal stores, in
//! one run (run 17 in `bench/results/h200.md`, "The staging pipeline, gather strategies and
//! wait modes").
//!
//! A [`Stager`] is made once per device and reused by many copies. Each direction has its own
//! ring, allocated on first use, so one host -> device and one device -> host copy may run at the
//! same time; two copies in the same direction take turns.
//!
//! Plans with a strided host side are gathered into (or scattered out of) the ring run by run;
//! a pitched device side is written from the ring with `cuMemcpy2DAsync`.
//!
//! ```no_run
//! use ferry::engine::cuda::staged::{Direction, Stager, StagingConfig};
//! use ferry::Plan;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! if !ferry::engine::cuda::staged::driver_present() {
//!     return Ok(()); // no CUDA driver on this machine
//! }
//! let ctx = cudarc::driver::CudaContext::new(0)?;
//! let stream = ctx.new_stream()?;
//! let stager = Stager::new(ctx.clone(), StagingConfig::new().threads(8))?;
//! let host = vec![7u8; 1 << 20];
//! let dev = unsafe { cudarc::driver::result::malloc_sync(host.len())? };
//! // SAFETY: `dev` holds `host.len()` bytes, `host` is live for the call, nothing else uses them.
//! unsafe {
//!     stager.copy(&stream, Direction::HostToDevice, dev, host.as_ptr() as u64, &Plan::contiguous(0, 0, host.len()))?;
//! }
//! # Ok(()) }
//! ```

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use thiserror::Error;

use crate::Plan;

/// Whether the CUDA driver library (`libcuda`) can be loaded on this machine. Never panics;
/// the answer is computed once and cached.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to open the library by its candidate names
    // (dlopen); it calls no driver function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Which way a staged copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Pageable host memory (`src`) to device memory (`dst`).
    HostToDevice,
    /// Device memory (`src`) to pageable host memory (`dst`).
    DeviceToHost,
}

/// Tuning of a [`Stager`]: chunk size, ring depth, worker threads. Plain data; start from
/// [`StagingConfig::new`] (the defaults) and chain setters.
///
/// ```
/// use ferry::engine::cuda::staged::StagingConfig;
/// let cfg = StagingConfig::new().chunk_bytes(64 << 20).ring_depth(3).threads(12);
/// assert_eq!(cfg.get_threads(), 12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    chunk_bytes: usize,
    ring_depth: usize,
    threads: usize,
    write_combined: bool,
    non_temporal: bool,
    non_temporal_h2d: bool,
}

impl Default for StagingConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl StagingConfig {
    /// The defaults: 16 MiB chunks, a ring of 4 per direction, three quarters of the cores as
    /// worker threads (1 to 12), cached (not write-combined) staging memory, non-temporal stores.
    ///
    /// Each default can be overridden from the environment, as KvikIO's `KVIKIO_*` variables
    /// do, so that a deployed program is tuned without a rebuild: `FERRY_STAGING_CHUNK` (bytes),
    /// `FERRY_STAGING_DEPTH`, `FERRY_STAGING_THREADS`, `FERRY_STAGING_NT` (`0` or `1`). A value
    /// that does not parse is ignored; the setters below still apply on top.
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        let env = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
        };
        StagingConfig {
            chunk_bytes: env("FERRY_STAGING_CHUNK").unwrap_or(16 << 20),
            ring_depth: env("FERRY_STAGING_DEPTH").unwrap_or(4),
            threads: env("FERRY_STAGING_THREADS").unwrap_or((cores * 3 / 4).clamp(1, 12)),
            write_combined: false,
            non_temporal: env("FERRY_STAGING_NT") != Some(0),
            non_temporal_h2d: env("FERRY_STAGING_NT_H2D") == Some(1),
        }
    }
    /// Bytes per staging buffer (one DMA per chunk). Must be at least 4096.
    pub fn chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }
    /// Staging buffers per direction. Must be at least 2 (one filling while one moves).
    pub fn ring_depth(mut self, depth: usize) -> Self {
        self.ring_depth = depth;
        self
    }
    /// Persistent CPU worker threads that split each chunk's host-side copy. At least 1.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }
    /// Allocate the host -> device ring write-combined (the CPU only writes it). The device ->
    /// host ring is never write-combined: the CPU reads it, and reads of such memory are slow.
    pub fn write_combined(mut self, on: bool) -> Self {
        self.write_combined = on;
        self
    }
    /// Copy from the device -> host ring into pageable memory with non-temporal (streaming)
    /// stores on x86-64, which skip the read-for-ownership of each destination line: host
    /// memory bandwidth, shared by the CPU copy and the DMA, is what caps a staged copy. On by
    /// default (`FERRY_STAGING_NT=0` turns it off).
    pub fn non_temporal(mut self, on: bool) -> Self {
        self.non_temporal = on;
        self
    }
    /// The same for the host -> device fill of the ring. Off by default: on the H200 host
    /// plain stores filled the ring as fast (45.8 against 45.6 GB/s for 256 MiB, one run,
    /// run 17 in `bench/results/h200.md`); `FERRY_STAGING_NT_H2D=1` turns it on.
    pub fn non_temporal_h2d(mut self, on: bool) -> Self {
        self.non_temporal_h2d = on;
        self
    }
    /// Whether the workers use non-temporal stores.
    pub fn get_non_temporal(&self) -> bool {
        self.non_temporal
    }
    /// Bytes per chunk.
    pub fn get_chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }
    /// Ring depth.
    pub fn get_ring_depth(&self) -> usize {
        self.ring_depth
    }
    /// Worker threads.
    pub fn get_threads(&self) -> usize {
        self.threads
    }
    /// Whether the host -> device ring is write-combined.
    pub fn get_write_combined(&self) -> bool {
        self.write_combined
    }
}

/// Why a staged copy (or making a [`Stager`]) failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StagedError {
    /// A configuration value is out of range.
    #[error("bad staging config: {0}")]
    BadConfig(String),
    /// A CUDA driver call failed; `op` names it, `source` keeps the driver's error.
    #[error("{op} failed: {source}")]
    Driver {
        /// The driver call.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// An address computation overflowed (a plan too large for the given base addresses).
    #[error("address overflow: base {base:#x} + {bytes} bytes")]
    AddressOverflow {
        /// Base address.
        base: u64,
        /// Byte offset past it.
        bytes: usize,
    },
    /// A worker thread panicked while copying (a bug; the copy's bytes are unspecified).
    #[error("a staging worker thread panicked")]
    WorkerPanicked,
    /// The worker threads could not be started.
    #[error("could not start staging worker threads: {0}")]
    Spawn(#[source] std::io::Error),
}

fn drv(op: &'static str) -> impl FnOnce(DriverError) -> StagedError {
    move |source| StagedError::Driver { op, source }
}

/// Copies `len` bytes from `src` to `dst`; with `nt` on x86-64, through non-temporal 16-byte
/// stores (then a store fence, so the bytes are visible to the DMA that follows).
///
/// # Safety
/// 1. `src` is readable and `dst` writable for `len` bytes, and the two ranges do not overlap.
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize, nt: bool) {
    #[cfg(target_arch = "x86_64")]
    if nt && len >= 4096 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.align_offset(16).min(len);
        // SAFETY: every access below stays inside `src..src+len` / `dst..dst+len` (contract);
        // stream stores go to 16-byte aligned addresses (`head` aligns `dst`); SSE2 is part of
        // the x86-64 baseline.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut s, mut d, mut n) = (src.add(head), dst.add(head), len - head);
            while n >= 64 {
                let a = _mm_loadu_si128(s as *const __m128i);
                let b = _mm_loadu_si128(s.add(16) as *const __m128i);
                let c = _mm_loadu_si128(s.add(32) as *const __m128i);
                let e = _mm_loadu_si128(s.add(48) as *const __m128i);
                _mm_stream_si128(d as *mut __m128i, a);
                _mm_stream_si128(d.add(16) as *mut __m128i, b);
                _mm_stream_si128(d.add(32) as *mut __m128i, c);
                _mm_stream_si128(d.add(48) as *mut __m128i, e);
                s = s.add(64);
                d = d.add(64);
                n -= 64;
            }
            std::ptr::copy_nonoverlapping(s, d, n);
            _mm_sfence();
        }
        return;
    }
    let _ = nt;
    // SAFETY: the contract above.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// One pinned host allocation (`cuMemHostAlloc`), freed on drop.
struct Pinned {
    ptr: *mut u8,
}

// SAFETY: the allocation is plain memory owned by this value; access is synchronized by the
// stager's per-direction lock.
unsafe impl Send for Pinned {}
// SAFETY: as above; shared access only reads the pointer value.
unsafe impl Sync for Pinned {}

impl Pinned {
    fn new(ctx: &CudaContext, len: usize, flags: u32) -> Result<Pinned, StagedError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: a plain allocation call; the pointer is owned by the returned value and freed
        // once in `Drop`.
        let ptr = unsafe { cu::malloc_host(len, flags) }.map_err(drv("cuMemHostAlloc"))?;
        count_alloc!(PinnedHost, 1);
        Ok(Pinned {
            ptr: ptr as *mut u8,
        })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `cuMemHostAlloc` and is freed exactly once; the ring's users
        // synchronize every DMA touching it before the stager (and so this) is dropped.
        if unsafe { cu::free_host(self.ptr as *mut std::ffi::c_void) }.is_ok() {
            count_alloc!(PinnedHost, -1);
        }
    }
}

/// A ring of pinned slots with one event per slot (recorded after the slot's DMA).
struct Ring {
    slots: Vec<Pinned>,
    events: Vec<CudaEvent>,
    pending: Vec<bool>,
}

impl Ring {
    fn new(ctx: &Arc<CudaContext>, cfg: &StagingConfig, flags: u32) -> Result<Ring, StagedError> {
        let mut slots = Vec::with_capacity(cfg.ring_depth);
        let mut events = Vec::with_capacity(cfg.ring_depth);
        for _ in 0..cfg.ring_depth {
            slots.push(Pinned::new(ctx, cfg.chunk_bytes, flags)?);
            events.push(
                ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(drv("cuEventCreate"))?,
            );
        }
        Ok(Ring {
            pending: vec![false; slots.len()],
            slots,
            events,
        })
    }
    fn wait(&mut self, slot: usize) -> Result<(), StagedError> {
        if self.pending[slot] {
            self.pending[slot] = false;
            self.events[slot]
                .synchronize()
                .map_err(drv("cuEventSynchronize"))?;
        }
        Ok(())
    }
    /// Whether the slot's DMA is done (no wait).
    fn poll(&mut self, slot: usize) -> Result<bool, StagedError> {
        if self.pending[slot] {
            if !self.events[slot]
                .try_is_complete()
                .map_err(drv("cuEventQuery"))?
            {
                return Ok(false);
            }
            self.pending[slot] = false;
        }
        Ok(true)
    }
    fn record(&mut self, slot: usize, stream: &CudaStream) -> Result<(), StagedError> {
        self.events[slot]
            .record(stream)
            .map_err(drv("cuEventRecord"))?;
        self.pending[slot] = true;
        Ok(())
    }
    /// Waits for every slot (also on the error path, so no DMA outlives the copy).
    fn drain(&mut self) -> Result<(), StagedError> {
        let mut first = Ok(());
        for s in 0..self.slots.len() {
            if let Err(e) = self.wait(s) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

// ---------------------------------------------------------------------------------------------
// A persistent fork-join pool: `run_with(n, f, main)` calls `f(i)` on worker `i` for i in 0..n
// (only those are woken, always the same low-numbered ones) and returns when all n have returned.

type Job = dyn Fn(usize) + Sync;

struct PoolState {
    generation: u64,
    job: Option<*const Job>,
    /// Workers the current job wants: those numbered 0..wanted.
    wanted: usize,
    remaining: usize,
    panicked: bool,
    shutdown: bool,
}

// SAFETY: the raw job pointer is only dereferenced while `Pool::run` (which owns the borrow)
// waits for every worker to finish with it.
unsafe impl Send for PoolState {}

struct PoolShared {
    state: Mutex<PoolState>,
    /// One per worker, so that a job wakes exactly the workers it wants.
    work: Vec<Condvar>,
    done: Condvar,
}

struct Pool {
    shared: Arc<PoolShared>,
    handles: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl Pool {
    fn new(threads: usize) -> Result<Pool, StagedError> {
        let shared = Arc::new(PoolShared {
            state: Mutex::new(PoolState {
                generation: 0,
                job: None,
                wanted: 0,
                remaining: 0,
                panicked: false,
                shutdown: false,
            }),
            work: (0..threads).map(|_| Condvar::new()).collect(),
            done: Condvar::new(),
        });
        let mut pool = Pool {
            shared: shared.clone(),
            handles: Vec::with_capacity(threads),
            run_lock: Mutex::new(()),
        };
        for i in 0..threads {
            let sh = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("ferry-stage-{i}"))
                .spawn(move || Pool::worker(sh, i))
                .map_err(StagedError::Spawn)?;
            pool.handles.push(h);
        }
        Ok(pool)
    }

    fn threads(&self) -> usize {
        self.handles.len()
    }

    fn worker(sh: Arc<PoolShared>, index: usize) {
        let mut seen = 0u64;
        loop {
            // Worker `index` runs each job that wants it once. `run_with` wakes it through its
            // own condition variable; if it was not asleep then, it sees the job here before it
            // sleeps again.
            let job = {
                let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if st.shutdown {
                        return;
                    }
                    if st.generation != seen {
                        seen = st.generation;
                        if index < st.wanted {
                            break st.job;
                        }
                    }
                    st = sh.work[index].wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let ok = match job {
                // SAFETY: `run` keeps the closure alive until `remaining` reaches 0, which
                // happens only after this call returns.
                Some(j) => catch_unwind(AssertUnwindSafe(|| unsafe { (*j)(index) })).is_ok(),
                None => true,
            };
            let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
            st.panicked |= !ok;
            st.remaining -= 1;
            if st.remaining == 0 {
                sh.done.notify_all();
            }
        }
    }

    /// Runs `f(i)` for each `i` in `0..n` on `n` workers (at most all of them) while `main`
    /// runs on the calling thread, then waits for those workers. Returns `main`'s error first,
    /// else `WorkerPanicked` if a worker panicked.
    fn run_with(
        &self,
        n: usize,
        f: &(dyn Fn(usize) + Sync),
        main: impl FnOnce() -> Result<(), StagedError>,
    ) -> Result<(), StagedError> {
        let n = n.clamp(1, self.handles.len());
        let _turn = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: erases the borrow's lifetime; the pointer is used only until every worker has
        // decremented `remaining`, which this function waits for before returning (also when
        // `main` panics: the guard below waits in its drop).
        let ptr: *const Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(f) };
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.job = Some(ptr);
            st.wanted = n;
            st.remaining = n;
            st.panicked = false;
            st.generation += 1;
        }
        // Only the workers wanted, and always the same ones (0..n): waking 4 of 12 workers
        // through one shared condition variable rotated through all twelve, each waking cold,
        // and left 1-8 MiB staged copies as slow as with all twelve (H200 run 28).
        for w in &self.shared.work[..n] {
            w.notify_one();
        }
        /// Waits for every worker to be done with the job, also when `main` panics.
        struct Finish<'a>(&'a PoolShared);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
                while st.remaining > 0 {
                    st = self.0.done.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                st.job = None;
            }
        }
        let finish = Finish(&self.shared);
        let r = main();
        drop(finish);
        let panicked = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .panicked;
        r?;
        if panicked {
            return Err(StagedError::WorkerPanicked);
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.shutdown = true;
            for w in &self.shared.work {
                w.notify_one();
            }
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Chunking of a plan.

/// The host and device sides of a plan, whichever way it goes.
#[derive(Clone, Copy)]
struct Sides<'a> {
    plan: &'a Plan,
    dir: Direction,
}

impl Sides<'_> {
    /// (device offset, host offset) of run `i`, in `for_each_run` order.
    fn run_at(&self, i: usize) -> (usize, usize) {
        let p = self.plan;
        let (mut d, mut s) = (p.dst_offset(), p.src_offset());
        let mut rest = i;
        for k in (0..p.counts().len()).rev() {
            let c = p.counts()[k];
            let j = rest % c;
            rest /= c;
            d += j * p.dst_strides()[k];
            s += j * p.src_strides()[k];
        }
        match self.dir {
            Direction::HostToDevice => (d, s),
            Direction::DeviceToHost => (s, d),
        }
    }
    /// The device-side stride and extent of the innermost outer dim (None for a contiguous plan).
    fn dev_inner(&self) -> Option<(usize, usize)> {
        let p = self.plan;
        let n = p.counts().len();
        if n == 0 {
            return None;
        }
        let s = match self.dir {
            Direction::HostToDevice => p.dst_strides()[n - 1],
            Direction::DeviceToHost => p.src_strides()[n - 1],
        };
        Some((s, p.counts()[n - 1]))
    }
}

/// One chunk of a staged copy.
#[derive(Clone, Copy, Debug)]
enum Chunk {
    /// `len` bytes of run `run`, starting `at` bytes into it (runs of at least one chunk).
    Piece { run: usize, at: usize, len: usize },
    /// Whole runs `first..first+count`, packed in the slot (runs shorter than a chunk).
    Runs { first: usize, count: usize },
}

struct Chunker {
    run: usize,
    runs: usize,
    chunk: usize,
    per_run: usize,
    runs_per_chunk: usize,
}

impl Chunker {
    fn new(plan: &Plan, chunk: usize) -> Chunker {
        let run = plan.run();
        let runs = plan.run_count();
        if run >= chunk {
            Chunker {
                run,
                runs,
                chunk,
                per_run: run.div_ceil(chunk),
                runs_per_chunk: 0,
            }
        } else {
            Chunker {
                run,
                runs,
                chunk,
                per_run: 0,
                runs_per_chunk: chunk / run.max(1),
            }
        }
    }
    fn count(&self) -> usize {
        if self.run == 0 || self.runs == 0 {
            0
        } else if self.per_run > 0 {
            self.runs * self.per_run
        } else {
            self.runs.div_ceil(self.runs_per_chunk)
        }
    }
    fn get(&self, k: usize) -> Chunk {
        if let Some(run) = k.checked_div(self.per_run) {
            let piece = k % self.per_run;
            let at = piece * self.chunk;
            Chunk::Piece {
                run,
                at,
                len: self.chunk.min(self.run - at),
            }
        } else {
            let first = k * self.runs_per_chunk;
            Chunk::Runs {
                first,
                count: self.runs_per_chunk.min(self.runs - first),
            }
        }
    }
}

fn add(base: u64, off: usize) -> Result<u64, StagedError> {
    base.checked_add(off as u64)
        .ok_or(StagedError::AddressOverflow { base, bytes: off })
}

/// Largest pitch `cuMemcpy2D` takes on every device we know (CU_DEVICE_ATTRIBUTE_MAX_PITCH is
/// 2^31 - 1 on current GPUs).
const MAX_PITCH: usize = (1 << 31) - 1;

/// Persistent staging machinery for one device: two pinned rings (allocated on first use in each
/// direction) and a pool of CPU worker threads. See the [module documentation](self).
pub struct Stager {
    ctx: Arc<CudaContext>,
    cfg: StagingConfig,
    pool: Pool,
    h2d: Mutex<Option<Ring>>,
    d2h: Mutex<Option<Ring>>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("device", &self.ctx.ordinal())
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// A raw pointer that may cross to worker threads (the workers touch disjoint bytes).
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: used only to hand disjoint byte ranges to the pool's workers, which finish before the
// copy returns.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The address `off` bytes on (a method, so closures capture the `Sync` wrapper).
    fn at(self, off: usize) -> *mut u8 {
        self.0.wrapping_add(off)
    }
}

/// Workers for a staged copy of `bytes`: one per 2 MiB, at least 4, at most the pool's. On the
/// H200 host (run 27, `ferry bench --test cuda-h2d-pageable`, staged / the driver's pageable
/// path) 12 workers gave 0.97x / 0.56x / 0.81x / 1.36x at 2 / 4 / 8 / 16 MiB, 4 workers 1.18x /
/// 1.18x / 1.34x / 1.46x; 256 MiB needs all 12 for its 45+ GB/s (4 workers: 30 GB/s, run 29).
/// With this choice and the pool waking workers 0..n (run 29): host to device 0.93-1.12x at
/// 2 MiB, 1.09-1.15x at 4-8 MiB, 48.8 GB/s at 256 MiB; device to host 1.5x at 1 MiB, 51 GB/s
/// at 256 MiB.
fn workers_for(pool: usize, bytes: usize) -> usize {
    (bytes / (2 << 20)).max(4).min(pool.max(1))
}

impl Stager {
    /// Makes a stager for `ctx`'s device and starts its worker threads. Pinned rings are
    /// allocated on the first copy in each direction (`ring_depth x chunk_bytes` each).
    ///
    /// Errors: [`StagedError::BadConfig`] (chunk < 4096, ring < 2, threads 0 or > 256),
    /// [`StagedError::Spawn`].
    pub fn new(ctx: Arc<CudaContext>, cfg: StagingConfig) -> Result<Stager, StagedError> {
        if cfg.chunk_bytes < 4096 {
            return Err(StagedError::BadConfig(format!(
                "chunk_bytes {} is under 4096",
                cfg.chunk_bytes
            )));
        }
        if cfg.ring_depth < 2 {
            return Err(StagedError::BadConfig(format!(
                "ring_depth {} is under 2",
                cfg.ring_depth
            )));
        }
        if cfg.threads == 0 || cfg.threads > 256 {
            return Err(StagedError::BadConfig(format!(
                "threads {} is not in 1..=256",
                cfg.threads
            )));
        }
        let pool = Pool::new(cfg.threads)?;
        Ok(Stager {
            ctx,
            cfg,
            pool,
            h2d: Mutex::new(None),
            d2h: Mutex::new(None),
        })
    }

    /// The configuration this stager runs with.
    pub fn config(&self) -> &StagingConfig {
        &self.cfg
    }

    /// The context this stager belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copies the runs of `plan` from `src` to `dst` through the pinned ring, and returns when
    /// every byte has arrived (it blocks; call it from a background thread). `dst` and `src` are
    /// base addresses to which the plan's offsets are added: for
    /// [`Direction::HostToDevice`] `dst` is a device pointer (`CUdeviceptr`) and `src` a host
    /// pointer; for [`Direction::DeviceToHost`] the reverse. Host memory may be pageable.
    ///
    /// On error the copy stops, every DMA already issued is waited for, and the destination's
    /// bytes are unspecified.
    ///
    /// # Safety
    /// 1. Every byte the plan reads (`src + plan.src_offset() .. src + plan.src_end()`, at the
    ///    plan's runs) is valid, initialized memory of the right kind, not written by anyone
    ///    during the call.
    /// 2. Every byte the plan writes is valid memory of the right kind that nothing else reads
    ///    or writes during the call.
    /// 3. Device memory belongs to (or is accessible from) this stager's context, and `stream`
    ///    belongs to this stager's context.
    /// 4. Source and destination bytes do not overlap.
    pub unsafe fn copy(
        &self,
        stream: &Arc<CudaStream>,
        dir: Direction,
        dst: u64,
        src: u64,
        plan: &Plan,
    ) -> Result<(), StagedError> {
        // Copies of a few chunks or less pipeline over smaller pieces (at least 1 MiB, so the
        // per-chunk overhead stays small), else the first chunk's host copy is not overlapped.
        let chunk = self
            .cfg
            .chunk_bytes
            .min((plan.total_bytes() / 4).max(1 << 20));
        let chunker = Chunker::new(plan, chunk);
        let n = chunker.count();
        if n == 0 {
            return Ok(());
        }
        // Bounds of the address arithmetic, checked once.
        add(dst, plan.dst_end())?;
        add(src, plan.src_end())?;
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let sides = Sides { plan, dir };
        let (dev_base, host_base) = match dir {
            Direction::HostToDevice => (dst, src),
            Direction::DeviceToHost => (src, dst),
        };
        let job = Staging {
            sides,
            chunker: &chunker,
            dev: dev_base,
            host: SendPtr(host_base as *mut u8),
            stream,
        };
        match dir {
            Direction::HostToDevice => {
                let mut guard = self.h2d.lock().unwrap_or_else(|e| e.into_inner());
                if guard.is_none() {
                    let flags = if self.cfg.write_combined {
                        sys::CU_MEMHOSTALLOC_WRITECOMBINED
                    } else {
                        0
                    };
                    *guard = Some(Ring::new(
                        &self.ctx,
                        &self.cfg,
                        flags | sys::CU_MEMHOSTALLOC_PORTABLE,
                    )?);
                }
                let ring = guard.as_mut().expect("ring was just made");
                let r = self.flow(ring, &job, n, dir);
                let d = ring.drain();
                r.and(d)
            }
            Direction::DeviceToHost => {
                let mut guard = self.d2h.lock().unwrap_or_else(|e| e.into_inner());
                if guard.is_none() {
                    *guard = Some(Ring::new(
                        &self.ctx,
                        &self.cfg,
                        sys::CU_MEMHOSTALLOC_PORTABLE,
                    )?);
                }
                let ring = guard.as_mut().expect("ring was just made");
                let r = self.flow(ring, &job, n, dir);
                let d = ring.drain();
                r.and(d)
            }
        }
    }

    /// Part `i` of `t` of a chunk's host-side copy (`to_slot`: host -> slot, else slot ->
    /// host). The parts of one chunk touch disjoint bytes; together they cover the chunk.
    fn part(
        &self,
        job: &Staging<'_>,
        chunk: Chunk,
        slot: SendPtr,
        to_slot: bool,
        i: usize,
        t: usize,
    ) {
        #[cfg(feature = "fault-injection")]
        if crate::fault::fire(crate::fault::Fault::StagingWorkerPanic) {
            panic!("injected panic");
        }
        let host = job.host;
        let sides = job.sides;
        let run = job.chunker.run;
        let nt = if to_slot {
            self.cfg.non_temporal_h2d
        } else {
            self.cfg.non_temporal
        };
        let copy = |a: *const u8, b: *mut u8, len: usize| {
            // SAFETY: `a`/`b` lie in the caller's buffers (contract of `Stager::copy`) or in the
            // slot, for `len` bytes; the parts' ranges are disjoint.
            unsafe { copy_bytes(a, b, len, nt) }
        };
        match chunk {
            Chunk::Piece { run: r, at, len } => {
                let (_, h) = sides.run_at(r);
                let h = h + at;
                // Split at 4 KiB boundaries; small pieces stay on few parts.
                let per = len.div_ceil(t).div_ceil(4096) * 4096;
                let start = i * per;
                if start >= len {
                    return;
                }
                let l = per.min(len - start);
                let (hp, sp) = (host.at(h + start), slot.at(start));
                if to_slot {
                    copy(hp, sp, l)
                } else {
                    copy(sp, hp, l)
                }
            }
            Chunk::Runs { first, count } => {
                let (a, b) = (count * i / t, count * (i + 1) / t);
                for k in a..b {
                    let (_, h) = sides.run_at(first + k);
                    let (hp, sp) = (host.at(h), slot.at(k * run));
                    if to_slot {
                        copy(hp, sp, run)
                    } else {
                        copy(sp, hp, run)
                    }
                }
            }
        }
    }

    /// The flowing pipeline: the workers take parts of chunks in order from a shared counter
    /// (no barrier between chunks: a worker done with its part of chunk `k` starts on chunk
    /// `k+1` while others finish `k`), and this thread issues each chunk's DMA as soon as all its
    /// parts are in (host -> device), or opens a chunk to the workers as soon as its DMA is done
    /// (device -> host), polling the ring's events.
    fn flow(
        &self,
        ring: &mut Ring,
        job: &Staging<'_>,
        n: usize,
        dir: Direction,
    ) -> Result<(), StagedError> {
        let t = workers_for(self.pool.threads(), job.sides.plan.total_bytes());
        let depth = ring.slots.len();
        let slots: Vec<SendPtr> = ring.slots.iter().map(|p| SendPtr(p.ptr)).collect();
        let h2d = dir == Direction::HostToDevice;
        // Workers may work on chunk `k` once `open > k`: its slot is free (h2d) or its DMA
        // is done (d2h). `done[slot]` counts the parts finished of the slot's current chunk.
        let open = AtomicUsize::new(if h2d { depth.min(n) } else { 0 });
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let done: Vec<AtomicUsize> = (0..depth).map(|_| AtomicUsize::new(0)).collect();
        let worker = |_: usize| loop {
            let p = next.fetch_add(1, Ordering::Relaxed);
            if p >= n * t {
                return;
            }
            let (k, i) = (p / t, p % t);
            let mut spin = Backoff::new();
            while open.load(Ordering::Acquire) <= k {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                spin.snooze();
            }
            let chunk = job.chunker.get(k);
            let r = catch_unwind(AssertUnwindSafe(|| {
                self.part(job, chunk, slots[k % depth], h2d, i, t)
            }));
            if r.is_err() {
                stop.store(true, Ordering::Relaxed);
                // Re-raised as the pool's `WorkerPanicked`.
                std::panic::resume_unwind(Box::new("staging part panicked"));
            }
            done[k % depth].fetch_add(1, Ordering::Release);
        };
        let coordinate = || -> Result<(), StagedError> {
            let r = if h2d {
                self.flow_h2d(ring, job, n, t, &open, &done, &stop)
            } else {
                self.flow_d2h(ring, job, n, t, &open, &done, &stop)
            };
            if r.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            r
        };
        self.pool.run_with(t, &worker, coordinate)
    }

    /// Host -> device coordinator of [`Stager::flow`].
    #[allow(clippy::too_many_arguments)]
    fn flow_h2d(
        &self,
        ring: &mut Ring,
        job: &Staging<'_>,
        n: usize,
        t: usize,
        open: &AtomicUsize,
        done: &[AtomicUsize],
        stop: &AtomicBool,
    ) -> Result<(), StagedError> {
        let depth = ring.slots.len();
        let (mut issued, mut retired) = (0usize, 0usize);
        let mut spin = Backoff::new();
        while issued < n {
            if stop.load(Ordering::Relaxed) {
                return Err(StagedError::WorkerPanicked);
            }
            let slot = issued % depth;
            if done[slot].load(Ordering::Acquire) == t {
                // No worker touches this slot again until `open` passes `issued + depth`,
                // which needs this chunk's DMA done: resetting the count here is safe.
                done[slot].store(0, Ordering::Relaxed);
                // SAFETY: the slot holds the chunk's bytes (all parts in, seen through the
                // Acquire above) and stays untouched until its event, recorded next, completes;
                // the device range is valid by `copy`'s contract.
                unsafe { job.device_side(job.chunker.get(issued), ring.slots[slot].ptr, true)? };
                ring.record(slot, job.stream)?;
                issued += 1;
                spin = Backoff::new();
            } else if retired < issued && ring.poll(retired % depth)? {
                retired += 1;
                open.store((retired + depth).min(n), Ordering::Release);
                spin = Backoff::new();
            } else {
                spin.snooze();
            }
        }
        Ok(())
    }

    /// Device -> host coordinator of [`Stager::flow`].
    #[allow(clippy::too_many_arguments)]
    fn flow_d2h(
        &self,
        ring: &mut Ring,
        job: &Staging<'_>,
        n: usize,
        t: usize,
        open: &AtomicUsize,
        done: &[AtomicUsize],
        stop: &AtomicBool,
    ) -> Result<(), StagedError> {
        let depth = ring.slots.len();
        let (mut issued, mut landed, mut drained) = (0usize, 0usize, 0usize);
        let mut spin = Backoff::new();
        while drained < n {
            if stop.load(Ordering::Relaxed) {
                return Err(StagedError::WorkerPanicked);
            }
            if issued < n && issued < drained + depth {
                let slot = issued % depth;
                // SAFETY: the slot was drained (or never used), so the DMA may overwrite it;
                // the device range is valid by `copy`'s contract.
                unsafe { job.device_side(job.chunker.get(issued), ring.slots[slot].ptr, false)? };
                ring.record(slot, job.stream)?;
                issued += 1;
                spin = Backoff::new();
            } else if landed < issued && ring.poll(landed % depth)? {
                landed += 1;
                open.store(landed, Ordering::Release);
                spin = Backoff::new();
            } else if done[drained % depth].load(Ordering::Acquire) == t {
                // Every part of chunk `drained` is out of its slot; its next use is a DMA
                // issued above, after this reset.
                done[drained % depth].store(0, Ordering::Relaxed);
                drained += 1;
                spin = Backoff::new();
            } else {
                spin.snooze();
            }
        }
        Ok(())
    }
}

/// Waiting for another thread's progress: spin briefly, then yield the core (a few hundred
/// microseconds: a chunk's DMA takes about that long, and a sleep would oversleep it by the
/// timer slack), then nap (so a pipeline stalled for longer does not burn every core).
struct Backoff {
    step: u32,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff { step: 0 }
    }
    fn snooze(&mut self) {
        if self.step < 64 {
            std::hint::spin_loop();
        } else if self.step < 4096 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        self.step = self.step.saturating_add(1);
    }
}

/// One copy in flight: what the loops need.
struct Staging<'a> {
    sides: Sides<'a>,
    chunker: &'a Chunker,
    dev: u64,
    host: SendPtr,
    stream: &'a Arc<CudaStream>,
}

impl Staging<'_> {
    /// Issues the DMA between a ring slot and the device for one chunk (`h2d`: slot -> device).
    ///
    /// # Safety
    /// 1. `slot` holds at least the chunk's bytes and stays valid until the stream reaches the
    ///    event recorded after this call.
    /// 2. The chunk's device bytes are valid device memory of the stream's context.
    unsafe fn device_side(
        &self,
        chunk: Chunk,
        slot: *mut u8,
        h2d: bool,
    ) -> Result<(), StagedError> {
        #[cfg(feature = "fault-injection")]
        if crate::fault::fire(crate::fault::Fault::StagedChunk) {
            return Err(StagedError::Driver {
                op: if h2d {
                    "cuMemcpyHtoDAsync"
                } else {
                    "cuMemcpyDtoHAsync"
                },
                source: DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            });
        }
        let cs = self.stream.cu_stream();
        let one = |dev: u64, host: *mut u8, len: usize| -> Result<(), StagedError> {
            if h2d {
                // SAFETY: `host` is `len` bytes of the pinned slot, `dev` `len` valid device bytes
                // (this function's contract).
                unsafe { sys::cuMemcpyHtoDAsync_v2(dev, host as *const _, len, cs) }
                    .result()
                    .map_err(drv("cuMemcpyHtoDAsync"))
            } else {
                // SAFETY: as above, the other way.
                unsafe { sys::cuMemcpyDtoHAsync_v2(host as *mut _, dev, len, cs) }
                    .result()
                    .map_err(drv("cuMemcpyDtoHAsync"))
            }
        };
        match chunk {
            Chunk::Piece { run, at, len } => {
                let (d, _) = self.sides.run_at(run);
                one(add(self.dev, d + at)?, slot, len)
            }
            Chunk::Runs { first, count } => {
                let run = self.chunker.run;
                let Some((pitch, inner)) = self.sides.dev_inner() else {
                    let (d, _) = self.sides.run_at(first);
                    return one(add(self.dev, d)?, slot, run * count);
                };
                let two_d = pitch >= run && pitch <= MAX_PITCH;
                let mut k = 0;
                while k < count {
                    // Runs k.. up to the end of this sweep of the innermost dim share one pitch.
                    let j = (first + k) % inner;
                    let rows = (inner - j).min(count - k);
                    let (d, _) = self.sides.run_at(first + k);
                    let sp = slot.wrapping_add(k * run);
                    if pitch == run || rows == 1 {
                        one(add(self.dev, d)?, sp, run * rows)?;
                    } else if two_d {
                        let dev = add(self.dev, d)?;
                        let (host_t, dev_t) = (
                            sys::CUmemorytype::CU_MEMORYTYPE_HOST,
                            sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                        );
                        let mut p = sys::CUDA_MEMCPY2D {
                            srcXInBytes: 0,
                            srcY: 0,
                            srcMemoryType: dev_t,
                            srcHost: std::ptr::null(),
                            srcDevice: 0,
                            srcArray: std::ptr::null_mut(),
                            srcPitch: 0,
                            dstXInBytes: 0,
                            dstY: 0,
                            dstMemoryType: dev_t,
                            dstHost: std::ptr::null_mut(),
                            dstDevice: 0,
                            dstArray: std::ptr::null_mut(),
                            dstPitch: 0,
                            WidthInBytes: run,
                            Height: rows,
                        };
                        if h2d {
                            p.srcMemoryType = host_t;
                            p.srcHost = sp as *const _;
                            p.srcPitch = run;
                            p.dstDevice = dev;
                            p.dstPitch = pitch;
                        } else {
                            p.srcDevice = dev;
                            p.srcPitch = pitch;
                            p.dstMemoryType = host_t;
                            p.dstHost = sp as *mut _;
                            p.dstPitch = run;
                        }
                        // SAFETY: the descriptor names `rows` rows of `run` bytes in the slot and
                        // in valid device memory (this function's contract).
                        unsafe { sys::cuMemcpy2DAsync_v2(&p, cs) }
                            .result()
                            .map_err(drv("cuMemcpy2DAsync"))?;
                    } else {
                        for r in 0..rows {
                            one(add(self.dev, d + r * pitch)?, sp.wrapping_add(r * run), run)?;
                        }
                    }
                    k += rows;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_bytes, workers_for, Pool};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn pool_runs_each_index_once_on_distinct_workers() {
        let pool = Pool::new(6).expect("pool");
        for round in 0..3000usize {
            // Every count from 1 to past the pool's size, in a changing order.
            let want = (round * 7) % 9 + 1;
            let n = want.min(6);
            let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
            let threads = Mutex::new(Vec::new());
            let main_ran = AtomicUsize::new(0);
            pool.run_with(
                want,
                &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    // Index i always runs on worker i (the same warm threads every time).
                    assert_eq!(
                        std::thread::current().name(),
                        Some(format!("ferry-stage-{i}").as_str())
                    );
                    threads
                        .lock()
                        .expect("lock")
                        .push(std::thread::current().id());
                },
                || {
                    main_ran.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                },
            )
            .expect("run");
            assert_eq!(main_ran.load(Ordering::Relaxed), 1);
            for (i, h) in hits.iter().enumerate() {
                let want_hits = usize::from(i < n);
                assert_eq!(
                    h.load(Ordering::Relaxed),
                    want_hits,
                    "round {round} index {i}"
                );
            }
            let mut t = threads.into_inner().expect("lock");
            t.sort_by_key(|id| format!("{id:?}"));
            t.dedup();
            assert_eq!(t.len(), n, "round {round}: one worker per index");
        }
    }

    #[test]
    fn pool_reports_a_panicking_worker_and_keeps_working() {
        let pool = Pool::new(3).expect("pool");
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = pool.run_with(2, &|i| assert!(i != 1, "worker 1 fails"), || Ok(()));
        std::panic::set_hook(prev);
        assert!(
            matches!(r, Err(super::StagedError::WorkerPanicked)),
            "{r:?}"
        );
        let count = AtomicUsize::new(0);
        pool.run_with(
            3,
            &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            },
            || Ok(()),
        )
        .expect("run after a panic");
        assert_eq!(count.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn workers_scale_with_the_copy() {
        assert_eq!(workers_for(12, 1 << 20), 4);
        assert_eq!(workers_for(12, 8 << 20), 4);
        assert_eq!(workers_for(12, 16 << 20), 8);
        assert_eq!(workers_for(12, 256 << 20), 12);
        assert_eq!(workers_for(2, 256 << 20), 2);
        assert_eq!(workers_for(1, 1 << 20), 1);
        assert_eq!(workers_for(0, 1 << 20), 1);
    }

    #[test]
    fn non_temporal_copy_every_alignment_and_length() {
        let src: Vec<u8> = (0..20_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for (so, do_, len) in [
            (0, 0, 4096),
            (1, 3, 4096),
            (5, 0, 9999),
            (0, 15, 10_001),
            (7, 9, 19_000),
            (3, 3, 100),
        ] {
            for nt in [true, false] {
                let mut dst = vec![0xEEu8; 20_016];
                // SAFETY: both ranges are inside their vectors and do not overlap.
                unsafe { copy_bytes(src.as_ptr().add(so), dst.as_mut_ptr().add(do_), len, nt) };
                assert_eq!(
                    &dst[do_..do_ + len],
                    &src[so..so + len],
                    "{so} {do_} {len} {nt}"
                );
                assert!(dst[..do_].iter().all(|&b| b == 0xEE));
                assert!(dst[do_ + len..].iter().all(|&b| b == 0xEE));
            }
        }
    }
}
