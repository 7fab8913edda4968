use thiserror::Error;

/// Why a layout could not be built, sliced, reshaped or placed in a buffer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// A layout needs at least one dimension.
    #[error("a layout needs at least one dimension")]
    NoDims,
    /// More dimensions than [`MAX_DIMS`](super::MAX_DIMS).
    #[error("{ndim} dimensions, at most {max} are supported")]
    TooManyDims {
        /// Dimensions asked for.
        ndim: usize,
        /// The limit.
        max: usize,
    },
    /// Element size of zero bytes.
    #[error("element size must be at least one byte")]
    ZeroElemSize,
    /// A dimension of extent zero where the interface needs elements (the C API's and AML's
    /// layouts; ferry's own [`Layout`](super::Layout)s may be empty).
    #[error("dimension {axis} has extent 0; this interface's layouts hold at least one element")]
    ZeroDim {
        /// Which dimension.
        axis: usize,
    },
    /// `dims` and `strides` have different lengths.
    #[error("{dims} dims but {strides} strides")]
    StridesLength {
        /// Number of dims.
        dims: usize,
        /// Number of strides.
        strides: usize,
    },
    /// A size or offset overflows `usize`.
    #[error("layout size overflows usize")]
    Overflow,
    /// Row pitch smaller than the row.
    #[error("pitch of {pitch} bytes is smaller than a row of {row} bytes")]
    PitchTooSmall {
        /// The pitch asked for.
        pitch: usize,
        /// Bytes in one row.
        row: usize,
    },
    /// The layout reaches past the end of its buffer.
    #[error("layout reaches byte {end} but the buffer holds {len} bytes")]
    OutOfBounds {
        /// One past the last byte the layout touches.
        end: usize,
        /// The buffer's length.
        len: usize,
    },
    /// An axis number past the layout's rank.
    #[error("axis {axis} out of range for a {ndim}-D layout")]
    AxisOutOfRange {
        /// The axis asked for.
        axis: usize,
        /// The layout's rank.
        ndim: usize,
    },
    /// A slice with step 0.
    #[error("slice step on axis {axis} must be at least 1")]
    ZeroStep {
        /// The axis sliced.
        axis: usize,
    },
    /// A slice range that is empty or past the dimension.
    #[error("slice {start}..{end} on axis {axis} is empty or outside 0..{dim}")]
    SliceOutOfRange {
        /// The axis sliced.
        axis: usize,
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// Extent of the axis.
        dim: usize,
    },
    /// An index with the wrong number of coordinates.
    #[error("index has {index} coordinates for a {ndim}-D layout")]
    IndexRank {
        /// The layout's rank.
        ndim: usize,
        /// Coordinates given.
        index: usize,
    },
    /// A coordinate past its dimension.
    #[error("index {index} out of range 0..{dim} on axis {axis}")]
    IndexOutOfRange {
        /// The axis.
        axis: usize,
        /// The coordinate.
        index: usize,
        /// Extent of the axis.
        dim: usize,
    },
    /// `order` is not a permutation of `0..ndim`.
    #[error("{order:?} is not a permutation of the {ndim} axes")]
    BadPermutation {
        /// The layout's rank.
        ndim: usize,
        /// The order given.
        order: Vec<usize>,
    },
    /// The new shape holds a different number of elements.
    #[error("cannot reshape {from} elements into {to} elements")]
    ReshapeCount {
        /// Elements in the layout.
        from: usize,
        /// Elements in the shape asked for.
        to: usize,
    },
    /// The new shape would need a copy: its dims cannot be expressed with strides over the
    /// existing elements.
    #[error("cannot reshape dims {from:?} (strides {strides:?}) into {to:?} without a copy")]
    ReshapeNeedsCopy {
        /// Current dims.
        from: Vec<usize>,
        /// Current strides.
        strides: Vec<usize>,
        /// Dims asked for.
        to: Vec<usize>,
    },
    /// A typed buffer holds whole elements of its type, where they are aligned: the layout's
    /// element size, offset and strides must be multiples of the buffer's element size.
    #[error(
        "the layout's {what} of {value} bytes is not a multiple of the buffer's {elem}-byte \
         elements (give strides in elements with Layout::with_strides, or use Layout::of)"
    )]
    NotWholeElements {
        /// `element size`, `offset` or `stride`.
        what: &'static str,
        /// The layout's value, in bytes.
        value: usize,
        /// The buffer's element size.
        elem: usize,
    },
    /// A layout made for one element type over a buffer of another
    /// ([`Layout::check_elem_type`](crate::Layout::check_elem_type)).
    #[error(
        "the layout is of {layout} elements but the buffer holds {buffer} (build the layout \
         with Layout::of::<{buffer}>, or from an element size in bytes to copy raw bytes)"
    )]
    ElemType {
        /// The type the layout was made for.
        layout: &'static str,
        /// The buffer's element type.
        buffer: &'static str,
    },
}
