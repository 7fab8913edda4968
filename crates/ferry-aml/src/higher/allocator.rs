//! `aml/higher/allocator.h`: the generic allocator (`struct aml_allocator`: data and ops), its
//! calls (`aml_alloc`, `aml_free`, the chunk calls), and what the three allocators share: the
//! memory they map from an area and give back when destroyed.
//!
//! The allocators keep their bookkeeping outside the memory they hand out (AML's too), so an
//! area may hand out memory the CPU cannot touch (a device's, or AML's tests' fake addresses).

pub mod area;
pub mod buddy;
pub mod sized;

use crate::area::{aml_area_mmap, aml_area_munmap, AmlArea};
use crate::error::{fail, inval, plain, plain_ptr, AML_ENOTSUP, AML_SUCCESS};
use ferry_capi::Fail;
// foldhash: the allocators look an address up on every call (std's SipHash is slower than
// AML's uthash there).
use foldhash::HashMap;
use std::ffi::{c_int, c_void};

/// `struct aml_allocator_ops`: `alloc` and `free` are required, the chunk calls optional.
#[repr(C)]
pub struct AmlAllocatorOps {
    /// Allocates at least `size` bytes; NULL with `aml_errno` set on failure.
    pub alloc: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    /// Frees a pointer from `alloc`.
    pub free: Option<unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int>,
    /// Allocates a chunk (pointer and actual size); NULL with `aml_errno` set on failure.
    pub alloc_chunk: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut AmlAllocatorChunk>,
    /// Frees a chunk from `alloc_chunk`.
    pub free_chunk: Option<unsafe extern "C" fn(*mut c_void, *mut AmlAllocatorChunk) -> c_int>,
}

/// `struct aml_allocator`: an allocator's data and methods.
#[repr(C)]
pub struct AmlAllocator {
    /// The allocator's data (`struct aml_allocator_data *`), passed to its methods.
    pub data: *mut c_void,
    /// Its methods.
    pub ops: *const AmlAllocatorOps,
}

/// `struct aml_allocator_chunk`: an allocation with its actual size.
#[repr(C)]
pub struct AmlAllocatorChunk {
    /// The memory (read-only for the user).
    pub ptr: *mut c_void,
    /// Its size, at least the size asked for (read-only for the user).
    pub size: usize,
    /// The user's (read/write).
    pub user_data: *mut c_void,
}

/// The allocator and its methods, or `-AML_EINVAL` (NULL allocator, data or ops).
///
/// # Safety
/// 1. `a` NULL or a valid allocator.
unsafe fn parts<'a>(a: *const AmlAllocator) -> Result<(*mut c_void, &'a AmlAllocatorOps), Fail> {
    // SAFETY: (1).
    let a = unsafe { a.as_ref() }.ok_or_else(|| inval("allocator is NULL"))?;
    // SAFETY: (1): a valid allocator's ops are NULL or valid.
    let ops = unsafe { a.ops.as_ref() }.ok_or_else(|| inval("allocator has no ops"))?;
    if a.data.is_null() {
        return Err(inval("allocator has no data"));
    }
    Ok((a.data, ops))
}

/// Allocates at least `size` bytes from `allocator`: NULL with `aml_errno` set on failure
/// (`AML_EINVAL` for a NULL allocator, data, ops or `alloc` method; AML asserts on the last).
///
/// # Safety
/// 1. `allocator` NULL or a valid allocator.
#[no_mangle]
pub unsafe extern "C" fn aml_alloc(allocator: *mut AmlAllocator, size: usize) -> *mut c_void {
    // No unwind guard (nothing here can panic, see `plain`): this runs once per allocation.
    // SAFETY: forwarded.
    plain_ptr(unsafe { aml_alloc_in(allocator, size) })
}

/// [`aml_alloc`]'s body.
///
/// # Safety
/// As [`aml_alloc`]'s.
unsafe fn aml_alloc_in(allocator: *mut AmlAllocator, size: usize) -> Result<*mut c_void, Fail> {
    // SAFETY: (1).
    let (data, ops) = unsafe { parts(allocator) }?;
    let f = ops
        .alloc
        .ok_or_else(|| inval("allocator has no alloc method"))?;
    // SAFETY: (1): the allocator's own method on its own data.
    let p = unsafe { f(data, size) };
    if p.is_null() {
        return Err(fail(crate::error::errno().max(1), "allocation failed"));
    }
    Ok(p)
}

