//! The C interface on a GPU, called as a C program would (`ferry_dma_cuda_create`,
//! `ferry_dma_request_create_mem` with device, pinned and pageable buffers, a transposing
//! layout, a fill, barriers, bad input). Every byte is checked. Prints `skipped: no CUDA driver`
//! on a machine without one.

use ferry::cuda::{DeviceBuffer, PinnedBuffer};
use ferry_capi::*;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

fn last() -> String {
    // SAFETY: no arguments; the string is copied before the next call on this thread.
    unsafe { CStr::from_ptr(ferry_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn dense(dims: &[usize], elem: usize) -> *mut FerryLayout {
    let mut l = null_mut();
    // SAFETY: valid pointers, `dims.len()` values.
    let rc = unsafe {
        ferry_layout_create_dense(
            &mut l,
            dims.len(),
            dims.as_ptr(),
            elem,
            FERRY_ORDER_ROW_MAJOR,
        )
    };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());
    l
}

fn buf(ptr: *mut c_void, len: usize, kind: i32, device: i32) -> FerryBuffer {
    FerryBuffer {
        ptr,
        len,
        kind,
        device,
    }
}

/// Submits one request and waits for it; returns the wait's code.
///
/// # Safety
/// The buffers are valid for their lengths and used by nobody else until this returns.
unsafe fn run(
    dma: *mut FerryDma,
    dst: &FerryBuffer,
    dl: *const FerryLayout,
    src: Option<&FerryBuffer>,
    sl: *const FerryLayout,
    op: *const FerryOp,
    arg: *mut c_void,
) -> i32 {
    let mut req = null_mut();
    let src = src.map_or(null(), |s| s as *const FerryBuffer);
    // SAFETY: the caller's contract; the layouts are live handles.
    let rc = unsafe { ferry_dma_request_create_mem(dma, &mut req, dst, dl, src, sl, op, arg) };
    if rc != FERRY_SUCCESS {
        return rc;
    }
    // SAFETY: `req` was just created on `dma`.
    unsafe { ferry_request_wait(dma, &mut req) }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn cuda_dma_through_the_c_interface() {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return;
    }
    let mut dma = null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { ferry_dma_cuda_create(&mut dma, 0) };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());

    // A 256 x 384 matrix of 4-byte elements: pageable -> device, device -> device transposed,
    // device -> pinned, and the transpose checked on the host.
    let (r, c, e) = (256usize, 384usize, 4usize);
    let n = r * c * e;
    let src = bytes(n, 7);
    let dev_a = DeviceBuffer::new(0, n).expect("device buffer");
    let dev_b = DeviceBuffer::new(0, n).expect("device buffer");
    let mut pinned = PinnedBuffer::new(n).expect("pinned buffer");
    let ab = buf(dev_a.device_ptr() as *mut c_void, n, FERRY_MEM_DEVICE, 0);
    let bb = buf(dev_b.device_ptr() as *mut c_void, n, FERRY_MEM_DEVICE, 0);
    let pb = buf(pinned.as_mut_ptr().cast(), n, FERRY_MEM_PINNED, 0);
    let hb = buf(src.as_ptr() as *mut c_void, n, FERRY_MEM_PAGEABLE, 0);
    let rc_layout = dense(&[r, c], e);
    let cr_layout = dense(&[c, r], e);
    let mut transposed = null_mut();
    // SAFETY: a live layout; valid out-pointer and permutation.
    let rc = unsafe { ferry_layout_permute(cr_layout, &mut transposed, 2, [1usize, 0].as_ptr()) };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());

    // SAFETY: for all requests below, the buffers live until the end of the test and are used by
    // one request at a time.
    unsafe {
        let op = &ferry_op_copy as *const FerryOp;
        assert_eq!(
            run(dma, &ab, rc_layout, Some(&hb), rc_layout, op, null_mut()),
            FERRY_SUCCESS,
            "{}",
            last()
        );
        // dev_b holds the c x r transpose: element (i, j) of A lands at (j, i) of B.
        assert_eq!(
            run(dma, &bb, transposed, Some(&ab), rc_layout, op, null_mut()),
            FERRY_SUCCESS,
            "{}",
            last()
        );
        assert_eq!(
            run(dma, &pb, cr_layout, Some(&bb), cr_layout, op, null_mut()),
            FERRY_SUCCESS,
            "{}",
            last()
        );
    }
    let out: &[u8] = &pinned;
    for i in 0..r {
        for j in 0..c {
            let s = (i * c + j) * e;
            let d = (j * r + i) * e;
            assert_eq!(&out[d..d + e], &src[s..s + e], "element ({i}, {j})");
        }
    }

    // A fill of the device buffer with a 4-byte pattern, read back.
    let pattern = 0xA1B2_C3D4u32.to_ne_bytes();
    // SAFETY: as above; the pattern is `e` bytes.
    unsafe {
        assert_eq!(
            run(
                dma,
                &ab,
                rc_layout,
                None,
                null(),
                &ferry_op_fill,
                pattern.as_ptr() as *mut c_void
            ),
            FERRY_SUCCESS,
            "{}",
            last()
        );
        let op = &ferry_op_copy as *const FerryOp;
        assert_eq!(
            run(dma, &pb, rc_layout, Some(&ab), rc_layout, op, null_mut()),
            FERRY_SUCCESS,
            "{}",
            last()
        );
    }
    assert!(pinned.chunks(e).all(|w| w == pattern));

    // Many requests in flight, then one barrier: 64 slices of 4 KiB device -> pinned.
    let flat = dense(&[n], 1);
    let mut reqs = Vec::new();
    for k in 0..64usize {
        let len = 4096;
        let d = buf(pb.ptr.wrapping_add(k * len), len, FERRY_MEM_PINNED, 0);
        let s = buf(
            (dev_b.device_ptr() + (k * len) as u64) as *mut c_void,
            len,
            FERRY_MEM_DEVICE,
            0,
        );
        let mut req = null_mut();
        // SAFETY: disjoint 4 KiB pieces of live buffers; the layouts may be NULL for memcpy.
        let rc = unsafe {
            ferry_dma_request_create_mem(
                dma,
                &mut req,
                &d,
                null(),
                &s,
                null(),
                &ferry_op_memcpy,
                null_mut(),
            )
        };
        assert_eq!(rc, FERRY_SUCCESS, "{}", last());
        reqs.push(req);
    }
    // SAFETY: a live dma.
    assert_eq!(unsafe { ferry_dma_barrier(dma) }, 0, "{}", last());
    for mut req in reqs {
        // SAFETY: requests of this dma, complete after the barrier.
        assert_eq!(unsafe { ferry_request_destroy(dma, &mut req) }, 0);
    }
    let expect = dev_b.to_vec().expect("read back");
    assert_eq!(&pinned[..64 * 4096], &expect[..64 * 4096]);

    // Bad input: a device that does not exist, a layout larger than its buffer, pageable to
    // pageable (the CUDA engine does not take it). Each a clear code; the dma still works.
    let ghost = buf(dev_a.device_ptr() as *mut c_void, n, FERRY_MEM_DEVICE, 4096);
    let small = buf(pb.ptr, n / 2, FERRY_MEM_PINNED, 0);
    let mut other = vec![0u8; n];
    let hb2 = buf(other.as_mut_ptr().cast(), n, FERRY_MEM_PAGEABLE, 0);
    // SAFETY: as above; none of these is submitted.
    unsafe {
        let op = &ferry_op_copy as *const FerryOp;
        let rc = run(dma, &ghost, rc_layout, Some(&ab), rc_layout, op, null_mut());
        assert!(rc < 0, "a device that does not exist was accepted");
        assert!(!last().is_empty());
        let rc = run(dma, &small, rc_layout, Some(&ab), rc_layout, op, null_mut());
        assert_eq!(rc, -FERRY_ELAYOUT, "{}", last());
        let rc = run(dma, &hb2, flat, Some(&hb), flat, op, null_mut());
        assert_eq!(rc, -FERRY_EUNSUPPORTED, "{}", last());
        // Still usable: device -> pageable.
        assert_eq!(
            run(dma, &hb2, rc_layout, Some(&bb), rc_layout, op, null_mut()),
            FERRY_SUCCESS,
            "{}",
            last()
        );
    }
    assert_eq!(other, expect);

    for mut l in [rc_layout, cr_layout, transposed, flat] {
        // SAFETY: live layouts, destroyed once.
        assert_eq!(unsafe { ferry_layout_destroy(&mut l) }, 0);
    }
    // SAFETY: a live dma with nothing in flight.
    assert_eq!(unsafe { ferry_dma_destroy(&mut dma) }, 0);
    assert!(dma.is_null());
}

