//! Tests across GPUs (and the one-GPU copy-engine/SM split), each next to the plain baseline in
//! the same run:
//!
//! - `multi-peer`: every ordered pair of GPUs, one direction (one row per pair, named
//!   `multi-peer[a->b]`): ferry's engine on GPU a vs raw `cuMemcpyPeerAsync`.
//! - `multi-peer-bidir`: both directions of each pair at once (`multi-peer-bidir[a<->b]`),
//!   through ferry's multiplex engine over every GPU vs raw `cuMemcpyPeerAsync` on each source
//!   GPU's stream, issued together.
//! - `multi-peer-all`: every ordered pair at once, payload summed.
//! - `multi-h2d-striped` / `multi-d2h-striped`: pinned host memory to (from) every GPU, `size`
//!   bytes per GPU, striped by [`MultiGpu`] vs the sum of each GPU's raw
//!   `cuMemcpyHtoDAsync`/`DtoH` rate measured alone (computed per sample: total bytes over the
//!   summed rates).
//! - `multi-nccl` (`multi-nccl-blocking`: a blocking communicator): NCCL send GPU 0 -> GPU 1,
//!   two ranks on two threads of this process, through ferry's
//!   [`NcclEngine`](ferry::engine::nccl::NcclEngine) vs NCCL's own `ncclSend`/`ncclRecv` on a
//!   blocking communicator ([`RawNccl`](ferry_bench::RawNccl)). A timed call: rank 0 signals
//!   rank 1, both post, rank 0 waits for its send and rank 1's acknowledgement (the same for
//!   both series); see `multi/nccl.rs`.
//! - `cuda-d2d-split`: device to device on GPU 0 with [`CudaConfig::d2d_sm_share`] percent
//!   (`FERRY_D2D_SM_SHARE`, default 50) done by an SM kernel, vs raw `cuMemcpyDtoDAsync` and
//!   the kernel alone.
//!
//! Destinations are poisoned before each series and compared with the source after it.

mod nccl;

use super::ctx::{env_number, flat, setup, Ctx};
use super::cuda::batch;
use super::data::pattern;
use super::{measure, BenchError, Kind, Method, Needs, Role, Row, Series, TestInfo, Timing};
use crate::sizes::format_size;
use ferry::cuda::multi::MultiGpu;
use ferry::cuda::split::SmCopy;
use ferry::cuda::StagingConfig;
use ferry::cuda::{CudaConfig, CudaEngine, DeviceBuffer, Direction, PinnedBuffer, WaitMode};
use ferry::{Engine, EngineExt};
use ferry_bench::RawCopier;

/// The tests of this file.
pub static TESTS: &[TestInfo] = &[
    TestInfo::new("multi-peer", "peer copy GPU a -> GPU b, every ordered pair (rows multi-peer[a->b]), ferry's engine on GPU a vs raw cuMemcpyPeerAsync", Needs::Cuda2, Kind::Bandwidth, "1M,16M,256M"),
    TestInfo::new("multi-peer-bidir", "both directions of each pair of GPUs at once (rows multi-peer-bidir[a<->b]), ferry multiplex vs raw cuMemcpyPeerAsync on both GPUs' streams, payload both ways", Needs::Cuda2, Kind::Bandwidth, "16M,256M"),
    TestInfo::new("multi-peer-all", "every ordered pair of GPUs at once, ferry multiplex vs raw cuMemcpyPeerAsync, payload summed", Needs::Cuda2, Kind::Bandwidth, "16M,256M"),
    TestInfo::new("multi-h2d-striped", "pinned host -> every GPU (size per GPU) striped over all links by MultiGpu, vs the sum of each GPU's raw cuMemcpyHtoDAsync rate alone", Needs::Cuda2, Kind::Bandwidth, "16M,256M"),
    TestInfo::new("multi-d2h-striped", "every GPU -> pinned host (size per GPU) striped by MultiGpu, vs the sum of each GPU's raw cuMemcpyDtoHAsync rate alone", Needs::Cuda2, Kind::Bandwidth, "16M,256M"),
    TestInfo::new("multi-nccl", "NCCL send GPU 0 -> GPU 1 (two ranks, one thread each): ferry's NcclEngine vs NCCL's own ncclSend/ncclRecv", Needs::Nccl2, Kind::Bandwidth, "1M,16M,256M"),
    TestInfo::new("multi-nccl-blocking", "as multi-nccl with NcclConfig::blocking(true) (no NCCL thread per group; joining cannot time out)", Needs::Nccl2, Kind::Bandwidth, "1M,16M,256M"),
    TestInfo::new("cuda-d2d-split", "device -> device on GPU 0 split between a copy engine and an SM kernel (FERRY_D2D_SM_SHARE percent, default 50), vs raw cuMemcpyDtoDAsync and the SM kernel alone", Needs::Cuda, Kind::Bandwidth, "16M,256M,1G"),
];

