//! The null CUDA driver's control API (`bench/null-cuda/null_cuda.c`), for tests: inject driver
//! failures, switch its asynchronous mode, count the work still queued.
//!
//! The null driver is the `libcuda.so.1` that `scripts/null-cuda-test.sh` puts first on
//! `LD_LIBRARY_PATH`; its control functions are found in the loaded library with
//! `dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)` + `dlsym`. With the real driver loaded
//! (or none) they are absent: [`is_null_driver`] is false, [`pending`] is `None`, and the
//! other functions do nothing and return `false`.
//!
//! Its settings are process-wide: a failure armed by one test is met by whichever thread
//! calls that entry point next, so tests that arm failures or change the delay take
//! [`exclusive`] (which also undoes both when the test ends, even by a panic) and live in a
//! binary whose other tests either take it too or never reach the entry points armed.
#![allow(dead_code)]

use cudarc::driver::sys::CUresult;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The device name the null driver reports.
pub const DEVICE_NAME: &str = "null CUDA driver";

struct Api {
    fail: unsafe extern "C" fn(*const c_char, c_int, c_int),
    clear: unsafe extern "C" fn(),
    pending: unsafe extern "C" fn() -> c_int,
    set_async: unsafe extern "C" fn(c_int),
}

/// The control functions of the loaded driver, if it is the null one.
fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(|| {
        // The driver is loaded by cudarc on first use; the probe makes sure it is.
        ferry::cuda::probe().driver.ok()?;
        // SAFETY: RTLD_NOLOAD only returns a library already loaded (it loads and runs
        // nothing); the name is a NUL-terminated literal. The handle is never closed.
        let lib =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if lib.is_null() {
            return None;
        }
        let sym = |name: &CStr| -> Option<*mut c_void> {
            // SAFETY: `lib` is a live handle (never closed); `name` is NUL-terminated.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let (fail, clear, pending, set_async) = (
            sym(c"nullcuda_fail")?,
            sym(c"nullcuda_clear")?,
            sym(c"nullcuda_pending")?,
            sym(c"nullcuda_async")?,
        );
        // SAFETY: the null driver defines these symbols as functions with exactly these C
        // signatures (`void nullcuda_fail(const char *, int, int)`, `void nullcuda_clear(void)`,
        // `int nullcuda_pending(void)`, `void nullcuda_async(int)`); its library stays loaded
        // for the life of the process (cudarc never unloads it, and the handle above holds it).
        unsafe {
            Some(Api {
                fail: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*const c_char, c_int, c_int),
                >(fail),
                clear: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(clear),
                pending: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(
                    pending,
                ),
                set_async: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(
                    set_async,
                ),
            })
        }
    })
    .as_ref()
}

/// Whether the loaded CUDA driver is the null one (its control API is present).
pub fn is_null_driver() -> bool {
    api().is_some()
}

/// Operations enqueued on any stream of the null driver and not yet done; `None` on another
/// driver.
pub fn pending() -> Option<usize> {
    // SAFETY: a function of the null driver taking nothing (see `api`).
    api().map(|a| unsafe { (a.pending)() }.max(0) as usize)
}

/// Makes the `nth` next call (1: the very next) of driver entry point `entry_point` (its
/// exported name, e.g. `"cuMemcpyHtoDAsync_v2"`, `"cuEventRecord"`) return `code` without
/// doing anything. Several may be armed at once. Returns whether the failure was armed
/// (false: not the null driver, or a name with a NUL byte).
pub fn fail(entry_point: &str, nth: i32, code: CUresult) -> bool {
    let (Some(a), Ok(name)) = (api(), CString::new(entry_point)) else {
        return false;
    };
    // SAFETY: a function of the null driver; `name` is a NUL-terminated string it copies.
    // `code` is a value of `CUresult`, so the driver returns only codes Rust can represent.
    unsafe { (a.fail)(name.as_ptr(), nth, code as c_int) };
    true
}

/// Forgets every failure armed (nothing on another driver).
pub fn clear() {
    if let Some(a) = api() {
        // SAFETY: a function of the null driver taking nothing.
        unsafe { (a.clear)() }
    }
}

/// Sets the null driver's delay per operation in microseconds: above 0 the work enqueued on
/// a stream runs later on that stream's worker thread; 0 makes it synchronous again. Returns
/// whether it was set (false: not the null driver).
pub fn set_async(usec: i32) -> bool {
    let Some(a) = api() else { return false };
    // SAFETY: a function of the null driver taking a plain integer.
    unsafe { (a.set_async)(usec) };
    true
}

/// Whether the loaded driver is the null one in its synchronous mode (`NULL_CUDA_ASYNC` unset
/// or 0): every copy, fill and record has completed when the call returns, so nothing a test
/// submits is ever seen in flight.
pub fn is_synchronous() -> bool {
    is_null_driver() && default_async() == 0
}

/// The delay `NULL_CUDA_ASYNC` set for this process (0 when unset).
pub fn default_async() -> i32 {
    std::env::var("NULL_CUDA_ASYNC")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The null driver to one test: see [`exclusive`].
pub struct Exclusive {
    _serial: MutexGuard<'static, ()>,
}

/// Serializes the tests of this binary that take it, and when dropped (at the end of the
/// test, or in its unwinding) forgets the failures armed and restores the delay of
/// `NULL_CUDA_ASYNC`.
pub fn exclusive() -> Exclusive {
    static SERIAL: Mutex<()> = Mutex::new(());
    Exclusive {
        _serial: SERIAL.lock().unwrap_or_else(PoisonError::into_inner),
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        clear();
        set_async(default_async());
    }
}
