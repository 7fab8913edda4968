//! CPU tests of the pure parts of the automatic wait.

use super::*;
use std::cell::Cell;

const US: Duration = Duration::from_micros(1);

#[test]
fn link_rate_from_sysfs_is_an_upper_bound() {
    let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e3);
    // gen5 x16: 64 GB/s raw, 58.9 GB/s of payload at most (the H200 moves 55.5 at best).
    assert!(near(link_rate("32.0 GT/s PCIe\n", 16), 58.88e9));
    assert!(link_rate("32.0 GT/s PCIe", 16).unwrap() > 55.5e9);
    assert!(near(link_rate("16.0 GT/s PCIe", 8), 16e9 * LINK_EFFICIENCY));
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
    // 256 MiB over gen5 x16's payload bound: 4.56 ms (the copy takes 4.85-4.89 ms at 55 GB/s).
    let link = link_rate("32.0 GT/s PCIe", 16);
    let x = expected(256 << 20, link).unwrap();
    assert!(
        x > Duration::from_micros(4550) && x < Duration::from_micros(4565),
        "{x:?}"
    );
    // 16 MiB: 285 us, 21 us under the 306 us the copy takes (the margin's cover).
    let x = expected(16 << 20, link).unwrap();
    assert!(
        x > Duration::from_micros(284) && x < Duration::from_micros(286),
        "{x:?}"
    );
}

#[test]
fn small_requests_spin_in_the_driver() {
    let t = Instant::now();
    let e = |x| Expect {
        submitted: Some(t),
        expected: x,
    };
    assert_eq!(schedule(e(Some(US))), Schedule::DriverSpin);
    assert_eq!(schedule(e(Some(29 * US))), Schedule::DriverSpin);
    // Unknown: poll (never spin unbounded), no sleep.
    assert_eq!(
        schedule(e(None)),
        Schedule::Poll {
            sleep_until: None,
            poll_until: t + POLL_MIN,
            poll_nap: Duration::ZERO,
        }
    );
}

#[test]
fn long_requests_sleep_until_the_margin_then_poll() {
    let t = Instant::now();
    let x = 4190 * US;
    assert_eq!(
        schedule(Expect {
            submitted: Some(t),
            expected: Some(x)
        }),
        Schedule::Poll {
            sleep_until: Some(t + x - SLEEP_MARGIN),
            poll_until: t + 2 * x,
            poll_nap: x / 512,
        }
    );
    // Absurd sizes are clamped, not overflowed.
    let far = schedule(Expect {
        submitted: Some(t),
        expected: Some(Duration::from_secs(u64::MAX / 4)),
    });
    assert_eq!(
        far,
        Schedule::Poll {
            sleep_until: Some(t + EXPECTED_MAX - SLEEP_MARGIN),
            poll_until: t + 2 * EXPECTED_MAX,
            poll_nap: POLL_NAP_MAX,
        }
    );
    // Shorter than the margin: no sleep, poll at least POLL_MIN past the end.
    assert_eq!(
        schedule(Expect {
            submitted: Some(t),
            expected: Some(35 * US)
        }),
        Schedule::Poll {
            sleep_until: None,
            poll_until: t + 35 * US + POLL_MIN,
            poll_nap: Duration::ZERO,
        }
    );
}

#[test]
fn polling_naps_only_for_long_requests() {
    // Below 2 ms: back to back (16 MiB pinned: 285 us; 64 MiB: 1.14 ms).
    assert_eq!(poll_nap(285 * US), Duration::ZERO);
    assert_eq!(poll_nap(POLL_NAPS_FROM - US), Duration::ZERO);
    // From 2 ms: 1/512 of the expected time, at most POLL_NAP_MAX (256 MiB: 4.56 ms -> 8.9 us;
    // 1 GiB: 18.2 ms -> 10 us).
    assert_eq!(poll_nap(POLL_NAPS_FROM), POLL_NAPS_FROM / 512);
    assert_eq!(poll_nap(4560 * US), 4560 * US / 512);
    assert!(poll_nap(4560 * US) < POLL_NAP_MAX);
    assert_eq!(poll_nap(18_200 * US), POLL_NAP_MAX);
    // Late notice from a poll nap: at most 0.2% of the request plus a wake-up.
    for ms in [2, 3, 5, 10, 100, 10_000] {
        let x = Duration::from_millis(ms);
        assert!(poll_nap(x) * 500 <= x, "{x:?}");
    }
}

#[test]
fn the_bound_covers_the_margin_on_the_h200() {
    // The sleep must end before the true end even when it wakes late: the margin plus the
    // distance between the bound and the measured time (run 31: 55 GB/s pinned) leave room
    // for a wake-up of more than 50 us from 16 MiB up.
    let link = link_rate("32.0 GT/s PCIe", 16);
    for size in [16usize << 20, 256 << 20, 1 << 30] {
        let bound = expected(size, link).unwrap();
        let measured = Duration::from_secs_f64(size as f64 / 55e9);
        let room = measured - (bound - SLEEP_MARGIN);
        assert!(room > 50 * US, "{size}: {room:?}");
    }
}

#[test]
fn the_clock_is_read_only_where_the_schedule_uses_it() {
    // Short: spins in the driver, no clock read.
    assert_eq!(Expect::now(Some(US)).submitted, None);
    assert_eq!(Expect::now(Some(29 * US)).submitted, None);
    // Longer, or unknown: the submit time is kept.
    let t = Instant::now();
    for x in [Some(30 * US), Some(Duration::from_millis(5)), None] {
        let e = Expect::now(x);
        assert!(e.submitted.is_some_and(|s| s >= t), "{x:?}");
        assert_eq!(e.expected, x);
    }
    // An unknown submit time counts from the schedule's call.
    let before = Instant::now();
    match schedule(Expect {
        submitted: None,
        expected: Some(Duration::from_millis(1)),
    }) {
        Schedule::Poll {
            sleep_until: Some(s),
            ..
        } => assert!(s >= before + Duration::from_millis(1) - SLEEP_MARGIN),
        other => panic!("{other:?}"),
    }
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
            submitted: Some(Instant::now()),
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
            submitted: Some(Instant::now()),
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
            submitted: Some(start),
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
fn slack_is_lowered_while_the_guard_lives() {
    #[cfg(target_os = "linux")]
    {
        let before = slack();
        {
            let _s = Slack::lower();
            assert!(slack() <= 1000, "{}", slack());
        }
        assert_eq!(slack(), before);
    }
    #[cfg(not(target_os = "linux"))]
    drop(Slack::lower());
}

#[test]
fn a_long_wait_restores_the_timer_slack() {
    // Expected 3 ms (naps in the polling), done after 4 ms.
    #[cfg(target_os = "linux")]
    let before = slack();
    let start = Instant::now();
    let done_at = start + Duration::from_millis(4);
    let queries = Cell::new(0u32);
    wait(
        Expect {
            submitted: Some(start),
            expected: Some(Duration::from_millis(3)),
        },
        || {
            queries.set(queries.get() + 1);
            (Instant::now() >= done_at).then_some(())
        },
        || unreachable!(),
    );
    assert!(start.elapsed() >= Duration::from_millis(4));
    // Napping (at least 5.8 us each) between queries over the last 1.04 ms: far fewer queries
    // than a back-to-back loop makes (hundreds of thousands).
    assert!(queries.get() < 5_000, "{}", queries.get());
    #[cfg(target_os = "linux")]
    assert_eq!(slack(), before);
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
