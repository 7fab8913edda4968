//! `aml/utils/bitmap.h`: a fixed bitmap of `AML_BITMAP_MAX` (2048) bits in `unsigned long`
//! words, bit `i` in word `i / bits`, position `i % bits` (as AML, so that a program may read
//! `mask` itself). Every function checks its arguments: NULL or an index out of range is
//! `-AML_EINVAL` (AML asserts in places).

use crate::error::{AML_EINVAL, AML_SUCCESS};
use std::ffi::{c_char, c_int, c_uint, c_ulong, CStr};

/// `AML_BITMAP_MAX`: bits in a bitmap.
pub const AML_BITMAP_MAX: usize = 2048;
/// `AML_BITMAP_NBITS`: bits in a word.
pub const AML_BITMAP_NBITS: usize = 8 * std::mem::size_of::<c_ulong>();
/// `AML_BITMAP_SIZE`: words in a bitmap.
pub const AML_BITMAP_SIZE: usize = AML_BITMAP_MAX / AML_BITMAP_NBITS;

/// `struct aml_bitmap`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AmlBitmap {
    /// The words, bit `i` in `mask[i / AML_BITMAP_NBITS]`.
    pub mask: [c_ulong; AML_BITMAP_SIZE],
}

impl AmlBitmap {
    const ZERO: AmlBitmap = AmlBitmap {
        mask: [0; AML_BITMAP_SIZE],
    };
    fn get(&self, i: usize) -> bool {
        self.mask[i / AML_BITMAP_NBITS] & (1 << (i % AML_BITMAP_NBITS)) != 0
    }
    fn put(&mut self, i: usize, on: bool) {
        let (w, b) = (i / AML_BITMAP_NBITS, 1 << (i % AML_BITMAP_NBITS));
        if on {
            self.mask[w] |= b;
        } else {
            self.mask[w] &= !b;
        }
    }
    fn count(&self) -> usize {
        self.mask.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// Runs `f` on the bitmap, `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `b` is NULL or a valid bitmap.
unsafe fn with<R>(b: *const AmlBitmap, f: impl FnOnce(&AmlBitmap) -> R) -> Result<R, c_int> {
    // SAFETY: (1).
    unsafe { b.as_ref() }.map(f).ok_or(-AML_EINVAL)
}

/// As [`with`], mutable.
///
/// # Safety
/// 1. `b` is NULL or a valid bitmap, not aliased during the call.
unsafe fn with_mut(b: *mut AmlBitmap, f: impl FnOnce(&mut AmlBitmap)) -> c_int {
    // SAFETY: (1).
    match unsafe { b.as_mut() } {
        Some(b) => {
            f(b);
            AML_SUCCESS
        }
        None => -AML_EINVAL,
    }
}

/// Copies `src` into `dst` (nothing if either is NULL).
///
/// # Safety
/// 1. `dst` and `src` NULL or valid bitmaps.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_copy(dst: *mut AmlBitmap, src: *const AmlBitmap) {
    if !dst.is_null() && !src.is_null() {
        // SAFETY: (1); `copy` allows the same bitmap twice.
        unsafe { std::ptr::copy(src, dst, 1) };
    }
}

/// Clears every bit. `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_zero(bitmap: *mut AmlBitmap) -> c_int {
    // SAFETY: (1).
    unsafe { with_mut(bitmap, |b| *b = AmlBitmap::ZERO) }
}

/// Sets every bit. `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_fill(bitmap: *mut AmlBitmap) -> c_int {
    // SAFETY: (1).
    unsafe { with_mut(bitmap, |b| b.mask = [c_ulong::MAX; AML_BITMAP_SIZE]) }
}

/// 1 if bit `i` is set, 0 if not; `-AML_EINVAL` for NULL or `i >= AML_BITMAP_MAX`.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_isset(bitmap: *const AmlBitmap, i: c_uint) -> c_int {
    if i as usize >= AML_BITMAP_MAX {
        return -AML_EINVAL;
    }
    // SAFETY: (1).
    unsafe { with(bitmap, |b| c_int::from(b.get(i as usize))) }.unwrap_or_else(|e| e)
}

/// 1 if no bit is set, else 0; `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_iszero(bitmap: *const AmlBitmap) -> c_int {
    // SAFETY: (1).
    unsafe { with(bitmap, |b| c_int::from(b.mask.iter().all(|&w| w == 0))) }.unwrap_or_else(|e| e)
}

/// 1 if every bit is set, else 0; `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_isfull(bitmap: *const AmlBitmap) -> c_int {
    // SAFETY: (1).
    unsafe {
        with(bitmap, |b| {
            c_int::from(b.mask.iter().all(|&w| w == c_ulong::MAX))
        })
    }
    .unwrap_or_else(|e| e)
}

