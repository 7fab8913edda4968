//! Shared helpers of the CUDA integration tests: skip without a driver, buffers of every kind,
//! a CPU reference, a tiny executor.
//!
//! Every test that needs a GPU carries
//! `#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]`: a plain
//! `cargo test` (CI, no GPU) lists it as ignored with that reason instead of passing it. The GPU
//! bundle (`scripts/gpu-bundle.sh`) builds the tests with the `gpu` feature; a test then probes
//! and, without a driver, prints `skipped: no CUDA driver` (see [`cuda_or_skip`]) and returns.
//! Tests in these files that need no GPU carry no such attribute.
//!
//! Every engine a test makes takes its settings from [`cuda_config`], so the whole suite runs
//! under the completion policy `FERRY_TEST_COMPLETION` names ([`completion`]).
//!
//! CI runs these tests against the null CUDA driver (`bench/null-cuda/null_cuda.c`): no GPU,
//! host memory and memmove behind the driver's calls, work completing late and out of order
//! in its asynchronous mode. A test it cannot serve (NVRTC kernels, several GPUs, timings only
//! a GPU shows) returns after [`skip_on_null_driver`]; [`null`] reaches its controls (injected
//! failures, the delay).
#![allow(dead_code)]

pub mod null;

use ferry::cuda::{
    CompletionPolicy, CudaConfig, CudaEngine, CudaError, DeviceBuffer, ManagedBuffer, MappedBuffer,
    PinnedBuffer, Registered,
};
use ferry::{CpuEngine, EngineExt, Layout, MemKind, Memory, MemoryMut, RawBuf};
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// The completion policy of every engine the tests make: `FERRY_TEST_COMPLETION=plain` or
/// `tuned` (unset or empty: tuned, the library's default). The test scripts run the suite
/// under each; the library itself reads no such variable.
pub fn completion() -> CompletionPolicy {
    match std::env::var("FERRY_TEST_COMPLETION").as_deref() {
        Err(_) | Ok("") | Ok("tuned") => CompletionPolicy::Tuned,
        Ok("plain") => CompletionPolicy::Plain,
        Ok(other) => panic!("FERRY_TEST_COMPLETION={other}: expected `plain` or `tuned`"),
    }
}

/// The rounds of a long upload-and-kernel loop: `full`, or fewer where `FERRY_TEST_ROUNDS` says
/// (the sanitizer pass runs these loops shorter: every round's ordering is checked the same
/// way, and thousands of rounds outlast what compute-sanitizer holds of one process).
pub fn rounds(full: usize) -> usize {
    match std::env::var("FERRY_TEST_ROUNDS").map(|v| v.parse::<usize>()) {
        Err(_) => full,
        Ok(Ok(n)) if n > 0 => n.min(full),
        Ok(_) => panic!("FERRY_TEST_ROUNDS: expected a positive count"),
    }
}

/// `CudaConfig::new(ordinal)` with the tests' completion policy ([`completion`]): the start of
/// every engine configuration in the tests.
pub fn cuda_config(ordinal: u32) -> CudaConfig {
    CudaConfig::new(ordinal).completion(completion())
}

/// An engine on device `ordinal` with the default settings and the tests' completion policy
/// (what `CudaEngine::new(ordinal)` is to a user).
pub fn cuda_engine(ordinal: u32) -> Result<CudaEngine, CudaError> {
    CudaEngine::with_config(cuda_config(ordinal))
}

/// An engine on device 0, or `None` after printing exactly `skipped: no CUDA driver`.
pub fn cuda_or_skip() -> Option<CudaEngine> {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return None;
    }
    Some(cuda_engine(0).expect("a CUDA driver is present, so device 0 must open"))
}

/// Whether device 0 is the null CUDA driver's (its name is [`null::DEVICE_NAME`]); if so,
/// prints `skipped: null CUDA driver: {reason}` and the test returns. For tests the null
/// driver cannot serve: say precisely what is missing there.
pub fn skip_on_null_driver(reason: &str) -> bool {
    let p = ferry::cuda::probe();
    let null = p
        .devices
        .first()
        .is_some_and(|d| d.name == null::DEVICE_NAME);
    if null {
        println!("skipped: null CUDA driver: {reason}");
    }
    null
}

