//! How [`WaitMode::Auto`](crate::engine::cuda::WaitMode::Auto) waits: sleep until shortly before the
//! request's expected end, poll, then nap.
//!
//! Why: a `BLOCKING_SYNC` event's sleep and wake-up cost 15 us on a 4 KiB copy and 100-150 us
//! per request at 16 MiB-1 GiB on the H200 (0.80-0.97x a raw spinning `cuStreamSynchronize`,
//! issue 14), while a spinning wait keeps a core busy for the whole copy. At submit the engine
//! computes the earliest time the request can end: its bytes over an UPPER bound on its path's
//! rate ([`Rates`]), so the estimate is never late for an idle stream. The waiter then
//! 1. spins in the driver (`cuEventSynchronize` on an event without `BLOCKING_SYNC`, as
//!    [`WaitMode::Spin`](crate::engine::cuda::WaitMode::Spin)) when the expected time is below
//!    [`SPIN_ONLY_BELOW`]: a sleep cannot pay off there (a sleep and wake-up cost about as much),
//!    and the driver's spin notices completion sooner than a `cuEventQuery` loop (the
//!    4 KiB row: 7.8 us against 8.4 us for a query loop, run 17). Cost: such a request queued
//!    behind long work spins a core until that work is done;
//! 2. otherwise sleeps (`std::thread::sleep`) until [`SLEEP_MARGIN`] before the expected end,
//!    polls (`cuEventQuery`) until the expected time has passed again (at least [`POLL_MIN`]
//!    past it: the true rate is below the bound): back to back for requests expected to take
//!    less than [`POLL_NAPS_FROM`], with short naps ([`poll_nap`], at most [`POLL_NAP_MAX`])
//!    between queries for longer ones, and
//! 3. if the request is still pending (queued behind other work, or the rate far below the
//!    bound), naps in growing sleeps ([`next_nap`]) between queries, each at most 1/16 of the
//!    time waited so far and at most [`NAP_MAX`], so a long unexpected wait costs a few wake-ups
//!    per millisecond and at most about 6% of its length in late notice.
//!
//! The thread's timer slack is lowered to 1 us for the whole wait once it first sleeps
//! ([`Slack`]; Linux's default of 50 us would make each sleep up to 50 us late), and restored
//! when the wait returns (two system calls per wait, not per nap).
//!
//! The figures (H200, gen5 x16, run 31 at 9e926d9, before the payload factor, the shorter
//! margin and the poll naps): a 256 MiB pinned upload took 4.89 ms (55 GB/s) against a bound of
//! 4.19 ms (the raw 64 GB/s), so the waiter polled back to back for about 0.8 ms: 21% of the
//! wait on the CPU (issue 14's target: at most 20%). With the bound at [`LINK_EFFICIENCY`] of
//! the link (58.9 GB/s, 4.56 ms) and 40 us of margin the polling starts about 0.37 ms before
//! the end, and napping 8.9 us between queries there costs a wake-up every 10-15 us. Measured
//! in run 32 (`bench/results/h200.md`): `ferry bench -t cuda-wait-cpu` 9% of the wait on the
//! CPU, the `cuda_wait` test's best of 5 3.1% (Spin 76%, Blocking 0.7%); the caller's view of
//! 256 MiB-1 GiB copies 0.99-1.01x a raw `cuStreamSynchronize`.

use crate::MemKind;
use std::time::{Duration, Instant};

