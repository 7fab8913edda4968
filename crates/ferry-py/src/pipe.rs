//! `ferry.pipeline(src, out, stage, chunk_bytes=1 << 20, slots=3, engine=None)`: ferry's
//! pipeline ([`ferry::pipeline::CpuPipeline`], or [`ferry::pipeline::CudaPipeline`] on a CUDA
//! engine) with a Python stage.
//!
//! `src` (any array `copy_` takes, strided too) is cut into chunks of `chunk_bytes` (a strided
//! source: whole rows of its outermost dimension); each chunk is copied into one of `slots`
//! input slots, the stage runs on it, and its output slot (as many bytes as its input) is
//! copied to `out` (a C-contiguous, writable array with as many bytes as `src`) at the chunk's
//! offset. The engine: `engine=`, else a GPU's when `src` or `out` is in its memory, else the
//! CPU's.
//!
//! CPU engine: `stage(inp, out, index)` gets 1-D `uint8` NumPy arrays viewing the slots without
//! a copy (`.view(dtype)` reinterprets them), host arrays only; it runs on one of ferry's
//! threads, holding the GIL only for the call. CUDA engine: `stage(inp, out, index, stream)`
//! gets device slots (`_DeviceSlot`, see `pipe_gpu`) and the compute stream's handle, enqueues
//! its work there and returns; it runs on the calling thread, the host never waiting for a
//! chunk except to bound the work queued ahead (and, before the run, for the work the GPU
//! arrays' producers queued: PyTorch's current stream, see `copy::after_producer`). Either way the slots are valid only during the
//! call: the pipeline reuses them (a view still referenced after the call fails the pipeline
//! with an `ArgumentError`), and ferry's copies and waits run with the GIL released. An
//! exception in the stage stops the pipeline (nothing more submitted, everything in flight
//! waited for) and is re-raised with `chunk` (the chunk's index) set on it and, on Python
//! 3.11+, a note.

use crate::array::{Arr, Held};
use crate::copy::after_producer;
use crate::engine::{self, Eng};
use crate::errors::{self, arg};
use ferry::cuda::CudaEngine;
use ferry::pipeline::{
    CpuPipeline, CudaPipeline, Dest, GpuChunk, PipelineConfig, PipelineError, Source,
};
use ferry::CpuEngine;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A pipeline's host slot, as a stage's NumPy views see it (their ``.base``): 1-D ``uint8``,
/// valid during the stage's call only; made by ``pipeline``, not directly.
///
/// Example:
///     >>> def stage(inp, out, i): out[:] = inp     # inp.base is a _Slot
#[pyclass(module = "ferry", name = "_Slot", frozen)]
struct Slot {
    addr: usize,
    len: usize,
    readonly: bool,
    over: AtomicBool,
}

#[pymethods]
impl Slot {
    /// dict: NumPy's array interface (version 3) over the slot's bytes.
    ///
    /// Raises:
    ///     ArgumentError: the stage's call is over (the slot is reused; copy the data instead).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.over.load(Ordering::Acquire) {
            return Err(arg(
                "a pipeline slot is only valid during its stage's call (copy the data instead)",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.addr, self.readonly))?;
        Ok(d)
    }
}

/// Refuses arrays outside host memory.
fn host(a: &Arr, what: &str) -> PyResult<()> {
    if a.kind().host_accessible() {
        Ok(())
    } else {
        Err(arg(format!(
            "{what} {} is not in host memory: the CPU engine's pipeline takes host arrays \
             (pass engine=ferry.CudaEngine(n) for a GPU's)",
            a.describe()
        )))
    }
}

