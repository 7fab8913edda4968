//! Two processes on one GPU through ferry's transfer agent (`ferry::agent`), measured: this
//! program starts itself again as the peer, which registers a device buffer (CUDA IPC) and
//! pinned shared host memory; this process imports both and moves segment lists to and from
//! them, against a raw baseline in one process on the same bytes.
//!
//! Rows (GB/s = 10^9 B/s of payload, host clock around post + wait, median of the samples;
//! ferry's and the raw baseline's samples taken in turns, at least `--reps` each and more for
//! calls of a few microseconds):
//! - `ipc-d2d-write` / `ipc-d2d-read`: device here -> the peer's device memory (a
//!   `DeviceBuffer`, CUDA IPC) and back; raw: one `cuMemcpyAsync` per segment between the same
//!   two pointers (the peer's opened here) on one stream, then `cuStreamSynchronize`.
//! - `ipc-vmm-d2d-write`: device here -> the peer's VMM allocation (`Agent::alloc_device`,
//!   imported from a file descriptor); raw as above.
//! - `ipc-h2d-read`: the peer's pinned host memory -> device here (an upload across processes);
//!   raw: one `cuMemcpyHtoDAsync` per segment from pinned memory of this process.
//! - `ipc-d2h-write`: device here -> the peer's pinned host memory; raw: `cuMemcpyDtoHAsync`
//!   into pinned memory of this process.
//! - `ipc-post`: 1 to 15,000 segments (66 KB each with `--full`): the time `Agent::write`
//!   takes to return (post), and the whole transfer's bandwidth.
//!
//! Without a GPU (or on the null CUDA driver) the same rows run on host memory and a CPU
//! engine: `host-shared-write` (memfd), `host-cross-write` (cross-memory attach).
//!
//! `cargo run --release --example 09_agent_ipc [-- --full] [--reps N] [--json FILE]`
//! (`bench/agent/nixl_compare.py --ferry FILE` runs the same transfers through NIXL and prints
//! the ratios.)

use cudarc::driver::{sys, CudaContext};
use ferry::agent::{Agent, Descriptor, Region, RemoteRegion};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::{CpuEngine, Engine, Request, Segment};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

fn gpu() -> bool {
    ferry::cuda::probe().driver.is_ok() && std::env::var_os("FERRY_AGENT_BENCH_HOST").is_none()
}

/// The peer: registers `bytes` of device memory and of pinned shared memory (host memory
/// only without a GPU), prints its socket and descriptors, and lives until stdin closes.
fn peer(bytes: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    let regions: Vec<Region>;
    writeln!(out, "COUNT {}", if gpu() { 3 } else { 2 })?;
    let agent;
    if gpu() {
        agent = Agent::new("bench-peer", Arc::new(CudaEngine::new(0)?))?;
        let dev = agent.register_device(DeviceBuffer::zeroed(0, bytes)?)?;
        let host = agent.alloc_shared(bytes, true)?;
        let vmm = agent.alloc_device(0, bytes)?;
        regions = vec![dev, host, vmm];
    } else {
        agent = Agent::new("bench-peer", Arc::new(CpuEngine::new(4)?))?;
        let shared = agent.alloc_shared(bytes, false)?;
        let cross = agent.register_host(vec![0u8; bytes])?;
        regions = vec![shared, cross];
    }
    writeln!(out, "PATH {}", agent.socket_path().display())?;
    for r in &regions {
        writeln!(out, "DESC {}", hex(&r.descriptor().to_bytes()))?;
    }
    out.flush()?;
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line)? > 0 {
        line.clear();
    }
    Ok(())
}

