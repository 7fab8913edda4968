//! `ferry.Agent` and its `Region`, `Peer` and `RemoteRegion`: ferry's transfer agent
//! (`ferry::agent`), registered memory moved between processes of one host.

use crate::copy::PyRequest;
use crate::errors::{self, arg};
use ferry::agent::{Agent, AgentError, Descriptor, Peer, Region, RemoteRegion};
use ferry::{CpuEngine, MemKind, Segment};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;
use std::time::Duration;

/// The exception for an agent's error.
fn agent_err(e: AgentError) -> PyErr {
    match e {
        AgentError::Segment(_)
        | AgentError::WrongPeer { .. }
        | AgentError::Unsupported(_)
        | AgentError::Config(_) => arg(e.to_string()),
        AgentError::Cuda(c) => errors::cuda(c),
        e => errors::FerryError::new_err(e.to_string()),
    }
}

/// Agent(name, device=None)
///
/// A transfer agent: registers memory that other processes of this host read and write
/// (``alloc``), connects to other processes' agents (``connect``) and moves segment lists to
/// and from their memory (``write``, ``read``), one ``Request`` per list. As NIXL's agent,
/// with descriptors of at most 109 bytes.
///
/// Host memory reaches peers through cross-memory attach (``kind="pageable"``) or a shared
/// memfd (``shared=True``, or ``kind="pinned"``); device memory through CUDA IPC, copied on
/// the copy engines of the GPU that holds it. Only processes of the same user may connect.
///
/// Args:
///     name (str): the agent's name (peers see it with each notification).
///     device (int | None): the GPU whose engine copies (``None``: a CPU engine, host memory
///         only).
///
/// Raises:
///     DriverError: no such GPU. FerryError: the socket could not be made.
///
/// Example:
///     >>> a = ferry.Agent("prefill", device=0)
///     >>> kv = a.alloc(1 << 20, kind="device")
///     >>> send_to_peer(a.socket_path, kv.descriptor)      # any channel
#[pyclass(module = "ferry", name = "Agent", frozen)]
pub(crate) struct PyAgent {
    agent: Arc<Agent>,
}

/// Registered memory of this process (``Agent.alloc``). Its ``descriptor`` lets peers reach
/// it; deleted, it is freed once no peer holds it. Not made directly.
///
/// Example:
///     >>> region = agent.alloc(1 << 20, kind="pinned")
///     >>> region.write(0, b"abcd"); region.read(0, 4)
///     b'abcd'
#[pyclass(module = "ferry", name = "Region", frozen)]
pub(crate) struct PyRegion {
    /// `None` only while dropped.
    region: Option<Arc<Region>>,
    /// For `Agent.register`'s: the agent (a lent region goes before its agent) and the array
    /// whose memory it is, both kept until the region has gone.
    lent: Option<(Arc<Agent>, Vec<PyObject>)>,
}

impl PyRegion {
    fn region(&self) -> &Arc<Region> {
        self.region.as_ref().expect("a region until dropped")
    }
}

impl Drop for PyRegion {
    fn drop(&mut self) {
        let region = self.region.take();
        // A lent region's drop waits for peers (maybe threads of this interpreter) to release
        // it: without the GIL.
        Python::with_gil(|py| py.allow_threads(move || drop(region)));
        // Then the agent and the array may go.
        drop(self.lent.take());
    }
}

/// A connection to another process's agent (``Agent.connect``). Not made directly.
///
/// Example:
///     >>> peer = agent.connect(path)
///     >>> remote = peer.open(descriptor)
#[pyclass(module = "ferry", name = "Peer", frozen)]
pub(crate) struct PyPeer {
    peer: Peer,
}

/// A peer's registered memory opened here (``Peer.open``): the far end of ``Agent.write``
/// and ``Agent.read``; deleted, the peer may free it. Not made directly.
///
/// Example:
///     >>> remote = peer.open(descriptor)
///     >>> agent.write(remote, local, [(0, 0, remote.nbytes)]).wait()
#[pyclass(module = "ferry", name = "RemoteRegion", frozen)]
pub(crate) struct PyRemote {
    remote: Arc<RemoteRegion>,
}