/// Deterministic pseudo-random bytes (xorshift, 8 bytes a step), different per seed. The
/// tests make gigabytes of them: a step per byte was 44% of `cuda_copy`'s CPU time against the
/// null CUDA driver.
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
}

/// The buffer kinds a GPU copy can involve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pageable,
    Pinned,
    Registered,
    Mapped,
    Managed,
    Device,
}

pub const KINDS: [Kind; 6] = [
    Kind::Pageable,
    Kind::Pinned,
    Kind::Registered,
    Kind::Mapped,
    Kind::Managed,
    Kind::Device,
];

/// A `Vec<u8>` whose bytes start 64 bytes into a page of their own and whose last page holds
/// nothing else: `cuMemHostRegister` works on whole pages and refuses a page already
/// registered (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`), so two small `Vec`s from the
/// allocator, which may share a page, cannot both be registered at the same time.
pub struct PageVec {
    v: Vec<u8>,
    at: usize,
    len: usize,
}

impl PageVec {
    pub fn new(data: &[u8]) -> PageVec {
        // SAFETY: sysconf only reads a system setting.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .unwrap_or(4096)
            .max(4096);
        let mut v = vec![0u8; data.len() + 3 * page];
        let at = v.as_ptr().align_offset(page) + 64;
        v[at..at + data.len()].copy_from_slice(data);
        PageVec {
            v,
            at,
            len: data.len(),
        }
    }
}

impl std::ops::Deref for PageVec {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.v[self.at..self.at + self.len]
    }
}
impl std::ops::DerefMut for PageVec {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.at..self.at + self.len]
    }
}

/// A buffer of any kind, made from and read back to host bytes.
pub enum Buf {
    Pageable(Vec<u8>),
    Pinned(PinnedBuffer),
    Registered(Registered<PageVec>),
    Mapped(MappedBuffer),
    Managed(ManagedBuffer),
    Device(DeviceBuffer),
}

impl Buf {
    pub fn new(kind: Kind, data: &[u8]) -> Buf {
        match kind {
            Kind::Pageable => Buf::Pageable(data.to_vec()),
            Kind::Pinned => {
                let mut b = PinnedBuffer::new(data.len()).unwrap();
                b.copy_from_slice(data);
                Buf::Pinned(b)
            }
            Kind::Registered => Buf::Registered(
                Registered::new(PageVec::new(data))
                    .map_err(|(e, _)| e)
                    .unwrap(),
            ),
            Kind::Mapped => {
                let mut b = MappedBuffer::new(data.len()).unwrap();
                b.copy_from_slice(data);
                Buf::Mapped(b)
            }
            Kind::Managed => {
                let mut b = ManagedBuffer::new(0, data.len()).unwrap();
                b.copy_from_slice(data);
                Buf::Managed(b)
            }
            Kind::Device => Buf::Device(DeviceBuffer::from_host(0, data).unwrap()),
        }
    }
    pub fn to_vec(&self) -> Vec<u8> {
        match self {
            Buf::Pageable(v) => v.clone(),
            Buf::Pinned(b) => b.to_vec(),
            Buf::Registered(b) => b.to_vec(),
            Buf::Mapped(b) => b.to_vec(),
            Buf::Managed(b) => b.to_vec(),
            Buf::Device(b) => b.to_vec().unwrap(),
        }
    }
}

// SAFETY: forwards to the wrapped buffer, which upholds the contract.
unsafe impl Memory for Buf {
    fn raw(&self) -> RawBuf {
        match self {
            Buf::Pageable(v) => v.raw(),
            Buf::Pinned(b) => b.raw(),
            Buf::Registered(b) => b.raw(),
            Buf::Mapped(b) => b.raw(),
            Buf::Managed(b) => b.raw(),
            Buf::Device(b) => b.raw(),
        }
    }
}
// SAFETY: forwards to the wrapped buffer, which upholds the contract.
unsafe impl MemoryMut for Buf {
    fn raw_mut(&mut self) -> RawBuf {
        match self {
            Buf::Pageable(v) => v.raw_mut(),
            Buf::Pinned(b) => b.raw_mut(),
            Buf::Registered(b) => b.raw_mut(),
            Buf::Mapped(b) => b.raw_mut(),
            Buf::Managed(b) => b.raw_mut(),
            Buf::Device(b) => b.raw_mut(),
        }
    }
}

