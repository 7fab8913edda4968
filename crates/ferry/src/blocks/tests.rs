use super::*;
use crate::op::{block_segments, check_blocks, Segment};
use crate::{CpuEngine, EngineExt, RequestError};
use proptest::prelude::*;

/// The block size and pairs of a block copy.
fn parts(op: &Op) -> (usize, &[(u64, u64)]) {
    match op {
        Op::Blocks { block_bytes, pairs } => (*block_bytes, pairs),
        _ => unreachable!("a block copy"),
    }
}

/// What a block copy writes: `dst` with each mapped source block in place.
fn reference(dst: &[u8], src: &[u8], map: &Op) -> Vec<u8> {
    let (b, pairs) = parts(map);
    let mut out = dst.to_vec();
    for &(s, d) in pairs {
        let (s, d) = (s as usize * b, d as usize * b);
        out[d..d + b].copy_from_slice(&src[s..s + b]);
    }
    out
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn run(map: &Op, dst: &mut Vec<u8>, src: &[u8]) -> Result<(), crate::Error> {
    let engine = CpuEngine::new(2)?;
    engine
        .scope(|s| -> crate::Result<()> { Ok(s.submit(dst, Some(src), map.clone(), &[])?.wait()?) })
}

/// The operator error a refused submit carries.
fn block_error(e: crate::Error) -> OpError {
    match e {
        crate::Error::Submit(SubmitError::Op(b)) => b,
        other => panic!("expected an operator error, got {other:?}"),
    }
}

#[test]
fn segments_merge_runs_that_continue_on_both_sides() {
    let pairs = [(0, 5), (1, 6), (2, 7), (9, 1), (10, 3), (11, 4)];
    let runs = check_blocks(4, &pairs, 64, 64, None).unwrap();
    assert_eq!(runs, 3);
    let segs = block_segments(4, &pairs, runs);
    assert_eq!(
        &*segs,
        [
            Segment::new(20, 0, 12),
            Segment::new(4, 36, 4),
            Segment::new(12, 40, 8)
        ]
    );
}

#[test]
fn refusals_name_the_entry_and_move_nothing() {
    let src = pattern(64, 1);
    let poison = vec![0xAAu8; 48];
    let cases: Vec<(Op, OpError)> = vec![
        (
            Op::blocks(16, [(0, 0), (4, 1)]),
            OpError::BlockOutOfRange {
                index: 1,
                side: "source",
                block: 4,
                blocks: 4,
                block_bytes: 16,
                table: None,
            },
        ),
        (
            Op::blocks(16, [(0, 3)]),
            OpError::BlockOutOfRange {
                index: 0,
                side: "destination",
                block: 3,
                blocks: 3,
                block_bytes: 16,
                table: None,
            },
        ),
        (
            Op::blocks(16, [(0, 2), (1, 0), (3, 2)]),
            OpError::BlockDuplicate {
                first: 0,
                second: 2,
                block: 2,
            },
        ),
        (
            Op::blocks(16, [(0, 1), (1, 1)]),
            OpError::BlockDuplicate {
                first: 0,
                second: 1,
                block: 1,
            },
        ),
        (Op::blocks(0, [(0, 0)]), OpError::BlockZero),
    ];
    for (map, want) in cases {
        let mut dst = poison.clone();
        let got = block_error(run(&map, &mut dst, &src).unwrap_err());
        assert_eq!(got, want, "{map:?}");
        assert_eq!(dst, poison, "{map:?} moved bytes");
        assert!(!got.to_string().is_empty());
    }
    assert_eq!(
        Op::blocks_from_indices(8, &[1, 2], &[3]).unwrap_err(),
        OpError::BlockIndexCount { src: 2, dst: 1 }
    );
    assert_eq!(
        Op::blocks_from_indices(8, &[1, 2], &[3, -4]).unwrap_err(),
        OpError::BlockNegative {
            index: 1,
            side: "destination",
            value: -4
        }
    );
}

#[test]
fn an_empty_mapping_is_a_no_op() {
    let src = pattern(64, 2);
    let mut dst = vec![7u8; 64];
    run(&Op::blocks(16, []), &mut dst, &src).unwrap();
    assert_eq!(dst, vec![7u8; 64]);
    // Even with a block size of 0: nothing to check, nothing to move.
    run(&Op::blocks(0, []), &mut dst, &src).unwrap();
    assert_eq!(dst, vec![7u8; 64]);
}

#[test]
fn a_partial_block_at_a_table_end_is_not_a_block() {
    // 40 bytes hold 2 whole blocks of 16.
    let src = pattern(40, 3);
    let mut dst = vec![0u8; 40];
    let err = run(&Op::blocks(16, [(2, 0)]), &mut dst, &src).unwrap_err();
    assert!(matches!(
        block_error(err),
        OpError::BlockOutOfRange {
            block: 2,
            blocks: 2,
            ..
        }
    ));
    run(&Op::blocks(16, [(1, 0)]), &mut dst, &src).unwrap();
    assert_eq!(&dst[..16], &src[16..32]);
}

#[test]
fn several_tables_are_one_request_and_checked_first() {
    let engine = CpuEngine::new(2).unwrap();
    let src: Vec<Vec<u8>> = (0..4).map(|l| pattern(8 * 32, l)).collect();
    // The last destination table is one block short: nothing moves in any table.
    let mut dst: Vec<Vec<u8>> = (0..4)
        .map(|l| vec![0u8; if l == 3 { 7 * 32 } else { 8 * 32 }])
        .collect();
    let map = Op::blocks(32, [(0, 7), (5, 2)]);
    let r =
        engine.scope(|s| -> crate::Result<()> { Ok(map.submit_pairs(s, &mut dst, &src)?.wait()?) });
    match r {
        Err(crate::Error::Submit(SubmitError::Op(OpError::BlockOutOfRange {
            index: 0,
            table: Some(3),
            ..
        }))) => {}
        other => panic!("{other:?}"),
    }
    assert!(dst.iter().all(|t| t.iter().all(|&b| b == 0)));
    dst[3].resize(8 * 32, 0);
    engine
        .scope(|s| -> crate::Result<()> { Ok(map.submit_pairs(s, &mut dst, &src)?.wait()?) })
        .unwrap();
    for (d, s) in dst.iter().zip(&src) {
        assert_eq!(*d, reference(&vec![0u8; 8 * 32], s, &map));
    }
    let mut fewer = vec![vec![0u8; 64]];
    let r = engine
        .scope(|s| -> crate::Result<()> { Ok(map.submit_pairs(s, &mut fewer, &src)?.wait()?) });
    assert!(matches!(
        r,
        Err(crate::Error::Submit(SubmitError::Op(OpError::PairCount {
            src: 4,
            dst: 1
        })))
    ));
}

#[test]
fn lowering_outside_submit_names_the_blocks_operator() {
    // An engine that lowers on a worker (`lower_catching`) reports a bad mapping as a request
    // error naming the operator.
    let op = Op::blocks(8, [(9, 0)]);
    let err = op.lower_catching(64, Some(64)).unwrap_err();
    assert!(
        matches!(err, RequestError::Operator { ref op, .. } if op == "blocks"),
        "{err:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_mappings_match_the_reference(
        block in prop_oneof![Just(1usize), Just(8), Just(24), Just(4096)],
        src_blocks in 1usize..40,
        dst_blocks in 1usize..40,
        picks in proptest::collection::vec((0usize..1000, 0usize..1000), 0..40),
        seed in any::<u8>(),
    ) {
        // Distinct destinations, any sources (a source block may be read twice).
        let mut seen = std::collections::HashSet::new();
        let pairs: Vec<(u64, u64)> = picks
            .iter()
            .map(|&(s, d)| ((s % src_blocks) as u64, (d % dst_blocks) as u64))
            .filter(|&(_, d)| seen.insert(d))
            .collect();
        let map = Op::blocks(block, pairs);
        let src = pattern(src_blocks * block, seed);
        let init = pattern(dst_blocks * block, seed.wrapping_add(101));
        let mut dst = init.clone();
        run(&map, &mut dst, &src).unwrap();
        prop_assert_eq!(dst, reference(&init, &src, &map));
    }

    #[test]
    fn segments_expand_back_to_the_mapping(
        block in prop_oneof![Just(1usize), Just(16), Just(4096)],
        runs in proptest::collection::vec((0u64..64, 1u64..6), 0..24),
    ) {
        // Runs of consecutive blocks on both sides (some continuing the one before, merged
        // then), destinations kept distinct: each run to its own stretch of the table.
        let pairs: Vec<(u64, u64)> = runs
            .iter()
            .enumerate()
            .flat_map(|(r, &(s, n))| (0..n).map(move |k| (s + k, r as u64 * 8 + k)))
            .collect();
        let (src_len, dst_len) = (70 * block, 200 * block);
        let count = check_blocks(block, &pairs, dst_len, src_len, None).unwrap();
        let segs = block_segments(block, &pairs, count);
        prop_assert_eq!(segs.len(), count);
        let b = block as u64;
        let back: Vec<(u64, u64)> = segs
            .iter()
            .flat_map(|g| (0..g.len / b).map(move |k| (g.src_off / b + k, g.dst_off / b + k)))
            .collect();
        prop_assert_eq!(back, pairs);
    }
}

/// The duplicate check's answer by sorting alone (what `check_blocks` did before its bitmap):
/// the lowest destination block written twice, its first two entries.
fn duplicate_by_sort(pairs: &[(u64, u64)]) -> Option<OpError> {
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.sort_unstable_by_key(|&i| (pairs[i].1, i));
    order
        .windows(2)
        .find(|w| pairs[w[0]].1 == pairs[w[1]].1)
        .map(|w| OpError::BlockDuplicate {
            first: w[0],
            second: w[1],
            block: pairs[w[0]].1,
        })
}

#[test]
fn duplicates_are_named_alike_in_small_and_huge_tables() {
    // 4 KiB tables take the bitmap; 2^40 blocks of 1 byte are far past it (the sort).
    for dst_len in [4096usize, 1 << 40] {
        let pairs = [(0, 9), (1, 3), (2, 700), (3, 3), (4, 9)];
        let err = check_blocks(1, &pairs, dst_len, 4096, None).unwrap_err();
        assert_eq!(
            err,
            OpError::BlockDuplicate {
                first: 1,
                second: 3,
                block: 3
            },
            "{dst_len}"
        );
        let perm: Vec<(u64, u64)> = (0..4096u64).map(|i| (i, (i * 7919) % 4096)).collect();
        check_blocks(1, &perm, dst_len, 4096, None).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn the_bitmap_and_the_sort_agree(
        dst_blocks in 1u64..300,
        picks in proptest::collection::vec(0u64..300, 0..60),
    ) {
        let pairs: Vec<(u64, u64)> = picks.iter().map(|&d| (0, d % dst_blocks)).collect();
        let got = check_blocks(1, &pairs, dst_blocks as usize, 1, None).err();
        prop_assert_eq!(got, duplicate_by_sort(&pairs));
    }
}
