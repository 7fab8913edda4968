//! Requests that record their completion event only when something needs it (`engine/cuda/completion/mark.rs`, issue
//! 14's caller's view): a request waited after a later one on the same stream returns at its
//! own end; `is_done` polling of a stream's last request and of an earlier one; a dependency on
//! another lane's last request; many threads sharing few streams, each copy waited at once;
//! futures woken while their thread submits more; the caller's stream waiting for a lazy
//! request; a stream handed to the caller after a lazy request; small pinned copies while a
//! staged copy uses the same stream; stamped requests (waited by the word their stream writes)
//! ending only after their bytes. Every result byte-checked. Prints `skipped: no CUDA
//! driver` without a GPU.

mod cuda_common;

use cuda_common::*;
use cudarc::driver::sys;
use ferry::cuda::{CudaEngine, DeviceBuffer, Direction, PinnedBuffer};
use ferry::{Engine, Job, Layout, Memory, MemoryMut, RawBuf, Request};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

/// An engine on device 0 with `streams` streams per direction, or `None` after printing
/// `skipped: no CUDA driver`.
fn engine_or_skip(streams: Option<usize>) -> Option<CudaEngine> {
    let e = cuda_or_skip()?;
    let Some(n) = streams else { return Some(e) };
    drop(e);
    Some(CudaEngine::with_config(cuda_config(0).streams(n)).expect("device 0 opens again"))
}

/// A flat copy of all of `src` into `dst` after `after`, panicking with `what` if refused.
///
/// # Safety
/// As [`Engine::submit_raw`].
unsafe fn copy(
    e: &dyn Engine,
    what: &str,
    dst: RawBuf,
    src: RawBuf,
    after: &[&Request],
) -> Request {
    let l = Layout::bytes(src.len).expect("layout");
    let mut job = Job::copy(dst, l, src, l);
    for a in after {
        job = job.after(a);
    }
    // SAFETY: the caller's guarantees.
    unsafe { e.submit_raw(job) }.unwrap_or_else(|err| panic!("{what}: submit refused: {err}"))
}

fn dev_check(what: &str, d: &DeviceBuffer, want: &[u8]) {
    let got = d
        .to_vec()
        .unwrap_or_else(|err| panic!("{what}: read back: {err}"));
    check(what, &got, want);
}

