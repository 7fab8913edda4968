//! Files streamed through bounded host windows: the bytes of a save's files (headers and
//! tensors, in file order) are copied into one window while the window before it is written,
//! two windows in all, so that copying and writing overlap and the memory held stays at two
//! windows whatever the checkpoint's size. Used by the `O_DIRECT` writer (each window a run of
//! whole 4 KiB blocks of one or more files: aligned buffer, aligned file offsets) and by a
//! snapshot larger than its bound ([`Checkpoint::snapshot_save`](super::Checkpoint::snapshot_save)).
//!
//! The files are laid end to end in a virtual stream, each starting at a multiple of 4 KiB;
//! window `k` holds the stream's bytes `k * half .. (k + 1) * half`. The caller's thread
//! copies ([`Feed::fill_all`]: a GPU's engine for device tensors, CPU threads for host ones); a writing
//! thread writes ([`Drain::run`]) and hands each window back.

use super::error::CheckpointError;
use super::kept;
use super::options::SaveOptions;
use super::write::{store_batches, Opened, Piece, Planned};
use super::TensorBuffer;
use crate::engine::cpu::CpuEngine;
use crate::engine::Engine;
use crate::file::{FileEngine, IoReport};
use crate::layout::Layout;
use crate::memory::{MemKind, Memory, Region, RegionMut};
use std::collections::VecDeque;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender};

/// Where each file starts in the stream, and each window's size, are multiples of this
/// (`O_DIRECT`'s alignment).
pub(super) const STREAM_ALIGN: usize = 4096;

/// One run of a file's bytes: its header, or a tensor.
struct Extent<'m> {
    /// Its start in the stream.
    at: u64,
    data: &'m dyn Memory,
    /// The tensor's name; empty for a header.
    name: &'m str,
}

/// A save's files, laid end to end.
pub(super) struct Stream<'m> {
    extents: Vec<Extent<'m>>,
    /// Per file: its start in the stream and its length.
    files: Vec<(u64, u64)>,
    end: u64,
}

/// Part of a window that belongs to one file: `range` of the window at `offset` of file `file`.
pub(super) struct Seg {
    file: usize,
    offset: u64,
    range: Range<usize>,
}

/// Per file, its tensors' starts (file offsets, ascending) and names: what a write error names.
pub(super) type Names = Vec<Vec<(u64, String)>>;

