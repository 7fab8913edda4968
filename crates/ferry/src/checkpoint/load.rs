//! Loading: headers, the choice of tensors, memory for them, and the reads.

use super::error::CheckpointError;
use super::header::{read_header, Header, Members, TensorEntry};
use super::loaded::{Checkpoint, LoadReport, Tensor, TensorBuffer};
use super::options::{LoadOptions, Placement, Select, Target};
use crate::file::{FileEngine, FileError, FileHandle, IoReport, OpenMode, ReadPiece};
use crate::memory::{MemKind, Memory};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Loads the checkpoint at `path`: a safetensors file, a sharded checkpoint when `path`
/// ends in `.json` (its `*.safetensors.index.json`), or a checkpoint's folder ([`resolve`]).
///
/// A sharded checkpoint is loaded through its index (`{"metadata": {...}, "weight_map":
/// {"tensor": "model-00001-of-00002.safetensors", ...}}`): every shard it names (paths inside
/// the index's folder: an absolute path or `..` is refused), checked against it before
/// anything is loaded (a tensor mapped to a shard that does not hold it, or listed twice, is
/// [`CheckpointError::Index`]; a name held by two shards [`CheckpointError::Duplicate`],
/// naming both; a shard that cannot be opened [`CheckpointError::Shard`], naming the index and
/// the shard; an index over [`MAX_INDEX_BYTES`] [`CheckpointError::Index`], before it is
/// read). Its shards are read all at once: one read per run of adjacent tensors of every
/// shard, all in flight together on the file engine's workers.
///
/// Errors: [`CheckpointError`], naming the file and tensor; every buffer allocated is freed.
pub fn load(
    engine: &FileEngine,
    path: impl AsRef<Path>,
    opts: &LoadOptions,
) -> Result<Checkpoint, CheckpointError> {
    let c = open_checkpoint(engine, path.as_ref())?;
    read_tensors(engine, &c.files, &c.headers, opts, &c.name_path, c.metadata)
}

/// Every tensor's header entry of the checkpoint at `path` (a safetensors file, a sharded
/// checkpoint's index, or a checkpoint's folder: [`resolve`]), in file order (shard by shard), with the file that holds it; the
/// headers are read and checked as [`load`] checks them, no tensor data is read.
///
/// ```
/// use ferry::checkpoint::{self, Dtype, SaveOptions, SaveTensor};
/// use ferry::file::{FileConfig, FileEngine};
/// let path = std::env::temp_dir().join(format!("ferry-doc-entries-{}.safetensors", std::process::id()));
/// let engine = FileEngine::new(FileConfig::new().threads(2))?;
/// checkpoint::save(&engine, &path, &[SaveTensor::new("w", Dtype::F32, &[2], &[1f32, 2.0])], &SaveOptions::new())?;
/// let entries = checkpoint::entries(&engine, &path)?;
/// assert_eq!((entries[0].1.name.as_str(), &entries[0].1.shape[..]), ("w", &[2][..]));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn entries(
    engine: &FileEngine,
    path: impl AsRef<Path>,
) -> Result<Vec<(PathBuf, TensorEntry)>, CheckpointError> {
    let c = open_checkpoint(engine, path.as_ref())?;
    select(&c.headers, &Select::All, &c.name_path)?;
    Ok(c.headers
        .into_iter()
        .flat_map(|h| {
            let p = h.path;
            h.tensors.into_iter().map(move |t| (p.clone(), t))
        })
        .collect())
}

/// A checkpoint's files, opened, with their headers read and checked.
pub(super) struct Opened {
    /// The files (one, or the shards an index names).
    pub files: Vec<FileHandle>,
    /// Their headers.
    pub headers: Vec<Header>,
    /// The index's `metadata` strings (empty for a single file).
    pub metadata: BTreeMap<String, String>,
    /// The path errors name: the file, or the index.
    pub name_path: PathBuf,
}

