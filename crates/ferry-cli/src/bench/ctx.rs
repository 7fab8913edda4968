//! One (test, size) being measured: [`Ctx`] names it in errors and runs one series (measure,
//! then verify); [`HostSeries`] checks, then times in turns, the series of a row whose
//! destination is one host slice.

use super::{
    last_in_turns, measure_interleaved, BenchError, Calls, Clock, Kind, Method, Role, Series,
    TestInfo, Timing,
};
use crate::sizes::format_size;

/// Names for errors of one (test, size), and the row's kind.
pub(super) struct Ctx {
    /// Test name.
    pub(super) test: &'static str,
    /// Bandwidth or latency.
    pub(super) kind: Kind,
    /// Size label.
    pub(super) size: String,
}

impl Ctx {
    /// The context of `test` at `size` bytes.
    pub(super) fn new(test: &TestInfo, size: u64) -> Ctx {
        Ctx {
            test: test.name,
            kind: test.kind,
            size: format_size(size),
        }
    }

    /// This size cannot be used by this test.
    pub(super) fn bad(&self, why: &str) -> BenchError {
        BenchError::BadSize {
            test: self.test.into(),
            size: self.size.clone(),
            why: why.into(),
        }
    }

    /// Series `series` failed in the engine (or a baseline) with `message`.
    pub(super) fn engine_err(&self, series: &str, message: String) -> BenchError {
        BenchError::Engine {
            test: self.test.into(),
            series: series.into(),
            size: self.size.clone(),
            message,
        }
    }

    /// Series `series` left a wrong byte at `offset` of the destination.
    pub(super) fn verify_err(&self, series: &str, offset: usize) -> BenchError {
        BenchError::Verify {
            test: self.test.into(),
            series: series.into(),
            size: self.size.clone(),
            offset,
        }
    }

    /// Runs `body` (which poisons, times and reports whether the result verified) as one
    /// series timed on the host clock.
    pub(super) fn series(
        &self,
        name: &str,
        role: Role,
        payload: u64,
        body: impl FnOnce() -> Result<(Timing, bool), String>,
    ) -> Result<Series, BenchError> {
        self.clocked_series(name, role, payload, || {
            body().map(|(t, ok)| (t, ok, Clock::Host))
        })
    }

    /// As [`Ctx::series`], `body` also saying how it was timed.
    pub(super) fn clocked_series(
        &self,
        name: &str,
        role: Role,
        payload: u64,
        body: impl FnOnce() -> Result<(Timing, bool, Clock), String>,
    ) -> Result<Series, BenchError> {
        let (t, ok, clock) = body().map_err(|message| self.engine_err(name, message))?;
        if !ok {
            return Err(self.verify_err(name, 0));
        }
        Ok(Series::new(name, role, self.kind, payload, t).clocked(clock))
    }
}

/// One series' call, made as many times as asked: writes the row's destination.
type HostOp<'a, T> = Box<Calls<'a, [T], String>>;

/// The series of one row whose destination is one host slice. Each series is checked first
/// (the slice poisoned, touching every page, one call, then verified), then all are timed
/// together, sample by sample in turns ([`measure_interleaved`]): a drift of the machine
/// during the row (a VM neighbour's burst, the clock) falls on ferry and the baselines alike.
pub(super) struct HostSeries<'a, T, V> {
    ctx: &'a Ctx,
    method: &'a Method,
    dst: &'a mut [T],
    poison: T,
    payload: u64,
    verify: V,
    ops: Vec<(String, Role, HostOp<'a, T>)>,
}

