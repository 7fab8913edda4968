//! Requests (`ferry_request`): create, wait, test, destroy.

use crate::dma::{dma_ref, FerryDma};
use crate::error::{guard, out, request_fail, Fail, FERRY_SUCCESS};
use crate::layout::{layout_opt, FerryLayout};
use crate::op::{op_ref, Bound, FerryOp, OpKind};
use ferry::{Job, Layout, MemKind, RawBuf, Request};
use std::any::Any;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Ordinary (pageable) host memory.
pub const FERRY_MEM_PAGEABLE: i32 = 0;
/// Page-locked host memory (allocated pinned, or registered).
pub const FERRY_MEM_PINNED: i32 = 1;
/// Page-locked host memory mapped into the GPUs' address space.
pub const FERRY_MEM_MAPPED: i32 = 2;
/// Memory on GPU `device`; `ptr` holds the device address.
pub const FERRY_MEM_DEVICE: i32 = 3;
/// CUDA managed memory.
pub const FERRY_MEM_MANAGED: i32 = 4;

/// A buffer and where it lives (`ferry_buffer` in C).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FerryBuffer {
    /// First byte (a host pointer, or a device address for `FERRY_MEM_DEVICE`).
    pub ptr: *mut c_void,
    /// Length in bytes.
    pub len: usize,
    /// One of `FERRY_MEM_*`.
    pub kind: i32,
    /// GPU ordinal for `FERRY_MEM_DEVICE`; ignored otherwise.
    pub device: i32,
}

impl FerryBuffer {
    pub(crate) fn raw(&self, what: &str) -> Result<RawBuf, Fail> {
        if self.ptr.is_null() {
            return Err(Fail::inval(format!("{what} is NULL")));
        }
        if self.len == 0 {
            return Err(Fail::inval(format!("{what} has length 0")));
        }
        let kind = match self.kind {
            FERRY_MEM_PAGEABLE => MemKind::Pageable,
            FERRY_MEM_PINNED => MemKind::Pinned,
            FERRY_MEM_MAPPED => MemKind::Mapped,
            FERRY_MEM_MANAGED => MemKind::Managed,
            FERRY_MEM_DEVICE => MemKind::Device {
                ordinal: u32::try_from(self.device).map_err(|_| {
                    Fail::inval(format!("{what}: device {} is negative", self.device))
                })?,
            },
            k => {
                return Err(Fail::inval(format!(
                    "{what}: memory kind {k} is not one of FERRY_MEM_*"
                )))
            }
        };
        Ok(RawBuf {
            addr: self.ptr as u64,
            len: self.len,
            kind,
        })
    }
}

const REQUEST_MAGIC: u64 = 0x6665_7272_795f_7271; // "ferry_rq"

/// What a request of no dma carries beside its result (an asynchronous checkpoint save's
/// report, filled when it completes), read by the call that waits for it.
pub(crate) type Extra = Arc<dyn Any + Send + Sync>;

/// A request handle (`ferry_request` in C).
pub struct FerryRequest {
    magic: u64,
    dma: u64,
    req: Request,
    extra: Option<Extra>,
}

impl FerryRequest {
    /// A new handle for request `req` of the dma numbered `dma`.
    pub(crate) fn boxed(dma: u64, req: Request) -> *mut FerryRequest {
        Self::boxed_with(dma, req, None)
    }

    /// [`FerryRequest::boxed`] with what the request carries beside its result.
    pub(crate) fn boxed_with(dma: u64, req: Request, extra: Option<Extra>) -> *mut FerryRequest {
        Box::into_raw(Box::new(FerryRequest {
            magic: REQUEST_MAGIC,
            dma,
            req,
            extra,
        }))
    }

    /// What the request carries beside its result.
    pub(crate) fn extra(&self) -> Option<&Extra> {
        self.extra.as_ref()
    }
}

/// Checks a request handle and that it belongs to `dma` (when `dma` is given).
///
/// # Safety
/// 1. `p` is NULL or a request not yet released.
unsafe fn request_mut<'a>(
    p: *mut FerryRequest,
    dma: Option<&FerryDma>,
) -> Result<&'a mut FerryRequest, Fail> {
    // SAFETY: (1).
    let r = unsafe { p.as_mut() }.ok_or_else(|| Fail::inval("request is NULL"))?;
    if r.magic != REQUEST_MAGIC {
        return Err(Fail::inval(
            "request is not a ferry_request (released, or another handle type)",
        ));
    }
    if let Some(d) = dma {
        if d.id != r.dma {
            return Err(Fail::inval("request was created by another dma"));
        }
    }
    Ok(r)
}

