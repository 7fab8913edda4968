//! Device loads and stores with `O_DIRECT` through io_uring: each chunk read by an io_uring entry
//! into a pinned bounce slot, then up by the CUDA engine; the same with the threads (io_uring
//! off) on the same file, every byte checked against the file and against each other. Prints
//! `skipped: no CUDA driver` without a GPU, `skipped: io_uring unavailable` where the kernel
//! refuses io_uring (the threads' half still runs).

mod cuda_common;
mod files_common;
use cuda_common::*;
use ferry::cuda::DeviceBuffer;
use ferry::file::{
    live_bounce_buffers, uring_ops_in_flight, FileConfig, FileEngine, IoIssue, OpenMode, UringMode,
};
use ferry::MemKind;
use files_common::TempDir;
use std::sync::Arc;

/// Panics naming the case and the first wrong byte (or the length) unless `got == want`.
fn same(got: &[u8], want: &[u8], case: &str) {
    assert_eq!(got.len(), want.len(), "{case}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{case}: first wrong byte at {i}");
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_load_and_store_through_io_uring() {
    let Some(cuda) = cuda_or_skip() else { return };
    let cuda = Arc::new(cuda);
    let data = bytes((48 << 20) + 4096, 11);
    let dir = TempDir::new("cuda-uring");
    let path = dir.file("data", &data);
    let base = FileConfig::new()
        .threads(4)
        .chunk_bytes(1 << 20)
        .direct(true);
    let mut modes = vec![("threads", base.uring(UringMode::Off))];
    if FileEngine::new(base.uring(UringMode::On)).is_ok() {
        modes.push(("io_uring depth 8", base.uring(UringMode::On).uring_depth(8)));
        modes.push(("io_uring depth 1", base.uring(UringMode::On).uring_depth(1)));
    } else {
        println!("skipped: io_uring unavailable (the threads' half runs)");
    }
    let cases = [
        (0usize, 48usize << 20),
        (4096, 16 << 20),
        (3, 5_000_001),
        (0, 4096),
        (0, 1),
        ((48 << 20) - 17, 17),
    ];
    let mut firsts: Vec<(&str, Vec<u8>)> = Vec::new();
    for (name, cfg) in &modes {
        let fe = FileEngine::with_engine(*cfg, cuda.clone()).unwrap();
        let f = fe.open(&path, OpenMode::Read).unwrap();
        for (off, len) in cases {
            let mut dev = DeviceBuffer::zeroed(0, len).unwrap();
            let r = fe
                .load_into(&f, off as u64, &mut dev)
                .unwrap_or_else(|e| panic!("{name}: load of {len} at {off}: {e}"));
            let got = dev.to_vec().unwrap();
            same(
                &got,
                &data[off..off + len],
                &format!("{name}: load of {len} at {off}: {r}"),
            );
            assert_eq!(r.bounce, Some(MemKind::Pinned), "{name}: {r}");
            let uring = cfg.uring == UringMode::On && len >= 4096;
            assert_eq!(
                matches!(r.issued, Some(IoIssue::Uring { .. })),
                uring,
                "{name}: load of {len} at {off}: {r}"
            );
            if off == 0 && len == 48 << 20 {
                println!("{name}: {r}");
                assert_eq!(r.direct_bytes, len as u64, "{name}: {r}");
                firsts.push((name, got));
            }
        }
        // Device -> file at an aligned offset: written by io_uring entries out of the slots.
        let out = dir.0.join("out");
        let g = fe.open(&out, OpenMode::Create).unwrap();
        let mut dev = DeviceBuffer::zeroed(0, 9 << 20).unwrap();
        fe.load_into(&f, 4096, &mut dev).unwrap();
        let r = fe.store_from(&g, 4096, &dev).unwrap();
        let back = std::fs::read(&out).unwrap();
        let want = &data[4096..4096 + (9 << 20)];
        same(
            &back[4096..],
            want,
            &format!("{name}: store of 9 MiB at 4096: {r}"),
        );
        assert_eq!(uring_ops_in_flight(), 0, "{name}");
        drop(fe);
        assert_eq!(live_bounce_buffers(), 0, "{name}");
    }
    for (name, got) in &firsts[1..] {
        assert!(*got == firsts[0].1, "{name} differs from {}", firsts[0].0);
    }
}
