//! Error codes, the thread-local last error message, and the panic guard every entry point
//! runs in.

use ferry::{LayoutError, OpError, PlanError, RequestError, SubmitError};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Success.
pub const FERRY_SUCCESS: c_int = 0;
/// An invalid argument: a NULL pointer, a bad value, a handle of the wrong type.
pub const FERRY_EINVAL: c_int = 1;
/// A layout is invalid, or lies outside its buffer.
pub const FERRY_ELAYOUT: c_int = 2;
/// Two layouts cannot be copied into each other (shape or element size differ).
pub const FERRY_ESHAPE: c_int = 3;
/// Source and destination share bytes, or the destination layout overlaps itself.
pub const FERRY_EOVERLAP: c_int = 4;
/// The engine cannot reach memory of these kinds.
pub const FERRY_EUNSUPPORTED: c_int = 5;
/// The backend is not available in this build (or on this machine).
pub const FERRY_ENOTAVAIL: c_int = 6;
/// The engine is shut down.
pub const FERRY_ESHUTDOWN: c_int = 7;
/// A driver call failed; the message keeps the driver's own error string.
pub const FERRY_EDRIVER: c_int = 8;
/// The request ran and failed (its operator failed, a driver call failed, ...).
pub const FERRY_EREQUEST: c_int = 9;
/// A user operator reported an error while building its steps.
pub const FERRY_EOP: c_int = 10;
/// An internal error: a Rust panic was caught at the C boundary.
pub const FERRY_EPANIC: c_int = 11;

/// A failure on its way to C: a positive `FERRY_E*` code and the message for
/// `ferry_last_error_message`. ferry-aml (AML's API) maps the code to AML's.
#[derive(Debug)]
pub struct Fail {
    /// A positive `FERRY_E*` code.
    pub code: c_int,
    /// Why, for `ferry_last_error_message`.
    pub msg: String,
}

impl Fail {
    /// A failure with this code and message.
    pub fn new(code: c_int, msg: impl Into<String>) -> Fail {
        Fail {
            code,
            msg: msg.into(),
        }
    }
    /// A `FERRY_EINVAL` failure.
    pub fn inval(msg: impl Into<String>) -> Fail {
        Fail::new(FERRY_EINVAL, msg)
    }
}

impl From<LayoutError> for Fail {
    fn from(e: LayoutError) -> Fail {
        Fail::new(FERRY_ELAYOUT, e.to_string())
    }
}

fn plan_code(e: &PlanError) -> c_int {
    match e {
        PlanError::Overlap { .. } | PlanError::DstSelfOverlap { .. } => FERRY_EOVERLAP,
        _ => FERRY_ESHAPE,
    }
}

/// The code for an operator error.
pub(crate) fn op_code(e: &OpError) -> c_int {
    match e {
        OpError::Layout(_) | OpError::Dst(_) | OpError::Src(_) => FERRY_ELAYOUT,
        OpError::Plan(p) => plan_code(p),
        OpError::Custom(_) => FERRY_EOP,
        _ => FERRY_EINVAL,
    }
}

impl From<OpError> for Fail {
    fn from(e: OpError) -> Fail {
        Fail::new(op_code(&e), e.to_string())
    }
}

impl From<SubmitError> for Fail {
    fn from(e: SubmitError) -> Fail {
        let code = match &e {
            SubmitError::Op(o) => op_code(o),
            SubmitError::Unsupported { .. } => FERRY_EUNSUPPORTED,
            SubmitError::Overlap(p) => plan_code(p),
            SubmitError::Null => FERRY_EINVAL,
            SubmitError::ShutDown(_) => FERRY_ESHUTDOWN,
            SubmitError::Backend(_) if e.driver_error().is_some() => FERRY_EDRIVER,
            _ => FERRY_EINVAL,
        };
        Fail::new(code, e.to_string())
    }
}

/// A failed request, with its id in the message.
pub(crate) fn request_fail(id: u64, e: &RequestError) -> Fail {
    Fail::new(FERRY_EREQUEST, format!("request #{id} failed: {e}"))
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A C string from any text (interior NULs become spaces).
/// A NUL-terminated UTF-8 string argument, or `-FERRY_EINVAL` naming it.
///
/// # Safety
/// 1. `p` is NULL or a NUL-terminated string that outlives the returned borrow.
pub(crate) unsafe fn utf8<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(Fail::inval(format!("{what} is NULL")));
    }
    // SAFETY: (1).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Fail::inval(format!("{what} is not UTF-8")))
}

pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Sets the calling thread's last error message (`ferry_last_error_message`).
pub fn set_last_error(msg: &str) {
    LAST_ERROR.with(|l| *l.borrow_mut() = c_string(msg));
}

/// Runs an entry point's body: its value, or its failure, with a panic turned into a
/// `FERRY_EPANIC` failure (it never unwinds into C); the failure's message is stored for
/// `ferry_last_error_message`. The one panic guard of both C APIs (ferry.h, and AML's in
/// ferry-aml, which maps the code).
pub fn catch(f: impl FnOnce() -> Result<c_int, Fail>) -> Result<c_int, Fail> {
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            Err(Fail::new(
                FERRY_EPANIC,
                format!("internal error (panic caught at the C boundary): {msg}"),
            ))
        }
    };
    if let Err(fail) = &r {
        set_last_error(&fail.msg);
    }
    r
}

/// Runs an entry point: returns its value, or stores the failure's message and returns its
/// negative code; a panic becomes `-FERRY_EPANIC` and never unwinds into C.
pub(crate) fn guard(f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    catch(f).unwrap_or_else(|fail| -fail.code)
}

/// The message of the last failure on the calling thread: the Rust error's `Display`, e.g.
/// `layout ends at byte 4096 but the buffer has 4000 bytes`. An empty string if no call on
/// this thread has failed yet.
///
/// Only calls that fail (return a negative code, or a barrier that reports failures) set it;
/// successful calls leave it as it was, like `errno`.
///
/// # Safety
/// 1. The returned pointer is valid, and NUL-terminated, until the next ferry call on the same
///    thread; the caller must not free it, and must copy the text to keep it longer.
#[no_mangle]
pub unsafe extern "C" fn ferry_last_error_message() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// A static description of an error code, positive or negative (`ferry_strerror(-FERRY_EINVAL)`
/// and `ferry_strerror(FERRY_EINVAL)` give the same text); `"unknown error code"` for any other
/// value. Never NULL.
///
/// # Safety
/// 1. None: the returned string is static and must not be freed or written.
#[no_mangle]
pub unsafe extern "C" fn ferry_strerror(code: c_int) -> *const c_char {
    strerror(code).as_ptr()
}

pub(crate) fn strerror(code: c_int) -> &'static std::ffi::CStr {
    match code.checked_abs().unwrap_or(-1) {
        FERRY_SUCCESS => c"success",
        FERRY_EINVAL => c"invalid argument",
        FERRY_ELAYOUT => c"invalid layout, or layout outside its buffer",
        FERRY_ESHAPE => c"layouts cannot be copied into each other",
        FERRY_EOVERLAP => c"source and destination overlap",
        FERRY_EUNSUPPORTED => c"engine cannot reach memory of these kinds",
        FERRY_ENOTAVAIL => c"not available on this machine",
        FERRY_ESHUTDOWN => c"engine is shut down",
        FERRY_EDRIVER => c"driver call failed",
        FERRY_EREQUEST => c"request failed",
        FERRY_EOP => c"operator failed",
        FERRY_EPANIC => c"internal error (panic caught)",
        _ => c"unknown error code",
    }
}

/// Checks a C out-pointer and returns it as a mutable reference.
///
/// # Safety
/// 1. `p` is NULL or valid for writes of one `T`.
pub(crate) unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Fail> {
    // SAFETY: non-null checked here; validity for writes is the caller's guarantee (1).
    unsafe { p.as_mut() }.ok_or_else(|| Fail::inval(format!("{what} is NULL")))
}

/// A C array as a slice.
///
/// # Safety
/// 1. `p` is NULL or valid for reads of `n` `T`s.
pub(crate) unsafe fn array<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T], Fail> {
    if p.is_null() {
        return Err(Fail::inval(format!("{what} is NULL")));
    }
    // SAFETY: non-null checked; validity for `n` reads is the caller's guarantee (1).
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}
