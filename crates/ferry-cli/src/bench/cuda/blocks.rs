//! `cuda-blocks-h2d`, `cuda-blocks-d2h`, `cuda-blocks-d2d` and `cuda-blocks-busy` (issue 34):
//! block copies of a KV cache's shape (size = one block; one row per block count: 16, 256 and
//! 4,096 blocks, those of at most 1 GiB in all) between a pinned host table and a device table,
//! or two device tables, the mapping a permutation of the blocks.
//!
//! The bandwidth rows time one block copy per call on the host clock (submit + wait, the caller's
//! view): ferry's block copy (`Op::Blocks`) on an engine of the row's own with the default
//! settings, the SMs free (the default route), the same on one that waits with `WaitMode::Spin` (no
//! completion word: the driver's own spin), and on one with the SMs busy
//! (`CudaConfig::compute_busy`: the batched DMA), and as one `enqueue` per block and one `flush` on
//! two more engines of the same two settings (the copies held until the flush, then one list: the
//! gather kernel where the block copy's route would take it, else one batched copy:
//! `completion/mark.rs`; engines apart from the block copy's, so that each series pays for its own
//! requests: the 4,096 of a held batch are let go on the engine's next submit, ~0.3 ms), next to
//! the three mechanisms run bare on a stream of their own through the gatherer with a fixed strategy and one synchronize: the driver's batched copy
//! (`cuMemcpyBatchAsync`, batches of 4,096, `PREFER_OVERLAP_WITH_COMPUTE`), one `cuMemcpyAsync` per
//! block, and ferry's SM gather kernel. Each series also carries its process CPU time per GB, and
//! the row's shape the submit cost alone (the time until the submitting call returns, the best of
//! the samples) of ferry's default and busy routes, the bare gather kernel and one `cuMemcpyAsync`
//! per block, and of `Op::lower` alone (the mapping's check and segment list), and each series'
//! minor page faults a call (the process's, from `getrusage`: memory a call allocates anew and
//! touches, where the allocator gave it back between calls).
//!
//! `cuda-blocks-busy` (host -> device, the largest count that fits) is the interference row:
//! a compute kernel (an FMA loop over every SM, NVRTC, about 20 ms alone) runs on a stream of
//! its own while the blocks move; each series is the time until both are done (us), and the
//! shape names the kernel's own time (CUDA events around it) beside each mechanism against
//! its time alone: the slowdown the copy costs the user's compute.

use super::CudaBench;
use crate::bench::ctx::{setup, Ctx};
use crate::bench::data::pattern_bytes;
use crate::bench::{
    last_in_turns, measure_interleaved, BenchError, Calls, Kind, Role, Row, Series, Timing,
};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer, WaitMode};
use ferry::engine::cuda::gather::{Gatherer, Strategy};
use ferry::{EngineExt, Memory, MemoryMut, Op, Segment};
use std::sync::Arc;
use std::time::Instant;

/// Block counts of the rows.
const COUNTS: [usize; 3] = [16, 256, 4096];
/// The most bytes one table holds in a row.
const MAX_TABLE: usize = 1 << 30;

/// Which tables a row copies between.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// Pinned host table -> device table.
    H2d,
    /// Device table -> pinned host table.
    D2h,
    /// Device table -> device table.
    D2d,
}

/// A table of either kind.
enum Table {
    Host(PinnedBuffer),
    Dev(DeviceBuffer),
}

impl Table {
    fn new(host: bool, bytes: &[u8]) -> Result<Table, String> {
        Ok(if host {
            let mut p = PinnedBuffer::new(bytes.len()).map_err(|e| e.to_string())?;
            p.copy_from_slice(bytes);
            Table::Host(p)
        } else {
            Table::Dev(DeviceBuffer::from_host(0, bytes).map_err(|e| e.to_string())?)
        })
    }
    fn read(&self) -> Result<Vec<u8>, String> {
        match self {
            Table::Host(p) => Ok(p.to_vec()),
            Table::Dev(d) => d.to_vec().map_err(|e| e.to_string()),
        }
    }
    fn poison(&mut self) -> Result<(), String> {
        let n = self.raw().len;
        match self {
            Table::Host(p) => p.fill(0xA5),
            Table::Dev(d) => d
                .copy_from_host(&vec![0xA5u8; n])
                .map_err(|e| e.to_string())?,
        }
        Ok(())
    }
}

