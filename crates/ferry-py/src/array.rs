//! Python arrays as ferry buffers: anything with `__array_interface__` (NumPy), `__dlpack__`
//! (PyTorch, CuPy, JAX, NumPy) or `__cuda_array_interface__` (CuPy, Numba) becomes an
//! address range, a [`Layout`] (shape, byte strides, element size) and a dtype.

use crate::dlpack;
use crate::dtype::{self, DType};
use crate::engine;
use crate::errors::{self, arg};
use ferry::{Layout, MemKind, Memory, MemoryMut, RawBuf};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// One array, described for ferry; holds the objects that keep its memory alive.
pub(crate) struct Arr {
    /// The bytes the layout spans (from the first element).
    pub raw: RawBuf,
    /// The elements (None for an array with no element).
    pub layout: Option<Layout>,
    /// Dims (empty for a 0-d array).
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// True when the producer said the memory is read-only.
    pub readonly: bool,
    /// The array and, for DLPack, its capsule: held until the copy completes.
    pub keep: Vec<PyObject>,
    /// A PyTorch tensor in GPU memory (ordered with PyTorch's current stream by default).
    pub torch_gpu: bool,
    /// The producer's stream of a `__cuda_array_interface__` (version 3 `stream`: 1 the legacy
    /// default stream, 2 the per-thread one, else a handle) that a copy must wait for; None
    /// when the producer asks for no synchronization.
    pub stream: Option<usize>,
}

impl Arr {
    /// Describes `obj`. `stream`: the CUDA stream a DLPack producer should order its export
    /// with (None: no synchronization asked).
    pub(crate) fn from_py(obj: &Bound<'_, PyAny>, stream: Option<usize>) -> PyResult<Arr> {
        if let Some(a) = numpy_scalar(obj)? {
            // A NumPy scalar's interface points into a temporary array: copy it into a 0-d
            // array of its own (held with the rest), read-only as the scalar is.
            let mut arr = Arr::from_py(&a, stream)?;
            arr.readonly = true;
            arr.keep.push(obj.clone().unbind());
            return Ok(arr);
        }
        if let Some(a) = torch_tensor(obj)? {
            return Ok(a);
        }
        if let Some(ai) = attr(obj, "__array_interface__")? {
            return interface(obj, &ai, false);
        }
        if obj.hasattr("__dlpack__")? {
            return from_dlpack(obj, stream);
        }
        if let Some(ai) = attr(obj, "__cuda_array_interface__")? {
            return interface(obj, &ai, true);
        }
        Err(arg(format!(
            "expected an array (an object with __dlpack__, __array_interface__ or \
             __cuda_array_interface__), got {}",
            obj.get_type().name()?
        )))
    }

    /// The kinds of memory, for choosing an engine.
    pub(crate) fn kind(&self) -> MemKind {
        self.raw.kind
    }

    /// A description for messages: `float32[4, 5] (device 0)`.
    pub(crate) fn describe(&self) -> String {
        format!("{}{:?} ({})", self.dtype.name, self.shape, self.raw.kind)
    }

    /// Refuses a read-only array as the `role` (e.g. "destination") a copy writes.
    pub(crate) fn writable(&self, role: &str) -> PyResult<()> {
        if self.readonly {
            return Err(arg(format!("{role} {} is read-only", self.describe())));
        }
        Ok(())
    }

