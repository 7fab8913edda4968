//! Operators (`ferry_op`): the built-ins and user operators from a C callback table.

use crate::error::{guard, op_code, out, strerror, Fail, FERRY_SUCCESS};
use crate::layout::{layout_ref, FerryLayout};
use ferry::{Layout, OpError, Operator, Program};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

const OP_MAGIC: u64 = 0x6665_7272_795f_6f70; // "ferry_op"
const PROGRAM_MAGIC: u64 = 0x6665_7272_795f_7067; // "ferry_pg"

/// An operator handle (`ferry_op` in C): a built-in (a static object) or a user operator.
pub struct FerryOp {
    magic: u64,
    pub(crate) kind: OpKind,
}

/// What an operator handle stands for.
pub(crate) enum OpKind {
    Copy,
    Memcpy,
    Fill,
    Custom(Arc<CustomOp>),
}

/// `FERRY_OP_COPY`: copy every element of the source layout to the destination layout.
#[no_mangle]
pub static ferry_op_copy: FerryOp = FerryOp {
    magic: OP_MAGIC,
    kind: OpKind::Copy,
};
/// `FERRY_OP_MEMCPY`: flat copy of bytes (layouts ignored).
#[no_mangle]
pub static ferry_op_memcpy: FerryOp = FerryOp {
    magic: OP_MAGIC,
    kind: OpKind::Memcpy,
};
/// `FERRY_OP_FILL`: write one element's pattern into every element of the destination layout.
#[no_mangle]
pub static ferry_op_fill: FerryOp = FerryOp {
    magic: OP_MAGIC,
    kind: OpKind::Fill,
};

/// Checks an operator handle.
///
/// # Safety
/// 1. `p` is NULL or points to a `ferry_op` (a built-in or one not yet destroyed).
pub(crate) unsafe fn op_ref<'a>(p: *const FerryOp) -> Result<&'a OpKind, Fail> {
    // SAFETY: the caller's guarantee (1).
    let o = unsafe { p.as_ref() }.ok_or_else(|| Fail::inval("operator is NULL"))?;
    if o.magic != OP_MAGIC {
        return Err(Fail::inval(
            "operator is not a ferry_op (destroyed, or another handle type)",
        ));
    }
    Ok(&o.kind)
}

/// The `lower` callback of a user operator (`ferry_lower_fn` in C).
pub type FerryLowerFn = Option<
    unsafe extern "C" fn(
        prog: *mut FerryProgram,
        dst: *const FerryLayout,
        src: *const FerryLayout,
        op_arg: *mut c_void,
        user_data: *mut c_void,
    ) -> c_int,
>;

/// A user operator's callback table (`ferry_operator` in C). Copied by
/// [`ferry_operator_create`]; the strings and pointers it holds must outlive the operator.
#[repr(C)]
pub struct FerryOperator {
    /// A short name for error messages (NUL-terminated; NULL: `"custom"`). Copied.
    pub name: *const c_char,
    /// Adds the request's steps with `ferry_program_copy`/`ferry_program_fill`; returns
    /// `FERRY_SUCCESS` or a negative code, which fails the request. May run more than once
    /// for one request (the multiplex engine lowers at submit to size it) and must build the
    /// same steps each time.
    pub lower: FerryLowerFn,
    /// Called once with `user_data` after the operator is destroyed and the engines have
    /// dropped every request's reference to it: shortly after the last request completes,
    /// possibly on an engine thread (may be NULL).
    pub destroy: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    /// Passed to `lower` and `destroy`.
    pub user_data: *mut c_void,
}

pub(crate) struct CustomOp {
    name: String,
    lower: unsafe extern "C" fn(
        *mut FerryProgram,
        *const FerryLayout,
        *const FerryLayout,
        *mut c_void,
        *mut c_void,
    ) -> c_int,
    destroy: Option<unsafe extern "C" fn(*mut c_void)>,
    user_data: *mut c_void,
}

// SAFETY: the C contract of `ferry_operator_create` (1)-(2): the callbacks and `user_data`
// may be used from any thread, concurrently.
unsafe impl Send for CustomOp {}
// SAFETY: as above.
unsafe impl Sync for CustomOp {}

impl Drop for CustomOp {
    fn drop(&mut self) {
        if let Some(d) = self.destroy {
            // SAFETY: the C contract: `destroy` accepts `user_data`, called exactly once, here.
            unsafe { d(self.user_data) }
        }
    }
}

