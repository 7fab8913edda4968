//! The transfer agent (`ferry_agent`, `ferry::agent`): registered memory moved between
//! processes. An agent allocates the memory it registers (host pageable, shared, pinned shared,
//! device) and hands the caller its address; descriptors travel as bytes; transfers are
//! segment lists, one `ferry_agent_request` each.

use crate::error::{
    array, c_string, guard, out, utf8, Fail, FERRY_EDRIVER, FERRY_EINVAL, FERRY_ENOTAVAIL,
    FERRY_EREQUEST, FERRY_SUCCESS,
};
use crate::request::{FerryBuffer, FERRY_MEM_DEVICE, FERRY_MEM_PAGEABLE, FERRY_MEM_PINNED};
use ferry::agent::{Agent, AgentError, Descriptor, Peer, Region, RemoteRegion};
use ferry::cuda::{CudaEngine, CudaError, DeviceBuffer};
use ferry::{CpuEngine, Engine, MemKind, Request, Segment};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;
use std::time::Duration;

/// One segment of a transfer (`ferry_segment` in C): `len` bytes from `src_off` in the source
/// region to `dst_off` in the destination region.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FerrySegment {
    /// Offset in the destination region.
    pub dst_off: u64,
    /// Offset in the source region.
    pub src_off: u64,
    /// Bytes.
    pub len: u64,
}

/// A handle with a type tag, checked on every use.
pub struct Tagged<T> {
    magic: u64,
    value: T,
}

const AGENT: u64 = 0x6665_7272_795f_6167; // "ferry_ag"
const REGION: u64 = 0x6665_7272_795f_7267; // "ferry_rg"
const PEER: u64 = 0x6665_7272_795f_7065; // "ferry_pe"
const REMOTE: u64 = 0x6665_7272_795f_726d; // "ferry_rm"
const AREQ: u64 = 0x6665_7272_795f_6172; // "ferry_ar"

/// `ferry_agent` in C.
pub type FerryAgent = Tagged<(Agent, CString)>;
/// `ferry_region` in C.
pub type FerryRegion = Tagged<Region>;
/// `ferry_peer` in C.
pub type FerryPeer = Tagged<Peer>;
/// `ferry_remote` in C.
pub type FerryRemote = Tagged<RemoteRegion>;
/// `ferry_agent_request` in C.
pub type FerryAgentRequest = Tagged<Request>;

/// Checks a handle.
///
/// # Safety
/// 1. `p` is NULL or a handle of some `Tagged` type not yet destroyed.
unsafe fn get<'a, T>(p: *const Tagged<T>, magic: u64, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: (1).
    let t = unsafe { p.as_ref() }.ok_or_else(|| Fail::inval(format!("{what} is NULL")))?;
    if t.magic != magic {
        return Err(Fail::inval(format!(
            "{what} is not a {what} (destroyed, or another handle type)"
        )));
    }
    Ok(&t.value)
}

fn boxed<T>(magic: u64, value: T) -> *mut Tagged<T> {
    Box::into_raw(Box::new(Tagged { magic, value }))
}

/// Takes a handle out of `*slot` (NULL: none) and frees it.
///
/// # Safety
/// 1. `slot` is NULL or valid for a read and a write; `*slot` is NULL or a handle not yet
///    destroyed.
unsafe fn destroy<T>(slot: *mut *mut Tagged<T>, magic: u64, what: &str) -> Result<c_int, Fail> {
    // SAFETY: (1).
    let slot = unsafe { out(slot, what) }?;
    if slot.is_null() {
        return Ok(FERRY_SUCCESS);
    }
    // SAFETY: (1).
    unsafe { get(*slot, magic, what) }?;
    // SAFETY: (1): from `Box::into_raw`, checked live above; freed once, here.
    let mut b = unsafe { Box::from_raw(*slot) };
    *slot = std::ptr::null_mut();
    b.magic = 0;
    Ok(FERRY_SUCCESS)
}

fn cuda_fail(e: CudaError) -> Fail {
    let code = match e {
        CudaError::NoDriver(_) => FERRY_ENOTAVAIL,
        CudaError::NoDevice { .. } | CudaError::InvalidArgument(_) => FERRY_EINVAL,
        _ => FERRY_EDRIVER,
    };
    Fail::new(code, e.to_string())
}

fn agent_fail(e: AgentError) -> Fail {
    let code = match e {
        AgentError::Segment(_)
        | AgentError::WrongPeer { .. }
        | AgentError::Unsupported(_)
        | AgentError::Config(_) => FERRY_EINVAL,
        AgentError::Cuda(e) => return cuda_fail(e),
        _ => FERRY_EREQUEST,
    };
    Fail::new(code, e.to_string())
}

