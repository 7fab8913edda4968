//! Loading into memory the caller already has: each tensor into its own destination (a
//! model's parameters, the buffers of an earlier per-tensor load), with no allocation.

use super::error::CheckpointError;
use super::header::read_header;
use super::header::TensorEntry;
use super::load::{name_failure, open_checkpoint, pinned_used, select, Opened};
use super::loaded::LoadReport;
use super::options::Select;
use crate::file::{FileEngine, FileHandle, IoOp, ReadInto};
use crate::memory::{first_overlap, MemoryMut, RawBuf};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::path::Path;
use std::time::Instant;

/// Where [`load_into`] puts one tensor: memory the caller owns (host or device, any memory
/// the file engine reaches), holding exactly the tensor's bytes, and optionally the dtype and
/// shape it expects (checked against the header before anything is read).
///
/// ```
/// use ferry::checkpoint::{Dest, Dtype};
/// let mut w = vec![0f32; 6];
/// let d = Dest::new("w", &mut w).dtype(Dtype::F32).shape(&[2, 3]);
/// assert_eq!(d.name, "w");
/// ```
pub struct Dest<'a> {
    /// The tensor's name.
    pub name: String,
    /// The dtype the caller expects, if any.
    pub dtype: Option<Dtype>,
    /// The shape the caller expects, if any.
    pub shape: Option<Vec<usize>>,
    memory: RawBuf,
    _memory: PhantomData<&'a mut [u8]>,
}

impl std::fmt::Debug for Dest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dest")
            .field("name", &self.name)
            .field("memory", &self.memory)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

impl<'a> Dest<'a> {
    /// Tensor `name` into `memory` (any memory the file engine reaches: a slice, a `Vec`, a
    /// device or pinned buffer), mutably borrowed as long as the `Dest` lives; dtype and shape
    /// unchecked (the byte count always is).
    pub fn new<M: MemoryMut + ?Sized>(name: impl Into<String>, memory: &'a mut M) -> Dest<'a> {
        Dest {
            name: name.into(),
            dtype: None,
            shape: None,
            memory: memory.raw_mut(),
            _memory: PhantomData,
        }
    }
    /// Expects this dtype.
    pub fn dtype(mut self, dtype: Dtype) -> Dest<'a> {
        self.dtype = Some(dtype);
        self
    }
    /// Expects this shape.
    pub fn shape(mut self, shape: &[usize]) -> Dest<'a> {
        self.shape = Some(shape.to_vec());
        self
    }
    /// Bytes of its memory.
    pub fn len(&self) -> usize {
        self.memory.len
    }
    /// True when its memory holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }
}

/// Loads the named tensors of the checkpoint at `path` (a safetensors file, a sharded
/// checkpoint's `*.safetensors.index.json`, or a checkpoint's folder:
/// [`resolve`](super::resolve)) into the caller's memory, one destination per
/// tensor, all reads in flight at once on the file engine's workers; returns when every byte
/// is in place. Nothing is allocated for the tensors (`allocations` is 0 in the report).
///
/// Every destination is checked before a byte is read, so these errors leave all of them
/// untouched: a name not in the checkpoint ([`CheckpointError::Missing`]); a name given
/// twice, two destinations over the same bytes, a destination whose byte count differs from
/// the tensor's, or a dtype or shape other than the one asked for
/// ([`CheckpointError::Destination`]); memory the file engine
/// cannot reach (device memory without [`FileEngine::with_engine`]: a
/// [`CheckpointError::File`] naming the tensor); and every header error of
/// [`load`](fn@super::load). A read that fails ([`CheckpointError::File`], naming the
/// tensor) is returned after all reads have finished; the destinations' bytes are then
/// unspecified.
///
/// ```
/// use ferry::checkpoint::{self, Dest, Dtype, SaveOptions, SaveTensor};
/// use ferry::file::{FileConfig, FileEngine};
/// let path = std::env::temp_dir().join(format!("ferry-doc-into-{}.safetensors", std::process::id()));
/// let engine = FileEngine::new(FileConfig::new().threads(2))?;
/// let w: Vec<f32> = (0..6).map(|i| i as f32).collect();
/// checkpoint::save(&engine, &path, &[SaveTensor::new("w", Dtype::F32, &[2, 3], &w)], &SaveOptions::new())?;
///
/// let mut back = vec![0f32; 6];
/// let report = checkpoint::load_into(&engine, &path, &mut [Dest::new("w", &mut back).shape(&[2, 3])])?;
/// assert_eq!((back, report.bytes), (w, 24));
///
/// let mut short = vec![0f32; 5];
/// let e = checkpoint::load_into(&engine, &path, &mut [Dest::new("w", &mut short)]).unwrap_err();
/// assert_eq!(e.tensor(), Some("w"));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn load_into(
    engine: &FileEngine,
    path: impl AsRef<Path>,
    dests: &mut [Dest<'_>],
) -> Result<LoadReport, CheckpointError> {
    let t0 = Instant::now();
    let c = open_checkpoint(engine, path.as_ref())?;
    read_into(engine, &c, dests, t0)
}

