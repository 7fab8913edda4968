//! The timing loop and its statistics: [`Method`] says how to measure, [`measure`],
//! [`measure_with`] and the interleaved [`measure_pair`] / [`measure_interleaved`] run the
//! warm-up, calibration and samples, and [`Timing`] keeps the
//! per-call seconds of each sample with their median, min and max.

use serde::Serialize;
use std::time::Instant;

/// How to measure.
#[derive(Debug, Clone, Serialize)]
pub struct Method {
    /// Warm-up calls per series (not timed).
    pub warmup: usize,
    /// Timed samples per series.
    pub samples: usize,
    /// A sample repeats the call until it lasts at least this long (seconds).
    pub min_sample_s: f64,
}

impl Default for Method {
    fn default() -> Self {
        Method {
            warmup: 3,
            samples: 10,
            min_sample_s: 1e-3,
        }
    }
}

/// Timing of one series: seconds per call.
#[derive(Debug, Clone, Serialize)]
pub struct Timing {
    /// Seconds per call of each sample.
    pub samples_s: Vec<f64>,
    /// Calls per sample.
    pub reps: u64,
    /// Median seconds per call.
    pub median_s: f64,
    /// Fastest sample.
    pub min_s: f64,
    /// Slowest sample.
    pub max_s: f64,
}

/// Times `op` as [`METHOD`](super::METHOD) describes, with the host's monotonic clock around
/// each sample of R calls. `op` returns an error to stop the measurement.
pub fn measure<E>(method: &Method, op: impl FnMut() -> Result<(), E>) -> Result<Timing, E> {
    let mut t = measure_interleaved(method, &mut (), &mut [&mut calls(op)]).map_err(|(_, e)| e)?;
    Ok(t.remove(0))
}

/// `op` as an op of [`measure_interleaved`] with no shared state: its calls in a loop of its
/// own.
fn calls<E>(mut op: impl FnMut() -> Result<(), E>) -> impl FnMut(&mut (), u64) -> Result<(), E> {
    move |_, n| (0..n).try_for_each(|_| op())
}

/// Times `a` and `b` as [`measure`] does, but interleaved: sample i of each is taken right
/// after (or before) the other's, the order swapped every sample, so that a drift of the
/// machine over the run (clocks, caches, another process) falls on both alike. For two ways
/// of doing the same thing whose ratio matters more than either figure.
pub fn measure_pair<E>(
    method: &Method,
    a: impl FnMut() -> Result<(), E>,
    b: impl FnMut() -> Result<(), E>,
) -> Result<(Timing, Timing), E> {
    let mut t = measure_interleaved(method, &mut (), &mut [&mut calls(a), &mut calls(b)])
        .map_err(|(_, e)| e)?;
    let tb = t.remove(1);
    Ok((t.remove(0), tb))
}

/// An op of [`measure_interleaved`]: makes its call as many times as it is handed, each on the
/// shared state.
pub type Calls<'a, C, E> = dyn FnMut(&mut C, u64) -> Result<(), E> + 'a;