// SAFETY: forwards to the wrapped buffer, which upholds the contract.
unsafe impl Memory for Table {
    fn raw(&self) -> ferry::RawBuf {
        match self {
            Table::Host(p) => p.raw(),
            Table::Dev(d) => d.raw(),
        }
    }
}
// SAFETY: forwards to the wrapped buffer, which upholds the contract.
unsafe impl MemoryMut for Table {
    fn raw_mut(&mut self) -> ferry::RawBuf {
        match self {
            Table::Host(p) => p.raw_mut(),
            Table::Dev(d) => d.raw_mut(),
        }
    }
}

/// One row's tables, mapping and the mechanisms' own stream and gatherer.
struct Setup {
    src: Table,
    dst: Table,
    map: Op,
    segs: Vec<Segment>,
    want: Vec<u8>,
    stream: Arc<CudaStream>,
    gather: Gatherer,
    /// The row's engine with the default settings (`WaitMode::Auto`): the default route's. The
    /// row's own, so that no stream an earlier test asked a shared engine for (handed to the
    /// caller: an event recorded per request, held copies issued one at a time) changes what
    /// these series measure.
    own: Arc<CudaEngine>,
    /// The same settings with `CudaConfig::compute_busy`.
    busy: Arc<CudaEngine>,
    /// The same settings with `WaitMode::Spin` (no stamp: the first wait of a batch
    /// synchronizes the stream, the others find it passed).
    spin: Arc<CudaEngine>,
    /// The held batches' engines, the default settings (the requests of one flush share one
    /// stamp, so their waits read a word) and `WaitMode::Spin`: apart from `own` and `spin`,
    /// because an engine lets a batch's 4,096 waited requests go on its next submit (the
    /// in-flight list's pruning, `request.rs`): on a shared engine, timed in turns, the block
    /// copy after a held batch paid for it (the tenth H100 run: 0.25 of the bare kernel at
    /// d2d 4,096 x 4 KiB, ~0.33 ms on the first call of each sample).
    held: Arc<CudaEngine>,
    held_spin: Arc<CudaEngine>,
}

impl Setup {
    fn new(bench: &CudaBench, way: Way, block: usize, count: usize) -> Result<Setup, String> {
        let data = pattern_bytes(count * block);
        // Block i of the source into block perm(i) of the destination (7919 is prime, above
        // every count, so this is a permutation with no two neighbours adjacent).
        let perm = |i: usize| ((i * 7919) % count) as u64;
        let pairs: Vec<(u64, u64)> = (0..count).map(|i| (i as u64, perm(i))).collect();
        let segs: Vec<Segment> = pairs
            .iter()
            .map(|&(s, d)| Segment::new(d * block as u64, s * block as u64, block as u64))
            .collect();
        let mut want = vec![0xA5u8; count * block];
        for s in &segs {
            let (d, o, n) = (s.dst_off as usize, s.src_off as usize, s.len as usize);
            want[d..d + n].copy_from_slice(&data[o..o + n]);
        }
        let src = Table::new(way == Way::H2d, &data)?;
        let dst = Table::new(way == Way::D2h, &want)?;
        let ctx = CudaContext::new(0).map_err(|e| e.to_string())?;
        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
        let gather = Gatherer::new(ctx).map_err(|e| e.to_string())?;
        let engine = |cfg| {
            CudaEngine::with_config(cfg)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        };
        let own = engine(bench.engine.config())?;
        let busy = engine(bench.engine.config().compute_busy(true))?;
        let spin = engine(bench.engine.config().wait_mode(WaitMode::Spin))?;
        let held = engine(bench.engine.config())?;
        let held_spin = engine(bench.engine.config().wait_mode(WaitMode::Spin))?;
        Ok(Setup {
            src,
            dst,
            map: Op::blocks(block, pairs),
            segs,
            want,
            stream,
            gather,
            own,
            busy,
            spin,
            held,
            held_spin,
        })
    }

    /// One block copy through `engine`, submitted and waited.
    fn ferry(&mut self, engine: &CudaEngine) -> Result<(), String> {
        let (dst, src, op) = (&mut self.dst, &self.src, self.map.clone());
        engine
            .scope(|s| {
                s.submit(dst, Some(src), op, &[])?
                    .wait()
                    .map_err(ferry::Error::from)
            })
            .map_err(|e| e.to_string())
    }

