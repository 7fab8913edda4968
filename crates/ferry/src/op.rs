//! Operators: what a request does, lowered to engine-independent steps.
//!
//! AML's copy operators are untyped functions that differ per backend. ferry's are typed and
//! portable: an [`Operator`] writes a [`Program`] of [`Step`]s (planned copies and fills)
//! relative to the request's destination and source buffers; every engine runs every program.
//! The program checks each step against the buffers' lengths, so an operator written in safe
//! Rust cannot reach outside them.
//!
//! Built-ins: [`Op::Copy`] (layout copy; a flat memcpy is a copy of two 1-D layouts) and
//! [`Op::Fill`]. A custom operator:
//!
//! ```
//! use ferry::{Layout, Operator, Program, OpError};
//! /// Copies the diagonal of an n x n f32 matrix into a vector.
//! struct Diagonal(usize);
//! impl Operator for Diagonal {
//!     fn name(&self) -> &str { "diagonal" }
//!     fn lower(&self, prog: &mut Program) -> Result<(), OpError> {
//!         let n = self.0;
//!         let diag = Layout::with_byte_strides(&[n], &[(n + 1) * 4], 4)?;
//!         prog.copy(&Layout::contiguous(&[n], 4)?, &diag)
//!     }
//! }
//! ```

use crate::layout::{Layout, LayoutError};
use crate::plan::{Plan, PlanError};
use crate::small_list::SmallList;
use thiserror::Error;

/// Why an operator could not build its program.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum OpError {
    /// A layout was invalid or outside its buffer.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Two layouts could not be copied into each other.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The destination layout does not fit the destination buffer.
    #[error("destination: {0}")]
    Dst(LayoutError),
    /// The source layout does not fit the source buffer.
    #[error("source: {0}")]
    Src(LayoutError),
    /// A copy step needs a source buffer and the request has none.
    #[error("this request has no source buffer")]
    NoSource,
    /// A fill pattern whose length is not the element size.
    #[error("fill pattern of {pattern} bytes for elements of {elem} bytes")]
    PatternSize {
        /// Pattern length.
        pattern: usize,
        /// Element size.
        elem: usize,
    },
    /// A segment reaches past its buffer (or its end overflows).
    #[error("segment {index} ({seg:?}) reaches past its buffer: destination holds {dst_len} bytes, source {src_len}")]
    SegmentOutOfBounds {
        /// Index in the list.
        index: usize,
        /// The segment.
        seg: Segment,
        /// Destination length.
        dst_len: usize,
        /// Source length.
        src_len: usize,
    },
    /// Two segments write the same destination bytes.
    #[error("segments {a} and {b} write overlapping destination bytes")]
    SegmentOverlap {
        /// Index of one segment.
        a: usize,
        /// Index of the other.
        b: usize,
    },
    /// A block copy ([`Op::Blocks`]) of blocks of 0 bytes.
    #[error("a block copy of blocks of 0 bytes")]
    BlockZero,
    /// A block copy's two index arrays differ in length ([`Op::blocks_from_indices`]).
    #[error("{src} source block indices but {dst} destination block indices")]
    BlockIndexCount {
        /// Source indices given.
        src: usize,
        /// Destination indices given.
        dst: usize,
    },
    /// A negative block index ([`Op::blocks_from_indices`]).
    #[error("mapping entry {index}: {side} block index {value} is negative")]
    BlockNegative {
        /// Entry in the mapping.
        index: usize,
        /// `"source"` or `"destination"`.
        side: &'static str,
        /// The index given.
        value: i64,
    },
    /// A block index past the end of its table ([`Op::Blocks`]).
    #[error("mapping entry {index}: {side} block {block} is past the table's end ({blocks} blocks of {block_bytes} bytes{})", table.map(|t| format!(", table pair {t}")).unwrap_or_default())]
    BlockOutOfRange {
        /// Entry in the mapping.
        index: usize,
        /// `"source"` or `"destination"`.
        side: &'static str,
        /// The block named.
        block: u64,
        /// Whole blocks in the table.
        blocks: u64,
        /// The block size.
        block_bytes: usize,
        /// Which buffer pair ([`Op::submit_pairs`]); `None` for a request's own buffers.
        table: Option<usize>,
    },
    /// Two entries of a block copy write the same destination block ([`Op::Blocks`]).
    #[error("mapping entries {first} and {second} both write destination block {block}")]
    BlockDuplicate {
        /// The earlier entry.
        first: usize,
        /// The later entry.
        second: usize,
        /// The block both write.
        block: u64,
    },
    /// [`Op::submit_pairs`] was given different numbers of destination and source buffers.
    #[error("{dst} destination buffers but {src} source buffers")]
    PairCount {
        /// Destination buffers.
        dst: usize,
        /// Source buffers.
        src: usize,
    },
    /// The operator's own failure.
    #[error("{0}")]
    Custom(String),
}

