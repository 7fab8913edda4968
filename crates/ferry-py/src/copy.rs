//! `ferry.copy_`, `ferry.gather` and the request they return.

use crate::array::Arr;
use crate::engine::{self, Eng};
use crate::errors::{self, arg};
use ferry::{Job, MemKind, Op, Segment};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex, PoisonError};

/// A copy in flight (or done), returned by ``copy_`` and ``gather``.
///
/// It holds the source and destination arrays until the copy completes; dropping an
/// unfinished request waits for it. Not made directly.
///
/// Methods: ``wait()`` (block until done, raise its error), ``done()`` (poll), and
/// ``await request`` (wait on the event loop's default executor).
///
/// Example:
///     >>> req = ferry.copy_(dst, src, non_blocking=True)
///     >>> req.done()
///     False
///     >>> req.wait()
#[pyclass(module = "ferry", name = "Request")]
pub(crate) struct PyRequest {
    state: Mutex<State>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) req: Option<ferry::Request>,
    result: Option<Result<(), ferry::RequestError>>,
    keep: Vec<PyObject>,
}

impl PyRequest {
    pub(crate) fn new(req: ferry::Request, keep: Vec<PyObject>) -> PyRequest {
        PyRequest {
            state: Mutex::new(State {
                req: Some(req),
                result: None,
                keep,
            }),
        }
    }
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// Stores the outcome and lets go of the arrays; raises a failure.
    pub(crate) fn finish(&self, r: Result<(), ferry::RequestError>) -> PyResult<()> {
        let keep = {
            let mut s = self.lock();
            s.result = Some(r.clone());
            std::mem::take(&mut s.keep)
        };
        drop(keep);
        r.map_err(|e| errors::request(&e))
    }
}

#[pymethods]
impl PyRequest {
    /// Blocks (without the GIL) until the copy completes.
    ///
    /// Returns:
    ///     None. Waiting again returns (or raises) the same outcome at once.
    ///
    /// Raises:
    ///     DriverError: the CUDA driver failed the copy. FerryError: any other failure, or a
    ///         request another thread is waiting for.
    ///
    /// Example:
    ///     >>> ferry.copy_(dst, src, non_blocking=True).wait()
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let req = {
            let mut s = self.lock();
            if let Some(r) = &s.result {
                return r.clone().map_err(|e| errors::request(&e));
            }
            match s.req.take() {
                Some(req) => req,
                None => {
                    return Err(errors::FerryError::new_err(
                        "request is being waited for by another thread",
                    ))
                }
            }
        };
        let r = py.allow_threads(move || req.wait());
        self.finish(r)
    }
    /// Polls the copy without blocking.
    ///
    /// Returns:
    ///     bool: True once the copy completed, successfully or not (a failure is raised by
    ///     ``wait()``).
    ///
    /// Example:
    ///     >>> while not req.done(): do_other_work()
    fn done(&self) -> bool {
        let r = {
            let mut s = self.lock();
            if s.result.is_some() {
                return true;
            }
            match s.req.as_mut().map(|r| r.try_wait()) {
                Some(Some(r)) => {
                    s.req = None;
                    r
                }
                _ => return false,
            }
        };
        // A failure stays stored for `wait()` to raise.
        let _ = self.finish(r);
        true
    }
    /// ``await request``: waits (as ``wait()``) on the running event loop's default executor.
    ///
    /// Returns:
    ///     An iterator for ``await``; the await gives None or raises as ``wait()``.
    ///
    /// Raises:
    ///     RuntimeError: no event loop is running.
    ///
    /// Example:
    ///     >>> await ferry.copy_(dst, src, non_blocking=True)
    fn __await__(slf: Bound<'_, Self>) -> PyResult<PyObject> {
        let py = slf.py();
        let lp = py.import("asyncio")?.call_method0("get_running_loop")?;
        let fut = lp.call_method1("run_in_executor", (py.None(), slf.getattr("wait")?))?;
        Ok(fut.call_method0("__await__")?.unbind())
    }
    /// ``ferry.Request(pending)``, ``(done)`` or ``(failed: ...)``; a request that completed
    /// since it was last asked says so (the same check as ``done()``).
    fn __repr__(&self) -> String {
        self.done();
        let s = self.lock();
        match &s.result {
            None => "ferry.Request(pending)".into(),
            Some(Ok(())) => "ferry.Request(done)".into(),
            Some(Err(e)) => format!("ferry.Request(failed: {e})"),
        }
    }
}

