#!/usr/bin/env python3
"""Memory between two processes over TCP: ferry's agent (`Agent.listen_tcp` /
`Agent.connect_tcp`) against NVIDIA NIXL's (UCX backend, `UCX_TLS=tcp`), the transport each
uses between hosts, run here over loopback. Host memory needs no GPU; `--memory device` puts
both sides' buffers in GPU 0's memory (ferry stages it through host memory at each end; NIXL
needs `UCX_TLS=tcp,cuda_copy`).

A target process registers one host buffer with each agent (a NIXL agent and a ferry agent
listening on TCP); this process registers its own with each and moves `batch` blocks of
`block` bytes with one segment list per call (the i-th block from slot batch-1-i to slot i,
as `ferry bench --test ipc-*`), WRITE and READ, posted and waited, host clock, median of the
samples; ferry's and NIXL's samples alternate. Every row is verified once first: the
destination cleared, one call, the bytes compared.

Usage (nixl_cu13 or nixl, torch, numpy and ferry importable):
  python3 bench/agent/nixl_tcp.py [--full] [--reps N] [--memory host|device] [--streams N]
      [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

os.environ.setdefault("UCX_TLS", "tcp")  # before nixl_compare's own default

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nixl_compare import descs, import_nixl  # noqa: E402  (one NIXL loader, one descriptor maker)

KIB = 1024
MIB = 1 << 20
KEY = b"nixl_tcp.py loopback key"


def tensor(nbytes: int, device: bool):
    """A zeroed uint8 tensor, in GPU 0's memory or the host's (NIXL registers tensors: VRAM or
    DRAM)."""
    import torch

    return torch.zeros(nbytes, dtype=torch.uint8, device="cuda:0" if device else "cpu")


def target(conn, nbytes: int, device: bool) -> None:
    """The target: one buffer registered with NIXL, one with a ferry agent over TCP (host
    memory, or with `device` GPU 0's)."""
    import numpy as np
    import torch

    import ferry

    nixl = import_nixl()
    agent = nixl.nixl_agent("target", nixl.nixl_agent_config(backends=["UCX"]))
    t = tensor(nbytes, device)
    agent.register_memory(t)
    fa = ferry.Agent("target", device=0 if device else None)
    at = fa.listen_tcp("127.0.0.1:0", KEY)
    region = fa.alloc(nbytes, kind="device" if device else "pageable")
    conn.send({"meta": agent.get_agent_metadata(), "buf": t.data_ptr(), "ferry": at,
               "desc": region.descriptor})
    agent.add_remote_agent(conn.recv())
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "nixl":  # the first n bytes of the NIXL buffer
            conn.send(t[: msg[1]].cpu().numpy().tobytes())
        elif msg[0] == "ferry":
            conn.send(region.read(0, msg[1]))
        elif msg[0] == "fill":  # both buffers' first n bytes
            data = msg[1]
            t[: len(data)].copy_(torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy()))
            if device:
                torch.cuda.synchronize()  # landed before NIXL's copies, on streams of their own
            region.write(0, data)
            conn.send("ok")
        else:
            return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="blocks 4 KiB-16 MiB x batches 1-1,024")
    ap.add_argument("--reps", type=int, default=0, help="samples per row (default 5, 11 with --full)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--memory", choices=["host", "device"], default="host",
                    help="both sides' buffers in host memory, or in GPU 0's (staged through "
                    "host memory by each; NIXL: VRAM over UCX's TCP with cuda_copy)")
    ap.add_argument("--streams", type=int, default=None,
                    help="ferry's TCP streams (default: connect_tcp's, 4 or $FERRY_AGENT_TCP_STREAMS)")
    a = ap.parse_args()
    nbytes = 64 * MIB
    reps = a.reps or (11 if a.full else 5)
    blocks = [4 * KIB, 64 * KIB, MIB, 16 * MIB] if a.full else [4 * KIB, MIB]
    batches = [1, 16, 256, 1024] if a.full else [1, 64]

    import numpy as np

    import ferry

    nixl = import_nixl()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    device = a.memory == "device"
    mem = "VRAM" if device else "DRAM"
    proc = ctx.Process(target=target, args=(child, nbytes, device), daemon=True)
    proc.start()
    deadline = time.monotonic() + 120
    while not parent.poll(0.5):
        if not proc.is_alive() or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"nixl_tcp: the target process ended or went quiet (exit code {proc.exitcode})")
    info = parent.recv()
    import torch

    agent = nixl.nixl_agent("initiator", nixl.nixl_agent_config(backends=["UCX"]))
    src = np.frombuffer(np.random.default_rng(7).bytes(nbytes), dtype=np.uint8).copy()
    tsrc, tdst = tensor(nbytes, device), tensor(nbytes, device)
    tsrc.copy_(torch.from_numpy(src))
    if device:
        torch.cuda.synchronize()
    agent.register_memory(tsrc)
    agent.register_memory(tdst)
    remote = agent.add_remote_agent(info["meta"])
    parent.send(agent.get_agent_metadata())
    parent.recv()  # ready
    fa = ferry.Agent("initiator", device=0 if device else None)
    peer = fa.connect_tcp(info["ferry"], KEY, streams=a.streams)
    fremote = peer.open(info["desc"])
    kind = "device" if device else "pageable"
    fsrc = fa.alloc(nbytes, kind=kind)
    fsrc.write(0, src.tobytes())
    fdst = fa.alloc(nbytes, kind=kind)
    streams = a.streams or os.environ.get("FERRY_AGENT_TCP_STREAMS", "default")
    print(f"ferry agent over TCP ({streams} streams) vs NIXL (UCX_TLS={os.environ['UCX_TLS']}), "
          f"{a.memory} memory, two processes, loopback, {reps} samples per row, "
          f"{os.cpu_count()} CPUs")

    backend = {"name": ""}

    def nixl_op(op: str, block: int, batch: int) -> None:
        write = op == "WRITE"
        local = tsrc.data_ptr() if write else tdst.data_ptr()
        ld = agent.get_xfer_descs(descs(local, block, batch, 0, not write), mem)
        rd = agent.get_xfer_descs(descs(info["buf"], block, batch, 0, write), mem)
        h = agent.initialize_xfer(op, ld, rd, remote)
        st = agent.transfer(h)
        stuck = time.monotonic() + 60.0
        while st == "PROC":
            st = agent.check_xfer_state(h)
            if time.monotonic() > stuck:
                raise RuntimeError(f"NIXL {op} of {batch} x {block} B: not done after 60 s")
        if st != "DONE":
            raise RuntimeError(f"NIXL transfer failed: {st}")
        if not backend["name"]:
            backend["name"] = agent.query_xfer_backend(h)
        agent.release_xfer_handle(h)

    def ferry_segs(block: int, batch: int, write: bool):
        # (destination offset, source offset, length): slot batch-1-i -> slot i.
        return [(i * block, (batch - 1 - i) * block, block) for i in range(batch)]

    def ferry_op(op: str, block: int, batch: int) -> None:
        segs = ferry_segs(block, batch, op == "WRITE")
        if op == "WRITE":
            fa.write(fremote, fsrc, segs).wait()
        else:
            fa.read(fdst, fremote, segs).wait()

    def verify(op: str, block: int, batch: int) -> None:
        n = block * batch
        want = bytearray(n)
        for i in range(batch):  # slot batch-1-i of the source at slot i
            want[i * block:(i + 1) * block] = src[(batch - 1 - i) * block:(batch - i) * block].tobytes()
        if op == "WRITE":
            parent.send(("fill", bytes(n)))
            parent.recv()
            nixl_op(op, block, batch)
            ferry_op(op, block, batch)
            for who in ("nixl", "ferry"):
                parent.send((who, n))
                if parent.recv() != bytes(want):
                    raise RuntimeError(f"{who} {op} {batch} x {block}: wrong bytes")
        else:
            parent.send(("fill", src[:n].tobytes()))
            parent.recv()
            tdst[:n].zero_()
            if device:
                torch.cuda.synchronize()
            fdst.write(0, bytes(n))
            nixl_op(op, block, batch)
            ferry_op(op, block, batch)
            if tdst[:n].cpu().numpy().tobytes() != bytes(want) or fdst.read(0, n) != bytes(want):
                raise RuntimeError(f"{op} {batch} x {block}: wrong bytes")

    rows = []
    print(f"{'op':<6} {'block':>9} {'batch':>6} {'ferry GB/s':>11} {'NIXL GB/s':>10} {'ratio':>6}")
    for block in blocks:
        for batch in batches:
            if block * batch > nbytes:
                continue
            for op in ("WRITE", "READ"):
                verify(op, block, batch)
                tf, tn = [], []
                for _ in range(reps):
                    t = time.perf_counter()
                    ferry_op(op, block, batch)
                    tf.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    nixl_op(op, block, batch)
                    tn.append(time.perf_counter() - t)
                n = block * batch
                f, x = n / statistics.median(tf) / 1e9, n / statistics.median(tn) / 1e9
                rows.append({"op": op, "block": block, "batch": batch, "bytes": n, "streams": streams,
                             "memory": a.memory,
                             "ferry_gbps": f, "nixl_gbps": x, "ratio": f / x,
                             "nixl_backend": backend["name"]})
                print(f"{op:<6} {block:>9} {batch:>6} {f:>11.3f} {x:>10.3f} {f / x:>6.2f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    gm = statistics.geometric_mean(ratios)
    print(f"ferry / NIXL: geometric mean {gm:.2f} ({min(ratios):.2f}..{max(ratios):.2f}) over "
          f"{len(rows)} rows; NIXL backend {backend['name']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    parent.send(("exit",))
    proc.join(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
