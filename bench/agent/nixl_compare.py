#!/usr/bin/env python3
"""The transfers of ferry's `examples/09_agent_ipc.rs`, through NVIDIA NIXL's Python API.

Two NIXL agents in two processes on one GPU (UCX backend; `UCX_TLS=cuda_ipc,cuda_copy,sm,self,tcp`
unless UCX_TLS is already set, tcp only for the wire-up, which needs peer-failure handling;
`UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on` unless set, so that a READ is a CUDA IPC get on a card without
NVLink too; `UCX_PROTO_EMULATION_ENABLE=n` makes a row that would fall back to tcp fail): the target
registers a device buffer and a pinned host buffer (torch), the initiator registers its own and
moves segment lists with `initialize_xfer` + `transfer`, polling `check_xfer_state`.

Rows (the same names, segments and sizes as ferry's example; GB/s = 10^9 B/s of payload, host
clock around post + completion, median of the samples):
  ipc-d2d-write   device here -> the target's device        (WRITE)
  ipc-d2d-read    the target's device -> device here        (READ)
  ipc-h2d-read    the target's pinned host -> device here   (READ)
  ipc-d2h-write   device here -> the target's pinned host   (WRITE)
  ipc-post        1..15,000 segments device -> device: post = building the descriptor lists,
                  initialize_xfer and transfer (what a caller pays per transfer)

`batch` segments of `block` bytes: the i-th goes from slot batch-1-i to slot i, as ferry's.

Usage (on the GPU host, nixl from the nixl_cu13 wheel, torch with CUDA):
  python3 bench/agent/nixl_compare.py [--full] [--reps N] [--json OUT]
  python3 bench/agent/nixl_compare.py --ferry ferry.json     # ferry's rows beside NIXL's, ratios
where ferry.json comes from `09_agent_ipc [--full] --json ferry.json` with the same options.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

# tcp: NIXL asks UCX for peer-failure handling, which UCX's shared-memory transports lack, so
# the wire-up's active messages need it (the copies themselves still take cuda_ipc/cuda_copy).
os.environ.setdefault("UCX_TLS", "cuda_ipc,cuda_copy,sm,self,tcp")
# READs over CUDA IPC: UCX turns cuda_ipc's get (a READ's zero-copy) off where it finds no NVLink
# ("cuda-ipc get zcopy disabled as no nvlinks detected", a PCIe card such as the H100 hosts'),
# and a READ then falls back to its protocol emulation over tcp: the first H100 run's READ and
# host rows (0.08-0.93 GB/s). `on` keeps the get; the other two leave UCX's default where set.
os.environ.setdefault("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "on")

KIB = 1024
MIB = 1 << 20


def import_nixl():
    """The nixl module: `nixl_cu13` (the wheel's name) or `nixl`."""
    try:
        import nixl_cu13 as nixl  # type: ignore
    except ImportError:
        import nixl  # type: ignore
    return nixl


def sweep(full: bool, nbytes: int) -> list[tuple[int, int]]:
    """(block, batch) pairs, as ferry's example."""
    blocks = [4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB] if full else [4 * KIB, MIB, 16 * MIB]
    batches = [1, 16, 256, 1024] if full else [1, 64]
    return [(b, n) for b in blocks for n in batches if b * n <= nbytes]


def target(conn, nbytes: int) -> None:
    """The target process: registers device and pinned memory, sends its metadata."""
    import torch

    nixl = import_nixl()
    agent = nixl.nixl_agent("target", nixl.nixl_agent_config(backends=["UCX"]))
    dev = torch.zeros(nbytes, dtype=torch.uint8, device="cuda:0")
    host = torch.zeros(nbytes, dtype=torch.uint8).pin_memory()
    agent.register_memory(dev)
    agent.register_memory(host)
    conn.send(
        {
            "meta": agent.get_agent_metadata(),
            "dev": dev.data_ptr(),
            "host": host.data_ptr(),
        }
    )
    agent.add_remote_agent(conn.recv())  # the initiator's metadata (for notifications)
    conn.send("ready")
    conn.recv()  # "done"
    conn.close()


def descs(base: int, block: int, batch: int, dev_id: int, dst_side: bool):
    """Nx3 (address, length, device) rows: slot i (destination side) or batch-1-i."""
    import numpy as np

    idx = np.arange(batch, dtype=np.uint64)
    if not dst_side:
        idx = np.uint64(batch - 1) - idx
    a = np.empty((batch, 3), dtype=np.uint64)
    a[:, 0] = np.uint64(base) + idx * np.uint64(block)
    a[:, 1] = block
    a[:, 2] = dev_id
    return a


def recv_from(conn, proc, what: str, timeout: float = 120.0):
    """The next message from the target process; exits naming `what` if it died or went quiet
    (a failed NIXL backend in the target would otherwise leave this process waiting forever)."""
    deadline = time.monotonic() + timeout
    while not conn.poll(0.5):
        if not proc.is_alive():
            sys.exit(f"nixl_compare: the target process ended (exit code {proc.exitcode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"nixl_compare: no {what} from the target process in {timeout:.0f} s")
    return conn.recv()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the whole sweep, 1 GiB buffers")
    ap.add_argument("--reps", type=int, default=0, help="samples per row (default 5, 20 with --full)")
    ap.add_argument("--bytes", type=int, default=0, help="bytes per buffer (default 256 MiB, 1 GiB with --full)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--ferry", help="ferry's rows (09_agent_ipc --json): print the ratios")
    a = ap.parse_args()
    nbytes = a.bytes or ((1 << 30) if a.full else 256 * MIB)
    reps = a.reps or (20 if a.full else 5)

    import torch

    nixl = import_nixl()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, nbytes), daemon=True)
    proc.start()
    info = recv_from(parent, proc, "its metadata")

    agent = nixl.nixl_agent("initiator", nixl.nixl_agent_config(backends=["UCX"]))
    dev = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda:0")
    agent.register_memory(dev)
    remote = agent.add_remote_agent(info["meta"])
    parent.send(agent.get_agent_metadata())
    recv_from(parent, proc, '"ready"')
    print(
        f"NIXL two processes on one GPU, {nbytes // MIB} MiB per buffer, {reps} samples per row, "
        f"UCX_TLS={os.environ.get('UCX_TLS')}, "
        f"UCX_CUDA_IPC_ENABLE_GET_ZCOPY={os.environ.get('UCX_CUDA_IPC_ENABLE_GET_ZCOPY')}, "
        f"UCX_PROTO_EMULATION_ENABLE={os.environ.get('UCX_PROTO_EMULATION_ENABLE', '(default)')}, "
        f"metadata {len(info['meta'])} bytes"
    )

    def run(op: str, local_type: str, local_base: int, remote_type: str, remote_base: int,
            block: int, batch: int) -> tuple[float, float, str]:
        write = op == "WRITE"
        backend = ""

        def once() -> float:
            nonlocal backend
            t = time.perf_counter()
            # WRITE: local slot batch-1-i -> remote slot i; READ: remote slot batch-1-i -> local i.
            ld = agent.get_xfer_descs(descs(local_base, block, batch, 0, not write), local_type)
            rd = agent.get_xfer_descs(descs(remote_base, block, batch, 0, write), remote_type)
            h = agent.initialize_xfer(op, ld, rd, remote)
            st = agent.transfer(h)
            post = time.perf_counter() - t
            stuck = time.monotonic() + 20.0
            while st == "PROC":
                st = agent.check_xfer_state(h)
                if time.monotonic() > stuck:
                    raise RuntimeError(f"NIXL {op} of {batch} x {block} B: not done after 20 s")
            if st != "DONE":
                raise RuntimeError(f"NIXL transfer failed: {st}")
            if not backend:
                backend = agent.query_xfer_backend(h)
            agent.release_xfer_handle(h)
            return post

        for _ in range(2):
            once()
        total, posts = [], []
        for _ in range(reps):
            t = time.perf_counter()
            posts.append(once())
            total.append(time.perf_counter() - t)
        return statistics.median(total), statistics.median(posts), backend

    rows = []
    cases = [
        ("ipc-d2d-write", "WRITE", "VRAM", dev.data_ptr(), "VRAM", info["dev"]),
        ("ipc-d2d-read", "READ", "VRAM", dev.data_ptr(), "VRAM", info["dev"]),
        ("ipc-h2d-read", "READ", "VRAM", dev.data_ptr(), "DRAM", info["host"]),
        ("ipc-d2h-write", "WRITE", "VRAM", dev.data_ptr(), "DRAM", info["host"]),
    ]
    for block, batch in sweep(a.full, nbytes):
        for name, op, lt, lb, rt, rb in cases:
            t, post, backend = run(op, lt, lb, rt, rb, block, batch)
            rows.append({"row": name, "block": block, "batch": batch, "bytes": block * batch,
                         "nixl_gbps": block * batch / t / 1e9, "post_us": post * 1e6,
                         "backend": backend})
            print(f"  {name} {batch} x {block} B: {block * batch / t / 1e9:.2f} GB/s", flush=True)
    pblock = 66 * 1000 if a.full else 16 * KIB
    for batch in (1, 100, 1000, 15_000):
        if pblock * batch <= nbytes:
            t, post, backend = run("WRITE", "VRAM", dev.data_ptr(), "VRAM", info["dev"], pblock, batch)
            rows.append({"row": "ipc-post", "block": pblock, "batch": batch, "bytes": pblock * batch,
                         "nixl_gbps": pblock * batch / t / 1e9, "post_us": post * 1e6,
                         "backend": backend})
    # NIXL's serialized descriptor list of 15,000 entries (nixl #156 reports 20 MB).
    big = agent.get_xfer_descs(descs(info["dev"], pblock, 15_000, 0, True), "VRAM")
    print(f"serialized 15,000-descriptor list: {len(agent.get_serialized_descs(big))} bytes")

    ferry = {}
    if a.ferry:
        with open(a.ferry) as f:
            for r in json.load(f):
                ferry[(r["row"], r["block"], r["batch"])] = r
    print(f"{'row':<15} {'block':>9} {'batch':>6} {'NIXL GB/s':>10} {'post us':>10} "
          f"{'ferry GB/s':>10} {'ferry post':>10} {'ratio':>6}  backend")
    for r in rows:
        fr = ferry.get((r["row"], r["block"], r["batch"]))
        fg = f"{fr['ferry_gbps']:.2f}" if fr else "-"
        fp = f"{fr['post_us']:.1f}" if fr else "-"
        ratio = f"{fr['ferry_gbps'] / r['nixl_gbps']:.2f}" if fr else "-"
        if fr:
            r["ferry_gbps"], r["ferry_post_us"] = fr["ferry_gbps"], fr["post_us"]
        print(f"{r['row']:<15} {r['block']:>9} {r['batch']:>6} {r['nixl_gbps']:>10.2f} "
              f"{r['post_us']:>10.1f} {fg:>10} {fp:>10} {ratio:>6}  {r['backend']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {a.json}")
    parent.send("done")
    proc.join(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