    /// The number of elements.
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Memory a Python array owns, described by its array interface.
pub(crate) struct Held(pub RawBuf);

// SAFETY: made only from an `Arr`'s `raw` (or a prefix of it) while the caller holds the
// array (its `Arr::keep`) for as long as ferry uses the memory: valid for reads over `len`, of
// the kind the raw buffer names.
unsafe impl Memory for Held {
    fn raw(&self) -> RawBuf {
        self.0
    }
}

// SAFETY: as above; used mutably only for an array whose producer did not mark it read-only
// (`Arr::writable`, checked by each caller), and ferry is its only writer meanwhile (the
// caller's thread is blocked in the call).
unsafe impl MemoryMut for Held {
    fn raw_mut(&mut self) -> RawBuf {
        self.0
    }
}

/// How ferry reads an array (for tests and debugging).
///
/// Args:
///     obj: any array ``copy_`` takes.
///
/// Returns:
///     dict: ``kind`` (memory kind), ``shape``, ``dtype``, ``readonly``, ``stream`` (the CUDA
///     array interface's producer stream a copy waits for, or None).
///
/// Raises:
///     ArgumentError: not an array ferry reads (the message says why).
///
/// Example:
///     >>> ferry._ferry._array_info(numpy.zeros(3))["dtype"]
///     'float64'
#[pyfunction]
pub(crate) fn _array_info<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let a = Arr::from_py(obj, None)?;
    let d = PyDict::new(obj.py());
    d.set_item("kind", a.kind().to_string())?;
    d.set_item("shape", a.shape.clone())?;
    d.set_item("dtype", a.dtype.name)?;
    d.set_item("readonly", a.readonly)?;
    d.set_item("stream", a.stream)?;
    Ok(d)
}

/// A PyTorch tensor read through its own accessors (`data_ptr()`, `shape`, `stride()`,
/// `dtype`, `get_device()`): a few attribute calls, where a DLPack export costs microseconds
/// (it matters for small copies). None for other objects, or a dtype this module does not
/// name (DLPack then says why).
fn torch_tensor(obj: &Bound<'_, PyAny>) -> PyResult<Option<Arr>> {
    let ty = obj.get_type();
    if !ty.module()?.to_cow()?.starts_with("torch") || !obj.hasattr("data_ptr")? {
        return Ok(None);
    }
    let dt = obj.getattr("dtype")?.str()?;
    let Some(dtype) = dt.to_cow()?.strip_prefix("torch.").and_then(dtype::by_name) else {
        return Ok(None);
    };
    // A lazily conjugated view holds the unconjugated bytes: refuse rather than copy those.
    if dtype.dl_code == 5 && obj.call_method0("is_conj")?.is_truthy()? {
        return Err(arg(
            "a conjugated view (tensor.conj()) holds unconjugated bytes: call .resolve_conj() first",
        ));
    }
    let addr: u64 = obj.call_method0("data_ptr")?.extract()?;
    let shape: Vec<usize> = obj.getattr("shape")?.extract()?;
    let strides: Vec<isize> = obj.call_method0("stride")?.extract()?;
    let dev: i64 = obj.call_method0("get_device")?.extract()?;
    let kind = match u32::try_from(dev) {
        Ok(ordinal) => MemKind::Device { ordinal },
        Err(_) if obj.getattr("is_cpu")?.is_truthy()? => MemKind::Pageable,
        Err(_) => return Ok(None),
    };
    let strides = non_negative(&strides, dtype.size)?;
    let mut a = build(obj, None, addr, kind, shape, Some(strides), dtype, false)?;
    a.torch_gpu = dev >= 0;
    Ok(Some(a))
}

/// `numpy.asarray(obj)` for a NumPy scalar (`numpy.generic`), else None. NumPy is only
/// looked up if already imported.
fn numpy_scalar<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    let Ok(np) = py.import("sys")?.getattr("modules")?.get_item("numpy") else {
        return Ok(None);
    };
    if np.is_none() || !obj.is_instance(&np.getattr("generic")?)? {
        return Ok(None);
    }
    Ok(Some(np.call_method1("array", (obj,))?))
}

