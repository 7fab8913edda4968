//! Unit tests through the C ABI and of the planner (the C programs in `tests/c/` cover the
//! rest, as a C program uses the library).

use crate::dma::{aml_dma_copy_custom, operator_rc, plan::pairs};
use crate::error::{code_of, AML_EDOM, AML_EINVAL, AML_ENOTSUP, AML_FAILURE};
use crate::layout::*;
use crate::linux::{aml_dma_linux_create, aml_dma_linux_destroy};
use ferry::RequestError;
use std::collections::BTreeSet;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

/// Every (destination, source) byte offset pair the ferry layout pairs copy, one per element.
fn copied(steps: &[(ferry::Layout, ferry::Layout)]) -> BTreeSet<(usize, usize)> {
    let mut set = BTreeSet::new();
    for (d, s) in steps {
        assert_eq!(d.len(), s.len());
        for (a, b) in d.element_offsets().zip(s.element_offsets()) {
            assert!(set.insert((a, b)), "element copied twice");
        }
    }
    set
}

/// The same, element by element from native coordinates (the reference).
fn naive(d: &Dense, s: &Dense) -> BTreeSet<(usize, usize)> {
    let n = d.dims.len();
    let mut c = vec![0usize; n];
    let mut set = BTreeSet::new();
    loop {
        let off = |l: &Dense| c.iter().zip(&l.bs).map(|(i, b)| i * b).sum::<usize>();
        set.insert((off(d), off(s)));
        let Some(i) = (0..n).find(|&i| c[i] + 1 < d.dims[i]) else {
            return set;
        };
        c[i] += 1;
        c[..i].iter_mut().for_each(|x| *x = 0);
    }
}

fn dense(dims: &[usize], bs: &[usize]) -> Dense {
    Dense {
        ptr: 0x1000,
        elem: 4,
        dims: dims.to_vec(),
        bs: bs.to_vec(),
        row: false,
    }
}

#[test]
fn more_dims_than_ferry_layouts_are_split_into_steps() {
    // 19 dims of 2: the destination dense, the source with a gap after every dim (pitch 3),
    // so nothing merges: 16 dims per step, 2^3 steps.
    let dims = vec![2usize; 19];
    let dbs: Vec<usize> = (0..19).map(|i| 4 << i).collect();
    let sbs: Vec<usize> = (0..19).map(|i| 4 * 3usize.pow(i as u32)).collect();
    let (d, s) = (dense(&dims, &dbs), dense(&dims, &sbs));
    let steps = pairs(&d, &s).expect("pairs");
    assert_eq!(steps.len(), 8);
    assert!(steps.iter().all(|(a, _)| a.ndim() == 16));
    assert_eq!(copied(&steps), naive(&d, &s));
}

#[test]
fn mergeable_dims_become_one_run() {
    let d = dense(&[4, 5, 6], &[4, 16, 80]);
    let s = dense(&[4, 5, 6], &[4, 16, 80]);
    let steps = pairs(&d, &s).expect("pairs");
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].0.ndim(), 1);
    // A strided source keeps its dims, and copies the same elements as the reference.
    let s = dense(&[4, 5, 6], &[4, 32, 200]);
    let steps = pairs(&d, &s).expect("pairs");
    assert_eq!(copied(&steps), naive(&d, &s));
}

#[test]
fn shape_and_element_size_mismatches_are_refused() {
    let d = dense(&[4, 5], &[4, 16]);
    assert!(pairs(&d, &dense(&[5, 4], &[4, 20])).is_err());
    let mut s = dense(&[4, 5], &[4, 16]);
    s.elem = 8;
    assert!(pairs(&d, &s).is_err());
    // Dims of 1 do not count.
    assert!(pairs(&d, &dense(&[4, 1, 5], &[4, 16, 16])).is_ok());
}

fn create(ptr: *mut c_void, order: i32, dims: &[usize]) -> *mut AmlLayout {
    let mut l = null_mut();
    // SAFETY: a valid out-pointer and dims array.
    let rc = unsafe {
        aml_layout_dense_create(
            &mut l,
            ptr,
            order,
            4,
            dims.len(),
            dims.as_ptr(),
            null(),
            null(),
        )
    };
    assert_eq!(rc, 0);
    l
}

