//! The Linux DMA (`aml/dma/linux.h`) on ferry's CPU engine, and AML's Linux operators.
//!
//! - `aml_dma_linux_create(&dma, n)`: `n` workers; 0 means what it means in AML: no workers,
//!   the copies run on the caller's thread when it waits or calls the barrier (ferry's
//!   caller-runs CPU engine).
//! - NULL operator: ferry's planned layout copy (a large copy is split across the workers);
//!   layouts of another type, or two layouts whose spans overlap in one buffer (which ferry
//!   does not plan): AML's generic element-wise copy.
//! - An AML operator runs on a worker (as a ferry operator whose `lower` performs the copy), but
//!   in a synchronous `aml_dma_copy_custom` on the calling thread (see `copy_here`);
//!   its return value is the request's result.

use crate::dma::{destroy_dma, planned_job, AmlCall, AmlDma, AmlDmaOperator, AmlDmaOps, Backend};
use crate::error::{guard, inval, AML_SUCCESS};
use crate::layout::{generic::dims_of, AmlLayout};
use ferry::{CpuConfig, CpuEngine, Job, MemKind, RawBuf};
use ferry_capi::{Fail, FERRY_EOVERLAP};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

const MAGIC: u64 = 0x616d_6c5f_6c6e_7578; // "aml_lnux"

/// The data of a Linux DMA (`struct aml_dma_data` is opaque in C).
struct Linux {
    magic: u64,
    backend: Backend,
}

/// The methods of the Linux DMA.
#[no_mangle]
pub static aml_dma_linux_ops: AmlDmaOps = AmlDmaOps {
    create_request: Some(aml_dma_linux_request_create),
    destroy_request: Some(aml_dma_linux_request_destroy),
    wait_request: Some(aml_dma_linux_request_wait),
    barrier: Some(aml_dma_linux_barrier),
    fprintf: Some(linux_fprintf),
};

/// The ready Linux DMA (one worker per core), set by `aml_init`, NULL after `aml_finalize`.
#[no_mangle]
pub static aml_dma_linux: AtomicPtr<AmlDma> = AtomicPtr::new(std::ptr::null_mut());

/// # Safety
/// 1. `data` is NULL or the data of a Linux DMA not yet destroyed.
unsafe fn linux<'a>(data: *const c_void) -> Result<&'a Linux, Fail> {
    // SAFETY: (1).
    let l = unsafe { data.cast::<Linux>().as_ref() }.ok_or_else(|| inval("dma data is NULL"))?;
    if l.magic != MAGIC {
        return Err(inval("not a Linux dma (destroyed, or another dma type)"));
    }
    Ok(l)
}

/// Creates a Linux DMA with `num_threads` workers (0: none, the caller makes progress in
/// wait and barrier, as AML). Returns `AML_SUCCESS`, `-AML_EINVAL` (NULL dma) or
/// `-AML_FAILURE` (a worker thread could not be started).
///
/// # Safety
/// 1. `dma` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_create(dma: *mut *mut AmlDma, num_threads: usize) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { dma.as_mut() }.ok_or_else(|| inval("dma is NULL"))?;
        let cfg = if num_threads == 0 {
            CpuConfig::caller_runs()
        } else {
            CpuConfig::new(num_threads)
        };
        let engine = CpuEngine::with_config(cfg)
            .map_err(|e| crate::error::fail(crate::error::AML_FAILURE, e.to_string()))?;
        let data = Box::into_raw(Box::new(Linux {
            magic: MAGIC,
            backend: Backend::new(Box::new(engine)),
        }));
        *out = Box::into_raw(Box::new(AmlDma {
            ops: &aml_dma_linux_ops,
            data: data.cast(),
        }));
        Ok(AML_SUCCESS)
    })
}

/// Destroys a Linux DMA after waiting for its work, and sets `*dma` to NULL (NULL: no-op).
///
/// # Safety
/// 1. `dma` is NULL or valid for a read and a write; `*dma` NULL or a Linux DMA from
///    `aml_dma_linux_create` not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_destroy(dma: *mut *mut AmlDma) -> c_int {
    // SAFETY: (1): a Linux DMA's data is a `Box<Linux>`.
    unsafe {
        destroy_dma(
            dma,
            |data| {
                linux(data)?.backend.barrier();
                Ok(())
            },
            |l: &mut Linux| l.magic = 0,
        )
    }
}