/// Checks a request handle against the `dma` given to wait or test it: a dma's request with
/// its dma, a request of no dma (a checkpoint's) with NULL.
///
/// # Safety
/// 1. `dma` is NULL or a dma not yet destroyed; `p` is NULL or a request not yet released.
unsafe fn request_of<'a>(
    dma: *mut FerryDma,
    p: *mut FerryRequest,
) -> Result<&'a mut FerryRequest, Fail> {
    let d = if dma.is_null() {
        None
    } else {
        // SAFETY: (1).
        Some(unsafe { dma_ref(dma) }?)
    };
    // SAFETY: (1).
    let r = unsafe { request_mut(p, d) }?;
    match (d, r.dma) {
        (None, 0) | (Some(_), _) => Ok(r),
        (None, _) => Err(Fail::inval(
            "dma is NULL: pass the dma that created the request",
        )),
    }
}

/// Builds the job for an operator.
fn job(
    dst: RawBuf,
    dst_layout: Option<Layout>,
    src: Option<RawBuf>,
    src_layout: Option<Layout>,
    op: &OpKind,
    op_arg: *mut c_void,
) -> Result<Job, Fail> {
    let need_src =
        || src.ok_or_else(|| Fail::inval("this operator needs a source buffer (src is NULL)"));
    Ok(match op {
        OpKind::Copy => {
            let src = need_src()?;
            let d = dst_layout
                .ok_or_else(|| Fail::inval("FERRY_OP_COPY needs dst_layout (it is NULL)"))?;
            let s = src_layout
                .ok_or_else(|| Fail::inval("FERRY_OP_COPY needs src_layout (it is NULL)"))?;
            Job::copy(dst, d, src, s)
        }
        OpKind::Memcpy => {
            let src = need_src()?;
            let n = if op_arg.is_null() {
                src.len
            } else {
                // SAFETY: the contract of `ferry_dma_request_create` (5): for FERRY_OP_MEMCPY a
                // non-NULL op_arg points to a size_t.
                unsafe { *op_arg.cast::<usize>() }
            };
            if n == 0 {
                // The C API's rule (ferry's own layouts may be empty): a copy of 0 bytes is
                // refused, as a zero dim is (`ferry.h`).
                return Err(ferry::LayoutError::ZeroDim { axis: 0 }.into());
            }
            let l = Layout::bytes(n)?;
            Job::copy(dst, l, src, l)
        }
        OpKind::Fill => {
            let d = dst_layout
                .ok_or_else(|| Fail::inval("FERRY_OP_FILL needs dst_layout (it is NULL)"))?;
            if op_arg.is_null() {
                return Err(Fail::inval(
                    "FERRY_OP_FILL needs op_arg: a pointer to one element's pattern",
                ));
            }
            // SAFETY: the contract of `ferry_dma_request_create` (5): for FERRY_OP_FILL op_arg
            // points to `elem_size` bytes.
            let pattern = unsafe { std::slice::from_raw_parts(op_arg.cast::<u8>(), d.elem_size()) };
            Job::fill(dst, d, pattern)
        }
        OpKind::Custom(c) => Job::custom(
            dst,
            src,
            Arc::new(Bound {
                op: Arc::clone(c),
                dst: dst_layout,
                src: src_layout,
                arg: op_arg,
                dst_len: dst.len,
                src_len: src.map(|s| s.len),
            }),
        ),
    })
}

/// Shared body of both create functions.
///
/// # Safety
/// The union of both functions' contracts.
#[allow(clippy::too_many_arguments)]
unsafe fn create(
    dma: *mut FerryDma,
    req: *mut *mut FerryRequest,
    dst: Option<FerryBuffer>,
    dst_layout: *const FerryLayout,
    src: Option<FerryBuffer>,
    src_layout: *const FerryLayout,
    op: *const FerryOp,
    op_arg: *mut c_void,
) -> Result<c_int, Fail> {
    // SAFETY: forwarded.
    let d = unsafe { dma_ref(dma) }?;
    // SAFETY: forwarded.
    let out = unsafe { out(req, "req") }?;
    // SAFETY: forwarded.
    let op = unsafe { op_ref(op) }?;
    let dst = dst.ok_or_else(|| Fail::inval("dst is NULL"))?.raw("dst")?;
    let src = match src {
        Some(s) if !s.ptr.is_null() || s.len != 0 => Some(s.raw("src")?),
        _ => None,
    };
    // SAFETY: forwarded.
    let (dl, sl) = unsafe {
        (
            layout_opt(dst_layout, "dst_layout")?,
            layout_opt(src_layout, "src_layout")?,
        )
    };
    let job = job(dst, dl, src, sl, op, op_arg)?;
    // SAFETY: the caller's contract (buffer validity and exclusivity until the request is
    // released) is the engine's.
    let r = unsafe { d.engine.submit_raw(job) }?;
    *out = FerryRequest::boxed(d.id, r);
    Ok(FERRY_SUCCESS)
}

