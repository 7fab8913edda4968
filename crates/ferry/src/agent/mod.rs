//! Registered memory across processes, as NIXL does: an [`Agent`] per process registers memory
//! ([`Region`]s) and hands out small [`Descriptor`]s of it; a peer process connects to the
//! agent ([`Agent::connect`] gives a [`Peer`]), opens a descriptor ([`Peer::import`] gives a
//! [`RemoteRegion`]) and reads or writes it with segment lists ([`Agent::read`],
//! [`Agent::write`]): many segments, one [`Request`] (wait, poll, Future, one
//! error), and an optional notification to the owner when the transfer lands (sent by the
//! agent's progress thread, whether or not the caller waits for the request).
//!
//! How the bytes move (one host), by the registration's kind (a transfer of at most 64 KiB
//! between host memory on both sides is copied on the caller's thread, before `write`/`read`
//! returns):
//!
//! | registered with | the peer reaches it through | copies run on |
//! |---|---|---|
//! | [`Agent::register_host`] (pageable) | cross-memory attach (`process_vm_readv/writev`) | the agent's worker thread |
//! | [`Agent::alloc_shared`] (`pinned`: page-locked on both sides) | a memfd passed over the socket (`SCM_RIGHTS`), mapped | the agent's engine |
//! | [`Agent::register_device`] ([`DeviceBuffer`]) | CUDA IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`) | the agent's engine: a [`CudaEngine`](crate::cuda::CudaEngine) of the GPU that holds the memory uses its copy engines |
//! | [`Agent::alloc_device`] (the driver's virtual memory calls) | its allocation as a file descriptor over the socket (`cuMemExportToShareableHandle` / `cuMemImportFromShareableHandle`, mapped) | as above |
//!
//! Metadata travels over a Unix socket in a private directory (mode 0700: `$FERRY_AGENT_DIR`,
//! else `$XDG_RUNTIME_DIR/ferry-agents`, else `/tmp/ferry-agents-<uid>`), and the agent serves
//! only processes of its own user (`SO_PEERCRED`). Only registered ranges are reachable: every
//! segment is checked against both regions before any byte moves, an import is confirmed by the
//! owner (a stale or forged descriptor is refused), and a registration a peer has imported is
//! not freed until the peer releases it or exits ([`Region::deregister`] refuses, dropping the
//! region defers). A request whose peer has exited by the time it is seen complete fails with
//! [`AgentError::PeerGone`]: it never hangs (a cross-memory copy to a dead process fails at
//! once, a copy into shared memory completes into pages nobody reads).
//!
//! Across hosts: an agent that also listens over TCP ([`Agent::listen_tcp`], with a key both
//! sides hold) is reached from any host with [`Agent::connect_tcp`]; the same descriptors,
//! imports, segment lists, requests and notifications, every registration reachable, the bytes
//! carried over the connection (its 4 TCP streams by default, a large transfer cut across
//! them; device memory staged through host memory at both ends, in pinned bounce buffers of
//! 2 MiB, two per transfer running, up to 16 kept by the process: `bounce.rs`; see `tcp.rs`
//! for the protocol, the key's check, the streams, and why TCP). The seam is the peer's connection
//! and the request path of [`Agent::read`]/[`Agent::write`], which picks the mechanism from
//! the import; an RDMA or NCCL mechanism (GPU memory at the network's speed; it needs two GPUs
//! or hosts to run) adds one there, and nothing above changes.
//!
//! ```no_run
//! use ferry::agent::Agent;
//! use ferry::{CpuEngine, Segment};
//! use std::sync::Arc;
//! // Process A: register 1 MiB of shared memory, publish its descriptor and socket path.
//! let a = Agent::new("prefill", Arc::new(CpuEngine::new(2)?))?;
//! let kv = a.alloc_shared(1 << 20, false)?;
//! let (path, desc) = (a.socket_path().to_owned(), kv.descriptor().to_bytes());
//! // Process B (given `path` and `desc`): import it and write 4 KiB into it, notifying A.
//! let b = Agent::new("decode", Arc::new(CpuEngine::new(2)?))?;
//! let peer = b.connect(&path)?;
//! let remote = peer.import(&ferry::agent::Descriptor::from_bytes(&desc).unwrap())?;
//! let mine = b.register_host(vec![7u8; 4096])?;
//! b.write(&remote, &mine, &[Segment::new(0, 0, 4096)], Some(b"block 0"))?.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bounce;
mod complete;
mod desc;
mod frame;
mod lanes;
mod sys;
mod tcp;
mod tcp_bytes;
mod wire;

use crate::cuda::{CudaError, DeviceBuffer};
use crate::engine::cuda::sys::memory::{ipc_handle, HostPin, IpcMapping, VmmBuffer};
use crate::memory::{MemKind, RawBuf};
use crate::op::{check_segments, Op, OpError, Segment};
use crate::request::{BackendError, Request, RequestError, Signal};
use crate::{Engine, Job, SubmitError};
pub use desc::Descriptor;
use desc::Transport;
use std::collections::{HashMap, VecDeque};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::Duration;
use sys::{Piece, ProcessHandle, SharedMap};
use thiserror::Error;

