//! Many threads submitting through one CUDA engine (its pool of streams per direction): every
//! copy byte-checked, dependencies across threads (and so across the pool's streams), each
//! thread's requests in one direction in submission order, and `CudaEngine::stream` being the
//! stream the calling thread's copies run on.

mod cuda_common;

use cuda_common::*;
use cudarc::driver::sys;
use ferry::cuda::{CudaEngine, DeviceBuffer, Direction, PinnedBuffer};
use ferry::{Engine, EngineExt, Job, Layout, Memory, MemoryMut, RawBuf, Request};
use std::sync::mpsc::channel;

/// An engine on device 0 with a pool of `streams` streams per direction, or `None` after
/// printing `skipped: no CUDA driver`.
fn pooled_or_skip(streams: usize) -> Option<CudaEngine> {
    let e = cuda_or_skip()?;
    drop(e);
    Some(
        CudaEngine::with_config(cuda_config(0).streams(streams))
            .expect("device 0 opened once, so it opens again"),
    )
}

/// Submits a flat copy of all of `src` into `dst` after `after`; the error names the copy.
///
/// # Safety
/// As [`Engine::submit_raw`].
unsafe fn try_copy_after(
    e: &CudaEngine,
    dst: RawBuf,
    src: RawBuf,
    after: Option<&Request>,
) -> Result<Request, String> {
    let l = Layout::bytes(src.len).map_err(|err| err.to_string())?;
    let mut job = Job::copy(dst, l, src, l);
    if let Some(a) = after {
        job = job.after(a);
    }
    // SAFETY: the caller's guarantees.
    unsafe { e.submit_raw(job) }.map_err(|err| {
        format!(
            "submit of {} bytes {:?} -> {:?}: {err}",
            src.len, src.kind, dst.kind
        )
    })
}

/// [`try_copy_after`], panicking on a refused submit.
///
/// # Safety
/// As [`Engine::submit_raw`].
unsafe fn copy_after(e: &CudaEngine, dst: RawBuf, src: RawBuf, after: Option<&Request>) -> Request {
    // SAFETY: the caller's guarantees.
    unsafe { try_copy_after(e, dst, src, after) }.unwrap_or_else(|m| panic!("{m}"))
}

/// The first byte where `got` differs from `want`, as a message naming `what`.
fn first_diff(what: &str, got: &[u8], want: &[u8]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    got.iter().zip(want).position(|(a, b)| a != b).map(|at| {
        format!(
            "{what}: byte {at} of {} is {:#04x}, expected {:#04x}",
            want.len(),
            got[at],
            want[at]
        )
    })
}

fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    if let Some(m) = first_diff(what, got, want) {
        panic!("{m}");
    }
}

