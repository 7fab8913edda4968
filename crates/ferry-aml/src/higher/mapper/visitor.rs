//! `aml/higher/mapper/visitor.h`: the walk of a structure described by a mapper, with AML's
//! public structs (a stack of states, the head the element visited). Where the structure is
//! not readable by the host, each element descended is first copied to the host through the
//! visitor's dma and `memcpy` operator (AML's convention: the layouts are the raw pointers,
//! the argument the size).

use super::AmlMapper;
use crate::dma::{aml_dma_copy_custom, AmlDma, AmlDmaOperator};
use crate::error::{guard, inval, AML_EDOM, AML_EINVAL, AML_ENOMEM, AML_SUCCESS};
use std::ffi::{c_int, c_void};

/// `struct aml_mapper_visitor_state`: one level of the visit.
#[repr(C)]
pub struct AmlMapperVisitorState {
    /// The element visited, where it lives.
    pub device_ptr: *mut c_void,
    /// Its bytes readable by the host (copied when its first field is descended; the element
    /// itself without a dma).
    pub host_copy: *mut c_void,
    /// Its mapper.
    pub mapper: *mut AmlMapper,
    /// Its field number in the parent's mapper.
    pub field_num: usize,
    /// The elements of the array it belongs to (1: not an array).
    pub array_size: usize,
    /// Its index in that array.
    pub array_num: usize,
    /// The parent's state.
    pub next: *mut AmlMapperVisitorState,
}

/// `struct aml_mapper_visitor`.
#[repr(C)]
pub struct AmlMapperVisitor {
    /// The states, the head the element visited.
    pub stack: *mut AmlMapperVisitorState,
    /// The dma copying from where the structure lives to the host (NULL: readable).
    pub dma: *mut AmlDma,
    /// Its `memcpy` operator.
    pub memcpy_op: AmlDmaOperator,
}

/// `p` moved by `off` bytes (wrapping: an address, never dereferenced here).
pub(crate) fn at(p: *mut c_void, off: usize) -> *mut c_void {
    p.cast::<u8>().wrapping_add(off).cast()
}

impl AmlMapperVisitor {
    /// The head state. Every visitor this module hands out has one.
    ///
    /// # Safety
    /// 1. `self` is a valid visitor.
    unsafe fn head(&mut self) -> &mut AmlMapperVisitorState {
        // SAFETY: (1): the stack is never empty while the visitor lives.
        unsafe { &mut *self.stack }
    }

    /// Frees a state and its host copy.
    ///
    /// # Safety
    /// 1. `s` from `Box::into_raw`, off the stack; `owned`: its host copy is a copy.
    unsafe fn free_state(s: *mut AmlMapperVisitorState, owned: bool) {
        // SAFETY: (1).
        let s = unsafe { Box::from_raw(s) };
        if owned {
            // SAFETY: (1): from `libc::malloc` (or NULL).
            unsafe { libc::free(s.host_copy) };
        }
    }

    /// Makes the head's host copy (its element; with no fields, the whole array).
    ///
    /// # Safety
    /// 1. `self` valid; the head's element readable where it lives.
    unsafe fn byte_copy(&mut self) -> c_int {
        let (dma, op) = (self.dma, self.memcpy_op);
        // SAFETY: (1).
        let h = unsafe { self.head() };
        if dma.is_null() {
            h.host_copy = h.device_ptr;
            return AML_SUCCESS;
        }
        // SAFETY: (1): a valid state's mapper.
        let m = unsafe { &*h.mapper };
        let n = if m.n_fields == 0 {
            h.array_size.max(1)
        } else {
            1
        };
        let Some(size) = m.size.checked_mul(n) else {
            return -AML_EINVAL;
        };
        // SAFETY: plain allocation.
        let element = unsafe { libc::malloc(size.max(1)) };
        if element.is_null() {
            return -AML_ENOMEM;
        }
        // SAFETY: (1): AML's memcpy operator convention.
        let rc = unsafe {
            aml_dma_copy_custom(
                dma,
                element.cast(),
                h.device_ptr.cast(),
                op,
                size as *mut c_void,
            )
        };
        if rc != AML_SUCCESS {
            // SAFETY: just allocated.
            unsafe { libc::free(element) };
            return rc;
        }
        // SAFETY: the previous copy is ours (a dma is set).
        unsafe { libc::free(h.host_copy) };
        h.host_copy = element;
        AML_SUCCESS
    }

