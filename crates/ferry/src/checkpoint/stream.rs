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

    /// The window each file starts in (windows of `half` bytes).
    pub fn lanes(&self, half: usize) -> Vec<usize> {
        self.files
            .iter()
            .map(|&(b, _)| (b / half as u64) as usize)
            .collect()
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

impl Stream<'_> {
    /// The stream's bytes in `range` as pieces to write, per file in file order, each of at
    /// most `chunk` bytes, straight from the tensors' memory (the hybrid writer's buffered
    /// share).
    pub fn pieces(&self, range: Range<u64>, chunk: usize) -> Vec<VecDeque<Piece<'_>>> {
        let mut queues: Vec<VecDeque<Piece<'_>>> =
            self.files.iter().map(|_| VecDeque::new()).collect();
        let first = self
            .extents
            .partition_point(|e| e.at + e.data.raw().len as u64 <= range.start);
        let mut file = self
            .files
            .partition_point(|&(b, _)| b <= range.start)
            .saturating_sub(1);
        for e in self.extents[first..]
            .iter()
            .take_while(|e| e.at < range.end)
        {
            while file + 1 < self.files.len() && e.at >= self.files[file + 1].0 {
                file += 1;
            }
            let len = e.data.raw().len as u64;
            let (mut s, t) = (e.at.max(range.start), (e.at + len).min(range.end));
            while s < t {
                let n = (t - s).min(chunk as u64);
                let from = (s - e.at) as usize;
                queues[file].push_back(Piece {
                    file,
                    offset: s - self.files[file].0,
                    data: Region::of(e.data, from..from + n as usize)
                        .expect("a piece lies inside its tensor"),
                });
                s += n;
            }
        }
        queues
    }
}

/// Which windows of a stream each side writes. Alone, the streaming side takes them in
/// order; split ([`Claims::split`], the hybrid writer), it takes them from the last one down
/// while a buffered share takes them from the front of each file up (one window of each of
/// up to [`SHARE_LANES`] files at a time: the kernel writes one file's buffered writes one
/// at a time, under its inode's lock, so the share spreads over files), at most `cap` of
/// them, until every window is taken: each side goes at its own rate (the disk's, the page
/// cache's), and at the end one waits for the other by at most its last claim (one window of
/// the stream's, up to [`SHARE_LANES`] of the share's).
pub(super) struct Claims {
    state: std::sync::Mutex<ClaimState>,
    /// Windows the buffered share may take.
    cap: usize,
    /// The streaming side takes from the end.
    split: bool,
}

struct ClaimState {
    taken: Vec<bool>,
    /// Alone: the next window. Split: every window from here up is taken.
    cursor: usize,
    /// Per lane (the window a file starts in, ascending; files starting in one window share
    /// it): its first window and the next one the share tries.
    lanes: Vec<(usize, usize)>,
    /// The lane the share's next batch starts from.
    turn: usize,
    /// Windows the share took.
    shared: usize,
}

/// Files the buffered share writes at once (one window of each per batch): a batch of
/// [`BATCH_BYTES`](super::write::BATCH_BYTES) at the direct writer's windows.
pub(super) const SHARE_LANES: usize = 4;

impl Claims {
    /// `windows` windows, all the streaming side's, in order.
    pub fn alone(windows: usize) -> Claims {
        Claims::new(windows, Vec::new(), 0, false)
    }

    /// `windows` windows shared: the streaming side's from the end, at most `cap` of them the
    /// buffered share's from the front of each lane (`lanes`: the windows files start in).
    pub fn split(windows: usize, lanes: &[usize], cap: usize) -> Claims {
        let mut starts: Vec<usize> = lanes.iter().copied().filter(|&w| w < windows).collect();
        starts.push(0);
        starts.sort_unstable();
        starts.dedup();
        if windows == 0 {
            starts.clear();
        }
        Claims::new(windows, starts, cap, true)
    }

