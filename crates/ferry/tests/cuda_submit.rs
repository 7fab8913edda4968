//! The CUDA engine's submission seam (`engine/cuda/submit.rs`, issue 30 item 2): a caller that
//! says more work follows (`Engine::enqueue`, then one `Engine::flush`) has its batch complete
//! in order, byte for byte; under the tuned completion policy nothing marks the batch's
//! requests (no event recorded) before the flush, under the plain one every request records its
//! event at submit; a request of a batch that a dependent, a future or a wait needs before the
//! flush never hangs. And the one trunk: one-run copies, tiles and refusals through
//! `submit_copy`, `submit_raw` and `enqueue` alike. Prints `skipped: no CUDA driver` without a
//! GPU.

mod cuda_common;

use cuda_common::*;
use cudarc::driver::sys::CUresult;
use ferry::cuda::{CompletionPolicy, DeviceBuffer, PinnedBuffer};
use ferry::{Engine, Job, Layout, Memory, MemoryMut, RawBuf, Request, SubmitError};

/// A flat copy of all of `src` into the start of `dst`, as a job.
fn flat(dst: RawBuf, src: RawBuf) -> Job {
    let l = Layout::bytes(src.len).expect("layout");
    Job::copy(dst, l, src, l)
}

/// `n` pinned sources of `len` bytes, each its own pattern.
fn sources(n: usize, len: usize) -> (Vec<PinnedBuffer>, Vec<Vec<u8>>) {
    let want: Vec<Vec<u8>> = (0..n).map(|i| bytes(len, 100 + i as u64)).collect();
    let bufs = want.iter().map(|w| pinned_with(w)).collect();
    (bufs, want)
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn n_enqueued_copies_then_one_flush_all_complete_in_order() {
    // Serial: one test arms a failure of an entry point every test calls.
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    for len in [4 << 10, 64 << 10, 1 << 20] {
        let n = 16;
        let (src, want) = sources(n, len);
        let mut dev: Vec<DeviceBuffer> =
            (0..n).map(|_| DeviceBuffer::new(0, len).unwrap()).collect();
        let reqs: Vec<Request> = (0..n)
            .map(|i| {
                let job = flat(dev[i].raw_mut(), src[i].raw());
                // SAFETY: live buffers, untouched until the requests are waited below.
                unsafe { e.enqueue(job) }.expect("enqueue")
            })
            .collect();
        e.flush();
        // One direction, one thread: one stream, so the last one's end is every one's.
        let mut reqs = reqs;
        let last = reqs.pop().unwrap();
        last.wait().expect("last of the batch");
        for (i, mut r) in reqs.into_iter().enumerate() {
            assert_eq!(
                r.try_wait().map(|r| r.is_ok()),
                Some(true),
                "{len} B: request {i} not done once the batch's last is"
            );
        }
        for (i, d) in dev.iter().enumerate() {
            check(
                &format!("{len} B: copy {i}"),
                &d.to_vec().unwrap(),
                &want[i],
            );
        }
        e.barrier().expect("barrier");
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn an_enqueued_batch_records_no_event_before_its_flush_under_the_tuned_policy() {
    // Serial: one test arms a failure of an entry point every test calls.
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    if !null::is_null_driver() {
        println!("skipped: counts driver calls through the null CUDA driver's injected failures");
        return;
    }
    let len = 64 << 10;
    let n = 8;
    let (src, want) = sources(n, len);
    let mut dev: Vec<DeviceBuffer> = (0..n).map(|_| DeviceBuffer::new(0, len).unwrap()).collect();
    let stream = e.context().new_stream().expect("a stream of the caller's");
    // The next cuEventRecord fails: whoever records an event first meets it.
    assert!(null::fail(
        "cuEventRecord",
        1,
        CUresult::CUDA_ERROR_LAUNCH_FAILED
    ));
    let mut reqs = Vec::new();
    for (i, d) in dev.iter_mut().enumerate() {
        // SAFETY: live buffers, untouched until the requests are waited below.
        let r = unsafe { e.enqueue(flat(d.raw_mut(), src[i].raw())) };
        match completion() {
            CompletionPolicy::Plain => {
                // The plain policy records every request's event at submit: the first meets
                // the failure, the others go through.
                match (i, r) {
                    (0, Err(err)) => assert_eq!(
                        err.driver_error().map(|d| d.call),
                        Some("cuEventRecord"),
                        "{err}"
                    ),
                    (0, Ok(_)) => panic!("plain: the first request recorded no event"),
                    (_, r) => reqs.push((i, r.expect("plain: enqueue"))),
                }
            }
            _ => reqs.push((i, r.expect("tuned: enqueue recorded no event"))),
        }
    }
    if completion() != CompletionPolicy::Plain {
        // Nothing recorded during the batch: the failure is still armed for the next record.
        let err = e
            .record(&stream)
            .expect_err("the armed failure met by this record");
        assert!(err.to_string().contains("cuEventRecord"), "{err}");
    }
    e.flush();
    for (i, r) in reqs {
        r.wait().unwrap_or_else(|err| panic!("copy {i}: {err}"));
        check(&format!("copy {i}"), &dev[i].to_vec().unwrap(), &want[i]);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_batch_request_needed_before_the_flush_never_hangs() {
    // Serial: one test arms a failure of an entry point every test calls.
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    let len = 256 << 10;
    let (src, want) = sources(3, len);
    let mut dev: Vec<DeviceBuffer> = (0..3).map(|_| DeviceBuffer::new(0, len).unwrap()).collect();
    let mut back = PinnedBuffer::new(len).unwrap();
    let mut back2 = PinnedBuffer::new(len).unwrap();
    let (d0, d1) = dev.split_at_mut(1);
    // SAFETY: every buffer is live and untouched until its request (or a later one that reads
    // it after it) is waited below.
    unsafe {
        let a = e.enqueue(flat(d0[0].raw_mut(), src[0].raw())).unwrap();
        let b = e.enqueue(flat(d1[0].raw_mut(), src[1].raw())).unwrap();
        // A download that depends on the batch's first (not its last) request, on another
        // stream: ordered after it on the GPU, before any flush.
        let c = e
            .submit_raw(flat(back.raw_mut(), d0[0].raw()).after(&a))
            .unwrap();
        c.wait().expect("dependent of a batch request");
        check("dependent", &back, &want[0]);
        // A future of a batch request, awaited before the flush.
        block_on(b).expect("future of a batch request");
        check("awaited", &d1[0].to_vec().unwrap(), &want[1]);
        // A request enqueued and never flushed, waited: its own wait issues nothing more.
        let d = e.enqueue(flat(d1[1].raw_mut(), src[2].raw())).unwrap();
        let f = e
            .submit_raw(flat(back2.raw_mut(), d1[1].raw()).after(&d))
            .unwrap();
        d.wait().expect("unflushed request");
        f.wait().expect("its dependent");
        check("unflushed", &back2, &want[2]);
        a.wait().expect("first");
    }
    e.barrier().expect("barrier");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn one_trunk_for_submit_copy_submit_raw_and_enqueue() {
    // Serial: one test arms a failure of an entry point every test calls.
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    // A tile (not one run) and one run, through each entry point, the same bytes.
    let (rows, cols, elem) = (64usize, 48usize, 4usize);
    let n = rows * cols * elem;
    let data = bytes(n, 7);
    let host = pinned_with(&data);
    let tile_src = Layout::with_byte_strides(&[rows / 2, cols / 2], &[cols * elem, elem], elem)
        .unwrap()
        .with_offset(elem * (cols + 1))
        .unwrap();
    let tile_dst = Layout::contiguous(&[rows / 2, cols / 2], elem).unwrap();
    let run = Layout::bytes(n).unwrap();
    let want_tile = reference_copy(&vec![0; n], &tile_dst, &data, &tile_src);
    for entry in ["submit_copy", "submit_raw", "enqueue"] {
        for (what, dl, sl, want) in [
            ("tile", &tile_dst, &tile_src, &want_tile),
            ("run", &run, &run, &data),
        ] {
            let mut dev = DeviceBuffer::zeroed(0, n).unwrap();
            let (d, s) = (dev.raw_mut(), host.raw());
            // SAFETY: live buffers, untouched until the request is waited.
            let r = unsafe {
                match entry {
                    "submit_copy" => e.submit_copy(d, dl, s, sl),
                    "submit_raw" => e.submit_raw(Job::copy(d, *dl, s, *sl)),
                    _ => e.enqueue(Job::copy(d, *dl, s, *sl)),
                }
            };
            r.unwrap_or_else(|err| panic!("{entry} {what}: {err}"))
                .wait()
                .unwrap_or_else(|err| panic!("{entry} {what}: {err}"));
            e.flush();
            check(&format!("{entry} {what}"), &dev.to_vec().unwrap(), want);
        }
        // Refused alike: a layout past its buffer, before anything is enqueued.
        let mut dev = DeviceBuffer::new(0, n / 2).unwrap();
        let (d, s) = (dev.raw_mut(), host.raw());
        // SAFETY: refused at submit (nothing runs).
        let r = unsafe {
            match entry {
                "submit_copy" => e.submit_copy(d, &run, s, &run),
                "submit_raw" => e.submit_raw(Job::copy(d, run, s, run)),
                _ => e.enqueue(Job::copy(d, run, s, run)),
            }
        };
        assert!(matches!(r, Err(SubmitError::Op(_))), "{entry}: {r:?}");
    }
}