    /// Points the head at field `num` of its parent (whose host copy is made).
    ///
    /// # Safety
    /// 1. `self` valid with a parent state, `num` < the parent's fields.
    unsafe fn field(&mut self, num: usize) -> c_int {
        // SAFETY: (1).
        let h = unsafe { self.head() };
        // SAFETY: (1).
        let parent = unsafe { &*h.next };
        // SAFETY: (1).
        let pm = unsafe { &*parent.mapper };
        // SAFETY: (1): a valid mapper's arrays hold `n_fields` entries.
        let (off, fm, count) = unsafe {
            (
                *pm.offsets.add(num),
                *pm.fields.add(num),
                if pm.num_elements.is_null() {
                    None
                } else {
                    *pm.num_elements.add(num)
                },
            )
        };
        // SAFETY: (1): the parent's host copy holds its element; the field a pointer.
        h.device_ptr = unsafe {
            at(parent.host_copy, off)
                .cast::<*mut c_void>()
                .read_unaligned()
        };
        h.field_num = num;
        h.mapper = fm;
        h.array_num = 0;
        // SAFETY: the mapper's count function reads the structure's host copy.
        h.array_size = count.map_or(1, |f| unsafe { f(parent.host_copy) });
        AML_SUCCESS
    }

    /// # Safety
    /// 1. `self` valid.
    unsafe fn next_array_element(&mut self) -> c_int {
        // SAFETY: (1).
        let h = unsafe { self.head() };
        if h.array_num + 1 >= h.array_size {
            return -AML_EDOM;
        }
        if h.device_ptr.is_null() {
            return -AML_EINVAL;
        }
        // SAFETY: (1).
        h.device_ptr = at(h.device_ptr, unsafe { (*h.mapper).size });
        h.array_num += 1;
        AML_SUCCESS
    }

    /// # Safety
    /// 1. `self` valid.
    unsafe fn prev_array_element(&mut self) -> c_int {
        // SAFETY: (1).
        let h = unsafe { self.head() };
        if h.array_num == 0 {
            return -AML_EDOM;
        }
        if h.device_ptr.is_null() {
            return -AML_EINVAL;
        }
        // SAFETY: (1).
        h.device_ptr = at(h.device_ptr, unsafe { (*h.mapper).size }.wrapping_neg());
        h.array_num -= 1;
        AML_SUCCESS
    }

    /// # Safety
    /// 1. `self` valid.
    unsafe fn next_field(&mut self) -> c_int {
        // SAFETY: (1).
        let h = unsafe { self.head() };
        if h.next.is_null() {
            return -AML_EDOM;
        }
        let num = h.field_num + 1;
        // SAFETY: (1).
        if num >= unsafe { (*(*h.next).mapper).n_fields } {
            return -AML_EDOM;
        }
        // SAFETY: checked above.
        unsafe { self.field(num) }
    }

    /// # Safety
    /// 1. `self` valid.
    unsafe fn prev_field(&mut self) -> c_int {
        // SAFETY: (1).
        let h = unsafe { self.head() };
        if h.next.is_null() || h.field_num == 0 {
            return -AML_EDOM;
        }
        let num = h.field_num - 1;
        // SAFETY: checked above.
        unsafe { self.field(num) }
    }

    /// # Safety
    /// 1. `self` valid; its elements readable (by the host or the dma).
    unsafe fn first_field(&mut self) -> c_int {
        // SAFETY: (1).
        let h = unsafe { self.head() };
        // SAFETY: (1).
        if unsafe { (*h.mapper).n_fields } == 0 || h.array_size == 0 {
            return -AML_EDOM;
        }
        if h.device_ptr.is_null() {
            return -AML_EINVAL;
        }
        // SAFETY: (1).
        let rc = unsafe { self.byte_copy() };
        if rc != AML_SUCCESS {
            return rc;
        }
        let next = Box::into_raw(Box::new(AmlMapperVisitorState {
            device_ptr: std::ptr::null_mut(),
            host_copy: std::ptr::null_mut(),
            mapper: std::ptr::null_mut(),
            field_num: 0,
            array_size: 1,
            array_num: 0,
            next: self.stack,
        }));
        self.stack = next;
        // SAFETY: the new head has a parent with at least one field.
        unsafe { self.field(0) }
    }

