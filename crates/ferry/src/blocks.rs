//! Block copies ([`Op::Blocks`]): the constructors, and one operator over several buffer pairs
//! as one request ([`Op::submit_pairs`]: a KV cache's layers, K and V tables each). The
//! mapping's checks and its lowering to a segment list are in `op.rs` (`check_blocks`,
//! `block_segments`, `BlockList`), beside the segment list's own checks. The CUDA engine hands
//! a checked mapping whose route starts with the gatherer to it as it is (`submit.rs`
//! `enqueue_blocks`): the gather kernel's table is written straight from the mapping.

use crate::engine::{Engine, Job, Scope, SubmitError};
use crate::memory::{Memory, MemoryMut, RawBuf};
use crate::op::{check_blocks, Op, OpError};
use crate::request::{Join, Request};
use std::sync::Arc;

impl Op {
    /// [`Op::Blocks`]: block `s` of the source into block `d` of the destination for every
    /// `(s, d)` of `pairs`, blocks of `block_bytes` bytes (checked against the buffers at
    /// submit).
    pub fn blocks(block_bytes: usize, pairs: impl IntoIterator<Item = (u64, u64)>) -> Op {
        Op::Blocks {
            block_bytes,
            pairs: pairs.into_iter().collect(),
        }
    }

    /// [`Op::Blocks`] of block `src[i]` into block `dst[i]` for every `i` (vLLM's mapping as
    /// two index arrays). Errors: [`OpError::BlockIndexCount`], [`OpError::BlockNegative`].
    pub fn blocks_from_indices(
        block_bytes: usize,
        src: &[i64],
        dst: &[i64],
    ) -> Result<Op, OpError> {
        if src.len() != dst.len() {
            return Err(OpError::BlockIndexCount {
                src: src.len(),
                dst: dst.len(),
            });
        }
        let idx = |index: usize, side, value: i64| {
            u64::try_from(value).map_err(|_| OpError::BlockNegative { index, side, value })
        };
        let pairs = src
            .iter()
            .zip(dst)
            .enumerate()
            .map(|(i, (&s, &d))| Ok((idx(i, "source", s)?, idx(i, "destination", d)?)))
            .collect::<Result<Arc<[_]>, OpError>>()?;
        Ok(Op::Blocks { block_bytes, pairs })
    }

    /// Checks this operator against a (destination, source) buffer pair of these lengths, as
    /// a submit would: a block copy's mapping, a built-in's program. Custom operators are
    /// lowered by the engine only.
    fn check_pair(&self, dst_len: usize, src_len: usize, table: usize) -> Result<(), OpError> {
        match self {
            Op::Blocks { block_bytes, pairs } => {
                check_blocks(*block_bytes, pairs, dst_len, src_len, Some(table)).map(drop)
            }
            Op::Custom(_) => Ok(()),
            op => op.lower(dst_len, Some(src_len)).map(drop),
        }
    }

    /// Submits this operator over each buffer pair (`dst[t]` from `src[t]`: a KV cache's
    /// layers, for [`Op::Blocks`]) as one request: done when every pair is done, failed with
    /// the first failure. The operator is checked against every pair first (a block copy's
    /// errors name the entry and the pair), so a refusal moves no byte.
    ///
    /// Errors: [`OpError::PairCount`], the operator's errors, else the engine's refusal of a
    /// pair (unsupported memory kinds, a shut-down engine), the pairs already submitted
    /// waited for first.
    ///
    /// ```
    /// use ferry::{CpuEngine, EngineExt, Op};
    /// let engine = CpuEngine::new(2)?;
    /// let src: Vec<Vec<u8>> = (0..3u8).map(|l| vec![l; 64]).collect(); // 3 layers, 4 blocks of 16
    /// let mut dst: Vec<Vec<u8>> = vec![vec![9u8; 64]; 3];
    /// let op = Op::blocks(16, [(1, 0), (2, 3)]);
    /// engine.scope(|s| -> ferry::Result<()> { Ok(op.submit_pairs(s, &mut dst, &src)?.wait()?) })?;
    /// assert!(dst.iter().enumerate().all(|(l, t)| t[..16] == [l as u8; 16] && t[16..48] == [9; 32]));
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn submit_pairs<'scope, D, S>(
        &self,
        scope: &Scope<'scope, '_>,
        dst: &'scope mut [D],
        src: &'scope [S],
    ) -> Result<Request, SubmitError>
    where
        D: MemoryMut,
        S: Memory,
    {
        if dst.len() != src.len() {
            return Err(OpError::PairCount {
                src: src.len(),
                dst: dst.len(),
            }
            .into());
        }
        for (t, (d, s)) in dst.iter().zip(src).enumerate() {
            self.check_pair(d.raw().len, s.raw().len, t)?;
        }
        let mut parts = Vec::with_capacity(dst.len());
        for (d, s) in dst.iter_mut().zip(src) {
            match scope.submit(d, Some(s), self.clone(), &[]) {
                Ok(r) => parts.push(r),
                Err(e) => return Err(abandon(parts, e)),
            }
        }
        Ok(Request::new(Join::new(parts)))
    }

    /// [`Op::submit_pairs`] over raw buffers, outside a scope (the C and Python interfaces):
    /// one request over every `(dst, src)` pair, each started after every request of `after`.
    ///
    /// # Safety
    /// As [`Engine::submit_raw`] for every buffer of `pairs`, until the returned request
    /// completes.
    pub unsafe fn submit_raw_pairs(
        &self,
        engine: &dyn Engine,
        pairs: &[(RawBuf, RawBuf)],
        after: &[Request],
    ) -> Result<Request, SubmitError> {
        for (t, (d, s)) in pairs.iter().enumerate() {
            self.check_pair(d.len, s.len, t)?;
        }
        let mut parts = Vec::with_capacity(pairs.len());
        for &(dst, src) in pairs {
            let job = Job {
                dst,
                src: Some(src),
                op: self.clone(),
                after: after.iter().map(Request::share).collect(),
            };
            // SAFETY: forwarded from the caller.
            match unsafe { engine.submit_raw(job) } {
                Ok(r) => parts.push(r),
                Err(e) => return Err(abandon(parts, e)),
            }
        }
        Ok(Request::new(Join::new(parts)))
    }
}

/// Waits for the pairs already submitted (their buffers are the caller's again when the
/// refusal returns) and passes the refusal on.
fn abandon(parts: Vec<Request>, e: SubmitError) -> SubmitError {
    for p in parts {
        let _ = p.wait();
    }
    e
}

#[cfg(test)]
mod tests;