impl<'m> Stream<'m> {
    /// The stream of `files` (each one's header, then its tensors in file order).
    pub fn new(files: &'m [Planned<'_, '_>]) -> Stream<'m> {
        let mut extents = Vec::new();
        let mut spans = Vec::with_capacity(files.len());
        let mut base = 0u64;
        for f in files {
            let mut at = base;
            let head: &dyn Memory = &f.head;
            extents.push(Extent {
                at,
                data: head,
                name: "",
            });
            at += f.head.len() as u64;
            for t in &f.order {
                extents.push(Extent {
                    at,
                    data: t.data,
                    name: t.name,
                });
                at += t.data.raw().len as u64;
            }
            spans.push((base, f.bytes()));
            base = (base + f.bytes()).next_multiple_of(STREAM_ALIGN as u64);
        }
        let end = spans.last().map_or(0, |&(b, l)| b + l);
        Stream {
            extents,
            files: spans,
            end,
        }
    }

    /// Windows of `half` bytes it takes.
    pub fn windows(&self, half: usize) -> usize {
        self.end.div_ceil(half as u64) as usize
    }

    /// Per file, its tensors' starts and names ([`Names`]).
    pub fn names(&self) -> Names {
        let mut names: Names = vec![Vec::new(); self.files.len()];
        let mut file = 0;
        for e in &self.extents {
            while file + 1 < self.files.len() && e.at >= self.files[file + 1].0 {
                file += 1;
            }
            if !e.name.is_empty() {
                names[file].push((e.at - self.files[file].0, e.name.to_string()));
            }
        }
        names
    }

    /// Copies window `k` (of `half` bytes) into `buf` and returns its parts, one per file.
    pub fn fill(
        &self,
        k: usize,
        half: usize,
        buf: &mut TensorBuffer,
        copier: &Copier<'_>,
    ) -> Result<Vec<Seg>, CheckpointError> {
        let w0 = k as u64 * half as u64;
        let w1 = (w0 + half as u64).min(self.end);
        let first = self
            .extents
            .partition_point(|e| e.at + e.data.raw().len as u64 <= w0);
        let mut parts = Vec::new();
        for e in self.extents[first..].iter().take_while(|e| e.at < w1) {
            let len = e.data.raw().len as u64;
            let (s, t) = (e.at.max(w0), (e.at + len).min(w1));
            if s >= t {
                continue;
            }
            parts.push(Part {
                at: (s - w0) as usize,
                name: e.name,
                data: e.data,
                src: (s - e.at) as usize..(t - e.at) as usize,
            });
        }
        copier.copy_all(buf, &parts)?;
        Ok(self
            .files
            .iter()
            .enumerate()
            .filter_map(|(i, &(b, l))| {
                let (s, t) = (b.max(w0), (b + l).min(w1));
                (s < t).then(|| Seg {
                    file: i,
                    offset: s - b,
                    range: (s - w0) as usize..(t - w0) as usize,
                })
            })
            .collect())
    }
}

/// What the copying thread sends the writing one.
pub(super) enum Msg {
    /// A full window and its parts.
    Window(TensorBuffer, Vec<Seg>),
    /// Every window sent: finish the files. With it, the copying side's end of the channel
    /// the windows come back on: those the writing side handed back and the copying side did
    /// not take again, for the kept snapshot memory.
    Done(Receiver<TensorBuffer>),
}

/// The writing side: the open files, windows in, windows back.
pub(super) struct Drain {
    open: Opened,
    rx: Receiver<Msg>,
    back: SyncSender<TensorBuffer>,
    names: Names,
    opts: SaveOptions,
    /// `Some(generation)`: the windows handed back and not taken again go to the kept
    /// snapshot memory ([`SaveOptions::keep_snapshot`], `kept::keep`) at the end instead of
    /// being freed.
    keep: Option<u64>,
}

impl Drain {
    /// Writes each window on `engine` as it comes and hands it back; at [`Msg::Done`], syncs
    /// (when asked) and renames the files into place. The copying side gone without `Done`
    /// (it failed or was interrupted) drops the files: nothing is left behind.
    pub fn run(self, engine: &FileEngine) -> Result<IoReport, CheckpointError> {
        let Drain {
            open,
            rx,
            back,
            names,
            opts,
            keep,
        } = self;
        let mut io = IoReport::default();
        loop {
            match rx.recv() {
                Ok(Msg::Window(buf, segs)) => {
                    let mut queues: Vec<VecDeque<Piece<'_>>> =
                        open.paths.iter().map(|_| VecDeque::new()).collect();
                    for s in &segs {
                        queues[s.file].push_back(Piece {
                            file: s.file,
                            offset: s.offset,
                            data: Region::of(&buf, s.range.clone())
                                .expect("a part lies inside its window"),
                        });
                    }
                    io.add(store_batches(
                        engine,
                        &open.handles,
                        &open.paths,
                        queues,
                        &opts,
                        |i, o| {
                            let t = names[i].partition_point(|(s, _)| *s <= o);
                            (t > 0).then(|| names[i][t - 1].1.clone())
                        },
                    )?);
                    // The copying side may have stopped (failed): nothing to hand back to.
                    let _ = back.send(buf);
                }
                Ok(Msg::Done(returned)) => {
                    // Every window written was handed back before `Done` came: all in
                    // `returned` now.
                    drop(back);
                    if let Some(since) = keep {
                        kept::keep(returned.try_iter(), since);
                    }
                    open.finish(&opts)?;
                    return Ok(io);
                }
                Err(_) => {
                    return Err(CheckpointError::Interrupted {
                        path: open.paths.first().cloned().unwrap_or_default(),
                    })
                }
            }
        }
    }
}

/// Why the copying side stopped early.
pub(super) enum Stop {
    /// A copy failed, or the save was interrupted.
    Failed(CheckpointError),
    /// The writing side stopped (its error is the save's).
    WriterGone,
}

/// The copying side: its window buffers, windows out, windows back.
pub(super) struct Feed {
    free: Vec<TensorBuffer>,
    tx: SyncSender<Msg>,
    back: Receiver<TensorBuffer>,
}

/// The two sides of a stream through the window buffers `free`, into the files `open`;
/// `keep` (`Some(generation)`): the windows end in the kept snapshot memory
/// ([`Feed::fill_all`] returns those it holds at the end, the writing side keeps the rest).
pub(super) fn pipeline(
    free: Vec<TensorBuffer>,
    open: Opened,
    names: Names,
    opts: &SaveOptions,
    keep: Option<u64>,
) -> (Feed, Drain) {
    let n = free.len();
    let (tx, rx) = std::sync::mpsc::sync_channel(n + 1);
    let (back, back_rx) = std::sync::mpsc::sync_channel(n);
    let feed = Feed {
        free,
        tx,
        back: back_rx,
    };
    let drain = Drain {
        open,
        rx,
        back,
        names,
        opts: opts.clone(),
        keep,
    };
    (feed, drain)
}

impl Feed {
    /// Copies every window of `stream` (of `half` bytes) into a free buffer and sends it to
    /// the writing side, reusing those it hands back; the interrupt is asked before each
    /// window (an interrupt names `first`). Ends with [`Msg::Done`] (which hands the writing
    /// side the windows that came back meanwhile) and returns the windows it never used.
    pub fn fill_all(
        mut self,
        stream: &Stream<'_>,
        half: usize,
        copier: &Copier<'_>,
        opts: &SaveOptions,
        first: &std::path::Path,
    ) -> Result<Vec<TensorBuffer>, Stop> {
        for k in 0..stream.windows(half) {
            let mut buf = match self.free.pop() {
                Some(b) => b,
                None => self.back.recv().map_err(|_| Stop::WriterGone)?,
            };
            if let Some(stop) = &opts.interrupt {
                if stop() {
                    return Err(Stop::Failed(CheckpointError::Interrupted {
                        path: first.to_path_buf(),
                    }));
                }
            }
            let segs = stream
                .fill(k, half, &mut buf, copier)
                .map_err(Stop::Failed)?;
            self.tx
                .send(Msg::Window(buf, segs))
                .map_err(|_| Stop::WriterGone)?;
        }
        let Feed { free, tx, back } = self;
        tx.send(Msg::Done(back)).map_err(|_| Stop::WriterGone)?;
        Ok(free)
    }
}

/// The save's result from both sides: the copying side's own failure first, else the writing
/// side's result.
pub(super) fn outcome<T, F>(
    filled: Result<F, Stop>,
    written: Result<T, CheckpointError>,
) -> Result<T, CheckpointError> {
    match (filled, written) {
        (Err(Stop::Failed(e)), _) => Err(e),
        (_, r) => r,
    }
}

/// One window buffer of `half` bytes of `kind`, one of `n` (what an allocation error names).
pub(super) fn window(
    kind: MemKind,
    half: usize,
    n: usize,
) -> Result<TensorBuffer, CheckpointError> {
    TensorBuffer::new(kind, half).map_err(|msg| CheckpointError::Alloc {
        path: PathBuf::from("<snapshot>"),
        bytes: (half * n) as u64,
        target: kind.to_string(),
        msg,
    })
}

/// Copies tensors out of their memory: a GPU's engine for device tensors, CPU threads for
/// host ones.
pub(super) struct Copier<'e> {
    gpu: Option<&'e dyn Engine>,
    /// The file engine's host copier (one per file engine, kept across saves).
    cpu: &'e CpuEngine,
}

