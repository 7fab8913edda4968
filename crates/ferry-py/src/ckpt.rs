//! `load_safetensors` / `save_safetensors` through ferry's checkpoint module, and the
//! ferry-owned tensors a load returns (handed to PyTorch, NumPy or CuPy through DLPack
//! without a copy: the tensor keeps ferry's allocation alive).

use crate::array::{Arr, Held};
use crate::dlpack::{self, DlDataType, DlDevice};
use crate::dtype::{self, DType};
use crate::engine;
use crate::errors::{self, arg, CheckpointError};
use ferry::checkpoint::{
    self, Dest, LoadOptions, SaveOptions, SaveTensor, Target, TensorBuffer, Writer,
};
use ferry::file::{FileConfig, FileEngine};
use ferry::{MemKind, Memory, RawBuf};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The process's file engine for `device` (None: host memory only), made once.
pub(crate) fn file_engine(py: Python<'_>, device: Option<u32>) -> PyResult<Arc<FileEngine>> {
    static ENGINES: OnceLock<Mutex<HashMap<Option<u32>, Arc<FileEngine>>>> = OnceLock::new();
    let map = ENGINES.get_or_init(Default::default);
    if let Some(e) = map
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&device)
    {
        return Ok(e.clone());
    }
    let cfg = FileConfig::new();
    let e = match device {
        None => FileEngine::new(cfg),
        Some(o) => {
            let cuda: Arc<dyn ferry::Engine> = engine::cuda_engine(py, o)?;
            FileEngine::with_engine(cfg, cuda)
        }
    }
    .map_err(|e| errors::FerryError::new_err(e.to_string()))?;
    Ok(map
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(device)
        .or_insert_with(|| Arc::new(e))
        .clone())
}

/// `cuda:N` / `cuda` / `cpu` / `pinned` as a load target, and the GPU whose file engine
/// ([`file_engine`]) loads to it: the ordinal is named once, to that engine.
fn target(device: &str) -> PyResult<(Target, Option<u32>)> {
    match device {
        "cpu" => Ok((Target::Pageable, None)),
        "pinned" => Ok((Target::Pinned, None)),
        "cuda" => Ok((Target::Device, Some(0))),
        d => d
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(|o| (Target::Device, Some(o)))
            .ok_or_else(|| {
                arg(format!(
                    "device {d:?}: expected \"cpu\", \"pinned\" or \"cuda:N\""
                ))
            }),
    }
}

/// A tensor in memory ferry allocated (a loaded checkpoint's), as
/// ``load_safetensors(..., framework="ferry")`` returns it; not made directly.
///
/// Any framework takes it without a copy through ``__dlpack__`` (and NumPy, in host memory,
/// through ``__array_interface__``); it keeps ferry's allocation alive.
///
/// Example:
///     >>> buf = ferry.load_safetensors("m.safetensors", device="cpu", framework="ferry")["w"]
///     >>> buf.shape, buf.dtype, buf.device
///     ([2, 3], 'float32', 'cpu')
///     >>> numpy.asarray(buf)     # or torch.from_dlpack(buf)
#[pyclass(module = "ferry", name = "Buffer", frozen)]
pub(crate) struct PyBuffer {
    bufs: Arc<Vec<TensorBuffer>>,
    index: usize,
    offset: usize,
    len: usize,
    dtype: DType,
    shape: Vec<usize>,
    kind: MemKind,
}

impl PyBuffer {
    fn addr(&self) -> u64 {
        self.bufs[self.index].raw().addr + self.offset as u64
    }
    fn dl_device(&self) -> DlDevice {
        match self.kind {
            MemKind::Device { ordinal } => DlDevice {
                device_type: dlpack::CUDA,
                device_id: ordinal as i32,
            },
            _ => DlDevice {
                device_type: dlpack::CPU,
                device_id: 0,
            },
        }
    }
}