/// Frees `ptr` (from `aml_alloc` on the same allocator). NULL `ptr`: `AML_SUCCESS`; NULL
/// allocator, data, ops or `free` method: `-AML_EINVAL`; else the method's result.
///
/// # Safety
/// 1. `allocator` NULL or a valid allocator; `ptr` NULL or what its `free` accepts.
#[no_mangle]
pub unsafe extern "C" fn aml_free(allocator: *mut AmlAllocator, ptr: *mut c_void) -> c_int {
    if ptr.is_null() {
        return AML_SUCCESS;
    }
    // No unwind guard, as `aml_alloc`.
    // SAFETY: forwarded.
    plain(unsafe { aml_free_in(allocator, ptr) })
}

/// [`aml_free`]'s body.
///
/// # Safety
/// As [`aml_free`]'s.
unsafe fn aml_free_in(allocator: *mut AmlAllocator, ptr: *mut c_void) -> Result<c_int, Fail> {
    // SAFETY: (1).
    let (data, ops) = unsafe { parts(allocator) }?;
    let f = ops
        .free
        .ok_or_else(|| inval("allocator has no free method"))?;
    // SAFETY: (1).
    Ok(unsafe { f(data, ptr) })
}

/// Allocates a chunk of at least `size` bytes: NULL with `aml_errno` set on failure
/// (`AML_EINVAL` for a NULL allocator, `AML_ENOTSUP` if it has no chunk methods).
///
/// # Safety
/// 1. `allocator` NULL or a valid allocator.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_alloc_chunk(
    allocator: *mut AmlAllocator,
    size: usize,
) -> *mut AmlAllocatorChunk {
    // No unwind guard, as `aml_alloc`.
    // SAFETY: forwarded.
    plain_ptr(unsafe { aml_allocator_alloc_chunk_in(allocator, size) })
}

/// [`aml_allocator_alloc_chunk`]'s body.
///
/// # Safety
/// As [`aml_allocator_alloc_chunk`]'s.
unsafe fn aml_allocator_alloc_chunk_in(
    allocator: *mut AmlAllocator,
    size: usize,
) -> Result<*mut AmlAllocatorChunk, Fail> {
    // SAFETY: (1).
    let (data, ops) = unsafe { parts(allocator) }?;
    let f = ops
        .alloc_chunk
        .ok_or_else(|| fail(AML_ENOTSUP, "allocator has no alloc_chunk method"))?;
    // SAFETY: (1).
    let c = unsafe { f(data, size) };
    if c.is_null() {
        return Err(fail(
            crate::error::errno().max(1),
            "chunk allocation failed",
        ));
    }
    Ok(c)
}

/// Frees a chunk from `aml_allocator_alloc_chunk`. NULL chunk: `AML_SUCCESS`; NULL
/// allocator: `-AML_EINVAL`; no chunk methods: `-AML_ENOTSUP`; else the method's result.
///
/// # Safety
/// 1. `allocator` NULL or a valid allocator; `chunk` NULL or what its `free_chunk` accepts.
#[no_mangle]
pub unsafe extern "C" fn aml_allocator_free_chunk(
    allocator: *mut AmlAllocator,
    chunk: *mut AmlAllocatorChunk,
) -> c_int {
    if chunk.is_null() {
        return AML_SUCCESS;
    }
    // No unwind guard, as `aml_alloc`.
    // SAFETY: forwarded.
    plain(unsafe { aml_allocator_free_chunk_in(allocator, chunk) })
}

/// [`aml_allocator_free_chunk`]'s body.
///
/// # Safety
/// As [`aml_allocator_free_chunk`]'s.
unsafe fn aml_allocator_free_chunk_in(
    allocator: *mut AmlAllocator,
    chunk: *mut AmlAllocatorChunk,
) -> Result<c_int, Fail> {
    // SAFETY: (1).
    let (data, ops) = unsafe { parts(allocator) }?;
    let f = ops
        .free_chunk
        .ok_or_else(|| fail(AML_ENOTSUP, "allocator has no free_chunk method"))?;
    // SAFETY: (1).
    Ok(unsafe { f(data, chunk) })
}

