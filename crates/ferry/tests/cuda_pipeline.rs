//! The pipeline on the GPU and the stream/event interop: outputs identical to a sequential
//! reference (K = 1..4, random, ragged, short and empty sources, pinned and pageable), failing
//! and panicking stages (nothing leaked, engine usable), two pipelines on one engine, the
//! timeline; a kernel reading a buffer right after a ferry upload through a stream wait (10,000
//! times), downloads that wait for a kernel. Kernels compiled with NVRTC. Prints `skipped: no
//! CUDA driver` without a GPU.
//!
//! On the null CUDA driver (CI: it runs no kernels, and its device memory is host memory) the
//! stream work is the same computation as a host function enqueued on the stream
//! (`cuLaunchHostFunc`) where the kernel would be launched: ordered on the stream as the kernel
//! is, so what these tests check (each stage after its upload and before its download, every
//! byte) is checked there too, late and out of order in the driver's asynchronous mode.

mod cuda_common;
use cuda_common::*;
use cudarc::driver::{CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg};
use ferry::cuda::{CudaEngine, DeviceBuffer, InteropError, PinnedBuffer, StreamWait};
use ferry::pipeline::{
    Chunk, CudaPipeline, Dest, GpuChunk, OutLen, Phase, PipelineConfig, PipelineError, Source,
    Timeline, FILL_THREADS_MAX,
};
use ferry::{Engine, EngineExt, Job, Layout, Memory, MemoryMut, RawBuf, Request};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const KERNELS: &str = r#"
typedef unsigned long long u64;
extern "C" __global__ void xform(const unsigned char* in, unsigned char* out, u64 n, unsigned int chunk) {
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n; j += (u64)gridDim.x * blockDim.x)
        out[j] = (unsigned char)((unsigned char)(in[j] * 3u + chunk) ^ (unsigned char)j);
}
extern "C" __global__ void checksum(const unsigned char* in, u64 n, unsigned int chunk, u64* out) {
    __shared__ u64 part[256];
    u64 s = 0;
    for (u64 j = threadIdx.x; j < n; j += blockDim.x) s += in[j];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = part[0] + chunk;
}
extern "C" __global__ void count_ne(const unsigned char* buf, u64 n, unsigned char v, unsigned int* bad) {
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n; j += (u64)gridDim.x * blockDim.x)
        if (buf[j] != v) atomicAdd(bad, 1u);
}
extern "C" __global__ void fill(unsigned char* buf, u64 n, unsigned char v) {
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n; j += (u64)gridDim.x * blockDim.x)
        buf[j] = v;
}
"#;

/// The tests' stream work: the kernels of `KERNELS`, or their host-function twins on the null
/// CUDA driver (see the module doc).
enum Kernels {
    Cuda {
        xform: CudaFunction,
        checksum: CudaFunction,
        count_ne: CudaFunction,
        fill: CudaFunction,
    },
    Host,
}

fn kernels(e: &CudaEngine) -> Kernels {
    if null::is_null_driver() {
        return Kernels::Host;
    }
    let ptx = cudarc::nvrtc::compile_ptx(KERNELS).expect("NVRTC compiles the test kernels");
    let m = e.context().load_module(ptx).expect("module loads");
    let f = |n| m.load_function(n).expect("kernel");
    Kernels::Cuda {
        xform: f("xform"),
        checksum: f("checksum"),
        count_ne: f("count_ne"),
        fill: f("fill"),
    }
}

impl Kernels {
    /// `out[j] = (input[j] * 3 + chunk) ^ j` for the `n` bytes, on stream `s`.
    ///
    /// # Safety
    /// 1. `input` and `out` are device addresses of `n` bytes each, live until the stream's
    ///    work is done.
    /// 2. Nothing else writes them until then, except work ordered on `s`.
    unsafe fn xform(
        &self,
        s: &CudaStream,
        input: u64,
        out: u64,
        n: u64,
        chunk: u32,
    ) -> Result<(), DriverError> {
        match self {
            // SAFETY: the kernel stays inside `n` bytes of each (caller).
            Kernels::Cuda { xform, .. } => unsafe {
                s.launch_builder(xform)
                    .arg(&input)
                    .arg(&out)
                    .arg(&n)
                    .arg(&chunk)
                    .launch(grid(n as usize))
                    .map(drop)
            },
            Kernels::Host => host_fn(s, move || {
                for j in 0..n as usize {
                    // SAFETY: the null driver's device addresses are host addresses; both
                    // ranges hold `n` bytes (caller) and the stream orders this after the
                    // writes of `input` and before the reads of `out`.
                    unsafe {
                        let x = (input as *const u8).add(j).read();
                        let y = x.wrapping_mul(3).wrapping_add(chunk as u8) ^ (j as u8);
                        (out as *mut u8).add(j).write(y);
                    }
                }
            }),
        }
    }

