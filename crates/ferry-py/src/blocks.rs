//! `ferry.copy_blocks`: the blocks a mapping names between block tables (a KV cache's swap,
//! vLLM's `swap_blocks`), every table pair in one request ([`Op::Blocks`]).

use crate::array::Arr;
use crate::copy::{pick_stream, producer_waits, stream_arg, PyRequest};
use crate::engine::{self, Eng};
use crate::errors::{self, arg};
use ferry::{MemKind, Op, RawBuf};
use pyo3::prelude::*;

/// One table: its buffer and its block size in bytes.
fn table(a: &Arr, role: &str) -> PyResult<(RawBuf, usize)> {
    let bad = || {
        arg(format!(
            "{role} must be an array of blocks (dim 0 the block index, each block contiguous \
             and the blocks back to back), got {}",
            a.describe()
        ))
    };
    if a.shape.is_empty() {
        return Err(bad());
    }
    let block = a.shape[1..].iter().product::<usize>() * a.dtype.size;
    match a.layout {
        Some(l) if l.is_contiguous() => Ok((a.raw, block)),
        // No element: no block.
        None => Ok((RawBuf { len: 0, ..a.raw }, block)),
        Some(_) => Err(bad()),
    }
}

/// The mapping argument as `(src, dst)` pairs: a 2-D int64 host array of shape `(n, 2)`
/// (vLLM's `block_mapping`), or a sequence of `(src, dst)` pairs.
fn pairs(mapping: &Bound<'_, PyAny>) -> PyResult<Vec<(i64, i64)>> {
    if let Ok(v) = mapping.extract::<Vec<(i64, i64)>>() {
        return Ok(v);
    }
    let m = Arr::from_py(mapping, None).map_err(|_| {
        arg(format!(
            "mapping={}: expected an int64 array of shape (n, 2) in host memory or a sequence \
             of (src_block, dst_block) pairs",
            errors::shown(mapping)
        ))
    })?;
    let ok = m.shape.len() == 2 && m.shape[1] == 2 && m.dtype.name == "int64";
    if !ok || !m.raw.kind.host_accessible() {
        return Err(arg(format!(
            "mapping must be an int64 array of shape (n, 2) in host memory, got {}",
            m.describe()
        )));
    }
    let Some(l) = m.layout else {
        return Ok(Vec::new());
    };
    let (s0, s1) = (l.strides()[0], l.strides()[1]);
    Ok((0..m.shape[0])
        .map(|i| {
            let at = |j: usize| {
                // SAFETY: host memory kept alive by `mapping` (borrowed for this call); element
                // (i, j) lies inside its layout (i < dims[0], j < 2); read unaligned as int64.
                unsafe { ((m.raw.addr as usize + i * s0 + j * s1) as *const i64).read_unaligned() }
            };
            (at(0), at(1))
        })
        .collect())
}

