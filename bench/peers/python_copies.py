#!/usr/bin/env python3
"""ferry's Python module against PyTorch and safetensors, in one process, on one GPU.

Each row times ferry and its PyTorch peer on the same buffers, host clock around the
caller's whole call (the copy waited for: `torch.cuda.synchronize()` after PyTorch's
asynchronous calls, ferry's blocking default), median of --runs runs after --warmup
warm-up runs, and prints ferry's speedup (peer time / ferry time; for the 4 KiB row also the
time ratio ferry / peer). Data is checked once per row. JSON to --json (default stdout).

    PYTHONPATH=/tmp/site python3 bench/peers/python_copies.py --json python_copies.json

Issue 18's targets: pageable -> GPU >= 5x `tensor.to("cuda")` at 256 MiB and 2 GiB; pinned
>= 0.98x `copy_(non_blocking=True)` + synchronize; 4 KiB with its wait <= 1.2x `copy_` +
`synchronize`; 100,000 scattered 4 KiB rows >= 5x `t[idx].to("cuda")`; a 4 GiB safetensors
checkpoint >= 5x `safetensors.torch.load_file(device="cuda:0")`.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import ferry

MiB = 1 << 20
GiB = 1 << 30


def timed(fn, runs, warmup, inner=1):
    """Median seconds of one call of fn (inner calls per sample)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples), samples


def check(a, b, what):
    if not torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8)):
        raise SystemExit(f"{what}: data differs")


def row(rows, name, nbytes, ferry_s, peer_s, peer, target, time_ratio=False):
    speedup = peer_s / ferry_s
    r = {
        "row": name,
        "bytes": nbytes,
        "ferry_s": ferry_s,
        "peer": peer,
        "peer_s": peer_s,
        "ferry_GBps": nbytes / ferry_s / 1e9,
        "peer_GBps": nbytes / peer_s / 1e9,
        "speedup": speedup,
        "target": target,
    }
    if time_ratio:
        r["time_ratio"] = ferry_s / peer_s
        ok = r["time_ratio"] <= target
        shown = f"time ratio {r['time_ratio']:.2f}x (target <= {target}x)"
    else:
        ok = speedup >= target
        shown = f"speedup {speedup:.2f}x (target >= {target}x)"
    r["meets_target"] = ok
    rows.append(r)
    print(
        f"{name:<34} ferry {ferry_s * 1e3:10.3f} ms {r['ferry_GBps']:7.2f} GB/s | "
        f"{peer:<38} {peer_s * 1e3:10.3f} ms {r['peer_GBps']:7.2f} GB/s | {shown} {'ok' if ok else 'MISSED'}",
        flush=True,
    )


def pageable_h2d(rows, size, a):
    src = torch.randint(0, 256, (size,), dtype=torch.uint8)
    dst = torch.empty(size, dtype=torch.uint8, device=a.dev)
    ferry.copy_(dst, src)
    check(dst, src, f"pageable {size}")

    def peer():
        src.to(a.dev)
        torch.cuda.synchronize()

    f, _ = timed(lambda: ferry.copy_(dst, src), a.runs, a.warmup)
    p, _ = timed(peer, a.runs, a.warmup)
    row(rows, f"pageable->gpu {size // MiB} MiB", size, f, p, 'tensor.to("cuda")', 5.0)


def pinned_h2d(rows, size, a):
    src = torch.randint(0, 256, (size,), dtype=torch.uint8).pin_memory()
    dst = torch.empty(size, dtype=torch.uint8, device=a.dev)
    ferry.copy_(dst, src)
    check(dst, src, f"pinned {size}")

    def peer():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()

    f, _ = timed(lambda: ferry.copy_(dst, src), a.runs, a.warmup)
    p, _ = timed(peer, a.runs, a.warmup)
    row(rows, f"pinned->gpu {size // MiB} MiB", size, f, p, "copy_(non_blocking=True)+sync", 0.98)


def small(rows, a):
    size = 4096
    src = torch.randint(0, 256, (size,), dtype=torch.uint8).pin_memory()
    dst = torch.empty(size, dtype=torch.uint8, device=a.dev)
    ferry.copy_(dst, src)
    check(dst, src, "4 KiB")

    def peer():
        dst.copy_(src)
        torch.cuda.synchronize()

    inner = 1000
    f, _ = timed(lambda: ferry.copy_(dst, src), a.runs, a.warmup, inner)
    p, _ = timed(peer, a.runs, a.warmup, inner)
    row(rows, "4 KiB pinned->gpu + wait", size, f, p, "copy_ + torch.cuda.synchronize()", 1.2, True)
    # The same on ferry's own streams (stream="ferry": no ordering with PyTorch's stream).
    f2, _ = timed(lambda: ferry.copy_(dst, src, stream="ferry"), a.runs, a.warmup, inner)
    row(rows, "4 KiB ... stream='ferry'", size, f2, p, "copy_ + torch.cuda.synchronize()", 1.2, True)