    /// `*out = sum(input[..n]) + chunk` (a u64), on stream `s`.
    ///
    /// # Safety
    /// As [`Kernels::xform`], `out` holding 8 bytes.
    unsafe fn checksum(
        &self,
        s: &CudaStream,
        input: u64,
        n: u64,
        chunk: u32,
        out: u64,
    ) -> Result<(), DriverError> {
        match self {
            // SAFETY: the kernel reads `n` bytes and writes 8 (caller).
            Kernels::Cuda { checksum, .. } => unsafe {
                s.launch_builder(checksum)
                    .arg(&input)
                    .arg(&n)
                    .arg(&chunk)
                    .arg(&out)
                    .launch(LaunchConfig {
                        grid_dim: (1, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    })
                    .map(drop)
            },
            Kernels::Host => host_fn(s, move || {
                // SAFETY: as in `xform`: host addresses of `n` and 8 bytes, ordered by the
                // stream; `write_unaligned` takes any alignment.
                unsafe {
                    let bytes = std::slice::from_raw_parts(input as *const u8, n as usize);
                    let sum = bytes.iter().map(|&b| u64::from(b)).sum::<u64>() + u64::from(chunk);
                    (out as *mut u64).write_unaligned(sum);
                }
            }),
        }
    }

    /// Adds to the u32 at `bad` the number of the `n` bytes at `buf` that are not `v`.
    ///
    /// # Safety
    /// As [`Kernels::xform`] for `buf` (read) and the 4-byte aligned `bad` (written).
    unsafe fn count_ne(
        &self,
        s: &CudaStream,
        buf: u64,
        n: u64,
        v: u8,
        bad: u64,
    ) -> Result<(), DriverError> {
        match self {
            // SAFETY: the kernel reads `n` bytes and adds to one u32 (caller).
            Kernels::Cuda { count_ne, .. } => unsafe {
                s.launch_builder(count_ne)
                    .arg(&buf)
                    .arg(&n)
                    .arg(&v)
                    .arg(&bad)
                    .launch(grid(n as usize))
                    .map(drop)
            },
            Kernels::Host => host_fn(s, move || {
                // SAFETY: as in `xform`; `bad` is an aligned u32 (caller), added to atomically
                // as the kernel does.
                unsafe {
                    let bytes = std::slice::from_raw_parts(buf as *const u8, n as usize);
                    let c = bytes.iter().filter(|&&b| b != v).count() as u32;
                    std::sync::atomic::AtomicU32::from_ptr(bad as *mut u32)
                        .fetch_add(c, std::sync::atomic::Ordering::Relaxed);
                }
            }),
        }
    }

    /// Writes `v` into the `n` bytes at `buf`.
    ///
    /// # Safety
    /// As [`Kernels::xform`] for `buf`.
    unsafe fn fill(&self, s: &CudaStream, buf: u64, n: u64, v: u8) -> Result<(), DriverError> {
        match self {
            // SAFETY: the kernel writes `n` bytes (caller).
            Kernels::Cuda { fill, .. } => unsafe {
                s.launch_builder(fill)
                    .arg(&buf)
                    .arg(&n)
                    .arg(&v)
                    .launch(grid(n as usize))
                    .map(drop)
            },
            Kernels::Host => host_fn(s, move || {
                // SAFETY: as in `xform`.
                unsafe { std::ptr::write_bytes(buf as *mut u8, v, n as usize) }
            }),
        }
    }
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 1024) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The CPU twin of the stage the tests enqueue.
fn stage_ref(c: &Chunk, input: &[u8], out: &mut [u8]) {
    if out.len() == 8 && c.len != 8 {
        let sum: u64 = input.iter().map(|&b| u64::from(b)).sum::<u64>() + c.index as u64;
        out.copy_from_slice(&sum.to_le_bytes());
        return;
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = input[j].wrapping_mul(3).wrapping_add(c.index as u8) ^ (j as u8);
    }
}

fn reference(src: &[u8], chunk: usize, out: OutLen) -> Vec<u8> {
    let mut res = Vec::new();
    for (index, input) in src.chunks(chunk).enumerate() {
        let c = Chunk {
            index,
            offset: index * chunk,
            len: input.len(),
            out_offset: res.len(),
            out_len: out.of(input.len()),
        };
        let mut o = vec![0u8; c.out_len];
        stage_ref(&c, input, &mut o);
        res.extend_from_slice(&o);
    }
    res
}

/// Enqueues the test stage for chunk `g`.
fn stage(k: &Kernels, g: &GpuChunk<'_>) -> Result<(), DriverError> {
    let c = g.chunk();
    let (input, n, idx) = (g.input(), c.len as u64, c.index as u32);
    let Some(out) = g.output() else { return Ok(()) };
    let s: &CudaStream = g.stream();
    // SAFETY: the addresses are the pipeline's slots, valid for work on this stream; the
    // stages stay inside `n` bytes of input and `out_len` bytes of output.
    unsafe {
        if c.out_len == 8 && c.len != 8 {
            k.checksum(s, input, n, idx, out)
        } else {
            k.xform(s, input, out, n, idx)
        }
    }
}

/// A xorshift generator from `seed`: each call a number below its argument (at least 1).
fn below_from(seed: u64) -> impl FnMut(usize) -> usize {
    let mut x = seed;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    }
}

fn run_case(
    e: &CudaEngine,
    k: &Kernels,
    src: &[u8],
    chunk: usize,
    slots: usize,
    out: OutLen,
    pinned: bool,
) -> Result<(), PipelineError> {
    let want = reference(src, chunk, out);
    let mut dst = vec![0xAAu8; want.len() + 3];
    let mut p = CudaPipeline::new(e, PipelineConfig::new(chunk, slots).output(out))?;
    let host;
    let source = if pinned {
        let mut h = PinnedBuffer::new(src.len().max(1)).unwrap();
        h[..src.len()].copy_from_slice(src);
        host = h;
        Source::new(&host[..src.len()])
    } else {
        Source::new(src)
    };
    p.run(source, Some(Dest::new(&mut dst)), |g| stage(k, g))?;
    assert_eq!(&dst[want.len()..], &[0xAA; 3], "wrote past the outputs");
    assert!(
        dst[..want.len()] == want[..],
        "output differs from the reference"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn matches_reference_for_random_chunks_every_k_pinned_and_pageable() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let mut below = below_from(0x1234_5678u64);
    for round in 0..32 {
        let n = 1 + below(24 << 20);
        let chunk = 1 + below(6 << 20);
        let slots = 1 + round % 4;
        let out = [OutLen::Same, OutLen::Fixed(8)][round % 2];
        let src = bytes(n, round as u64);
        run_case(&e, &k, &src, chunk, slots, out, round % 3 != 0)
            .unwrap_or_else(|err| panic!("n {n} chunk {chunk} k {slots} {out:?}: {err}"));
    }
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn ragged_short_and_empty_sources() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    for slots in 1..=4 {
        for pinned in [true, false] {
            run_case(
                &e,
                &k,
                &bytes((4 << 20) + 17, 1),
                1 << 20,
                slots,
                OutLen::Same,
                pinned,
            )
            .unwrap();
            run_case(&e, &k, &bytes(123, 2), 1 << 20, slots, OutLen::Same, pinned).unwrap();
        }
    }
    let mut p = CudaPipeline::new(&e, PipelineConfig::new(4096, 2)).unwrap();
    let mut dst = vec![9u8; 4];
    let rep = p
        .run(
            Source::new(&[0u8; 0][..]),
            Some(Dest::new(&mut dst)),
            |_| Err::<(), _>("must not run"),
        )
        .unwrap();
    assert_eq!(rep.chunks, 0);
    assert_eq!(dst, [9; 4]);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn failing_stage_stops_at_its_chunk_and_leaks_nothing() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let src = bytes(64 << 20, 3);
    // One good run first: the engine starts its staging threads (1 MiB pageable downloads are
    // staged) on first use and keeps them for its life; they are not the pipeline's (H200
    // run of 2026-12-03 counted them as leaked).
    let mut dst = vec![0u8; src.len()];
    CudaPipeline::new(&e, PipelineConfig::new(1 << 20, 2))
        .unwrap()
        .run(Source::new(&src), Some(Dest::new(&mut dst)), |g| {
            stage(&k, g)
        })
        .unwrap();
    let (free0, threads0, allocs0) = (device_free(), threads().1, open_allocs());
    for (round, bad) in [0usize, 5, 31, 63].into_iter().enumerate() {
        let slots = 1 + round % 4;
        let mut dst = vec![0u8; src.len()];
        let mut p = CudaPipeline::new(&e, PipelineConfig::new(1 << 20, slots)).unwrap();
        let err = p
            .run(Source::new(&src), Some(Dest::new(&mut dst)), |g| {
                if g.chunk().index == bad {
                    return Err(format!("bad chunk {bad}"));
                }
                stage(&k, g).map_err(|d| d.to_string())
            })
            .unwrap_err();
        assert!(
            matches!(&err, PipelineError::Stage { chunk, .. } if *chunk == bad),
            "{err}"
        );
        let want = reference(&src[..bad << 20], 1 << 20, OutLen::Same);
        assert!(
            dst[..want.len()] == want[..],
            "chunks before {bad} written back"
        );
        // The same pipeline works afterwards.
        p.run(Source::new(&src), Some(Dest::new(&mut dst)), |g| {
            stage(&k, g)
        })
        .unwrap();
        e.barrier().unwrap();
    }
    assert!(settled_threads(threads0, 5).1 <= threads0, "threads leaked");
    assert!(
        device_free() + DEVICE_SLACK >= free0,
        "device memory leaked"
    );
    assert_eq!(open_allocs(), allocs0, "driver allocations leaked");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn panicking_stage_waits_for_work_in_flight_then_unwinds() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let src = bytes(32 << 20, 4);
    let mut dst = vec![0u8; src.len()];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut p = CudaPipeline::new(&e, PipelineConfig::new(1 << 20, 3)).unwrap();
        let _ = p.run(Source::new(&src), Some(Dest::new(&mut dst)), |g| {
            if g.chunk().index == 17 {
                panic!("stage gave up");
            }
            stage(&k, g)
        });
    }));
    assert!(r.is_err());
    let want = reference(&src[..17 << 20], 1 << 20, OutLen::Same);
    assert!(dst[..want.len()] == want[..]);
    run_case(&e, &k, &src, 4 << 20, 2, OutLen::Same, true).unwrap();
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn two_pipelines_share_one_engine() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let (a, b) = (bytes(40 << 20, 5), bytes(33 << 20, 6));
    std::thread::scope(|s| {
        let ha = s.spawn(|| run_case(&e, &k, &a, 3 << 20, 2, OutLen::Same, true).unwrap());
        let hb = s.spawn(|| run_case(&e, &k, &b, 1 << 20, 3, OutLen::Fixed(8), false).unwrap());
        ha.join().unwrap();
        hb.join().unwrap();
    });
    e.barrier().unwrap();
}