/// Polls `r.is_done()` until true (at most 20 s); the time it took.
fn poll_done(what: &str, r: &Request) -> Duration {
    let t = Instant::now();
    while !r.is_done() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{what}: is_done still false after 20 s"
        );
        std::hint::spin_loop();
    }
    t.elapsed()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_wait_after_a_later_request_on_the_same_stream_ends_at_its_own_end() {
    let Some(e) = engine_or_skip(None) else {
        return;
    };
    if null::is_synchronous()
        && skip_on_null_driver(
            "synchronous mode: the 256 MiB upload is done when submitted, so no wait can end \
             before it",
        )
    {
        return;
    }
    let (small, big) = (64 << 10, 256 << 20);
    let (ds, db) = (bytes(small, 1), bytes(big, 2));
    let (hs, hb) = (pinned_with(&ds), pinned_with(&db));
    let mut a = DeviceBuffer::new(0, small).unwrap();
    let mut b = DeviceBuffer::new(0, big).unwrap();
    // The 256 MiB upload takes at least this long over PCIe 5.0 x16 (64 GB/s): a round whose
    // wait began later than this after the upload was submitted (the thread descheduled in
    // between, as once on an H100 VM: the small wait took 4.7 us, both already done) says
    // nothing about the wait, and is run again.
    let big_min = Duration::from_secs_f64(big as f64 / 64e9);
    let (mut conclusive, mut round) = (0, 0);
    while conclusive < 3 {
        assert!(
            round < 12,
            "only {conclusive} of {round} rounds began their wait within {big_min:?} of the \
             256 MiB upload's submit: this host cannot run the test"
        );
        a.copy_from_host(&vec![0xA5; small]).unwrap();
        // SAFETY: the buffers outlive both waits below.
        let (ra, rb, submitted) = unsafe {
            let ra = copy(&e, "small upload", a.raw_mut(), hs.raw(), &[]);
            let submitted = Instant::now();
            // Same thread, same direction: the same stream, after `ra`.
            let rb = copy(&e, "256 MiB upload", b.raw_mut(), hb.raw(), &[]);
            (ra, rb, submitted)
        };
        let t = Instant::now();
        let late = t - submitted >= big_min;
        ra.wait()
            .unwrap_or_else(|err| panic!("round {round}: small upload: {err}"));
        let waited = t.elapsed();
        let big_done = rb.is_done();
        dev_check(&format!("round {round}: 64 KiB upload"), &a, &ds);
        if late {
            println!(
                "round {round}: the wait began {:?} after the 256 MiB submit: run again",
                t - submitted
            );
        } else {
            println!("round {round}: 64 KiB waited {waited:?} with 256 MiB queued behind it");
            assert!(
                !big_done,
                "round {round}: the 64 KiB wait returned only after the 256 MiB upload queued \
                 behind it ({waited:?}): it waited for the rest of its stream"
            );
            conclusive += 1;
        }
        rb.wait()
            .unwrap_or_else(|err| panic!("round {round}: 256 MiB upload: {err}"));
        dev_check(&format!("round {round}: 256 MiB upload"), &b, &db);
        round += 1;
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn is_done_polling_of_the_last_request_and_of_an_earlier_one() {
    let Some(e) = engine_or_skip(None) else {
        return;
    };
    for (i, &n) in [4usize, 64 << 10, 4 << 20, 64 << 20].iter().enumerate() {
        let (d1, d2) = (bytes(n, 10 + i as u64), bytes(n, 20 + i as u64));
        let (h1, h2) = (pinned_with(&d1), pinned_with(&d2));
        let mut x = DeviceBuffer::new(0, n).unwrap();
        let mut y = DeviceBuffer::new(0, n).unwrap();
        // The stream's last request (no event): polled on the stream.
        // SAFETY: the buffers outlive the polls and waits below.
        let r = unsafe { copy(&e, "alone", x.raw_mut(), h1.raw(), &[]) };
        let took = poll_done(&format!("{n} B alone"), &r);
        r.wait().unwrap();
        dev_check(&format!("{n} B polled alone ({took:?})"), &x, &d1);
        // Two back to back: the first gets its event at the second's submit; both polled,
        // the first first.
        x.copy_from_host(&vec![0x5A; n]).unwrap();
        // SAFETY: as above.
        let (r1, r2) = unsafe {
            (
                copy(&e, "first", x.raw_mut(), h2.raw(), &[]),
                copy(&e, "second", y.raw_mut(), h1.raw(), &[]),
            )
        };
        poll_done(&format!("{n} B first of two"), &r1);
        dev_check(&format!("{n} B first of two, polled"), &x, &d2);
        poll_done(&format!("{n} B second of two"), &r2);
        dev_check(&format!("{n} B second of two, polled"), &y, &d1);
        r1.wait().unwrap();
        r2.wait().unwrap();
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_dependency_on_another_lanes_last_request() {
    // Thread A uploads (its lane's last request, no event) and hands the request to thread B,
    // which copies on the device after it and downloads; A meanwhile submits its next upload
    // on its own stream (recording the first one's event there, racing B's record).
    let Some(e) = engine_or_skip(Some(4)) else {
        return;
    };
    let n = 32 << 20;
    let rounds = 8;
    let wants: Vec<Vec<u8>> = (0..rounds).map(|r| bytes(n, 40 + r as u64)).collect();
    let srcs: Vec<PinnedBuffer> = wants.iter().map(|w| pinned_with(w)).collect();
    let mut xs: Vec<DeviceBuffer> = (0..rounds)
        .map(|_| DeviceBuffer::new(0, n).unwrap())
        .collect();
    let mut y = DeviceBuffer::new(0, n).unwrap();
    let mut z = DeviceBuffer::new(0, n).unwrap();
    let mut out = PinnedBuffer::new(n).unwrap();
    let (y_w, z_w) = (y.raw_mut(), z.raw_mut());
    let (y_r, out_w) = (y.raw(), out.raw_mut());
    let (to_b, at_b) = channel::<(usize, Request, RawBuf)>();
    let (back, at_a) = channel::<()>();
    let e = &e;
    std::thread::scope(|sc| {
        let xs_w: Vec<(RawBuf, RawBuf)> = xs.iter_mut().map(|x| (x.raw_mut(), x.raw())).collect();
        let srcs = &srcs;
        sc.spawn(move || {
            let mut prev: Option<Request> = None;
            for (r, &(xw, xr)) in xs_w.iter().enumerate() {
                // SAFETY: every buffer outlives the thread scope; `x[r]` is written once.
                let up = unsafe { copy(e, "A's upload", xw, srcs[r].raw(), &[]) };
                to_b.send((r, up, xr)).unwrap();
                if let Some(p) = prev.take() {
                    p.wait()
                        .unwrap_or_else(|err| panic!("round {r}: A's wait: {err}"));
                }
                // The next upload of this thread follows on its stream (into A's own `z`).
                // SAFETY: as above; `z` is written by this thread only, each copy waited
                // before the next.
                prev = Some(unsafe { copy(e, "A's next upload", z_w, srcs[r].raw(), &[]) });
                at_a.recv().unwrap();
            }
            if let Some(p) = prev {
                p.wait().unwrap();
            }
        });
        for (r, up, xr) in at_b.iter() {
            // SAFETY: `y` and `out` are only used here, one round at a time.
            let (across, down) = unsafe {
                let across = copy(e, "B's device copy", y_w, xr, &[&up]);
                let down = copy(e, "B's download", out_w, y_r, &[&across]);
                (across, down)
            };
            down.wait()
                .unwrap_or_else(|err| panic!("round {r}: the chain failed: {err}"));
            assert!(
                across.is_done() && up.is_done(),
                "round {r}: dependencies not done"
            );
            check(
                &format!("round {r}: 32 MiB after another lane's upload"),
                &out,
                &wants[r],
            );
            up.wait().unwrap();
            back.send(()).unwrap();
            if r + 1 == rounds {
                break;
            }
        }
    });
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn many_threads_on_few_streams_each_copy_waited() {
    // 16 threads on 3 lanes: several threads per stream, so one thread's wait on the stream
    // races the others' submissions there.
    let Some(e) = engine_or_skip(Some(3)) else {
        return;
    };
    let e = &e;
    std::thread::scope(|sc| {
        for t in 0..16usize {
            sc.spawn(move || {
                for r in 0..64usize {
                    let n = [4usize, 4 << 10, 64 << 10, 1 << 20][(t + r) % 4];
                    let want = bytes(n, (t * 100 + r) as u64);
                    let src = pinned_with(&want);
                    let mut d = DeviceBuffer::new(0, n).unwrap();
                    let mut out = PinnedBuffer::new(n).unwrap();
                    out.fill(0xA5);
                    let what = format!("thread {t} round {r} ({n} B)");
                    // SAFETY: the buffers outlive each wait.
                    unsafe {
                        copy(e, &what, d.raw_mut(), src.raw(), &[])
                            .wait()
                            .unwrap_or_else(|err| panic!("{what}: upload: {err}"));
                        copy(e, &what, out.raw_mut(), d.raw(), &[])
                            .wait()
                            .unwrap_or_else(|err| panic!("{what}: download: {err}"));
                    }
                    check(&what, &out, &want);
                }
            });
        }
    });
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn futures_wake_while_their_thread_submits_more() {
    let Some(e) = engine_or_skip(None) else {
        return;
    };
    for &n in &[4usize, 64 << 10, 16 << 20] {
        let (d1, d2) = (bytes(n, 60), bytes(n, 61));
        let (h1, h2) = (pinned_with(&d1), pinned_with(&d2));
        let mut x = DeviceBuffer::new(0, n).unwrap();
        let mut y = DeviceBuffer::new(0, n).unwrap();
        // SAFETY: the buffers outlive the thread scope, which waits for both requests.
        let r1 = unsafe { copy(&e, "first", x.raw_mut(), h1.raw(), &[]) };
        std::thread::scope(|sc| {
            let woken = sc.spawn(move || block_on(r1));
            // Submitted on the first's stream while its future may be registering.
            // SAFETY: as above.
            let r2 = unsafe { copy(&e, "second", y.raw_mut(), h2.raw(), &[]) };
            woken
                .join()
                .expect("the future's thread")
                .unwrap_or_else(|err| panic!("{n} B future: {err}"));
            block_on(r2).unwrap_or_else(|err| panic!("{n} B second: {err}"));
        });
        dev_check(&format!("{n} B, future"), &x, &d1);
        dev_check(&format!("{n} B, after the future"), &y, &d2);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn the_callers_stream_waits_for_a_lazy_request() {
    let Some(e) = engine_or_skip(None) else {
        return;
    };
    let compute = e.context().new_stream().expect("cuStreamCreate");
    let n = 64 << 20;
    let want = bytes(n, 70);
    let src = pinned_with(&want);
    let mut d = DeviceBuffer::new(0, n).unwrap();
    let mut out = PinnedBuffer::new(n).unwrap();
    for round in 0..3 {
        d.copy_from_host(&vec![0xA5; n]).unwrap();
        out.fill(0x5A);
        // SAFETY: the buffers outlive the stream synchronize below.
        let up = unsafe { copy(&e, "upload", d.raw_mut(), src.raw(), &[]) };
        e.stream_wait(&compute, &up)
            .unwrap_or_else(|err| panic!("round {round}: stream_wait: {err}"));
        // The caller's download on its own stream, after the upload by the GPU only.
        // SAFETY: both buffers valid for `n` bytes; `compute` is a live stream of the context.
        unsafe {
            let r = sys::cuMemcpyDtoHAsync_v2(
                out.raw_mut().addr as *mut std::ffi::c_void,
                d.device_ptr(),
                n,
                compute.cu_stream(),
            );
            assert_eq!(
                r,
                sys::CUresult::CUDA_SUCCESS,
                "cuMemcpyDtoHAsync on the caller's stream"
            );
            let r = sys::cuStreamSynchronize(compute.cu_stream());
            assert_eq!(
                r,
                sys::CUresult::CUDA_SUCCESS,
                "cuStreamSynchronize of the caller's stream"
            );
        }
        check(
            &format!("round {round}: download ordered by stream_wait"),
            &out,
            &want,
        );
        up.wait().unwrap();
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_stream_handed_out_after_a_lazy_request() {
    // A lazy upload, then the stream handed to the caller, who enqueues a long copy on it: the
    // upload's wait ends at its own end, not the caller's copy's.
    let Some(e) = engine_or_skip(None) else {
        return;
    };
    if null::is_synchronous()
        && skip_on_null_driver(
            "synchronous mode: the caller's 256 MiB copy is done when enqueued, so the \
             upload's wait cannot end before it",
        )
    {
        return;
    }
    let (small, big) = (64 << 10, 256 << 20);
    let (ds, db) = (bytes(small, 80), bytes(big, 81));
    let (hs, hb) = (pinned_with(&ds), pinned_with(&db));
    let mut a = DeviceBuffer::new(0, small).unwrap();
    let b = DeviceBuffer::new(0, big).unwrap();
    // SAFETY: the buffers outlive the waits below.
    let up = unsafe { copy(&e, "upload", a.raw_mut(), hs.raw(), &[]) };
    let stream = e.stream(Direction::HostToDevice).clone();
    // SAFETY: both buffers valid for `big` bytes; the engine's live stream.
    unsafe {
        let r = sys::cuMemcpyHtoDAsync_v2(
            b.device_ptr(),
            hb.raw().addr as *const std::ffi::c_void,
            big,
            stream.cu_stream(),
        );
        assert_eq!(
            r,
            sys::CUresult::CUDA_SUCCESS,
            "the caller's cuMemcpyHtoDAsync"
        );
    }
    up.wait().expect("the upload");
    // SAFETY: the engine's live stream.
    let pending = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    dev_check("64 KiB upload before the stream was handed out", &a, &ds);
    assert_eq!(
        pending,
        sys::CUresult::CUDA_ERROR_NOT_READY,
        "the upload's wait returned only after the caller's 256 MiB copy behind it"
    );
    // SAFETY: as above.
    let r = unsafe { sys::cuStreamSynchronize(stream.cu_stream()) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuStreamSynchronize");
    dev_check("the caller's 256 MiB copy", &b, &db);
    // Later requests on the handed-out stream (with events now) still wait correctly.
    // SAFETY: as above.
    unsafe { copy(&e, "after", a.raw_mut(), hs.raw(), &[]) }
        .wait()
        .unwrap();
    dev_check("upload after the stream was handed out", &a, &ds);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn small_pinned_copies_around_a_staged_copy_on_the_same_stream() {
    let Some(e) = engine_or_skip(None) else {
        return;
    };
    let big = 64 << 20; // pageable, staged
    let small = 64 << 10;
    let wb = bytes(big, 90);
    let ws: Vec<Vec<u8>> = (0..8).map(|i| bytes(small, 91 + i)).collect();
    let hs: Vec<PinnedBuffer> = ws.iter().map(|w| pinned_with(w)).collect();
    let mut db = DeviceBuffer::new(0, big).unwrap();
    let mut ds: Vec<DeviceBuffer> = (0..8)
        .map(|_| DeviceBuffer::new(0, small).unwrap())
        .collect();
    // SAFETY: the buffers outlive the waits below.
    unsafe {
        let first = copy(&e, "small before", ds[0].raw_mut(), hs[0].raw(), &[]);
        let staged = copy(&e, "staged 64 MiB", db.raw_mut(), wb.raw(), &[]);
        let mut smalls = vec![first];
        for i in 1..8 {
            smalls.push(copy(&e, "small during", ds[i].raw_mut(), hs[i].raw(), &[]));
        }
        for (i, r) in smalls.into_iter().enumerate() {
            r.wait().unwrap_or_else(|err| panic!("small {i}: {err}"));
        }
        staged.wait().expect("the staged copy");
    }
    for (i, d) in ds.iter().enumerate() {
        dev_check(&format!("small copy {i} around a staged one"), d, &ws[i]);
    }
    dev_check("staged 64 MiB", &db, &wb);
}

/// Stamped requests (`engine/cuda/completion/stamp.rs`: a copy submitted on an idle stream, waited by reading the word
/// its stream writes after it): 2,000 downloads of 4 KiB-1 MiB each compared right after its
/// wait (two sources alternating through the device, so a stale byte shows), uploads whose
/// source is overwritten right after the wait, `is_done` polling of one, and one waited on
/// another thread.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn stamped_requests_end_after_their_bytes() {
    let Some(e) = engine_or_skip(None) else {
        return;
    };
    for n in [4 << 10, 64 << 10, 1 << 20] {
        let what = format!("{n} B");
        let a = bytes(n, 3);
        let b = bytes(n, 4);
        let mut src = [PinnedBuffer::new(n).unwrap(), PinnedBuffer::new(n).unwrap()];
        src[0].copy_from_slice(&a);
        src[1].copy_from_slice(&b);
        let mut dev = DeviceBuffer::new(0, n).unwrap();
        let mut host = PinnedBuffer::new(n).unwrap();
        for i in 0..2000 {
            let s = &src[i % 2];
            let want = if i % 2 == 0 { &a } else { &b };
            // SAFETY: live buffers of n bytes; each request is waited before the next use.
            unsafe {
                copy(&e, &what, dev.raw_mut(), s.raw(), &[]).wait().unwrap();
                copy(&e, &what, host.raw_mut(), dev.raw(), &[])
                    .wait()
                    .unwrap();
            }
            check(&format!("{what}: download {i}"), &host, want);
        }
        // An upload's source may be reused as soon as its wait returns.
        let mut up = PinnedBuffer::new(n).unwrap();
        up.copy_from_slice(&a);
        // SAFETY: as above.
        unsafe { copy(&e, &what, dev.raw_mut(), up.raw(), &[]) }
            .wait()
            .unwrap();
        up.fill(0xEE);
        dev_check(&format!("{what}: upload"), &dev, &a);
        // Polled to done, then waited on another thread.
        // SAFETY: as above.
        let r = unsafe { copy(&e, &what, host.raw_mut(), dev.raw(), &[]) };
        poll_done(&what, &r);
        r.wait().unwrap();
        check(&format!("{what}: polled"), &host, &a);
        // SAFETY: as above; the request is waited on the spawned thread before the buffers
        // are touched again (the join).
        let r = unsafe { copy(&e, &what, dev.raw_mut(), src[1].raw(), &[]) };
        std::thread::spawn(move || r.wait())
            .join()
            .unwrap()
            .unwrap();
        dev_check(&format!("{what}: waited elsewhere"), &dev, &b);
    }
}