/// The file a checkpoint's path names: a folder's `model.safetensors.index.json`, else the
/// one `*.safetensors.index.json` in it, else its `model.safetensors`, else the one
/// `*.safetensors` file in it (as Hugging Face lays a model's folder out); any other path as
/// it is. A folder holding none of these, or several indexes (or, without an index, several
/// safetensors files and no `model.safetensors`), is [`CheckpointError::Index`] naming the
/// folder and what it holds. [`load`](fn@load), [`load_into`](super::load_into) and
/// [`entries`] resolve their path with it.
///
/// ```
/// use ferry::checkpoint;
/// let dir = std::env::temp_dir().join(format!("ferry-doc-resolve-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// std::fs::write(dir.join("model.safetensors.index.json"), "{}")?;
/// assert_eq!(checkpoint::resolve(&dir)?, dir.join("model.safetensors.index.json"));
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn resolve(path: impl AsRef<Path>) -> Result<PathBuf, CheckpointError> {
    let path = path.as_ref();
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let bad = |msg: String| CheckpointError::Index {
        path: path.to_path_buf(),
        msg,
    };
    let listed =
        std::fs::read_dir(path).map_err(|e| bad(format!("the folder cannot be listed: {e}")))?;
    let (mut indexes, mut files) = (Vec::new(), Vec::new());
    for entry in listed {
        let entry = entry.map_err(|e| bad(format!("the folder cannot be listed: {e}")))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !entry.path().is_file() {
            continue;
        }
        if name.ends_with(".safetensors.index.json") {
            indexes.push(name);
        } else if name.ends_with(".safetensors") {
            files.push(name);
        }
    }
    indexes.sort();
    files.sort();
    let pick = |list: &[String],
                preferred: &str,
                what: &str|
     -> Result<Option<PathBuf>, CheckpointError> {
        match list {
            [] => Ok(None),
            _ if list.iter().any(|n| n == preferred) => Ok(Some(path.join(preferred))),
            [one] => Ok(Some(path.join(one))),
            many => Err(bad(format!(
                "the folder holds {} {what} ({}) and no {preferred}: name the one to load",
                many.len(),
                many.join(", ")
            ))),
        }
    };
    if let Some(p) = pick(&indexes, "model.safetensors.index.json", "indexes")? {
        return Ok(p);
    }
    if let Some(p) = pick(&files, "model.safetensors", "safetensors files")? {
        return Ok(p);
    }
    Err(bad(
        "the folder holds no checkpoint (no *.safetensors.index.json, no *.safetensors file)"
            .into(),
    ))
}

/// Opens the checkpoint at `path` (a safetensors file, an index when it ends in `.json`, or
/// a folder: [`resolve`]) and reads its headers.
pub(super) fn open_checkpoint(engine: &FileEngine, path: &Path) -> Result<Opened, CheckpointError> {
    let resolved = resolve(path)?;
    let path = resolved.as_path();
    if path.extension().is_some_and(|e| e == "json") {
        return open_index(engine, path);
    }
    let files = vec![open(engine, path)?];
    let headers = vec![read_header(engine, &files[0])?];
    Ok(Opened {
        files,
        headers,
        metadata: BTreeMap::new(),
        name_path: path.to_path_buf(),
    })
}

/// The largest sharded checkpoint index (`*.safetensors.index.json`) read, in bytes: as the
/// format's limit on a header, 100,000,000 (the index of a checkpoint of hundreds of
/// thousands of tensors is a few MB). A larger one is [`CheckpointError::Index`], refused
/// before it is read: it was read whole into memory, however large.
pub const MAX_INDEX_BYTES: u64 = 100_000_000;

