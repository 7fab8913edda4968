//! `ferry.pipeline(src, out, stage, chunk_bytes=1 << 20, slots=3, engine=None)`: ferry's
//! CPU pipeline ([`ferry::pipeline::CpuPipeline`]) with a Python stage.
//!
//! `src` (any host array `copy_` takes, strided too) is cut into chunks of `chunk_bytes`
//! (a strided source: whole rows of its outermost dimension); each chunk is copied into one
//! of `slots` input slots, `stage(inp, out, index)` runs on it, and its output slot (as many
//! bytes as its input) is copied to `out` (a C-contiguous, writable host array with as many
//! bytes as `src`) at the chunk's offset. `inp` and `out` are 1-D `uint8` NumPy arrays viewing
//! the slots without a copy (`.view(dtype)` reinterprets them), valid only during the call:
//! the pipeline reuses the slots (a view still referenced after the call
//! fails the pipeline with an `ArgumentError`). The stage runs on one of ferry's threads, holding the GIL
//! only for the call; ferry's copies and waits run with the GIL released. An exception in
//! the stage stops the pipeline (nothing more submitted, everything in flight waited for) and
//! is re-raised with `chunk` (the chunk's index) set on it and, on Python 3.11+, a note.
//! Only the CPU engine takes a Python stage (a `CudaEngine` is an `ArgumentError`).

use crate::array::Arr;
use crate::engine::{self, Eng};
use crate::errors::{self, arg};
use ferry::pipeline::{CpuPipeline, Dest, PipelineConfig, PipelineError, Source};
use ferry::{Memory, MemoryMut, RawBuf};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Host memory a Python array owns, described by its array interface.
struct Held(RawBuf);

// SAFETY: the bytes belong to an array the caller holds (its `Arr::keep`) for the whole run,
// host-accessible (checked by `host`), valid for reads over `len`.
unsafe impl Memory for Held {
    fn raw(&self) -> RawBuf {
        self.0
    }
}

// SAFETY: as above; the destination's producer did not mark it read-only (checked), and the
// pipeline is its only writer during the run (the caller's thread is blocked in `pipeline`).
unsafe impl MemoryMut for Held {
    fn raw_mut(&mut self) -> RawBuf {
        self.0
    }
}

/// A slot seen from Python: `__array_interface__` over its bytes (1-D `uint8`).
#[pyclass(module = "ferry", name = "_Slot", frozen)]
struct Slot {
    addr: usize,
    len: usize,
    readonly: bool,
}

#[pymethods]
impl Slot {
    /// NumPy's array interface (version 3).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
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
            "{what} {} is not in host memory: only the CPU engine takes a Python stage",
            a.describe()
        )))
    }
}

/// `ferry.pipeline(src, out, stage, chunk_bytes=1 << 20, slots=3, engine=None)`: see the
/// module documentation. Returns the number of chunks.
#[pyfunction]
#[pyo3(signature = (src, out, stage, chunk_bytes = 1 << 20, slots = 3, engine = None))]
pub(crate) fn pipeline(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    stage: &Bound<'_, PyAny>,
    chunk_bytes: usize,
    slots: usize,
    engine: Option<&Bound<'_, PyAny>>,
) -> PyResult<usize> {
    if !stage.is_callable() {
        return Err(arg("stage must be callable as stage(inp, out, index)"));
    }
    let s = Arr::from_py(src, None)?;
    let d = Arr::from_py(out, None)?;
    host(&s, "source")?;
    host(&d, "destination")?;
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
    let eng = match engine {
        None => engine::cpu_engine()?,
        Some(_) => match engine::from_arg(py, engine, &[])? {
            Eng::Cpu(c) => c,
            Eng::Cuda(_) => {
                return Err(arg(
                    "only the CPU engine takes a Python stage: pass a ferry.CpuEngine",
                ))
            }
        },
    };
    let asarray = py
        .import("numpy")
        .map_err(|_| arg("ferry.pipeline needs NumPy for the stage's views"))?
        .getattr("asarray")?
        .unbind();
    let stage = stage.clone().unbind();
    let cfg = PipelineConfig::new(chunk_bytes, slots);
    let src_mem = Held(s.raw);
    let mut dst_mem = Held(d.raw);
    let result = py.allow_threads(|| {
        let source = match s.layout {
            Some(l) if !l.is_contiguous() => Source::strided(&src_mem, l)?,
            _ => Source::new(&src_mem),
        };
        let mut p = CpuPipeline::new(&*eng, cfg)?;
        p.run(
            source,
            Some(Dest::new(&mut dst_mem)),
            |c, input: &[u8], output: &mut [u8]| {
                Python::with_gil(|py| -> PyResult<()> {
                    let view = |addr: usize, len: usize, readonly: bool| {
                        asarray.call1(
                            py,
                            (Slot {
                                addr,
                                len,
                                readonly,
                            },),
                        )
                    };
                    let i = view(input.as_ptr() as usize, input.len(), true)?;
                    let o = view(output.as_mut_ptr() as usize, output.len(), false)?;
                    stage.call1(py, (i.clone_ref(py), o.clone_ref(py), c.index))?;
                    // A view kept past the call (or an array viewing it) would outlive the
                    // slot's reuse and the pipeline's memory: refused.
                    if i.get_refcnt(py) > 1 || o.get_refcnt(py) > 1 {
                        return Err(arg(format!(
                            "the stage kept a view of chunk {}'s slot past its call (copy it instead)",
                            c.index
                        )));
                    }
                    Ok(())
                })
            },
        )
    });
    match result {
        Ok(r) => Ok(r.chunks),
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
