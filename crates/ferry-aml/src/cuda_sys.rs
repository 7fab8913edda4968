//! The CUDA driver calls of this library (cudarc's `sys` layer, loaded at run time): the only
//! place it calls the driver directly. Every function checks first that a driver is present
//! (ferry's probe) and is `-AML_ENOTSUP` otherwise, so the library links and runs everywhere.

use crate::error::{fail, AML_EINVAL, AML_ENOMEM, AML_ENOTSUP, AML_FAILURE};
use cudarc::driver::{sys, CudaContext};
use ferry::MemKind;
use ferry_capi::Fail;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The number of devices, or why CUDA is not usable here (probed once).
pub(crate) fn devices() -> Result<usize, Fail> {
    static PROBE: OnceLock<Result<usize, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let p = ferry::cuda::probe();
            match p.driver {
                Ok(_) if !p.devices.is_empty() => Ok(p.devices.len()),
                Ok(_) => Err("no CUDA device".into()),
                Err(e) => Err(e),
            }
        })
        .clone()
        .map_err(|e| fail(AML_ENOTSUP, format!("CUDA is not available: {e}")))
}

/// A driver result as an AML failure (out of memory: `AML_ENOMEM`).
fn check(what: &str, r: sys::CUresult) -> Result<(), Fail> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            Err(fail(AML_ENOMEM, format!("{what}: out of memory")))
        }
        sys::CUresult::CUDA_ERROR_INVALID_VALUE => Err(fail(AML_EINVAL, format!("{what}: {r:?}"))),
        e => Err(fail(AML_FAILURE, format!("{what} failed: {e:?}"))),
    }
}

/// The primary context of device `ordinal` (retained once, kept for the process).
pub(crate) fn context(ordinal: u32) -> Result<Arc<CudaContext>, Fail> {
    let n = devices()?;
    if ordinal as usize >= n {
        return Err(fail(AML_EINVAL, format!("device {ordinal}: there are {n}")));
    }
    static CTXS: OnceLock<Mutex<Vec<Option<Arc<CudaContext>>>>> = OnceLock::new();
    let mut c = CTXS
        .get_or_init(|| Mutex::new(vec![None; n]))
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(ctx) = &c[ordinal as usize] {
        return Ok(Arc::clone(ctx));
    }
    let ctx = CudaContext::new(ordinal as usize).map_err(|e| {
        fail(
            AML_FAILURE,
            format!("cuDevicePrimaryCtxRetain({ordinal}): {e:?}"),
        )
    })?;
    c[ordinal as usize] = Some(Arc::clone(&ctx));
    Ok(ctx)
}