/// One piece of a segment list: `len` bytes from `src_off` in the source buffer to `dst_off`
/// in the destination buffer. Plain data, laid out as the GPU gather kernel reads it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Segment {
    /// Byte offset in the destination buffer.
    pub dst_off: u64,
    /// Byte offset in the source buffer.
    pub src_off: u64,
    /// Bytes to copy.
    pub len: u64,
}

impl Segment {
    /// A segment of `len` bytes from `src_off` to `dst_off`.
    pub fn new(dst_off: u64, src_off: u64, len: u64) -> Segment {
        Segment {
            dst_off,
            src_off,
            len,
        }
    }
}

/// Checks a segment list against the buffers: every segment inside both, no two destination
/// ranges overlapping (one linear pass when the list is sorted by destination, else a sort).
/// Returns the bytes the list copies.
pub fn check_segments(segs: &[Segment], dst_len: usize, src_len: usize) -> Result<usize, OpError> {
    let mut total = 0usize;
    let mut sorted = true;
    let mut prev_end = 0u64;
    for (index, seg) in segs.iter().enumerate() {
        let fits = |off: u64, len: usize| off.checked_add(seg.len).is_some_and(|e| e <= len as u64);
        if !fits(seg.dst_off, dst_len) || !fits(seg.src_off, src_len) {
            return Err(OpError::SegmentOutOfBounds {
                index,
                seg: *seg,
                dst_len,
                src_len,
            });
        }
        if seg.len > 0 {
            sorted &= seg.dst_off >= prev_end;
            prev_end = seg.dst_off + seg.len;
        }
        total += seg.len as usize;
    }
    if !sorted {
        let mut order: Vec<usize> = (0..segs.len()).filter(|&i| segs[i].len > 0).collect();
        order.sort_unstable_by_key(|&i| segs[i].dst_off);
        for w in order.windows(2) {
            let (a, b) = (&segs[w[0]], &segs[w[1]]);
            if a.dst_off + a.len > b.dst_off {
                return Err(OpError::SegmentOverlap { a: w[0], b: w[1] });
            }
        }
    }
    Ok(total)
}

/// Checks a block mapping against a destination table of `dst_len` bytes and a source table
/// of `src_len` bytes: a block size above 0 (unless the mapping is empty), every index inside
/// its table, no destination block written twice. `table` names the buffer pair in the errors.
/// Returns the number of segments [`block_segments`] makes of it (the entries less those that
/// continue the one before on both sides).
pub(crate) fn check_blocks(
    block: usize,
    pairs: &[(u64, u64)],
    dst_len: usize,
    src_len: usize,
    table: Option<usize>,
) -> Result<usize, OpError> {
    if pairs.is_empty() {
        return Ok(0);
    }
    if block == 0 {
        return Err(OpError::BlockZero);
    }
    let (dst_blocks, src_blocks) = ((dst_len / block) as u64, (src_len / block) as u64);
    // One pass: both tables' bounds (the error built out of line), whether the destinations
    // ascend (then they are distinct without a bitmap), and the entries that continue the one
    // before on both sides (merged into its segment by `block_segments`).
    let (mut sorted, mut merges) = (true, 0usize);
    let mut prev: Option<(u64, u64)> = None;
    for (index, &(s, d)) in pairs.iter().enumerate() {
        if s >= src_blocks || d >= dst_blocks {
            return Err(block_out_of_range(
                index,
                (s, d),
                (src_blocks, dst_blocks),
                block,
                table,
            ));
        }
        if let Some((ps, pd)) = prev {
            sorted &= pd < d;
            merges += usize::from(ps + 1 == s && pd + 1 == d);
        }
        prev = Some((s, d));
    }
    // Distinct destinations: one pass over a bitmap of the destination table where the table
    // is small next to the mapping (vLLM's swaps: thousands of entries into tables of
    // thousands of blocks); else, or to name a duplicate, the entries sorted by destination
    // (two sorts per submit cost 60 ns a block at 4,096 blocks on the H100 host, more than the
    // copy of a 4 KiB block).
    let distinct_known =
        sorted || (bitmap_fits(dst_blocks, pairs.len()) && distinct(pairs, dst_blocks));
    if !distinct_known {
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_unstable_by_key(|&i| (pairs[i].1, i));
        if let Some(w) = order.windows(2).find(|w| pairs[w[0]].1 == pairs[w[1]].1) {
            return Err(OpError::BlockDuplicate {
                first: w[0],
                second: w[1],
                block: pairs[w[0]].1,
            });
        }
    }
    Ok(pairs.len() - merges)
}