    /// One block copy by `strategy` on the setup's own stream, not waited.
    fn enqueue(&mut self, strategy: Strategy) -> Result<(), String> {
        let (d, s) = (self.dst.raw_mut(), self.src.raw());
        // SAFETY: both tables are this setup's, alive and untouched by anything else until the
        // stream is synchronized (every caller does before the next use); the segments lie
        // inside them (built from the mapping); this context's stream.
        unsafe {
            self.gather.copy(
                &self.stream,
                d.addr,
                d.len,
                s.addr,
                s.len,
                &self.segs,
                strategy,
            )
        }
        .map(drop)
        .map_err(|e| e.to_string())
    }

    /// One contiguous copy per block through `engine`'s `enqueue`, then one `flush` (the copies
    /// held until it and given to the GPU as one list: the gather kernel or one batched copy),
    /// every request waited.
    fn enqueued(&mut self, engine: Arc<CudaEngine>) -> Result<(), String> {
        let (d, s) = (self.dst.raw_mut(), self.src.raw());
        let mut reqs = Vec::with_capacity(self.segs.len());
        for seg in &self.segs {
            let at = |off: u64| {
                ferry::Layout::bytes(seg.len as usize)
                    .and_then(|l| l.with_offset(off as usize))
                    .map_err(|e| e.to_string())
            };
            let job = ferry::Job::copy(d, at(seg.dst_off)?, s, at(seg.src_off)?);
            // SAFETY: both tables are this setup's, alive and untouched by anything else until
            // every request is waited below (an early return drops them: each drop waits);
            // each block lies inside them (built from the mapping).
            reqs.push(unsafe { ferry::Engine::enqueue(&*engine, job) }.map_err(|e| e.to_string())?);
        }
        ferry::Engine::flush(&*engine);
        reqs.into_iter()
            .try_for_each(|r| r.wait())
            .map_err(|e| e.to_string())
    }

    /// The least time, over `samples` calls, until `how`'s submitting call returns (each call
    /// then waited, or for the lowering dropped).
    fn submit_alone(&mut self, how: &Submit, samples: usize) -> Result<f64, String> {
        let mut best = f64::INFINITY;
        for _ in 0..samples {
            let t0 = Instant::now();
            match how {
                Submit::Ferry(engine) => {
                    let (dst, src, op) = (&mut self.dst, &self.src, self.map.clone());
                    engine
                        .scope(|s| -> ferry::Result<()> {
                            let r = s.submit(dst, Some(src), op, &[])?;
                            best = best.min(t0.elapsed().as_secs_f64());
                            Ok(r.wait()?)
                        })
                        .map_err(|e| e.to_string())?;
                }
                Submit::Raw(strategy) => {
                    self.enqueue(*strategy)?;
                    best = best.min(t0.elapsed().as_secs_f64());
                    self.stream.synchronize().map_err(|e| e.to_string())?;
                }
                Submit::Lower => {
                    let (d, s) = (self.dst.raw().len, self.src.raw().len);
                    let program = self.map.lower(d, Some(s)).map_err(|e| e.to_string())?;
                    best = best.min(t0.elapsed().as_secs_f64());
                    drop(program);
                }
            }
        }
        Ok(best)
    }

    fn raw(&mut self, strategy: Strategy) -> Result<(), String> {
        self.enqueue(strategy)?;
        self.stream.synchronize().map_err(|e| e.to_string())
    }

    fn verify(&self) -> Result<bool, String> {
        Ok(self.dst.read()? == self.want)
    }
}

/// What [`Setup::submit_alone`] times.
enum Submit {
    /// Ferry's block copy through this engine: `scope` + `submit`.
    Ferry(Arc<CudaEngine>),
    /// The gatherer's mechanism, bare on the setup's stream.
    Raw(Strategy),
    /// `Op::lower` of the mapping for the row's tables.
    Lower,
}

/// CPU seconds of this process so far.
fn cpu_now() -> f64 {
    ferry_bench::cpu_time(ferry_bench::CpuOf::Process).map_or(f64::NAN, |d| d.as_secs_f64())
}

/// The mechanisms a row compares: name, role, and how one call runs.
type Mechanism = (
    &'static str,
    Role,
    fn(&mut Setup, &CudaBench) -> Result<(), String>,
);

