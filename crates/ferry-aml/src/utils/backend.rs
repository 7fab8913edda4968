//! `aml/utils/backend/linux.h`: the Linux backend's setup, the ready `aml_dma_linux` (what
//! `aml_init` and `aml_finalize` do for it).

use crate::error::guard;
use std::ffi::c_int;

/// Creates the ready `aml_dma_linux` (one worker per core; AML: 32) if it is not there.
/// `AML_SUCCESS`, or the creation's failure.
///
/// # Safety
/// 1. None (as `aml_init`).
#[no_mangle]
pub unsafe extern "C" fn aml_backend_linux_init() -> c_int {
    guard(|| Ok(crate::linux::init_ready()))
}

/// Destroys the ready `aml_dma_linux` (after waiting for its work). `AML_SUCCESS`.
///
/// # Safety
/// 1. No other thread uses `aml_dma_linux` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn aml_backend_linux_finalize() -> c_int {
    guard(|| {
        crate::linux::finalize_ready();
        Ok(crate::error::AML_SUCCESS)
    })
}