/// Why an agent call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A system call failed (`what` names it and its object).
    #[error("{what}: {source}")]
    Io {
        /// What was attempted.
        what: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// The peer refused (another user, a registration it does not hold, a bad message).
    #[error("refused by {peer}: {reason}")]
    Refused {
        /// The peer (agent name and pid) or socket.
        peer: String,
        /// Its reason.
        reason: String,
    },
    /// A descriptor of another agent was given to this peer.
    #[error("{desc} belongs to another agent than {peer} (pid {pid})")]
    WrongPeer {
        /// The descriptor.
        desc: Box<Descriptor>,
        /// The peer it was given to.
        peer: String,
        /// That peer's pid.
        pid: u32,
    },
    /// A segment lies outside its region (the offsets and lengths named).
    #[error("segment list outside the regions: {0}")]
    Segment(#[from] OpError),
    /// The connection to a peer over TCP broke (its process or host gone, or silent for the
    /// agent's timeout inside a transfer): this transfer and every later one on it fail.
    #[error("connection to {peer} lost: {reason}")]
    Disconnected {
        /// The peer (agent name and pid on its host).
        peer: String,
        /// What the system said.
        reason: String,
    },
    /// The peer's process has exited.
    #[error("peer {peer} (pid {pid}) has exited")]
    PeerGone {
        /// The peer's agent name.
        peer: String,
        /// Its pid.
        pid: u32,
    },
    /// Cross-memory attach was refused by the kernel's ptrace check.
    #[error(
        "{call} on pid {pid} refused by ptrace permission (same user needed, and Yama's \
         ptrace_scope at most 1, the owner naming this process): register the memory with \
         Agent::alloc_shared instead"
    )]
    Ptrace {
        /// `process_vm_readv` or `process_vm_writev`.
        call: &'static str,
        /// The peer's pid.
        pid: u32,
    },
    /// The region was deregistered.
    #[error("region {0} is deregistered")]
    Deregistered(u64),
    /// The region is imported by peers: it stays registered until they release it.
    #[error("region {region} is imported by {peers} peer connection(s): not deregistered")]
    InUse {
        /// The region.
        region: u64,
        /// Connections that hold it.
        peers: usize,
    },
    /// The agent cannot move these kinds of memory (the reason says why).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// CUDA failed (IPC handles, host registration).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The engine refused the copy.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// A setting read from the environment does not parse (`$FERRY_AGENT_TCP_STREAMS`).
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Io { what, source }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Requests that touch a piece of memory: waited for before it is freed or unmapped.
#[derive(Default)]
struct InUse(Mutex<Vec<Request>>);

impl InUse {
    fn push(&self, req: &Request) {
        let mut v = lock(&self.0);
        v.retain(|r| !r.is_done());
        v.push(req.share());
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        for r in lock(&self.0).drain(..) {
            let _ = r.settle_keep();
        }
    }
}

/// The memory behind a local registration. `in_use` is first, so it is dropped (waited) first.
struct Local {
    in_use: InUse,
    raw: RawBuf,
    live: AtomicBool,
    store: Store,
}

enum Store {
    /// A boxed slice given up by the caller (`Box::into_raw`), freed on drop.
    Host(*mut [u8]),
    /// The caller's memory ([`Agent::register_raw`], [`Agent::lend`]): nothing to free, but
    /// its `Region`'s drop waits until no request and no peer uses it.
    Borrowed,
    /// Page-locked (dropped before the mapping) or not.
    Shared {
        _pin: Option<HostPin>,
        map: SharedMap,
    },
    Device {
        _buf: DeviceBuffer,
    },
    /// The allocation's descriptor, sent to each importer.
    Vmm {
        fd: std::os::fd::OwnedFd,
        _buf: VmmBuffer,
    },
}

// SAFETY: `Host` owns its allocation (a raw box); the other variants are Send + Sync.
unsafe impl Send for Store {}
// SAFETY: as above; the bytes are only reached through raw views under requests.
unsafe impl Sync for Store {}

impl Drop for Store {
    fn drop(&mut self) {
        if let Store::Host(p) = *self {
            // SAFETY: made by `Box::into_raw` in `register_host`, freed once, after every
            // request that touched it (`Local::in_use` is dropped first).
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

/// A registration's record in its agent.
struct Entry {
    desc: Descriptor,
    local: Arc<Local>,
    /// Imports per connection.
    importers: HashMap<u64, usize>,
    /// Its `Region` was dropped while imported: removed when the last import goes.
    dropped: bool,
}

/// Transfers of at most this many bytes run on the caller's thread, the request done on return:
/// between host memory of both processes (cross-memory attach, or shared memory mapped here),
/// and over TCP on a connection with no transfer queued (`tcp_bytes.rs`). A hand-off to the copy
/// thread, the engine or the connection's transfer thread and back costs more than such a
/// transfer: 10-20 us on a 2-core machine (over TCP: single 4 KiB blocks 0.51-0.77 -> 0.89-0.90
/// of a plain socket, `bench/results/cpu-2core.md`).
const INLINE_BYTES: usize = 64 << 10;

/// A job for the agent's copy thread or a TCP connection's transfer thread ([`run_on`]).
type CopyJob = Box<dyn FnOnce() + Send>;

struct AgentInner {
    name: String,
    id: u64,
    pid: u32,
    path: PathBuf,
    engine: Arc<dyn Engine>,
    timeout: Duration,
    regions: Mutex<HashMap<u64, Entry>>,
    next_region: AtomicU64,
    notes: Mutex<VecDeque<(String, Vec<u8>)>>,
    notes_cv: Condvar,
    /// Signalled (with `regions`) when a peer releases imports.
    released: Condvar,
    /// Served connections, by number (Unix and TCP alike).
    conns: Mutex<HashMap<u64, frame::Stream>>,
    next_conn: AtomicU64,
    /// Where the agent listens over TCP, if it does ([`Agent::listen_tcp`]).
    tcp: Mutex<Option<tcp::Listening>>,
    /// The lanes' tickets of the connections served over TCP.
    tickets: lanes::Tickets,
    stop: AtomicBool,
    worker: Mutex<Option<mpsc::Sender<CopyJob>>>,
    /// The progress thread that sends notifications when transfers land (`complete.rs`).
    progress: Mutex<Option<mpsc::Sender<Arc<complete::Notified>>>>,
}

impl AgentInner {
    /// Forgets connection `conn`'s imports (it released them, closed, or its process exited).
    fn release(&self, conn: u64, region: Option<u64>) {
        let mut regions = lock(&self.regions);
        let ids: Vec<u64> = match region {
            Some(r) => vec![r],
            None => regions.keys().copied().collect(),
        };
        for id in ids {
            let Some(e) = regions.get_mut(&id) else {
                continue;
            };
            if let Some(n) = e.importers.get_mut(&conn) {
                *n -= 1;
                if *n == 0 || region.is_none() {
                    e.importers.remove(&conn);
                }
            }
            if e.dropped && e.importers.is_empty() {
                regions.remove(&id);
            }
        }
        self.released.notify_all();
    }
}

/// One process's transfer agent: registers memory, serves its descriptors to peers over a Unix
/// socket, and moves bytes to and from peers' registered memory. Cheap to share (`&Agent`
/// across threads); dropping it closes its socket and its peers' connections.
pub struct Agent {
    inner: Arc<AgentInner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.inner.name)
            .field("pid", &self.inner.pid)
            .field("socket", &self.inner.path)
            .finish()
    }
}

/// The private directory of this user's agent sockets.
fn socket_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERRY_AGENT_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return Path::new(&d).join("ferry-agents");
    }
    std::env::temp_dir().join(format!("ferry-agents-{}", sys::uid()))
}

