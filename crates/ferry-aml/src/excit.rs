//! libaml's `excit.h`: the iterators AML's tiling programs use (ranges and products of
//! iterators), libaml's own code with excit's interface and values, so that `pkg-config aml`
//! is all a tiling program needs. An `excit_t` is a boxed [`Excit`].

use std::ffi::c_int;

/// `EXCIT_SUCCESS`.
pub const EXCIT_SUCCESS: c_int = 0;
/// `EXCIT_STOPIT`: the iteration is over.
pub const EXCIT_STOPIT: c_int = 1;
/// `EXCIT_ENOMEM` (returned negated).
pub const EXCIT_ENOMEM: c_int = 2;
/// `EXCIT_EINVAL` (returned negated).
pub const EXCIT_EINVAL: c_int = 3;
/// `EXCIT_RANGE`, the range iterator's type tag.
pub const EXCIT_RANGE: c_int = 2;
/// `EXCIT_PRODUCT`, the product iterator's type tag.
pub const EXCIT_PRODUCT: c_int = 6;

/// An iterator (`struct excit_s`, opaque to C).
pub enum Excit {
    /// `first`, `first + step`, ... up to `last` included; `v` the current value. `dim` is 0
    /// until `excit_range_init`, as excit's.
    Range {
        /// First value.
        first: isize,
        /// Last value (included when reached).
        last: isize,
        /// Step (0: not initialised, an error to iterate).
        step: isize,
        /// Current value.
        v: isize,
        /// 1 once initialised.
        dim: usize,
    },
    /// The product of its parts, the last one fastest.
    Product(Vec<Box<Excit>>),
}

impl Excit {
    /// The number of indexes of an element.
    fn dimension(&self) -> usize {
        match self {
            Excit::Range { dim, .. } => *dim,
            Excit::Product(its) => its.iter().map(|i| i.dimension()).sum(),
        }
    }

    /// The current element in `out` (of `dimension()` values), or `EXCIT_STOPIT` / an error.
    fn peek(&self, out: &mut [isize]) -> c_int {
        match self {
            Excit::Range { last, step, v, .. } => {
                if *step == 0 {
                    return -EXCIT_EINVAL;
                }
                if (*step > 0 && v > last) || (*step < 0 && v < last) {
                    return EXCIT_STOPIT;
                }
                if let Some(o) = out.first_mut() {
                    *o = *v;
                }
                EXCIT_SUCCESS
            }
            Excit::Product(its) => {
                if its.is_empty() {
                    return -EXCIT_EINVAL;
                }
                let mut off = 0;
                for it in its {
                    let d = it.dimension();
                    let rc = it.peek(&mut out[off..off + d]);
                    if rc != EXCIT_SUCCESS {
                        return rc;
                    }
                    off += d;
                }
                EXCIT_SUCCESS
            }
        }
    }

    /// Back to the first element.
    fn rewind(&mut self) -> c_int {
        match self {
            Excit::Range { first, v, .. } => {
                *v = *first;
                EXCIT_SUCCESS
            }
            Excit::Product(its) => {
                for it in its {
                    let rc = it.rewind();
                    if rc != EXCIT_SUCCESS {
                        return rc;
                    }
                }
                EXCIT_SUCCESS
            }
        }
    }

    /// The current element in `out`, then the next one becomes current.
    fn next(&mut self, out: &mut [isize]) -> c_int {
        match self {
            Excit::Range { .. } => {
                let rc = self.peek(out);
                if rc == EXCIT_SUCCESS {
                    if let Excit::Range { v, step, .. } = self {
                        *v += *step;
                    }
                }
                rc
            }
            Excit::Product(_) => {
                // The current element first (nothing moves if there is none; an empty
                // product is -EXCIT_EINVAL).
                let rc = self.peek(out);
                if rc != EXCIT_SUCCESS {
                    return rc;
                }
                let Excit::Product(its) = self else {
                    return -EXCIT_EINVAL;
                };
                // An odometer: the last part advances; a part that runs out rewinds and
                // carries to the one before; the first part running out ends the product.
                let mut scratch =
                    vec![0isize; its.iter().map(|i| i.dimension()).max().unwrap_or(0)];
                for (k, it) in its.iter_mut().enumerate().rev() {
                    let d = it.dimension();
                    let rc = it.next(&mut scratch[..d]);
                    if rc != EXCIT_SUCCESS {
                        return rc;
                    }
                    if k == 0 || it.peek(&mut scratch[..d]) != EXCIT_STOPIT {
                        break;
                    }
                    let rc = it.rewind();
                    if rc != EXCIT_SUCCESS {
                        return rc;
                    }
                }
                EXCIT_SUCCESS
            }
        }
    }
}

/// The iterator behind an `excit_t`.
///
/// # Safety
/// 1. `it` is NULL or from `excit_alloc`, not freed.
unsafe fn get<'a>(it: *const Excit) -> Option<&'a Excit> {
    // SAFETY: (1).
    unsafe { it.as_ref() }
}

/// Runs `f` on `dimension` indexes, written to `indexes` unless NULL.
///
/// # Safety
/// 1. `indexes` is NULL or valid for `dimension` writes.
unsafe fn with_out(
    indexes: *mut isize,
    dimension: usize,
    f: impl FnOnce(&mut [isize]) -> c_int,
) -> c_int {
    let mut buf = vec![0isize; dimension];
    let rc = f(&mut buf);
    if rc == EXCIT_SUCCESS && !indexes.is_null() {
        // SAFETY: (1).
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), indexes, dimension) };
    }
    rc
}

