//! Asynchronous host-side copies into pinned memory on the staging workers: the GPU
//! pipeline's bounce buffers (`pipeline/bounce.rs`) are filled from pageable memory with the
//! staged path's own machinery ([`Pool`], [`copy_bytes`], pieces cut by [`piece`] for
//! [`workers_for`] workers), which moves pageable memory to a device at 46-51 GB/s on the H200
//! host (run 29). A [`Filler`] takes copies in order on a dispatching thread and runs each on
//! its pool, so the thread that queues a copy goes on (enqueuing DMAs) and waits for the copy's
//! request only when it needs the bytes.

use super::nt_copy::{copy_bytes, piece};
use super::pool::Pool;
use super::{workers_for, StagedError, StagingConfig};
use crate::request::{Request, RequestError, Signal};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// One queued copy: addresses as integers (the thread that queued it keeps them valid).
struct Fill {
    dst: usize,
    src: usize,
    len: usize,
    /// Bytes of the whole transfer this copy belongs to: picks the workers, as a staged copy
    /// of that many bytes would ([`workers_for`]).
    transfer: usize,
    done: Arc<Signal>,
}

/// The staging workers and a thread that hands them queued copies one at a time.
pub(crate) struct Filler {
    queue: Option<Sender<Fill>>,
    thread: Option<JoinHandle<()>>,
}

impl Filler {
    /// `cfg.get_threads()` staging workers; non-temporal stores when `cfg`'s host -> device
    /// setting asks for them (`FERRY_STAGING_NT_H2D` through [`StagingConfig::from_env`]).
    /// Errors: [`StagedError::BadConfig`] (no threads, or more than 256), [`StagedError::Spawn`].
    pub(crate) fn new(cfg: StagingConfig) -> Result<Filler, StagedError> {
        if !(1..=256).contains(&cfg.threads) {
            return Err(StagedError::BadConfig(format!(
                "threads {} is not in 1..=256",
                cfg.threads
            )));
        }
        let pool = Pool::new(cfg.threads)?;
        let nt = cfg.non_temporal_h2d;
        let (tx, rx) = channel::<Fill>();
        let thread = std::thread::Builder::new()
            .name("ferry-fill".into())
            .spawn(move || {
                // Ends when the Filler is dropped, after the copies queued before.
                for f in rx {
                    let t = workers_for(pool.threads(), f.transfer.max(f.len));
                    let part = |i: usize| {
                        if let Some((at, len)) = piece(f.len, t, i) {
                            // SAFETY: `queue`'s contract: both ranges are valid, disjoint and
                            // unshared until `done` completes; the pieces are disjoint.
                            unsafe {
                                copy_bytes(
                                    (f.src + at) as *const u8,
                                    (f.dst + at) as *mut u8,
                                    len,
                                    nt,
                                )
                            }
                        }
                    };
                    let r = pool.run_with(t, &part, || Ok(()));
                    f.done.complete(r.map_err(RequestError::from));
                }
            })
            .map_err(StagedError::Spawn)?;
        Ok(Filler {
            queue: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues a copy of `len` bytes from `src` to `dst`, part of a transfer of `transfer` bytes
    /// (which sizes its pieces), and returns at once; the request completes when the bytes are
    /// in `dst` (non-temporal stores fenced), or with [`StagedError::WorkerPanicked`].
    ///
    /// # Safety
    /// 1. `src` is readable and `dst` writable for `len` bytes, the ranges do not overlap, and
    ///    both stay valid, with nothing else writing `src` or touching `dst`, until the returned
    ///    request completes (also when the caller fails meanwhile: wait for it).
    pub(crate) unsafe fn queue(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        transfer: usize,
    ) -> Result<Request, StagedError> {
        let done = Arc::new(Signal::new());
        let f = Fill {
            dst: dst as usize,
            src: src as usize,
            len,
            transfer,
            done: Arc::clone(&done),
        };
        let gone = || StagedError::BadConfig("the fill thread has stopped".into());
        let q = self.queue.as_ref().ok_or_else(gone)?;
        q.send(f).map_err(|_| gone())?;
        Ok(Request::new(done))
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        // Closing the queue ends the thread once the copies queued have run.
        self.queue = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_fills_copy_every_byte_in_order_without_blocking_the_caller() {
        let filler = Filler::new(StagingConfig::new().threads(3)).expect("filler");
        let src: Vec<u8> = (0..(9 << 20) + 77u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let mut dsts = [vec![0u8; src.len()], vec![0u8; 5000], vec![0u8; 0]];
        let lens = [src.len(), 5000, 0];
        let reqs: Vec<Request> = dsts
            .iter_mut()
            .zip(lens)
            .map(|(d, len)| {
                // SAFETY: both vectors outlive the requests, waited for below.
                unsafe { filler.queue(d.as_mut_ptr() as u64, src.as_ptr() as u64, len, 64 << 20) }
                    .expect("queue")
            })
            .collect();
        for r in reqs {
            r.wait().expect("fill");
        }
        assert!(dsts[0] == src, "9 MiB fill differs");
        assert_eq!(dsts[1][..], src[..5000]);
    }
}