/// Whether the NCCL test can run: two GPUs and the NCCL library.
pub fn available_nccl() -> Result<(), String> {
    super::cuda::available_two()?;
    ferry::engine::nccl::probe().library.map(drop)
}

/// GPU `g`'s engine settings here: spin waits, the staging tuned by `FERRY_STAGING_*`.
fn spin_config(g: u32, staging: StagingConfig) -> CudaConfig {
    CudaConfig::new(g)
        .wait_mode(WaitMode::Spin)
        .staging(Some(staging))
}

fn poison(d: &mut DeviceBuffer) -> Result<(), String> {
    let n = d.len();
    d.copy_from_host(&vec![0xA5; n]).map_err(|e| e.to_string())
}

/// The multi-GPU side of a bench run: one spin-waiting engine and one raw copier per GPU.
pub struct MultiBench {
    method: Method,
    engines: Vec<CudaEngine>,
    raw: Vec<RawCopier>,
    gpus: Option<MultiGpu>,
}

impl MultiBench {
    /// Engines and raw copiers on every GPU (spin waits, as the raw side's synchronize spins).
    pub fn new(method: Method) -> Result<MultiBench, BenchError> {
        let n = ferry::cuda::probe().devices.len() as u32;
        let staging = StagingConfig::from_env().map_err(setup)?;
        let cfg = |g| spin_config(g, staging);
        let engines = (0..n)
            .map(|g| CudaEngine::with_config(cfg(g)).map_err(setup))
            .collect::<Result<Vec<_>, _>>()?;
        let raw = (0..n)
            .map(|g| RawCopier::new(g).map_err(setup))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MultiBench {
            method,
            engines,
            raw,
            gpus: None,
        })
    }

    /// The multiplex engine over every GPU, made on first use.
    fn gpus(&mut self) -> Result<&MultiGpu, BenchError> {
        if self.gpus.is_none() {
            let staging = StagingConfig::from_env().map_err(setup)?;
            let g = MultiGpu::with_configs(|g| spin_config(g, staging)).map_err(setup)?;
            self.gpus = Some(g);
        }
        self.gpus.as_ref().ok_or_else(|| setup("no GPUs"))
    }

    fn gpus_ready(&self) -> Result<&MultiGpu, BenchError> {
        self.gpus.as_ref().ok_or_else(|| setup("no GPUs"))
    }

    fn pairs(&self) -> Vec<(u32, u32)> {
        let n = self.engines.len() as u32;
        (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .collect()
    }

    /// Runs one test at one size; matrix tests return one row per pair.
    pub fn run(&mut self, test: &TestInfo, size: u64) -> Result<Vec<Row>, BenchError> {
        let ctx = Ctx::new(test, size);
        let size = usize::try_from(size).map_err(|_| ctx.bad("larger than the address space"))?;
        if size == 0 {
            return Err(ctx.bad("zero bytes"));
        }
        match test.name {
            "multi-peer" => self
                .pairs()
                .into_iter()
                .map(|(a, b)| self.peer_one_way(&ctx, size, a, b))
                .collect(),
            "multi-peer-bidir" => {
                let pairs: Vec<(u32, u32)> =
                    self.pairs().into_iter().filter(|(a, b)| a < b).collect();
                let mut rows = vec![];
                for (a, b) in pairs {
                    rows.push(self.peer_many(&ctx, size, &[(a, b), (b, a)])?);
                }
                Ok(rows)
            }
            "multi-peer-all" => {
                let pairs = self.pairs();
                Ok(vec![self.peer_many(&ctx, size, &pairs)?])
            }
            "multi-h2d-striped" => Ok(vec![self.striped(&ctx, size, true)?]),
            "multi-d2h-striped" => Ok(vec![self.striped(&ctx, size, false)?]),
            "multi-nccl" => Ok(vec![nccl::nccl(&ctx, &self.method, size, false)?]),
            "multi-nccl-blocking" => Ok(vec![nccl::nccl(&ctx, &self.method, size, true)?]),
            "cuda-d2d-split" => Ok(vec![self.d2d_split(&ctx, size)?]),
            _ => Err(BenchError::UnknownTest {
                name: test.name.into(),
                valid: TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    fn peer_one_way(&self, ctx: &Ctx, size: usize, a: u32, b: u32) -> Result<Row, BenchError> {
        let batch = batch(size);
        let data = pattern(size, (a * 64 + b) as u64);
        let src = DeviceBuffer::from_host(a, &data).map_err(setup)?;
        let mut dsts = (0..batch)
            .map(|_| DeviceBuffer::new(b, size).map_err(setup))
            .collect::<Result<Vec<_>, _>>()?;
        let payload = (size * batch) as u64;
        let check = |ds: &[DeviceBuffer]| ds.iter().all(|d| d.to_vec().is_ok_and(|v| v == data));
        let e = &self.engines[a as usize];
        let f = ctx.series(
            &format!("ferry {} spin", e.name()),
            Role::Ferry,
            payload,
            || {
                dsts.iter_mut().try_for_each(poison)?;
                let t = measure(&self.method, || {
                    flat(e.scope(|s| {
                        dsts.iter_mut().try_for_each(|d| {
                            s.memcpy(d, &src).map(drop).map_err(ferry::Error::from)
                        })
                    }))
                })?;
                Ok((t, check(&dsts)))
            },
        )?;
        let raw = &self.raw[a as usize];
        let r = ctx.series("raw cuMemcpyPeerAsync", Role::Baseline, payload, || {
            dsts.iter_mut().try_for_each(poison)?;
            let t = measure(&self.method, || {
                let mut jobs: Vec<(&RawCopier, &mut DeviceBuffer, &DeviceBuffer)> =
                    dsts.iter_mut().map(|d| (raw, d, &src)).collect();
                RawCopier::peer_all(&mut jobs, size, 1).map_err(|e| e.to_string())
            })?;
            Ok((t, check(&dsts)))
        })?;
        let mut row = Row::new(
            ctx.test,
            Kind::Bandwidth,
            size as u64,
            payload,
            format!("device {a} -> device {b}"),
            vec![f, r],
        );
        row.test = format!("{}[{a}->{b}]", ctx.test);
        Ok(row)
    }

    /// Copies for every `(from, to)` pair at once; payload summed.
    fn peer_many(
        &mut self,
        ctx: &Ctx,
        size: usize,
        pairs: &[(u32, u32)],
    ) -> Result<Row, BenchError> {
        let datas: Vec<Vec<u8>> = pairs
            .iter()
            .map(|&(a, b)| pattern(size, 1000 + (a * 64 + b) as u64))
            .collect();
        let srcs = pairs
            .iter()
            .zip(&datas)
            .map(|(&(a, _), d)| DeviceBuffer::from_host(a, d).map_err(setup))
            .collect::<Result<Vec<_>, _>>()?;
        let mut dsts = pairs
            .iter()
            .map(|&(_, b)| DeviceBuffer::new(b, size).map_err(setup))
            .collect::<Result<Vec<_>, _>>()?;
        let payload = (size * pairs.len()) as u64;
        let check = |ds: &[DeviceBuffer]| {
            ds.iter()
                .zip(&datas)
                .all(|(d, want)| d.to_vec().is_ok_and(|v| &v == want))
        };
        let method = self.method.clone();
        self.gpus()?;
        let mux = self.gpus_ready()?.engine();
        let f = ctx.series(
            &format!("ferry {}", mux.name()),
            Role::Ferry,
            payload,
            || {
                dsts.iter_mut().try_for_each(poison)?;
                let t = measure(&method, || {
                    flat(mux.scope(|s| {
                        dsts.iter_mut().zip(&srcs).try_for_each(|(d, src)| {
                            s.memcpy(d, src).map(drop).map_err(ferry::Error::from)
                        })
                    }))
                })?;
                Ok((t, check(&dsts)))
            },
        )?;
        let raw = &self.raw;
        let r = ctx.series(
            "raw cuMemcpyPeerAsync, all issued then synchronized",
            Role::Baseline,
            payload,
            || {
                dsts.iter_mut().try_for_each(poison)?;
                let t = measure(&method, || {
                    let mut jobs: Vec<(&RawCopier, &mut DeviceBuffer, &DeviceBuffer)> = dsts
                        .iter_mut()
                        .zip(&srcs)
                        .zip(pairs)
                        .map(|((d, s), &(a, _))| (&raw[a as usize], d, s))
                        .collect();
                    RawCopier::peer_all(&mut jobs, size, 1).map_err(|e| e.to_string())
                })?;
                Ok((t, check(&dsts)))
            },
        )?;
        let shape = pairs
            .iter()
            .map(|(a, b)| format!("{a}->{b}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut row = Row::new(
            ctx.test,
            Kind::Bandwidth,
            size as u64,
            payload,
            format!("at once: {shape}"),
            vec![f, r],
        );
        if let [(a, b), (c, d)] = pairs {
            if (a, b) == (d, c) {
                row.test = format!("{}[{a}<->{b}]", ctx.test);
            }
        }
        Ok(row)
    }

    /// Host <-> every GPU, `size` bytes per GPU.
    fn striped(&mut self, ctx: &Ctx, size: usize, h2d: bool) -> Result<Row, BenchError> {
        let n = self.engines.len();
        let total = size * n;
        let data = pattern(total, 77);
        let mut host = PinnedBuffer::new(total).map_err(setup)?;
        host.copy_from_slice(&data);
        let mut parts = (0..n as u32)
            .map(|g| {
                DeviceBuffer::from_host(g, &data[g as usize * size..(g as usize + 1) * size])
                    .map_err(setup)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let payload = total as u64;
        let method = self.method.clone();
        self.gpus()?;
        let gpus = self.gpus_ready()?;
        let name = format!("ferry MultiGpu x{n}");
        let f = if h2d {
            ctx.series(&name, Role::Ferry, payload, || {
                parts.iter_mut().try_for_each(poison)?;
                let t = measure(&method, || {
                    gpus.scatter(&mut parts, &host).map_err(|e| e.to_string())
                })?;
                let ok = parts.iter().enumerate().all(|(g, p)| {
                    p.to_vec()
                        .is_ok_and(|v| v[..] == data[g * size..(g + 1) * size])
                });
                Ok((t, ok))
            })?
        } else {
            ctx.series(&name, Role::Ferry, payload, || {
                host.fill(0xA5);
                let t = measure(&method, || {
                    gpus.gather(&mut host, &parts).map_err(|e| e.to_string())
                })?;
                Ok((t, host[..] == data[..]))
            })?
        };
        // Each GPU alone, raw; then the sum of their rates.
        let mut alone = Vec::with_capacity(n);
        for g in 0..n {
            let raw = &self.raw[g];
            let part = &mut parts[g];
            let want = &data[g * size..(g + 1) * size];
            let name = format!("raw GPU {g} alone");
            let s = if h2d {
                let mut src = PinnedBuffer::new(size).map_err(setup)?;
                src.copy_from_slice(want);
                ctx.series(&name, Role::Baseline, size as u64, || {
                    poison(part)?;
                    let t = measure(&method, || {
                        raw.copy(part, &src, size, 1).map_err(|e| e.to_string())
                    })?;
                    Ok((t, part.to_vec().is_ok_and(|v| v == want)))
                })?
            } else {
                let mut dst = PinnedBuffer::new(size).map_err(setup)?;
                ctx.series(&name, Role::Baseline, size as u64, || {
                    dst.fill(0xA5);
                    let t = measure(&method, || {
                        raw.copy(&mut dst, &*part, size, 1)
                            .map_err(|e| e.to_string())
                    })?;
                    Ok((t, dst[..] == want[..]))
                })?
            };
            alone.push(s);
        }
        let sum = summed(&alone, size as u64, payload);
        let call = if h2d {
            "cuMemcpyHtoDAsync"
        } else {
            "cuMemcpyDtoHAsync"
        };
        let sum = Series::new(
            format!("sum of {n} single-GPU raw {call} rates (computed)"),
            Role::Baseline,
            Kind::Bandwidth,
            payload,
            sum,
        );
        // The single-GPU series stay in the row (each below the sum, so never the better
        // baseline).
        let mut series = vec![f, sum];
        series.extend(alone);
        let dir = if h2d {
            "pinned -> every GPU"
        } else {
            "every GPU -> pinned"
        };
        Ok(Row::new(
            ctx.test,
            Kind::Bandwidth,
            size as u64,
            payload,
            format!("{dir}, {} per GPU", format_size(size as u64)),
            series,
        ))
    }

    fn d2d_split(&self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let share: u8 = env_number(
            "FERRY_D2D_SM_SHARE",
            "a percentage (0..=255, capped at 100)",
        )?
        .unwrap_or(50);
        let staging = StagingConfig::from_env().map_err(setup)?;
        let e =
            CudaEngine::with_config(spin_config(0, staging).d2d_sm_share(share)).map_err(setup)?;
        let data = pattern(size, 5);
        let src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
        let mut dst = DeviceBuffer::new(0, size).map_err(setup)?;
        let payload = size as u64;
        let m = &self.method;
        let check = |d: &DeviceBuffer| d.to_vec().is_ok_and(|v| v == data);
        let f = ctx.series(
            &format!("ferry {} spin, {share}% on SMs", e.name()),
            Role::Ferry,
            payload,
            || {
                poison(&mut dst)?;
                let t = measure(m, || {
                    flat(e.scope(|s| {
                        s.memcpy(&mut dst, &src)
                            .map(drop)
                            .map_err(ferry::Error::from)
                    }))
                })?;
                Ok((t, check(&dst)))
            },
        )?;
        let r = ctx.series("raw cuMemcpyDtoDAsync", Role::Baseline, payload, || {
            poison(&mut dst)?;
            let t = measure(m, || {
                self.raw[0]
                    .copy(&mut dst, &src, size, 1)
                    .map_err(|e| e.to_string())
            })?;
            Ok((t, check(&dst)))
        })?;
        let stream = e.stream(Direction::DeviceToDevice);
        let sm = SmCopy::new(stream.context().clone()).map_err(setup)?;
        let side = stream
            .context()
            .new_stream()
            .map_err(|e| setup(format!("cuStreamCreate: {e:?}")))?;
        let k = ctx.series("SM copy kernel alone", Role::Baseline, payload, || {
            poison(&mut dst)?;
            let t = measure(m, || {
                sm.copy(&side, &mut dst, &src, size, 1)
                    .map_err(|e| e.to_string())
            })?;
            Ok((t, check(&dst)))
        })?;
        Ok(Row::new(
            ctx.test,
            Kind::Bandwidth,
            size as u64,
            payload,
            "device -> device (GPU 0)".into(),
            vec![f, r, k],
        ))
    }
}

/// A timing whose per-call time is the total payload over the summed rates of the single-GPU
/// series, each moving `per_gpu` bytes per call (sample by sample; min and max from the best
/// and worst rates).
fn summed(alone: &[Series], per_gpu: u64, payload: u64) -> Timing {
    let k = alone
        .iter()
        .map(|s| s.timing.samples_s.len())
        .min()
        .unwrap_or(0);
    let over = |f: &dyn Fn(&Timing) -> f64| {
        let rate: f64 = alone.iter().map(|s| per_gpu as f64 / f(&s.timing)).sum();
        payload as f64 / rate
    };
    Timing {
        reps: alone.iter().map(|s| s.timing.reps).min().unwrap_or(1),
        median_s: over(&|t| t.median_s),
        min_s: over(&|t| t.min_s),
        max_s: over(&|t| t.max_s),
        samples_s: (0..k).map(|i| over(&|t| t.samples_s[i])).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(s: &[f64]) -> Timing {
        let mut v = s.to_vec();
        v.sort_by(f64::total_cmp);
        Timing {
            samples_s: s.to_vec(),
            reps: 1,
            median_s: v[v.len() / 2],
            min_s: v[0],
            max_s: v[v.len() - 1],
        }
    }

    #[test]
    fn sum_of_rates_is_total_over_summed_rates() {
        // GPU 0: 1 GB in 0.1 s (10 GB/s); GPU 1: 1 GB in 0.05 s (20 GB/s).
        let gb = 1_000_000_000u64;
        let a = Series::new(
            "a",
            Role::Baseline,
            Kind::Bandwidth,
            gb,
            timing(&[0.1, 0.1, 0.2]),
        );
        let b = Series::new(
            "b",
            Role::Baseline,
            Kind::Bandwidth,
            gb,
            timing(&[0.05, 0.05, 0.1]),
        );
        let t = summed(&[a, b], gb, 2 * gb);
        let s = Series::new("sum", Role::Baseline, Kind::Bandwidth, 2 * gb, t);
        assert!((s.median - 30.0).abs() < 1e-9, "{}", s.median);
        assert!((s.worst - 15.0).abs() < 1e-9, "{}", s.worst);
        assert_eq!(s.timing.samples_s.len(), 3);
    }

    #[test]
    fn registry_names_are_unique() {
        let all = super::super::registry();
        for t in TESTS {
            assert_eq!(
                all.iter().filter(|x| x.name == t.name).count(),
                1,
                "{}",
                t.name
            );
        }
    }
}