/// Submits a request: `op` on a worker with `op_arg`, or (NULL `op`) ferry's planned copy of
/// `src` into `dest`. `req` NULL: reclaimed by the barrier. `-AML_EINVAL`: NULL data, dest or
/// src, layouts of different shapes or element sizes.
///
/// # Safety
/// 1. `data` is NULL or a Linux DMA's data; `req` NULL or valid for one write.
/// 2. `dest`/`src` are what `op` expects, valid (with their buffers) until the request is done.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_request_create(
    data: *mut c_void,
    req: *mut *mut c_void,
    dest: *mut AmlLayout,
    src: *mut AmlLayout,
    op: AmlDmaOperator,
    op_arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let l = unsafe { linux(data) }?;
        if dest.is_null() || src.is_null() {
            return Err(inval("dest or src is NULL"));
        }
        let generic = || call_job(aml_dma_linux_copy_generic, dest, src, op_arg);
        let job = match op {
            Some(op) => call_job(op, dest, src, op_arg),
            // SAFETY: (2).
            None => match unsafe { planned_job(dest, src, |_| MemKind::Pageable) }? {
                Some(job) => job,
                None => generic(),
            },
        };
        // SAFETY: (1), (2).
        match unsafe { l.backend.submit(req, job) } {
            // Layouts in one buffer whose spans overlap (ferry does not copy in place; AML
            // copies element by element): the generic copy, as AML.
            // SAFETY: (1), (2).
            Err(f) if op.is_none() && f.code == FERRY_EOVERLAP => unsafe {
                l.backend.submit(req, generic())
            },
            r => r,
        }
    })
}

/// A job that runs an AML operator on a worker. Its buffer is only a tag (the operator does
/// the copy; ferry touches no byte of it): the destination pointer, one byte.
fn call_job(
    op: unsafe extern "C" fn(*mut AmlLayout, *const AmlLayout, *mut c_void) -> c_int,
    dst: *mut AmlLayout,
    src: *mut AmlLayout,
    arg: *mut c_void,
) -> Job {
    let tag = RawBuf {
        addr: dst as u64,
        len: 1,
        kind: MemKind::Pageable,
    };
    Job::custom(tag, None, Arc::new(AmlCall { op, dst, src, arg }))
}

/// A synchronous copy (`aml_dma_copy_custom`) with an AML operator on a Linux DMA: the
/// operator runs on the calling thread, which would otherwise only wait for a worker to run
/// it (the hand-off costs more than a small copy; AML's workers give requests no order
/// either, so earlier requests still pending may run alongside, as on AML). Its return value.
///
/// # Safety
/// 1. `data` is NULL or a Linux DMA's data.
/// 2. `dst`/`src`/`arg` are what `op` expects.
pub(crate) unsafe fn copy_here(
    data: *const c_void,
    op: unsafe extern "C" fn(*mut AmlLayout, *const AmlLayout, *mut c_void) -> c_int,
    dst: *mut AmlLayout,
    src: *mut AmlLayout,
    arg: *mut c_void,
) -> Result<c_int, Fail> {
    // SAFETY: (1).
    unsafe { linux(data) }?;
    // SAFETY: (2).
    Ok(unsafe { op(dst, src, arg) })
}

/// Waits for this request only and releases it: its result, or `-AML_EINVAL`.
///
/// # Safety
/// 1. `dma` is NULL or a Linux DMA's data; `req` NULL or valid; `*req` NULL or its request.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_request_wait(
    dma: *mut c_void,
    req: *mut *mut c_void,
) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { linux(dma)?.backend.wait(req) })
}

/// Waits for every request; the first failure not already returned, or `AML_SUCCESS`.
///
/// # Safety
/// 1. `dma` is NULL or a Linux DMA's data.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_barrier(dma: *mut c_void) -> c_int {
    // SAFETY: (1).
    guard(|| Ok(unsafe { linux(dma) }?.backend.barrier()))
}

/// Releases a request without its result (waits until its buffers are free).
///
/// # Safety
/// As [`aml_dma_linux_request_wait`].
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_request_destroy(
    dma: *mut c_void,
    req: *mut *mut c_void,
) -> c_int {
    // SAFETY: (1).
    guard(|| unsafe { linux(dma)?.backend.cancel(req) })
}

/// # Safety
/// 1. `data` a Linux DMA's data; `stream` a valid `FILE *`; `prefix` a C string.
unsafe extern "C" fn linux_fprintf(
    data: *const c_void,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let l = unsafe { linux(data) }?;
        // SAFETY: (1).
        let lines = [
            format!("dma-linux: {data:p}"),
            format!("engine: ferry {}", l.backend.engine.name()),
        ];
        // SAFETY: (1).
        unsafe { crate::dma::print_lines(stream, prefix, &lines) }
    })
}