/// Segments from a sequence of ``(dst_offset, src_offset, nbytes)`` triples.
fn segments(segs: Vec<(u64, u64, u64)>) -> Vec<Segment> {
    segs.into_iter()
        .map(|(d, s, n)| Segment::new(d, s, n))
        .collect()
}

#[pymethods]
impl PyAgent {
    #[new]
    #[pyo3(signature = (name, device = None))]
    fn new(py: Python<'_>, name: &str, device: Option<u32>) -> PyResult<Self> {
        let engine: Arc<dyn ferry::Engine> = match device {
            None => Arc::new(CpuEngine::new(0).map_err(errors::ferry)?),
            Some(d) => crate::engine::cuda_engine(py, d)?,
        };
        let agent = py
            .allow_threads(|| Agent::new(name, engine))
            .map_err(agent_err)?;
        Ok(PyAgent {
            agent: Arc::new(agent),
        })
    }

    /// The agent's socket, which peers pass to ``Agent.connect``.
    #[getter]
    fn socket_path(&self) -> String {
        self.agent.socket_path().display().to_string()
    }

    /// The agent's name.
    #[getter]
    fn name(&self) -> String {
        self.agent.name().to_string()
    }

    /// Allocates and registers ``nbytes`` zero bytes.
    ///
    /// Args:
    ///     nbytes (int): size, > 0.
    ///     kind (str): ``"pageable"`` (host; peers use cross-memory attach, or a memfd with
    ///         ``shared=True``), ``"pinned"`` (shared host memory, page-locked for the GPU's
    ///         DMA) or ``"device"`` (GPU ``device``, CUDA IPC).
    ///     shared (bool): for ``"pageable"``: shared memory instead of cross-memory attach.
    ///     device (int): the GPU of ``"device"`` memory.
    ///
    /// Returns:
    ///     Region: the registration.
    ///
    /// Raises:
    ///     ArgumentError: a bad ``kind`` or size. DriverError: GPU memory could not be made.
    ///
    /// Example:
    ///     >>> r = agent.alloc(4096, kind="pinned")
    #[pyo3(signature = (nbytes, kind = "pageable", shared = false, device = 0))]
    fn alloc(
        &self,
        py: Python<'_>,
        nbytes: usize,
        kind: &str,
        shared: bool,
        device: u32,
    ) -> PyResult<PyRegion> {
        if nbytes == 0 {
            return Err(arg("nbytes=0: a registration holds at least one byte"));
        }
        let a = &self.agent;
        let r = py.allow_threads(|| match kind {
            "pageable" if shared => Ok(a.alloc_shared(nbytes, false)),
            "pageable" => Ok(a.register_host(vec![0u8; nbytes])),
            "pinned" => Ok(a.alloc_shared(nbytes, true)),
            "device" => ferry::cuda::DeviceBuffer::zeroed(device, nbytes)
                .map(|b| a.register_device(b))
                .map_err(errors::cuda),
            k => Err(arg(format!(
                "kind={k:?}: expected \"pageable\", \"pinned\" or \"device\""
            ))),
        })?;
        Ok(PyRegion {
            region: Some(Arc::new(r.map_err(agent_err)?)),
            lent: None,
        })
    }

