//! Writing safetensors files: one file's layout and header (as the reference writer lays it
//! out), the writer's choice (buffered, `O_DIRECT` or both: [`SaveOptions::writer`]), and the
//! writes of several files at once (buffered: their pieces interleaved and in flight
//! together, in batches between which a save may be interrupted; `O_DIRECT` and hybrid:
//! streamed through aligned windows, `stream.rs`), each file through a [`Replacement`] so
//! that a failed or interrupted save leaves every destination as it was.

use super::error::CheckpointError;
use super::header::tensor_bytes;
use super::options::{SaveOptions, SaveTensor, Writer};
use crate::file::{FileEngine, FileError, FileHandle, IoReport, OpenMode, Replacement, WritePiece};
use crate::memory::{Memory, Region};
use safetensors::tensor::{Metadata, TensorInfo};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bytes one batch of a save writes (all of its pieces in flight together) before the
/// interrupt is asked again.
pub(super) const BATCH_BYTES: usize = 256 << 20;

/// The largest piece a tensor is cut into: several per batch, so that one large tensor
/// keeps every writer busy and batches stay near [`BATCH_BYTES`].
pub(super) const CHUNK_BYTES: usize = 64 << 20;

/// One safetensors file to write: its destination, header and tensors in file order.
pub(super) struct Planned<'t, 'a> {
    /// The destination.
    pub path: PathBuf,
    /// The 8-byte length and the padded JSON header.
    pub head: Vec<u8>,
    /// The tensors, in the order their bytes follow the header.
    pub order: Vec<&'t SaveTensor<'a>>,
    /// Bytes of tensor data.
    pub data_len: u64,
}

impl Planned<'_, '_> {
    /// Bytes of the whole file.
    pub fn bytes(&self) -> u64 {
        self.head.len() as u64 + self.data_len
    }
}