/// 1 if both have the same bits, else 0; `-AML_EINVAL` if either is NULL.
///
/// # Safety
/// 1. `a` and `b` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_isequal(a: *const AmlBitmap, b: *const AmlBitmap) -> c_int {
    // SAFETY: (1).
    match unsafe { (a.as_ref(), b.as_ref()) } {
        (Some(a), Some(b)) => c_int::from(a.mask == b.mask),
        _ => -AML_EINVAL,
    }
}

/// Sets or clears the bits `i..=ii`; `-AML_EINVAL` for NULL, an index out of range or `i > ii`.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
unsafe fn range(bitmap: *mut AmlBitmap, i: c_uint, ii: c_uint, on: bool) -> c_int {
    let (i, ii) = (i as usize, ii as usize);
    if i > ii || ii >= AML_BITMAP_MAX {
        return -AML_EINVAL;
    }
    // SAFETY: (1).
    unsafe { with_mut(bitmap, |b| (i..=ii).for_each(|k| b.put(k, on))) }
}

/// Sets bit `i`; `-AML_EINVAL` for NULL or `i >= AML_BITMAP_MAX`.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_set(bitmap: *mut AmlBitmap, i: c_uint) -> c_int {
    // SAFETY: (1).
    unsafe { range(bitmap, i, i, true) }
}

/// Clears bit `i`; `-AML_EINVAL` for NULL or `i >= AML_BITMAP_MAX`.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_clear(bitmap: *mut AmlBitmap, i: c_uint) -> c_int {
    // SAFETY: (1).
    unsafe { range(bitmap, i, i, false) }
}

/// Sets bits `i..=ii`; `-AML_EINVAL` for NULL, an index out of range or `i > ii`.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_set_range(
    bitmap: *mut AmlBitmap,
    i: c_uint,
    ii: c_uint,
) -> c_int {
    // SAFETY: (1).
    unsafe { range(bitmap, i, ii, true) }
}

/// Clears bits `i..=ii`; `-AML_EINVAL` for NULL, an index out of range or `i > ii`.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_clear_range(
    bitmap: *mut AmlBitmap,
    i: c_uint,
    ii: c_uint,
) -> c_int {
    // SAFETY: (1).
    unsafe { range(bitmap, i, ii, false) }
}

/// The number of bits set; `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_nset(bitmap: *const AmlBitmap) -> c_int {
    // SAFETY: (1). At most 2048: fits.
    unsafe { with(bitmap, |b| b.count() as c_int) }.unwrap_or_else(|e| e)
}

/// Sets in `bitmap` the bits of the first `size` bits of the words at `src` (bits past
/// `AML_BITMAP_MAX` ignored); bits already set stay set. Nothing if either is NULL.
///
/// # Safety
/// 1. `bitmap` NULL or valid; `src` NULL or valid for `ceil(min(size, MAX) / NBITS)` words.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_copy_from_ulong(
    bitmap: *mut AmlBitmap,
    src: *const c_ulong,
    size: usize,
) {
    let n = size.min(AML_BITMAP_MAX);
    // SAFETY: (1).
    let (Some(b), false) = (unsafe { bitmap.as_mut() }, src.is_null()) else {
        return;
    };
    // SAFETY: (1).
    let words = unsafe { std::slice::from_raw_parts(src, n.div_ceil(AML_BITMAP_NBITS)) };
    for i in 0..n {
        if words[i / AML_BITMAP_NBITS] & (1 << (i % AML_BITMAP_NBITS)) != 0 {
            b.put(i, true);
        }
    }
}

/// Sets in the words at `dst` the bits of the first `size` bits of `bitmap` (others left as
/// they are). Nothing if either is NULL.
///
/// # Safety
/// 1. `bitmap` NULL or valid; `dst` NULL or valid for `ceil(min(size, MAX) / NBITS)` words.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_copy_to_ulong(
    bitmap: *const AmlBitmap,
    dst: *mut c_ulong,
    size: usize,
) {
    let n = size.min(AML_BITMAP_MAX);
    // SAFETY: (1).
    let (Some(b), false) = (unsafe { bitmap.as_ref() }, dst.is_null()) else {
        return;
    };
    // SAFETY: (1).
    let words = unsafe { std::slice::from_raw_parts_mut(dst, n.div_ceil(AML_BITMAP_NBITS)) };
    for i in 0..n {
        if b.get(i) {
            words[i / AML_BITMAP_NBITS] |= 1 << (i % AML_BITMAP_NBITS);
        }
    }
}

/// The index of the highest bit set; -1 if none; `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_last(bitmap: *const AmlBitmap) -> c_int {
    // SAFETY: (1).
    unsafe { with(bitmap, |b| (0..AML_BITMAP_MAX).rev().find(|&i| b.get(i))) }
        .map_or_else(|e| e, |i| i.map_or(-1, |i| i as c_int))
}

/// The index of the lowest bit set; -1 if none or NULL (as AML).
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_first(bitmap: *const AmlBitmap) -> c_int {
    // SAFETY: (1).
    unsafe { with(bitmap, |b| (0..AML_BITMAP_MAX).find(|&i| b.get(i))) }
        .ok()
        .flatten()
        .map_or(-1, |i| i as c_int)
}