    /// Registers an existing host array in place (no copy): peers reach its bytes by
    /// cross-memory attach, as ``alloc``'s ``"pageable"`` memory. The region keeps the array
    /// alive; deleting the region deregisters it and waits until no peer holds an import of
    /// it (a peer releases it by deleting its ``RemoteRegion``, closing, or exiting).
    ///
    /// Args:
    ///     array: a writable, C-contiguous host array (NumPy, a CPU torch tensor, anything
    ///         with ``__array_interface__`` or ``__dlpack__``) of at least one byte.
    ///
    /// Returns:
    ///     Region: the registration of the array's bytes.
    ///
    /// Raises:
    ///     ArgumentError: a read-only, strided, empty or GPU array.
    ///
    /// Example:
    ///     >>> kv = numpy.zeros(1 << 20, dtype=numpy.uint8)
    ///     >>> region = agent.register(kv)      # peers write into kv itself
    fn register(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<PyRegion> {
        let arr = crate::array::Arr::from_py(array, None)?;
        arr.writable("registered array")?;
        if !arr.kind().host_accessible() {
            return Err(arg(format!(
                "{}: register host memory (GPU memory: alloc(kind=\"device\"))",
                arr.describe()
            )));
        }
        if arr.raw.len == 0 || arr.raw.len != arr.numel() * arr.dtype.size {
            return Err(arg(format!(
                "{}: a registration is a non-empty C-contiguous array",
                arr.describe()
            )));
        }
        let raw = arr.raw;
        let a = &self.agent;
        // SAFETY: the array's memory, writable (checked), is kept alive by `keep` in the
        // region's `lent`, dropped after the region (`PyRegion`'s drop), and the agent by the
        // `Arc` kept there too, so the region goes first.
        let r = py
            .allow_threads(|| unsafe { a.register_raw(raw.addr as *mut u8, raw.len) })
            .map_err(agent_err)?;
        Ok(PyRegion {
            region: Some(Arc::new(r)),
            lent: Some((Arc::clone(a), arr.keep)),
        })
    }

    /// Connects to the agent whose socket is ``path`` (same host, same user).
    ///
    /// Args:
    ///     path (str): the peer agent's ``socket_path``.
    ///
    /// Returns:
    ///     Peer: the connection.
    ///
    /// Raises:
    ///     FerryError: nothing listens there, or the agent runs as another user.
    ///
    /// Example:
    ///     >>> peer = agent.connect(path)
    fn connect(&self, py: Python<'_>, path: &str) -> PyResult<PyPeer> {
        let peer = py
            .allow_threads(|| self.agent.connect(path))
            .map_err(agent_err)?;
        Ok(PyPeer { peer })
    }

    /// Serves peers of other hosts too: listens on TCP at ``addr`` for connections that
    /// prove ``key`` (the same given to their ``connect_tcp``; HMAC-SHA256 challenges both
    /// ways, the key never sent). Every region is then reachable from them, its bytes carried
    /// over the connection (device memory staged through host memory), unencrypted: a network
    /// the cluster trusts.
    ///
    /// Args:
    ///     addr (str): ``"host:port"`` to bind (port 0: one the kernel picks).
    ///     key (bytes): at least 16 bytes.
    ///
    /// Returns:
    ///     str: the address bound, ``"ip:port"``.
    ///
    /// Raises:
    ///     ArgumentError: a key shorter than 16 bytes, or the agent already listens.
    ///     FerryError: the bind failed.
    ///
    /// Example:
    ///     >>> at = agent.listen_tcp("0.0.0.0:0", key)
    fn listen_tcp(&self, py: Python<'_>, addr: &str, key: &[u8]) -> PyResult<String> {
        let at = py
            .allow_threads(|| self.agent.listen_tcp(addr, key))
            .map_err(agent_err)?;
        Ok(at.to_string())
    }

    /// Connects to the agent listening at ``addr`` (``listen_tcp``) on this or another host,
    /// proving ``key`` and checking that the agent holds it. Transfers then carry their bytes
    /// over the connection, one at a time, in order; one that breaks fails them. A transfer
    /// of at least 512 KiB is cut into parts carried by the connection's TCP streams at once.
    ///
    /// Args:
    ///     addr (str): ``"host:port"``.
    ///     key (bytes): the agent's key (at least 16 bytes).
    ///     streams (int | None): TCP streams, 1 to 16 (``None``: 4, or
    ///         ``$FERRY_AGENT_TCP_STREAMS`` where set; C's 0).
    ///
    /// Returns:
    ///     Peer: the connection.
    ///
    /// Raises:
    ///     ArgumentError: a key shorter than 16 bytes, ``streams`` out of range (0 and
    ///         negative included), ``$FERRY_AGENT_TCP_STREAMS`` not a whole number.
    ///         FerryError: nothing listens there, or the key is refused.
    ///
    /// Example:
    ///     >>> peer = agent.connect_tcp("10.0.0.2:7000", key)
    #[pyo3(signature = (addr, key, streams=None))]
    fn connect_tcp(
        &self,
        py: Python<'_>,
        addr: &str,
        key: &[u8],
        streams: Option<i64>,
    ) -> PyResult<PyPeer> {
        let streams = match streams {
            None => None,
            Some(n) => Some(
                usize::try_from(n).map_err(|_| arg(format!("streams={n}: 1 to 16 TCP streams")))?,
            ),
        };
        let peer = py
            .allow_threads(|| match streams {
                None => self.agent.connect_tcp(addr, key),
                Some(n) => self.agent.connect_tcp_streams(addr, key, n),
            })
            .map_err(agent_err)?;
        Ok(PyPeer { peer })
    }

    /// Writes ``local``'s bytes into the peer's ``remote``, one request for the whole list.
    /// Over TCP (``connect_tcp``) a transfer of at most 64 KiB on a connection with none queued
    /// runs in the call (the GIL released) and comes back done; larger ones return at once.
    ///
    /// Args:
    ///     remote (RemoteRegion): the destination.
    ///     local (Region): the source.
    ///     segments (list[tuple[int, int, int]]): ``(offset in remote, offset in local,
    ///         nbytes)`` each, all checked before any byte moves.
    ///     notify (bytes | None): a message the peer receives once the request is seen
    ///         complete.
    ///
    /// Returns:
    ///     Request: ``wait()``, ``done()``, ``await``.
    ///
    /// Raises:
    ///     ArgumentError: a segment outside its region. FerryError: the peer has exited.
    ///
    /// Example:
    ///     >>> agent.write(remote, local, [(0, 0, 4096)], notify=b"block 0").wait()
    #[pyo3(signature = (remote, local, segments, notify = None))]
    fn write(
        &self,
        py: Python<'_>,
        remote: &PyRemote,
        local: &PyRegion,
        segments: Vec<(u64, u64, u64)>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<PyRequest> {
        let segs = self::segments(segments);
        let req = py
            .allow_threads(|| {
                self.agent
                    .write(&remote.remote, local.region(), &segs, notify.as_deref())
            })
            .map_err(agent_err)?;
        Ok(PyRequest::new(req, Vec::new()))
    }

    /// Reads the peer's ``remote`` into ``local``: as ``write``, the other way; each segment
    /// is ``(offset in local, offset in remote, nbytes)``.
    ///
    /// Args:
    ///     local (Region): the destination.
    ///     remote (RemoteRegion): the source.
    ///     segments (list[tuple[int, int, int]]): ``(offset in local, offset in remote,
    ///         nbytes)`` each.
    ///     notify (bytes | None): a message for the peer once the request is seen complete.
    ///
    /// Returns:
    ///     Request: ``wait()``, ``done()``, ``await``.
    ///
    /// Raises:
    ///     ArgumentError: a segment outside its region. FerryError: the peer has exited.
    ///
    /// Example:
    ///     >>> agent.read(local, remote, [(0, 4096, 4096)]).wait()
    #[pyo3(signature = (local, remote, segments, notify = None))]
    fn read(
        &self,
        py: Python<'_>,
        local: &PyRegion,
        remote: &PyRemote,
        segments: Vec<(u64, u64, u64)>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<PyRequest> {
        let segs = self::segments(segments);
        let req = py
            .allow_threads(|| {
                self.agent
                    .read(local.region(), &remote.remote, &segs, notify.as_deref())
            })
            .map_err(agent_err)?;
        Ok(PyRequest::new(req, Vec::new()))
    }

    /// The next notification a peer sent, waiting at most ``timeout`` seconds.
    ///
    /// Args:
    ///     timeout (float): seconds to wait (0: only one already here).
    ///
    /// Returns:
    ///     tuple[str, bytes] | None: the sender's agent name and the message, or None.
    ///
    /// Example:
    ///     >>> agent.next_notification(timeout=1.0)
    ///     ('decode', b'block 0')
    #[pyo3(signature = (timeout = 0.0))]
    fn next_notification(
        &self,
        py: Python<'_>,
        timeout: f64,
    ) -> PyResult<Option<(String, Py<PyBytes>)>> {
        if !(timeout >= 0.0 && timeout.is_finite()) {
            return Err(arg(format!("timeout={timeout}: expected seconds >= 0")));
        }
        let got = py.allow_threads(|| {
            self.agent
                .next_notification(Duration::from_secs_f64(timeout))
        });
        Ok(got.map(|(from, msg)| (from, PyBytes::new(py, &msg).unbind())))
    }
}

#[pymethods]
impl PyRegion {
    /// The descriptor peers open (``Peer.open``), at most 109 bytes.
    #[getter]
    fn descriptor<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.region().descriptor().to_bytes())
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.region().len()
    }

    /// ``"pageable"``, ``"pinned"`` or ``"device"``.
    #[getter]
    fn kind(&self) -> &'static str {
        match self.region().kind() {
            MemKind::Device { .. } => "device",
            MemKind::Pageable => "pageable",
            _ => "pinned",
        }
    }

