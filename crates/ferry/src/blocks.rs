//! Block copies: the blocks a mapping names, copied between block tables, as one request.
//!
//! A KV cache is a table of fixed-size blocks (8 KiB to 2 MiB each), one table (or a K and a V
//! table) per layer, swapped between GPU memory and pinned host memory while the model computes
//! (vLLM's `swap_blocks`, LMCache, SGLang's hierarchical cache). A [`BlockCopy`] names the
//! blocks to move: `(src_block, dst_block)` pairs, or two index arrays, and the block size.
//! [`Op::Blocks`] moves them between one source and one destination table
//! (any memory kinds an engine supports, either direction, or device to device);
//! [`copy_tables`] moves the same blocks between several table pairs (every layer of a cache)
//! as one [`Request`], every mapping checked before any byte moves.
//!
//! The mapping lowers to a segment list (consecutive blocks in the mapping that are
//! consecutive on both sides merged into one segment), so each engine runs it as it runs a
//! gather: the CPU engine on its workers, the CUDA engine through its gatherer, whose route
//! picks the driver's batched copy (`cuMemcpyBatchAsync`), one copy per block, or the SM
//! gather kernel by block size and by whether the SMs are left to compute
//! ([`CudaConfig::compute_busy`](crate::cuda::CudaConfig::compute_busy)).
//!
//! ```
//! use ferry::blocks::BlockCopy;
//! use ferry::{CpuEngine, EngineExt, Op};
//! let engine = CpuEngine::new(2)?;
//! // Two tables of 4 blocks of 8 bytes; blocks 0 and 3 of `src` into blocks 2 and 1 of `dst`.
//! let src: Vec<u8> = (0..32).collect();
//! let mut dst = vec![0u8; 32];
//! let map = BlockCopy::new(8, [(0, 2), (3, 1)]);
//! engine.scope(|s| -> ferry::Result<()> {
//!     Ok(s.submit(&mut dst, Some(&src), Op::Blocks(map.into()), &[])?.wait()?)
//! })?;
//! assert_eq!(&dst[16..24], &src[0..8]);
//! assert_eq!(&dst[8..16], &src[24..32]);
//! # Ok::<(), ferry::Error>(())
//! ```

use crate::engine::{Engine, Scope, SubmitError};
use crate::memory::{Memory, MemoryMut, RawBuf};
use crate::op::{Op, Segment};
use crate::request::{Join, Request};
use std::sync::Arc;
use thiserror::Error;

/// Why a block copy was refused (before any byte moved).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BlockError {
    /// A block size of 0 bytes.
    #[error("a block of 0 bytes")]
    ZeroBlock,
    /// The two index arrays differ in length.
    #[error("{src} source block indices but {dst} destination block indices")]
    IndexCount {
        /// Source indices given.
        src: usize,
        /// Destination indices given.
        dst: usize,
    },
    /// A negative block index (from a signed index array).
    #[error("mapping entry {index}: {side} block index {value} is negative")]
    Negative {
        /// Entry in the mapping.
        index: usize,
        /// `"source"` or `"destination"`.
        side: &'static str,
        /// The index given.
        value: i64,
    },
    /// A block index past the end of its table.
    #[error("mapping entry {index}: {side} block {block} is past the table's end ({blocks} blocks of {block_bytes} bytes{table})", table = table_name(*table))]
    OutOfRange {
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
        /// Which table pair ([`copy_tables`]); `None` for one pair.
        table: Option<usize>,
    },
    /// Two entries write the same destination block.
    #[error("mapping entries {first} and {second} both write destination block {block}")]
    DuplicateDst {
        /// The earlier entry.
        first: usize,
        /// The later entry.
        second: usize,
        /// The block both write.
        block: u64,
    },
    /// [`copy_tables`] was given different numbers of source and destination tables.
    #[error("{src} source tables but {dst} destination tables")]
    TableCount {
        /// Source tables.
        src: usize,
        /// Destination tables.
        dst: usize,
    },
}

impl From<BlockError> for SubmitError {
    fn from(e: BlockError) -> SubmitError {
        SubmitError::Op(e.into())
    }
}

fn table_name(t: Option<usize>) -> String {
    t.map(|t| format!(", table pair {t}")).unwrap_or_default()
}