/// Whether a bitmap of `blocks` bits is small next to a mapping of `entries` (at most 8 bytes
/// an entry, or 8 KiB).
fn bitmap_fits(blocks: u64, entries: usize) -> bool {
    blocks <= (entries as u64).saturating_mul(64).max(1 << 16)
}

/// Whether no two entries of `pairs` (destinations below `blocks`) write the same block: one
/// pass without a branch per entry (a duplicate is rare; [`check_blocks`] names it by sorting).
fn distinct(pairs: &[(u64, u64)], blocks: u64) -> bool {
    let mut seen = vec![0u64; blocks.div_ceil(64) as usize];
    let mut again = 0u64;
    for &(_, d) in pairs {
        let (word, bit) = (&mut seen[(d / 64) as usize], 1u64 << (d % 64));
        again |= *word & bit;
        *word |= bit;
    }
    again == 0
}

/// [`OpError::BlockOutOfRange`] for entry `index`, `(s, d)`, of a mapping between tables of
/// `(src_blocks, dst_blocks)` blocks: its source named where both are out of range.
#[cold]
#[inline(never)]
fn block_out_of_range(
    index: usize,
    (s, d): (u64, u64),
    (src_blocks, dst_blocks): (u64, u64),
    block_bytes: usize,
    table: Option<usize>,
) -> OpError {
    let (side, block, blocks) = if s >= src_blocks {
        ("source", s, src_blocks)
    } else {
        ("destination", d, dst_blocks)
    };
    OpError::BlockOutOfRange {
        index,
        side,
        block,
        blocks,
        block_bytes,
        table,
    }
}

/// The mapping as a segment list in mapping order, entries that continue the previous one on
/// both sides (block `s + 1` into block `d + 1` after `s` into `d`) merged into one segment.
/// Call after [`check_blocks`], with the count of segments it returned (`runs`). Built in place
/// in its one allocation (an exact-size iterator): through a `Vec` first, the two allocations
/// of 4,096 segments (96 KiB each) cost 30 us a submit on the H100 host, the heap trimmed and
/// faulted in again each time. A mapping with nothing to merge (a permutation's usual case) is
/// one map over the entries: the check and this, 4,096 blocks, 7.3 us on the 2-core machine
/// against 12.3 us with the runs counted here and walked (`cpu-2core.md`, "Block mappings'
/// host work").
pub(crate) fn block_segments(
    block: usize,
    pairs: &[(u64, u64)],
    runs: usize,
) -> std::sync::Arc<[Segment]> {
    BlockList { block, pairs, runs }.segments().collect()
}

/// A block mapping checked against its tables ([`check_blocks`]: `runs` is its count of
/// segments), before its segment list is built: the CUDA engine's gatherer writes the list
/// straight into its pinned table where its kernel copies it (on the fifth H100 host, building
/// the list and copying it there cost 14-25 us of a 4,096-block device -> device copy whose
/// bare kernel took 43 us).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockList<'a> {
    /// Bytes per block.
    pub(crate) block: usize,
    /// `(src_block, dst_block)` pairs, checked.
    pub(crate) pairs: &'a [(u64, u64)],
    /// Segments of the list ([`check_blocks`]' count).
    pub(crate) runs: usize,
}

