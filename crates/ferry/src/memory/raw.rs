//! The memory every engine takes: its kind ([`MemKind`]), a raw view of it ([`RawBuf`]), and
//! the traits that describe a buffer ([`Memory`], [`MemoryMut`]).

use bytemuck::Pod;

/// Where a buffer lives, which decides which engines and which hardware paths can reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemKind {
    /// Ordinary host memory (may be paged out; a GPU reaches it only through staging).
    Pageable,
    /// Page-locked host memory the GPUs can DMA to and from (allocated pinned, or registered).
    Pinned,
    /// Page-locked host memory mapped into the GPUs' address space (zero-copy).
    Mapped,
    /// Memory on one GPU.
    Device {
        /// The GPU's ordinal.
        ordinal: u32,
    },
    /// CUDA managed (unified) memory, migrated on demand.
    Managed,
}

impl MemKind {
    /// True for memory the CPU can read and write directly.
    pub fn host_accessible(self) -> bool {
        !matches!(self, MemKind::Device { .. })
    }
}

impl std::fmt::Display for MemKind {
    /// `pageable`, `pinned`, `mapped`, `device 0`, `managed`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemKind::Pageable => f.write_str("pageable"),
            MemKind::Pinned => f.write_str("pinned"),
            MemKind::Mapped => f.write_str("mapped"),
            MemKind::Device { ordinal } => write!(f, "device {ordinal}"),
            MemKind::Managed => f.write_str("managed"),
        }
    }
}

/// A raw view of a buffer: address, length in bytes, kind. Plain data; holding one grants
/// nothing: the safe API ties it to a borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBuf {
    /// Address of the first byte (a host pointer, or a CUDA device pointer).
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// Where it lives.
    pub kind: MemKind,
}

impl RawBuf {
    /// A raw view of host memory.
    pub fn host(ptr: *const u8, len: usize, kind: MemKind) -> RawBuf {
        RawBuf {
            addr: ptr as u64,
            len,
            kind,
        }
    }
    /// The address range the buffer spans.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.addr..self.addr + self.len as u64
    }
}

/// Memory an engine may read.
///
/// # Safety
/// Implementors guarantee that
/// 1. [`Memory::raw`] describes memory valid for reads of `len` bytes for as long as `self` is
///    borrowed, and
/// 2. its `kind` is true (host-accessible kinds are addressable by the CPU at `addr`).
pub unsafe trait Memory {
    /// The raw view.
    fn raw(&self) -> RawBuf;
    /// The size in bytes of the buffer's element type: 1 for untyped memory (the default), 4
    /// for a `[f32]`. The safe API refuses a layout whose element size, offset or strides are
    /// not multiples of it (a typed buffer holds whole elements, where they are aligned).
    fn elem_size(&self) -> usize {
        1
    }
    /// The name of the buffer's element type as [`std::any::type_name`] writes it (`"f32"`
    /// for a `[f32]`); `None` for untyped memory (the default). The safe API refuses a layout
    /// made for another type ([`Layout::check_elem_type`](crate::Layout::check_elem_type)).
    fn elem_type(&self) -> Option<&'static str> {
        None
    }
}

/// The first two of `spans` (`start..end` byte ranges) that overlap, as their indices in
/// `spans`, the earlier-starting first; empty ranges overlap nothing. The one check of
/// disjoint destinations for the calls that write many ranges at once.
pub(crate) fn first_overlap(spans: &[std::ops::Range<u64>]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..spans.len()).filter(|&i| !spans[i].is_empty()).collect();
    order.sort_unstable_by_key(|&i| (spans[i].start, spans[i].end));
    order
        .windows(2)
        .find(|w| spans[w[0]].end > spans[w[1]].start)
        .map(|w| (w[0], w[1]))
}

/// Memory an engine may write.
///
/// # Safety
/// As [`Memory`], and [`MemoryMut::raw_mut`] describes memory valid for writes, not aliased
/// by any other live reference while `self` is mutably borrowed.
pub unsafe trait MemoryMut: Memory {
    /// The raw view, for writing.
    fn raw_mut(&mut self) -> RawBuf;
}

