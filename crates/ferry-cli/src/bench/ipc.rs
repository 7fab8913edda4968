//! Transfer-agent tests of `ferry bench` (`ipc-*`): two processes on one host. The bench
//! starts itself again as the peer ([`peer_main`], selected by the `FERRY_BENCH_IPC_PEER`
//! environment variable before any argument is read), which registers memory with its agent
//! and prints the descriptors; this process imports them and moves `batch` blocks of the row's
//! size with one segment list per call (block i of this process to slot `batch - 1 - i` of the
//! peer's, so that no two segments merge), posted and waited (host clock, median of samples),
//! interleaved with the raw baseline: the same segments copied in this process between the
//! same two mappings (the peer's memory mapped here), one plain call per segment.
//!
//! - `ipc-host-write` / `ipc-host-read`: host memory. ferry: the peer's shared memory (a memfd,
//!   copies on a CPU engine) and, as a second ferry series, its pageable memory reached by
//!   cross-memory attach (`process_vm_writev`/`readv`); raw: `copy_from_slice` per segment
//!   into (out of) the peer's shared memory mapped here.
//! - `ipc-d2d` (GPU): device memory here -> the peer's device memory (CUDA IPC); raw: one
//!   `cuMemcpyAsync` per segment between the same two pointers, then a synchronize.
//! - `ipc-h2d` (GPU): the peer's pinned shared memory -> device memory here; raw as above.
//! - `ipc-tcp-write` / `ipc-tcp-read`: host memory over TCP, loopback (the agent's transport
//!   between hosts: [`Agent::connect_tcp`]); raw: a plain TCP socket to the same peer process,
//!   a 9-byte header, then one `write_all` per block (one `read_exact` per block into its place
//!   here), the peer reading into (sending from) its buffer, and a byte back after a write.
//!
//! Batches of 1, 16, 256 and 1,024 blocks at each block size, as long as a call moves at most
//! 64 MiB (host) or 1 GiB (GPU). Every series is verified: the destination poisoned, one call,
//! every segment compared with the source.

use super::ctx::setup;
use super::data::pattern;
use super::{measure, measure_pair, BenchError, Kind, Method, Needs, Role, Row, Series, TestInfo};
use crate::sizes::format_size;
use ferry::agent::{Agent, Descriptor, Region, RemoteRegion};
use ferry::{CpuEngine, Memory, MemoryMut, RawBuf, Segment};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;

/// The transfer-agent tests.
pub static TESTS: &[TestInfo] = &[
    TestInfo::new("ipc-host-write", "batch x block of host memory written into another process's (agent: shared memory; cross-memory attach), vs copy_from_slice per block into the same pages mapped here", Needs::Cpu, Kind::Bandwidth, "4K,64K,1M,16M,64M"),
    TestInfo::new("ipc-host-read", "batch x block of another process's host memory read here (agent: shared memory; cross-memory attach), vs copy_from_slice per block out of the same pages mapped here", Needs::Cpu, Kind::Bandwidth, "4K,64K,1M,16M,64M"),
    TestInfo::new("ipc-d2d", "batch x block of device memory written into another process's on the same GPU (agent, CUDA IPC), vs one cuMemcpyAsync per block between the same pointers in this process", Needs::Cuda, Kind::Bandwidth, "4K,64K,1M,16M,64M"),
    TestInfo::new("ipc-tcp-write", "batch x block of host memory written into another process's over TCP on loopback (agent, the transport between hosts), vs the same blocks written on a plain TCP socket to the same process, one byte back", Needs::Cpu, Kind::Bandwidth, "4K,64K,1M,16M,64M"),
    TestInfo::new("ipc-tcp-read", "batch x block of another process's host memory read over TCP on loopback (agent), vs the same blocks read from a plain TCP socket into their places here", Needs::Cpu, Kind::Bandwidth, "4K,64K,1M,16M,64M"),
    TestInfo::new("ipc-h2d", "batch x block of another process's pinned host memory read into device memory here (agent), vs one cuMemcpyAsync per block from the same pages mapped here", Needs::Cuda, Kind::Bandwidth, "4K,64K,1M,16M,64M"),
];