/// One request's use of a user operator: the operator, the request's layouts and `op_arg`.
pub(crate) struct Bound {
    pub(crate) op: Arc<CustomOp>,
    pub(crate) dst: Option<Layout>,
    pub(crate) src: Option<Layout>,
    pub(crate) arg: *mut c_void,
    pub(crate) dst_len: usize,
    pub(crate) src_len: Option<usize>,
}

// SAFETY: `arg` is only handed back to the user's callback, which the C contract of
// `ferry_dma_request_create` (op_arg) allows on any thread.
unsafe impl Send for Bound {}
// SAFETY: as above.
unsafe impl Sync for Bound {}

/// The program a user operator is building (`ferry_program` in C); valid only during its
/// `lower` callback.
pub struct FerryProgram {
    magic: u64,
    prog: *mut Program,
    dst_len: usize,
    src_len: Option<usize>,
    error: Option<String>,
}

impl Operator for Bound {
    fn name(&self) -> &str {
        &self.op.name
    }
    fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
        let mut p = FerryProgram {
            magic: PROGRAM_MAGIC,
            prog,
            dst_len: self.dst_len,
            src_len: self.src_len,
            error: None,
        };
        let dst = self.dst.map(FerryLayout::boxed);
        let src = self.src.map(FerryLayout::boxed);
        // SAFETY: the C contract of `ferry_operator_create`: `lower` takes these arguments;
        // the layouts and program outlive the call.
        let rc = unsafe {
            (self.op.lower)(
                &mut p,
                dst.unwrap_or(std::ptr::null_mut()),
                src.unwrap_or(std::ptr::null_mut()),
                self.arg,
                self.op.user_data,
            )
        };
        for l in [dst, src].into_iter().flatten() {
            // SAFETY: boxed above, not freed by the callback (it gets const pointers).
            drop(unsafe { Box::from_raw(l) });
        }
        p.magic = 0;
        if rc == FERRY_SUCCESS {
            return Ok(());
        }
        let what = strerror(rc).to_string_lossy();
        Err(OpError::Custom(match p.error {
            Some(e) => format!("returned {rc} ({what}): {e}"),
            None => format!("returned {rc} ({what})"),
        }))
    }
}

/// Creates a user operator from a callback table (copied; `table` may be freed afterwards).
///
/// Returns `FERRY_SUCCESS`, or `-FERRY_EINVAL` (NULL `out`, `table` or `table->lower`, or a
/// name that is not valid UTF-8).
///
/// # Safety
/// 1. `lower` and `destroy` may be called from any thread (engine workers), `lower`
///    concurrently for different requests, with `user_data`; they must not unwind.
/// 2. `user_data` stays valid until `destroy` is called (or forever if `destroy` is NULL).
/// 3. `out` is NULL or valid for one write; `table` is NULL or valid for reads; `table->name`
///    is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ferry_operator_create(
    out: *mut *mut FerryOp,
    table: *const FerryOperator,
) -> c_int {
    guard(|| {
        // SAFETY: (3).
        let out = unsafe { crate::error::out(out, "out") }?;
        // SAFETY: (3).
        let t = unsafe { table.as_ref() }.ok_or_else(|| Fail::inval("table is NULL"))?;
        let lower = t.lower.ok_or_else(|| Fail::inval("table->lower is NULL"))?;
        let name = if t.name.is_null() {
            "custom".to_string()
        } else {
            // SAFETY: (3).
            unsafe { CStr::from_ptr(t.name) }
                .to_str()
                .map_err(|_| Fail::inval("table->name is not valid UTF-8"))?
                .to_string()
        };
        let op = CustomOp {
            name,
            lower,
            destroy: t.destroy,
            user_data: t.user_data,
        };
        *out = Box::into_raw(Box::new(FerryOp {
            magic: OP_MAGIC,
            kind: OpKind::Custom(Arc::new(op)),
        }));
        Ok(FERRY_SUCCESS)
    })
}

