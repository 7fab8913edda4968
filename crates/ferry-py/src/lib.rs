//! The Python module `ferry` (its compiled part, `ferry._ferry`): PyTorch, NumPy and CuPy
//! arrays through ferry's engines. Importable without any of them installed.
//!
//! - `agent`: `Agent`, `Region`, `Peer`, `RemoteRegion`: ferry's transfer agent between
//!   processes (registered memory, descriptors, segment lists as one `Request`).
//! - `array`: any object with `__array_interface__`, `__dlpack__` or
//!   `__cuda_array_interface__` as a ferry buffer and layout.
//! - `copy`: `copy_(dst, src, non_blocking=False, engine=None, stream=None)` and
//!   `gather(src, index, out)`, returning a `Request` (`wait()`, `done()`, `await`). The GIL
//!   is released while ferry copies or waits.
//! - `ckpt`: `load_safetensors` / `save_safetensors` through ferry's checkpoint module;
//!   loaded tensors are ferry-owned `Buffer`s handed out through DLPack without a copy.
//! - `engine`: `CpuEngine`, `CudaEngine`, and the default engine per copy.
//! - `errors`: `FerryError` and its subclasses.
//! - `fileio`: `read_file(path, out, *, offset, size)` and `write_file(path, src, *, offset)`
//!   through ferry's file engine, as KvikIO's `pread`/`pwrite`.
//! - `pipe`, `pipe_gpu`: `pipeline(src, out, stage, ...)`, ferry's CPU or GPU pipeline with a
//!   Python stage.
//!
//! Built by maturin (`crates/ferry-py/pyproject.toml`); the Python wrapper in `python/ferry`
//! adds the framework choice of `load_safetensors`.

// The doc comments of the `#[pyfunction]`s, `#[pyclass]`es and their methods are Python
// docstrings (PyO3 copies them into `__doc__`), in Python's conventions: `list[int]` types,
// reST ``code``. rustdoc would read their brackets as links to Rust items.
#![allow(rustdoc::broken_intra_doc_links)]

mod agent;
mod array;
mod blocks;
mod ckpt;
mod copy;
mod dlpack;
mod dtype;
mod engine;
mod errors;
mod fileio;
mod pipe;
mod pipe_gpu;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// What ferry sees on this machine.
///
/// Returns:
///     dict: ``version``, ``abi``, ``cuda_driver`` (int, or None) and ``cuda_error`` (why not,
///     or None), ``devices`` (a list of dicts: ``ordinal``, ``name``, ``total_mem``,
///     ``async_engines``, ``sm_count``, ``compute_capability``, ``pci_bus_id``, ``pcie_gen``,
///     ``pcie_width``), ``nvidia_fs`` (GPUDirect Storage's kernel module loaded),
///     ``cpu_threads``, ``dtypes`` (the dtypes ferry copies).
///
/// Raises:
///     Nothing: a missing driver is reported in ``cuda_error``.
///
/// Example:
///     >>> ferry.info()["cuda_driver"] is None    # on a machine without a GPU
///     True
#[pyfunction]
fn info(py: Python<'_>) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", env!("CARGO_PKG_VERSION"))?;
    d.set_item("abi", "abi3-py39")?;
    let probe = py.allow_threads(ferry::cuda::probe);
    match &probe.driver {
        Ok(v) => {
            d.set_item("cuda_driver", *v)?;
            d.set_item("cuda_error", py.None())?;
        }
        Err(e) => {
            d.set_item("cuda_driver", py.None())?;
            d.set_item("cuda_error", e)?;
        }
    }
    let devs = PyList::empty(py);
    for dev in &probe.devices {
        let x = PyDict::new(py);
        x.set_item("ordinal", dev.ordinal)?;
        x.set_item("name", &dev.name)?;
        x.set_item("total_mem", dev.total_mem)?;
        x.set_item("async_engines", dev.async_engines)?;
        x.set_item("sm_count", dev.sm_count)?;
        x.set_item("compute_capability", dev.compute_capability)?;
        x.set_item("pci_bus_id", &dev.pci_bus_id)?;
        x.set_item("pcie_gen", dev.pcie_gen)?;
        x.set_item("pcie_width", dev.pcie_width)?;
        devs.append(x)?;
    }
    d.set_item("devices", devs)?;
    d.set_item("nvidia_fs", probe.nvidia_fs)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    d.set_item("cpu_threads", cpus)?;
    d.set_item(
        "dtypes",
        dtype::ALL.iter().map(|t| t.name).collect::<Vec<_>>(),
    )?;
    Ok(d.unbind())
}

/// ferry's compiled module (``ferry._ferry``); import ``ferry`` instead, which re-exports all
/// of it and adds ``load_safetensors``.
///
/// Functions: ``copy_``, ``gather``, ``pipeline``, ``read_file``, ``write_file``,
/// ``save_safetensors``, ``info``; ``_load_safetensors`` and ``_load_safetensors_into``
/// (behind ``ferry.load_safetensors``); ``_array_info`` (how ferry reads an array, for
/// debugging).
///
/// Classes: ``Request``, ``SaveRequest``, ``SaveReport``, ``CpuEngine``, ``CudaEngine``,
/// ``Buffer``; ``Agent``, ``Region``, ``Peer``, ``RemoteRegion`` (the transfer agent between
/// processes).
///
/// Exceptions: ``FerryError``, ``ArgumentError``, ``DriverError``, ``CheckpointError``.
#[pymodule]
fn _ferry(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    agent::register(m)?;
    m.add_class::<engine::PyCpuEngine>()?;
    m.add_class::<engine::PyCudaEngine>()?;
    m.add_class::<copy::PyRequest>()?;
    m.add_class::<ckpt::PyBuffer>()?;
    m.add_function(wrap_pyfunction!(info, m)?)?;
    m.add_function(wrap_pyfunction!(array::_array_info, m)?)?;
    m.add_function(wrap_pyfunction!(copy::copy_, m)?)?;
    m.add_function(wrap_pyfunction!(copy::gather, m)?)?;
    m.add_function(wrap_pyfunction!(blocks::copy_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(pipe::pipeline, m)?)?;
    m.add_function(wrap_pyfunction!(fileio::read_file, m)?)?;
    m.add_function(wrap_pyfunction!(fileio::write_file, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::_load_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::_load_safetensors_into, m)?)?;
    m.add_function(wrap_pyfunction!(ckpt::save_safetensors, m)?)?;
    m.add_class::<ckpt::SaveRequest>()?;
    m.add_class::<ckpt::PySaveReport>()?;
    Ok(())
}