/// Creates an agent named `name` whose copies run on GPU `device` (its copy engines), or on a
/// CPU engine for `device` < 0 (host memory only). Opens its socket.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EINVAL` (NULL or non-UTF-8 `name`, NULL `out`),
/// `-FERRY_ENOTAVAIL`/`-FERRY_EDRIVER` (no such GPU) or `-FERRY_EREQUEST` (the socket).
///
/// # Safety
/// 1. `name` is NULL or a NUL-terminated string; `out` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_create(
    name: *const c_char,
    device: c_int,
    out_agent: *mut *mut FerryAgent,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let name = unsafe { utf8(name, "name") }?;
        // SAFETY: (1).
        let slot = unsafe { out(out_agent, "agent") }?;
        let engine: Arc<dyn Engine> = if device < 0 {
            Arc::new(CpuEngine::new(0).map_err(|e| Fail::new(FERRY_EREQUEST, e.to_string()))?)
        } else {
            Arc::new(CudaEngine::new(device as u32).map_err(cuda_fail)?)
        };
        let agent = Agent::new(name, engine).map_err(agent_fail)?;
        let path = c_string(&agent.socket_path().display().to_string());
        *slot = boxed(AGENT, (agent, path));
        Ok(FERRY_SUCCESS)
    })
}

/// Destroys an agent (NULL `*agent`: no-op) and sets `*agent` to NULL: closes its socket and
/// its peers' connections. Regions, peers and remotes made from it stay valid to destroy.
///
/// # Safety
/// 1. `agent` is NULL or valid for a read and a write; `*agent` NULL or an agent not yet
///    destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_destroy(agent: *mut *mut FerryAgent) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { destroy(agent, AGENT, "agent") })
}

/// The agent's socket path (peers pass it to `ferry_agent_connect`), valid until the agent
/// is destroyed.
///
/// # Safety
/// 1. `agent` is NULL or an agent not yet destroyed; `path` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_socket_path(
    agent: *const FerryAgent,
    path: *mut *const c_char,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (_, p) = unsafe { get(agent, AGENT, "agent") }?;
        // SAFETY: (1).
        *unsafe { out(path, "path") }? = p.as_ptr();
        Ok(FERRY_SUCCESS)
    })
}

/// Allocates and registers `len` bytes: `kind` `FERRY_MEM_PAGEABLE` (zeroed host memory, peers
/// reach it by cross-memory attach), `FERRY_MEM_PINNED` (zeroed shared host memory,
/// page-locked; `shared` is then ignored) or `FERRY_MEM_DEVICE` (on GPU `device`, CUDA IPC);
/// `shared` != 0 with `FERRY_MEM_PAGEABLE`: shared memory (a memfd peers map) instead.
/// `ferry_region_buffer` gives its address.
///
/// # Safety
/// 1. `agent` is NULL or an agent not yet destroyed; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_alloc(
    agent: *const FerryAgent,
    len: usize,
    kind: c_int,
    device: c_int,
    shared: c_int,
    out_region: *mut *mut FerryRegion,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (a, _) = unsafe { get(agent, AGENT, "agent") }?;
        // SAFETY: (1).
        let slot = unsafe { out(out_region, "region") }?;
        if len == 0 {
            return Err(Fail::inval("len is 0"));
        }
        let r = match kind {
            FERRY_MEM_PAGEABLE if shared != 0 => a.alloc_shared(len, false),
            FERRY_MEM_PAGEABLE => a.register_host(vec![0u8; len]),
            FERRY_MEM_PINNED => a.alloc_shared(len, true),
            FERRY_MEM_DEVICE => {
                let d = u32::try_from(device)
                    .map_err(|_| Fail::inval(format!("device {device} is negative")))?;
                let buf = DeviceBuffer::zeroed(d, len).map_err(cuda_fail)?;
                a.register_device(buf)
            }
            k => {
                return Err(Fail::inval(format!(
                    "kind {k}: not PAGEABLE, PINNED or DEVICE"
                )))
            }
        }
        .map_err(agent_fail)?;
        *slot = boxed(REGION, r);
        Ok(FERRY_SUCCESS)
    })
}