    /// Back to the parent: `-AML_EDOM` at the root (which stays).
    ///
    /// # Safety
    /// 1. `self` valid.
    unsafe fn parent(&mut self) -> c_int {
        let old = self.stack;
        // SAFETY: (1).
        let next = unsafe { (*old).next };
        if next.is_null() {
            return -AML_EDOM;
        }
        self.stack = next;
        // SAFETY: popped; its copy is owned with a dma.
        unsafe { Self::free_state(old, !self.dma.is_null()) };
        AML_SUCCESS
    }

    /// A new visitor of the head's element and its descendants.
    ///
    /// # Safety
    /// 1. `self` valid.
    unsafe fn subtree(&mut self) -> Box<AmlMapperVisitor> {
        // SAFETY: (1).
        let h = unsafe { self.head() };
        new_visitor(h.device_ptr, h.mapper, self.dma, self.memcpy_op)
    }
}

fn new_visitor(
    ptr: *mut c_void,
    mapper: *mut AmlMapper,
    dma: *mut AmlDma,
    memcpy_op: AmlDmaOperator,
) -> Box<AmlMapperVisitor> {
    let head = Box::into_raw(Box::new(AmlMapperVisitorState {
        device_ptr: ptr,
        host_copy: std::ptr::null_mut(),
        mapper,
        field_num: 0,
        array_size: 1,
        array_num: 0,
        next: std::ptr::null_mut(),
    }));
    Box::new(AmlMapperVisitor {
        stack: head,
        dma,
        memcpy_op,
    })
}

impl Drop for AmlMapperVisitor {
    fn drop(&mut self) {
        let owned = !self.dma.is_null();
        while !self.stack.is_null() {
            let s = self.stack;
            // SAFETY: the stack's states are boxes this module made.
            self.stack = unsafe { (*s).next };
            // SAFETY: popped.
            unsafe { AmlMapperVisitor::free_state(s, owned) };
        }
    }
}

/// The visitor behind `it`, or `-AML_EINVAL`.
///
/// # Safety
/// 1. `it` NULL or a visitor from this module, not used concurrently.
unsafe fn visitor<'a>(
    it: *mut AmlMapperVisitor,
) -> Result<&'a mut AmlMapperVisitor, ferry_capi::Fail> {
    // SAFETY: (1).
    match unsafe { it.as_mut() } {
        Some(v) if !v.stack.is_null() => Ok(v),
        _ => Err(inval("visitor is NULL")),
    }
}

/// Creates a visitor of the structure at `ptr` described by `mapper`; `dma` and `memcpy_op`
/// copy from where it lives to the host (NULL: the host reads it). `-AML_EINVAL` for a NULL
/// `out`, `ptr` or `mapper`.
///
/// # Safety
/// 1. `out` NULL or valid for one write; `mapper` NULL or valid (with its fields' mappers)
///    for the visitor's life; `ptr` readable through the dma (or the host) during the visit.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_create(
    out: *mut *mut AmlMapperVisitor,
    ptr: *mut c_void,
    mapper: *mut AmlMapper,
    dma: *mut AmlDma,
    memcpy_op: AmlDmaOperator,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let o = unsafe { out.as_mut() }.ok_or_else(|| inval("out is NULL"))?;
        if ptr.is_null() || mapper.is_null() {
            return Err(inval("ptr or mapper is NULL"));
        }
        *o = Box::into_raw(new_visitor(ptr, mapper, dma, memcpy_op));
        Ok(AML_SUCCESS)
    })
}

/// Frees a visitor. `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `it` NULL or from this module, not used after.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_destroy(it: *mut AmlMapperVisitor) -> c_int {
    if it.is_null() {
        return -AML_EINVAL;
    }
    guard(|| {
        // SAFETY: (1): from `Box::into_raw`.
        drop(unsafe { Box::from_raw(it) });
        Ok(AML_SUCCESS)
    })
}

