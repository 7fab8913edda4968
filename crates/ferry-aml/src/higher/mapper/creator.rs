//! `aml/higher/mapper/creator.h`: the step-by-step deep copy of a tree-shaped structure into
//! one packed buffer (AML's creator, with its public struct): each element is copied to a host
//! buffer and its parent's pointer rewritten to where it will live in the destination buffer,
//! which receives the host buffer in one copy at `finish`. Fields whose mapper has
//! `AML_MAPPER_FLAG_SPLIT` are branched out to a creator of their own, or connected to a copy
//! made already.

use super::visitor::{
    aml_mapper_visitor_create, aml_mapper_visitor_destroy, aml_mapper_visitor_size, at,
    AmlMapperVisitor, AmlMapperVisitorState,
};
use super::{AmlMapper, AML_MAPPER_FLAG_HOST, AML_MAPPER_FLAG_SPLIT};
use crate::area::{aml_area_mmap, aml_area_munmap, AmlArea};
use crate::dma::{aml_dma_copy_custom, AmlDma, AmlDmaOperator};
use crate::error::{errno, guard, AML_EDOM, AML_EINVAL, AML_ENOMEM, AML_SUCCESS};
use std::ffi::{c_int, c_void};

/// `struct aml_mapper_creator`.
#[repr(C)]
pub struct AmlMapperCreator {
    /// The states; a state's `device_ptr` is the source element, its `host_copy` where it is
    /// copied in `host_memory`.
    pub stack: *mut AmlMapperVisitorState,
    /// The destination buffer (`host_memory` itself for a host copy).
    pub device_memory: *mut c_void,
    /// The host buffer the copy is built in.
    pub host_memory: *mut c_void,
    /// The buffers' size.
    pub size: usize,
    /// The bytes of the buffers used so far.
    pub offset: usize,
    /// The area of `device_memory` (NULL: a host copy).
    pub device_area: *mut AmlArea,
    /// Copies from the source to the host (NULL: the host reads the source).
    pub dma_src_host: *mut AmlDma,
    /// Copies from the host to the destination.
    pub dma_host_dst: *mut AmlDma,
    /// `dma_src_host`'s memcpy operator.
    pub memcpy_src_host: AmlDmaOperator,
    /// `dma_host_dst`'s memcpy operator.
    pub memcpy_host_dst: AmlDmaOperator,
}

impl AmlMapperCreator {
    /// The head state.
    ///
    /// # Safety
    /// 1. `self` valid with a non-empty stack.
    unsafe fn head(&mut self) -> &mut AmlMapperVisitorState {
        // SAFETY: (1).
        unsafe { &mut *self.stack }
    }

