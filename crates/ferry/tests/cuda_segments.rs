//! Pageable segment lists through the staged ring (issue 14, item 3): many runs of pageable
//! host memory to the device and back, through the public API. Every destination byte is
//! checked: the segments' bytes, and every byte between them untouched.
//!
//! The engines here use small staging chunks (64 KiB, 4 workers) so that a few MiB already
//! make many chunks, segments span chunk edges and the last chunk is ragged; one test runs the
//! default configuration on 100,000 segments. Destinations (host -> device) and sources
//! (device -> host) are either back to back in list order (each chunk one DMA) or scattered
//! (each chunk through device scratch and the gatherer).

mod cuda_common;
mod stress_common;

use cuda_common::{bytes, cuda_config, cuda_or_skip};
use ferry::cuda::StagingConfig;
use ferry::cuda::{CudaEngine, DeviceBuffer};
use ferry::{EngineExt, Segment};
use std::sync::Arc;
use stress_common::Rng;

/// How one side of a list lies in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lay {
    /// Back to back in list order, from an odd offset.
    Packed,
    /// Random disjoint slots in random order, random offsets inside them.
    Scattered,
    /// Anywhere (may overlap: sources only).
    Anywhere,
}

/// `n` segments of `min..=max` bytes (random), destinations laid out as `dl`, sources as `sl`.
/// Returns the list and the lengths the two buffers need.
fn list(
    rng: &mut Rng,
    n: usize,
    (min, max): (u64, u64),
    dl: Lay,
    sl: Lay,
) -> (Vec<Segment>, usize, usize) {
    let lens: Vec<u64> = (0..n)
        .map(|_| rng.range(min as usize, max as usize) as u64)
        .collect();
    let slot = max + 64;
    let mut side = |lay: Lay| -> (Vec<u64>, usize) {
        match lay {
            Lay::Packed => {
                let mut at = 7u64;
                let offs = lens
                    .iter()
                    .map(|&l| {
                        let o = at;
                        at += l;
                        o
                    })
                    .collect();
                (offs, at as usize + 5)
            }
            Lay::Scattered => {
                let mut slots: Vec<u64> = (0..n as u64).collect();
                for i in (1..slots.len()).rev() {
                    let j = rng.below(i + 1);
                    slots.swap(i, j);
                }
                let offs = slots
                    .iter()
                    .zip(&lens)
                    .map(|(&s, &l)| s * slot + rng.below((slot - l + 1) as usize) as u64)
                    .collect();
                (offs, (n as u64 * slot) as usize)
            }
            Lay::Anywhere => {
                let len = (lens.iter().sum::<u64>() / 2).max(max + 1);
                let offs = lens
                    .iter()
                    .map(|&l| rng.below((len - l + 1) as usize) as u64)
                    .collect();
                (offs, len as usize)
            }
        }
    };
    let (d, dst_len) = side(dl);
    let (s, src_len) = side(sl);
    let segs = (0..n).map(|i| Segment::new(d[i], s[i], lens[i])).collect();
    (segs, dst_len, src_len)
}

/// An engine with 64 KiB staging chunks and 4 workers.
fn small_chunks() -> CudaEngine {
    let st = StagingConfig::new().chunk_bytes(64 << 10).threads(4);
    CudaEngine::with_config(cuda_config(0).staging(Some(st))).expect("engine")
}

/// The expected destination: `dst` with every segment's source bytes in place.
fn reference(dst: &[u8], src: &[u8], segs: &[Segment]) -> Vec<u8> {
    let mut want = dst.to_vec();
    for s in segs {
        let (d, o, l) = (s.dst_off as usize, s.src_off as usize, s.len as usize);
        want[d..d + l].copy_from_slice(&src[o..o + l]);
    }
    want
}

/// The first wrong byte, as a message naming the segment it belongs to (if any).
fn first_diff(got: &[u8], want: &[u8], segs: &[Segment]) -> Option<String> {
    let i = (0..want.len()).find(|&i| got[i] != want[i])?;
    let seg = segs
        .iter()
        .position(|s| (s.dst_off..s.dst_off + s.len).contains(&(i as u64)));
    Some(format!(
        "byte {i}: got {:#04x}, want {:#04x}; {}",
        got[i],
        want[i],
        match seg {
            Some(k) => format!("in segment {k} {:?}", segs[k]),
            None => "between segments (must be untouched)".to_string(),
        }
    ))
}

