//! Block copies on the CUDA engine (issue 34): the blocks a mapping names, between block tables
//! of every memory kind pair the engine takes, in every direction, with the SMs free (the
//! default route) and busy (`CudaConfig::compute_busy`: the batched DMA); several tables as one
//! request; refusals before any byte moves; the driver's batched copy refusing a batch (the
//! null driver's injected failure) and that batch alone copied one call per segment.
//!
//! Every destination byte is checked against a CPU reference: the mapped blocks, and every
//! other byte of the table untouched.

mod cuda_common;
mod stress_common;

use cuda_common::{bytes, check, cuda_config, null, Buf, Kind, KINDS};
use cudarc::driver::CudaContext;
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::engine::cuda::gather::{Gatherer, Strategy};
use ferry::{EngineExt, Memory, MemoryMut, Op, OpError, SubmitError};
use stress_common::Rng;

/// A block copy's block size and pairs.
fn parts(op: &Op) -> (usize, &[(u64, u64)]) {
    match op {
        Op::Blocks { block_bytes, pairs } => (*block_bytes, pairs),
        _ => unreachable!("a block copy"),
    }
}

/// What a block copy writes into `dst`.
fn reference(dst: &[u8], src: &[u8], map: &Op) -> Vec<u8> {
    let (b, pairs) = parts(map);
    let mut out = dst.to_vec();
    for &(s, d) in pairs {
        let (s, d) = (s as usize * b, d as usize * b);
        out[d..d + b].copy_from_slice(&src[s..s + b]);
    }
    out
}

/// `n` (at most `dst_blocks`) random pairs: distinct destinations, any sources, sometimes runs
/// of consecutive blocks on both sides (which the lowering merges).
fn mapping(rng: &mut Rng, block: usize, n: usize, src_blocks: usize, dst_blocks: usize) -> Op {
    let mut dsts: Vec<u64> = (0..dst_blocks as u64).collect();
    for i in (1..dsts.len()).rev() {
        dsts.swap(i, rng.below(i + 1));
    }
    let mut pairs = Vec::with_capacity(n);
    let mut i = 0;
    while pairs.len() < n.min(dst_blocks) {
        let d = dsts[i];
        i += 1;
        if pairs.iter().any(|&(_, pd)| pd == d) {
            continue;
        }
        let s = rng.below(src_blocks) as u64;
        pairs.push((s, d));
        // A run: the next blocks on both sides, where free.
        if rng.chance(1, 4) {
            for k in 1..4u64 {
                let (s2, d2) = (s + k, d + k);
                if s2 < src_blocks as u64
                    && d2 < dst_blocks as u64
                    && pairs.len() < n
                    && !pairs.iter().any(|&(_, pd)| pd == d2)
                {
                    pairs.push((s2, d2));
                } else {
                    break;
                }
            }
        }
        if i == dsts.len() {
            break;
        }
    }
    Op::blocks(block, pairs)
}

fn engine(busy: bool) -> Option<CudaEngine> {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return None;
    }
    Some(CudaEngine::with_config(cuda_config(0).compute_busy(busy)).expect("device 0 opens"))
}

