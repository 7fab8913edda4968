//! `cuda-threads`: many threads submitting through one engine. 1, 2, 8 and 16 threads each copy
//! their own pinned buffer into their own device buffer, `size` bytes per copy, one copy
//! submitted and waited at a time: through ONE shared engine with the default config (a scope,
//! `memcpy`, `wait` per copy, as a user writes it), and raw (a stream of the thread's own,
//! `cuMemcpyHtoDAsync` + `cuStreamSynchronize` per copy), on the same buffers in the same run.
//! One row per thread count (`cuda-threads[N]`); a timed call is one *round*: every thread's
//! [`copies_per_round`] copies, released together, host clock until the last thread is done.
//! The default engine's rounds and the raw ones are timed in turns on the same threads
//! (`measure_pair`), so that the host's drift moves both alike (timed one series after the
//! other, one thread's 64 KiB copies read 0.94x raw in run 96 of `bench/results/h200.md`, where
//! the same copies interleaved on one thread, main or spawned, ran 1.06-1.11x raw in run 109;
//! this row, interleaved, 1.02 and 1.06 in run 110).
//! Two more ferry series follow (the row's ratio is the default's): the same with spin waits,
//! and an engine of one stream per direction (as before the pool), each timed on its own.
//! Payload: threads x copies x size bytes. Every device buffer is poisoned before a series (or
//! before a verifying round of each side of the pair) and compared with its thread's own
//! pattern after it.

use super::CudaBench;
use crate::bench::ctx::{flat, setup, threads_label, Ctx};
use crate::bench::data::pattern;
use crate::bench::{measure, measure_pair, BenchError, Kind, Role, Row};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::{Engine, EngineExt};
use ferry_bench::RawCopier;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex, PoisonError};

/// Submitting threads, one row each.
const THREADS: [usize; 4] = [1, 2, 8, 16];

/// Copies each thread makes per timed round: 16 MiB per thread, 1 to 64 copies.
fn copies_per_round(size: usize) -> usize {
    ((16 << 20) / size.max(1)).clamp(1, 64)
}

/// One thread's buffers and the bytes its destination must hold.
struct Lane {
    src: PinnedBuffer,
    dev: DeviceBuffer,
    want: Vec<u8>,
}

impl CudaBench {
    /// The rows of `cuda-threads` at `size` bytes per copy.
    pub(super) fn threads(&self, ctx: &Ctx, size: usize) -> Result<Vec<Row>, BenchError> {
        if size == 0 {
            return Err(ctx.bad("zero bytes"));
        }
        let mut rows = Vec::new();
        for n in THREADS {
            rows.push(self.threads_row(ctx, size, n)?);
        }
        Ok(rows)
    }

    fn threads_row(&self, ctx: &Ctx, size: usize, n: usize) -> Result<Row, BenchError> {
        let mut lanes = (0..n)
            .map(|i| {
                let want = pattern(size, 7000 + i as u64);
                let mut src = PinnedBuffer::new(size).map_err(setup)?;
                src.copy_from_slice(&want);
                let dev = DeviceBuffer::new(0, size).map_err(setup)?;
                Ok(Lane { src, dev, want })
            })
            .collect::<Result<Vec<_>, BenchError>>()?;
        let copies = copies_per_round(size);
        let payload = (n * copies * size) as u64;
        // The default engine first (the row's ratio), timed in turns with raw; then two
        // diagnostics: the same with spin waits (what the default wait costs), and one stream
        // per direction (without the pool).
        let label = |engine: &CudaEngine, what: &str| {
            format!("ferry {} ({what}, {})", engine.name(), threads_label(n))
        };
        let raw_name = format!(
            "raw cuMemcpyHtoDAsync + cuStreamSynchronize (a stream per thread, {})",
            threads_label(n)
        );
        let open_raw = || RawCopier::new(0).map_err(|e| e.to_string());
        let ferry_op = |_: &RawCopier, l: &mut Lane| ferry_copy(&self.engine, l);
        let raw_op = |raw: &RawCopier, l: &mut Lane| {
            raw.copy(&mut l.dev, &l.src, size, 1)
                .map_err(|e| e.to_string())
        };
        // Each side verified on its own round, then both timed in turns.
        let ok_f = verified_round(&mut lanes, copies, &open_raw, &ferry_op);
        let ok_r = verified_round(&mut lanes, copies, &open_raw, &raw_op);
        let times = rounds_of(
            &mut lanes,
            copies,
            &open_raw,
            &[&ferry_op, &raw_op],
            |round| measure_pair(&self.method, || round(0), || round(1)),
        );
        let (tf, tr) = match times {
            Ok((tf, tr)) => (Ok(tf), Ok(tr)),
            Err(e) => (Err(e.clone()), Err(e)),
        };
        let default = label(&self.engine, "one engine, default config");
        let mut series = vec![ctx.series(&default, Role::Ferry, payload, || Ok((tf?, ok_f?)))?];
        let single = CudaEngine::with_config(self.engine.config().streams(1)).map_err(setup)?;
        for (engine, what) in [
            (&*self.spin, "one engine, spin waits"),
            (&single, "one engine, one stream per direction"),
        ] {
            series.push(ctx.series(&label(engine, what), Role::Ferry, payload, || {
                let op = |_: &(), l: &mut Lane| ferry_copy(engine, l);
                checked(&mut lanes, copies, &|| Ok(()), &op, |round| {
                    measure(&self.method, || round(0))
                })
            })?);
        }
        series.push(ctx.series(&raw_name, Role::Baseline, payload, || Ok((tr?, ok_r?)))?);
        let shape = format!(
            "pinned -> device, {}, {copies} copies of {size} bytes each per round",
            threads_label(n)
        );
        let mut row = Row::new(
            ctx.test,
            Kind::Bandwidth,
            size as u64,
            payload,
            shape,
            series,
        );
        row.test = format!("{}[{n}]", ctx.test);
        row.link_limit_fraction = self
            .link_gbps
            .zip(row.ferry().map(|s| s.median))
            .map(|(limit, f)| f / limit);
        Ok(row)
    }
}