const MECHANISMS: [Mechanism; 8] = [
    (
        "ferry block copy, SMs free (default route)",
        Role::Ferry,
        |s, _| {
            let own = Arc::clone(&s.own);
            s.ferry(&own)
        },
    ),
    (
        "ferry block copy, SMs free, WaitMode::Spin",
        Role::Ferry,
        |s, _| {
            let spin = Arc::clone(&s.spin);
            s.ferry(&spin)
        },
    ),
    (
        "ferry block copy, SMs busy (compute_busy)",
        Role::Ferry,
        |s, _| {
            let busy = Arc::clone(&s.busy);
            s.ferry(&busy)
        },
    ),
    (
        "ferry enqueue per block + flush (held batch)",
        Role::Ferry,
        |s, _| s.enqueued(Arc::clone(&s.held)),
    ),
    (
        "ferry enqueue per block + flush (held batch, WaitMode::Spin)",
        Role::Ferry,
        |s, _| s.enqueued(Arc::clone(&s.held_spin)),
    ),
    ("raw cuMemcpyBatchAsync", Role::Baseline, |s, _| {
        s.raw(Strategy::Batch)
    }),
    ("raw cuMemcpyAsync per block", Role::Baseline, |s, _| {
        s.raw(Strategy::PerSegment)
    }),
    ("ferry SM gather kernel (bare)", Role::Baseline, |s, _| {
        s.raw(Strategy::Kernel)
    }),
];