/// `batch` segments of `block` bytes, the i-th from slot `batch - 1 - i` to slot `i` (never
/// adjacent in both buffers, so nothing merges them).
fn segments(block: usize, batch: usize) -> Vec<Segment> {
    (0..batch)
        .map(|i| {
            Segment::new(
                (i * block) as u64,
                ((batch - 1 - i) * block) as u64,
                block as u64,
            )
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One transfer: `post` (its request), then a wait for it; the post's time in seconds. `what`
/// names the transfer in the panic of a failed wait.
fn post_wait(what: &str, post: &mut impl FnMut() -> Request) -> f64 {
    let t = Instant::now();
    let r = post();
    let p = t.elapsed().as_secs_f64();
    r.wait().unwrap_or_else(|e| panic!("{what}: {e}"));
    p
}

/// Times the transfer `post` posts ([`post_wait`]): 2 warm-up calls, then `reps`; the median
/// call time and the median post time.
fn time(reps: usize, what: &str, mut post: impl FnMut() -> Request) -> (f64, f64) {
    for _ in 0..2 {
        post_wait(what, &mut post);
    }
    let (mut total, mut posts) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        posts.push(post_wait(what, &mut post));
        total.push(t.elapsed().as_secs_f64());
    }
    (median(&mut total), median(&mut posts))
}

/// Times ferry's transfer `post` (as [`time`]) and the raw baseline `raw` in turns, sample by
/// sample, the order swapped every sample, so that a drift of the machine falls on both alike;
/// at least `reps` samples each, more for short calls (as many as fill about 2 ms, up to 200),
/// where a few samples of a few microseconds are mostly noise. The medians: ferry's call,
/// ferry's post, the raw call.
fn time_pair(
    reps: usize,
    what: &str,
    mut post: impl FnMut() -> Request,
    mut raw: impl FnMut(),
) -> (f64, f64, f64) {
    for _ in 0..2 {
        post_wait(what, &mut post);
        raw();
    }
    let t = Instant::now();
    post_wait(what, &mut post);
    let one = t.elapsed().as_secs_f64();
    let samples = reps.max(((2e-3 / one.max(1e-7)).ceil() as usize).min(200));
    let (mut total, mut posts, mut base) = (Vec::new(), Vec::new(), Vec::new());
    let mut ferry = || {
        let t = Instant::now();
        posts.push(post_wait(what, &mut post));
        total.push(t.elapsed().as_secs_f64());
    };
    let mut baseline = || {
        let t = Instant::now();
        raw();
        base.push(t.elapsed().as_secs_f64());
    };
    for i in 0..samples {
        if i % 2 == 0 {
            ferry();
            baseline();
        } else {
            baseline();
            ferry();
        }
    }
    (median(&mut total), median(&mut posts), median(&mut base))
}

#[derive(serde::Serialize)]
struct Row {
    row: &'static str,
    block: usize,
    batch: usize,
    bytes: usize,
    ferry_gbps: f64,
    raw_gbps: Option<f64>,
    post_us: f64,
}

impl Row {
    /// A row timed against the raw baseline: [`time_pair`]'s (ferry's time, its post, raw's time)
    /// for `batch` segments of `block` bytes.
    fn paired(
        row: &'static str,
        block: usize,
        batch: usize,
        (t, post, rt): (f64, f64, f64),
    ) -> Row {
        let n = block * batch;
        Row {
            row,
            block,
            batch,
            bytes: n,
            ferry_gbps: gbps(n, t),
            raw_gbps: Some(gbps(n, rt)),
            post_us: post * 1e6,
        }
    }
}

/// Raw driver copies in one process: one call per segment on one stream, then a synchronize.
struct Raw {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
}

#[derive(Clone, Copy)]
enum Dir {
    D2D,
    H2D,
    D2H,
}

impl Raw {
    fn new() -> Result<Raw, Box<dyn std::error::Error>> {
        let ctx = CudaContext::new(0)?;
        ctx.bind_to_thread()?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current.
        unsafe { sys::cuStreamCreate(&mut stream, 1) }.result()?;
        Ok(Raw { ctx, stream })
    }

    /// Copies `segs` from `src` to `dst` (addresses of this process) and waits.
    fn copy(&self, dir: Dir, dst: u64, src: u64, segs: &[Segment]) {
        self.ctx.bind_to_thread().expect("bind");
        for s in segs {
            let (d, sr, n) = (dst + s.dst_off, src + s.src_off, s.len as usize);
            // SAFETY: `dst`/`src` are live allocations of at least every segment's end
            // (registered regions and this process's buffers, checked by the agent's own
            // transfers on the same segment lists first); the stream is this context's.
            let r = unsafe {
                match dir {
                    Dir::D2D => sys::cuMemcpyAsync(d, sr, n, self.stream),
                    Dir::H2D => sys::cuMemcpyHtoDAsync_v2(d, sr as *const _, n, self.stream),
                    Dir::D2H => sys::cuMemcpyDtoHAsync_v2(d as *mut _, sr, n, self.stream),
                }
            };
            r.result().expect("raw copy");
        }
        // SAFETY: the stream made in `new`.
        unsafe { sys::cuStreamSynchronize(self.stream) }
            .result()
            .expect("synchronize");
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the stream made in `new`, idle after its last synchronize.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.stream) };
    }
}

