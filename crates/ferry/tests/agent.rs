//! The transfer agent between two real processes: this test binary runs itself as the peer
//! (`owner`, a test that does nothing unless `FERRY_AGENT_ROLE` is set), which registers host
//! memory (pageable, reached by cross-memory attach; shared, a memfd) and answers commands on
//! its stdin. Host memory only: runs anywhere (the GPU variants are in `cuda_agent.rs`).

use ferry::agent::{Agent, AgentError, Descriptor};
use ferry::{CpuEngine, RequestError, Segment};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const LEN: usize = 1 << 20;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// The byte at offset `i` of the owner's region `r` when it starts.
fn pattern(r: usize, i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(r as u8 * 50 + 1)
}

fn engine() -> Arc<CpuEngine> {
    Arc::new(CpuEngine::new(2).expect("cpu engine"))
}

/// The peer process: registers region 0 (pageable, cross-memory) and region 1 (shared), prints
/// its socket and descriptors, then answers `get R OFF LEN`, `dereg R`, `note`, `exit`.
#[test]
fn owner() {
    let Ok(role) = std::env::var("FERRY_AGENT_ROLE") else {
        return; // run as a peer only
    };
    let agent = Agent::new(&role, engine()).expect("agent");
    let host = agent
        .register_host((0..LEN).map(|i| pattern(0, i)).collect())
        .expect("register host");
    let shared = agent.alloc_shared(LEN, false).expect("alloc shared");
    let init: Vec<u8> = (0..LEN).map(|i| pattern(1, i)).collect();
    shared.write_at(0, &init).expect("fill shared");
    let regions = [host, shared];
    let mut out = std::io::stdout().lock();
    // On a line of its own: the test harness's `test owner ... ` has no newline yet.
    writeln!(out, "\nPATH {}", agent.socket_path().display()).unwrap();
    for r in &regions {
        writeln!(out, "DESC {}", hex(&r.descriptor().to_bytes())).unwrap();
    }
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["get", r, off, len] => {
                let mut b = vec![0u8; len.parse().unwrap()];
                let r: usize = r.parse().unwrap();
                regions[r].read_at(off.parse().unwrap(), &mut b).unwrap();
                writeln!(out, "{}", hex(&b)).unwrap();
            }
            ["dereg", r] => match regions[r.parse::<usize>().unwrap()].deregister() {
                Ok(()) => writeln!(out, "ok").unwrap(),
                Err(e) => writeln!(out, "err {e}").unwrap(),
            },
            ["note"] => match agent.next_notification(Duration::from_secs(20)) {
                Some((from, msg)) => {
                    writeln!(out, "{from} {}", String::from_utf8_lossy(&msg)).unwrap()
                }
                None => writeln!(out, "none").unwrap(),
            },
            ["exit"] => break,
            _ => writeln!(out, "? {line}").unwrap(),
        }
        out.flush().unwrap();
    }
}

/// A running owner process.
struct Owner {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    path: String,
    descs: Vec<Descriptor>,
}

