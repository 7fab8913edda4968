//! The generic DMA calls of `aml.h` (dispatched through `dma->ops`, as AML) and what the Linux
//! and CUDA DMAs share: requests on a ferry engine, AML operators run as ferry operators, and
//! the NULL operator as ferry's planned layout copy.

use crate::error::{fail, guard, inval, request_code, AML_ENOTSUP, AML_SUCCESS};
use crate::layout::AmlLayout;
use ferry::{Engine, Job, Op, OpError, Operator, Program, Request, RequestError};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, PoisonError};

pub(crate) mod plan;
mod transform;
pub(crate) use plan::planned_job;
pub use transform::aml_copy_layout_transform_generic;

/// `aml_dma_operator`: a C function that performs the copy of `src` into `dst`, with the
/// request's argument; its return value is the request's result.
pub type AmlDmaOperator = Option<
    unsafe extern "C" fn(dst: *mut AmlLayout, src: *const AmlLayout, arg: *mut c_void) -> c_int,
>;

type Data = *mut c_void;
type ReqOut = *mut *mut c_void;

/// `struct aml_dma_ops`, in AML's field order.
#[repr(C)]
pub struct AmlDmaOps {
    /// Creates (submits) a request; `req` NULL: nobody waits for it but a barrier.
    pub create_request: Option<
        unsafe extern "C" fn(
            Data,
            ReqOut,
            *mut AmlLayout,
            *mut AmlLayout,
            AmlDmaOperator,
            *mut c_void,
        ) -> c_int,
    >,
    /// Releases a request without its result.
    pub destroy_request: Option<unsafe extern "C" fn(Data, ReqOut) -> c_int>,
    /// Waits for a request and releases it.
    pub wait_request: Option<unsafe extern "C" fn(Data, ReqOut) -> c_int>,
    /// Waits for every request.
    pub barrier: Option<unsafe extern "C" fn(Data) -> c_int>,
    /// Prints the dma.
    pub fprintf:
        Option<unsafe extern "C" fn(*const c_void, *mut libc::FILE, *const c_char) -> c_int>,
}

/// `struct aml_dma`: the ops table and the implementation's data.
#[repr(C)]
pub struct AmlDma {
    /// The dma's functions.
    pub ops: *const AmlDmaOps,
    /// Implementation data.
    pub data: *mut c_void,
}

// SAFETY: a plain pair of pointers to tables and data that are themselves thread-safe (every
// dma of this library may be used from several threads).
unsafe impl Sync for AmlDma {}

/// The ops table and data of a dma.
///
/// # Safety
/// 1. `dma` is NULL or a valid dma whose `ops` is NULL or a valid table.
unsafe fn ops<'a>(dma: *mut AmlDma) -> Result<(&'a AmlDmaOps, Data), Fail> {
    // SAFETY: (1).
    let d = unsafe { dma.as_ref() }.ok_or_else(|| inval("dma is NULL"))?;
    // SAFETY: (1).
    let o = unsafe { d.ops.as_ref() }.ok_or_else(|| inval("dma->ops is NULL"))?;
    Ok((o, d.data))
}

fn need<T>(f: Option<T>, what: &str) -> Result<T, Fail> {
    f.ok_or_else(|| fail(AML_ENOTSUP, format!("this dma has no {what} operation")))
}

/// Copies `src` into `dst` and waits for it: `op` (NULL: the dma's default, on the Linux and
/// CUDA DMAs ferry's planned layout copy) with `op_arg`. Returns `AML_SUCCESS`, the
/// operator's error, or `-AML_EINVAL` (NULL dma, dst or src).
///
/// # Safety
/// 1. `dma` is NULL or a valid dma; `dest`/`src` NULL or what `op` expects (layouts, or raw
///    pointers for the memcpy operators), valid until this returns.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_copy_custom(
    dma: *mut AmlDma,
    dest: *mut AmlLayout,
    src: *mut AmlLayout,
    op: AmlDmaOperator,
    op_arg: *mut c_void,
) -> c_int {
    guard(|| {
        if dest.is_null() || src.is_null() {
            return Err(inval("dest or src is NULL"));
        }
        // SAFETY: (1).
        let (o, d) = unsafe { ops(dma) }?;
        if let (true, Some(f)) = (std::ptr::eq(o, &crate::linux::aml_dma_linux_ops), op) {
            // SAFETY: (1): a Linux DMA's data; the operator with what it expects.
            return unsafe { crate::linux::copy_here(d, f, dest, src, op_arg) };
        }
        let mut req: *mut c_void = std::ptr::null_mut();
        // SAFETY: (1): the dma's own functions on its own data.
        let rc = unsafe {
            need(o.create_request, "create_request")?(d, &mut req, dest, src, op, op_arg)
        };
        if rc != AML_SUCCESS || req.is_null() {
            return Ok(rc);
        }
        // SAFETY: as above.
        Ok(unsafe { need(o.wait_request, "wait_request")?(d, &mut req) })
    })
}

