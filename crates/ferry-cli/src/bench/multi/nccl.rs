//! `multi-nccl` and `multi-nccl-blocking`: NCCL send GPU 0 -> GPU 1, two ranks on two threads
//! of this process, ferry's [`NcclEngine`] next to NCCL's own calls ([`RawNccl`]).

use super::poison;
use crate::bench::ctx::{flat, setup, Ctx};
use crate::bench::data::pattern;
use crate::bench::{measure, BenchError, Kind, Method, Role, Row};
use ferry::cuda::DeviceBuffer;
use ferry::engine::nccl::{NcclConfig, NcclEngine, NcclId};
use ferry_bench::RawNccl;
use std::sync::mpsc;

/// What rank 1's thread is asked to do.
enum Cmd {
    Poison,
    Ferry,
    Raw,
    Check,
}

/// NCCL send 0 -> 1 on two threads: ferry's engine and NCCL's own calls.
pub(super) fn nccl(
    ctx: &Ctx,
    method: &Method,
    size: usize,
    blocking: bool,
) -> Result<Row, BenchError> {
    let data = pattern(size, 42);
    let id = NcclId::new().map_err(setup)?;
    let raw_id = NcclId::new().map_err(setup)?;
    let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
    let (ack_tx, ack_rx) = mpsc::channel::<Result<bool, String>>();
    let payload = size as u64;
    std::thread::scope(|sc| {
        let want = &data;
        // Rank 1: receives, on command.
        let peer = sc.spawn(move || -> Result<(), String> {
            let e = NcclEngine::new(NcclConfig::new(1, 1, 2, id).blocking(blocking))
                .map_err(|e| e.to_string())?;
            let mut raw = RawNccl::new(1, 1, 2, raw_id).map_err(|e| e.to_string())?;
            let mut dst = DeviceBuffer::new(1, size).map_err(|e| e.to_string())?;
            ack_tx.send(Ok(true)).map_err(|e| e.to_string())?;
            while let Ok(cmd) = cmd_rx.recv() {
                let r = match cmd {
                    Cmd::Poison => poison(&mut dst).map(|()| true),
                    Cmd::Ferry => flat(e.scope(|s| -> Result<(), ferry::Error> {
                        Ok(s.recv(&mut dst, size, 0)?.wait()?)
                    }))
                    .map(|()| true),
                    Cmd::Raw => raw
                        .exchange(None::<(&DeviceBuffer, u32)>, Some((&mut dst, 0)), size, 1)
                        .map(|()| true)
                        .map_err(|e| e.to_string()),
                    Cmd::Check => Ok(dst.to_vec().is_ok_and(|v| v == *want)),
                };
                let failed = r.is_err();
                ack_tx.send(r).map_err(|e| e.to_string())?;
                if failed {
                    break;
                }
            }
            Ok(())
        });
        // Rank 0 on this thread's scope: sends.
        let run = || -> Result<Row, BenchError> {
            let e =
                NcclEngine::new(NcclConfig::new(0, 0, 2, id).blocking(blocking)).map_err(setup)?;
            let mut raw = RawNccl::new(0, 0, 2, raw_id).map_err(setup)?;
            let src = DeviceBuffer::from_host(0, &data).map_err(setup)?;
            let ack = |rx: &mpsc::Receiver<Result<bool, String>>| -> Result<bool, String> {
                rx.recv().map_err(|_| "rank 1 stopped".to_string())?
            };
            ack(&ack_rx).map_err(setup)?;
            let ask = |c: Cmd| cmd_tx.send(c).map_err(|_| "rank 1 stopped".to_string());
            let mut series = vec![];
            for (name, role, ferry) in [
                (format!("ferry {} send", e.name()), Role::Ferry, true),
                (
                    "NCCL ncclSend/ncclRecv (blocking comm)".to_string(),
                    Role::Baseline,
                    false,
                ),
            ] {
                series.push(ctx.series(&name, role, payload, || {
                    ask(Cmd::Poison)?;
                    ack(&ack_rx)?;
                    let t = measure(method, || {
                        ask(if ferry { Cmd::Ferry } else { Cmd::Raw })?;
                        if ferry {
                            flat(e.scope(|s| -> Result<(), ferry::Error> {
                                Ok(s.send(&src, size, 1)?.wait()?)
                            }))?;
                        } else {
                            raw.exchange(
                                Some((&src, 1)),
                                None::<(&mut DeviceBuffer, u32)>,
                                size,
                                1,
                            )
                            .map_err(|e| e.to_string())?;
                        }
                        ack(&ack_rx).map(drop)
                    })?;
                    ask(Cmd::Check)?;
                    Ok((t, ack(&ack_rx)?))
                })?);
            }
            Ok(Row::new(
                ctx.test,
                Kind::Bandwidth,
                size as u64,
                payload,
                "device 0 -> device 1, NCCL ranks 0 and 1".into(),
                series,
            ))
        };
        let row = run();
        drop(cmd_tx);
        let peer = peer.join().map_err(|_| setup("rank 1's thread panicked"))?;
        match (row, peer) {
            (Ok(r), Ok(())) => Ok(r),
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(setup(format!("rank 1: {e}"))),
        }
    })
}
