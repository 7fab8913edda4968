//! AML's error values, `aml_errno`, the strings, and the guard every entry point runs in
//! (ferry-capi's panic guard, with ferry's codes mapped to AML's).

use ferry_capi::{
    Fail, FERRY_EINVAL, FERRY_ELAYOUT, FERRY_ENOTAVAIL, FERRY_EOVERLAP, FERRY_ESHAPE,
    FERRY_EUNSUPPORTED,
};
use std::ffi::{c_char, c_int, CStr};
use std::io::Write;
use std::sync::atomic::{AtomicI32, Ordering};

/// Success.
pub const AML_SUCCESS: c_int = 0;
/// Generic error.
pub const AML_FAILURE: c_int = 1;
/// Not enough memory.
pub const AML_ENOMEM: c_int = 2;
/// Invalid argument.
pub const AML_EINVAL: c_int = 3;
/// Value out of bound.
pub const AML_EDOM: c_int = 4;
/// Operation not supported (e.g. a CUDA call without a CUDA driver).
pub const AML_ENOTSUP: c_int = 5;
/// Underlying resource is not available for operation.
pub const AML_EBUSY: c_int = 6;
/// Insufficient permissions.
pub const AML_EPERM: c_int = 7;
/// One past the last error value.
pub const AML_ERROR_MAX: c_int = 8;

/// The error of the last failed call that returns a pointer (as AML: a process-wide `int`,
/// holding a positive code, as AML's generic area and `aml_perror` use it). An `AtomicI32` has
/// the layout of a C `int`.
#[no_mangle]
pub static aml_errno: AtomicI32 = AtomicI32::new(0);

/// A failure with an AML code (positive) and a message for `ferry_last_error_message`.
pub(crate) fn fail(code: c_int, msg: impl Into<String>) -> Fail {
    // Stored with the AML code offset, so that `code_of` can tell it from ferry's own codes.
    Fail::new(AML_BASE + code, msg)
}

/// A create function's failure as AML reports it: without a CUDA driver or device AML's
/// constructors return `-AML_FAILURE` (other calls keep `-AML_ENOTSUP`); the reason is kept.
pub(crate) fn unsupported_is_failure(f: Fail) -> Fail {
    if code_of(&f) == AML_ENOTSUP {
        return fail(AML_FAILURE, f.msg);
    }
    f
}

/// `-AML_EINVAL` with a message.
pub(crate) fn inval(msg: impl Into<String>) -> Fail {
    fail(AML_EINVAL, msg)
}

/// AML codes travel in a [`Fail`] above ferry's codes (which are below 100).
const AML_BASE: c_int = 1000;

/// The AML code of a failure: its own, or ferry's code mapped.
pub(crate) fn code_of(f: &Fail) -> c_int {
    if f.code >= AML_BASE {
        return f.code - AML_BASE;
    }
    match f.code {
        FERRY_EINVAL | FERRY_ELAYOUT | FERRY_ESHAPE | FERRY_EOVERLAP => AML_EINVAL,
        FERRY_EUNSUPPORTED | FERRY_ENOTAVAIL => AML_ENOTSUP,
        _ => AML_FAILURE,
    }
}

/// Runs an entry point returning an AML code: its value, or its failure's code negated (the
/// message kept for `ferry_last_error_message`). A panic is `-AML_FAILURE`, never unwinding.
pub(crate) fn guard(f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    ferry_capi::catch(f).unwrap_or_else(|e| -code_of(&e))
}

/// Sets `aml_errno` to the code of `rc` (positive, whatever the sign of `rc`).
pub(crate) fn set_errno(rc: c_int) {
    aml_errno.store(rc.saturating_abs(), Ordering::Relaxed);
}

/// `aml_errno` as a positive code (a C program may have stored a negated one).
pub(crate) fn errno() -> c_int {
    aml_errno.load(Ordering::Relaxed).saturating_abs()
}

/// Runs an entry point returning a pointer: the pointer, or NULL with `aml_errno` set to the
/// (positive) code.
pub(crate) fn guard_ptr<T>(f: impl FnOnce() -> Result<*mut T, Fail>) -> *mut T {
    let mut p = std::ptr::null_mut();
    let rc = guard(|| {
        p = f()?;
        Ok(AML_SUCCESS)
    });
    if rc != AML_SUCCESS {
        set_errno(rc);
        return std::ptr::null_mut();
    }
    p
}

