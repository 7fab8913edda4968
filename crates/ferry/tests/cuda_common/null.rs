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
use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The device name the null driver reports.
pub const DEVICE_NAME: &str = "null CUDA driver";

struct Api {
    fail: unsafe extern "C" fn(*const c_char, c_int, c_int),
    clear: unsafe extern "C" fn(),
    pending: unsafe extern "C" fn() -> c_int,
    set_async: unsafe extern "C" fn(c_int),
    count: unsafe extern "C" fn(c_int),
    calls: unsafe extern "C" fn(*const c_char) -> c_long,
    batch_attrs: unsafe extern "C" fn(*mut c_long, c_int) -> c_int,
    batch_fail_at: unsafe extern "C" fn(c_int),
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
        let (count, calls, batch_attrs, batch_fail_at) = (
            sym(c"nullcuda_count")?,
            sym(c"nullcuda_calls")?,
            sym(c"nullcuda_batch_attrs")?,
            sym(c"nullcuda_batch_fail_at")?,
        );
        // SAFETY: the null driver defines these symbols as functions with exactly these C
        // signatures (`void nullcuda_fail(const char *, int, int)`, `void nullcuda_clear(void)`,
        // `int nullcuda_pending(void)`, `void nullcuda_async(int)`, `void nullcuda_count(int)`,
        // `long nullcuda_calls(const char *)`, `int nullcuda_batch_attrs(long *, int)`,
        // `void nullcuda_batch_fail_at(int)`); its library stays loaded
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
                count: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(count),
                calls: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*const c_char) -> c_long,
                >(calls),
                batch_attrs: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*mut c_long, c_int) -> c_int,
                >(batch_attrs),
                batch_fail_at: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(
                    batch_fail_at,
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

/// Starts counting every driver call afresh (the counts of [`calls`]); returns whether it
/// could (false: not the null driver).
pub fn count_calls() -> bool {
    let Some(a) = api() else { return false };
    // SAFETY: a function of the null driver taking a plain integer.
    unsafe { (a.count)(1) };
    true
}

/// Stops counting (the counts stay readable).
pub fn stop_counting() {
    if let Some(a) = api() {
        // SAFETY: a function of the null driver taking a plain integer.
        unsafe { (a.count)(0) }
    }
}

/// Calls of driver entry point `entry_point` (its exported name) since [`count_calls`]; 0 on
/// another driver.
pub fn calls(entry_point: &str) -> usize {
    let (Some(a), Ok(name)) = (api(), CString::new(entry_point)) else {
        return 0;
    };
    // SAFETY: a function of the null driver; `name` is a NUL-terminated string it reads.
    unsafe { (a.calls)(name.as_ptr()) }.max(0) as usize
}

/// Calls of either batched copy (`cuMemcpyBatchAsync_v2`, 12.8's `cuMemcpyBatchAsync`) since
/// [`count_calls`].
pub fn batch_calls() -> usize {
    calls("cuMemcpyBatchAsync_v2") + calls("cuMemcpyBatchAsync")
}

/// One attribute of a batched copy, as the null driver recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchAttr {
    /// The first copy it applies to.
    pub from: usize,
    pub src_access_order: c_long,
    /// `CUmemLocation` type and id of the source's hint.
    pub src_hint: (c_long, c_long),
    /// Of the destination's hint.
    pub dst_hint: (c_long, c_long),
    pub flags: c_long,
    /// The batch's number of copies.
    pub count: usize,
}

/// The attributes of the last batched copy the null driver took; empty on another driver.
pub fn last_batch_attrs() -> Vec<BatchAttr> {
    let Some(a) = api() else { return Vec::new() };
    let mut raw = vec![0 as c_long; 8 * 64];
    // SAFETY: a function of the null driver writing at most 64 entries of 8 longs into `raw`.
    let n = unsafe { (a.batch_attrs)(raw.as_mut_ptr(), 64) }.clamp(0, 64) as usize;
    raw.chunks(8)
        .take(n)
        .map(|c| BatchAttr {
            from: c[0] as usize,
            src_access_order: c[1],
            src_hint: (c[2], c[3]),
            dst_hint: (c[4], c[5]),
            flags: c[6],
            count: c[7] as usize,
        })
        .collect()
}

/// The next batched copy of more than `idx` copies fails with `CUDA_ERROR_INVALID_VALUE`
/// after enqueueing the copies before `idx` (12.8's symbol names `idx` in `failIdx`; `_v2`
/// enqueues nothing). Returns whether it was armed.
pub fn batch_fail_at(idx: i32) -> bool {
    let Some(a) = api() else { return false };
    // SAFETY: a function of the null driver taking a plain integer.
    unsafe { (a.batch_fail_at)(idx) };
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
        stop_counting();
        batch_fail_at(-1);
    }
}