/// Starts a copy of `src` into `dst` and returns at once. `req` NULL: fire and forget, the
/// request is reclaimed (and its error reported) by `aml_dma_barrier`; else `*req` must be
/// released with `aml_dma_wait` or `aml_dma_cancel`. Returns `AML_SUCCESS`, `-AML_EINVAL`
/// (NULL dma, dest or src) or the dma's error.
///
/// # Safety
/// 1. As [`aml_dma_copy_custom`], the buffers valid and untouched until the request is waited
///    (or the barrier returns); with a custom operator the layouts too (they are passed as
///    given); with the NULL operator the layouts may be destroyed at once (they are read here).
/// 2. `req` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_async_copy_custom(
    dma: *mut AmlDma,
    req: ReqOut,
    dest: *mut AmlLayout,
    src: *mut AmlLayout,
    op: AmlDmaOperator,
    op_arg: *mut c_void,
) -> c_int {
    guard(|| {
        if dest.is_null() || src.is_null() {
            return Err(inval("dest or src is NULL"));
        }
        // SAFETY: (1).
        let (o, d) = unsafe { ops(dma) }?;
        // SAFETY: (1), (2).
        Ok(unsafe { need(o.create_request, "create_request")?(d, req, dest, src, op, op_arg) })
    })
}

/// Waits for this request only, releases it and sets `*req` to NULL. Returns its result (an
/// operator's own error value), or `-AML_EINVAL` (NULL arguments, a request of another dma).
///
/// # Safety
/// 1. `dma` is NULL or valid; `req` NULL or valid for a read and a write; `*req` NULL or a
///    request of `dma` not yet released.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_wait(dma: *mut AmlDma, req: ReqOut) -> c_int {
    guard(|| {
        if req.is_null() {
            return Err(inval("req is NULL"));
        }
        // SAFETY: (1).
        let (o, d) = unsafe { ops(dma) }?;
        // SAFETY: (1).
        Ok(unsafe { need(o.wait_request, "wait_request")?(d, req) })
    })
}

/// Waits for every request of `dma` submitted so far. Returns `AML_SUCCESS` or the error of
/// the first failed request not already returned by `aml_dma_wait` (an AML error value).
/// Requests the caller holds must still be waited or cancelled.
///
/// # Safety
/// 1. `dma` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_barrier(dma: *mut AmlDma) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (o, d) = unsafe { ops(dma) }?;
        // SAFETY: (1).
        Ok(unsafe { need(o.barrier, "barrier")?(d) })
    })
}

/// Releases a request without its result and sets `*req` to NULL. ferry does not stop a copy
/// that has started: this waits until the request no longer touches its buffers.
///
/// # Safety
/// As [`aml_dma_wait`].
#[no_mangle]
pub unsafe extern "C" fn aml_dma_cancel(dma: *mut AmlDma, req: ReqOut) -> c_int {
    guard(|| {
        if req.is_null() {
            return Err(inval("req is NULL"));
        }
        // SAFETY: (1).
        let (o, d) = unsafe { ops(dma) }?;
        // SAFETY: (1).
        Ok(unsafe { need(o.destroy_request, "destroy_request")?(d, req) })
    })
}

/// Prints a description of the dma on `stream`.
///
/// # Safety
/// 1. `stream` NULL or a valid `FILE *`; `prefix` NULL or a C string; `dma` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_fprintf(
    stream: *mut libc::FILE,
    prefix: *const c_char,
    dma: *const AmlDma,
) -> c_int {
    guard(|| {
        if stream.is_null() {
            return Err(inval("stream is NULL"));
        }
        // SAFETY: (1).
        let (o, d) = unsafe { ops(dma.cast_mut()) }?;
        let p = if prefix.is_null() {
            c"".as_ptr()
        } else {
            prefix
        };
        // SAFETY: (1).
        Ok(unsafe { need(o.fprintf, "fprintf")?(d, stream, p) })
    })
}