/// Registers `len` bytes at `ptr`, host memory the caller owns and keeps (an existing array),
/// without copying it: peers reach it by cross-memory attach. `ferry_region_destroy` of it
/// deregisters it and waits until no request of this process and no peer's import uses it.
///
/// # Safety
/// 1. `agent` is NULL or an agent not yet destroyed; `out` NULL or valid for one write.
/// 2. `ptr..ptr + len` is host memory valid for reads and writes until
///    `ferry_region_destroy` of the region has returned, which happens before the agent is
///    destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_register(
    agent: *const FerryAgent,
    ptr: *mut c_void,
    len: usize,
    out_region: *mut *mut FerryRegion,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (a, _) = unsafe { get(agent, AGENT, "agent") }?;
        // SAFETY: (1).
        let slot = unsafe { out(out_region, "region") }?;
        if ptr.is_null() || len == 0 {
            return Err(Fail::inval(format!("{len} bytes at {ptr:p}")));
        }
        // SAFETY: (2): the memory stays valid until the region's destroy, which waits for
        // its users, before the agent's.
        let r = unsafe { a.register_raw(ptr.cast(), len) }.map_err(agent_fail)?;
        *slot = boxed(REGION, r);
        Ok(FERRY_SUCCESS)
    })
}

/// The region's memory: address (a device address for device memory), length, kind.
///
/// # Safety
/// 1. `region` is NULL or a region not yet destroyed; `buf` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_region_buffer(
    region: *const FerryRegion,
    buf: *mut FerryBuffer,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let r = unsafe { get(region, REGION, "region") }?;
        // SAFETY: (1).
        let b = unsafe { out(buf, "buf") }?;
        let raw = r.raw();
        let (kind, device) = match raw.kind {
            MemKind::Device { ordinal } => (FERRY_MEM_DEVICE, ordinal as c_int),
            MemKind::Pageable => (FERRY_MEM_PAGEABLE, 0),
            _ => (FERRY_MEM_PINNED, 0),
        };
        *b = FerryBuffer {
            ptr: raw.addr as *mut c_void,
            len: raw.len,
            kind,
            device,
        };
        Ok(FERRY_SUCCESS)
    })
}

/// Writes the region's descriptor (at most 109 bytes) into `buf` of `cap` bytes and its length
/// into `*len` (`-FERRY_EINVAL` if `cap` is too small; `*len` is set all the same).
///
/// # Safety
/// 1. `region` is NULL or a region not yet destroyed; `buf` NULL or valid for `cap` writes;
///    `len` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_region_descriptor(
    region: *const FerryRegion,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let r = unsafe { get(region, REGION, "region") }?;
        // SAFETY: (1).
        let len = unsafe { out(len, "len") }?;
        let d = r.descriptor().to_bytes();
        *len = d.len();
        if buf.is_null() || cap < d.len() {
            return Err(Fail::inval(format!(
                "the descriptor needs {} bytes, buf holds {cap}",
                d.len()
            )));
        }
        // SAFETY: (1): `buf` holds `cap` >= `d.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), buf, d.len()) };
        Ok(FERRY_SUCCESS)
    })
}

/// Deregisters the region now (`-FERRY_EREQUEST` while a peer holds an import of it).
///
/// # Safety
/// 1. `region` is NULL or a region not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferry_region_deregister(region: *const FerryRegion) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let r = unsafe { get(region, REGION, "region") }?;
        r.deregister().map_err(agent_fail)?;
        Ok(FERRY_SUCCESS)
    })
}

/// Destroys a region handle (its memory is freed once no peer holds an import of it and its
/// requests have ended; for `ferry_agent_register`'s, this call waits for that) and sets
/// `*region` to NULL.
///
/// # Safety
/// 1. `region` is NULL or valid for a read and a write; `*region` NULL or a region not yet
///    destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferry_region_destroy(region: *mut *mut FerryRegion) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { destroy(region, REGION, "region") })
}

/// Connects to the agent at socket `path` (same host, same user).
///
/// # Safety
/// 1. `agent` is NULL or an agent not yet destroyed; `path` NULL or a NUL-terminated string;
///    `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_connect(
    agent: *const FerryAgent,
    path: *const c_char,
    out_peer: *mut *mut FerryPeer,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (a, _) = unsafe { get(agent, AGENT, "agent") }?;
        // SAFETY: (1).
        let path = unsafe { utf8(path, "path") }?;
        // SAFETY: (1).
        let slot = unsafe { out(out_peer, "peer") }?;
        *slot = boxed(PEER, a.connect(path).map_err(agent_fail)?);
        Ok(FERRY_SUCCESS)
    })
}

/// A key argument: `len` bytes at `key` (at least 16), or `-FERRY_EINVAL`.
///
/// # Safety
/// 1. `key` is NULL or valid for reads of `len` bytes, outliving the returned borrow.
unsafe fn key_bytes<'a>(key: *const u8, len: usize) -> Result<&'a [u8], Fail> {
    if key.is_null() {
        return Err(Fail::inval("key is NULL"));
    }
    // SAFETY: (1).
    Ok(unsafe { std::slice::from_raw_parts(key, len) })
}