impl<'a> BlockList<'a> {
    /// The mapping's segments in mapping order, merged as [`block_segments`] says.
    pub(crate) fn segments(self) -> impl ExactSizeIterator<Item = Segment> + 'a {
        let (b, pairs) = (self.block as u64, self.pairs);
        // Nothing to merge (a permutation's usual case): one segment per entry, no look ahead.
        let merge = self.runs != pairs.len();
        let mut at = 0;
        (0..self.runs).map(move |_| {
            let (s, d) = pairs[at];
            let mut len = 1;
            // A run grows while the next entry continues it on both sides.
            while merge && pairs.get(at + len) == Some(&(s + len as u64, d + len as u64)) {
                len += 1;
            }
            at += len;
            Segment::new(d * b, s * b, len as u64 * b)
        })
    }

    /// The bytes the mapping copies.
    pub(crate) fn bytes(&self) -> usize {
        self.block * self.pairs.len()
    }

    /// The mapping as the program's one step (what [`Op::lower_into`] pushes).
    pub(crate) fn push_into(self, prog: &mut Program) {
        let segs = block_segments(self.block, self.pairs, self.runs);
        let (range, bytes) = (0..segs.len(), self.bytes());
        prog.steps.push(Step::Segments { segs, range, bytes });
    }
}

/// A copy from `src` to `dst` checked against buffers of `dst_len` and `src_len` bytes (both
/// layouts inside their buffers, the same element size), and its one contiguous run
/// `(dst offset, src offset, bytes)` where it is one ([`Plan::single_run`]); `None`: a general
/// plan. What [`Program::copy`] checks, and all that an engine needs to run one run without
/// building a program (the CUDA engine's one-run path).
#[inline]
pub(crate) fn checked_run(
    dst: &Layout,
    src: &Layout,
    dst_len: usize,
    src_len: usize,
) -> Result<Option<(usize, usize, usize)>, OpError> {
    // The common case first, without the general passes over the dims (issue 14 counts the
    // host work per small request): one run inside both buffers. A contiguous layout's span
    // is its offset plus its bytes. Anything else, errors included, takes the general checks
    // (tests: `checked_run_agrees_with_the_general_checks`).
    if let Ok(Some((d, s, n))) = Plan::single_run(dst, src) {
        let fits = |off: usize, len: usize| off.checked_add(n).is_some_and(|end| end <= len);
        if fits(d, dst_len) && fits(s, src_len) {
            return Ok(Some((d, s, n)));
        }
    }
    dst.check_buffer(dst_len).map_err(OpError::Dst)?;
    src.check_buffer(src_len).map_err(OpError::Src)?;
    Ok(Plan::single_run(dst, src)?)
}

/// One engine-independent step, in byte offsets of the request's buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Copy the plan's runs from the source buffer to the destination buffer.
    Copy(Plan),
    /// Write `pattern` (one element) at each element of the plan's destination runs.
    Fill {
        /// Destination runs (source side unused).
        plan: Plan,
        /// One element's bytes.
        pattern: Box<[u8]>,
    },
    /// Copy the segments `segs[range]` (checked: inside the buffers, destinations disjoint).
    Segments {
        /// The whole list (shared, not copied, when a step is split).
        segs: std::sync::Arc<[Segment]>,
        /// The part of the list this step copies.
        range: std::ops::Range<usize>,
        /// Bytes this step copies.
        bytes: usize,
    },
}

impl Step {
    /// Bytes the step writes.
    pub fn bytes(&self) -> usize {
        match self {
            Step::Copy(p) | Step::Fill { plan: p, .. } => p.total_bytes(),
            Step::Segments { bytes, .. } => *bytes,
        }
    }
}

/// The steps of one request, checked against its buffers as they are added.
#[derive(Debug)]
pub struct Program {
    dst_len: usize,
    src_len: Option<usize>,
    /// The one step of nearly every request inline (no allocation per request: a Step is
    /// about 430 bytes, and a `Vec` of them took glibc's slower path for large blocks).
    steps: SmallList<Step>,
}