    /// The memory's address in this process (a device address for ``"device"`` memory).
    #[getter]
    fn ptr(&self) -> u64 {
        self.region().raw().addr
    }

    /// Copies ``nbytes`` bytes at ``offset`` out of the region.
    ///
    /// Args:
    ///     offset (int): first byte.
    ///     nbytes (int): how many.
    ///
    /// Returns:
    ///     bytes: a copy.
    ///
    /// Raises:
    ///     ArgumentError: a range outside the region.
    ///
    /// Example:
    ///     >>> region.read(0, 4)
    ///     b'\x00\x00\x00\x00'
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; nbytes];
        py.allow_threads(|| self.region().read_at(offset, &mut buf))
            .map_err(agent_err)?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Copies ``data`` into the region at ``offset``.
    ///
    /// Args:
    ///     offset (int): first byte.
    ///     data (bytes): what to write.
    ///
    /// Raises:
    ///     ArgumentError: a range outside the region.
    ///
    /// Example:
    ///     >>> region.write(0, b"abcd")
    fn write(&self, py: Python<'_>, offset: usize, data: Vec<u8>) -> PyResult<()> {
        py.allow_threads(|| self.region().write_at(offset, &data))
            .map_err(agent_err)
    }

    /// Deregisters now: transfers on it fail after this, and its descriptor is refused.
    ///
    /// Raises:
    ///     FerryError: a peer still holds an import of it.
    ///
    /// Example:
    ///     >>> region.deregister()
    fn deregister(&self) -> PyResult<()> {
        self.region().deregister().map_err(agent_err)
    }
}

