//! Unit tests of layouts: constructors, slicing, reshape, permute and the predicates.

use super::*;

fn offsets(l: &Layout) -> Vec<usize> {
    l.element_offsets().collect()
}

#[test]
fn contiguous_and_column_major_strides() {
    let l = Layout::contiguous(&[2, 3, 4], 8).unwrap();
    assert_eq!(l.strides(), &[96, 32, 8]);
    assert_eq!(l.len(), 24);
    assert_eq!(l.size_bytes(), 192);
    assert_eq!(l.span(), 0..192);
    assert!(l.is_contiguous() && l.is_dense() && l.is_non_overlapping());
    assert_eq!(l.contiguous_inner_bytes(), 192);
    let c = Layout::column_major(&[2, 3, 4], 8).unwrap();
    assert_eq!(c.strides(), &[8, 16, 48]);
    assert!(!c.is_contiguous());
    assert!(c.is_dense());
    assert_eq!(c.contiguous_inner_bytes(), 8);
}

#[test]
fn pitched_rows() {
    let l = Layout::pitched(&[3, 4, 5], 2, 16).unwrap();
    assert_eq!(l.strides(), &[64, 16, 2]);
    assert_eq!(l.span(), 0..(2 * 64 + 3 * 16 + 10));
    assert!(!l.is_contiguous() && !l.is_dense() && l.is_non_overlapping());
    assert_eq!(l.contiguous_inner_bytes(), 10);
    assert!(l.check_buffer(186).is_ok());
    assert_eq!(
        l.check_buffer(185),
        Err(LayoutError::OutOfBounds { end: 186, len: 185 })
    );
    // A 1-D pitched layout ignores the pitch.
    assert_eq!(Layout::pitched(&[5], 4, 1).unwrap().strides(), &[4]);
}

#[test]
fn size_one_dims_do_not_matter_for_predicates() {
    let l = Layout::with_byte_strides(&[1, 4, 1, 3], &[999, 12, 7, 4], 4).unwrap();
    assert!(l.is_contiguous() && l.is_dense() && l.is_non_overlapping());
    assert_eq!(l.contiguous_inner_bytes(), 48);
}

#[test]
fn broadcast_and_overlap() {
    let b = Layout::with_byte_strides(&[4, 3], &[0, 4], 4).unwrap();
    assert!(!b.is_non_overlapping() && !b.is_dense() && !b.is_contiguous());
    // Strides smaller than the element.
    assert!(!Layout::with_byte_strides(&[4], &[2], 4)
        .unwrap()
        .is_non_overlapping());
    // Interleaved but disjoint: [2, 2] with strides [4, 8] over 4-byte elements is dense.
    let t = Layout::with_byte_strides(&[2, 2], &[4, 8], 4).unwrap();
    assert!(t.is_dense() && t.is_non_overlapping() && !t.is_contiguous());
    // Gaps: dense fails, non-overlapping holds.
    let g = Layout::with_byte_strides(&[3], &[8], 4).unwrap();
    assert!(!g.is_dense() && g.is_non_overlapping());
}

#[test]
fn slice_with_steps() {
    let l = Layout::contiguous(&[10, 6], 4).unwrap();
    let s = l.slice(0, 1..10, 3).unwrap().slice(1, 1..6, 2).unwrap();
    assert_eq!(s.dims(), &[3, 3]);
    assert_eq!(s.strides(), &[72, 8]);
    assert_eq!(s.offset(), 24 + 4);
    let want: Vec<usize> = [1usize, 4, 7]
        .iter()
        .flat_map(|&r| [1usize, 3, 5].map(|c| (r * 6 + c) * 4))
        .collect();
    assert_eq!(offsets(&s), want);
    // A step past the range keeps one element.
    assert_eq!(l.slice(1, 2..6, 100).unwrap().dims(), &[10, 1]);
}

