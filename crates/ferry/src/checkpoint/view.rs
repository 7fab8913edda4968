//! One loaded tensor's memory, borrowed from its [`Checkpoint`] and typed by where it lives:
//! [`HostView`] (bytes, typed slices) or [`DeviceView`] (a device pointer), both [`Memory`]
//! for engines and saves; [`TensorView`] is either.

use super::error::CheckpointError;
use super::loaded::{Checkpoint, Tensor, TensorBuffer};
use crate::memory::{MemKind, Memory, RawBuf, Region};
use safetensors::Dtype;

/// A Rust element type a tensor's bytes can be read as ([`HostView::as_slice`]): its
/// safetensors dtype. Implemented for the integer and float primitives and `half`'s `f16` and
/// `bf16`; a `#[repr(transparent)]` wrapper of one may implement it too.
pub trait Element: bytemuck::Pod {
    /// The dtype whose elements this type holds.
    const DTYPE: Dtype;
}

macro_rules! elements {
    ($($t:ty => $d:ident),* $(,)?) => { $(
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    )* };
}
elements!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64,
    f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16,
);

/// A loaded tensor in host memory (pinned or pageable), borrowed from its [`Checkpoint`]:
/// its bytes, or its elements as a typed slice.
///
/// ```
/// use ferry::checkpoint::{self, Dtype, LoadOptions, SaveOptions, SaveTensor, Target};
/// use ferry::file::{FileConfig, FileEngine};
/// let path = std::env::temp_dir().join(format!("ferry-doc-host-{}.safetensors", std::process::id()));
/// let engine = FileEngine::new(FileConfig::new().threads(2))?;
/// checkpoint::save(&engine, &path, &[SaveTensor::new("w", Dtype::F32, &[2], &[1f32, 2.0])], &SaveOptions::new())?;
/// let ckpt = checkpoint::load(&engine, &path, &LoadOptions::new(Target::Pageable))?;
/// let w = ckpt.host("w").expect("loaded to host memory");
/// assert_eq!((w.dtype(), w.shape(), w.len()), (Dtype::F32, &[2][..], 8));
/// assert_eq!(w.as_slice::<f32>()?, &[1.0, 2.0]);
/// assert!(w.as_slice::<u32>().is_err()); // another dtype
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct HostView<'a> {
    tensor: &'a Tensor,
    bytes: &'a [u8],
}

impl<'a> HostView<'a> {
    /// The tensor's entry (name, dtype, shape, file and byte range).
    pub fn tensor(&self) -> &'a Tensor {
        self.tensor
    }
    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.tensor.dtype
    }
    /// Dimensions (empty for a 0-d tensor).
    pub fn shape(&self) -> &'a [usize] {
        &self.tensor.shape
    }
    /// Bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    /// True for a tensor of no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// [`MemKind::Pinned`] or [`MemKind::Pageable`].
    pub fn kind(&self) -> MemKind {
        self.tensor.kind
    }
    /// The tensor's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    /// The tensor's elements as `T`. Errors: [`CheckpointError::View`] when its dtype is not
    /// `T`'s ([`Element::DTYPE`]), or its bytes are not aligned for `T` (a tensor at an offset
    /// in the file that is not a multiple of its element size: read [`HostView::bytes`]).
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T], CheckpointError> {
        let refuse = |msg: String| CheckpointError::View {
            path: self.tensor.file.clone(),
            tensor: self.tensor.name.clone(),
            msg,
        };
        if T::DTYPE != self.tensor.dtype {
            return Err(refuse(format!(
                "its dtype is {}, not {} ({})",
                self.tensor.dtype,
                T::DTYPE,
                std::any::type_name::<T>()
            )));
        }
        bytemuck::try_cast_slice(self.bytes).map_err(|e| {
            refuse(format!(
                "its bytes cannot be read as {}: {e}",
                std::any::type_name::<T>()
            ))
        })
    }
}

