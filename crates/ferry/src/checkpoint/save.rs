//! Saving: tensors from any memory the file engine reaches -> a safetensors file.

use super::error::CheckpointError;
use super::header::tensor_bytes;
use super::loaded::Checkpoint;
use crate::file::{FileEngine, FileError, IoReport, OpenMode, Replacement, WritePiece};
use crate::memory::Memory;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

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

/// How to save: [`SaveOptions::new`] then chained setters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaveOptions {
    /// `fsync` the file (and its folder, after the rename) before returning.
    pub fsync: bool,
    /// The `__metadata__` string map.
    pub metadata: BTreeMap<String, String>,
}

impl SaveOptions {
    /// No fsync, no metadata.
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
}

/// What a save did.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveReport {
    /// Bytes written (header included).
    pub bytes: u64,
    /// Tensors written.
    pub tensors: usize,
    /// Seconds, from the file's creation to its rename (fsync included).
    pub seconds: f64,
    /// Whether the file was synced.
    pub synced: bool,
    /// The file engine's report over all writes.
    pub io: IoReport,
}

impl std::fmt::Display for SaveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gbs = if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        };
        write!(
            f,
            "{} tensors, {} bytes in {:.4} s ({gbs:.2} GB/s){}; {}",
            self.tensors,
            self.bytes,
            self.seconds,
            if self.synced { ", fsynced" } else { "" },
            self.io
        )
    }
}