#[test]
fn slice_errors() {
    let l = Layout::contiguous(&[10, 6], 4).unwrap();
    assert_eq!(
        l.slice(2, 0..1, 1),
        Err(LayoutError::AxisOutOfRange { axis: 2, ndim: 2 })
    );
    assert_eq!(l.slice(1, 0..3, 0), Err(LayoutError::ZeroStep { axis: 1 }));
    let e = l.slice(1, 4..7, 1).unwrap_err();
    assert_eq!(
        e,
        LayoutError::SliceOutOfRange {
            axis: 1,
            start: 4,
            end: 7,
            dim: 6
        }
    );
    assert!(
        e.to_string().contains("4..7") && e.to_string().contains("0..6"),
        "{e}"
    );
    assert!(matches!(
        l.slice(0, 3..3, 1),
        Err(LayoutError::SliceOutOfRange { .. })
    ));
    #[allow(clippy::reversed_empty_ranges)]
    let r = l.slice(0, 5..2, 1);
    assert!(matches!(r, Err(LayoutError::SliceOutOfRange { .. })));
    // A huge step keeps one element (regression: it overflowed the stride).
    assert_eq!(l.slice(0, 3..10, usize::MAX).unwrap().dims(), &[1, 6]);
    assert_eq!(l.slice(0, 3..10, usize::MAX).unwrap().offset(), 72);
}

#[test]
fn index_drops_axis() {
    let l = Layout::contiguous(&[4, 5, 6], 2).unwrap();
    let i = l.index(1, 3).unwrap();
    assert_eq!(i.dims(), &[4, 6]);
    assert_eq!(i.strides(), &[60, 2]);
    assert_eq!(i.offset(), 3 * 12);
    let one = Layout::contiguous(&[7], 2).unwrap().index(0, 6).unwrap();
    assert_eq!((one.dims(), one.offset()), (&[1usize][..], 12));
    assert!(matches!(
        l.index(0, 4),
        Err(LayoutError::SliceOutOfRange { .. })
    ));
    assert!(matches!(
        l.index(0, usize::MAX),
        Err(LayoutError::SliceOutOfRange { .. })
    ));
}

#[test]
fn permute_and_transpose() {
    let l = Layout::contiguous(&[2, 3, 4], 1).unwrap();
    let p = l.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.dims(), &[4, 2, 3]);
    assert_eq!(p.strides(), &[1, 12, 4]);
    assert!(p.is_dense() && !p.is_contiguous());
    assert_eq!(
        p.offset_of(&[3, 1, 2]).unwrap(),
        l.offset_of(&[1, 2, 3]).unwrap()
    );
    assert_eq!(l.transpose(0, 2).unwrap().dims(), &[4, 3, 2]);
    for bad in [&[0, 1][..], &[0, 1, 1], &[0, 1, 3], &[0, 1, 2, 3]] {
        let e = l.permute(bad).unwrap_err();
        assert_eq!(
            e,
            LayoutError::BadPermutation {
                ndim: 3,
                order: bad.to_vec()
            }
        );
        assert!(e.to_string().contains("3 axes"), "{e}");
    }
    assert_eq!(
        l.transpose(0, 3),
        Err(LayoutError::AxisOutOfRange { axis: 3, ndim: 3 })
    );
}