/// Opens the shards an index names, checked against it, and reads their headers.
fn open_index(engine: &FileEngine, index: &Path) -> Result<Opened, CheckpointError> {
    let bad = |msg: String| CheckpointError::Index {
        path: index.to_path_buf(),
        msg,
    };
    let handle = open(engine, index)?;
    let len = handle
        .len()
        .map_err(|source| file_err(index, None, source))?;
    if len > MAX_INDEX_BYTES {
        return Err(bad(format!(
            "{len} bytes, over the limit of {MAX_INDEX_BYTES} bytes for an index"
        )));
    }
    // Read up to the length checked: a file that grows meanwhile costs no more memory.
    let mut raw = vec![0u8; len as usize];
    let (n, _) = engine
        .load_up_to(&handle, 0, &mut raw[..])
        .map_err(|source| file_err(index, None, source))?;
    raw.truncate(n);
    let json: serde_json::Value =
        serde_json::from_slice(&raw).map_err(|e| bad(format!("not JSON: {e}")))?;
    if !json.get("weight_map").is_some_and(|m| m.is_object()) {
        return Err(bad("no \"weight_map\" object".into()));
    }
    // Read again for the names given twice, which `serde_json::Value` drops silently.
    #[derive(serde::Deserialize)]
    struct WeightMap {
        weight_map: Members,
    }
    let map = serde_json::from_slice::<WeightMap>(&raw)
        .map_err(|e| bad(format!("\"weight_map\": {e}")))?
        .weight_map;
    if let Some(name) = map.twice {
        return Err(bad(format!(
            "tensor `{name}` is listed twice in \"weight_map\""
        )));
    }
    let map = map.list;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut shards: Vec<String> = Vec::new();
    let mut wanted: Vec<(String, usize)> = Vec::with_capacity(map.len());
    for (name, shard) in &map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(format!("tensor `{name}`: the shard is not a string")))?;
        let plain = Path::new(shard)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain || shard.is_empty() {
            return Err(bad(format!(
                "tensor `{name}`: shard {shard:?} is not a path inside the index's folder"
            )));
        }
        let i = match shards.iter().position(|s| s == shard) {
            Some(i) => i,
            None => {
                shards.push(shard.to_string());
                shards.len() - 1
            }
        };
        wanted.push((name.clone(), i));
    }
    let files = shards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let shard = dir.join(s);
            engine
                .open(&shard, OpenMode::Read)
                .map_err(|source| CheckpointError::Shard {
                    index: index.to_path_buf(),
                    tensor: wanted
                        .iter()
                        .find(|w| w.1 == i)
                        .map_or_else(String::new, |w| w.0.clone()),
                    source: Box::new(source),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let headers = files
        .iter()
        .map(|f| read_header(engine, f))
        .collect::<Result<Vec<_>, _>>()?;
    for (name, i) in &wanted {
        if !headers[*i].tensors.iter().any(|t| &t.name == name) {
            return Err(bad(format!(
                "tensor `{name}` is mapped to {}, which does not hold it",
                shards[*i]
            )));
        }
    }
    let mut metadata = BTreeMap::new();
    if let Some(m) = json.get("metadata").and_then(|m| m.as_object()) {
        for (k, v) in m {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            metadata.insert(k.clone(), v);
        }
    }
    Ok(Opened {
        files,
        headers,
        metadata,
        name_path: index.to_path_buf(),
    })
}

/// Loads the tensors of one or more open safetensors files (the shards of one checkpoint:
/// a name in two of them is [`CheckpointError::Duplicate`]). Any [`FileHandle`] works,
/// including one over a test's own [`FileIo`](crate::file::FileIo).
pub fn load_files(
    engine: &FileEngine,
    files: &[FileHandle],
    opts: &LoadOptions,
) -> Result<Checkpoint, CheckpointError> {
    let headers = files
        .iter()
        .map(|f| read_header(engine, f))
        .collect::<Result<Vec<_>, _>>()?;
    let first = files
        .first()
        .map_or_else(PathBuf::new, |f| f.path().to_path_buf());
    read_tensors(engine, files, &headers, opts, &first, BTreeMap::new())
}

pub(super) fn open(engine: &FileEngine, path: &Path) -> Result<FileHandle, CheckpointError> {
    engine
        .open(path, OpenMode::Read)
        .map_err(|source| file_err(path, None, source))
}

pub(super) fn file_err(path: &Path, tensor: Option<String>, source: FileError) -> CheckpointError {
    CheckpointError::File {
        path: path.to_path_buf(),
        tensor,
        source,
    }
}

/// The tensors chosen, as (file index, entry), in file order; a name in two files is
/// [`CheckpointError::Duplicate`], a name asked for and absent [`CheckpointError::Missing`].
pub(super) fn select<'h>(
    headers: &'h [Header],
    choice: &Select,
    name_path: &Path,
) -> Result<Vec<(usize, &'h TensorEntry)>, CheckpointError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (fi, h) in headers.iter().enumerate() {
        for t in &h.tensors {
            if let Some(&other) = seen.get(t.name.as_str()) {
                return Err(CheckpointError::Duplicate {
                    tensor: t.name.clone(),
                    first: headers[other].path.clone(),
                    second: h.path.clone(),
                });
            }
            seen.insert(&t.name, fi);
        }
    }
    let all = headers
        .iter()
        .enumerate()
        .flat_map(|(fi, h)| h.tensors.iter().map(move |t| (fi, t)));
    Ok(match choice {
        Select::All => all.collect(),
        Select::Filter(f) => all.filter(|(_, t)| f(t)).collect(),
        Select::Names(names) => {
            if let Some(n) = names.iter().find(|n| !seen.contains_key(n.as_str())) {
                return Err(CheckpointError::Missing {
                    path: name_path.to_path_buf(),
                    tensor: n.clone(),
                });
            }
            let want: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
            all.filter(|(_, t)| want.contains(t.name.as_str()))
                .collect()
        }
    })
}