    /// Copies the head's element(s) from the source into the host buffer.
    ///
    /// # Safety
    /// 1. `self` valid with a non-empty stack; the source readable (host or dma).
    unsafe fn copy_head(&mut self) -> c_int {
        let (dma, op, cap, used) = (
            self.dma_src_host,
            self.memcpy_src_host,
            self.size,
            self.offset,
        );
        // SAFETY: (1).
        let h = unsafe { self.head() };
        // SAFETY: (1): a valid state's mapper.
        let Some(size) = unsafe { (*h.mapper).size }.checked_mul(h.array_size) else {
            return -AML_EINVAL;
        };
        if used.checked_add(size).is_none_or(|end| end > cap) {
            ferry_capi::set_last_error("the structure outgrew the size it was measured at");
            return -AML_ENOMEM;
        }
        if size > 0 {
            if h.device_ptr.is_null() {
                ferry_capi::set_last_error("a NULL pointer field with elements");
                return -AML_EINVAL;
            }
            if dma.is_null() {
                // SAFETY: (1): the source holds `size` bytes; the buffer has room (checked).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        h.device_ptr.cast::<u8>(),
                        h.host_copy.cast::<u8>(),
                        size,
                    )
                };
            } else {
                // SAFETY: (1): AML's memcpy operator convention.
                let rc = unsafe {
                    aml_dma_copy_custom(
                        dma,
                        h.host_copy.cast(),
                        h.device_ptr.cast(),
                        op,
                        size as *mut c_void,
                    )
                };
                if rc != AML_SUCCESS {
                    return rc;
                }
            }
        }
        self.offset += size;
        AML_SUCCESS
    }

    /// The head becomes field `num` of its parent: its source pointer read from the parent's
    /// host copy, which is pointed at the field's place in the destination.
    ///
    /// # Safety
    /// 1. `self` valid, the head with a parent whose element is in the host buffer, `num` <
    ///    the parent's fields.
    unsafe fn init_field(&mut self, num: usize) -> c_int {
        let (host, dev, off) = (self.host_memory, self.device_memory, self.offset);
        // SAFETY: (1).
        let h = unsafe { self.head() };
        // SAFETY: (1).
        let parent = unsafe { &*h.next };
        // SAFETY: (1).
        let pm = unsafe { &*parent.mapper };
        // SAFETY: (1): a valid mapper's arrays hold `n_fields` entries.
        let (foff, fm, count) = unsafe {
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
        h.mapper = fm;
        h.field_num = num;
        h.array_num = 0;
        // SAFETY: the count function reads the parent's copy.
        h.array_size = count.map_or(1, |f| unsafe { f(parent.host_copy) });
        let field = at(parent.host_copy, foff).cast::<*mut c_void>();
        h.host_copy = at(host, off);
        // SAFETY: (1): the field is a pointer inside the parent's copy.
        unsafe {
            h.device_ptr = field.read_unaligned();
            field.write_unaligned(at(dev, off));
        }
        AML_SUCCESS
    }

    /// # Safety
    /// 1. As `init_field`'s, for the next field.
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
        // SAFETY: checked.
        unsafe { self.init_field(num) }
    }

    /// # Safety
    /// 1. `self` valid with a non-empty stack, the head's element in the host buffer.
    unsafe fn first_field(&mut self) -> c_int {
        // SAFETY: (1).
        if unsafe { (*self.head().mapper).n_fields } == 0 {
            return -AML_EDOM;
        }
        self.stack = Box::into_raw(Box::new(AmlMapperVisitorState {
            device_ptr: std::ptr::null_mut(),
            host_copy: std::ptr::null_mut(),
            mapper: std::ptr::null_mut(),
            field_num: 0,
            array_size: 1,
            array_num: 0,
            next: self.stack,
        }));
        // SAFETY: the new head's parent has a field.
        unsafe { self.init_field(0) }
    }

    /// Pops the head: `-AML_EDOM` when the stack is empty after (or was).
    fn parent(&mut self) -> c_int {
        if self.stack.is_null() {
            return -AML_EDOM;
        }
        // SAFETY: the stack's states are boxes of this module.
        let old = unsafe { Box::from_raw(self.stack) };
        self.stack = old.next;
        if self.stack.is_null() {
            -AML_EDOM
        } else {
            AML_SUCCESS
        }
    }

    /// # Safety
    /// 1. `self` valid with a non-empty stack.
    unsafe fn next_array_element(&mut self) -> c_int {
        // SAFETY: (1).
        let h = unsafe { self.head() };
        if h.array_num + 1 >= h.array_size {
            return -AML_EDOM;
        }
        // SAFETY: (1).
        let size = unsafe { (*h.mapper).size };
        h.device_ptr = at(h.device_ptr, size);
        h.host_copy = at(h.host_copy, size);
        h.array_num += 1;
        AML_SUCCESS
    }

    /// Frees the states, the buffers (the destination unless `keep_device`) and the creator.
    ///
    /// # Safety
    /// 1. `c` from `Box::into_raw` in this module, not used after.
    unsafe fn free(c: *mut AmlMapperCreator, keep_device: bool) {
        // SAFETY: (1).
        let mut c = unsafe { Box::from_raw(c) };
        while c.parent() == AML_SUCCESS {}
        let host = c.host_memory == c.device_memory;
        if !keep_device && !host {
            // SAFETY: mapped from this area with this size.
            unsafe { aml_area_munmap(c.device_area, c.device_memory, c.size) };
        }
        if !(keep_device && host) {
            // SAFETY: from `libc::malloc`.
            unsafe { libc::free(c.host_memory) };
        }
    }
}