#[test]
fn reshape_merges_and_splits() {
    let l = Layout::contiguous(&[4, 6], 4).unwrap();
    assert_eq!(l.reshape(&[24]).unwrap().strides(), &[4]);
    assert_eq!(l.reshape(&[2, 2, 3, 2]).unwrap().strides(), &[48, 24, 8, 4]);
    assert_eq!(l.reshape(&[3, 8]).unwrap().strides(), &[32, 4]);
    // Size-1 dims anywhere.
    let r = l.reshape(&[1, 4, 1, 6, 1]).unwrap();
    assert_eq!(offsets(&r), offsets(&l));
    let back = r.reshape(&[24]).unwrap();
    assert_eq!(offsets(&back), offsets(&l));
    // Padded rows: split and merge inside a row, keep rows apart.
    let p = Layout::pitched(&[4, 6], 4, 32).unwrap();
    let q = p.reshape(&[2, 2, 2, 3]).unwrap();
    assert_eq!(q.strides(), &[64, 32, 12, 4]);
    assert_eq!(offsets(&q), offsets(&p));
    // A sliced layout with steps keeps its gaps.
    let s = Layout::contiguous(&[8, 8], 1)
        .unwrap()
        .slice(1, 0..8, 2)
        .unwrap();
    assert_eq!(offsets(&s.reshape(&[8, 2, 2]).unwrap()), offsets(&s));
    // Single element.
    let one = Layout::contiguous(&[1, 1], 8)
        .unwrap()
        .with_offset(16)
        .unwrap();
    assert_eq!(offsets(&one.reshape(&[1, 1, 1]).unwrap()), vec![16]);
}

#[test]
fn reshape_impossible_cases() {
    let l = Layout::contiguous(&[4, 6], 4).unwrap();
    let e = l.reshape(&[5, 5]).unwrap_err();
    assert_eq!(e, LayoutError::ReshapeCount { from: 24, to: 25 });
    assert!(e.to_string().contains("24") && e.to_string().contains("25"));
    let t = l.transpose(0, 1).unwrap();
    let e = t.reshape(&[24]).unwrap_err();
    assert!(matches!(e, LayoutError::ReshapeNeedsCopy { .. }));
    assert!(
        e.to_string().contains("[6, 4]") && e.to_string().contains("[24]"),
        "{e}"
    );
    let p = Layout::pitched(&[4, 6], 4, 32).unwrap();
    assert!(matches!(
        p.reshape(&[24]),
        Err(LayoutError::ReshapeNeedsCopy { .. })
    ));
    assert!(matches!(
        p.reshape(&[8, 3]),
        Err(LayoutError::ReshapeNeedsCopy { .. })
    ));
    assert_eq!(l.reshape(&[]), Err(LayoutError::NoDims));
    assert_eq!(
        l.reshape(&[24, 0]),
        Err(LayoutError::ReshapeCount { from: 24, to: 0 })
    );
    assert_eq!(
        l.reshape(&[1; 17]),
        Err(LayoutError::TooManyDims {
            ndim: 17,
            max: MAX_DIMS
        })
    );
    assert_eq!(l.reshape(&[usize::MAX, 2]), Err(LayoutError::Overflow));
}

#[test]
fn reshape_huge_strides_do_not_overflow() {
    // Regression: the contiguity test multiplied stride x extent unchecked and panicked.
    let big = usize::MAX - 10;
    let l = Layout::with_byte_strides(&[2, 2], &[0, big], 1).unwrap();
    assert!(matches!(
        l.reshape(&[4]),
        Err(LayoutError::ReshapeNeedsCopy { .. })
    ));
    // Regression: a leading new dim of extent 1 over a huge stride overflowed.
    let l = Layout::with_byte_strides(&[2], &[big], 1).unwrap();
    let r = l.reshape(&[1, 2]).unwrap();
    assert_eq!(offsets(&r), offsets(&l));
}

