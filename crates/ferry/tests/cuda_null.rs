//! The null CUDA driver's controls, as CI uses them (`cuda_common::null`,
//! `bench/null-cuda/null_cuda.c`): an injected driver failure reaches exactly the request whose
//! call it hit, and in the asynchronous mode streams complete late, independently and out of
//! order. Every test here needs the null driver and prints `skipped: needs the null CUDA
//! driver` on a real one; each takes `null::exclusive()` (its settings are process-wide).

mod cuda_common;
use cuda_common::*;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::CudaContext;
use ferry::cuda::{DeviceBuffer, PinnedBuffer};
use ferry::{EngineExt, Layout};

/// Whether the null driver is loaded; else prints the skip line.
fn null_or_skip() -> bool {
    if !null::is_null_driver() {
        println!("skipped: needs the null CUDA driver (its control API)");
        return false;
    }
    true
}

/// The second of four pinned -> device copies meets an injected `cuMemcpyHtoDAsync_v2`
/// failure: that request fails naming the call and the code, the others (before and after,
/// on the same engine) copy every byte.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn an_injected_copy_failure_fails_its_request_only() {
    let Some(e) = cuda_or_skip() else { return };
    let _null = null::exclusive();
    if !null_or_skip() {
        return;
    }
    let n = 64 << 10;
    let l = Layout::bytes(n).unwrap();
    let data: Vec<Vec<u8>> = (0..4).map(|i| bytes(n, 40 + i)).collect();
    let srcs: Vec<PinnedBuffer> = data.iter().map(|d| pinned_with(d)).collect();
    let mut dsts: Vec<DeviceBuffer> = (0..4)
        .map(|_| DeviceBuffer::zeroed(0, n).unwrap())
        .collect();
    assert!(null::fail(
        "cuMemcpyHtoDAsync_v2",
        2,
        CUresult::CUDA_ERROR_UNKNOWN
    ));
    let results: Vec<Result<(), ferry::Error>> = srcs
        .iter()
        .zip(dsts.iter_mut())
        .map(|(s, d)| e.scope(|sc| sc.copy(d, &l, s, &l)?.wait().map_err(ferry::Error::from)))
        .collect();
    null::clear();
    for (i, r) in results.iter().enumerate() {
        if i == 1 {
            let err = r.as_ref().expect_err("the copy whose driver call failed");
            let d = err
                .driver_error()
                .unwrap_or_else(|| panic!("no driver error in {err}"));
            assert_eq!(d.call, "cuMemcpyHtoDAsync", "{err}");
            assert_eq!(d.code, CUresult::CUDA_ERROR_UNKNOWN, "{err}");
            assert!(
                dsts[i].to_vec().unwrap().iter().all(|&b| b == 0),
                "the failed copy wrote"
            );
        } else {
            r.as_ref()
                .unwrap_or_else(|err| panic!("copy {i} (no failure armed for it): {err}"));
            check(&format!("copy {i}"), &dsts[i].to_vec().unwrap(), &data[i]);
        }
    }
}

/// Asynchronous mode: stream A is held by a wait on a word of mapped memory, stream B copies
/// and completes meanwhile (its event and stream done, A's not, work still pending); then B
/// writes the word, A runs, and nothing is left pending.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn streams_complete_independently_in_the_asynchronous_mode() {
    if cuda_or_skip().is_none() {
        return;
    }
    let _null = null::exclusive();
    if !null_or_skip() {
        return;
    }
    assert!(null::set_async(100));
    let ctx = CudaContext::new(0).unwrap();
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 256 << 10;
    let (da, db) = (bytes(n, 1), bytes(n, 2));
    let (sa, sb) = (pinned_with(&da), pinned_with(&db));
    let (dev_a, dev_b) = (
        DeviceBuffer::zeroed(0, n).unwrap(),
        DeviceBuffer::zeroed(0, n).unwrap(),
    );
    let gate = DeviceBuffer::zeroed(0, 4).unwrap();
    let eq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
    // SAFETY: every address is a live allocation of at least the length given (the gate one
    // word), all of it outlives the streams' work (both streams are synchronized below before
    // anything is dropped); the streams belong to the current context.
    unsafe {
        ok(sys::cuStreamWaitValue32_v2(
            a.cu_stream(),
            gate.device_ptr(),
            1,
            eq,
        ));
        ok(sys::cuMemcpyHtoDAsync_v2(
            dev_a.device_ptr(),
            sa.as_ptr().cast(),
            n,
            a.cu_stream(),
        ));
        ok(sys::cuMemcpyHtoDAsync_v2(
            dev_b.device_ptr(),
            sb.as_ptr().cast(),
            n,
            b.cu_stream(),
        ));
    }
    let ea = a.record_event(None).unwrap();
    let eb = b.record_event(None).unwrap();
    assert!(
        !ea.try_is_complete().unwrap(),
        "A's event done while A is held"
    );
    eb.synchronize().unwrap();
    check("B's copy", &dev_b.to_vec().unwrap(), &db);
    assert!(
        !ea.try_is_complete().unwrap(),
        "A's event done while A is held"
    );
    // SAFETY: queries a live stream.
    let q = unsafe { sys::cuStreamQuery(a.cu_stream()) };
    assert_eq!(q, CUresult::CUDA_ERROR_NOT_READY, "A's stream while held");
    assert!(
        null::pending().unwrap() >= 3,
        "the wait, A's copy and record are queued"
    );
    // SAFETY: the gate is a live word of device memory; B's stream is the current context's.
    unsafe {
        ok(sys::cuStreamWriteValue32_v2(
            b.cu_stream(),
            gate.device_ptr(),
            1,
            0,
        ))
    };
    a.synchronize().unwrap();
    assert!(
        ea.try_is_complete().unwrap(),
        "A's event after A's synchronize"
    );
    check("A's copy", &dev_a.to_vec().unwrap(), &da);
    b.synchronize().unwrap();
    assert_eq!(null::pending(), Some(0));
}

fn ok(r: CUresult) {
    assert_eq!(r, CUresult::CUDA_SUCCESS);
}