#[pymethods]
impl PyPeer {
    /// The peer agent's name.
    #[getter]
    fn name(&self) -> String {
        self.peer.name().to_string()
    }

    /// The peer's process id.
    #[getter]
    fn pid(&self) -> u32 {
        self.peer.pid()
    }

    /// Whether the peer's process still runs.
    #[getter]
    fn alive(&self) -> bool {
        self.peer.is_alive()
    }

    /// Opens the peer's registration from its descriptor, after the peer confirms it.
    ///
    /// Args:
    ///     descriptor (bytes): a ``Region.descriptor`` of the peer's.
    ///
    /// Returns:
    ///     RemoteRegion: the peer's memory, for ``Agent.write`` and ``Agent.read``.
    ///
    /// Raises:
    ///     ArgumentError: not a descriptor, or another process's. FerryError: the peer no
    ///         longer holds it (deregistered) or refused it.
    ///
    /// Example:
    ///     >>> remote = peer.open(descriptor)
    fn open(&self, py: Python<'_>, descriptor: Vec<u8>) -> PyResult<PyRemote> {
        let d = Descriptor::from_bytes(&descriptor).ok_or_else(|| {
            arg(format!(
                "{} bytes that are not a descriptor",
                descriptor.len()
            ))
        })?;
        let remote = py
            .allow_threads(|| self.peer.import(&d))
            .map_err(agent_err)?;
        Ok(PyRemote {
            remote: Arc::new(remote),
        })
    }

    /// Sends a notification to the peer now.
    ///
    /// Args:
    ///     message (bytes): the message.
    ///
    /// Raises:
    ///     FerryError: the peer has exited.
    ///
    /// Example:
    ///     >>> peer.notify(b"ready")
    fn notify(&self, message: Vec<u8>) -> PyResult<()> {
        self.peer.notify(&message).map_err(agent_err)
    }
}

#[pymethods]
impl PyRemote {
    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.remote.len()
    }

    /// The descriptor it was opened from.
    #[getter]
    fn descriptor<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.remote.descriptor().to_bytes())
    }
}

/// Registers the classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAgent>()?;
    m.add_class::<PyRegion>()?;
    m.add_class::<PyPeer>()?;
    m.add_class::<PyRemote>()?;
    Ok(())
}
