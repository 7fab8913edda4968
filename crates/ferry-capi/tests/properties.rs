//! Property tests through the C ABI: random strided copies match a naive element-by-element
//! reference byte for byte, buffers too short are refused (never overrun), and random layout
//! arguments give an error code, never a panic.

use ferry_capi::*;
use proptest::prelude::*;
use std::ptr::null_mut;

/// (dims, elem_size, per-dim step for the source slice, permutation seed)
fn case() -> impl Strategy<Value = (Vec<usize>, usize, Vec<usize>, u64)> {
    (1usize..=4).prop_flat_map(|n| {
        (
            prop::collection::vec(1usize..=5, n),
            prop::sample::select(vec![1usize, 2, 4, 8, 12]),
            prop::collection::vec(1usize..=3, n),
            any::<u64>(),
        )
    })
}

fn permutation(n: usize, mut seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        p.swap(i, (seed >> 33) as usize % (i + 1));
    }
    p
}

fn layout(dims: &[usize], strides: &[usize], elem: usize, offset: usize) -> *mut FerryLayout {
    let mut l = null_mut();
    // SAFETY: valid pointers of `dims.len()` values.
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
    assert_eq!(rc, 0);
    l
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn strided_copies_match_the_reference((dims, elem, steps, seed) in case(), short in 0usize..3) {
        // Source: a dense buffer big enough for `dims * steps`, viewed with the steps and then
        // permuted; destination: dense in the permuted shape.
        let n = dims.len();
        let big: Vec<usize> = dims.iter().zip(&steps).map(|(d, s)| d * s).collect();
        let mut dense_strides = vec![elem; n];
        for i in (0..n.saturating_sub(1)).rev() {
            dense_strides[i] = dense_strides[i + 1] * big[i + 1];
        }
        let src_strides: Vec<usize> = dense_strides.iter().zip(&steps).map(|(s, k)| s * k).collect();
        let perm = permutation(n, seed);
        let sdims: Vec<usize> = perm.iter().map(|&i| dims[i]).collect();
        let sstrides: Vec<usize> = perm.iter().map(|&i| src_strides[i]).collect();
        let offset = 3;
        let sl = layout(&sdims, &sstrides, elem, offset);
        let mut out = null_mut();
        // SAFETY: valid pointers.
        prop_assert_eq!(unsafe { ferry_layout_create_dense(&mut out, n, sdims.as_ptr(), elem, FERRY_ORDER_ROW_MAJOR) }, 0);
        let dl = out;
        let (mut sspan, mut dspan) = (0, 0);
        // SAFETY: live layouts, valid outputs.
        unsafe {
            prop_assert_eq!(ferry_layout_span(sl, &mut sspan), 0);
            prop_assert_eq!(ferry_layout_span(dl, &mut dspan), 0);
        }
        let src: Vec<u8> = (0..sspan).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0xA5u8; dspan + 5];
        let mut dma = null_mut();
        // SAFETY: valid out-pointer.
        prop_assert_eq!(unsafe { ferry_dma_cpu_create(&mut dma, 2) }, 0);
        let src_len = sspan - short.min(1); // short == 0: exact; else one byte too few
        let mut req = null_mut();
        // SAFETY: the buffers outlive the request, which is waited below.
        let rc = unsafe {
            ferry_dma_request_create(dma, &mut req, dst.as_mut_ptr().cast(), dst.len(), dl, src.as_ptr().cast(), src_len, sl, &ferry_op_copy, null_mut())
        };
        if src_len < sspan {
            prop_assert_eq!(rc, -FERRY_ELAYOUT);
            prop_assert!(dst.iter().all(|&b| b == 0xA5));
        } else {
            prop_assert_eq!(rc, 0);
            // SAFETY: live handles.
            prop_assert_eq!(unsafe { ferry_request_wait(dma, &mut req) }, 0);
            // Naive reference: walk the permuted shape in row-major index order.
            let mut expect = vec![0xA5u8; dspan + 5];
            let count: usize = sdims.iter().product();
            for k in 0..count {
                let (mut rem, mut so, mut dof) = (k, offset, 0);
                for ax in (0..n).rev() {
                    let i = rem % sdims[ax];
                    rem /= sdims[ax];
                    so += i * sstrides[ax];
                    dof += i * sdims[ax + 1..].iter().product::<usize>() * elem;
                }
                expect[dof..dof + elem].copy_from_slice(&src[so..so + elem]);
            }
            prop_assert_eq!(&dst, &expect);
        }
        // SAFETY: live handles.
        unsafe {
            prop_assert_eq!(ferry_dma_destroy(&mut dma), 0);
            let (mut a, mut b) = (sl, dl);
            ferry_layout_destroy(&mut a);
            ferry_layout_destroy(&mut b);
        }
    }

    #[test]
    fn random_layout_arguments_never_panic(
        dims in prop::collection::vec(any::<usize>().prop_map(|x| x % 7 + if x % 13 == 0 { usize::MAX / 3 } else { 0 }), 0..18),
        strides in prop::collection::vec(any::<usize>().prop_map(|x| if x % 11 == 0 { x } else { x % 64 }), 0..18),
        elem in 0usize..10,
        offset in prop_oneof![0usize..100, Just(usize::MAX)],
        axis in 0usize..5, start in 0usize..8, end in 0usize..8, step in 0usize..3,
    ) {
        let n = dims.len().min(strides.len());
        let mut l = null_mut();
        // SAFETY: valid pointers of `n` values.
        let rc = unsafe { ferry_layout_create_strided(&mut l, n, dims.as_ptr(), strides.as_ptr(), elem, offset) };
        prop_assert!(rc == 0 || rc == -FERRY_ELAYOUT, "rc {}", rc);
        if rc == 0 {
            let (mut s, mut r) = (null_mut(), null_mut());
            // SAFETY: a live layout, valid pointers.
            unsafe {
                let rc = ferry_layout_slice(l, &mut s, axis, start, end, step);
                prop_assert!(rc == 0 || rc == -FERRY_ELAYOUT, "slice rc {}", rc);
                let rc = ferry_layout_reshape(l, &mut r, n.min(2), [6usize, 2].as_ptr());
                prop_assert!(rc == 0 || rc == -FERRY_ELAYOUT, "reshape rc {}", rc);
                let mut span = 0;
                prop_assert_eq!(ferry_layout_span(l, &mut span), 0);
                for mut x in [l, s, r] {
                    prop_assert_eq!(ferry_layout_destroy(&mut x), 0);
                }
            }
        } else {
            prop_assert!(l.is_null());
        }
    }
}