/// Lays out `tensors` as the reference writer does (by dtype alignment, then name; header
/// padded to 8 bytes) for a file at `path`. Errors: a tensor whose bytes do not match its
/// dtype x shape, a name given twice, a header the format refuses.
pub(super) fn plan<'t, 'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = &'t SaveTensor<'a>>,
    metadata: &BTreeMap<String, String>,
) -> Result<Planned<'t, 'a>, CheckpointError>
where
    'a: 't,
{
    let mut order: Vec<&SaveTensor<'_>> = tensors.into_iter().collect();
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
        check_tensor(path, t)?;
        let len = t.data.raw().len;
        let info = TensorInfo {
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            data_offsets: (offset, offset + len),
        };
        entries.push((t.name.to_string(), info));
        offset += len;
    }
    let meta = (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    let header_err = |msg: String| CheckpointError::Header {
        path: path.to_path_buf(),
        msg,
    };
    let metadata = Metadata::new(meta, entries).map_err(|e| header_err(e.to_string()))?;
    let mut header = serde_json::to_vec(&metadata).map_err(|e| header_err(e.to_string()))?;
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut head = (header.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(&header);
    Ok(Planned {
        path: path.to_path_buf(),
        head,
        order,
        data_len: offset as u64,
    })
}

/// Refuses a tensor whose bytes do not match its dtype x shape.
pub(super) fn check_tensor(path: &Path, t: &SaveTensor<'_>) -> Result<(), CheckpointError> {
    let len = t.data.raw().len;
    if tensor_bytes(t.dtype, t.shape) == Some(len as u64) {
        return Ok(());
    }
    Err(CheckpointError::BadTensor {
        path: path.to_path_buf(),
        tensor: t.name.to_string(),
        msg: format!(
            "shape {:?} of {} does not match its {len} bytes",
            t.shape, t.dtype
        ),
    })
}

/// A save's failure to put a file in place, naming the step.
pub(super) fn replace_err(path: &Path, e: &std::io::Error, step: &str) -> CheckpointError {
    CheckpointError::Replace {
        path: path.to_path_buf(),
        step: step.to_string(),
        kind: e.kind(),
        msg: e.to_string(),
    }
}

/// The smallest save [`Writer::Auto`] writes with `O_DIRECT`: below it the windows' setup and
/// the preallocation cost more than the page cache's second copy.
pub(super) const AUTO_DIRECT_MIN: u64 = 64 << 20;

/// Each of the `O_DIRECT` writer's two windows.
pub(super) const DIRECT_WINDOW: usize = 64 << 20;

/// The least room in the page cache worth a buffered share beside the `O_DIRECT` windows:
/// two windows.
pub(super) const MIN_SHARE: u64 = 2 * DIRECT_WINDOW as u64;

/// The writer a save of `bytes` uses when `asked` (before the file system has its say), why,
/// in words, and for [`Writer::Hybrid`] the most bytes its buffered share writes.
/// `on_device`: most of the bytes are in GPU memory (the `O_DIRECT` windows are then the
/// GPU's copies, the CPUs free for the buffered share). `room` is the page cache's room before
/// writeback and why (`dirty::room_now`), `None` where it is not known or a buffered share
/// may not read the tensors beside the windows (a streamed snapshot, whose tensors may change
/// once copied). Auto: buffered under [`AUTO_DIRECT_MIN`] (below it the windows' setup and the
/// preallocation cost more than the page cache's second copy); `O_DIRECT` when fsynced (every
/// byte goes to the disk) or from host memory; else hybrid. Hybrid (asked, or Auto's): its
/// share 90% of the room (other writers dirty pages too), `O_DIRECT` alone without
/// [`MIN_SHARE`] of it. Measured: `SaveOptions::writer`'s documentation.
pub(super) fn choose_writer(
    asked: Writer,
    fsync: bool,
    bytes: u64,
    on_device: bool,
    room: Option<(u64, String)>,
) -> (Writer, String, u64) {
    let hybrid = |why: String| match room {
        Some((room, figures)) if room / 10 * 9 >= MIN_SHARE => {
            let share = room / 10 * 9;
            (
                Writer::Hybrid,
                format!(
                    "{why}: O_DIRECT from the end beside buffered writes from the start, at most \
                     {} MiB of them ({figures})",
                    share >> 20
                ),
                share,
            )
        }
        Some((room, figures)) => (
            Writer::Direct,
            format!(
                "{why}: O_DIRECT alone, {} MiB of room in the page cache before writeback \
                 ({figures})",
                room >> 20
            ),
            0,
        ),
        None => (
            Writer::Direct,
            format!("{why}: O_DIRECT alone, no room in the page cache known to write beside it"),
            0,
        ),
    };
    match asked {
        Writer::Buffered | Writer::Direct => (asked, "asked".into(), 0),
        Writer::Hybrid => hybrid("asked".into()),
        Writer::Auto if bytes < AUTO_DIRECT_MIN => (
            Writer::Buffered,
            format!("auto: {bytes} bytes, under the 64 MiB worth writing O_DIRECT"),
            0,
        ),
        Writer::Auto if fsync => (
            Writer::Direct,
            format!(
                "auto: {bytes} bytes, fsync asked: every byte goes to the disk, O_DIRECT skips \
                 the page cache's copy"
            ),
            0,
        ),
        Writer::Auto if !on_device => (
            Writer::Direct,
            format!(
                "auto: {bytes} bytes, mostly in host memory: O_DIRECT skips the page cache \
                 (buffered writes beside it would take the same CPUs as its copies)"
            ),
            0,
        ),
        Writer::Auto => hybrid(format!("auto: {bytes} bytes from a GPU")),
    }
}

/// A save's files, open for the writer that will write them.
pub(super) struct Target {
    /// The files.
    pub open: Opened,
    /// Buffered, `O_DIRECT`, or both.
    pub writer: Writer,
    /// Why that writer.
    pub note: String,
    /// The most bytes the hybrid writer's buffered share writes (0 for the others).
    pub share: u64,
    /// The engine that writes `O_DIRECT` ([`FileConfig::direct`](crate::file::FileConfig::direct)
    /// on, otherwise `engine`'s settings); `None` for the buffered writer.
    pub direct: Option<FileEngine>,
}

/// Opens the temporary files of a save of `bytes` for the writer [`choose_writer`] picks
/// (`share_ok`: a buffered share may read the tensors beside the windows; a streamed
/// snapshot's may change once copied): `O_DIRECT` ones preallocated to their size; a file
/// system that refuses `O_DIRECT` gets the buffered writer, the reason in the note.
pub(super) fn open_for(
    engine: &FileEngine,
    files: &[Planned<'_, '_>],
    extra: &[(PathBuf, Vec<u8>)],
    opts: &SaveOptions,
    bytes: u64,
    share_ok: bool,
) -> Result<Target, CheckpointError> {
    let room = share_ok.then(super::dirty::room_now).flatten();
    let on_device: u64 = files
        .iter()
        .flat_map(|f| &f.order)
        .filter(|t| matches!(t.data.raw().kind, crate::memory::MemKind::Device { .. }))
        .map(|t| t.data.raw().len as u64)
        .sum();
    let (writer, note, share) =
        choose_writer(opts.writer, opts.fsync, bytes, 2 * on_device >= bytes, room);
    let first = files.first().map_or(Path::new(""), |f| f.path.as_path());
    if writer == Writer::Buffered {
        return Ok(Target {
            open: Opened::new(engine, files, extra)?,
            writer,
            note,
            share,
            direct: None,
        });
    }
    let direct =
        FileEngine::new(engine.config().direct(true)).map_err(|e| file_err(first, None, e))?;
    let open = Opened::new(&direct, files, extra)?;
    if let Some(why) = open.handles.iter().find_map(|h| h.direct().err()) {
        return Ok(Target {
            open,
            writer: Writer::Buffered,
            note: format!("{note}, but {why}"),
            share: 0,
            direct: None,
        });
    }
    let mut note = note;
    for (f, h) in files.iter().zip(&open.handles) {
        match crate::file::preallocate(h.path(), f.bytes()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                return Err(replace_err(&f.path, &e, "preallocating the file"))
            }
            Err(e) => {
                note = format!("{note}; not preallocated: {e}");
                break;
            }
        }
    }
    Ok(Target {
        open,
        writer,
        note,
        share,
        direct: Some(direct),
    })
}

