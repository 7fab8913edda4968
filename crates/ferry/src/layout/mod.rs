//! N-D strided layouts: dims, byte strides, element size and a byte offset.
//!
//! A [`Layout`] describes where the elements of an N-D array live inside one buffer. Dimension 0
//! is the outermost (row-major order: the last dimension varies fastest in
//! [`Layout::contiguous`]). Strides are stored in bytes and never negative (give them in elements
//! with [`Layout::with_strides`], or in bytes with [`Layout::with_byte_strides`]); a stride of 0 repeats an
//! element (a broadcast source). A dim of extent 0 is legal: the layout holds no element
//! ([`Layout::is_empty`]), spans `offset..offset`, and a copy or fill over it completes at once
//! (the C API and AML's keep refusing zero dims). Every constructor and transformation checks its input and
//! returns a [`LayoutError`] in every build: nothing here panics on user input.
//!
//! ```
//! use ferry::Layout;
//! // A 1024 x 1024 matrix of f32, rows padded to 4352 bytes.
//! let m = Layout::pitched(&[1024, 1024], 4, 4352)?;
//! // The 256 x 256 tile at rows 128.., columns 512..
//! let tile = m.slice(0, 128..384, 1)?.slice(1, 512..768, 1)?;
//! assert_eq!(tile.dims(), &[256, 256]);
//! assert_eq!(tile.offset(), 128 * 4352 + 512 * 4);
//! assert!(tile.check_buffer(1024 * 4352).is_ok());
//! # Ok::<(), ferry::LayoutError>(())
//! ```

mod error;
mod reshape;

pub use error::LayoutError;

use std::ops::Range;

/// The most dimensions a [`Layout`] holds.
pub const MAX_DIMS: usize = 16;

/// An N-D strided view of elements inside one buffer, in bytes.
///
/// Plain data (`Copy`); cheap to pass by value. See the [module documentation](self).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    offset: usize,
    elem_size: usize,
    ndim: usize,
    dims: [usize; MAX_DIMS],
    strides: [usize; MAX_DIMS],
    elem_type: ElemType,
}

/// The name of the Rust type a layout was made for ([`Layout::of`], [`Layout::with_strides`]),
/// checked against a typed buffer's at submit. A check, not part of the geometry: equality and
/// hashing ignore it, so `Layout::of::<f32>` equals `Layout::contiguous(.., 4)`.
#[derive(Clone, Copy, Default)]
struct ElemType(Option<&'static str>);

impl PartialEq for ElemType {
    fn eq(&self, _: &ElemType) -> bool {
        true
    }
}
impl Eq for ElemType {}
impl std::hash::Hash for ElemType {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layout")
            .field("dims", &self.dims())
            .field("strides", &self.strides())
            .field("elem_size", &self.elem_size)
            .field("offset", &self.offset)
            .field("elem_type", &self.elem_type.0)
            .finish()
    }
}

impl Layout {
    /// A dense row-major layout of elements of type `T`: [`Layout::contiguous`] with
    /// `size_of::<T>()` as the element size.
    ///
    /// ```
    /// let l = ferry::Layout::of::<f32>(&[2, 3])?;
    /// assert_eq!((l.elem_size(), l.strides()), (4, &[12, 4][..]));
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    pub fn of<T>(dims: &[usize]) -> Result<Layout, LayoutError> {
        Layout::contiguous(dims, std::mem::size_of::<T>()).map(|l| l.typed::<T>())
    }

    /// This layout, made for elements of type `T` (its element size is `T`'s).
    fn typed<T>(mut self) -> Layout {
        self.elem_type = ElemType(Some(std::any::type_name::<T>()));
        self
    }