/// Runs ``stage`` over ``src`` in chunks through ferry's double/triple-buffered pipeline:
/// chunk N+1 is copied in while the stage computes chunk N and chunk N-1 is copied out.
///
/// ``src`` is cut into chunks of ``chunk_bytes`` (a strided source: whole rows of its
/// outermost dimension); each chunk is copied into one of ``slots`` input slots, the stage
/// runs on it, and its output slot (as many bytes as the input) is copied into ``out`` at the
/// chunk's offset. The slots are valid only during the stage's call (keeping a view of one
/// is an ``ArgumentError``).
///
/// Args:
///     src: any array ``copy_`` takes (strided too).
///     out: a C-contiguous, writable array with as many bytes as ``src``.
///     stage (callable): on the CPU engine ``stage(inp, out, index)``, where ``inp`` and
///         ``out`` are 1-D ``uint8`` NumPy views of the slots (``.view(dtype)`` reinterprets
///         them); on a CUDA engine ``stage(inp, out, index, stream)`` with device slots and the
///         compute stream's handle, on which it enqueues its work and returns.
///     chunk_bytes (int): bytes per chunk (1 or more).
///     slots (int): buffers per side (2: double, 3: triple buffering).
///     engine (CpuEngine | CudaEngine | None): default: a GPU's when ``src`` or ``out`` is in
///         its memory, else the CPU's.
///
/// Returns:
///     int: the number of chunks run.
///
/// Raises:
///     ArgumentError: a bad argument (the message names it and its value), arrays that do not
///         match, a slot view kept past the call.
///     Exception: whatever the stage raised, with ``chunk`` (the chunk's index) set on it.
///     DriverError: a CUDA failure. FerryError: any other failure.
///
/// Example:
///     >>> src = numpy.arange(1 << 20, dtype=numpy.float32)
///     >>> out = numpy.empty_like(src)
///     >>> def double(inp, o, i):
///     ...     o.view(numpy.float32)[:] = inp.view(numpy.float32) * 2
///     >>> ferry.pipeline(src, out, double, chunk_bytes=1 << 18)
///     16
#[pyfunction]
#[pyo3(
    signature = (src, out, stage, chunk_bytes = None, slots = None, engine = None),
    text_signature = "(src, out, stage, chunk_bytes=1048576, slots=3, engine=None)"
)]
pub(crate) fn pipeline(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    stage: &Bound<'_, PyAny>,
    chunk_bytes: Option<&Bound<'_, PyAny>>,
    slots: Option<&Bound<'_, PyAny>>,
    engine: Option<&Bound<'_, PyAny>>,
) -> PyResult<usize> {
    let chunk_bytes: usize = chunk_bytes.map_or(Ok(1 << 20), |v| errors::uint(v, "chunk_bytes"))?;
    let slots: usize = slots.map_or(Ok(3), |v| errors::uint(v, "slots"))?;
    for (name, v) in [("chunk_bytes", chunk_bytes), ("slots", slots)] {
        if v == 0 {
            return Err(arg(format!("{name}=0: expected 1 or more")));
        }
    }
    if !stage.is_callable() {
        return Err(arg("stage must be callable"));
    }
    // A GPU array's DLPack producer orders its export with the legacy default stream, which
    // the run then waits for (`after_producer`).
    let mut s = Arr::from_py(src, Some(1))?;
    let mut d = Arr::from_py(out, Some(1))?;
    d.writable("destination")?;
    if d.layout.is_some_and(|l| !l.is_contiguous()) {
        return Err(arg(format!(
            "destination {} is not C-contiguous",
            d.describe()
        )));
    }
    let n = s.numel() * s.dtype.size;
    if d.numel() * d.dtype.size != n {
        return Err(arg(format!(
            "destination {} and source {} differ in bytes",
            d.describe(),
            s.describe()
        )));
    }
    let eng = engine::from_arg(py, engine, &[s.kind(), d.kind()])?;
    let stage = stage.clone().unbind();
    let cfg = PipelineConfig::new(chunk_bytes, slots);
    let result = match eng {
        Eng::Cpu(c) => {
            host(&s, "source")?;
            host(&d, "destination")?;
            run_cpu(py, &c, cfg, &s, &d, stage)?
        }
        Eng::Cuda(c) => {
            // The producers' queued work on the arrays comes first (the host waits for it).
            let mut waited = Vec::new();
            after_producer(py, &s, &mut waited)?;
            after_producer(py, &d, &mut waited)?;
            // Host arrays as the driver knows them (pinned or pageable): one query each.
            s.raw = c.host_kind(s.raw);
            d.raw = c.host_kind(d.raw);
            run_gpu(py, &c, cfg, &s, &d, stage)
        }
    };
    match result {
        Ok(chunks) => Ok(chunks),
        Err(PipelineError::Stage { chunk, source }) => match source.downcast::<PyErr>() {
            Ok(e) => {
                let v = e.value(py);
                // Best effort: an exception type may refuse new attributes; the error itself
                // is re-raised either way.
                let _ = v.setattr("chunk", chunk);
                if v.hasattr("add_note").unwrap_or(false) {
                    let _ = v.call_method1(
                        "add_note",
                        (format!("raised by ferry.pipeline's stage on chunk {chunk}"),),
                    );
                }
                Err(*e)
            }
            Err(other) => Err(errors::FerryError::new_err(format!(
                "the stage failed on chunk {chunk}: {other}"
            ))),
        },
        Err(e @ PipelineError::Config(_)) => Err(arg(e.to_string())),
        Err(e) => Err(errors::FerryError::new_err(e.to_string())),
    }
}