impl<'e> Copier<'e> {
    /// For the tensors named with their memory's kind, saved through `engine`: its GPU
    /// engine where a tensor is on a GPU. Errors: a device tensor and no GPU engine to copy
    /// it; no CPU threads.
    pub fn new<'n>(
        engine: &'e FileEngine,
        tensors: impl IntoIterator<Item = (&'n str, MemKind)>,
    ) -> Result<Copier<'e>, CheckpointError> {
        let tensors: Vec<_> = tensors.into_iter().collect();
        let on_gpu = tensors
            .iter()
            .any(|(_, k)| matches!(k, MemKind::Device { .. }));
        let gpu = engine.mover().filter(|_| on_gpu);
        let cpu = engine
            .host_copier()
            .map_err(|e| CheckpointError::BadTensor {
                path: PathBuf::from("<snapshot>"),
                tensor: String::new(),
                msg: format!("no CPU engine for the host copies: {e}"),
            })?;
        let c = Copier { gpu, cpu };
        for (name, kind) in tensors {
            c.engine_for(name, kind)?;
        }
        Ok(c)
    }

    /// Host memory to copy into: pinned where a GPU's engine copies, else pageable.
    pub fn kind(&self) -> MemKind {
        if self.gpu.is_some() {
            MemKind::Pinned
        } else {
            MemKind::Pageable
        }
    }

    /// The engine that copies `data` out: the GPU's for device memory, the CPU's for host.
    fn engine_for(&self, name: &str, kind: MemKind) -> Result<&dyn Engine, CheckpointError> {
        match (kind, self.gpu) {
            (MemKind::Device { .. }, Some(g)) => Ok(g),
            (MemKind::Device { ordinal }, None) => Err(CheckpointError::BadTensor {
                path: PathBuf::from("<snapshot>"),
                tensor: name.to_string(),
                msg: format!(
                    "it is on cuda:{ordinal}: snapshot it with a file engine made by \
                     FileEngine::with_engine and that GPU's CudaEngine"
                ),
            }),
            _ => Ok(self.cpu),
        }
    }

    /// Copies every part into `buf` (each `src` of its tensor's memory to its place `at`):
    /// the GPU's parts first, all submitted before the first wait, so that they follow each
    /// other on its copy engine without a round trip to the host between tensors (a
    /// checkpoint's thousands of tensors); then the host parts on the CPU engine (those up to
    /// its inline size on this thread as they are submitted, larger ones over its workers).
    /// Errors: the first failed copy, with its tensor.
    pub fn copy_all(
        &self,
        buf: &mut TensorBuffer,
        parts: &[Part<'_>],
    ) -> Result<(), CheckpointError> {
        let parts: Vec<&Part<'_>> = parts.iter().filter(|p| !p.src.is_empty()).collect();
        let places: Vec<Range<usize>> = parts.iter().map(|p| p.at..p.at + p.src.len()).collect();
        let views = RegionMut::split(buf, &places)
            .ok_or_else(|| copy_err("", "the places overlap or lie outside the buffer".into()))?;
        let (mut on_gpu, mut on_cpu) = (Vec::new(), Vec::new());
        for (p, view) in parts.into_iter().zip(views) {
            let src = Region::of(p.data, p.src.clone())
                .ok_or_else(|| copy_err(p.name, "a range outside it".into()))?;
            // A device tensor without a GPU engine is refused here.
            self.engine_for(p.name, p.data.raw().kind)?;
            match p.data.raw().kind {
                MemKind::Device { .. } => on_gpu.push((p.name, view, src)),
                _ => on_cpu.push((p.name, view, src)),
            }
        }
        if let Some(gpu) = self.gpu {
            copy_on(gpu, &mut on_gpu)?;
        }
        copy_on(self.cpu, &mut on_cpu)
    }
}