/// The bytes of the structure at `ptr` that belong in one buffer (see
/// `aml_mapper_visitor_size`).
///
/// # Safety
/// 1. `ptr` readable through `dma` (or by the host); `mapper` valid.
unsafe fn measure(
    ptr: *mut c_void,
    mapper: *mut AmlMapper,
    dma: *mut AmlDma,
    op: AmlDmaOperator,
) -> Result<usize, c_int> {
    let mut v: *mut AmlMapperVisitor = std::ptr::null_mut();
    // SAFETY: (1).
    let rc = unsafe { aml_mapper_visitor_create(&mut v, ptr, mapper, dma, op) };
    if rc != AML_SUCCESS {
        return Err(rc);
    }
    let mut size = 0;
    // SAFETY: just made.
    let rc = unsafe { aml_mapper_visitor_size(v, &mut size) };
    // SAFETY: just made.
    unsafe { aml_mapper_visitor_destroy(v) };
    if rc != AML_SUCCESS {
        return Err(rc);
    }
    Ok(size)
}

/// Creates a creator copying the structure at `src_ptr` (described by `mapper`) into a buffer
/// of `size` bytes (0: measured) mapped from `area`; with `AML_MAPPER_FLAG_HOST` in the
/// mapper, the copy is the host buffer itself (`area` and `dma_host_dst` may be NULL).
/// `-AML_EINVAL` for a NULL `out`, `src_ptr` or `mapper`, or no `area` / `dma_host_dst` for a
/// copy off the host; `-AML_ENOMEM`; the area's failure; the dma's failure while measuring.
///
/// # Safety
/// 1. `out` NULL or valid for one write; `mapper` NULL or valid; `src_ptr` readable through
///    `dma_src_host` (NULL: by the host) as long as the creator lives; `area`, `area_opts`,
///    the dmas valid as long as it lives.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_creator_create(
    out: *mut *mut AmlMapperCreator,
    src_ptr: *mut c_void,
    size: usize,
    mapper: *mut AmlMapper,
    area: *mut AmlArea,
    area_opts: *mut c_void,
    dma_src_host: *mut AmlDma,
    dma_host_dst: *mut AmlDma,
    memcpy_src_host: AmlDmaOperator,
    memcpy_host_dst: AmlDmaOperator,
) -> c_int {
    guard(|| {
        if out.is_null() || src_ptr.is_null() || mapper.is_null() {
            return Ok(-AML_EINVAL);
        }
        // SAFETY: (1).
        let host =
            unsafe { (*mapper).flags } & (AML_MAPPER_FLAG_HOST & !AML_MAPPER_FLAG_SPLIT) != 0;
        if !host && (area.is_null() || dma_host_dst.is_null()) {
            return Ok(-AML_EINVAL);
        }
        let size = if size == 0 {
            // SAFETY: (1).
            match unsafe { measure(src_ptr, mapper, dma_src_host, memcpy_src_host) } {
                Ok(s) => s,
                Err(rc) => return Ok(rc),
            }
        } else {
            size
        };
        // SAFETY: plain allocation (at least a byte, so that NULL means failure).
        let host_memory = unsafe { libc::malloc(size.max(1)) };
        if host_memory.is_null() {
            return Ok(-AML_ENOMEM);
        }
        let device_memory = if host {
            host_memory
        } else {
            // SAFETY: (1).
            let p = unsafe { aml_area_mmap(area, size.max(1), area_opts) };
            if p.is_null() {
                // SAFETY: just allocated.
                unsafe { libc::free(host_memory) };
                return Ok(-errno().max(1));
            }
            p
        };
        let head = Box::into_raw(Box::new(AmlMapperVisitorState {
            device_ptr: src_ptr,
            host_copy: host_memory,
            mapper,
            field_num: 0,
            array_size: 1,
            array_num: 0,
            next: std::ptr::null_mut(),
        }));
        let c = Box::new(AmlMapperCreator {
            stack: head,
            device_memory,
            host_memory,
            size: if host { size } else { size.max(1) },
            offset: 0,
            device_area: if host { std::ptr::null_mut() } else { area },
            dma_src_host,
            dma_host_dst: if host {
                std::ptr::null_mut()
            } else {
                dma_host_dst
            },
            memcpy_src_host,
            memcpy_host_dst: if host { None } else { memcpy_host_dst },
        });
        // SAFETY: (1).
        unsafe { *out = Box::into_raw(c) };
        Ok(AML_SUCCESS)
    })
}