    /// The name of the Rust type the layout was made for: `Some("f32")` from
    /// `Layout::of::<f32>` or `Layout::with_strides::<f32>`; `None` for layouts built from an
    /// element size in bytes. The safe API refuses a typed layout over a buffer of another
    /// element type ([`Layout::check_elem_type`]).
    pub fn elem_type(&self) -> Option<&'static str> {
        self.elem_type.0
    }

    /// Checks that a buffer whose elements are of the type named `buffer` (as
    /// [`std::any::type_name`] writes it) holds this layout's elements: a layout made for
    /// another type is refused, naming both. Untyped layouts, untyped buffers and byte buffers
    /// (`u8`, `i8`: raw storage for anything) pass.
    ///
    /// ```
    /// use ferry::Layout;
    /// assert!(Layout::of::<f32>(&[4])?.check_elem_type(Some("f32")).is_ok());
    /// assert!(Layout::of::<f64>(&[4])?.check_elem_type(Some("i32")).is_err());
    /// assert!(Layout::contiguous(&[4], 8)?.check_elem_type(Some("i32")).is_ok());
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    #[inline]
    pub fn check_elem_type(&self, buffer: Option<&'static str>) -> Result<(), LayoutError> {
        match (self.elem_type.0, buffer) {
            (Some(layout), Some(buffer)) if layout != buffer && !matches!(buffer, "u8" | "i8") => {
                Err(LayoutError::ElemType { layout, buffer })
            }
            _ => Ok(()),
        }
    }

    /// A layout of elements of type `T` from dims (outermost first) and strides counted in
    /// elements, as PyTorch's `Tensor.stride()` and NumPy's `strides / itemsize` give them.
    ///
    /// ```
    /// // The transpose of a 2 x 3 row-major f32 matrix: element strides [1, 3].
    /// let t = ferry::Layout::with_strides::<f32>(&[3, 2], &[1, 3])?;
    /// assert_eq!(t.strides(), &[4, 12]); // in bytes
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    ///
    /// Errors: as [`Layout::with_byte_strides`], and a stride whose byte count overflows.
    pub fn with_strides<T>(dims: &[usize], elem_strides: &[usize]) -> Result<Layout, LayoutError> {
        let size = std::mem::size_of::<T>();
        let mut bytes = [0usize; MAX_DIMS];
        for (b, &s) in bytes.iter_mut().zip(elem_strides) {
            *b = s.checked_mul(size).ok_or(LayoutError::Overflow)?;
        }
        // More strides than MAX_DIMS: keep the count so that the length check reports it.
        let n = elem_strides.len();
        if n > MAX_DIMS {
            return Layout::with_byte_strides(dims, elem_strides, size);
        }
        Layout::with_byte_strides(dims, &bytes[..n], size).map(|l| l.typed::<T>())
    }

    /// A general layout from dims (outermost first), strides in **bytes**, and an element size
    /// in bytes. For strides counted in elements use [`Layout::with_strides`].
    ///
    /// A dim of extent 0 makes an empty layout (no element, span `offset..offset`).
    ///
    /// Errors: more than [`MAX_DIMS`] dims, no dims, a zero element size, dims and strides of
    /// different lengths, or a byte span that overflows `usize`.
    pub fn with_byte_strides(
        dims: &[usize],
        strides: &[usize],
        elem_size: usize,
    ) -> Result<Layout, LayoutError> {
        if dims.len() != strides.len() {
            return Err(LayoutError::StridesLength {
                dims: dims.len(),
                strides: strides.len(),
            });
        }
        if dims.is_empty() {
            return Err(LayoutError::NoDims);
        }
        if dims.len() > MAX_DIMS {
            return Err(LayoutError::TooManyDims {
                ndim: dims.len(),
                max: MAX_DIMS,
            });
        }
        if elem_size == 0 {
            return Err(LayoutError::ZeroElemSize);
        }
        let mut l = Layout {
            offset: 0,
            elem_size,
            ndim: dims.len(),
            dims: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
            elem_type: ElemType(None),
        };
        l.dims[..dims.len()].copy_from_slice(dims);
        l.strides[..dims.len()].copy_from_slice(strides);
        l.extent()?;
        l.len_checked()?;
        Ok(l)
    }

    /// A dense row-major (C order) layout: the last dim is contiguous.
    ///
    /// ```
    /// let l = ferry::Layout::contiguous(&[2, 3, 4], 8)?;
    /// assert_eq!(l.strides(), &[96, 32, 8]);
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    pub fn contiguous(dims: &[usize], elem_size: usize) -> Result<Layout, LayoutError> {
        let strides = dense_strides(dims, elem_size, false)?;
        Layout::with_byte_strides(dims, &strides[..dims.len().min(MAX_DIMS)], elem_size)
    }

    /// Checks that a buffer of `elem`-byte elements can hold this layout: its element size,
    /// offset and the strides of dims longer than 1 are multiples of `elem` (the safe API checks
    /// this at submit for typed buffers such as `Vec<f32>`).
    ///
    /// ```
    /// use ferry::Layout;
    /// assert!(Layout::of::<f32>(&[4, 4])?.check_elem(4).is_ok());
    /// // Element strides [4, 1] given as byte strides: elements overlap, rows are 4 bytes.
    /// assert!(Layout::with_byte_strides(&[4, 4], &[4, 1], 4)?.check_elem(4).is_err());
    /// assert!(Layout::with_strides::<f32>(&[4, 4], &[4, 1])?.check_elem(4).is_ok());
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    #[inline]
    pub fn check_elem(&self, elem: usize) -> Result<(), LayoutError> {
        if elem <= 1 {
            // Every value is a multiple of one byte (the byte buffers of every `memcpy`: no
            // call, no pass over the dims on the path a small copy's caller waits for, issue 14).
            return Ok(());
        }
        self.check_whole_elems(elem)
    }

    /// [`Layout::check_elem`] for elements of more than one byte.
    fn check_whole_elems(&self, elem: usize) -> Result<(), LayoutError> {
        let stride = (0..self.ndim)
            .filter(|&i| self.dims[i] > 1)
            .map(|i| self.strides[i])
            .find(|s| s % elem != 0);
        let bad = [("element size", self.elem_size), ("offset", self.offset)]
            .into_iter()
            .find(|(_, v)| v % elem != 0)
            .or(stride.map(|s| ("stride", s)));
        match bad {
            Some((what, value)) => Err(LayoutError::NotWholeElements { what, value, elem }),
            None => Ok(()),
        }
    }

    /// A dense 1-D layout of `bytes` bytes (element size 1); empty for 0 bytes.
    #[inline]
    pub fn bytes(bytes: usize) -> Result<Layout, LayoutError> {
        // Every `memcpy` builds two of these: built directly, without the general checks,
        // none of which can fail for one dim of one-byte elements (the same layout as
        // `Layout::contiguous(&[bytes], 1)`: tests.rs `bytes_matches_contiguous`).
        let mut l = Layout {
            offset: 0,
            elem_size: 1,
            ndim: 1,
            dims: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
            elem_type: ElemType(None),
        };
        l.dims[0] = bytes;
        l.strides[0] = 1;
        Ok(l)
    }

    /// A dense column-major (Fortran order) layout: the first dim is contiguous.
    ///
    /// ```
    /// let l = ferry::Layout::column_major(&[2, 3, 4], 8)?;
    /// assert_eq!(l.strides(), &[8, 16, 48]);
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    pub fn column_major(dims: &[usize], elem_size: usize) -> Result<Layout, LayoutError> {
        let strides = dense_strides(dims, elem_size, true)?;
        Layout::with_byte_strides(dims, &strides[..dims.len().min(MAX_DIMS)], elem_size)
    }

    /// A row-major layout whose rows (the last dim) start every `pitch` bytes, as returned by
    /// `cudaMallocPitch`; outer dims are dense over padded rows.
    ///
    /// Errors: `pitch` smaller than one row, and everything [`Layout::with_byte_strides`] checks.
    pub fn pitched(dims: &[usize], elem_size: usize, pitch: usize) -> Result<Layout, LayoutError> {
        let mut strides = dense_strides(dims, elem_size, false)?;
        let n = dims.len();
        if n >= 2 {
            let row = dims[n - 1]
                .checked_mul(elem_size)
                .ok_or(LayoutError::Overflow)?;
            if pitch < row {
                return Err(LayoutError::PitchTooSmall { pitch, row });
            }
            let mut s = pitch;
            for i in (0..n - 1).rev() {
                strides[i] = s;
                s = s.checked_mul(dims[i]).ok_or(LayoutError::Overflow)?;
            }
        }
        Layout::with_byte_strides(dims, &strides[..n], elem_size)
    }

    /// The same layout with its first element at byte `bytes` of the buffer (the offset is
    /// set, not added to). Errors: the span overflows `usize`.
    ///
    /// `bytes` and this are inlined into the caller: a layout is 296 bytes, and a block copy
    /// enqueued one job per block builds two each (out of line, moving the results cost 8% of
    /// the null driver's 0.27 us a held block).
    #[inline]
    pub fn with_offset(mut self, bytes: usize) -> Result<Layout, LayoutError> {
        self.offset = bytes;
        self.span_checked()?;
        Ok(self)
    }

    /// Number of dimensions.
    #[inline]
    pub fn ndim(&self) -> usize {
        self.ndim
    }
    /// Extent of each dimension, outermost first.
    #[inline]
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.ndim]
    }
    /// Byte stride of each dimension, outermost first.
    #[inline]
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.ndim]
    }
    /// Bytes per element.
    #[inline]
    pub fn elem_size(&self) -> usize {
        self.elem_size
    }
    /// Byte offset of the first element from the start of the buffer.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        // Checked at construction (the other dims' product may overflow beside a zero dim).
        if self.is_empty() {
            return 0;
        }
        self.dims().iter().product()
    }
    /// True when the layout holds no element (a dim of extent 0): its span is empty, and a
    /// copy or fill over it completes at once.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.dims().contains(&0)
    }
    /// Bytes of data the layout holds (elements times element size), not counting gaps.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.elem_size
    }

    /// The byte range of the buffer the layout touches: from its first byte to one past its last
    /// (`offset..offset` for an empty layout).
    pub fn span(&self) -> Range<usize> {
        // Checked at construction.
        self.offset..self.offset + self.extent().unwrap_or(0)
    }

    /// Checks that the layout lies inside a buffer of `len` bytes.
    ///
    /// ```
    /// let l = ferry::Layout::contiguous(&[4, 4], 4)?;
    /// assert!(l.check_buffer(64).is_ok());
    /// assert!(l.check_buffer(63).is_err());
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    pub fn check_buffer(&self, len: usize) -> Result<(), LayoutError> {
        let end = self.span_checked()?;
        if end > len {
            return Err(LayoutError::OutOfBounds { end, len });
        }
        Ok(())
    }

    /// True when the elements fill their span with no gap, in row-major order (an empty layout
    /// is).
    pub fn is_contiguous(&self) -> bool {
        if self.is_empty() {
            return true;
        }
        let mut expect = self.elem_size;
        for i in (0..self.ndim).rev() {
            if self.dims[i] != 1 && self.strides[i] != expect {
                return false;
            }
            expect *= self.dims[i];
        }
        true
    }

    /// True when the elements fill their span with no gap and no repeat, in some dim order
    /// (row-major, column-major or any permutation); an empty layout is.
    pub fn is_dense(&self) -> bool {
        if self.is_empty() {
            return true;
        }
        let (order, n) = self.by_stride();
        let mut expect = self.elem_size;
        for &i in &order[..n] {
            if self.strides[i] != expect {
                return false;
            }
            expect *= self.dims[i];
        }
        true
    }

    /// Bytes of the innermost run that is contiguous in row-major order (at least one element;
    /// one element's bytes for an empty layout).
    pub fn contiguous_inner_bytes(&self) -> usize {
        let mut run = self.elem_size;
        if self.is_empty() {
            return run;
        }
        for i in (0..self.ndim).rev() {
            if self.dims[i] == 1 {
                continue;
            }
            if self.strides[i] != run {
                break;
            }
            run *= self.dims[i];
        }
        run
    }

    /// True when no two elements share a byte (sufficient test: after sorting dims by stride,
    /// each stride is at least the extent of the dims inside it). A layout that fails this test
    /// may still be free of overlap; ferry treats it as overlapping. An empty layout has no
    /// overlap.
    pub fn is_non_overlapping(&self) -> bool {
        if self.is_empty() {
            return true;
        }
        let (order, n) = self.by_stride();
        let mut extent = self.elem_size;
        for &i in &order[..n] {
            if self.strides[i] < extent {
                return false;
            }
            extent += self.strides[i] * (self.dims[i] - 1);
        }
        true
    }

    /// Slices one axis to `range` with `step` (numpy's `a[start:end:step]` on that axis).
    ///
    /// Errors: axis out of range, a zero step, an empty range, or a range past the dim (so the
    /// axis of extent 0 of an empty layout has no slice; its other axes do).
    ///
    /// ```
    /// let l = ferry::Layout::contiguous(&[10], 4)?;
    /// let every_third = l.slice(0, 1..10, 3)?; // elements 1, 4, 7
    /// assert_eq!(every_third.dims(), &[3]);
    /// assert_eq!(every_third.strides(), &[12]);
    /// assert_eq!(every_third.offset(), 4);
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    pub fn slice(
        &self,
        axis: usize,
        range: Range<usize>,
        step: usize,
    ) -> Result<Layout, LayoutError> {
        self.check_axis(axis)?;
        if step == 0 {
            return Err(LayoutError::ZeroStep { axis });
        }
        let dim = self.dims[axis];
        if range.start >= range.end || range.end > dim {
            return Err(LayoutError::SliceOutOfRange {
                axis,
                start: range.start,
                end: range.end,
                dim,
            });
        }
        let mut l = *self;
        let skip = range
            .start
            .checked_mul(self.strides[axis])
            .ok_or(LayoutError::Overflow)?;
        l.offset = self.offset.checked_add(skip).ok_or(LayoutError::Overflow)?;
        l.dims[axis] = (range.end - range.start).div_ceil(step);
        // One element left: the step is irrelevant (and may be huge); keep the stride.
        if l.dims[axis] > 1 {
            l.strides[axis] = self.strides[axis]
                .checked_mul(step)
                .ok_or(LayoutError::Overflow)?;
        }
        l.span_checked()?;
        Ok(l)
    }

    /// Fixes one axis at `index` and removes it (numpy's `a[.., index, ..]`). A 1-D layout keeps
    /// one dim of extent 1.
    pub fn index(&self, axis: usize, index: usize) -> Result<Layout, LayoutError> {
        let l = self.slice(axis, index..index.saturating_add(1), 1)?;
        if l.ndim == 1 {
            return Ok(l);
        }
        let mut out = l;
        out.ndim -= 1;
        for i in axis..out.ndim {
            out.dims[i] = l.dims[i + 1];
            out.strides[i] = l.strides[i + 1];
        }
        out.dims[out.ndim] = 1;
        out.strides[out.ndim] = 0;
        Ok(out)
    }

    /// Reorders the dims: dim `i` of the result is dim `order[i]` of `self`.
    ///
    /// ```
    /// let l = ferry::Layout::contiguous(&[2, 3], 4)?;
    /// let t = l.permute(&[1, 0])?;
    /// assert_eq!(t.dims(), &[3, 2]);
    /// assert_eq!(t.strides(), &[4, 12]);
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    pub fn permute(&self, order: &[usize]) -> Result<Layout, LayoutError> {
        if order.len() != self.ndim {
            return Err(LayoutError::BadPermutation {
                ndim: self.ndim,
                order: order.to_vec(),
            });
        }
        let mut seen = [false; MAX_DIMS];
        for &o in order {
            if o >= self.ndim || seen[o] {
                return Err(LayoutError::BadPermutation {
                    ndim: self.ndim,
                    order: order.to_vec(),
                });
            }
            seen[o] = true;
        }
        let mut l = *self;
        for (i, &o) in order.iter().enumerate() {
            l.dims[i] = self.dims[o];
            l.strides[i] = self.strides[o];
        }
        Ok(l)
    }

    /// Swaps two axes.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Layout, LayoutError> {
        self.check_axis(a)?;
        self.check_axis(b)?;
        let mut order: Vec<usize> = (0..self.ndim).collect();
        order.swap(a, b);
        self.permute(&order)
    }

    /// Byte offset (from the buffer start) of the element at `index`.
    pub fn offset_of(&self, index: &[usize]) -> Result<usize, LayoutError> {
        if index.len() != self.ndim {
            return Err(LayoutError::IndexRank {
                ndim: self.ndim,
                index: index.len(),
            });
        }
        let mut off = self.offset;
        for (axis, (&i, (&d, &s))) in index
            .iter()
            .zip(self.dims().iter().zip(self.strides()))
            .enumerate()
        {
            if i >= d {
                return Err(LayoutError::IndexOutOfRange {
                    axis,
                    index: i,
                    dim: d,
                });
            }
            off += i * s;
        }
        Ok(off)
    }

    /// Byte offsets of every element, in row-major index order. The naive reference walk used
    /// by tests; engines never copy this way.
    pub fn element_offsets(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.len();
        let mut idx = [0usize; MAX_DIMS];
        let mut off = self.offset;
        let nd = self.ndim;
        (0..n).map(move |k| {
            if k > 0 {
                let mut axis = nd;
                while axis > 0 {
                    axis -= 1;
                    idx[axis] += 1;
                    // Wrapping: one step past the end may exceed usize for huge strides;
                    // every offset returned is in range and exact.
                    off = off.wrapping_add(self.strides[axis]);
                    if idx[axis] < self.dims[axis] {
                        break;
                    }
                    off = off.wrapping_sub(self.strides[axis].wrapping_mul(self.dims[axis]));
                    idx[axis] = 0;
                }
            }
            off
        })
    }

    /// The axes of extent other than 1, by increasing stride (on the stack: queries allocate
    /// nothing), and how many there are.
    fn by_stride(&self) -> ([usize; MAX_DIMS], usize) {
        let mut order = [0usize; MAX_DIMS];
        let mut n = 0;
        for i in (0..self.ndim).filter(|&i| self.dims[i] != 1) {
            order[n] = i;
            n += 1;
        }
        order[..n].sort_unstable_by_key(|&i| self.strides[i]);
        (order, n)
    }

    fn check_axis(&self, axis: usize) -> Result<(), LayoutError> {
        if axis >= self.ndim {
            return Err(LayoutError::AxisOutOfRange {
                axis,
                ndim: self.ndim,
            });
        }
        Ok(())
    }

    /// Bytes from the first element's first byte to one past the last element's last byte
    /// (0 for an empty layout).
    fn extent(&self) -> Result<usize, LayoutError> {
        if self.is_empty() {
            return Ok(0);
        }
        let mut far = 0usize;
        for i in 0..self.ndim {
            let step = (self.dims[i] - 1)
                .checked_mul(self.strides[i])
                .ok_or(LayoutError::Overflow)?;
            far = far.checked_add(step).ok_or(LayoutError::Overflow)?;
        }
        far.checked_add(self.elem_size).ok_or(LayoutError::Overflow)
    }

    fn span_checked(&self) -> Result<usize, LayoutError> {
        self.offset
            .checked_add(self.extent()?)
            .ok_or(LayoutError::Overflow)
    }

    fn len_checked(&self) -> Result<usize, LayoutError> {
        if self.is_empty() {
            return Ok(0);
        }
        let mut n = 1usize;
        for &d in self.dims() {
            n = n.checked_mul(d).ok_or(LayoutError::Overflow)?;
        }
        n.checked_mul(self.elem_size).ok_or(LayoutError::Overflow)?;
        Ok(n)
    }

    /// Builds a layout from parts already validated by the caller (planner, reshape).
    pub(crate) fn from_parts(
        offset: usize,
        elem_size: usize,
        dims: &[usize],
        strides: &[usize],
    ) -> Result<Layout, LayoutError> {
        Layout::with_byte_strides(dims, strides, elem_size)?.with_offset(offset)
    }
}

/// Dense strides, row-major or column-major.
fn dense_strides(
    dims: &[usize],
    elem_size: usize,
    column_major: bool,
) -> Result<[usize; MAX_DIMS], LayoutError> {
    if dims.len() > MAX_DIMS {
        return Err(LayoutError::TooManyDims {
            ndim: dims.len(),
            max: MAX_DIMS,
        });
    }
    let mut strides = [0usize; MAX_DIMS];
    let mut s = elem_size;
    let n = dims.len();
    for k in 0..n {
        let i = if column_major { k } else { n - 1 - k };
        strides[i] = s;
        s = s.checked_mul(dims[i]).ok_or(LayoutError::Overflow)?;
    }
    Ok(strides)
}

#[cfg(test)]
mod tests;
