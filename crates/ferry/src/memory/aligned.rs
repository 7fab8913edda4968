//! [`AlignedBuffer`]: zeroed pageable host memory aligned to a page, the one place ferry
//! allocates such memory (the file engine's host bounce buffers, checkpoints in pageable
//! memory).

use super::raw::{MemKind, Memory, MemoryMut, RawBuf};
use std::ops::{Deref, DerefMut};

/// Alignment of every [`AlignedBuffer`]: a page, which `O_DIRECT` transfers need and which any
/// element type's alignment divides.
pub const PAGE_ALIGN: usize = 4096;

/// Zeroed, page-aligned pageable host memory of a fixed length. Dereferences to `[u8]`;
/// [`Memory`]/[`MemoryMut`] of kind [`MemKind::Pageable`]. Unlike a `Vec<u8>`, its start is
/// aligned for any element type (`bytemuck::cast_slice` to `f64` works) and for `O_DIRECT`.
///
/// ```
/// let mut b = ferry::memory::AlignedBuffer::new(10_000)?;
/// b[0] = 7;
/// assert_eq!(b.len(), 10_000);
/// assert_eq!(b.as_ptr() as usize % ferry::memory::PAGE_ALIGN, 0);
/// # Ok::<(), ferry::memory::AllocError>(())
/// ```
pub struct AlignedBuffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
}

/// An [`AlignedBuffer`] could not be allocated (the system is out of memory, or the length
/// overflows): the length asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate {bytes} bytes of page-aligned host memory")]
pub struct AllocError {
    /// Bytes asked for.
    pub bytes: usize,
}

// SAFETY: the buffer owns its allocation; shared access only reads it.
unsafe impl Send for AlignedBuffer {}
// SAFETY: as above.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// `len` zero bytes, page-aligned. A failed allocation is an error, never an abort.
    pub fn new(len: usize) -> Result<AlignedBuffer, AllocError> {
        let err = AllocError { bytes: len };
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), PAGE_ALIGN).map_err(|_| err)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p).ok_or(err)?;
        Ok(AlignedBuffer { ptr, len, layout })
    }
}

impl std::fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AlignedBuffer {{ ptr: {:p}, len: {} }}",
            self.ptr, self.len
        )
    }
}

impl Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the allocation holds `len` initialised (zeroed) bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: a live host allocation of `len` bytes owned by the buffer.
unsafe impl Memory for AlignedBuffer {
    fn raw(&self) -> RawBuf {
        RawBuf::host(self.ptr.as_ptr(), self.len, MemKind::Pageable)
    }
}

// SAFETY: as above; `&mut self` is exclusive.
unsafe impl MemoryMut for AlignedBuffer {
    fn raw_mut(&mut self) -> RawBuf {
        self.raw()
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