/// One read of a packed load: `len` bytes at `file_start` of file `file`, to `at`.
struct Run {
    file: usize,
    file_start: u64,
    len: usize,
    at: usize,
}

fn read_tensors(
    engine: &FileEngine,
    files: &[FileHandle],
    headers: &[Header],
    opts: &LoadOptions,
    name_path: &Path,
    mut metadata: BTreeMap<String, String>,
) -> Result<Checkpoint, CheckpointError> {
    let t0 = Instant::now();
    let kind = memory_kind(engine, opts.target, name_path)?;
    let align = opts.checked_align(name_path)?;
    let chosen = select(headers, &opts.select, name_path)?;
    let target = match kind {
        MemKind::Device { ordinal } => format!("cuda:{ordinal}"),
        k => k.to_string(),
    };
    let too_big = |len: u64| CheckpointError::Alloc {
        path: name_path.to_path_buf(),
        target: target.clone(),
        bytes: len,
        msg: "larger than the address space".into(),
    };
    let alloc = |len: usize| {
        TensorBuffer::new(kind, len).map_err(|msg| CheckpointError::Alloc {
            path: name_path.to_path_buf(),
            target: target.clone(),
            bytes: len as u64,
            msg,
        })
    };
    // Where each chosen tensor goes: (buffer, offset).
    let mut place: Vec<(usize, usize)> = Vec::with_capacity(chosen.len());
    let (buffers, io, reads, t1) = match opts.placement {
        Placement::Packed => {
            let mut runs: Vec<Run> = Vec::new();
            let mut cursor = 0usize;
            for &(fi, t) in &chosen {
                let len = usize::try_from(t.len()).map_err(|_| too_big(t.len()))?;
                let next = runs
                    .last_mut()
                    .filter(|r| r.file == fi && r.file_start + r.len as u64 == t.file_range.start);
                let at = match next {
                    Some(r) => {
                        r.len += len;
                        r.at + r.len - len
                    }
                    None => {
                        // Congruent to the tensor's data-section offset modulo `align`: what
                        // is aligned in the file stays aligned in memory.
                        // Overflow-free for any `align`: the padding is `rel - cursor % a`
                        // modulo `a`, without forming `rel + a`.
                        let a = align;
                        let rel =
                            ((t.file_range.start - headers[fi].data_start) % a as u64) as usize;
                        let c = cursor % a;
                        let pad = if rel >= c { rel - c } else { a - (c - rel) };
                        let at = cursor.checked_add(pad).ok_or_else(|| too_big(u64::MAX))?;
                        runs.push(Run {
                            file: fi,
                            file_start: t.file_range.start,
                            len,
                            at,
                        });
                        at
                    }
                };
                cursor = at.checked_add(len).ok_or_else(|| too_big(u64::MAX))?;
                place.push((0, at));
            }
            let mut buf = alloc(cursor)?;
            let pieces: Vec<ReadPiece<'_>> = runs
                .iter()
                .map(|r| ReadPiece {
                    file: &files[r.file],
                    offset: r.file_start,
                    at: r.at,
                    len: r.len,
                })
                .collect();
            let t1 = Instant::now();
            let io = match &opts.progress {
                None => engine.load_pieces(&mut buf, &pieces),
                Some(f) => in_batches(engine, &mut buf, &pieces, cursor as u64, &**f),
            }
            .map_err(|e| name_failure(files, headers, e))?;
            (vec![buf], io, runs.len(), t1)
        }
        Placement::PerTensor => {
            let mut bufs = Vec::with_capacity(chosen.len());
            for (i, &(_, t)) in chosen.iter().enumerate() {
                let len = usize::try_from(t.len()).map_err(|_| too_big(t.len()))?;
                bufs.push(alloc(len)?);
                place.push((i, 0));
            }
            let t1 = Instant::now();
            let mut inflight = Vec::with_capacity(bufs.len());
            let mut first_err = None;
            for (buf, &(fi, t)) in bufs.into_iter().zip(&chosen) {
                match engine.load(&files[fi], t.file_range.start, buf) {
                    Ok(x) => inflight.push(x),
                    Err(f) => {
                        first_err = Some(f.error);
                        break;
                    }
                }
            }
            let mut io = IoReport::default();
            let mut back = Vec::with_capacity(inflight.len());
            let total: u64 = chosen.iter().map(|(_, t)| t.len()).sum();
            for x in inflight {
                match x.wait() {
                    Ok((b, r)) => {
                        io.add(r);
                        if let Some(f) = &opts.progress {
                            f(io.bytes, total);
                        }
                        back.push(b);
                    }
                    Err(f) => {
                        first_err.get_or_insert(f.error);
                    }
                }
            }
            if let Some(e) = first_err {
                return Err(name_failure(files, headers, e));
            }
            let n = back.len();
            (back, io, n, t1)
        }
    };
    let seconds = t1.elapsed().as_secs_f64();
    let tensors: Vec<Tensor> = chosen
        .iter()
        .zip(&place)
        .map(|(&(fi, t), &(b, offset))| Tensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            file: headers[fi].path.clone(),
            file_range: t.file_range.clone(),
            buffer: b,
            offset,
            len: t.len() as usize,
            kind: buffers[b].raw().kind,
        })
        .collect();
    if let Some(h) = headers.first() {
        for (k, v) in &h.metadata {
            metadata.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let by_name = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), i))
        .collect();
    let report = LoadReport {
        bytes: tensors.iter().map(|t| t.len as u64).sum(),
        tensors: tensors.len(),
        files: files.len(),
        reads,
        allocations: buffers.len(),
        seconds,
        setup_seconds: (t1 - t0).as_secs_f64(),
        pinned_bytes: pinned_used(engine, &io)
            + buffers
                .iter()
                .filter(|b| matches!(b, TensorBuffer::Pinned(_)))
                .map(|b| b.raw().len as u64)
                .sum::<u64>(),
        io,
        peak_rss_bytes: LoadReport::process_peak_rss(),
    };
    Ok(Checkpoint {
        tensors,
        by_name,
        buffers,
        metadata,
        report,
    })
}