impl Drop for PyRequest {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(req) = s.req.take() {
            // The arrays must outlive the copy: wait here, without the GIL.
            let _ = Python::with_gil(|py| py.allow_threads(move || req.wait()));
        }
    }
}

/// Submits `job` on `eng` (on the caller's CUDA stream `stream` if given) and returns the
/// request, waited for unless `non_blocking`.
fn run(
    py: Python<'_>,
    eng: &Eng,
    job: Job,
    keep: Vec<PyObject>,
    non_blocking: bool,
    stream: Option<usize>,
) -> PyResult<PyRequest> {
    let eng = eng.clone();
    let submitted = py.allow_threads(move || -> Result<_, ferry::SubmitError> {
        let req = match (&eng, stream) {
            (Eng::Cuda(c), Some(s)) => {
                // SAFETY: the caller passed a live stream handle of this device's primary
                // context (PyTorch's and CuPy's streams are), alive for this call; the
                // stream engine is dropped before return. The job's buffers are the arrays
                // held in `keep` until the request completes (`PyRequest`), and Python code
                // is trusted, as with PyTorch's own copies, not to touch them meanwhile.
                unsafe { ferry::Engine::submit_raw(&c.on_raw_stream(s as _), job)? }
            }
            // SAFETY: as above: the arrays stay alive and untouched until completion.
            _ => unsafe { ferry::Engine::submit_raw(&*eng.dyn_engine(), job)? },
        };
        Ok(if non_blocking {
            Ok(req)
        } else {
            Err(req.wait())
        })
    });
    into_request(submitted, keep)
}

/// The `stream=` argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StreamArg {
    /// None: PyTorch's current stream when a PyTorch GPU tensor takes part, else the legacy
    /// default stream, as the CUDA array-interchange protocols assume.
    Auto,
    /// `"ferry"`: ferry's own streams, ordered with nothing (the caller orders its work).
    Own,
    /// An int: this stream handle (`torch.cuda.current_stream().cuda_stream`).
    Raw(usize),
}

impl StreamArg {
    /// The stream handle given as an int, if one was (DLPack producers synchronise with it).
    pub(crate) fn raw(&self) -> Option<usize> {
        match *self {
            StreamArg::Raw(s) => Some(s),
            _ => None,
        }
    }
}

/// Reads `stream=`.
pub(crate) fn stream_arg(stream: Option<&Bound<'_, PyAny>>) -> PyResult<StreamArg> {
    let Some(s) = stream.filter(|s| !s.is_none()) else {
        return Ok(StreamArg::Auto);
    };
    if let Ok(n) = s.extract::<usize>() {
        return Ok(StreamArg::Raw(n));
    }
    if s.extract::<String>().is_ok_and(|t| t == "ferry") {
        return Ok(StreamArg::Own);
    }
    Err(arg(format!(
        "stream={}: expected None (the current stream), a CUDA stream handle (an int 0 or \
         more) or \"ferry\" (ferry's own streams)",
        errors::shown(s)
    )))
}

/// The stream a copy on `eng` runs in (None: the engine's own streams).
pub(crate) fn pick_stream(
    py: Python<'_>,
    eng: &Eng,
    a: StreamArg,
    torch_gpu: bool,
) -> PyResult<Option<usize>> {
    match (eng, a) {
        (Eng::Cpu(_), StreamArg::Raw(_)) => Err(arg(
            "stream= needs a copy that involves GPU memory (a CUDA engine)",
        )),
        (Eng::Cpu(_), _) | (_, StreamArg::Own) => Ok(None),
        (Eng::Cuda(_), StreamArg::Raw(s)) => Ok(Some(s)),
        (Eng::Cuda(c), StreamArg::Auto) if torch_gpu => torch_stream(py, c.ordinal()).map(Some),
        (Eng::Cuda(_), StreamArg::Auto) => Ok(Some(0)),
    }
}