/// `obj.name`, or None when absent (an error raised while getting it is raised).
fn attr<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// An array from its `__array_interface__` (host) or `__cuda_array_interface__` (device) dict.
fn interface(obj: &Bound<'_, PyAny>, ai: &Bound<'_, PyAny>, cuda: bool) -> PyResult<Arr> {
    let which = if cuda {
        "__cuda_array_interface__"
    } else {
        "__array_interface__"
    };
    let ai = ai
        .downcast::<PyDict>()
        .map_err(|_| arg(format!("{which} is not a dict")))?;
    let get = |k: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(ai.get_item(k)?.filter(|v| !v.is_none()))
    };
    // Each field read into ferry's terms: a bad one is an `ArgumentError` naming the field and
    // its value (not PyO3's "Can't extract" or `OverflowError`).
    let bad = |k: &str, v: &Bound<'_, PyAny>, want: &str| {
        arg(format!(
            "{which}['{k}'] = {}: expected {want}",
            errors::shown(v)
        ))
    };
    let ints = |k: &str, v: &Bound<'_, PyAny>, signed: bool| -> PyResult<Vec<isize>> {
        let want = if signed {
            "a tuple of ints"
        } else {
            "a tuple of ints 0 or more"
        };
        if !v.is_instance_of::<PyTuple>() && !v.is_instance_of::<pyo3::types::PyList>() {
            return Err(bad(k, v, want));
        }
        v.try_iter()?
            .map(|x| {
                x.ok()
                    .and_then(|x| x.extract::<isize>().ok())
                    .filter(|&x| signed || x >= 0)
                    .ok_or_else(|| bad(k, v, want))
            })
            .collect()
    };
    let shape_v = get("shape")?.ok_or_else(|| arg(format!("{which} has no shape")))?;
    let shape: Vec<usize> = ints("shape", &shape_v, false)?
        .into_iter()
        .map(|d| d as usize)
        .collect();
    let typestr_v = get("typestr")?.ok_or_else(|| arg(format!("{which} has no typestr")))?;
    let typestr: String = typestr_v
        .extract()
        .map_err(|_| bad("typestr", &typestr_v, "a str such as '<f4'"))?;
    let dtype = dtype::from_typestr(&typestr).map_err(arg)?;
    let data = get("data")?.ok_or_else(|| {
        arg(format!(
            "{which} without a data pointer (a buffer-protocol export) is not supported"
        ))
    })?;
    let (ptr, readonly): (usize, bool) = data
        .downcast::<PyTuple>()
        .ok()
        .and_then(|t| t.extract().ok())
        .ok_or_else(|| bad("data", &data, "a tuple (address, read-only flag)"))?;
    if get("mask")?.is_some() {
        return Err(arg("masked arrays are not supported"));
    }
    let strides: Option<Vec<isize>> = get("strides")?
        .map(|s| ints("strides", &s, true))
        .transpose()?;
    let offset: usize = get("offset")?
        .map(|o| errors::uint(&o, &format!("{which}['offset']")))
        .transpose()?
        .unwrap_or(0);
    let kind = if cuda {
        match engine::device_of(ptr as u64) {
            Some(ordinal) => MemKind::Device { ordinal },
            None => MemKind::Device { ordinal: 0 },
        }
    } else {
        MemKind::Pageable
    };
    let byte_strides = match strides {
        Some(s) => Some(non_negative(&s, 1)?),
        None => None,
    };
    let stream = match (cuda, get("stream")?) {
        (true, Some(s)) => Some(cai_stream(&s)?),
        _ => None,
    };
    let mut a = build(
        obj,
        None,
        (ptr as u64).checked_add(offset as u64).ok_or_else(|| {
            arg(format!(
                "{which}: data address {ptr:#x} + offset {offset} overflows"
            ))
        })?,
        kind,
        shape,
        byte_strides,
        dtype,
        readonly,
    )?;
    a.stream = stream;
    Ok(a)
}

/// A `__cuda_array_interface__` `stream` (not None): an int, 0 refused (the spec disallows it:
/// ambiguous between the legacy and per-thread default streams).
fn cai_stream(s: &Bound<'_, PyAny>) -> PyResult<usize> {
    let v: i64 = s
        .extract()
        .map_err(|_| arg("__cuda_array_interface__'s stream must be an int or None"))?;
    match v {
        0 => Err(arg(
            "__cuda_array_interface__'s stream 0 is disallowed (use 1 for the legacy default \
             stream, 2 for the per-thread default stream)",
        )),
        v => usize::try_from(v).map_err(|_| {
            arg(format!(
                "__cuda_array_interface__'s stream {v} is not a stream handle"
            ))
        }),
    }
}