/// A new iterator of type `ty` (`EXCIT_RANGE` or `EXCIT_PRODUCT`; NULL for the others, which
/// libaml does not make). Free it with `excit_free`.
#[no_mangle]
pub extern "C" fn excit_alloc(ty: c_int) -> *mut Excit {
    let it = match ty {
        EXCIT_RANGE => Excit::Range {
            first: 0,
            last: 0,
            step: 0,
            v: 0,
            dim: 0,
        },
        EXCIT_PRODUCT => Excit::Product(Vec::new()),
        _ => return std::ptr::null_mut(),
    };
    Box::into_raw(Box::new(it))
}

/// Frees an iterator and, for a product, its parts. NULL: no-op.
///
/// # Safety
/// 1. `it` is NULL or from `excit_alloc`, not owned by a product, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn excit_free(it: *mut Excit) {
    if !it.is_null() {
        // SAFETY: (1): a box from `excit_alloc`.
        drop(unsafe { Box::from_raw(it) });
    }
}

/// The number of indexes an element has, in `*dimension`. `-EXCIT_EINVAL` for NULL.
///
/// # Safety
/// 1. `it` as `excit_free`'s, or owned by a product; `dimension` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn excit_dimension(it: *const Excit, dimension: *mut isize) -> c_int {
    // SAFETY: (1).
    match (unsafe { get(it) }, dimension.is_null()) {
        (Some(i), false) => {
            // SAFETY: (1).
            unsafe { *dimension = i.dimension() as isize };
            EXCIT_SUCCESS
        }
        _ => -EXCIT_EINVAL,
    }
}

/// The current element in `indexes` (NULL: not written), then the next one is current.
/// `EXCIT_STOPIT` when the iteration is over; `-EXCIT_EINVAL` for NULL, a range not
/// initialised or an empty product.
///
/// # Safety
/// 1. `it` as `excit_dimension`'s; `indexes` NULL or valid for its dimension's writes.
#[no_mangle]
pub unsafe extern "C" fn excit_next(it: *mut Excit, indexes: *mut isize) -> c_int {
    // SAFETY: (1).
    let Some(i) = (unsafe { it.as_mut() }) else {
        return -EXCIT_EINVAL;
    };
    let d = i.dimension();
    // SAFETY: (1).
    unsafe { with_out(indexes, d, |o| i.next(o)) }
}

/// The current element in `indexes` (NULL: not written); as `excit_next` without moving.
///
/// # Safety
/// 1. As `excit_next`'s.
#[no_mangle]
pub unsafe extern "C" fn excit_peek(it: *const Excit, indexes: *mut isize) -> c_int {
    // SAFETY: (1).
    let Some(i) = (unsafe { get(it) }) else {
        return -EXCIT_EINVAL;
    };
    // SAFETY: (1).
    unsafe { with_out(indexes, i.dimension(), |o| i.peek(o)) }
}

/// Back to the first element. `-EXCIT_EINVAL` for NULL.
///
/// # Safety
/// 1. As `excit_dimension`'s.
#[no_mangle]
pub unsafe extern "C" fn excit_rewind(it: *mut Excit) -> c_int {
    // SAFETY: (1).
    match unsafe { it.as_mut() } {
        Some(i) => i.rewind(),
        None => -EXCIT_EINVAL,
    }
}

/// Makes a range iterate `first`, `first + step`, ... up to `last` included (down to it for
/// a negative step). `-EXCIT_EINVAL` for NULL or an iterator other than a range.
///
/// # Safety
/// 1. As `excit_dimension`'s.
#[no_mangle]
pub unsafe extern "C" fn excit_range_init(
    it: *mut Excit,
    first: isize,
    last: isize,
    step: isize,
) -> c_int {
    // SAFETY: (1).
    match unsafe { it.as_mut() } {
        Some(r @ Excit::Range { .. }) => {
            *r = Excit::Range {
                first,
                last,
                step,
                v: first,
                dim: 1,
            };
            EXCIT_SUCCESS
        }
        _ => -EXCIT_EINVAL,
    }
}

/// Adds `added` as the product's last (fastest) part; on success the product owns it (and
/// frees it). `-EXCIT_EINVAL` for NULL, `it` not a product, or `added` being `it`.
///
/// # Safety
/// 1. `it` as `excit_dimension`'s; `added` NULL or from `excit_alloc`, not owned by a product.
#[no_mangle]
pub unsafe extern "C" fn excit_product_add(it: *mut Excit, added: *mut Excit) -> c_int {
    if added.is_null() || std::ptr::eq(it, added) {
        return -EXCIT_EINVAL;
    }
    // SAFETY: (1).
    match unsafe { it.as_mut() } {
        Some(Excit::Product(its)) => {
            if its.try_reserve(1).is_err() {
                return -EXCIT_ENOMEM;
            }
            // SAFETY: (1): a box from `excit_alloc`, now the product's.
            its.push(unsafe { Box::from_raw(added) });
            EXCIT_SUCCESS
        }
        _ => -EXCIT_EINVAL,
    }
}
