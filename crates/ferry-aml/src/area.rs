//! Areas (`aml.h`, `aml/area/linux.h`, `aml/area/cuda.h`): where `aml_area_mmap` allocates.
//!
//! - `aml_area_linux` and `aml_area_linux_create(&area, nodemask, policy)` (module `linux`):
//!   `mmap` with AML's options, NUMA policies through the kernel's `mbind`.
//! - `aml_area_cuda` (device memory of the current device), `aml_area_cuda_unified`, and
//!   `aml_area_cuda_create(&area, device, flags)` with AML's flags: `ALLOC_HOST` (pinned host
//!   memory), `ALLOC_MAPPED` (pinned and mapped; without `ALLOC_HOST` it registers the
//!   options' `ptr`), `ALLOC_UNIFIED` (managed), `ALLOC_GLOBAL` (portable / attached
//!   globally). Without a CUDA driver: `-AML_ENOTSUP`.

use crate::cuda_sys::{self, Alloc};
use crate::error::{fail, guard, guard_ptr, guard_void, inval, AML_SUCCESS};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_void};

/// `struct aml_area_ops`.
#[repr(C)]
pub struct AmlAreaOps {
    /// Allocates `size` bytes.
    pub mmap: Option<unsafe extern "C" fn(*const c_void, usize, *mut c_void) -> *mut c_void>,
    /// Frees what `mmap` returned.
    pub munmap: Option<unsafe extern "C" fn(*const c_void, *mut c_void, usize) -> c_int>,
    /// Prints the area.
    pub fprintf:
        Option<unsafe extern "C" fn(*const c_void, *mut libc::FILE, *const c_char) -> c_int>,
}

/// `struct aml_area`.
#[repr(C)]
pub struct AmlArea {
    /// The area's functions.
    pub ops: *const AmlAreaOps,
    /// Implementation data.
    pub data: *mut c_void,
}

// SAFETY: pointers to immutable tables and data.
unsafe impl Sync for AmlArea {}

/// Default CUDA area flags: device memory.
pub const AML_AREA_CUDA_FLAG_DEFAULT: c_int = 0;
/// Page-locked host memory.
pub const AML_AREA_CUDA_FLAG_ALLOC_HOST: c_int = 1;
/// Managed (unified) memory.
pub const AML_AREA_CUDA_FLAG_ALLOC_UNIFIED: c_int = 2;
/// Host memory mapped into the device.
pub const AML_AREA_CUDA_FLAG_ALLOC_MAPPED: c_int = 4;
/// Visible to every device (portable / attached globally).
pub const AML_AREA_CUDA_FLAG_ALLOC_GLOBAL: c_int = 8;

/// `struct aml_area_cuda_data`.
#[repr(C)]
pub struct AmlAreaCudaData {
    /// `AML_AREA_CUDA_FLAG_*`.
    pub flags: c_int,
    /// The device (-1: the current one).
    pub device: c_int,
}

/// `struct aml_area_cuda_mmap_options`.
#[repr(C)]
pub struct AmlAreaCudaMmapOptions {
    /// The device (-1 or 0: the area's).
    pub device: c_int,
    /// Host memory to register (mapped without `ALLOC_HOST`).
    pub ptr: *mut c_void,
}

/// Allocates `size` bytes in `area`; NULL with `aml_errno` on failure (`AML_EINVAL` for a
/// NULL area). Size 0 is NULL with `aml_errno` untouched, as AML.
///
/// # Safety
/// 1. `area` is NULL or valid; `opts` NULL or what the area expects.
#[no_mangle]
pub unsafe extern "C" fn aml_area_mmap(
    area: *const AmlArea,
    size: usize,
    opts: *mut c_void,
) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    guard_ptr(|| {
        // SAFETY: (1).
        let a = unsafe { area.as_ref() }.ok_or_else(|| inval("area is NULL"))?;
        // SAFETY: (1).
        let f = unsafe { a.ops.as_ref() }
            .and_then(|o| o.mmap)
            .ok_or_else(|| fail(crate::error::AML_ENOTSUP, "area has no mmap"))?;
        // SAFETY: (1).
        let p = unsafe { f(a.data, size, opts) };
        if p.is_null() {
            // The area set aml_errno (an area written for AML may leave it 0).
            let code = match crate::error::errno() {
                0 => crate::error::AML_FAILURE,
                c => c,
            };
            return Err(fail(code, "area mmap failed"));
        }
        Ok(p)
    })
}