/// Copies the next element: `AML_SUCCESS`, `-AML_EDOM` when everything is copied (then
/// `finish`), `-AML_EINVAL` at a split field (then `branch` or `connect`), or a NULL creator,
/// or a NULL pointer field with elements; `-AML_ENOMEM` if the structure outgrew its measure;
/// the dma's failure.
///
/// # Safety
/// 1. `c` NULL or a valid creator, not used concurrently.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_creator_next(c: *mut AmlMapperCreator) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let Some(c) = (unsafe { c.as_mut() }) else {
            return Ok(-AML_EINVAL);
        };
        if c.stack.is_null() {
            return Ok(-AML_EDOM);
        }
        // SAFETY: (1) for the calls below: the stack is not empty until `parent` says so.
        unsafe {
            let h = c.head();
            if (*h.mapper).flags & AML_MAPPER_FLAG_SPLIT != 0 && !h.next.is_null() {
                return Ok(-AML_EINVAL);
            }
            if h.array_num == 0 {
                let rc = c.copy_head();
                if rc != AML_SUCCESS {
                    return Ok(rc);
                }
            }
            let rc = c.first_field();
            if rc != -AML_EDOM {
                return Ok(rc);
            }
            loop {
                if (*c.head().mapper).n_fields != 0 {
                    match c.next_array_element() {
                        AML_SUCCESS => {
                            let rc = c.first_field();
                            if rc != -AML_EDOM {
                                return Ok(rc);
                            }
                            continue;
                        }
                        rc if rc != -AML_EDOM => return Ok(rc),
                        _ => {}
                    }
                }
                let rc = c.next_field();
                if rc != -AML_EDOM {
                    return Ok(rc);
                }
                let rc = c.parent();
                if rc != AML_SUCCESS {
                    return Ok(rc);
                }
            }
        }
    })
}

/// Points the split field of the head at `ptr` (a copy made already) and moves to the next
/// element to copy: `AML_SUCCESS`, `-AML_EDOM` when nothing is left, `-AML_EINVAL` for a NULL
/// argument or a head that is not split.
///
/// # Safety
/// 1. `c` NULL or a valid creator, not used concurrently.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_creator_connect(
    c: *mut AmlMapperCreator,
    ptr: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let Some(c) = (unsafe { c.as_mut() }) else {
            return Ok(-AML_EINVAL);
        };
        if ptr.is_null() {
            return Ok(-AML_EINVAL);
        }
        // SAFETY: (1).
        Ok(unsafe { c.connect_to(ptr) })
    })
}

impl AmlMapperCreator {
    /// `aml_mapper_creator_connect` without its NULL check (a NULL `ptr`: an empty field).
    ///
    /// # Safety
    /// 1. `self` valid.
    pub(crate) unsafe fn connect_to(&mut self, ptr: *mut c_void) -> c_int {
        let c = self;
        // SAFETY: (1) for the calls below.
        unsafe {
            if c.stack.is_null()
                || c.head().next.is_null()
                || (*c.head().mapper).flags & AML_MAPPER_FLAG_SPLIT == 0
            {
                return -AML_EINVAL;
            }
            let h = c.head();
            let parent = &*h.next;
            let off = *(*parent.mapper).offsets.add(h.field_num);
            at(parent.host_copy, off)
                .cast::<*mut c_void>()
                .write_unaligned(ptr);
            loop {
                let rc = c.next_field();
                if rc != -AML_EDOM {
                    return rc;
                }
                let rc = c.parent();
                if rc != AML_SUCCESS {
                    return rc;
                }
                if (*c.head().mapper).n_fields == 0 {
                    continue;
                }
                match c.next_array_element() {
                    AML_SUCCESS => {}
                    rc if rc == -AML_EDOM => continue,
                    rc => return rc,
                }
                let rc = c.first_field();
                if rc != -AML_EDOM {
                    return rc;
                }
            }
        }
    }
}

