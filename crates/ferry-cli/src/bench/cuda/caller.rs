//! What a program waits for: the caller's view of a bandwidth row ([`CallerView`]), the CPU
//! a series costs the process, and `cuda-wait-cpu` (the waiting thread's CPU time during one
//! long copy, issue 14).

use super::timing::poison_devs;
use super::CudaBench;
use crate::bench::ctx::{flat, setup, Ctx, Msg};
use crate::bench::data::pattern_bytes;
use crate::bench::{measure, measure_pair, BenchError, CallerView, Clock, Role, Row};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::{Engine, EngineExt, Layout, Memory, MemoryMut, Segment};
use ferry_bench::{cpu_time, CpuOf, RawCopier};
use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `body`, giving it a counter to bump once per timed call; returns its result, the
/// process's CPU time spent meanwhile, and the count.
pub(super) fn cpu_metered<T>(body: impl FnOnce(&Cell<u64>) -> T) -> (T, Option<Duration>, u64) {
    let calls = Cell::new(0);
    let c0 = cpu_time(CpuOf::Process);
    let out = body(&calls);
    let spent = match (c0, cpu_time(CpuOf::Process)) {
        (Some(a), Some(b)) => b.checked_sub(a),
        _ => None,
    };
    (out, spent, calls.get())
}

/// Runs `wait`, adding the calling thread's CPU time and the wall time it took to `acc`.
fn metered<E>(
    acc: &Cell<(Duration, Duration)>,
    wait: impl FnOnce() -> Result<(), E>,
) -> Result<(), E> {
    let (c0, t0) = (cpu_time(CpuOf::Thread), Instant::now());
    let out = wait();
    let (wall, c1) = (t0.elapsed(), cpu_time(CpuOf::Thread));
    let cpu = c0.zip(c1).and_then(|(a, b)| b.checked_sub(a));
    let (c, w) = acc.get();
    acc.set((c + cpu.unwrap_or_default(), w + wall));
    out
}

/// Poisons one device buffer (before a verified call).
pub(super) fn poison_dev(d: &mut DeviceBuffer) -> Result<(), String> {
    poison_devs(std::slice::from_mut(d))
}

/// Whether a device buffer holds `want`.
pub(super) fn dev_is(want: &[u8]) -> impl Fn(&DeviceBuffer) -> bool + '_ {
    move |d| d.to_vec().is_ok_and(|v| v == want)
}

/// What a caller's-view copy ([`CudaBench::caller_view`]) moves.
#[derive(Clone, Copy)]
pub(super) enum Moved<'a> {
    /// The first so many bytes of the source, to the start of the destination.
    Bytes(usize),
    /// A segment list, and the same as `(dst offset, src offset, length)` for the raw calls.
    Segments(&'a Arc<[Segment]>, &'a [(usize, usize, usize)]),
}

impl CudaBench {
    /// The caller's view of copying `what` from `src` into `dst`: the default engine and the
    /// raw driver (one `cuMemcpyAsync`, or one per segment), one copy per call, host clock;
    /// `poison` before and `check` after each series.
    pub(super) fn caller_view<D, S>(
        &self,
        ctx: &Ctx,
        dst: &mut D,
        src: &S,
        what: Moved<'_>,
        poison: impl Fn(&mut D) -> Result<(), String>,
        check: impl Fn(&D) -> bool,
    ) -> Result<CallerView, BenchError>
    where
        D: MemoryMut + ?Sized,
        S: Memory + ?Sized,
    {
        let (n, raw_name) = match what {
            Moved::Bytes(n) => (n, "cuMemcpyAsync + cuStreamSynchronize (caller)"),
            Moved::Segments(_, segs) => (
                segs.iter().map(|s| s.2).sum(),
                "raw cuMemcpyAsync per segment + cuStreamSynchronize (caller)",
            ),
        };
        let l = Layout::bytes(n).map_err(setup)?;
        self.caller_pair(
            ctx,
            dst,
            n as u64,
            |e, d| {
                flat(e.scope(|s| {
                    match what {
                        Moved::Bytes(_) => s.copy(d, &l, src, &l)?,
                        Moved::Segments(list, _) => s.segments(d, src, Arc::clone(list))?,
                    }
                    .wait()
                    .map_err(ferry::Error::from)
                }))
            },
            (raw_name, |raw, d| {
                match what {
                    Moved::Bytes(_) => raw.copy(d, src, n, 1),
                    Moved::Segments(_, segs) => raw.copy_segments(d, src, segs, 1),
                }
                .map_err(|e| e.to_string())
            }),
            poison,
            check,
        )
    }

