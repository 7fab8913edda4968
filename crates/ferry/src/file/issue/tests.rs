//! The io_uring choice and runner count, on the CPU.

use super::{choose, errno_name, runners, IoIssue, UringMode};
use crate::env::EnvValue;

fn threads(why: &str) -> IoIssue {
    IoIssue::Threads { why: why.into() }
}

#[test]
fn choose_takes_io_uring_only_with_every_condition() {
    assert_eq!(
        choose(UringMode::Auto, 32, Ok(()), Ok(()), true, true),
        IoIssue::Uring { depth: 32 }
    );
    assert_eq!(
        choose(UringMode::On, 8, Ok(()), Ok(()), true, true),
        IoIssue::Uring { depth: 8 }
    );
    assert_eq!(
        choose(UringMode::Off, 32, Ok(()), Ok(()), true, true),
        threads("io_uring off: FileConfig::uring or FERRY_FILE_URING=off")
    );
    assert_eq!(
        choose(UringMode::Auto, 32, Err(libc::EPERM), Ok(()), true, true),
        threads("io_uring unavailable: EPERM")
    );
    assert_eq!(
        choose(UringMode::Auto, 32, Err(libc::ENOSYS), Ok(()), true, true),
        threads("io_uring unavailable: ENOSYS")
    );
    assert_eq!(
        choose(
            UringMode::Auto,
            32,
            Ok(()),
            Err("refused".into()),
            true,
            true
        ),
        threads("no O_DIRECT part: refused")
    );
    assert_eq!(
        choose(UringMode::Auto, 32, Ok(()), Ok(()), false, true),
        threads("no O_DIRECT part: nothing aligned to 4096 bytes")
    );
    assert_eq!(
        choose(UringMode::Auto, 32, Ok(()), Ok(()), true, false),
        threads("the file has no O_DIRECT descriptor (FileIo::direct_fd)")
    );
    // Off first, then the kernel: the machine's reason before the transfer's.
    assert_eq!(
        choose(
            UringMode::Auto,
            32,
            Err(libc::EPERM),
            Err("x".into()),
            false,
            false
        ),
        threads("io_uring unavailable: EPERM")
    );
}

#[test]
fn display_and_errno_names() {
    assert_eq!(
        IoIssue::Uring { depth: 32 }.to_string(),
        "io_uring, depth 32"
    );
    assert_eq!(
        threads("io_uring unavailable: EPERM").to_string(),
        "threads (io_uring unavailable: EPERM)"
    );
    assert_eq!(errno_name(libc::EPERM), "EPERM");
    assert_eq!(errno_name(12345), "errno 12345");
}

#[test]
fn runners_keep_depth_in_flight_each() {
    // Straight into host memory: one runner.
    assert_eq!(runners(16, 32, None, 16), 1);
    assert_eq!(runners(1024, 32, None, 16), 1);
    // Through 16 slots: one runner at depth 32, two at depth 8, capped by the threads.
    assert_eq!(runners(1024, 32, Some(16), 16), 1);
    assert_eq!(runners(1024, 8, Some(16), 16), 2);
    assert_eq!(runners(1024, 1, Some(16), 4), 4);
    // Never more than the chunks, none for none.
    assert_eq!(runners(1, 1, Some(16), 16), 1);
    assert_eq!(runners(0, 32, None, 16), 0);
}

#[test]
fn mode_parses_from_the_environment_words() {
    assert_eq!(UringMode::parse_env("off"), Some(UringMode::Off));
    assert_eq!(UringMode::parse_env("on"), Some(UringMode::On));
    assert_eq!(UringMode::parse_env("auto"), Some(UringMode::Auto));
    assert_eq!(UringMode::parse_env("1"), None);
    assert_eq!(UringMode::default(), UringMode::Auto);
}

#[test]
fn reports_add_keeps_io_uring_if_any_transfer_used_it() {
    use crate::file::IoReport;
    let r = |issued: Option<IoIssue>| IoReport {
        bytes: 1,
        issued,
        ..IoReport::default()
    };
    let uring = Some(IoIssue::Uring { depth: 8 });
    let mut sum = IoReport::default();
    sum.add(r(Some(threads("a"))));
    assert_eq!(sum.issued, Some(threads("a")));
    sum.add(r(Some(threads("b"))));
    assert_eq!(sum.issued, Some(threads("a")), "the first reason is kept");
    sum.add(r(uring.clone()));
    sum.add(r(Some(threads("c"))));
    sum.add(r(None));
    assert_eq!((sum.issued.clone(), sum.bytes), (uring, 5));
    assert!(
        sum.to_string().ends_with("; issued by io_uring, depth 8"),
        "{sum}"
    );
    assert_eq!(IoReport::default().issued, None);
}
