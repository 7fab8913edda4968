//! Saving: tensors from any memory the file engine reaches -> a safetensors file.

use super::error::CheckpointError;
use super::loaded::Checkpoint;
use super::options::{SaveOptions, SaveTensor, Writer};
use super::stream::stream_now;
use super::write::{check_tensor, open_for, plan, write_pieces, Planned, Target, DIRECT_WINDOW};
use crate::file::{FileEngine, IoReport};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What a save did.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveReport {
    /// Bytes written (header included).
    pub bytes: u64,
    /// Tensors written.
    pub tensors: usize,
    /// Safetensors files written (the shards of a sharded save; its index not counted).
    pub files: usize,
    /// Seconds, from the file's creation to its rename (fsync included).
    pub seconds: f64,
    /// Whether the file was synced.
    pub synced: bool,
    /// The most host memory a snapshot held at once, in bytes
    /// ([`Checkpoint::snapshot_save`]: at most [`SaveOptions::snapshot_bytes`]), or the
    /// `O_DIRECT` writer's windows; 0 for a buffered save straight from the tensors.
    pub snapshot_bytes: u64,
    /// The writer that ran (never [`Writer::Auto`]): the one [`SaveOptions::writer`] asked
    /// for or `Auto`'s choice; `Buffered` where the file system refused `O_DIRECT`, `Direct`
    /// where a `Hybrid` save found no room in the page cache (the note says why). `io`'s
    /// direct and buffered bytes say how much each way took.
    pub writer: Writer,
    /// Why that writer ("asked", the reason it was chosen, or why `O_DIRECT` was refused).
    pub writer_note: String,
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
            "{} tensors in {} file(s), {} bytes in {:.4} s ({gbs:.2} GB/s){}; writer {} ({}){}; {}",
            self.tensors,
            self.files,
            self.bytes,
            self.seconds,
            if self.synced { ", fsynced" } else { "" },
            self.writer,
            self.writer_note,
            if self.snapshot_bytes > 0 {
                format!("; {} bytes of windows held at most", self.snapshot_bytes)
            } else {
                String::new()
            },
            self.io
        )
    }
}

/// Writes `tensors` to a safetensors file at `path`, laid out as the reference writer lays it
/// out (by dtype alignment, then name; header padded to 8 bytes), through `engine` (device
/// memory needs a file engine made with [`FileEngine::with_engine`]): its pieces are written
/// in parallel, in batches of 256 MiB between which [`SaveOptions::interrupt`] is asked. The
/// bytes go to a temporary file beside `path`, renamed to `path` once complete
/// ([`Replacement`](crate::file::Replacement)): a failed or interrupted save leaves no file
/// (and an existing `path` untouched); a symbolic link is written through and an existing
/// file's permission bits are kept; an existing `path` that is not a regular file (a device,
/// FIFO or folder) is refused.
///
/// A `path` ending in `.safetensors.index.json` writes a sharded checkpoint in Hugging Face's
/// layout: that index (`{"metadata": {"total_size": N, ...}, "weight_map": {tensor: shard}}`)
/// and shards `<prefix>-0000i-of-0000N.safetensors` beside it, the tensors cut into shards in
/// the order given, a new shard started where the next tensor would take one over
/// [`SaveOptions::shard_bytes`] (default 5 GB). Every shard is written at once (one set of
/// pieces over all of them), each beside its destination and renamed into place once all are
/// complete, the index last; [`load`](fn@super::load) of the index reads it back.
///
/// Errors: [`CheckpointError::BadTensor`] (bytes that do not match dtype x shape),
/// [`CheckpointError::Duplicate`], [`CheckpointError::Replace`] (the temporary file cannot be
/// made beside `path`, or renamed over it: the step is named), [`CheckpointError::File`]
/// (naming the tensor being written), [`CheckpointError::Interrupted`]; checked before the
/// file is created where they can be.
pub fn save(
    engine: &FileEngine,
    path: impl AsRef<Path>,
    tensors: &[SaveTensor<'_>],
    opts: &SaveOptions,
) -> Result<SaveReport, CheckpointError> {
    let (planned, extra) = plan_save(path.as_ref(), tensors, opts)?;
    let t0 = Instant::now();
    let (io, writer, writer_note, held) = write_files(engine, &planned, &extra, opts)?;
    Ok(SaveReport {
        bytes: planned.iter().map(|p| p.bytes()).sum::<u64>()
            + extra.iter().map(|e| e.1.len() as u64).sum::<u64>(),
        tensors: tensors.len(),
        files: planned.len(),
        seconds: t0.elapsed().as_secs_f64(),
        synced: opts.fsync,
        snapshot_bytes: held,
        writer,
        writer_note,
        io,
    })
}

/// The files [`save`] writes to `path`: the safetensors files, planned, and the small extra
/// ones (a sharded checkpoint's index).
#[allow(clippy::type_complexity)]
pub(super) fn plan_save<'t, 'a>(
    path: &Path,
    tensors: &'t [SaveTensor<'a>],
    opts: &SaveOptions,
) -> Result<(Vec<Planned<'t, 'a>>, Vec<(PathBuf, Vec<u8>)>), CheckpointError> {
    if path.to_string_lossy().ends_with(".safetensors.index.json") {
        return plan_sharded(path, tensors, opts);
    }
    Ok((vec![plan(path, tensors, &opts.metadata)?], Vec::new()))
}

