//! The NCCL engine on real GPUs: one process per GPU (this test binary runs itself again with
//! `FERRY_NCCL_TEST_RANK` and `FERRY_NCCL_TEST_ID_FILE` set; the id goes from rank 0 to rank 1
//! through that file), sends, receives and grouped exchanges with every byte checked, refused
//! bad input, and timeouts instead of hangs. Every child runs under a watchdog, so a hang fails
//! the test instead of stalling the run.
//!
//! Prints `skipped: no CUDA driver`, `skipped: null CUDA driver: ...`, `skipped: no NCCL
//! library` or `skipped: needs 2 GPUs` where the machine lacks what a test needs. Tests on one
//! rank (self exchange, bad input, a peer that never arrives) need one GPU.

mod cuda_common;
use cuda_common::{block_on, bytes, cuda_engine, skip_on_null_driver};
use ferry::cuda::DeviceBuffer;
use ferry::engine::nccl::{NcclConfig, NcclEngine, NcclError, NcclId};
use ferry::{EngineExt, RequestError};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const RANK_VAR: &str = "FERRY_NCCL_TEST_RANK";
const FILE_VAR: &str = "FERRY_NCCL_TEST_ID_FILE";
/// A child that takes longer than this is killed and the test fails.
const WATCHDOG: Duration = Duration::from_secs(180);

/// Why this machine cannot run a test needing `gpus` GPUs (printed), or `None`.
fn skip(gpus: usize) -> bool {
    let p = ferry::cuda::probe();
    if p.driver.is_err() {
        println!("skipped: no CUDA driver");
        return true;
    }
    if skip_on_null_driver("NCCL runs its own kernels through the CUDA runtime and driver") {
        return true;
    }
    if let Err(why) = ferry::engine::nccl::probe().library {
        println!("skipped: no NCCL library ({why})");
        return true;
    }
    if p.devices.len() < gpus {
        println!("skipped: needs {gpus} GPUs");
        return true;
    }
    false
}

/// In a child: `Some((rank, id file))`. In the parent: `None`.
fn child() -> Option<(u32, PathBuf)> {
    let rank = std::env::var(RANK_VAR).ok()?.parse().ok()?;
    Some((rank, PathBuf::from(std::env::var_os(FILE_VAR)?)))
}

