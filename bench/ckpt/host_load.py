"""Loads into host memory on any machine (no GPU): one safetensors file of 64 float32 tensors
(1 GiB by default), in the page cache, best of N. Rows: ferry into fresh arrays, ferry into
existing arrays (out=), safetensors.numpy.load_file; then saves from host memory: ferry vs
safetensors.numpy.save_file.

    python bench/ckpt/host_load.py [--gib 1] [--repeat 3] [--dir /tmp]
"""

import argparse
import os
import tempfile
import time

import numpy as np

import ferry


def best(f, n):
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return min(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    n = int(a.gib * (1 << 30)) // 64 // 4
    rng = np.random.default_rng(0)
    t = {f"t{i:02}": rng.standard_normal(n, dtype=np.float32) for i in range(64)}
    nbytes = sum(v.nbytes for v in t.values())
    path = os.path.join(a.dir, f"ferry-host-load-{os.getpid()}.safetensors")
    ferry.save_safetensors(t, path)
    with open(path, "rb") as f:  # into the page cache
        while f.read(64 << 20):
            pass
    rows = {}
    rows["ferry load (fresh arrays)"] = best(
        lambda: ferry.load_safetensors(path, device="cpu", framework="numpy"), a.repeat
    )
    out = {k: np.empty_like(v) for k, v in t.items()}
    rows["ferry load (out=, existing arrays)"] = best(
        lambda: ferry.load_safetensors(path, out=out), a.repeat
    )
    try:
        import safetensors.numpy as stn

        rows["safetensors.numpy.load_file"] = best(lambda: stn.load_file(path), a.repeat)
        rows["safetensors.numpy.save_file"] = best(lambda: stn.save_file(t, path + ".st"), a.repeat)
        os.remove(path + ".st")
    except ImportError:
        print("safetensors is missing: its rows are skipped")
    rows["ferry save_safetensors"] = best(lambda: ferry.save_safetensors(t, path + ".f"), a.repeat)
    os.remove(path + ".f")
    os.remove(path)
    print(f"{nbytes / 2**30:.2f} GiB, 64 float32 tensors, page cache warm, best of {a.repeat}:")
    for k, s in rows.items():
        print(f"  {k:38s} {s:8.4f} s  {nbytes / s / 1e9:7.2f} GB/s")
    fresh = rows["ferry load (fresh arrays)"]
    print(f"  fresh / existing: {rows['ferry load (out=, existing arrays)'] / fresh:.2f}x")
    if "safetensors.numpy.load_file" in rows:
        print(f"  fresh / safetensors: {rows['safetensors.numpy.load_file'] / fresh:.2f}x")


if __name__ == "__main__":
    main()