/// A save's files, open: each planned file's temporary file (open for writing) and the
/// `extra` files' (written by [`Opened::finish`]). Dropped before `finish`, every temporary
/// file is removed and no destination touched.
pub(super) struct Opened {
    /// The planned files' temporary files, open (closed before the renames).
    pub handles: Vec<FileHandle>,
    /// The planned files' destinations.
    pub paths: Vec<PathBuf>,
    reps: Vec<Replacement>,
    extra: Vec<(PathBuf, Vec<u8>)>,
    extra_reps: Vec<Replacement>,
}

impl Opened {
    /// Prepares a temporary file beside each destination and opens the planned ones.
    pub fn new(
        engine: &FileEngine,
        files: &[Planned<'_, '_>],
        extra: &[(PathBuf, Vec<u8>)],
    ) -> Result<Opened, CheckpointError> {
        let mut reps = Vec::with_capacity(files.len());
        for f in files {
            reps.push(
                Replacement::new(&f.path)
                    .map_err(|e| replace_err(&f.path, &e, "preparing the file"))?,
            );
        }
        let mut extra_reps = Vec::with_capacity(extra.len());
        for (path, _) in extra {
            extra_reps.push(
                Replacement::new(path).map_err(|e| replace_err(path, &e, "preparing the file"))?,
            );
        }
        let handles = files
            .iter()
            .zip(&reps)
            .map(|(f, r)| {
                engine
                    .open(r.temp_path(), OpenMode::Create)
                    .map_err(|e| file_err(&f.path, None, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Opened {
            handles,
            paths: files.iter().map(|f| f.path.clone()).collect(),
            reps,
            extra: extra.to_vec(),
            extra_reps,
        })
    }

    /// Once every planned file is written: syncs them (when asked), writes the extra files
    /// and renames every file into place, the extra ones last.
    pub fn finish(self, opts: &SaveOptions) -> Result<(), CheckpointError> {
        let Opened {
            handles,
            paths,
            reps,
            extra,
            extra_reps,
        } = self;
        interrupted(&paths, opts)?;
        if opts.fsync {
            for (p, h) in paths.iter().zip(&handles) {
                h.sync().map_err(|e| file_err(p, None, e))?;
            }
        }
        drop(handles);
        for ((path, bytes), r) in extra.iter().zip(&extra_reps) {
            write_small(r.temp_path(), bytes, opts.fsync)
                .map_err(|e| replace_err(path, &e, "writing the file"))?;
        }
        interrupted(&paths, opts)?;
        for (p, r) in paths.iter().zip(reps) {
            r.commit(opts.fsync)
                .map_err(|e| replace_err(p, &e, "the rename into place"))?;
        }
        for ((path, _), r) in extra.iter().zip(extra_reps) {
            r.commit(opts.fsync)
                .map_err(|e| replace_err(path, &e, "the rename into place"))?;
        }
        Ok(())
    }
}

fn write_small(path: &Path, bytes: &[u8], fsync: bool) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(bytes)?;
    if fsync {
        f.sync_all()?;
    }
    Ok(())
}

/// [`CheckpointError::Interrupted`] (naming the first file) when the interrupt says stop.
fn interrupted(paths: &[PathBuf], opts: &SaveOptions) -> Result<(), CheckpointError> {
    match &opts.interrupt {
        Some(stop) if stop() => Err(CheckpointError::Interrupted {
            path: paths.first().cloned().unwrap_or_default(),
        }),
        _ => Ok(()),
    }
}

fn file_err(path: &Path, tensor: Option<String>, source: FileError) -> CheckpointError {
    CheckpointError::File {
        path: path.to_path_buf(),
        tensor,
        source,
    }
}

/// Every file's header and tensors, cut into pieces of at most [`CHUNK_BYTES`], interleaved
/// across files (so that all files are written at once) and written in batches of about
/// [`BATCH_BYTES`], the interrupt asked before each.
pub(super) fn write_pieces(
    engine: &FileEngine,
    files: &[Planned<'_, '_>],
    handles: &[FileHandle],
    opts: &SaveOptions,
) -> Result<IoReport, CheckpointError> {
    // Per file, its pieces in file order; the tensors' starts, to name one in an error.
    let mut queues: Vec<std::collections::VecDeque<Piece<'_>>> = Vec::with_capacity(files.len());
    let mut starts: Vec<Vec<u64>> = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let mut q = std::collections::VecDeque::new();
        let mut s = Vec::with_capacity(f.order.len());
        let mut at = 0u64;
        let head: &dyn Memory = &f.head;
        for (k, mem) in std::iter::once(head)
            .chain(f.order.iter().map(|t| t.data))
            .enumerate()
        {
            if k > 0 {
                s.push(at);
            }
            let len = mem.raw().len;
            let mut done = 0;
            while done < len {
                let n = CHUNK_BYTES.min(len - done);
                let data = Region::of(mem, done..done + n).expect("a chunk lies inside its tensor");
                q.push_back(Piece {
                    file: i,
                    offset: at + done as u64,
                    data,
                });
                done += n;
            }
            at += len as u64;
        }
        queues.push(q);
        starts.push(s);
    }
    let paths: Vec<PathBuf> = files.iter().map(|f| f.path.clone()).collect();
    store_batches(engine, handles, &paths, queues, opts, |i, o| {
        let t = starts[i].partition_point(|&s| s <= o);
        (t > 0).then(|| files[i].order[t - 1].name.to_string())
    })
}

/// One piece to write to file `file` (an index into the files of a save) at `offset`.
pub(super) struct Piece<'m> {
    pub file: usize,
    pub offset: u64,
    pub data: Region<'m>,
}

