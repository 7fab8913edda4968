//! CPU time from `getrusage`: what a series costs the host besides its wall time.

use std::time::Duration;

/// Whose CPU time [`cpu_time`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuOf {
    /// Every thread of the process (`RUSAGE_SELF`): a staged copy's worker threads included.
    Process,
    /// The calling thread only (`RUSAGE_THREAD`): a waiting thread's spin or sleep.
    Thread,
}

/// User + system CPU time of `who` so far; `None` if `getrusage` fails.
pub fn cpu_time(who: CpuOf) -> Option<Duration> {
    let u = usage(match who {
        CpuOf::Process => libc::RUSAGE_SELF,
        CpuOf::Thread => libc::RUSAGE_THREAD,
    })?;
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).ok()?)
            .checked_add(Duration::from_micros(u64::try_from(t.tv_usec).ok()?))
    };
    tv(u.ru_utime)?.checked_add(tv(u.ru_stime)?)
}

/// Minor page faults of the whole process so far (`ru_minflt`: pages mapped in without I/O,
/// such as freshly allocated heap touched for the first time); `None` if `getrusage` fails.
pub fn minor_faults() -> Option<u64> {
    u64::try_from(usage(libc::RUSAGE_SELF)?.ru_minflt).ok()
}

/// `getrusage(who)`; `None` if it fails.
fn usage(who: libc::c_int) -> Option<libc::rusage> {
    // SAFETY: rusage is plain data; all zeroes is a valid value for getrusage to overwrite.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer for the duration of the call.
    (unsafe { libc::getrusage(who, &mut u) } == 0).then_some(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let (p0, t0) = (
            cpu_time(CpuOf::Process).unwrap(),
            cpu_time(CpuOf::Thread).unwrap(),
        );
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let (p1, t1) = (
            cpu_time(CpuOf::Process).unwrap(),
            cpu_time(CpuOf::Thread).unwrap(),
        );
        assert!(t1 > t0 && p1 > p0, "{t0:?} -> {t1:?}, {p0:?} -> {p1:?}");
        assert!(p1 - p0 >= t1 - t0 - Duration::from_millis(5));
    }

    #[test]
    fn minor_faults_count_fresh_pages() {
        let f0 = minor_faults().unwrap();
        // 64 MiB, mapped fresh (above the heap's mmap threshold), one byte written per page.
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        std::hint::black_box(&v);
        let f1 = minor_faults().unwrap();
        // Huge pages may serve it with fewer faults; at least one was taken.
        assert!(f1 > f0, "{f0} -> {f1}");
    }
}
