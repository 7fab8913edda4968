//! What a load gives: the [`Checkpoint`] (its memory, [`TensorBuffer`]s, and each
//! [`Tensor`]'s place in it) and its [`LoadReport`]. The views of one tensor's memory are in
//! `view.rs`.

use crate::cuda::{DeviceBuffer, PinnedBuffer};
use crate::file::IoReport;
use crate::memory::{AlignedBuffer, MemKind, Memory, MemoryMut, RawBuf};
use safetensors::Dtype;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::PathBuf;

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
    /// `len` bytes of memory of `kind`: [`MemKind::Device`], [`MemKind::Pinned`] or
    /// [`MemKind::Pageable`]. Errors: the allocator's or driver's message, or why `kind` is
    /// not one of those three.
    pub fn new(kind: MemKind, len: usize) -> Result<TensorBuffer, String> {
        Ok(match kind {
            MemKind::Device { ordinal } => {
                TensorBuffer::Device(DeviceBuffer::new(ordinal, len).map_err(|e| e.to_string())?)
            }
            MemKind::Pinned => {
                TensorBuffer::Pinned(PinnedBuffer::new(len).map_err(|e| e.to_string())?)
            }
            MemKind::Pageable => {
                TensorBuffer::Pageable(AlignedBuffer::new(len).map_err(|e| e.to_string())?)
            }
            MemKind::Mapped | MemKind::Managed => {
                return Err(format!(
                    "{kind} memory is not a place for loaded tensors (device, pinned or pageable)"
                ))
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
    /// Where it lives. Its memory: [`Checkpoint::view`] (or [`Checkpoint::host`],
    /// [`Checkpoint::device`]).
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
    /// Pinned host memory the load used, in bytes: the file engine's bounce ring where the
    /// bytes went through it pinned (a device load: its
    /// [`FileConfig::ring_depth`](crate::file::FileConfig::ring_depth) buffers of
    /// [`FileConfig::chunk_bytes`](crate::file::FileConfig::chunk_bytes), the bound on the
    /// staging memory whatever the checkpoint's size; made on the engine's first transfer
    /// through it and kept), plus the tensors' own memory for
    /// [`Target::Pinned`](super::Target::Pinned).
    pub pinned_bytes: u64,
    /// The process's peak resident memory so far (`VmHWM` of `/proc/self/status`), in bytes,
    /// read after the load: the whole process's high-water mark, not this load's alone.
    /// `None` where it cannot be read.
    pub peak_rss_bytes: Option<u64>,
}

impl LoadReport {
    /// The process's peak resident memory so far (`VmHWM` of `/proc/self/status`), in bytes:
    /// what [`LoadReport::peak_rss_bytes`] holds, read now. `None` where it cannot be read.
    pub fn process_peak_rss() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: u64 = line
            .trim_start_matches("VmHWM:")
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kb.checked_mul(1024)
    }
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
            "{} tensors, {} bytes from {} file(s) in {} read(s), {:.4} s ({:.2} GB/s) + {:.4} s setup; {} pinned bytes, process peak RSS {}; {}",
            self.tensors,
            self.bytes,
            self.files,
            self.reads,
            self.seconds,
            self.gb_per_s(),
            self.setup_seconds,
            self.pinned_bytes,
            self.peak_rss_bytes
                .map_or_else(|| "unknown".to_string(), |b| format!("{b} bytes")),
            self.io
        )
    }
}

/// Tensors loaded into memory ([`load`](fn@super::load)): the buffers, and each tensor's place in
/// them. Each tensor's memory, by name, as a borrow that knows where it lives:
/// [`Checkpoint::view`], [`Checkpoint::host`] (bytes and typed slices), [`Checkpoint::device`]
/// (a device pointer for other libraries).
#[derive(Debug)]
pub struct Checkpoint {
    pub(super) tensors: Vec<Tensor>,
    pub(super) by_name: HashMap<String, usize>,
    pub(super) buffers: Vec<TensorBuffer>,
    pub(super) metadata: BTreeMap<String, String>,
    pub(super) report: LoadReport,
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
    /// The buffers and the tensors, taking the memory over.
    pub fn into_parts(self) -> (Vec<TensorBuffer>, Vec<Tensor>) {
        (self.buffers, self.tensors)
    }
}