/// Writes `queues` (per file, its pieces in file order), interleaved across files in
/// batches of about [`BATCH_BYTES`], the interrupt asked before each; an error names the
/// file and the tensor `name(file, offset)` gives.
pub(super) fn store_batches(
    engine: &FileEngine,
    handles: &[FileHandle],
    paths: &[PathBuf],
    mut queues: Vec<std::collections::VecDeque<Piece<'_>>>,
    opts: &SaveOptions,
    name: impl Fn(usize, u64) -> Option<String>,
) -> Result<IoReport, CheckpointError> {
    let mut total = IoReport::default();
    loop {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while bytes < BATCH_BYTES {
            let before = batch.len();
            for q in queues.iter_mut() {
                if let Some(p) = q.pop_front() {
                    bytes += p.data.raw().len;
                    batch.push(p);
                }
            }
            if batch.len() == before {
                break;
            }
        }
        if batch.is_empty() {
            return Ok(total);
        }
        interrupted(paths, opts)?;
        let pieces: Vec<WritePiece<'_>> = batch
            .iter()
            .map(|p| WritePiece {
                file: &handles[p.file],
                offset: p.offset,
                data: &p.data,
            })
            .collect();
        let r = engine.store_pieces(&pieces).map_err(|e| {
            let (path, off) = match &e {
                FileError::Io { path, offset, .. } => (Some(path.clone()), Some(*offset)),
                FileError::Transfer { offset, .. } => (None, Some(*offset)),
                _ => (None, None),
            };
            let i = path
                .and_then(|p| handles.iter().position(|h| h.path() == p))
                .unwrap_or(batch[0].file);
            file_err(&paths[i], off.and_then(|o| name(i, o)), e)
        })?;
        total.add(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_buffered_o_direct_or_both_by_size_fsync_memory_and_room() {
        let big = AUTO_DIRECT_MIN;
        let room = |bytes: u64| Some((bytes, "figures".to_string()));
        for (fsync, dev) in [(false, true), (true, false)] {
            let (w, why, _) = choose_writer(Writer::Auto, fsync, big - 1, dev, room(1 << 40));
            assert_eq!(w, Writer::Buffered);
            assert!(why.contains("64 MiB"), "{why}");
        }
        // Fsynced: O_DIRECT whatever the room.
        let (w, why, share) = choose_writer(Writer::Auto, true, 5 * big, true, room(1 << 40));
        assert_eq!((w, share), (Writer::Direct, 0));
        assert!(why.contains("fsync asked"), "{why}");
        // From host memory: O_DIRECT.
        let (w, why, share) = choose_writer(Writer::Auto, false, big, false, room(1 << 40));
        assert_eq!((w, share), (Writer::Direct, 0));
        assert!(why.contains("host memory"), "{why}");
        // From a GPU, not fsynced: both, the share 90% of the room, its figures in the note...
        let (w, why, share) = choose_writer(Writer::Auto, false, big, true, room(10 << 30));
        assert_eq!((w, share), (Writer::Hybrid, 9 << 30));
        assert!(
            why.contains("9216 MiB") && why.contains("(figures)"),
            "{why}"
        );
        // ...unless 90% of the room is under two windows, or the room is not known.
        let (w, why, share) = choose_writer(Writer::Auto, false, big, true, room(MIN_SHARE));
        assert_eq!((w, share), (Writer::Direct, 0));
        assert!(why.contains("128 MiB of room"), "{why}");
        let r = room(MIN_SHARE / 9 * 10 + 20);
        let (w, _, share) = choose_writer(Writer::Auto, false, big, true, r);
        assert_eq!(w, Writer::Hybrid);
        assert!((MIN_SHARE..MIN_SHARE + 20).contains(&share), "{share}");
        assert_eq!(
            choose_writer(Writer::Auto, false, big, true, None).0,
            Writer::Direct
        );
        // Hybrid asked: wherever the bytes are and whatever their size, given the room.
        let (w, why, share) = choose_writer(Writer::Hybrid, true, 1, false, room(1 << 30));
        assert_eq!((w, share), (Writer::Hybrid, (1 << 30) / 10 * 9));
        assert!(why.starts_with("asked"), "{why}");
        assert_eq!(
            choose_writer(Writer::Hybrid, false, big, true, None).0,
            Writer::Direct
        );
        // Buffered or O_DIRECT asked: given, whatever the size, fsync and room.
        for (asked, fsync, bytes) in [(Writer::Direct, false, 1), (Writer::Buffered, true, big)] {
            let got = choose_writer(asked, fsync, bytes, true, room(1 << 40));
            assert_eq!(got, (asked, "asked".to_string(), 0));
        }
    }
}
