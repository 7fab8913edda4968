//! How to load a checkpoint: [`LoadOptions`] (where the tensors go, [`Target`]; how they are
//! laid out, [`Placement`]; which of them, [`Select`]; alignment and progress); and what and
//! how to save: [`SaveTensor`], [`SaveOptions`] (fsync, metadata, interrupt, shard size,
//! snapshot memory, buffered or `O_DIRECT` writes).

use super::error::CheckpointError;
use super::header::TensorEntry;
use crate::memory::Memory;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where loaded tensors go.
///
/// The GPU is named once, by the file engine: [`Target::Device`] is the memory of the GPU whose
/// [`CudaEngine`](crate::cuda::CudaEngine) was given to
/// [`FileEngine::with_engine`](crate::file::FileEngine::with_engine), so the engine that moves
/// the bytes and the memory they land in cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Memory of the file engine's GPU: the ordinal of the engine given to
    /// [`FileEngine::with_engine`](crate::file::FileEngine::with_engine). A file engine
    /// without one (made by [`FileEngine::new`](crate::file::FileEngine::new)), or with an
    /// engine that is not one GPU's (a CPU or multiplex engine), is
    /// [`CheckpointError::NoDevice`], before anything is allocated.
    Device,
    /// Pinned host memory ([`PinnedBuffer`](crate::cuda::PinnedBuffer); needs a CUDA driver).
    Pinned,
    /// Pageable host memory ([`AlignedBuffer`](crate::memory::AlignedBuffer), page-aligned).
    Pageable,
}

impl std::fmt::Display for Target {
    /// `device`, `pinned`, `pageable` (a load's errors name the GPU: `cuda:0`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Device => f.write_str("device"),
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
/// let o = LoadOptions::new(Target::Device)
///     .placement(Placement::PerTensor)
///     .filter(|t| t.name.starts_with("model.layers.0."));
/// assert_eq!(o.target, Target::Device);
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

/// One tensor to save: its name, dtype, shape and bytes (host or device memory).
#[derive(Clone, Copy)]
pub struct SaveTensor<'a> {
    /// Its name.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: &'a [usize],
    /// Its bytes: exactly shape x dtype of them.
    pub data: &'a dyn Memory,
}

impl<'a> SaveTensor<'a> {
    /// A tensor to save.
    pub fn new(name: &'a str, dtype: Dtype, shape: &'a [usize], data: &'a dyn Memory) -> Self {
        SaveTensor {
            name,
            dtype,
            shape,
            data,
        }
    }
}

impl std::fmt::Debug for SaveTensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveTensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("data", &self.data.raw())
            .finish()
    }
}

/// How a save's bytes go into its files ([`SaveOptions::writer`]); the one used and why:
/// [`SaveReport::writer`](super::SaveReport::writer),
/// [`SaveReport::writer_note`](super::SaveReport::writer_note).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Writer {
    /// Chosen per save (the default): `Buffered` under 64 MiB; else `Direct` when fsynced,
    /// when most of the bytes are in host memory, or without room in the page cache; else
    /// `Hybrid`.
    #[default]
    Auto,
    /// Parallel `pwrite`s straight from the tensors' memory through the page cache.
    Buffered,
    /// `O_DIRECT` from two aligned windows, the file preallocated.
    Direct,
    /// `O_DIRECT` windows from the end of the save down, beside buffered writes from the front
    /// of its files up into the page cache's room before writeback, each at its own rate until
    /// they meet; `Direct` alone without room.
    Hybrid,
}

impl Writer {
    /// Every writer, in the order [`Writer::key`]s are listed to users.
    pub const ALL: [Writer; 4] = [
        Writer::Auto,
        Writer::Buffered,
        Writer::Direct,
        Writer::Hybrid,
    ];