#[test]
fn constructor_errors() {
    assert_eq!(
        Layout::with_byte_strides(&[], &[], 1),
        Err(LayoutError::NoDims)
    );
    assert_eq!(
        Layout::with_byte_strides(&[2, 3], &[3], 1),
        Err(LayoutError::StridesLength {
            dims: 2,
            strides: 1
        })
    );
    assert_eq!(
        Layout::with_byte_strides(&[2], &[1], 0),
        Err(LayoutError::ZeroElemSize)
    );
    let e = Layout::contiguous(&[1; 17], 1).unwrap_err();
    assert_eq!(e, LayoutError::TooManyDims { ndim: 17, max: 16 });
    assert!(e.to_string().contains("17") && e.to_string().contains("16"));
    assert_eq!(
        Layout::with_byte_strides(&[1; 17], &[1; 17], 1),
        Err(LayoutError::TooManyDims { ndim: 17, max: 16 })
    );
    assert_eq!(
        Layout::contiguous(&[1 << 40, 1 << 40], 1),
        Err(LayoutError::Overflow)
    );
    assert_eq!(
        Layout::with_byte_strides(&[3], &[usize::MAX / 2 + 1], 1),
        Err(LayoutError::Overflow)
    );
    assert_eq!(
        Layout::with_byte_strides(&[2], &[1], usize::MAX),
        Err(LayoutError::Overflow)
    );
    assert_eq!(Layout::bytes(usize::MAX).unwrap().span(), 0..usize::MAX);
    assert_eq!(
        Layout::bytes(8).unwrap().with_offset(usize::MAX - 4),
        Err(LayoutError::Overflow)
    );
    let e = Layout::pitched(&[4, 8], 4, 31).unwrap_err();
    assert_eq!(e, LayoutError::PitchTooSmall { pitch: 31, row: 32 });
    assert!(e.to_string().contains("31") && e.to_string().contains("32"));
    assert_eq!(
        Layout::pitched(&[usize::MAX, 2], 1, 4),
        Err(LayoutError::Overflow)
    );
}

#[test]
fn offset_of_and_errors() {
    let l = Layout::contiguous(&[3, 4], 2)
        .unwrap()
        .with_offset(10)
        .unwrap();
    assert_eq!(l.offset_of(&[2, 3]).unwrap(), 10 + 22);
    assert_eq!(
        l.offset_of(&[1]),
        Err(LayoutError::IndexRank { ndim: 2, index: 1 })
    );
    let e = l.offset_of(&[3, 0]).unwrap_err();
    assert_eq!(
        e,
        LayoutError::IndexOutOfRange {
            axis: 0,
            index: 3,
            dim: 3
        }
    );
    assert!(e.to_string().contains("index 3") && e.to_string().contains("0..3"));
}

#[test]
fn check_buffer_reports_numbers() {
    let l = Layout::contiguous(&[4, 4], 4)
        .unwrap()
        .with_offset(8)
        .unwrap();
    let e = l.check_buffer(70).unwrap_err();
    assert_eq!(e, LayoutError::OutOfBounds { end: 72, len: 70 });
    assert!(e.to_string().contains("72") && e.to_string().contains("70"));
    assert!(l.check_buffer(72).is_ok());
}

#[test]
fn element_offsets_match_offset_of() {
    let l = Layout::with_byte_strides(&[2, 3, 2], &[100, 7, 40], 3)
        .unwrap()
        .with_offset(5)
        .unwrap();
    let mut want = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            for k in 0..2 {
                want.push(l.offset_of(&[i, j, k]).unwrap());
            }
        }
    }
    assert_eq!(offsets(&l), want);
}

#[test]
fn element_offsets_with_huge_strides() {
    // Regression: stepping one stride past the last element overflowed and panicked.
    let h = usize::MAX / 2 + 1;
    let l = Layout::with_byte_strides(&[2, 2], &[1, h], 1).unwrap();
    assert_eq!(offsets(&l), vec![0, h, 1, h + 1]);
}

#[test]
fn bytes_matches_contiguous() {
    for n in [0, 1, 2, 4096, usize::MAX / 2, usize::MAX] {
        assert_eq!(Layout::bytes(n), Layout::contiguous(&[n], 1), "{n}");
    }
}