/// A GPU timeline's spans in the pipeline's order: a chunk's compute after its upload and
/// before its download, each step's chunks one after the other on its stream, a chunk's upload
/// after the compute that last read its slot (`k` slots). Downloads ended by a host thread
/// (`staged`, into pageable memory) may show no length and start before their compute ended;
/// they are only checked to end after it.
fn spans_in_order(t: &Timeline, k: usize, staged: bool) {
    for c in &t.chunks {
        let (u, comp, d) = (c.upload.unwrap(), c.compute.unwrap(), c.download.unwrap());
        let down = if staged { d.end_us } else { d.start_us };
        assert!(
            u.end_us <= comp.start_us + 1.0 && comp.end_us <= down + 1.0,
            "{c:?}"
        );
        assert!(u.len_us() >= 0.0 && comp.len_us() > 0.0, "{c:?}");
        assert!(staged || (u.len_us() > 0.0 && d.len_us() > 0.0), "{c:?}");
    }
    let phases: &[Phase] = match staged {
        true => &[Phase::Upload, Phase::Compute],
        false => &[Phase::Upload, Phase::Compute, Phase::Download],
    };
    for w in t.chunks.windows(2) {
        for &p in phases {
            let (a, b) = (w[0].get(p).unwrap(), w[1].get(p).unwrap());
            assert!(
                a.end_us <= b.start_us + 1.0,
                "{p}: {:?} then {:?}",
                w[0],
                w[1]
            );
        }
    }
    for (i, c) in t.chunks.iter().enumerate().skip(k) {
        let reader = t.chunks[i - k].compute.unwrap();
        assert!(reader.end_us <= c.upload.unwrap().start_us + 1.0, "{c:?}");
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn timeline_from_cuda_events() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let src = bytes(64 << 20, 7);
    let mut host = PinnedBuffer::new(src.len()).unwrap();
    host.copy_from_slice(&src);
    let mut dst = PinnedBuffer::new(src.len()).unwrap();
    let mut p = CudaPipeline::new(&e, PipelineConfig::new(4 << 20, 3).timeline(true)).unwrap();
    let rep = p
        .run(Source::new(&host), Some(Dest::new(&mut dst)), |g| {
            stage(&k, g)
        })
        .unwrap();
    let t = rep.timeline.unwrap();
    assert_eq!(t.chunks.len(), 16);
    spans_in_order(&t, 3, false);
    println!(
        "upload {:.0} us, compute {:.0} us, download {:.0} us, wall {:.0} us, upload||compute {:.0} us",
        t.busy_us(Phase::Upload),
        t.busy_us(Phase::Compute),
        t.busy_us(Phase::Download),
        t.wall_us(),
        t.overlap_us(Phase::Upload, Phase::Compute)
    );
    assert!(t.to_chrome_trace("gpu").matches("\"ph\":\"X\"").count() == 48);
    let want = reference(&src, 4 << 20, OutLen::Same);
    assert!(dst[..] == want[..]);
}

/// The timeline of a run whose uploads wait for their bounce buffers' fills (a pageable
/// source: streams that go idle before a step is submitted) and whose downloads into pageable
/// memory are staged (ended by a host thread): every step is there, in order on its stream.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn timeline_of_a_pageable_source_and_destination() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let src = bytes(32 << 20, 11);
    let mut dst = vec![0u8; src.len()];
    let mut p = CudaPipeline::new(&e, PipelineConfig::new(2 << 20, 3).timeline(true)).unwrap();
    let rep = p
        .run(Source::new(&src[..]), Some(Dest::new(&mut dst[..])), |g| {
            stage(&k, g)
        })
        .unwrap();
    let t = rep.timeline.unwrap();
    assert_eq!(t.chunks.len(), 16);
    spans_in_order(&t, 3, true);
    let want = reference(&src, 2 << 20, OutLen::Same);
    assert!(dst == want);
}