/// Checkpoints of GPU tensors through the C interface: a device tensor and a pinned one
/// saved (blocking, then in the background while the device tensor is overwritten), loaded
/// back into zeroed device and pinned buffers, every byte compared; the load's pinned bytes
/// are the bounce ring's (bounded by the file engine's config), not the checkpoint's.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn checkpoints_of_device_tensors_through_the_c_interface() {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferry-capi-cuda-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = 64 << 20;
    let want_d = bytes(n, 1);
    let want_p = bytes(4096, 2);
    let mut dev = DeviceBuffer::from_host(0, &want_d).unwrap();
    let mut pin = PinnedBuffer::new(4096).unwrap();
    pin.copy_from_slice(&want_p);
    let shape_d = [n / 2];
    let shape_p = [4096usize];
    let tensors = |dev: &mut DeviceBuffer, pin: &mut PinnedBuffer| {
        [
            FerryTensor {
                name: c"dev".as_ptr(),
                dtype: FERRY_DTYPE_BF16,
                ndims: 1,
                shape: shape_d.as_ptr(),
                buf: buf(dev.device_ptr() as *mut c_void, n, FERRY_MEM_DEVICE, 0),
            },
            FerryTensor {
                name: c"pin".as_ptr(),
                dtype: FERRY_DTYPE_U8,
                ndims: 1,
                shape: shape_p.as_ptr(),
                buf: buf(pin.as_mut_ptr() as *mut c_void, 4096, FERRY_MEM_PINNED, 0),
            },
        ]
    };
    let file = std::ffi::CString::new(dir.join("m.safetensors").to_str().unwrap()).unwrap();
    let later = std::ffi::CString::new(dir.join("later.safetensors").to_str().unwrap()).unwrap();
    let ts = tensors(&mut dev, &mut pin);
    let mut r = FerryCheckpointReport::default();
    // SAFETY: live tensors, path and report.
    let rc = unsafe { ferry_checkpoint_save(file.as_ptr(), ts.as_ptr(), 2, null(), &mut r) };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());
    println!("save: {r:?}");
    let mut req = null_mut();
    // SAFETY: as above.
    let rc =
        unsafe { ferry_checkpoint_save_async(later.as_ptr(), ts.as_ptr(), 2, null(), &mut req) };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());
    dev.copy_from_host(&vec![0xabu8; n]).unwrap();
    // SAFETY: a live request of no dma.
    let rc = unsafe { ferry_request_wait(null_mut(), &mut req) };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());
    let opts = FerryCheckpointOptions {
        threads: 4,
        ..Default::default()
    };
    for path in [&file, &later] {
        let mut dev = DeviceBuffer::zeroed(0, n).unwrap();
        let mut pin = PinnedBuffer::new(4096).unwrap();
        pin.fill(0);
        let mut ts = tensors(&mut dev, &mut pin);
        // SAFETY: live tensors, path, options and report.
        let rc = unsafe { ferry_checkpoint_load(path.as_ptr(), ts.as_mut_ptr(), 2, &opts, &mut r) };
        assert_eq!(rc, FERRY_SUCCESS, "{}", last());
        println!("load {path:?}: {r:?}");
        assert!(
            dev.to_vec().unwrap() == want_d,
            "{path:?}: the device tensor differs"
        );
        assert_eq!(&pin[..], &want_p[..], "{path:?}");
        assert_eq!(r.bytes, (n + 4096) as u64);
        // 0 where cuFile (real GPUDirect Storage) moved the bytes without the ring.
        assert!(
            r.pinned_bytes <= 4 * ((4 << 20) + 3 * 4096),
            "{path:?}: {} pinned bytes for 4 threads of 4 MiB chunks",
            r.pinned_bytes
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
