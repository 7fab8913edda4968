//! Unit tests through the C ABI, as a C caller would use it.

use crate::*;
use std::ffi::{c_int, c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};

fn last() -> String {
    // SAFETY: no arguments; the pointer is read before the next call on this thread.
    unsafe { CStr::from_ptr(ferry_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn cpu(threads: c_int) -> *mut FerryDma {
    let mut d = null_mut();
    assert_eq!(
        // SAFETY: valid out-pointer.
        unsafe { ferry_dma_cpu_create(&mut d, threads) },
        FERRY_SUCCESS,
        "{}",
        last()
    );
    d
}

fn dense(dims: &[usize], elem: usize) -> *mut FerryLayout {
    let mut l = null_mut();
    assert_eq!(
        // SAFETY: valid pointers, `dims.len()` values.
        unsafe {
            ferry_layout_create_dense(
                &mut l,
                dims.len(),
                dims.as_ptr(),
                elem,
                FERRY_ORDER_ROW_MAJOR,
            )
        },
        0,
        "{}",
        last()
    );
    l
}

fn strided(dims: &[usize], strides: &[usize], elem: usize, offset: usize) -> *mut FerryLayout {
    let mut l = null_mut();
    // SAFETY: valid pointers.
    let rc = unsafe {
        ferry_layout_create_strided(
            &mut l,
            dims.len(),
            dims.as_ptr(),
            strides.as_ptr(),
            elem,
            offset,
        )
    };
    assert_eq!(rc, 0, "{}", last());
    l
}

fn describe(l: *const FerryLayout) -> (Vec<usize>, Vec<usize>, usize, usize) {
    let (mut n, mut d, mut s, mut e, mut o) =
        (0, [0usize; FERRY_MAX_DIMS], [0usize; FERRY_MAX_DIMS], 0, 0);
    // SAFETY: valid outputs of FERRY_MAX_DIMS entries.
    let rc = unsafe {
        ferry_layout_describe(
            l,
            FERRY_MAX_DIMS,
            &mut n,
            d.as_mut_ptr(),
            s.as_mut_ptr(),
            &mut e,
            &mut o,
        )
    };
    assert_eq!(rc, 0, "{}", last());
    (d[..n].to_vec(), s[..n].to_vec(), e, o)
}

fn free_layouts(ls: &mut [*mut FerryLayout]) {
    for l in ls {
        // SAFETY: live layouts from the helpers.
        assert_eq!(unsafe { ferry_layout_destroy(l) }, 0);
        assert!(l.is_null());
    }
}

/// Submits a host request and returns its code and handle.
#[allow(clippy::too_many_arguments)]
fn submit(
    dma: *mut FerryDma,
    dst: &mut [u8],
    dl: *const FerryLayout,
    src: &[u8],
    sl: *const FerryLayout,
    op: *const FerryOp,
    arg: *mut c_void,
) -> (c_int, *mut FerryRequest) {
    let mut r = null_mut();
    let (sp, sn) = if src.is_empty() {
        (null(), 0)
    } else {
        (src.as_ptr().cast(), src.len())
    };
    // SAFETY: the buffers outlive the request: every test waits or barriers before they drop.
    let rc = unsafe {
        ferry_dma_request_create(
            dma,
            &mut r,
            dst.as_mut_ptr().cast(),
            dst.len(),
            dl,
            sp,
            sn,
            sl,
            op,
            arg,
        )
    };
    (rc, r)
}

fn wait(dma: *mut FerryDma, r: &mut *mut FerryRequest) -> c_int {
    // SAFETY: live handles.
    unsafe { ferry_request_wait(dma, r) }
}

fn destroy(mut d: *mut FerryDma) -> c_int {
    // SAFETY: a live dma.
    let rc = unsafe { ferry_dma_destroy(&mut d) };
    assert!(d.is_null());
    rc
}

#[test]
fn layouts_create_slice_reshape_permute_describe() {
    let whole = dense(&[6, 8], 4);
    assert_eq!(describe(whole), (vec![6, 8], vec![32, 4], 4, 0));
    let mut col = null_mut();
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe {
            ferry_layout_create_dense(&mut col, 2, [6, 8].as_ptr(), 4, FERRY_ORDER_COLUMN_MAJOR)
        },
        0
    );
    assert_eq!(describe(col), (vec![6, 8], vec![4, 24], 4, 0));

    let mut s = null_mut();
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { ferry_layout_slice(whole, &mut s, 1, 1, 8, 3) },
        0,
        "{}",
        last()
    );
    assert_eq!(describe(s), (vec![6, 3], vec![32, 12], 4, 4));
    let mut p = null_mut();
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { ferry_layout_permute(s, &mut p, 2, [1, 0].as_ptr()) },
        0
    );
    assert_eq!(describe(p), (vec![3, 6], vec![12, 32], 4, 4));
    let mut r = null_mut();
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { ferry_layout_reshape(whole, &mut r, 3, [2, 3, 8].as_ptr()) },
        0
    );
    assert_eq!(describe(r), (vec![2, 3, 8], vec![96, 32, 4], 4, 0));
    let mut span = 0;
    // SAFETY: valid pointers.
    assert_eq!(unsafe { ferry_layout_span(s, &mut span) }, 0);
    assert_eq!(span, 5 * 32 + 2 * 12 + 4 + 4);
    let st = strided(&[2, 3], &[100, 8], 8, 16);
    assert_eq!(describe(st), (vec![2, 3], vec![100, 8], 8, 16));

    // Errors: each a code and a message, nothing created.
    let mut out = null_mut();
    // SAFETY: every pointer valid or NULL, as the contract allows.
    unsafe {
        assert_eq!(
            ferry_layout_slice(whole, &mut out, 2, 0, 1, 1),
            -FERRY_ELAYOUT
        );
        assert!(last().contains("axis"), "{}", last());
        assert_eq!(
            ferry_layout_slice(whole, &mut out, 0, 0, 7, 1),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_slice(whole, &mut out, 0, 0, 2, 0),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_reshape(p, &mut out, 1, [18].as_ptr()),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_reshape(whole, &mut out, 1, [47].as_ptr()),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_permute(whole, &mut out, 2, [0, 0].as_ptr()),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_permute(whole, &mut out, 1, [0].as_ptr()),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_create_dense(&mut out, 2, null(), 4, 0),
            -FERRY_EINVAL
        );
        assert_eq!(last(), "dims is NULL");
        assert_eq!(
            ferry_layout_create_dense(null_mut(), 1, [1].as_ptr(), 4, 0),
            -FERRY_EINVAL
        );
        assert_eq!(
            ferry_layout_create_dense(&mut out, 1, [4].as_ptr(), 4, 7),
            -FERRY_EINVAL
        );
        assert!(last().contains("order 7"), "{}", last());
        assert_eq!(
            ferry_layout_create_dense(&mut out, 0, [4].as_ptr(), 4, 0),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_create_dense(&mut out, 17, [4; 17].as_ptr(), 4, 0),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_create_dense(&mut out, 1, [0].as_ptr(), 4, 0),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_create_dense(&mut out, 1, [4].as_ptr(), 0, 0),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_create_dense(&mut out, 2, [usize::MAX, 4].as_ptr(), 4, 0),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_create_strided(&mut out, 1, [4].as_ptr(), null(), 4, 0),
            -FERRY_EINVAL
        );
        assert_eq!(
            ferry_layout_create_strided(&mut out, 1, [4].as_ptr(), [4].as_ptr(), 4, usize::MAX),
            -FERRY_ELAYOUT
        );
        assert_eq!(
            ferry_layout_slice(null(), &mut out, 0, 0, 1, 1),
            -FERRY_EINVAL
        );
        let mut small = [0usize; 1];
        let rc = ferry_layout_describe(
            whole,
            1,
            null_mut(),
            small.as_mut_ptr(),
            null_mut(),
            null_mut(),
            null_mut(),
        );
        assert_eq!(rc, -FERRY_EINVAL);
        assert_eq!(ferry_layout_span(whole, null_mut()), -FERRY_EINVAL);
        // A dma handle is not a layout.
        let d = cpu(1);
        assert_eq!(ferry_layout_span(d.cast(), &mut span), -FERRY_EINVAL);
        assert!(last().contains("not a ferry_layout"), "{}", last());
        destroy(d);
        assert_eq!(ferry_layout_destroy(null_mut()), -FERRY_EINVAL);
        let mut nothing: *mut FerryLayout = null_mut();
        assert_eq!(ferry_layout_destroy(&mut nothing), FERRY_SUCCESS);
    }
    assert!(out.is_null());
    free_layouts(&mut [whole, col, s, p, r, st]);
}