/// An array through `obj.__dlpack__()`.
fn from_dlpack(obj: &Bound<'_, PyAny>, stream: Option<usize>) -> PyResult<Arr> {
    let py = obj.py();
    let (dev_type, _): (i32, i32) = match attr(obj, "__dlpack_device__")? {
        Some(f) => f.call0()?.extract()?,
        None => (dlpack::CPU, 0),
    };
    let kwargs = PyDict::new(py);
    // A CUDA producer orders its export with the consumer's stream; None asks for nothing
    // beyond what the producer does by default (NumPy takes only None).
    if dev_type == dlpack::CUDA || dev_type == dlpack::CUDA_MANAGED {
        if let Some(s) = stream {
            kwargs.set_item("stream", s)?;
        }
    }
    let f = obj.getattr("__dlpack__")?;
    let cap = match f.call((), Some(&kwargs)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) && !kwargs.is_empty() => f.call0()?,
        Err(e) => return Err(e),
    };
    let t = dlpack::import(&cap)?;
    let dtype = dtype::from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes).map_err(arg)?;
    let kind = match t.device.device_type {
        dlpack::CPU => MemKind::Pageable,
        dlpack::CUDA_HOST => MemKind::Pinned,
        dlpack::CUDA => MemKind::Device {
            ordinal: u32::try_from(t.device.device_id)
                .map_err(|_| arg("negative DLPack device id"))?,
        },
        dlpack::CUDA_MANAGED => MemKind::Managed,
        other => {
            return Err(arg(format!(
                "DLPack device type {other} is not one ferry reaches (CPU, CUDA, CUDA host, CUDA managed)"
            )))
        }
    };
    let shape = t
        .shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| arg("negative dim")))
        .collect::<PyResult<Vec<_>>>()?;
    let strides = match &t.strides {
        Some(s) => Some(non_negative(
            &s.iter().map(|&x| x as isize).collect::<Vec<_>>(),
            dtype.size,
        )?),
        None => None,
    };
    build(
        obj,
        Some(cap.unbind()),
        t.addr,
        kind,
        shape,
        strides,
        dtype,
        false,
    )
}

/// Byte strides from strides in units of `unit` bytes; a negative one is refused.
fn non_negative(s: &[isize], unit: usize) -> PyResult<Vec<usize>> {
    s.iter()
        .map(|&x| {
            usize::try_from(x)
                .ok()
                .and_then(|x| x.checked_mul(unit))
                .ok_or_else(|| {
                    arg(format!(
                        "strides {s:?}: negative strides (a flipped view) are not supported, \
                         ferry's layouts step forward; copy it first (np.ascontiguousarray, \
                         tensor.contiguous())"
                    ))
                })
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn build(
    obj: &Bound<'_, PyAny>,
    capsule: Option<PyObject>,
    addr: u64,
    kind: MemKind,
    shape: Vec<usize>,
    byte_strides: Option<Vec<usize>>,
    dtype: DType,
    readonly: bool,
) -> PyResult<Arr> {
    let mut keep = vec![obj.clone().unbind()];
    keep.extend(capsule);
    let empty = shape.contains(&0);
    let layout = if empty {
        None
    } else if shape.is_empty() {
        Some(Layout::contiguous(&[1], dtype.size))
    } else {
        Some(match &byte_strides {
            Some(s) if s.len() != shape.len() => {
                return Err(arg(format!("{} strides for {} dims", s.len(), shape.len())))
            }
            Some(s) => Layout::with_byte_strides(&shape, s, dtype.size),
            None => Layout::contiguous(&shape, dtype.size),
        })
    }
    .transpose()
    .map_err(|e| arg(format!("shape {shape:?}: {e}")))?;
    let len = layout.as_ref().map_or(0, |l| l.span().end);
    let raw = RawBuf { addr, len, kind };
    Ok(Arr {
        raw,
        layout,
        shape,
        dtype,
        readonly,
        keep,
        torch_gpu: false,
        stream: None,
    })
}