/// True for the tests of this module.
pub fn owns(name: &str) -> bool {
    TESTS.iter().any(|t| t.name == name)
}

/// The environment variable that makes `ferry` the peer process: `cpu` or `gpu`.
const PEER_VAR: &str = "FERRY_BENCH_IPC_PEER";
/// The peer's registration size in bytes.
const BYTES_VAR: &str = "FERRY_BENCH_IPC_BYTES";
/// Set for a peer that listens over TCP too (its agent, and a plain socket), with this key.
const TCP_KEY_VAR: &str = "FERRY_BENCH_IPC_TCP_KEY";

const BATCHES: [usize; 4] = [1, 16, 256, 1024];
/// The most a call moves: host rows, GPU rows.
const HOST_CAP: usize = 64 << 20;
const GPU_CAP: usize = 1 << 30;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// The peer process's main, when `FERRY_BENCH_IPC_PEER` is set (`None` otherwise): registers
/// its memory, prints `PATH` and one `DESC` per region, and lives until its stdin closes.
pub fn peer_main() -> Option<std::process::ExitCode> {
    let kind = std::env::var(PEER_VAR).ok()?;
    Some(match serve_peer(&kind) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry bench ipc peer: {e}");
            std::process::ExitCode::FAILURE
        }
    })
}