#[test]
fn copy_a_tile_with_strided_layouts() {
    let dma = cpu(2);
    let (rows, cols) = (40usize, 30usize);
    let src: Vec<u8> = (0..rows * cols * 2).map(|i| (i * 7 % 251) as u8).collect();
    let whole = dense(&[rows, cols], 2);
    let mut a = null_mut();
    let mut tile = null_mut();
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(ferry_layout_slice(whole, &mut a, 0, 5, 25, 2), 0);
        assert_eq!(ferry_layout_slice(a, &mut tile, 1, 3, 27, 1), 0);
    }
    let pitch = 64;
    let dl = strided(&[10, 24], &[pitch, 2], 2, 0);
    let mut dst = vec![0xEEu8; 9 * pitch + 48];
    let (rc, mut r) = submit(dma, &mut dst, dl, &src, tile, &ferry_op_copy, null_mut());
    assert_eq!(rc, 0, "{}", last());
    let mut done = 0;
    // SAFETY: live handles.
    assert_eq!(unsafe { ferry_request_test(dma, r, &mut done) }, 0);
    assert_eq!(wait(dma, &mut r), 0, "{}", last());
    assert!(r.is_null());
    for i in 0..10 {
        for j in 0..pitch {
            let b = i * pitch + j;
            if b >= dst.len() {
                break;
            }
            let want = if j < 48 {
                src[((5 + 2 * i) * cols + 3) * 2 + j]
            } else {
                0xEE
            };
            assert_eq!(dst[b], want, "row {i} byte {j}");
        }
    }
    assert_eq!(destroy(dma), 0);
    free_layouts(&mut [whole, a, tile, dl]);
}