// SAFETY: a shared slice is valid for reads of its bytes while borrowed; ordinary heap or stack
// memory is pageable host memory.
unsafe impl<T: Pod> Memory for [T] {
    fn raw(&self) -> RawBuf {
        RawBuf::host(
            self.as_ptr().cast(),
            std::mem::size_of_val(self),
            MemKind::Pageable,
        )
    }
    fn elem_size(&self) -> usize {
        std::mem::size_of::<T>()
    }
    fn elem_type(&self) -> Option<&'static str> {
        Some(std::any::type_name::<T>())
    }
}
// SAFETY: a mutable slice is valid for writes and unaliased while mutably borrowed; `T: Pod`
// makes any bytes written into it a valid value.
unsafe impl<T: Pod> MemoryMut for [T] {
    fn raw_mut(&mut self) -> RawBuf {
        RawBuf::host(
            self.as_mut_ptr().cast(),
            std::mem::size_of_val(self),
            MemKind::Pageable,
        )
    }
}

/// `Memory`/`MemoryMut` of a container of `[T]` (`T: Pod`) through its slice.
macro_rules! via_slice {
    ($([$($g:tt)*] $t:ty),*) => { $(
        // SAFETY: as for slices: the container's buffer does not move while it is borrowed.
        unsafe impl<T: Pod, $($g)*> Memory for $t {
            fn raw(&self) -> RawBuf {
                self.as_slice().raw()
            }
            fn elem_size(&self) -> usize {
                std::mem::size_of::<T>()
            }
            fn elem_type(&self) -> Option<&'static str> {
                Some(std::any::type_name::<T>())
            }
        }
        // SAFETY: as for slices.
        unsafe impl<T: Pod, $($g)*> MemoryMut for $t {
            fn raw_mut(&mut self) -> RawBuf {
                self.as_mut_slice().raw_mut()
            }
        }
    )* };
}
via_slice!([] Vec<T>, [const N: usize] [T; N]);
// SAFETY: forwards to the referent, borrowed for at least as long.
unsafe impl<M: Memory + ?Sized> Memory for &M {
    fn raw(&self) -> RawBuf {
        (**self).raw()
    }
    fn elem_size(&self) -> usize {
        (**self).elem_size()
    }
    fn elem_type(&self) -> Option<&'static str> {
        (**self).elem_type()
    }
}
// SAFETY: forwards to the referent, borrowed for at least as long.
unsafe impl<M: Memory + ?Sized> Memory for &mut M {
    fn raw(&self) -> RawBuf {
        (**self).raw()
    }
    fn elem_size(&self) -> usize {
        (**self).elem_size()
    }
    fn elem_type(&self) -> Option<&'static str> {
        (**self).elem_type()
    }
}
// SAFETY: forwards to the referent, mutably borrowed for at least as long.
unsafe impl<M: MemoryMut + ?Sized> MemoryMut for &mut M {
    fn raw_mut(&mut self) -> RawBuf {
        (**self).raw_mut()
    }
}

/// A shared view of a byte range of any [`Memory`] (a tensor inside one device allocation),
/// itself [`Memory`] of the same kind, borrowing the buffer for `'a`.
///
/// ```
/// use ferry::memory::{Memory, Region};
/// let v = vec![0u8; 100];
/// let r = Region::of(&v, 10..30).expect("inside the buffer");
/// assert_eq!(r.raw().len, 20);
/// assert!(Region::of(&v, 90..110).is_none());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    raw: RawBuf,
    _borrow: std::marker::PhantomData<&'a ()>,
}

