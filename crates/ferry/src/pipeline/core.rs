//! The schedule every pipeline runs, whatever runs its steps: which request each step waits
//! for, how far uploads run ahead, when the submitting thread waits, and which failure is
//! reported. The backends ([`super::cpu`], [`super::cuda`]) only make the requests.

use super::chunk::{Chunk, Phase};
use super::error::PipelineError;
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
    /// Whether [`Lanes::upload`] of `c` would now return without the submitting thread
    /// waiting. The schedule submits an upload ahead of its chunk's compute only when this
    /// says yes (asking again after each step), and the upload a compute needs next whatever
    /// it says: an upload that waits on the host (the GPU's bounce-buffer fills) then never
    /// holds back the computes and downloads of earlier chunks. Never blocks; may start work
    /// the upload will need (the fills).
    fn upload_ready(&mut self, _c: &Chunk) -> bool {
        true
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
///
/// Chunk `i`'s steps in submission order: its upload (if not submitted ahead), its compute,
/// its download; uploads of chunks up to `i + K - 1` are submitted ahead, before chunk `i`'s
/// compute and again after its download, each once [`Lanes::upload_ready`] says it would not
/// wait (with lanes whose uploads never wait: chunk `i + K - 1`'s upload right before chunk
/// `i`'s compute, as the slots allow).
fn schedule<L: Lanes>(
    lanes: &mut L,
    chunks: &[Chunk],
    k: usize,
    max_requests: usize,
    download: bool,
    fl: &mut InFlight,
) -> Result<Option<Failure>, PipelineError> {
    let lead = k - 1;
    let mut ups = Uploads {
        queued: VecDeque::with_capacity(k),
        next: 0,
    };
    let mut computes: Vec<Option<Request>> = (0..k).map(|_| None).collect();
    let mut downloads: Vec<Option<Request>> = (0..k).map(|_| None).collect();
    for (i, c) in chunks.iter().enumerate() {
        // Chunk i's upload (needed now) and those ahead that would not wait.
        ups.submit(lanes, chunks, &computes, fl, i, i + lead)?;
        let slot = i % k;
        let Some(up) = ups.queued.pop_front() else {
            unreachable!("chunk {i} was uploaded");
        };
        let comp = lanes.compute(c, slot, &up, downloads[slot].as_ref())?;
        fl.push(i, Phase::Compute, &comp);
        if download {
            let down = lanes.download(c, slot, &comp)?;
            fl.push(i, Phase::Download, &down);
            downloads[slot] = Some(down);
        }
        computes[slot] = Some(comp);
        // Uploads ahead whose fills completed meanwhile.
        ups.submit(lanes, chunks, &computes, fl, i + 1, i + lead)?;
        if let Some(f) = fl.poll() {
            return Ok(Some(f));
        }
        if let Some(f) = fl.bound(max_requests, &mut |r| lanes.wait(r)) {
            return Ok(Some(f));
        }
    }
    Ok(None)
}

/// The uploads submitted and not yet consumed by their compute, in chunk order, and the next
/// chunk to upload.
struct Uploads {
    queued: VecDeque<Request>,
    next: usize,
}

impl Uploads {
    /// Submits the uploads of chunks `next..=last` (at most the last chunk) in order: those up
    /// to `needed` whatever [`Lanes::upload_ready`] says, the rest while it says yes. Chunk
    /// `j` goes to slot `j % k` after `computes[j % k]`, which holds the compute of chunk
    /// `j - k`: the callers have submitted the computes of the chunks before `needed` and no
    /// other, and pass `last < needed + k`.
    fn submit<L: Lanes>(
        &mut self,
        lanes: &mut L,
        chunks: &[Chunk],
        computes: &[Option<Request>],
        fl: &mut InFlight,
        needed: usize,
        last: usize,
    ) -> Result<(), PipelineError> {
        let k = computes.len();
        while let Some(c) = chunks.get(self.next) {
            if self.next > last || (self.next > needed && !lanes.upload_ready(c)) {
                break;
            }
            let slot = self.next % k;
            let up = lanes.upload(c, slot, computes[slot].as_ref())?;
            fl.push(c.index, Phase::Upload, &up);
            self.queued.push_back(up);
            self.next += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Records the steps in submission order; uploads ahead are ready when `ready` says so.
    struct Record<R: FnMut(usize, &[String]) -> bool> {
        log: Vec<String>,
        /// Request id -> the step that made it.
        made: HashMap<u64, String>,
        ready: R,
    }

    impl<R: FnMut(usize, &[String]) -> bool> Record<R> {
        fn step(&mut self, what: String) -> Request {
            let r = Request::ready(Ok(()));
            self.made.insert(r.id(), what.clone());
            self.log.push(what);
            r
        }
        fn name(&self, r: Option<&Request>) -> String {
            r.map_or("-".into(), |r| self.made[&r.id()].clone())
        }
    }

    impl<R: FnMut(usize, &[String]) -> bool> Lanes for Record<R> {
        fn upload(
            &mut self,
            c: &Chunk,
            slot: usize,
            after: Option<&Request>,
        ) -> Result<Request, PipelineError> {
            let a = self.name(after);
            Ok(self.step(format!("up {} s{slot} after {a}", c.index)))
        }
        fn compute(
            &mut self,
            c: &Chunk,
            slot: usize,
            upload: &Request,
            out_free: Option<&Request>,
        ) -> Result<Request, PipelineError> {
            let (u, o) = (self.name(Some(upload)), self.name(out_free));
            let u = u.split(" after").next().unwrap_or_default().to_string();
            Ok(self.step(format!("comp {} s{slot} <{u}> after {o}", c.index)))
        }
        fn download(
            &mut self,
            c: &Chunk,
            slot: usize,
            computed: &Request,
        ) -> Result<Request, PipelineError> {
            let c2 = self.name(Some(computed));
            let c2 = c2.split(" s").next().unwrap_or_default().to_string();
            Ok(self.step(format!("down {} s{slot} after {c2}", c.index)))
        }
        fn upload_ready(&mut self, c: &Chunk) -> bool {
            (self.ready)(c.index, &self.log)
        }
    }

    fn chunks(n: usize) -> Vec<Chunk> {
        (0..n)
            .map(|i| Chunk {
                index: i,
                offset: i * 10,
                len: 10,
                out_offset: i * 10,
                out_len: 10,
            })
            .collect()
    }

    fn run<R: FnMut(usize, &[String]) -> bool>(n: usize, k: usize, ready: R) -> Vec<String> {
        let mut lanes = Record {
            log: Vec::new(),
            made: HashMap::new(),
            ready,
        };
        drive(&mut lanes, &chunks(n), k, 2 * k, true).expect("drive");
        lanes.log
    }

    /// Every chunk's steps in order with the right dependencies, whatever the uploads' readiness:
    /// upload j into slot j % K after the compute of chunk j - K (submitted before it), the
    /// compute after its own upload and the download of chunk j - K, the download after it.
    fn check(log: &[String], n: usize, k: usize) {
        let pos = |s: &str| log.iter().position(|l| l.starts_with(s));
        assert_eq!(log.len(), 3 * n, "{log:?}");
        for j in 0..n {
            let up = pos(&format!("up {j} ")).expect("upload");
            let comp = pos(&format!("comp {j} ")).expect("compute");
            let down = pos(&format!("down {j} ")).expect("download");
            assert!(up < comp && comp < down, "chunk {j}: {log:?}");
            let s = j % k;
            let (after_c, after_d) = match j.checked_sub(k) {
                Some(p) => (format!("comp {p} s{s} "), format!("down {p} s{s} ")),
                None => ("-".into(), "-".into()),
            };
            let want = format!("up {j} s{s} after {after_c}");
            assert!(log[up].starts_with(&want), "{} != {want}...", log[up]);
            if let Some(p) = j.checked_sub(k) {
                assert!(pos(&format!("comp {p} ")).is_some_and(|c| c < up));
            }
            let want = format!("comp {j} s{s} <up {j} s{s}> after {after_d}");
            assert!(log[comp].starts_with(&want), "{} != {want}", log[comp]);
            assert_eq!(log[down], format!("down {j} s{s} after comp {j}"));
        }
    }

    #[test]
    fn uploads_that_never_wait_run_k_minus_1_chunks_ahead() {
        for k in 1..=4 {
            for n in [0, 1, 2, 5, 11] {
                let log = run(n, k, |_, _| true);
                check(&log, n, k);
                // The order before `upload_ready`: chunks 0..K-1 uploaded first, then for each
                // chunk i the upload of chunk i + K - 1, its compute and its download.
                let mut want: Vec<String> = Vec::new();
                for j in 0..(k - 1).min(n) {
                    want.push(format!("up {j} "));
                }
                for i in 0..n {
                    if i + k - 1 < n {
                        want.push(format!("up {} ", i + k - 1));
                    }
                    want.push(format!("comp {i} "));
                    want.push(format!("down {i} "));
                }
                assert_eq!(log.len(), want.len());
                for (got, w) in log.iter().zip(&want) {
                    assert!(got.starts_with(w), "K={k} n={n}: {log:?}");
                }
            }
        }
    }

    #[test]
    fn an_upload_that_would_wait_never_holds_back_earlier_computes() {
        for k in 1..=4 {
            // No fill ever done ahead: each upload right before its compute.
            let n = 9;
            let log = run(n, k, |_, _| false);
            check(&log, n, k);
            for i in 0..n {
                assert!(
                    log[3 * i].starts_with(&format!("up {i} ")),
                    "K={k}: {log:?}"
                );
            }
        }
        // Fills that complete at arbitrary points (a fixed pseudo-random pattern): the
        // dependencies hold, and an upload ahead is submitted only when ready.
        for k in 1..=4 {
            for seed in 0..20u64 {
                let mut x = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
                // Per chunk, the last answer given: (log length when asked, ready).
                let mut last = HashMap::new();
                let log = run(13, k, |j, log: &[String]| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let yes = x % 3 == 0;
                    last.insert(j, (log.len(), yes));
                    yes
                });
                check(&log, 13, k);
                let mut computed = 0;
                for (at, step) in log.iter().enumerate() {
                    if step.starts_with("comp ") {
                        computed += 1;
                    }
                    let Some(j) = step
                        .strip_prefix("up ")
                        .and_then(|r| r.split(' ').next())
                        .and_then(|j| j.parse::<usize>().ok())
                    else {
                        continue;
                    };
                    // Chunk `computed` is the next compute: its upload goes whatever the
                    // answer; one further ahead only right after a yes.
                    if j > computed {
                        assert_eq!(
                            last.get(&j),
                            Some(&(at, true)),
                            "K={k} seed={seed}: upload {j} ahead without a yes: {log:?}"
                        );
                    }
                }
            }
        }
    }
}
