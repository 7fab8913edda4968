//! `ferry_dma_copy_blocks` through the C ABI on the CPU engine.

use crate::*;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

fn last() -> String {
    // SAFETY: no arguments; the pointer is read before the next call on this thread.
    unsafe { CStr::from_ptr(ferry_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn host(v: &mut [u8]) -> FerryBuffer {
    FerryBuffer {
        ptr: v.as_mut_ptr() as *mut c_void,
        len: v.len(),
        kind: FERRY_MEM_PAGEABLE,
        device: 0,
    }
}

/// Submits and waits; the return code of the first failing call.
fn copy(
    dma: *mut FerryDma,
    dst: &[FerryBuffer],
    src: &[FerryBuffer],
    block: usize,
    s: &[i64],
    d: &[i64],
) -> i32 {
    let mut req = null_mut();
    // SAFETY: valid handles and arrays of the lengths given; the buffers outlive the wait.
    let rc = unsafe {
        ferry_dma_copy_blocks(
            dma,
            &mut req,
            dst.as_ptr(),
            src.as_ptr(),
            dst.len().min(src.len()),
            block,
            s.as_ptr(),
            d.as_ptr(),
            s.len().min(d.len()),
        )
    };
    if rc != FERRY_SUCCESS {
        assert!(req.is_null(), "no request on failure");
        return rc;
    }
    // SAFETY: a live request of `dma`.
    unsafe { ferry_request_wait(dma, &mut req) }
}

fn cpu() -> *mut FerryDma {
    let mut d = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ferry_dma_cpu_create(&mut d, 2) }, FERRY_SUCCESS);
    d
}

#[test]
fn blocks_of_several_tables_in_one_request() {
    let dma = cpu();
    let block = 32;
    let mut src: Vec<Vec<u8>> = (0..3u8)
        .map(|l| (0..8 * 32).map(|i| i as u8 ^ l).collect())
        .collect();
    let mut dst: Vec<Vec<u8>> = vec![vec![0xEEu8; 6 * 32]; 3];
    let sb: Vec<FerryBuffer> = src.iter_mut().map(|v| host(v)).collect();
    let db: Vec<FerryBuffer> = dst.iter_mut().map(|v| host(v)).collect();
    let (s, d) = ([7i64, 0, 3], [0i64, 5, 2]);
    assert_eq!(
        copy(dma, &db, &sb, block, &s, &d),
        FERRY_SUCCESS,
        "{}",
        last()
    );
    for (l, t) in dst.iter().enumerate() {
        for blk in 0..6 {
            let got = &t[blk * 32..(blk + 1) * 32];
            match d.iter().position(|&x| x as usize == blk) {
                Some(i) => {
                    let sb = s[i] as usize;
                    assert_eq!(
                        got,
                        &src[l][sb * 32..(sb + 1) * 32],
                        "layer {l} block {blk}"
                    );
                }
                None => assert!(
                    got.iter().all(|&b| b == 0xEE),
                    "layer {l} block {blk} written"
                ),
            }
        }
    }
    // SAFETY: a live dma.
    assert_eq!(unsafe { ferry_dma_destroy(&mut { dma }) }, 0);
}

#[test]
fn bad_mappings_are_refused_naming_the_entry_and_the_table() {
    let dma = cpu();
    let mut src = [vec![1u8; 64], vec![2u8; 64]];
    let mut dst = [vec![0u8; 64], vec![0u8; 48]];
    let sb: Vec<FerryBuffer> = src.iter_mut().map(|v| host(v)).collect();
    let db: Vec<FerryBuffer> = dst.iter_mut().map(|v| host(v)).collect();
    // Block 3 of 16 bytes fits the first destination table (4 blocks), not the second (3).
    assert_eq!(copy(dma, &db, &sb, 16, &[0, 1], &[1, 3]), -FERRY_EINVAL);
    let m = last();
    assert!(m.contains("entry 1") && m.contains("table pair 1"), "{m}");
    assert_eq!(
        copy(dma, &db, &sb, 16, &[0, 1, 2], &[1, 0, 1]),
        -FERRY_EINVAL
    );
    assert!(last().contains("entries 0 and 2"), "{}", last());
    assert_eq!(copy(dma, &db, &sb, 16, &[-1], &[0]), -FERRY_EINVAL);
    assert!(last().contains("negative"), "{}", last());
    assert_eq!(copy(dma, &db, &sb, 0, &[0], &[0]), -FERRY_EINVAL);
    assert!(
        dst.iter().all(|t| t.iter().all(|&b| b == 0)),
        "nothing moved"
    );
    // An empty mapping, or no tables: done at once.
    assert_eq!(copy(dma, &db, &sb, 16, &[], &[]), FERRY_SUCCESS);
    assert_eq!(copy(dma, &[], &[], 16, &[0], &[0]), FERRY_SUCCESS);
    // NULL arrays where they are needed.
    let mut req = null_mut();
    // SAFETY: NULL table arrays with a count: refused before any read.
    let rc =
        unsafe { ferry_dma_copy_blocks(dma, &mut req, null(), null(), 1, 16, null(), null(), 1) };
    assert_eq!(rc, -FERRY_EINVAL);
    assert!(req.is_null());
    // SAFETY: a live dma.
    assert_eq!(unsafe { ferry_dma_destroy(&mut { dma }) }, 0);
}
