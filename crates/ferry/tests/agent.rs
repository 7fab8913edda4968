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
/// its socket and descriptors, then answers `get R OFF LEN`, `dereg R`, `note`, `exit`, and,
/// as the importer of a region of the test's own agent, `peer PATH`, `import DESC`,
/// `put OFF HEX`, `release-later MS`, `released`.
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
    // The other way: this process imports a region of the test's agent.
    let (mut peer, mut import) = (None, None);
    let mut out = std::io::stdout().lock();
    // On a line of its own: the test harness's `test owner ... ` has no newline yet.
    writeln!(out, "\nPATH {}", agent.socket_path().display()).unwrap();
    // Over TCP too, where a key is given (loopback, a port the kernel picks).
    if let Ok(key) = std::env::var("FERRY_AGENT_TCP_KEY") {
        let at = agent
            .listen_tcp("127.0.0.1:0", key.as_bytes())
            .expect("listen");
        writeln!(out, "TCP {at}").unwrap();
    }
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
            ["peer", path] => match agent.connect(path) {
                Ok(p) => {
                    peer = Some(p);
                    writeln!(out, "ok").unwrap()
                }
                Err(e) => writeln!(out, "err {e}").unwrap(),
            },
            ["import", d] => {
                let d = Descriptor::from_bytes(&unhex(d)).unwrap();
                match peer.as_ref().unwrap().import(&d) {
                    Ok(r) => {
                        import = Some(r);
                        writeln!(out, "ok").unwrap()
                    }
                    Err(e) => writeln!(out, "err {e}").unwrap(),
                }
            }
            ["put", off, data] => {
                let data = unhex(data);
                let src = agent.register_host(data.clone()).unwrap();
                let seg = Segment::new(off.parse().unwrap(), 0, data.len() as u64);
                let r = agent.write(import.as_ref().unwrap(), &src, &[seg], None);
                match r
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.wait().map_err(|e| e.to_string()))
                {
                    Ok(()) => writeln!(out, "ok").unwrap(),
                    Err(e) => writeln!(out, "err {e}").unwrap(),
                }
            }
            // Drops the import after `ms` milliseconds, from another thread, and says when it
            // begins to (`released`).
            ["release-later", ms] => {
                let (r, ms) = (import.take().unwrap(), ms.parse().unwrap());
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(ms));
                    RELEASED.store(true, std::sync::atomic::Ordering::SeqCst);
                    drop(r);
                });
                writeln!(out, "ok").unwrap()
            }
            ["released"] => {
                let r = RELEASED.load(std::sync::atomic::Ordering::SeqCst);
                writeln!(out, "{r}").unwrap()
            }
            ["exit"] => break,
            _ => writeln!(out, "? {line}").unwrap(),
        }
        out.flush().unwrap();
    }
}

/// Set by the owner just before it drops an import it was told to release later.
static RELEASED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A running owner process.
struct Owner {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    path: String,
    /// Its TCP address, where it listens ([`Owner::spawn_tcp`]).
    tcp: String,
    descs: Vec<Descriptor>,
}

/// The key of the owners that listen over TCP.
const TCP_KEY: &str = "a test key of more than sixteen bytes";

impl Owner {
    fn spawn(role: &str) -> Owner {
        Owner::start(role, false)
    }

    /// An owner that listens over TCP too (loopback), with [`TCP_KEY`].
    fn spawn_tcp(role: &str) -> Owner {
        Owner::start(role, true)
    }