// SAFETY: host memory of the tensor's own kind (pinned or pageable), borrowed from the
// checkpoint for `'a`: valid for reads of `len` bytes, at a CPU address, while the view lives.
unsafe impl Memory for HostView<'_> {
    fn raw(&self) -> RawBuf {
        RawBuf::host(self.bytes.as_ptr(), self.bytes.len(), self.tensor.kind)
    }
}

/// A loaded tensor in a GPU's memory, borrowed from its [`Checkpoint`]: [`Memory`] for
/// engines and saves, and its device address for other libraries
/// ([`DeviceView::device_ptr`]), valid while the view (the checkpoint) lives.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    tensor: &'a Tensor,
    region: Region<'a>,
    ordinal: u32,
}

impl<'a> DeviceView<'a> {
    /// The tensor's entry (name, dtype, shape, file and byte range).
    pub fn tensor(&self) -> &'a Tensor {
        self.tensor
    }
    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.tensor.dtype
    }
    /// Dimensions (empty for a 0-d tensor).
    pub fn shape(&self) -> &'a [usize] {
        &self.tensor.shape
    }
    /// Bytes.
    pub fn len(&self) -> usize {
        self.region.raw().len
    }
    /// True for a tensor of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The GPU it lives on.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
    /// The device address of its first byte (a `CUdeviceptr`, for kernels and other
    /// libraries). It stays valid while the checkpoint does; the memory is the checkpoint's:
    /// writing through it while an engine reads the tensor is the caller's race.
    pub fn device_ptr(&self) -> u64 {
        self.region.raw().addr
    }
}

// SAFETY: a sub-range of the checkpoint's device buffer (the region's own guarantee), borrowed
// for `'a`.
unsafe impl Memory for DeviceView<'_> {
    fn raw(&self) -> RawBuf {
        self.region.raw()
    }
}

/// A loaded tensor's memory, by where it lives ([`Checkpoint::view`]); [`Memory`] either way.
#[derive(Debug, Clone, Copy)]
pub enum TensorView<'a> {
    /// In host memory (pinned or pageable).
    Host(HostView<'a>),
    /// On a GPU.
    Device(DeviceView<'a>),
}

impl<'a> TensorView<'a> {
    /// The tensor's entry (name, dtype, shape, file and byte range).
    pub fn tensor(&self) -> &'a Tensor {
        match self {
            TensorView::Host(v) => v.tensor(),
            TensorView::Device(v) => v.tensor(),
        }
    }
}

// SAFETY: forwards to the view, valid as it is.
unsafe impl Memory for TensorView<'_> {
    fn raw(&self) -> RawBuf {
        match self {
            TensorView::Host(v) => v.raw(),
            TensorView::Device(v) => v.raw(),
        }
    }
}

impl Checkpoint {
    /// The memory of tensor `name`, typed by where it lives (`None` if no tensor has that
    /// name).
    pub fn view(&self, name: &str) -> Option<TensorView<'_>> {
        let t = self.get(name)?;
        let range = t.offset..t.offset + t.len;
        Some(match &self.buffers()[t.buffer] {
            TensorBuffer::Device(d) => TensorView::Device(DeviceView {
                tensor: t,
                region: Region::of(d, range)?,
                ordinal: d.ordinal(),
            }),
            host => TensorView::Host(HostView {
                tensor: t,
                bytes: host.host_bytes()?.get(range)?,
            }),
        })
    }
    /// Tensor `name` in host memory: `None` if absent, or loaded to a GPU.
    pub fn host(&self, name: &str) -> Option<HostView<'_>> {
        match self.view(name)? {
            TensorView::Host(v) => Some(v),
            TensorView::Device(_) => None,
        }
    }
    /// Tensor `name` in device memory: `None` if absent, or loaded to host memory.
    pub fn device(&self, name: &str) -> Option<DeviceView<'_>> {
        match self.view(name)? {
            TensorView::Device(v) => Some(v),
            TensorView::Host(_) => None,
        }
    }
}