/// The sleep ends this long before the expected end: a wake-up's lateness with the timer
/// slack at 1 us ([`Slack`]; several microseconds, tens on a busy VM host), with room to spare.
/// (It was 100 us, sized for Linux's default slack of 50 us; where the slack cannot be lowered
/// the bound's own distance from the true end still covers the sleep's lateness: at least 7% of
/// the copy, 20 us at 16 MiB pinned, plus the copy's start-up latency of 5-10 us.)
pub(crate) const SLEEP_MARGIN: Duration = Duration::from_micros(40);
/// Requests expected to take less than this spin in the driver.
pub(crate) const SPIN_ONLY_BELOW: Duration = Duration::from_micros(30);
/// Polling lasts at least this long past the expected end before the naps begin (a small copy's
/// fixed latency on the H200 is 7-20 us).
pub(crate) const POLL_MIN: Duration = Duration::from_micros(200);
/// Requests expected to take at least this long (117 MiB at 58.9 GB/s) nap between the
/// queries of their polling ([`poll_nap`]); shorter ones poll back to back.
pub(crate) const POLL_NAPS_FROM: Duration = Duration::from_millis(2);
/// The longest nap between two queries of the polling (late notice of at most this plus a
/// wake-up: 0.3% of a 256 MiB copy, less beyond).
pub(crate) const POLL_NAP_MAX: Duration = Duration::from_micros(10);
/// The share of a PCIe link's raw rate that can carry payload, an upper bound: each
/// transaction layer packet carries at most the max payload size (256 bytes on the H200 host
/// and most GPUs' root ports) behind 20-26 bytes of header, sequence number, LCRC and framing
/// (256 / 280 = 0.914), and gen3+ lines lose 2/130 more to encoding; flow-control and
/// read-completion packets cost more still. 0.92 stays above every figure measured: the
/// H200 moves at best 55.5 GB/s pinned on gen5 x16, 0.87 of the raw 64 GB/s (run 31). (A
/// 512-byte max payload would allow 0.95: such a link's copies could end up to 3% before the
/// bound, and be noticed that much late.)
pub(crate) const LINK_EFFICIENCY: f64 = 0.92;
/// The longest expected time a schedule uses (a lower bound stays one when lowered).
pub(crate) const EXPECTED_MAX: Duration = Duration::from_secs(3600);
/// The first nap.
pub(crate) const NAP_FIRST: Duration = Duration::from_micros(20);
/// The longest nap.
pub(crate) const NAP_MAX: Duration = Duration::from_millis(1);

/// Upper bounds on the rates of this GPU's paths, bytes per second; `None` where unknown (the
/// wait then does not sleep before polling).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Rates {
    /// The PCIe link to the host, one direction: `max_link_speed` x `max_link_width` from
    /// sysfs times [`LINK_EFFICIENCY`] (an upper bound on the payload rate: gen5 x16 = 58.9
    /// GB/s; the H200 moves 55.5 GB/s pinned at best). The maximum, not the current, speed:
    /// an idle link trains down.
    pub link: Option<f64>,
    /// Peak device memory bandwidth: 2 x memory clock x bus width (attributes
    /// `MEMORY_CLOCK_RATE`, `GLOBAL_MEMORY_BUS_WIDTH`; H200: about 4.8 TB/s). A device copy
    /// reads and writes each byte, so it moves at most half this (the H200 copies 2.1 TB/s).
    pub memory: Option<f64>,
}

impl Rates {
    /// The rates of device `dev` (PCI bus id `pci` as sysfs spells it, lower case).
    pub(crate) fn probe(dev: cudarc::driver::sys::CUdevice, pci: Option<&str>) -> Rates {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let attr = |a| {
            // SAFETY: `dev` came from the driver; the attribute is a plain enum value.
            unsafe { cudarc::driver::result::device::get_attribute(dev, a) }.ok()
        };
        let sysfs = |file: &str| {
            std::fs::read_to_string(format!("/sys/bus/pci/devices/{}/{file}", pci?)).ok()
        };
        // A GPU that reads host memory through the host's page tables (Grace Hopper's
        // NVLink-C2C) may reach the host faster than its PCIe function says: no bound.
        let c2c = attr(A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES)
            .is_some_and(|v| v != 0);
        let link = match (sysfs("max_link_speed"), sysfs("max_link_width")) {
            (Some(s), Some(w)) if !c2c => w.trim().parse().ok().and_then(|w| link_rate(&s, w)),
            _ => None,
        };
        let memory = match (
            attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
            attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
        ) {
            (Some(khz), Some(bits)) if khz > 0 && bits > 0 => {
                Some(2.0 * f64::from(khz) * 1e3 * f64::from(bits) / 8.0)
            }
            _ => None,
        };
        Rates { link, memory }
    }