    /// The writer's short name, as an option takes it (Python's `writer=`, the CLI's
    /// `--writer`): `auto`, `buffered`, `direct`, `hybrid`; [`Writer::from_key`] reads it back.
    pub fn key(self) -> &'static str {
        match self {
            Writer::Auto => "auto",
            Writer::Buffered => "buffered",
            Writer::Direct => "direct",
            Writer::Hybrid => "hybrid",
        }
    }

    /// The writer whose [`Writer::key`] is `key`, or `None`.
    pub fn from_key(key: &str) -> Option<Writer> {
        Writer::ALL.into_iter().find(|w| w.key() == key)
    }

    /// In reports: `auto`, `buffered`, `O_DIRECT`, `O_DIRECT + buffered`.
    pub fn name(self) -> &'static str {
        match self {
            Writer::Auto => "auto",
            Writer::Buffered => "buffered",
            Writer::Direct => "O_DIRECT",
            Writer::Hybrid => "O_DIRECT + buffered",
        }
    }
}

impl std::fmt::Display for Writer {
    /// [`Writer::name`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How to save: [`SaveOptions::new`] then chained setters.
#[derive(Clone, Default)]
pub struct SaveOptions {
    /// `fsync` the file (and its folder, after the rename) before returning.
    pub fsync: bool,
    /// The `__metadata__` string map.
    pub metadata: BTreeMap<String, String>,
    /// Asked between batches whether to stop: `true` stops the save with
    /// [`CheckpointError::Interrupted`], the partial files removed and the destination as it
    /// was (the CLI's Ctrl-C and SIGTERM handler, Python's `check_signals`).
    pub interrupt: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
    /// A sharded save's largest shard, in bytes of tensor data (default 5 GB, as Hugging
    /// Face's `save_pretrained` cuts them).
    pub shard_bytes: Option<u64>,
    /// The most host memory [`Checkpoint::snapshot_save`](super::Checkpoint::snapshot_save)
    /// holds at once, in bytes (default 1 GiB, at least 8 KiB): a larger checkpoint streams
    /// through two windows of half of it each.
    pub snapshot_bytes: Option<u64>,
    /// [`Checkpoint::snapshot_save`](super::Checkpoint::snapshot_save) (Python's and C's
    /// non-blocking saves) keeps its snapshot's host memory (or its two windows) once written,
    /// and the next snapshot save whose copy fits in it takes it: a loop that saves every N
    /// steps allocates (and, pinned, page-locks) its snapshot once, and each later stall is
    /// the copy alone, at the link's rate for GPU tensors. The memory is the process's: a
    /// snapshot save without this option (default off) frees it, and with it what saves still
    /// writing would keep; a save whose copy does not fit frees the kept memory of its kind and
    /// keeps its own. [`Checkpoint::snapshot`](super::Checkpoint::snapshot) takes kept memory
    /// over too (without giving it back). Blocking saves neither keep nor free it.
    pub keep_snapshot: bool,
    /// How the bytes go into the files: [`Writer::Auto`] (the default), chosen per save.
    ///
    /// - [`Writer::Buffered`]: the tensors' bytes are `pwrite`n straight from their memory by
    ///   the file engine's parallel writers, into the page cache (the kernel writes them back
    ///   later, or at `fsync`).
    /// - [`Writer::Direct`]: each file is preallocated (`fallocate`) and opened with
    ///   `O_DIRECT`; its bytes are gathered, in file order, into two page-aligned host windows
    ///   of 64 MiB (one filled while the other is written: engine copies, a GPU's for device
    ///   tensors) and written from them at aligned offsets, through io_uring where the kernel
    ///   allows it; the unaligned tail of each file goes buffered. The page cache is
    ///   bypassed: no second copy, no writeback. A file system that refuses `O_DIRECT` gets
    ///   buffered writes, the reason in the report.
    /// - [`Writer::Hybrid`]: both at once: the `O_DIRECT` windows from the end of the save
    ///   down, beside buffered writes straight from the tensors from the front of its files
    ///   up (a few files at a time: the kernel takes one file's buffered writes one at a
    ///   time), the buffered share at most 90% of the page cache's room before the kernel
    ///   starts writing back (its `vm.dirty_background_*` share of the memory free or caching
    ///   files, less what is dirty now; a memory cgroup's own where less), each side taking
    ///   its next 64 MiB window at its own rate until they meet: no writeback competes with
    ///   the `O_DIRECT` writes for the disk. Without that room, `O_DIRECT` alone.
    /// - [`Writer::Auto`]: buffered under 64 MiB; `O_DIRECT` when fsynced (every byte goes
    ///   to the disk, and `O_DIRECT` skips the page cache's copy) or when most of the bytes
    ///   are in host memory (both sides' copies then take the same CPUs: on the 2-core host,
    ///   `bench/results/cpu-2core.md`, the hybrid writer saved 1 GiB 2x faster than `O_DIRECT`
    ///   alone but 3 GiB 0.66x); else hybrid. The thirteenth H100 run (`bench/results/h100.md`,
    ///   17.6 GB from the GPU in 8 shards): hybrid 5.65-7.97 GB/s against `O_DIRECT` alone's
    ///   1.74-1.92 and buffered 1.59-1.74.
    ///
    /// Ask for buffered writes where the page cache should keep all the bytes for a load that
    /// follows. The writer used and why: [`SaveReport::writer`](super::SaveReport::writer),
    /// [`SaveReport::writer_note`](super::SaveReport::writer_note).
    pub writer: Writer,
}

impl std::fmt::Debug for SaveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveOptions")
            .field("fsync", &self.fsync)
            .field("metadata", &self.metadata)
            .field("interrupt", &self.interrupt.as_ref().map(|_| ".."))
            .field("shard_bytes", &self.shard_bytes)
            .field("snapshot_bytes", &self.snapshot_bytes)
            .field("keep_snapshot", &self.keep_snapshot)
            .field("writer", &self.writer)
            .finish()
    }
}

