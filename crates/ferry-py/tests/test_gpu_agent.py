"""ferry.Agent between two processes on one GPU: device memory (CUDA IPC) and pinned shared
host memory of a peer process, written and read with segment lists, a notification sent
without a wait. Skipped, with the reason, without PyTorch, a CUDA driver or a GPU."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest

import ferry

from _gpu import DEV, torch  # skips this module without PyTorch, a driver or a GPU

N = 1 << 20


def _gpu_owner(conn: Any) -> None:
    """The peer: device memory and pinned shared memory on GPU 0, answering `get` and `note`
    until `exit`."""
    agent = ferry.Agent("py-gpu-owner", device=0)
    dev = agent.alloc(N, kind="device", device=0)
    pinned = agent.alloc(N, kind="pinned")
    pinned.write(0, bytes(range(256)) * (N // 256))
    conn.send((agent.socket_path, dev.descriptor, pinned.descriptor))
    while True:
        msg = conn.recv()
        if msg[0] == "get":
            _, which, off, n = msg
            conn.send((dev if which == 0 else pinned).read(off, n))
        elif msg[0] == "note":
            conn.send(agent.next_notification(timeout=20.0))
        else:
            return


@pytest.fixture
def gpu_owner() -> Any:
    ctx = mp.get_context("spawn")  # a fresh process: no CUDA state inherited
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_gpu_owner, args=(child,))
    p.start()
    yield parent, p, parent.recv()
    if p.is_alive():
        parent.send(("exit",))
    p.join(timeout=20)
    if p.is_alive():
        p.kill()


def test_two_processes_on_one_gpu(gpu_owner: Any) -> None:
    conn, proc, (path, dev_desc, pinned_desc) = gpu_owner
    me = ferry.Agent("py-gpu-peer", device=0)
    peer = me.connect(path)
    assert peer.pid == proc.pid
    dev = peer.open(dev_desc)
    pinned = peer.open(pinned_desc)
    # A tensor's bytes in device memory of this process.
    t = torch.randint(0, 256, (N,), dtype=torch.uint8, device=DEV, generator=None)
    data = t.cpu().numpy().tobytes()
    local = me.alloc(N, kind="device", device=0)
    local.write(0, data)
    # 256 scattered 1 KiB blocks into the peer's device memory, one request, a notification
    # the peer receives though this request is never waited for.
    segs = [(i * 2048, (255 - i) * 1024, 1024) for i in range(256)]
    req = me.write(dev, local, segs, notify=b"kv landed")
    conn.send(("note",))
    assert conn.recv() == ("py-gpu-peer", b"kv landed")
    for d, s, n in (segs[0], segs[255]):
        conn.send(("get", 0, d, n))
        assert conn.recv() == data[s : s + n]
    del req
    # The peer's pinned host memory -> device memory here (an upload across processes).
    back = me.alloc(N, kind="device", device=0)
    me.read(back, pinned, [(0, 0, N)]).wait()
    got = torch.frombuffer(bytearray(back.read(0, N)), dtype=torch.uint8)
    want = torch.arange(256, dtype=torch.uint8).repeat(N // 256)
    assert torch.equal(got, want)
