//! `aml/utils/queue.h`: a FIFO of pointers in a ring (`struct aml_queue` is public: programs
//! read `max`, `head`, `tail`, `len` and `elems`, so the ring's layout is AML's: elements
//! from `head` to `tail` (exclusive) modulo `max`; a full ring doubles, the wrapped part
//! `elems[0..tail]` moving after the old end; taking an element shifts the shorter side
//! that AML shifts). Memory is the C allocator's: `aml_queue_destroy` frees both blocks.

use crate::error::{AML_EDOM, AML_EINVAL, AML_ENOMEM, AML_SUCCESS};
use std::ffi::{c_int, c_void};

/// `struct aml_queue`.
#[repr(C)]
pub struct AmlQueue {
    /// Capacity (doubled when full).
    pub max: usize,
    /// Index of the first element.
    pub head: usize,
    /// Index one past the last element (modulo `max`).
    pub tail: usize,
    /// Number of elements.
    pub len: usize,
    /// `max` slots.
    pub elems: *mut *mut c_void,
}

type Elem = *mut c_void;

/// A queue with room for `max` elements before it grows (`max` 0: 1); NULL when out of memory.
///
/// # Safety
/// 1. None.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_create(max: usize) -> *mut AmlQueue {
    let max = max.max(1);
    // SAFETY: C allocations, checked; the queue is written whole before use.
    unsafe {
        let q = libc::malloc(std::mem::size_of::<AmlQueue>()).cast::<AmlQueue>();
        if q.is_null() {
            return q;
        }
        let elems = libc::calloc(max, std::mem::size_of::<Elem>()).cast::<Elem>();
        if elems.is_null() {
            libc::free(q.cast());
            return std::ptr::null_mut();
        }
        q.write(AmlQueue {
            max,
            head: 0,
            tail: 0,
            len: 0,
            elems,
        });
        q
    }
}

/// Forgets the elements (capacity kept). NULL: no-op.
///
/// # Safety
/// 1. `q` NULL or a queue from `aml_queue_create`.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_clear(q: *mut AmlQueue) {
    // SAFETY: (1).
    if let Some(q) = unsafe { q.as_mut() } {
        (q.head, q.tail, q.len) = (0, 0, 0);
    }
}

/// Frees the queue and its slots. NULL: no-op.
///
/// # Safety
/// 1. `q` NULL or a queue from `aml_queue_create`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_destroy(q: *mut AmlQueue) {
    if q.is_null() {
        return;
    }
    // SAFETY: (1): both blocks are the C allocator's.
    unsafe {
        libc::free((*q).elems.cast());
        libc::free(q.cast());
    }
}

/// The number of elements (0 for NULL).
///
/// # Safety
/// 1. `q` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_len(q: *const AmlQueue) -> usize {
    // SAFETY: (1).
    unsafe { q.as_ref() }.map_or(0, |q| q.len)
}

/// The queue's slots as a slice.
fn slots(q: &mut AmlQueue) -> &mut [Elem] {
    // SAFETY: `elems` holds `max` slots while the queue lives (the queue's invariant).
    unsafe { std::slice::from_raw_parts_mut(q.elems, q.max) }
}

/// Doubles the ring's capacity (at least one slot), keeping its elements in order (AML
/// exports it without declaring it; `aml_queue_push` calls it on a full ring).
/// `-AML_EINVAL` for NULL, `-AML_ENOMEM`.
///
/// # Safety
/// 1. `q` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_extend(q: *mut AmlQueue) -> c_int {
    // SAFETY: (1).
    let Some(q) = (unsafe { q.as_mut() }) else {
        return -AML_EINVAL;
    };
    let old = q.max;
    let new = old.saturating_mul(2).max(1);
    let Some(bytes) = new.checked_mul(std::mem::size_of::<Elem>()) else {
        return -AML_ENOMEM;
    };
    // SAFETY: `elems` is the C allocator's; the result is checked.
    let e = unsafe { libc::realloc(q.elems.cast(), bytes) }.cast::<Elem>();
    if e.is_null() {
        return -AML_ENOMEM;
    }
    (q.elems, q.max) = (e, new);
    // The wrapped part [0, head + len - old) moves after the old end.
    let wrapped = (q.head + q.len).saturating_sub(old);
    slots(q).copy_within(0..wrapped, old);
    q.tail = (q.head + q.len) % new;
    AML_SUCCESS
}

/// Appends `element` at the tail, growing a full ring. `-AML_EINVAL` for NULL,
/// `-AML_ENOMEM`.
///
/// # Safety
/// 1. `q` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_push(q: *mut AmlQueue, element: *mut c_void) -> c_int {
    // SAFETY: (1).
    let Some(q) = (unsafe { q.as_mut() }) else {
        return -AML_EINVAL;
    };
    if q.len == q.max {
        // SAFETY: `q` is valid.
        let rc = unsafe { aml_queue_extend(q) };
        if rc != AML_SUCCESS {
            return rc;
        }
    }
    let t = q.tail;
    slots(q)[t] = element;
    q.tail = (t + 1) % q.max;
    q.len += 1;
    AML_SUCCESS
}

