//! What the layouts built over another layout (reshape, pad) share: one `malloc` block per
//! layout (so that a program may `free` it, as with AML's), the order argument, the target's
//! native dims, a call of the target's native deref, and the nested printout.

use super::{generic::dims_of, AmlLayout, AmlLayoutOps, Data};
use crate::error::{fail, guard, inval, AML_ENOMEM, AML_SUCCESS};
use ferry_capi::Fail;
use std::ffi::{c_char, c_int, c_void};

/// A new block: the `AmlLayout`, then `T`, then `n` `usize`s, then `extra` bytes (16-byte
/// aligned), all zeroed; `layout.data` points at the `T`.
pub(super) struct Block<T> {
    pub(super) layout: *mut AmlLayout,
    pub(super) data: *mut T,
    pub(super) arr: *mut usize,
    pub(super) extra: *mut u8,
}

impl<T> Block<T> {
    /// Allocates the block (`calloc`, so every field starts NULL / 0).
    pub(super) fn new(ops: *const AmlLayoutOps, n: usize, extra: usize) -> Result<Self, Fail> {
        const {
            assert!(std::mem::align_of::<T>() <= std::mem::align_of::<usize>());
        }
        let word = std::mem::size_of::<usize>();
        let head =
            std::mem::size_of::<AmlLayout>() + std::mem::size_of::<T>().next_multiple_of(word);
        let big = || fail(AML_ENOMEM, "layout too large");
        let arrays = n
            .checked_mul(word)
            .and_then(|a| a.checked_add(head))
            .ok_or_else(big)?;
        let tail = arrays.next_multiple_of(16);
        let bytes = tail.checked_add(extra).ok_or_else(big)?;
        // SAFETY: calloc of one non-zero size; the result is checked.
        let block = unsafe { libc::calloc(1, bytes) }.cast::<u8>();
        if block.is_null() {
            return Err(fail(AML_ENOMEM, "malloc failed"));
        }
        // SAFETY: `block` holds `bytes` bytes, 16-byte aligned (malloc); the parts lie back to
        // back inside it at offsets aligned for their types (`T` is at most pointer-aligned).
        unsafe {
            let layout = block.cast::<AmlLayout>();
            let data = block.add(std::mem::size_of::<AmlLayout>()).cast::<T>();
            layout.write(AmlLayout {
                ops,
                data: data.cast(),
            });
            Ok(Block {
                layout,
                data,
                arr: block.add(head).cast(),
                extra: block.add(tail),
            })
        }
    }
}

/// AML's order argument: `AML_LAYOUT_ORDER(order)`, i.e. its low bit (other bits are tags
/// AML keeps, as the pad layout's `tags`).
pub(super) fn is_row(order: c_int) -> bool {
    order & 1 == super::AML_LAYOUT_ORDER_ROW_MAJOR
}

/// `dims` (given in `row` order) in native (column-major) order.
pub(super) fn native(dims: &[usize], row: bool) -> Vec<usize> {
    let mut v = dims.to_vec();
    if row {
        v.reverse();
    }
    v
}

/// The target's dims in native order (through its `dims_native` op).
///
/// # Safety
/// 1. `target` is NULL or a valid layout.
pub(super) unsafe fn target_dims(target: *const AmlLayout) -> Result<Vec<usize>, Fail> {
    // SAFETY: (1).
    let d = unsafe { dims_of(target, true) }?;
    if d.is_empty() {
        return Err(inval("the target layout has no dims"));
    }
    Ok(d)
}

/// The target's element at native coordinates (its `deref_native` op).
///
/// # Safety
/// 1. `target` is a valid layout; `coords` holds its `ndims` values.
pub(super) unsafe fn deref_native(
    target: *const AmlLayout,
    coords: &[usize],
) -> Result<*mut c_void, Fail> {
    // SAFETY: (1).
    let t = unsafe { target.as_ref() }.ok_or_else(|| inval("target layout is NULL"))?;
    // SAFETY: (1).
    let o = unsafe { t.ops.as_ref() }.ok_or_else(|| inval("target layout's ops are NULL"))?;
    let f = o
        .deref_native
        .ok_or_else(|| inval("the target layout has no deref_native"))?;
    // SAFETY: (1): the target's own function on its own data.
    Ok(unsafe { f(t.data.cast_const(), coords.as_ptr()) })
}

/// Runs `f` on a scratch array of `n` coordinates (on the stack up to 16 dims).
pub(super) fn with_coords<R>(n: usize, f: impl FnOnce(&mut [usize]) -> R) -> R {
    let mut small = [0usize; 16];
    if n <= small.len() {
        return f(&mut small[..n]);
    }
    f(&mut vec![0; n])
}

/// Prints `head`, then the target between `target: begin` and `target: end` lines, as AML.
///
/// # Safety
/// 1. `stream` NULL or a valid `FILE *`; `prefix` NULL or a C string; `target` NULL or valid.
pub(super) unsafe fn print_nested(
    stream: *mut libc::FILE,
    prefix: *const c_char,
    head: &[String],
    target: *const AmlLayout,
) -> Result<c_int, Fail> {
    // SAFETY: (1).
    unsafe { crate::dma::print_lines(stream, prefix, head) }?;
    // SAFETY: (1).
    unsafe { crate::dma::print_lines(stream, prefix, &["target: begin".into()]) }?;
    // SAFETY: (1). A failure of the target's printer is the printout's failure.
    let rc = unsafe { super::generic::aml_layout_fprintf(stream, prefix, target) };
    // SAFETY: (1).
    unsafe { crate::dma::print_lines(stream, prefix, &["target: end".into()]) }?;
    if rc != AML_SUCCESS {
        return Err(fail(-rc, "printing the target layout failed"));
    }
    Ok(AML_SUCCESS)
}

/// Runs a layout op returning a code, the data checked non-NULL first.
pub(super) fn op(data: Data, f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    guard(|| {
        if data.is_null() {
            return Err(inval("layout data is NULL"));
        }
        f()
    })
}
