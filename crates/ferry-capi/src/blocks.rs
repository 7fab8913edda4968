//! `ferry_dma_copy_blocks`: the blocks a mapping names, copied between block tables (a KV
//! cache's swap), every table pair in one request ([`Op::Blocks`], [`Op::submit_raw_pairs`]).

use crate::dma::{dma_ref, FerryDma};
use crate::error::{array, guard, out, Fail, FERRY_SUCCESS};
use crate::request::{FerryBuffer, FerryRequest};
use ferry::Op;
use std::ffi::c_int;

/// Copies block `src_blocks[i]` of each source table into block `dst_blocks[i]` of the
/// destination table of the same position (`dst_tables[t]` from `src_tables[t]`), for every
/// `i < nblocks`, blocks of `block_bytes` bytes (block `b` of a table: bytes `b * block_bytes
/// ..` of its buffer), as one request. Never waits for the copy. `nblocks` 0 (index arrays may
/// then be NULL) or `ntables` 0: a request that is already done.
///
/// Returns `FERRY_SUCCESS` and the request in `*req`, or (nothing submitted, `*req` unchanged)
/// `-FERRY_EINVAL` (NULL or invalid arguments; a block index negative or past its table's end,
/// two entries writing one destination block, `block_bytes` 0: the message names the entry and
/// the table pair), `-FERRY_EOVERLAP`, `-FERRY_EUNSUPPORTED`, `-FERRY_ESHUTDOWN`,
/// `-FERRY_EDRIVER`.
///
/// # Safety
/// 1. `dma` is NULL or a dma not yet destroyed; `req` is NULL or valid for one write.
/// 2. `dst_tables` and `src_tables` are NULL or valid for reads of `ntables` buffers, each
///    describing memory of the kind it claims; `src_blocks` and `dst_blocks` NULL or valid for
///    reads of `nblocks` indices.
/// 3. The buffer lifetime contract of `ferry_dma_request_create` for every table, until the
///    request is released.
#[allow(clippy::too_many_arguments)]
#[no_mangle]
pub unsafe extern "C" fn ferry_dma_copy_blocks(
    dma: *mut FerryDma,
    req: *mut *mut FerryRequest,
    dst_tables: *const FerryBuffer,
    src_tables: *const FerryBuffer,
    ntables: usize,
    block_bytes: usize,
    src_blocks: *const i64,
    dst_blocks: *const i64,
    nblocks: usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let d = unsafe { dma_ref(dma) }?;
        // SAFETY: (1).
        let slot = unsafe { out(req, "req") }?;
        let (map, tables) = if ntables == 0 {
            (Op::blocks(block_bytes, []), Vec::new())
        } else {
            // SAFETY: (2).
            let (dt, st) = unsafe {
                (
                    array(dst_tables, ntables, "dst_tables")?,
                    array(src_tables, ntables, "src_tables")?,
                )
            };
            let map = if nblocks == 0 {
                Op::blocks(block_bytes, [])
            } else {
                // SAFETY: (2).
                let (s, dd) = unsafe {
                    (
                        array(src_blocks, nblocks, "src_blocks")?,
                        array(dst_blocks, nblocks, "dst_blocks")?,
                    )
                };
                Op::blocks_from_indices(block_bytes, s, dd)
                    .map_err(|e| Fail::inval(e.to_string()))?
            };
            let tables = dt
                .iter()
                .zip(st)
                .enumerate()
                .map(|(t, (a, b))| {
                    Ok((
                        a.raw(&format!("dst_tables[{t}]"))?,
                        b.raw(&format!("src_tables[{t}]"))?,
                    ))
                })
                .collect::<Result<Vec<_>, Fail>>()?;
            (map, tables)
        };
        // SAFETY: the caller's contract (3) is the engine's, for every table.
        let r = unsafe { map.submit_raw_pairs(&*d.engine, &tables, &[]) }?;
        *slot = FerryRequest::boxed(d.id, r);
        Ok(FERRY_SUCCESS)
    })
}

#[cfg(test)]
#[path = "blocks_tests.rs"]
mod tests;
