//! Tests of the NCCL engine's configuration and descriptions (no GPU needed).

use super::config::DEFAULT_TIMEOUT;
use super::submit::describe;
use super::*;
use crate::memory::{MemKind, RawBuf};
use std::collections::HashMap;
use std::time::Duration;

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn config_validation() {
    let id = NcclId::from_bytes([1; 128]);
    assert!(NcclConfig::new(0, 0, 1, id).validate().is_ok());
    let e = NcclConfig::new(0, 3, 2, id).validate().unwrap_err();
    assert!(e.to_string().contains("rank 3"), "{e}");
    assert!(NcclConfig::new(0, 0, 0, id).validate().is_err());
    assert!(NcclConfig::new(0, 0, 1, id)
        .timeout(Duration::ZERO)
        .validate()
        .is_err());
}

#[test]
fn config_from_lookup() {
    let hex = NcclId::from_bytes([9; 128]).to_hex();
    let c = NcclConfig::from_lookup(&lookup(&[
        ("FERRY_NCCL_RANK", "1"),
        ("FERRY_NCCL_NRANKS", "4"),
        ("FERRY_NCCL_DEVICE", "3"),
        ("FERRY_NCCL_ID", &hex),
        ("FERRY_NCCL_TIMEOUT_S", "7"),
    ]))
    .unwrap();
    assert_eq!((c.rank, c.nranks, c.ordinal), (1, 4, 3));
    assert_eq!(c.id, NcclId::from_bytes([9; 128]));
    assert_eq!(c.timeout, Duration::from_secs(7));
    assert_eq!(c.init_timeout, Duration::from_secs(7));
    let c = NcclConfig::from_lookup(&lookup(&[
        ("FERRY_NCCL_RANK", "0"),
        ("FERRY_NCCL_NRANKS", "1"),
        ("FERRY_NCCL_DEVICE", "0"),
        ("FERRY_NCCL_ID", &hex),
        ("FERRY_NCCL_INIT_TIMEOUT_S", "300"),
    ]))
    .unwrap();
    assert_eq!(c.init_timeout, Duration::from_secs(300));
    assert_eq!(c.timeout, DEFAULT_TIMEOUT);

    let err = |pairs: &[(&str, &str)]| {
        NcclConfig::from_lookup(&lookup(pairs))
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[("FERRY_NCCL_NRANKS", "2")]).contains("FERRY_NCCL_RANK"));
    assert!(
        err(&[("FERRY_NCCL_RANK", "x"), ("FERRY_NCCL_NRANKS", "2")]).contains("not a whole number")
    );
    assert!(err(&[("FERRY_NCCL_RANK", "2"), ("FERRY_NCCL_NRANKS", "2")]).contains("rank 2"));
    assert!(err(&[
        ("FERRY_NCCL_RANK", "0"),
        ("FERRY_NCCL_NRANKS", "2"),
        ("FERRY_NCCL_DEVICE", "0")
    ])
    .contains("FERRY_NCCL_ID_FILE"));
    assert!(err(&[
        ("FERRY_NCCL_RANK", "0"),
        ("FERRY_NCCL_NRANKS", "2"),
        ("FERRY_NCCL_DEVICE", "0"),
        ("FERRY_NCCL_ID", "abc")
    ])
    .contains("$FERRY_NCCL_ID"));
}

#[test]
fn describe_names_every_operation() {
    let b = RawBuf {
        addr: 1,
        len: 8,
        kind: MemKind::Device { ordinal: 0 },
    };
    let ops = [
        P2p {
            kind: P2pKind::Send,
            buf: b,
            bytes: 8,
            peer: 1,
        },
        P2p {
            kind: P2pKind::Recv,
            buf: b,
            bytes: 4,
            peer: 1,
        },
    ];
    assert_eq!(describe(0, &ops), "send 8 B 0->1, recv 4 B 1->0");
}
