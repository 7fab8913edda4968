//! The checkpoint path's error: every variant names the file, and the tensor where one is at
//! fault.

use crate::file::FileError;
use safetensors::Dtype;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Why a checkpoint could not be read, loaded or saved. Nothing is reported as loaded when
/// one is returned: the memory allocated for the load is freed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Opening, reading or writing the file failed (the file engine's error, which names the
    /// offset), in the bytes of `tensor` where the failure lies in one.
    #[error("{}{}: {source}", path.display(), tensor.as_ref().map(|t| format!(", tensor `{t}`")).unwrap_or_default())]
    File {
        /// The file.
        path: PathBuf,
        /// The tensor whose bytes the failed call was moving, if one.
        tensor: Option<String>,
        /// The file engine's error.
        source: FileError,
    },
    /// The file is shorter than the 8-byte header length that starts every safetensors file.
    #[error("{}: {file_len} bytes, too short for a safetensors file (8-byte header length first)", path.display())]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its length.
        file_len: u64,
    },
    /// The header length is larger than the format allows (100,000,000 bytes).
    #[error("{}: header length {header_len} is over the format's limit of 100000000 bytes", path.display())]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The header length the file gives.
        header_len: u64,
    },
    /// The header length runs past the end of the file.
    #[error("{}: header of {header_len} bytes runs past the end of the file ({file_len} bytes)", path.display())]
    HeaderBeyondFile {
        /// The file.
        path: PathBuf,
        /// The header length the file gives.
        header_len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The JSON header is not UTF-8.
    #[error("{}: the header is not UTF-8 (invalid byte at header offset {valid_up_to})", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Bytes of the header that are valid UTF-8 before the first invalid one.
        valid_up_to: usize,
    },
    /// The header is not a JSON object (truncated, or not JSON).
    #[error("{}: the header is not valid JSON: {msg}", path.display())]
    BadJson {
        /// The file.
        path: PathBuf,
        /// serde_json's message (with line and column).
        msg: String,
    },
    /// A tensor's dtype is not one of the format's.
    #[error("{}: tensor `{tensor}` has unknown dtype {dtype:?}", path.display())]
    UnknownDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype as written.
        dtype: String,
    },
    /// A tensor's entry is malformed (a missing field, a negative dimension, ...).
    #[error("{}: tensor `{tensor}`: bad header entry: {msg}", path.display())]
    BadEntry {
        /// The file.
        path: PathBuf,
        /// The tensor (or `__metadata__`).
        tensor: String,
        /// What is wrong.
        msg: String,
    },
    /// A tensor's data offsets are out of order (end before begin).
    #[error("{}: tensor `{tensor}`: data offsets [{begin}, {end}] are out of order", path.display())]
    BadOffsets {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Begin offset in the data section.
        begin: u64,
        /// End offset.
        end: u64,
    },
    /// Two tensors' byte ranges overlap.
    #[error("{}: tensor `{tensor}` overlaps tensor `{other}` in the data section", path.display())]
    Overlap {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The tensor it overlaps.
        other: String,
    },
    /// Bytes of the data section belong to no tensor (the format has no gaps).
    #[error("{}: tensor `{tensor}` starts at data offset {begin}, but the previous tensor ends at {expected}: the format allows no gap", path.display())]
    Gap {
        /// The file.
        path: PathBuf,
        /// The tensor after the gap.
        tensor: String,
        /// Its begin offset.
        begin: u64,
        /// Where it should begin.
        expected: u64,
    },
    /// A tensor ends beyond the file's data section.
    #[error("{}: tensor `{tensor}` ends at data offset {end}, outside the data section ({data_len} bytes)", path.display())]
    OutsideData {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its end offset.
        end: u64,
        /// Bytes of the file after the header.
        data_len: u64,
    },
    /// A tensor's byte range does not match its shape times its dtype's size.
    #[error("{}: tensor `{tensor}`: shape {shape:?} of {dtype} needs {} bytes, its byte range holds {bytes}", path.display(), need.map_or("a non-whole or overflowing number of".to_string(), |n| n.to_string()))]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes the shape needs (`None`: overflows, or not a whole number of bytes).
        need: Option<u64>,
        /// Bytes of its range.
        bytes: u64,
    },
    /// The file goes on after the last tensor.
    #[error("{}: {extra} bytes after the last tensor (the data section is {data_len} bytes)", path.display())]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Bytes the tensors cover.
        data_len: u64,
        /// Bytes after them.
        extra: u64,
    },
    /// The `safetensors` crate refused the header after ferry's own checks passed.
    #[error("{}: bad header: {msg}", path.display())]
    Header {
        /// The file.
        path: PathBuf,
        /// The crate's message.
        msg: String,
    },
    /// A sharded checkpoint's index (`*.safetensors.index.json`) is malformed or disagrees
    /// with its shards.
    #[error("{}: bad index: {msg}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A tensor asked for by name is not in the checkpoint.
    #[error("{}: no tensor `{tensor}`", path.display())]
    Missing {
        /// The file (or index).
        path: PathBuf,
        /// The name asked for.
        tensor: String,
    },
    /// Two tensors share a name: in two shards, twice in one file's header, or twice in a save
    /// (`first` and `second` are then the same file).
    #[error("{}", duplicate_words(tensor, first, second))]
    Duplicate {
        /// The name.
        tensor: String,
        /// Where it was first seen.
        first: PathBuf,
        /// Where it was seen again.
        second: PathBuf,
    },
    /// A shard that a sharded checkpoint's index lists cannot be opened (missing, unreadable,
    /// not a regular file): `source` names the shard.
    #[error("{}: the shard it lists for tensor `{tensor}`: {source}", index.display())]
    Shard {
        /// The index (`*.safetensors.index.json`).
        index: PathBuf,
        /// A tensor the index maps to the shard.
        tensor: String,
        /// The file engine's error (boxed: the variant stays as small as the others).
        source: Box<FileError>,
    },
    /// The memory for the tensors could not be allocated.
    #[error("cannot allocate {bytes} bytes of {target} memory for {}: {msg}", path.display())]
    Alloc {
        /// The file being loaded.
        path: PathBuf,
        /// Where (`cuda:0`, `pinned`, `pageable`).
        target: String,
        /// Bytes asked for.
        bytes: u64,
        /// The allocator's or driver's message.
        msg: String,
    },
    /// A load to [`Target::Device`](super::Target::Device) with a file engine that has no GPU
    /// of its own: made without an engine, or with one that is not one GPU's. Returned before
    /// anything is allocated or read.
    #[error("loading {} to device memory: {why}", path.display())]
    NoDevice {
        /// The checkpoint being loaded.
        path: PathBuf,
        /// What the file engine has instead.
        why: String,
    },
    /// A loaded tensor's bytes cannot be viewed as the element type asked for
    /// ([`HostView::as_slice`](super::HostView::as_slice)): another dtype, or not aligned for
    /// it in memory.
    #[error("{}: tensor `{tensor}`: {msg}", path.display())]
    View {
        /// The file the tensor came from.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Why not.
        msg: String,
    },
    /// A destination of [`load_into`](super::load_into) does not fit its tensor (byte count,
    /// or the dtype or shape it expects), or names a tensor given twice.
    #[error("{}: tensor `{tensor}`: the destination {msg}", path.display())]
    Destination {
        /// The file (or index) being loaded.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What does not fit.
        msg: String,
    },
    /// [`LoadOptions::align`](super::LoadOptions::align) (the field) is not a power of two
    /// (its setter rounds; a value set directly is checked before any tensor is read).
    #[error("loading {}: LoadOptions::align {align} is not a power of two", path.display())]
    Align {
        /// The checkpoint being loaded.
        path: PathBuf,
        /// The alignment asked for.
        align: usize,
    },
    /// A tensor handed to a save does not hold what its dtype and shape say.
    #[error("saving {}: tensor `{tensor}`: {msg}", path.display())]
    BadTensor {
        /// The file being written.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        msg: String,
    },
    /// A save could not put its file in place: `step` says which step failed (creating the
    /// temporary file beside the destination, renaming it over the destination, syncing the
    /// folder), `msg` the system's reason. The destination is as it was before the save.
    #[error("saving {}: {step} failed: {msg}", path.display())]
    Replace {
        /// The destination.
        path: PathBuf,
        /// The step that failed, in words.
        step: String,
        /// The system's error kind.
        kind: std::io::ErrorKind,
        /// The system's message.
        msg: String,
    },
    /// A save was stopped by [`SaveOptions::interrupt`](super::SaveOptions::interrupt) (Ctrl-C,
    /// SIGTERM): the partial file is removed, the destination is as it was before the save.
    #[error("saving {}: interrupted; the file was not written (nothing was left behind)", path.display())]
    Interrupted {
        /// The destination.
        path: PathBuf,
    },
}