    fn start(role: &str, tcp: bool) -> Owner {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        if tcp {
            cmd.env("FERRY_AGENT_TCP_KEY", TCP_KEY);
        }
        let mut child = cmd
            .args(["--exact", "owner", "--nocapture", "--test-threads=1"])
            .env("FERRY_AGENT_ROLE", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the owner");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (mut path, mut at, mut descs) = (String::new(), String::new(), Vec::new());
        while descs.len() < 2 {
            let mut l = String::new();
            assert!(
                stdout.read_line(&mut l).unwrap() > 0,
                "the owner ended early"
            );
            if let Some(p) = l.trim().strip_prefix("PATH ") {
                path = p.to_string();
            } else if let Some(a) = l.trim().strip_prefix("TCP ") {
                at = a.to_string();
            } else if let Some(d) = l.trim().strip_prefix("DESC ") {
                descs.push(Descriptor::from_bytes(&unhex(d)).expect("a descriptor"));
            }
        }
        Owner {
            child,
            stdin,
            stdout,
            path,
            tcp: at,
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

/// Both owner regions written from a local pageable region (100 pieces of 1000 bytes, the
/// bytes outside them untouched) and read back into a local shared region as a Future;
/// `notify`: each write carries a notification the owner must receive (`ME region R`).
fn both_ways(
    owner: &mut Owner,
    me: &Agent,
    peer: &ferry::agent::Peer,
    me_name: &str,
    notify: bool,
) {
    for r in 0..2 {
        let remote = peer.import(&owner.descs[r]).unwrap();
        assert_eq!(remote.len(), LEN);
        let src: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 ^ 0x5a).collect();
        let local = me.register_host(src.clone()).unwrap();
        let segs = scattered(100, 1000, false); // dst_off in the peer, src_off here
        let note = format!("region {r}");
        me.write(&remote, &local, &segs, notify.then_some(note.as_bytes()))
            .unwrap()
            .wait()
            .unwrap();
        if notify {
            assert_eq!(owner.ask("note"), format!("{me_name} {note}"));
        }
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
fn host_memory_moves_both_ways_with_segment_lists() {
    let mut owner = Owner::spawn("owner-both-ways");
    let me = Agent::new("both-ways", engine()).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    assert_eq!(peer.name(), "owner-both-ways");
    assert_eq!(peer.pid(), owner.child.id());
    both_ways(&mut owner, &me, &peer, "both-ways", false);
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
    // The owner's socket, there while it lives.
    let sock = std::path::PathBuf::from(&owner.path);
    assert!(sock.exists());
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
    // A small write into its shared memory runs on this thread (the pages are mapped here
    // too: nothing is lost) and fails when seen complete.
    let small = me
        .write(&shared, &local, &[Segment::new(0, 0, 4096)], None)
        .map_or_else(
            |e| e.to_string(),
            |r| {
                r.wait()
                    .expect_err("a small write to a dead peer")
                    .to_string()
            },
        );
    assert!(small.contains("has exited"), "{small}");
    assert!(!peer.is_alive());
    let mut mine = vec![0u8; 16];
    local.read_at(LEN - 16, &mut mine).unwrap();
    assert_eq!(mine, vec![3u8; 16]);
    // The killed owner's socket is removed by the next agent made here (this one, or one that
    // a test running beside this one made after the kill: checked before the kill, not here).
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

#[test]
fn notifications_go_when_the_transfer_lands_unwaited() {
    let mut owner = Owner::spawn("owner-unwaited");
    let me = Agent::new("unwaited", engine()).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    let cross = peer.import(&owner.descs[0]).unwrap();
    let shared = peer.import(&owner.descs[1]).unwrap();
    let local = me.register_host(vec![0x42u8; LEN]).unwrap();
    // Each path a transfer takes: a small cross-memory copy (run at submit), a large one (the
    // copy thread), one into shared memory (the engine). Nobody waits for these requests.
    let cases = [
        (&cross, 4096, "small cross-memory"),
        (&cross, LEN, "large cross-memory"),
        (&shared, LEN, "shared memory"),
    ];
    for (remote, len, what) in cases {
        let seg = [Segment::new(0, 0, len as u64)];
        let req = me
            .write(remote, &local, &seg, Some(what.as_bytes()))
            .unwrap();
        assert_eq!(owner.ask("note"), format!("unwaited {what}"), "{what}");
        // The bytes were there when the owner heard of them.
        let r = if std::ptr::eq(remote, &cross) { 0 } else { 1 };
        assert_eq!(owner.get(r, len - 4, 4), vec![0x42; 4], "{what}");
        drop(req); // never waited
    }
    // Waited, the request completes after its message went, and sends it once.
    let mut req = me
        .write(&shared, &local, &[Segment::new(0, 0, 64)], Some(b"once"))
        .unwrap();
    futures::executor::block_on(&mut req).unwrap();
    assert_eq!(req.try_wait(), Some(Ok(())));
    assert_eq!(owner.ask("note"), "unwaited once");
    peer.notify(b"after").unwrap();
    assert_eq!(owner.ask("note"), "unwaited after", "a message sent twice");
}

/// The test's agent lends a buffer of its own; the owner process imports it and writes into
/// it. `lend` returns only once the owner has released its import.
#[test]
fn lent_memory_is_reached_in_place_and_lend_waits_for_the_peer() {
    let mut owner = Owner::spawn("owner-importer");
    let me = Agent::new("lender", engine()).unwrap();
    let path = me.socket_path().display().to_string();
    let mut buf = vec![0u8; 64 << 10];
    let addr = buf.as_ptr() as u64;
    let desc = me
        .lend(&mut buf[..], |region| {
            assert_eq!(region.raw().addr, addr, "registered in place");
            assert_eq!(owner.ask(&format!("peer {path}")), "ok");
            let d = hex(&region.descriptor().to_bytes());
            assert_eq!(owner.ask(&format!("import {d}")), "ok");
            assert_eq!(owner.ask("put 1000 c0ffee"), "ok");
            let mut got = [0u8; 3];
            region.read_at(1000, &mut got).unwrap();
            assert_eq!(got, [0xc0, 0xff, 0xee]);
            // A region a peer holds is not deregistered early.
            let e = region.deregister().unwrap_err();
            assert!(matches!(e, AgentError::InUse { .. }), "{e}");
            assert_eq!(owner.ask("release-later 300"), "ok");
            assert_eq!(owner.ask("released"), "false");
            d
        })
        .unwrap();
    // The owner had begun to drop its import before `lend` returned.
    assert_eq!(owner.ask("released"), "true");
    assert_eq!(&buf[1000..1003], &[0xc0, 0xff, 0xee], "written in place");
    assert_eq!(buf[999], 0);
    // The lent region is gone: its descriptor is refused.
    let e = owner.ask(&format!("import {desc}"));
    assert!(e.starts_with("err") && e.contains("not registered"), "{e}");
    // An empty buffer is refused.
    let mut empty: [u8; 0] = [];
    let e = me.lend(&mut empty[..], |_| ()).unwrap_err();
    assert!(matches!(e, AgentError::Unsupported(_)), "{e}");
}

/// A peer that dies holding an import of lent memory releases it: `lend` returns.
#[test]
fn lend_returns_when_the_importer_dies() {
    let mut owner = Owner::spawn("owner-dies");
    let me = Agent::new("lender-2", engine()).unwrap();
    let path = me.socket_path().display().to_string();
    let mut buf = vec![1u32; 1024];
    me.lend(&mut buf, |region| {
        assert_eq!(owner.ask(&format!("peer {path}")), "ok");
        let d = hex(&region.descriptor().to_bytes());
        assert_eq!(owner.ask(&format!("import {d}")), "ok");
        owner.child.kill().unwrap();
        owner.child.wait().unwrap();
    })
    .unwrap();
    assert_eq!(buf, vec![1u32; 1024]);
}

/// A child process killed and reaped when dropped (a test that fails leaves none behind).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run by `a_foreign_user_is_refused` as a child process (root at first): tries the test's
/// agent as another user, then serves an agent of its own as that user.
#[test]
fn foreign_child() {
    let (Ok(target), Ok(own_dir)) = (
        std::env::var("FERRY_FOREIGN_TARGET"),
        std::env::var("FERRY_FOREIGN_DIR"),
    ) else {
        return; // run as a child only
    };
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    let agent = Agent::new("foreign", engine()).unwrap();
    const NOBODY: u32 = 65534;
    // 1. The credential check: an effective uid of another user (SO_PEERCRED reports the
    //    effective uid), its file-system uid left at root's so that the private directory
    //    lets it reach the socket.
    // SAFETY: plain system calls changing this process's ids (glibc applies setgroups,
    // setgid and seteuid to every thread; setfsuid is this thread's, the one that connects).
    let ok = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(NOBODY) == 0
            && libc::seteuid(NOBODY) == 0
    };
    if !ok {
        let e = std::io::Error::last_os_error();
        writeln!(out, "SKIP cannot become uid {NOBODY}: {e}").unwrap();
        return;
    }
    // SAFETY: as above.
    let fs_root = unsafe {
        libc::setfsuid(0);
        libc::setfsuid(0) == 0
    };
    assert!(fs_root, "setfsuid(0) with real uid 0");
    let r = agent.connect(&target);
    writeln!(
        out,
        "CRED {}",
        r.map(|_| "connected".to_string())
            .unwrap_or_else(|e| e.to_string())
    )
    .unwrap();
    // 2. The directory: every id that of the other user.
    // SAFETY: as above.
    let ok = unsafe {
        libc::setfsuid(NOBODY);
        libc::setresuid(NOBODY, NOBODY, NOBODY) == 0
    };
    assert!(ok, "{}", std::io::Error::last_os_error());
    let r = agent.connect(&target);
    writeln!(
        out,
        "DIR {}",
        r.map(|_| "connected".to_string())
            .unwrap_or_else(|e| e.to_string())
    )
    .unwrap();
    // 3. An agent of the other user, which the test tries to connect to.
    std::env::set_var("FERRY_AGENT_DIR", &own_dir);
    let mine = Agent::new("foreign-owner", engine()).unwrap();
    let region = mine.alloc_shared(4096, false).unwrap();
    writeln!(out, "PATH {}", mine.socket_path().display()).unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    // Nobody imported it.
    region.deregister().unwrap();
    writeln!(out, "DONE").unwrap();
}

/// Another user's process is refused by the agent (the credential check) and cannot even reach
/// its socket (the private directory); an agent of another user is refused by this process.
/// Needs root (to become `nobody`): skipped otherwise.
#[test]
fn a_foreign_user_is_refused() {
    // SAFETY: no arguments, cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root to run a child as another user (uid 65534)");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let me = Agent::new("guarded", engine()).unwrap();
    let mine = me.alloc_shared(4096, false).unwrap();
    let dir = me.socket_path().parent().unwrap().to_owned();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{} is not private", dir.display());
    // The child's own agent directories: root's first, then one of the other user.
    let root_dir = tempfile::tempdir().unwrap();
    let foreign_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root_dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(foreign_dir.path(), Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(foreign_dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut child = Reap(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "foreign_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FERRY_FOREIGN_TARGET", me.socket_path())
            .env("FERRY_FOREIGN_DIR", foreign_dir.path())
            .env("FERRY_AGENT_DIR", root_dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the child"),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let stdout = BufReader::new(child.0.stdout.take().unwrap());
    // Lines through a thread, so that a child that hangs fails the test instead.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let next = |tag: &str| -> Option<String> {
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if l.starts_with("SKIP ") => return None,
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(tag) {
                        return Some(rest.trim().to_string());
                    }
                }
                Err(e) => panic!("no {tag} line from the child: {e}"),
            }
        }
    };
    let Some(cred) = next("CRED") else {
        println!("skipped: the child could not become uid 65534");
        return;
    };
    assert!(
        cred.contains("refused") && cred.contains("runs as uid 65534, not this agent's uid 0"),
        "credential check: {cred}"
    );
    println!("uid 65534 with root's file access: {cred}");
    let dir_err = next("DIR").unwrap();
    println!("uid 65534: {dir_err}");
    assert!(
        dir_err.contains("Permission denied")
            && dir_err.contains(&me.socket_path().display().to_string()),
        "directory: {dir_err}"
    );
    // This process refuses the other user's agent.
    let path = next("PATH").unwrap();
    let e = me.connect(&path).unwrap_err();
    assert!(
        matches!(e, AgentError::Refused { .. }) && e.to_string().contains("runs as uid 65534"),
        "{e}"
    );
    writeln!(stdin, "go").unwrap();
    assert_eq!(next("DONE"), Some(String::new()));
    assert!(child.0.wait().unwrap().success());
    // Nothing reached this agent's region.
    mine.deregister().unwrap();
}

/// A peer speaking the first agent protocol (an older ferry, whose handshake reply lacked the
/// life word) is refused with the reason, not answered with a reply it would misread.
#[test]
fn a_peer_of_the_first_protocol_is_refused_with_the_reason() {
    use std::io::Read;
    let a = Agent::new("protocol", engine()).unwrap();
    let mut s = std::os::unix::net::UnixStream::connect(a.socket_path()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The first protocol's HELLO: the frame's length (tag included), tag 1, a pid, a name.
    let mut payload = std::process::id().to_le_bytes().to_vec();
    payload.extend_from_slice(b"older");
    let mut frame = (payload.len() as u32 + 1).to_le_bytes().to_vec();
    frame.push(1);
    frame.extend_from_slice(&payload);
    s.write_all(&frame).unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(head) as usize];
    s.read_exact(&mut body).unwrap();
    assert_eq!(body[0], 0x81, "an ERR frame");
    let why = String::from_utf8_lossy(&body[1..]);
    assert!(why.contains("first agent protocol"), "{why}");
}

/// Over TCP (the transport between hosts, here over loopback): both owner regions written
/// and read back with segment lists, a notification after the bytes landed.
#[test]
fn over_tcp_host_memory_moves_both_ways() {
    let mut owner = Owner::spawn_tcp("owner-tcp");
    let me = Agent::new("tcp-both-ways", engine()).unwrap();
    let peer = me.connect_tcp(&owner.tcp, TCP_KEY.as_bytes()).unwrap();
    assert_eq!(peer.name(), "owner-tcp");
    assert_eq!(peer.pid(), owner.child.id());
    both_ways(&mut owner, &me, &peer, "tcp-both-ways", true);
    // A segment past the peer's region: refused here, before any byte moves.
    let remote = peer.import(&owner.descs[0]).unwrap();
    let local = me.register_host(vec![1u8; 4096]).unwrap();
    assert!(matches!(
        me.write(
            &remote,
            &local,
            &[Segment::new(0, LEN as u64 - 10, 20)],
            None
        ),
        Err(AgentError::Segment(_))
    ));
    // Imported over TCP, the region is still held: the owner cannot deregister it.
    assert!(owner.ask("dereg 0").starts_with("err"));
    drop(remote);
}

/// Over TCP a killed owner fails the transfer in flight and every later one, never hangs.
#[test]
fn over_tcp_a_killed_owner_fails_requests_and_never_hangs() {
    let mut owner = Owner::spawn_tcp("owner-tcp-killed");
    let me = Agent::with_timeout("tcp-survivor", engine(), Duration::from_secs(5)).unwrap();
    let peer = me.connect_tcp(&owner.tcp, TCP_KEY.as_bytes()).unwrap();
    let remote = peer.import(&owner.descs[1]).unwrap();
    let local = me.register_host(vec![9u8; LEN]).unwrap();
    me.write(&remote, &local, &[Segment::new(0, 0, LEN as u64)], None)
        .unwrap()
        .wait()
        .unwrap();
    owner.child.kill().unwrap();
    owner.child.wait().unwrap();
    let start = std::time::Instant::now();
    let first = me
        .write(&remote, &local, &[Segment::new(0, 0, LEN as u64)], None)
        .and_then(|r| r.wait().map_err(|e| AgentError::Unsupported(e.to_string())));
    assert!(first.is_err(), "a write to a killed owner succeeded");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    // Known broken now: refused at once with the reason.
    match me.read(&local, &remote, &[Segment::new(0, 0, 16)], None) {
        Err(AgentError::Disconnected { peer, .. }) => assert!(peer.contains("owner-tcp-killed")),
        r => panic!("a read after the connection broke: {r:?}"),
    }
    assert!(!peer.is_alive());
    // The local memory is intact.
    let mut b = vec![0u8; 16];
    local.read_at(0, &mut b).unwrap();
    assert_eq!(b, vec![9u8; 16]);
}