impl SaveOptions {
    /// No fsync, no metadata, never interrupted.
    pub fn new() -> SaveOptions {
        SaveOptions::default()
    }
    /// Sets whether to `fsync`.
    pub fn fsync(mut self, on: bool) -> SaveOptions {
        self.fsync = on;
        self
    }
    /// Adds a `__metadata__` entry.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> SaveOptions {
        self.metadata.insert(key.into(), value.into());
        self
    }
    /// Sets the check that stops a save ([`SaveOptions::interrupt`](field@SaveOptions::interrupt)); it is
    /// called from the saving thread between batches of at most 256 MiB.
    pub fn interrupt(mut self, stop: impl Fn() -> bool + Send + Sync + 'static) -> SaveOptions {
        self.interrupt = Some(Arc::new(stop));
        self
    }
    /// Sets a sharded save's largest shard in bytes of tensor data.
    pub fn shard_bytes(mut self, bytes: u64) -> SaveOptions {
        self.shard_bytes = Some(bytes);
        self
    }
    /// Sets the most host memory a snapshot holds at once
    /// ([`SaveOptions::snapshot_bytes`](field@SaveOptions::snapshot_bytes)).
    pub fn snapshot_bytes(mut self, bytes: u64) -> SaveOptions {
        self.snapshot_bytes = Some(bytes);
        self
    }
    /// Keeps the snapshot's host memory for the next snapshot save, or frees what earlier
    /// ones kept (`false`) ([`SaveOptions::keep_snapshot`](field@SaveOptions::keep_snapshot)).
    pub fn keep_snapshot(mut self, on: bool) -> SaveOptions {
        self.keep_snapshot = on;
        self
    }
    /// Writes with `O_DIRECT` (`true`: [`Writer::Direct`]) or buffered (`false`:
    /// [`Writer::Buffered`]) instead of choosing per save.
    pub fn direct(mut self, on: bool) -> SaveOptions {
        self.writer = if on { Writer::Direct } else { Writer::Buffered };
        self
    }

    /// How the bytes go into the files ([`SaveOptions::writer`](field@SaveOptions::writer)).
    pub fn writer(mut self, writer: Writer) -> SaveOptions {
        self.writer = writer;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::Writer;

    #[test]
    fn a_writers_key_reads_back_as_that_writer_and_nothing_else_does() {
        for w in Writer::ALL {
            assert_eq!(Writer::from_key(w.key()), Some(w));
        }
        let keys: Vec<&str> = Writer::ALL.iter().map(|w| w.key()).collect();
        assert_eq!(keys, ["auto", "buffered", "direct", "hybrid"]);
        for bad in ["", "Auto", "O_DIRECT", "fast", "hybrid "] {
            assert_eq!(Writer::from_key(bad), None, "{bad:?}");
        }
    }
}