/// One block copy `src_kind` -> `dst_kind` of a random mapping through `eng`, checked.
fn one(eng: &CudaEngine, rng: &mut Rng, dk: Kind, sk: Kind, block: usize, n: usize, what: &str) {
    let (src_blocks, dst_blocks) = (n + 3, n + 5);
    let src_bytes = bytes(src_blocks * block, rng.next());
    let init = bytes(dst_blocks * block, rng.next());
    let map = mapping(rng, block, n, src_blocks, dst_blocks);
    let src = Buf::new(sk, &src_bytes);
    let mut dst = Buf::new(dk, &init);
    eng.scope(|s| -> ferry::Result<()> {
        Ok(s.submit(&mut dst, Some(&src), map.clone(), &[])?.wait()?)
    })
    .unwrap_or_else(|e| panic!("{what}: {sk:?} -> {dk:?}, {n} blocks of {block}: {e}"));
    check(
        &format!("{what}: {sk:?} -> {dk:?}, {n} blocks of {block}"),
        &dst.to_vec(),
        &reference(&init, &src_bytes, &map),
    );
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn every_kind_pair_and_direction_with_the_sms_free_and_busy() {
    for busy in [false, true] {
        let Some(eng) = engine(busy) else { return };
        let what = if busy { "SMs busy" } else { "SMs free" };
        let mut rng = Rng(34 + busy as u64);
        for dk in KINDS {
            for sk in KINDS {
                if dk == Kind::Pageable && sk == Kind::Pageable {
                    continue; // not a CUDA engine's copy
                }
                // Small blocks in many entries (the gather's range), KV-sized blocks, a few
                // 2 MiB ones, and odd sizes.
                for (block, n) in [
                    (16, 300),
                    (8 << 10, 70),
                    (64 << 10, 20),
                    (2 << 20, 3),
                    (1000, 9),
                ] {
                    one(&eng, &mut rng, dk, sk, block, n, what);
                }
            }
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn random_mappings_device_and_pinned_both_ways() {
    let Some(eng) = engine(false) else { return };
    let busy = engine(true).expect("the driver opened once");
    let mut rng = Rng(3434);
    for round in 0..40 {
        let block = [4, 512, 4096, 12 << 10, 32 << 10][rng.below(5)];
        let n = rng.range(0, 200);
        let (dk, sk) = [
            (Kind::Device, Kind::Pinned),
            (Kind::Pinned, Kind::Device),
            (Kind::Device, Kind::Device),
        ][rng.below(3)];
        let e = if round % 2 == 0 { &eng } else { &busy };
        one(e, &mut rng, dk, sk, block, n, &format!("round {round}"));
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn several_tables_per_layer_are_one_request() {
    let Some(eng) = engine(true) else { return };
    let (block, blocks, layers) = (16 << 10, 24, 6);
    let mut rng = Rng(77);
    let host: Vec<Vec<u8>> = (0..layers)
        .map(|_| bytes(block * blocks, rng.next()))
        .collect();
    let src: Vec<PinnedBuffer> = host.iter().map(|h| cuda_common::pinned_with(h)).collect();
    let init: Vec<Vec<u8>> = (0..layers)
        .map(|_| bytes(block * blocks, rng.next()))
        .collect();
    let mut dst: Vec<DeviceBuffer> = init
        .iter()
        .map(|h| DeviceBuffer::from_host(0, h).unwrap())
        .collect();
    let map = mapping(&mut rng, block, 17, blocks, blocks);
    eng.scope(|s| -> ferry::Result<()> { Ok(map.submit_pairs(s, &mut dst, &src)?.wait()?) })
        .unwrap();
    for l in 0..layers {
        check(
            &format!("layer {l}"),
            &dst[l].to_vec().unwrap(),
            &reference(&init[l], &host[l], &map),
        );
    }
}

/// The block error of a refused submit.
fn refusal(e: ferry::Error) -> OpError {
    match e {
        ferry::Error::Submit(SubmitError::Op(b)) => b,
        other => panic!("expected a block refusal, got {other:?}"),
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn bad_mappings_are_refused_before_any_byte_moves() {
    let Some(eng) = engine(false) else { return };
    let block = 4096;
    let src = DeviceBuffer::from_host(0, &bytes(8 * block, 1)).unwrap();
    let init = bytes(8 * block, 2);
    let mut dst = cuda_common::pinned_with(&init);
    let mut run = |map: Op| {
        eng.scope(|s| -> ferry::Result<()> {
            Ok(s.submit(&mut dst, Some(&src), map, &[])?.wait()?)
        })
    };
    let e = refusal(run(Op::blocks(block, [(0, 1), (8, 2)])).unwrap_err());
    assert!(
        matches!(
            e,
            OpError::BlockOutOfRange {
                index: 1,
                side: "source",
                block: 8,
                blocks: 8,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("entry 1"), "{e}");
    let e = refusal(run(Op::blocks(block, [(0, 9)])).unwrap_err());
    assert!(
        matches!(
            e,
            OpError::BlockOutOfRange {
                side: "destination",
                block: 9,
                ..
            }
        ),
        "{e:?}"
    );
    let e = refusal(run(Op::blocks(block, [(0, 3), (1, 4), (2, 3)])).unwrap_err());
    assert_eq!(
        e,
        OpError::BlockDuplicate {
            first: 0,
            second: 2,
            block: 3
        }
    );
    // An empty mapping: done, nothing written.
    run(Op::blocks(block, [])).unwrap();
    check("after refusals", &dst, &init);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_refused_batch_falls_back_alone() {
    let Some(_) = engine(false) else { return };
    if !Gatherer::batch_supported() {
        println!("skipped: the driver lacks cuMemcpyBatchAsync_v2");
        return;
    }
    let _x = null::exclusive();
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.new_stream().expect("stream");
    let g = Gatherer::new(ctx.clone()).expect("gatherer");
    // 10,000 blocks of 512 bytes: three batches (4,096 a batch); the driver refuses the second.
    let (block, n) = (512usize, 10_000usize);
    let host = bytes(n * block, 5);
    let src = cuda_common::pinned_with(&host);
    let mut dst = DeviceBuffer::from_host(0, &vec![0u8; n * block]).unwrap();
    let map = Op::blocks(block, (0..n as u64).map(|i| (i, (i * 7919) % n as u64)));
    let segs: Vec<_> = parts(&map)
        .1
        .iter()
        .map(|&(s, d)| ferry::Segment::new(d * block as u64, s * block as u64, block as u64))
        .collect();
    // CUDA_ERROR_INVALID_VALUE, as the driver answers shapes its batched copy does not take.
    let injected = null::fail(
        "cuMemcpyBatchAsync_v2",
        2,
        cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
    );
    let (d, s) = (dst.raw_mut(), src.raw());
    // SAFETY: both buffers hold n blocks, live and untouched until the stream is synchronized
    // below; the segments lie inside them, destinations distinct; this context's stream.
    let used = unsafe {
        g.copy(
            &stream,
            d.addr,
            d.len,
            s.addr,
            s.len,
            &segs,
            Strategy::Batch,
        )
    }
    .expect("batched copy");
    stream.synchronize().expect("sync");
    assert_eq!(used, Strategy::Batch);
    check(
        "blocks",
        &dst.to_vec().unwrap(),
        &reference(&vec![0u8; n * block], &host, &map),
    );
    let (refused, first) = g.batch_refusals();
    if injected {
        assert_eq!(refused, 1, "one batch refused");
        assert_eq!(
            first.map(|e| e.0),
            Some(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE)
        );
    } else {
        println!("batch refusals on this driver: {refused} (first: {first:?})");
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn the_busy_route_survives_a_refused_batch() {
    // Through the engine: the block copy is right although the driver refused its batch.
    let Some(eng) = engine(true) else { return };
    let _x = null::exclusive();
    if !null::fail(
        "cuMemcpyBatchAsync_v2",
        1,
        cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
    ) {
        println!("skipped: a refused batch is injected by the null driver only");
        return;
    }
    let mut rng = Rng(99);
    one(
        &eng,
        &mut rng,
        Kind::Device,
        Kind::Pinned,
        8 << 10,
        200,
        "refused batch",
    );
    one(
        &eng,
        &mut rng,
        Kind::Pinned,
        Kind::Device,
        8 << 10,
        200,
        "after the refusal",
    );
}
