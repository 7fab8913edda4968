//! CPU tests of the pure parts of the automatic wait.

use super::*;
use std::cell::Cell;

const US: Duration = Duration::from_micros(1);

#[test]
fn link_rate_from_sysfs_is_an_upper_bound() {
    // gen5 x16: 64 GB/s (the H200 moves 55 GB/s pinned).
    assert_eq!(link_rate("32.0 GT/s PCIe\n", 16), Some(64e9));
    assert_eq!(link_rate("16.0 GT/s PCIe", 8), Some(16e9));
    assert_eq!(link_rate("Unknown", 16), None);
    assert_eq!(link_rate("32.0 GT/s", 0), None);
}

#[test]
fn rates_by_kinds() {
    let r = Rates {
        link: Some(64e9),
        memory: Some(4.8e12),
    };
    let dev = MemKind::Device { ordinal: 0 };
    let peer = MemKind::Device { ordinal: 1 };
    assert_eq!(r.for_kinds(dev, Some(MemKind::Pinned)), Some(64e9));
    assert_eq!(r.for_kinds(MemKind::Pinned, Some(dev)), Some(64e9));
    assert_eq!(r.for_kinds(MemKind::Pageable, Some(dev)), Some(64e9));
    assert_eq!(r.for_kinds(dev, Some(dev)), Some(2.4e12));
    assert_eq!(r.for_kinds(peer, Some(dev)), Some(2.4e12));
    assert_eq!(r.for_kinds(dev, None), Some(4.8e12));
    assert_eq!(r.for_kinds(MemKind::Mapped, None), Some(64e9));
    assert_eq!(r.for_kinds(MemKind::Managed, Some(dev)), None);
    assert_eq!(r.for_kinds(MemKind::Pinned, Some(MemKind::Pinned)), None);
    assert_eq!(Rates::default().for_kinds(dev, Some(dev)), None);
}

#[test]
fn expected_time_is_bytes_over_rate() {
    assert_eq!(
        expected(64_000_000, Some(64e9)),
        Some(Duration::from_millis(1))
    );
    assert_eq!(expected(0, Some(64e9)), Some(Duration::ZERO));
    assert_eq!(expected(1, None), None);
    assert_eq!(expected(1, Some(0.0)), None);
    assert_eq!(expected(1, Some(f64::NAN)), None);
    // 256 MiB over gen5 x16: 4.19 ms (the copy takes 4.85 ms at 55 GB/s).
    let x = expected(256 << 20, Some(64e9)).unwrap();
    assert!(x > Duration::from_micros(4190) && x < Duration::from_micros(4200));
}

#[test]
fn small_requests_spin_in_the_driver() {
    let t = Instant::now();
    let e = |x| Expect {
        submitted: t,
        expected: x,
    };
    assert_eq!(schedule(e(Some(US))), Schedule::DriverSpin);
    assert_eq!(schedule(e(Some(29 * US))), Schedule::DriverSpin);
    // Unknown: poll (never spin unbounded), no sleep.
    assert_eq!(
        schedule(e(None)),
        Schedule::Poll {
            sleep_until: None,
            poll_until: t + POLL_MIN
        }
    );
}

#[test]
fn long_requests_sleep_until_the_margin_then_poll() {
    let t = Instant::now();
    let x = 4190 * US;
    assert_eq!(
        schedule(Expect {
            submitted: t,
            expected: Some(x)
        }),
        Schedule::Poll {
            sleep_until: Some(t + x - SLEEP_MARGIN),
            poll_until: t + 2 * x,
        }
    );
    // Absurd sizes are clamped, not overflowed.
    let far = schedule(Expect {
        submitted: t,
        expected: Some(Duration::from_secs(u64::MAX / 4)),
    });
    assert_eq!(
        far,
        Schedule::Poll {
            sleep_until: Some(t + EXPECTED_MAX - SLEEP_MARGIN),
            poll_until: t + 2 * EXPECTED_MAX,
        }
    );
    // Shorter than the margin: no sleep, poll at least POLL_MIN past the end.
    assert_eq!(
        schedule(Expect {
            submitted: t,
            expected: Some(50 * US)
        }),
        Schedule::Poll {
            sleep_until: None,
            poll_until: t + 50 * US + POLL_MIN,
        }
    );
}

#[test]
fn naps_grow_and_stay_bounded() {
    // Early in a wait: the first nap.
    assert_eq!(next_nap(Duration::ZERO, 100 * US), NAP_FIRST);
    // Doubling, capped by 1/16 of the wait so far.
    assert_eq!(next_nap(NAP_FIRST, 10_000 * US), 2 * NAP_FIRST);
    assert_eq!(next_nap(400 * US, 3_200 * US), 200 * US);
    // Never above NAP_MAX.
    assert_eq!(next_nap(NAP_MAX, Duration::from_secs(10)), NAP_MAX);
    let mut n = Duration::ZERO;
    for _ in 0..40 {
        n = next_nap(n, Duration::from_secs(1));
        assert!(n >= NAP_FIRST && n <= NAP_MAX);
    }
    assert_eq!(n, NAP_MAX);
}

#[test]
fn wait_returns_once_the_query_says_done() {
    // Unknown rate, done on the 5th query: polls, never calls the driver spin.
    let calls = Cell::new(0);
    let r = wait(
        Expect {
            submitted: Instant::now(),
            expected: None,
        },
        || {
            calls.set(calls.get() + 1);
            (calls.get() == 5).then_some(7)
        },
        || unreachable!("no driver spin for an unknown rate"),
    );
    assert_eq!((r, calls.get()), (7, 5));
    // Small: the driver spin only.
    let r = wait(
        Expect {
            submitted: Instant::now(),
            expected: Some(US),
        },
        || -> Option<i32> { unreachable!("a small request spins in the driver") },
        || 3,
    );
    assert_eq!(r, 3);
}

#[test]
fn wait_sleeps_no_later_than_the_expected_end_and_naps_past_it() {
    // Expected 2 ms, done after 5 ms (queued): the first query comes before 2 ms, the wait
    // ends after 5 ms, within a few naps.
    let start = Instant::now();
    let first = Cell::new(None);
    let done_at = start + Duration::from_millis(5);
    wait(
        Expect {
            submitted: start,
            expected: Some(Duration::from_millis(2)),
        },
        || {
            if first.get().is_none() {
                first.set(Some(start.elapsed()));
            }
            (Instant::now() >= done_at).then_some(())
        },
        || unreachable!(),
    );
    assert!(first.get().unwrap() < Duration::from_millis(2));
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(5));
    assert!(took < Duration::from_millis(500), "{took:?}");
}

/// The calling thread's timer slack, ns (`PR_GET_TIMERSLACK`).
#[cfg(target_os = "linux")]
fn slack() -> i32 {
    // SAFETY: reads the calling thread's slack; no pointers.
    unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) }
}

#[test]
fn sleep_sleeps_and_restores_the_timer_slack() {
    #[cfg(target_os = "linux")]
    let before = slack();
    let t = Instant::now();
    sleep(Duration::from_millis(2));
    assert!(t.elapsed() >= Duration::from_millis(2));
    #[cfg(target_os = "linux")]
    assert_eq!(slack(), before);
}
