//! Errors of the CUDA engine: each a clear error, no crash, engine usable afterwards. Also the
//! probe and peer copies. Prints `skipped: no CUDA driver` without a GPU.

mod cuda_common;
use cuda_common::*;
use ferry::cuda::{probe, CudaEngine, CudaError, DeviceBuffer, Location, ManagedBuffer};
use ferry::{Engine, EngineExt, Error, Layout, MemKind, SubmitError};

fn still_works(e: &CudaEngine) {
    let l = Layout::bytes(1 << 20).unwrap();
    check_copy(
        e,
        Kind::Device,
        Kind::Pinned,
        &l,
        1 << 20,
        &l,
        1 << 20,
        4242,
    );
}

/// Runs without a GPU too: the probe then reports the missing driver and no device.
#[test]
fn probe_reports_the_device() {
    let p = probe();
    let Ok(v) = p.driver else {
        println!("no CUDA driver: checked that the probe lists no device");
        assert!(p.devices.is_empty());
        return;
    };
    println!("{p:#?}");
    assert!(v >= 12000, "driver version {v}");
    let d = p.devices.first().expect("a driver with no device");
    assert!(!d.name.is_empty());
    assert!(d.async_engines.unwrap_or(0) >= 1);
    assert!(d.sm_count.unwrap_or(0) >= 1);
    assert!(d.total_mem.unwrap_or(0) > 0);
    assert_eq!(p.peer.len(), p.devices.len());
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn bad_device_and_unsupported_kinds() {
    let Some(e) = cuda_or_skip() else { return };
    let count = probe().devices.len() as u32;
    assert!(matches!(
        cuda_engine(count),
        Err(CudaError::NoDevice { .. })
    ));
    assert!(matches!(
        DeviceBuffer::new(count + 3, 16),
        Err(CudaError::NoDevice { .. })
    ));
    // A buffer on a device this engine cannot reach.
    let far = ferry::RawBuf {
        addr: 0x1000,
        len: 64,
        kind: MemKind::Device { ordinal: count + 5 },
    };
    let here = [0u8; 64];
    let l = Layout::bytes(64).unwrap();
    // SAFETY: the job is refused before any memory is touched (unreachable device).
    let r = unsafe {
        e.submit_raw(ferry::Job::copy(
            far,
            l,
            ferry::RawBuf::host(here.as_ptr(), 64, MemKind::Pageable),
            l,
        ))
    };
    match r {
        Err(err @ SubmitError::Unsupported { .. }) => println!("wrong device: {err}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    // Pageable to pageable and fills of pageable memory belong to the CPU engine.
    let mut a = vec![0u8; 64];
    let b = vec![1u8; 64];
    let r = e
        .scope(|s| Ok::<_, ferry::BarrierError>(s.memcpy(&mut a, &b).map(|_| ())))
        .unwrap();
    assert!(matches!(r, Err(SubmitError::Unsupported { .. })), "{r:?}");
    let r = e
        .scope(|s| Ok::<_, ferry::BarrierError>(s.fill(&mut a, &l, &[1]).map(|_| ())))
        .unwrap();
    assert!(matches!(r, Err(SubmitError::Unsupported { .. })), "{r:?}");
    still_works(&e);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn layout_larger_than_buffer() {
    let Some(e) = cuda_or_skip() else { return };
    let mut dev = DeviceBuffer::new(0, 1000).unwrap();
    let src = vec![0u8; 4096];
    let l = Layout::bytes(4096).unwrap();
    let r = e
        .scope(|s| Ok::<_, ferry::BarrierError>(s.copy(&mut dev, &l, &src[..], &l).map(|_| ())))
        .unwrap();
    match r {
        Err(err @ SubmitError::Op(_)) => println!("too large: {err}"),
        other => panic!("expected an Op error, got {other:?}"),
    }
    let big = Layout::contiguous(&[100, 100], 1).unwrap();
    let r = e
        .scope(|s| Ok::<_, ferry::BarrierError>(s.fill(&mut dev, &big, &[1]).map(|_| ())))
        .unwrap();
    assert!(matches!(r, Err(SubmitError::Op(_))), "{r:?}");
    still_works(&e);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_out_of_memory() {
    let Some(e) = cuda_or_skip() else { return };
    let total = probe().devices[0].total_mem.unwrap();
    match DeviceBuffer::new(0, total * 2) {
        Err(err @ CudaError::Alloc { .. }) => {
            let s = err.to_string();
            println!("out of memory: {s}");
            assert!(
                s.contains("OUT_OF_MEMORY") || s.contains("out of memory"),
                "{s}"
            );
            let as_ferry: Error = err.into();
            assert!(as_ferry.to_string().contains("device memory"));
        }
        other => panic!("expected an allocation error, got {other:?}"),
    }
    still_works(&e);
    // Managed memory of a modest size, prefetched both ways.
    let mut m = ManagedBuffer::new(0, 8 << 20).unwrap();
    m.fill(3);
    m.prefetch_to(Location::Device(0)).unwrap();
    m.prefetch_to(Location::Host).unwrap();
    assert!(m.iter().all(|&b| b == 3));
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn peer_copies() {
    let Some(e0) = cuda_or_skip() else { return };
    let p = probe();
    if p.devices.len() < 2 {
        println!("skipped: needs 2 GPUs");
        return;
    }
    let n = 8 << 20;
    let data = bytes(n, 77);
    let src = DeviceBuffer::from_host(1, &data).unwrap();
    let mut dst = DeviceBuffer::new(0, n).unwrap();
    let r = e0
        .scope(|s| Ok::<_, ferry::BarrierError>(s.memcpy(&mut dst, &src).map(|r| r.wait())))
        .unwrap();
    if p.peer[0][1] {
        r.unwrap().unwrap();
        assert!(dst.to_vec().unwrap() == data);
    } else {
        assert!(matches!(r, Err(SubmitError::Unsupported { .. })), "{r:?}");
        println!("peer pair 0<-1 unsupported, reported as such");
    }
    still_works(&e0);
}

/// cudarc keeps the error of an earlier asynchronous call (a drop's free) in its context
/// object and returns it, once, from its next call that binds that context, without making
/// the call. Where ferry waits for work before memory is freed or reused (its requests, the
/// staging ring's slots, the gather tables, the split copies, a pipeline's failed stage, an
/// engine's drop) it makes the context current and waits with the driver's own calls, so such
/// an error ends no wait early. Here, with the engine's streams, events and staging ring made
/// (by a first round of copies) and then an error stored in its context: the next copy may
/// fail with that error (a cudarc call on its path returns it), but no DMA is still running
/// when its request is done (the null driver's asynchronous mode counts pending work), every
/// copy after it moves every byte, and the engine works on.
///
/// The stored error lives in the process's one context object for device 0, which every test
/// of this binary shares: a concurrent test's call could take it first (it did, about one run
/// in ten). So the test runs in a process of its own: this binary again, with only this test.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn an_error_cudarc_stored_ends_no_wait_early() {
    const ALONE: &str = "FERRY_TEST_ALONE";
    if std::env::var_os(ALONE).is_none() {
        let name = "an_error_cudarc_stored_ends_no_wait_early";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        print!("{text}");
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    use cudarc::driver::{sys::CUresult, DriverError};
    let Some(e) = cuda_or_skip() else { return };
    let _null = null::exclusive();
    let on_null = null::is_null_driver() && null::set_async(200);
    let n = 8 << 20;
    let l = Layout::bytes(n).unwrap();
    let data = bytes(n, 77);
    let pinned = pinned_with(&data);
    let mut failed = 0;
    for round in 0..3 {
        if round == 1 {
            e.context()
                .record_err::<()>(Err(DriverError(CUresult::CUDA_ERROR_UNKNOWN)));
        }
        for (what, src) in [("pageable", &data[..]), ("pinned", &pinned[..])] {
            let mut dev = DeviceBuffer::zeroed(0, n).unwrap();
            let r = e.scope(|s| s.copy(&mut dev, &l, src, &l)?.wait().map_err(Error::from));
            if on_null {
                assert_eq!(
                    null::pending(),
                    Some(0),
                    "{what} copy done, DMA still queued"
                );
            }
            match r {
                Err(err) if round == 1 && failed == 0 => {
                    failed += 1;
                    assert_eq!(
                        err.driver_error().map(|d| d.code),
                        Some(CUresult::CUDA_ERROR_UNKNOWN),
                        "{err}"
                    );
                    continue;
                }
                r => r.unwrap_or_else(|err| panic!("round {round}, {what} -> device: {err}")),
            }
            check(what, &dev.to_vec().unwrap(), &data);
            let mut back = vec![0u8; n];
            e.scope(|s| {
                s.copy(&mut back[..], &l, &dev, &l)?
                    .wait()
                    .map_err(Error::from)
            })
            .unwrap_or_else(|err| panic!("round {round}, device -> pageable: {err}"));
            check("device -> pageable", &back, &data);
        }
    }
    if on_null {
        null::set_async(null::default_async());
    }
    still_works(&e);
}