/// Parses a bitmap: NULL, "none", "zero", "empty" (no bit); "all", "fill", "full" (every
/// bit), case-insensitive; a comma-separated list of bit indices; or the string
/// `aml_bitmap_to_string` gives. 0, or -1 for a string that is none of these (the bitmap then
/// unchanged) or a NULL bitmap.
///
/// # Safety
/// 1. `bitmap` NULL or valid; `s` NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_from_string(bitmap: *mut AmlBitmap, s: *const c_char) -> c_int {
    // SAFETY: (1).
    let Some(out) = (unsafe { bitmap.as_mut() }) else {
        return -1;
    };
    let text = if s.is_null() {
        "none".to_owned()
    } else {
        // SAFETY: (1).
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    match parse(&text) {
        Some(b) => {
            *out = b;
            0
        }
        None => -1,
    }
}

fn parse(text: &str) -> Option<AmlBitmap> {
    let lower = text.to_ascii_lowercase();
    let mut b = AmlBitmap::ZERO;
    match lower.as_str() {
        "none" | "zero" | "empty" => return Some(b),
        "all" | "fill" | "full" => {
            b.mask = [c_ulong::MAX; AML_BITMAP_SIZE];
            return Some(b);
        }
        _ => {}
    }
    if let Some(body) = text.strip_prefix('[') {
        let bits = body.strip_suffix(']')?.as_bytes();
        if bits.len() != AML_BITMAP_MAX {
            return None;
        }
        for (i, c) in bits.iter().enumerate() {
            match c {
                b'1' => b.put(i, true),
                b'0' => {}
                _ => return None,
            }
        }
        return Some(b);
    }
    for tok in text.split(',').filter(|t| !t.is_empty()) {
        let i: usize = tok.trim().parse().ok()?;
        if i >= AML_BITMAP_MAX {
            return None;
        }
        b.put(i, true);
    }
    text.starts_with(|c: char| c.is_ascii_digit()).then_some(b)
}

/// The bitmap as `[` then one `0`/`1` per bit (bit 0 first) then `]`, in `malloc`'d memory
/// the caller frees; NULL for a NULL bitmap or when out of memory.
///
/// # Safety
/// 1. `bitmap` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_to_string(bitmap: *const AmlBitmap) -> *mut c_char {
    // SAFETY: (1).
    let Some(b) = (unsafe { bitmap.as_ref() }) else {
        return std::ptr::null_mut();
    };
    let len = AML_BITMAP_MAX + 3;
    // SAFETY: a fresh allocation of `len` bytes, checked, then written within bounds.
    unsafe {
        let p = libc::malloc(len).cast::<u8>();
        if p.is_null() {
            return std::ptr::null_mut();
        }
        *p = b'[';
        for i in 0..AML_BITMAP_MAX {
            *p.add(1 + i) = if b.get(i) { b'1' } else { b'0' };
        }
        *p.add(AML_BITMAP_MAX + 1) = b']';
        *p.add(AML_BITMAP_MAX + 2) = 0;
        p.cast()
    }
}

/// Allocates a cleared bitmap (`malloc`'d: `aml_bitmap_destroy` or `free` releases it).
/// `-AML_EINVAL` for NULL, `-AML_ENOMEM`.
///
/// # Safety
/// 1. `map` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_create(map: *mut *mut AmlBitmap) -> c_int {
    if map.is_null() {
        return -AML_EINVAL;
    }
    // SAFETY: a zeroed allocation of one bitmap, checked; (1).
    unsafe {
        let b = libc::calloc(1, std::mem::size_of::<AmlBitmap>()).cast::<AmlBitmap>();
        if b.is_null() {
            return -crate::error::AML_ENOMEM;
        }
        *map = b;
    }
    AML_SUCCESS
}

/// Frees a bitmap from `aml_bitmap_create`/`aml_bitmap_dup` and sets `*map` NULL (NULL: no-op).
///
/// # Safety
/// 1. `map` NULL or valid; `*map` NULL or from this library's create or dup.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_destroy(map: *mut *mut AmlBitmap) {
    // SAFETY: (1).
    if let Some(slot) = unsafe { map.as_mut() } {
        // SAFETY: (1): `malloc`'d.
        unsafe { libc::free((*slot).cast()) };
        *slot = std::ptr::null_mut();
    }
}

/// A new bitmap holding `src`'s bits. `-AML_EINVAL` for NULL, `-AML_ENOMEM`.
///
/// # Safety
/// 1. `dst` NULL or valid for one write; `src` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_bitmap_dup(dst: *mut *mut AmlBitmap, src: *const AmlBitmap) -> c_int {
    if src.is_null() {
        return -AML_EINVAL;
    }
    // SAFETY: (1).
    let rc = unsafe { aml_bitmap_create(dst) };
    if rc == AML_SUCCESS {
        // SAFETY: (1); `*dst` was just allocated.
        unsafe { aml_bitmap_copy(*dst, src) };
    }
    rc
}