#[test]
fn reshape_keeps_every_element_where_it_was() {
    let mut buf = vec![0f32; 4 * 6 * 5];
    for order in [AML_LAYOUT_ORDER_ROW_MAJOR, AML_LAYOUT_ORDER_COLUMN_MAJOR] {
        let l = create(buf.as_mut_ptr().cast(), order, &[4, 6, 5]);
        let mut r = null_mut();
        // SAFETY: live layouts, valid arrays.
        unsafe {
            assert_eq!(aml_layout_reshape(l, &mut r, 2, [24, 5].as_ptr()), 0);
            // Element (i, j) of the reshaped layout is element k of the flat order.
            let flat = |i: usize, j: usize| if order == 1 { i * 5 + j } else { i + j * 24 };
            for (i, j) in [(0, 0), (7, 3), (23, 4)] {
                let p = aml_layout_deref(r, [i, j].as_ptr());
                assert_eq!(
                    p,
                    buf.as_mut_ptr().add(flat(i, j)).cast(),
                    "order {order} ({i}, {j})"
                );
            }
            aml_layout_destroy(&mut r);
            // 7 x 3 does not divide the dims: a copy would be needed (and the count differs).
            assert_eq!(
                aml_layout_reshape(l, &mut r, 2, [7, 3].as_ptr()),
                -AML_EINVAL
            );
            let mut l = l;
            aml_layout_destroy(&mut l);
        }
    }
}

#[test]
fn errors_map_to_aml_values() {
    use ferry_capi::{Fail, FERRY_EINVAL, FERRY_ENOTAVAIL, FERRY_EREQUEST};
    assert_eq!(code_of(&Fail::new(FERRY_EINVAL, "")), AML_EINVAL);
    assert_eq!(code_of(&Fail::new(FERRY_ENOTAVAIL, "")), AML_ENOTSUP);
    assert_eq!(code_of(&Fail::new(FERRY_EREQUEST, "")), AML_FAILURE);
    assert_eq!(code_of(&crate::error::fail(AML_EDOM, "")), AML_EDOM);
    let e = RequestError::Operator {
        op: "aml_dma_operator".into(),
        msg: "returned -4".into(),
    };
    assert_eq!(operator_rc(&e), Some(-AML_EDOM));
    assert_eq!(
        operator_rc(&RequestError::Dependency(Box::new(e))),
        Some(-AML_EDOM)
    );
    let other = RequestError::Operator {
        op: "other".into(),
        msg: "returned -4".into(),
    };
    assert_eq!(operator_rc(&other), None);
}

#[test]
fn null_operator_maps_native_coordinates_across_orders() {
    // AML copies element by native (column-major) coordinates: a row-major 3 x 4 source and a
    // column-major 4 x 3 destination have the same native dims, so the bytes come over as is.
    let src: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut dst = vec![0f32; 12];
    let s = create(
        src.as_ptr().cast_mut().cast(),
        AML_LAYOUT_ORDER_ROW_MAJOR,
        &[3, 4],
    );
    let d = create(
        dst.as_mut_ptr().cast(),
        AML_LAYOUT_ORDER_COLUMN_MAJOR,
        &[4, 3],
    );
    let mut dma = null_mut();
    // SAFETY: live layouts and buffers, the copy waited before they go.
    unsafe {
        assert_eq!(aml_dma_linux_create(&mut dma, 2), 0);
        // Native dims: source (4, 3), destination (4, 3): element (j, i) of both.
        assert_eq!(aml_dma_copy_custom(dma, d, s, None, null_mut()), 0);
        assert_eq!(aml_dma_linux_destroy(&mut dma), 0);
        aml_layout_destroy(&mut { s });
        aml_layout_destroy(&mut { d });
    }
    assert_eq!(dst, src);
}

#[test]
fn null_operator_submits_the_rust_api_job() {
    // The strided 3-D copy of `examples/aml_vs_rust.rs`, smaller: a box of a row-major array
    // into a dense one. Through AML, in either order, it must be the very job the Rust API
    // submits (same layouts, the source offset moved into the buffer's address), so that the
    // engine plans and splits it alike.
    let (big, bx, off) = ([6usize, 7, 8], [3usize, 4, 5], [1usize, 2, 3]);
    let src = vec![0f32; big.iter().product()];
    let mut dst = vec![0f32; bx.iter().product()];
    let mut sl = ferry::Layout::of::<f32>(&big).expect("layout");
    for (axis, (o, n)) in off.iter().zip(bx).enumerate() {
        sl = sl.slice(axis, *o..o + n, 1).expect("slice");
    }
    let dl = ferry::Layout::of::<f32>(&bx).expect("layout");
    let rev = |a: [usize; 3]| [a[2], a[1], a[0]];
    for order in [AML_LAYOUT_ORDER_ROW_MAJOR, AML_LAYOUT_ORDER_COLUMN_MAJOR] {
        let user = |a: [usize; 3]| {
            if order == AML_LAYOUT_ORDER_ROW_MAJOR {
                a
            } else {
                rev(a)
            }
        };
        let mut whole = create(src.as_ptr().cast_mut().cast(), order, &user(big));
        let d = create(dst.as_mut_ptr().cast(), order, &user(bx));
        let mut s = null_mut();
        // SAFETY: live layouts over live buffers, valid arrays; nothing is copied.
        let job = unsafe {
            let (o, b) = (user(off), user(bx));
            assert_eq!(
                aml_layout_slice(whole, &mut s, o.as_ptr(), b.as_ptr(), null()),
                0
            );
            crate::dma::planned_job(d, s, |_| ferry::MemKind::Pageable)
        }
        .expect("planned job")
        .expect("dense layouts");
        assert_eq!(job.dst.addr, dst.as_ptr() as u64, "order {order}");
        assert_eq!(
            job.src.map(|b| b.addr),
            Some(src.as_ptr() as u64 + sl.offset() as u64),
            "order {order}"
        );
        match job.op {
            ferry::Op::Copy { dst: jd, src: js } => {
                assert_eq!(jd, dl, "order {order}");
                assert_eq!(js, sl.with_offset(0).expect("offset"), "order {order}");
            }
            other => panic!("order {order}: not a planned copy: {other:?}"),
        }
        // SAFETY: ours, not used afterwards.
        unsafe {
            aml_layout_destroy(&mut whole);
            aml_layout_destroy(&mut { d });
            aml_layout_destroy(&mut s);
        }
    }
}

