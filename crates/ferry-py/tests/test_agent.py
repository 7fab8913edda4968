"""ferry.Agent between two real processes (host memory: runs anywhere)."""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

import pytest

import ferry


def _owner(conn: Any) -> None:
    """The peer: a shared region and a pageable one, answering `get`, `note`, `put` and
    `dereg` until `exit`."""
    agent = ferry.Agent("py-owner")
    shared = agent.alloc(1 << 16, shared=True)
    cross = agent.alloc(1 << 16)
    shared.write(0, bytes(range(256)) * 256)
    conn.send((agent.socket_path, shared.descriptor, cross.descriptor))
    while True:
        msg = conn.recv()
        if msg[0] == "get":
            _, which, off, n = msg
            conn.send((shared if which == 0 else cross).read(off, n))
        elif msg[0] == "note":
            conn.send(agent.next_notification(timeout=10.0))
        elif msg[0] == "put":
            # Into a region of the test's own agent: connect, open, write, let go.
            _, path, desc, off, data = msg
            peer = agent.connect(path)
            remote = peer.open(desc)
            src = agent.alloc(len(data))
            src.write(0, data)
            agent.write(remote, src, [(off, 0, len(data))]).wait()
            del remote, peer
            conn.send("ok")
        elif msg[0] == "dereg":
            try:
                shared.deregister()
                conn.send("ok")
            except ferry.FerryError as e:
                conn.send(f"err {e}")
        else:
            return


@pytest.fixture
def owner() -> Any:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_owner, args=(child,))
    p.start()
    yield parent, p, parent.recv()
    if p.is_alive():
        parent.send(("exit",))
    p.join(timeout=10)
    if p.is_alive():
        p.kill()


def test_both_ways_with_segment_lists_and_a_notification(owner: Any) -> None:
    conn, proc, (path, shared_desc, cross_desc) = owner
    me = ferry.Agent("py-peer")
    peer = me.connect(path)
    assert peer.name == "py-owner" and peer.pid == proc.pid and peer.alive
    assert len(shared_desc) <= 109
    for which, desc in ((0, shared_desc), (1, cross_desc)):
        remote = peer.open(desc)
        assert remote.nbytes == 1 << 16 and remote.descriptor == desc
        local = me.alloc(1 << 16)
        local.write(0, b"\xab" * 4096)
        me.write(remote, local, [(100, 0, 1000), (5000, 2000, 10)], notify=b"landed").wait()
        conn.send(("get", which, 100, 1000))
        assert conn.recv() == b"\xab" * 1000
        conn.send(("note",))
        assert conn.recv() == ("py-peer", b"landed")
        back = me.alloc(1 << 16, shared=True)
        me.read(back, remote, [(0, 5000, 10), (10, 0, 4)]).wait()
        conn.send(("get", which, 0, 4))
        assert back.read(0, 14) == b"\xab" * 10 + conn.recv()


def test_bad_segments_and_stale_descriptors_are_refused(owner: Any) -> None:
    conn, _, (path, shared_desc, _) = owner
    me = ferry.Agent("py-checker")
    peer = me.connect(path)
    remote = peer.open(shared_desc)
    local = me.alloc(4096)
    with pytest.raises(ferry.ArgumentError, match="segment 0"):
        me.write(remote, local, [((1 << 16) - 10, 0, 100)])
    with pytest.raises(ferry.ArgumentError, match="not a descriptor"):
        peer.open(b"nonsense")
    conn.send(("dereg",))
    assert conn.recv().startswith("err")  # imported: refused
    del remote
    for _ in range(100):
        conn.send(("dereg",))
        if conn.recv() == "ok":
            break
    with pytest.raises(ferry.FerryError, match="not registered"):
        peer.open(shared_desc)


def test_a_killed_peer_fails_the_request(owner: Any) -> None:
    _, proc, (path, _, cross_desc) = owner
    me = ferry.Agent("py-survivor")
    peer = me.connect(path)
    remote = peer.open(cross_desc)
    local = me.alloc(1 << 16)
    req = me.write(remote, local, [(0, 0, 1 << 16)])
    proc.kill()
    proc.join()
    with pytest.raises(ferry.FerryError, match="exited"):
        req.wait()
    assert not peer.alive
    with pytest.raises(ferry.FerryError, match="exited"):
        me.write(remote, local, [(0, 0, 1)])


def test_no_agent_there() -> None:
    me = ferry.Agent("py-lonely")
    with pytest.raises(ferry.FerryError):
        me.connect(os.path.join(os.path.dirname(me.socket_path), "nobody.sock"))