impl Owner {
    fn spawn(role: &str) -> Owner {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "owner", "--nocapture", "--test-threads=1"])
            .env("FERRY_AGENT_ROLE", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the owner");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (mut path, mut descs) = (String::new(), Vec::new());
        while descs.len() < 2 {
            let mut l = String::new();
            assert!(
                stdout.read_line(&mut l).unwrap() > 0,
                "the owner ended early"
            );
            if let Some(p) = l.trim().strip_prefix("PATH ") {
                path = p.to_string();
            } else if let Some(d) = l.trim().strip_prefix("DESC ") {
                descs.push(Descriptor::from_bytes(&unhex(d)).expect("a descriptor"));
            }
        }
        Owner {
            child,
            stdin,
            stdout,
            path,
            descs,
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l.trim().to_string()
    }

    fn get(&mut self, r: usize, off: usize, len: usize) -> Vec<u8> {
        unhex(&self.ask(&format!("get {r} {off} {len}")))
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Scattered segments: `n` pieces of `len` bytes, every third slot, in both regions.
fn scattered(n: u64, len: u64, local_first: bool) -> Vec<Segment> {
    (0..n)
        .map(|i| {
            let (a, b) = (i * 3 * len, (n - 1 - i) * 2 * len + 5);
            if local_first {
                Segment::new(a, b, len)
            } else {
                Segment::new(b, a, len)
            }
        })
        .collect()
}

#[test]
fn host_memory_moves_both_ways_with_segment_lists() {
    let mut owner = Owner::spawn("owner-both-ways");
    let me = Agent::new("both-ways", engine()).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    assert_eq!(peer.name(), "owner-both-ways");
    assert_eq!(peer.pid(), owner.child.id());
    for r in 0..2 {
        let remote = peer.import(&owner.descs[r]).unwrap();
        assert_eq!(remote.len(), LEN);
        // Write 100 pieces of 1000 bytes from a local pageable region into the peer's.
        let src: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 ^ 0x5a).collect();
        let local = me.register_host(src.clone()).unwrap();
        let segs = scattered(100, 1000, false); // dst_off in the peer, src_off here
        me.write(&remote, &local, &segs, None)
            .unwrap()
            .wait()
            .unwrap();
        for s in [segs[0], segs[57], segs[99]] {
            let got = owner.get(r, s.dst_off as usize, s.len as usize);
            let want = &src[s.src_off as usize..(s.src_off + s.len) as usize];
            assert_eq!(got, want, "region {r}, segment {s:?}");
        }
        // Bytes outside the segments are untouched.
        let gap = segs[0].dst_off as usize + 1000;
        assert_eq!(
            owner.get(r, gap, 8),
            (gap..gap + 8).map(|i| pattern(r, i)).collect::<Vec<_>>()
        );
        // Read 100 pieces back into a shared local region, as a Future.
        let dst = me.alloc_shared(LEN, false).unwrap();
        let back = scattered(100, 1000, true); // dst_off here, src_off in the peer
        futures::executor::block_on(me.read(&dst, &remote, &back, None).unwrap()).unwrap();
        let mut mine = vec![0u8; LEN];
        dst.read_at(0, &mut mine).unwrap();
        for s in &back {
            let want = owner.get(r, s.src_off as usize, s.len as usize);
            assert_eq!(
                &mine[s.dst_off as usize..(s.dst_off + s.len) as usize],
                &want[..]
            );
        }
    }
}

#[test]
fn notifications_reach_the_owner() {
    let mut owner = Owner::spawn("owner-notes");
    let me = Agent::new("notifier", engine()).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    let remote = peer.import(&owner.descs[1]).unwrap();
    let local = me.register_host(vec![9u8; 4096]).unwrap();
    let mut req = me
        .write(
            &remote,
            &local,
            &[Segment::new(0, 0, 4096)],
            Some(b"block 0 landed"),
        )
        .unwrap();
    while req.try_wait().is_none() {
        std::thread::yield_now();
    }
    assert_eq!(owner.ask("note"), "notifier block 0 landed");
    assert_eq!(owner.get(1, 0, 4), vec![9; 4]);
    peer.notify(b"direct").unwrap();
    assert_eq!(owner.ask("note"), "notifier direct");
}

#[test]
fn bad_descriptors_and_segments_are_refused() {
    let mut owner = Owner::spawn("owner-bad");
    let other = Owner::spawn("owner-other");
    let me = Agent::new("checker", engine()).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    // A descriptor of another process.
    let e = peer.import(&other.descs[0]).unwrap_err();
    assert!(matches!(e, AgentError::WrongPeer { .. }), "{e}");
    assert!(e.to_string().contains("owner-bad"), "{e}");
    // A forged descriptor: the right agent, a region's length changed.
    let mut forged = owner.descs[0].to_bytes();
    forged[37] ^= 0xff;
    let e = peer
        .import(&Descriptor::from_bytes(&forged).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");
    // A segment past the end of the peer's region, named with its offsets.
    let remote = peer.import(&owner.descs[0]).unwrap();
    let local = me.register_host(vec![1u8; 8192]).unwrap();
    let segs = [
        Segment::new(0, 0, 100),
        Segment::new(LEN as u64 - 10, 0, 100),
    ];
    let e = me.write(&remote, &local, &segs, None).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, AgentError::Segment(_)), "{text}");
    assert!(
        text.contains("segment 1 ") && text.contains(&(LEN - 10).to_string()),
        "{text}"
    );
    assert_eq!(
        owner.get(0, 0, 4),
        (0..4).map(|i| pattern(0, i)).collect::<Vec<_>>()
    );
    // Past the local region too.
    let e = me
        .read(&local, &remote, &[Segment::new(8000, 0, 500)], None)
        .unwrap_err();
    assert!(matches!(e, AgentError::Segment(_)), "{e}");
    // Deregistering memory a peer holds is refused; after the peer drops it, it works, and
    // the stale descriptor is refused.
    assert!(
        owner.ask("dereg 0").starts_with("err region"),
        "imported region deregistered"
    );
    drop(remote);
    let mut answer = String::new();
    for _ in 0..100 {
        answer = owner.ask("dereg 0");
        if answer == "ok" {
            break;
        }
        std::thread::sleep(Duration::from_millis(20)); // the release travels on the socket
    }
    assert_eq!(answer, "ok");
    let e = peer.import(&owner.descs[0]).unwrap_err();
    assert!(e.to_string().contains("not registered"), "{e}");
    // A local region deregistered here is refused too.
    let remote1 = peer.import(&owner.descs[1]).unwrap();
    local.deregister().unwrap();
    let e = me
        .write(&remote1, &local, &[Segment::new(0, 0, 1)], None)
        .unwrap_err();
    assert!(matches!(e, AgentError::Deregistered(_)), "{e}");
}