#[pymethods]
impl PyBuffer {
    /// list[int]: the dims.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }
    /// str: the element type's name (``float32``, ``bfloat16``, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name
    }
    /// int: the tensor's size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }
    /// str: where it lives: ``cpu``, ``pinned`` or ``cuda:N``.
    #[getter]
    fn device(&self) -> String {
        match self.kind {
            MemKind::Device { ordinal } => format!("cuda:{ordinal}"),
            MemKind::Pinned => "pinned".into(),
            _ => "cpu".into(),
        }
    }
    /// The DLPack device.
    ///
    /// Returns:
    ///     tuple[int, int]: ``(device type, device id)``: (1, 0) host, (3, 0) pinned host,
    ///     (2, N) GPU N.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.dl_device();
        (d.device_type, d.device_id)
    }
    /// A DLPack capsule over this memory (no copy; the capsule keeps the memory alive). The
    /// data is complete before the load returned, so no stream needs to wait.
    ///
    /// Args:
    ///     stream, max_version, dl_device, copy: as the DLPack protocol defines them.
    ///
    /// Returns:
    ///     PyCapsule: a ``dltensor`` capsule.
    ///
    /// Raises:
    ///     ArgumentError: a copy or another device asked for.
    ///
    /// Example:
    ///     >>> t = torch.from_dlpack(buf)
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<PyObject>,
        max_version: Option<PyObject>,
        dl_device: Option<PyObject>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        let _ = (stream, max_version, dl_device);
        if copy == Some(true) {
            return Err(arg("ferry.Buffer.__dlpack__: copy=True is not supported"));
        }
        let dtype = DlDataType {
            code: self.dtype.dl_code,
            bits: (self.dtype.size * 8) as u8,
            lanes: 1,
        };
        dlpack::export(
            py,
            Box::new(self.bufs.clone()),
            self.addr(),
            self.dl_device(),
            dtype,
            &self.shape,
        )
    }
    /// dict: NumPy's array interface (version 3), for host memory.
    ///
    /// Raises:
    ///     AttributeError: the buffer is in GPU memory (use ``__dlpack__``).
    #[getter]
    fn __array_interface__(&self, py: Python<'_>) -> PyResult<PyObject> {
        if !self.kind.host_accessible() {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "__array_interface__: the buffer is in GPU memory",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("shape", pyo3::types::PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", dtype::typestr(self.dtype))?;
        d.set_item("data", (self.addr(), false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d.into_any().unbind())
    }
    /// ``ferry.Buffer(dtype[shape], device)``.
    fn __repr__(&self) -> String {
        format!(
            "ferry.Buffer({}{:?}, {})",
            self.dtype.name,
            self.shape,
            self.device()
        )
    }
}

/// The compiled part of ``load_safetensors`` (use that): the tensors as ferry ``Buffer``s.
///
/// Args:
///     path (str | os.PathLike[str]): the file, or a sharded checkpoint's ``*.index.json``.
///     device (str): ``"cuda:N"``, ``"cuda"``, ``"cpu"`` or ``"pinned"``.
///     names (list[str] | None): only these tensors.
///
/// Returns:
///     list[tuple[str, Buffer]]: ``(name, buffer)`` in file order.
///
/// Raises:
///     ArgumentError: a bad argument (named with its value). CheckpointError: the file.
///
/// Example:
///     >>> ferry._ferry._load_safetensors("m.safetensors", "cpu", None)
#[pyfunction]
#[pyo3(
    signature = (path, device = None, names = None),
    text_signature = "(path, device='cuda:0', names=None)"
)]
pub(crate) fn _load_safetensors(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    names: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyList>> {
    let path = errors::path(path, "path")?;
    let device = match device {
        Some(d) => errors::string(d, "device")?,
        None => "cuda:0".to_string(),
    };
    let names: Option<Vec<String>> = match names.filter(|n| !n.is_none()) {
        None => None,
        Some(n) if n.is_instance_of::<pyo3::types::PyString>() => {
            return Err(arg(format!(
                "names={}: expected a list of tensor names, got one str",
                errors::shown(n)
            )))
        }
        Some(n) => Some(
            n.try_iter()
                .map_err(|_| {
                    arg(format!(
                        "names={}: expected a list of str (tensor names)",
                        errors::shown(n)
                    ))
                })?
                .map(|x| errors::string(&x?, "names[...]"))
                .collect::<PyResult<_>>()?,
        ),
    };
    let (target, gpu) = target(&device)?;
    let fe = file_engine(py, gpu)?;
    let mut opts = LoadOptions::new(target);
    if let Some(n) = names {
        opts = opts.names(n);
    }
    let ckpt = py
        .allow_threads(|| checkpoint::load(&fe, &path, &opts))
        .map_err(|e| checkpoint_err(py, e))?;
    let (bufs, tensors) = ckpt.into_parts();
    let bufs = Arc::new(bufs);
    let out = PyList::empty(py);
    for t in tensors {
        let dtype = dtype::from_safetensors(t.dtype).map_err(|m| {
            CheckpointError::new_err(format!("{}: tensor {}: {m}", path.display(), t.name))
        })?;
        let b = PyBuffer {
            bufs: bufs.clone(),
            index: t.buffer,
            offset: t.offset,
            len: t.len,
            dtype,
            shape: t.shape,
            kind: t.kind,
        };
        out.append((t.name, Py::new(py, b)?))?;
    }
    Ok(out.unbind())
}

/// The compiled part of ``load_safetensors(out=...)`` (use that).
///
/// Example:
///     >>> ferry._ferry._load_safetensors_into("m.safetensors", model.state_dict(), True)
///
/// Details: the tensors named by `out`'s keys into its
/// arrays (C-contiguous, writable, not overlapping; host, or one GPU), in place, nothing
/// allocated. A destination whose dtype, shape or byte count differs from its tensor's, or
/// that shares memory with another (`checkpoint::load_into` checks both), is an
/// `ArgumentError`, checked for all before a byte is read. `strict=False` leaves the arrays whose names the checkpoint lacks untouched (tied
/// weights that a file stores once) instead of raising `CheckpointError`; returns the names
/// loaded.
#[pyfunction]
#[pyo3(
    signature = (path, out, strict = None),
    text_signature = "(path, out, strict=True)"
)]
pub(crate) fn _load_safetensors_into(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    strict: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<String>> {
    let strict = errors::boolean(strict, "strict", true)?;
    let path = errors::path(path, "path")?;
    // The items first (converting an array may run Python code that changes the mapping).
    let items: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> = out
        .call_method0("items")
        .and_then(|it| it.try_iter()?.map(|kv| kv?.extract()).collect())
        .map_err(|_| arg("out must be a dict (or mapping) of tensor name -> array"))?;
    let mut arrs = Vec::with_capacity(items.len());
    let mut gpu: Option<u32> = None;
    for (k, v) in &items {
        let name: String = k
            .extract()
            .map_err(|_| arg("out's keys must be str (the tensors' names)"))?;
        let role = format!("out[{name:?}]");
        let a = Arr::from_py(v, None)?;
        a.writable(&role)?;
        let raw = crate::fileio::contiguous(&a, &role)?;
        let st = dtype::to_safetensors(a.dtype).map_err(|m| arg(format!("{role}: {m}")))?;
        if let MemKind::Device { ordinal } = a.kind() {
            if gpu.is_some_and(|g| g != ordinal) {
                return Err(arg(format!(
                    "{role} is on cuda:{ordinal}, an earlier array on cuda:{}: one load fills one GPU's arrays",
                    gpu.unwrap_or_default()
                )));
            }
            gpu = Some(ordinal);
        }
        arrs.push((name, st, a, raw));
    }
    let fe = file_engine(py, gpu)?;
    if !strict {
        let have: std::collections::HashSet<String> = py
            .allow_threads(|| checkpoint::entries(&fe, &path))
            .map_err(|e| checkpoint_err(py, e))?
            .into_iter()
            .map(|(_, t)| t.name)
            .collect();
        arrs.retain(|(n, ..)| have.contains(n));
    }
    // The arrays' producers' queued work (PyTorch's current stream) comes before the writes.
    let mut waited = Vec::new();
    for (_, _, a, _) in &arrs {
        crate::copy::after_producer(py, a, &mut waited)?;
    }
    let mut held: Vec<(String, ferry::checkpoint::Dtype, Vec<usize>, Held)> = arrs
        .iter()
        .map(|(n, st, a, raw)| (n.clone(), *st, a.shape.clone(), Held(*raw)))
        .collect();
    let r = py.allow_threads(|| {
        let mut dests: Vec<Dest<'_>> = held
            .iter_mut()
            .map(|(n, st, shape, h)| Dest::new(n.clone(), h).dtype(*st).shape(shape))
            .collect();
        checkpoint::load_into(&fe, &path, &mut dests)
    });
    // The arrays were held (`arrs`) until the load returned.
    let names = arrs.into_iter().map(|(n, ..)| n).collect();
    match r {
        Ok(_) => Ok(names),
        Err(e @ checkpoint::CheckpointError::Destination { .. }) => Err(arg(e.to_string())),
        Err(e) => Err(checkpoint_err(py, e)),
    }
}

/// Saves arrays as one safetensors file, or as a sharded checkpoint (GPU tensors copied out
/// on ferry's engines). The file appears only once complete; Ctrl-C stops the save between
/// its batches, removes the partial file and raises ``KeyboardInterrupt`` (the old file kept).
///
/// Args:
///     tensors (dict[str, array]): name -> array (host or GPU, C-contiguous).
///     path (str | os.PathLike[str]): the file to write (replaced if it exists); a folder, or
///         a name ending in ``.safetensors.index.json``, writes a sharded checkpoint (Hugging
///         Face's layout: ``model.safetensors.index.json`` and
///         ``model-0000i-of-0000N.safetensors`` in the folder).
///     metadata (dict[str, str] | None): the header's ``__metadata__`` (str -> str only).
///     max_shard_size (int | None): a sharded save's largest shard in bytes (default 5 GB).
///     non_blocking (bool): copy the tensors out (GPU tensors into pinned host memory, at the
///         link's rate) and return a ``SaveRequest`` at once: the tensors may change as soon as
///         it is returned; the files are written in the background (``wait()`` for them).
///     snapshot_bytes (int | None): with ``non_blocking=True``, the most host memory the copy
///         holds at once (default 1 GiB): a larger checkpoint is streamed through two windows
///         of half of it, one copied while the other is written, the call then also waiting
///         for writes while both are full.
///     keep_snapshot (bool): with ``non_blocking=True``, keep the snapshot's host memory once
///         written and reuse it for the next non-blocking save that fits in it (a loop saving
///         every N steps then pays the pinned allocation once: each later call waits for the
///         copy alone; set ``snapshot_bytes`` to at least the checkpoint's size for that). A
///         non-blocking save without it (the default) frees what earlier ones kept; with
///         ``non_blocking=False`` it is refused (a blocking save makes no snapshot).
///     fsync (bool): flush the files to the disk before they are renamed into place.
///     writer (str): ``"auto"`` (the default: buffered under 64 MiB; ``O_DIRECT`` when
///         fsynced or from host memory; else, from a GPU, ``"hybrid"``), ``"hybrid"``
///         (``O_DIRECT`` from the end beside buffered writes from the start into the page
///         cache's room before writeback, each at its own rate), ``"buffered"``
///         (parallel writes through the page cache) or
///         ``"direct"`` (``O_DIRECT`` from aligned windows; buffered where the file system
///         refuses it).
///
/// Returns:
///     SaveReport | SaveRequest: what the save did (bytes, seconds, the writer and why), or
///     with ``non_blocking=True`` the background write, whose ``wait()`` returns it.
///
/// Raises:
///     ArgumentError: a bad argument (named with its value): a name or metadata entry that is
///         not a str, an array that is not C-contiguous or of a dtype safetensors lacks.
///     CheckpointError: the file cannot be written (the message names it).
///     DriverError: a CUDA failure.
///
/// Example:
///     >>> ferry.save_safetensors({"w": numpy.ones((2, 3), numpy.float32)}, "m.safetensors",
///     ...                        metadata={"format": "np"})
#[pyfunction]
#[pyo3(
    signature = (tensors, path, metadata = None, max_shard_size = None, non_blocking = None,
                 snapshot_bytes = None, fsync = None, writer = None, keep_snapshot = None),
    text_signature = "(tensors, path, metadata=None, max_shard_size=None, non_blocking=False, \
                      snapshot_bytes=None, fsync=False, writer='auto', keep_snapshot=False)"
)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn save_safetensors(
    py: Python<'_>,
    tensors: &Bound<'_, PyAny>,
    path: &Bound<'_, PyAny>,
    metadata: Option<&Bound<'_, PyAny>>,
    max_shard_size: Option<&Bound<'_, PyAny>>,
    non_blocking: Option<&Bound<'_, PyAny>>,
    snapshot_bytes: Option<&Bound<'_, PyAny>>,
    fsync: Option<&Bound<'_, PyAny>>,
    writer: Option<&Bound<'_, PyAny>>,
    keep_snapshot: Option<&Bound<'_, PyAny>>,
) -> PyResult<Saved> {
    let non_blocking = errors::boolean(non_blocking, "non_blocking", false)?;
    let keep_snapshot = errors::boolean(keep_snapshot, "keep_snapshot", false)?;
    if keep_snapshot && !non_blocking {
        return Err(arg(
            "keep_snapshot=True: only a non_blocking=True save makes a snapshot to keep",
        ));
    }
    let fsync = errors::boolean(fsync, "fsync", false)?;
    let writer = match writer.filter(|w| !w.is_none()) {
        None => Writer::Auto,
        Some(w) => w
            .extract::<String>()
            .ok()
            .and_then(|k| Writer::from_key(&k))
            .ok_or_else(|| {
                let keys: Vec<String> = Writer::ALL
                    .iter()
                    .map(|w| format!("{:?}", w.key()))
                    .collect();
                arg(format!(
                    "writer={}: expected one of {}",
                    errors::shown(w),
                    keys.join(", ")
                ))
            })?,
    };
    let snapshot_bytes = match snapshot_bytes.filter(|m| !m.is_none()) {
        None => None,
        Some(m) => Some(m.extract::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
            arg(format!(
                "snapshot_bytes={}: expected a positive int (bytes)",
                errors::shown(m)
            ))
        })?),
    };
    let max_shard_size = match max_shard_size.filter(|m| !m.is_none()) {
        None => None,
        Some(m) => Some(m.extract::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
            arg(format!(
                "max_shard_size={}: expected a positive int (bytes)",
                errors::shown(m)
            ))
        })?),
    };
    let tensors = tensors.downcast::<PyDict>().map_err(|_| {
        arg(format!(
            "tensors: expected a dict of name -> array, got {}",
            tensors
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let path = errors::path(path, "path")?;
    let metadata = metadata
        .filter(|m| !m.is_none())
        .map(metadata_arg)
        .transpose()?;
    let mut arrs = Vec::with_capacity(tensors.len());
    let mut gpu = None;
    for (k, v) in tensors.iter() {
        let name: String = k.extract().map_err(|_| {
            arg(format!(
                "tensors: key {}: tensor names must be str",
                errors::shown(&k)
            ))
        })?;
        let a = Arr::from_py(&v, None)?;
        if a.layout.as_ref().is_some_and(|l| !l.is_contiguous()) {
            return Err(arg(format!(
                "tensor {name}: {} is not C-contiguous (save a contiguous copy)",
                a.describe()
            )));
        }
        let st = dtype::to_safetensors(a.dtype).map_err(|m| arg(format!("tensor {name}: {m}")))?;
        if let MemKind::Device { ordinal } = a.kind() {
            gpu.get_or_insert(ordinal);
        }
        arrs.push((name, st, a));
    }
    let fe = file_engine(py, gpu)?;
    // GPU tensors: their producers' queued work (PyTorch's current stream) comes first.
    let mut waited = Vec::new();
    for (_, _, a) in &arrs {
        crate::copy::after_producer(py, a, &mut waited)?;
    }
    // Ctrl-C: Python's handler only sets a flag; the save asks between its batches.
    let caught: Arc<Mutex<Option<PyErr>>> = Arc::default();
    let stash = caught.clone();
    let mut opts = SaveOptions::new().fsync(fsync).interrupt(move || {
        Python::with_gil(|py| match py.check_signals() {
            Ok(()) => false,
            Err(e) => {
                *stash.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                true
            }
        })
    });
    opts.writer = writer;
    for (k, v) in metadata.unwrap_or_default() {
        opts = opts.metadata(k, v);
    }
    // A folder: a sharded checkpoint in it.
    let path = if path.is_dir() {
        path.join("model.safetensors.index.json")
    } else {
        path
    };
    if let Some(n) = max_shard_size {
        opts = opts.shard_bytes(n);
    }
    let lent: Vec<(String, ferry::checkpoint::Dtype, Vec<usize>, Held)> = arrs
        .iter()
        .map(|(n, st, a)| {
            let raw = RawBuf {
                len: a.numel() * a.dtype.size,
                ..a.raw
            };
            (n.clone(), *st, a.shape.clone(), Held(raw))
        })
        .collect();
    if non_blocking {
        // Written on a thread of its own: no Ctrl-C check there (only the main thread may
        // ask Python for signals); `wait()` is where the caller is.
        let mut bg = SaveOptions::new().fsync(opts.fsync);
        bg.writer = opts.writer;
        bg.metadata = opts.metadata.clone();
        bg.shard_bytes = opts.shard_bytes;
        bg.snapshot_bytes = snapshot_bytes;
        bg.keep_snapshot = keep_snapshot;
        let handle = py
            .allow_threads(|| {
                let list: Vec<SaveTensor<'_>> = lent
                    .iter()
                    .map(|(n, st, shape, mem)| SaveTensor::new(n, *st, shape, mem))
                    .collect();
                checkpoint::Checkpoint::snapshot_save(fe.clone(), path, &list, bg)
            })
            .map_err(|e| checkpoint_err(py, e))?;
        drop(arrs);
        return Ok(Saved::Request(Py::new(
            py,
            SaveRequest {
                state: Mutex::new(Writing::Running(handle)),
            },
        )?));
    }
    let r = py.allow_threads(|| {
        let list: Vec<SaveTensor<'_>> = lent
            .iter()
            .map(|(n, st, shape, mem)| SaveTensor::new(n, *st, shape, mem))
            .collect();
        // An index path is a sharded save.
        checkpoint::save(&fe, &path, &list, &opts)
    });
    drop(arrs);
    match r {
        Ok(report) => Ok(Saved::Report(Py::new(py, PySaveReport::from(report))?)),
        Err(e @ checkpoint::CheckpointError::Interrupted { .. }) => {
            let signal = caught.lock().unwrap_or_else(PoisonError::into_inner).take();
            Err(signal.unwrap_or_else(|| checkpoint_err(py, e)))
        }
        Err(e) => Err(checkpoint_err(py, e)),
    }
}

/// What `save_safetensors` returns: the report of a blocking save, or a background one.
#[derive(IntoPyObject)]
pub(crate) enum Saved {
    Report(Py<PySaveReport>),
    Request(Py<SaveRequest>),
}

/// What a save did: ``save_safetensors`` returns it, or its ``SaveRequest``'s ``wait()``
/// (``str()`` of it is one line).
///
/// Example:
///     >>> r = ferry.save_safetensors(model.state_dict(), "ckpt")
///     >>> r.writer, r.bytes / r.seconds / 1e9   # ("hybrid", 7.9): the writer and GB/s
#[pyclass(module = "ferry", name = "SaveReport", frozen)]
pub(crate) struct PySaveReport {
    report: checkpoint::SaveReport,
}

impl From<checkpoint::SaveReport> for PySaveReport {
    fn from(report: checkpoint::SaveReport) -> Self {
        PySaveReport { report }
    }
}

#[pymethods]
impl PySaveReport {
    /// int: bytes written (headers included).
    #[getter]
    fn bytes(&self) -> u64 {
        self.report.bytes
    }
    /// int: tensors written.
    #[getter]
    fn tensors(&self) -> usize {
        self.report.tensors
    }
    /// int: safetensors files written (a sharded save's shards; its index not counted).
    #[getter]
    fn files(&self) -> usize {
        self.report.files
    }
    /// float: seconds from the files' creation to their rename (fsync included; for a
    /// non-blocking save, the background write's).
    #[getter]
    fn seconds(&self) -> f64 {
        self.report.seconds
    }
    /// bool: whether the files were flushed to the disk (``fsync=True``).
    #[getter]
    fn synced(&self) -> bool {
        self.report.synced
    }
    /// str: the writer that ran, as ``writer=`` names it: ``"buffered"``, ``"direct"`` or
    /// ``"hybrid"`` (what ``"auto"`` chose).
    #[getter]
    fn writer(&self) -> &'static str {
        self.report.writer.key()
    }
    /// str: why that writer (``"asked"``, the reason it was chosen, or why ``O_DIRECT`` was
    /// refused).
    #[getter]
    fn writer_note(&self) -> &str {
        &self.report.writer_note
    }
    /// int: of ``bytes``, those written with ``O_DIRECT``.
    #[getter]
    fn direct_bytes(&self) -> u64 {
        self.report.io.direct_bytes
    }
    /// int: of ``bytes``, those written through the page cache.
    #[getter]
    fn buffered_bytes(&self) -> u64 {
        self.report.io.buffered_bytes
    }
    /// int: the most host memory the save held at once (a non-blocking save's snapshot or
    /// the ``O_DIRECT`` writer's windows); 0 for a buffered save straight from the arrays.
    #[getter]
    fn snapshot_bytes(&self) -> u64 {
        self.report.snapshot_bytes
    }
    /// The library's one-line report (bytes, seconds and GB/s, the writer and why, the
    /// file engine's report).
    fn __str__(&self) -> String {
        self.report.to_string()
    }
    /// ``SaveReport(bytes=..., tensors=..., files=..., seconds=..., writer=...)``.
    fn __repr__(&self) -> String {
        format!(
            "SaveReport(bytes={}, tensors={}, files={}, seconds={:.4}, writer={:?})",
            self.report.bytes,
            self.report.tensors,
            self.report.files,
            self.report.seconds,
            self.writer()
        )
    }
}

/// A save running in the background (``save_safetensors(..., non_blocking=True)``): the
/// tensors were copied out when it was returned (they may be changed now); the files are
/// written on a thread of ferry's.
///
/// Example:
///     >>> req = ferry.save_safetensors(model.state_dict(), "ckpt.safetensors", non_blocking=True)
///     >>> optimizer.step()   # the tensors may change now
///     >>> report = req.wait()   # the file is complete (or the error is raised here)
#[pyclass(module = "ferry")]
pub(crate) struct SaveRequest {
    state: Mutex<Writing>,
}

/// A background save: the thread writing the snapshot, then how it ended.
enum Writing {
    Running(std::thread::JoinHandle<Result<checkpoint::SaveReport, checkpoint::CheckpointError>>),
    Saved(Py<PySaveReport>),
    Failed(PyErr),
    /// Only while a `wait()` joins the thread.
    Joining,
}

impl Drop for SaveRequest {
    /// Dropped unwaited: the write is finished first (a thread stopped at the process's exit
    /// would leave its temporary file).
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Writing::Running(h) = std::mem::replace(state, Writing::Joining) {
            let _ = h.join();
        }
    }
}

#[pymethods]
impl SaveRequest {
    /// Waits until the files are written (the GIL released meanwhile).
    ///
    /// Returns:
    ///     SaveReport: what the save did; a later ``wait()`` returns it again at once.
    ///
    /// Raises:
    ///     CheckpointError: the write failed (the message names the file); a later
    ///         ``wait()`` raises it again.
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PySaveReport>> {
        loop {
            let running = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                match std::mem::replace(&mut *state, Writing::Joining) {
                    Writing::Saved(r) => {
                        let out = r.clone_ref(py);
                        *state = Writing::Saved(r);
                        return Ok(out);
                    }
                    Writing::Failed(e) => {
                        let err = e.clone_ref(py);
                        *state = Writing::Failed(e);
                        return Err(err);
                    }
                    Writing::Joining => None,
                    Writing::Running(h) => Some(h),
                }
            };
            let Some(h) = running else {
                // Another thread's `wait()` is joining the writer: wait for its outcome (the
                // lock is never held while the GIL is released).
                py.allow_threads(|| std::thread::sleep(std::time::Duration::from_millis(1)));
                continue;
            };
            let ended = match py.allow_threads(|| h.join()) {
                Ok(Ok(r)) => Py::new(py, PySaveReport::from(r)).map(Writing::Saved),
                Ok(Err(e)) => Ok(Writing::Failed(checkpoint_err(py, e))),
                Err(_) => Ok(Writing::Failed(errors::FerryError::new_err(
                    "the thread writing the checkpoint panicked",
                ))),
            };
            *self.state.lock().unwrap_or_else(PoisonError::into_inner) =
                ended.unwrap_or_else(Writing::Failed);
        }
    }

    /// Whether the write has ended (``wait()`` then returns at once).
    ///
    /// Returns:
    ///     bool: True once the files are written or the write failed.
    fn done(&self) -> bool {
        match &*self.state.lock().unwrap_or_else(PoisonError::into_inner) {
            Writing::Running(h) => h.is_finished(),
            Writing::Joining => false,
            Writing::Saved(_) | Writing::Failed(_) => true,
        }
    }
}

