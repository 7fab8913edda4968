//! Checkpoints: safetensors files (and sharded checkpoints through their
//! `*.safetensors.index.json`) loaded into GPU, pinned or pageable memory through the
//! [`FileEngine`](crate::file::FileEngine), and saved back.
//!
//! - [`load`](fn@load) reads the header (checked tensor by tensor, then by the `safetensors` crate,
//!   the format's reference implementation), picks the tensors asked for
//!   ([`LoadOptions::names`], [`LoadOptions::filter`]), allocates memory for them
//!   ([`Target`]: a GPU, pinned or pageable host memory; [`Placement`]: one allocation for
//!   all, or one per tensor) and moves the bytes with the file engine's parallel reads: in a
//!   packed allocation, tensors next to each other in the file are read as one piece, so a
//!   whole checkpoint is one large read per file. Device loads take the file engine's
//!   file -> device path (its pinned bounce ring and the CUDA engine given to
//!   [`FileEngine::with_engine`](crate::file::FileEngine::with_engine)).
//! - [`load_into`] reads tensors into memory the caller already has ([`Dest`]: one
//!   destination per tensor, byte count, dtype and shape checked before anything is read),
//!   allocating nothing: reloading into a model's parameters, or into the buffers of an
//!   earlier [`Placement::PerTensor`] load.
//! - [`Checkpoint`] holds the memory and, per tensor, its name, dtype, shape, byte range in
//!   the file, and where it lies ([`Tensor::addr`]: a device address for a GPU).
//! - [`save`](fn@save) writes tensors from any memory the engine reaches (device buffers included) to
//!   a safetensors file, laid out as the reference writer does, through the file engine; the
//!   file appears under its name only once complete ([`SaveOptions::fsync`] for durability).
//! - Errors: [`CheckpointError`], one variant per fault, naming the file and the tensor;
//!   nothing is reported as loaded when one is returned.
//!
//! ```
//! use ferry::checkpoint::{self, Dtype, LoadOptions, SaveOptions, SaveTensor, Target};
//! use ferry::file::{FileConfig, FileEngine};
//! let path = std::env::temp_dir().join(format!("ferry-doc-ckpt-{}.safetensors", std::process::id()));
//! let engine = FileEngine::new(FileConfig::new().threads(2))?;
//!
//! // Save two tensors from host memory...
//! let w: Vec<f32> = (0..6).map(|i| i as f32).collect();
//! let b = vec![1u16; 3];
//! let tensors = [
//!     SaveTensor::new("w", Dtype::F32, &[2, 3], &w),
//!     SaveTensor::new("b", Dtype::BF16, &[3], &b),
//! ];
//! checkpoint::save(&engine, &path, &tensors, &SaveOptions::new())?;
//!
//! // ...and load one of them back into pageable memory (`Target::Device(0)` for a GPU,
//! // with a file engine made by `FileEngine::with_engine`).
//! let ckpt = checkpoint::load(&engine, &path, &LoadOptions::new(Target::Pageable).names(["w"]))?;
//! let t = ckpt.get("w").expect("loaded");
//! assert_eq!((t.dtype, &t.shape[..]), (Dtype::F32, &[2, 3][..]));
//! assert_eq!(ckpt.host_bytes("w"), Some(bytemuck::cast_slice::<f32, u8>(&w)));
//! assert!(ckpt.get("b").is_none());
//! println!("{}", ckpt.report());
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod header;
mod into;
mod load;
mod save;

pub use error::CheckpointError;
pub use header::{read_header, tensor_bytes, Header, TensorEntry};
pub use into::{load_files_into, load_into, Dest};
pub use load::{entries, load, load_files, load_index, MAX_INDEX_BYTES};
pub use safetensors::Dtype;
pub use save::{save, SaveOptions, SaveReport, SaveTensor};

use crate::cuda::{DeviceBuffer, PinnedBuffer};
use crate::file::IoReport;
use crate::memory::{AlignedBuffer, MemKind, Memory, MemoryMut, RawBuf};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

/// Where loaded tensors go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Memory of the GPU with this ordinal (the file engine needs a CUDA engine:
    /// [`FileEngine::with_engine`](crate::file::FileEngine::with_engine)).
    Device(u32),
    /// Pinned host memory ([`PinnedBuffer`]; needs a CUDA driver).
    Pinned,
    /// Pageable host memory ([`AlignedBuffer`], page-aligned).
    Pageable,
}

impl std::fmt::Display for Target {
    /// `cuda:0`, `pinned`, `pageable`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Device(o) => write!(f, "cuda:{o}"),
            Target::Pinned => f.write_str("pinned"),
            Target::Pageable => f.write_str("pageable"),
        }
    }
}

/// How the loaded tensors are laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Placement {
    /// One allocation for all tensors (the default). Tensors next to each other in the file
    /// stay next to each other and are read as one piece; each tensor's offset in the
    /// allocation equals its offset in the file's data section modulo [`LoadOptions::align`]
    /// (the allocation itself is at least 256-byte aligned), so a tensor aligned in the file
    /// (the reference writer aligns each to its dtype) is aligned in memory.
    #[default]
    Packed,
    /// One allocation per tensor, each read on its own (all in flight at once).
    PerTensor,
}