static AGENTS: AtomicU64 = AtomicU64::new(0);

/// Removes the sockets in `dir` of agents whose process has exited without closing them (a
/// killed process): `<name>.<pid>.<seq>.sock`, the pid no longer running.
fn remove_stale_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".sock")) else {
            continue;
        };
        let mut parts = stem.rsplit('.');
        let (Some(_seq), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Agent {
    /// An agent named `name` (any text; it names the socket and the notifications' sender)
    /// whose copies into mapped memory run on `engine` (a
    /// [`CudaEngine`](crate::cuda::CudaEngine) for GPU memory, any engine for host memory).
    /// Opens its socket and starts the thread that serves peers. Peers' replies are awaited
    /// at most 30 s ([`Agent::with_timeout`]).
    pub fn new(name: &str, engine: Arc<dyn Engine>) -> Result<Agent, AgentError> {
        Agent::with_timeout(name, engine, Duration::from_secs(30))
    }

    /// As [`Agent::new`], waiting at most `timeout` for a peer's reply (connect, import).
    pub fn with_timeout(
        name: &str,
        engine: Arc<dyn Engine>,
        timeout: Duration,
    ) -> Result<Agent, AgentError> {
        let dir = socket_dir();
        sys::private_dir(&dir).map_err(io_err(format!("socket directory {}", dir.display())))?;
        // This process's life word, made here rather than at a peer's first handshake (a
        // `fork` meanwhile would leave the child's copy half made); peers fall back to its
        // pidfd where it cannot be made.
        let _ = sys::Life::get();
        let pid = std::process::id();
        let seq = AGENTS.fetch_add(1, Ordering::Relaxed);
        let clean: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        remove_stale_sockets(&dir);
        let path = dir.join(format!("{clean}.{pid}.{seq}.sock"));
        let _ = std::fs::remove_file(&path);
        let listener =
            UnixListener::bind(&path).map_err(io_err(format!("bind {}", path.display())))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let id = nanos ^ (u64::from(pid) << 32) ^ seq.rotate_left(17) ^ (&path as *const _ as u64);
        let inner = Arc::new(AgentInner {
            name: name.to_string(),
            id,
            pid,
            path,
            engine,
            timeout,
            regions: Mutex::new(HashMap::new()),
            next_region: AtomicU64::new(1),
            notes: Mutex::new(VecDeque::new()),
            notes_cv: Condvar::new(),
            released: Condvar::new(),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            tcp: Mutex::new(None),
            tickets: lanes::Tickets::default(),
            stop: AtomicBool::new(false),
            worker: Mutex::new(None),
            progress: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("ferry-agent".into())
            .spawn(move || wire::serve(listener, weak))
            .map_err(io_err("start the agent's thread"))?;
        Ok(Agent { inner })
    }

    /// The agent's socket, which peers pass to [`Agent::connect`].
    pub fn socket_path(&self) -> &Path {
        &self.inner.path
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn add(
        &self,
        transport: Transport,
        store: Store,
        raw: RawBuf,
        ipc: Option<[u8; 64]>,
    ) -> Region {
        let id = self.inner.next_region.fetch_add(1, Ordering::Relaxed);
        let ordinal = match raw.kind {
            MemKind::Device { ordinal } => ordinal,
            _ => 0,
        };
        let desc = Descriptor {
            agent: self.inner.id,
            pid: self.inner.pid,
            region: id,
            transport,
            ordinal,
            addr: raw.addr,
            len: raw.len as u64,
            ipc: ipc.map(Box::new),
        };
        let local = Arc::new(Local {
            in_use: InUse::default(),
            raw,
            live: AtomicBool::new(true),
            store,
        });
        lock(&self.inner.regions).insert(
            id,
            Entry {
                desc: desc.clone(),
                local: Arc::clone(&local),
                importers: HashMap::new(),
                dropped: false,
            },
        );
        Region {
            agent: Arc::downgrade(&self.inner),
            desc,
            local,
        }
    }

    /// Registers pageable host memory (taken over until the region is dropped): peers reach it
    /// with cross-memory attach, which needs ptrace permission over this process (the same
    /// user; where Yama's `ptrace_scope` is 1, the agent names its last connected peer with
    /// `PR_SET_PTRACER`). Errors: an empty buffer.
    pub fn register_host(&self, buf: Vec<u8>) -> Result<Region, AgentError> {
        if buf.is_empty() {
            return Err(AgentError::Unsupported("an empty registration".into()));
        }
        let p = Box::into_raw(buf.into_boxed_slice());
        let raw = RawBuf::host(p as *const u8, p.len(), MemKind::Pageable);
        Ok(self.add(Transport::CrossMemory, Store::Host(p), raw, None))
    }

    /// Registers memory the caller owns and keeps, without moving it (an existing buffer: a
    /// NumPy array, a KV cache), for the duration of `f`: peers reach it as they reach
    /// [`Agent::register_host`]'s (cross-memory attach), and the region is given to `f`. When
    /// `f` returns (or unwinds), the region is deregistered and this call waits until no
    /// request of this process and no peer's import uses the memory any more (a peer releases
    /// it by dropping its [`RemoteRegion`], closing its connection or exiting; a live peer
    /// that keeps its import keeps this call waiting, as a thread scope waits for its threads).
    /// Errors: an empty buffer, or memory the CPU cannot address (device memory: register it
    /// with [`Agent::register_device`]).
    ///
    /// ```no_run
    /// # use ferry::{agent::Agent, CpuEngine};
    /// # use std::sync::Arc;
    /// let agent = Agent::new("owner", Arc::new(CpuEngine::new(2)?))?;
    /// let mut kv_cache = vec![0u8; 1 << 20];
    /// agent.lend(&mut kv_cache, |region| {
    ///     let desc = region.descriptor().to_bytes(); // hand it to a peer; wait for its writes
    ///     # drop(desc);
    /// })?;
    /// // Here no peer reaches `kv_cache` any more.
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lend<M: crate::MemoryMut + ?Sized, R>(
        &self,
        mem: &mut M,
        f: impl FnOnce(&Region) -> R,
    ) -> Result<R, AgentError> {
        let raw = mem.raw_mut();
        if !raw.kind.host_accessible() {
            return Err(AgentError::Unsupported(format!(
                "lending {} memory: register device memory with register_device or \
                 alloc_device",
                raw.kind
            )));
        }
        // SAFETY: `mem` is mutably borrowed (valid, unaliased) until this call returns, and the
        // region is dropped before it returns (on unwind too), which waits until nothing
        // reaches the memory; the agent outlives it (borrowed).
        let region = unsafe { self.register_raw(raw.addr as *mut u8, raw.len) }?;
        Ok(f(&region))
    }

    /// Registers `len` bytes at `ptr`, memory the caller owns and keeps (for C and Python
    /// callers that hold their own buffer; Rust code has the safe [`Agent::lend`]): as
    /// [`Agent::lend`], the region's drop deregistering it and waiting until no request of
    /// this process and no peer's import uses it. Errors: `len` 0 or a null `ptr`.
    ///
    /// # Safety
    /// 1. `ptr..ptr + len` is host memory of this process valid for reads and writes, and
    ///    stays valid (not freed, unmapped or reused) until the returned region has been
    ///    dropped; a leaked region (`std::mem::forget`) leaves it reachable by peers for good.
    /// 2. The region is dropped before this agent (dropping the agent closes its peers'
    ///    connections, which the region's drop takes as their releases).
    /// 3. Nothing else writes the bytes while a transfer on them runs (the race of any DMA
    ///    buffer).
    pub unsafe fn register_raw(&self, ptr: *mut u8, len: usize) -> Result<Region, AgentError> {
        if len == 0 || ptr.is_null() {
            return Err(AgentError::Unsupported(format!(
                "a registration of {len} bytes at {ptr:p}"
            )));
        }
        let raw = RawBuf::host(ptr, len, MemKind::Pageable);
        Ok(self.add(Transport::CrossMemory, Store::Borrowed, raw, None))
    }

    /// Allocates `len` zero bytes of host memory that peers map (a memfd whose descriptor
    /// travels over the socket): no ptrace permission needed, and copies run on the engines
    /// (`pinned`: page-locked with CUDA here and by each importer, for the GPU's DMA).
    pub fn alloc_shared(&self, len: usize, pinned: bool) -> Result<Region, AgentError> {
        if len == 0 {
            return Err(AgentError::Unsupported("an empty registration".into()));
        }
        let map = SharedMap::create(len).map_err(io_err(format!("memfd of {len} bytes")))?;
        let (pin, kind, transport) = if pinned {
            // SAFETY: the mapping lives in the same `Store` and is dropped after the pin
            // (fields drop in order).
            let pin = unsafe { HostPin::new(map.ptr(), len) }?;
            (Some(pin), MemKind::Pinned, Transport::SharedPinned)
        } else {
            (None, MemKind::Pageable, Transport::Shared)
        };
        let raw = RawBuf::host(map.ptr(), len, kind);
        Ok(self.add(transport, Store::Shared { _pin: pin, map }, raw, None))
    }

    /// Registers device memory (taken over until the region is dropped): peers on the same
    /// host open it with CUDA IPC, and copies run on their GPU's copy engines.
    pub fn register_device(&self, buf: DeviceBuffer) -> Result<Region, AgentError> {
        let handle = ipc_handle(&buf)?;
        let raw = RawBuf {
            addr: buf.device_ptr(),
            len: buf.len(),
            kind: MemKind::Device {
                ordinal: buf.ordinal(),
            },
        };
        Ok(self.add(
            Transport::CudaIpc,
            Store::Device { _buf: buf },
            raw,
            Some(handle),
        ))
    }

    /// Allocates and registers `len` bytes of device memory on GPU `ordinal` with the driver's
    /// virtual memory calls (`cuMemCreate`): peers import the allocation from a file
    /// descriptor passed over the socket, and copies run on their GPU's copy engines. The
    /// region's [`Region::raw`] gives its device address.
    pub fn alloc_device(&self, ordinal: u32, len: usize) -> Result<Region, AgentError> {
        if len == 0 {
            return Err(AgentError::Unsupported("an empty registration".into()));
        }
        let buf = VmmBuffer::alloc(ordinal, len)?;
        let fd = buf.export_fd()?;
        let raw = buf.raw();
        Ok(self.add(Transport::CudaVmm, Store::Vmm { fd, _buf: buf }, raw, None))
    }

    /// Connects to the agent whose socket is `path` (same host, same user). Blocks for the
    /// handshake, at most the agent's timeout.
    pub fn connect(&self, path: impl AsRef<Path>) -> Result<Peer, AgentError> {
        wire::connect(&self.inner, path.as_ref()).map(|inner| Peer {
            inner: Arc::new(inner),
        })
    }

    /// Serves peers of other hosts too: listens on TCP at `addr` (`"0.0.0.0:7000"`, or port 0
    /// for one the kernel picks) and serves connections that prove `key` (at least 16 bytes,
    /// the same given to the peers' [`Agent::connect_tcp`]; HMAC-SHA256 challenges both ways,
    /// the key never sent). Every registration of this agent is then reachable from them, its
    /// bytes carried over the connection (device memory staged through host memory here).
    /// The bytes travel unencrypted: a network the cluster trusts. Returns the address bound.
    /// Errors: a short key, an agent already listening, the bind.
    pub fn listen_tcp(&self, addr: &str, key: &[u8]) -> Result<std::net::SocketAddr, AgentError> {
        tcp::listen(&self.inner, addr, key)
    }

    /// Connects to the agent listening at `addr` (`"host:port"`, [`Agent::listen_tcp`]) on
    /// this or another host, proving `key` and checking that the agent holds it. Transfers to
    /// and from its registrations then carry their bytes over this connection, one at a time
    /// per connection, in order; a connection that breaks fails them with
    /// [`AgentError::Disconnected`], and a copy of device memory that fails on either side
    /// fails its transfer only (with the cause; the bytes after the failed copy arrive as
    /// zeros). Blocks for the name's resolution and the connection (together at most the
    /// agent's timeout), then for the key's proof and the handshake (each answer waited for at
    /// most the timeout), then for each further stream in turn (its connection, proof and
    /// admission, each within the timeout).
    ///
    /// The connection is 4 TCP streams (`$FERRY_AGENT_TCP_STREAMS` where set;
    /// [`Agent::connect_tcp_streams`] to choose): a transfer of at least 512 KiB is cut into
    /// parts of at least 256 KiB carried by the streams at once, as NCCL's sockets and UCX's
    /// lanes do (one stream runs at what one core copies through the kernel, several at what
    /// the network takes; each further stream is a thread on each side). Errors: those of
    /// [`Agent::connect_tcp_streams`], and a value of the variable that is no whole number
    /// ([`AgentError::Config`]).
    pub fn connect_tcp(&self, addr: &str, key: &[u8]) -> Result<Peer, AgentError> {
        self.connect_tcp_streams(addr, key, tcp::default_streams(&crate::env::process)?)
    }

    /// As [`Agent::connect_tcp`], over `streams` TCP streams (1 to 16; 1: every transfer on
    /// one stream, in order). Each further stream proves the key and joins the first with a
    /// ticket the owner gave on it, and carries transfers' parts alone. A stream that breaks
    /// breaks the connection: every stream is shut down. Errors: a short key, `streams` out
    /// of range ([`AgentError::Unsupported`]), the connection or the proof of any stream (an
    /// owner already proving 64 connections at once drops the next: a burst of connectors
    /// may see one refused), an owner of an older ferry without lanes (`streams` > 1).
    pub fn connect_tcp_streams(
        &self,
        addr: &str,
        key: &[u8],
        streams: usize,
    ) -> Result<Peer, AgentError> {
        tcp::connect(&self.inner, addr, key, streams).map(|inner| Peer {
            inner: Arc::new(inner),
        })
    }

    /// Writes `src`'s bytes into the peer's `dst`, one request for the whole segment list
    /// (`dst_off` in `dst`, `src_off` in `src`); `notify`: a message the peer receives
    /// ([`Agent::next_notification`]) once the bytes have landed, sent by the agent's progress
    /// thread even if the request is never waited for (the request then completes after the
    /// message is sent, and a failure to send it is the request's error; a failed transfer
    /// sends nothing). Every segment is checked against both regions first. On this host nothing
    /// blocks on the peer; over TCP ([`Agent::connect_tcp`]) a transfer of at most 64 KiB on a
    /// connection with none queued runs on the calling thread (the hand-off to the connection's
    /// thread cost more than such a transfer) and returns done, after the owner's answer (at
    /// most the agent's timeout); larger ones return at once.
    pub fn write(
        &self,
        dst: &RemoteRegion,
        src: &Region,
        segs: &[Segment],
        notify: Option<&[u8]>,
    ) -> Result<Request, AgentError> {
        self.transfer(dst, src, segs, notify, true)
    }

    /// Reads the peer's `src` into `dst` (`dst_off` in `dst`, `src_off` in `src`): as
    /// [`Agent::write`] the other way.
    pub fn read(
        &self,
        dst: &Region,
        src: &RemoteRegion,
        segs: &[Segment],
        notify: Option<&[u8]>,
    ) -> Result<Request, AgentError> {
        self.transfer(src, dst, segs, notify, false)
    }

    fn transfer(
        &self,
        remote: &RemoteRegion,
        local: &Region,
        segs: &[Segment],
        notify: Option<&[u8]>,
        write: bool,
    ) -> Result<Request, AgentError> {
        if !local.local.live.load(Ordering::Acquire) {
            return Err(AgentError::Deregistered(local.desc.region));
        }
        let (l, r) = (local.local.raw, remote.mem.raw);
        if write {
            check_segments(segs, r.len, l.len)?;
        } else {
            check_segments(segs, l.len, r.len)?;
        }
        let peer = &remote.peer;
        // A small copy between two host mappings runs here and now (below), whatever the
        // peer's state (its pages are mapped here too); its request looks at the peer when it
        // is seen complete (`complete::wrap`): one look per transfer (a load of the peer's
        // life word, or a `poll` of its pidfd where it shared none: then the larger part of
        // such a transfer's cost). Every other transfer is refused here if the peer has
        // exited.
        let here = l.kind.host_accessible()
            && r.kind.host_accessible()
            && !matches!(remote.mem.kind, RemoteKind::Cross { .. } | RemoteKind::Tcp)
            && segs.iter().map(|s| s.len).sum::<u64>() <= INLINE_BYTES as u64;
        if !here && peer.exited() {
            return Err(peer.gone());
        }
        let req = match &remote.mem.kind {
            RemoteKind::Tcp => {
                let req = tcp_bytes::transfer(
                    peer,
                    Arc::clone(&self.inner.engine),
                    Arc::clone(&local.local),
                    remote.desc.region,
                    segs,
                    write,
                )?;
                local.local.in_use.push(&req);
                remote.mem.in_use.push(&req);
                req
            }
            RemoteKind::Cross { pid } => {
                if !l.kind.host_accessible() {
                    return Err(AgentError::Unsupported(format!(
                        "a peer's pageable memory reaches only host memory, not {} memory: \
                         have the peer register it with alloc_shared",
                        l.kind
                    )));
                }
                let pieces: Vec<Piece> = segs
                    .iter()
                    .filter(|s| s.len > 0)
                    .map(|s| {
                        let (lo, ro) = if write {
                            (s.src_off, s.dst_off)
                        } else {
                            (s.dst_off, s.src_off)
                        };
                        Piece {
                            local: l.addr + lo,
                            remote: r.addr + ro,
                            len: s.len as usize,
                        }
                    })
                    .collect();
                let bytes: usize = pieces.iter().map(|p| p.len).sum();
                if bytes <= INLINE_BYTES {
                    // SAFETY: the local ranges lie in the registered region (checked above),
                    // borrowed for this call.
                    let r = unsafe { sys::cross_copy(*pid as i32, &pieces, write) };
                    let r = r.map_err(|e| cross_error(e, write, *pid, &peer.name));
                    return complete::wrap(&self.inner.progress, Request::ready(r), peer, notify);
                }
                let (pid, keep) = (*pid, (Arc::clone(&local.local), Arc::clone(&remote.mem)));
                let signal = Arc::new(Signal::new());
                let done = Arc::clone(&signal);
                let pname = peer.name.clone();
                self.run_on_worker(Box::new(move || {
                    // SAFETY: the local ranges lie in the registered region (checked above),
                    // kept alive by `keep` until the copy ends.
                    let r = unsafe { sys::cross_copy(pid as i32, &pieces, write) };
                    drop(keep);
                    done.complete(r.map_err(|e| cross_error(e, write, pid, &pname)));
                }))?;
                let req = Request::new(signal);
                local.local.in_use.push(&req);
                req
            }
            // Mapped host memory on both sides, a small transfer: copied here, as the small
            // cross-memory copies are (the engine's queue costs more than the copy). A peer
            // that has exited loses nothing (the pages are mapped here too) and fails the
            // request (`complete::wrap`).
            _ if here => {
                let (dst, src) = if write { (r, l) } else { (l, r) };
                for s in segs {
                    // SAFETY: both ranges were checked inside their regions (the live local
                    // registration and the peer's mapping, both host memory of this process),
                    // borrowed for this call; `copy` allows the two mappings to alias (a
                    // process that imported its own region).
                    unsafe {
                        std::ptr::copy(
                            (src.addr + s.src_off) as *const u8,
                            (dst.addr + s.dst_off) as *mut u8,
                            s.len as usize,
                        )
                    };
                }
                Request::ready(Ok(()))
            }
            _ => {
                let (dst, src) = if write { (r, l) } else { (l, r) };
                let job = Job {
                    dst,
                    src: Some(src),
                    op: Op::Segments(segs.into()),
                    after: Vec::new(),
                };
                // SAFETY: both views are live registered memory (the local region and the
                // peer's mapping), each kept until this request ends (`InUse`, waited before
                // either is freed); the segments were checked against both.
                let req = unsafe { self.inner.engine.submit_raw(job) }?;
                local.local.in_use.push(&req);
                remote.mem.in_use.push(&req);
                req
            }
        };
        complete::wrap(&self.inner.progress, req, peer, notify)
    }

    fn run_on_worker(&self, job: CopyJob) -> Result<(), AgentError> {
        run_on(&self.inner.worker, "ferry-agent-copy", job)
    }

    /// The next notification a peer sent (its agent's name and the message), waiting at most
    /// `timeout`; `None` when none came.
    pub fn next_notification(&self, timeout: Duration) -> Option<(String, Vec<u8>)> {
        let notes = lock(&self.inner.notes);
        let (mut notes, _) = self
            .inner
            .notes_cv
            .wait_timeout_while(notes, timeout, |n| n.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        notes.pop_front()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        // Wakes the serving threads' accepts, then closes every peer's connection.
        let _ = UnixStream::connect(&self.inner.path);
        let _ = std::fs::remove_file(&self.inner.path);
        if let Some(l) = lock(&self.inner.tcp).take() {
            let mut at = l.addr;
            if at.ip().is_unspecified() {
                at.set_ip(match at {
                    std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            let _ = std::net::TcpStream::connect_timeout(&at, Duration::from_secs(1));
        }
        for (_, c) in lock(&self.inner.conns).drain() {
            c.shutdown();
        }
    }
}

/// Runs `job` on the thread behind `slot`, started (named `name`) at its first job: the
/// agent's cross-memory copy thread, a TCP connection's transfer thread. Jobs run in order.
fn run_on(
    slot: &Mutex<Option<mpsc::Sender<CopyJob>>>,
    name: &str,
    job: CopyJob,
) -> Result<(), AgentError> {
    let mut w = lock(slot);
    if w.is_none() {
        let (tx, rx) = mpsc::channel::<CopyJob>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .map_err(io_err(format!("start the thread {name}")))?;
        *w = Some(tx);
    }
    let tx = w.as_ref().expect("started above");
    tx.send(job)
        .map_err(|_| AgentError::Unsupported(format!("the thread {name} stopped")))
}

/// Maps a cross-memory copy's failure to the agent's error.
fn cross_error(e: std::io::Error, write: bool, pid: u32, peer: &str) -> RequestError {
    let call = if write {
        "process_vm_writev"
    } else {
        "process_vm_readv"
    };
    let err = match e.raw_os_error() {
        Some(libc::ESRCH) => AgentError::PeerGone {
            peer: peer.to_string(),
            pid,
        },
        Some(libc::EPERM) => AgentError::Ptrace { call, pid },
        _ => AgentError::Io {
            what: format!("{call} on pid {pid} ({peer})"),
            source: e,
        },
    };
    RequestError::Backend(BackendError::new(err))
}

/// Memory registered with an [`Agent`]. Its [`Region::descriptor`] lets peers reach it.
/// Dropped, it is deregistered (and freed) once no peer holds an import of it.
pub struct Region {
    agent: Weak<AgentInner>,
    desc: Descriptor,
    local: Arc<Local>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Region({})", self.desc)
    }
}

impl Region {
    /// The descriptor peers import ([`Peer::import`]).
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.local.raw.len
    }

    /// Always false (registrations are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.local.raw.len == 0
    }

    /// Where the memory lives.
    pub fn kind(&self) -> MemKind {
        self.local.raw.kind
    }

    /// The memory as engines see it (address, length, kind), for copies of the caller's own
    /// (the caller keeps it from racing with transfers, as for any DMA buffer).
    pub fn raw(&self) -> RawBuf {
        self.local.raw
    }

    /// Copies `out.len()` bytes at `offset` into `out` (device memory through the agent's
    /// engine). Transfers in flight on the same bytes race with it, as any DMA does.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), AgentError> {
        let me = RawBuf::host(out.as_ptr(), out.len(), MemKind::Pageable);
        self.copy_with(me, offset, false)
    }

    /// Copies `data` into the region at `offset` (as [`Region::read_at`]).
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), AgentError> {
        let me = RawBuf::host(data.as_ptr(), data.len(), MemKind::Pageable);
        self.copy_with(me, offset, true)
    }

    fn copy_with(&self, host: RawBuf, offset: usize, into: bool) -> Result<(), AgentError> {
        let r = self.local.raw;
        let seg = [Segment::new(0, offset as u64, host.len as u64)];
        if into {
            check_segments(
                &[Segment::new(offset as u64, 0, host.len as u64)],
                r.len,
                host.len,
            )?;
        } else {
            check_segments(&seg, host.len, r.len)?;
        }
        if host.len == 0 {
            return Ok(());
        }
        if r.kind.host_accessible() {
            let (d, s) = if into {
                (r.addr + offset as u64, host.addr)
            } else {
                (host.addr, r.addr + offset as u64)
            };
            // SAFETY: both ranges were checked inside their buffers (the caller's slice and the
            // live registration); a peer's concurrent access is the documented race of DMA
            // memory, and the two never overlap (distinct allocations).
            unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, host.len) };
            return Ok(());
        }
        let Some(agent) = self.agent.upgrade() else {
            return Err(AgentError::Deregistered(self.desc.region));
        };
        if into {
            engine_copy(
                &*agent.engine,
                r,
                host,
                &[Segment::new(offset as u64, 0, host.len as u64)],
            )
        } else {
            engine_copy(&*agent.engine, host, r, &seg)
        }
    }

    /// Deregisters now: refused with [`AgentError::InUse`] while a peer holds an import of
    /// it (the peer's [`RemoteRegion`] not yet dropped). After it, transfers on this region
    /// fail and its descriptor is refused by imports; the memory is freed when it is dropped.
    pub fn deregister(&self) -> Result<(), AgentError> {
        let Some(agent) = self.agent.upgrade() else {
            self.local.live.store(false, Ordering::Release);
            return Ok(());
        };
        let mut regions = lock(&agent.regions);
        if let Some(e) = regions.get(&self.desc.region) {
            if !e.importers.is_empty() {
                return Err(AgentError::InUse {
                    region: self.desc.region,
                    peers: e.importers.len(),
                });
            }
        }
        regions.remove(&self.desc.region);
        self.local.live.store(false, Ordering::Release);
        Ok(())
    }
}

impl Region {
    /// The end of a borrowed registration: refuses new imports and transfers, then waits for
    /// this process's requests on it and for every peer's import of it to be released.
    fn retire(&self) {
        self.local.live.store(false, Ordering::Release);
        if let Some(agent) = self.agent.upgrade() {
            let mut regions = lock(&agent.regions);
            if let Some(e) = regions.get_mut(&self.desc.region) {
                e.dropped = true;
            }
            while regions
                .get(&self.desc.region)
                .is_some_and(|e| !e.importers.is_empty())
            {
                regions = agent
                    .released
                    .wait(regions)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            regions.remove(&self.desc.region);
        }
        let reqs: Vec<Request> = lock(&self.local.in_use.0).drain(..).collect();
        for r in reqs {
            let _ = r.settle_keep();
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if matches!(self.local.store, Store::Borrowed) {
            return self.retire();
        }
        let Some(agent) = self.agent.upgrade() else {
            return;
        };
        let mut regions = lock(&agent.regions);
        if let Some(e) = regions.get_mut(&self.desc.region) {
            if e.importers.is_empty() {
                regions.remove(&self.desc.region);
            } else {
                e.dropped = true;
            }
        }
    }
}

/// Copies `segs` from `src` into `dst` on `engine` and waits (device memory's way to and from
/// a host buffer: a registration's `read_at`/`write_at`, the bytes of transfers over TCP).
fn engine_copy(
    engine: &dyn Engine,
    dst: RawBuf,
    src: RawBuf,
    segs: &[Segment],
) -> Result<(), AgentError> {
    // SAFETY: the callers' host buffers are borrowed until the wait below returns, the
    // registrations are live (held), and the segments were checked against both.
    unsafe { engine_submit(engine, dst, src, segs) }?
        .wait()
        .map_err(copy_failed)
}

/// Submits the copy of `segs` from `src` to `dst` on `engine`: its request.
///
/// # Safety
/// 1. `dst` and `src` stay valid until the request has completed, and every segment lies in
///    both (the contract of [`Engine::submit_raw`]).
unsafe fn engine_submit(
    engine: &dyn Engine,
    dst: RawBuf,
    src: RawBuf,
    segs: &[Segment],
) -> Result<Request, AgentError> {
    let job = Job {
        dst,
        src: Some(src),
        op: Op::Segments(segs.into()),
        after: Vec::new(),
    };
    // SAFETY: (1).
    Ok(unsafe { engine.submit_raw(job) }?)
}

/// A copy through the engine that failed, as the agent reports it.
fn copy_failed(e: RequestError) -> AgentError {
    AgentError::Unsupported(format!("copy through the engine failed: {e}"))
}

/// A connection to another process's agent ([`Agent::connect`], [`Agent::connect_tcp`]).
pub struct Peer {
    inner: Arc<PeerInner>,
}

struct PeerInner {
    name: String,
    pid: u32,
    agent: u64,
    stream: Mutex<frame::Stream>,
    reach: Reach,
}

/// How a peer's end is seen: a process of this host (its life word or pidfd), or a
/// connection over TCP (broken or not).
enum Reach<L = ProcessHandle> {
    Local(L),
    Remote(tcp_bytes::Link),
}

impl PeerInner {
    /// The error of a transfer to a peer that is gone.
    fn gone(&self) -> AgentError {
        match &self.reach {
            Reach::Local(_) => AgentError::PeerGone {
                peer: self.name.clone(),
                pid: self.pid,
            },
            Reach::Remote(_) => AgentError::Disconnected {
                peer: format!("{} (pid {})", self.name, self.pid),
                reason: "an earlier transfer or message found the connection broken".into(),
            },
        }
    }

    /// Whether the peer is gone (the hot path's look: one load).
    fn exited(&self) -> bool {
        match &self.reach {
            Reach::Local(p) => p.exited(),
            Reach::Remote(l) => l.lost(),
        }
    }

    /// Whether a transfer that completed must still fail because the peer is gone: a process
    /// of this host that has exited (its memory may be gone with it); never over TCP, where
    /// the owner's answer already said the bytes landed (a later break is a later transfer's).
    fn gone_after_transfer(&self) -> bool {
        match &self.reach {
            Reach::Local(p) => p.exited(),
            Reach::Remote(_) => false,
        }
    }

    /// Refuses a message over a connection already found broken (TCP).
    fn usable(&self) -> Result<(), AgentError> {
        match &self.reach {
            Reach::Remote(l) if l.lost() => Err(self.gone()),
            _ => Ok(()),
        }
    }

    /// The error of a failed socket call `what` on `stream` (held by the caller), which is
    /// closed: a frame cut short leaves it out of step. The peer gone, if it is (asked
    /// surely), else the call's.
    fn lost(&self, stream: &frame::Stream, what: String, e: std::io::Error) -> AgentError {
        stream.shutdown();
        match &self.reach {
            Reach::Local(p) if p.exited_surely() => self.gone(),
            Reach::Local(_) => AgentError::Io { what, source: e },
            Reach::Remote(_) => tcp_bytes::broken(self, &e),
        }
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Peer({}, pid {})", self.inner.name, self.inner.pid)
    }
}

impl Peer {
    /// The peer agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The peer's process id.
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// Whether the peer's process still runs (a process that has `exec`ed another program no
    /// longer counts: its agent and memory are gone); over TCP, whether the connection has
    /// not been found broken.
    pub fn is_alive(&self) -> bool {
        match &self.inner.reach {
            Reach::Local(p) => !p.exited_surely(),
            Reach::Remote(l) => !l.lost(),
        }
    }

    /// Opens the peer's registration `desc` in this process, after the peer confirms that it
    /// still holds it (a descriptor of another agent, a stale one after its deregistration or
    /// a forged one is refused with the reason). The peer keeps the memory registered until
    /// the returned region is dropped.
    pub fn import(&self, desc: &Descriptor) -> Result<RemoteRegion, AgentError> {
        if desc.agent != self.inner.agent || desc.pid != self.inner.pid {
            return Err(AgentError::WrongPeer {
                desc: Box::new(desc.clone()),
                peer: self.inner.name.clone(),
                pid: self.inner.pid,
            });
        }
        let fd = wire::import(&self.inner, desc)?;
        let len = desc.len as usize;
        let kind = match (desc.transport, fd) {
            // Over TCP every registration is reached through the connection.
            _ if matches!(self.inner.reach, Reach::Remote(_)) => RemoteKind::Tcp,
            (Transport::CrossMemory, _) => RemoteKind::Cross { pid: desc.pid },
            (Transport::Shared | Transport::SharedPinned, Some(fd)) => {
                let map = SharedMap::map(fd, len)
                    .map_err(io_err(format!("map the peer's shared memory ({desc})")))?;
                let pin = if desc.transport == Transport::SharedPinned {
                    // SAFETY: the mapping is dropped after the pin (fields drop in order).
                    Some(unsafe { HostPin::new(map.ptr(), len) }?)
                } else {
                    None
                };
                RemoteKind::Shared(pin, map)
            }
            (Transport::CudaVmm, Some(fd)) => {
                use std::os::fd::AsRawFd;
                RemoteKind::Vmm(VmmBuffer::import(desc.ordinal, fd.as_raw_fd(), len)?)
            }
            (Transport::CudaIpc, _) => {
                let h = desc.ipc.as_deref().ok_or_else(|| AgentError::Refused {
                    peer: self.inner.name.clone(),
                    reason: "a CUDA IPC descriptor without its handle".into(),
                })?;
                RemoteKind::Ipc(IpcMapping::open(desc.ordinal, h, len)?)
            }
            (_, None) => {
                return Err(AgentError::Refused {
                    peer: self.inner.name.clone(),
                    reason: format!("no shared memory came with {desc}"),
                })
            }
        };
        let raw = match &kind {
            RemoteKind::Cross { .. } => RawBuf {
                addr: desc.addr,
                len,
                kind: MemKind::Pageable,
            },
            RemoteKind::Shared(pin, map) => RawBuf::host(
                map.ptr(),
                len,
                if pin.is_some() {
                    MemKind::Pinned
                } else {
                    MemKind::Pageable
                },
            ),
            RemoteKind::Ipc(m) => m.raw(),
            RemoteKind::Vmm(b) => b.raw(),
            RemoteKind::Tcp => RawBuf {
                addr: desc.addr,
                len,
                kind: match desc.transport {
                    Transport::CudaIpc | Transport::CudaVmm => MemKind::Device {
                        ordinal: desc.ordinal,
                    },
                    Transport::SharedPinned => MemKind::Pinned,
                    Transport::CrossMemory | Transport::Shared => MemKind::Pageable,
                },
            },
        };
        Ok(RemoteRegion {
            mem: Arc::new(RemoteMem {
                in_use: InUse::default(),
                raw,
                kind,
                _release: Release {
                    peer: Arc::clone(&self.inner),
                    region: desc.region,
                },
            }),
            peer: Arc::clone(&self.inner),
            desc: desc.clone(),
        })
    }

    /// Sends `msg` to the peer's notifications ([`Agent::next_notification`]) now.
    pub fn notify(&self, msg: &[u8]) -> Result<(), AgentError> {
        wire::notify(&self.inner, msg)
    }
}

/// A peer's registration opened in this process ([`Peer::import`]): the far end of
/// [`Agent::read`] and [`Agent::write`]. Dropped, the peer is told it may free the memory
/// once this process's requests on it have ended.
pub struct RemoteRegion {
    mem: Arc<RemoteMem>,
    peer: Arc<PeerInner>,
    desc: Descriptor,
}

/// Fields drop in order: requests are waited for, then the mapping goes, then the peer is
/// told it may free the memory.
struct RemoteMem {
    in_use: InUse,
    raw: RawBuf,
    kind: RemoteKind,
    _release: Release,
}

/// Tells the peer, when dropped, that this process no longer uses its region.
struct Release {
    peer: Arc<PeerInner>,
    region: u64,
}

impl Drop for Release {
    fn drop(&mut self) {
        wire::release(&self.peer, self.region);
    }
}

enum RemoteKind {
    Cross {
        pid: u32,
    },
    /// A registration of an agent connected over TCP: its bytes travel in the connection.
    Tcp,
    Shared(Option<HostPin>, SharedMap),
    Ipc(IpcMapping),
    Vmm(VmmBuffer),
}

impl std::fmt::Debug for RemoteRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteRegion({})", self.desc)
    }
}

impl RemoteRegion {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.raw.len
    }
    /// Always false (registrations are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.mem.raw.len == 0
    }
    /// The descriptor it was opened from.
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }
    /// The memory as this process sees it: the mapped address of shared memory or of a CUDA
    /// IPC allocation (for copies of the caller's own, e.g. a benchmark's raw baseline), or the
    /// peer's own address of pageable memory reached by cross-memory attach or of any memory
    /// reached over TCP (not an address of this process).
    pub fn raw(&self) -> RawBuf {
        self.mem.raw
    }
}