fn serve_peer(kind: &str) -> Result<(), Box<dyn std::error::Error>> {
    let bytes: usize = std::env::var(BYTES_VAR)?.parse()?;
    let (agent, regions) = if kind == "gpu" {
        let agent = Agent::new("bench-peer", Arc::new(ferry::cuda::CudaEngine::new(0)?))?;
        let dev = agent.register_device(ferry::cuda::DeviceBuffer::zeroed(0, bytes)?)?;
        let pinned = agent.alloc_shared(bytes, true)?;
        (agent, vec![dev, pinned])
    } else {
        let agent = Agent::new("bench-peer", Arc::new(CpuEngine::new(1)?))?;
        let shared = agent.alloc_shared(bytes, false)?;
        let cross = agent.register_host(vec![0u8; bytes])?;
        (agent, vec![shared, cross])
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "PATH {}", agent.socket_path().display())?;
    if let Ok(key) = std::env::var(TCP_KEY_VAR) {
        writeln!(
            out,
            "TCP {}",
            agent.listen_tcp("127.0.0.1:0", key.as_bytes())?
        )?;
        let plain = std::net::TcpListener::bind("127.0.0.1:0")?;
        writeln!(out, "RAW {}", plain.local_addr()?)?;
        std::thread::spawn(move || plain_socket(plain, bytes));
    }
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

/// The peer's plain TCP socket (the `ipc-tcp-*` rows' baseline): one connection; each
/// message a direction byte (`W` or `R`) and a byte count (u64, little-endian); `W`: that
/// many bytes read into its buffer, then one byte back; `R`: that many bytes of it sent.
fn plain_socket(listener: std::net::TcpListener, bytes: usize) {
    use std::io::Read;
    let Ok((mut s, _)) = listener.accept() else {
        return;
    };
    let _ = s.set_nodelay(true);
    let mut buf = vec![0u8; bytes];
    let mut head = [0u8; 9];
    while s.read_exact(&mut head).is_ok() {
        let n = (u64::from_le_bytes(head[1..].try_into().expect("8 bytes")) as usize).min(bytes);
        let ok = match head[0] {
            b'W' => s.read_exact(&mut buf[..n]).and_then(|()| s.write_all(&[1])),
            _ => s.write_all(&buf[..n]),
        };
        if ok.is_err() {
            return;
        }
    }
}

/// A running peer and this process's imports of its regions (and, for a peer reached over
/// TCP, the plain socket to it).
struct PeerProc {
    child: Child,
    _stdin: ChildStdin,
    agent: Agent,
    remote: Vec<RemoteRegion>,
    raw: Option<std::net::TcpStream>,
}

/// The key of the bench's agents over TCP (loopback, one run).
const TCP_KEY: &str = "ferry bench loopback key";

impl PeerProc {
    fn start(gpu: bool, bytes: usize, agent: Agent) -> Result<PeerProc, BenchError> {
        PeerProc::launch(gpu, bytes, agent, false)
    }

    /// A peer process (`gpu`: device and pinned memory, else host memory) reached over its
    /// Unix socket, or over TCP (`tcp`: its agent, and its plain socket).
    fn launch(gpu: bool, bytes: usize, agent: Agent, tcp: bool) -> Result<PeerProc, BenchError> {
        let exe = std::env::current_exe().map_err(setup)?;
        let mut cmd = Command::new(exe);
        if tcp {
            cmd.env(TCP_KEY_VAR, TCP_KEY);
        }
        let mut child = cmd
            .env(PEER_VAR, if gpu { "gpu" } else { "cpu" })
            .env(BYTES_VAR, bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| setup(format!("start the peer process: {e}")))?;
        let stdin = child.stdin.take().expect("piped");
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let (mut path, mut descs) = (String::new(), Vec::new());
        let (mut at, mut plain) = (String::new(), String::new());
        while descs.len() < 2 {
            let mut l = String::new();
            if out.read_line(&mut l).map_err(setup)? == 0 {
                let _ = child.kill();
                let _ = child.wait();
                return Err(setup("the peer process ended before its descriptors"));
            }
            if let Some(p) = l.trim().strip_prefix("PATH ") {
                path = p.to_string();
            } else if let Some(a) = l.trim().strip_prefix("TCP ") {
                at = a.to_string();
            } else if let Some(a) = l.trim().strip_prefix("RAW ") {
                plain = a.to_string();
            } else if let Some(d) = l.trim().strip_prefix("DESC ") {
                let d = unhex(d).and_then(|b| Descriptor::from_bytes(&b));
                descs.push(d.ok_or_else(|| setup("the peer printed a bad descriptor"))?);
            }
        }
        let mut p = PeerProc {
            child,
            _stdin: stdin,
            agent,
            remote: Vec::new(),
            raw: None,
        };
        let peer = if tcp {
            let s = std::net::TcpStream::connect(&plain).map_err(setup)?;
            s.set_nodelay(true).map_err(setup)?;
            p.raw = Some(s);
            p.agent
                .connect_tcp(&at, TCP_KEY.as_bytes())
                .map_err(setup)?
        } else {
            p.agent.connect(&path).map_err(setup)?
        };
        for d in &descs {
            p.remote.push(peer.import(d).map_err(setup)?);
        }
        Ok(p)
    }
}

impl PeerProc {
    /// One agent call, waited: `write`: `src`'s segments into `remote`, else `remote`'s into
    /// `dst`.
    fn call(
        &self,
        remote: &RemoteRegion,
        src: &Region,
        dst: &Region,
        segs: &[Segment],
        write: bool,
    ) -> Result<(), String> {
        let r = if write {
            self.agent.write(remote, src, segs, None)
        } else {
            self.agent.read(dst, remote, segs, None)
        };
        r.map_err(|e| e.to_string())?
            .wait()
            .map_err(|e| e.to_string())
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        self.remote.clear();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Memory mapped into this process (a peer's region opened here, or a local region), for the
/// raw baselines.
struct Mapped(RawBuf);

// SAFETY: made only from the raw view of a live registration of this process or of a peer's
// region mapped here ([`RemoteRegion::raw`] of shared memory or CUDA IPC), both held by the
// `PeerProc` / `Local` for as long as the bench uses the view; its kind is the mapping's.
unsafe impl Memory for Mapped {
    fn raw(&self) -> RawBuf {
        self.0
    }
}
// SAFETY: as above; the bench's copies are the only writers while a series runs.
unsafe impl MemoryMut for Mapped {
    fn raw_mut(&mut self) -> RawBuf {
        self.0
    }
}

/// Runs the `ipc-*` tests; the peers start on first use.
pub struct IpcBench {
    method: Method,
    threads: usize,
    host: Option<(PeerProc, Region, Region)>,
    tcp: Option<(PeerProc, Region, Region)>,
    gpu: Option<(PeerProc, Region, ferry_bench::RawCopier)>,
}

impl IpcBench {
    /// No peer yet.
    pub fn new(threads: usize, method: Method) -> IpcBench {
        IpcBench {
            method,
            threads,
            host: None,
            tcp: None,
            gpu: None,
        }
    }

    /// Runs one test at one block size: one row per batch.
    pub fn run(&mut self, test: &TestInfo, size: u64) -> Result<Vec<Row>, BenchError> {
        let block = usize::try_from(size).map_err(setup)?;
        let gpu = test.needs.is_gpu();
        let cap = if gpu { GPU_CAP } else { HOST_CAP };
        if block == 0 || block > cap {
            return Err(BenchError::BadSize {
                test: test.name.into(),
                size: format_size(size),
                why: format!("blocks of 1 byte to {}", format_size(cap as u64)),
            });
        }
        let mut rows = Vec::new();
        for batch in BATCHES.into_iter().filter(|&n| n * block <= cap) {
            rows.push(if gpu {
                self.gpu_row(test, block, batch)?
            } else if test.name.starts_with("ipc-tcp") {
                self.tcp_row(test, block, batch)?
            } else {
                self.host_row(test, block, batch)?
            });
        }
        Ok(rows)
    }

    /// A host-memory peer (over the Unix socket, or `tcp`) and this process's source and
    /// destination regions.
    fn host_peer(&self, tcp: bool) -> Result<(PeerProc, Region, Region), BenchError> {
        let engine = Arc::new(CpuEngine::new(self.threads).map_err(setup)?);
        let agent = Agent::new("ferry-bench", engine).map_err(setup)?;
        let src = agent.register_host(pattern(HOST_CAP, 7)).map_err(setup)?;
        let dst = agent.register_host(vec![0u8; HOST_CAP]).map_err(setup)?;
        let p = PeerProc::launch(false, HOST_CAP, agent, tcp)?;
        Ok((p, src, dst))
    }

    fn host_row(&mut self, test: &TestInfo, block: usize, batch: usize) -> Result<Row, BenchError> {
        if self.host.is_none() {
            self.host = Some(self.host_peer(false)?);
        }
        let (p, src, dst) = self.host.as_ref().expect("started above");
        let write = test.name == "ipc-host-write";
        let segs = segments(block, batch, write);
        let payload = (block * batch) as u64;
        let (shared, cross) = (&p.remote[0], &p.remote[1]);
        // The peer's shared memory, mapped here, for the raw copies.
        let map = shared.raw();
        let (lsrc, ldst) = (src.raw(), dst.raw());
        let err = |s: &str, e: String| BenchError::Engine {
            test: test.name.into(),
            series: s.into(),
            size: format_size(block as u64),
            message: e,
        };
        let agent_op = |remote: &RemoteRegion| p.call(remote, src, dst, &segs, write);
        let raw_op = || -> Result<(), String> {
            let (from, to) = if write { (lsrc, map) } else { (map, ldst) };
            for s in &segs {
                // SAFETY: both ranges lie inside live mappings of this process (the local
                // registrations and the peer's shared memory mapped here; the agent checked
                // the same segments against both regions in the verification call first).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (from.addr + s.src_off) as *const u8,
                        (to.addr + s.dst_off) as *mut u8,
                        s.len as usize,
                    )
                };
            }
            Ok(())
        };
        // Verified first: the destination zeroed, the source's span filled, one call, every
        // segment compared with the source.
        let check = |name: &str, target: Target| -> Result<(), BenchError> {
            host_prepare(p, src, dst, write, payload as usize).map_err(|e| err(name, e))?;
            match target {
                Target::Shared => agent_op(shared),
                Target::Cross => agent_op(cross),
                Target::Raw => raw_op(),
            }
            .map_err(|e| err(name, e))?;
            let got =
                host_result(p, dst, write, target, payload as usize).map_err(|e| err(name, e))?;
            let mut want = vec![0u8; payload as usize];
            src.read_at(0, &mut want)
                .map_err(|e| err(name, e.to_string()))?;
            wrong_byte(&segs, &got, &want).map_err(|e| err(name, e))
        };
        check("ferry agent (shared memory)", Target::Shared)?;
        check("ferry agent (cross-memory attach)", Target::Cross)?;
        check("copy_from_slice per block", Target::Raw)?;
        let (t_shared, t_raw) = measure_pair(&self.method, || agent_op(shared), raw_op)
            .map_err(|e| err("ferry agent (shared memory)", e))?;
        let t_cross = measure(&self.method, || agent_op(cross))
            .map_err(|e| err("ferry agent (cross-memory attach)", e))?;
        let bw = Kind::Bandwidth;
        Ok(Row::new(
            test.name,
            bw,
            block as u64,
            payload,
            format!(
                "{batch} x {} blocks, one request",
                format_size(block as u64)
            ),
            vec![
                Series::new(
                    "ferry agent (shared memory)",
                    Role::Ferry,
                    bw,
                    payload,
                    t_shared,
                ),
                Series::new(
                    "ferry agent (cross-memory attach)",
                    Role::Ferry,
                    bw,
                    payload,
                    t_cross,
                ),
                Series::new(
                    "copy_from_slice per block, mapped here",
                    Role::Baseline,
                    bw,
                    payload,
                    t_raw,
                ),
            ],
        ))
    }

    fn tcp_row(&mut self, test: &TestInfo, block: usize, batch: usize) -> Result<Row, BenchError> {
        if self.tcp.is_none() {
            self.tcp = Some(self.host_peer(true)?);
        }
        let (p, src, dst) = self.tcp.as_ref().expect("started above");
        let write = test.name == "ipc-tcp-write";
        let segs = segments(block, batch, write);
        let payload = (block * batch) as u64;
        let remote = &p.remote[0];
        let raw = p.raw.as_ref().expect("a TCP peer has its plain socket");
        let err = |s: &str, e: String| BenchError::Engine {
            test: test.name.into(),
            series: s.into(),
            size: format_size(block as u64),
            message: e,
        };
        let agent_op = || p.call(remote, src, dst, &segs, write);
        // The plain socket: a header (the direction, the byte count), then the blocks written
        // one `write_all` each (or read one `read_exact` each into their places here); the
        // peer reads them into (sends them from) its buffer, and a write is answered by one
        // byte once all have arrived.
        let (lsrc, ldst) = (src.raw(), dst.raw());
        let plain = |write: bool, segs: &[Segment]| -> Result<(), String> {
            let mut s: &std::net::TcpStream = raw;
            let mut head = [0u8; 9];
            head[0] = if write { b'W' } else { b'R' };
            head[1..].copy_from_slice(&payload.to_le_bytes());
            s.write_all(&head).map_err(|e| e.to_string())?;
            for g in segs {
                if write {
                    // SAFETY: the segment lies inside the local source registration, which
                    // nothing writes while the series runs.
                    let b = unsafe {
                        std::slice::from_raw_parts(
                            (lsrc.addr + g.src_off) as *const u8,
                            g.len as usize,
                        )
                    };
                    s.write_all(b).map_err(|e| e.to_string())?;
                } else {
                    // SAFETY: the segment lies inside the local destination registration,
                    // which only this series writes.
                    let b = unsafe {
                        std::slice::from_raw_parts_mut(
                            (ldst.addr + g.dst_off) as *mut u8,
                            g.len as usize,
                        )
                    };
                    std::io::Read::read_exact(&mut s, b).map_err(|e| e.to_string())?;
                }
            }
            if write {
                let mut ack = [0u8; 1];
                std::io::Read::read_exact(&mut s, &mut ack).map_err(|e| e.to_string())?;
            }
            Ok(())
        };
        let raw_op = || plain(write, &segs);
        // Verified, both series: the local destination zeroed, the blocks written to the peer
        // and read back (block i of the source to the peer's slot `batch - 1 - i` and back, or
        // in order over the plain socket), the destination then equal to the source.
        let mut want = vec![0u8; payload as usize];
        src.read_at(0, &mut want)
            .map_err(|e| err("ferry agent over TCP", e.to_string()))?;
        let zero = vec![0u8; payload as usize];
        let (out, back) = (segments(block, batch, true), segments(block, batch, false));
        let round_trip = |agent: bool| -> Result<(), String> {
            dst.write_at(0, &zero).map_err(|e| e.to_string())?;
            if agent {
                let r = p.agent.write(remote, src, &out, None);
                r.map_err(|e| e.to_string())?
                    .wait()
                    .map_err(|e| e.to_string())?;
                let r = p.agent.read(dst, remote, &back, None);
                r.map_err(|e| e.to_string())?
                    .wait()
                    .map_err(|e| e.to_string())?;
            } else {
                plain(true, &out)?;
                plain(false, &back)?;
            }
            let mut got = vec![0u8; payload as usize];
            dst.read_at(0, &mut got).map_err(|e| e.to_string())?;
            match got.iter().zip(&want).position(|(g, w)| g != w) {
                None => Ok(()),
                Some(i) => Err(format!("wrong byte at offset {i} after a round trip")),
            }
        };
        round_trip(true).map_err(|e| err("ferry agent over TCP", e))?;
        round_trip(false).map_err(|e| err("plain TCP socket", e))?;
        let (t_ferry, t_raw) = measure_pair(&self.method, agent_op, raw_op)
            .map_err(|e| err("ferry agent over TCP", e))?;
        let bw = Kind::Bandwidth;
        Ok(Row::new(
            test.name,
            bw,
            block as u64,
            payload,
            format!(
                "{batch} x {} blocks, one request, loopback",
                format_size(block as u64)
            ),
            vec![
                Series::new("ferry agent over TCP", Role::Ferry, bw, payload, t_ferry),
                Series::new(
                    if write {
                        "plain TCP socket, write_all per block"
                    } else {
                        "plain TCP socket, read_exact per block"
                    },
                    Role::Baseline,
                    bw,
                    payload,
                    t_raw,
                ),
            ],
        ))
    }

    fn gpu_row(&mut self, test: &TestInfo, block: usize, batch: usize) -> Result<Row, BenchError> {
        if self.gpu.is_none() {
            let engine = ferry::cuda::CudaEngine::new(0).map_err(setup)?;
            let agent = Agent::new("ferry-bench", Arc::new(engine)).map_err(setup)?;
            let dev = ferry::cuda::DeviceBuffer::zeroed(0, GPU_CAP).map_err(setup)?;
            let local = agent.register_device(dev).map_err(setup)?;
            let raw = ferry_bench::RawCopier::new(0).map_err(setup)?;
            let p = PeerProc::start(true, GPU_CAP, agent)?;
            self.gpu = Some((p, local, raw));
        }
        let (p, local, raw) = self.gpu.as_ref().expect("started above");
        let d2d = test.name == "ipc-d2d";
        let segs = segments(block, batch, d2d);
        let payload = (block * batch) as u64;
        let name = format_size(block as u64);
        let err = |s: &str, e: String| BenchError::Engine {
            test: test.name.into(),
            series: s.into(),
            size: name.clone(),
            message: e,
        };
        // d2d: local device -> the peer's device; h2d: the peer's pinned -> local device.
        let remote = if d2d { &p.remote[0] } else { &p.remote[1] };
        let agent_op = || p.call(remote, local, local, &segs, d2d);
        let pieces: Vec<(usize, usize, usize)> = segs
            .iter()
            .map(|s| (s.dst_off as usize, s.src_off as usize, s.len as usize))
            .collect();
        let raw_op = || -> Result<(), String> {
            let (mut to, from) = if d2d {
                (Mapped(remote.raw()), Mapped(local.raw()))
            } else {
                (Mapped(local.raw()), Mapped(remote.raw()))
            };
            raw.copy_segments(&mut to, &from, &pieces, 1)
                .map_err(|e| e.to_string())
        };
        // Verified: the source filled with a pattern, the destination zeroed, one call each.
        let check = |series: &str, op: &dyn Fn() -> Result<(), String>| -> Result<(), BenchError> {
            let span = |b: RawBuf| RawBuf {
                len: payload as usize,
                ..b
            };
            let (src_r, dst_r) = if d2d {
                (span(local.raw()), span(remote.raw()))
            } else {
                (span(remote.raw()), span(local.raw()))
            };
            fill_device_or_host(raw, src_r, 11).map_err(|e| err(series, e))?;
            fill_device_or_host(raw, dst_r, 0).map_err(|e| err(series, e))?;
            op().map_err(|e| err(series, e))?;
            let (s, d) = (
                read_back(raw, src_r).map_err(|e| err(series, e))?,
                read_back(raw, dst_r).map_err(|e| err(series, e))?,
            );
            wrong_byte(&segs, &d, &s).map_err(|e| err(series, e))
        };
        check("ferry agent", &agent_op)?;
        check("raw cuMemcpyAsync per block", &raw_op)?;
        let (t_ferry, t_raw) =
            measure_pair(&self.method, agent_op, raw_op).map_err(|e| err("ferry agent", e))?;
        let bw = Kind::Bandwidth;
        Ok(Row::new(
            test.name,
            bw,
            block as u64,
            payload,
            format!("{batch} x {name} blocks, one request"),
            vec![
                Series::new("ferry agent", Role::Ferry, bw, payload, t_ferry),
                Series::new(
                    "raw cuMemcpyAsync per block, one process",
                    Role::Baseline,
                    bw,
                    payload,
                    t_raw,
                ),
            ],
        ))
    }
}

/// Which copy a host series makes.
#[derive(Clone, Copy)]
enum Target {
    /// The agent, into (out of) the peer's shared memory.
    Shared,
    /// The agent, into (out of) the peer's pageable memory (cross-memory attach).
    Cross,
    /// `copy_from_slice` into (out of) the peer's shared memory mapped here.
    Raw,
}

/// Before a verified host call over the first `n` bytes: a write zeroes both of the peer's
/// regions; a read zeroes the local destination and gives both of the peer's regions the
/// source's bytes (so that a read of either gives the source's bytes).
fn host_prepare(
    p: &PeerProc,
    src: &Region,
    dst: &Region,
    write: bool,
    n: usize,
) -> Result<(), String> {
    let map = p.remote[0].raw();
    let whole = [Segment::new(0, 0, n as u64)];
    let from = if write {
        dst.write_at(0, &vec![0u8; n]).map_err(|e| e.to_string())?;
        dst
    } else {
        dst.write_at(0, &vec![0u8; n]).map_err(|e| e.to_string())?;
        src
    };
    let mut bytes = vec![0u8; n];
    from.read_at(0, &mut bytes).map_err(|e| e.to_string())?;
    // SAFETY: the first `n` bytes (n <= its length) of the peer's shared memory mapped here;
    // no transfer runs now.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.addr as *mut u8, n) };
    let r = p
        .agent
        .write(&p.remote[1], from, &whole, None)
        .map_err(|e| e.to_string())?;
    r.wait().map_err(|e| e.to_string())
}

/// After a verified host call: the first `n` bytes of the destination it wrote.
fn host_result(
    p: &PeerProc,
    dst: &Region,
    write: bool,
    target: Target,
    n: usize,
) -> Result<Vec<u8>, String> {
    let mut got = vec![0u8; n];
    match (write, target) {
        (false, _) => dst.read_at(0, &mut got).map_err(|e| e.to_string())?,
        (true, Target::Cross) => {
            let r = p
                .agent
                .read(dst, &p.remote[1], &[Segment::new(0, 0, n as u64)], None);
            r.map_err(|e| e.to_string())?
                .wait()
                .map_err(|e| e.to_string())?;
            dst.read_at(0, &mut got).map_err(|e| e.to_string())?
        }
        (true, _) => {
            let map = p.remote[0].raw();
            // SAFETY: the first `n` bytes of the peer's shared memory mapped here; no transfer
            // runs now.
            unsafe { std::ptr::copy_nonoverlapping(map.addr as *const u8, got.as_mut_ptr(), n) };
        }
    }
    Ok(got)
}

/// `batch` segments of `block` bytes: block i of this process's buffer and slot
/// `batch - 1 - i` of the peer's (`to_peer`: the peer's is the destination), never adjacent in
/// both, so nothing merges them.
fn segments(block: usize, batch: usize, to_peer: bool) -> Vec<Segment> {
    (0..batch)
        .map(|i| {
            let (mine, theirs) = ((i * block) as u64, ((batch - 1 - i) * block) as u64);
            let n = block as u64;
            if to_peer {
                Segment::new(theirs, mine, n)
            } else {
                Segment::new(mine, theirs, n)
            }
        })
        .collect()
}

/// Fills `b` (device memory, or host memory mapped here) with a pattern of `seed` (0: zeros)
/// through one raw copy from host memory.
/// Checks that every segment of `segs` landed: `got` (the destination's bytes) holds `want`'s
/// (the source's) at each segment; the first wrong byte's offset, in words.
fn wrong_byte(segs: &[Segment], got: &[u8], want: &[u8]) -> Result<(), String> {
    for g in segs {
        let (d, o, n) = (g.dst_off as usize, g.src_off as usize, g.len as usize);
        if let Some(i) = (0..n).find(|&i| got[d + i] != want[o + i]) {
            return Err(format!("wrong byte at offset {} of the destination", d + i));
        }
    }
    Ok(())
}

fn fill_device_or_host(raw: &ferry_bench::RawCopier, b: RawBuf, seed: u64) -> Result<(), String> {
    let host = if seed == 0 {
        vec![0u8; b.len]
    } else {
        pattern(b.len, seed)
    };
    let mut to = Mapped(b);
    raw.copy(&mut to, &host[..], b.len, 1)
        .map_err(|e| e.to_string())
}

/// `b`'s bytes, copied to the host.
fn read_back(raw: &ferry_bench::RawCopier, b: RawBuf) -> Result<Vec<u8>, String> {
    let mut host = vec![0u8; b.len];
    let from = Mapped(b);
    raw.copy(&mut host[..], &from, b.len, 1)
        .map_err(|e| e.to_string())?;
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_never_merge_and_stay_inside() {
        for (block, batch) in [(4096, 1), (4096, 1024), (1 << 20, 16)] {
            for to_peer in [false, true] {
                let s = segments(block, batch, to_peer);
                assert_eq!(s.len(), batch);
                let total = (block * batch) as u64;
                assert!(s
                    .iter()
                    .all(|g| g.dst_off + g.len <= total && g.src_off + g.len <= total));
                // Adjacent in the list: never contiguous in both buffers.
                for w in s.windows(2) {
                    let both = w[0].dst_off + w[0].len == w[1].dst_off
                        && w[0].src_off + w[0].len == w[1].src_off;
                    assert!(!both, "{w:?}");
                }
            }
        }
    }

    #[test]
    fn registered_with_sizes() {
        for t in TESTS {
            assert!(owns(t.name));
            assert!(!crate::sizes::parse_sizes(t.default_sizes)
                .unwrap()
                .is_empty());
        }
    }
}