/// The memory an allocator mapped from its area (each region as mapped), unmapped on drop.
pub(crate) struct Pools {
    area: *const AmlArea,
    opts: *mut c_void,
    mapped: HashMap<usize, usize>,
    last: usize,
}

impl Pools {
    /// No memory yet; `area` must outlive the pools.
    pub(crate) fn new(area: *const AmlArea, opts: *mut c_void) -> Self {
        Pools {
            area,
            opts,
            mapped: HashMap::default(),
            last: 0,
        }
    }

    /// Maps `size` bytes from the area: its address, or the area's failure (`aml_errno` set).
    pub(crate) fn map(&mut self, size: usize) -> Result<usize, c_int> {
        // SAFETY: the area and its options are valid for the allocator's life (the create
        // functions' contract).
        let p = unsafe { aml_area_mmap(self.area, size, self.opts) };
        if p.is_null() {
            return Err(-crate::error::errno().max(1));
        }
        self.mapped.insert(p as usize, size);
        self.last = size;
        Ok(p as usize)
    }

    /// The size of the last region mapped (0 if none).
    pub(crate) fn last_size(&self) -> usize {
        self.last
    }

    /// Unmaps the region at `addr` (mapped by `map`), or `-AML_EINVAL` if there is none.
    pub(crate) fn unmap(&mut self, addr: usize) -> c_int {
        let Some(&size) = self.mapped.get(&addr) else {
            return -crate::error::AML_EINVAL;
        };
        // SAFETY: as in `map`; the region came from this area with this size.
        let rc = unsafe { aml_area_munmap(self.area, addr as *mut c_void, size) };
        if rc == AML_SUCCESS {
            self.mapped.remove(&addr);
        }
        rc
    }
}

impl Drop for Pools {
    fn drop(&mut self) {
        for (&p, &size) in &self.mapped {
            // SAFETY: as in `unmap`. A failure here has nowhere to go (the allocator is
            // being destroyed); the area reported it through `aml_errno`.
            unsafe { aml_area_munmap(self.area, p as *mut c_void, size) };
        }
    }
}

/// Boxes `data` behind a new `struct aml_allocator` with `ops`, stored in `*out`.
///
/// # Safety
/// 1. `out` valid for one write.
pub(crate) unsafe fn publish<T>(
    out: *mut *mut AmlAllocator,
    data: T,
    ops: &'static AmlAllocatorOps,
) {
    let a = Box::new(AmlAllocator {
        data: Box::into_raw(Box::new(data)).cast(),
        ops,
    });
    // SAFETY: (1).
    unsafe { *out = Box::into_raw(a) };
}

/// Takes back an allocator made by `publish::<T>` with `ops` (`*allocator` set NULL):
/// `-AML_EINVAL` for NULL, or an allocator of another kind.
///
/// # Safety
/// 1. `allocator` NULL or valid; `*allocator` NULL or a valid allocator.
pub(crate) unsafe fn take<T>(
    allocator: *mut *mut AmlAllocator,
    ops: &'static AmlAllocatorOps,
) -> Result<Box<T>, Fail> {
    // SAFETY: (1).
    let slot = unsafe { allocator.as_mut() }.ok_or_else(|| inval("allocator is NULL"))?;
    // SAFETY: (1).
    let a = unsafe { slot.as_ref() }.ok_or_else(|| inval("*allocator is NULL"))?;
    if !std::ptr::eq(a.ops, ops) || a.data.is_null() {
        return Err(inval("not an allocator of this kind"));
    }
    // SAFETY: (1) and the ops check: made by `publish::<T>`.
    let a = unsafe { Box::from_raw(*slot) };
    *slot = std::ptr::null_mut();
    // SAFETY: as above.
    Ok(unsafe { Box::from_raw(a.data.cast::<T>()) })
}

/// The data of an allocator made by `publish::<T>`, from its data pointer.
///
/// # Safety
/// 1. `data` NULL or the data pointer of an allocator made by `publish::<T>`, alive.
pub(crate) unsafe fn data<'a, T>(data: *mut c_void) -> Result<&'a T, Fail> {
    // SAFETY: (1).
    unsafe { data.cast::<T>().as_ref() }.ok_or_else(|| inval("allocator data is NULL"))
}