/// AML's flat copy: `element_size * dims[0]` bytes from `src`'s pointer to `dst`'s (1-D
/// dense layouts). `arg` unused.
///
/// # Safety
/// 1. `dst`, `src` are valid layouts whose buffers hold that many bytes, not overlapping.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_copy_1D(
    dst: *mut AmlLayout,
    src: *const AmlLayout,
    _arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let n = unsafe { flat_bytes(dst, src) }?;
        // SAFETY: (1).
        unsafe {
            std::ptr::copy_nonoverlapping(
                crate::layout::aml_layout_rawptr(src).cast::<u8>(),
                crate::layout::aml_layout_rawptr(dst).cast::<u8>(),
                n,
            )
        };
        Ok(AML_SUCCESS)
    })
}

/// The bytes of a 1-D copy: the source's dim 0 times its element size.
///
/// # Safety
/// 1. `dst`, `src` are NULL or valid layouts.
pub(crate) unsafe fn flat_bytes(
    dst: *const AmlLayout,
    src: *const AmlLayout,
) -> Result<usize, Fail> {
    if dst.is_null() {
        return Err(inval("dst is NULL"));
    }
    // SAFETY: (1).
    let dims = unsafe { dims_of(src, false) }?;
    // SAFETY: (1).
    let e = unsafe { crate::layout::aml_layout_element_size(src) };
    Ok(dims.first().copied().unwrap_or(0) * e)
}

/// AML's memcpy operator: `dst` and `src` are raw pointers (cast to layouts) and `arg` the
/// byte count (cast to a pointer).
///
/// # Safety
/// 1. `dst` is valid for `arg` bytes of writes, `src` for reads; they do not overlap.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_memcpy_op(
    dst: *mut AmlLayout,
    src: *const AmlLayout,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        if dst.is_null() || src.is_null() {
            return Err(inval("dst or src is NULL"));
        }
        // SAFETY: (1).
        unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst.cast::<u8>(), arg as usize) };
        Ok(AML_SUCCESS)
    })
}

/// AML's generic copy: every element of `src` to the same native coordinates of `dst`
/// (through the layouts' `deref_native`). `-AML_EINVAL` if the layouts' native dims or
/// element sizes differ.
///
/// # Safety
/// 1. `dst`, `src` are valid layouts whose elements lie in valid, non-overlapping memory.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_copy_generic(
    dst: *mut AmlLayout,
    src: *const AmlLayout,
    _arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (dd, sd) = unsafe { (dims_of(dst, true)?, dims_of(src, true)?) };
        // SAFETY: (1).
        let (de, se) = unsafe {
            (
                crate::layout::aml_layout_element_size(dst),
                crate::layout::aml_layout_element_size(src),
            )
        };
        if dd != sd || de != se || de == 0 {
            return Err(inval(format!(
                "layouts differ: dims {dd:?} / {sd:?}, element sizes {de} / {se}"
            )));
        }
        let mut c = vec![0usize; dd.len()];
        if dd.contains(&0) {
            return Ok(AML_SUCCESS);
        }
        loop {
            // SAFETY: (1): coordinates within the dims.
            unsafe {
                let s = crate::layout::aml_layout_deref_native(src, c.as_ptr());
                let d = crate::layout::aml_layout_deref_native(dst, c.as_ptr());
                if s.is_null() || d.is_null() {
                    return Err(inval("deref_native returned NULL"));
                }
                std::ptr::copy_nonoverlapping(s.cast::<u8>(), d.cast::<u8>(), de);
            }
            let Some(i) = (0..c.len()).find(|&i| c[i] + 1 < dd[i]) else {
                return Ok(AML_SUCCESS);
            };
            c[i] += 1;
            c[..i].iter_mut().for_each(|x| *x = 0);
        }
    })
}

/// Creates the ready Linux DMA (`aml_init`).
pub(crate) fn init_ready() -> c_int {
    if !aml_dma_linux.load(Ordering::Acquire).is_null() {
        return AML_SUCCESS;
    }
    let mut d = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; 0 < threads (one per core).
    let rc =
        unsafe { aml_dma_linux_create(&mut d, ferry::engine::cpu::probe().default_threads.max(1)) };
    if rc == AML_SUCCESS
        && aml_dma_linux
            .compare_exchange(std::ptr::null_mut(), d, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        // Another thread's `aml_init` won: drop this one.
        // SAFETY: ours, unused.
        unsafe { aml_dma_linux_destroy(&mut d) };
    }
    rc
}