/// Runs test `name` of this binary in `ranks` child processes (rank r on GPU r), each under the
/// watchdog, and fails unless every child passed. Prints each child's output.
fn spawn_ranks(name: &str, ranks: u32) {
    // One multi-process test at a time (the test harness runs tests on parallel threads): the
    // timeouts then measure NCCL, not contention between tests.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = std::env::temp_dir().join(format!(
        "ferry-nccl-{}-{}-{}",
        name,
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let id_file = dir.join("id");
    let exe = std::env::current_exe().unwrap();
    let mut kids = Vec::new();
    for r in 0..ranks {
        let log = dir.join(format!("rank{r}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        // `--include-ignored`: the child runs the test also where it is marked ignored (built
        // without the `gpu` feature, the parent run with `--ignored`).
        let child = Command::new(&exe)
            .args([
                name,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(RANK_VAR, r.to_string())
            .env(FILE_VAR, &id_file)
            .env("NCCL_NVLS_ENABLE", "0")
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        kids.push((r, child, log));
    }
    let start = Instant::now();
    let mut failed = Vec::new();
    for (r, mut c, log) in kids {
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break Some(s);
            }
            if start.elapsed() > WATCHDOG {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        println!("--- {name} rank {r} ({:?}) ---\n{text}", status);
        let passed = status.is_some_and(|s| s.success()) && text.contains("1 passed");
        if !passed {
            failed.push(match status {
                None => format!("rank {r} hung (killed after {WATCHDOG:?})"),
                Some(s) => format!("rank {r} failed ({s})"),
            });
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failed.is_empty(), "{name}: {}", failed.join("; "));
}

/// Rank `rank` on GPU `rank`: 120 s to join, `timeout` for each request.
fn engine(rank: u32, nranks: u32, id_file: &Path, timeout: Duration) -> NcclEngine {
    let id = NcclId::exchange_file(id_file, rank, Duration::from_secs(60)).unwrap();
    let cfg = NcclConfig::new(rank, rank, nranks, id)
        .init_timeout(Duration::from_secs(120))
        .op_timeout(timeout);
    NcclEngine::new(cfg).unwrap()
}

fn dev(rank: u32, n: usize, seed: u64) -> DeviceBuffer {
    DeviceBuffer::from_host(rank, &bytes(n, seed)).unwrap()
}

const SIZES: [usize; 6] = [0, 1, 4097, (1 << 20) + 3, 16 << 20, 256 << 20];

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn send_recv_every_byte() {
    let Some((rank, file)) = child() else {
        if !skip(2) {
            spawn_ranks("send_recv_every_byte", 2);
        }
        return;
    };
    let e = engine(rank, 2, &file, Duration::from_secs(120));
    let peer = 1 - rank;
    for (i, &n) in SIZES.iter().enumerate() {
        // One way, then the other; the receive buffer is larger, poisoned beyond `n`.
        for from in [0, 1] {
            let seed = 100 + 10 * i as u64 + from as u64;
            if rank == from {
                let src = dev(rank, n.max(1), seed);
                e.scope(|s| s.send(&src, n, peer)?.wait().map_err(ferry::Error::from))
                    .unwrap();
            } else {
                let poison = bytes(n + 4096, 7);
                let mut dst = DeviceBuffer::from_host(rank, &poison).unwrap();
                e.scope(|s| {
                    s.recv(&mut dst, n, peer)?
                        .wait()
                        .map_err(ferry::Error::from)
                })
                .unwrap();
                let got = dst.to_vec().unwrap();
                let want = bytes(n.max(1), seed);
                assert!(
                    got[..n] == want[..n],
                    "size {n} from rank {from}: payload differs"
                );
                assert!(
                    got[n..] == poison[n..],
                    "size {n}: bytes past the count were written"
                );
            }
        }
    }
    e.barrier().unwrap();
    println!("rank {rank}: {} sizes both ways verified", SIZES.len());
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn grouped_exchange_every_byte() {
    let Some((rank, file)) = child() else {
        if !skip(2) {
            spawn_ranks("grouped_exchange_every_byte", 2);
        }
        return;
    };
    let e = engine(rank, 2, &file, Duration::from_secs(120));
    let peer = 1 - rank;
    let n = 32 << 20;
    // Each rank: two sends to the peer, two receives from it, a send to itself and its
    // matching receive, all in one group; then the same as a future.
    let a = dev(rank, n, 1000 + rank as u64);
    let b = dev(rank, n / 2 + 1, 2000 + rank as u64);
    let me = dev(rank, n, 3000 + rank as u64);
    let mut ra = DeviceBuffer::zeroed(rank, n).unwrap();
    let mut rb = DeviceBuffer::zeroed(rank, n / 2 + 1).unwrap();
    let mut rme = DeviceBuffer::zeroed(rank, n).unwrap();
    for round in 0..3 {
        e.scope(|s| {
            let req = s.group(|g| {
                g.send(&a, n, peer);
                g.recv(&mut ra, n, peer);
                g.send(&b, n / 2 + 1, peer);
                g.recv(&mut rb, n / 2 + 1, peer);
                g.send(&me, n, rank);
                g.recv(&mut rme, n, rank);
            })?;
            if round == 2 {
                block_on(req).map_err(ferry::Error::from)
            } else {
                req.wait().map_err(ferry::Error::from)
            }
        })
        .unwrap();
        assert!(
            ra.to_vec().unwrap() == bytes(n, 1000 + peer as u64),
            "round {round}: a"
        );
        assert!(
            rb.to_vec().unwrap() == bytes(n / 2 + 1, 2000 + peer as u64),
            "round {round}: b"
        );
        assert!(
            rme.to_vec().unwrap() == bytes(n, 3000 + rank as u64),
            "round {round}: self"
        );
        for buf in [&mut ra, &mut rb, &mut rme] {
            let len = buf.len();
            buf.copy_from_host(&vec![0xA5; len]).unwrap();
        }
    }
    println!("rank {rank}: grouped exchange verified");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn self_exchange_one_rank() {
    if skip(1) {
        return;
    }
    // A blocking communicator, then the default non-blocking one (kept for the rest).
    let mut engine = None;
    for blocking in [true, false] {
        let id = NcclId::new().unwrap();
        let cfg = NcclConfig::new(0, 0, 1, id)
            .timeout(Duration::from_secs(60))
            .blocking(blocking);
        let e = NcclEngine::new(cfg).unwrap();
        for (i, &n) in SIZES.iter().enumerate() {
            let src = dev(0, n.max(1), 50 + i as u64);
            let mut dst = DeviceBuffer::zeroed(0, n.max(1)).unwrap();
            e.scope(|s| {
                s.group(|g| {
                    g.send(&src, n, 0);
                    g.recv(&mut dst, n, 0);
                })?
                .wait()
                .map_err(ferry::Error::from)
            })
            .unwrap();
            let got = dst.to_vec().unwrap();
            assert!(
                got[..n] == src.to_vec().unwrap()[..n],
                "size {n}, blocking {blocking}"
            );
        }
        engine = Some(e);
    }
    let e = engine.unwrap();
    // After a CUDA engine's copy (waited on the GPU), and after a failed request (not run).
    let cuda = cuda_engine(0).unwrap();
    let n = 8 << 20;
    let host = bytes(n, 61);
    let mut staged = DeviceBuffer::zeroed(0, n).unwrap();
    let src = dev(0, n, 62);
    let mut dst = DeviceBuffer::from_host(0, &vec![0xA5; n]).unwrap();
    cuda.scope(|cs| {
        let copy = cs.memcpy(&mut staged, &host)?;
        e.scope(|s| {
            s.group_after(&[&copy], |g| {
                g.send(&src, n, 0);
                g.recv(&mut dst, n, 0);
            })?
            .wait()
            .map_err(ferry::Error::from)
        })
    })
    .unwrap();
    assert_eq!(dst.to_vec().unwrap(), bytes(n, 62));
    assert_eq!(staged.to_vec().unwrap(), host);
    let mut untouched = DeviceBuffer::from_host(0, &vec![0xA5; n]).unwrap();
    let failed = ferry::Request::ready(Err(RequestError::Aborted("test".into())));
    let r = e
        .scope(|s| {
            Ok::<_, ferry::BarrierError>({
                s.group_after(&[&failed], |g| {
                    g.send(&src, n, 0);
                    g.recv(&mut untouched, n, 0);
                })
                .map(|req| req.wait())
            })
        })
        .unwrap()
        .unwrap();
    assert!(matches!(r, Err(RequestError::Dependency(_))), "{r:?}");
    assert!(untouched.to_vec().unwrap().iter().all(|&b| b == 0xA5));
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn bad_input_is_refused() {
    if skip(1) {
        return;
    }
    let id = NcclId::new().unwrap();
    let e = NcclEngine::new(NcclConfig::new(0, 0, 1, id).timeout(Duration::from_secs(60))).unwrap();
    let buf = dev(0, 4096, 1);
    let mut small = DeviceBuffer::zeroed(0, 100).unwrap();
    let host = vec![0u8; 4096];
    let r = e.scope(|s| {
        Ok::<_, ferry::BarrierError>({
            let wrong_rank = s.send(&buf, 4096, 1).unwrap_err();
            let too_small = s.recv(&mut small, 4096, 0).unwrap_err();
            let on_host = s.send(&host, 4096, 0).unwrap_err();
            (wrong_rank, too_small, on_host)
        })
    });
    let (wrong_rank, too_small, on_host) = r.unwrap();
    for (e, what) in [
        (&wrong_rank, "outside the communicator"),
        (&too_small, "buffer of 100 bytes"),
        (&on_host, "device memory of GPU 0"),
    ] {
        assert!(matches!(e, NcclError::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains(what), "{e}");
    }
    if ferry::cuda::probe().devices.len() >= 2 {
        let other = dev(1, 4096, 2);
        let err = e
            .scope(|s| Ok::<_, ferry::BarrierError>(s.send(&other, 4096, 0).unwrap_err()))
            .unwrap();
        assert!(err.to_string().contains("GPU 0"), "{err}");
    }
    // Bad configurations never reach NCCL.
    let bad = NcclEngine::new(NcclConfig::new(0, 2, 2, id)).unwrap_err();
    assert!(matches!(bad, NcclError::InvalidConfig(_)), "{bad}");
    let bad = NcclEngine::new(NcclConfig::new(99, 0, 1, NcclId::new().unwrap())).unwrap_err();
    assert!(matches!(bad, NcclError::Cuda(_)), "{bad}");
    // The engine still works after the refusals.
    let mut dst = DeviceBuffer::zeroed(0, 4096).unwrap();
    e.scope(|s| {
        s.group(|g| {
            g.send(&buf, 4096, 0);
            g.recv(&mut dst, 4096, 0);
        })?
        .wait()
        .map_err(ferry::Error::from)
    })
    .unwrap();
    assert_eq!(dst.to_vec().unwrap(), bytes(4096, 1));
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn peer_never_arrives_times_out() {
    let Some((rank, _file)) = child() else {
        if !skip(1) {
            // In a child, so that a hang inside NCCL fails the test instead of stalling it.
            spawn_ranks("peer_never_arrives_times_out", 1);
        }
        return;
    };
    assert_eq!(rank, 0);
    // A communicator of two ranks; rank 1 never starts.
    let id = NcclId::new().unwrap();
    let limit = Duration::from_secs(3);
    let start = Instant::now();
    let e = NcclEngine::new(NcclConfig::new(0, 0, 2, id).init_timeout(limit)).unwrap_err();
    let took = start.elapsed();
    println!("init without the peer: {e} after {took:?}");
    assert!(matches!(e, NcclError::Timeout { .. }), "{e:?}");
    assert!(
        took >= limit && took < limit + Duration::from_secs(30),
        "{took:?}"
    );
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn unmatched_send_times_out() {
    let Some((rank, file)) = child() else {
        if !skip(2) {
            spawn_ranks("unmatched_send_times_out", 2);
        }
        return;
    };
    let e = engine(rank, 2, &file, Duration::from_secs(10));
    let done = file.with_extension("done");
    let n = 1 << 20;
    // A first exchange connects the two ranks.
    let src = dev(rank, n, 9);
    let mut dst = DeviceBuffer::zeroed(rank, n).unwrap();
    e.scope(|s| {
        s.group(|g| {
            g.send(&src, n, 1 - rank);
            g.recv(&mut dst, n, 1 - rank);
        })?
        .wait()
        .map_err(ferry::Error::from)
    })
    .unwrap();
    assert_eq!(dst.to_vec().unwrap(), bytes(n, 9));
    if rank == 0 {
        // Rank 1 never posts the matching receive; 64 MiB is more than NCCL's staging buffers
        // hold, so the send cannot complete on its own.
        let big = dev(0, 64 << 20, 10);
        let start = Instant::now();
        let r = e.scope(|s| {
            Ok::<_, ferry::BarrierError>(match s.send(&big, 64 << 20, 1) {
                Ok(req) => req.wait().map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            })
        });
        let took = start.elapsed();
        println!("unmatched send: {r:?} after {took:?}");
        let msg = match r {
            Ok(Err(m)) => m,
            Err(b) => b.to_string(),
            Ok(Ok(())) => panic!("a send without a receiver completed"),
        };
        assert!(msg.contains("timed out"), "{msg}");
        assert!(took < Duration::from_secs(60), "{took:?}");
        let later = e
            .scope(|s| Ok::<_, ferry::BarrierError>(s.send(&src, n, 1).map(drop)))
            .unwrap()
            .unwrap_err();
        assert!(matches!(later, NcclError::Aborted(_)), "{later:?}");
        std::fs::write(&done, "done").unwrap();
    } else {
        // Stay in the communicator without posting anything until rank 0 is done.
        let start = Instant::now();
        while !done.exists() && start.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(done.exists(), "rank 0 never finished");
        e.abort();
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn one_rank_through_the_backend_contract() {
    use ferry::engine::nccl::{P2p, P2pKind};
    use ferry::{Backend, MemoryMut, SubmitError};
    if skip(1) {
        return;
    }
    let id = NcclId::new().unwrap();
    let e = NcclEngine::new(NcclConfig::new(0, 0, 1, id).timeout(Duration::from_secs(60))).unwrap();
    let n = 1 << 20;
    let src = dev(0, n, 70);
    let mut dst = DeviceBuffer::zeroed(0, n).unwrap();
    let ops = vec![
        P2p {
            kind: P2pKind::Send,
            buf: ferry::Memory::raw(&src),
            bytes: n,
            peer: 0,
        },
        P2p {
            kind: P2pKind::Recv,
            buf: dst.raw_mut(),
            bytes: n,
            peer: 0,
        },
    ];
    // SAFETY: both buffers outlive the request, waited here; nothing else touches them.
    let req = unsafe { e.submit_work((ops, Vec::new())) }.unwrap();
    Backend::flush(&e);
    req.wait().unwrap();
    Backend::barrier(&e).unwrap();
    assert_eq!(dst.to_vec().unwrap(), src.to_vec().unwrap());
    // A peer outside the communicator: refused, NCCL's own error kept whole.
    let bad = vec![P2p {
        kind: P2pKind::Send,
        buf: ferry::Memory::raw(&src),
        bytes: n,
        peer: 5,
    }];
    // SAFETY: refused before anything runs (asserted).
    match unsafe { e.submit_work((bad, Vec::new())) } {
        Err(SubmitError::Backend(b)) => assert!(
            matches!(
                b.downcast_ref::<NcclError>(),
                Some(NcclError::InvalidArgument(_))
            ),
            "{b}"
        ),
        other => panic!("not refused with NCCL's error: {other:?}"),
    }
}
