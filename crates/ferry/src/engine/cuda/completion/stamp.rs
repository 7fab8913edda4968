//! A stream's completion word: a 32-bit word of mapped pinned host memory into which the
//! stream writes a request's sequence number after its work (`cuStreamWriteValue32`), so that
//! a waiting thread sees the request's end by reading host memory.
//!
//! Why: the driver notices a copy's end late. On the H200 host (run 84 of
//! `bench/results/h200.md`, the same buffers and stream, interleaved) a 4 KiB-1 MiB copy with
//! a word written after it and the host spinning on that word returned 0.38-0.95 us sooner
//! than the same copy waited with `cuStreamSynchronize` or `cuEventSynchronize`, in every
//! direction: about 8% of a 64 KiB copy's wait, more than all of ferry's host work per request
//! (issue 14: the caller's view of small copies). The write itself costs the stream about 1.6
//! us before the driver's own end of the work (the same copy, word written, then
//! `cuStreamSynchronize`: 1.5-1.8 us later than without the word), so a request gets a stamp
//! only where a thread is likely to wait for it soon and nothing queues behind it: on an
//! engine stream that was idle when it was submitted, by a thread submitting alone, and not
//! for uploads under 1 KiB, whose end the driver sees sooner (run 93; `mark.rs` decides).
//!
//! The write's default flags put a system-scope memory barrier before it: the request's
//! writes (a download's bytes in host memory) are visible before the word is (2,000
//! downloads of 4 KiB-1 MiB in run 84, each compared as soon as the word was seen: none
//! early). The word only ever grows in stream order, so a request is done once the word has
//! reached its number ([`reached`]). The word holds the low 32 bits of numbers its queue counts
//! in 64: it tells whether a request's number was reached only while fewer than 2^31 numbers
//! were handed out after it ([`seen`]). Past that the request is asked of the driver, as one
//! without a stamp is, never of the word (its answer is recorded for good by whatever sees it
//! first: a wait, a poll, the next submission on its queue, `event::Inner::known`; a request
//! nobody asked for 2^31 stamps on its queue, about half an hour of back-to-back small copies,
//! is the one that gets there). A request whose stream fails never sees its number: waits fall
//! back to the driver (`event.rs`), which reports the error.

use crate::engine::cuda::sys::driver::check;
use crate::engine::cuda::sys::memory::{HostAlloc, PinFlags};
use crate::engine::cuda::DriverError;
use cudarc::driver::{sys, CudaContext};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A completion word of one stream.
pub(crate) struct Stamp {
    /// A page of mapped pinned memory whose first 4 bytes are the word. A whole page: the
    /// driver carves small pinned allocations from shared blocks, and three 4-byte ones left
    /// later 1 MiB bounce buffers off their page boundaries (a file engine's `O_DIRECT` then
    /// ran buffered; run 85).
    mem: HostAlloc,
    /// The word as the device writes it.
    dev: sys::CUdeviceptr,
}

impl Stamp {
    /// Bytes allocated for a word.
    const PAGE: usize = 4096;

    /// A word in `ctx` (made current), zero; `None` where mapped pinned memory cannot be had.
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Option<Stamp> {
        let mem = HostAlloc::new(ctx, Self::PAGE, PinFlags::MAPPED).ok()?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `mem` was allocated mapped (DEVICEMAP) just above; a valid out-pointer.
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut dev, mem.ptr().cast(), 0)
        })
        .ok()?;
        // SAFETY: the word is the first 4 bytes of the 4096 just allocated (the driver's
        // allocations are at least 4-byte aligned), not yet shared with the device.
        unsafe { mem.ptr().cast::<u32>().write_volatile(0) };
        Some(Stamp { mem, dev })
    }

    /// Enqueues the write of `seq` into the word on `stream`, after the work enqueued there
    /// before.
    ///
    /// # Safety
    /// `stream` is a live stream of the context the word was allocated in, current on this
    /// thread.
    pub(crate) unsafe fn write(&self, stream: sys::CUstream, seq: u32) -> Result<(), DriverError> {
        // SAFETY: the caller's stream; `dev` is the mapped word, alive while `self` is. The
        // queue that owns it outlives every request stamped on it (each holds the queue), a
        // request's drop waits until its number is reached or its stream failed, and the
        // engine synchronizes its streams before they go: no write is pending when it is freed.
        check("cuStreamWriteValue32", unsafe {
            sys::cuStreamWriteValue32_v2(stream, self.dev, seq, 0)
        })
    }

    /// The word now (acquire: what the request wrote before it is visible after).
    pub(crate) fn word(&self) -> u32 {
        // SAFETY: the first 4 bytes of a live page of host memory (freed when `self` drops),
        // aligned; the device writes them with one 4-byte write, every host access is atomic.
        unsafe { AtomicU32::from_ptr(self.mem.ptr().cast::<u32>()) }.load(Ordering::Acquire)
    }
}