/// Which blocks a block copy moves: `(src_block, dst_block)` pairs of blocks of
/// `block_bytes` bytes. Block `i` of a table is bytes `i * block_bytes .. (i + 1) *
/// block_bytes` of its buffer; a buffer holds `len / block_bytes` whole blocks. The mapping is
/// checked against the tables when it is submitted: every index inside its table, no two
/// entries writing the same destination block ([`BlockError`]). An empty mapping copies
/// nothing. See the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockCopy {
    block_bytes: usize,
    pairs: Vec<(u64, u64)>,
}

impl BlockCopy {
    /// The blocks `pairs` names, `(src_block, dst_block)` each, of `block_bytes` bytes.
    pub fn new(block_bytes: usize, pairs: impl IntoIterator<Item = (u64, u64)>) -> BlockCopy {
        BlockCopy {
            block_bytes,
            pairs: pairs.into_iter().collect(),
        }
    }

    /// Block `src[i]` into block `dst[i]` for every `i` (vLLM's `swap_blocks` mapping as two
    /// arrays). Errors: [`BlockError::IndexCount`], [`BlockError::Negative`].
    pub fn from_indices(
        block_bytes: usize,
        src: &[i64],
        dst: &[i64],
    ) -> Result<BlockCopy, BlockError> {
        if src.len() != dst.len() {
            return Err(BlockError::IndexCount {
                src: src.len(),
                dst: dst.len(),
            });
        }
        let idx = |index: usize, side, value: i64| {
            u64::try_from(value).map_err(|_| BlockError::Negative { index, side, value })
        };
        let pairs = src
            .iter()
            .zip(dst)
            .enumerate()
            .map(|(i, (&s, &d))| Ok((idx(i, "source", s)?, idx(i, "destination", d)?)))
            .collect::<Result<_, BlockError>>()?;
        Ok(BlockCopy { block_bytes, pairs })
    }

    /// The block size in bytes.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The `(src_block, dst_block)` pairs.
    pub fn pairs(&self) -> &[(u64, u64)] {
        &self.pairs
    }

    /// Checks the mapping against a destination table of `dst_len` bytes and a source table of
    /// `src_len` bytes, as a submit does: a block size above 0 (unless the mapping is empty),
    /// every index inside its table, no destination block written twice.
    pub fn check(&self, dst_len: usize, src_len: usize) -> Result<(), BlockError> {
        self.check_in(dst_len, src_len, None)
    }

    /// [`BlockCopy::check`]; `table` names the pair in the errors ([`copy_tables`]).
    pub(crate) fn check_in(
        &self,
        dst_len: usize,
        src_len: usize,
        table: Option<usize>,
    ) -> Result<(), BlockError> {
        if self.pairs.is_empty() {
            return Ok(());
        }
        let b = self.block_bytes;
        if b == 0 {
            return Err(BlockError::ZeroBlock);
        }
        let (dst_blocks, src_blocks) = ((dst_len / b) as u64, (src_len / b) as u64);
        let mut sorted = true;
        for (index, w) in self.pairs.iter().enumerate() {
            let (s, d) = *w;
            let out = |side, block, blocks| BlockError::OutOfRange {
                index,
                side,
                block,
                blocks,
                block_bytes: b,
                table,
            };
            if s >= src_blocks {
                return Err(out("source", s, src_blocks));
            }
            if d >= dst_blocks {
                return Err(out("destination", d, dst_blocks));
            }
            sorted &= index == 0 || self.pairs[index - 1].1 < d;
        }
        if !sorted {
            let mut order: Vec<usize> = (0..self.pairs.len()).collect();
            order.sort_unstable_by_key(|&i| (self.pairs[i].1, i));
            if let Some(w) = order
                .windows(2)
                .find(|w| self.pairs[w[0]].1 == self.pairs[w[1]].1)
            {
                return Err(BlockError::DuplicateDst {
                    first: w[0],
                    second: w[1],
                    block: self.pairs[w[0]].1,
                });
            }
        }
        Ok(())
    }

    /// The mapping as a segment list in mapping order, entries that continue the previous one
    /// on both sides (block `s + 1` into block `d + 1` after `s` into `d`) merged into one
    /// segment. Call after [`BlockCopy::check`].
    pub(crate) fn segments(&self) -> Vec<Segment> {
        let b = self.block_bytes as u64;
        let mut out: Vec<Segment> = Vec::with_capacity(self.pairs.len());
        for &(s, d) in &self.pairs {
            if let Some(last) = out.last_mut() {
                if last.src_off + last.len == s * b && last.dst_off + last.len == d * b {
                    last.len += b;
                    continue;
                }
            }
            out.push(Segment::new(d * b, s * b, b));
        }
        out
    }