/// dims {2^63 + 1, 2}, stride {2, 1}, pitch {1, 1}: (d - 1) x s + 1 wrapped to 1 in release
/// builds and the too-small pitch was accepted; overflowing extents and total pitches are
/// refused with `-AML_EINVAL`.
#[test]
fn overflowing_pitches_are_refused() {
    let mut buf = [0u8; 64];
    let mut create = |dims: [usize; 2], stride: [usize; 2], pitch: [usize; 2]| {
        let mut l = null_mut();
        // SAFETY: a valid out-pointer and arrays of two.
        let rc = unsafe {
            aml_layout_dense_create(
                &mut l,
                buf.as_mut_ptr().cast(),
                AML_LAYOUT_ORDER_COLUMN_MAJOR,
                1,
                2,
                dims.as_ptr(),
                stride.as_ptr(),
                pitch.as_ptr(),
            )
        };
        if rc == 0 {
            // SAFETY: made above.
            unsafe { aml_layout_destroy(&mut l) };
        }
        rc
    };
    assert_eq!(create([4, 2], [1, 1], [4, 2]), 0);
    assert_eq!(create([(1 << 63) + 1, 2], [2, 1], [1, 1]), -AML_EINVAL);
    assert_eq!(create([4, usize::MAX], [1, 2], [4, 1]), -AML_EINVAL);
}

#[test]
fn excit_product_is_an_odometer_and_resize_tiles_cover_the_layout() {
    use crate::excit::*;
    use crate::tiling::*;
    // SAFETY: iterators made here, used and freed once.
    unsafe {
        let p = excit_alloc(EXCIT_PRODUCT);
        for (first, last, step) in [(0, 1, 1), (4, 0, -4)] {
            let r = excit_alloc(EXCIT_RANGE);
            assert_eq!(excit_range_init(r, first, last, step), EXCIT_SUCCESS);
            assert_eq!(excit_product_add(p, r), EXCIT_SUCCESS);
        }
        let mut v = [0isize; 2];
        let mut seen = Vec::new();
        while excit_next(p, v.as_mut_ptr()) == EXCIT_SUCCESS {
            seen.push(v);
        }
        assert_eq!(seen, [[0, 4], [0, 0], [1, 4], [1, 0]]);
        assert_eq!(excit_peek(p, null_mut()), EXCIT_STOPIT);
        excit_free(p);
    }
    // A 5 x 3 column-major layout of bytes in tiles of 2 x 2: 3 x 2 tiles, borders 1 wide.
    let mut buf = [0u8; 15];
    let dims = [5usize, 3];
    let mut l: *mut AmlLayout = null_mut();
    let mut t: *mut AmlTiling = null_mut();
    // SAFETY: `buf` outlives the layout and the tiling; all destroyed below.
    unsafe {
        let rc = aml_layout_dense_create(
            &mut l,
            buf.as_mut_ptr().cast(),
            AML_LAYOUT_ORDER_COLUMN_MAJOR,
            1,
            2,
            dims.as_ptr(),
            null(),
            null(),
        );
        assert_eq!(rc, 0);
        assert_eq!(
            aml_tiling_resize_create(&mut t, 0, l, 2, [2usize, 2].as_ptr()),
            0
        );
        assert_eq!(aml_tiling_ntiles(t), 6);
        let mut td = [0usize; 2];
        assert_eq!(
            aml_tiling_tile_dims(t, [2usize, 1].as_ptr(), td.as_mut_ptr()),
            0
        );
        assert_eq!(td, [1, 1]);
        assert!(aml_tiling_index(t, [3usize, 0].as_ptr()).is_null());
        let p = aml_tiling_rawptr(t, [1usize, 1].as_ptr());
        assert_eq!(p.cast::<u8>(), buf.as_mut_ptr().add(2 + 2 * 5));
        aml_tiling_resize_destroy(&mut t);
        assert!(t.is_null());
        aml_layout_destroy(&mut l);
    }
}