/// A kernel on the caller's stream reads a buffer right after a ferry upload, ordered by a
/// stream wait only (no host synchronization), 10,000 times in a row (fewer where
/// `FERRY_TEST_ROUNDS` says: [`rounds`]); the next upload into the buffer waits for the kernel
/// through a recorded point of the stream.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn kernel_after_upload_sees_every_byte_10000_times() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let compute = e.context().new_stream().unwrap();
    let n = 256 << 10;
    let patterns = 16;
    let mut host = PinnedBuffer::new(n * patterns).unwrap();
    for p in 0..patterns {
        host[p * n..(p + 1) * n].fill(p as u8 + 1);
    }
    let mut dev = DeviceBuffer::new(0, n).unwrap();
    let bad = DeviceBuffer::zeroed(0, 4).unwrap();
    let (dev_ptr, bad_ptr, n64) = (dev.device_ptr(), bad.device_ptr(), n as u64);
    let dev_raw = dev.raw_mut();
    let mut read_done: Option<Request> = None;
    let mut on_gpu = 0;
    let rounds = rounds(10_000);
    for i in 0..rounds {
        let p = i % patterns;
        let src = RawBuf {
            len: n,
            addr: host.raw().addr + (p * n) as u64,
            ..host.raw()
        };
        let l = Layout::bytes(n).unwrap();
        let mut job = Job::copy(dev_raw, l, src, l);
        if let Some(r) = &read_done {
            job = job.after(r);
        }
        // SAFETY: `dev` is written only by this copy, which waits for the previous kernel that
        // read it; `host` is never written while copies run; both outlive the final sync.
        let up = unsafe { e.submit_raw(job) }.unwrap();
        if e.stream_wait(&compute, &up).unwrap() == StreamWait::Event {
            on_gpu += 1;
        }
        let v = p as u8 + 1;
        // SAFETY: `dev` holds n bytes, `bad` one u32; both outlive the sync below.
        unsafe { k.count_ne(&compute, dev_ptr, n64, v, bad_ptr) }.unwrap();
        read_done = Some(e.record(&compute).unwrap());
    }
    compute.synchronize().unwrap();
    e.barrier().unwrap();
    if null::is_synchronous() && on_gpu * 10 <= rounds * 9 {
        // Every upload has completed when submitted there: the tuned policy waits on the host.
        println!(
            "skipped: null CUDA driver: synchronous mode: the check that the waits are on the \
             GPU ({on_gpu} of {rounds} were)"
        );
    } else {
        assert!(
            on_gpu * 10 > rounds * 9,
            "only {on_gpu} of {rounds} waits were on the GPU"
        );
    }
    let bad = u32::from_le_bytes(bad.to_vec().unwrap()[..4].try_into().unwrap());
    assert_eq!(bad, 0, "a kernel saw bytes of another upload");
}

/// Downloads that wait for a kernel (through a recorded stream point, a caller's event, and a
/// copy ordered in the caller's stream) see the kernel's output.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn download_after_kernel_sees_its_output() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let compute = e.context().new_stream().unwrap();
    let n = 8 << 20;
    let out = DeviceBuffer::new(0, n).unwrap();
    let (out_ptr, n64) = (out.device_ptr(), n as u64);
    let mut host = PinnedBuffer::new(n).unwrap();
    let l = Layout::bytes(n).unwrap();
    for i in 0..300u32 {
        let v = (i % 250) as u8 + 1;
        // SAFETY: `out` holds n bytes and outlives the waits below.
        unsafe { k.fill(&compute, out_ptr, n64, v) }.unwrap();
        let job = Job::copy(host.raw_mut(), l, out.raw(), l);
        let req = match i % 3 {
            0 => {
                let at = e.record(&compute).unwrap();
                // SAFETY: `host` and `out` outlive the wait; nothing else touches them.
                unsafe { e.submit_raw(job.after(&at)) }.unwrap()
            }
            1 => {
                let ev = compute.record_event(None).unwrap();
                let at = e.after_event(&ev).unwrap();
                drop(ev); // ferry captured the event's state: dropping it is allowed.
                          // SAFETY: as above.
                unsafe { e.submit_raw(job.after(&at)) }.unwrap()
            }
            _ => {
                let se = e.on_stream(&compute).unwrap();
                // SAFETY: as above.
                unsafe { se.submit_raw(job) }.unwrap()
            }
        };
        req.wait().unwrap();
        assert!(
            host.iter().all(|&b| b == v),
            "iteration {i}: download before the kernel"
        );
    }
    compute.synchronize().unwrap();
    e.barrier().unwrap();
}