    /// [`BlockCopy::check`] then [`BlockCopy::segments`]: what [`Op::Blocks`] lowers to.
    pub(crate) fn lower(&self, dst_len: usize, src_len: usize) -> Result<Vec<Segment>, BlockError> {
        self.check(dst_len, src_len)?;
        Ok(self.segments())
    }
}

/// Copies the blocks `map` names from each source table into the destination table of the same
/// position (`dst[t]` from `src[t]`: a KV cache's layers, K and V tables each), as one
/// request: done when every table pair is done, failed with the first failure. Every mapping
/// is checked against every pair first: a refusal names the entry and the table pair, and no
/// byte moves.
///
/// Errors: [`SubmitError::Op`] of a [`BlockError`] (the table counts differ, the mapping does
/// not fit a pair), else the engine's refusal of a pair (unsupported memory kinds, a shut-down
/// engine), the pairs already submitted waited for first.
///
/// ```
/// use ferry::blocks::{copy_tables, BlockCopy};
/// use ferry::{CpuEngine, EngineExt};
/// let engine = CpuEngine::new(2)?;
/// let src: Vec<Vec<u8>> = (0..3u8).map(|l| vec![l; 64]).collect(); // 3 layers, 4 blocks of 16
/// let mut dst: Vec<Vec<u8>> = vec![vec![9u8; 64]; 3];
/// let map = BlockCopy::new(16, [(1, 0), (2, 3)]);
/// engine.scope(|s| -> ferry::Result<()> { Ok(copy_tables(s, &mut dst, &src, &map)?.wait()?) })?;
/// assert!(dst.iter().enumerate().all(|(l, t)| t[..16] == [l as u8; 16] && t[16..48] == [9; 32]));
/// # Ok::<(), ferry::Error>(())
/// ```
pub fn copy_tables<'scope, D, S>(
    scope: &Scope<'scope, '_>,
    dst: &'scope mut [D],
    src: &'scope [S],
    map: &BlockCopy,
) -> Result<Request, SubmitError>
where
    D: MemoryMut,
    S: Memory,
{
    if dst.len() != src.len() {
        return Err(BlockError::TableCount {
            src: src.len(),
            dst: dst.len(),
        }
        .into());
    }
    for (t, (d, s)) in dst.iter().zip(src).enumerate() {
        map.check_in(d.raw().len, s.raw().len, Some(t))?;
    }
    let op = Op::Blocks(Arc::new(map.clone()));
    let mut parts = Vec::with_capacity(dst.len());
    for (d, s) in dst.iter_mut().zip(src) {
        match scope.submit(d, Some(s), op.clone(), &[]) {
            Ok(r) => parts.push(r),
            Err(e) => {
                for p in parts {
                    let _ = p.wait();
                }
                return Err(e);
            }
        }
    }
    Ok(Request::new(Join::new(parts)))
}

/// [`copy_tables`] over raw buffers, outside a scope (the C and Python interfaces): one
/// request over every `(dst, src)` table pair, each started after every request of `after`.
///
/// # Safety
/// As [`Engine::submit_raw`] for every buffer of `tables`, until the returned request
/// completes.
pub unsafe fn submit_tables(
    engine: &dyn Engine,
    tables: &[(RawBuf, RawBuf)],
    map: &BlockCopy,
    after: &[Request],
) -> Result<Request, SubmitError> {
    if tables.is_empty() {
        return Ok(Request::ready(Ok(())));
    }
    for (t, (d, s)) in tables.iter().enumerate() {
        map.check_in(d.len, s.len, Some(t))?;
    }
    let op = Op::Blocks(Arc::new(map.clone()));
    let mut parts = Vec::with_capacity(tables.len());
    for &(dst, src) in tables {
        let job = crate::engine::Job {
            dst,
            src: Some(src),
            op: op.clone(),
            after: after.iter().map(Request::share).collect(),
        };
        // SAFETY: forwarded from the caller.
        match unsafe { engine.submit_raw(job) } {
            Ok(r) => parts.push(r),
            Err(e) => {
                for p in parts {
                    let _ = p.wait();
                }
                return Err(e);
            }
        }
    }
    Ok(Request::new(Join::new(parts)))
}

#[cfg(test)]
mod tests;