/// A new visitor of the element visited and its descendants, in `*subtree_visitor`.
///
/// # Safety
/// 1. `it` NULL or a valid visitor; `subtree_visitor` NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_subtree(
    it: *const AmlMapperVisitor,
    subtree_visitor: *mut *mut AmlMapperVisitor,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let v = unsafe { visitor(it.cast_mut()) }?;
        // SAFETY: (1).
        let o = unsafe { subtree_visitor.as_mut() }.ok_or_else(|| inval("out is NULL"))?;
        // SAFETY: (1).
        *o = Box::into_raw(unsafe { v.subtree() });
        Ok(AML_SUCCESS)
    })
}

/// Runs one step of the visitor behind `it` (`-AML_EINVAL` for NULL).
///
/// # Safety
/// 1. `it` NULL or a valid visitor, its structure readable as `aml_mapper_visitor_create` says.
unsafe fn step(it: *mut AmlMapperVisitor, f: impl FnOnce(&mut AmlMapperVisitor) -> c_int) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let v = unsafe { visitor(it) }?;
        Ok(f(v))
    })
}

/// To the next element of the array visited: `-AML_EDOM` if none (or not an array),
/// `-AML_EINVAL` if the element is NULL or the visitor NULL.
///
/// # Safety
/// 1. `it` NULL or a valid visitor, its structure readable as `aml_mapper_visitor_create` says.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_next_array_element(it: *mut AmlMapperVisitor) -> c_int {
    // SAFETY: (1); the step's own contract is the same.
    unsafe { step(it, |v| v.next_array_element()) }
}

/// To the previous element of the array visited: `-AML_EDOM` if none, `-AML_EINVAL` if the
/// element is NULL or the visitor NULL.
///
/// # Safety
/// 1. `it` NULL or a valid visitor, its structure readable as `aml_mapper_visitor_create` says.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_prev_array_element(it: *mut AmlMapperVisitor) -> c_int {
    // SAFETY: (1); the step's own contract is the same.
    unsafe { step(it, |v| v.prev_array_element()) }
}

/// To the next field of the parent: `-AML_EDOM` if none (or at the root).
///
/// # Safety
/// 1. `it` NULL or a valid visitor, its structure readable as `aml_mapper_visitor_create` says.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_next_field(it: *mut AmlMapperVisitor) -> c_int {
    // SAFETY: (1); the step's own contract is the same.
    unsafe { step(it, |v| v.next_field()) }
}

/// To the previous field of the parent: `-AML_EDOM` if none (or at the root).
///
/// # Safety
/// 1. `it` NULL or a valid visitor, its structure readable as `aml_mapper_visitor_create` says.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_prev_field(it: *mut AmlMapperVisitor) -> c_int {
    // SAFETY: (1); the step's own contract is the same.
    unsafe { step(it, |v| v.prev_field()) }
}

/// To the first field of the element visited: `-AML_EDOM` if it has no field (or is an
/// empty array), `-AML_EINVAL` if it is NULL, `-AML_ENOMEM`, or the dma's failure.
///
/// # Safety
/// 1. `it` NULL or a valid visitor, its structure readable as `aml_mapper_visitor_create` says.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_first_field(it: *mut AmlMapperVisitor) -> c_int {
    // SAFETY: (1); the step's own contract is the same.
    unsafe { step(it, |v| v.first_field()) }
}

/// Back to the parent: `-AML_EDOM` at the root (AML pops the root too, leaving a visitor
/// that cannot be used; libaml's stays at the root).
///
/// # Safety
/// 1. `it` NULL or a valid visitor, its structure readable as `aml_mapper_visitor_create` says.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_parent(it: *mut AmlMapperVisitor) -> c_int {
    // SAFETY: (1); the step's own contract is the same.
    unsafe { step(it, |v| v.parent()) }
}

/// The element visited (where it lives); NULL for a NULL visitor.
///
/// # Safety
/// 1. `it` NULL or a valid visitor.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_ptr(it: *mut AmlMapperVisitor) -> *mut c_void {
    // SAFETY: (1).
    unsafe { visitor(it) }.map_or(std::ptr::null_mut(), |v| unsafe { v.head() }.device_ptr)
}

/// 1 if the element visited belongs to an array of more than one element, else 0 (0 for a NULL
/// visitor).
///
/// # Safety
/// 1. `it` NULL or a valid visitor.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_is_array(it: *mut AmlMapperVisitor) -> c_int {
    // SAFETY: (1).
    unsafe { visitor(it) }.map_or(0, |v| c_int::from(unsafe { v.head() }.array_size > 1))
}