    /// The bound for a request writing `dst` from `src` (`None`: a fill): the link where host
    /// memory is on one side and device memory on the other, half the memory bandwidth for a
    /// copy between device memories (a peer link is slower still), the whole of it for a fill
    /// of device memory; `None` otherwise (managed memory may be anywhere).
    pub(crate) fn for_kinds(&self, dst: MemKind, src: Option<MemKind>) -> Option<f64> {
        let dev = |k: MemKind| matches!(k, MemKind::Device { .. });
        let host = |k: MemKind| matches!(k, MemKind::Pinned | MemKind::Pageable | MemKind::Mapped);
        match src {
            None if dev(dst) => self.memory,
            None if host(dst) => self.link,
            Some(s) if dev(dst) && dev(s) => self.memory.map(|m| m / 2.0),
            Some(s) if (dev(dst) && host(s)) || (host(dst) && dev(s)) => self.link,
            _ => None,
        }
    }
}

/// Upper bound on the payload rate of one direction of a PCIe link from sysfs's
/// `max_link_speed` (`32.0 GT/s PCIe`) and width, bytes per second: transfers x lanes / 8 x
/// [`LINK_EFFICIENCY`].
pub(crate) fn link_rate(speed: &str, width: u32) -> Option<f64> {
    let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
    (gts > 0.0 && width > 0).then(|| gts * 1e9 * f64::from(width) / 8.0 * LINK_EFFICIENCY)
}

/// The shortest time `bytes` can take at `rate` bytes per second (`None` if unknown).
pub(crate) fn expected(bytes: usize, rate: Option<f64>) -> Option<Duration> {
    let rate = rate.filter(|r| r.is_finite() && *r > 0.0)?;
    Duration::try_from_secs_f64(bytes as f64 / rate).ok()
}

/// When a request was submitted and how long it takes at the least.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expect {
    /// Host clock at submit; `None` where the schedule does not use it (a request that spins in
    /// the driver: [`Expect::now`] reads no clock for it) or nobody looked.
    pub submitted: Option<Instant>,
    /// Its bytes over its path's rate bound; `None` if unknown.
    pub expected: Option<Duration>,
}

impl Expect {
    /// For the modes other than [`WaitMode::Auto`](crate::engine::cuda::WaitMode::Auto), which never look.
    pub(crate) const UNUSED: Expect = Expect {
        submitted: None,
        expected: None,
    };

    /// A request submitted now that takes at least `expected`. The clock is read only where
    /// the schedule needs it: not for the short requests that spin in the driver (a clock read
    /// per request saved on the small copies whose per-request cost issue 14 counts).
    pub(crate) fn now(expected: Option<Duration>) -> Expect {
        Expect {
            submitted: (!spins(expected)).then(Instant::now),
            expected,
        }
    }
}

/// Whether a request expected to take `expected` spins in the driver.
fn spins(expected: Option<Duration>) -> bool {
    expected.is_some_and(|x| x < SPIN_ONLY_BELOW)
}

/// What the waiter does first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schedule {
    /// Spin in the driver (`cuEventSynchronize`).
    DriverSpin,
    /// Sleep until `sleep_until` (if set), poll until `poll_until` (napping `poll_nap`
    /// between queries), then nap.
    Poll {
        /// End of the first sleep.
        sleep_until: Option<Instant>,
        /// End of the polling.
        poll_until: Instant,
        /// The nap between two queries of the polling (zero: back to back).
        poll_nap: Duration,
    },
}

/// The schedule of a request ([module doc](self)).
/// A request whose submit time is unknown counts from now.
pub(crate) fn schedule(e: Expect) -> Schedule {
    match e.expected {
        x if spins(x) => Schedule::DriverSpin,
        x => {
            // Clamped (still a lower bound) so that no clock arithmetic can overflow.
            let x = x.unwrap_or(Duration::ZERO).min(EXPECTED_MAX);
            let end = e.submitted.unwrap_or_else(Instant::now) + x;
            Schedule::Poll {
                sleep_until: (x > SLEEP_MARGIN).then(|| end - SLEEP_MARGIN),
                poll_until: end + x.max(POLL_MIN),
                poll_nap: poll_nap(x),
            }
        }
    }
}

/// The nap between two queries of the polling of a request expected to take `x`: none below
/// [`POLL_NAPS_FROM`] (a sleep and wake-up cost about what a few microseconds of polling do),
/// else 1/512 of `x` (late notice of at most 0.2% of the copy plus a wake-up), at most
/// [`POLL_NAP_MAX`].
pub(crate) fn poll_nap(x: Duration) -> Duration {
    if x < POLL_NAPS_FROM {
        Duration::ZERO
    } else {
        (x / 512).min(POLL_NAP_MAX)
    }
}