/// The body of every `aml_dma_*_destroy`: a NULL `dma` or `*dma` is a no-op; else `check`
/// the data (and finish its work), `retire` it, free it and the dma, and set `*dma` to NULL.
///
/// # Safety
/// 1. `dma` is NULL or valid for a read and a write; `*dma` NULL or a dma of this library
///    whose data came from `Box::<T>::into_raw` (once `check` accepted it), not used
///    afterwards.
pub(crate) unsafe fn destroy_dma<T>(
    dma: *mut *mut AmlDma,
    check: impl FnOnce(*mut c_void) -> Result<(), Fail>,
    retire: impl FnOnce(&mut T),
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let Some(slot) = (unsafe { dma.as_mut() }) else {
            return Ok(AML_SUCCESS);
        };
        if slot.is_null() {
            return Ok(AML_SUCCESS);
        }
        // SAFETY: (1).
        check(unsafe { (**slot).data })?;
        // SAFETY: (1): both from `Box::into_raw` in the dma's create; not used afterwards.
        let (mut data, d) = unsafe {
            (
                Box::from_raw((**slot).data.cast::<T>()),
                Box::from_raw(*slot),
            )
        };
        retire(&mut data);
        drop((data, d));
        *slot = std::ptr::null_mut();
        Ok(AML_SUCCESS)
    })
}

/// Prints `text` as AML prints a line: `"<prefix>: <text>\n"` (`prefix` NULL: "").
///
/// # Safety
/// 1. `stream` a valid `FILE *`; `prefix` NULL or a C string.
pub(crate) unsafe fn print(stream: *mut libc::FILE, prefix: *const c_char, text: &str) -> c_int {
    // SAFETY: (1).
    unsafe { print_lines(stream, prefix, &[text.to_owned()]) }.unwrap_or(-crate::error::AML_EINVAL)
}

/// Prints each line as [`print()`] does. `-AML_EINVAL` for a NULL stream.
///
/// # Safety
/// 1. `stream` NULL or a valid `FILE *`; `prefix` NULL or a C string.
pub(crate) unsafe fn print_lines(
    stream: *mut libc::FILE,
    prefix: *const c_char,
    lines: &[String],
) -> Result<c_int, Fail> {
    if stream.is_null() {
        return Err(inval("stream is NULL"));
    }
    let prefix = if prefix.is_null() {
        c"".as_ptr()
    } else {
        prefix
    };
    for l in lines {
        let c = std::ffi::CString::new(l.replace('\0', " ")).unwrap_or_default();
        // SAFETY: (1); a "%s: %s\n" format with two C strings.
        unsafe { libc::fprintf(stream, c"%s: %s\n".as_ptr(), prefix, c.as_ptr()) };
    }
    Ok(AML_SUCCESS)
}

/// The name of [`AmlCall`] in ferry's request errors.
const CALL: &str = "aml_dma_operator";

/// An AML operator as a ferry operator: `lower` performs the copy itself (on the engine's
/// worker) and adds no step; a non-zero return value fails the request with that value.
pub(crate) struct AmlCall {
    pub(crate) op: unsafe extern "C" fn(*mut AmlLayout, *const AmlLayout, *mut c_void) -> c_int,
    pub(crate) dst: *mut AmlLayout,
    pub(crate) src: *const AmlLayout,
    pub(crate) arg: *mut c_void,
}

// SAFETY: the C contract of `aml_dma_async_copy_custom`: the operator, its layouts and
// argument may be used from the engine's worker threads.
unsafe impl Send for AmlCall {}
// SAFETY: as above; `lower` runs once per request.
unsafe impl Sync for AmlCall {}

impl Operator for AmlCall {
    fn name(&self) -> &str {
        CALL
    }
    fn lower(&self, _prog: &mut Program) -> Result<(), OpError> {
        // SAFETY: the caller's contract (see `Send` above): a C operator with its arguments.
        let rc = unsafe { (self.op)(self.dst, self.src, self.arg) };
        if rc == AML_SUCCESS {
            Ok(())
        } else {
            Err(OpError::Custom(format!("returned {rc}")))
        }
    }
}

/// The value an [`AmlCall`] returned, if `e` is its failure.
pub(crate) fn operator_rc(e: &RequestError) -> Option<c_int> {
    match e {
        RequestError::Operator { op, msg } if op == CALL => {
            msg.strip_prefix("returned ")?.parse().ok()
        }
        RequestError::Dependency(inner) => operator_rc(inner),
        _ => None,
    }
}

const REQ_MAGIC: u64 = 0x616d_6c5f_7265_7131; // "aml_req1"

/// A request of an engine-backed dma (`struct aml_dma_request` is opaque in C).
struct Req {
    magic: u64,
    owner: usize,
    req: Request,
}

/// An engine-backed dma's state: the ferry engine and the fire-and-forget requests that only a
/// barrier reclaims.
pub(crate) struct Backend {
    pub(crate) engine: Box<dyn Engine>,
    owned: Mutex<Vec<Request>>,
}