impl Program {
    /// An empty program over a destination of `dst_len` bytes and an optional source.
    pub fn new(dst_len: usize, src_len: Option<usize>) -> Program {
        Program {
            dst_len,
            src_len,
            steps: SmallList::default(),
        }
    }
    /// Adds a copy from `src` (in the source buffer) to `dst` (in the destination buffer).
    /// Two empty layouts (checked like any) add no step; one empty side is a shape mismatch.
    pub fn copy(&mut self, dst: &Layout, src: &Layout) -> Result<(), OpError> {
        let src_len = self.src_len.ok_or(OpError::NoSource)?;
        // `Plan::new`, each plan built where it stays (a request's one step is inline in the
        // program: no move of the 416-byte plan through a `Result`).
        match checked_run(dst, src, self.dst_len, src_len)? {
            Some(run) => self.push_run(run),
            None => self.push_general(dst, src)?,
        }
        Ok(())
    }
    /// Adds the copy of one contiguous run `(dst offset, src offset, bytes)` that
    /// [`checked_run`] returned (checked there: nothing is checked again); a run of 0 bytes
    /// (two empty layouts) adds no step.
    #[inline(always)]
    pub(crate) fn push_run(&mut self, (d, s, bytes): (usize, usize, usize)) {
        if bytes > 0 {
            self.steps.push(Step::Copy(Plan::contiguous(d, s, bytes)));
        }
    }
    /// Adds the copy between layouts that [`checked_run`] checked against this program's
    /// buffers and found not one run: planned, not checked again.
    #[inline(always)]
    pub(crate) fn push_general(&mut self, dst: &Layout, src: &Layout) -> Result<(), OpError> {
        self.steps.push(Step::Copy(Plan::general(dst, src)?));
        Ok(())
    }
    /// Adds a fill of every element of `dst` with `pattern` (`pattern.len()` = element size);
    /// an empty `dst` (checked like any) adds no step.
    pub fn fill(&mut self, dst: &Layout, pattern: &[u8]) -> Result<(), OpError> {
        if pattern.len() != dst.elem_size() {
            return Err(OpError::PatternSize {
                pattern: pattern.len(),
                elem: dst.elem_size(),
            });
        }
        dst.check_buffer(self.dst_len).map_err(OpError::Dst)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.steps.push(Step::Fill {
            plan: Plan::fill(dst)?,
            pattern: pattern.into(),
        });
        Ok(())
    }
    /// Adds a copy of every segment of `segs` (a scattered list of pieces). Errors: a segment
    /// outside its buffer, two segments writing the same destination bytes.
    pub fn segments(&mut self, segs: std::sync::Arc<[Segment]>) -> Result<(), OpError> {
        let src_len = self.src_len.ok_or(OpError::NoSource)?;
        let bytes = check_segments(&segs, self.dst_len, src_len)?;
        let range = 0..segs.len();
        self.steps.push(Step::Segments { segs, range, bytes });
        Ok(())
    }
    /// The steps so far.
    pub fn steps(&self) -> &[Step] {
        self.steps.as_slice()
    }
    /// Takes the steps out.
    pub fn into_steps(self) -> Vec<Step> {
        self.steps.into_vec()
    }
    /// Bytes the program writes.
    pub fn total_bytes(&self) -> usize {
        self.steps().iter().map(Step::bytes).sum()
    }
}

/// A custom operator: builds the program of a request. Portable across engines.
///
/// `lower` runs once per request, on a thread of the engine's choosing (the CPU engine runs it
/// on a worker, the CUDA engine on the submitting thread). An error or a panic fails only that
/// request.
pub trait Operator: Send + Sync + 'static {
    /// A short name for error messages.
    fn name(&self) -> &str {
        "custom"
    }
    /// Adds the request's steps to `prog`.
    fn lower(&self, prog: &mut Program) -> Result<(), OpError>;
}