    fn new(windows: usize, starts: Vec<usize>, cap: usize, split: bool) -> Claims {
        Claims {
            state: std::sync::Mutex::new(ClaimState {
                taken: vec![false; windows],
                cursor: if split { windows } else { 0 },
                lanes: starts.into_iter().map(|w| (w, w)).collect(),
                turn: 0,
                shared: 0,
            }),
            cap,
            split,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClaimState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The streaming side's next window, if any is left.
    pub fn stream_next(&self) -> Option<usize> {
        let mut g = self.lock();
        let st = &mut *g;
        if !self.split {
            let k = st.cursor;
            return (k < st.taken.len()).then(|| {
                st.taken[k] = true;
                st.cursor += 1;
                k
            });
        }
        while st.cursor > 0 && st.taken[st.cursor - 1] {
            st.cursor -= 1;
        }
        (st.cursor > 0).then(|| {
            st.cursor -= 1;
            st.taken[st.cursor] = true;
            st.cursor
        })
    }

    /// The buffered share's next windows: the next one of each of up to [`SHARE_LANES`]
    /// lanes, taking turns, within its cap; empty once none is left to it.
    pub fn share_next(&self) -> Vec<usize> {
        let mut got = Vec::new();
        let mut g = self.lock();
        let st = &mut *g;
        let n = st.lanes.len();
        let mut tried = 0;
        while tried < n && got.len() < SHARE_LANES && st.shared < self.cap {
            let l = (st.turn + tried) % n;
            tried += 1;
            let end = st.lanes.get(l + 1).map_or(st.taken.len(), |&(s, _)| s);
            let mut k = st.lanes[l].1;
            while k < end && st.taken[k] {
                k += 1;
            }
            st.lanes[l].1 = k;
            if k < end {
                st.taken[k] = true;
                st.shared += 1;
                got.push(k);
            }
        }
        st.turn = (st.turn + tried) % n.max(1);
        got
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
        let opts = self.opts.clone();
        let (io, open) = self.write_windows(engine)?;
        open.finish(&opts)?;
        Ok(io)
    }

    /// [`Drain::run`] up to the files' finish: returns them open and written, for a caller
    /// that finishes them once other writes to them (the hybrid writer's buffered share) are
    /// done too.
    fn write_windows(self, engine: &FileEngine) -> Result<(IoReport, Opened), CheckpointError> {
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
                    return Ok((io, open));
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
    /// Copies every window of `stream` (of `half` bytes) that `claims` gives this side into a
    /// free buffer and sends it to the writing side, reusing those it hands back; the
    /// interrupt is asked before each window (an interrupt names `first`). Ends with
    /// [`Msg::Done`] (which hands the writing side the windows that came back meanwhile) and
    /// returns the windows it never used.
    pub fn fill_all(
        mut self,
        stream: &Stream<'_>,
        half: usize,
        claims: &Claims,
        copier: &Copier<'_>,
        opts: &SaveOptions,
        first: &std::path::Path,
    ) -> Result<Vec<TensorBuffer>, Stop> {
        while let Some(k) = claims.stream_next() {
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
/// once they are in place, with the writes' report and the window bytes held. With `share`
/// (the hybrid writer), at most that many bytes from the stream's start are written buffered
/// straight from the tensors on `copying` by a third thread, beside the windows written from
/// the end ([`Claims::split`]); a failure on any side stops the others.
pub(super) fn stream_now(
    copying: &FileEngine,
    writing: &FileEngine,
    files: &[Planned<'_, '_>],
    open: Opened,
    opts: &SaveOptions,
    half: usize,
    share: Option<u64>,
) -> Result<(IoReport, u64), CheckpointError> {
    let stream = Stream::new(files);
    let copier = Copier::new(
        copying,
        files
            .iter()
            .flat_map(|f| f.order.iter().map(|t| (t.name, t.data.raw().kind))),
    )?;
    let windows = stream.windows(half);
    let n = windows.clamp(1, 2);
    let free = (0..n)
        .map(|_| window(copier.kind(), half, n))
        .collect::<Result<Vec<_>, _>>()?;
    let first = files.first().map(|f| f.path.clone()).unwrap_or_default();
    let claims = match share {
        Some(bytes) => Claims::split(windows, &stream.lanes(half), (bytes / half as u64) as usize),
        None => Claims::alone(windows),
    };
    // Every side asks this between its batches: the user's interrupt, or another side failed.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut run_opts = opts.clone();
    if share.is_some() {
        let (user, flag) = (opts.interrupt.clone(), stop.clone());
        run_opts.interrupt = Some(std::sync::Arc::new(move || {
            flag.load(std::sync::atomic::Ordering::Relaxed) || user.as_ref().is_some_and(|u| u())
        }));
    }
    let failed = |r: bool| {
        if r {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let names = stream.names();
    let (handles, paths) = (open.handles.clone(), open.paths.clone());
    // The share's windows as pieces, made here: the tensors' memory is read on its thread
    // through `Region`s (plain addresses), not through the stream's `&dyn Memory`.
    let share_windows: Vec<Vec<VecDeque<Piece<'_>>>> =
        (0..if share.is_some() { windows } else { 0 })
            .map(|k| {
                let at = k as u64 * half as u64;
                stream.pieces(at..at + half as u64, super::write::CHUNK_BYTES)
            })
            .collect();
    let (feed, drain) = pipeline(free, open, names.clone(), &run_opts, None);
    std::thread::scope(|s| {
        let (claims, handles, paths, names, run_opts, failed) =
            (&claims, &handles, &paths, &names, &run_opts, &failed);
        let shared = share.map(|_| {
            s.spawn(move || {
                let r = write_share(
                    copying,
                    share_windows,
                    claims,
                    handles,
                    paths,
                    names,
                    run_opts,
                );
                failed(r.is_err());
                r
            })
        });
        let h = s.spawn(|| {
            let r = drain.write_windows(writing);
            failed(r.is_err());
            r
        });
        let filled = feed.fill_all(&stream, half, claims, &copier, run_opts, &first);
        failed(filled.is_err());
        let written = h.join().unwrap_or_else(|_| Err(panicked(&first)));
        let Some(shared) = shared else {
            let (io, open) = outcome(filled, written)?;
            open.finish(opts)?;
            return Ok((io, (n * half) as u64));
        };
        let shared = shared.join().unwrap_or_else(|_| Err(panicked(&first)));
        match (filled, written, shared) {
            (Ok(_), Ok((mut io, open)), Ok(r)) => {
                io.add(r);
                if io.buffered_bytes > 0 {
                    // Each side's own reason would read as a fault ("not asked for", "not
                    // aligned"): the buffered bytes are the share's, and each file's unaligned
                    // tail.
                    io.direct_note = Some(
                        "for the hybrid writer's buffered share and each file's unaligned \
                         tail (through the page cache)"
                            .into(),
                    );
                }
                open.finish(opts)?;
                Ok((io, (n * half) as u64))
            }
            (filled, written, shared) => {
                // A side stopped by another's failure says Interrupted: the failure is the
                // save's, whichever side saw it.
                let errs = [
                    filled.err().and_then(|s| match s {
                        Stop::Failed(e) => Some(e),
                        Stop::WriterGone => None,
                    }),
                    written.err(),
                    shared.err(),
                ];
                let mut errs = errs.into_iter().flatten();
                let Some(first_err) = errs.next() else {
                    return Err(panicked(&first));
                };
                let is_stop =
                    |e: &CheckpointError| matches!(e, CheckpointError::Interrupted { .. });
                Err(if is_stop(&first_err) {
                    errs.find(|e| !is_stop(e)).unwrap_or(first_err)
                } else {
                    first_err
                })
            }
        }
    })
}

/// The hybrid writer's buffered share: the windows `claims` gives it, a few files' at a time
/// (`windows`: per window, its pieces per file), their bytes written straight from the
/// tensors through `engine` (its own staging for device tensors) into `handles`, in batches
/// between which the interrupt is asked.
fn write_share(
    engine: &FileEngine,
    mut windows: Vec<Vec<VecDeque<Piece<'_>>>>,
    claims: &Claims,
    handles: &[crate::file::FileHandle],
    paths: &[PathBuf],
    names: &Names,
    opts: &SaveOptions,
) -> Result<IoReport, CheckpointError> {
    let mut io = IoReport::default();
    loop {
        let ks = claims.share_next();
        if ks.is_empty() {
            return Ok(io);
        }
        // Per file, the pieces of every window taken (each window's in file order).
        let mut queues: Vec<VecDeque<Piece<'_>>> = paths.iter().map(|_| VecDeque::new()).collect();
        for k in ks {
            for (q, w) in queues.iter_mut().zip(std::mem::take(&mut windows[k])) {
                q.extend(w);
            }
        }
        io.add(store_batches(
            engine,
            handles,
            paths,
            queues,
            opts,
            |i, o| {
                let t = names[i].partition_point(|(s, _)| *s <= o);
                (t > 0).then(|| names[i][t - 1].1.clone())
            },
        )?);
    }
}

/// The writing thread panicked (its files were removed as it unwound).
pub(super) fn panicked(path: &std::path::Path) -> CheckpointError {
    super::write::replace_err(
        path,
        &std::io::Error::other("the writing thread panicked"),
        "writing the file",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::options::SaveTensor;
    use crate::checkpoint::write::plan;
    use safetensors::Dtype;
    use std::path::Path;

    #[test]
    fn alone_the_stream_takes_every_window_in_order() {
        let c = Claims::alone(3);
        assert!(c.share_next().is_empty());
        let got: Vec<_> = std::iter::from_fn(|| c.stream_next()).collect();
        assert_eq!(got, [0, 1, 2]);
        assert!(c.share_next().is_empty());
    }

    #[test]
    fn split_the_stream_takes_from_the_end_and_the_share_from_each_file_s_front() {
        // One file: the share from the start, the stream from the end, each window once.
        let c = Claims::split(5, &[0], 10);
        assert_eq!(c.stream_next(), Some(4));
        assert_eq!(c.share_next(), [0]);
        assert_eq!(c.share_next(), [1]);
        assert_eq!(c.stream_next(), Some(3));
        assert_eq!(c.share_next(), [2]);
        assert!(c.share_next().is_empty());
        assert_eq!(c.stream_next(), None);
        // Files starting in windows 0, 3, 3 (two in one window) and 6 of 10: a window of each
        // file's lane per batch, then the next ones; the stream skips what the share took.
        let c = Claims::split(10, &[0, 3, 3, 6], 5);
        assert_eq!(c.share_next(), [0, 3, 6]);
        assert_eq!(c.stream_next(), Some(9));
        assert_eq!(c.stream_next(), Some(8));
        assert_eq!(c.stream_next(), Some(7));
        assert_eq!(c.stream_next(), Some(5)); // 6 was the share's
                                              // The cap: two more windows for the share.
        assert_eq!(c.share_next(), [1, 4]);
        assert!(c.share_next().is_empty());
        let rest: Vec<_> = std::iter::from_fn(|| c.stream_next()).collect();
        assert_eq!(rest, [2]);
        // More lanes than a batch takes: SHARE_LANES of them, the rest next time.
        let lanes: Vec<usize> = (0..6).map(|i| i * 2).collect();
        let c = Claims::split(12, &lanes, 100);
        assert_eq!(c.share_next(), [0, 2, 4, 6]);
        assert_eq!(c.share_next(), [8, 10, 1, 3]);
        // Taken from several threads at once: every window exactly once, the share within
        // its cap.
        let lanes: Vec<usize> = (0..8).map(|i| i * 125).collect();
        let c = Claims::split(1000, &lanes, 600);
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                std::iter::from_fn(|| Some(c.share_next()).filter(|v| !v.is_empty()))
                    .flatten()
                    .collect::<Vec<_>>()
            });
            let b = s.spawn(|| std::iter::from_fn(|| c.stream_next()).collect::<Vec<_>>());
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(a.len() <= 600, "{}", a.len());
        let mut all: Vec<_> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        assert!(Claims::split(0, &[0], 5).share_next().is_empty());
    }

    #[test]
    fn pieces_cover_a_range_of_the_stream_file_by_file() {
        let (a, b, c) = (vec![1u8; 5000], vec![2u8; 300], vec![3u8; 9000]);
        let t1 = [SaveTensor::new("a", Dtype::U8, &[5000], &a)];
        let t2 = [
            SaveTensor::new("b", Dtype::U8, &[300], &b),
            SaveTensor::new("c", Dtype::U8, &[9000], &c),
        ];
        let meta = Default::default();
        let files = [
            plan(Path::new("one"), &t1, &meta).unwrap(),
            plan(Path::new("two"), &t2, &meta).unwrap(),
        ];
        let stream = Stream::new(&files);
        let (len1, len2) = (files[0].bytes(), files[1].bytes());
        let start2 = len1.next_multiple_of(STREAM_ALIGN as u64);
        // The whole stream in pieces of at most 4 KiB: each file's bytes once, in order.
        let end = start2 + len2;
        let q = stream.pieces(0..end, 4096);
        for (i, len) in [(0, len1), (1, len2)] {
            let mut at = 0;
            for p in &q[i] {
                assert_eq!((p.file, p.offset), (i, at));
                assert!(p.data.raw().len <= 4096);
                at += p.data.raw().len as u64;
            }
            assert_eq!(at, len, "file {i}");
        }
        // A range from the middle of the first file into the second: the first's tail from
        // the range's start, the second's head (its 8-byte length and header first).
        let q = stream.pieces(4096..start2 + 100, 1 << 20);
        assert_eq!(q[0].front().map(|p| p.offset), Some(4096));
        assert_eq!(
            q[0].iter().map(|p| p.data.raw().len as u64).sum::<u64>(),
            len1 - 4096
        );
        assert_eq!(q[1].front().map(|p| p.offset), Some(0));
        assert_eq!(
            q[1].iter().map(|p| p.data.raw().len as u64).sum::<u64>(),
            100
        );
        // The padding between files is no file's.
        let q = stream.pieces(len1..start2, 4096);
        assert!(q.iter().all(VecDeque::is_empty));
    }
}
