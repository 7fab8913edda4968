//! Calls built on one load or store: a whole file, "up to N bytes", and many pieces at once
//! (a scattered load into one buffer, a gathered store from many), all blocking.

use super::completion::{finish_now, result_of};
use super::engine::FileEngine;
use super::error::{FileError, IoOp};
use super::handle::FileHandle;
use super::report::IoReport;
use crate::memory::{first_overlap, AlignedBuffer, Memory, MemoryMut, RawBuf};
use crate::request::WaitOnDrop;
use std::marker::PhantomData;

/// One piece of a scattered load ([`FileEngine::load_pieces`]): `len` bytes at `offset` of
/// `file` into the buffer, `at` bytes from its start.
#[derive(Debug, Clone, Copy)]
pub struct ReadPiece<'f> {
    /// The file.
    pub file: &'f FileHandle,
    /// Byte offset in the file.
    pub offset: u64,
    /// Byte offset in the buffer.
    pub at: usize,
    /// Bytes.
    pub len: usize,
}

/// One piece of a gathered store ([`FileEngine::store_pieces`]): all of `data` at `offset` of
/// `file`.
#[derive(Clone, Copy)]
pub struct WritePiece<'a> {
    /// The file.
    pub file: &'a FileHandle,
    /// Byte offset in the file.
    pub offset: u64,
    /// The bytes (any memory the engine reaches: a slice, a device buffer, a
    /// [`Region`](crate::memory::Region) of one).
    pub data: &'a dyn Memory,
}

/// One load of [`FileEngine::load_each`]: as many bytes as `dst` holds, at `offset` of
/// `file`, into `dst` (its own buffer: a tensor the caller allocated, say), which stays
/// mutably borrowed as long as the piece lives.
pub struct ReadInto<'a> {
    file: &'a FileHandle,
    offset: u64,
    dst: RawBuf,
    _dst: PhantomData<&'a mut [u8]>,
}

impl<'a> ReadInto<'a> {
    /// `dst.len()` bytes at `offset` of `file` into `dst` (any memory the engine reaches:
    /// a slice, a `Vec`, a device or pinned buffer).
    pub fn new<M: MemoryMut + ?Sized>(file: &'a FileHandle, offset: u64, dst: &'a mut M) -> Self {
        ReadInto {
            file,
            offset,
            dst: dst.raw_mut(),
            _dst: PhantomData,
        }
    }
    /// A piece over memory the caller holds borrowed.
    ///
    /// # Safety
    /// `dst` is valid for writes and not accessed through anything else for `'a`, and no
    /// other live piece covers any of its bytes.
    pub(crate) unsafe fn from_raw(file: &'a FileHandle, offset: u64, dst: RawBuf) -> Self {
        ReadInto {
            file,
            offset,
            dst,
            _dst: PhantomData,
        }
    }
    /// Bytes it loads.
    pub fn len(&self) -> usize {
        self.dst.len
    }
    /// True when it loads nothing.
    pub fn is_empty(&self) -> bool {
        self.dst.len == 0
    }
}

impl std::fmt::Debug for ReadInto<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadInto")
            .field("file", &self.file.path())
            .field("offset", &self.offset)
            .field("dst", &self.dst)
            .finish()
    }
}

impl std::fmt::Debug for WritePiece<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WritePiece")
            .field("file", &self.file.path())
            .field("offset", &self.offset)
            .field("data", &self.data.raw())
            .finish()
    }
}