/// Copies through `on_stream` whose route is not one driver call run on the engine's stream,
/// ordered by events around the caller's (issue 30: through the submission trunk, not a
/// rebuilt job): a staged upload from pageable memory or a segment list from pinned memory
/// (the gatherer's route) into `a`, a kernel on the caller's stream reading `a` into `b`, then
/// a segment list or a staged download of `b`. The stream's earlier work (junk written into
/// `a`) must not overwrite the upload, each kernel must see its own upload (the stream waits
/// for it) and each download the kernel's output (it waits for the stream); the stream sleeps
/// before its work so that a copy not ordered so would overtake it. Every byte checked, 40
/// times, late and out of order on the null driver's asynchronous mode.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn non_driver_routes_on_a_callers_stream_keep_its_order() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let s = e.context().new_stream().unwrap();
    let (n, piece) = (4usize << 20, 64usize << 10);
    let (a, b) = (
        DeviceBuffer::new(0, n).unwrap(),
        DeviceBuffer::new(0, n).unwrap(),
    );
    let (a_ptr, b_ptr, n64) = (a.device_ptr(), b.device_ptr(), n as u64);
    let mut pinned = PinnedBuffer::new(n).unwrap();
    let mut pageable = vec![0u8; n];
    let mut host = PinnedBuffer::new(n).unwrap();
    let l = Layout::bytes(n).unwrap();
    // The pieces in reverse order: a segment list (gather route) that is its own inverse.
    let pieces = n / piece;
    let reversed: std::sync::Arc<[ferry::Segment]> = (0..pieces)
        .map(|j| {
            ferry::Segment::new(
                (j * piece) as u64,
                ((pieces - 1 - j) * piece) as u64,
                piece as u64,
            )
        })
        .collect();
    let reverse = |v: &[u8]| -> Vec<u8> { v.chunks(piece).rev().flatten().copied().collect() };
    let segments = |dst: RawBuf, src: RawBuf| Job {
        dst,
        src: Some(src),
        op: ferry::Op::Segments(std::sync::Arc::clone(&reversed)),
        after: Vec::new(),
    };
    let se = e.on_stream(&s).unwrap();
    for i in 0..40u32 {
        let src = bytes(n, 1000 + u64::from(i));
        let staged_up = i % 2 == 0;
        let (up, in_a) = if staged_up {
            pageable.copy_from_slice(&src);
            (Job::copy(a.raw(), l, pageable.raw(), l), src.clone())
        } else {
            pinned.copy_from_slice(&src);
            (segments(a.raw(), pinned.raw()), reverse(&src))
        };
        // The caller's stream is held back before its work (a host function that sleeps), so
        // that a copy not ordered after that work would overtake it: the junk written into
        // `a` would overwrite the upload, and the download would read `b` before the kernel.
        host_fn(&s, || {
            std::thread::sleep(std::time::Duration::from_millis(20))
        })
        .unwrap();
        // SAFETY: `a` holds n bytes and outlives the wait below.
        unsafe { k.fill(&s, a_ptr, n64, 0x5A) }.unwrap();
        // SAFETY: the buffers outlive the download's wait below, which comes after the upload,
        // the kernel and the download (ordered by the stream); nothing else touches them.
        let up = unsafe { se.submit_raw(up) }.unwrap();
        host_fn(&s, || {
            std::thread::sleep(std::time::Duration::from_millis(20))
        })
        .unwrap();
        // SAFETY: `a` and `b` hold n bytes and outlive the wait below.
        unsafe { k.xform(&s, a_ptr, b_ptr, n64, i) }.unwrap();
        let in_b: Vec<u8> = (0..n)
            .map(|j| in_a[j].wrapping_mul(3).wrapping_add(i as u8) ^ (j as u8))
            .collect();
        let (job, want) = if staged_up {
            (segments(host.raw_mut(), b.raw()), reverse(&in_b))
        } else {
            (Job::copy(pageable.raw_mut(), l, b.raw(), l), in_b)
        };
        // SAFETY: as above.
        let down = unsafe { se.submit_raw(job) }.unwrap();
        down.wait()
            .unwrap_or_else(|err| panic!("iteration {i}: download: {err}"));
        up.wait()
            .unwrap_or_else(|err| panic!("iteration {i}: upload: {err}"));
        let (what, got): (&str, &[u8]) = if staged_up {
            ("staged upload, gathered download", &host)
        } else {
            ("gathered upload, staged download", &pageable)
        };
        check(&format!("iteration {i} ({what})"), got, &want);
    }
    s.synchronize().unwrap();
    e.barrier().unwrap();
}

/// A failed request is not waited on by a stream: the caller learns of it.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn stream_wait_on_failed_request_is_an_error() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let compute = e.context().new_stream().unwrap();
    let failed = Request::ready(Err(ferry::RequestError::Aborted("test".into())));
    assert!(matches!(
        e.stream_wait(&compute, &failed),
        Err(InteropError::Request(_))
    ));
    let done = Request::ready(Ok(()));
    assert_eq!(e.stream_wait(&compute, &done).unwrap(), StreamWait::Host);
}

/// The seed's loop through the safe API (`Scope::copy_to_device`, as example 07): two device
/// buffers written again and again in one scope, each upload after the kernel that last read
/// its buffer (`record`), each kernel after its upload (`stream_wait`), 4,000 times (fewer where
/// `FERRY_TEST_ROUNDS` says: [`rounds`]); every kernel checks every byte of its batch.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn scoped_copy_to_device_double_buffered_loop_sees_every_byte() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let compute = e.context().new_stream().unwrap();
    let (n, patterns, rounds) = (1 << 20, 8, rounds(4000));
    let mut host = PinnedBuffer::new(n * patterns).unwrap();
    for p in 0..patterns {
        host[p * n..(p + 1) * n].fill(p as u8 + 1);
    }
    let bufs = [
        DeviceBuffer::new(0, n).unwrap(),
        DeviceBuffer::new(0, n).unwrap(),
    ];
    // One counter per round: a failure names the round.
    let bad = DeviceBuffer::zeroed(0, 4 * rounds).unwrap();
    let l = Layout::bytes(n).unwrap();
    let n64 = n as u64;
    e.scope(|s| -> Result<(), Box<dyn std::error::Error>> {
        let mut read_done: [Option<Request>; 2] = [None, None];
        for i in 0..rounds {
            let (p, buf) = (i % patterns, &bufs[i % 2]);
            let after: Vec<&Request> = read_done[i % 2].iter().collect();
            let up = s.copy_to_device(buf, &l, &host[p * n..(p + 1) * n], &l, &after)?;
            e.stream_wait(&compute, &up)?;
            let (ptr, v, bad_i) = (
                buf.device_ptr(),
                p as u8 + 1,
                bad.device_ptr() + 4 * i as u64,
            );
            // SAFETY: `buf` holds n bytes and `bad_i` one u32 of `bad`; both outlive the sync
            // below; the next upload into `buf` waits for this kernel.
            unsafe { k.count_ne(&compute, ptr, n64, v, bad_i) }?;
            read_done[i % 2] = Some(e.record(&compute)?);
        }
        compute.synchronize()?;
        Ok(())
    })
    .unwrap();
    let counts = bad.to_vec().unwrap();
    for (i, c) in counts.chunks_exact(4).enumerate() {
        let c = u32::from_le_bytes(c.try_into().unwrap());
        assert_eq!(
            c,
            0,
            "round {i}: the kernel saw {c} bytes of {n} that were not pattern {} (buffer {})",
            i % patterns + 1,
            i % 2
        );
    }
    // Refused where it cannot run: a CPU engine does not take device memory.
    let cpu = ferry::CpuEngine::new(1).unwrap();
    let r = cpu.scope(|s| -> ferry::Result<()> {
        s.copy_to_device(&bufs[0], &l, &host[..n], &l, &[])?
            .wait()?;
        Ok(())
    });
    assert!(r.is_err(), "a CPU engine took a copy into device memory");
}