/// Serves peers of other hosts too: listens on TCP at `addr` (`"0.0.0.0:7000"`; port 0 for
/// one the kernel picks) and serves connections that prove `key` (`key_len` >= 16 bytes, the
/// same given to the peers' `ferry_agent_connect_tcp`; the key itself never travels). Every
/// registration is then reachable from them, its bytes carried over the connection,
/// unencrypted. `*port` (if `port` is not NULL) = the port bound.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EINVAL` (NULL or non-UTF-8 `addr`, NULL `key`, a key
/// shorter than 16 bytes, an agent already listening) or `-FERRY_EREQUEST` (the bind).
///
/// # Safety
/// 1. `agent` is NULL or an agent not yet destroyed; `addr` NULL or a NUL-terminated string;
///    `key` NULL or valid for `key_len` bytes; `port` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_listen_tcp(
    agent: *const FerryAgent,
    addr: *const c_char,
    key: *const u8,
    key_len: usize,
    port: *mut u16,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (a, _) = unsafe { get(agent, AGENT, "agent") }?;
        // SAFETY: (1).
        let (addr, key) = unsafe { (utf8(addr, "addr")?, key_bytes(key, key_len)?) };
        let at = a.listen_tcp(addr, key).map_err(agent_fail)?;
        if !port.is_null() {
            // SAFETY: (1).
            unsafe { *port = at.port() };
        }
        Ok(FERRY_SUCCESS)
    })
}

/// Connects to the agent listening at `addr` (`"host:port"`, `ferry_agent_listen_tcp`) on
/// this or another host, proving `key` (`key_len` >= 16 bytes) and checking that the agent
/// holds it. Transfers then carry their bytes over the connection; one that breaks fails them
/// (`-FERRY_EREQUEST`, "connection ... lost"). The connection is 4 TCP streams
/// (`$FERRY_AGENT_TCP_STREAMS` where set), a transfer of at least 512 KiB cut across them:
/// `ferry_agent_connect_tcp_streams` to choose.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EINVAL` (NULL or non-UTF-8 `addr`, NULL or short `key`,
/// NULL `out`, a variable that is no number from 1 to 16) or `-FERRY_EREQUEST` (nothing
/// listens there, the key refused).
///
/// # Safety
/// 1. `agent` is NULL or an agent not yet destroyed; `addr` NULL or a NUL-terminated string;
///    `key` NULL or valid for `key_len` bytes; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_connect_tcp(
    agent: *const FerryAgent,
    addr: *const c_char,
    key: *const u8,
    key_len: usize,
    out_peer: *mut *mut FerryPeer,
) -> c_int {
    // SAFETY: (1), passed on; 0 streams: the default.
    unsafe { ferry_agent_connect_tcp_streams(agent, addr, key, key_len, 0, out_peer) }
}

/// As `ferry_agent_connect_tcp`, over `streams` TCP streams (1 to 16; 0: the default, 4 or
/// `$FERRY_AGENT_TCP_STREAMS`). Returns as `ferry_agent_connect_tcp`, and `-FERRY_EINVAL` for
/// `streams` past 16.
///
/// # Safety
/// As `ferry_agent_connect_tcp`.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_connect_tcp_streams(
    agent: *const FerryAgent,
    addr: *const c_char,
    key: *const u8,
    key_len: usize,
    streams: usize,
    out_peer: *mut *mut FerryPeer,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (a, _) = unsafe { get(agent, AGENT, "agent") }?;
        // SAFETY: (1).
        let (addr, key) = unsafe { (utf8(addr, "addr")?, key_bytes(key, key_len)?) };
        // SAFETY: (1).
        let slot = unsafe { out(out_peer, "peer") }?;
        let peer = match streams {
            0 => a.connect_tcp(addr, key),
            n => a.connect_tcp_streams(addr, key, n),
        };
        *slot = boxed(PEER, peer.map_err(agent_fail)?);
        Ok(FERRY_SUCCESS)
    })
}

/// Destroys a peer handle and sets `*peer` to NULL (its remotes stay valid to destroy).
///
/// # Safety
/// 1. `peer` is NULL or valid for a read and a write; `*peer` NULL or a peer not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferry_peer_destroy(peer: *mut *mut FerryPeer) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { destroy(peer, PEER, "peer") })
}