/// The length of the array the element visited belongs to (1: not an array; 0 for a NULL
/// visitor).
///
/// # Safety
/// 1. `it` NULL or a valid visitor.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_array_len(it: *mut AmlMapperVisitor) -> usize {
    // SAFETY: (1).
    unsafe { visitor(it) }.map_or(0, |v| unsafe { v.head() }.array_size)
}

/// Where a walk goes next (AML's visit order: depth first, array elements, then fields).
#[derive(Clone, Copy)]
enum Step {
    FirstField,
    NextArrayElement,
    NextField,
}

/// A private visitor of a subtree, walked by `size` and `match`: made only from a valid
/// visitor whose structure the caller of those functions promised readable, and never handed
/// out, so its steps are safe to call.
struct Walk(Box<AmlMapperVisitor>);

impl Walk {
    /// # Safety
    /// 1. `v` valid, its structure readable (by the host or its dma) during the walk.
    unsafe fn of(v: &mut AmlMapperVisitor) -> Walk {
        // SAFETY: (1).
        Walk(unsafe { v.subtree() })
    }
    fn head(&self) -> &AmlMapperVisitorState {
        // SAFETY: a walk's stack is never empty (see `Walk`).
        unsafe { &*self.0.stack }
    }
    fn mapper(&self) -> &AmlMapper {
        // SAFETY: a valid state's mapper (see `Walk`).
        unsafe { &*self.head().mapper }
    }
    fn split(&self) -> bool {
        self.mapper().flags & super::AML_MAPPER_FLAG_SPLIT != 0
    }
    fn bytes(&self) -> usize {
        self.mapper().size.saturating_mul(self.head().array_size)
    }
    fn empty(&self) -> bool {
        self.head().device_ptr.is_null() || self.head().array_size == 0
    }
    fn first_field(&mut self) -> c_int {
        // SAFETY: see `Walk`.
        unsafe { self.0.first_field() }
    }
    fn next_array_element(&mut self) -> c_int {
        // SAFETY: see `Walk`.
        unsafe { self.0.next_array_element() }
    }
    fn next_field(&mut self) -> c_int {
        // SAFETY: see `Walk`.
        unsafe { self.0.next_field() }
    }
    fn parent(&mut self) -> c_int {
        // SAFETY: see `Walk`.
        unsafe { self.0.parent() }
    }
    fn byte_copy(&mut self) -> c_int {
        // SAFETY: see `Walk`.
        unsafe { self.0.byte_copy() }
    }
    /// The host copy's bytes `[off, off + len)`.
    fn copy(&self, off: usize, len: usize) -> &[u8] {
        // SAFETY: called on a head whose host copy is made and holds them (`state_match`).
        unsafe { std::slice::from_raw_parts(at(self.head().host_copy, off).cast::<u8>(), len) }
    }
    /// The mapper's field offsets.
    fn offsets(&self) -> &[usize] {
        let m = self.mapper();
        if m.n_fields == 0 {
            return &[];
        }
        // SAFETY: a valid mapper holds `n_fields` offsets.
        unsafe { std::slice::from_raw_parts(m.offsets, m.n_fields) }
    }
}

/// The bytes of the element(s) visited, in `*size`: the elements and their descendants,
/// except those with `AML_MAPPER_FLAG_SPLIT` (allocated apart). `-AML_EINVAL` for a NULL
/// argument or a NULL element with fields; the dma's failure.
///
/// # Safety
/// 1. `visitor` NULL or a valid visitor, its structure readable; `size` NULL or valid for one
///    write.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_size(
    visitor: *const AmlMapperVisitor,
    size: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let base = unsafe { self::visitor(visitor.cast_mut()) }?;
        // SAFETY: (1).
        let out = unsafe { size.as_mut() }.ok_or_else(|| inval("size is NULL"))?;
        // SAFETY: (1).
        let mut v = unsafe { Walk::of(base) };
        let mut tot = v.bytes();
        let mut step = Step::FirstField;
        loop {
            step = match step {
                Step::FirstField | Step::NextField => {
                    let rc = match step {
                        Step::FirstField => v.first_field(),
                        _ => v.next_field(),
                    };
                    match rc {
                        AML_SUCCESS if v.split() => Step::NextField,
                        AML_SUCCESS => {
                            tot = tot.saturating_add(v.bytes());
                            Step::FirstField
                        }
                        rc if rc != -AML_EDOM => return Ok(rc),
                        _ if matches!(step, Step::FirstField) => Step::NextArrayElement,
                        _ if v.parent() == AML_SUCCESS => Step::NextArrayElement,
                        _ => break,
                    }
                }
                Step::NextArrayElement if v.mapper().n_fields == 0 => Step::NextField,
                Step::NextArrayElement => match v.next_array_element() {
                    AML_SUCCESS => Step::FirstField,
                    rc if rc == -AML_EDOM => Step::NextField,
                    rc => return Ok(rc),
                },
            };
        }
        *out = tot;
        Ok(AML_SUCCESS)
    })
}

