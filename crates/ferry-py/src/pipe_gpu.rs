//! `ferry.pipeline` on a CUDA engine ([`ferry::pipeline::CudaPipeline`]): the Python stage
//! gets each chunk's device slots as `_DeviceSlot` objects (`__dlpack__`,
//! `__dlpack_device__`, `__cuda_array_interface__`: `torch.from_dlpack`, `torch.as_tensor`,
//! `cupy.from_dlpack`, `cupy.asarray` take them without a copy, as 1-D `uint8`) and the
//! pipeline's compute stream handle (an int: `torch.cuda.ExternalStream(stream)`,
//! `cupy.cuda.ExternalStream(stream)`), enqueues its work there and returns.
//!
//! Ordering: the slot's bytes are ready on the compute stream. `__dlpack__(stream=s)` for a
//! consumer stream `s` other than the compute stream makes `s` wait for the compute stream (an
//! event, no host wait), and once the stage returns the compute stream waits for `s` in turn
//! (the download and the slot's next upload come after the work the stage put on `s`): a stage
//! that works on PyTorch's current stream through `torch.from_dlpack` is ordered too (a stream
//! so named must outlive the stage's call: PyTorch's always do; a CuPy stream made and dropped
//! inside the stage must not be named).
//! `__cuda_array_interface__` names the compute stream as its `stream` (version 3): its
//! consumers synchronize with it (CuPy and Numba on the host), but work they enqueue is ordered
//! with the pipeline only if it goes on the compute stream.
//!
//! Lifetimes: the slots are reused by later chunks and freed with the run. A slot object, or
//! a DLPack export of one, still alive when the stage returns fails the pipeline with an
//! `ArgumentError`, and a kept slot object refuses to export anything after its call.

use crate::dlpack;
use crate::errors::{self, arg};
use ferry::cuda::CudaEngine;
use ferry::pipeline::GpuChunk;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What one chunk's slot objects share: whether the stage's call is still running, and the
/// consumer streams DLPack exports were ordered into (joined back after the call). Every
/// DLPack capsule made from a slot holds a clone (its count tells an export still alive).
#[derive(Default)]
struct ChunkState {
    live: AtomicBool,
    joined: Mutex<Vec<usize>>,
}

/// A pipeline's device slot, as a CUDA stage gets it: 1-D ``uint8``, ``nbytes`` bytes at
/// ``ptr``, valid during the stage's call only; made by ``pipeline``, not directly. Read it
/// through ``__cuda_array_interface__`` or DLPack (``torch.from_dlpack(slot)``).
///
/// Example:
///     >>> def stage(inp, out, i, stream):
///     ...     torch.from_dlpack(out).copy_(torch.from_dlpack(inp))
#[pyclass(module = "ferry", name = "_DeviceSlot", frozen)]
pub(crate) struct DeviceSlot {
    addr: u64,
    len: usize,
    readonly: bool,
    eng: Arc<CudaEngine>,
    compute: usize,
    state: Arc<ChunkState>,
}

impl DeviceSlot {
    fn live(&self) -> PyResult<()> {
        if self.state.live.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(arg(
                "this pipeline slot is no longer valid: it was handed to a stage call that has returned",
            ))
        }
    }
}

/// The DLPack `stream` a consumer passed, read per the DLPack spec (CUDA): None is the legacy
/// default stream (1), -1 asks for no synchronization (None here), 0 is refused (ambiguous).
fn consumer_stream(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    let s: i64 = match stream.filter(|s| !s.is_none()) {
        None => return Ok(Some(1)),
        Some(s) => s
            .extract()
            .map_err(|_| arg("__dlpack__(stream=) takes an int or None"))?,
    };
    match s {
        -1 => Ok(None),
        0 => Err(arg(
            "__dlpack__(stream=0) is ambiguous for CUDA: pass 1 (legacy default), 2 (per-thread default) or a stream handle",
        )),
        s => usize::try_from(s)
            .map(Some)
            .map_err(|_| arg(format!("__dlpack__(stream={s}): not a stream handle"))),
    }
}