/// `metadata=`: a dict of str -> str (safetensors stores only strings); a key or value of
/// another type is an `ArgumentError` naming it.
fn metadata_arg(m: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    let d = m.downcast::<PyDict>().map_err(|_| {
        arg(format!(
            "metadata={}: expected a dict of str -> str",
            errors::shown(m)
        ))
    })?;
    d.iter()
        .map(|(k, v)| {
            let key: String = k.extract().map_err(|_| {
                arg(format!(
                    "metadata key {}: expected a str (safetensors metadata is str -> str)",
                    errors::shown(&k)
                ))
            })?;
            let val: String = v.extract().map_err(|_| {
                arg(format!(
                    "metadata[{key:?}] = {}: expected a str (safetensors metadata is str -> str; \
                     convert it with str() or json.dumps())",
                    errors::shown(&v)
                ))
            })?;
            Ok((key, val))
        })
        .collect()
}

/// The exception for a checkpoint error: a `CheckpointError`, which for a file that cannot be
/// opened, read or written is also Python's own `OSError` subclass for the reason
/// (`except FileNotFoundError` and `except ferry.CheckpointError` both catch a missing file),
/// as `read_file` / `write_file` raise it.
fn checkpoint_err(py: Python<'_>, e: checkpoint::CheckpointError) -> PyErr {
    use ferry::file::FileError;
    use std::io::ErrorKind;
    let msg = e.to_string();
    let fe = match &e {
        checkpoint::CheckpointError::File { source, .. } => Some(source),
        checkpoint::CheckpointError::Shard { source, .. } => Some(&**source),
        _ => None,
    };
    if let checkpoint::CheckpointError::Replace { kind, .. } = &e {
        return match errors::checkpoint_os_type(py, *kind) {
            Ok(Some(ty)) => PyErr::from_type(ty, msg),
            Ok(None) => CheckpointError::new_err(msg),
            Err(err) => err,
        };
    }
    let kind = match fe {
        // Refused after opening as not a regular file: a directory is still one.
        Some(FileError::Open { path, .. }) if path.is_dir() => Some(ErrorKind::IsADirectory),
        Some(FileError::Open { kind, .. } | FileError::Io { kind, .. }) => Some(*kind),
        _ => None,
    };
    match kind.and_then(|k| errors::checkpoint_os_type(py, k).transpose()) {
        Some(Ok(ty)) => PyErr::from_type(ty, msg),
        Some(Err(err)) => err,
        None => CheckpointError::new_err(msg),
    }
}