/// Writes `tensors` to a safetensors file at `path`, laid out as the reference writer lays it
/// out (by dtype alignment, then name; header padded to 8 bytes), through `engine` (device
/// memory needs a file engine made with [`FileEngine::with_engine`]). The bytes go to a
/// temporary file beside `path`, renamed to `path` once complete ([`Replacement`]): a failed
/// save leaves no file (and an existing `path` untouched); a symbolic link is written through
/// and an existing file's permission bits are kept; an existing `path` that is not a regular
/// file (a device, FIFO or folder) is refused.
///
/// Errors: [`CheckpointError::BadTensor`] (bytes that do not match dtype x shape),
/// [`CheckpointError::Duplicate`], [`CheckpointError::File`] (naming the tensor being
/// written), checked before the file is created where they can be.
pub fn save(
    engine: &FileEngine,
    path: impl AsRef<Path>,
    tensors: &[SaveTensor<'_>],
    opts: &SaveOptions,
) -> Result<SaveReport, CheckpointError> {
    let path = path.as_ref();
    let bad = |t: &SaveTensor<'_>, msg: String| CheckpointError::BadTensor {
        path: path.to_path_buf(),
        tensor: t.name.to_string(),
        msg,
    };
    let mut order: Vec<&SaveTensor<'_>> = tensors.iter().collect();
    order.sort_by(|a, b| b.dtype.cmp(&a.dtype).then(a.name.cmp(b.name)));
    let mut entries = Vec::with_capacity(order.len());
    let mut offset = 0usize;
    let mut names = std::collections::HashSet::with_capacity(order.len());
    for t in &order {
        if !names.insert(t.name) {
            return Err(CheckpointError::Duplicate {
                tensor: t.name.to_string(),
                first: path.to_path_buf(),
                second: path.to_path_buf(),
            });
        }
        let len = t.data.raw().len;
        if tensor_bytes(t.dtype, t.shape) != Some(len as u64) {
            return Err(bad(
                t,
                format!(
                    "shape {:?} of {} does not match its {len} bytes",
                    t.shape, t.dtype
                ),
            ));
        }
        let info = TensorInfo {
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            data_offsets: (offset, offset + len),
        };
        entries.push((t.name.to_string(), info));
        offset += len;
    }
    let meta = (!opts.metadata.is_empty()).then(|| opts.metadata.clone().into_iter().collect());
    let header_err = |msg: String| CheckpointError::Header {
        path: path.to_path_buf(),
        msg,
    };
    let metadata = Metadata::new(meta, entries).map_err(|e| header_err(e.to_string()))?;
    let mut header = serde_json::to_vec(&metadata).map_err(|e| header_err(e.to_string()))?;
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut head = (header.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(&header);

    let t0 = Instant::now();
    let replacing = Replacement::new(path).map_err(|e| os_err(path, &e, "replacing"))?;
    // Dropped on an error: the temporary file goes, an existing `path` stays as it was.
    let io = write(
        engine,
        path,
        replacing.temp_path(),
        &head,
        &order,
        opts.fsync,
    )?;
    replacing
        .commit(opts.fsync)
        .map_err(|e| os_err(path, &e, "the rename into place"))?;
    Ok(SaveReport {
        bytes: head.len() as u64 + offset as u64,
        tensors: order.len(),
        seconds: t0.elapsed().as_secs_f64(),
        synced: opts.fsync,
        io,
    })
}

fn os_err(path: &Path, e: &std::io::Error, what: &str) -> CheckpointError {
    CheckpointError::File {
        path: path.to_path_buf(),
        tensor: None,
        source: FileError::Io {
            op: crate::file::IoOp::Write,
            path: path.to_path_buf(),
            offset: 0,
            len: 0,
            kind: e.kind(),
            msg: format!("{what} failed: {e}"),
        },
    }
}

/// Creates `tmp` and writes the header and every tensor (all in flight at once); errors name
/// `path`, the file being replaced (the engine's own error names `tmp`).
fn write(
    engine: &FileEngine,
    path: &Path,
    tmp: &Path,
    head: &[u8],
    order: &[&SaveTensor<'_>],
    fsync: bool,
) -> Result<IoReport, CheckpointError> {
    let ferr = |tensor: Option<String>, source| CheckpointError::File {
        path: path.to_path_buf(),
        tensor,
        source,
    };
    let file = engine
        .open(tmp, OpenMode::Create)
        .map_err(|e| ferr(None, e))?;
    let mut pieces = Vec::with_capacity(order.len() + 1);
    pieces.push(WritePiece {
        file: &file,
        offset: 0,
        data: &head,
    });
    let mut at = head.len() as u64;
    let mut starts = Vec::with_capacity(order.len());
    for t in order {
        starts.push(at);
        pieces.push(WritePiece {
            file: &file,
            offset: at,
            data: t.data,
        });
        at += t.data.raw().len as u64;
    }
    let io = engine.store_pieces(&pieces).map_err(|e| {
        let off = match &e {
            FileError::Io { offset, .. } | FileError::Transfer { offset, .. } => Some(*offset),
            _ => None,
        };
        let i = off.map(|o| starts.partition_point(|&s| s <= o));
        let tensor = i.filter(|&i| i > 0).map(|i| order[i - 1].name.to_string());
        ferr(tensor, e)
    })?;
    if fsync {
        file.sync().map_err(|e| ferr(None, e))?;
    }
    Ok(io)
}

impl Checkpoint {
    /// Saves every tensor of this checkpoint, from wherever it was loaded to, to a
    /// safetensors file at `path` ([`save`]), with its metadata and `opts`'s.
    pub fn save(
        &self,
        engine: &FileEngine,
        path: impl AsRef<Path>,
        opts: &SaveOptions,
    ) -> Result<SaveReport, CheckpointError> {
        let regions: Vec<_> = self
            .tensors()
            .iter()
            .map(|t| {
                crate::memory::Region::of(&self.buffers()[t.buffer], t.offset..t.offset + t.len)
                    .expect("a loaded tensor lies inside its buffer")
            })
            .collect();
        let tensors: Vec<SaveTensor<'_>> = self
            .tensors()
            .iter()
            .zip(&regions)
            .map(|(t, r)| SaveTensor::new(&t.name, t.dtype, &t.shape, r))
            .collect();
        let mut opts = opts.clone();
        for (k, v) in self.metadata() {
            opts.metadata.entry(k.clone()).or_insert_with(|| v.clone());
        }
        save(engine, path, &tensors, &opts)
    }
}