/// The source as the pipeline reads it: whole, or through its strided layout.
fn source<'a>(s: &Arr, mem: &'a Held) -> Result<Source<'a>, PipelineError> {
    match s.layout {
        Some(l) if !l.is_contiguous() => Source::strided(mem, l),
        _ => Ok(Source::new(mem)),
    }
}

/// The CPU engine's run: the stage on one of its threads with NumPy views of the slots.
fn run_cpu(
    py: Python<'_>,
    eng: &CpuEngine,
    cfg: PipelineConfig,
    s: &Arr,
    d: &Arr,
    stage: PyObject,
) -> PyResult<Result<usize, PipelineError>> {
    let asarray = py
        .import("numpy")
        .map_err(|_| arg("ferry.pipeline needs NumPy for the stage's views"))?
        .getattr("asarray")?
        .unbind();
    let src_mem = Held(s.raw);
    let mut dst_mem = Held(d.raw);
    // Set when the stage kept a view or slot past its call: the pipeline's slot memory is
    // then never freed (the view must not reach freed memory), and the run fails.
    let kept = AtomicBool::new(false);
    Ok(py.allow_threads(|| {
        let mut p = CpuPipeline::new(eng, cfg)?;
        let r = p
            .run(
                source(s, &src_mem)?,
                Some(Dest::new(&mut dst_mem)),
                |c, input: &[u8], output: &mut [u8]| {
                    Python::with_gil(|py| -> PyResult<()> {
                        let slot = |addr: usize, len: usize, readonly: bool| {
                            Py::new(
                                py,
                                Slot {
                                    addr,
                                    len,
                                    readonly,
                                    over: AtomicBool::new(false),
                                },
                            )
                        };
                        let si = slot(input.as_ptr() as usize, input.len(), true)?;
                        let so = slot(output.as_mut_ptr() as usize, output.len(), false)?;
                        let i = asarray.call1(py, (si.clone_ref(py),))?;
                        let o = asarray.call1(py, (so.clone_ref(py),))?;
                        let called = stage.call1(py, (i.clone_ref(py), o.clone_ref(py), c.index));
                        for sl in [&si, &so] {
                            sl.get().over.store(true, Ordering::Release);
                        }
                        // A view kept past the call (an array viewing it, or the slot object
                        // behind it, its `.base`) would outlive the slot's reuse: refused (and
                        // noted even when the stage also failed).
                        let views_kept = i.get_refcnt(py) > 1 || o.get_refcnt(py) > 1;
                        drop((i, o));
                        let any_kept =
                            views_kept || si.get_refcnt(py) > 1 || so.get_refcnt(py) > 1;
                        if any_kept {
                            kept.store(true, Ordering::Release);
                        }
                        called?;
                        if any_kept {
                            return Err(arg(format!(
                                "the stage kept a view of chunk {}'s slot past its call (copy it instead)",
                                c.index
                            )));
                        }
                        Ok(())
                    })
                },
            )
            .map(|r| r.chunks);
        if kept.load(Ordering::Acquire) {
            // A kept view still points into the slots: they stay allocated for good.
            std::mem::forget(p);
        }
        r
    }))
}

/// The CUDA engine's run: the stage on this thread with device slots and the compute stream.
fn run_gpu(
    py: Python<'_>,
    eng: &Arc<CudaEngine>,
    cfg: PipelineConfig,
    s: &Arr,
    d: &Arr,
    stage: PyObject,
) -> Result<usize, PipelineError> {
    let src_mem = Held(s.raw);
    let mut dst_mem = Held(d.raw);
    py.allow_threads(|| {
        let mut p = CudaPipeline::new(eng, cfg)?;
        p.run(
            source(s, &src_mem)?,
            Some(Dest::new(&mut dst_mem)),
            |g: &GpuChunk<'_>| Python::with_gil(|py| crate::pipe_gpu::call(py, &stage, eng, g)),
        )
        .map(|r| r.chunks)
    })
}