/// Creates and submits a request on host memory (pageable; see `ferry_dma_request_create_mem`
/// for other kinds). Never waits for the copy.
///
/// - `FERRY_OP_COPY`: copies every element of `src_layout` (in `src`) to `dst_layout` (in
///   `dst`); `op_arg` unused.
/// - `FERRY_OP_MEMCPY`: copies bytes from the start of `src` to the start of `dst`: `src_len`
///   bytes, or `*(size_t *)op_arg` bytes if `op_arg` is not NULL; layouts unused (may be NULL).
/// - `FERRY_OP_FILL`: writes the element `op_arg` points to (`elem_size` bytes, copied at once)
///   into every element of `dst_layout`; `src` may be NULL (with `src_len` 0).
/// - a user operator: its `lower` callback gets the layouts (either may be NULL) and `op_arg`,
///   on an engine thread, and adds the steps; `src` may be NULL.
///
/// Returns `FERRY_SUCCESS` and the request in `*req`, or (nothing submitted, `*req` unchanged)
/// `-FERRY_EINVAL` (NULL or invalid dma, req, op, dst, a needed src or layout, zero length),
/// `-FERRY_ELAYOUT` (a layout outside its buffer), `-FERRY_ESHAPE`, `-FERRY_EOVERLAP`,
/// `-FERRY_EUNSUPPORTED`, `-FERRY_ESHUTDOWN`, `-FERRY_EDRIVER`. A user operator's own failure
/// is reported later, by wait/test/barrier.
///
/// # Safety
/// 1. `dma` is NULL or a dma not yet destroyed; `op` is NULL, a built-in or a live operator;
///    the layouts are NULL or live layouts (the request keeps copies).
/// 2. `req` is NULL or valid for one write.
/// 3. `dst` is valid for writes of `dst_len` bytes and `src` for reads of `src_len` bytes
///    **until the request is released** by `ferry_request_wait`, `ferry_request_destroy`, or a
///    `ferry_dma_barrier`/`ferry_dma_destroy` on its dma.
/// 4. Until then no other code reads or writes the destination bytes or writes the source bytes.
/// 5. `op_arg` is what the operator expects (see above); for a user operator it must be usable
///    from any thread until the request is released.
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_request_create(
    dma: *mut FerryDma,
    req: *mut *mut FerryRequest,
    dst: *mut c_void,
    dst_len: usize,
    dst_layout: *const FerryLayout,
    src: *const c_void,
    src_len: usize,
    src_layout: *const FerryLayout,
    op: *const FerryOp,
    op_arg: *mut c_void,
) -> c_int {
    guard(|| {
        if dst.is_null() {
            return Err(Fail::inval("dst is NULL"));
        }
        let host = |ptr: *mut c_void, len| FerryBuffer {
            ptr,
            len,
            kind: FERRY_MEM_PAGEABLE,
            device: 0,
        };
        // SAFETY: the contract above, forwarded.
        unsafe {
            create(
                dma,
                req,
                Some(host(dst, dst_len)),
                dst_layout,
                Some(host(src.cast_mut(), src_len)),
                src_layout,
                op,
                op_arg,
            )
        }
    })
}

/// As `ferry_dma_request_create`, with buffers that say where they live (`FERRY_MEM_*`).
/// `src` may be NULL for operators that need no source.
///
/// # Safety
/// As `ferry_dma_request_create`, with `dst`/`src` NULL or valid for reads of a
/// `ferry_buffer` that describes memory of the kind it claims.
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_request_create_mem(
    dma: *mut FerryDma,
    req: *mut *mut FerryRequest,
    dst: *const FerryBuffer,
    dst_layout: *const FerryLayout,
    src: *const FerryBuffer,
    src_layout: *const FerryLayout,
    op: *const FerryOp,
    op_arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: the contract above.
        let (d, s) = unsafe { (dst.as_ref().copied(), src.as_ref().copied()) };
        // SAFETY: the contract above, forwarded.
        unsafe { create(dma, req, d, dst_layout, s, src_layout, op, op_arg) }
    })
}

/// Waits for this request only, releases it and sets `*req` to NULL. May block.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EREQUEST` if the request failed (the message says why; the
/// request is released all the same and a later barrier does not report it again), or
/// `-FERRY_EINVAL` (NULL or invalid `req`/`*req`, invalid `dma`, a request of another dma, or
/// NULL `dma` for a dma's request; nothing released). A request of no dma (a checkpoint
/// save's) is waited with a NULL `dma`.
///
/// # Safety
/// 1. `dma` is NULL or a dma not yet destroyed.
/// 2. `req` is NULL or valid for a read and a write of one pointer; `*req` is NULL or a
///    request not yet released.
#[no_mangle]
pub unsafe extern "C" fn ferry_request_wait(
    dma: *mut FerryDma,
    req: *mut *mut FerryRequest,
) -> c_int {
    guard(|| {
        // SAFETY: the contract above, forwarded.
        unsafe { wait_release(dma, req, |_| Ok(())) }.map(|_| FERRY_SUCCESS)
    })
}