/// PyTorch's current stream on device `ordinal` (its raw handle).
pub(crate) fn torch_stream(py: Python<'_>, ordinal: u32) -> PyResult<usize> {
    static RAW: pyo3::sync::GILOnceCell<PyObject> = pyo3::sync::GILOnceCell::new();
    let f = RAW.get_or_try_init(py, || -> PyResult<PyObject> {
        let torch = py.import("torch")?;
        // The private accessor returns the handle without making a Stream object; the public
        // one is the fallback.
        match torch.getattr("_C")?.getattr("_cuda_getCurrentRawStream") {
            Ok(f) => Ok(f.unbind()),
            Err(_) => Ok(py
                .eval(
                    c"lambda d: __import__('torch').cuda.current_stream(d).cuda_stream",
                    None,
                    None,
                )?
                .unbind()),
        }
    })?;
    f.call1(py, (ordinal,))?.extract(py)
}

/// Requests that complete when the producers' streams (`__cuda_array_interface__`'s `stream`)
/// reach the point they hold now: events recorded there, which the copy waits for on the GPU
/// (no host wait). None for an array whose producer asked for no synchronization, or on the
/// stream the copy itself runs in (`on`), which orders it already.
pub(crate) fn producer_waits(
    eng: &Eng,
    arrs: &[&Arr],
    on: Option<usize>,
) -> PyResult<Vec<ferry::Request>> {
    let Eng::Cuda(c) = eng else {
        return Ok(Vec::new());
    };
    arrs.iter()
        .filter_map(|a| a.stream)
        // The null stream (0) is the legacy default stream (1).
        .filter(|&s| Some(s) != on && !(s == 1 && on == Some(0)))
        .map(|s| {
            // SAFETY: the producer named its stream in the CUDA array interface: a live stream
            // of the device's primary context while it exports the array (CuPy's and Numba's
            // are), or the driver's legacy (1) or per-thread (2) default stream handle, the
            // latter this thread's, which calls this.
            unsafe { c.record_raw(s as _) }
                .map_err(|e| errors::DriverError::new_err(format!("stream {s:#x}: {e}")))
        })
        .collect()
}

/// The job, after the requests.
fn after_all(mut job: Job, reqs: &[ferry::Request]) -> Job {
    for r in reqs {
        job = job.after(r);
    }
    job
}

/// Waits on the host for the work a device array's producer queued so far, for a blocking
/// call that reads or writes it on ferry's own streams: PyTorch's current stream for a PyTorch
/// tensor, the stream its `__cuda_array_interface__` names, else the legacy default stream
/// (a DLPack producer asked with `stream=1` orders its export there). Nothing for host
/// memory, or for a (device, stream) of `waited` (already waited for by this call; added).
pub(crate) fn after_producer(
    py: Python<'_>,
    a: &Arr,
    waited: &mut Vec<(u32, usize)>,
) -> PyResult<()> {
    let MemKind::Device { ordinal } = a.kind() else {
        return Ok(());
    };
    let stream = match (a.torch_gpu, a.stream) {
        (true, _) => torch_stream(py, ordinal)?,
        (false, Some(s)) => s,
        (false, None) => 1,
    };
    if waited.contains(&(ordinal, stream)) {
        return Ok(());
    }
    waited.push((ordinal, stream));
    let eng = engine::cuda_engine(py, ordinal)?;
    py.allow_threads(|| {
        // SAFETY: PyTorch's current stream, the stream the array's producer named, or the
        // driver's legacy default stream handle (1): each a live stream of the device's
        // primary context for this call (PyTorch's and CuPy's are).
        let req = unsafe { eng.record_raw(stream as _) }.map_err(|e| e.to_string())?;
        req.wait().map_err(|e| e.to_string())
    })
    .map_err(|e| {
        errors::DriverError::new_err(format!(
            "waiting for the producer's stream {stream:#x} of {}: {e}",
            a.describe()
        ))
    })
}