impl FileEngine {
    /// The whole file, read into a new page-aligned host buffer (its length read once, at
    /// the start: a file that shrinks during the read fails it with
    /// [`FileError::UnexpectedEof`]).
    ///
    /// ```
    /// use ferry::file::{FileConfig, FileEngine, OpenMode};
    /// let path = std::env::temp_dir().join(format!("ferry-doc-all-{}", std::process::id()));
    /// std::fs::write(&path, b"all of it")?;
    /// let engine = FileEngine::new(FileConfig::new().threads(2))?;
    /// let (bytes, report) = engine.read_all(&engine.open(&path, OpenMode::Read)?)?;
    /// assert_eq!(&bytes[..], b"all of it");
    /// assert_eq!(report.bytes, 9);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_all(&self, file: &FileHandle) -> Result<(AlignedBuffer, IoReport), FileError> {
        let len = file.len()?;
        let len = usize::try_from(len)
            .map_err(|_| FileError::BadRange(format!("{len} bytes do not fit in memory")))?;
        let mut buf = AlignedBuffer::new(len).map_err(|e| FileError::Setup(e.to_string()))?;
        let report = self.load_into(file, 0, &mut buf)?;
        Ok((buf, report))
    }

    /// Loads up to `buf.len()` bytes at `offset` into the start of `buf` and returns how many
    /// it loaded with the report: fewer where the file ends first, 0 at or past its end (as
    /// `pread` and KvikIO's `pread` count). The count is settled from the file's length at
    /// the call; a file that shrinks below it while loading fails the call.
    ///
    /// ```
    /// use ferry::file::{FileConfig, FileEngine, OpenMode};
    /// let path = std::env::temp_dir().join(format!("ferry-doc-upto-{}", std::process::id()));
    /// std::fs::write(&path, [1u8; 100])?;
    /// let engine = FileEngine::new(FileConfig::new().threads(2))?;
    /// let file = engine.open(&path, OpenMode::Read)?;
    /// let mut buf = vec![0u8; 64];
    /// assert_eq!(engine.load_up_to(&file, 60, &mut buf)?.0, 40);
    /// assert_eq!(engine.load_up_to(&file, 200, &mut buf)?.0, 0);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_up_to<B: MemoryMut + ?Sized>(
        &self,
        file: &FileHandle,
        offset: u64,
        buf: &mut B,
    ) -> Result<(usize, IoReport), FileError> {
        let mut raw = buf.raw_mut();
        let left = file.len()?.saturating_sub(offset);
        raw.len = raw.len.min(usize::try_from(left).unwrap_or(usize::MAX));
        // SAFETY: `raw` is a prefix of the mutably borrowed `buf`; `finish_now` waits before
        // the borrow ends.
        let (req, x) = unsafe { self.submit(file, offset, raw, IoOp::Read)? };
        let n = raw.len;
        finish_now(req, &x).map(|r| (n, r))
    }

    /// Loads every piece into `buf` at once (the pieces run in parallel on the workers,
    /// each split as a single load is) and returns when all are done, with one report over
    /// all of them. Pieces must lie inside `buf` and not overlap there
    /// ([`FileError::BadRange`] otherwise, before anything is read). The first failure is
    /// returned, after every piece submitted has finished; the buffer's bytes are then
    /// unspecified.
    ///
    /// ```
    /// use ferry::file::{FileConfig, FileEngine, OpenMode, ReadPiece};
    /// let path = std::env::temp_dir().join(format!("ferry-doc-pieces-{}", std::process::id()));
    /// std::fs::write(&path, b"0123456789")?;
    /// let engine = FileEngine::new(FileConfig::new().threads(2))?;
    /// let file = engine.open(&path, OpenMode::Read)?;
    /// let mut buf = [0u8; 4];
    /// let p = |offset, at| ReadPiece { file: &file, offset, at, len: 2 };
    /// engine.load_pieces(&mut buf, &[p(8, 0), p(0, 2)])?;
    /// assert_eq!(&buf, b"8901");
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_pieces<B: MemoryMut + ?Sized>(
        &self,
        buf: &mut B,
        pieces: &[ReadPiece<'_>],
    ) -> Result<IoReport, FileError> {
        let whole = buf.raw_mut();
        let mut spans = Vec::with_capacity(pieces.len());
        for p in pieces {
            match p.at.checked_add(p.len) {
                Some(end) if end <= whole.len => spans.push(p.at as u64..end as u64),
                _ => {
                    return Err(FileError::BadRange(format!(
                        "a piece of {} bytes at {} does not fit a buffer of {}",
                        p.len, p.at, whole.len
                    )))
                }
            }
        }
        if let Some((a, b)) = first_overlap(&spans) {
            return Err(FileError::BadRange(format!(
                "pieces overlap in the buffer: {:?} and {:?}",
                spans[a], spans[b]
            )));
        }
        let raws = pieces.iter().map(|p| {
            let raw = RawBuf {
                addr: whole.addr + p.at as u64,
                len: p.len,
                kind: whole.kind,
            };
            (p.file, p.offset, raw)
        });
        // SAFETY: every piece is a disjoint range inside the mutably borrowed `buf` (checked
        // above), and `run_all` waits for each before returning.
        unsafe { self.run_all(raws, IoOp::Read) }
    }

    /// Loads every piece into its own buffer at once (in parallel, as
    /// [`FileEngine::load_pieces`]) and returns when all are done, with one report over all
    /// of them. Empty buffers are skipped. A buffer the engine cannot reach is refused before
    /// any piece is read ([`FileError::Unsupported`]); any other failure is returned after
    /// every piece submitted has finished, the buffers' bytes then unspecified.
    ///
    /// ```
    /// use ferry::file::{FileConfig, FileEngine, OpenMode, ReadInto};
    /// let path = std::env::temp_dir().join(format!("ferry-doc-each-{}", std::process::id()));
    /// std::fs::write(&path, b"0123456789")?;
    /// let engine = FileEngine::new(FileConfig::new().threads(2))?;
    /// let file = engine.open(&path, OpenMode::Read)?;
    /// let (mut a, mut b) = ([0u8; 3], vec![0u8; 2]);
    /// engine.load_each(&mut [ReadInto::new(&file, 7, &mut a), ReadInto::new(&file, 0, &mut b)])?;
    /// assert_eq!((&a, &b[..]), (b"789", &b"01"[..]));
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_each(&self, pieces: &mut [ReadInto<'_>]) -> Result<IoReport, FileError> {
        let raws = pieces
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| (p.file, p.offset, p.dst));
        // SAFETY: each piece holds its buffer's exclusive borrow for as long as it lives
        // (`ReadInto::new` takes `&mut`; pieces are not `Clone`), so no two overlap and the
        // memory stays valid; `pieces` is borrowed mutably, so no other call writes through
        // them meanwhile; `run_all` waits for each before returning.
        unsafe { self.run_all(raws, IoOp::Read) }
    }

    /// Stores every piece at once (in parallel, as [`FileEngine::load_pieces`]) and returns
    /// when all are done, with one report over all of them. The first failure is returned,
    /// after every piece submitted has finished.
    pub fn store_pieces(&self, pieces: &[WritePiece<'_>]) -> Result<IoReport, FileError> {
        let raws = pieces.iter().map(|p| (p.file, p.offset, p.data.raw()));
        // SAFETY: each piece's memory is borrowed for this call and only read; `run_all`
        // waits for each before returning.
        unsafe { self.run_all(raws, IoOp::Write) }
    }

    /// Submits every transfer, then waits for all, and merges their reports.
    ///
    /// # Safety
    /// 1. Each buffer satisfies [`FileEngine::submit`]'s contract for `op` until this call
    ///    returns (it waits for every transfer it submitted, on every path).
    /// 2. For reads, no two buffers overlap.
    unsafe fn run_all<'f>(
        &self,
        raws: impl Iterator<Item = (&'f FileHandle, u64, RawBuf)>,
        op: IoOp,
    ) -> Result<IoReport, FileError> {
        let raws: Vec<_> = raws.collect();
        // Every kind of memory checked first: no buffer is refused after others were submitted.
        let mut kinds: Vec<crate::memory::MemKind> = Vec::new();
        for (_, _, raw) in &raws {
            if !kinds.contains(&raw.kind) {
                self.check_reach(raw.kind, op)?;
                kinds.push(raw.kind);
            }
        }
        // The transfers submitted, waited for before this returns or unwinds: a later submit
        // calls the next file's `FileIo` (its length), which may panic (the trait is safe to
        // implement), and the transfers already running once wrote on into freed buffers.
        let mut running = WaitOnDrop::default();
        let mut xfers = Vec::new();
        let mut first_err = None;
        for (file, offset, raw) in raws {
            // SAFETY: the caller's contract, per buffer; every submitted transfer is waited
            // for below (or by `running`'s drop) before this function returns or unwinds.
            match unsafe { self.submit(file, offset, raw, op) } {
                Ok((req, x)) => {
                    running.push(req);
                    xfers.push(x);
                }
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        // All waited for before any result is read (reading one may ask a `FileIo` again).
        drop(running);
        let mut total = IoReport::default();
        for x in xfers {
            match result_of(&x) {
                Ok(r) => total.add(r),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }
}
