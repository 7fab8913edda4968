//! Requests on the CUDA engine: dependencies across streams and engines, futures, barriers,
//! many threads, wait modes, drops with work in flight. Prints `skipped: no CUDA driver`
//! without a GPU.

mod cuda_common;
use cuda_common::*;
use ferry::cuda::{CudaEngine, DeviceBuffer, Direction, PinnedBuffer, WaitMode};
use ferry::op::Op;
use ferry::{CpuEngine, Engine, EngineExt, Layout, Request, RequestError};
use std::sync::Arc;

fn copy_op(n: usize) -> Op {
    let l = Layout::bytes(n).unwrap();
    Op::Copy { dst: l, src: l }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn chain_across_streams_runs_in_order() {
    let Some(e) = cuda_or_skip() else { return };
    // H2D, then D2D, then D2H: three streams, ordered only by event dependencies.
    let n = 64 << 20;
    for round in 0..3u64 {
        let data = bytes(n, 7 + round);
        let mut host = PinnedBuffer::new(n).unwrap();
        host.copy_from_slice(&data);
        let mut a = DeviceBuffer::new(0, n).unwrap();
        let mut b = DeviceBuffer::new(0, n).unwrap();
        let mut back = PinnedBuffer::new(n).unwrap();
        // SAFETY: each buffer is written by one request and read only by requests ordered
        // after it; all outlive the barrier below, and nothing else touches them meanwhile.
        unsafe {
            let r1 = copy_raw(&e, dev_raw(&mut a), staging_raw(&host), &[]);
            let r2 = copy_raw(&e, dev_raw(&mut b), dev_ro(&a), &[&r1]);
            let r3 = copy_raw(&e, pinned_raw(&mut back), dev_ro(&b), &[&r2]);
            r3.wait().unwrap();
        }
        e.barrier().unwrap();
        assert!(
            back[..] == data[..],
            "round {round}: chained copies out of order"
        );
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn host_dependency_and_failed_dependency() {
    let Some(e) = cuda_or_skip() else { return };
    let cpu = CpuEngine::new(2).unwrap();
    let n = 16 << 20;
    let data = bytes(n, 11);
    let mut staging = PinnedBuffer::new(n).unwrap();
    let mut dev = DeviceBuffer::new(0, n).unwrap();
    // A CPU request fills the pinned buffer; the GPU copy waits for it on the host.
    // SAFETY: `staging` is written by the CPU request and then only read by the GPU request,
    // which starts after it; all buffers outlive both waits and nothing else touches them.
    unsafe {
        let l = Layout::bytes(n).unwrap();
        let d = ferry::RawBuf::host(data.as_ptr(), n, ferry::MemKind::Pageable);
        let fill = cpu
            .submit_raw(ferry::Job::copy(pinned_raw(&mut staging), l, d, l))
            .unwrap();
        let r = copy_raw(&e, dev_raw(&mut dev), staging_raw(&staging), &[&fill]);
        r.wait().unwrap();
        fill.wait().unwrap();
    }
    assert!(dev.to_vec().unwrap() == data);
    // A failed dependency fails the dependent request without running it.
    let failed = Request::ready(Err(RequestError::Aborted("test".into())));
    let before = dev.to_vec().unwrap();
    let src = bytes(n, 12);
    e.scope(|s| {
        let r = s
            .submit(&mut dev, Some(&src[..]), copy_op(n), &[&failed])
            .unwrap();
        assert!(matches!(r.wait(), Err(RequestError::Dependency(_))));
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    assert!(
        dev.to_vec().unwrap() == before,
        "a request whose dependency failed must not run"
    );
}

/// Submits a flat copy of all of `src` after `after`.
///
/// # Safety
/// As [`Engine::submit_raw`].
unsafe fn copy_raw(
    e: &dyn Engine,
    dst: ferry::RawBuf,
    src: ferry::RawBuf,
    after: &[&Request],
) -> Request {
    let l = Layout::bytes(src.len).unwrap();
    let mut job = ferry::Job::copy(dst, l, src, l);
    for r in after {
        job = job.after(r);
    }
    // SAFETY: the caller's guarantees.
    unsafe { e.submit_raw(job) }.unwrap()
}

fn dev_ro(d: &DeviceBuffer) -> ferry::RawBuf {
    use ferry::Memory;
    d.raw()
}
fn pinned_raw(p: &mut PinnedBuffer) -> ferry::RawBuf {
    use ferry::MemoryMut;
    p.raw_mut()
}
fn dev_raw(d: &mut DeviceBuffer) -> ferry::RawBuf {
    use ferry::MemoryMut;
    d.raw_mut()
}
fn staging_raw(p: &PinnedBuffer) -> ferry::RawBuf {
    use ferry::Memory;
    p.raw()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn futures_complete() {
    let Some(e) = cuda_or_skip() else { return };
    let n = 32 << 20;
    let data = bytes(n, 21);
    let mut dev = DeviceBuffer::new(0, n).unwrap();
    let mut back = vec![0u8; n];
    e.scope(|s| {
        let r = s.memcpy(&mut dev, &data[..]).unwrap();
        block_on(r).unwrap();
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    e.scope(|s| {
        let r = s.memcpy(&mut back[..], &dev).unwrap();
        block_on(r).unwrap();
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    assert!(back == data);
    // Many futures at once, awaited in reverse order.
    let srcs: Vec<Vec<u8>> = (0..16).map(|i| bytes(1 << 20, 30 + i)).collect();
    let mut devs: Vec<DeviceBuffer> = (0..16)
        .map(|_| DeviceBuffer::new(0, 1 << 20).unwrap())
        .collect();
    e.scope(|s| {
        {
            let mut reqs: Vec<Request> = devs
                .iter_mut()
                .zip(&srcs)
                .map(|(d, h)| s.memcpy(d, &h[..]).unwrap())
                .collect();
            while let Some(r) = reqs.pop() {
                block_on(r).unwrap();
            }
        }
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    for (d, h) in devs.iter().zip(&srcs) {
        assert!(d.to_vec().unwrap() == *h);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn barrier_after_many_requests() {
    let Some(e) = cuda_or_skip() else { return };
    let k = 2000;
    let src = bytes(k * 512, 41);
    let mut dev = DeviceBuffer::new(0, k * 512).unwrap();
    {
        let (sl, dl) = (Layout::bytes(512).unwrap(), Layout::bytes(512).unwrap());
        let raw_d = dev_raw(&mut dev);
        for i in 0..k {
            let d = ferry::RawBuf {
                addr: raw_d.addr + (i * 512) as u64,
                len: 512,
                kind: raw_d.kind,
            };
            let s = ferry::RawBuf::host(src[i * 512..].as_ptr(), 512, ferry::MemKind::Pageable);
            // SAFETY: disjoint 512-byte pieces of `dev` and `src`, both alive and untouched
            // until the barrier below; requests are dropped, the barrier waits for them.
            let r = unsafe { e.submit_raw(ferry::Job::copy(d, dl, s, sl)) }.unwrap();
            drop(r);
        }
        e.barrier().unwrap();
    }
    assert!(dev.to_vec().unwrap() == src);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn many_threads_submit_at_once() {
    let Some(e) = cuda_or_skip() else { return };
    let e = Arc::new(e);
    std::thread::scope(|ts| {
        for t in 0..8u64 {
            let e = Arc::clone(&e);
            ts.spawn(move || {
                let n = (1 << 20) + t as usize * 4099;
                let mut dev = DeviceBuffer::new(0, n).unwrap();
                for i in 0..25 {
                    let data = bytes(n, 1000 * t + i);
                    let mut back = PinnedBuffer::new(n).unwrap();
                    let src = ferry::RawBuf::host(data.as_ptr(), n, ferry::MemKind::Pageable);
                    // SAFETY: `dev` is written by `up` and read by `down`, ordered after it;
                    // every buffer outlives both waits and nothing else touches them.
                    unsafe {
                        let up = copy_raw(&*e, dev_raw(&mut dev), src, &[]);
                        let down = copy_raw(&*e, pinned_raw(&mut back), dev_ro(&dev), &[&up]);
                        down.wait().unwrap();
                        up.wait().unwrap();
                    }
                    assert!(back[..] == data[..], "thread {t} round {i}");
                }
            });
        }
    });
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn spin_mode_and_forced_direction() {
    if cuda_or_skip().is_none() {
        return;
    }
    for cfg in [
        cuda_config(0).wait_mode(WaitMode::Spin),
        cuda_config(0).direction(Direction::DeviceToDevice),
        cuda_config(0)
            .wait_mode(WaitMode::Spin)
            .direction(Direction::HostToDevice),
        cuda_config(0).wait_mode(WaitMode::SpinThenBlock(std::time::Duration::from_micros(
            20,
        ))),
    ] {
        let e = CudaEngine::with_config(cfg).unwrap();
        for (i, &k) in [Kind::Pageable, Kind::Pinned, Kind::Device]
            .iter()
            .enumerate()
        {
            let l = Layout::bytes(3 << 20).unwrap();
            check_copy(&e, Kind::Device, k, &l, 3 << 20, &l, 3 << 20, 70 + i as u64);
            check_copy(&e, k, Kind::Device, &l, 3 << 20, &l, 3 << 20, 80 + i as u64);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn try_wait_polls_to_completion() {
    let Some(e) = cuda_or_skip() else { return };
    let n = 256 << 20;
    let data = PinnedBuffer::new(n).unwrap();
    let mut dev = DeviceBuffer::new(0, n).unwrap();
    e.scope(|s| {
        let mut r = s.memcpy(&mut dev, &data).unwrap();
        let mut polls = 0u64;
        let res = loop {
            if let Some(res) = r.try_wait() {
                break res;
            }
            polls += 1;
            std::thread::yield_now();
        };
        res.unwrap();
        println!("256 MiB H2D polled {polls} times before completion");
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn drops_with_work_in_flight_are_safe() {
    let Some(e) = cuda_or_skip() else { return };
    let n = 128 << 20;
    let data = bytes(n, 91);
    let dev = DeviceBuffer::new(0, n).unwrap();
    // Dropping the engine while an owned transfer is in flight: the transfer still completes.
    let t = e
        .memcpy_owned(dev, data.clone())
        .map_err(|r| r.error)
        .unwrap();
    drop(e);
    let (dev, _) = t.wait().map_err(|f| f.error).unwrap();
    assert!(dev.to_vec().unwrap() == data);
    // Dropping requests unwaited inside a scope: the scope waits for them.
    let e = cuda_engine(0).unwrap();
    let mut dev2 = DeviceBuffer::new(0, n).unwrap();
    e.scope(|s| {
        drop(s.memcpy(&mut dev2, &data[..]).unwrap());
        Ok::<_, ferry::BarrierError>(())
    })
    .unwrap();
    assert!(dev2.to_vec().unwrap() == data);
}