#[pymethods]
impl DeviceSlot {
    /// int: the slot's device address.
    ///
    /// Raises:
    ///     ArgumentError: the stage's call is over.
    #[getter]
    fn ptr(&self) -> PyResult<u64> {
        self.live()?;
        Ok(self.addr)
    }
    /// int: the slot's size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }
    /// dict: the CUDA array interface (version 3), its ``stream`` the compute stream.
    ///
    /// Raises:
    ///     ArgumentError: the stage's call is over.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.live()?;
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.len,))?;
        d.set_item("typestr", "|u1")?;
        // Never flagged read-only: PyTorch refuses the flag ("should always be False"); the
        // input slot is not to be written all the same.
        d.set_item("data", (self.addr, false))?;
        d.set_item("strides", py.None())?;
        d.set_item("stream", self.compute)?;
        Ok(d)
    }
    /// The DLPack device.
    ///
    /// Returns:
    ///     tuple[int, int]: ``(2, device)`` (``kDLCUDA``).
    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::CUDA, self.eng.ordinal() as i32)
    }
    /// A ``dltensor`` capsule of the slot (1-D ``uint8``), ordered for the consumer's
    /// ``stream``.
    ///
    /// Args:
    ///     stream, max_version, dl_device, copy: as the DLPack protocol defines them.
    ///
    /// Returns:
    ///     PyCapsule: the capsule.
    ///
    /// Raises:
    ///     ArgumentError: the stage's call is over, or a bad ``stream`` (0 is ambiguous).
    ///
    /// Example:
    ///     >>> t = torch.from_dlpack(slot)
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        let _ = max_version; // only the unversioned capsule is made; consumers accept it.
        self.live()?;
        if copy == Some(true) {
            return Err(arg(
                "a pipeline slot is exported without a copy (copy=True)",
            ));
        }
        if dl_device.is_some_and(|d| d != self.__dlpack_device__()) {
            return Err(arg(format!(
                "a pipeline slot lives on {:?}, not {dl_device:?}",
                self.__dlpack_device__()
            )));
        }
        if let Some(s) = consumer_stream(stream)?.filter(|&s| s != self.compute) {
            order(&self.eng, self.compute, s)?;
            let mut j = self
                .state
                .joined
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !j.contains(&s) {
                j.push(s);
            }
        }
        let dtype = dlpack::DlDataType {
            code: 1,
            bits: 8,
            lanes: 1,
        };
        let device = dlpack::DlDevice {
            device_type: dlpack::CUDA,
            device_id: self.eng.ordinal() as i32,
        };
        dlpack::export(
            py,
            Box::new(self.state.clone()),
            self.addr,
            device,
            dtype,
            &[self.len],
        )
    }
    /// ``ferry._DeviceSlot(...)``: its device, address and size.
    fn __repr__(&self) -> String {
        format!(
            "ferry._DeviceSlot({} bytes at {:#x} on cuda:{}{})",
            self.len,
            self.addr,
            self.eng.ordinal(),
            if self.readonly { ", input" } else { "" }
        )
    }
}

/// Makes stream `later` wait for what stream `first` holds now (an event recorded on `first`,
/// `cuStreamWaitEvent` on `later`; no host wait).
fn order(eng: &CudaEngine, first: usize, later: usize) -> PyResult<()> {
    let drv = |e: ferry::cuda::InteropError| errors::DriverError::new_err(e.to_string());
    // SAFETY: `first` is the pipeline's compute stream (alive for the run) or a stream a DLPack
    // consumer named during the stage's call, which the stage keeps alive until its call and
    // this join are over (documented: PyTorch's streams are never destroyed; 1 and 2 are the
    // driver's legacy and per-thread handles, the latter of this very thread, which runs the
    // stage); both of the device's primary context, as PyTorch's and CuPy's are.
    let req = unsafe { eng.record_raw(first as _) }.map_err(drv)?;
    // SAFETY: as above, for `later`.
    unsafe { eng.stream_wait_raw(later as _, &req) }.map_err(drv)?;
    Ok(())
}

/// One call of the stage on chunk `g`: `stage(inp, out, index, stream)`, then the consumer
/// streams joined back into the compute stream, then the slots' lifetimes checked.
pub(crate) fn call(
    py: Python<'_>,
    stage: &PyObject,
    eng: &Arc<CudaEngine>,
    g: &GpuChunk<'_>,
) -> PyResult<()> {
    let c = g.chunk();
    let compute = g.stream().cu_stream() as usize;
    let state = Arc::new(ChunkState {
        live: AtomicBool::new(true),
        joined: Mutex::new(Vec::new()),
    });
    let slot = |addr: u64, len: usize, readonly: bool| {
        Py::new(
            py,
            DeviceSlot {
                addr,
                len,
                readonly,
                eng: eng.clone(),
                compute,
                state: state.clone(),
            },
        )
    };
    let i = slot(g.input(), c.len, true)?.into_any();
    let o = match g.output() {
        Some(a) => slot(a, c.out_len, false)?.into_any(),
        None => py.None(),
    };
    let called = stage.call1(py, (i.clone_ref(py), o.clone_ref(py), c.index, compute));
    state.live.store(false, Ordering::Release);
    // The work the stage put on consumer streams comes before the chunk's download and the
    // slots' reuse, whether or not it raised.
    let joined = std::mem::take(&mut *state.joined.lock().unwrap_or_else(PoisonError::into_inner));
    let mut join = joined.iter().try_for_each(|&s| order(eng, s, compute));
    called?;
    let kept = i.get_refcnt(py) > 1 || (!o.is_none(py) && o.get_refcnt(py) > 1);
    drop((i, o));
    if kept || Arc::strong_count(&state) > 1 {
        join = Err(arg(format!(
            "the stage kept a slot of chunk {} (or a tensor viewing it) past its call: \
             the slots are reused, copy what you keep",
            c.index
        )));
    }
    join
}