/// [`load_into`] over open safetensors files (the shards of one checkpoint). Any
/// [`FileHandle`] works, including one over a test's own [`FileIo`](crate::file::FileIo).
pub fn load_files_into(
    engine: &FileEngine,
    files: &[FileHandle],
    dests: &mut [Dest<'_>],
) -> Result<LoadReport, CheckpointError> {
    let t0 = Instant::now();
    let headers = files
        .iter()
        .map(|f| read_header(engine, f))
        .collect::<Result<Vec<_>, _>>()?;
    let c = Opened {
        files: files.to_vec(),
        headers,
        metadata: BTreeMap::new(),
        name_path: files
            .first()
            .map_or_else(Default::default, |f| f.path().to_path_buf()),
    };
    read_into(engine, &c, dests, t0)
}

/// Checks every destination against the headers, then reads them all at once.
fn read_into(
    engine: &FileEngine,
    c: &Opened,
    dests: &mut [Dest<'_>],
    t0: Instant,
) -> Result<LoadReport, CheckpointError> {
    let path = c.name_path.as_path();
    let bad = |tensor: &str, msg: String| CheckpointError::Destination {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        msg,
    };
    let mut seen = HashMap::with_capacity(dests.len());
    for d in dests.iter() {
        if seen.insert(d.name.as_str(), ()).is_some() {
            return Err(bad(&d.name, "is given twice".into()));
        }
    }
    // Disjoint destinations: safe code cannot make two `Dest`s over the same bytes, but a
    // `MemoryMut` over foreign memory (a Python array) can, and their reads would race.
    let spans: Vec<_> = dests
        .iter()
        .map(|d| d.memory.addr..d.memory.addr + d.memory.len as u64)
        .collect();
    if let Some((a, b)) = first_overlap(&spans) {
        return Err(bad(
            &dests[b].name,
            format!(
                "and tensor `{}`'s share memory (the same memory twice, overlapping views, or tied weights): their reads would race",
                dests[a].name
            ),
        ));
    }
    let names = Select::Names(dests.iter().map(|d| d.name.clone()).collect());
    let chosen = select(&c.headers, &names, path)?;
    let by_name: HashMap<&str, (usize, &TensorEntry)> = chosen
        .iter()
        .map(|&(fi, t)| (t.name.as_str(), (fi, t)))
        .collect();
    let mut pieces = Vec::with_capacity(dests.len());
    let mut bytes = 0u64;
    for d in dests {
        // Present: `select` returned Missing otherwise.
        let Some(&(fi, t)) = by_name.get(d.name.as_str()) else {
            return Err(CheckpointError::Missing {
                path: path.to_path_buf(),
                tensor: d.name.clone(),
            });
        };
        if let Some(want) = d.dtype.filter(|&w| w != t.dtype) {
            return Err(bad(
                &d.name,
                format!("expects {want:?}, the tensor is {:?}", t.dtype),
            ));
        }
        if let Some(want) = d.shape.as_ref().filter(|&w| w != &t.shape) {
            return Err(bad(
                &d.name,
                format!("expects shape {want:?}, the tensor's is {:?}", t.shape),
            ));
        }
        let have = d.len() as u64;
        if have != t.len() {
            return Err(bad(
                &d.name,
                format!(
                    "holds {have} bytes, the tensor {} ({:?} {:?})",
                    t.len(),
                    t.dtype,
                    t.shape
                ),
            ));
        }
        // Memory the engine cannot reach is refused here, before any read is submitted.
        if !d.is_empty() {
            engine
                .check_reach(d.memory.kind, IoOp::Read)
                .map_err(|source| CheckpointError::File {
                    path: c.headers[fi].path.clone(),
                    tensor: Some(d.name.clone()),
                    source,
                })?;
        }
        bytes += t.len();
        // SAFETY: `d` holds its memory's exclusive borrow for longer than `pieces` lives
        // (`Dest::new` took `&mut`; a `Dest` is not `Clone`), and `dests` is borrowed
        // mutably for this call: no other call writes through it meanwhile.
        pieces.push(unsafe { ReadInto::from_raw(&c.files[fi], t.file_range.start, d.memory) });
    }
    let t1 = Instant::now();
    let io = engine
        .load_each(&mut pieces)
        .map_err(|e| name_failure(&c.files, &c.headers, e))?;
    Ok(LoadReport {
        bytes,
        tensors: pieces.len(),
        files: c.files.len(),
        reads: pieces.iter().filter(|p| !p.is_empty()).count(),
        allocations: 0,
        seconds: t1.elapsed().as_secs_f64(),
        setup_seconds: (t1 - t0).as_secs_f64(),
        pinned_bytes: pinned_used(engine, &io),
        io,
        peak_rss_bytes: LoadReport::process_peak_rss(),
    })
}