/// A file streamed through the GPU pipeline, chunk by chunk into the device slots (the file
/// engine's reads into the pipeline's pinned bounce buffers, then DMAs; no buffer of the whole
/// file): outputs
/// equal the reference for random ranges, chunk sizes and K; a range past the end fails the
/// first chunk past it, and the pipeline stays usable.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn file_source_through_device_slots_matches_reference() {
    use ferry::file::{FileConfig, FileEngine, OpenMode};
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let e = std::sync::Arc::new(e);
    let k = kernels(&e);
    let files = FileEngine::with_engine(FileConfig::new(), e.clone()).unwrap();
    let data = bytes(40 << 20, 91);
    let path = std::env::temp_dir().join(format!("ferry-cuda-pipe-file-{}", std::process::id()));
    std::fs::write(&path, &data).unwrap();
    let file = files.open(&path, OpenMode::Read).unwrap();
    let mut below = below_from(0xF11E_u64);
    let run = |off: usize, n: usize, chunk: usize, slots: usize| -> Result<(), PipelineError> {
        let want = reference(&data[off..off + n], chunk, OutLen::Same);
        let mut dst = PinnedBuffer::new(want.len().max(1)).unwrap();
        let mut p = CudaPipeline::new(&e, PipelineConfig::new(chunk, slots))?;
        let src = Source::file(&files, &file, off as u64, n)?;
        p.run(src, Some(Dest::new(&mut dst[..want.len()])), |g| {
            stage(&k, g)
        })?;
        if let Some(b) = dst[..want.len()]
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
        {
            panic!("offset {off} len {n} chunk {chunk} k {slots}: output differs at byte {b}");
        }
        Ok(())
    };
    for round in 0..12 {
        let off = below(1 << 20);
        let n = below(data.len() - off + 1);
        let chunk = 1 + below(8 << 20);
        let slots = 1 + round % 4;
        run(off, n, chunk, slots)
            .unwrap_or_else(|err| panic!("offset {off} len {n} chunk {chunk} k {slots}: {err}"));
    }
    let chunk = 4 << 20;
    let mut p = CudaPipeline::new(&e, PipelineConfig::new(chunk, 3)).unwrap();
    let mut dst = vec![0u8; data.len() + chunk];
    let src = Source::file(&files, &file, 0, data.len() + chunk).unwrap();
    let err = p
        .run(src, Some(Dest::new(&mut dst)), |g| stage(&k, g))
        .unwrap_err();
    assert_eq!(err.chunk(), Some(data.len() / chunk), "{err}");
    run(0, data.len(), chunk, 3).expect("the pipeline runs again after a failed file range");
    std::fs::remove_file(&path).ok();
    e.barrier().unwrap();
}

/// The bounce buffers' fills run ahead of the uploads as far as the buffers allow, and an
/// upload ahead of its chunk's compute is submitted only once its fill is done: byte-checked
/// for K = 1..4 with a stage that holds the submitting thread (every fill runs K + 2 ahead
/// and is done when its upload comes), a stage that returns at once on chunks of 64 KiB-1 MiB
/// (uploads wait for fills still running, computes go first), and one that alternates, on
/// pageable sources; once the pipelines are gone no thread of theirs is left and none of the
/// process's host copy workers (at most the cores) is left running.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn bounce_fills_ahead_slow_and_fast_stages_match_reference() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let data = bytes(24 << 20, 41);
    // Warm-up: the engine's own threads (staging) start on first use and stay.
    run_case(&e, &k, &data[..4 << 20], 1 << 20, 2, OutLen::Same, false).unwrap();
    let threads0 = threads().1;
    let mut below = below_from(0xFA57_u64);
    for slots in 1..=4 {
        for (mode, chunk) in [(0, 1 << 20), (1, 64 << 10), (2, (256 << 10) + 4095)] {
            let n = (3 * slots + 9) * chunk + below(chunk);
            let off = below(4096);
            let src = &data[off..off + n];
            let want = reference(src, chunk, OutLen::Same);
            let mut dst = vec![0u8; n];
            let mut p = CudaPipeline::new(&e, PipelineConfig::new(chunk, slots)).unwrap();
            for run in 0..2 {
                dst.fill(0);
                p.run(Source::new(src), Some(Dest::new(&mut dst)), |g| {
                    let i = g.chunk().index;
                    if mode == 0 || (mode == 2 && i % 3 == 0) {
                        std::thread::sleep(std::time::Duration::from_micros(300));
                    }
                    stage(&k, g)
                })
                .unwrap_or_else(|err| {
                    panic!("k {slots} mode {mode} chunk {chunk} run {run}: {err}")
                });
                if let Some(b) = dst.iter().zip(&want).position(|(a, b)| a != b) {
                    panic!(
                        "k {slots} mode {mode} chunk {chunk} len {n} run {run}: output byte {b} (chunk {}) is {:#04x}, the reference {:#04x}",
                        b / chunk,
                        dst[b],
                        want[b]
                    );
                }
            }
        }
    }
    assert!(
        settled_threads(threads0, 5).1 <= threads0,
        "pipeline threads left after their pipelines were dropped"
    );
    let (host, running) = host_workers_idle();
    assert!(
        host <= cores(),
        "{host} host copy workers on {} cores",
        cores()
    );
    assert_eq!(
        running, 0,
        "host copy workers left running after their pipelines were dropped"
    );
    e.barrier().unwrap();
}

/// The process's threads whose name starts with `prefix` now.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .count()
}