def gather(rows, a):
    row_elems, n = 1024, 100_000  # 4 KiB float32 rows
    total_rows = a.gather_rows
    src = torch.randn((total_rows, row_elems))
    idx = torch.randint(0, total_rows, (n,), dtype=torch.int64)
    out = torch.empty((n, row_elems), device=a.dev)
    ferry.gather(src, idx, out)
    check(out, src[idx], "gather")

    def peer():
        src[idx].to(a.dev)
        torch.cuda.synchronize()

    f, _ = timed(lambda: ferry.gather(src, idx, out), a.runs, a.warmup)
    p, _ = timed(peer, a.runs, a.warmup)
    row(rows, "gather 100,000 x 4 KiB ->gpu", n * row_elems * 4, f, p, 't[idx].to("cuda")', 5.0)


def checkpoint(rows, a):
    from safetensors.torch import load_file, save_file

    folder = a.dir or tempfile.mkdtemp(prefix="ferry-peers-")
    path = os.path.join(folder, "ferry-peers-4GiB.safetensors")
    n, each = 16, a.ckpt_bytes // 16
    if not os.path.exists(path) or os.path.getsize(path) < a.ckpt_bytes:
        g = torch.Generator().manual_seed(0)
        tensors = {
            f"layer{i}.weight": torch.randn((each // 2 // 4096, 4096), generator=g).to(torch.bfloat16)
            for i in range(n)
        }
        save_file(tensors, path)
        del tensors
    nbytes = os.path.getsize(path)
    with open(path, "rb") as f:  # into the page cache, as both loaders read it from there
        while f.read(64 * MiB):
            pass
    mine = ferry.load_safetensors(path, device=a.dev)
    ref = load_file(path, device=a.dev)
    for k in ref:
        check(mine[k], ref[k], f"checkpoint {k}")
    del mine, ref
    gc.collect()
    torch.cuda.empty_cache()

    def ours():
        t = ferry.load_safetensors(path, device=a.dev)
        del t

    def peer():
        t = load_file(path, device=a.dev)
        torch.cuda.synchronize()
        del t

    f, _ = timed(ours, a.runs, a.warmup)
    p, _ = timed(peer, a.runs, a.warmup)
    row(rows, f"safetensors {nbytes / GiB:.1f} GiB ->gpu", nbytes, f, p, 'load_file(device="cuda:0")', 5.0)
    if not a.keep and not a.dir:
        os.remove(path)
        os.rmdir(folder)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", help="write the results here (default: stdout)")
    ap.add_argument("--dir", help="folder for the checkpoint (kept); default a temporary one")
    ap.add_argument("--keep", action="store_true", help="keep the temporary checkpoint")
    ap.add_argument("--ckpt-bytes", type=int, default=4 * GiB)
    ap.add_argument("--gather-rows", type=int, default=262_144, help="rows of the 4 KiB source (1 GiB)")
    ap.add_argument("--only", help="comma list of rows: pageable,pinned,small,gather,checkpoint")
    a = ap.parse_args()
    a.dev = f"cuda:{a.device}"
    torch.cuda.init()
    only = set(a.only.split(",")) if a.only else None
    info = ferry.info()
    print(f"ferry {info['version']}, driver {info['cuda_driver']}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(a.device)}; median of {a.runs} after {a.warmup} warm-up", flush=True)
    rows = []
    steps = [
        ("pageable", lambda: [pageable_h2d(rows, s, a) for s in (256 * MiB, 2 * GiB)]),
        ("pinned", lambda: [pinned_h2d(rows, s, a) for s in (256 * MiB, 2 * GiB)]),
        ("small", lambda: small(rows, a)),
        ("gather", lambda: gather(rows, a)),
        ("checkpoint", lambda: checkpoint(rows, a)),
    ]
    for name, step in steps:
        if only is None or name in only:
            step()
            gc.collect()
            torch.cuda.empty_cache()
    out = {
        "what": "ferry Python module vs PyTorch/safetensors, host clock, caller's view",
        "ferry": info,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "runs": a.runs,
        "warmup": a.warmup,
        "rows": rows,
    }
    text = json.dumps(out, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
        print(f"wrote {a.json}")
    else:
        print(text)
    missed = [r["row"] for r in rows if not r["meets_target"]]
    print("all targets met" if not missed else f"targets missed: {', '.join(missed)}")


if __name__ == "__main__":
    main()