#[test]
fn zero_dims_make_empty_layouts_with_every_method_defined() {
    let big = usize::MAX / 2;
    for l in [
        Layout::of::<f32>(&[0]).unwrap(),
        Layout::contiguous(&[0], 4).unwrap(),
        Layout::contiguous(&[3, 0, 5], 8).unwrap(),
        Layout::column_major(&[2, 0], 2).unwrap(),
        Layout::pitched(&[4, 0], 4, 64).unwrap(),
        Layout::bytes(0).unwrap(),
        // Dims and strides whose extent would overflow beside the zero dim.
        Layout::with_byte_strides(&[big, 0, big], &[big, 1, big], 1).unwrap(),
        Layout::with_strides::<u16>(&[0, 7], &[7, 1])
            .unwrap()
            .with_offset(40)
            .unwrap(),
    ] {
        let o = l.offset();
        assert!(l.is_empty(), "{l:?}");
        assert_eq!((l.len(), l.size_bytes()), (0, 0), "{l:?}");
        assert_eq!(l.span(), o..o, "{l:?}");
        assert_eq!(l.element_offsets().count(), 0);
        assert!(
            l.is_contiguous() && l.is_dense() && l.is_non_overlapping(),
            "{l:?}"
        );
        assert_eq!(l.contiguous_inner_bytes(), l.elem_size());
        assert!(l.check_elem(l.elem_size()).is_ok());
        // Inside any buffer that reaches its offset, outside any shorter one.
        assert!(l.check_buffer(o).is_ok());
        assert_eq!(l.check_buffer(o.wrapping_sub(1)).is_err(), o > 0, "{l:?}");
        // Reshapes to any dims without element (dense, same offset), to none with elements.
        let r = l.reshape(&[0, 2]).unwrap();
        assert!(r.is_empty() && r.offset() == o && r.span() == (o..o));
        assert_eq!(
            l.reshape(&[1]),
            Err(LayoutError::ReshapeCount { from: 0, to: 1 })
        );
        // Permutations and transposes keep it empty.
        let rev: Vec<usize> = (0..l.ndim()).rev().collect();
        let p = l.permute(&rev).unwrap();
        assert!(p.is_empty() && p.span() == (o..o));
        assert_eq!(
            p.dims().iter().rev().collect::<Vec<_>>(),
            l.dims().iter().collect::<Vec<_>>()
        );
        // The zero axis has no index nor slice; another axis slices to an empty layout.
        let zero = l.dims().iter().position(|&d| d == 0).unwrap();
        assert!(l.index(zero, 0).is_err());
        assert!(l.slice(zero, 0..1, 1).is_err());
        assert!(l.offset_of(&vec![0; l.ndim()]).is_err());
        if let Some(other) = (0..l.ndim()).find(|&a| a != zero && l.dims()[a] > 1) {
            let s = l.slice(other, 1..2, 1).unwrap();
            assert!(s.is_empty());
            assert_eq!(s.offset(), o + l.strides()[other]);
        }
    }
    // Equal to the same geometry built another way.
    assert_eq!(Layout::of::<f32>(&[0]), Layout::contiguous(&[0], 4));
    assert_eq!(Layout::bytes(0).unwrap().dims(), &[0]);
}

#[test]
fn empty_layouts_still_check_their_other_inputs() {
    assert_eq!(Layout::contiguous(&[0], 0), Err(LayoutError::ZeroElemSize));
    assert_eq!(
        Layout::with_byte_strides(&[0, 1], &[1], 1),
        Err(LayoutError::StridesLength {
            dims: 2,
            strides: 1
        })
    );
    assert_eq!(
        Layout::contiguous(&[0; 17], 1),
        Err(LayoutError::TooManyDims { ndim: 17, max: 16 })
    );
    let l = Layout::contiguous(&[0], 4).unwrap();
    assert_eq!(
        l.with_offset(usize::MAX).map(|l| l.span()),
        Ok(usize::MAX..usize::MAX)
    );
    assert_eq!(
        l.check_buffer(10)
            .and(l.with_offset(11).unwrap().check_buffer(10)),
        Err(LayoutError::OutOfBounds { end: 11, len: 10 })
    );
}