/// Times every op of `ops` as [`measure`] does (each its own warm-up, calibration and calls
/// per sample), but in turns: sample i of every op is taken in one round, each round starting
/// one op further on, so that a drift of the machine over the run (clocks, caches, another
/// process, a neighbour's burst on a VM) falls on all of them alike instead of on whichever ran
/// while it lasted. A sample of several calls follows one untimed call of its own op. An op handed `n` makes its call `n` times (the loop inside the op, so that
/// the call is not behind a dynamic dispatch of its own), each given `state`, which they all
/// share (the one destination all the series of a row write). One timing per op, in the order
/// given; an error comes back with the index of the op that returned it.
pub fn measure_interleaved<C: ?Sized, E>(
    method: &Method,
    state: &mut C,
    ops: &mut [&mut Calls<'_, C, E>],
) -> Result<Vec<Timing>, (usize, E)> {
    for _ in 0..method.warmup {
        for (k, op) in ops.iter_mut().enumerate() {
            op(state, 1).map_err(|e| (k, e))?;
        }
    }
    let mut reps = Vec::with_capacity(ops.len());
    for (k, op) in ops.iter_mut().enumerate() {
        let t = Instant::now();
        op(state, 1).map_err(|e| (k, e))?;
        reps.push(reps_for(method, t.elapsed().as_secs_f64()));
    }
    let n = method.samples.max(1);
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(n); ops.len()];
    for i in 0..n {
        for k in 0..ops.len() {
            let j = (i + k) % ops.len();
            if reps[j] > 1 {
                // Settle: one untimed call first, so that a sample of short calls does not pay
                // for the state the op before it left (a 16-thread baseline leaves the shared
                // destination's lines in 16 other cores' caches, and the op after it fetched
                // them back on the clock, each round: issue 32's 1 MiB rows). A sample of one
                // call (1 ms or more) is left as it is: there the cost is a sliver, and a
                // settle call would double the row's time.
                ops[j](state, 1).map_err(|e| (j, e))?;
            }
            let t = Instant::now();
            ops[j](state, reps[j]).map_err(|e| (j, e))?;
            samples[j].push(t.elapsed().as_secs_f64() / reps[j] as f64);
        }
    }
    Ok(samples
        .into_iter()
        .zip(reps)
        .map(|(s, r)| Timing::of(s, r))
        .collect())
}

/// Which of `ops` ops [`measure_interleaved`] timed last (the last round's last turn): the one
/// whose bytes the shared destination holds afterwards. `None` for no ops.
pub fn last_in_turns(method: &Method, ops: usize) -> Option<usize> {
    (ops > 0).then(|| (method.samples.max(1) - 1 + ops - 1) % ops)
}

/// Times `op` as [`measure`] does, but each call reports its own duration in seconds (the GPU
/// time between two CUDA events); a sample is the mean over its R calls.
pub fn measure_with<E>(
    method: &Method,
    mut op: impl FnMut() -> Result<f64, E>,
) -> Result<Timing, E> {
    for _ in 0..method.warmup {
        op()?;
    }
    let reps = reps_for(method, op()?);
    let mut samples_s = Vec::with_capacity(method.samples);
    for _ in 0..method.samples.max(1) {
        let mut total = 0.0;
        for _ in 0..reps {
            total += op()?;
        }
        samples_s.push(total / reps as f64);
    }
    Ok(Timing::of(samples_s, reps))
}

/// Calls per sample so that a sample lasts at least `min_sample_s`, from one call's time.
fn reps_for(method: &Method, one: f64) -> u64 {
    if one >= method.min_sample_s {
        1
    } else {
        (method.min_sample_s / one.max(1e-9)).ceil().min(1e6) as u64
    }
}