/// A predicate choosing tensors by their header entry.
pub type Filter = Arc<dyn Fn(&TensorEntry) -> bool + Send + Sync>;

/// Called during a load with (bytes loaded so far, bytes in all).
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// Which tensors a load takes.
#[derive(Clone, Default)]
pub enum Select {
    /// Every tensor (the default).
    #[default]
    All,
    /// These names; one that is not in the checkpoint is [`CheckpointError::Missing`].
    Names(Vec<String>),
    /// Those the predicate accepts.
    Filter(Filter),
}

impl std::fmt::Debug for Select {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Select::All => f.write_str("All"),
            Select::Names(n) => f.debug_tuple("Names").field(n).finish(),
            Select::Filter(_) => f.write_str("Filter(..)"),
        }
    }
}

/// How to load a checkpoint: [`LoadOptions::new`] then chained setters. Its `Debug` form
/// shows the predicate and progress callback as set or not.
///
/// ```
/// use ferry::checkpoint::{LoadOptions, Placement, Target};
/// let o = LoadOptions::new(Target::Device(0))
///     .placement(Placement::PerTensor)
///     .filter(|t| t.name.starts_with("model.layers.0."));
/// assert_eq!(o.target, Target::Device(0));
/// ```
#[derive(Clone)]
pub struct LoadOptions {
    /// Where the tensors go.
    pub target: Target,
    /// One allocation or one per tensor.
    pub placement: Placement,
    /// Which tensors.
    pub select: Select,
    /// In a packed allocation, tensor offsets keep their data-section offsets modulo this (a
    /// power of two; default 256, the CUDA allocator's alignment; 0 counts as 1). Any other
    /// value is refused by the load, [`CheckpointError::Align`], before any tensor is read: set it
    /// with [`LoadOptions::align`], which rounds.
    pub align: usize,
    /// Called as the bytes arrive (for a progress bar). With it, a packed load is read in
    /// about 32 batches, each waited for before the next, instead of all at once.
    pub progress: Option<Progress>,
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("target", &self.target)
            .field("placement", &self.placement)
            .field("select", &self.select)
            .field("align", &self.align)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// The largest [`LoadOptions::align`]: the largest power of two a `usize` holds (2^63 on a
/// 64-bit target).
pub const MAX_ALIGN: usize = 1 << (usize::BITS - 1);

impl LoadOptions {
    /// Every tensor into `target`, packed in one allocation.
    pub fn new(target: Target) -> LoadOptions {
        LoadOptions {
            target,
            placement: Placement::Packed,
            select: Select::All,
            align: 256,
            progress: None,
        }
    }
    /// Calls `f(loaded, total)` as the bytes arrive.
    pub fn progress(mut self, f: impl Fn(u64, u64) + Send + Sync + 'static) -> LoadOptions {
        self.progress = Some(Arc::new(f));
        self
    }
    /// Sets the placement.
    pub fn placement(mut self, p: Placement) -> LoadOptions {
        self.placement = p;
        self
    }
    /// Only these tensors.
    pub fn names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> LoadOptions {
        self.select = Select::Names(names.into_iter().map(Into::into).collect());
        self
    }
    /// Only the tensors `f` accepts.
    pub fn filter(
        mut self,
        f: impl Fn(&TensorEntry) -> bool + Send + Sync + 'static,
    ) -> LoadOptions {
        self.select = Select::Filter(Arc::new(f));
        self
    }
    /// Sets the alignment of runs in a packed allocation: `bytes` rounded up to a power of two
    /// (0 to 1), and at most [`MAX_ALIGN`], the largest power of two a `usize` holds (what
    /// anything above it gives: rounding up would overflow).
    ///
    /// ```
    /// use ferry::checkpoint::{LoadOptions, Target, MAX_ALIGN};
    /// assert_eq!(LoadOptions::new(Target::Pageable).align(100).align, 128);
    /// assert_eq!(LoadOptions::new(Target::Pageable).align(usize::MAX).align, MAX_ALIGN);
    /// ```
    pub fn align(mut self, bytes: usize) -> LoadOptions {
        self.align = bytes
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(MAX_ALIGN);
        self
    }