/// The count of threads named `prefix*` once `ok` holds for it, or after 2 s what it is then:
/// a joined thread can leave `/proc/self/task` a moment after its join returned, and a new
/// thread takes its name itself when it first runs, which on a loaded machine (CI's 2 cores)
/// can be after the work it was started for was done by others.
fn settled_by(prefix: &str, ok: impl Fn(usize) -> bool) -> usize {
    let t0 = std::time::Instant::now();
    loop {
        let n = threads_named(prefix);
        if ok(n) || t0.elapsed() > std::time::Duration::from_secs(2) {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// [`settled_by`] until the count is `want`.
fn settled(prefix: &str, want: usize) -> usize {
    settled_by(prefix, |n| n == want)
}

/// `PipelineConfig::fill_threads` is how many of the process's host copy workers
/// (`ferry-host-*`, one set shared by every pipeline and staged copy) a pageable run's fills
/// use: the run starts that many where fewer run, never more than the cores, and once the
/// pipeline is dropped none of them is left running (the output is still the reference, from
/// a whole and a strided source); more than `FILL_THREADS_MAX` is refused when the pipeline is
/// made.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn fill_threads_setting_starts_that_many_workers() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let data = bytes(6 << 20, 91);
    let want = reference(&data, 1 << 20, OutLen::Same);
    for threads in [1, 3] {
        let before = host_workers().0;
        let cfg = PipelineConfig::new(1 << 20, 3).fill_threads(threads);
        let mut p = CudaPipeline::new(&e, cfg).unwrap();
        let mut dst = vec![0u8; data.len()];
        p.run(Source::new(&data), Some(Dest::new(&mut dst)), |g| {
            stage(&k, g)
        })
        .unwrap();
        assert!(
            dst == want,
            "{threads} fill threads: output differs from the reference"
        );
        let started = settled_by(HOST_WORKERS, |n| n >= threads.min(cores()));
        assert!(
            started >= before.max(threads.min(cores())) && started <= cores(),
            "fill_threads({threads}): {started} host copy workers (before {before}, {} cores)",
            cores()
        );
        drop(p);
        let (after, running) = host_workers_idle();
        assert_eq!(
            running, 0,
            "fill_threads({threads}): host copy workers left running after the pipeline"
        );
        assert_eq!(
            after, started,
            "the host copy workers are the process's: they stay"
        );
    }
    // A strided source (every other 4 KiB row of a pageable matrix) with two fill threads.
    let rows = 512;
    let m = bytes(rows * 8192, 92);
    let l = Layout::pitched(&[rows, 4096], 1, 8192).unwrap();
    let packed: Vec<u8> = m.chunks(8192).flat_map(|r| r[..4096].to_vec()).collect();
    let want = reference(&packed, 1 << 20, OutLen::Same);
    // Strided fills run on a CPU engine's workers (`ferry-cpu-*`).
    let cpu_before = threads_named("ferry-cpu-");
    let mut p = CudaPipeline::new(&e, PipelineConfig::new(1 << 20, 2).fill_threads(2)).unwrap();
    let mut dst = vec![0u8; packed.len()];
    p.run(
        Source::strided(&m, l).unwrap(),
        Some(Dest::new(&mut dst)),
        |g| stage(&k, g),
    )
    .unwrap();
    assert!(
        dst == want,
        "strided source, 2 fill threads: output differs from the reference"
    );
    assert_eq!(
        settled("ferry-cpu-", cpu_before + 2),
        cpu_before + 2,
        "strided fill workers of fill_threads(2)"
    );
    drop(p);
    assert_eq!(
        settled("ferry-cpu-", cpu_before),
        cpu_before,
        "strided fill workers outlived their pipeline"
    );
    let too_many = PipelineConfig::new(1 << 20, 2).fill_threads(FILL_THREADS_MAX + 1);
    assert!(matches!(
        CudaPipeline::new(&e, too_many),
        Err(PipelineError::Config(_))
    ));
    e.barrier().unwrap();
}

/// The fill workers start only for a source they fill: a file source's chunks are read by
/// the file engine into the bounce buffers, and its pipeline (into pinned memory) starts no
/// host copy worker (`ferry-host-*`); a pageable run on the same pipeline has its fill threads
/// among them (at most the cores), and once the pipeline is dropped none of them is left
/// running.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn file_sources_start_no_fill_workers() {
    use ferry::file::{FileConfig, FileEngine, OpenMode};
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let e = std::sync::Arc::new(e);
    let k = kernels(&e);
    let files = FileEngine::with_engine(FileConfig::new(), e.clone()).expect("a file engine");
    let data = bytes(8 << 20, 78);
    let path = std::env::temp_dir().join(format!("ferry-cuda-pipe-nofill-{}", std::process::id()));
    std::fs::write(&path, &data).unwrap();
    let file = files.open(&path, OpenMode::Read).unwrap();
    let want = reference(&data, 1 << 20, OutLen::Same);
    let before = host_workers().0;
    let cfg = PipelineConfig::new(1 << 20, 2);
    let fill = cfg.effective_fill_threads().min(cores());
    let mut p = CudaPipeline::new(&e, cfg).unwrap();
    // Into pinned memory: a pageable destination's downloads may take the engine's staged
    // route, whose copies out of its ring run on the same workers (the plain policy's run of
    // the seventh H100 run saw 12 started so), and this test is about the source.
    let mut pinned = ferry::cuda::PinnedBuffer::new(data.len()).unwrap();
    let src = Source::file(&files, &file, 0, data.len()).unwrap();
    p.run(src, Some(Dest::new(&mut pinned)), |g| stage(&k, g))
        .unwrap();
    assert!(
        pinned[..] == want[..],
        "file source: output differs from the reference"
    );
    assert_eq!(
        host_workers().0,
        before,
        "a file source started host copy workers"
    );
    let mut dst = vec![0u8; data.len()];
    p.run(Source::new(&data), Some(Dest::new(&mut dst)), |g| {
        stage(&k, g)
    })
    .unwrap();
    assert!(
        dst == want,
        "pageable source: output differs from the reference"
    );
    let started = settled_by(HOST_WORKERS, |n| n >= fill);
    assert!(
        started >= fill && started <= cores(),
        "a pageable source ran on {started} host copy workers ({fill} fill threads, {} cores)",
        cores()
    );
    drop(p);
    assert_eq!(
        host_workers_idle().1,
        0,
        "host copy workers left running after the pipeline"
    );
    std::fs::remove_file(&path).ok();
    e.barrier().unwrap();
}

/// Pageable, strided-pageable and file sources go through the pipeline's K + 1 pinned bounce
/// buffers: one pipeline per K (1..4) reused across runs of random chunk counts (many more
/// chunks than bounce buffers, so every buffer is refilled after its DMA, and a ragged last
/// chunk), sources alternating between pageable memory and a file, and a run after a failed
/// file range; every output byte checked against the reference.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn pageable_and_file_sources_through_bounce_buffers_match_reference() {
    use ferry::file::{FileConfig, FileEngine, OpenMode};
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let e = std::sync::Arc::new(e);
    let k = kernels(&e);
    let files = FileEngine::with_engine(FileConfig::new().chunk_bytes(256 << 10), e.clone())
        .expect("a file engine");
    let data = bytes(48 << 20, 77);
    let path = std::env::temp_dir().join(format!("ferry-cuda-pipe-bounce-{}", std::process::id()));
    std::fs::write(&path, &data).unwrap();
    let file = files.open(&path, OpenMode::Read).unwrap();
    let mut below = below_from(0xB0_0CE_u64);
    let check = |what: &str, got: &[u8], want: &[u8]| {
        if let Some(b) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!(
                "{what}: output byte {b} of {} is {:#04x}, the reference {:#04x}",
                want.len(),
                got[b],
                want[b]
            );
        }
    };
    for slots in 1..=4 {
        let chunk = (1 << 20) + below(3 << 20);
        let mut p = CudaPipeline::new(&e, PipelineConfig::new(chunk, slots)).unwrap();
        for run in 0..6 {
            let off = below(1 << 20);
            // At least 2 K + 3 chunks and a ragged last one (or a single short one).
            let n = match run {
                5 => 1 + below(chunk),
                _ => (2 * slots + 3 + below(8)) * chunk + 1 + below(chunk - 1),
            }
            .min(data.len() - off);
            let want = reference(&data[off..off + n], chunk, OutLen::Same);
            let mut dst = PinnedBuffer::new(n.max(1)).unwrap();
            let from_file = run % 2 == 1;
            let what = format!(
                "k {slots} chunk {chunk} offset {off} len {n} {}",
                if from_file { "file" } else { "pageable" }
            );
            let src = match from_file {
                true => Source::file(&files, &file, off as u64, n).unwrap(),
                false => Source::new(&data[off..off + n]),
            };
            p.run(src, Some(Dest::new(&mut dst[..n])), |g| stage(&k, g))
                .unwrap_or_else(|err| panic!("{what}: {err}"));
            check(&what, &dst[..n], &want);
        }
        // A file range past the end fails its first chunk past the end; the same pipeline
        // (and its bounce buffers) runs again.
        let mut dst = vec![0u8; data.len() + chunk];
        let src = Source::file(&files, &file, 0, data.len() + chunk).unwrap();
        let err = p
            .run(src, Some(Dest::new(&mut dst)), |g| stage(&k, g))
            .unwrap_err();
        assert_eq!(err.chunk(), Some(data.len() / chunk), "k {slots}: {err}");
        let n = 5 * chunk + 7;
        let want = reference(&data[..n], chunk, OutLen::Same);
        let mut dst = vec![0u8; n];
        p.run(Source::new(&data[..n]), Some(Dest::new(&mut dst)), |g| {
            stage(&k, g)
        })
        .unwrap_or_else(|err| panic!("k {slots}: the run after a failed file range: {err}"));
        check(&format!("k {slots} after a failed range"), &dst, &want);
    }
    // A strided pageable source: columns 3..61 of 4-byte elements, packed into the bounce
    // buffers by the fill workers.
    let cols = 4096usize;
    let rows = 3000usize;
    let m = bytes(rows * cols * 4, 5);
    let l = Layout::contiguous(&[rows, cols], 4)
        .unwrap()
        .slice(1, 3..cols - 3, 1)
        .unwrap();
    let row = (cols - 6) * 4;
    let dense: Vec<u8> = (0..rows)
        .flat_map(|r| m[(r * cols + 3) * 4..(r * cols + cols - 3) * 4].to_vec())
        .collect();
    // Chunks of several rows (K = 1..4), then chunks of fewer bytes than a row (K = 1..3):
    // each of those is one whole row, more than the device slots were made for; they grow to
    // it (sized to `chunk_bytes`, they were written past their end).
    let many = (1..=4).map(|slots| (slots, row * (7 + slots) + 5));
    let few = (1..=3).map(|slots| (slots, row / (slots + 1)));
    for (slots, chunk) in many.chain(few) {
        let step = (chunk / row).max(1) * row;
        let want = reference(&dense, step, OutLen::Same);
        let mut dst = vec![0u8; want.len()];
        let mut p = CudaPipeline::new(&e, PipelineConfig::new(chunk, slots)).unwrap();
        p.run(
            Source::strided(&m, l).unwrap(),
            Some(Dest::new(&mut dst)),
            |g| stage(&k, g),
        )
        .unwrap_or_else(|err| panic!("strided k {slots} chunk {chunk}: {err}"));
        check(&format!("strided k {slots} chunk {chunk}"), &dst, &want);
    }
    std::fs::remove_file(&path).ok();
    e.barrier().unwrap();
}

