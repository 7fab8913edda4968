//! What a run reads ([`Source`]: memory, a strided layout over it, or a file range) and
//! writes ([`Dest`]), and how a run is cut into chunks over them (`plan`, `slot_need`).

use super::chunk::{Chunk, Phase};
use super::config::{PipelineConfig, CHUNKS_MAX};
use super::error::PipelineError;
use crate::file::{FileEngine, FileHandle, IoOp};
use crate::layout::Layout;
use crate::memory::{Memory, MemoryMut, RawBuf};
use crate::request::{Request, RequestError};
use std::marker::PhantomData;

/// What a pipeline reads: host memory of any kind (pageable, pinned, registered, mapped,
/// managed) or device memory, whole or through a strided layout, or a byte range of a file
/// read chunk by chunk through a [`FileEngine`]. Borrowed for the run.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub(super) buf: RawBuf,
    pub(super) layout: Option<Layout>,
    pub(super) file: Option<FileSource<'a>>,
    _borrow: PhantomData<&'a [u8]>,
}

/// A file range a [`Source`] reads: each chunk is one [`FileEngine`] load straight into its
/// slot, no buffer of the whole range.
#[derive(Clone, Copy)]
pub(super) struct FileSource<'a> {
    engine: &'a FileEngine,
    file: &'a FileHandle,
    offset: u64,
}

impl std::fmt::Debug for FileSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource")
            .field("path", &self.file.path())
            .field("offset", &self.offset)
            .finish()
    }
}

impl<'a> Source<'a> {
    /// All of `mem`, in order.
    pub fn new<M: Memory + ?Sized>(mem: &'a M) -> Source<'a> {
        Source {
            buf: mem.raw(),
            layout: None,
            file: None,
            _borrow: PhantomData,
        }
    }

    /// `len` bytes of `file` from `offset`, each chunk loaded by `engine` (its parallel reads):
    /// on the CPU straight into its input slot, once the slot's previous reader has finished
    /// (waited for on the submitting thread); on the GPU into one of the pipeline's pinned
    /// bounce buffers, then DMAed into the slot (as a pageable source, see
    /// [`CudaPipeline`](super::CudaPipeline)). Errors: the range overflows. A file shorter than the
    /// range fails the first chunk that reaches past its end ([`PipelineError::Copy`] of its
    /// upload, with the file's error).
    pub fn file(
        engine: &'a FileEngine,
        file: &'a FileHandle,
        offset: u64,
        len: usize,
    ) -> Result<Source<'a>, PipelineError> {
        if offset.checked_add(len as u64).is_none() {
            return Err(PipelineError::Config(format!(
                "file range: offset {offset} + {len} bytes overflows"
            )));
        }
        Ok(Source {
            buf: RawBuf {
                addr: 0,
                len,
                kind: crate::memory::MemKind::Pageable,
            },
            layout: None,
            file: Some(FileSource {
                engine,
                file,
                offset,
            }),
            _borrow: PhantomData,
        })
    }

    /// For a file source: queues chunk `c`'s load into `to` (its input slot, `c.len` bytes)
    /// once `after` (the slot's previous reader) has completed, waited for here. `None` for
    /// memory sources.
    ///
    /// # Safety
    /// 1. `to` is valid for writes of `c.len` bytes, of its kind, until the returned request
    ///    completes, and nothing else reads or writes it until then.
    pub(crate) unsafe fn load(
        &self,
        c: &Chunk,
        to: RawBuf,
        after: Option<&Request>,
    ) -> Option<Result<Request, PipelineError>> {
        let f = self.file?;
        let failed = |e: RequestError| PipelineError::Copy {
            chunk: c.index,
            phase: Phase::Upload,
            source: e,
        };
        Some((|| {
            if let Some(a) = after {
                a.completion()
                    .wait()
                    .map_err(|e| failed(RequestError::Dependency(Box::new(e))))?;
            }
            let to = RawBuf { len: c.len, ..to };
            // SAFETY: the slot is valid and unshared until the request completes (1).
            let (req, _) = unsafe {
                f.engine
                    .submit(f.file, f.offset + c.offset as u64, to, IoOp::Read)
            }
            .map_err(|e| failed(e.into()))?;
            Ok(req)
        })())
    }

