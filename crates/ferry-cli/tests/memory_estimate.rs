//! The memory pre-check's estimates (`args::memory_needed`, which refuses a run that cannot fit
//! before any work starts) measured against what the CPU tests really use: each test runs at
//! 64 MiB in its own process and its peak resident memory (`ru_maxrss` from `wait4`) less that
//! of the same test at 4 KiB is compared with the estimate. The estimate is a lower bound ("a run
//! refused could not have fit"), so it must not exceed the measured growth; and it must not be
//! far below it, or the check would let through runs that cannot fit.

use std::process::Command;

/// Peak resident bytes of `ferry bench --test TEST --sizes SIZE` (few samples).
// `wait4` below reaps the child (std's `wait` has no rusage).
#[allow(clippy::zombie_processes)]
fn peak_rss(test: &str, size: &str) -> u64 {
    let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "bench",
            "--test",
            test,
            "--sizes",
            size,
            "--samples",
            "1",
            "--warmup",
            "0",
            "--threads",
            "2",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("run ferry");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: all-zero is a valid rusage; wait4 fills it for the child we spawned.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our un-waited child; `status` and `ru` are valid out-pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "ferry bench --test {test} --sizes {size} failed (status {status})"
    );
    ru.ru_maxrss as u64 * 1024
}

#[test]
fn estimates_match_measured_peak_memory() {
    const SIZE: u64 = 64 << 20;
    let mut report = String::new();
    for test in [
        "cpu-contig",
        "cpu-tile",
        "cpu-transpose-f32",
        "cpu-transpose-f64",
        "cpu-transpose-bf16",
        "file-read",
        "pipeline",
    ] {
        let info = ferry_cli::bench::registry()
            .into_iter()
            .find(|t| t.name == test)
            .expect("a known test");
        let (host, _) = ferry_cli::args::memory_needed(&info, SIZE).expect("fits in 64 bits");
        let grown = peak_rss(test, "64M").saturating_sub(peak_rss(test, "4K"));
        let ratio = grown as f64 / host as f64;
        report += &format!(
            "{test}: estimate {} MiB, measured growth {} MiB ({ratio:.2}x)\n",
            host >> 20,
            grown >> 20
        );
        assert!(
            (0.95..=1.15).contains(&ratio),
            "{test} at 64 MiB: the estimate is {host} B but the peak grew by {grown} B\n{report}"
        );
    }
    println!("{report}");
}