/// Copies ``src`` into ``dst`` (as ``tensor.copy_``) on ferry's engines: host or GPU memory,
/// strided arrays merged into the fewest, largest runs.
///
/// Args:
///     dst: a writable array (PyTorch, NumPy, CuPy, or any with ``__dlpack__``,
///         ``__array_interface__`` or ``__cuda_array_interface__``), no two elements sharing
///         memory.
///     src: an array of the same shape and dtype (no broadcasting, no conversion), not
///         overlapping ``dst``.
///     non_blocking (bool): return at once with a pending ``Request`` (the arrays are held
///         until it completes).
///     engine (CpuEngine | CudaEngine | None): default: the CUDA engine of the GPU that holds
///         either array, else the CPU engine.
///     stream (int | str | None): None: PyTorch's current stream for a PyTorch GPU tensor,
///         else the legacy default stream; an int: that CUDA stream handle; ``"ferry"``:
///         ferry's own streams (ordered with nothing).
///
/// Returns:
///     Request: done unless ``non_blocking``.
///
/// Raises:
///     ArgumentError: shapes or dtypes differ, a read-only or self-overlapping destination,
///         source and destination sharing bytes (offsets named), an object that is not an
///         array, a bad ``engine`` or ``stream``.
///     DriverError: the CUDA driver failed. FerryError: any other failure.
///
/// Example:
///     >>> src = numpy.arange(12, dtype=numpy.float32).reshape(3, 4)
///     >>> dst = numpy.empty((4, 3), dtype=numpy.float32).T
///     >>> ferry.copy_(dst, src)
///     ferry.Request(done)
#[pyfunction]
#[pyo3(
    signature = (dst, src, non_blocking = None, engine = None, stream = None),
    text_signature = "(dst, src, non_blocking=False, engine=None, stream=None)"
)]
pub(crate) fn copy_(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    non_blocking: Option<&Bound<'_, PyAny>>,
    engine: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyRequest> {
    let non_blocking = errors::boolean(non_blocking, "non_blocking", false)?;
    let sa = stream_arg(stream)?;
    let dl_stream = sa.raw();
    let mut d = Arr::from_py(dst, dl_stream)?;
    let mut s = Arr::from_py(src, dl_stream)?;
    d.writable("destination")?;
    if d.shape != s.shape || d.dtype != s.dtype {
        return Err(arg(format!(
            "shape or dtype mismatch: destination {}, source {} (ferry.copy_ neither broadcasts nor converts)",
            d.describe(),
            s.describe()
        )));
    }
    let eng = engine::from_arg(py, engine, &[d.kind(), s.kind()])?;
    let stream = pick_stream(py, &eng, sa, d.torch_gpu || s.torch_gpu)?;
    let mut keep = std::mem::take(&mut d.keep);
    keep.append(&mut s.keep);
    let (Some(dl), Some(sl)) = (d.layout, s.layout) else {
        return Ok(PyRequest::new(ferry::Request::ready(Ok(())), Vec::new()));
    };
    if !dl.is_non_overlapping() {
        return Err(arg(format!(
            "destination {} has overlapping elements (a zero or overlapping stride)",
            d.describe()
        )));
    }
    // Host arrays stay as described (pageable unless ferry allocated them): the engine asks
    // the driver whether they are page-locked where the answer can change the copy's path
    // (`CudaEngine::host_kind`); a small copy takes the same driver call either way, and asking
    // here cost every call a driver query.
    let waits = producer_waits(&eng, &[&d, &s], stream)?;
    run(
        py,
        &eng,
        after_all(Job::copy(d.raw, dl, s.raw, sl), &waits),
        keep,
        non_blocking,
        stream,
    )
}

/// Gathers rows: row ``index[i]`` of the 2-D ``src`` into row ``i`` of ``out``, as one
/// request (a segment list), as ``torch.index_select(src, 0, index, out=out)``.
///
/// Args:
///     src: a 2-D array whose rows are contiguous (host or GPU).
///     index: a 1-D ``int64`` array in host memory; every entry in ``0 .. len(src)``.
///     out: a writable 2-D array of ``src``'s dtype, shape ``(len(index), src.shape[1])``.
///     non_blocking (bool): return at once with a pending ``Request``.
///     engine (CpuEngine | CudaEngine | None): as for ``copy_``.
///     stream (int | str | None): as for ``copy_``.
///
/// Returns:
///     Request: done unless ``non_blocking``.
///
/// Raises:
///     ArgumentError: wrong shapes or dtypes, an index out of range (its position and value
///         named), rows that are not contiguous.
///     DriverError: the CUDA driver failed. FerryError: any other failure.
///
/// Example:
///     >>> table = numpy.arange(20, dtype=numpy.float32).reshape(10, 2)
///     >>> out = numpy.empty((2, 2), dtype=numpy.float32)
///     >>> ferry.gather(table, numpy.array([7, 1]), out).wait()
#[pyfunction]
#[pyo3(
    signature = (src, index, out, non_blocking = None, engine = None, stream = None),
    text_signature = "(src, index, out, non_blocking=False, engine=None, stream=None)"
)]
pub(crate) fn gather(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    index: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    non_blocking: Option<&Bound<'_, PyAny>>,
    engine: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyRequest> {
    let non_blocking = errors::boolean(non_blocking, "non_blocking", false)?;
    let sa = stream_arg(stream)?;
    let dl_stream = sa.raw();
    let mut s = Arr::from_py(src, dl_stream)?;
    let mut o = Arr::from_py(out, dl_stream)?;
    let idx = Arr::from_py(index, None)?;
    o.writable("out")?;
    if s.shape.len() != 2 || o.shape.len() != 2 {
        return Err(arg(format!(
            "gather takes 2-D src and out, got src {} and out {}",
            s.describe(),
            o.describe()
        )));
    }
    if idx.shape.len() != 1 || idx.dtype.name != "int64" || !idx.raw.kind.host_accessible() {
        return Err(arg(format!(
            "index must be a 1-D int64 array in host memory, got {}",
            idx.describe()
        )));
    }
    let n = idx.shape[0];
    if o.dtype != s.dtype || o.shape != [n, s.shape[1]] {
        return Err(arg(format!(
            "out must be {}[{n}, {}], got {}",
            s.dtype.name,
            s.shape[1],
            o.describe()
        )));
    }
    let eng = engine::from_arg(py, engine, &[o.kind(), s.kind()])?;
    let stream = pick_stream(py, &eng, sa, o.torch_gpu || s.torch_gpu)?;
    let rows = s.shape[0];
    let mut keep = std::mem::take(&mut o.keep);
    keep.append(&mut s.keep);
    // Every index checked first, also where there is nothing to copy (src of 0 rows or 0
    // columns once returned success with its index unread and `out` untouched).
    let mut picked = Vec::with_capacity(n);
    if let Some(il) = idx.layout {
        let i_step = il.strides()[0];
        for i in 0..n {
            // SAFETY: `idx` is host memory kept alive by `index` (borrowed for this call), and
            // element `i` lies inside its layout (i < dims[0]); read unaligned as int64.
            let v =
                unsafe { ((idx.raw.addr as usize + i * i_step) as *const i64).read_unaligned() };
            let r = usize::try_from(v)
                .ok()
                .filter(|&r| r < rows)
                .ok_or_else(|| arg(format!("index[{i}] = {v} is outside src's {rows} rows")))?;
            picked.push(r);
        }
    }
    let (Some(sl), Some(ol)) = (s.layout, o.layout) else {
        return Ok(PyRequest::new(ferry::Request::ready(Ok(())), Vec::new()));
    };
    let row = s.shape[1] * s.dtype.size;
    let inner = |l: &ferry::Layout| l.dims()[1] == 1 || l.strides()[1] == l.elem_size();
    if !inner(&sl) || !inner(&ol) {
        return Err(arg(
            "gather needs src and out rows that are contiguous (last stride 1)",
        ));
    }
    let (s_pitch, o_pitch) = (sl.strides()[0], ol.strides()[0]);
    let segs: Vec<Segment> = picked
        .iter()
        .enumerate()
        .map(|(i, &r)| Segment::new((i * o_pitch) as u64, (r * s_pitch) as u64, row as u64))
        .collect();
    // As in `copy_`, the engine asks the driver whether host arrays are page-locked.
    let job = Job {
        dst: o.raw,
        src: Some(s.raw),
        op: Op::Segments(Arc::from(segs)),
        after: producer_waits(&eng, &[&o, &s], stream)?,
    };
    run(py, &eng, job, keep, non_blocking, stream)
}

/// The Python request of a submission made with the GIL released: `Ok(request)` when the call
/// was non-blocking, `Err(result)` when it already waited (its outcome raised here, or a done
/// request returned). One tail for every call that submits through the engine.
pub(crate) fn into_request(
    submitted: Result<Result<ferry::Request, Result<(), ferry::RequestError>>, ferry::SubmitError>,
    keep: Vec<PyObject>,
) -> PyResult<PyRequest> {
    match submitted.map_err(errors::submit)? {
        Ok(req) => Ok(PyRequest::new(req, keep)),
        Err(waited) => {
            let out = PyRequest::new(ferry::Request::ready(Ok(())), keep);
            out.lock().req = None;
            out.finish(waited)?;
            Ok(out)
        }
    }
}