    /// The alignment a load uses: [`LoadOptions::align`] (the field), 0 taken as 1. Errors:
    /// [`CheckpointError::Align`] when it is not a power of two (the placement arithmetic
    /// relies on it; `usize::MAX` once overflowed it).
    pub(crate) fn checked_align(&self, path: &std::path::Path) -> Result<usize, CheckpointError> {
        let a = self.align.max(1);
        if a.is_power_of_two() {
            Ok(a)
        } else {
            Err(CheckpointError::Align {
                path: path.to_path_buf(),
                align: self.align,
            })
        }
    }
}

/// Memory holding loaded tensors.
#[derive(Debug)]
pub enum TensorBuffer {
    /// On a GPU.
    Device(DeviceBuffer),
    /// Pinned host memory.
    Pinned(PinnedBuffer),
    /// Pageable host memory.
    Pageable(AlignedBuffer),
}

impl TensorBuffer {
    /// `len` bytes of `target` memory; the allocator's or driver's message when it fails.
    pub fn new(target: Target, len: usize) -> Result<TensorBuffer, String> {
        Ok(match target {
            Target::Device(o) => {
                TensorBuffer::Device(DeviceBuffer::new(o, len).map_err(|e| e.to_string())?)
            }
            Target::Pinned => {
                TensorBuffer::Pinned(PinnedBuffer::new(len).map_err(|e| e.to_string())?)
            }
            Target::Pageable => {
                TensorBuffer::Pageable(AlignedBuffer::new(len).map_err(|e| e.to_string())?)
            }
        })
    }
    /// The bytes, for host memory; `None` on a GPU.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match self {
            TensorBuffer::Device(_) => None,
            TensorBuffer::Pinned(p) => Some(p),
            TensorBuffer::Pageable(p) => Some(p),
        }
    }
}

// SAFETY: forwards to the owned buffer, which is live as long as `self`.
unsafe impl Memory for TensorBuffer {
    fn raw(&self) -> RawBuf {
        match self {
            TensorBuffer::Device(b) => b.raw(),
            TensorBuffer::Pinned(b) => b.raw(),
            TensorBuffer::Pageable(b) => b.raw(),
        }
    }
}
// SAFETY: as above; `&mut self` is exclusive.
unsafe impl MemoryMut for TensorBuffer {
    fn raw_mut(&mut self) -> RawBuf {
        match self {
            TensorBuffer::Device(b) => b.raw_mut(),
            TensorBuffer::Pinned(b) => b.raw_mut(),
            TensorBuffer::Pageable(b) => b.raw_mut(),
        }
    }
}

/// One loaded tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions (empty for a 0-d tensor).
    pub shape: Vec<usize>,
    /// The file it came from (a shard, for a sharded checkpoint).
    pub file: PathBuf,
    /// Its byte range in that file.
    pub file_range: Range<u64>,
    /// Index of its buffer in [`Checkpoint::buffers`].
    pub buffer: usize,
    /// Byte offset in that buffer.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
    /// Address of its first byte (a device address for [`Target::Device`]).
    pub addr: u64,
    /// Where it lives.
    pub kind: MemKind,
}

/// What a load did.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadReport {
    /// Bytes of tensor data loaded.
    pub bytes: u64,
    /// Tensors loaded.
    pub tensors: usize,
    /// Files read.
    pub files: usize,
    /// Reads issued to the file engine (each split over its workers): one per run of
    /// adjacent tensors when packed, one per tensor otherwise.
    pub reads: usize,
    /// Allocations made.
    pub allocations: usize,
    /// Seconds spent moving the data (after the headers were read and memory allocated).
    pub seconds: f64,
    /// Seconds reading headers and allocating.
    pub setup_seconds: f64,
    /// The file engine's report over all reads (path taken, `O_DIRECT` and GDS notes).
    pub io: IoReport,
}

impl LoadReport {
    /// Data rate of the move, in GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tensors, {} bytes from {} file(s) in {} read(s), {:.4} s ({:.2} GB/s) + {:.4} s setup; {}",
            self.tensors,
            self.bytes,
            self.files,
            self.reads,
            self.seconds,
            self.gb_per_s(),
            self.setup_seconds,
            self.io
        )
    }
}

/// Tensors loaded into memory ([`load`](fn@load)): the buffers, and each tensor's place in them.
#[derive(Debug)]
pub struct Checkpoint {
    tensors: Vec<Tensor>,
    by_name: HashMap<String, usize>,
    buffers: Vec<TensorBuffer>,
    metadata: BTreeMap<String, String>,
    report: LoadReport,
}

impl Checkpoint {
    /// The tensors, in file order (shard by shard).
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
    /// The memory holding the tensors.
    pub fn buffers(&self) -> &[TensorBuffer] {
        &self.buffers
    }
    /// The `__metadata__` map (of the first shard, for a sharded checkpoint, merged with the
    /// index's `metadata` strings).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    /// What the load did.
    pub fn report(&self) -> &LoadReport {
        &self.report
    }
    /// The bytes of tensor `name` in host memory (`None` if absent, or on a GPU: read those
    /// with [`Checkpoint::region`] and an engine, or [`DeviceBuffer::to_vec`]).
    pub fn host_bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.get(name)?;
        Some(&self.buffers[t.buffer].host_bytes()?[t.offset..t.offset + t.len])
    }
    /// The memory of tensor `name`, wherever it lives, as [`Memory`] for engines and
    /// [`save`](fn@save).
    pub fn region(&self, name: &str) -> Option<crate::memory::Region<'_>> {
        let t = self.get(name)?;
        crate::memory::Region::of(&self.buffers[t.buffer], t.offset..t.offset + t.len)
    }
    /// The buffers and the tensors, taking the memory over.
    pub fn into_parts(self) -> (Vec<TensorBuffer>, Vec<Tensor>) {
        (self.buffers, self.tensors)
    }
}
