//! The CUDA engine's submission seam (`engine/cuda/submit.rs`, issue 30 item 2): a caller that
//! says more work follows (`Engine::enqueue`, then one `Engine::flush`) has its batch complete
//! in order, byte for byte; its one-run copies are held until the flush and go to the GPU as
//! one list: many small ones by the gather kernel while the SMs are free, else one batched
//! copy (issue 34: counted on the null driver, either symbol, a refused batch
//! copied one call per copy, from the failed index where 12.8's symbol names it, each range's
//! location hints), the batch's waits reading its stamp (tuned) or events (plain), never
//! synchronizing the stream; nothing is marked before the flush; a request of a batch that a
//! dependent, a future, a poll or a wait needs before the flush never hangs. And the one trunk:
//! one-run copies, tiles and refusals through `submit_copy`, `submit_raw` and `enqueue` alike.
//! Prints `skipped: no CUDA driver` without a GPU.

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
        // One-run copies are held until the flush: nothing recorded at submit, whatever the
        // policy.
        reqs.push((i, r.expect("enqueue recorded no event")));
    }
    if completion() != CompletionPolicy::Plain {
        // Nothing recorded during the batch nor at its flush (one stamp marks its end): the
        // failure is still armed for the next record.
        e.flush();
        let err = e
            .record(&stream)
            .expect_err("the armed failure met by this record");
        assert!(err.to_string().contains("cuEventRecord"), "{err}");
        for (i, r) in reqs {
            r.wait().unwrap_or_else(|err| panic!("copy {i}: {err}"));
            check(&format!("copy {i}"), &dev[i].to_vec().unwrap(), &want[i]);
        }
        return;
    }
    // The plain policy records every request's event after the batch, at the flush: the first
    // meets the failure (its copy done before the failure is handed back), the others go
    // through.
    e.flush();
    for (i, r) in reqs {
        match (i, r.wait()) {
            (0, Err(err)) => assert_eq!(
                err.driver_error().map(|d| d.call),
                Some("cuEventRecord"),
                "{err}"
            ),
            (0, Ok(())) => panic!("plain: the first request recorded no event"),
            (_, r) => r.unwrap_or_else(|err| panic!("copy {i}: {err}")),
        }
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

/// `n` pinned sources of `len` bytes enqueued into `n` device buffers (one-run copies held
/// until the flush); the sources, the destinations, the bytes each must get, the requests.
struct HeldBatch {
    _src: Vec<PinnedBuffer>,
    dev: Vec<DeviceBuffer>,
    want: Vec<Vec<u8>>,
    reqs: Vec<Request>,
}

fn enqueue_uploads(e: &ferry::cuda::CudaEngine, n: usize, len: usize) -> HeldBatch {
    let (src, want) = sources(n, len);
    let mut dev: Vec<DeviceBuffer> = (0..n).map(|_| DeviceBuffer::new(0, len).unwrap()).collect();
    let reqs = dev
        .iter_mut()
        .zip(&src)
        // SAFETY: live buffers, untouched until the requests are waited (the batch's owner
        // waits them before dropping it).
        .map(|(d, s)| unsafe { e.enqueue(flat(d.raw_mut(), s.raw())) }.expect("enqueue"))
        .collect();
    HeldBatch {
        _src: src,
        dev,
        want,
        reqs,
    }
}

impl HeldBatch {
    /// Waits every request and checks every destination.
    fn check(self, what: &str) {
        for (i, r) in self.reqs.into_iter().enumerate() {
            r.wait()
                .unwrap_or_else(|err| panic!("{what}: copy {i}: {err}"));
        }
        for (i, d) in self.dev.iter().enumerate() {
            check(
                &format!("{what}: copy {i}"),
                &d.to_vec().unwrap(),
                &self.want[i],
            );
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn enqueued_one_run_copies_go_to_the_driver_as_one_batch_at_the_flush() {
    let _x = null::exclusive();
    if cuda_or_skip().is_none() {
        return;
    }
    // The SMs left to the caller: the batched copy at any count (with them free, many small
    // copies take the gather kernel: the next test).
    let e = ferry::cuda::CudaEngine::with_config(cuda_config(0).compute_busy(true))
        .expect("device 0 opens");
    let batched = ferry::engine::cuda::gather::Gatherer::batch_supported();
    for (n, len) in [(16, 64 << 10), (100, 4 << 10), (3, 1 << 20)] {
        let null = null::count_calls();
        let before = e.flush_batches();
        let b = enqueue_uploads(&e, n, len);
        if null {
            // Held: nothing given to the driver before the flush.
            assert_eq!(null::batch_calls(), 0, "{n} x {len} B: before the flush");
            assert_eq!(null::calls("cuMemcpyHtoDAsync_v2"), 0, "{n} x {len} B");
        }
        e.flush();
        let after = e.flush_batches();
        if null {
            assert_eq!(null::batch_calls(), 1, "{n} x {len} B: one batched copy");
            assert_eq!(null::calls("cuMemcpyHtoDAsync_v2"), 0, "{n} x {len} B");
            let attrs = null::last_batch_attrs();
            assert_eq!(
                attrs.len(),
                1,
                "{n} x {len} B: one kind pair, one attribute"
            );
            assert_eq!(attrs[0].count, n, "{n} x {len} B: every copy in the batch");
        }
        if batched {
            assert_eq!(after.0 - before.0, 1, "{n} x {len} B: one batch counted");
            assert_eq!(
                after.1, before.1,
                "{n} x {len} B: no refusal: {:?}",
                after.2
            );
        }
        println!("{n} x {len} B: batched copies {}", after.0 - before.0);
        b.check(&format!("{n} x {len} B"));
    }
}

/// Whether every GPU reaches page-locked host memory at its host address (unified addressing,
/// `CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`): where not, held copies to or from host memory
/// keep the batched copy.
fn host_memory_at_host_address() -> bool {
    use cudarc::driver::result::device;
    use cudarc::driver::sys::CUdevice_attribute as A;
    let Ok(count) = device::get_count() else {
        return false;
    };
    (0..count).all(|i| {
        device::get(i).is_ok_and(|dev| {
            [
                A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
                A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            ]
            .into_iter()
            // SAFETY: `dev` came from cuDeviceGet; the attribute is a plain enum value.
            .all(|a| unsafe { device::get_attribute(dev, a) } == Ok(1))
        })
    })
}

/// The copies of `n` blocks of `len` bytes from slot `n - 1 - i` of `src` to slot `i` of
/// `dst`, enqueued one job each.
fn enqueue_reversed(
    e: &ferry::cuda::CudaEngine,
    dst: RawBuf,
    src: RawBuf,
    n: usize,
    len: usize,
) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let at = |slot: usize| Layout::bytes(len).unwrap().with_offset(slot * len).unwrap();
            let job = Job::copy(dst, at(i), src, at(n - 1 - i));
            // SAFETY: the caller's live buffers, untouched until the requests are waited.
            unsafe { e.enqueue(job) }.expect("enqueue")
        })
        .collect()
}

/// `got`'s slot `i` is `want`'s slot `n - 1 - i`.
fn check_reversed(what: &str, got: &[u8], want: &[u8], n: usize, len: usize) {
    for i in 0..n {
        let j = n - 1 - i;
        check(
            &format!("{what}: slot {i}"),
            &got[i * len..(i + 1) * len],
            &want[j * len..(j + 1) * len],
        );
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn many_small_held_copies_take_the_gather_kernel_while_the_sms_are_free() {
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    // The kernel where it can be made here (not on the null driver: no NVRTC), else the
    // batched copy, as a block copy's list; every byte lands either way.
    let kernel = ferry::engine::cuda::gather::Gatherer::new(std::sync::Arc::clone(e.context()))
        .is_ok_and(|g| g.kernel().is_ok());
    let batched = ferry::engine::cuda::gather::Gatherer::batch_supported();
    let host_ok = host_memory_at_host_address();
    let (n, len) = (256, 4 << 10);
    // `host`: a side is page-locked host memory, which the kernel takes only at its host address.
    let took = |what: &str, before: (usize, usize, _), host: bool| {
        let batches = e.flush_batches().0 - before.0;
        if kernel && (host_ok || !host) {
            assert_eq!(batches, 0, "{what}: the gather kernel, no batched copy");
        } else if batched {
            assert_eq!(batches, 1, "{what}: the batched copy");
        }
        println!(
            "{what}: {n} x {len} B held, batched copies {batches} (kernel made: {kernel}, host \
             memory at its address: {host_ok})"
        );
    };
    // Host -> device, each copy its own pinned allocation and device allocation.
    let before = e.flush_batches();
    let b = enqueue_uploads(&e, n, len);
    e.flush();
    took("uploads", before, true);
    b.check("uploads");
    // Device -> registered host memory (page-locked in place: at its host address too),
    // blocks reversed.
    let want = bytes(n * len, 41);
    let dev = DeviceBuffer::from_host(0, &want).unwrap();
    let mut back = ferry::cuda::Registered::new(vec![0u8; n * len])
        .map_err(|(e, _)| e)
        .expect("register");
    let before = e.flush_batches();
    let reqs = enqueue_reversed(&e, back.raw_mut(), dev.raw(), n, len);
    e.flush();
    for r in reqs {
        r.wait().expect("download");
    }
    took("downloads", before, true);
    check_reversed("downloads", &back, &want, n, len);
    // Device -> device, blocks reversed.
    let mut dst = DeviceBuffer::zeroed(0, n * len).unwrap();
    let before = e.flush_batches();
    let reqs = enqueue_reversed(&e, dst.raw_mut(), dev.raw(), n, len);
    e.flush();
    for r in reqs {
        r.wait().expect("device copy");
    }
    took("device -> device", before, false);
    check_reversed("device -> device", &dst.to_vec().unwrap(), &want, n, len);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_full_batch_is_stamped_and_its_requests_waited_without_stream_queries() {
    // 4,096 held copies (BATCH_MAX_COPIES) go to the driver at the last enqueue, before any
    // flush; their requests used to have no stamp and each wait asked cuStreamQuery.
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    if !null::is_synchronous() || completion() != CompletionPolicy::Tuned {
        println!("skipped: null CUDA driver: counts the waits' calls in its synchronous mode and under the tuned policy only");
        return;
    }
    // BATCH_MAX_COPIES; uploads of 4 KiB (worth a stamp: from 1 KiB).
    let n = 4096;
    null::count_calls();
    let b = enqueue_uploads(&e, n, 4 << 10);
    assert_eq!(null::batch_calls(), 1, "issued when full, before the flush");
    assert_eq!(
        null::calls("cuStreamWriteValue32_v2"),
        1,
        "the full batch stamped"
    );
    e.flush();
    null::count_calls();
    assert_eq!(b.reqs.len(), n);
    b.check("full batch");
    assert_eq!(null::calls("cuStreamQuery"), 0, "no stream query per wait");
    assert_eq!(null::calls("cuStreamSynchronize"), 0, "no stream wait");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_single_enqueued_copy_stays_one_typed_copy() {
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    if !null::count_calls() {
        println!("skipped: counts driver calls through the null CUDA driver");
        return;
    }
    let b = enqueue_uploads(&e, 1, 64 << 10);
    e.flush();
    assert_eq!(null::batch_calls(), 0);
    assert_eq!(null::calls("cuMemcpyHtoDAsync_v2"), 1);
    b.check("one copy");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_flushed_batch_is_waited_without_synchronizing_its_stream() {
    // Issue 30's leftover: the batch's last request got no stamp and waited with
    // cuStreamSynchronize. Now every request of a held batch shares the batch's stamp (tuned
    // policy) or records its own event after it (plain); a flushed batch that was already on
    // the stream (tiles: not held) has its last request stamped at the flush.
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    if !null::is_synchronous() {
        println!("skipped: null CUDA driver: counts the waits' calls in its synchronous mode only");
        return;
    }
    // Held one-run copies.
    let mut b = enqueue_uploads(&e, 8, 64 << 10);
    null::count_calls();
    e.flush();
    let writes = null::calls("cuStreamWriteValue32_v2");
    match completion() {
        CompletionPolicy::Tuned => assert_eq!(writes, 1, "one stamp for the batch"),
        _ => assert_eq!(null::calls("cuEventRecord"), 8, "plain: an event each"),
    }
    null::count_calls();
    let last = b.reqs.pop().unwrap();
    last.wait().expect("the batch's last");
    let reqs = std::mem::take(&mut b.reqs);
    for r in reqs {
        r.wait().expect("the batch's others");
    }
    assert_eq!(
        null::calls("cuStreamSynchronize"),
        0,
        "held batch: no stream wait"
    );
    assert_eq!(
        null::calls("cuStreamQuery"),
        0,
        "held batch: no stream query"
    );
    b.check("held batch");

    // Tiles (programs: on the stream at once), the last stamped at the flush.
    let (rows, cols, elem) = (32usize, 32usize, 4usize);
    let n = rows * cols * elem;
    let data = bytes(n, 11);
    let host = pinned_with(&data);
    let tile_src = Layout::with_byte_strides(&[rows / 2, cols / 2], &[cols * elem, elem], elem)
        .unwrap()
        .with_offset(elem * (cols + 1))
        .unwrap();
    let tile_dst = Layout::contiguous(&[rows / 2, cols / 2], elem).unwrap();
    let want = reference_copy(&vec![0; n], &tile_dst, &data, &tile_src);
    let mut dev: Vec<DeviceBuffer> = (0..6)
        .map(|_| DeviceBuffer::zeroed(0, n).unwrap())
        .collect();
    let mut reqs: Vec<Request> = dev
        .iter_mut()
        // SAFETY: live buffers, untouched until the requests are waited below.
        .map(|d| unsafe { e.enqueue(Job::copy(d.raw_mut(), tile_dst, host.raw(), tile_src)) })
        .map(|r| r.expect("enqueue a tile"))
        .collect();
    e.flush();
    null::count_calls();
    reqs.pop().unwrap().wait().expect("the last tile");
    assert_eq!(
        null::calls("cuStreamSynchronize"),
        0,
        "tiles: the last waited on its stamp"
    );
    for r in reqs {
        r.wait().expect("a tile");
    }
    for (i, d) in dev.iter().enumerate() {
        check(&format!("tile {i}"), &d.to_vec().unwrap(), &want);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_spin_batch_is_waited_with_one_stream_sync() {
    // Under `WaitMode::Spin` a held batch gets no stamp: its requests wait on their stream. Each
    // used to synchronize it (4,096 held 4 KiB uploads on the H100: 3.6 us a block against the
    // raw batch's 1.8); the first sync passes them all, and the others now ask nothing.
    let _x = null::exclusive();
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return;
    }
    if !null::is_synchronous() || completion() != CompletionPolicy::Tuned {
        println!("skipped: null CUDA driver: counts the waits' calls in its synchronous mode and under the tuned policy only");
        return;
    }
    let e =
        ferry::cuda::CudaEngine::with_config(cuda_config(0).wait_mode(ferry::cuda::WaitMode::Spin))
            .expect("a spin-wait engine");
    let n = 64;
    let b = enqueue_uploads(&e, n, 4 << 10);
    e.flush();
    null::count_calls();
    b.check("spin batch");
    assert_eq!(
        null::calls("cuStreamSynchronize"),
        1,
        "one stream sync for the batch"
    );
    assert_eq!(null::calls("cuStreamQuery"), 0, "no stream query");
    assert_eq!(null::calls("cuEventSynchronize"), 0, "no events");

    // Polled instead: the first query that finds the stream idle ends them all.
    let b = enqueue_uploads(&e, n, 4 << 10);
    e.flush();
    null::count_calls();
    let mut reqs = b.reqs;
    for (i, r) in reqs.iter_mut().enumerate() {
        assert_eq!(r.try_wait().map(|r| r.is_ok()), Some(true), "poll {i}");
    }
    assert_eq!(
        null::calls("cuStreamQuery"),
        1,
        "one stream query for the batch"
    );
    assert_eq!(null::calls("cuStreamSynchronize"), 0, "no stream sync");
    for (i, d) in b.dev.iter().enumerate() {
        check(
            &format!("polled: copy {i}"),
            &d.to_vec().unwrap(),
            &b.want[i],
        );
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn held_copies_polled_or_awaited_before_the_flush_complete() {
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    // Polled: a poll issues the held copies (never flushed here).
    let mut b = enqueue_uploads(&e, 4, 32 << 10);
    let start = std::time::Instant::now();
    let mut r = b.reqs.remove(1);
    let polled = loop {
        if let Some(res) = r.try_wait() {
            break res;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "a polled held copy never completed"
        );
        std::thread::yield_now();
    };
    polled.expect("polled");
    b.reqs.insert(1, r);
    b.check("polled");
    // Awaited: a future's waker.
    let mut b = enqueue_uploads(&e, 3, 32 << 10);
    block_on(b.reqs.pop().unwrap()).expect("awaited");
    b.want.pop();
    let last = b.dev.pop().unwrap();
    check(
        "awaited",
        &last.to_vec().unwrap(),
        &sources(3, 32 << 10).1[2],
    );
    b.check("awaited batch");
    // A barrier with held copies in flight (its pruning leaves them held; the barrier's waits
    // issue them).
    let b = enqueue_uploads(&e, 40, 4 << 10);
    e.barrier().expect("barrier");
    b.check("barrier");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_refused_batch_still_lands_every_copy() {
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    if !null::is_null_driver() {
        println!("skipped: refuses the batch through the null CUDA driver's injected failures");
        return;
    }
    let sym = if null_driver_has_v2() {
        "cuMemcpyBatchAsync_v2"
    } else {
        "cuMemcpyBatchAsync"
    };
    // Refused: every copy one typed call.
    let n = 8;
    assert!(null::fail(sym, 1, CUresult::CUDA_ERROR_INVALID_VALUE));
    null::count_calls();
    let b = enqueue_uploads(&e, n, 16 << 10);
    e.flush();
    assert_eq!(null::calls(sym), 1, "the batch was tried");
    assert_eq!(null::calls("cuMemcpyHtoDAsync_v2"), n, "then one call each");
    let (batches, refused, why) = e.flush_batches();
    assert_eq!((batches, refused), (0, 1));
    assert_eq!(
        why.map(|d| d.code),
        Some(CUresult::CUDA_ERROR_INVALID_VALUE),
        "the refusal kept"
    );
    b.check("refused batch");
    // Refused, and the third copy's own call fails too: the first two land, the others fail
    // with the driver's error.
    assert!(null::fail(sym, 1, CUresult::CUDA_ERROR_INVALID_VALUE));
    assert!(null::fail(
        "cuMemcpyHtoDAsync_v2",
        3,
        CUresult::CUDA_ERROR_LAUNCH_FAILED
    ));
    let b = enqueue_uploads(&e, 5, 16 << 10);
    e.flush();
    assert_eq!(e.flush_batches().1, 2, "the second refusal counted too");
    for (i, r) in b.reqs.into_iter().enumerate() {
        match (i, r.wait()) {
            (0 | 1, Ok(())) => check(
                &format!("copy {i}"),
                &b.dev[i].to_vec().unwrap(),
                &b.want[i],
            ),
            (0 | 1, Err(err)) => panic!("copy {i} was enqueued: {err}"),
            (_, Ok(())) => panic!("copy {i}: its call failed"),
            (_, Err(err)) => assert_eq!(
                err.driver_error().map(|d| d.call),
                Some("cuMemcpyHtoDAsync"),
                "copy {i}: {err}"
            ),
        }
    }
}

/// Whether the loaded null driver exports `cuMemcpyBatchAsync_v2` (the default build) rather
/// than only 12.8's symbol (`-DNULL_CUDA_NO_BATCH_V2`).
fn null_driver_has_v2() -> bool {
    std::env::var_os(V1_CHILD).is_none()
}

/// Set in the child run on the null driver without `_v2` (`on_the_12_8_symbol`).
const V1_CHILD: &str = "FERRY_TEST_BATCH_V1_CHILD";

/// Runs test `name` of this binary again in a child process with the null driver built without
/// `cuMemcpyBatchAsync_v2` (`NULL_CUDA_V1_DIR`, set by `scripts/null-cuda-test.sh`) first on
/// `LD_LIBRARY_PATH`; `false` (after printing why) where that driver is not at hand.
fn on_the_12_8_symbol(name: &str) -> bool {
    let Some(dir) = std::env::var_os("NULL_CUDA_V1_DIR") else {
        println!(
            "skipped: null CUDA driver: NULL_CUDA_V1_DIR unset (scripts/null-cuda-test.sh sets it)"
        );
        return false;
    };
    let mut path = dir;
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", path)
        .env(V1_CHILD, "1")
        .output()
        .expect("the test binary runs again");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} on the 12.8 symbol failed:\n{text}"
    );
    assert!(
        text.contains("1 passed"),
        "{name} did not run in the child:\n{text}"
    );
    assert!(
        text.contains("ran on cuMemcpyBatchAsync."),
        "{name}: the child did not batch:\n{text}"
    );
    true
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn the_batched_copy_runs_on_either_symbol_and_refills_from_the_failed_index() {
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    if !null::is_null_driver() {
        println!("skipped: null CUDA driver: hides cuMemcpyBatchAsync_v2 and fails a batch midway");
        return;
    }
    let v2 = null_driver_has_v2();
    let (sym, other) = if v2 {
        ("cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync")
    } else {
        ("cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2")
    };
    null::count_calls();
    let b = enqueue_uploads(&e, 8, 16 << 10);
    e.flush();
    assert_eq!(
        (null::calls(sym), null::calls(other)),
        (1, 0),
        "{sym} first"
    );
    b.check(sym);
    // The batch fails at copy 5: 12.8's symbol names it (copies 0-4 enqueued by the batch,
    // 5-7 one call each); `_v2` names none (all 8 one call each).
    null::count_calls();
    assert!(null::batch_fail_at(5));
    let b = enqueue_uploads(&e, 8, 16 << 10);
    e.flush();
    let each = null::calls("cuMemcpyHtoDAsync_v2");
    assert_eq!(
        each,
        if v2 { 8 } else { 3 },
        "{sym}: copied again from the failed index"
    );
    assert_eq!(e.flush_batches().1, 1, "{sym}: the refusal counted");
    b.check(&format!("{sym}, failed at 5"));
    println!("ran on {sym}.");
    if v2 {
        on_the_12_8_symbol(
            "the_batched_copy_runs_on_either_symbol_and_refills_from_the_failed_index",
        );
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn held_batches_carry_each_range_s_location_hints() {
    let _x = null::exclusive();
    let Some(e) = cuda_or_skip() else {
        return;
    };
    if !null::is_null_driver() {
        println!("skipped: null CUDA driver: reads the batch's attributes it recorded");
        return;
    }
    use cudarc::driver::sys::{CUmemLocationType as L, CUmemcpySrcAccessOrder as O};
    let (host, dev) = (
        (L::CU_MEM_LOCATION_TYPE_HOST as i64, 0),
        (L::CU_MEM_LOCATION_TYPE_DEVICE as i64, 0),
    );
    let stream_order = O::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM as i64;
    // Uploads: host to device 0.
    let b = enqueue_uploads(&e, 4, 8 << 10);
    e.flush();
    let a = null::last_batch_attrs();
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        (a[0].from, a[0].src_hint, a[0].dst_hint),
        (0, host, dev),
        "{a:?}"
    );
    assert_eq!(a[0].src_access_order, stream_order);
    assert_eq!(
        a[0].flags,
        cudarc::driver::sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as i64,
        "the copy engines preferred, as the gatherer's batches"
    );
    b.check("uploads");
    // Downloads: device 0 to host.
    let n = 4;
    let len = 8 << 10;
    let want: Vec<Vec<u8>> = (0..n).map(|i| bytes(len, 300 + i as u64)).collect();
    let devs: Vec<DeviceBuffer> = want
        .iter()
        .map(|w| DeviceBuffer::from_host(0, w).unwrap())
        .collect();
    let mut back: Vec<PinnedBuffer> = (0..n).map(|_| PinnedBuffer::new(len).unwrap()).collect();
    let reqs: Vec<Request> = back
        .iter_mut()
        .zip(&devs)
        // SAFETY: live buffers, untouched until the requests are waited below.
        .map(|(h, d)| unsafe { e.enqueue(flat(h.raw_mut(), d.raw())) }.expect("enqueue"))
        .collect();
    e.flush();
    let a = null::last_batch_attrs();
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!((a[0].src_hint, a[0].dst_hint), (dev, host), "{a:?}");
    for (i, r) in reqs.into_iter().enumerate() {
        r.wait().expect("download");
        check(&format!("download {i}"), &back[i], &want[i]);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn busy_block_copies_carry_location_hints_and_the_overlap_flag() {
    let _x = null::exclusive();
    if !null::is_null_driver() {
        println!("skipped: null CUDA driver: reads the batch's attributes it recorded");
        return;
    }
    let e = ferry::cuda::CudaEngine::with_config(cuda_config(0).compute_busy(true))
        .expect("device 0 opens");
    use cudarc::driver::sys::{CUmemLocationType as L, CUmemcpyFlags as F};
    let (host, dev) = (
        (L::CU_MEM_LOCATION_TYPE_HOST as i64, 0),
        (L::CU_MEM_LOCATION_TYPE_DEVICE as i64, 0),
    );
    let overlap = F::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as i64;
    let (block, blocks) = (8 << 10, 64);
    let table = bytes(block * blocks, 21);
    let host_table = pinned_with(&table);
    let mut dev_table = DeviceBuffer::zeroed(0, block * blocks).unwrap();
    // Every other block, reversed: no two neighbours merge into one run.
    let pairs: Vec<(u64, u64)> = (0..blocks as u64 / 2)
        .map(|i| (2 * i, blocks as u64 - 1 - 2 * i))
        .collect();
    let job = Job {
        dst: dev_table.raw_mut(),
        src: Some(host_table.raw()),
        op: ferry::Op::blocks(block, pairs.iter().copied()),
        after: Vec::new(),
    };
    null::count_calls();
    // SAFETY: live buffers, untouched until the request is waited.
    unsafe { e.submit_raw(job) }.unwrap().wait().unwrap();
    assert_eq!(null::batch_calls(), 1, "the busy route: one batched copy");
    let a = null::last_batch_attrs();
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        (a[0].src_hint, a[0].dst_hint, a[0].flags, a[0].count),
        (host, dev, overlap, pairs.len()),
        "{a:?}"
    );
    let got = dev_table.to_vec().unwrap();
    for &(s, d) in &pairs {
        let (s, d) = (s as usize * block, d as usize * block);
        check(
            &format!("block {}", d / block),
            &got[d..d + block],
            &table[s..s + block],
        );
    }
}