/// Pinned staging memory a transfer reported by `io` used: the file engine's bounce ring
/// where the bytes went through it pinned.
pub(super) fn pinned_used(engine: &FileEngine, io: &IoReport) -> u64 {
    match io.bounce {
        Some(MemKind::Pinned) => engine.pinned_bytes(),
        _ => 0,
    }
}

/// The memory a load to `target` allocates: for [`Target::Device`], the GPU of the engine the
/// file engine was given ([`FileEngine::with_engine`]), the one that moves the bytes there;
/// [`CheckpointError::NoDevice`] when it has none.
fn memory_kind(
    engine: &FileEngine,
    target: Target,
    path: &Path,
) -> Result<MemKind, CheckpointError> {
    let why = match (target, engine.mover()) {
        (Target::Pinned, _) => return Ok(MemKind::Pinned),
        (Target::Pageable, _) => return Ok(MemKind::Pageable),
        (Target::Device, Some(m)) => match m.home() {
            Some(k @ MemKind::Device { .. }) => return Ok(k),
            _ => format!(
                "the file engine's engine `{}` is not one GPU's: give FileEngine::with_engine \
                 the CudaEngine of the GPU to load to",
                m.name()
            ),
        },
        (Target::Device, None) => {
            "the file engine has no CUDA engine: make it with \
                                   FileEngine::with_engine and the CudaEngine of the GPU to load to"
                .to_string()
        }
    };
    Err(CheckpointError::NoDevice {
        path: path.to_path_buf(),
        why,
    })
}