/// Destroys a user operator and sets `*op` to NULL. Requests already created with it keep it
/// alive; its `destroy` callback runs when the last of them is released. A NULL `*op` is a
/// no-op; a built-in operator is `-FERRY_EINVAL` (they are static).
///
/// # Safety
/// 1. `op` is NULL or valid for a read and a write of one pointer.
/// 2. `*op` is NULL, a built-in, or an operator from `ferry_operator_create` not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn ferry_operator_destroy(op: *mut *mut FerryOp) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let slot = unsafe { out(op, "op") }?;
        if slot.is_null() {
            return Ok(FERRY_SUCCESS);
        }
        // SAFETY: (2).
        if !matches!(unsafe { op_ref(*slot) }?, OpKind::Custom(_)) {
            return Err(Fail::inval(
                "built-in operators are static and cannot be destroyed",
            ));
        }
        // SAFETY: (2): a custom operator came from `Box::into_raw` in `ferry_operator_create`.
        let mut b = unsafe { Box::from_raw(*slot) };
        b.magic = 0;
        drop(b);
        *slot = std::ptr::null_mut();
        Ok(FERRY_SUCCESS)
    })
}

/// Checks a program handle.
///
/// # Safety
/// 1. `p` is NULL or the program passed to a `lower` callback that is still running.
unsafe fn program<'a>(p: *mut FerryProgram) -> Result<&'a mut FerryProgram, Fail> {
    // SAFETY: (1).
    let p = unsafe { p.as_mut() }.ok_or_else(|| Fail::inval("prog is NULL"))?;
    if p.magic != PROGRAM_MAGIC {
        return Err(Fail::inval(
            "prog is not a live ferry_program (used outside its lower callback?)",
        ));
    }
    Ok(p)
}

fn record(p: &mut FerryProgram, r: Result<(), OpError>) -> Result<c_int, Fail> {
    match r {
        Ok(()) => Ok(FERRY_SUCCESS),
        Err(e) => {
            p.error = Some(e.to_string());
            Err(Fail::new(op_code(&e), e.to_string()))
        }
    }
}

/// In a `lower` callback: adds a copy from `src` (in the request's source buffer) to `dst` (in
/// its destination buffer). Checked at once against the buffers: returns `-FERRY_ELAYOUT`
/// (outside a buffer), `-FERRY_ESHAPE`, `-FERRY_EOVERLAP`, or `-FERRY_EINVAL` (no source
/// buffer, NULL pointer). The error text is also kept as the request's error if the callback
/// then returns a negative code.
///
/// # Safety
/// 1. `prog` is NULL or the program of a running `lower` callback, on the callback's thread.
/// 2. `dst` and `src` are NULL or live layouts.
#[no_mangle]
pub unsafe extern "C" fn ferry_program_copy(
    prog: *mut FerryProgram,
    dst: *const FerryLayout,
    src: *const FerryLayout,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let p = unsafe { program(prog) }?;
        // SAFETY: (2).
        let (d, s) = unsafe { (layout_ref(dst, "dst")?, layout_ref(src, "src")?) };
        // SAFETY: (1): `prog` points to the `Program` being lowered, borrowed for the callback.
        let r = unsafe { &mut *p.prog }.copy(d, s);
        record(p, r)
    })
}

/// In a `lower` callback: adds a fill of every element of `dst` with `pattern`
/// (`pattern_len` must equal the layout's element size, else `-FERRY_EINVAL`).
///
/// # Safety
/// 1. `prog` is NULL or the program of a running `lower` callback, on the callback's thread.
/// 2. `dst` is NULL or a live layout; `pattern` is NULL or valid for `pattern_len` reads.
#[no_mangle]
pub unsafe extern "C" fn ferry_program_fill(
    prog: *mut FerryProgram,
    dst: *const FerryLayout,
    pattern: *const c_void,
    pattern_len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let p = unsafe { program(prog) }?;
        // SAFETY: (2).
        let d = unsafe { layout_ref(dst, "dst") }?;
        // SAFETY: (2).
        let pat = unsafe { crate::error::array(pattern.cast::<u8>(), pattern_len, "pattern") }?;
        // SAFETY: (1).
        let r = unsafe { &mut *p.prog }.fill(d, pat);
        record(p, r)
    })
}

/// In a `lower` callback: the request's destination length and source length in bytes
/// (`*src_len` = 0 when the request has no source). Either output may be NULL.
///
/// # Safety
/// 1. `prog` is NULL or the program of a running `lower` callback, on the callback's thread.
/// 2. `dst_len`, `src_len` are NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn ferry_program_buffers(
    prog: *mut FerryProgram,
    dst_len: *mut usize,
    src_len: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let p = unsafe { program(prog) }?;
        // SAFETY: (2), each checked non-null.
        unsafe {
            if let Some(d) = dst_len.as_mut() {
                *d = p.dst_len;
            }
            if let Some(s) = src_len.as_mut() {
                *s = p.src_len.unwrap_or(0);
            }
        }
        Ok(FERRY_SUCCESS)
    })
}