/// `ferry_request_wait`'s body, for the calls that wait for a request of their own kind:
/// checks `*req` with `check`, then against `dma` (nothing released if either refuses),
/// releases it, sets `*req` to NULL and waits for it. Its `extra` back once it succeeded; a
/// failure as `-FERRY_EREQUEST` (released all the same).
///
/// # Safety
/// As `ferry_request_wait`'s.
pub(crate) unsafe fn wait_release(
    dma: *mut FerryDma,
    req: *mut *mut FerryRequest,
    check: impl FnOnce(&FerryRequest) -> Result<(), Fail>,
) -> Result<Option<Extra>, Fail> {
    // SAFETY: the contract (2).
    let slot = unsafe { out(req, "req") }?;
    // `check` first: a request of the wrong kind is named as such, whatever `dma` is.
    // SAFETY: the contract (2).
    check(unsafe { request_mut(*slot, None) }?)?;
    // SAFETY: the contract (1), (2).
    unsafe { request_of(dma, *slot) }?;
    // SAFETY: the contract (2): from `Box::into_raw`, checked live above; released once, here.
    let mut b = unsafe { Box::from_raw(*slot) };
    *slot = std::ptr::null_mut();
    b.magic = 0;
    let id = b.req.id();
    let extra = b.extra.take();
    match b.req.wait() {
        Ok(()) => Ok(extra),
        Err(e) => Err(request_fail(id, &e)),
    }
}

/// Polls a request without blocking: `*done` = 1 once it has completed, 0 while in flight.
/// The request is not released.
///
/// Returns `FERRY_SUCCESS`, `-FERRY_EREQUEST` once it has completed and failed (again at each
/// call; a later barrier does not report it), or `-FERRY_EINVAL` for bad arguments. `dma` as
/// for `ferry_request_wait` (NULL for a request of no dma).
///
/// # Safety
/// 1. `dma` is NULL or a dma not yet destroyed.
/// 2. `req` is NULL or a request not yet released; `done` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_request_test(
    dma: *mut FerryDma,
    req: *mut FerryRequest,
    done: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: (1), (2).
        let r = unsafe { request_of(dma, req) }?;
        // SAFETY: (2).
        let done = unsafe { out(done, "done") }?;
        match r.req.try_wait() {
            None => {
                *done = 0;
                Ok(FERRY_SUCCESS)
            }
            Some(res) => {
                *done = 1;
                res.map(|()| FERRY_SUCCESS)
                    .map_err(|e| request_fail(r.req.id(), &e))
            }
        }
    })
}

/// The request's id, unique in the process; barrier failures name requests by it.
///
/// # Safety
/// 1. `req` is NULL or a request not yet released; `id` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_request_id(req: *mut FerryRequest, id: *mut u64) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let r = unsafe { request_mut(req, None) }?;
        // SAFETY: (1).
        *unsafe { out(id, "id") }? = r.req.id();
        Ok(FERRY_SUCCESS)
    })
}

/// Releases a request without taking its result: waits until it is complete (its buffers are
/// free again when this returns; may block), frees it and sets `*req` to NULL. If it failed
/// and nobody saw the failure, the next `ferry_dma_barrier` reports it. A NULL `*req` is a
/// no-op. `dma` may be NULL (e.g. after `ferry_dma_destroy`); if given, the request must be
/// its own.
///
/// # Safety
/// 1. `dma` is NULL or a dma not yet destroyed.
/// 2. `req` is NULL or valid for a read and a write of one pointer; `*req` is NULL or a
///    request not yet released.
#[no_mangle]
pub unsafe extern "C" fn ferry_request_destroy(
    dma: *mut FerryDma,
    req: *mut *mut FerryRequest,
) -> c_int {
    guard(|| {
        let d = if dma.is_null() {
            None
        } else {
            // SAFETY: (1): not NULL, so a dma not yet destroyed.
            Some(unsafe { dma_ref(dma) }?)
        };
        // SAFETY: (2).
        let slot = unsafe { out(req, "req") }?;
        if slot.is_null() {
            return Ok(FERRY_SUCCESS);
        }
        // SAFETY: (2).
        unsafe { request_mut(*slot, d) }?;
        // SAFETY: (2): from `Box::into_raw`, checked live above; released once, here.
        let mut b = unsafe { Box::from_raw(*slot) };
        *slot = std::ptr::null_mut();
        b.magic = 0;
        // Completion's own wait does not mark the result observed: the barrier still reports it.
        let _ = b.req.completion().wait();
        Ok(FERRY_SUCCESS)
    })
}
