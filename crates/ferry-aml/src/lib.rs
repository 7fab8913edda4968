//! libaml: AML's DMA API on ferry's engines, so that a C or C++ program written for AML
//! (`aml.h`, `aml/dma/{linux,cuda,multiplex}.h`, `aml/layout/{dense,reshape,pad}.h`,
//! `aml/area/{linux,cuda}.h`, `aml/utils/*.h`, `aml/higher/allocator*.h`, `aml/higher/mapper{,/visitor,/creator,/deepcopy,/replicaset}.h`, `aml/higher/replicaset.h`) builds unchanged against `include/` and
//! `-laml` (pkg-config `aml`), NUMA areas bind through the kernel's `mbind`, and its copies run on ferry: the Linux DMA on the CPU engine
//! (a large copy split across the workers), the CUDA DMA on the CUDA engine (copy engines,
//! staging, 2-D/3-D copies), the NULL operator as ferry's planned layout copy.
//!
//! What is AML's: names, signatures, struct layouts of the public structs, constant values,
//! operators that are C functions doing the copy, layouts that carry their pointer, NULL
//! requests reclaimed by the barrier, a multiplex that does not own its dmas. What differs
//! (documented in the headers): every bad argument is an error value (AML asserts); waiting for
//! one request waits for that request only; barriers return the first failure; device to
//! device works through `aml_dma_cuda_memcpy_op`; the multiplex accepts the same dma twice and
//! weights of 0; every CUDA symbol exists in every build and is `-AML_ENOTSUP` without a
//! driver. `ferry_last_error_message()` (ferry-capi) tells why the last call failed, and
//! `aml_perror` prints it.
//!
//! ferry's own C API (`ferry.h`, crate ferry-capi) is a different API; this crate shares its
//! panic guard and error classification.

pub mod area;
pub mod cuda;
mod cuda_sys;
pub mod dma;
pub mod error;
pub mod excit;
pub mod higher;
pub mod layout;
pub mod linux;
pub mod multiplex;
#[cfg(test)]
mod tests;
pub mod tiling;
pub mod utils;

use error::{guard, AML_SUCCESS};
use std::ffi::{c_char, c_int, c_ulong};

/// libnuma: the NUMA Linux area (on the kernel's `mbind`, without libnuma).
pub const AML_BACKEND_LIBNUMA: c_ulong = 1 << 1;
/// CUDA.
pub const AML_BACKEND_CUDA: c_ulong = 1 << 2;
/// hwloc (not a backend of this library).
pub const AML_BACKEND_HWLOC: c_ulong = 1 << 3;
/// OpenCL (not a backend of this library).
pub const AML_BACKEND_OPENCL: c_ulong = 1 << 4;
/// Level Zero (not a backend of this library).
pub const AML_BACKEND_ZE: c_ulong = 1 << 5;
/// HIP (not a backend of this library).
pub const AML_BACKEND_HIP: c_ulong = 1 << 6;

/// Initializes the library: creates the ready `aml_dma_linux`. `argc`/`argv` are unused (may
/// be NULL). Returns `AML_SUCCESS` or `-AML_FAILURE`.
///
/// # Safety
/// 1. None (the arguments are not read).
#[no_mangle]
pub unsafe extern "C" fn aml_init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> c_int {
    guard(|| Ok(linux::init_ready()))
}

/// Releases what `aml_init` and the ready DMAs made (after waiting for their work).
///
/// # Safety
/// 1. No other thread uses `aml_dma_linux` or `aml_dma_cuda` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn aml_finalize() -> c_int {
    guard(|| {
        linux::finalize_ready();
        cuda::finalize_ready();
        Ok(AML_SUCCESS)
    })
}

/// 1 if every backend in `backends` (`AML_BACKEND_*` flags) is usable here, else 0: libnuma
/// (the NUMA Linux area) always; CUDA is answered by ferry's probe (a driver and a device);
/// hwloc, OpenCL, Level Zero and HIP are not backends of this library (0).
///
/// # Safety
/// 1. None.
#[no_mangle]
pub unsafe extern "C" fn aml_support_backends(backends: c_ulong) -> c_int {
    let other = AML_BACKEND_HWLOC | AML_BACKEND_OPENCL | AML_BACKEND_ZE | AML_BACKEND_HIP;
    if backends & other != 0 {
        return 0;
    }
    if backends & AML_BACKEND_CUDA != 0 && cuda_sys::devices().is_err() {
        return 0;
    }
    1
}
