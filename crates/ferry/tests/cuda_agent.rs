//! The transfer agent with GPU memory between two real processes on one GPU: this binary runs
//! itself as the peer (`owner`, idle unless `FERRY_AGENT_ROLE` is set), which registers a
//! device buffer (CUDA IPC), pinned shared host memory and VMM device memory (its allocation
//! passed as a file descriptor) and answers commands on its stdin.
//! On the null CUDA driver (CI) the IPC handles map the same pages in both processes
//! (`bench/null-cuda/null_cuda.c`), so the cross-process logic runs for real there too.

mod cuda_common;
use cuda_common::*;

use ferry::agent::{Agent, AgentError, Descriptor};
use ferry::cuda::DeviceBuffer;
use ferry::{MemKind, RequestError, Segment};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;

const LEN: usize = 4 << 20;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// The owner's region `r` when it starts.
fn initial(r: usize) -> Vec<u8> {
    bytes(LEN, 100 + r as u64)
}

/// The peer process: region 0 device memory (CUDA IPC), region 1 pinned shared host memory,
/// region 2 VMM device memory (a file descriptor over the socket). Answers `get R OFF LEN`,
/// `note` (the next notification, waiting at most 20 s) and `exit`.
#[test]
fn owner() {
    let Ok(role) = std::env::var("FERRY_AGENT_ROLE") else {
        return; // run as a peer only
    };
    let engine = Arc::new(cuda_engine(0).expect("device 0"));
    let agent = Agent::new(&role, engine).expect("agent");
    let dev = DeviceBuffer::from_host(0, &initial(0)).expect("device buffer");
    let dev = agent.register_device(dev).expect("register device");
    let pinned = agent.alloc_shared(LEN, true).expect("pinned shared");
    pinned.write_at(0, &initial(1)).unwrap();
    let vmm = agent.alloc_device(0, LEN).expect("VMM device memory");
    vmm.write_at(0, &initial(2)).unwrap();
    let regions = [dev, pinned, vmm];
    let mut out = std::io::stdout().lock();
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
            ["note"] => match agent.next_notification(std::time::Duration::from_secs(20)) {
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
        while descs.len() < 3 {
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

    fn get(&mut self, r: usize, off: u64, len: u64) -> Vec<u8> {
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

/// `n` segments of `len` bytes: the `i`th from `(n-1-i) * 2 len + 64` to `i * 3 len`.
fn scattered(n: u64, len: u64) -> Vec<Segment> {
    (0..n)
        .map(|i| Segment::new(i * 3 * len, (n - 1 - i) * 2 * len + 64, len))
        .collect()
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_memory_moves_between_two_processes_on_one_gpu() {
    let Some(engine) = cuda_or_skip() else { return };
    let mut owner = Owner::spawn("gpu-owner");
    let me = Agent::new("gpu-peer", Arc::new(engine)).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    let dev = peer.import(&owner.descs[0]).unwrap();
    let pinned = peer.import(&owner.descs[1]).unwrap();
    assert_eq!(dev.len(), LEN);
    let mine_data = bytes(LEN, 7);
    let mine = me
        .register_device(DeviceBuffer::from_host(0, &mine_data).unwrap())
        .unwrap();
    assert_eq!(mine.kind(), MemKind::Device { ordinal: 0 });
    // Device -> the peer's device memory, 1,000 segments of 1 KiB, one request.
    let segs = scattered(1000, 1024);
    me.write(&dev, &mine, &segs, None).unwrap().wait().unwrap();
    for s in [segs[0], segs[500], segs[999]] {
        let want = &mine_data[s.src_off as usize..(s.src_off + s.len) as usize];
        check(
            "device -> peer device",
            &owner.get(0, s.dst_off, s.len),
            want,
        );
    }
    // Untouched bytes of the peer stay as they were.
    let gap = segs[0].dst_off + 1024;
    check(
        "gap",
        &owner.get(0, gap, 64),
        &initial(0)[gap as usize..gap as usize + 64],
    );
    // The peer's pinned host memory -> device memory here (a host -> device upload across
    // processes), and the peer's device memory -> pinned shared memory here.
    let back = me
        .register_device(DeviceBuffer::zeroed(0, LEN).unwrap())
        .unwrap();
    let whole = [Segment::new(0, 0, LEN as u64)];
    me.read(&back, &pinned, &whole, None)
        .unwrap()
        .wait()
        .unwrap();
    let mut got = vec![0u8; LEN];
    back.read_at(0, &mut got).unwrap();
    check("peer pinned -> device", &got, &initial(1));
    let host = me.alloc_shared(LEN, true).unwrap();
    assert_eq!(host.kind(), MemKind::Pinned);
    block_on(me.read(&host, &dev, &whole, Some(b"read")).unwrap()).unwrap();
    host.read_at(0, &mut got).unwrap();
    let mut want = initial(0);
    for s in &segs {
        want[s.dst_off as usize..(s.dst_off + s.len) as usize]
            .copy_from_slice(&mine_data[s.src_off as usize..(s.src_off + s.len) as usize]);
    }
    check("peer device -> pinned here", &got, &want);
    // The peer's VMM allocation (imported from its file descriptor): written here, read back.
    let vmm = peer.import(&owner.descs[2]).unwrap();
    assert_eq!(vmm.len(), LEN);
    me.write(&vmm, &mine, &segs, None).unwrap().wait().unwrap();
    for s in [segs[0], segs[999]] {
        let want = &mine_data[s.src_off as usize..(s.src_off + s.len) as usize];
        check("device -> peer VMM", &owner.get(2, s.dst_off, s.len), want);
    }
    me.read(&back, &vmm, &whole, None).unwrap().wait().unwrap();
    back.read_at(0, &mut got).unwrap();
    let mut want = initial(2);
    for s in &segs {
        want[s.dst_off as usize..(s.dst_off + s.len) as usize]
            .copy_from_slice(&mine_data[s.src_off as usize..(s.src_off + s.len) as usize]);
    }
    check("peer VMM -> device", &got, &want);
    // A segment past the peer's buffer is refused before anything moves.
    let e = me
        .write(&dev, &mine, &[Segment::new(LEN as u64 - 1, 0, 2)], None)
        .unwrap_err();
    assert!(matches!(e, AgentError::Segment(_)), "{e}");
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_killed_gpu_peer_fails_the_request() {
    let Some(engine) = cuda_or_skip() else { return };
    let mut owner = Owner::spawn("gpu-owner-killed");
    let me = Agent::new("gpu-survivor", Arc::new(engine)).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    let dev = peer.import(&owner.descs[0]).unwrap();
    let mine = me
        .register_device(DeviceBuffer::from_host(0, &bytes(LEN, 3)).unwrap())
        .unwrap();
    let req = me.write(&dev, &mine, &scattered(1000, 1024), None).unwrap();
    owner.child.kill().unwrap();
    owner.child.wait().unwrap();
    let e = req.wait().expect_err("the peer died");
    let RequestError::Backend(be) = &e else {
        panic!("{e}")
    };
    assert!(
        matches!(
            be.downcast_ref::<AgentError>(),
            Some(AgentError::PeerGone { .. })
        ),
        "{e}"
    );
    let mut got = vec![0u8; 64];
    mine.read_at(0, &mut got).unwrap();
    check("the survivor's memory", &got, &bytes(LEN, 3)[..64]);
    drop(dev);
}

/// A notification goes when a device copy lands, though nobody waits for the request: the
/// CUDA engine's waiter thread wakes the agent's progress thread.
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn a_notification_goes_when_a_device_copy_lands_unwaited() {
    let Some(engine) = cuda_or_skip() else { return };
    let mut owner = Owner::spawn("gpu-owner-notes");
    let me = Agent::new("gpu-notifier", Arc::new(engine)).unwrap();
    let peer = me.connect(&owner.path).unwrap();
    let data = bytes(LEN, 21);
    let mine = me
        .register_device(DeviceBuffer::from_host(0, &data).unwrap())
        .unwrap();
    let segs = scattered(1000, 1024);
    for (r, what) in [(0, "device"), (1, "pinned"), (2, "vmm")] {
        let remote = peer.import(&owner.descs[r]).unwrap();
        let req = me
            .write(&remote, &mine, &segs, Some(what.as_bytes()))
            .unwrap();
        assert_eq!(owner.ask("note"), format!("gpu-notifier {what}"), "{what}");
        let s = segs[999];
        let want = &data[s.src_off as usize..(s.src_off + s.len) as usize];
        check(what, &owner.get(r, s.dst_off, s.len), want);
        drop(req); // never waited
    }
}

/// Device memory over TCP (the transport between hosts; here two agents of this process over
/// loopback): staged through host memory on both ends, in pieces (10 MiB: three of them).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a GPU: run with --features gpu")]
fn device_memory_moves_over_tcp_staged_through_host_memory() {
    let Some(engine) = cuda_or_skip() else { return };
    const BIG: usize = 10 << 20;
    const KEY: &[u8] = b"a key of at least sixteen bytes";
    let owner = Agent::new("tcp-gpu-owner", Arc::new(engine)).unwrap();
    let at = owner.listen_tcp("127.0.0.1:0", KEY).unwrap().to_string();
    let theirs = bytes(BIG, 31);
    let dev = owner
        .register_device(DeviceBuffer::from_host(0, &theirs).unwrap())
        .unwrap();
    let vmm = owner.alloc_device(0, BIG).unwrap();
    let me = Agent::new("tcp-gpu-peer", Arc::new(cuda_engine(0).unwrap())).unwrap();
    let peer = me.connect_tcp(&at, KEY).unwrap();
    let remote = peer.import(dev.descriptor()).unwrap();
    assert_eq!(remote.raw().kind, MemKind::Device { ordinal: 0 });
    let remote_vmm = peer.import(vmm.descriptor()).unwrap();
    let mine_data = bytes(BIG, 37);
    let mine = me
        .register_device(DeviceBuffer::from_host(0, &mine_data).unwrap())
        .unwrap();
    // Device here -> the owner's device memory, 1,000 segments of 1 KiB.
    let segs = scattered(1000, 1024);
    me.write(&remote, &mine, &segs, Some(b"landed"))
        .unwrap()
        .wait()
        .unwrap();
    let (from, msg) = owner
        .next_notification(std::time::Duration::from_secs(10))
        .expect("a notification");
    assert_eq!((from.as_str(), &msg[..]), ("tcp-gpu-peer", &b"landed"[..]));
    let mut want = theirs.clone();
    for s in &segs {
        want[s.dst_off as usize..(s.dst_off + s.len) as usize]
            .copy_from_slice(&mine_data[s.src_off as usize..(s.src_off + s.len) as usize]);
    }
    let mut got = vec![0u8; BIG];
    dev.read_at(0, &mut got).unwrap();
    check("device -> owner's device over TCP", &got, &want);
    // The whole 10 MiB: device here -> the owner's VMM memory, then back into pinned memory
    // here and into device memory here.
    let whole = [Segment::new(0, 0, BIG as u64)];
    me.write(&remote_vmm, &mine, &whole, None)
        .unwrap()
        .wait()
        .unwrap();
    vmm.read_at(0, &mut got).unwrap();
    check("device -> owner's VMM over TCP", &got, &mine_data);
    let pinned = me.alloc_shared(BIG, true).unwrap();
    block_on(me.read(&pinned, &remote, &whole, None).unwrap()).unwrap();
    pinned.read_at(0, &mut got).unwrap();
    check("owner's device -> pinned over TCP", &got, &want);
    let back = me
        .register_device(DeviceBuffer::zeroed(0, BIG).unwrap())
        .unwrap();
    me.read(&back, &remote_vmm, &whole, None)
        .unwrap()
        .wait()
        .unwrap();
    back.read_at(0, &mut got).unwrap();
    check("owner's VMM -> device over TCP", &got, &mine_data);
}