/// One submit+wait through the shared engine, as a user writes it.
fn ferry_copy(engine: &CudaEngine, l: &mut Lane) -> Result<(), String> {
    let Lane { src, dev, .. } = l;
    flat(engine.scope(|s| s.memcpy(dev, &*src)?.wait().map_err(ferry::Error::from)))
}

/// Whether every thread's device buffer holds its own pattern (an error names the first
/// thread and byte that do not).
fn check(lanes: &[Lane]) -> Result<bool, String> {
    for (i, l) in lanes.iter().enumerate() {
        let got = l.dev.to_vec().map_err(|e| e.to_string())?;
        if let Some(at) = got.iter().zip(&l.want).position(|(a, b)| a != b) {
            return Err(format!(
                "thread {i}'s device buffer: byte {at} is {:#04x}, its pattern has {:#04x}",
                got[at], l.want[at]
            ));
        }
    }
    Ok(true)
}

fn poison(lanes: &mut [Lane]) -> Result<(), String> {
    for l in lanes {
        let n = l.dev.len();
        l.dev
            .copy_from_host(&vec![0xA5; n])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One thread's call with its session `S` on its lane.
type Op<'a, S> = &'a (dyn Fn(&S, &mut Lane) -> Result<(), String> + Sync);

/// Poisons every device buffer, runs rounds of `op` as `time` asks ([`rounds_of`]), and
/// checks the buffers after: what `time` returned, and whether they hold their patterns.
fn checked<S, T>(
    lanes: &mut [Lane],
    copies: usize,
    open: &(impl Fn() -> Result<S, String> + Sync),
    op: Op<'_, S>,
    time: impl FnOnce(&dyn Fn(usize) -> Result<(), String>) -> Result<T, String>,
) -> Result<(T, bool), String> {
    poison(lanes)?;
    let t = rounds_of(lanes, copies, open, &[op], time)?;
    Ok((t, check(lanes)?))
}

/// One round of `op` on poisoned buffers ([`checked`]): whether they hold their patterns after.
fn verified_round<S>(
    lanes: &mut [Lane],
    copies: usize,
    open: &(impl Fn() -> Result<S, String> + Sync),
    op: Op<'_, S>,
) -> Result<bool, String> {
    checked(lanes, copies, open, op, |round| round(0)).map(|((), ok)| ok)
}

/// One thread per lane, each with its own session (`open`, made on the thread); `time` gets
/// `round(i)`, which releases every thread at once (a barrier) to make `copies` calls of
/// `ops[i]` and returns when the last thread is done, with the first error of any thread.
fn rounds_of<S, T>(
    lanes: &mut [Lane],
    copies: usize,
    open: &(impl Fn() -> Result<S, String> + Sync),
    ops: &[Op<'_, S>],
    time: impl FnOnce(&dyn Fn(usize) -> Result<(), String>) -> Result<T, String>,
) -> Result<T, String> {
    let (start, end) = (Barrier::new(lanes.len() + 1), Barrier::new(lanes.len() + 1));
    let stop = AtomicBool::new(false);
    let which = AtomicUsize::new(0);
    let error: Mutex<Option<String>> = Mutex::new(None);
    let fail = |e: String| {
        error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(e);
    };
    std::thread::scope(|sc| {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let (start, end, stop, which, fail) = (&start, &end, &stop, &which, &fail);
            sc.spawn(move || {
                let session = open().map_err(|e| format!("thread {i}: {e}"));
                loop {
                    start.wait();
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let op = ops.get(which.load(Ordering::Acquire)).copied();
                    match (&session, op) {
                        (Ok(s), Some(op)) => {
                            for k in 0..copies {
                                if let Err(e) = op(s, lane) {
                                    fail(format!("thread {i}, copy {k} of the round: {e}"));
                                    break;
                                }
                            }
                        }
                        (Err(e), _) => fail(e.clone()),
                        (_, None) => fail(format!("thread {i}: no such operation")),
                    }
                    end.wait();
                }
            });
        }
        let round = |i: usize| {
            which.store(i, Ordering::Release);
            start.wait();
            end.wait();
            match error.lock().unwrap_or_else(PoisonError::into_inner).take() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        };
        let t = time(&round);
        stop.store(true, Ordering::Release);
        start.wait();
        t
    })
}