/// Copies through `on_stream` run in the caller's stream's order with no host wait between
/// them: upload, a kernel on the same stream, download, 200 times; the download's request is
/// the only wait. Pinned <-> device copies (driver-call routes) run on the caller's stream
/// itself; every fourth upload is from pageable memory (a staged route, ordered by events
/// instead). Every byte of every output checked.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn copies_on_a_callers_stream_run_in_its_order() {
    let _g = serial();
    let Some(e) = cuda_or_skip() else { return };
    let k = kernels(&e);
    let s = e.context().new_stream().unwrap();
    let n = 4 << 20;
    let (a, b) = (
        DeviceBuffer::new(0, n).unwrap(),
        DeviceBuffer::new(0, n).unwrap(),
    );
    let (a_ptr, b_ptr, n64) = (a.device_ptr(), b.device_ptr(), n as u64);
    let mut pinned = PinnedBuffer::new(n).unwrap();
    let mut pageable = vec![0u8; n];
    let mut host = PinnedBuffer::new(n).unwrap();
    let l = Layout::bytes(n).unwrap();
    let se = e.on_stream(&s).unwrap();
    for i in 0..200u32 {
        let src = bytes(n, u64::from(i));
        let from_pageable = i % 4 == 3;
        let up = if from_pageable {
            pageable.copy_from_slice(&src);
            Job::copy(a.raw(), l, pageable.raw(), l)
        } else {
            pinned.copy_from_slice(&src);
            Job::copy(a.raw(), l, pinned.raw(), l)
        };
        // SAFETY: the buffers outlive the download's wait below, which comes after every copy
        // and the kernel (one stream); nothing else touches them meanwhile.
        let up = unsafe { se.submit_raw(up) }.unwrap();
        // SAFETY: `a` and `b` hold n bytes and outlive the wait below.
        unsafe { k.xform(&s, a_ptr, b_ptr, n64, i) }.unwrap();
        // SAFETY: as above.
        let down = unsafe { se.submit_raw(Job::copy(host.raw_mut(), l, b.raw(), l)) }.unwrap();
        down.wait()
            .unwrap_or_else(|err| panic!("iteration {i}: download: {err}"));
        up.wait()
            .unwrap_or_else(|err| panic!("iteration {i}: upload: {err}"));
        let bad =
            (0..n).find(|&j| host[j] != (src[j].wrapping_mul(3).wrapping_add(i as u8) ^ (j as u8)));
        if let Some(j) = bad {
            panic!(
                "iteration {i} ({} source): byte {j} of {n} is {:#04x}, want {:#04x}",
                if from_pageable { "pageable" } else { "pinned" },
                host[j],
                src[j].wrapping_mul(3).wrapping_add(i as u8) ^ (j as u8)
            );
        }
    }
    s.synchronize().unwrap();
    e.barrier().unwrap();
}
