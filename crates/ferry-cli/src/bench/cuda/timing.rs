//! How a GPU series is timed and checked: the clock it gets (CUDA events behind the latch, or
//! the host's), one batch of ferry's or the raw copier's calls, and the device buffers'
//! poisoning and comparison.

use super::{CudaBench, Twin};
use crate::bench::ctx::{flat, setup, Ctx, Msg};
use crate::bench::{measure, measure_with, BenchError, Clock, Role, Series, Timing};
use ferry::cuda::{DeviceBuffer, Direction};
use ferry::EngineExt;
use ferry_bench::{BaselineError, RawCopier, StreamTimer};

impl CudaBench {
    /// The latch and events, where `events` asks for them and they work here.
    pub(super) fn clock(&self, events: bool) -> Option<&StreamTimer> {
        self.timer.as_ref().filter(|_| events)
    }

    /// Times `call` (one batch per call): with CUDA events when `timer` is given (`call` then
    /// returns the events' seconds; one untimed call runs first, outside the latch), else with
    /// the host clock.
    pub(super) fn time(
        &self,
        timer: Option<&StreamTimer>,
        mut call: impl FnMut(Option<&StreamTimer>) -> Result<Option<f64>, String>,
    ) -> Result<(Timing, Clock), String> {
        match timer {
            Some(t) => {
                // One untimed call outside the latch first: lazy set-up (kernel compiles,
                // table and staging allocations, peer access) may wait for the device.
                call(None)?;
                let tm = measure_with(&self.method, || {
                    call(Some(t))?.ok_or_else(|| "the batch was not timed by events".to_string())
                })?;
                Ok((tm, Clock::CudaEvents))
            }
            None => Ok((measure(&self.method, || call(None).map(drop))?, Clock::Host)),
        }
    }

    /// One batch of the raw copier's calls, behind the latch when `timer` is given.
    pub(super) fn raw_batch(
        &self,
        timer: Option<&StreamTimer>,
        f: impl FnOnce(&RawCopier) -> Result<(), BaselineError>,
    ) -> Result<Option<f64>, String> {
        match timer {
            None => f(&self.raw).map(|()| None),
            Some(t) => self.raw.timed(t, f).map(Some),
        }
        .map_err(|e| e.to_string())
    }

    /// A series whose destination is one device buffer: poison it, time `op` (one batch per
    /// call, given the timer when events apply), compare the buffer with `want`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dev_series(
        &self,
        ctx: &Ctx,
        timer: Option<&StreamTimer>,
        name: &str,
        role: Role,
        payload: u64,
        dev: &mut DeviceBuffer,
        want: &[u8],
        mut op: impl FnMut(&mut DeviceBuffer, Option<&StreamTimer>) -> Result<Option<f64>, String>,
    ) -> Result<Series, BenchError> {
        ctx.clocked_series(name, role, payload, || {
            poison_devs(std::slice::from_mut(dev))?;
            let (t, c) = self.time(timer, |tm| op(dev, tm))?;
            Ok((t, dev.to_vec().is_ok_and(|v| v == want), c))
        })
    }
}

/// One batch of ferry copies, submitted by `submit` in a scope of `e` and waited; with `timer`
/// given, in a scope of `e`'s latched twin instead, behind the latch on its stream for `dir`
/// (then returns the events' seconds).
pub(super) fn ferry_batch<'env, F, E>(
    e: &'env Twin,
    dir: Direction,
    timer: Option<&StreamTimer>,
    submit: F,
) -> Result<Option<f64>, String>
where
    F: for<'s> FnOnce(&'s ferry::Scope<'s, 'env>) -> Result<(), E>,
    E: std::fmt::Display,
{
    ferry_batches(e, &[dir], timer, submit)
}

/// As [`ferry_batch`], with copies on the streams of several directions, all behind the latch.
pub(super) fn ferry_batches<'env, F, E>(
    e: &'env Twin,
    dirs: &[Direction],
    timer: Option<&StreamTimer>,
    submit: F,
) -> Result<Option<f64>, String>
where
    F: for<'s> FnOnce(&'s ferry::Scope<'s, 'env>) -> Result<(), E>,
    E: std::fmt::Display,
{
    match timer {
        None => flat(e.scope(|s| submit(s).map_err(|x| Msg(x.to_string())))).map(|()| None),
        Some(t) => {
            let e = &e.latched;
            let streams: Vec<_> = dirs.iter().map(|&d| &**e.stream(d)).collect();
            flat(e.scope(|s| -> Result<(), Msg> {
                t.time_all(&streams, || submit(s))
                    .map_err(|x| x.to_string())?
                    .map_err(|x| x.to_string())?;
                Ok(())
            }))?;
            t.seconds().map(Some).map_err(|e| e.to_string())
        }
    }
}

pub(super) fn dev_bufs(
    n: usize,
    size: usize,
    ordinal: u32,
) -> Result<Vec<DeviceBuffer>, BenchError> {
    (0..n)
        .map(|_| DeviceBuffer::new(ordinal, size).map_err(setup))
        .collect()
}

pub(super) fn poison_devs(devs: &mut [DeviceBuffer]) -> Result<(), String> {
    for d in devs {
        let n = d.len();
        d.copy_from_host(&vec![0xA5; n])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub(super) fn devs_check(devs: &[DeviceBuffer], data: &[u8]) -> bool {
    devs.iter().all(|d| d.to_vec().is_ok_and(|v| v == data))
}
