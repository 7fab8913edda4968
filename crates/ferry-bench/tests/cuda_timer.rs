//! `StreamTimer` (CUDA events behind a latch, as nvbandwidth times copies) and the raw copier's
//! timed, SM-kernel and waited baselines: the copies land whole, the figures are plausible, the
//! latch holds the stream until released, and the watchdog turns a hang into an error. Prints
//! `skipped: no CUDA driver` without a GPU.
//!
//! The tests run one at a time: a closed latch holds its stream, and any driver call of another
//! thread that waits for the whole context (a module load, an implicitly synchronizing free)
//! would wait for it too, and hold up that test's own timed section (H200 run 18: two tests
//! ran into the watchdog while the watchdog test held its latch for 10 s).

use ferry::cuda::{CudaEngine, DeviceBuffer, Direction, MappedBuffer, PinnedBuffer};
use ferry::EngineExt;
use ferry_bench::{RawCopier, RawWait, StreamTimer, LATCH_TIMEOUT};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

static LOCK: Mutex<()> = Mutex::new(());

/// The CUDA engine on device 0 with this binary's test lock held, or `None` after printing
/// exactly `skipped: no CUDA driver`.
fn serial_engine() -> Option<(MutexGuard<'static, ()>, CudaEngine)> {
    let g = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return None;
    }
    Some((
        g,
        CudaEngine::new(0).expect("a driver is present: device 0"),
    ))
}