pub fn is_pageable(k: Kind) -> bool {
    k == Kind::Pageable
}

/// What the CPU engine writes for this copy into a poisoned destination.
pub fn reference_copy(dst_init: &[u8], dl: &Layout, src: &[u8], sl: &Layout) -> Vec<u8> {
    let cpu = CpuEngine::new(1).unwrap();
    let mut out = dst_init.to_vec();
    cpu.scope(|s| Ok::<_, ferry::BarrierError>(s.copy(&mut out, dl, src, sl).map(|_| ())))
        .unwrap()
        .unwrap();
    out
}

/// What the CPU engine writes for this fill.
pub fn reference_fill(dst_init: &[u8], l: &Layout, pattern: &[u8]) -> Vec<u8> {
    let cpu = CpuEngine::new(1).unwrap();
    let mut out = dst_init.to_vec();
    cpu.scope(|s| Ok::<_, ferry::BarrierError>(s.fill(&mut out, l, pattern).map(|_| ())))
        .unwrap()
        .unwrap();
    out
}

#[allow(clippy::too_many_arguments)]
/// Copies `sl` of random source bytes (of kind `sk`) into `dl` of a poisoned destination (of
/// kind `dk`) on the engine and checks every destination byte against the CPU reference.
pub fn check_copy(
    e: &CudaEngine,
    dk: Kind,
    sk: Kind,
    dl: &Layout,
    dlen: usize,
    sl: &Layout,
    slen: usize,
    seed: u64,
) {
    let src_h = bytes(slen, seed);
    let dst_h = bytes(dlen, seed ^ 0xDEAD);
    let want = reference_copy(&dst_h, dl, &src_h, sl);
    let src = Buf::new(sk, &src_h);
    let mut dst = Buf::new(dk, &dst_h);
    e.scope(|s| {
        s.copy(&mut dst, dl, &src, sl)?
            .wait()
            .map_err(ferry::Error::from)
    })
    .unwrap_or_else(|err| panic!("{dk:?} <- {sk:?}: {err}"));
    let got = dst.to_vec();
    if let Some(i) = (0..dlen).find(|&i| got[i] != want[i]) {
        panic!(
            "{dk:?} <- {sk:?} {dl:?} <- {sl:?}: first wrong byte at {i}: got {}, want {}",
            got[i], want[i]
        );
    }
}

/// Runs a future to completion on this thread (a minimal executor: park until woken).
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

pub fn kind_of(k: Kind) -> MemKind {
    match k {
        Kind::Pageable => MemKind::Pageable,
        Kind::Pinned | Kind::Registered => MemKind::Pinned,
        Kind::Mapped => MemKind::Mapped,
        Kind::Managed => MemKind::Managed,
        Kind::Device => MemKind::Device { ordinal: 0 },
    }
}

/// Free device memory of device 0 in bytes (`cuMemGetInfo`); the whole device, so other
/// processes count too (the GPU host runs one test binary at a time).
pub fn device_free() -> usize {
    let ctx = cudarc::driver::CudaContext::new(0).expect("device 0");
    ctx.bind_to_thread().expect("bind");
    cudarc::driver::result::mem_get_info()
        .expect("cuMemGetInfo")
        .0
}

/// The name prefix of the process's host copy workers (`staging/workers.rs`): one set per
/// process, at most the cores, living as long as the process.
pub const HOST_WORKERS: &str = "ferry-host-";

/// Threads of this process: (all, those ferry started, named `ferry-*`, less the process's
/// host copy workers, which outlive every engine: [`host_workers`] counts them).
pub fn threads() -> (usize, usize) {
    let mut all = 0;
    let mut ferry = 0;
    for t in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        all += 1;
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        ferry += usize::from(comm.starts_with("ferry-") && !comm.starts_with(HOST_WORKERS));
    }
    (all, ferry)
}

/// The process's host copy workers: (started, running now: not asleep, from each thread's
/// state in `/proc/self/task/*/stat`).
pub fn host_workers() -> (usize, usize) {
    let (mut started, mut running) = (0, 0);
    for t in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(HOST_WORKERS) {
            continue;
        }
        started += 1;
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the name's closing parenthesis.
        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
        running += usize::from(state == Some('R'));
    }
    (started, running)
}

