//! Ctrl-C and SIGTERM during `ferry save`: [`catch`] installs a handler that only records the
//! signal; the save asks [`caught`] between its batches, stops, removes its partial file and
//! the process exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal caught, 0 for none.
static CAUGHT: AtomicI32 = AtomicI32::new(0);

extern "C" fn record(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    CAUGHT.store(sig, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM (from then on those signals no longer end the
/// process: the work in progress checks [`caught`] and stops cleanly). Errors: the system's.
pub fn catch() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `sa` is zeroed then filled (an empty mask, SA_RESTART so that interrupted
        // reads and writes resume); `record` is an `extern "C"` function that only stores to an
        // atomic, which is async-signal-safe; sigaction reads `sa` and writes nothing back
        // (null old action).
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = record as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal caught since [`catch`], if one was.
pub fn caught() -> Option<i32> {
    match CAUGHT.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The exit status for a process stopped by `sig`: 128 + its number, as a shell reports it.
pub fn exit_status(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(u8::MAX)
}