impl<'a, T: Copy, V: Fn(&[T]) -> Result<(), usize>> HostSeries<'a, T, V> {
    /// No series yet; each will move `payload` bytes into `dst` per call, written with
    /// `poison` before it and checked by `verify` (the first wrong byte) after it.
    pub(super) fn new(
        ctx: &'a Ctx,
        method: &'a Method,
        (dst, poison): (&'a mut [T], T),
        payload: usize,
        verify: V,
    ) -> Self {
        HostSeries {
            ctx,
            method,
            dst,
            poison,
            payload: payload as u64,
            verify,
            ops: vec![],
        }
    }

    /// Poisons the destination, calls `op` once and verifies the destination; keeps `op` to
    /// be timed with the others in [`HostSeries::done`].
    pub(super) fn run(
        &mut self,
        name: &str,
        role: Role,
        mut op: impl FnMut(&mut [T]) -> Result<(), String> + 'a,
    ) -> Result<(), BenchError> {
        self.dst.fill(self.poison);
        op(self.dst).map_err(|m| self.ctx.engine_err(name, m))?;
        (self.verify)(self.dst).map_err(|offset| self.ctx.verify_err(name, offset))?;
        let calls = move |d: &mut [T], n: u64| (0..n).try_for_each(|_| op(d));
        self.ops.push((name.to_string(), role, Box::new(calls)));
        Ok(())
    }

    /// Times every series kept, interleaved, and returns them in the order they were added.
    pub(super) fn done(self) -> Result<Vec<Series>, BenchError> {
        let HostSeries {
            ctx,
            method,
            dst,
            payload,
            verify,
            mut ops,
            ..
        } = self;
        let mut refs: Vec<&mut Calls<'_, [T], String>> = ops
            .iter_mut()
            .map(|(_, _, op)| &mut **op as &mut Calls<'_, [T], String>)
            .collect();
        let timings = measure_interleaved(method, &mut *dst, &mut refs);
        drop(refs);
        let timings = timings.map_err(|(k, m)| ctx.engine_err(&ops[k].0, m))?;
        // The destination still holds the bytes of the last call timed (the last round's
        // last series): checked too.
        if let Some(last) = last_in_turns(method, ops.len()) {
            verify(dst).map_err(|offset| ctx.verify_err(&ops[last].0, offset))?;
        }
        Ok(ops
            .iter()
            .zip(timings)
            .map(|((name, role, _), t)| Series::new(name, *role, ctx.kind, payload, t))
            .collect())
    }
}

/// A setup failure.
pub(super) fn setup(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(e.to_string())
}

/// A bench-only number from the environment (`var`, e.g. `FERRY_BENCH_BOUNCE`): `None` when
/// unset; a value that does not parse is a setup error naming the variable and `what` it is.
pub(super) fn env_number<T: std::str::FromStr>(
    var: &str,
    what: &str,
) -> Result<Option<T>, BenchError> {
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(s) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| BenchError::Setup(format!("${var}={s:?} is not {what}"))),
    }
}

/// A scope's error (the closure's own, or the barrier's converted into it) as a message.
pub(super) fn flat<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

/// A message that also takes a scope's barrier failures: the error of scope closures whose
/// own errors are messages, so that the scope can return it.
pub(super) struct Msg(pub String);

impl From<String> for Msg {
    fn from(s: String) -> Self {
        Msg(s)
    }
}

impl From<ferry::BarrierError> for Msg {
    fn from(e: ferry::BarrierError) -> Self {
        Msg(e.to_string())
    }
}

impl std::fmt::Display for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `1 thread`, `2 threads`, ...
pub(super) fn threads_label(n: usize) -> String {
    if n == 1 {
        "1 thread".to_string()
    } else {
        format!("{n} threads")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_number_unset_set_and_bad() {
        // A variable no other test touches.
        const VAR: &str = "FERRY_BENCH_TEST_ENV_NUMBER";
        std::env::remove_var(VAR);
        assert_eq!(env_number::<usize>(VAR, "a count").unwrap(), None);
        std::env::set_var(VAR, " 8 ");
        assert_eq!(env_number::<usize>(VAR, "a count").unwrap(), Some(8));
        std::env::set_var(VAR, "eight");
        let e = env_number::<usize>(VAR, "a count").unwrap_err().to_string();
        assert!(
            e.contains(VAR) && e.contains("\"eight\"") && e.contains("a count"),
            "{e}"
        );
        std::env::remove_var(VAR);
    }
}
