//! Where the time of one small submit+wait goes: a 4 KiB pinned -> device copy waited at once,
//! done by raw driver calls in several shapes and by ferry's CUDA engine (spin wait), each
//! timed per call on the host clock. The variants run interleaved in rounds (a block of calls
//! of each in turn), so drift of the machine hits them alike; reported: median and 10th
//! percentile per variant, and the ratio of each median to the plain raw copy's.
//! Prints `skipped: no CUDA driver` without a GPU.
//!
//! Run: `cargo run --release --example cuda_latency_parts [BYTES]` (default 4096).

use cudarc::driver::{sys, CudaContext};
use ferry::cuda::{CudaConfig, CudaEngine, DeviceBuffer, Direction, PinnedBuffer, WaitMode};
use ferry::{Engine, EngineExt, Job, Layout, Memory, MemoryMut};
use std::time::Instant;

/// Rounds, and calls of each variant per round.
const ROUNDS: usize = 40;
const PER_ROUND: usize = 250;

fn ok(call: &str, r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{call} failed");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if ferry::cuda::probe().driver.is_err() {
        println!("skipped: no CUDA driver");
        return Ok(());
    }
    let bytes: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 4096,
    };
    let ctx = CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    let spin = CudaEngine::with_config(CudaConfig::new(0).wait_mode(WaitMode::Spin))?;
    let src = PinnedBuffer::new(bytes)?;
    let mut dev = DeviceBuffer::new(0, bytes)?;
    let l = Layout::bytes(bytes)?;
    let raw_stream = ctx.new_stream()?;
    let st = raw_stream.cu_stream();
    // The engine's own H2D stream, for the raw variants that share it.
    let est = spin.stream(Direction::HostToDevice).cu_stream();
    let mut ev = std::ptr::null_mut();
    // SAFETY: valid out-pointer, context current.
    ok("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    });
    // 64 events used in turn, as a pool of events cycles through requests kept alive.
    let ring: Vec<sys::CUevent> = (0..64)
        .map(|_| {
            let mut e = std::ptr::null_mut();
            // SAFETY: valid out-pointer, context current.
            ok("cuEventCreate", unsafe {
                sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            });
            e
        })
        .collect();
    let turn = std::cell::Cell::new(0usize);
    let (d, s) = (dev.raw_mut().addr, src.raw().addr);
    // The raw variants below are called with `st` or `est`, live streams of the current
    // context, and `ev`, a live event of it.
    // SAFETY: `dev` and `src` hold `bytes` bytes and outlive the waits that end each call.
    let copy = |stream| unsafe {
        ok(
            "cuMemcpyHtoDAsync",
            sys::cuMemcpyHtoDAsync_v2(d, s as *const _, bytes, stream),
        )
    };
    // SAFETY: a live stream of the current context.
    let stream_sync =
        |stream| unsafe { ok("cuStreamSynchronize", sys::cuStreamSynchronize(stream)) };
    // SAFETY: a live event and stream of the current context.
    let record = |stream| unsafe { ok("cuEventRecord", sys::cuEventRecord(ev, stream)) };
    // SAFETY: a live event of the current context.
    let event_sync = || unsafe { ok("cuEventSynchronize", sys::cuEventSynchronize(ev)) };
    let event_poll = || loop {
        // SAFETY: as above.
        match unsafe { sys::cuEventQuery(ev) } {
            sys::CUresult::CUDA_SUCCESS => break,
            sys::CUresult::CUDA_ERROR_NOT_READY => std::hint::spin_loop(),
            c => panic!("cuEventQuery: {c:?}"),
        }
    };
    let dst_raw = dev.raw_mut();
    let src_raw = src.raw();

    type Variant<'a> = (&'static str, Box<dyn FnMut() + 'a>);
    let mut variants: Vec<Variant> = vec![
        (
            "raw copy + cuStreamSynchronize",
            Box::new(|| {
                copy(st);
                stream_sync(st)
            }),
        ),
        (
            "raw copy on ferry's H2D stream + cuStreamSynchronize",
            Box::new(|| {
                copy(est);
                stream_sync(est)
            }),
        ),
        (
            "raw copy + cuEventRecord + cuEventSynchronize",
            Box::new(|| {
                copy(st);
                record(st);
                event_sync()
            }),
        ),
        (
            "raw copy + cuEventRecord + cuEventSynchronize, 64 events in turn",
            Box::new(|| {
                copy(st);
                let e = ring[turn.get() % ring.len()];
                turn.set(turn.get() + 1);
                // SAFETY: live events of this context and our stream.
                unsafe {
                    ok("cuEventRecord", sys::cuEventRecord(e, st));
                    ok("cuEventSynchronize", sys::cuEventSynchronize(e));
                }
            }),
        ),
        (
            "raw copy + cuEventRecord + cuStreamSynchronize",
            Box::new(|| {
                copy(st);
                record(st);
                stream_sync(st)
            }),
        ),
        (
            "raw copy + cuEventRecord + cuEventQuery loop",
            Box::new(|| {
                copy(st);
                record(st);
                event_poll()
            }),
        ),
        (
            "ferry submit_raw + wait (spin)",
            Box::new(|| {
                // SAFETY: `dev` and `src` outlive the wait below.
                let r = unsafe { spin.submit_raw(Job::copy(dst_raw, l, src_raw, l)) };
                r.expect("submit").wait().expect("wait");
            }),
        ),
        (
            "ferry scope + copy + wait (spin)",
            Box::new(|| {
                let (dd, ss) = (&mut dev, &src);
                spin.scope(|sc| sc.copy(dd, &l, ss, &l).expect("submit").wait())
                    .expect("scope")
                    .expect("wait");
            }),
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..ROUNDS + 1 {
        for (i, (_, f)) in variants.iter_mut().enumerate() {
            for _ in 0..PER_ROUND {
                let t = Instant::now();
                f();
                let e = t.elapsed().as_secs_f64() * 1e6;
                // Round 0 warms up every variant (event pool, caches).
                if round > 0 {
                    times[i].push(e);
                }
            }
        }
    }
    println!(
        "{bytes} B pinned -> device, submit+wait, us per call ({ROUNDS} rounds x {PER_ROUND} calls, interleaved):"
    );
    let mut base = None;
    for ((name, _), mut t) in variants.iter().zip(times) {
        t.sort_by(f64::total_cmp);
        let med = t[t.len() / 2];
        let p10 = t[t.len() / 10];
        let b = *base.get_or_insert(med);
        println!(
            "  {name:<66} median {med:7.3}  p10 {p10:7.3}  {:5.2}x",
            med / b
        );
    }
    drop(variants);
    // SAFETY: the event is idle (every variant waited) and destroyed once.
    ok("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(ev) });
    for e in ring {
        // SAFETY: idle events, each destroyed once.
        ok("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(e) });
    }
    Ok(())
}