/// Frees `size` bytes at `ptr` from `area`. A NULL `ptr` or a size 0 is a no-op
/// (`AML_SUCCESS`), as AML; a NULL area is `-AML_EINVAL`.
///
/// # Safety
/// 1. `area` NULL or valid; `ptr` from `aml_area_mmap(area, size, ...)`.
#[no_mangle]
pub unsafe extern "C" fn aml_area_munmap(
    area: *const AmlArea,
    ptr: *mut c_void,
    size: usize,
) -> c_int {
    if ptr.is_null() || size == 0 {
        return AML_SUCCESS;
    }
    guard(|| {
        // SAFETY: (1).
        let a = unsafe { area.as_ref() }.ok_or_else(|| inval("area is NULL"))?;
        // SAFETY: (1).
        let f = unsafe { a.ops.as_ref() }
            .and_then(|o| o.munmap)
            .ok_or_else(|| fail(crate::error::AML_ENOTSUP, "area has no munmap"))?;
        // SAFETY: (1).
        Ok(unsafe { f(a.data, ptr, size) })
    })
}

/// Prints a description of the area.
///
/// # Safety
/// 1. `stream` NULL or a valid `FILE *`; `prefix` NULL or a C string; `area` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_area_fprintf(
    stream: *mut libc::FILE,
    prefix: *const c_char,
    area: *const AmlArea,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let a = unsafe { area.as_ref() }.ok_or_else(|| inval("area is NULL"))?;
        if stream.is_null() {
            return Err(inval("stream is NULL"));
        }
        let p = if prefix.is_null() {
            c"".as_ptr()
        } else {
            prefix
        };
        // SAFETY: (1).
        match unsafe { a.ops.as_ref() }.and_then(|o| o.fprintf) {
            // SAFETY: (1).
            Some(f) => Ok(unsafe { f(a.data, stream, p) }),
            // SAFETY: (1).
            None => Ok(unsafe { crate::dma::print(stream, p, &format!("area: {:p}", a.data)) }),
        }
    })
}

/// Prints a CUDA area as AML does (its data, device, flags, mapped, global).
///
/// # Safety
/// 1. `data` NULL or a CUDA area's data; `stream` a valid `FILE *`; `prefix` NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_area_cuda_fprintf(
    data: *const c_void,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    guard(|| {
        let mut lines = vec![format!("area-cuda: {data:p}")];
        // SAFETY: (1).
        if let Some(d) = unsafe { data.cast::<AmlAreaCudaData>().as_ref() } {
            let kind = match d.flags & 3 {
                AML_AREA_CUDA_FLAG_ALLOC_HOST => "host",
                AML_AREA_CUDA_FLAG_ALLOC_UNIFIED => "unified",
                _ => "default",
            };
            let yes = |f: c_int| if d.flags & f != 0 { "yes" } else { "no" };
            lines.push(format!("device: {}", d.device));
            lines.push(format!("flags: {kind}"));
            lines.push(format!("mapped: {}", yes(AML_AREA_CUDA_FLAG_ALLOC_MAPPED)));
            lines.push(format!("global: {}", yes(AML_AREA_CUDA_FLAG_ALLOC_GLOBAL)));
        }
        // SAFETY: (1).
        unsafe { crate::dma::print_lines(stream, prefix, &lines) }
    })
}

/// The CUDA area's methods.
#[no_mangle]
pub static aml_area_cuda_ops: AmlAreaOps = AmlAreaOps {
    mmap: Some(aml_area_cuda_mmap),
    munmap: Some(aml_area_cuda_munmap),
    fprintf: Some(aml_area_cuda_fprintf),
};

static CUDA_DEFAULT: AmlAreaCudaData = AmlAreaCudaData {
    flags: 0,
    device: -1,
};
static CUDA_UNIFIED: AmlAreaCudaData = AmlAreaCudaData {
    flags: AML_AREA_CUDA_FLAG_ALLOC_UNIFIED,
    device: -1,
};

/// Device memory of the current device.
#[no_mangle]
pub static aml_area_cuda: AmlArea = AmlArea {
    ops: &aml_area_cuda_ops,
    data: &CUDA_DEFAULT as *const AmlAreaCudaData as *mut c_void,
};

/// Managed memory.
#[no_mangle]
pub static aml_area_cuda_unified: AmlArea = AmlArea {
    ops: &aml_area_cuda_ops,
    data: &CUDA_UNIFIED as *const AmlAreaCudaData as *mut c_void,
};

/// How an area with `flags` allocates.
fn how(flags: c_int, ptr: *mut c_void) -> Alloc {
    let global = flags & AML_AREA_CUDA_FLAG_ALLOC_GLOBAL != 0;
    if flags & AML_AREA_CUDA_FLAG_ALLOC_UNIFIED != 0 {
        Alloc::Managed { global }
    } else if flags & AML_AREA_CUDA_FLAG_ALLOC_MAPPED != 0 {
        if flags & AML_AREA_CUDA_FLAG_ALLOC_HOST != 0 {
            Alloc::Host {
                portable: global,
                mapped: true,
            }
        } else {
            Alloc::Register {
                ptr,
                portable: global,
            }
        }
    } else if flags & AML_AREA_CUDA_FLAG_ALLOC_HOST != 0 {
        Alloc::Host {
            portable: global,
            mapped: false,
        }
    } else {
        Alloc::Device
    }
}