/// One run of a tensor's bytes to copy out: `src` of `data` (the tensor `name`, empty for a
/// header) to `at` in the buffer.
pub(super) struct Part<'m> {
    /// Where it goes in the buffer.
    pub at: usize,
    /// The tensor's name (empty for a file's header): what an error names.
    pub name: &'m str,
    /// The memory it comes from.
    pub data: &'m dyn Memory,
    /// The byte range of `data`.
    pub src: Range<usize>,
}

/// A failed copy out of the tensor `name`.
fn copy_err(name: &str, msg: String) -> CheckpointError {
    CheckpointError::BadTensor {
        path: PathBuf::from("<snapshot>"),
        tensor: name.to_string(),
        msg: format!("copying it out failed: {msg}"),
    }
}

/// Runs `jobs` (tensor, destination, source) on `engine` in one scope: all submitted, then
/// waited in order. Errors: the first failure, named.
fn copy_on(
    engine: &dyn Engine,
    jobs: &mut [(&str, RegionMut<'_>, Region<'_>)],
) -> Result<(), CheckpointError> {
    if jobs.is_empty() {
        return Ok(());
    }
    // Every request submitted is waited here, so that the first failure keeps its tensor's
    // name and the scope's end has nothing left to report.
    let failed = engine
        .scope(|s| -> crate::Result<Option<CheckpointError>> {
            let mut reqs = Vec::with_capacity(jobs.len());
            let mut first = None;
            for (name, dst, src) in jobs.iter_mut() {
                let l = Layout::bytes(src.raw().len)?;
                match s.copy(dst, &l, src, &l) {
                    Ok(r) => reqs.push((*name, r)),
                    Err(e) => {
                        first = Some(copy_err(name, e.to_string()));
                        break;
                    }
                }
            }
            for (name, r) in reqs {
                if let Err(e) = r.wait() {
                    first.get_or_insert_with(|| copy_err(name, e.to_string()));
                }
            }
            Ok(first)
        })
        .map_err(|e| copy_err("", e.to_string()))?;
    failed.map_or(Ok(()), Err)
}