/// Copies blocks between block tables, as vLLM's ``swap_blocks``: block ``s`` of each source
/// table into block ``d`` of the destination table of the same position, for every
/// ``(s, d)`` of ``mapping``, every table in one request, on PyTorch's current stream.
///
/// A table is an array whose dim 0 indexes the blocks (``[num_blocks, ...]``, contiguous): a
/// KV cache's per-layer key or value tensor, in GPU memory or (pinned) host memory. Either
/// direction, or GPU to GPU. Every entry is checked before any byte moves.
///
/// Args:
///     dst: a writable table, or a list of tables (one per layer).
///     src: a table, or a list of as many tables, blocks of the same byte size as ``dst``'s.
///     mapping: an ``int64`` array of shape ``(n, 2)`` in host memory (``(src_block,
///         dst_block)`` rows, vLLM's ``block_mapping``), or a sequence of such pairs.
///     leave_sms (bool): the GPU's SMs run the caller's kernels meanwhile: move the blocks on
///         the copy engines only (the driver's batched copy), never with an SM kernel.
///         Default False: small blocks may go to an SM gather kernel, which is faster alone.
///     non_blocking (bool): return at once with a pending ``Request``.
///     engine (CpuEngine | CudaEngine | None): as for ``copy_``; with ``leave_sms``, a
///         ``CudaEngine`` made with ``compute_busy=True`` (or a ``CpuEngine``).
///     stream (int | str | None): as for ``copy_``.
///
/// Returns:
///     Request: done unless ``non_blocking``.
///
/// Raises:
///     ArgumentError: tables of different block sizes or counts, a block index negative or
///         past its table's end, two entries writing the same destination block (the entry
///         and the table named), a table that is not an array of contiguous blocks.
///     DriverError: the CUDA driver failed. FerryError: any other failure.
///
/// Example:
///     >>> ferry.copy_blocks(gpu_kv, cpu_kv, torch.tensor([[0, 5], [1, 2]]))
#[pyfunction]
#[pyo3(
    signature = (dst, src, mapping, leave_sms = None, non_blocking = None, engine = None, stream = None),
    text_signature = "(dst, src, mapping, leave_sms=False, non_blocking=False, engine=None, stream=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_blocks(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    mapping: &Bound<'_, PyAny>,
    leave_sms: Option<&Bound<'_, PyAny>>,
    non_blocking: Option<&Bound<'_, PyAny>>,
    engine: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyRequest> {
    let leave_sms = errors::boolean(leave_sms, "leave_sms", false)?;
    let non_blocking = errors::boolean(non_blocking, "non_blocking", false)?;
    let sa = stream_arg(stream)?;
    let dl_stream = sa.raw();
    let list = |o: &Bound<'_, PyAny>| -> PyResult<Vec<Arr>> {
        if o.is_instance_of::<pyo3::types::PyList>() || o.is_instance_of::<pyo3::types::PyTuple>() {
            o.try_iter()?
                .map(|t| Arr::from_py(&t?, dl_stream))
                .collect()
        } else {
            Ok(vec![Arr::from_py(o, dl_stream)?])
        }
    };
    let (mut ds, mut ss) = (list(dst)?, list(src)?);
    if ds.len() != ss.len() {
        return Err(arg(format!(
            "{} destination tables but {} source tables",
            ds.len(),
            ss.len()
        )));
    }
    let mut tables = Vec::with_capacity(ds.len());
    let mut block = None;
    for (t, (d, s)) in ds.iter().zip(&ss).enumerate() {
        d.writable("dst")?;
        let ((dr, db), (sr, sb)) = (table(d, "dst")?, table(s, "src")?);
        if db != sb || block.is_some_and(|b| b != db) {
            return Err(arg(format!(
                "block sizes differ: table pair {t} has destination blocks of {db} bytes and \
                 source blocks of {sb} bytes{}",
                block
                    .map(|b| format!(", table pair 0 blocks of {b} bytes"))
                    .unwrap_or_default()
            )));
        }
        block = Some(db);
        tables.push((dr, sr));
    }
    let p = pairs(mapping)?;
    let (sidx, didx): (Vec<i64>, Vec<i64>) = p.into_iter().unzip();
    let map = Op::blocks_from_indices(block.unwrap_or(0), &sidx, &didx)
        .map_err(|e| arg(e.to_string()))?;
    if sidx.is_empty() {
        return Ok(PyRequest::new(ferry::Request::ready(Ok(())), Vec::new()));
    }
    // A table with no element holds no block (and is no buffer to submit): refused here.
    for (t, (d, s)) in tables.iter().enumerate() {
        if d.len == 0 || s.len == 0 {
            let b = block.unwrap_or(0);
            let blocks = |n: usize| n.checked_div(b).unwrap_or(0);
            let (side, have) = if s.len == 0 {
                ("source", blocks(s.len))
            } else {
                ("destination", blocks(d.len))
            };
            return Err(arg(format!(
                "mapping entry 0: {side} block {} is past the table's end ({have} blocks of {b} \
                 bytes, table pair {t})",
                if s.len == 0 { sidx[0] } else { didx[0] }
            )));
        }
    }
    let kinds: Vec<MemKind> = tables.iter().flat_map(|(d, s)| [d.kind, s.kind]).collect();
    let eng = match (leave_sms, engine) {
        (true, None) => match engine::default_for(py, &kinds)? {
            Eng::Cuda(c) => Eng::Cuda(engine::busy_engine(py, c.ordinal())?),
            cpu => cpu,
        },
        (true, Some(e)) => match engine::from_arg(py, Some(e), &kinds)? {
            Eng::Cuda(c) if !c.config().compute_busy => {
                return Err(arg(format!(
                    "leave_sms=True with engine={}, which may use the SMs: pass \
                     engine=ferry.CudaEngine({}, compute_busy=True), or engine=None",
                    errors::shown(e),
                    c.ordinal()
                )))
            }
            // A CUDA engine that leaves the SMs, or a CPU engine (which never uses them).
            eng => eng,
        },
        (false, e) => engine::from_arg(py, e, &kinds)?,
    };
    let torch_gpu = ds.iter().chain(&ss).any(|a| a.torch_gpu);
    let stream = pick_stream(py, &eng, sa, torch_gpu)?;
    let arrs: Vec<&Arr> = ds.iter().chain(&ss).collect();
    let after = producer_waits(&eng, &arrs, stream)?;
    let mut keep = Vec::new();
    for a in ds.iter_mut().chain(ss.iter_mut()) {
        keep.append(&mut a.keep);
    }
    let submitted = py.allow_threads(move || -> Result<_, ferry::SubmitError> {
        let req = match (&eng, stream) {
            (Eng::Cuda(c), Some(s)) => {
                // SAFETY: as `copy_`: the caller passed a live stream of this device's primary
                // context, alive for this call; the tables are the arrays held in `keep` until
                // the request completes, untouched meanwhile by Python code's contract.
                unsafe { map.submit_raw_pairs(&c.on_raw_stream(s as _), &tables, &after)? }
            }
            // SAFETY: as above.
            _ => unsafe { map.submit_raw_pairs(&*eng.dyn_engine(), &tables, &after)? },
        };
        Ok(if non_blocking {
            Ok(req)
        } else {
            Err(req.wait())
        })
    });
    crate::copy::into_request(submitted, keep)
}