/// What a request does.
// A copy holds two layouts inline (no allocation per request); the size is fine for a value
// built once per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Op {
    /// Copy every element of the source layout to the destination layout.
    Copy {
        /// Destination layout (in the destination buffer).
        dst: Layout,
        /// Source layout (in the source buffer).
        src: Layout,
    },
    /// Write `pattern` into every element of the layout.
    Fill {
        /// Destination layout.
        dst: Layout,
        /// One element's bytes.
        pattern: Box<[u8]>,
    },
    /// Copy a list of scattered segments (e.g. 100,000 pieces of 4 KiB): one request, run as
    /// a gather/scatter by the engine (an SM kernel or the driver's batched copy on a GPU).
    Segments(std::sync::Arc<[Segment]>),
    /// Copy blocks between two block tables (a KV cache's swap, as vLLM's `swap_blocks`):
    /// block `s` of the source into block `d` of the destination for every `(s, d)` of
    /// `pairs`, blocks of `block_bytes` bytes (block `i` of a buffer: bytes `i * block_bytes ..
    /// (i + 1) * block_bytes`; a buffer holds `len / block_bytes` whole blocks). Checked at
    /// submit, before any byte moves: every index inside its table, no destination block
    /// written twice (errors name the entry). An empty mapping copies nothing. Lowered to one
    /// segment list (entries that continue the previous one on both sides merged), so each
    /// engine runs it as a gather: on a GPU the driver's batched copy, one copy per block, or
    /// the SM gather kernel, by block size and by whether the SMs are left to compute
    /// ([`CudaConfig::compute_busy`](crate::cuda::CudaConfig::compute_busy)). Made by
    /// [`Op::blocks`] or [`Op::blocks_from_indices`]; several tables (a cache's layers) as one
    /// request: [`Op::submit_pairs`].
    ///
    /// ```
    /// use ferry::{CpuEngine, EngineExt, Op};
    /// let engine = CpuEngine::new(2)?;
    /// // Tables of 4 blocks of 8 bytes; blocks 0 and 3 of `src` into blocks 2 and 1 of `dst`.
    /// let src: Vec<u8> = (0..32).collect();
    /// let mut dst = vec![0u8; 32];
    /// let op = Op::blocks(8, [(0, 2), (3, 1)]);
    /// engine.scope(|s| -> ferry::Result<()> { Ok(s.submit(&mut dst, Some(&src), op, &[])?.wait()?) })?;
    /// assert_eq!((&dst[16..24], &dst[8..16]), (&src[0..8], &src[24..32]));
    /// # Ok::<(), ferry::Error>(())
    /// ```
    Blocks {
        /// Bytes per block.
        block_bytes: usize,
        /// `(src_block, dst_block)` pairs.
        pairs: std::sync::Arc<[(u64, u64)]>,
    },
    /// A custom operator.
    Custom(std::sync::Arc<dyn Operator>),
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Copy { dst, src } => f
                .debug_struct("Copy")
                .field("dst", dst)
                .field("src", src)
                .finish(),
            Op::Fill { dst, pattern } => f
                .debug_struct("Fill")
                .field("dst", dst)
                .field("pattern", pattern)
                .finish(),
            Op::Segments(s) => write!(f, "Segments({} segments)", s.len()),
            Op::Blocks { block_bytes, pairs } => {
                write!(f, "Blocks({} blocks of {block_bytes} bytes)", pairs.len())
            }
            Op::Custom(o) => write!(f, "Custom({})", o.name()),
        }
    }
}

