//! Across GPUs: peer copies between every pair (peer access on first use), one direction,
//! both at once and all pairs at once; host <-> devices transfers striped over every GPU by
//! the multiplex engine; device copies split between a copy engine and the SMs. Every byte is
//! checked. Prints `skipped: no CUDA driver` without a driver and `skipped: needs 2 GPUs` for
//! the tests between GPUs on fewer.

mod cuda_common;
use cuda_common::{bytes, cuda_config, cuda_engine};
use ferry::cuda::multi::MultiGpu;
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::{EngineExt, Layout};

fn gpus_or_skip(need: usize) -> Option<u32> {
    let p = ferry::cuda::probe();
    if p.driver.is_err() {
        println!("skipped: no CUDA driver");
        return None;
    }
    if p.devices.len() < need {
        println!("skipped: needs {need} GPUs");
        return None;
    }
    Some(p.devices.len() as u32)
}

fn pairs(n: u32) -> Vec<(u32, u32)> {
    (0..n)
        .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn peer_copy_every_pair_one_way() {
    let Some(n) = gpus_or_skip(2) else { return };
    println!("peer access matrix: {:?}", ferry::cuda::probe().peer);
    let engines: Vec<CudaEngine> = (0..n).map(|g| cuda_engine(g).unwrap()).collect();
    for size in [1, (1 << 20) + 3, 64 << 20] {
        for (a, b) in pairs(n) {
            let data = bytes(size, (a * 31 + b) as u64);
            let src = DeviceBuffer::from_host(a, &data).unwrap();
            // Pushed by the source GPU's engine, then pulled by the destination's.
            for by in [a, b] {
                let mut dst = DeviceBuffer::from_host(b, &vec![0xA5; size]).unwrap();
                engines[by as usize]
                    .scope(|s| s.memcpy(&mut dst, &src)?.wait().map_err(ferry::Error::from))
                    .unwrap();
                assert!(
                    dst.to_vec().unwrap() == data,
                    "{size} B, GPU {a} -> GPU {b} by engine {by}"
                );
            }
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn peer_copy_both_ways_and_all_pairs_at_once() {
    let Some(n) = gpus_or_skip(2) else { return };
    let gpus = MultiGpu::with_configs(cuda_config).unwrap();
    let size = (32 << 20) + 5;
    let ps = pairs(n);
    let srcs: Vec<DeviceBuffer> = ps
        .iter()
        .map(|&(a, b)| DeviceBuffer::from_host(a, &bytes(size, (a * 7 + b) as u64)).unwrap())
        .collect();
    let mut dsts: Vec<DeviceBuffer> = ps
        .iter()
        .map(|&(_, b)| DeviceBuffer::from_host(b, &vec![0xA5; size]).unwrap())
        .collect();
    for round in 0..2 {
        // Every ordered pair at once (so both directions of each pair too), one scope.
        gpus.engine()
            .scope(|s| {
                for (d, src) in dsts.iter_mut().zip(&srcs) {
                    s.memcpy(d, src).map(drop)?;
                }
                Ok::<(), ferry::Error>(())
            })
            .unwrap();
        for (i, &(a, b)) in ps.iter().enumerate() {
            assert!(
                dsts[i].to_vec().unwrap() == bytes(size, (a * 7 + b) as u64),
                "round {round}: GPU {a} -> GPU {b}"
            );
            dsts[i].copy_from_host(&vec![0xA5; size]).unwrap();
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn peer_copy_strided_between_gpus() {
    let Some(_) = gpus_or_skip(2) else { return };
    let e = cuda_engine(0).unwrap();
    // 300 rows of 1000 bytes out of a matrix with 4096-byte rows, GPU 0 -> GPU 1.
    let (rows, w, pitch) = (300usize, 1000usize, 4096usize);
    let data = bytes(rows * pitch, 5);
    let src = DeviceBuffer::from_host(0, &data).unwrap();
    let mut dst = DeviceBuffer::from_host(1, &vec![0u8; rows * w]).unwrap();
    let sl = Layout::pitched(&[rows, w], 1, pitch).unwrap();
    let dl = Layout::contiguous(&[rows, w], 1).unwrap();
    e.scope(|s| Ok::<_, ferry::BarrierError>(s.copy(&mut dst, &dl, &src, &sl).map(drop)))
        .unwrap()
        .unwrap();
    let want: Vec<u8> = data.chunks(pitch).flat_map(|r| r[..w].to_vec()).collect();
    assert!(dst.to_vec().unwrap() == want);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn striped_scatter_and_gather_every_byte() {
    // One GPU works too (one part); with several, each part runs on its own GPU's link.
    let Some(n) = gpus_or_skip(1) else { return };
    let gpus = MultiGpu::with_configs(cuda_config).unwrap();
    assert_eq!(gpus.count(), n);
    for part in [4097usize, 64 << 20] {
        let total = part * n as usize + 11;
        let data = bytes(total, part as u64);
        let mut host = PinnedBuffer::new(total).unwrap();
        host.copy_from_slice(&data);
        let mut parts: Vec<DeviceBuffer> = (0..n)
            .map(|g| DeviceBuffer::from_host(g, &vec![0xA5; part]).unwrap())
            .collect();
        gpus.scatter(&mut parts, &host).unwrap();
        for (g, p) in parts.iter().enumerate() {
            assert!(
                p.to_vec().unwrap()[..] == data[g * part..(g + 1) * part],
                "part {g} of {part} B"
            );
        }
        // Back into a poisoned pageable buffer: the parts, then the untouched tail.
        let mut back = vec![0x5Au8; total];
        gpus.gather(&mut back, &parts).unwrap();
        assert!(back[..part * n as usize] == data[..part * n as usize]);
        assert!(back[part * n as usize..].iter().all(|&b| b == 0x5A));
    }
    // A source shorter than the parts is refused, nothing copied.
    let mut parts: Vec<DeviceBuffer> = (0..n)
        .map(|g| DeviceBuffer::new(g, 4096).unwrap())
        .collect();
    let short = vec![0u8; 4096 * n as usize - 1];
    assert!(gpus.scatter(&mut parts, &short).is_err());
    let mut short = vec![0u8; 10];
    assert!(gpus.gather(&mut short, &parts).is_err());
}

/// Empty parts copy nothing, in `scatter` and `gather`, wherever they are among the others. A
/// zero-length source once made `gather` fail after its earlier copies were submitted and
/// return without waiting for them, ending the destination's borrow while they still wrote it
/// (the 64 MiB part first makes that window wide: the bytes below would be checked while it was
/// still copying, or after the caller freed the buffer).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn scatter_and_gather_skip_empty_parts() {
    let Some(n) = gpus_or_skip(1) else { return };
    let gpus = MultiGpu::with_configs(cuda_config).unwrap();
    let sizes = [64usize << 20, 0, 4097, 0];
    let total: usize = sizes.iter().sum();
    let data = bytes(total, 77);
    let mut parts: Vec<DeviceBuffer> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| DeviceBuffer::new(i as u32 % n, len).unwrap())
        .collect();
    gpus.scatter(&mut parts, &data).unwrap();
    assert!(parts[0].to_vec().unwrap() == data[..64 << 20]);
    assert!(parts[2].to_vec().unwrap() == data[64 << 20..]);
    let mut back = vec![0x5Au8; total + 5];
    gpus.gather(&mut back, &parts).unwrap();
    assert!(back[..total] == data[..]);
    assert!(back[total..].iter().all(|&b| b == 0x5A));
    // Only empty parts: nothing to do.
    let empty = [DeviceBuffer::new(0, 0).unwrap()];
    gpus.gather(&mut back, &empty).unwrap();
    assert!(back[..total] == data[..]);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn d2d_split_between_copy_engine_and_sms_every_byte() {
    let Some(_) = gpus_or_skip(1) else { return };
    for share in [1u8, 30, 50, 100] {
        let e = CudaEngine::with_config(cuda_config(0).d2d_sm_share(share)).unwrap();
        for (size, off) in [
            (64 << 20, 0usize),
            ((16 << 20) + 7, 3),
            (8 << 20, 0),
            (4096, 0),
        ] {
            let data = bytes(size + off, share as u64 + size as u64);
            let src = DeviceBuffer::from_host(0, &data).unwrap();
            let mut dst = DeviceBuffer::from_host(0, &vec![0xA5; size + off]).unwrap();
            // `off` bytes in on both sides: an odd offset takes the kernel's byte path.
            let l = Layout::bytes(size).unwrap().with_offset(off).unwrap();
            e.scope(|s| {
                s.copy(&mut dst, &l, &src, &l)?
                    .wait()
                    .map_err(ferry::Error::from)
            })
            .unwrap();
            let got = dst.to_vec().unwrap();
            assert!(
                got[off..] == data[off..],
                "share {share}%, {size} B at offset {off}"
            );
            assert!(
                got[..off].iter().all(|&b| b == 0xA5),
                "bytes before the range written"
            );
        }
    }
}