/// The area's data and the device to use.
///
/// # Safety
/// 1. `data` NULL or an `aml_area_cuda_data`; `opts` NULL or an `aml_area_cuda_mmap_options`.
unsafe fn target(
    data: *const c_void,
    opts: *const c_void,
) -> Result<(c_int, u32, *mut c_void), Fail> {
    // SAFETY: (1).
    let d: &AmlAreaCudaData = unsafe { data.cast::<AmlAreaCudaData>().as_ref() }
        .ok_or_else(|| inval("area data is NULL"))?;
    // SAFETY: (1).
    let o = unsafe { opts.cast::<AmlAreaCudaMmapOptions>().as_ref() };
    let dev = match o.map(|o| o.device).filter(|&x| x > 0).unwrap_or(d.device) {
        x if x < 0 => cuda_sys::current_device()?,
        x => x as u32,
    };
    Ok((d.flags, dev, o.map_or(std::ptr::null_mut(), |o| o.ptr)))
}

/// The CUDA area's mmap (see the module doc); NULL with `aml_errno` on failure.
///
/// # Safety
/// 1. `area_data` an `aml_area_cuda_data`; `options` NULL or an `aml_area_cuda_mmap_options`
///    (its `ptr` valid host memory of `size` bytes when it is registered).
#[no_mangle]
pub unsafe extern "C" fn aml_area_cuda_mmap(
    area_data: *const c_void,
    size: usize,
    options: *mut c_void,
) -> *mut c_void {
    guard_ptr(|| {
        cuda_sys::devices()?;
        // SAFETY: (1).
        let (flags, dev, ptr) = unsafe { target(area_data, options) }?;
        let h = how(flags, ptr);
        if let Alloc::Register { ptr, .. } = h {
            if ptr.is_null() {
                return Err(inval(
                    "ALLOC_MAPPED without ALLOC_HOST needs the options' ptr",
                ));
            }
        }
        cuda_sys::alloc(h, size, dev)
    })
}

/// The CUDA area's munmap.
///
/// # Safety
/// 1. `ptr` from `aml_area_cuda_mmap` on the same area data.
#[no_mangle]
pub unsafe extern "C" fn aml_area_cuda_munmap(
    area_data: *const c_void,
    ptr: *mut c_void,
    _size: usize,
) -> c_int {
    guard(|| {
        cuda_sys::devices()?;
        // SAFETY: (1).
        let (flags, dev, _) = unsafe { target(area_data, std::ptr::null()) }?;
        // SAFETY: (1).
        unsafe { cuda_sys::free(how(flags, ptr), ptr, dev) }?;
        Ok(AML_SUCCESS)
    })
}

/// Creates a CUDA area on `device` (-1: the current one) with `flags`. `-AML_FAILURE` without
/// CUDA (as AML), `-AML_EINVAL` for a NULL area or a device that does not exist.
///
/// # Safety
/// 1. `area` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_area_cuda_create(
    area: *mut *mut AmlArea,
    device: c_int,
    flags: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { area.as_mut() }.ok_or_else(|| inval("area is NULL"))?;
        let n = cuda_sys::devices().map_err(crate::error::unsupported_is_failure)?;
        if device >= 0 && device as usize >= n {
            return Err(inval(format!("device {device}: there are {n}")));
        }
        let data = Box::into_raw(Box::new(AmlAreaCudaData {
            flags,
            device: device.max(-1),
        }));
        *out = Box::into_raw(Box::new(AmlArea {
            ops: &aml_area_cuda_ops,
            data: data.cast(),
        }));
        Ok(AML_SUCCESS)
    })
}

/// Destroys an area from `aml_area_cuda_create` and sets `*area` to NULL.
///
/// # Safety
/// 1. `area` NULL or valid; `*area` NULL or such an area, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_area_cuda_destroy(area: *mut *mut AmlArea) {
    guard_void(|| {
        // SAFETY: (1).
        let Some(slot) = (unsafe { area.as_mut() }) else {
            return Ok(AML_SUCCESS);
        };
        if slot.is_null() {
            return Ok(AML_SUCCESS);
        }
        // SAFETY: (1): both from `Box::into_raw` in create.
        unsafe {
            drop(Box::from_raw((**slot).data.cast::<AmlAreaCudaData>()));
            drop(Box::from_raw(*slot));
        }
        *slot = std::ptr::null_mut();
        Ok(AML_SUCCESS)
    })
}

mod linux;
pub use linux::*;