#[test]
fn memcpy_and_fill() {
    let dma = cpu(1);
    let src: Vec<u8> = (0..1000).map(|i| i as u8).collect();
    let mut dst = vec![0u8; 1000];
    let mut n: usize = 600;
    let (rc, mut r) = submit(
        dma,
        &mut dst,
        null(),
        &src,
        null(),
        &ferry_op_memcpy,
        (&mut n as *mut usize).cast(),
    );
    assert_eq!(rc, 0, "{}", last());
    assert_eq!(wait(dma, &mut r), 0);
    assert_eq!(&dst[..600], &src[..600]);
    assert!(dst[600..].iter().all(|&b| b == 0));

    // Every other u32 of the destination gets the pattern.
    let l = strided(&[125], &[8], 4, 0);
    let mut pattern = 0xDEAD_BEEFu32.to_ne_bytes();
    let (rc, mut r) = submit(
        dma,
        &mut dst,
        l,
        &[],
        null(),
        &ferry_op_fill,
        pattern.as_mut_ptr().cast(),
    );
    assert_eq!(rc, 0, "{}", last());
    assert_eq!(wait(dma, &mut r), 0);
    for k in 0..125 {
        assert_eq!(&dst[k * 8..k * 8 + 4], &pattern, "element {k}");
    }
    assert_eq!(dst[4..8], src[4..8]);

    // Errors at submit, each with its own code; nothing submitted.
    let (rc, r) = submit(
        dma,
        &mut dst[..100],
        null(),
        &src,
        null(),
        &ferry_op_memcpy,
        null_mut(),
    );
    assert_eq!((rc, r), (-FERRY_ELAYOUT, null_mut()), "{}", last());
    let (rc, _) = submit(dma, &mut dst, l, &[], null(), &ferry_op_fill, null_mut());
    assert_eq!(rc, -FERRY_EINVAL);
    assert!(last().contains("op_arg"), "{}", last());
    let (rc, _) = submit(
        dma,
        &mut dst,
        null(),
        &[],
        null(),
        &ferry_op_fill,
        pattern.as_mut_ptr().cast(),
    );
    assert_eq!(rc, -FERRY_EINVAL);
    let (rc, _) = submit(dma, &mut dst, l, &[], null(), &ferry_op_copy, null_mut());
    assert_eq!(rc, -FERRY_EINVAL);
    assert!(last().contains("source"), "{}", last());
    let l2 = dense(&[10], 4);
    let l3 = dense(&[11], 4);
    let (rc, _) = submit(dma, &mut dst, l2, &src, l3, &ferry_op_copy, null_mut());
    assert_eq!(rc, -FERRY_ESHAPE, "{}", last());
    let (rc, _) = submit(dma, &mut dst, l2, &src, null(), &ferry_op_copy, null_mut());
    assert_eq!(rc, -FERRY_EINVAL);
    let (rc, _) = submit(dma, &mut dst, l2, &src, l2, null(), null_mut());
    assert_eq!(rc, -FERRY_EINVAL);
    assert_eq!(last(), "operator is NULL");
    // Overlapping buffers: one allocation seen as both.
    let mut buf = vec![0u8; 64];
    let p = buf.as_mut_ptr();
    let mut r = null_mut();
    // SAFETY: valid pointers; refused before anything runs.
    let rc = unsafe {
        ferry_dma_request_create(
            dma,
            &mut r,
            p.cast(),
            64,
            null(),
            p.add(8).cast(),
            32,
            null(),
            &ferry_op_memcpy,
            null_mut(),
        )
    };
    assert_eq!(rc, -FERRY_EOVERLAP, "{}", last());
    assert_eq!(destroy(dma), 0);
    free_layouts(&mut [l, l2, l3]);
}