impl Timing {
    /// Median, min and max of the samples (at least one).
    pub(super) fn of(samples_s: Vec<f64>, reps: u64) -> Timing {
        let mut sorted = samples_s.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median_s = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Timing {
            reps,
            median_s,
            min_s: sorted[0],
            max_s: sorted[n - 1],
            samples_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_takes_median_min_max() {
        let mut n = 0u32;
        let t = measure(
            &Method {
                warmup: 1,
                samples: 5,
                min_sample_s: 0.0,
            },
            || {
                n += 1;
                Ok::<(), ()>(())
            },
        )
        .unwrap();
        // 1 warm-up + 1 calibration + 5 samples of 1 rep each.
        assert_eq!((n, t.reps, t.samples_s.len()), (7, 1, 5));
        assert!(t.min_s <= t.median_s && t.median_s <= t.max_s);
    }

    #[test]
    fn measure_pair_interleaves_and_swaps_the_order() {
        let order = std::cell::RefCell::new(String::new());
        let m = Method {
            warmup: 1,
            samples: 4,
            min_sample_s: 0.0,
        };
        let (a, b) = measure_pair(
            &m,
            || {
                order.borrow_mut().push('a');
                Ok::<(), ()>(())
            },
            || {
                order.borrow_mut().push('b');
                Ok(())
            },
        )
        .unwrap();
        // Warm-up ab, calibration ab, then samples ab, ba, ab, ba (one rep each).
        assert_eq!(order.into_inner(), "ababab".to_string() + "baabba");
        assert_eq!(
            (a.samples_s.len(), b.samples_s.len(), a.reps, b.reps),
            (4, 4, 1, 1)
        );
    }

    /// An op of [`measure_interleaved`] that appends `ch` to the shared string once per call.
    fn pusher(ch: char) -> impl FnMut(&mut String, u64) -> Result<(), &'static str> {
        move |o: &mut String, n: u64| {
            (0..n).for_each(|_| o.push(ch));
            Ok(())
        }
    }

    #[test]
    fn measure_interleaved_takes_turns_each_round_one_op_further_on() {
        let m = Method {
            warmup: 1,
            samples: 3,
            min_sample_s: 0.0,
        };
        let (mut a, mut b, mut c) = (pusher('a'), pusher('b'), pusher('c'));
        let mut order = String::new();
        let t = measure_interleaved(&m, &mut order, &mut [&mut a, &mut b, &mut c]).unwrap();
        // Warm-up abc, calibration abc, then the rounds abc, bca, cab (one rep each).
        assert_eq!(order, "abcabc".to_string() + "abcbcacab");
        assert_eq!(t.len(), 3);
        assert!(t.iter().all(|t| t.samples_s.len() == 3 && t.reps == 1));
        assert_eq!(
            last_in_turns(&m, 3),
            Some(1),
            "the last round, cab, ends with b"
        );
        assert_eq!(last_in_turns(&m, 0), None);
        // An op's error ends the measurement and comes back as it was, with the op's index:
        // the shared count is 1, 2 after the warm-up round, 3, 4 at calibration: the second op
        // fails there.
        let mut calls = 0;
        let mut fine = |k: &mut i32, n: u64| {
            *k += n as i32;
            Ok(())
        };
        let mut fails_at_four = |k: &mut i32, n: u64| {
            *k += n as i32;
            if *k >= 4 {
                Err("fourth call")
            } else {
                Ok(())
            }
        };
        let e = measure_interleaved(&m, &mut calls, &mut [&mut fine, &mut fails_at_four]);
        assert_eq!((e.unwrap_err(), calls), ((1, "fourth call"), 4));
    }

    /// A sample of several calls follows one untimed call of the same op: `a`'s sample of R
    /// calls is `a` R + 1 times in a row, after `b`'s.
    #[test]
    fn measure_interleaved_settles_a_sample_of_several_calls_with_its_own_op() {
        let m = Method {
            warmup: 1,
            samples: 2,
            // Far above one call: the most calls per sample (1e6).
            min_sample_s: 10.0,
        };
        let (mut a, mut b) = (pusher('a'), pusher('b'));
        let mut order = String::new();
        let t = measure_interleaved(&m, &mut order, &mut [&mut a, &mut b]).unwrap();
        let r = 1_000_000;
        assert!(t.iter().all(|t| t.reps == r && t.samples_s.len() == 2));
        // Warm-up ab, calibration ab, then the rounds ab, ba: each sample R + 1 calls.
        let run = |ch: char| ch.to_string().repeat(r as usize + 1);
        let want = format!("abab{}{}{}{}", run('a'), run('b'), run('b'), run('a'));
        assert!(
            order == want,
            "calls out of order ({} of them)",
            order.len()
        );
    }

    #[test]
    fn measure_with_uses_the_reported_times() {
        let mut n = 0u32;
        let m = Method {
            warmup: 2,
            samples: 3,
            min_sample_s: 1e-3,
        };
        // Each call reports 0.4 ms: 3 calls per sample reach 1 ms; the sample is their mean.
        let t = measure_with(&m, || {
            n += 1;
            Ok::<f64, ()>(4e-4)
        })
        .unwrap();
        assert_eq!((t.reps, t.samples_s.len(), n), (3, 3, 2 + 1 + 9));
        assert!((t.median_s - 4e-4).abs() < 1e-12 && (t.max_s - 4e-4).abs() < 1e-12);
        let e = measure_with(&m, || Err::<f64, &str>("stop")).unwrap_err();
        assert_eq!(e, "stop");
    }
}