/// The device of the calling thread's current context (CUDA's "current device"), 0 if none.
pub(crate) fn current_device() -> Result<u32, Fail> {
    devices()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle into a local.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    if ctx.is_null() {
        return Ok(0);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one device number into a local.
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    Ok(dev as u32)
}

/// Makes device `ordinal`'s primary context current on this thread.
pub(crate) fn bind(ordinal: u32) -> Result<Arc<CudaContext>, Fail> {
    let ctx = context(ordinal)?;
    ctx.bind_to_thread()
        .map_err(|e| fail(AML_FAILURE, format!("cuCtxSetCurrent: {e:?}")))?;
    Ok(ctx)
}

fn attribute(addr: u64, a: sys::CUpointer_attribute) -> Option<u32> {
    let mut v: u32 = 0;
    // SAFETY: one 4-byte attribute (memory type, is-managed, device ordinal are all 32-bit)
    // into a local; the driver only looks the address up and never dereferences it.
    let r = unsafe { sys::cuPointerGetAttribute((&mut v as *mut u32).cast(), a, addr) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

/// Where the memory at `addr` lives, as the driver knows it (unknown: pageable host memory).
pub(crate) fn kind_of(addr: u64) -> MemKind {
    if devices().is_err() {
        return MemKind::Pageable;
    }
    use sys::CUpointer_attribute as A;
    if attribute(addr, A::CU_POINTER_ATTRIBUTE_IS_MANAGED).is_some_and(|m| m != 0) {
        return MemKind::Managed;
    }
    match attribute(addr, A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
        Some(t) if t == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 => MemKind::Device {
            ordinal: attribute(addr, A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL).unwrap_or(0),
        },
        Some(t) if t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 => MemKind::Pinned,
        _ => MemKind::Pageable,
    }
}

/// How [`alloc`] allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alloc {
    /// Device memory.
    Device,
    /// Page-locked host memory (`portable`: for every context; `mapped`: in the device space).
    Host { portable: bool, mapped: bool },
    /// Managed memory (`global`: attached to every stream).
    Managed { global: bool },
    /// Registers existing host memory, mapped.
    Register { ptr: *mut c_void, portable: bool },
}

/// Allocates `size` bytes with device `ordinal`'s context current.
pub(crate) fn alloc(how: Alloc, size: usize, ordinal: u32) -> Result<*mut c_void, Fail> {
    bind(ordinal)?;
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: each call writes one pointer into a local (or registers the caller's range,
    // which the caller guarantees is valid host memory of `size` bytes).
    unsafe {
        match how {
            Alloc::Device => {
                check("cuMemAlloc", sys::cuMemAlloc_v2(&mut d, size))?;
                p = d as *mut c_void;
            }
            Alloc::Host { portable, mapped } => {
                let f = if portable { 1 } else { 0 } | if mapped { 2 } else { 0 };
                check("cuMemHostAlloc", sys::cuMemHostAlloc(&mut p, size, f))?;
            }
            Alloc::Managed { global } => {
                let f = if global { 1 } else { 2 };
                check("cuMemAllocManaged", sys::cuMemAllocManaged(&mut d, size, f))?;
                p = d as *mut c_void;
            }
            Alloc::Register { ptr, portable } => {
                let f = if portable { 1 } else { 0 } | 2;
                check("cuMemHostRegister", sys::cuMemHostRegister_v2(ptr, size, f))?;
                p = ptr;
            }
        }
    }
    Ok(p)
}

/// Frees what [`alloc`] allocated the same way.
///
/// # Safety
/// 1. `p` came from [`alloc`] with `how` and is not used afterwards.
pub(crate) unsafe fn free(how: Alloc, p: *mut c_void, ordinal: u32) -> Result<(), Fail> {
    bind(ordinal)?;
    // SAFETY: (1).
    unsafe {
        match how {
            Alloc::Device | Alloc::Managed { .. } => {
                check("cuMemFree", sys::cuMemFree_v2(p as u64))
            }
            Alloc::Host { .. } => check("cuMemFreeHost", sys::cuMemFreeHost(p)),
            Alloc::Register { .. } => check("cuMemHostUnregister", sys::cuMemHostUnregister(p)),
        }
    }
}

/// Enqueues a copy of `n` bytes (unified addresses: any direction) on `stream`.
///
/// # Safety
/// 1. `dst`/`src` are valid for `n` bytes until the copy completes; `stream` is a live stream
///    (or NULL, the legacy stream) of the current context.
pub(crate) unsafe fn memcpy_async(
    dst: u64,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> Result<(), Fail> {
    devices()?;
    // SAFETY: (1).
    check("cuMemcpyAsync", unsafe {
        sys::cuMemcpyAsync(dst, src, n, stream.cast())
    })
}

/// Enqueues a copy of `n` bytes from device `sdev` to device `ddev` on `stream`.
///
/// # Safety
/// As [`memcpy_async`], with `dst` on `ddev` and `src` on `sdev`.
pub(crate) unsafe fn memcpy_peer_async(
    dst: u64,
    ddev: u32,
    src: u64,
    sdev: u32,
    n: usize,
    stream: *mut c_void,
) -> Result<(), Fail> {
    let (dc, sc) = (context(ddev)?, context(sdev)?);
    // SAFETY: (1); both contexts are retained (kept for the process).
    check("cuMemcpyPeerAsync", unsafe {
        sys::cuMemcpyPeerAsync(dst, dc.cu_ctx(), src, sc.cu_ctx(), n, stream.cast())
    })
}
