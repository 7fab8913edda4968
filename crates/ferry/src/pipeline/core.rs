//! The schedule every pipeline runs, whatever runs its steps: which request each step waits
//! for, how far uploads run ahead, when the submitting thread waits, and which failure is
//! reported. The backends ([`super::cpu`], [`super::cuda`]) only make the requests.

use super::{Chunk, Phase, PipelineError};
use crate::request::{Request, RequestError};
use std::collections::VecDeque;

/// A backend's three steps. Each returns a request that completes when its step is done and
/// is ordered after the given requests without the submitting thread waiting for them.
pub(crate) trait Lanes {
    /// Chunk `c` into input slot `slot`, after `after` (the compute of chunk `c - K`, the
    /// slot's last reader).
    fn upload(
        &mut self,
        c: &Chunk,
        slot: usize,
        after: Option<&Request>,
    ) -> Result<Request, PipelineError>;
    /// The stage on chunk `c` in slot `slot`, after its upload and after `out_free` (the
    /// download of chunk `c - K`, the output slot's last reader).
    fn compute(
        &mut self,
        c: &Chunk,
        slot: usize,
        upload: &Request,
        out_free: Option<&Request>,
    ) -> Result<Request, PipelineError>;
    /// Output slot `slot` to the destination, after `computed`.
    fn download(
        &mut self,
        c: &Chunk,
        slot: usize,
        computed: &Request,
    ) -> Result<Request, PipelineError>;
    /// Waits for one of the run's requests (the submitting thread bounding the work queued
    /// ahead, or waiting for the end of the run). The GPU lanes spin briefly first: a thread
    /// asleep on a blocking-sync event wakes 100-150 us after the event (H200 host), which
    /// the end of every run would pay.
    fn wait(&mut self, req: Request) -> Result<(), RequestError> {
        req.wait()
    }
    /// The error to report for a failed request of `chunk`'s `phase` (a backend may know
    /// more than the request's error, e.g. the stage's own error).
    fn explain(&mut self, chunk: usize, phase: Phase, e: RequestError) -> PipelineError {
        PipelineError::Copy {
            chunk,
            phase,
            source: e,
        }
    }
}

struct Tracked {
    chunk: usize,
    phase: Phase,
    req: Request,
}

type Failure = (usize, Phase, RequestError);

/// Every request of a run, in submission order, waited for (and so observed) before the run
/// returns, and when dropped: a stage that panics unwinds only after the work it depends on
/// is done.
#[derive(Default)]
pub(crate) struct InFlight {
    list: VecDeque<Tracked>,
}

impl InFlight {
    fn push(&mut self, chunk: usize, phase: Phase, req: &Request) {
        self.list.push_back(Tracked {
            chunk,
            phase,
            req: req.share(),
        });
    }

    /// Pops the completed requests at the front; the first failure, if any. Never blocks.
    fn poll(&mut self) -> Option<Failure> {
        while let Some(t) = self.list.front_mut() {
            match t.req.try_wait() {
                None => return None,
                Some(r) => {
                    let t = self.list.pop_front()?;
                    if let Err(e) = r {
                        return Some((t.chunk, t.phase, e));
                    }
                }
            }
        }
        None
    }

    /// Waits (with `wait`) for front requests until at most `max` are left; the first
    /// failure, if any.
    fn bound(
        &mut self,
        max: usize,
        wait: &mut impl FnMut(Request) -> Result<(), RequestError>,
    ) -> Option<Failure> {
        while self.list.len() > max {
            let t = self.list.pop_front()?;
            if let Err(e) = wait(t.req) {
                return Some((t.chunk, t.phase, e));
            }
        }
        None
    }

    /// Waits (with `wait`) for every request; the first failure in submission order (a
    /// failure's cause is submitted before the requests that depend on it).
    fn wait_all(
        &mut self,
        wait: &mut impl FnMut(Request) -> Result<(), RequestError>,
    ) -> Option<Failure> {
        let mut first = None;
        while let Some(t) = self.list.pop_front() {
            if let Err(e) = wait(t.req) {
                first.get_or_insert((t.chunk, t.phase, e));
            }
        }
        first
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let _ = self.wait_all(&mut Request::wait);
    }
}

/// Runs `chunks` through `k` slots on `lanes`: uploads `k - 1` chunks ahead, at most about
/// `depth` chunks in flight, downloads when `download`. Returns once every request completed,
/// with the failure of the earliest chunk, if any.
pub(crate) fn drive<L: Lanes>(
    lanes: &mut L,
    chunks: &[Chunk],
    k: usize,
    depth: usize,
    download: bool,
) -> Result<(), PipelineError> {
    let mut fl = InFlight::default();
    let steps = if download { 3 } else { 2 };
    let stopped = schedule(lanes, chunks, k, depth * steps, download, &mut fl);
    let tail = fl.wait_all(&mut |r| lanes.wait(r));
    let failed = match stopped {
        Ok(Some(f)) => Some(f),
        Ok(None) => tail,
        Err(e) => match tail {
            // An earlier chunk's copy failed before the step that refused: that is the cause.
            Some(f) if e.chunk().is_none_or(|c| f.0 < c) => Some(f),
            _ => return Err(e),
        },
    };
    match failed {
        Some((chunk, phase, e)) => Err(lanes.explain(chunk, phase, e)),
        None => Ok(()),
    }
}

/// Submits every step; stops at the first failure seen (returned) or refusal (the error).
fn schedule<L: Lanes>(
    lanes: &mut L,
    chunks: &[Chunk],
    k: usize,
    max_requests: usize,
    download: bool,
    fl: &mut InFlight,
) -> Result<Option<Failure>, PipelineError> {
    let n = chunks.len();
    let lead = k - 1;
    let mut uploads = VecDeque::with_capacity(k);
    let mut computes: Vec<Option<Request>> = (0..k).map(|_| None).collect();
    let mut downloads: Vec<Option<Request>> = (0..k).map(|_| None).collect();
    for c in &chunks[..lead.min(n)] {
        let up = lanes.upload(c, c.index % k, None)?;
        fl.push(c.index, Phase::Upload, &up);
        uploads.push_back(up);
    }
    for (i, c) in chunks.iter().enumerate() {
        if let Some(ahead) = chunks.get(i + lead) {
            // Its slot's last reader is the compute of chunk i + lead - k = i - 1.
            let slot = ahead.index % k;
            let up = lanes.upload(ahead, slot, computes[slot].as_ref())?;
            fl.push(ahead.index, Phase::Upload, &up);
            uploads.push_back(up);
        }
        let slot = i % k;
        let Some(up) = uploads.pop_front() else {
            unreachable!("chunk {i} was uploaded ahead");
        };
        let comp = lanes.compute(c, slot, &up, downloads[slot].as_ref())?;
        fl.push(i, Phase::Compute, &comp);
        if download {
            let down = lanes.download(c, slot, &comp)?;
            fl.push(i, Phase::Download, &down);
            downloads[slot] = Some(down);
        }
        computes[slot] = Some(comp);
        if let Some(f) = fl.poll() {
            return Ok(Some(f));
        }
        if let Some(f) = fl.bound(max_requests, &mut |r| lanes.wait(r)) {
            return Ok(Some(f));
        }
    }
    Ok(None)
}