/// `n` bytes that differ per seed and along the buffer (a multiplicative hash).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let k = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n as u64)
        .map(|i| ((i ^ seed).wrapping_mul(k) >> 29) as u8)
        .collect()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn ferry_copies_timed_by_events() {
    let Some((_serial, e)) = serial_engine() else {
        return;
    };
    let timer = StreamTimer::new(0).unwrap();
    let n = 64 << 20;
    let data = bytes(n, 5);
    let mut host = PinnedBuffer::new(n).unwrap();
    host.copy_from_slice(&data);
    let mut devs: Vec<DeviceBuffer> = (0..4)
        .map(|_| DeviceBuffer::zeroed(0, n).unwrap())
        .collect();
    let stream = e.stream(Direction::HostToDevice).clone();
    let t0 = Instant::now();
    e.scope(|s| {
        Ok::<_, ferry::BarrierError>({
            timer.time(&stream, || {
                devs.iter_mut()
                    .try_for_each(|d| s.memcpy(d, &host).map(drop))
            })
        })
    })
    .unwrap()
    .unwrap()
    .unwrap();
    let host_s = t0.elapsed().as_secs_f64();
    let gpu_s = timer.seconds().unwrap();
    let gbps = (4 * n) as f64 / gpu_s / 1e9;
    println!(
        "4 x 64 MiB pinned -> device: {gbps:.1} GB/s by events ({gpu_s:.6} s; host {host_s:.6} s)"
    );
    assert!(
        gpu_s > 0.0 && gpu_s <= host_s,
        "events {gpu_s} s, host {host_s} s"
    );
    // Below any bus a GPU sits on today, and not absurdly fast.
    assert!(gbps > 0.5 && gbps < 1000.0, "{gbps} GB/s");
    for d in &devs {
        assert!(d.to_vec().unwrap() == data);
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn latch_holds_the_stream_until_released() {
    let Some((_serial, _)) = serial_engine() else {
        return;
    };
    let timer = StreamTimer::new(0).unwrap();
    let raw = RawCopier::new(0).unwrap();
    let n = 1 << 20;
    let data = bytes(n, 9);
    let src = DeviceBuffer::from_host(0, &data).unwrap();
    // The destination is mapped host memory, so the CPU sees whether the copy has run.
    let mut dst = MappedBuffer::new(n).unwrap();
    dst.fill(0xA5);
    let mut untouched = false;
    let s = raw
        .timed(&timer, |r| {
            r.copy(&mut dst, &src, n, 1)?;
            // Enqueued only: while the latch is closed, the copy must not run.
            std::thread::sleep(Duration::from_millis(200));
            let p = dst.as_ptr();
            // SAFETY: reads inside the mapped buffer; volatile, as the GPU could write it.
            untouched = (0..n)
                .step_by(4096)
                .all(|i| unsafe { p.add(i).read_volatile() } == 0xA5);
            Ok(())
        })
        .unwrap();
    assert!(untouched, "the copy ran before the latch opened");
    // The events time the copy, not the host's sleep.
    assert!(s < 0.1, "the events timed the host's sleep: {s} s");
    assert!(dst[..] == data[..]);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn raw_kernel_copy_through_mapped_memory() {
    let Some((_serial, _)) = serial_engine() else {
        return;
    };
    let timer = StreamTimer::new(0).unwrap();
    let raw = RawCopier::new(0).unwrap();
    // The first SM copy compiles and loads the kernel: not inside a timed section.
    let mut warm = DeviceBuffer::zeroed(0, 1).unwrap();
    raw.kernel_copy(&mut warm, &DeviceBuffer::zeroed(0, 1).unwrap(), 1, 1)
        .unwrap();
    for n in [1usize, 4097, (16 << 20) + 5] {
        let data = bytes(n, n as u64);
        let mut mapped = MappedBuffer::new(n).unwrap();
        mapped.copy_from_slice(&data);
        let mut dev = DeviceBuffer::zeroed(0, n).unwrap();
        let s = raw
            .timed(&timer, |r| r.kernel_copy(&mut dev, &mapped, n, 1))
            .unwrap();
        assert!(s > 0.0);
        assert!(dev.to_vec().unwrap() == data, "mapped -> device, {n} bytes");
        let mut back = MappedBuffer::new(n).unwrap();
        raw.kernel_copy(&mut back, &dev, n, 1).unwrap();
        assert!(back[..] == data[..], "device -> mapped, {n} bytes");
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn watchdog_turns_a_hang_into_an_error() {
    let Some((_serial, e)) = serial_engine() else {
        return;
    };
    let timer = StreamTimer::new(0).unwrap();
    let stream = e.stream(Direction::DeviceToDevice).clone();
    let t0 = Instant::now();
    // Waiting for the stream inside the timed section would hang for ever without the
    // watchdog.
    timer
        .time(&stream, || stream.synchronize().unwrap())
        .unwrap();
    let waited = t0.elapsed();
    assert!(waited >= LATCH_TIMEOUT, "returned after {waited:?}");
    let err = timer.seconds().unwrap_err().to_string();
    assert!(err.contains("watchdog"), "{err}");
    // The next timing works again.
    timer.time(&stream, || ()).unwrap();
    assert!(timer.seconds().unwrap() >= 0.0);
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn both_directions_behind_one_latch() {
    let Some((_serial, e)) = serial_engine() else {
        return;
    };
    let timer = StreamTimer::new(0).unwrap();
    let n = 32 << 20;
    let (up, down) = (bytes(n, 21), bytes(n, 22));
    let mut up_src = PinnedBuffer::new(n).unwrap();
    up_src.copy_from_slice(&up);
    let down_src = DeviceBuffer::from_host(0, &down).unwrap();
    let mut up_dst = DeviceBuffer::zeroed(0, n).unwrap();
    let mut down_dst = PinnedBuffer::new(n).unwrap();
    let streams = [
        &**e.stream(Direction::HostToDevice),
        &**e.stream(Direction::DeviceToHost),
    ];
    e.scope(|s| -> Result<(), Box<dyn std::error::Error>> {
        let (a, b) = timer.time_all(&streams, || -> Result<_, ferry::Error> {
            Ok((
                s.memcpy(&mut up_dst, &up_src)?,
                s.memcpy(&mut down_dst, &down_src)?,
            ))
        })??;
        a.wait()?;
        b.wait()?;
        Ok(())
    })
    .unwrap();
    let secs = timer.seconds().unwrap();
    println!(
        "32 MiB each way at once: {:.1} GB/s by events",
        (2 * n) as f64 / secs / 1e9
    );
    assert!(secs > 0.0);
    assert!(up_dst.to_vec().unwrap() == up && down_dst[..] == down[..]);
}

#[test]
fn small_copies_waited_every_way() {
    let Some((_serial, e)) = serial_engine() else {
        return;
    };
    let raw = RawCopier::new(0).unwrap();
    let n = 4096;
    let data = bytes(n, 31);
    let mut src = PinnedBuffer::new(n).unwrap();
    src.copy_from_slice(&data);
    let engine_stream = e.stream(Direction::HostToDevice).clone();
    let ways = [
        RawWait::StreamSync,
        RawWait::EventSync,
        RawWait::EventRing,
        RawWait::EventThenStreamSync,
        RawWait::EventQuery,
    ];
    for wait in ways {
        for stream in [None, Some(&*engine_stream)] {
            // More than the ring's 64 events, so it wraps.
            for _ in 0..70 {
                let mut dev = DeviceBuffer::zeroed(0, n).unwrap();
                raw.copy_waited(&mut dev, &src, n, stream, wait).unwrap();
                assert!(dev.to_vec().unwrap() == data, "{wait:?}");
            }
        }
    }
    let mut dev = DeviceBuffer::zeroed(0, n).unwrap();
    let l = ferry::Layout::bytes(n).unwrap();
    ferry_bench::submit_raw_and_wait(&e, &mut dev, &src, l).unwrap();
    assert!(dev.to_vec().unwrap() == data);
    assert!(raw
        .copy_waited(&mut dev, &src, n + 1, None, RawWait::StreamSync)
        .is_err());
}
