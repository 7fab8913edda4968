//! Engines as Python objects (`ferry.CpuEngine`, `ferry.CudaEngine`) and the default engine
//! chosen per copy from where its buffers live.

use crate::errors;
use ferry::cuda::CudaEngine as RsCuda;
use ferry::{CpuEngine as RsCpu, MemKind};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// An engine of either kind, shared.
#[derive(Clone)]
pub(crate) enum Eng {
    /// The CPU thread pool.
    Cpu(Arc<RsCpu>),
    /// One GPU's copy engines.
    Cuda(Arc<RsCuda>),
}

impl Eng {
    /// As the engine trait.
    pub(crate) fn dyn_engine(&self) -> Arc<dyn ferry::Engine> {
        match self {
            Eng::Cpu(e) => e.clone(),
            Eng::Cuda(e) => e.clone(),
        }
    }
}

/// CpuEngine(threads=0)
///
/// Copies between host arrays on a pool of threads; pass it as ``engine=``.
///
/// Args:
///     threads (int): worker threads, 0 (default) for one per core.
///
/// Raises:
///     ArgumentError: a negative or non-int ``threads``.
///
/// Example:
///     >>> eng = ferry.CpuEngine(threads=4)
///     >>> ferry.copy_(dst, src, engine=eng)
#[pyclass(module = "ferry", name = "CpuEngine", frozen)]
pub(crate) struct PyCpuEngine {
    pub(crate) eng: Arc<RsCpu>,
}

#[pymethods]
impl PyCpuEngine {
    #[new]
    #[pyo3(signature = (threads = None), text_signature = "(threads=0)")]
    fn new(py: Python<'_>, threads: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        // Taken as any object: a negative count is an ArgumentError, not an OverflowError.
        let threads: usize = threads.map_or(Ok(0), |t| errors::uint(t, "threads"))?;
        Ok(PyCpuEngine {
            eng: Arc::new(RsCpu::new(threads).map_err(|e| match errors::ferry(e) {
                e if e.is_instance_of::<errors::ArgumentError>(py) => {
                    errors::arg(format!("threads={threads}: {}", e.value(py)))
                }
                e => e,
            })?),
        })
    }
    /// str: the engine's name (as ``ferry bench`` and error messages show it).
    #[getter]
    fn name(&self) -> String {
        ferry::Engine::name(&self.eng)
    }
    /// Waits for every copy submitted on this engine so far.
    ///
    /// Returns:
    ///     None.
    ///
    /// Raises:
    ///     FerryError: one or more copies failed (every failure in the message).
    ///
    /// Example:
    ///     >>> eng.barrier()
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        barrier(py, self.eng.clone())
    }
    /// ``ferry.CpuEngine(<name>)``.
    fn __repr__(&self) -> String {
        format!("ferry.CpuEngine({})", self.name())
    }
}

/// CudaEngine(device=0, *, compute_busy=False)
///
/// Copies to, from and between one GPU's memory on its copy engines (pageable host memory
/// staged through pinned buffers); one per device and setting per process, shared. Pass it
/// as ``engine=``.
///
/// Args:
///     device (int): the GPU's ordinal (0 or more).
///     compute_busy (bool): the caller's kernels keep the GPU's SMs busy: copies never use
///         the SMs (segment lists and block copies go through the driver's batched copy on
///         the copy engines). ``ferry.copy_blocks(..., leave_sms=True, engine=eng)`` needs it.
///         Default: False (the SM gather kernel where it is measured faster).
///
/// Raises:
///     ArgumentError: a negative or non-int ``device``, a non-bool ``compute_busy``.
///     DriverError: no CUDA driver, or no such device.
///
/// Example:
///     >>> eng = ferry.CudaEngine(0)
///     >>> ferry.copy_(gpu_tensor, host_array, engine=eng)
///     >>> busy = ferry.CudaEngine(0, compute_busy=True)
///     >>> ferry.copy_blocks(gpu_cache, host_cache, mapping, leave_sms=True, engine=busy)
#[pyclass(module = "ferry", name = "CudaEngine", frozen)]
pub(crate) struct PyCudaEngine {
    pub(crate) eng: Arc<RsCuda>,
}

#[pymethods]
impl PyCudaEngine {
    #[new]
    #[pyo3(
        signature = (device = None, *, compute_busy = None),
        text_signature = "(device=0, *, compute_busy=False)"
    )]
    fn new(
        py: Python<'_>,
        device: Option<&Bound<'_, PyAny>>,
        compute_busy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // Taken as any object: a negative ordinal is an ArgumentError, not an OverflowError.
        let device: u32 = device.map_or(Ok(0), |d| errors::uint(d, "device"))?;
        let busy = errors::boolean(compute_busy, "compute_busy", false)?;
        let eng = match busy {
            true => busy_engine(py, device)?,
            false => cuda_engine(py, device)?,
        };
        Ok(PyCudaEngine { eng })
    }
    /// bool: copies leave the GPU's SMs to the caller's kernels (``compute_busy=True``, or
    /// ``FERRY_CUDA_COMPUTE_BUSY=1`` in the environment).
    #[getter]
    fn compute_busy(&self) -> bool {
        self.eng.config().compute_busy
    }
    /// int: the GPU's ordinal.
    #[getter]
    fn device(&self) -> u32 {
        self.eng.ordinal()
    }
    /// str: the engine's name (as ``ferry bench`` and error messages show it).
    #[getter]
    fn name(&self) -> String {
        ferry::Engine::name(&self.eng)
    }
    /// Waits for every copy submitted on this engine so far.
    ///
    /// Returns:
    ///     None.
    ///
    /// Raises:
    ///     FerryError: one or more copies failed (every failure in the message).
    ///
    /// Example:
    ///     >>> eng.barrier()
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        barrier(py, self.eng.clone())
    }
    /// ``ferry.CudaEngine(<name>)``.
    fn __repr__(&self) -> String {
        format!("ferry.CudaEngine({})", self.name())
    }
}