/// Whether a word that reads `word` has reached `seq`, numbers being written in stream order
/// modulo 2^32: exact while the word is less than 2^31 numbers past `seq` (and never 2^31
/// behind it: that many stamps are never pending), which [`seen`] makes sure of.
pub(crate) fn reached(word: u32, seq: u32) -> bool {
    (word.wrapping_sub(seq) as i32) >= 0
}

/// How many numbers may be handed out after a request's before its queue's word can no longer
/// tell whether the request's was reached ([`reached`] wraps there).
pub(crate) const WORD_TELLS: u64 = 1 << 31;

/// What a word that reads `word` says of the request numbered `seq` (of the 64-bit count its
/// queue hands out, `issued` the last number handed out when `word` was read or later):
/// `Some(reached)` while fewer than [`WORD_TELLS`] numbers were handed out after `seq`, `None`
/// after (then the driver must be asked). The word never holds a number beyond `issued`, so
/// it is at most that many past `seq`; a stale (smaller) `issued` only says `Some` where
/// `None` was due, and [`reached`] then says `false` of a number that was reached, a later
/// answer, never an early one.
pub(crate) fn seen(word: u32, seq: u64, issued: u64) -> Option<bool> {
    (issued.saturating_sub(seq) < WORD_TELLS).then(|| reached(word, seq as u32))
}

#[cfg(test)]
mod tests {
    use super::{reached, seen, WORD_TELLS};

    #[test]
    fn a_word_reaches_its_numbers_in_order_across_the_wrap() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(
            !reached(0, 1),
            "the word starts at 0, the first number is 1"
        );
        // Across 2^32: the word at 2 has passed u32::MAX.
        assert!(reached(2, u32::MAX));
        assert!(!reached(u32::MAX, 2));
        assert!(!reached(5, 5 + (1 << 31) - 1));
    }

    #[test]
    fn a_word_tells_only_while_fewer_than_2_31_numbers_followed() {
        // Regression: a request seen after 2^31 later stamps read its word as not reached and
        // spun on it (200 us) before asking the driver; the word was then past telling.
        let seq = 7u64;
        let late = seq + WORD_TELLS;
        assert!(!reached(late as u32, seq as u32), "the 32-bit word wrapped");
        assert_eq!(seen(late as u32, seq, late), None, "ask the driver");
        assert_eq!(seen(u32::MAX, seq, seq + (1 << 40)), None);
        // Just under the limit the word still tells, both ways.
        let last = seq + WORD_TELLS - 1;
        assert_eq!(seen(last as u32, seq, last), Some(true));
        assert_eq!(seen((seq - 1) as u32, seq, last), Some(false));
        assert_eq!(seen(seq as u32, seq, seq), Some(true));
        assert_eq!(seen(0, 1, 1), Some(false), "the word starts at 0");
        // Across 2^32 in the 64-bit count: only the low 32 bits are written.
        let high = (5u64 << 32) - 2;
        assert_eq!(seen((high + 3) as u32, high, high + 3), Some(true));
        assert_eq!(seen((high - 1) as u32, high, high + 3), Some(false));
    }
}