#[test]
fn a_killed_peer_fails_requests_and_never_hangs() {
    let mut owner = Owner::spawn("owner-killed");
    let me = Agent::new("survivor", engine()).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    let cross = peer.import(&owner.descs[0]).unwrap();
    let shared = peer.import(&owner.descs[1]).unwrap();
    let local = me.register_host(vec![3u8; LEN]).unwrap();
    let segs: Vec<Segment> = (0..256)
        .map(|i| Segment::new(i * 4096, i * 4096, 4096))
        .collect();
    // Posted, then the peer is killed before they are waited for.
    let a = me.write(&cross, &local, &segs, None).unwrap();
    let b = me.write(&shared, &local, &segs, Some(b"late")).unwrap();
    owner.child.kill().unwrap();
    owner.child.wait().unwrap();
    for (what, r) in [("cross-memory", a.wait()), ("shared", b.wait())] {
        let e = r.expect_err(what);
        let RequestError::Backend(be) = &e else {
            panic!("{what}: {e}")
        };
        assert!(
            matches!(
                be.downcast_ref::<AgentError>(),
                Some(AgentError::PeerGone { .. })
            ),
            "{what}: {e}"
        );
    }
    // New requests are refused at once; the survivor's memory is intact.
    let e = me.write(&cross, &local, &segs, None).unwrap_err();
    assert!(matches!(e, AgentError::PeerGone { .. }), "{e}");
    assert!(!peer.is_alive());
    let mut mine = vec![0u8; 16];
    local.read_at(LEN - 16, &mut mine).unwrap();
    assert_eq!(mine, vec![3u8; 16]);
    // The killed owner's socket is removed by the next agent made here.
    let sock = std::path::PathBuf::from(&owner.path);
    assert!(sock.exists());
    drop(Agent::new("after", engine()).unwrap());
    assert!(!sock.exists(), "{} left behind", sock.display());
    // Importing from a dead peer fails instead of waiting.
    let e = peer.import(&owner.descs[1]).unwrap_err();
    assert!(
        matches!(e, AgentError::PeerGone { .. } | AgentError::Io { .. }),
        "{e}"
    );
    drop((cross, shared));
}

#[test]
fn fifteen_thousand_segments_post_as_one_request() {
    let owner = Owner::spawn("owner-many");
    let me = Agent::new("many", engine()).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    let remote = peer.import(&owner.descs[1]).unwrap();
    let local = me.register_host(vec![0u8; LEN]).unwrap();
    let segs: Vec<Segment> = (0..15_000u64)
        .map(|i| Segment::new(i * 64, i * 64 + 7, 64))
        .collect();
    me.read(&local, &remote, &segs, None)
        .unwrap()
        .wait()
        .unwrap();
    let mut got = vec![0u8; 64];
    local.read_at(14_999 * 64, &mut got).unwrap();
    let want: Vec<u8> = (14_999 * 64 + 7..14_999 * 64 + 71)
        .map(|i| pattern(1, i))
        .collect();
    assert_eq!(got, want);
    // A 15,000-region table of descriptors stays small.
    assert!(15_000 * owner.descs[1].to_bytes().len() < 1 << 20);
}