/// Whether the heads of two walks hold the same bytes, pointer fields aside (their host
/// copies made).
fn state_match(a: &Walk, b: &Walk) -> bool {
    let (ma, mb) = (a.mapper(), b.mapper());
    if ma.size != mb.size || ma.n_fields != mb.n_fields {
        return false;
    }
    if ma.n_fields == 0 {
        let len = a.bytes();
        return a.head().array_size == b.head().array_size && a.copy(0, len) == b.copy(0, len);
    }
    if a.offsets() != b.offsets() {
        return false;
    }
    let ptr = std::mem::size_of::<*mut c_void>();
    let mut sorted = a.offsets().to_vec();
    sorted.sort_unstable();
    let mut start = 0;
    for &o in sorted.iter().chain(std::iter::once(&ma.size)) {
        if o > start && o <= ma.size && a.copy(start, o - start) != b.copy(start, o - start) {
            return false;
        }
        start = start.max(o.saturating_add(ptr));
    }
    true
}

/// 1 if the two structures hold the same bytes (pointer values aside) and the same shape, 0
/// if not; `-AML_EINVAL` for a NULL visitor or a NULL element with fields; the dma's failure.
///
/// # Safety
/// 1. `lhs`, `rhs` NULL or valid visitors, their structures readable.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_visitor_match(
    lhs: *const AmlMapperVisitor,
    rhs: *const AmlMapperVisitor,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let (a, b) = unsafe { (visitor(lhs.cast_mut())?, visitor(rhs.cast_mut())?) };
        // SAFETY: (1).
        let (mut v1, mut v2) = unsafe { (Walk::of(a), Walk::of(b)) };
        let mut step = Step::FirstField;
        loop {
            let (r1, r2) = match step {
                Step::FirstField => (v1.first_field(), v2.first_field()),
                Step::NextArrayElement => {
                    if v1.mapper().n_fields != v2.mapper().n_fields {
                        return Ok(0);
                    }
                    if v1.mapper().n_fields == 0 {
                        // A NULL or empty array of scalars has nothing to read.
                        if v1.empty() != v2.empty() {
                            return Ok(0);
                        }
                        if !v1.empty() {
                            for v in [&mut v1, &mut v2] {
                                let rc = v.byte_copy();
                                if rc != AML_SUCCESS {
                                    return Ok(rc);
                                }
                            }
                            if !state_match(&v1, &v2) {
                                return Ok(0);
                            }
                        }
                        step = Step::NextField;
                        continue;
                    }
                    (v1.next_array_element(), v2.next_array_element())
                }
                Step::NextField => (v1.next_field(), v2.next_field()),
            };
            if r1 != r2 {
                return Ok(0);
            }
            step = match (r1, step) {
                (AML_SUCCESS, _) => Step::FirstField,
                (rc, _) if rc != -AML_EDOM => return Ok(rc),
                (_, Step::FirstField) => Step::NextArrayElement,
                (_, Step::NextArrayElement) => Step::NextField,
                (_, Step::NextField) => {
                    let (p1, p2) = (v1.parent(), v2.parent());
                    if p1 != p2 {
                        return Ok(0);
                    }
                    if p1 != AML_SUCCESS {
                        break;
                    }
                    if !state_match(&v1, &v2) {
                        return Ok(0);
                    }
                    Step::NextArrayElement
                }
            };
        }
        Ok(1)
    })
}