/// A sharded save's largest shard by default: 5 GB of tensor data, as Hugging Face's
/// `save_pretrained` cuts them.
const DEFAULT_SHARD_BYTES: u64 = 5_000_000_000;

/// [`plan_save`] of a sharded checkpoint: `index` is `<prefix>.safetensors.index.json`.
#[allow(clippy::type_complexity)]
fn plan_sharded<'t, 'a>(
    index: &Path,
    tensors: &'t [SaveTensor<'a>],
    opts: &SaveOptions,
) -> Result<(Vec<Planned<'t, 'a>>, Vec<(PathBuf, Vec<u8>)>), CheckpointError> {
    let prefix = index
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".safetensors.index.json"))
        .filter(|p| !p.is_empty())
        .ok_or_else(|| CheckpointError::Index {
            path: index.to_path_buf(),
            msg: "a sharded checkpoint's index is named <prefix>.safetensors.index.json, with a \
                  prefix"
                .into(),
        })?;
    let mut names = std::collections::HashSet::with_capacity(tensors.len());
    for t in tensors {
        if !names.insert(t.name) {
            return Err(CheckpointError::Duplicate {
                tensor: t.name.to_string(),
                first: index.to_path_buf(),
                second: index.to_path_buf(),
            });
        }
        check_tensor(index, t)?;
    }
    let limit = opts.shard_bytes.unwrap_or(DEFAULT_SHARD_BYTES).max(1);
    let mut groups: Vec<Vec<&SaveTensor<'_>>> = vec![Vec::new()];
    let mut size = 0u64;
    for t in tensors {
        let len = t.data.raw().len as u64;
        let last = groups.last_mut().expect("one group at least");
        if !last.is_empty() && size + len > limit {
            groups.push(vec![t]);
            size = len;
        } else {
            last.push(t);
            size += len;
        }
    }
    let n = groups.len();
    let dir = index.parent().unwrap_or(Path::new(""));
    let mut planned = Vec::with_capacity(n);
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (i, g) in groups.into_iter().enumerate() {
        let name = format!("{prefix}-{:05}-of-{n:05}.safetensors", i + 1);
        for t in &g {
            weight_map.insert(t.name.to_string(), name.clone());
            total += t.data.raw().len as u64;
        }
        planned.push(plan(&dir.join(&name), g, &opts.metadata)?);
    }
    let mut meta = serde_json::Map::new();
    meta.insert("total_size".into(), total.into());
    for (k, v) in &opts.metadata {
        meta.entry(k.clone()).or_insert_with(|| v.clone().into());
    }
    let json = serde_json::json!({ "metadata": meta, "weight_map": weight_map });
    let mut text = serde_json::to_vec_pretty(&json).map_err(|e| CheckpointError::Index {
        path: index.to_path_buf(),
        msg: e.to_string(),
    })?;
    text.push(b'\n');
    Ok((planned, vec![(index.to_path_buf(), text)]))
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
        self.with_tensors(opts, |tensors, opts| save(engine, path, tensors, opts))
    }

    /// Calls `f` with this checkpoint's tensors, in file order, and `opts` with its metadata.
    fn with_tensors<R>(
        &self,
        opts: &SaveOptions,
        f: impl FnOnce(&[SaveTensor<'_>], &SaveOptions) -> R,
    ) -> R {
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
            if k != "total_size" {
                opts.metadata.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        f(&tensors, &opts)
    }
}

/// Writes every planned file and then the small `extra` files (a sharded checkpoint's index,
/// written last so that it never names a shard not yet in place): each beside its destination
/// and renamed over it once every file is complete, by the writer [`open_for`] picks. On an
/// error or an interrupt every temporary file is removed and no destination is touched (a
/// failure while renaming leaves those renamed before it in place). Returns the writes'
/// report, the writer used and why, and the bytes of windows the `O_DIRECT` writer held.
pub(super) fn write_files(
    engine: &FileEngine,
    files: &[Planned<'_, '_>],
    extra: &[(PathBuf, Vec<u8>)],
    opts: &SaveOptions,
) -> Result<(IoReport, Writer, String, u64), CheckpointError> {
    let bytes = files.iter().map(|f| f.bytes()).sum();
    let Target {
        open,
        writer,
        note,
        share,
        direct,
    } = open_for(engine, files, extra, opts, bytes, true)?;
    let share = (writer == Writer::Hybrid).then_some(share);
    let (io, held) = match &direct {
        Some(d) => stream_now(engine, d, files, open, opts, DIRECT_WINDOW, share)?,
        None => {
            let io = write_pieces(engine, files, &open.handles, opts)?;
            open.finish(opts)?;
            (io, 0)
        }
    };
    Ok((io, writer, note, held))
}