    /// The caller's view of one operation on `target`, `payload` bytes per call
    /// ([`CallerView`]): `ferry` runs it through the default-config engine (scope, submit,
    /// wait), `raw` (named `raw.0`) with the raw driver's calls and their synchronize, on the
    /// same buffers. Each side is verified on its own (`poison`, one call, `check`), then both
    /// are timed interleaved (`measure_pair`) on the host clock: the two figures are a few
    /// percent apart at 64 KiB-1 MiB, less than the drift between two series timed one after
    /// the other. Every bandwidth row with a raw submit+sync baseline uses it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn caller_pair<T: ?Sized>(
        &self,
        ctx: &Ctx,
        target: &mut T,
        payload: u64,
        ferry: impl Fn(&CudaEngine, &mut T) -> Result<(), String>,
        raw: (&str, impl Fn(&RawCopier, &mut T) -> Result<(), String>),
        poison: impl Fn(&mut T) -> Result<(), String>,
        check: impl Fn(&T) -> bool,
    ) -> Result<CallerView, BenchError> {
        let e = &self.engine;
        let name = format!("ferry {} default (caller)", e.name());
        let (raw_name, raw_op) = raw;
        let ferry_op = |t: &mut T| ferry(e, t);
        let raw_op = |t: &mut T| raw_op(&self.raw, t);
        let mut verified = |op: &dyn Fn(&mut T) -> Result<(), String>| -> Result<bool, String> {
            poison(target)?;
            op(target)?;
            Ok(check(target))
        };
        let (ok_f, ok_r) = (verified(&ferry_op), verified(&raw_op));
        let target = std::cell::RefCell::new(target);
        let (tf, tr) = measure_pair(
            &self.method,
            || ferry_op(&mut target.borrow_mut()),
            || raw_op(&mut target.borrow_mut()),
        )
        .map_err(|m| ctx.engine_err(&name, m))?;
        let f = ctx.clocked_series(&name, Role::Ferry, payload, || Ok((tf, ok_f?, Clock::Host)))?;
        let r = ctx.clocked_series(raw_name, Role::Baseline, payload, || {
            Ok((tr, ok_r?, Clock::Host))
        })?;
        Ok(CallerView::new(f, r))
    }

    /// [`CudaBench::caller_view`] of `data.len()` bytes of `src` into the device buffer `dst`.
    pub(super) fn dev_caller_view<S: Memory + ?Sized>(
        &self,
        ctx: &Ctx,
        dst: &mut DeviceBuffer,
        src: &S,
        data: &[u8],
    ) -> Result<CallerView, BenchError> {
        self.caller_view(
            ctx,
            dst,
            src,
            Moved::Bytes(data.len()),
            poison_dev,
            dev_is(data),
        )
    }

    /// [`CudaBench::caller_pair`] of an operation writing the device buffer `dev`, whose
    /// result must be `want` (`want.len()` bytes moved per call).
    pub(super) fn dev_caller_pair(
        &self,
        ctx: &Ctx,
        dev: &mut DeviceBuffer,
        want: &[u8],
        ferry: impl Fn(&CudaEngine, &mut DeviceBuffer) -> Result<(), String>,
        raw: (
            &str,
            impl Fn(&RawCopier, &mut DeviceBuffer) -> Result<(), String>,
        ),
    ) -> Result<CallerView, BenchError> {
        let n = want.len() as u64;
        self.caller_pair(ctx, dev, n, ferry, raw, poison_dev, dev_is(want))
    }

    /// `cuda-wait-cpu`: one pinned host -> device copy of `size` submitted, then waited; the
    /// waiting thread's CPU time around each wait over the waits' wall time, for the default
    /// wait, `Spin`, and a raw `cuStreamSynchronize` (the figure is microseconds per wait; the
    /// share is `wait_cpu_share`). Issue 14's target: the default at most 20% at 256 MiB.
    pub(super) fn wait_cpu(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let data = pattern_bytes(size);
        let mut src = PinnedBuffer::new(size).map_err(setup)?;
        src.copy_from_slice(&data);
        let mut dev = DeviceBuffer::new(0, size).map_err(setup)?;
        let l = Layout::bytes(size).map_err(setup)?;
        let n = size as u64;
        let check = |d: &DeviceBuffer| d.to_vec().is_ok_and(|v| v == data);
        // (cpu, wall) summed over the waits of a series.
        let acc = Cell::new((Duration::ZERO, Duration::ZERO));
        let share = || {
            let (c, w) = acc.replace((Duration::ZERO, Duration::ZERO));
            (w > Duration::ZERO).then(|| c.as_secs_f64() / w.as_secs_f64())
        };
        let mut series = Vec::new();
        let engines: [(&CudaEngine, &str, Role); 2] = [
            (&self.engine, "default", Role::Ferry),
            (&self.spin, "spin", Role::Baseline),
        ];
        for (e, how, role) in engines {
            let name = format!("ferry {} {how}", e.name());
            let mut s = ctx.clocked_series(&name, role, n, || {
                dev.copy_from_host(&vec![0xA5; size])
                    .map_err(|e| e.to_string())?;
                let t = measure(&self.method, || {
                    flat(e.scope(|s| {
                        let r = s
                            .copy(&mut dev, &l, &src, &l)
                            .map_err(|x| Msg(x.to_string()))?;
                        metered(&acc, || r.wait()).map_err(|x| Msg(x.to_string()))
                    }))
                })?;
                Ok((t, check(&dev), Clock::Host))
            })?;
            s.wait_cpu_share = share();
            series.push(s);
        }
        let mut r = ctx.clocked_series("raw cuStreamSynchronize", Role::Baseline, n, || {
            dev.copy_from_host(&vec![0xA5; size])
                .map_err(|e| e.to_string())?;
            let t = measure(&self.method, || {
                // The enqueue (a few microseconds) is metered with the synchronize.
                metered(&acc, || self.raw.copy(&mut dev, &src, size, 1)).map_err(|e| e.to_string())
            })?;
            Ok((t, check(&dev), Clock::Host))
        })?;
        r.wait_cpu_share = share();
        series.push(r);
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            n,
            n,
            "pinned -> device, waited".into(),
            series,
        ))
    }
}