/// `engine.barrier()` without the GIL; every failure in the message.
fn barrier(py: Python<'_>, e: Arc<dyn ferry::Engine>) -> PyResult<()> {
    py.allow_threads(move || e.barrier())
        .map_err(|e| errors::FerryError::new_err(e.to_string()))
}

/// The engine an `engine=` argument names (`None`: chosen from the buffers' kinds).
pub(crate) fn from_arg(
    py: Python<'_>,
    engine: Option<&Bound<'_, PyAny>>,
    kinds: &[MemKind],
) -> PyResult<Eng> {
    match engine {
        None => default_for(py, kinds),
        Some(e) => {
            if let Ok(c) = e.downcast::<PyCpuEngine>() {
                Ok(Eng::Cpu(c.get().eng.clone()))
            } else if let Ok(c) = e.downcast::<PyCudaEngine>() {
                Ok(Eng::Cuda(c.get().eng.clone()))
            } else {
                Err(errors::arg(format!(
                    "engine={}: expected a ferry.CpuEngine, a ferry.CudaEngine or None",
                    errors::shown(e)
                )))
            }
        }
    }
}

/// The default engine for buffers of these kinds: the CUDA engine of the first GPU among
/// them, else the CPU engine (one per process, one thread per core).
pub(crate) fn default_for(py: Python<'_>, kinds: &[MemKind]) -> PyResult<Eng> {
    let gpu = kinds.iter().find_map(|k| match k {
        MemKind::Device { ordinal } => Some(*ordinal),
        _ => None,
    });
    let managed = kinds.contains(&MemKind::Managed);
    match (gpu, managed) {
        (Some(o), _) => Ok(Eng::Cuda(cuda_engine(py, o)?)),
        (None, true) => Ok(Eng::Cuda(cuda_engine(py, 0)?)),
        (None, false) => Ok(Eng::Cpu(cpu_engine()?)),
    }
}

/// The process's default CPU engine.
pub(crate) fn cpu_engine() -> PyResult<Arc<RsCpu>> {
    static CPU: OnceLock<Arc<RsCpu>> = OnceLock::new();
    if let Some(e) = CPU.get() {
        return Ok(e.clone());
    }
    let e = Arc::new(RsCpu::new(0).map_err(errors::ferry)?);
    Ok(CPU.get_or_init(|| e).clone())
}

/// CUDA engines kept per device for the process's life, made once each.
type Engines = OnceLock<Mutex<HashMap<u32, Arc<RsCuda>>>>;

/// The engine of device `ordinal` in `engines`, made by `make` the first time (the GIL released
/// while it is; a thread that made one meanwhile wins, and both callers get the same engine).
fn kept(
    py: Python<'_>,
    engines: &'static Engines,
    ordinal: u32,
    make: impl FnOnce() -> Result<RsCuda, ferry::cuda::CudaError> + Send,
) -> PyResult<Arc<RsCuda>> {
    let map = engines.get_or_init(Default::default);
    if let Some(e) = map
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&ordinal)
    {
        return Ok(e.clone());
    }
    let e = Arc::new(py.allow_threads(make).map_err(errors::cuda)?);
    Ok(map
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(ordinal)
        .or_insert(e)
        .clone())
}

/// The process's CUDA engine of device `ordinal` (made once; the GIL released while it is).
pub(crate) fn cuda_engine(py: Python<'_>, ordinal: u32) -> PyResult<Arc<RsCuda>> {
    static CUDA: Engines = OnceLock::new();
    kept(py, &CUDA, ordinal, || RsCuda::new(ordinal))
}

/// The CUDA engine of device `ordinal` that leaves the SMs to the caller's kernels
/// (`CudaConfig::compute_busy`, the rest of its configuration from the environment), one per
/// device and process.
pub(crate) fn busy_engine(py: Python<'_>, ordinal: u32) -> PyResult<Arc<RsCuda>> {
    static BUSY: Engines = OnceLock::new();
    let cfg = ferry::cuda::CudaConfig::from_env(ordinal)
        .map_err(|e| errors::arg(e.to_string()))?
        .compute_busy(true);
    kept(py, &BUSY, ordinal, || RsCuda::with_config(cfg))
}

/// True when the CUDA driver loaded (probed once per process).
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| ferry::cuda::probe().driver.is_ok())
}

/// The ordinal of the GPU holding device address `addr`, if the driver knows it.
pub(crate) fn device_of(addr: u64) -> Option<u32> {
    if !driver_present() {
        return None;
    }
    pointer_attr(
        addr,
        cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    )
}

/// One 32-bit pointer attribute of `addr`, or None when the driver does not know the address.
fn pointer_attr(addr: u64, attr: cudarc::driver::sys::CUpointer_attribute) -> Option<u32> {
    let mut v: u32 = 0;
    // SAFETY: the driver library is loaded (`driver_present`); the attribute queried is a
    // 32-bit value written into a local of that size; the driver only looks the address up in
    // its tables and never dereferences it.
    let r = unsafe {
        cudarc::driver::sys::cuPointerGetAttribute((&mut v as *mut u32).cast(), attr, addr)
    };
    (r == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(v)
}