/// Writes `files` (opened as `open`) through two windows of `half` bytes: copied on
/// `copying`'s engines on this thread, written on `writing` by another, overlapped; returns
/// once they are in place, with the writes' report and the window bytes held.
pub(super) fn stream_now(
    copying: &FileEngine,
    writing: &FileEngine,
    files: &[Planned<'_, '_>],
    open: Opened,
    opts: &SaveOptions,
    half: usize,
) -> Result<(IoReport, u64), CheckpointError> {
    let stream = Stream::new(files);
    let copier = Copier::new(
        copying,
        files
            .iter()
            .flat_map(|f| f.order.iter().map(|t| (t.name, t.data.raw().kind))),
    )?;
    let n = stream.windows(half).clamp(1, 2);
    let free = (0..n)
        .map(|_| window(copier.kind(), half, n))
        .collect::<Result<Vec<_>, _>>()?;
    let first = files.first().map(|f| f.path.clone()).unwrap_or_default();
    let (feed, drain) = pipeline(free, open, stream.names(), opts, None);
    std::thread::scope(|s| {
        let h = s.spawn(|| drain.run(writing));
        let filled = feed.fill_all(&stream, half, &copier, opts, &first);
        let written = h.join().unwrap_or_else(|_| Err(panicked(&first)));
        outcome(filled, written).map(|io| (io, (n * half) as u64))
    })
}

/// The writing thread panicked (its files were removed as it unwound).
pub(super) fn panicked(path: &std::path::Path) -> CheckpointError {
    super::write::replace_err(
        path,
        &std::io::Error::other("the writing thread panicked"),
        "writing the file",
    )
}