/// Removes and returns the head element; NULL if empty or NULL.
///
/// # Safety
/// 1. `q` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_pop(q: *mut AmlQueue) -> *mut c_void {
    // SAFETY: (1).
    let Some(q) = (unsafe { q.as_mut() }) else {
        return std::ptr::null_mut();
    };
    if q.len == 0 {
        return std::ptr::null_mut();
    }
    let h = q.head;
    let e = slots(q)[h];
    q.head = (q.head + 1) % q.max;
    q.len -= 1;
    e
}

/// The slot of the first element `e` with `comp(e, key) == 0` in `*out` (NULL: not stored).
/// `-AML_EINVAL` for NULL `q` or `comp`, `-AML_EDOM` if none matches.
///
/// # Safety
/// 1. `q` NULL or valid; `out` NULL or valid for one write; `comp` safe on the elements.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_find(
    q: *mut AmlQueue,
    key: *const c_void,
    comp: Option<unsafe extern "C" fn(*const c_void, *const c_void) -> c_int>,
    out: *mut *mut *mut c_void,
) -> c_int {
    // SAFETY: (1).
    let (Some(q), Some(comp)) = (unsafe { q.as_mut() }, comp) else {
        return -AML_EINVAL;
    };
    for i in 0..q.len {
        let at = (q.head + i) % q.max;
        // SAFETY: (1).
        if unsafe { comp(slots(q)[at], key) } == 0 {
            // SAFETY: (1).
            if let Some(o) = unsafe { out.as_mut() } {
                // SAFETY: `at < max`.
                *o = unsafe { q.elems.add(at) };
            }
            return AML_SUCCESS;
        }
    }
    -AML_EDOM
}

/// The slot of element `index` (from the head) in `*out` (NULL: not stored). `-AML_EINVAL`
/// for NULL, `-AML_EDOM` for an index out of bounds.
///
/// # Safety
/// 1. `q` NULL or valid; `out` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_get(
    q: *const AmlQueue,
    index: usize,
    out: *mut *mut *mut c_void,
) -> c_int {
    // SAFETY: (1).
    let Some(q) = (unsafe { q.as_ref() }) else {
        return -AML_EINVAL;
    };
    if index >= q.len {
        return -AML_EDOM;
    }
    // SAFETY: (1).
    if let Some(o) = unsafe { out.as_mut() } {
        // SAFETY: the index is below `max`.
        *o = unsafe { q.elems.add((q.head + index) % q.max) };
    }
    AML_SUCCESS
}

/// The index in `elems` of a slot pointer that holds an element, else None.
fn index_of(q: &AmlQueue, slot: *const *mut c_void) -> Option<usize> {
    let off = (slot as usize).checked_sub(q.elems as usize)?;
    let i = off / std::mem::size_of::<Elem>();
    if off % std::mem::size_of::<Elem>() != 0 || i >= q.max || q.len == 0 {
        return None;
    }
    let inside = if q.head < q.tail {
        (q.head..q.tail).contains(&i)
    } else {
        i >= q.head || i < q.tail
    };
    inside.then_some(i)
}

/// Removes the element in slot `element` (a pointer into `elems`). `-AML_EINVAL` for NULL,
/// `-AML_EDOM` for a slot that holds no element.
///
/// # Safety
/// 1. `q` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_take(q: *mut AmlQueue, element: *mut *mut c_void) -> c_int {
    // SAFETY: (1).
    let Some(q) = (unsafe { q.as_mut() }) else {
        return -AML_EINVAL;
    };
    let Some(i) = index_of(q, element) else {
        return -AML_EDOM;
    };
    let (head, tail, max) = (q.head, q.tail, q.max);
    let s = slots(q);
    if head < tail || i < tail {
        // The elements after it (up to the tail) move back one slot.
        s.copy_within(i + 1..if tail == 0 { max } else { tail }, i);
        q.tail = (tail + max - 1) % max;
    } else {
        // Wrapped, in [head, max): the elements from the head move forward one slot.
        s.copy_within(head..i, head + 1);
        q.head = (head + 1) % max;
    }
    q.len -= 1;
    AML_SUCCESS
}

/// The slot of the head element; NULL if empty or NULL.
///
/// # Safety
/// 1. `q` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_head(q: *const AmlQueue) -> *mut *mut c_void {
    // SAFETY: (1).
    match unsafe { q.as_ref() } {
        // SAFETY: `head < max`.
        Some(q) if q.len > 0 => unsafe { q.elems.add(q.head) },
        _ => std::ptr::null_mut(),
    }
}

/// The slot after `current` (NULL: the head); NULL at the end, for a slot that holds no
/// element, or an empty or NULL queue.
///
/// # Safety
/// 1. `q` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_queue_next(
    q: *const AmlQueue,
    current: *mut *const c_void,
) -> *mut *mut c_void {
    if current.is_null() {
        // SAFETY: (1).
        return unsafe { aml_queue_head(q) };
    }
    // SAFETY: (1).
    let Some(q) = (unsafe { q.as_ref() }) else {
        return std::ptr::null_mut();
    };
    match index_of(q, current.cast()) {
        Some(i) if (i + 1) % q.max != q.tail => {
            // SAFETY: the index is below `max`.
            unsafe { q.elems.add((i + 1) % q.max) }
        }
        _ => std::ptr::null_mut(),
    }
}