impl CudaBench {
    /// The bandwidth rows of one direction: one per block count.
    pub(super) fn blocks(&self, ctx: &Ctx, block: usize, way: Way) -> Result<Vec<Row>, BenchError> {
        if block == 0 {
            return Err(ctx.bad("zero-byte blocks"));
        }
        let mut rows = Vec::new();
        for count in COUNTS.into_iter().filter(|&c| c * block <= MAX_TABLE) {
            let mut st = Setup::new(self, way, block, count).map_err(setup)?;
            let payload = (count * block) as u64;
            let (series, faults) = self.mechanisms(ctx, &mut st, payload)?;
            let mut submit = Vec::new();
            // Submit cost alone: ferry's default and busy routes against the bare mechanisms
            // they run (the gather kernel, one call per block), and the lowering alone (the
            // mapping's check and its segment list: host work only ferry's calls do).
            for (what, how) in [
                ("ferry default route", Submit::Ferry(Arc::clone(&st.own))),
                ("ferry busy", Submit::Ferry(Arc::clone(&st.busy))),
                ("SM gather kernel (bare)", Submit::Raw(Strategy::Kernel)),
                ("cuMemcpyAsync per block", Submit::Raw(Strategy::PerSegment)),
                ("lowering alone", Submit::Lower),
            ] {
                match st.submit_alone(&how, self.method.samples.max(3)) {
                    Ok(best) => submit.push(format!("{what} {:.1} us", best * 1e6)),
                    // No NVRTC here: the bare kernel's figure is left out.
                    Err(e) if what.contains("kernel") => {
                        println!("  submit alone, {what}: skipped ({e})")
                    }
                    Err(e) => return Err(ctx.engine_err(what, e)),
                }
            }
            let dir = match way {
                Way::H2d => "pinned -> device",
                Way::D2h => "device -> pinned",
                Way::D2d => "device -> device",
            };
            let shape = format!(
                "{dir}, {count} blocks of {block} bytes (a permutation), one block copy per call; \
                 submit alone (best): {}; the process's minor page faults a call: {}",
                submit.join(", "),
                faults.join(", ")
            );
            let mut row = Row::new(
                ctx.test,
                Kind::Bandwidth,
                block as u64,
                payload,
                shape,
                series,
            );
            row.test = format!("{}[{count}]", ctx.test);
            if way != Way::D2d {
                row.link_limit_fraction = self
                    .link_gbps
                    .zip(row.ferry().map(|s| s.median))
                    .map(|(l, f)| f / l);
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// One row's bandwidth series and each one's minor page faults a call (`name n`). Each
    /// mechanism is checked first (the destination poisoned, one call, verified; the bare
    /// kernel left out where it cannot be made, a batch where the driver lacks it), then all
    /// are timed in turns ([`measure_interleaved`]), so that a drift of the GPU host during the
    /// row falls on ferry and the raw calls alike; each counts its calls, CPU time and faults.
    fn mechanisms(
        &self,
        ctx: &Ctx,
        st: &mut Setup,
        payload: u64,
    ) -> Result<(Vec<Series>, Vec<String>), BenchError> {
        let mut kept = Vec::new();
        for (name, role, run) in MECHANISMS {
            if name.contains("cuMemcpyBatchAsync") && !Gatherer::batch_supported() {
                println!("  {name}: skipped, the driver lacks cuMemcpyBatchAsync_v2");
                continue;
            }
            st.dst.poison().map_err(setup)?;
            match run(st, self) {
                Ok(()) => {}
                // The kernel cannot be made here (no NVRTC): the row goes on without it.
                Err(e) if name.contains("kernel") => {
                    println!("  {name}: skipped ({e})");
                    continue;
                }
                Err(e) => return Err(ctx.engine_err(name, e)),
            }
            if !st.verify().map_err(|e| ctx.engine_err(name, e))? {
                return Err(ctx.verify_err(name, 0));
            }
            kept.push((name, role, run));
        }
        // Per mechanism: calls, CPU seconds, minor faults (None where the count is unknown).
        let mut acct = vec![(0u64, 0f64, Some(0u64)); kept.len()];
        let mut ops: Vec<_> = kept
            .iter()
            .zip(acct.iter_mut())
            .map(|(&(_, _, run), a)| {
                move |st: &mut Setup, n: u64| -> Result<(), String> {
                    let (cpu0, faults0) = (cpu_now(), ferry_bench::minor_faults());
                    let r = (0..n).try_for_each(|_| run(st, self));
                    a.0 += n;
                    a.1 += cpu_now() - cpu0;
                    a.2 = match (a.2, faults0, ferry_bench::minor_faults()) {
                        (Some(sum), Some(f0), Some(f1)) => Some(sum + (f1 - f0)),
                        _ => None,
                    };
                    r
                }
            })
            .collect();
        let mut refs: Vec<&mut Calls<'_, Setup, String>> = ops
            .iter_mut()
            .map(|f| f as &mut Calls<'_, Setup, String>)
            .collect();
        let timings = measure_interleaved(&self.method, st, &mut refs);
        drop(refs);
        drop(ops);
        let timings = timings.map_err(|(k, e)| ctx.engine_err(kept[k].0, e))?;
        // The destination holds the last call's bytes (the last round's last mechanism).
        if let Some(k) = last_in_turns(&self.method, kept.len()) {
            if !st.verify().map_err(|e| ctx.engine_err(kept[k].0, e))? {
                return Err(ctx.verify_err(kept[k].0, 0));
            }
        }
        let mut faults = Vec::new();
        let series = kept
            .iter()
            .zip(timings)
            .zip(acct)
            .map(|((&(name, role, _), t), (calls, cpu, f))| {
                if let Some(f) = f {
                    faults.push(format!("{name} {:.1}", f as f64 / calls.max(1) as f64));
                }
                let cpu = cpu / (calls.max(1) as f64 * payload as f64 / 1e9);
                Series {
                    cpu_s_per_gb: Some(cpu),
                    ..Series::new(name, role, Kind::Bandwidth, payload, t)
                }
            })
            .collect();
        Ok((series, faults))
    }

    /// The interference row: time until a compute kernel and the block copy are both done.
    pub(super) fn blocks_busy(&self, ctx: &Ctx, block: usize) -> Result<Row, BenchError> {
        if block == 0 {
            return Err(ctx.bad("zero-byte blocks"));
        }
        let count = COUNTS
            .into_iter()
            .filter(|&c| c * block <= MAX_TABLE)
            .max()
            .ok_or_else(|| ctx.bad("a block above 64 MiB"))?;
        let mut st = Setup::new(self, Way::H2d, block, count).map_err(setup)?;
        let k = Compute::new().map_err(setup)?;
        let alone = k.calibrate(20e-3).map_err(setup)?;
        let payload = (count * block) as u64;
        let mut series = Vec::new();
        let mut slow = Vec::new();
        let samples = self.method.samples.max(3);
        for (name, role, run) in MECHANISMS {
            if name.contains("cuMemcpyBatchAsync") && !Gatherer::batch_supported() {
                continue;
            }
            let (mut both, mut kern) = (Vec::new(), Vec::new());
            let mut failed = None;
            for _ in 0..samples {
                st.dst.poison().map_err(setup)?;
                let t0 = Instant::now();
                k.launch().map_err(setup)?;
                if let Err(e) = run(&mut st, self) {
                    failed = Some(e);
                    let _ = k.finish();
                    break;
                }
                let kt = k.finish().map_err(setup)?;
                both.push(t0.elapsed().as_secs_f64());
                kern.push(kt);
            }
            match failed {
                Some(e) if name.contains("kernel") => {
                    println!("  {name}: skipped ({e})");
                    continue;
                }
                Some(e) => return Err(ctx.engine_err(name, e)),
                None => {}
            }
            if !st.verify().map_err(|e| ctx.engine_err(name, e))? {
                return Err(ctx.verify_err(name, 0));
            }
            kern.sort_by(f64::total_cmp);
            slow.push(format!("{name} {:.3}x", kern[kern.len() / 2] / alone));
            series.push(Series::new(
                name,
                role,
                Kind::Latency,
                payload,
                Timing::of(both, 1),
            ));
        }
        let shape = format!(
            "pinned -> device, {count} blocks of {block} bytes while an FMA kernel on every SM \
             runs on another stream ({:.2} ms alone); figures: until both are done; the \
             kernel's own time against alone: {}",
            alone * 1e3,
            slow.join(", ")
        );
        let mut row = Row::new(
            ctx.test,
            Kind::Latency,
            block as u64,
            payload,
            shape,
            series,
        );
        row.test = format!("{}[{count}]", ctx.test);
        Ok(row)
    }
}

/// A compute-bound kernel (independent FMA chains, every SM busy) on a stream of its own, its
/// time taken with CUDA events.
struct Compute {
    func: CudaFunction,
    stream: Arc<CudaStream>,
    out: cudarc::driver::CudaSlice<f32>,
    blocks: u32,
    iters: std::cell::Cell<i32>,
    start: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
}

const FMA_SRC: &str = r#"
extern "C" __global__ void ferry_bench_fma(float* out, int iters) {
    float a = threadIdx.x * 1e-3f, b = a + 1.0f, c = a + 2.0f, d = a + 3.0f;
    for (int i = 0; i < iters; i++) {
        a = a * 0.9999f + 1e-7f; b = b * 0.9999f + 1e-7f;
        c = c * 0.9999f + 1e-7f; d = d * 0.9999f + 1e-7f;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d;
}
"#;

impl Compute {
    fn new() -> Result<Compute, String> {
        let ptx = super::compile_kernel(FMA_SRC)?;
        let ctx = CudaContext::new(0).map_err(|e| e.to_string())?;
        let module = ctx.load_module(ptx).map_err(|e| e.to_string())?;
        let func = module
            .load_function("ferry_bench_fma")
            .map_err(|e| e.to_string())?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| e.to_string())? as u32;
        let blocks = sms * 8;
        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
        let out = stream
            .alloc_zeros::<f32>(blocks as usize * 256)
            .map_err(|e| e.to_string())?;
        let ev = || {
            ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| e.to_string())
        };
        Ok(Compute {
            func,
            stream,
            out,
            blocks,
            iters: std::cell::Cell::new(1 << 12),
            start: ev()?,
            end: ev()?,
        })
    }

    fn launch(&self) -> Result<(), String> {
        let cfg = LaunchConfig {
            grid_dim: (self.blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let iters = self.iters.get();
        self.start.record(&self.stream).map_err(|e| e.to_string())?;
        let mut l = self.stream.launch_builder(&self.func);
        l.arg(&self.out).arg(&iters);
        // SAFETY: the arguments match the kernel's signature (a float buffer of blocks * 256
        // elements, one per thread, and an int); the buffer lives as long as `self`.
        unsafe { l.launch(cfg) }.map_err(|e| e.to_string())?;
        self.end.record(&self.stream).map_err(|e| e.to_string())
    }

    /// Waits for the kernel; its time in seconds.
    fn finish(&self) -> Result<f64, String> {
        self.stream.synchronize().map_err(|e| e.to_string())?;
        Ok(self
            .start
            .elapsed_ms(&self.end)
            .map_err(|e| e.to_string())? as f64
            / 1e3)
    }

    /// Sets the iterations so that the kernel alone lasts about `target` seconds; returns its
    /// time alone (median of 5).
    fn calibrate(&self, target: f64) -> Result<f64, String> {
        self.launch()?;
        let t = self.finish()?;
        let scale = (target / t.max(1e-6)).clamp(1e-3, 1e4);
        self.iters
            .set(((self.iters.get() as f64 * scale) as i64).clamp(1, i32::MAX as i64) as i32);
        let mut ts = (0..5)
            .map(|_| self.launch().and_then(|()| self.finish()))
            .collect::<Result<Vec<_>, _>>()?;
        ts.sort_by(f64::total_cmp);
        Ok(ts[2])
    }
}