    /// The elements of `layout` over `mem`, in the layout's order; chunks are whole rows of its
    /// outermost dimension, packed densely in the slots. Errors: the layout reaches outside
    /// `mem`.
    pub fn strided<M: Memory + ?Sized>(
        mem: &'a M,
        layout: Layout,
    ) -> Result<Source<'a>, PipelineError> {
        let buf = mem.raw();
        layout
            .check_buffer(buf.len)
            .map_err(|e| PipelineError::Config(format!("source layout: {e}")))?;
        Ok(Source {
            buf,
            layout: Some(layout),
            file: None,
            _borrow: PhantomData,
        })
    }

    /// Bytes of data the source holds.
    pub fn len(&self) -> usize {
        self.layout.map_or(self.buf.len, |l| l.size_bytes())
    }

    /// True when there is nothing to read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The chunks for input slots of `chunk_bytes` (outputs only `with_output`), and the
    /// bytes of the largest. Errors ([`PipelineError::Config`]): more than [`CHUNKS_MAX`]
    /// chunks (counted before anything is allocated), outputs that together overflow `usize`;
    /// [`PipelineError::Setup`]: no memory for the list.
    pub(crate) fn chunks(
        &self,
        cfg: &PipelineConfig,
        with_output: bool,
    ) -> Result<(Vec<Chunk>, usize), PipelineError> {
        // A chunk is whole rows of a strided source, any bytes of a whole buffer.
        let row = self.layout.map_or(1, |l| l.size_bytes() / l.dims()[0]);
        let (step, total) = match self.layout {
            None => (cfg.chunk_bytes.max(1), self.buf.len),
            // At most the whole source: `(chunk_bytes / row) * row` may overflow otherwise.
            Some(l) => (
                (cfg.chunk_bytes / row).clamp(1, l.dims()[0]) * row,
                l.size_bytes(),
            ),
        };
        let count = total.div_ceil(step);
        if count > CHUNKS_MAX {
            let fits = (total / row).div_ceil(CHUNKS_MAX) * row;
            return Err(PipelineError::Config(format!(
                "chunk_bytes {} cuts {total} bytes into {count} chunks, more than \
                 {CHUNKS_MAX}: chunk_bytes must be at least {fits}",
                cfg.chunk_bytes
            )));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(count)
            .map_err(|e| PipelineError::Setup(format!("the list of {count} chunks: {e}")))?;
        let (mut off, mut out_off) = (0usize, 0usize);
        while off < total {
            let len = step.min(total - off);
            let out_len = if with_output { cfg.output.of(len) } else { 0 };
            out.push(Chunk {
                index: out.len(),
                offset: off,
                len,
                out_offset: out_off,
                out_len,
            });
            off += len;
            out_off = out_off.checked_add(out_len).ok_or_else(|| {
                PipelineError::Config(format!(
                    "the outputs of {total} bytes of input need more than {} bytes",
                    usize::MAX
                ))
            })?;
        }
        Ok((out, step.min(total)))
    }

    /// The source side of chunk `c`'s upload: a buffer and the layout of the chunk in it.
    pub(super) fn part(&self, c: &Chunk) -> Result<(RawBuf, Layout), PipelineError> {
        let bad = |e: crate::LayoutError| PipelineError::Config(format!("chunk layout: {e}"));
        match self.layout {
            None => {
                let buf = RawBuf {
                    addr: self.buf.addr + c.offset as u64,
                    len: c.len,
                    kind: self.buf.kind,
                };
                Ok((buf, Layout::bytes(c.len).map_err(bad)?))
            }
            Some(l) => {
                let row = l.size_bytes() / l.dims()[0];
                let rows = c.offset / row..(c.offset + c.len) / row;
                Ok((self.buf, l.slice(0, rows, 1).map_err(bad)?))
            }
        }
    }

    /// The dense layout chunk `c` takes in its slot.
    pub(super) fn slot_layout(&self, c: &Chunk) -> Result<Layout, PipelineError> {
        let bad = |e: crate::LayoutError| PipelineError::Config(format!("chunk layout: {e}"));
        match self.layout {
            None => Layout::bytes(c.len).map_err(bad),
            Some(l) => {
                let row = l.size_bytes() / l.dims()[0];
                let mut dims = [0usize; crate::MAX_DIMS];
                dims[..l.ndim()].copy_from_slice(l.dims());
                dims[0] = c.len / row;
                Layout::contiguous(&dims[..l.ndim()], l.elem_size()).map_err(bad)
            }
        }
    }
}

/// Where a pipeline writes the chunks' outputs, one after the other from its start: host
/// memory of any kind or device memory. Borrowed for the run.
#[derive(Debug)]
pub struct Dest<'a> {
    buf: RawBuf,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Dest<'a> {
    /// All of `mem`.
    pub fn new<M: MemoryMut + ?Sized>(mem: &'a mut M) -> Dest<'a> {
        Dest {
            buf: mem.raw_mut(),
            _borrow: PhantomData,
        }
    }

    /// Chunk `c`'s part of the destination.
    pub(super) fn part(&self, c: &Chunk) -> RawBuf {
        RawBuf {
            addr: self.buf.addr + c.out_offset as u64,
            len: c.out_len,
            kind: self.buf.kind,
        }
    }
}

/// A run's chunks, checked against its destination (which must hold every output).
pub(super) fn plan(
    cfg: &PipelineConfig,
    src: &Source<'_>,
    dst: Option<&Dest<'_>>,
) -> Result<Vec<Chunk>, PipelineError> {
    let (chunks, _) = src.chunks(cfg, dst.is_some())?;
    check_dest(&chunks, dst)?;
    Ok(chunks)
}

/// The slot sizes a run's chunks need: (the largest input, the largest output). A strided
/// source's chunk is at least one whole row, which may be more than `chunk_bytes`: the
/// pipelines grow their slots to these before the run (sized to `chunk_bytes` alone, such a
/// chunk was once copied past its slot's end).
pub(crate) fn slot_need(chunks: &[Chunk]) -> (usize, usize) {
    chunks
        .iter()
        .fold((0, 0), |(i, o), c| (i.max(c.len), o.max(c.out_len)))
}

/// Checks a run's buffers against its chunks: the destination holds every output.
fn check_dest(chunks: &[Chunk], dst: Option<&Dest<'_>>) -> Result<(), PipelineError> {
    if let (Some(d), Some(last)) = (dst, chunks.last()) {
        let need = last.out_offset + last.out_len;
        if need > d.buf.len {
            return Err(PipelineError::Config(format!(
                "the destination holds {} bytes, the outputs need {need}",
                d.buf.len
            )));
        }
    }
    Ok(())
}