#[test]
fn requests_belong_to_their_dma_and_null_arguments_are_errors() {
    let (a, b) = (cpu(1), cpu(1));
    let src = vec![3u8; 256];
    let mut dst = vec![0u8; 256];
    let (rc, mut r) = submit(
        a,
        &mut dst,
        null(),
        &src,
        null(),
        &ferry_op_memcpy,
        null_mut(),
    );
    assert_eq!(rc, 0);
    let mut id = 0;
    // SAFETY: every pointer valid or NULL, as the contract allows.
    unsafe {
        assert_eq!(ferry_request_wait(b, &mut r), -FERRY_EINVAL);
        assert!(last().contains("another dma"), "{}", last());
        assert!(!r.is_null(), "a refused wait must not release the request");
        assert_eq!(ferry_request_id(r, &mut id), 0);
        assert!(id > 0);
        assert_eq!(ferry_request_wait(null_mut(), &mut r), -FERRY_EINVAL);
        assert_eq!(ferry_request_wait(a, null_mut()), -FERRY_EINVAL);
        assert_eq!(ferry_request_test(a, r, null_mut()), -FERRY_EINVAL);
        assert_eq!(ferry_request_test(a, null_mut(), &mut 0), -FERRY_EINVAL);
        assert_eq!(ferry_request_destroy(b, &mut r), -FERRY_EINVAL);
        assert_eq!(ferry_request_wait(a, &mut r), 0);
        assert_eq!(
            ferry_request_wait(a, &mut r),
            -FERRY_EINVAL,
            "a released request is NULL now"
        );
        assert_eq!(
            ferry_request_destroy(a, &mut r),
            0,
            "destroying NULL is a no-op"
        );
        assert_eq!(ferry_request_id(null_mut(), &mut id), -FERRY_EINVAL);
        let mut req = null_mut();
        assert_eq!(
            ferry_dma_request_create(
                a,
                &mut req,
                null_mut(),
                8,
                null(),
                src.as_ptr().cast(),
                8,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            -FERRY_EINVAL
        );
        assert_eq!(
            ferry_dma_request_create(
                a,
                null_mut(),
                dst.as_mut_ptr().cast(),
                8,
                null(),
                src.as_ptr().cast(),
                8,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            -FERRY_EINVAL
        );
        assert_eq!(
            ferry_dma_request_create(
                a,
                &mut req,
                dst.as_mut_ptr().cast(),
                0,
                null(),
                src.as_ptr().cast(),
                8,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            -FERRY_EINVAL
        );
        assert_eq!(
            ferry_dma_request_create(
                a,
                &mut req,
                dst.as_mut_ptr().cast(),
                8,
                null(),
                null(),
                8,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            -FERRY_EINVAL
        );
        // A layout handle is not an operator, and a dma is not a layout.
        let l = dense(&[8], 1);
        assert_eq!(
            ferry_dma_request_create(
                a,
                &mut req,
                dst.as_mut_ptr().cast(),
                8,
                l,
                src.as_ptr().cast(),
                8,
                l,
                l.cast(),
                null_mut()
            ),
            -FERRY_EINVAL
        );
        assert_eq!(
            ferry_dma_request_create(
                a,
                &mut req,
                dst.as_mut_ptr().cast(),
                8,
                a.cast(),
                src.as_ptr().cast(),
                8,
                l,
                &ferry_op_copy,
                null_mut()
            ),
            -FERRY_EINVAL
        );
        assert!(req.is_null());
        assert_eq!(ferry_dma_barrier(null_mut()), -FERRY_EINVAL);
        assert_eq!(ferry_dma_destroy(null_mut()), -FERRY_EINVAL);
        let mut none: *mut FerryDma = null_mut();
        assert_eq!(ferry_dma_destroy(&mut none), 0);
        free_layouts(&mut [l]);
    }
    assert_eq!(dst, src);
    destroy(a);
    destroy(b);
}

#[test]
fn memory_kinds() {
    let dma = cpu(1);
    let src = vec![5u8; 64];
    let mut dst = vec![0u8; 64];
    let buf = |p: *mut u8, kind, device| FerryBuffer {
        ptr: p.cast(),
        len: 64,
        kind,
        device,
    };
    let (d, s) = (
        buf(dst.as_mut_ptr(), FERRY_MEM_PINNED, 0),
        buf(src.as_ptr().cast_mut(), FERRY_MEM_PAGEABLE, 0),
    );
    let mut r = null_mut();
    // SAFETY: valid buffers that outlive the request.
    unsafe {
        assert_eq!(
            ferry_dma_request_create_mem(
                dma,
                &mut r,
                &d,
                null(),
                &s,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            0,
            "{}",
            last()
        );
        assert_eq!(ferry_request_wait(dma, &mut r), 0);
        let dev = buf(0x1000 as *mut u8, FERRY_MEM_DEVICE, 0);
        assert_eq!(
            ferry_dma_request_create_mem(
                dma,
                &mut r,
                &dev,
                null(),
                &s,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            -FERRY_EUNSUPPORTED
        );
        assert!(last().contains("cannot copy"), "{}", last());
        let bad = buf(dst.as_mut_ptr(), 9, 0);
        assert_eq!(
            ferry_dma_request_create_mem(
                dma,
                &mut r,
                &bad,
                null(),
                &s,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            -FERRY_EINVAL
        );
        let neg = buf(dst.as_mut_ptr(), FERRY_MEM_DEVICE, -1);
        assert_eq!(
            ferry_dma_request_create_mem(
                dma,
                &mut r,
                &neg,
                null(),
                &s,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            -FERRY_EINVAL
        );
        assert_eq!(
            ferry_dma_request_create_mem(
                dma,
                &mut r,
                null(),
                null(),
                &s,
                null(),
                &ferry_op_memcpy,
                null_mut()
            ),
            -FERRY_EINVAL
        );
    }
    assert_eq!(dst, src);
    destroy(dma);
}

#[test]
fn engines_cpu_multiplex_cuda() {
    let mut out = null_mut();
    // SAFETY: every pointer valid or NULL, as the contract allows.
    unsafe {
        assert_eq!(ferry_dma_cpu_create(&mut out, -1), -FERRY_EINVAL);
        assert_eq!(ferry_dma_cpu_create(null_mut(), 1), -FERRY_EINVAL);
        assert_eq!(ferry_dma_cuda_create(&mut out, -1), -FERRY_EINVAL);
        if ferry::cuda::probe().driver.is_err() {
            // No driver here: a clear code and message, nothing created.
            assert_eq!(ferry_dma_cuda_create(&mut out, 0), -FERRY_ENOTAVAIL);
            assert!(last().contains("no CUDA driver"), "{}", last());
            assert!(out.is_null());
        } else {
            assert_eq!(
                ferry_dma_cuda_create(&mut out, 0),
                FERRY_SUCCESS,
                "{}",
                last()
            );
            destroy(out);
            out = null_mut();
        }
        // 0 threads: one worker per core, the same engine as Rust's CpuEngine::new(0).
        let default = cpu(0);
        let cores = ferry::engine::cpu::probe().cores;
        assert_eq!((*default).engine.name(), format!("cpu({cores})"));
        assert_eq!(
            (*default).engine.name(),
            ferry::Engine::name(&ferry::CpuEngine::new(0).unwrap())
        );
        destroy(default);

        let mut parts = [cpu(1), cpu(2)];
        let keep = parts;
        assert_eq!(
            ferry_dma_multiplex_create(
                &mut out,
                parts.as_mut_ptr(),
                [1.0, f64::NAN].as_ptr(),
                2,
                0
            ),
            -FERRY_EINVAL
        );
        assert_eq!(parts, keep, "a refused multiplex takes nothing");
        assert_eq!(
            ferry_dma_multiplex_create(&mut out, parts.as_mut_ptr(), null(), 0, 0),
            -FERRY_EINVAL
        );
        let mut twice = [parts[0], parts[0]];
        assert_eq!(
            ferry_dma_multiplex_create(&mut out, twice.as_mut_ptr(), null(), 2, 0),
            -FERRY_EINVAL
        );
        assert!(last().contains("twice"), "{}", last());
        assert_eq!(
            ferry_dma_multiplex_create(&mut out, parts.as_mut_ptr(), [1.0, 2.0].as_ptr(), 2, 4096),
            0,
            "{}",
            last()
        );
        assert_eq!(parts, [null_mut(), null_mut()]);

        // A split copy through the multiplex.
        let src: Vec<u8> = (0..1 << 20).map(|i: usize| (i % 253) as u8).collect();
        let mut dst = vec![0u8; 1 << 20];
        let (rc, mut r) = submit(
            out,
            &mut dst,
            null(),
            &src,
            null(),
            &ferry_op_memcpy,
            null_mut(),
        );
        assert_eq!(rc, 0, "{}", last());
        assert_eq!(ferry_request_wait(out, &mut r), 0);
        assert_eq!(dst, src);
    }
    assert_eq!(destroy(out), 0);
}

static DESTROYED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count_destroy(user: *mut c_void) {
    assert_eq!(user as usize, 42);
    DESTROYED.fetch_add(1, Ordering::SeqCst);
}

/// Copies the diagonal of an n x n u32 source matrix (n from `op_arg`) into a dense vector.
unsafe extern "C" fn lower_diagonal(
    prog: *mut FerryProgram,
    _dst: *const FerryLayout,
    _src: *const FerryLayout,
    arg: *mut c_void,
    _user: *mut c_void,
) -> c_int {
    // SAFETY: the test passes a usize as op_arg.
    let n = unsafe { *arg.cast::<usize>() };
    let d = dense(&[n], 4);
    let s = strided(&[n], &[(n + 1) * 4], 4, 0);
    // SAFETY: live program and layouts.
    let rc = unsafe { ferry_program_copy(prog, d, s) };
    free_layouts(&mut [d, s]);
    rc
}

/// Uses the request's own layouts: fills dst_layout with 0x11, then copies src_layout into it.
unsafe extern "C" fn lower_with_layouts(
    prog: *mut FerryProgram,
    dst: *const FerryLayout,
    src: *const FerryLayout,
    _arg: *mut c_void,
    _user: *mut c_void,
) -> c_int {
    // SAFETY: live program and layouts.
    unsafe {
        let rc = ferry_program_fill(prog, dst, [0x11u8].as_ptr().cast(), 1);
        if rc != 0 {
            return rc;
        }
        let (mut dl, mut sl) = (0, 0);
        assert_eq!(ferry_program_buffers(prog, &mut dl, &mut sl), 0);
        assert_eq!((dl, sl), (16, 8));
        assert_eq!(
            ferry_program_fill(prog, dst, [0u8; 2].as_ptr().cast(), 2),
            -FERRY_EINVAL
        );
        ferry_program_copy(prog, dst, src)
    }
}

/// Returns an error of its own without any step.
unsafe extern "C" fn lower_fails(
    _: *mut FerryProgram,
    _: *const FerryLayout,
    _: *const FerryLayout,
    _: *mut c_void,
    _: *mut c_void,
) -> c_int {
    -FERRY_EOP
}

/// Tries to copy with no source buffer.
unsafe extern "C" fn lower_no_source(
    prog: *mut FerryProgram,
    dst: *const FerryLayout,
    _: *const FerryLayout,
    _: *mut c_void,
    _: *mut c_void,
) -> c_int {
    // SAFETY: live program and layout.
    unsafe { ferry_program_copy(prog, dst, dst) }
}

fn operator(name: &CStr, lower: FerryLowerFn, destroy: bool) -> *mut FerryOp {
    let t = FerryOperator {
        name: name.as_ptr(),
        lower,
        destroy: if destroy { Some(count_destroy) } else { None },
        user_data: 42 as *mut c_void,
    };
    let mut op = null_mut();
    assert_eq!(
        // SAFETY: valid table and out-pointer.
        unsafe { ferry_operator_create(&mut op, &t) },
        0,
        "{}",
        last()
    );
    op
}

#[test]
fn user_operators() {
    let dma = cpu(2);
    let n = 9usize;
    let m: Vec<u32> = (0..(n * n) as u32).collect();
    let src: Vec<u8> = m.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let mut dst = vec![0u8; n * 4];
    let mut arg = n;
    let diag = operator(c"diagonal", Some(lower_diagonal), true);
    let (rc, mut r) = submit(
        dma,
        &mut dst,
        null(),
        &src,
        null(),
        diag,
        (&mut arg as *mut usize).cast(),
    );
    assert_eq!(rc, 0, "{}", last());
    // Destroying the operator with a request in flight keeps it alive until the request ends.
    let mut d = diag;
    // SAFETY: a live operator.
    assert_eq!(unsafe { ferry_operator_destroy(&mut d) }, 0);
    assert!(d.is_null());
    assert_eq!(wait(dma, &mut r), 0, "{}", last());
    // The engine drops its reference to the operator just after completing the request, on
    // its own thread: wait for that (bounded).
    let t = std::time::Instant::now();
    while DESTROYED.load(Ordering::SeqCst) == 0 && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        DESTROYED.load(Ordering::SeqCst),
        1,
        "destroy callback runs once, after the last request"
    );
    let got: Vec<u32> = dst
        .chunks(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(
        got,
        (0..n as u32)
            .map(|i| i * (n as u32 + 1))
            .collect::<Vec<_>>()
    );

    // The operator sees the request's layouts.
    let with = operator(c"with_layouts", Some(lower_with_layouts), false);
    let dl = strided(&[8], &[2], 1, 0);
    let sl = dense(&[8], 1);
    let mut out = vec![0u8; 16];
    let (rc, mut r) = submit(
        dma,
        &mut out,
        dl,
        &[1, 2, 3, 4, 5, 6, 7, 8],
        sl,
        with,
        null_mut(),
    );
    assert_eq!(rc, 0);
    assert_eq!(wait(dma, &mut r), 0, "{}", last());
    assert_eq!(out, [1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 0]);

    // Failures reach wait with the operator's name, the code's text and the step's own error.
    let fails = operator(c"fails", Some(lower_fails), false);
    let (rc, mut r) = submit(dma, &mut out, null(), &[1], null(), fails, null_mut());
    assert_eq!(rc, 0);
    assert_eq!(wait(dma, &mut r), -FERRY_EREQUEST);
    assert!(
        last().contains("operator `fails` failed: returned -10 (operator failed)"),
        "{}",
        last()
    );
    let nosrc = operator(c"nosrc", Some(lower_no_source), false);
    let (rc, mut r) = submit(dma, &mut out, dl, &[], null(), nosrc, null_mut());
    assert_eq!(rc, 0);
    assert_eq!(wait(dma, &mut r), -FERRY_EREQUEST);
    assert!(last().contains("no source buffer"), "{}", last());

    // Table errors; built-ins are not destroyable.
    let mut op = null_mut();
    let no_lower = FerryOperator {
        name: null(),
        lower: None,
        destroy: None,
        user_data: null_mut(),
    };
    // SAFETY: every pointer valid or NULL, as the contract allows.
    unsafe {
        assert_eq!(ferry_operator_create(&mut op, &no_lower), -FERRY_EINVAL);
        assert_eq!(ferry_operator_create(&mut op, null()), -FERRY_EINVAL);
        let bad_name = FerryOperator {
            name: c"\xff".as_ptr(),
            lower: Some(lower_fails),
            destroy: None,
            user_data: null_mut(),
        };
        assert_eq!(ferry_operator_create(&mut op, &bad_name), -FERRY_EINVAL);
        let mut builtin = (&ferry_op_copy as *const FerryOp).cast_mut();
        assert_eq!(ferry_operator_destroy(&mut builtin), -FERRY_EINVAL);
        assert!(!builtin.is_null());
        assert_eq!(ferry_program_copy(null_mut(), dl, sl), -FERRY_EINVAL);
        for mut o in [with, fails, nosrc] {
            assert_eq!(ferry_operator_destroy(&mut o), 0);
        }
    }
    assert_eq!(destroy(dma), 0);
    free_layouts(&mut [dl, sl]);
}

#[test]
fn barrier_reports_every_failure_and_destroy_waits() {
    let dma = cpu(2);
    let fails = operator(c"fails", Some(lower_fails), false);
    let src = vec![9u8; 1 << 22];
    let mut dst = vec![0u8; 1 << 22];
    let mut small = vec![0u8; 8];
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (rc, mut r) = submit(dma, &mut small, null(), &[1], null(), fails, null_mut());
        assert_eq!(rc, 0);
        let mut id = 0;
        // SAFETY: live handles; destroy waits for completion without taking the result.
        unsafe {
            assert_eq!(ferry_request_id(r, &mut id), 0);
            assert_eq!(ferry_request_destroy(dma, &mut r), 0);
        }
        ids.push(id);
    }
    // One failure observed through test(): not reported again by the barrier.
    let (rc, r) = submit(dma, &mut small, null(), &[1], null(), fails, null_mut());
    assert_eq!(rc, 0);
    let mut done = 0;
    loop {
        // SAFETY: live handles.
        let rc = unsafe { ferry_request_test(dma, r, &mut done) };
        if done == 1 {
            assert_eq!(rc, -FERRY_EREQUEST);
            break;
        }
        assert_eq!(rc, 0);
        std::thread::yield_now();
    }
    // SAFETY: live handles.
    assert_eq!(unsafe { ferry_dma_barrier(dma) }, 3, "{}", last());
    assert!(last().contains("3 request(s) failed"), "{}", last());
    let mut seen = Vec::new();
    for i in 0..3 {
        let (mut id, mut msg) = (0u64, null());
        // SAFETY: valid outputs; the message is read before the next barrier.
        unsafe {
            assert_eq!(ferry_dma_barrier_failure(dma, i, &mut id, &mut msg), 0);
            let msg = CStr::from_ptr(msg).to_string_lossy();
            assert!(
                msg.contains(&format!("request #{id} failed: operator `fails` failed")),
                "{msg}"
            );
        }
        seen.push(id);
    }
    seen.sort();
    assert_eq!(seen, ids);
    // SAFETY: valid handles.
    unsafe {
        assert_eq!(
            ferry_dma_barrier_failure(dma, 3, null_mut(), null_mut()),
            -FERRY_EINVAL
        );
        assert_eq!(ferry_dma_barrier(dma), 0);
        assert_eq!(
            ferry_dma_barrier_failure(dma, 0, null_mut(), null_mut()),
            -FERRY_EINVAL
        );
        let mut r = r;
        assert_eq!(ferry_request_destroy(dma, &mut r), 0);
    }

    // Destroy with work in flight: waits for it, and reports a failure nobody saw.
    let (rc, mut big) = submit(
        dma,
        &mut dst,
        null(),
        &src,
        null(),
        &ferry_op_memcpy,
        null_mut(),
    );
    assert_eq!(rc, 0);
    let (rc, mut unseen) = submit(dma, &mut small, null(), &[1], null(), fails, null_mut());
    assert_eq!(rc, 0);
    assert_eq!(destroy(dma), 1);
    assert!(dst.iter().all(|&b| b == 9));
    // SAFETY: a request outliving its dma is released with a NULL dma.
    assert_eq!(unsafe { ferry_request_destroy(null_mut(), &mut big) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { ferry_request_destroy(null_mut(), &mut unseen) }, 0);
    let mut f = fails;
    // SAFETY: a live operator.
    assert_eq!(unsafe { ferry_operator_destroy(&mut f) }, 0);
}

#[test]
fn strerror_and_panics() {
    for code in 0..=FERRY_EPANIC {
        // SAFETY: static strings.
        let (pos, neg) = unsafe {
            (
                CStr::from_ptr(ferry_strerror(code)),
                CStr::from_ptr(ferry_strerror(-code)),
            )
        };
        assert_eq!(pos, neg);
        assert_ne!(pos.to_str().unwrap(), "unknown error code", "code {code}");
    }
    // SAFETY: static strings.
    unsafe {
        assert_eq!(
            CStr::from_ptr(ferry_strerror(1000)).to_str().unwrap(),
            "unknown error code"
        );
        assert_eq!(
            CStr::from_ptr(ferry_strerror(c_int::MIN)).to_str().unwrap(),
            "unknown error code"
        );
    }
    // The guard every entry point runs in turns a panic into a code and a message.
    let rc = crate::error::guard(|| panic!("boom {}", 7));
    assert_eq!(rc, -FERRY_EPANIC);
    assert!(last().contains("boom 7"), "{}", last());
    // The message is per thread.
    std::thread::spawn(|| assert_eq!(last(), ""))
        .join()
        .unwrap();
}

static GATE_OPEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Copies `src` into `dst`, but only once `GATE_OPEN` is set (at most 30 s): a user operator
/// is lowered on a worker, so this keeps its request in flight until the test opens the gate.
unsafe extern "C" fn lower_gated(
    prog: *mut FerryProgram,
    dst: *const FerryLayout,
    src: *const FerryLayout,
    _: *mut c_void,
    _: *mut c_void,
) -> c_int {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !GATE_OPEN.load(Ordering::SeqCst) {
        if std::time::Instant::now() > until {
            return -FERRY_EOP;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: live program and layouts.
    unsafe { ferry_program_copy(prog, dst, src) }
}

/// Waiting for one request waits for that one only: a request held in flight on the engine's
/// one worker (a user operator that lowers only once the test lets it) does not hold up the
/// wait of a small copy submitted after it, and is still in flight after that wait. (A plain
/// large copy no longer serves: the CPU engine's caller runs a share of it at submit, so it
/// may end before the small copy is submitted.)
#[test]
fn wait_waits_for_that_request_only() {
    let dma = cpu(1);
    let n = 1 << 20;
    let big = vec![1u8; n];
    let mut big_dst = vec![0u8; n];
    let small = vec![2u8; 4096];
    let mut small_dst = vec![0u8; 4096];
    let gated = operator(c"gated", Some(lower_gated), false);
    let l = dense(&[n], 1);
    GATE_OPEN.store(false, Ordering::SeqCst);
    let (rc, big_req) = submit(dma, &mut big_dst, l, &big, l, gated, null_mut());
    assert_eq!(rc, 0, "{}", last());
    let (rc, mut small_req) = submit(
        dma,
        &mut small_dst,
        null(),
        &small,
        null(),
        &ferry_op_memcpy,
        null_mut(),
    );
    assert_eq!(rc, 0);
    assert_eq!(wait(dma, &mut small_req), 0);
    assert_eq!(small_dst, small);
    let mut done = -1;
    // SAFETY: live handles.
    assert_eq!(unsafe { ferry_request_test(dma, big_req, &mut done) }, 0);
    assert_eq!(
        done, 0,
        "the gated request must still be in flight after waiting for the small one"
    );
    GATE_OPEN.store(true, Ordering::SeqCst);
    let mut big_req = big_req;
    assert_eq!(wait(dma, &mut big_req), 0, "{}", last());
    assert!(big_dst.iter().all(|&b| b == 1));
    free_layouts(&mut [l]);
    let mut gated = gated;
    // SAFETY: a live operator, no request uses it any more.
    assert_eq!(unsafe { ferry_operator_destroy(&mut gated) }, 0);
    destroy(dma);
}

#[test]
fn one_dma_from_many_threads() {
    struct Dma(*mut FerryDma);
    // SAFETY: a ferry_dma may be used from several threads at once (the header's contract).
    unsafe impl Sync for Dma {}
    let dma = Dma(cpu(2));
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let dma = &dma;
            s.spawn(move || {
                for i in 0..200usize {
                    let len = 1 + (i * 997) % 200_000;
                    let src = vec![t ^ i as u8; len];
                    let mut dst = vec![0u8; len];
                    let (rc, mut r) = submit(
                        dma.0,
                        &mut dst,
                        null(),
                        &src,
                        null(),
                        &ferry_op_memcpy,
                        null_mut(),
                    );
                    assert_eq!(rc, 0);
                    assert_eq!(wait(dma.0, &mut r), 0);
                    assert_eq!(dst, src);
                }
            });
        }
    });
    // SAFETY: a live dma.
    assert_eq!(unsafe { ferry_dma_barrier(dma.0) }, 0);
    assert_eq!(destroy(dma.0), 0);
}

static LOWERED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn lower_counting(
    prog: *mut FerryProgram,
    dst: *const FerryLayout,
    src: *const FerryLayout,
    _: *mut c_void,
    _: *mut c_void,
) -> c_int {
    LOWERED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: live program and layouts.
    unsafe { ferry_program_copy(prog, dst, src) }
}

#[test]
fn lower_may_run_more_than_once_per_request() {
    let mut parts = [cpu(1), cpu(1)];
    let mut mux = null_mut();
    assert_eq!(
        // SAFETY: valid pointers.
        unsafe { ferry_dma_multiplex_create(&mut mux, parts.as_mut_ptr(), null(), 2, 0) },
        0
    );
    let op = operator(c"counting", Some(lower_counting), false);
    let l = dense(&[64], 1);
    let src = vec![4u8; 64];
    let mut dst = vec![0u8; 64];
    let (rc, mut r) = submit(mux, &mut dst, l, &src, l, op, null_mut());
    assert_eq!(rc, 0, "{}", last());
    assert_eq!(wait(mux, &mut r), 0);
    assert_eq!(dst, src);
    // The multiplex engine lowers once at submit to size the request for routing, and the
    // chosen engine lowers again to run it: the header tells operators to expect this.
    assert!(
        (1..=2).contains(&LOWERED.load(Ordering::SeqCst)),
        "{}",
        LOWERED.load(Ordering::SeqCst)
    );
    println!(
        "lower ran {} time(s) for one request on a multiplex engine",
        LOWERED.load(Ordering::SeqCst)
    );
    let mut o = op;
    // SAFETY: live handles.
    unsafe { assert_eq!(ferry_operator_destroy(&mut o), 0) };
    destroy(mux);
    free_layouts(&mut [l]);
}