impl<'a> Region<'a> {
    /// `range` of `mem`'s bytes; `None` if it does not lie inside the buffer.
    pub fn of<M: Memory + ?Sized>(mem: &'a M, range: std::ops::Range<usize>) -> Option<Region<'a>> {
        let whole = mem.raw();
        if range.start > range.end || range.end > whole.len {
            return None;
        }
        Some(Region {
            raw: RawBuf {
                addr: whole.addr + range.start as u64,
                len: range.end - range.start,
                kind: whole.kind,
            },
            _borrow: std::marker::PhantomData,
        })
    }
}

// SAFETY: a sub-range of memory valid for reads while borrowed for `'a` (the view holds that
// borrow), of the buffer's own kind.
unsafe impl Memory for Region<'_> {
    fn raw(&self) -> RawBuf {
        self.raw
    }
}

/// A writable view of a byte range of any [`MemoryMut`], of the buffer's own kind: one of
/// several disjoint views that [`RegionMut::split`] makes of one buffer, so that many requests
/// may write into one allocation at once (a snapshot's tensors copied into one pinned buffer,
/// each by its own request).
#[derive(Debug)]
pub(crate) struct RegionMut<'a> {
    raw: RawBuf,
    _borrow: std::marker::PhantomData<&'a mut ()>,
}

impl<'a> RegionMut<'a> {
    /// One view per range of `ranges` (in their order), borrowing `mem` for `'a`; `None` when
    /// a range lies outside the buffer or two ranges overlap (empty ranges overlap nothing).
    pub(crate) fn split<M: MemoryMut + ?Sized>(
        mem: &'a mut M,
        ranges: &[std::ops::Range<usize>],
    ) -> Option<Vec<RegionMut<'a>>> {
        let whole = mem.raw_mut();
        let spans: Vec<std::ops::Range<u64>> = ranges
            .iter()
            .map(|r| r.start as u64..r.end as u64)
            .collect();
        if ranges.iter().any(|r| r.start > r.end || r.end > whole.len)
            || first_overlap(&spans).is_some()
        {
            return None;
        }
        Some(
            ranges
                .iter()
                .map(|r| RegionMut {
                    raw: RawBuf {
                        addr: whole.addr + r.start as u64,
                        len: r.end - r.start,
                        kind: whole.kind,
                    },
                    _borrow: std::marker::PhantomData,
                })
                .collect(),
        )
    }
}

// SAFETY: a sub-range of memory valid for reads and writes while `mem` is mutably borrowed for
// `'a` (the views hold that borrow); `split` hands out only disjoint ranges, so no two views
// alias.
unsafe impl Memory for RegionMut<'_> {
    fn raw(&self) -> RawBuf {
        self.raw
    }
}
// SAFETY: as above; each view is the only one of its bytes.
unsafe impl MemoryMut for RegionMut<'_> {
    fn raw_mut(&mut self) -> RawBuf {
        self.raw
    }
}

#[cfg(test)]
mod overlap_tests {
    use super::first_overlap;

    #[test]
    fn region_mut_splits_disjoint_ranges_inside_the_buffer_only() {
        use super::{Memory, RegionMut};
        let mut v = vec![0u8; 100];
        let base = v.as_ptr() as u64;
        let parts = RegionMut::split(&mut v, &[10..30, 0..10, 30..30, 40..100]).expect("disjoint");
        let got: Vec<(u64, usize)> = parts
            .iter()
            .map(|p| (p.raw().addr - base, p.raw().len))
            .collect();
        assert_eq!(got, [(10, 20), (0, 10), (30, 0), (40, 60)]);
        assert!(RegionMut::split(&mut v, &[0..10, 9..12]).is_none());
        assert!(RegionMut::split(&mut v, &[90..101, 0..0]).is_none());
    }

    #[test]
    fn first_overlap_by_index_touching_and_empty_ranges_apart() {
        assert_eq!(first_overlap(&[]), None);
        assert_eq!(first_overlap(&[0..10, 10..20, 20..20, 5..5]), None);
        assert_eq!(first_overlap(&[30..40, 0..10, 9..12]), Some((1, 2)));
        assert_eq!(
            first_overlap(&[100..200, 0..50, 150..150, 120..130]),
            Some((0, 3))
        );
    }
}