/// [`host_workers`] once none runs (their polling after a fill lasts 500 us), or after 2 s
/// what it is then.
pub fn host_workers_idle() -> (usize, usize) {
    let t = std::time::Instant::now();
    loop {
        let now = host_workers();
        if now.1 == 0 || t.elapsed().as_secs() >= 2 {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The machine's cores: the most host copy workers a process starts.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads once ferry's have settled to at most `ferry_target` (threads of dropped engines
/// exit asynchronously: a waiter thread ends when the last request holding its channel goes),
/// or after `secs` seconds.
pub fn settled_threads(ferry_target: usize, secs: u64) -> (usize, usize) {
    let t = std::time::Instant::now();
    loop {
        let now = threads();
        if now.1 <= ferry_target || t.elapsed().as_secs() >= secs {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Device memory that may stay allocated after a workload although everything it made was
/// dropped: the driver grows some per-context resources on first use and keeps them for the
/// context's lifetime (the local-memory pool of kernel launches, the gather kernel's module,
/// event and stream pools, internal staging of pageable copies). `cuMemGetInfo` also counts in
/// 2 MiB pages. On the H200 (run 18) such driver memory came to 68-84 MiB after the stress and
/// custom-operator tests, with ferry's own allocation counters back at exactly zero (the
/// `fault-injection` check), and was given back later in the process. A leak of per-request
/// device memory grows with the number of requests (each case allocates up to tens of MiB,
/// thousands of requests) and exceeds this after a few operations; ferry's own allocations are
/// compared exactly by the counters.
pub const DEVICE_SLACK: usize = 256 << 20;

/// Driver allocations ferry holds open: (page-locked host, device), counted by the library
/// with the `fault-injection` feature (`ferry::fault::live`); `None` without it.
#[cfg(feature = "fault-injection")]
pub fn open_allocs() -> Option<(isize, isize)> {
    use ferry::fault::{live, Resource};
    Some((live(Resource::PinnedHost), live(Resource::Device)))
}

/// Driver allocations ferry holds open: not counted without the `fault-injection` feature.
#[cfg(not(feature = "fault-injection"))]
pub fn open_allocs() -> Option<(isize, isize)> {
    None
}

/// A pinned buffer holding `data`.
pub fn pinned_with(data: &[u8]) -> PinnedBuffer {
    let mut p = PinnedBuffer::new(data.len()).expect("cuMemHostAlloc");
    p.copy_from_slice(data);
    p
}

/// Panics naming `what` and the first byte where `got` differs from `want`.
pub fn check(what: &str, got: &[u8], want: &[u8]) {
    // One memcmp first: the byte loop below is slow in the tests' build (opt-level 1).
    if got == want {
        return;
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: byte {i} of {} is {:#04x}, want {:#04x}",
            want.len(),
            got[i],
            want[i]
        );
    }
    assert_eq!(got.len(), want.len(), "{what}: length");
}

/// The first index where `got` differs from `want` (the shorter length when they differ in
/// length), or None when equal.
pub fn first_diff(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    if got == want {
        return None;
    }
    got.iter().zip(want).position(|(a, b)| a != b)
}

/// Enqueues `f` on stream `s` as a host function (`cuLaunchHostFunc`): the null driver's
/// stand-in for a kernel, or a latch that holds the stream back.
pub fn host_fn(
    s: &cudarc::driver::CudaStream,
    f: impl FnOnce() + Send + 'static,
) -> Result<(), cudarc::driver::DriverError> {
    type Work = Box<dyn FnOnce() + Send>;
    unsafe extern "C" fn run(p: *mut std::ffi::c_void) {
        // SAFETY: `p` is the box leaked below, which the driver hands back exactly once.
        let f = unsafe { Box::from_raw(p.cast::<Work>()) };
        f();
    }
    let p = Box::into_raw(Box::new(Box::new(f) as Work));
    s.context().bind_to_thread()?;
    // SAFETY: `s` is a live stream of the current context; the driver calls `run` once with
    // `p`, after the work enqueued on `s` before it.
    let r = unsafe { cudarc::driver::sys::cuLaunchHostFunc(s.cu_stream(), Some(run), p.cast()) }
        .result();
    if r.is_err() {
        // SAFETY: refused, so the driver never calls `run`: the box is still this one's.
        drop(unsafe { Box::from_raw(p) });
    }
    r
}