struct Setup {
    me: Agent,
    remote: Vec<RemoteRegion>,
    bytes: usize,
    reps: usize,
}

fn sweep(full: bool, bytes: usize) -> Vec<(usize, usize)> {
    let blocks: &[usize] = if full {
        &[4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB]
    } else {
        &[4 * KIB, MIB, 16 * MIB]
    };
    let batches: &[usize] = if full { &[1, 16, 256, 1024] } else { &[1, 64] };
    let mut v = Vec::new();
    for &b in blocks {
        for &n in batches {
            if b * n <= bytes {
                v.push((b, n));
            }
        }
    }
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--full");
    let bytes: usize = std::env::var("FERRY_AGENT_BENCH_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1 << 30 } else { 256 * MIB });
    if std::env::var_os("FERRY_AGENT_BENCH_PEER").is_some() {
        return peer(bytes);
    }
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(if full { 20 } else { 5 });
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned());

    let mut child = Command::new(std::env::current_exe()?)
        .args(&args[1..])
        .env("FERRY_AGENT_BENCH_PEER", "1")
        .env("FERRY_AGENT_BENCH_BYTES", bytes.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let (mut path, mut descs, mut count) = (String::new(), Vec::new(), usize::MAX);
    while descs.len() < count {
        let mut l = String::new();
        if out.read_line(&mut l)? == 0 {
            return Err("the peer process ended early".into());
        }
        if let Some(n) = l.trim().strip_prefix("COUNT ") {
            count = n.parse()?;
        } else if let Some(p) = l.trim().strip_prefix("PATH ") {
            path = p.to_string();
        } else if let Some(d) = l.trim().strip_prefix("DESC ") {
            descs.push(Descriptor::from_bytes(&unhex(d)).ok_or("bad descriptor")?);
        }
    }
    let gpu = gpu();
    let engine: Arc<dyn Engine> = if gpu {
        Arc::new(CudaEngine::new(0)?)
    } else {
        Arc::new(CpuEngine::new(4)?)
    };
    let me = Agent::new("bench", engine)?;
    let peer = me.connect(&path)?;
    let t = Instant::now();
    let remote = descs
        .iter()
        .map(|d| peer.import(d))
        .collect::<Result<Vec<_>, _>>()?;
    println!(
        "two processes (pid {} and peer pid {}), {} MiB per buffer, at least {} samples per row \
         (ferry and raw in turns); imports took {:.1} us; descriptor {} bytes",
        std::process::id(),
        peer.pid(),
        bytes / MIB,
        reps,
        t.elapsed().as_secs_f64() * 1e6 / 2.0,
        descs[0].to_bytes().len()
    );
    let setup = Setup {
        me,
        remote,
        bytes,
        reps,
    };
    let rows = if gpu {
        gpu_rows(&setup, full)?
    } else {
        println!("skipped: GPU rows: no CUDA driver (host rows instead)");
        host_rows(&setup, full)?
    };
    println!(
        "{:<18} {:>9} {:>6} {:>10} {:>10} {:>7} {:>10}",
        "row", "block", "batch", "ferry GB/s", "raw GB/s", "ratio", "post us"
    );
    for r in &rows {
        let raw = r.raw_gbps.map_or("-".into(), |g| format!("{g:.2}"));
        let ratio = r
            .raw_gbps
            .map_or("-".into(), |g| format!("{:.2}", r.ferry_gbps / g));
        println!(
            "{:<18} {:>9} {:>6} {:>10.2} {:>10} {:>7} {:>10.1}",
            r.row, r.block, r.batch, r.ferry_gbps, raw, ratio, r.post_us
        );
    }
    if let Some(f) = json {
        std::fs::write(&f, serde_json::to_string_pretty(&rows)?)?;
        println!("wrote {f}");
    }
    drop(setup);
    drop(child.stdin.take());
    child.wait()?;
    Ok(())
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Checks that the first and last segments of `segs` landed: `dst` read back against `src`.
fn verify(what: &str, got: &[u8], want: &[u8], segs: &[Segment]) {
    for s in [segs[0], segs[segs.len() - 1]] {
        let (d, so, n) = (s.dst_off as usize, s.src_off as usize, s.len as usize);
        assert!(
            got[d..d + n] == want[so..so + n],
            "{what}: segment {s:?} differs"
        );
    }
}

fn gpu_rows(s: &Setup, full: bool) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let (me, bytes, reps) = (&s.me, s.bytes, s.reps);
    let (rdev, rhost) = (&s.remote[0], &s.remote[1]);
    let data: Vec<u8> = (0..bytes)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
        .collect();
    // `dev` is the writes' source and keeps `data` throughout; the reads land in `sink` (a read
    // into `dev` would change what the next row's writes send).
    let dev = me.register_device(DeviceBuffer::from_host(0, &data)?)?;
    let sink = me.register_device(DeviceBuffer::zeroed(0, bytes)?)?;
    let mut pinned = PinnedBuffer::new(bytes)?;
    pinned.copy_from_slice(&data);
    let raw = Raw::new()?;
    let check = me.alloc_shared(bytes, true)?;
    // Zeros, copied over the peer's buffer before the checked write.
    let zeros = DeviceBuffer::zeroed(0, bytes)?;
    let mut back = vec![0u8; bytes];
    let mut rows = Vec::new();
    for (block, batch) in sweep(full, bytes) {
        let segs = segments(block, batch);
        // Device -> the peer's device. Checked first, alone: the peer's buffer zeroed (a raw
        // copy), one write through the agent, read back (the raw baseline writes the same
        // bytes to the same place, so a check after the timing would not tell them apart).
        let whole = [Segment::new(0, 0, bytes as u64)];
        raw.copy(Dir::D2D, rdev.raw().addr, zeros.device_ptr(), &whole);
        me.write(rdev, &dev, &segs, None)?.wait()?;
        me.read(&check, rdev, &whole, None)?.wait()?;
        check.read_at(0, &mut back)?;
        verify("ipc-d2d-write", &back, &data, &segs);
        let timed = time_pair(
            reps,
            "d2d write",
            || me.write(rdev, &dev, &segs, None).expect("post"),
            || raw.copy(Dir::D2D, rdev.raw().addr, dev.raw().addr, &segs),
        );
        rows.push(Row::paired("ipc-d2d-write", block, batch, timed));
        // Device -> the peer's VMM allocation (imported from its file descriptor).
        let rvmm = &s.remote[2];
        let timed = time_pair(
            reps,
            "vmm write",
            || me.write(rvmm, &dev, &segs, None).expect("post"),
            || raw.copy(Dir::D2D, rvmm.raw().addr, dev.raw().addr, &segs),
        );
        rows.push(Row::paired("ipc-vmm-d2d-write", block, batch, timed));
        // The peer's device -> device here. Checked first, alone, as the write: `sink` zeroed,
        // one read through the agent, compared with what the write left in the peer's buffer
        // (zeros, and `data` where the segments put it).
        let mut peer_bytes = vec![0u8; bytes];
        for s in &segs {
            let (d, so, n) = (s.dst_off as usize, s.src_off as usize, s.len as usize);
            peer_bytes[d..d + n].copy_from_slice(&data[so..so + n]);
        }
        raw.copy(Dir::D2D, sink.raw().addr, zeros.device_ptr(), &whole);
        me.read(&sink, rdev, &segs, None)?.wait()?;
        sink.read_at(0, &mut back)?;
        verify("ipc-d2d-read", &back, &peer_bytes, &segs);
        let timed = time_pair(
            reps,
            "d2d read",
            || me.read(&sink, rdev, &segs, None).expect("post"),
            || raw.copy(Dir::D2D, sink.raw().addr, rdev.raw().addr, &segs),
        );
        rows.push(Row::paired("ipc-d2d-read", block, batch, timed));
        // The peer's pinned host memory -> device here, against an in-process pinned upload.
        let timed = time_pair(
            reps,
            "h2d read",
            || me.read(&sink, rhost, &segs, None).expect("post"),
            || raw.copy(Dir::H2D, sink.raw().addr, pinned.as_ptr() as u64, &segs),
        );
        rows.push(Row::paired("ipc-h2d-read", block, batch, timed));
        // Device here -> the peer's pinned host memory, against an in-process download.
        let timed = time_pair(
            reps,
            "d2h write",
            || me.write(rhost, &dev, &segs, None).expect("post"),
            || raw.copy(Dir::D2H, pinned.as_mut_ptr() as u64, dev.raw().addr, &segs),
        );
        rows.push(Row::paired("ipc-d2h-write", block, batch, timed));
    }
    post_rows(s, &dev, rdev, full, &mut rows)?;
    Ok(rows)
}

/// The post time of 1 to 15,000 segments, device here -> the peer's device (or host memory).
fn post_rows(
    s: &Setup,
    local: &Region,
    remote: &RemoteRegion,
    full: bool,
    rows: &mut Vec<Row>,
) -> Result<(), Box<dyn std::error::Error>> {
    let block = if full { 66 * 1000 } else { 16 * KIB };
    for batch in [1, 100, 1000, 15_000] {
        if block * batch > s.bytes {
            continue;
        }
        let segs = segments(block, batch);
        let (t, post) = time(s.reps, "write", || {
            s.me.write(remote, local, &segs, None).expect("post")
        });
        let n = block * batch;
        rows.push(Row {
            row: "ipc-post",
            block,
            batch,
            bytes: n,
            ferry_gbps: gbps(n, t),
            raw_gbps: None,
            post_us: post * 1e6,
        });
    }
    Ok(())
}

fn host_rows(s: &Setup, full: bool) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let (me, bytes, reps) = (&s.me, s.bytes, s.reps);
    let data: Vec<u8> = (0..bytes)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
        .collect();
    let local = me.register_host(data.clone())?;
    let check = me.register_host(vec![0u8; bytes])?;
    let mut back = vec![0u8; bytes];
    let mut rows = Vec::new();
    for (block, batch) in sweep(full, bytes) {
        let segs = segments(block, batch);
        let n = block * batch;
        for (row, remote) in [
            ("host-shared-write", &s.remote[0]),
            ("host-cross-write", &s.remote[1]),
        ] {
            let (t, post) = time(reps, "write", || {
                me.write(remote, &local, &segs, None).expect("post")
            });
            me.read(&check, remote, &[Segment::new(0, 0, bytes as u64)], None)?
                .wait()?;
            check.read_at(0, &mut back)?;
            verify(row, &back, &data, &segs);
            rows.push(Row {
                row,
                block,
                batch,
                bytes: n,
                ferry_gbps: gbps(n, t),
                raw_gbps: None,
                post_us: post * 1e6,
            });
        }
    }
    post_rows(s, &local, &s.remote[0], full, &mut rows)?;
    Ok(rows)
}
