//! [`AlignedBuffer`]: zeroed pageable host memory aligned to a page, the one place ferry
//! allocates such memory (the file engine's host bounce buffers, checkpoints in pageable
//! memory). Large ones are fresh anonymous mappings on huge-page boundaries, so that a load
//! into one pays its page faults on the workers that write it, in parallel, as huge pages.

use super::raw::{MemKind, Memory, MemoryMut, RawBuf};
use std::ops::{Deref, DerefMut};

/// Alignment of every [`AlignedBuffer`]: a page, which `O_DIRECT` transfers need and which any
/// element type's alignment divides.
pub(crate) const PAGE_ALIGN: usize = 4096;

/// Zeroed, page-aligned pageable host memory of a fixed length. Dereferences to `[u8]`;
/// [`Memory`]/[`MemoryMut`] of kind [`MemKind::Pageable`]. Unlike a `Vec<u8>`, its start is
/// aligned for any element type (`bytemuck::cast_slice` to `f64` works) and for `O_DIRECT`.
///
/// ```
/// let mut b = ferry::memory::AlignedBuffer::new(10_000)?;
/// b[0] = 7;
/// assert_eq!(b.len(), 10_000);
/// assert_eq!(b.as_ptr() as usize % 4096, 0);
/// # Ok::<(), ferry::memory::AllocError>(())
/// ```
pub struct AlignedBuffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    from: Backing,
}

/// Where an [`AlignedBuffer`]'s memory came from.
enum Backing {
    /// The global allocator, with this layout.
    Heap(std::alloc::Layout),
    /// An anonymous mapping of this many bytes starting at this address (the buffer starts at
    /// the first huge-page boundary inside it).
    Map(*mut libc::c_void, usize),
}

/// Buffers from this size up are mapped straight from the kernel: its pages are zero already
/// (no `memset` that faults every page on the allocating thread) and are faulted in by whoever
/// writes them first (the file engine's workers, in parallel), as huge pages where the system
/// allows (`madvise(MADV_HUGEPAGE)`: one fault per 2 MiB instead of 512).
const MAP_FROM: usize = 4 << 20;

/// A transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

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
        if len >= MAP_FROM {
            return Self::mapped(len).ok_or(err);
        }
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), PAGE_ALIGN).map_err(|_| err)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p).ok_or(err)?;
        Ok(AlignedBuffer {
            ptr,
            len,
            from: Backing::Heap(layout),
        })
    }

    /// `len` bytes of a fresh anonymous mapping (zero pages, not yet faulted in), starting at
    /// a huge-page boundary and advised to use huge pages. None when the system refuses.
    fn mapped(len: usize) -> Option<AlignedBuffer> {
        let map_len = len
            .checked_next_multiple_of(HUGE_PAGE)?
            .checked_add(HUGE_PAGE)?;
        // SAFETY: a new private anonymous mapping (no file, no fixed address): it aliases
        // nothing; the result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let start = (base as usize).next_multiple_of(HUGE_PAGE);
        let ptr = std::ptr::NonNull::new(start as *mut u8)?;
        // SAFETY: `start .. start + len` rounded up to a huge page lies inside the mapping made
        // above (`map_len` has a huge page to spare for the alignment); the advice only changes
        // how its pages are backed, and its failure (huge pages off) is harmless.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                len.next_multiple_of(HUGE_PAGE),
                libc::MADV_HUGEPAGE,
            );
        }
        Some(AlignedBuffer {
            ptr,
            len,
            from: Backing::Map(base, map_len),
        })
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
        match self.from {
            // SAFETY: allocated with this layout in `new`, freed once.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: the mapping made in `mapped`, unmapped once; nothing borrows the buffer
            // any more.
            Backing::Map(base, map_len) => unsafe {
                libc::munmap(base, map_len);
            },
        }
    }
}