/// Opens the peer's registration whose descriptor is the `len` bytes at `desc` (refused with
/// the reason: another process's, stale, forged).
///
/// # Safety
/// 1. `peer` is NULL or a peer not yet destroyed; `desc` NULL or valid for `len` reads; `out`
///    NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_peer_import(
    peer: *const FerryPeer,
    desc: *const u8,
    len: usize,
    out_remote: *mut *mut FerryRemote,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let p = unsafe { get(peer, PEER, "peer") }?;
        // SAFETY: (1).
        let bytes = unsafe { array(desc, len, "desc") }?;
        let d = Descriptor::from_bytes(bytes)
            .ok_or_else(|| Fail::inval(format!("{len} bytes that are not a descriptor")))?;
        // SAFETY: (1).
        let slot = unsafe { out(out_remote, "remote") }?;
        *slot = boxed(REMOTE, p.import(&d).map_err(agent_fail)?);
        Ok(FERRY_SUCCESS)
    })
}

/// Destroys a remote handle (after its requests end, the peer may free the memory) and sets
/// `*remote` to NULL.
///
/// # Safety
/// 1. `remote` is NULL or valid for a read and a write; `*remote` NULL or a remote not yet
///    destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferry_remote_destroy(remote: *mut *mut FerryRemote) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { destroy(remote, REMOTE, "remote") })
}

/// Writes (`write` != 0: `region` -> `remote`) or reads (`remote` -> `region`) `n` segments
/// as one request; `notify` (NULL: none) of `notify_len` bytes reaches the peer when the
/// request is seen complete. Every segment is checked first (`-FERRY_EINVAL` names it).
///
/// # Safety
/// 1. `agent`, `remote`, `region` are NULL or handles not yet destroyed; `segs` NULL or valid
///    for `n` reads; `notify` NULL or valid for `notify_len` reads; `out` NULL or valid for
///    one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_transfer(
    agent: *const FerryAgent,
    write: c_int,
    remote: *const FerryRemote,
    region: *const FerryRegion,
    segs: *const FerrySegment,
    n: usize,
    notify: *const c_void,
    notify_len: usize,
    out_req: *mut *mut FerryAgentRequest,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (a, _) = unsafe { get(agent, AGENT, "agent") }?;
        // SAFETY: (1).
        let rm = unsafe { get(remote, REMOTE, "remote") }?;
        // SAFETY: (1).
        let rg = unsafe { get(region, REGION, "region") }?;
        let segs: Vec<Segment> = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: (1).
            unsafe { array(segs, n, "segs") }?
                .iter()
                .map(|s| Segment::new(s.dst_off, s.src_off, s.len))
                .collect()
        };
        let note = if notify.is_null() {
            None
        } else {
            // SAFETY: (1).
            Some(unsafe { array(notify.cast::<u8>(), notify_len, "notify") }?)
        };
        // SAFETY: (1).
        let slot = unsafe { out(out_req, "req") }?;
        let req = if write != 0 {
            a.write(rm, rg, &segs, note)
        } else {
            a.read(rg, rm, &segs, note)
        }
        .map_err(agent_fail)?;
        *slot = boxed(AREQ, req);
        Ok(FERRY_SUCCESS)
    })
}

/// Waits for an agent request (may block), releases it and sets `*req` to NULL;
/// `-FERRY_EREQUEST` if it failed (the message says why: e.g. the peer has exited).
///
/// # Safety
/// 1. `req` is NULL or valid for a read and a write; `*req` NULL or a request not yet released.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_request_wait(req: *mut *mut FerryAgentRequest) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let slot = unsafe { out(req, "req") }?;
        // SAFETY: (1).
        unsafe { get(*slot, AREQ, "req") }?;
        // SAFETY: (1): from `Box::into_raw`, checked live above; released once, here.
        let mut b = unsafe { Box::from_raw(*slot) };
        *slot = std::ptr::null_mut();
        b.magic = 0;
        let id = b.value.id();
        b.value
            .wait()
            .map(|()| FERRY_SUCCESS)
            .map_err(|e| Fail::new(FERRY_EREQUEST, format!("request #{id} failed: {e}")))
    })
}

/// Polls an agent request: `*done` = 1 once complete (then `-FERRY_EREQUEST` if it failed),
/// else 0. Does not release it.
///
/// # Safety
/// 1. `req` is NULL or a request not yet released; `done` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_request_test(
    req: *mut FerryAgentRequest,
    done: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        unsafe { get(req, AREQ, "req") }?;
        // SAFETY: (1): checked live above; used by one thread at a time (the header's rule).
        let r = &mut unsafe { &mut *req }.value;
        // SAFETY: (1).
        let done = unsafe { out(done, "done") }?;
        match r.try_wait() {
            None => {
                *done = 0;
                Ok(FERRY_SUCCESS)
            }
            Some(res) => {
                *done = 1;
                let id = r.id();
                res.map(|()| FERRY_SUCCESS)
                    .map_err(|e| Fail::new(FERRY_EREQUEST, format!("request #{id} failed: {e}")))
            }
        }
    })
}

