//! Reshape without a copy: merge and split dims where the strides allow it.

use super::{Layout, LayoutError, MAX_DIMS};

impl Layout {
    /// The same elements, in the same row-major order, seen with new dims.
    ///
    /// Dims are merged and split in groups (numpy's no-copy reshape): a group of old dims maps
    /// onto a group of new dims with the same element count, and the old group must be
    /// contiguous within itself (each stride = next stride x next dim). Where that fails the
    /// shape cannot be expressed without a copy and [`LayoutError::ReshapeNeedsCopy`] is
    /// returned. An empty layout reshapes to any dims with no element (dense strides, same
    /// offset).
    ///
    /// ```
    /// let l = ferry::Layout::contiguous(&[4, 6], 4)?;
    /// assert_eq!(l.reshape(&[2, 2, 3, 2])?.strides(), &[48, 24, 8, 4]);
    /// // A transposed matrix cannot be flattened without a copy.
    /// assert!(l.transpose(0, 1)?.reshape(&[24]).is_err());
    /// # Ok::<(), ferry::LayoutError>(())
    /// ```
    pub fn reshape(&self, new_dims: &[usize]) -> Result<Layout, LayoutError> {
        if new_dims.is_empty() {
            return Err(LayoutError::NoDims);
        }
        if new_dims.len() > MAX_DIMS {
            return Err(LayoutError::TooManyDims {
                ndim: new_dims.len(),
                max: MAX_DIMS,
            });
        }
        let mut to = 1usize;
        if !new_dims.contains(&0) {
            for &d in new_dims {
                to = to.checked_mul(d).ok_or(LayoutError::Overflow)?;
            }
        } else {
            to = 0;
        }
        let from = self.len();
        if to != from {
            return Err(LayoutError::ReshapeCount { from, to });
        }
        if from == 0 {
            // No element: no stride to keep; the new dims laid out densely at the same offset.
            return Layout::contiguous(new_dims, self.elem_size)?.with_offset(self.offset);
        }
        let needs_copy = || LayoutError::ReshapeNeedsCopy {
            from: self.dims().to_vec(),
            strides: self.strides().to_vec(),
            to: new_dims.to_vec(),
        };
        // Old dims without the size-1 ones (they carry no stride information).
        let (od, os): (Vec<usize>, Vec<usize>) = self
            .dims()
            .iter()
            .zip(self.strides())
            .filter(|(&d, _)| d != 1)
            .map(|(&d, &s)| (d, s))
            .unzip();
        let mut new_strides = [0usize; MAX_DIMS];
        let (mut oi, mut ni) = (0usize, 0usize);
        let (on, nn) = (od.len(), new_dims.len());
        while oi < on && ni < nn {
            // Grow the two groups until their element counts match.
            let (mut oj, mut nj) = (oi + 1, ni + 1);
            let (mut op, mut np) = (od[oi], new_dims[ni]);
            while op != np {
                if np < op {
                    np *= new_dims[nj];
                    nj += 1;
                } else {
                    op *= od[oj];
                    oj += 1;
                }
            }
            // The old group must be contiguous within itself.
            for k in oi..oj - 1 {
                if os[k + 1].checked_mul(od[k + 1]) != Some(os[k]) {
                    return Err(needs_copy());
                }
            }
            // Lay the new group over the old group's innermost stride.
            new_strides[nj - 1] = os[oj - 1];
            for k in (ni + 1..nj).rev() {
                // Overflows only when every dim outside `k` in the group has extent 1 (else the
                // layout's own extent would overflow); any stride serves such a dim.
                new_strides[k - 1] = new_strides[k]
                    .checked_mul(new_dims[k])
                    .unwrap_or(new_strides[k]);
            }
            oi = oj;
            ni = nj;
        }
        // Trailing new dims of extent 1 get a stride; any value keeps the element set.
        let last = if ni > 0 {
            new_strides[ni - 1]
        } else {
            self.elem_size
        };
        for s in new_strides.iter_mut().take(nn).skip(ni) {
            *s = last;
        }
        Layout::from_parts(self.offset, self.elem_size, new_dims, &new_strides[..nn])
    }
}