/// Destroys the ready Linux DMA (`aml_finalize`).
pub(crate) fn finalize_ready() {
    let mut d = aml_dma_linux.swap(std::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: the ready dma, no longer reachable through `aml_dma_linux`.
    unsafe { aml_dma_linux_destroy(&mut d) };
}

/// Runs `job` to completion: on the ready Linux DMA's workers after `aml_init`, else on the
/// caller's thread (ferry's caller-runs CPU engine). `Err`: the job was not submitted (its
/// failure, `FERRY_EOVERLAP` for overlapping buffers); `Ok`: the request's result.
///
/// # Safety
/// 1. The job's buffers are valid, and untouched by others, until it is done; no other
///    thread runs `aml_finalize` meanwhile.
pub(crate) unsafe fn run_now(job: Job) -> Result<c_int, Fail> {
    // SAFETY: (1): the ready dma stays alive until `aml_finalize`.
    if let Some(dma) = unsafe { aml_dma_linux.load(Ordering::Acquire).as_ref() } {
        // SAFETY: the ready dma is a Linux DMA.
        let l = unsafe { linux(dma.data.cast_const()) }?;
        let mut req = std::ptr::null_mut();
        // SAFETY: (1); `req` is a local slot, waited for at once.
        unsafe { l.backend.submit(&mut req, job) }?;
        // SAFETY: the request just handed out.
        return unsafe { l.backend.wait(&mut req) };
    }
    let engine = CpuEngine::caller_runs()
        .map_err(|e| crate::error::fail(crate::error::AML_FAILURE, e.to_string()))?;
    // SAFETY: (1).
    let r =
        unsafe { ferry::Engine::submit_raw(&engine, job) }.map_err(crate::error::submit_fail)?;
    Ok(r.wait()
        .map_or_else(|e| crate::error::request_code(&e), |()| AML_SUCCESS))
}

/// `struct aml_dma_linux_task_in`: AML's task input of a Linux DMA request.
#[repr(C)]
pub struct AmlDmaLinuxTaskIn {
    /// The operator.
    pub op: AmlDmaOperator,
    /// Its destination layout.
    pub dst: *mut AmlLayout,
    /// Its source layout.
    pub src: *mut AmlLayout,
    /// Its extra argument.
    pub op_arg: *mut c_void,
    /// The request this input belongs to.
    pub req: *mut AmlDmaLinuxRequest,
}

/// `struct aml_dma_linux_request`: AML's task form of a Linux DMA request (programs driving
/// a task scheduler themselves use it; this library's own requests are ferry's).
#[repr(C)]
pub struct AmlDmaLinuxRequest {
    /// The scheduler task.
    pub task: crate::utils::sched::AmlTask,
    /// The task's input.
    pub task_in: AmlDmaLinuxTaskIn,
    /// The task's output: the operator's result.
    pub task_out: c_int,
    /// `AML_DMA_LINUX_REQUEST_FLAGS_*`.
    pub flags: c_int,
    /// Held while the operator runs.
    pub lock: libc::pthread_mutex_t,
}

/// `AML_DMA_LINUX_REQUEST_FLAGS_DONE`.
const REQUEST_FLAGS_DONE: c_int = 0x2;

/// The work of AML's Linux DMA task: with the request's lock held, calls the operator of
/// `input` (a `struct aml_dma_linux_task_in`), stores its result in the `int` at `output` and
/// marks the request done. A NULL input, operator or request: the `int` gets `-AML_EINVAL`
/// (AML dereferences them); a NULL output: nothing is stored.
///
/// # Safety
/// 1. `input` is NULL or a valid `struct aml_dma_linux_task_in` whose request (if not NULL) is
///    valid with an initialised lock; `output` NULL or valid for one `int` write.
/// 2. The operator's arguments are what it expects.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_linux_exec_request(input: *mut c_void, output: *mut c_void) {
    let out = output.cast::<c_int>();
    // SAFETY: (1).
    let task = unsafe { input.cast::<AmlDmaLinuxTaskIn>().as_ref() };
    let rc = match task {
        // SAFETY: (1): the request's lock is initialised; (2) for the call.
        Some(t) if !t.req.is_null() && t.op.is_some() => unsafe {
            let req = t.req;
            libc::pthread_mutex_lock(&raw mut (*req).lock);
            let rc =
                t.op.map_or(-crate::error::AML_EINVAL, |op| op(t.dst, t.src, t.op_arg));
            (*req).flags |= REQUEST_FLAGS_DONE;
            libc::pthread_mutex_unlock(&raw mut (*req).lock);
            rc
        },
        _ => -crate::error::AML_EINVAL,
    };
    // SAFETY: (1).
    if let Some(o) = unsafe { out.as_mut() } {
        *o = rc;
    }
}