/// A packed load in about 32 batches of pieces (long runs split), `progress` called after
/// each.
fn in_batches(
    engine: &FileEngine,
    buf: &mut TensorBuffer,
    pieces: &[ReadPiece<'_>],
    total: u64,
    progress: &(dyn Fn(u64, u64) + Send + Sync),
) -> Result<IoReport, FileError> {
    let batch = (total / 32).max(64 << 20) as usize;
    let mut io = IoReport::default();
    let mut cur: Vec<ReadPiece<'_>> = Vec::new();
    let mut cur_bytes = 0usize;
    let mut flush = |cur: &mut Vec<ReadPiece<'_>>, io: &mut IoReport| -> Result<(), FileError> {
        if !cur.is_empty() {
            io.add(engine.load_pieces(buf, cur)?);
            cur.clear();
            progress(io.bytes, total);
        }
        Ok(())
    };
    for p in pieces {
        let mut p = *p;
        loop {
            let take = p.len.min(batch - cur_bytes);
            cur.push(ReadPiece { len: take, ..p });
            cur_bytes += take;
            if cur_bytes == batch {
                flush(&mut cur, &mut io)?;
                cur_bytes = 0;
            }
            if take == p.len {
                break;
            }
            p = ReadPiece {
                offset: p.offset + take as u64,
                at: p.at + take,
                len: p.len - take,
                ..p
            };
        }
    }
    flush(&mut cur, &mut io)?;
    Ok(io)
}

/// The failed read's error, with the file it was reading and the tensor whose bytes lie at
/// the failed offset.
pub(super) fn name_failure(
    files: &[FileHandle],
    headers: &[Header],
    e: FileError,
) -> CheckpointError {
    let at = match &e {
        FileError::Io { path, offset, .. }
        | FileError::OutOfRange { path, offset, .. }
        | FileError::UnexpectedEof { path, offset, .. }
        | FileError::Transfer { path, offset, .. }
        | FileError::Panicked { path, offset, .. } => Some((path.clone(), *offset)),
        _ => None,
    };
    let Some((path, offset)) = at else {
        let path = files
            .first()
            .map_or_else(PathBuf::new, |f| f.path().to_path_buf());
        return file_err(&path, None, e);
    };
    let tensor = files
        .iter()
        .position(|f| f.path() == path)
        .and_then(|i| headers[i].tensor_at(offset))
        .map(|t| t.name.clone());
    file_err(&path, tensor, e)
}