/// Sizes the threads cycle through: small, medium, odd, and one staged pageable size.
const SIZES: [usize; 4] = [4 << 10, 64 << 10, (1 << 20) + 13, 3 << 20];

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn many_threads_chain_copies_in_every_direction_through_one_engine() {
    // The default configuration, as a user gets it (the pool sized by the host's cores).
    let Some(e) = cuda_or_skip() else { return };
    let (threads, rounds) = (16, 24);
    std::thread::scope(|sc| {
        for t in 0..threads {
            let e = &e;
            sc.spawn(move || {
                for r in 0..rounds {
                    let n = SIZES[(t + r) % SIZES.len()];
                    let want = bytes(n, (t * 1000 + r) as u64 + 1);
                    // Host -> device from pinned memory, or from pageable memory (staged from
                    // 2 MiB on), device -> device, device -> host: a chain of dependencies,
                    // only its end waited.
                    let mut pinned = PinnedBuffer::new(n).unwrap();
                    pinned.copy_from_slice(&want);
                    let pageable = want.clone();
                    let mut a = DeviceBuffer::new(0, n).unwrap();
                    let mut b = DeviceBuffer::new(0, n).unwrap();
                    let mut out = PinnedBuffer::new(n).unwrap();
                    out.fill(0xA5);
                    let src = if r % 3 == 2 {
                        pageable.raw()
                    } else {
                        pinned.raw()
                    };
                    // SAFETY: every buffer outlives the wait of the chain's end below, and each
                    // request reads only what its dependency wrote.
                    unsafe {
                        let up = copy_after(e, a.raw_mut(), src, None);
                        let across = copy_after(e, b.raw_mut(), a.raw(), Some(&up));
                        let down = copy_after(e, out.raw_mut(), b.raw(), Some(&across));
                        down.wait().unwrap_or_else(|err| {
                            panic!("thread {t} round {r} ({n} bytes): the chain failed: {err}")
                        });
                    }
                    let what = format!("thread {t} round {r}: {n} bytes H2D -> D2D -> D2H");
                    assert_bytes(&what, &out, &want);
                    // A fill of device memory (the device-to-device stream) then a read back.
                    // SAFETY: as above; the fill and the copy are chained.
                    unsafe {
                        let l = Layout::bytes(n).unwrap();
                        let fill = e.submit_raw(Job::fill(a.raw_mut(), l, &[t as u8])).unwrap();
                        copy_after(e, out.raw_mut(), a.raw(), Some(&fill))
                            .wait()
                            .unwrap();
                    }
                    assert_bytes(
                        &format!("thread {t} round {r}: fill of {n}"),
                        &out,
                        &vec![t as u8; n],
                    );
                }
            });
        }
    });
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_request_after_one_of_another_thread_sees_its_bytes() {
    // Three threads (usually three lanes of the pool; threads take lanes in the order they
    // first submit, process-wide): A uploads, B copies on the device after A's
    // request, C downloads after B's. A's copy is large, so that B starting early would read the
    // poison.
    let Some(e) = pooled_or_skip(8) else { return };
    let n = 64 << 20;
    let rounds = 6;
    let mut src = PinnedBuffer::new(n).unwrap();
    let mut x = DeviceBuffer::new(0, n).unwrap();
    let mut y = DeviceBuffer::new(0, n).unwrap();
    let mut out = PinnedBuffer::new(n).unwrap();
    let (src_r, x_w, x_r, y_w, y_r, out_w) = (
        src.raw(),
        x.raw_mut(),
        x.raw(),
        y.raw_mut(),
        y.raw(),
        out.raw_mut(),
    );
    let wants: Vec<Vec<u8>> = (0..rounds).map(|r| bytes(n, 77 + r as u64)).collect();
    let (to_b, at_b) = channel::<Request>();
    let (to_c, at_c) = channel::<Request>();
    // The main thread lets A start the next round once it has checked this one.
    let (next_round, at_a) = channel::<()>();
    let mut failures: Vec<String> = Vec::new();
    let e = &e;
    std::thread::scope(|sc| {
        let wants = &wants;
        // Thread A fills the pinned source, so it owns it; the main thread checks `out`.
        let src_w = src.raw_mut();
        sc.spawn(move || {
            for want in wants {
                // SAFETY: nothing reads the source until A's copy is submitted below, and the
                // previous round has finished (the main thread said so).
                unsafe { std::slice::from_raw_parts_mut(src_w.addr as *mut u8, n) }
                    .copy_from_slice(want);
                // SAFETY: the buffers outlive the thread scope; each round ends (the main
                // thread's wait and check) before the next one writes them.
                let up = unsafe { copy_after(e, x_w, src_r, None) };
                // (B may have ended on a failure: the main thread reports it.)
                let _ = to_b.send(up);
                if at_a.recv().is_err() {
                    return; // the main thread is done (or failed)
                }
            }
        });
        sc.spawn(move || {
            for up in at_b.iter() {
                // SAFETY: as above; reads `x` after A's request.
                let across = unsafe { copy_after(e, y_w, x_r, Some(&up)) };
                let _ = to_c.send(across);
            }
        });
        // Failures are collected and reported after the scope, so that every thread ends.
        for (r, want) in wants.iter().enumerate() {
            let checked = at_c
                .recv()
                .map_err(|_| "thread B ended early (see its panic)".to_string())
                .and_then(|across| {
                    // SAFETY: as above; reads `y` after B's request.
                    let down = unsafe { try_copy_after(e, out_w, y_r, Some(&across)) }?;
                    down.wait()
                        .map_err(|err| format!("the chain failed: {err}"))?;
                    // SAFETY: the download completed; nothing else writes `out` now.
                    let got = unsafe { std::slice::from_raw_parts(out_w.addr as *const u8, n) };
                    first_diff("64 MiB across three threads", got, want).map_or(Ok(()), Err)
                });
            if let Err(m) = checked {
                failures.push(format!("round {r}: {m}"));
                // Whatever is still in flight finishes before the buffers are written again.
                let _ = e.barrier();
            }
            // Poison the device buffers for the next round (nothing is in flight: C's request
            // waited for B's, which waited for A's).
            if let Err(err) = x.copy_from_host(&vec![0xA5; n]) {
                failures.push(format!("round {r}: poisoning x: {err}"));
            }
            if let Err(err) = y.copy_from_host(&vec![0x5A; n]) {
                failures.push(format!("round {r}: poisoning y: {err}"));
            }
            let _ = next_round.send(());
        }
        drop(next_round);
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    drop((src, x, y, out));
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn one_threads_copies_in_one_direction_keep_their_order() {
    // Each thread writes one device buffer from eight sources in turn, without waiting or
    // dependencies: on its one stream of the pool they land in order, so the last one wins.
    let Some(e) = pooled_or_skip(4) else { return };
    let (threads, k, n) = (8, 8, 4 << 20);
    std::thread::scope(|sc| {
        for t in 0..threads {
            let e = &e;
            sc.spawn(move || {
                let srcs: Vec<PinnedBuffer> = (0..k)
                    .map(|i| {
                        let mut p = PinnedBuffer::new(n).unwrap();
                        p.copy_from_slice(&bytes(n, (t * 100 + i) as u64 + 5));
                        p
                    })
                    .collect();
                let mut dev = DeviceBuffer::new(0, n).unwrap();
                // SAFETY: the sources and the buffer outlive the waits below; the copies all write
                // `dev`, one after the other on this thread's stream (the order under test).
                let reqs: Vec<Request> = srcs
                    .iter()
                    .map(|s| unsafe { copy_after(e, dev.raw_mut(), s.raw(), None) })
                    .collect();
                for (i, r) in reqs.into_iter().enumerate() {
                    r.wait()
                        .unwrap_or_else(|err| panic!("thread {t}, copy {i}: {err}"));
                }
                let want = bytes(n, (t * 100 + k - 1) as u64 + 5);
                let what = format!("thread {t}: the last of {k} copies of 4 MiB into one buffer");
                assert_bytes(&what, &dev.to_vec().unwrap(), &want);
            });
        }
    });
    e.barrier().unwrap();
}

/// Enqueues a raw `cuMemcpyAsync` of `n` bytes on `stream` and synchronizes the stream.
///
/// # Safety
/// 1. `dst` and `src` are valid for `n` bytes (unified addresses) until the call returns.
/// 2. `stream` is a live stream of the current context.
unsafe fn raw_copy_on(stream: sys::CUstream, dst: u64, src: u64, n: usize) {
    // SAFETY: (1, 2).
    let r = unsafe { sys::cuMemcpyAsync(dst, src, n, stream) };
    assert_eq!(
        r,
        sys::CUresult::CUDA_SUCCESS,
        "cuMemcpyAsync on the engine's stream"
    );
    // SAFETY: a live stream (2).
    let r = unsafe { sys::cuStreamSynchronize(stream) };
    assert_eq!(
        r,
        sys::CUresult::CUDA_SUCCESS,
        "cuStreamSynchronize of the engine's stream"
    );
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn the_stream_a_thread_is_shown_is_where_its_copies_run() {
    // Each thread submits a large copy (not waited) and then reads its destination with a raw
    // copy on `engine.stream(direction)`, synchronized: only if the engine's copy ran on that
    // stream is it done by then. In every direction.
    let Some(e) = pooled_or_skip(8) else { return };
    let (threads, n) = (8, 32 << 20);
    std::thread::scope(|sc| {
        for t in 0..threads {
            let e = &e;
            sc.spawn(move || {
                e.context().bind_to_thread().unwrap();
                let want = bytes(n, 500 + t as u64);
                let mut host = PinnedBuffer::new(n).unwrap();
                host.copy_from_slice(&want);
                let mut dev = DeviceBuffer::new(0, n).unwrap();
                let mut dev2 = DeviceBuffer::new(0, n).unwrap();
                let mut back = PinnedBuffer::new(n).unwrap();
                let mut probe = PinnedBuffer::new(n).unwrap();
                let cases: [(Direction, &str); 3] = [
                    (Direction::HostToDevice, "pinned -> device"),
                    (Direction::DeviceToDevice, "device -> device"),
                    (Direction::DeviceToHost, "device -> pinned"),
                ];
                for (dir, what) in cases {
                    let stream = e.stream(dir);
                    assert_eq!(
                        stream.cu_stream(),
                        e.stream(dir).cu_stream(),
                        "thread {t}: stream({dir:?}) changed between two calls"
                    );
                    probe.fill(0xA5);
                    // SAFETY: every buffer outlives the request's wait below; the raw copy
                    // reads the destination only after the stream has done the engine's copy.
                    let req = unsafe {
                        match dir {
                            Direction::HostToDevice => {
                                copy_after(e, dev.raw_mut(), host.raw(), None)
                            }
                            Direction::DeviceToDevice => {
                                copy_after(e, dev2.raw_mut(), dev.raw(), None)
                            }
                            Direction::DeviceToHost => {
                                copy_after(e, back.raw_mut(), dev2.raw(), None)
                            }
                        }
                    };
                    let written = match dir {
                        Direction::HostToDevice => dev.raw().addr,
                        Direction::DeviceToDevice => dev2.raw().addr,
                        Direction::DeviceToHost => back.raw().addr,
                    };
                    // SAFETY: the destination and the probe hold `n` bytes; the stream is the
                    // engine's, of the current context.
                    unsafe { raw_copy_on(stream.cu_stream(), probe.raw_mut().addr, written, n) };
                    let msg =
                        format!("thread {t}, {what}: read on stream({dir:?}) right after the copy");
                    assert_bytes(&msg, &probe, &want);
                    req.wait()
                        .unwrap_or_else(|err| panic!("thread {t}, {what}: {err}"));
                }
            });
        }
    });
    e.barrier().unwrap();
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn scopes_on_many_threads_share_one_engine() {
    // The safe API as a user writes it, 16 threads, one engine: scope, memcpy, wait.
    let Some(e) = cuda_or_skip() else { return };
    std::thread::scope(|sc| {
        for t in 0..16usize {
            let e = &e;
            sc.spawn(move || {
                let n = 64 << 10;
                let mut dev = DeviceBuffer::new(0, n).unwrap();
                let mut out = vec![0u8; n];
                for r in 0..200usize {
                    let want = bytes(n, (t * 1000 + r) as u64);
                    let mut src = PinnedBuffer::new(n).unwrap();
                    src.copy_from_slice(&want);
                    e.scope(|s| -> ferry::Result<()> { Ok(s.memcpy(&mut dev, &src)?.wait()?) })
                        .unwrap_or_else(|err| panic!("thread {t} round {r}: upload: {err}"));
                    e.scope(|s| -> ferry::Result<()> { Ok(s.memcpy(&mut out[..], &dev)?.wait()?) })
                        .unwrap_or_else(|err| panic!("thread {t} round {r}: download: {err}"));
                    assert_bytes(
                        &format!("thread {t} round {r}: 64 KiB there and back"),
                        &out,
                        &want,
                    );
                }
            });
        }
    });
    e.barrier().unwrap();
}