impl CheckpointError {
    /// The file the error is about.
    pub fn path(&self) -> Option<&std::path::Path> {
        use CheckpointError::*;
        match self {
            File { path, .. }
            | TooShort { path, .. }
            | HeaderTooLarge { path, .. }
            | HeaderBeyondFile { path, .. }
            | NotUtf8 { path, .. }
            | BadJson { path, .. }
            | UnknownDtype { path, .. }
            | BadEntry { path, .. }
            | BadOffsets { path, .. }
            | Overlap { path, .. }
            | Gap { path, .. }
            | OutsideData { path, .. }
            | SizeMismatch { path, .. }
            | TrailingBytes { path, .. }
            | Header { path, .. }
            | Index { path, .. }
            | Missing { path, .. }
            | Alloc { path, .. }
            | Destination { path, .. }
            | Align { path, .. }
            | NoDevice { path, .. }
            | View { path, .. }
            | BadTensor { path, .. }
            | Replace { path, .. }
            | Interrupted { path } => Some(path),
            Duplicate { second, .. } => Some(second),
            Shard { index, .. } => Some(index),
        }
    }

    /// The tensor the error is about, where one is.
    pub fn tensor(&self) -> Option<&str> {
        use CheckpointError::*;
        match self {
            File { tensor, .. } => tensor.as_deref(),
            UnknownDtype { tensor, .. }
            | BadEntry { tensor, .. }
            | BadOffsets { tensor, .. }
            | Overlap { tensor, .. }
            | Gap { tensor, .. }
            | OutsideData { tensor, .. }
            | SizeMismatch { tensor, .. }
            | Missing { tensor, .. }
            | Duplicate { tensor, .. }
            | Shard { tensor, .. }
            | Destination { tensor, .. }
            | View { tensor, .. }
            | BadTensor { tensor, .. } => Some(tensor),
            _ => None,
        }
    }
}

/// [`CheckpointError::Duplicate`] in words: one file named once, two files both.
fn duplicate_words(tensor: &str, first: &Path, second: &Path) -> String {
    if first == second {
        format!("{}: tensor `{tensor}` is named twice", first.display())
    } else {
        format!(
            "tensor `{tensor}` appears twice: in {} and in {}",
            first.display(),
            second.display()
        )
    }
}