/// The nap after one of length `prev` (zero before the first), `waited` into the wait: twice
/// the last, at least [`NAP_FIRST`], at most 1/16 of `waited` (so a late notice costs at most
/// about 6%) and at most [`NAP_MAX`].
pub(crate) fn next_nap(prev: Duration, waited: Duration) -> Duration {
    (prev * 2).min(waited / 16).min(NAP_MAX).max(NAP_FIRST)
}

/// Waits by `schedule(e)`: `query` returns the result once known (`cuEventQuery`, or
/// `cuStreamQuery` for a request without an event: `mark.rs`), `driver_spin` blocks until it is
/// (`cuEventSynchronize`, `cuStreamSynchronize`).
pub(crate) fn wait<R>(
    e: Expect,
    mut query: impl FnMut() -> Option<R>,
    driver_spin: impl FnOnce() -> R,
) -> R {
    if spins(e.expected) {
        return driver_spin();
    }
    let submitted = e.submitted.unwrap_or_else(Instant::now);
    let e = Expect {
        submitted: Some(submitted),
        ..e
    };
    let (sleep_until, poll_until, poll_nap) = match schedule(e) {
        Schedule::DriverSpin => return driver_spin(),
        Schedule::Poll {
            sleep_until,
            poll_until,
            poll_nap,
        } => (sleep_until, poll_until, poll_nap),
    };
    // Lowered on the first sleep, restored when the wait returns.
    let mut slack: Option<Slack> = None;
    let mut sleep = |d: Duration| {
        slack.get_or_insert_with(Slack::lower);
        std::thread::sleep(d);
    };
    if let Some(t) = sleep_until {
        let now = Instant::now();
        if t > now {
            if let Some(r) = query() {
                return r;
            }
            sleep(t - now);
        }
    }
    loop {
        if let Some(r) = query() {
            return r;
        }
        if Instant::now() >= poll_until {
            break;
        }
        if poll_nap.is_zero() {
            std::hint::spin_loop();
        } else {
            sleep(poll_nap);
        }
    }
    let mut nap = Duration::ZERO;
    loop {
        if let Some(r) = query() {
            return r;
        }
        nap = next_nap(nap, submitted.elapsed());
        sleep(nap);
    }
}

/// The calling thread's timer slack lowered to 1 us while this lives (Linux otherwise lets a
/// normal thread's sleep end up to 50 us late), restored on drop; nothing where the slack
/// cannot be read or set, or is already at most 1 us.
pub(crate) struct Slack {
    /// The slack to restore, ns (`None`: not changed).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    old: Option<u64>,
}

impl Slack {
    /// The slack while lowered, ns.
    const LOW_NS: u64 = 1000;

    /// Lowers the calling thread's slack.
    #[cfg(target_os = "linux")]
    pub(crate) fn lower() -> Slack {
        // SAFETY: PR_GET_TIMERSLACK reads the calling thread's slack (ns, the return value);
        // the other arguments are unused zeroes.
        let old = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        let old = u64::try_from(old).ok().filter(|&o| o > Self::LOW_NS);
        let lowered = old.is_some()
            // SAFETY: PR_SET_TIMERSLACK sets the calling thread's slack to a plain number.
            && unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, Self::LOW_NS as libc::c_ulong, 0, 0, 0) }
                == 0;
        Slack {
            old: old.filter(|_| lowered),
        }
    }

    /// Nothing to lower here.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn lower() -> Slack {
        Slack { old: None }
    }
}

impl Drop for Slack {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(old) = self.old {
            // SAFETY: as in `lower`; `old` is the positive value read there.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, old as libc::c_ulong, 0, 0, 0) };
        }
    }
}

/// `std::thread::sleep(d)` with the calling thread's timer slack at 1 us meanwhile ([`Slack`]).
#[cfg(test)]
pub(crate) fn sleep(d: Duration) {
    let _slack = Slack::lower();
    std::thread::sleep(d);
}

#[cfg(test)]
mod tests;