/// A new creator in `*out` for the split field of the head (its elements and descendants, in
/// a buffer of `area`), connected to the field (an empty field: no creator, `*out` NULL, the
/// field NULL); `c` moves on: `AML_SUCCESS`, `-AML_EDOM` if
/// `c` has nothing left, `-AML_EINVAL` for a NULL argument or a head that is not split; the
/// new creator's failure.
///
/// # Safety
/// 1. `out` NULL or valid for one write; `c` NULL or a valid creator; as
///    `aml_mapper_creator_create` for the rest.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_creator_branch(
    out: *mut *mut AmlMapperCreator,
    c: *mut AmlMapperCreator,
    area: *mut AmlArea,
    area_opts: *mut c_void,
    dma_host_dst: *mut AmlDma,
    memcpy_host_dst: AmlDmaOperator,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let Some(cr) = (unsafe { c.as_mut() }) else {
            return Ok(-AML_EINVAL);
        };
        // SAFETY: (1) for the calls below.
        unsafe {
            if out.is_null()
                || area.is_null()
                || dma_host_dst.is_null()
                || cr.stack.is_null()
                || (*cr.head().mapper).flags & AML_MAPPER_FLAG_SPLIT == 0
            {
                return Ok(-AML_EINVAL);
            }
            let h = cr.head();
            let m = h.mapper;
            let (src, n) = (h.device_ptr, h.array_size);
            let tot = if (*m).n_fields == 0 {
                (*m).size.saturating_mul(n)
            } else {
                let mut tot = 0usize;
                for i in 0..n {
                    match measure(
                        at(src, i * (*m).size),
                        m,
                        cr.dma_src_host,
                        cr.memcpy_src_host,
                    ) {
                        Ok(s) => tot = tot.saturating_add(s),
                        Err(rc) => return Ok(rc),
                    }
                }
                tot
            };
            if n == 0 || tot == 0 {
                // Nothing to copy: no creator, the field NULL.
                *out = std::ptr::null_mut();
                return Ok(cr.connect_to(std::ptr::null_mut()));
            }
            if src.is_null() {
                ferry_capi::set_last_error("a NULL pointer field with elements");
                return Ok(-AML_EINVAL);
            }
            let rc = aml_mapper_creator_create(
                out,
                src,
                tot,
                m,
                area,
                area_opts,
                cr.dma_src_host,
                dma_host_dst,
                cr.memcpy_src_host,
                memcpy_host_dst,
            );
            if rc != AML_SUCCESS {
                return Ok(rc);
            }
            (*(**out).stack).array_size = n;
            Ok(cr.connect_to((**out).device_memory))
        }
    })
}

/// Ends a creator whose `next` returned `-AML_EDOM`: copies the host buffer to the destination
/// and frees the creator; the copy in `*ptr` and its size in `*size` (either may be NULL).
/// `-AML_EINVAL` for a NULL creator or one not done (the creator stays; `abort` ends it); the
/// dma's failure (the creator stays).
///
/// # Safety
/// 1. `c` NULL or a valid creator, not used after success; `ptr`, `size` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_creator_finish(
    c: *mut AmlMapperCreator,
    ptr: *mut *mut c_void,
    size: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let Some(cr) = (unsafe { c.as_mut() }) else {
            return Ok(-AML_EINVAL);
        };
        if !cr.stack.is_null() {
            return Ok(-AML_EINVAL);
        }
        if cr.host_memory != cr.device_memory && cr.offset > 0 {
            // SAFETY: (1): AML's memcpy operator convention.
            let rc = unsafe {
                aml_dma_copy_custom(
                    cr.dma_host_dst,
                    cr.device_memory.cast(),
                    cr.host_memory.cast(),
                    cr.memcpy_host_dst,
                    cr.offset as *mut c_void,
                )
            };
            if rc != AML_SUCCESS {
                return Ok(rc);
            }
        }
        // SAFETY: (1).
        unsafe {
            if let Some(p) = ptr.as_mut() {
                *p = cr.device_memory;
            }
            if let Some(s) = size.as_mut() {
                *s = if cr.device_area.is_null() {
                    cr.offset
                } else {
                    cr.size
                };
            }
            AmlMapperCreator::free(c, true);
        }
        Ok(AML_SUCCESS)
    })
}

/// Ends a creator before it is done: frees it and its destination buffer (not its branches).
/// `-AML_EINVAL` for NULL.
///
/// # Safety
/// 1. `crtr` NULL or a valid creator, not used after.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_creator_abort(crtr: *mut AmlMapperCreator) -> c_int {
    if crtr.is_null() {
        return -AML_EINVAL;
    }
    guard(|| {
        // SAFETY: (1).
        unsafe { AmlMapperCreator::free(crtr, false) };
        Ok(AML_SUCCESS)
    })
}