def test_a_notification_goes_without_a_wait(owner: Any) -> None:
    conn, _, (path, shared_desc, cross_desc) = owner
    me = ferry.Agent("py-unwaited")
    peer = me.connect(path)
    local = me.alloc(1 << 16)
    local.write(0, b"\x5a" * (1 << 16))
    for which, desc in ((0, shared_desc), (1, cross_desc)):
        remote = peer.open(desc)
        req = me.write(remote, local, [(0, 0, 1 << 16)], notify=b"landed %d" % which)
        conn.send(("note",))  # the request is never waited for
        assert conn.recv() == ("py-unwaited", b"landed %d" % which)
        conn.send(("get", which, (1 << 16) - 4, 4))
        assert conn.recv() == b"\x5a" * 4
        del req


def test_an_existing_array_is_registered_in_place(owner: Any) -> None:
    np = pytest.importorskip("numpy")
    conn, _, _ = owner
    me = ferry.Agent("py-lender")
    kv = np.zeros(4096, dtype=np.uint8)
    region = me.register(kv)
    assert region.nbytes == 4096 and region.ptr == kv.ctypes.data
    assert region.kind == "pageable"
    conn.send(("put", me.socket_path, region.descriptor, 100, b"\xc0\xff\xee"))
    assert conn.recv() == "ok"
    assert bytes(kv[100:103]) == b"\xc0\xff\xee" and kv[99] == 0 and kv[103] == 0
    del region  # the peer let go: returns
    with pytest.raises(ferry.ArgumentError, match="read-only"):
        ro = np.zeros(16, dtype=np.uint8)
        ro.flags.writeable = False
        me.register(ro)
    with pytest.raises(ferry.ArgumentError, match="contiguous"):
        me.register(np.zeros((8, 8), dtype=np.uint8)[:, ::2])


def _tcp_owner(conn: Any) -> None:
    """A peer reached over TCP: a pageable region, answering `get` until `exit`."""
    agent = ferry.Agent("py-tcp-owner")
    at = agent.listen_tcp("127.0.0.1:0", b"a python key, sixteen bytes+")
    region = agent.alloc(2 << 20)
    region.write(0, bytes(range(256)) * 256)
    conn.send((at, region.descriptor))
    while True:
        msg = conn.recv()
        if msg[0] == "get":
            conn.send(region.read(msg[1], msg[2]))
        else:
            return


def test_over_tcp_both_ways_and_a_wrong_key() -> None:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_tcp_owner, args=(child,))
    p.start()
    try:
        # The owner's address, or a failure (an owner that died before sending) instead of a
        # wait for ever.
        for _ in range(600):
            if parent.poll(0.1) or not p.is_alive():
                break
        assert parent.poll(0.1), f"the TCP owner sent nothing (exit code {p.exitcode})"
        at, desc = parent.recv()
        me = ferry.Agent("py-tcp-peer")
        with pytest.raises(ferry.FerryError, match="does not hold this key"):
            me.connect_tcp(at, b"not the key, though sixteen")
        with pytest.raises(ferry.ArgumentError):
            me.connect_tcp(at, b"short")
        peer = me.connect_tcp(at, b"a python key, sixteen bytes+")
        assert peer.name == "py-tcp-owner" and peer.pid == p.pid and peer.alive
        remote = peer.open(desc)
        local = me.alloc(1 << 16)
        local.write(0, b"\x5a" * 4096)
        me.write(remote, local, [(100, 0, 1000), (5000, 2000, 10)], notify=b"x").wait()
        parent.send(("get", 100, 1000))
        assert parent.recv() == b"\x5a" * 1000
        back = me.alloc(1 << 16)
        me.read(back, remote, [(0, 2048, 256)]).wait()
        assert back.read(0, 256) == bytes(range(256))
        # Two streams: 2 MiB cut across both, both ways; streams out of range refused.
        for bad in (0, -1, 17):
            with pytest.raises(ferry.ArgumentError, match="streams"):
                me.connect_tcp(at, b"a python key, sixteen bytes+", streams=bad)
        two = me.connect_tcp(at, b"a python key, sixteen bytes+", streams=2)
        far = two.open(desc)
        big = me.alloc(2 << 20)
        pattern = bytes(range(251)) * (4096 // 251 + 1)
        for off in range(0, 2 << 20, 4096):
            big.write(off, pattern[:4096])
        me.write(far, big, [(0, 0, 2 << 20)]).wait()
        parent.send(("get", (1 << 20) - 10, 4096))
        assert parent.recv() == big.read((1 << 20) - 10, 4096)
        again = me.alloc(2 << 20)
        me.read(again, far, [(0, 0, 2 << 20)]).wait()
        assert again.read(0, 2 << 20) == big.read(0, 2 << 20)
    finally:
        parent.send(("exit",))
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