/// Copies `segs` from pageable host memory to the device (`h2d`) or back, and checks every
/// destination byte.
fn check(
    e: &CudaEngine,
    h2d: bool,
    segs: &[Segment],
    (dst_len, src_len): (usize, usize),
    seed: u64,
    what: &str,
) {
    let src = bytes(src_len, seed);
    let init = bytes(dst_len, seed ^ 0xBEEF);
    let want = reference(&init, &src, segs);
    let list: Arc<[Segment]> = segs.into();
    let (got, way) = if h2d {
        let mut dev = DeviceBuffer::from_host(0, &init).expect("device buffer");
        e.scope(|s| {
            s.segments(&mut dev, &src, list)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap_or_else(|err| panic!("{what}: host -> device failed: {err}"));
        (dev.to_vec().expect("read back"), "host -> device")
    } else {
        let dev = DeviceBuffer::from_host(0, &src).expect("device buffer");
        let mut host = init.clone();
        e.scope(|s| {
            s.segments(&mut host, &dev, list)?
                .wait()
                .map_err(ferry::Error::from)
        })
        .unwrap_or_else(|err| panic!("{what}: device -> host failed: {err}"));
        (host, "device -> host")
    };
    if let Some(m) = first_diff(&got, &want, segs) {
        panic!("{what}: {way}, {} segments: {m}", segs.len());
    }
}

/// Random lists in one direction: sizes from 1 byte, unaligned offsets, segments spanning the
/// 64 KiB chunks, ragged last chunks, each pair of layouts (destination, source) of `lays`.
fn random_lists(h2d: bool, seed: u64, lays: [(Lay, Lay); 3]) {
    if cuda_or_skip().is_none() {
        return;
    }
    let e = small_chunks();
    let mut rng = Rng(seed);
    let mut seed = seed;
    for (n, sizes) in [
        (64, (1, 1)),
        (5000, (1, 3000)),
        (3000, (4096, 4096)),
        (200, (1, 200_000)),
    ] {
        for (dl, sl) in lays {
            let (segs, dst_len, src_len) = list(&mut rng, n, sizes, dl, sl);
            let what = format!("{n} segments of {sizes:?} bytes, dst {dl:?}, src {sl:?}");
            check(&e, h2d, &segs, (dst_len, src_len), seed, &what);
            seed += 1;
        }
    }
}

/// Host -> device: destinations (the device side) packed or scattered.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn host_to_device_random_lists() {
    use Lay::*;
    random_lists(
        true,
        0x5E6,
        [
            (Packed, Anywhere),
            (Scattered, Anywhere),
            (Scattered, Scattered),
        ],
    );
}

/// The reverse: scattered pageable destinations, the device side packed or scattered.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_to_host_random_lists() {
    use Lay::*;
    random_lists(
        false,
        0xD2A,
        [
            (Scattered, Packed),
            (Packed, Scattered),
            (Scattered, Anywhere),
        ],
    );
}

/// Segments several chunks long next to 1-byte ones, both directions.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn runs_longer_than_a_chunk() {
    if cuda_or_skip().is_none() {
        return;
    }
    let e = small_chunks();
    // 1 byte, 300 KiB + 3 (five chunks and a bit), 1 byte, 64 KiB exactly, 65 bytes; ...
    let lens = [1u64, (300 << 10) + 3, 1, 64 << 10, 65];
    let mut segs = Vec::new();
    let (mut d, mut s) = (3u64, 11u64);
    for i in 0..70 {
        let l = lens[i % lens.len()];
        segs.push(Segment::new(d, s, l));
        d += l + (i as u64 % 3); // gaps of 0-2 bytes: some chunks merge into runs, some not
        s += l + 17;
    }
    let (dst_len, src_len) = (d as usize + 9, s as usize + 9);
    check(
        &e,
        true,
        &segs,
        (dst_len, src_len),
        7,
        "runs longer than a chunk",
    );
    let rev: Vec<Segment> = segs
        .iter()
        .map(|g| Segment::new(g.src_off, g.dst_off, g.len))
        .collect();
    check(
        &e,
        false,
        &rev,
        (src_len, dst_len),
        8,
        "runs longer than a chunk",
    );
}

/// 100,000 segments with the default configuration (16 MiB chunks), both directions, the device
/// side packed (one DMA per chunk) and scattered (device scratch and the gatherer).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn hundred_thousand_segments_default_config() {
    let Some(e) = cuda_or_skip() else { return };
    let mut rng = Rng(0x100_000);
    let n = 100_000;
    for (k, dev_lay) in [Lay::Packed, Lay::Scattered].into_iter().enumerate() {
        let (segs, dst_len, src_len) = list(&mut rng, n, (1, 4096), dev_lay, Lay::Scattered);
        let what = format!("100,000 segments of 1-4096 bytes, device side {dev_lay:?}");
        check(&e, true, &segs, (dst_len, src_len), 50 + k as u64, &what);
        let (segs, dst_len, src_len) = list(&mut rng, n, (1, 4096), Lay::Scattered, dev_lay);
        check(&e, false, &segs, (dst_len, src_len), 60 + k as u64, &what);
    }
}

/// Many threads each copying their own pageable lists through one engine (the staging thread
/// takes them in turn), up and back down.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn threads_round_trip_through_one_engine() {
    if cuda_or_skip().is_none() {
        return;
    }
    let e = small_chunks();
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let e = &e;
            sc.spawn(move || {
                let mut rng = Rng(0xABC + t);
                let (segs, dst_len, src_len) =
                    list(&mut rng, 2000, (1, 5000), Lay::Scattered, Lay::Anywhere);
                let src = bytes(src_len, 900 + t);
                let mut dev = DeviceBuffer::zeroed(0, dst_len).expect("device buffer");
                let mut back = vec![0u8; dst_len];
                let up: Arc<[Segment]> = segs.clone().into();
                // Back: every segment's destination bytes, device -> the same offsets on the host.
                let down: Arc<[Segment]> = segs
                    .iter()
                    .map(|g| Segment::new(g.dst_off, g.dst_off, g.len))
                    .collect();
                e.scope(|s| {
                    s.segments(&mut dev, &src, up)?
                        .wait()
                        .map_err(ferry::Error::from)
                })
                .unwrap_or_else(|err| panic!("thread {t}: up: {err}"));
                e.scope(|s| {
                    s.segments(&mut back, &dev, down)?
                        .wait()
                        .map_err(ferry::Error::from)
                })
                .unwrap_or_else(|err| panic!("thread {t}: down: {err}"));
                let want = reference(&vec![0u8; dst_len], &src, &segs);
                if let Some(m) = first_diff(&back, &want, &segs) {
                    panic!("thread {t}: round trip: {m}");
                }
            });
        }
    });
}