impl Backend {
    /// A backend over `engine`.
    pub(crate) fn new(engine: Box<dyn Engine>) -> Backend {
        Backend {
            engine,
            owned: Mutex::new(Vec::new()),
        }
    }

    /// Submits `job`, handing its request to `*out` (or keeping it for the barrier).
    ///
    /// # Safety
    /// 1. The job's buffers are valid, and untouched by others, until its request completes.
    /// 2. `out` is NULL or valid for one write.
    pub(crate) unsafe fn submit(&self, out: ReqOut, job: Job) -> Result<c_int, Fail> {
        let r = match (&job.op, job.src) {
            // A planned copy goes through the engine's copy entry, which runs a small one at
            // once without building a job (the CPU engine's inline copies).
            // SAFETY: (1).
            (Op::Copy { dst, src }, Some(sbuf)) if job.after.is_empty() => unsafe {
                self.engine.submit_copy(job.dst, dst, sbuf, src)
            },
            // SAFETY: (1).
            _ => unsafe { self.engine.submit_raw(job) },
        }
        .map_err(crate::error::submit_fail)?;
        // SAFETY: (2).
        unsafe { self.hand_out(out, r) };
        Ok(AML_SUCCESS)
    }

    /// Gives a submitted request to the caller (`*out`), or keeps it for the barrier.
    ///
    /// # Safety
    /// 1. `out` is NULL or valid for one write.
    pub(crate) unsafe fn hand_out(&self, out: ReqOut, r: Request) {
        // SAFETY: (1).
        match unsafe { out.as_mut() } {
            Some(o) => {
                *o = Box::into_raw(Box::new(Req {
                    magic: REQ_MAGIC,
                    owner: self as *const Backend as usize,
                    req: r,
                }))
                .cast();
            }
            None => {
                let mut l = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
                // Completed successful ones have nothing left for the barrier.
                if l.len() >= 64 && l.len().is_power_of_two() {
                    l.retain(|r| !matches!(r.completion().poll_done(), Some(Ok(()))));
                }
                l.push(r);
            }
        }
    }

    /// Takes a request of this backend out of `*slot`.
    ///
    /// # Safety
    /// 1. `slot` is NULL or valid for a read and a write; `*slot` NULL or a request not yet
    ///    released.
    unsafe fn take(&self, slot: ReqOut) -> Result<Request, Fail> {
        // SAFETY: (1).
        let s = unsafe { slot.as_mut() }.ok_or_else(|| inval("req is NULL"))?;
        // SAFETY: (1).
        let r = unsafe { s.cast::<Req>().as_ref() }.ok_or_else(|| inval("*req is NULL"))?;
        if r.magic != REQ_MAGIC {
            return Err(inval("*req is not a request of this library (released?)"));
        }
        if r.owner != self as *const Backend as usize {
            return Err(inval("*req was created by another dma"));
        }
        // SAFETY: (1): from `Box::into_raw` in `hand_out`, released once, here.
        let mut b = unsafe { Box::from_raw(s.cast::<Req>()) };
        *s = std::ptr::null_mut();
        b.magic = 0;
        Ok(b.req)
    }

    /// `wait_request`: this request only; its result.
    ///
    /// # Safety
    /// As [`Backend::take`].
    pub(crate) unsafe fn wait(&self, slot: ReqOut) -> Result<c_int, Fail> {
        // SAFETY: forwarded.
        let r = unsafe { self.take(slot) }?;
        Ok(r.wait().map_or_else(|e| request_code(&e), |()| AML_SUCCESS))
    }

    /// `destroy_request`: waits until the request is done, without its result (a failure
    /// goes to the next barrier).
    ///
    /// # Safety
    /// As [`Backend::take`].
    pub(crate) unsafe fn cancel(&self, slot: ReqOut) -> Result<c_int, Fail> {
        // SAFETY: forwarded.
        let r = unsafe { self.take(slot) }?;
        let _ = r.completion().wait();
        Ok(AML_SUCCESS)
    }

    /// `barrier`: everything submitted so far; the first failure not yet returned.
    pub(crate) fn barrier(&self) -> c_int {
        let owned = std::mem::take(&mut *self.owned.lock().unwrap_or_else(PoisonError::into_inner));
        let mut first = match self.engine.barrier() {
            Ok(()) => AML_SUCCESS,
            Err(e) => e
                .failures
                .first()
                .map_or(AML_SUCCESS, |(_, e)| request_code(e)),
        };
        for r in owned {
            // Requests the engine does not track (recorded on a CUDA stream) are settled here.
            if let Err(e) = r.wait() {
                if first == AML_SUCCESS {
                    first = request_code(&e);
                }
            }
        }
        first
    }
}