/// [`guard_ptr`] without the unwind guard, for the address calls that AML's kernels make
/// once per tile or element (`aml_tiling_rawptr`, `aml_layout_deref`): `r` comes from code
/// that cannot panic (no indexing, no allocation but an error's message), so there is
/// nothing to catch, and the guard's calls would cost more than the address arithmetic.
pub(crate) fn plain_ptr<T>(r: Result<*mut T, Fail>) -> *mut T {
    match r {
        Ok(p) => p,
        Err(e) => {
            ferry_capi::set_last_error(&e.msg);
            set_errno(code_of(&e));
            std::ptr::null_mut()
        }
    }
}

/// [`plain_ptr`] for an entry point returning an AML code: the value, or the failure's code
/// negated (its message kept). For the dispatch calls that run once per allocation
/// (`aml_alloc`, `aml_free`): they do nothing that can panic but call an op, and an op that
/// panics cannot unwind out of its `extern "C"` function.
pub(crate) fn plain(r: Result<c_int, Fail>) -> c_int {
    match r {
        Ok(rc) => rc,
        Err(e) => {
            ferry_capi::set_last_error(&e.msg);
            -code_of(&e)
        }
    }
}

/// Runs an entry point that returns nothing in C; a failure only sets `aml_errno`.
pub(crate) fn guard_void(f: impl FnOnce() -> Result<c_int, Fail>) {
    let rc = guard(f);
    if rc < 0 {
        set_errno(rc);
    }
}

/// The AML code of a submit failure (out of device memory is `AML_ENOMEM`).
pub(crate) fn submit_fail(e: ferry::SubmitError) -> Fail {
    if e.driver_error().is_some_and(|d| d.is_out_of_memory()) {
        return fail(AML_ENOMEM, e.to_string());
    }
    Fail::from(e)
}

/// The AML code of a failed request: an AML operator's own return value, else
/// `-AML_FAILURE` (`-AML_ENOMEM` when the driver ran out of memory).
pub(crate) fn request_code(e: &ferry::RequestError) -> c_int {
    if let Some(rc) = crate::dma::operator_rc(e) {
        return rc;
    }
    if e.driver_error().is_some_and(|d| d.is_out_of_memory()) {
        return -AML_ENOMEM;
    }
    ferry_capi::set_last_error(&e.to_string());
    -AML_FAILURE
}

fn strerror(err: c_int) -> &'static CStr {
    match err.checked_abs().unwrap_or(-1) {
        AML_SUCCESS => c"Success",
        AML_FAILURE => c"Generic error",
        AML_ENOMEM => c"Not enough memory",
        AML_EINVAL => c"Invalid argument",
        AML_EDOM => c"Value out of bound",
        AML_ENOTSUP => c"Operation not supported",
        AML_EBUSY => c"Underlying resource is not available for operation",
        AML_EPERM => c"Insufficient permissions",
        _ => c"Unknown error",
    }
}

/// A static description of an AML error value, given as returned (negated) or positive
/// (AML itself answers "Unknown error" for negated values, which its own tutorials pass).
///
/// # Safety
/// 1. None: the string is static; the caller must not free or write it.
#[no_mangle]
pub unsafe extern "C" fn aml_strerror(err: c_int) -> *const c_char {
    strerror(err).as_ptr()
}

/// Prints `msg:` and the description of `aml_errno` on standard error, then the reason of the
/// last failure on this thread (`ferry_last_error_message`) when there is one.
///
/// # Safety
/// 1. `msg` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn aml_perror(msg: *const c_char) {
    let m = if msg.is_null() {
        String::new()
    } else {
        // SAFETY: (1).
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    };
    let e = strerror(aml_errno.load(Ordering::Relaxed)).to_string_lossy();
    // SAFETY: the last error message is a valid C string until the next ferry call here.
    let why = unsafe { CStr::from_ptr(ferry_capi::ferry_last_error_message()) }.to_string_lossy();
    // A standard error that cannot be written (a full disk, a closed pipe) is ignored, as
    // AML's `fprintf` ignores it (`eprintln!` panicked, and the panic aborted across the C
    // boundary).
    let mut err = std::io::stderr().lock();
    let _ = if why.is_empty() {
        writeln!(err, "{m}:{e}")
    } else {
        writeln!(err, "{m}:{e} ({why})")
    };
}