/// The next notification from a peer, waiting at most `timeout_ms`: its bytes into `buf` (at
/// most `cap`; the rest is dropped) and their full length into `*len`. Returns 1 when one
/// came, 0 when none did, or a negative code.
///
/// # Safety
/// 1. `agent` is NULL or an agent not yet destroyed; `buf` NULL or valid for `cap` writes;
///    `len` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_agent_next_notification(
    agent: *const FerryAgent,
    timeout_ms: u32,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (a, _) = unsafe { get(agent, AGENT, "agent") }?;
        // SAFETY: (1).
        let len = unsafe { out(len, "len") }?;
        let Some((_, msg)) = a.next_notification(Duration::from_millis(timeout_ms.into())) else {
            return Ok(0);
        };
        *len = msg.len();
        let n = msg.len().min(cap);
        if n > 0 && !buf.is_null() {
            // SAFETY: (1): `buf` holds `cap` >= `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), buf, n) };
        }
        Ok(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two agents over TCP on loopback: the key checked, a write and a read back.
    #[test]
    fn agents_reach_each_other_over_tcp_through_the_c_api() {
        // SAFETY: every handle is made and destroyed here, in order; buffers outlive requests.
        unsafe {
            let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(ferry_agent_create(c"c-tcp-owner".as_ptr(), -1, &mut a), 0);
            assert_eq!(ferry_agent_create(c"c-tcp-peer".as_ptr(), -1, &mut b), 0);
            let key = b"a key of sixteen bytes or more";
            let mut port = 0u16;
            assert_eq!(
                ferry_agent_listen_tcp(a, c"127.0.0.1:0".as_ptr(), key.as_ptr(), 8, &mut port),
                -FERRY_EINVAL
            );
            assert_eq!(
                ferry_agent_listen_tcp(
                    a,
                    c"127.0.0.1:0".as_ptr(),
                    key.as_ptr(),
                    key.len(),
                    &mut port
                ),
                0
            );
            assert_ne!(port, 0);
            let at = std::ffi::CString::new(format!("127.0.0.1:{port}")).unwrap();
            let mut peer = std::ptr::null_mut();
            let wrong = b"another key of sixteen bytes";
            assert_eq!(
                ferry_agent_connect_tcp(b, at.as_ptr(), wrong.as_ptr(), wrong.len(), &mut peer),
                -FERRY_EREQUEST
            );
            assert!(peer.is_null());
            assert_eq!(
                ferry_agent_connect_tcp(b, at.as_ptr(), key.as_ptr(), key.len(), &mut peer),
                0
            );
            let (mut theirs, mut mine) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(
                ferry_agent_alloc(a, 8192, FERRY_MEM_PAGEABLE, 0, 0, &mut theirs),
                0
            );
            assert_eq!(
                ferry_agent_alloc(b, 8192, FERRY_MEM_PAGEABLE, 0, 0, &mut mine),
                0
            );
            let mut buf = FerryBuffer {
                ptr: std::ptr::null_mut(),
                len: 0,
                kind: -1,
                device: 0,
            };
            assert_eq!(ferry_region_buffer(mine, &mut buf), 0);
            let m = std::slice::from_raw_parts_mut(buf.ptr.cast::<u8>(), 8192);
            m.fill(0x17);
            let mut desc = [0u8; 128];
            let mut dlen = 0;
            assert_eq!(
                ferry_region_descriptor(theirs, desc.as_mut_ptr(), 128, &mut dlen),
                0
            );
            let mut remote = std::ptr::null_mut();
            assert_eq!(ferry_peer_import(peer, desc.as_ptr(), dlen, &mut remote), 0);
            let seg = [FerrySegment {
                dst_off: 4096,
                src_off: 0,
                len: 4096,
            }];
            let mut req = std::ptr::null_mut();
            let none = std::ptr::null();
            assert_eq!(
                ferry_agent_transfer(b, 1, remote, mine, seg.as_ptr(), 1, none, 0, &mut req),
                0
            );
            assert_eq!(ferry_agent_request_wait(&mut req), 0);
            assert_eq!(ferry_region_buffer(theirs, &mut buf), 0);
            let t = std::slice::from_raw_parts(buf.ptr.cast::<u8>(), 8192);
            assert!(t[4096..].iter().all(|&x| x == 0x17) && t[..4096].iter().all(|&x| x == 0));
            // Read their zeros back over the first half of mine.
            let back = [FerrySegment {
                dst_off: 0,
                src_off: 0,
                len: 4096,
            }];
            assert_eq!(
                ferry_agent_transfer(b, 0, remote, mine, back.as_ptr(), 1, none, 0, &mut req),
                0
            );
            assert_eq!(ferry_agent_request_wait(&mut req), 0);
            assert!(m[..4096].iter().all(|&x| x == 0) && m[4096..].iter().all(|&x| x == 0x17));
            assert_eq!(ferry_remote_destroy(&mut remote), 0);
            assert_eq!(ferry_peer_destroy(&mut peer), 0);
            // Two streams: 1 MiB cut across both into their region; 17 streams refused.
            assert_eq!(
                ferry_agent_connect_tcp_streams(
                    b,
                    at.as_ptr(),
                    key.as_ptr(),
                    key.len(),
                    17,
                    &mut peer
                ),
                -FERRY_EINVAL
            );
            let (mut wide, mut big) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(
                ferry_agent_alloc(a, 1 << 20, FERRY_MEM_PAGEABLE, 0, 0, &mut wide),
                0
            );
            assert_eq!(
                ferry_agent_alloc(b, 1 << 20, FERRY_MEM_PAGEABLE, 0, 0, &mut big),
                0
            );
            assert_eq!(ferry_region_buffer(big, &mut buf), 0);
            let src = std::slice::from_raw_parts_mut(buf.ptr.cast::<u8>(), 1 << 20);
            src.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i % 241) as u8);
            assert_eq!(
                ferry_agent_connect_tcp_streams(
                    b,
                    at.as_ptr(),
                    key.as_ptr(),
                    key.len(),
                    2,
                    &mut peer
                ),
                0
            );
            assert_eq!(
                ferry_region_descriptor(wide, desc.as_mut_ptr(), 128, &mut dlen),
                0
            );
            assert_eq!(ferry_peer_import(peer, desc.as_ptr(), dlen, &mut remote), 0);
            let all = [FerrySegment {
                dst_off: 0,
                src_off: 0,
                len: 1 << 20,
            }];
            assert_eq!(
                ferry_agent_transfer(b, 1, remote, big, all.as_ptr(), 1, none, 0, &mut req),
                0
            );
            assert_eq!(ferry_agent_request_wait(&mut req), 0);
            assert_eq!(ferry_region_buffer(wide, &mut buf), 0);
            assert!(std::slice::from_raw_parts(buf.ptr.cast::<u8>(), 1 << 20) == src);
            assert_eq!(ferry_remote_destroy(&mut remote), 0);
            assert_eq!(ferry_peer_destroy(&mut peer), 0);
            assert_eq!(ferry_region_destroy(&mut big), 0);
            assert_eq!(ferry_region_destroy(&mut wide), 0);
            assert_eq!(ferry_region_destroy(&mut mine), 0);
            assert_eq!(ferry_region_destroy(&mut theirs), 0);
            assert_eq!(ferry_agent_destroy(&mut b), 0);
            assert_eq!(ferry_agent_destroy(&mut a), 0);
        }
    }

    /// One agent talking to itself through its own socket (cross-memory attach on its own pid
    /// and a second mapping of its shared memory): the whole C path in one process.
    #[test]
    fn an_agent_writes_and_reads_through_the_c_api() {
        // SAFETY: every handle is made and destroyed here, in order; buffers outlive requests.
        unsafe {
            let mut a = std::ptr::null_mut();
            assert_eq!(ferry_agent_create(c"c-test".as_ptr(), -1, &mut a), 0);
            let mut path = std::ptr::null();
            assert_eq!(ferry_agent_socket_path(a, &mut path), 0);
            let (mut shared, mut host) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(
                ferry_agent_alloc(a, 8192, FERRY_MEM_PAGEABLE, 0, 1, &mut shared),
                0
            );
            assert_eq!(
                ferry_agent_alloc(a, 8192, FERRY_MEM_PAGEABLE, 0, 0, &mut host),
                0
            );
            let mut b = FerryBuffer {
                ptr: std::ptr::null_mut(),
                len: 0,
                kind: -1,
                device: 0,
            };
            assert_eq!(ferry_region_buffer(host, &mut b), 0);
            assert_eq!((b.len, b.kind), (8192, FERRY_MEM_PAGEABLE));
            std::slice::from_raw_parts_mut(b.ptr.cast::<u8>(), 8192).fill(0x42);
            let mut desc = [0u8; 128];
            let mut dlen = 0;
            assert_eq!(
                ferry_region_descriptor(shared, desc.as_mut_ptr(), 10, &mut dlen),
                -FERRY_EINVAL
            );
            assert_eq!(
                ferry_region_descriptor(shared, desc.as_mut_ptr(), 128, &mut dlen),
                0
            );
            let mut peer = std::ptr::null_mut();
            assert_eq!(ferry_agent_connect(a, path, &mut peer), 0);
            let mut remote = std::ptr::null_mut();
            assert_eq!(ferry_peer_import(peer, desc.as_ptr(), dlen, &mut remote), 0);
            let segs = [FerrySegment {
                dst_off: 100,
                src_off: 0,
                len: 1000,
            }];
            let mut req = std::ptr::null_mut();
            let note = b"landed";
            assert_eq!(
                ferry_agent_transfer(
                    a,
                    1,
                    remote,
                    host,
                    segs.as_ptr(),
                    1,
                    note.as_ptr().cast(),
                    6,
                    &mut req
                ),
                0
            );
            assert_eq!(ferry_agent_request_wait(&mut req), 0);
            assert!(req.is_null());
            let mut got = [0u8; 16];
            let mut glen = 0;
            assert_eq!(
                ferry_agent_next_notification(a, 5000, got.as_mut_ptr(), 16, &mut glen),
                1
            );
            assert_eq!(&got[..glen], b"landed");
            assert_eq!(ferry_region_buffer(shared, &mut b), 0);
            let s = std::slice::from_raw_parts(b.ptr.cast::<u8>(), 8192);
            assert!(s[100..1100].iter().all(|&x| x == 0x42) && s[99] == 0 && s[1100] == 0);
            // A segment past the remote region: refused, named.
            let bad = [FerrySegment {
                dst_off: 8000,
                src_off: 0,
                len: 1000,
            }];
            assert_eq!(
                ferry_agent_transfer(
                    a,
                    1,
                    remote,
                    host,
                    bad.as_ptr(),
                    1,
                    std::ptr::null(),
                    0,
                    &mut req
                ),
                -FERRY_EINVAL
            );
            let msg = std::ffi::CStr::from_ptr(crate::ferry_last_error_message())
                .to_str()
                .unwrap();
            assert!(msg.contains("segment 0"), "{msg}");
            // Imported: deregistering is refused; after the remote goes, it works.
            assert_eq!(ferry_region_deregister(shared), -FERRY_EREQUEST);
            assert_eq!(ferry_remote_destroy(&mut remote), 0);
            assert_eq!(ferry_peer_destroy(&mut peer), 0);
            let mut ok = false;
            for _ in 0..100 {
                if ferry_region_deregister(shared) == 0 {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(ok, "the release reaches the agent");
            assert_eq!(ferry_region_destroy(&mut shared), 0);
            // The caller's own array, registered in place: read into it from the host region.
            let mut mine = vec![0u8; 4096];
            let mut lent = std::ptr::null_mut();
            assert_eq!(
                ferry_agent_register(a, std::ptr::null_mut(), 1, &mut lent),
                -FERRY_EINVAL
            );
            assert_eq!(
                ferry_agent_register(a, mine.as_mut_ptr().cast(), 4096, &mut lent),
                0
            );
            assert_eq!(ferry_region_buffer(lent, &mut b), 0);
            assert_eq!((b.ptr.cast::<u8>(), b.len), (mine.as_mut_ptr(), 4096));
            assert_eq!(
                ferry_region_descriptor(lent, desc.as_mut_ptr(), 128, &mut dlen),
                0
            );
            assert_eq!(ferry_agent_connect(a, path, &mut peer), 0);
            assert_eq!(ferry_peer_import(peer, desc.as_ptr(), dlen, &mut remote), 0);
            let segs = [FerrySegment {
                dst_off: 10,
                src_off: 0,
                len: 100,
            }];
            assert_eq!(
                ferry_agent_transfer(
                    a,
                    1,
                    remote,
                    host,
                    segs.as_ptr(),
                    1,
                    std::ptr::null(),
                    0,
                    &mut req
                ),
                0
            );
            assert_eq!(ferry_agent_request_wait(&mut req), 0);
            assert_eq!(ferry_remote_destroy(&mut remote), 0);
            assert_eq!(ferry_peer_destroy(&mut peer), 0);
            // Waits for the release of the import, then the array is the caller's again.
            assert_eq!(ferry_region_destroy(&mut lent), 0);
            assert!(mine[10..110].iter().all(|&x| x == 0x42) && mine[9] == 0 && mine[110] == 0);
            assert_eq!(ferry_region_destroy(&mut host), 0);
            assert_eq!(ferry_agent_destroy(&mut a), 0);
            assert!(a.is_null());
        }
    }
}