impl Op {
    /// The operator's name.
    pub fn name(&self) -> &str {
        match self {
            Op::Copy { .. } => "copy",
            Op::Fill { .. } => "fill",
            Op::Segments(_) => "segments",
            Op::Blocks { .. } => "blocks",
            Op::Custom(o) => o.name(),
        }
    }
    /// True for the built-ins, whose programs are built (and checked) at submit.
    pub fn is_builtin(&self) -> bool {
        !matches!(self, Op::Custom(_))
    }
    /// Builds the program for buffers of the given lengths.
    pub fn lower(&self, dst_len: usize, src_len: Option<usize>) -> Result<Program, OpError> {
        let mut prog = Program::new(dst_len, src_len);
        self.lower_into(&mut prog)?;
        Ok(prog)
    }
    /// [`Op::lower`] into a program the caller holds (an empty [`Program::new`]): a program
    /// holds its first step inline, so the engines' hot paths build it where it stays rather
    /// than moving it out.
    pub(crate) fn lower_into(&self, prog: &mut Program) -> Result<(), OpError> {
        match self {
            Op::Copy { dst, src } => prog.copy(dst, src),
            Op::Fill { dst, pattern } => prog.fill(dst, pattern),
            Op::Segments(segs) => prog.segments(std::sync::Arc::clone(segs)),
            Op::Blocks { .. } => {
                let src_len = prog.src_len.ok_or(OpError::NoSource)?;
                // Checked as a mapping (inside both tables, distinct destination blocks): the
                // segment list's own checks would sort it again.
                if let Some(list) = self.checked_blocks(prog.dst_len, src_len)? {
                    list.push_into(prog);
                }
                Ok(())
            }
            Op::Custom(o) => o.lower(prog),
        }
    }
    /// A block copy's mapping checked against tables of `dst_len` and `src_len` bytes, its
    /// segment list not yet built; `None` for an empty mapping (no step) or another operator.
    pub(crate) fn checked_blocks(
        &self,
        dst_len: usize,
        src_len: usize,
    ) -> Result<Option<BlockList<'_>>, OpError> {
        let Op::Blocks { block_bytes, pairs } = self else {
            return Ok(None);
        };
        let runs = check_blocks(*block_bytes, pairs, dst_len, src_len, None)?;
        Ok((runs > 0).then_some(BlockList {
            block: *block_bytes,
            pairs,
            runs,
        }))
    }
    /// Builds the program, turning a custom operator's error or panic into a request error.
    pub fn lower_catching(
        &self,
        dst_len: usize,
        src_len: Option<usize>,
    ) -> Result<Program, crate::RequestError> {
        let name = self.name().to_string();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.lower(dst_len, src_len)
        })) {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(crate::RequestError::Operator {
                op: name,
                msg: e.to_string(),
            }),
            Err(panic) => Err(crate::RequestError::Panicked {
                op: name,
                msg: panic_message(&panic),
            }),
        }
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_run_agrees_with_the_general_checks() {
        // Contiguous layouts of several shapes, offsets and element sizes, against buffers
        // shorter than, as long as and longer than their spans, and mismatched pairs.
        let shapes: [&[usize]; 4] = [&[1], &[7], &[3, 5], &[2, 1, 4]];
        for ds in &shapes {
            for ss in &shapes {
                for (de, se) in [(1, 1), (4, 4), (2, 4)] {
                    for (doff, soff) in [(0, 0), (3 * de, 0), (0, 8 * se)] {
                        let d = Layout::contiguous(ds, de)
                            .unwrap()
                            .with_offset(doff)
                            .unwrap();
                        let s = Layout::contiguous(ss, se)
                            .unwrap()
                            .with_offset(soff)
                            .unwrap();
                        for slack in [-1isize, 0, 5] {
                            let dl = (d.span().end as isize + slack).max(0) as usize;
                            let sl = (s.span().end as isize + slack).max(0) as usize;
                            let general = d
                                .check_buffer(dl)
                                .map_err(OpError::Dst)
                                .and_then(|()| s.check_buffer(sl).map_err(OpError::Src))
                                .and_then(|()| Ok(Plan::single_run(&d, &s)?));
                            let fast = checked_run(&d, &s, dl, sl);
                            assert_eq!(
                                fast.map_err(|e| e.to_string()),
                                general.map_err(|e| e.to_string()),
                                "{ds:?}x{de} at {doff} / {ss:?}x{se} at {soff}, slack {slack}"
                            );
                        }
                    }
                }
            }
        }
        // Not one run: a transposed source.
        let m = Layout::contiguous(&[4, 4], 1).unwrap();
        let t = m.transpose(0, 1).unwrap();
        assert_eq!(checked_run(&m, &t, 16, 16).unwrap(), None);
    }

    #[test]
    fn steps_keep_their_order_inline_and_in_the_vec() {
        for n in 0..4 {
            let mut prog = Program::new(1024, Some(1024));
            for i in 0..n {
                let l = Layout::bytes(16 + i).unwrap().with_offset(64 * i).unwrap();
                prog.copy(&l, &l).unwrap();
            }
            let bytes: Vec<usize> = prog.steps().iter().map(Step::bytes).collect();
            assert_eq!(bytes, (16..16 + n).collect::<Vec<_>>(), "{n} steps");
            assert_eq!(prog.total_bytes(), bytes.iter().sum::<usize>());
            assert_eq!(
                prog.into_steps()
                    .iter()
                    .map(Step::bytes)
                    .collect::<Vec<_>>(),
                bytes
            );
        }
        // A refused step adds nothing.
        let mut prog = Program::new(8, Some(8));
        assert!(prog
            .copy(&Layout::bytes(16).unwrap(), &Layout::bytes(16).unwrap())
            .is_err());
        assert!(prog.steps().is_empty());
    }
}
