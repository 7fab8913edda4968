"""Checkpoints at model scale, ferry against its peers, on one GPU (issue 35).

Generates a sharded bf16 checkpoint in Hugging Face's layout (8 shards x 2 GiB, about 2,000
tensors from 8 KiB to 256 MiB at --scale 1; --scale 0.125 for a quick run) under --dir, then:

- loads it to the GPU (page cache warm; --cold also drops the page cache before each run, as
  root) with ferry, safetensors.torch.load_file, fastsafetensors (nogds, 16 threads, 16 MiB
  bounce buffer) and the Run:ai Model Streamer (RUNAI_STREAMER_CONCURRENCY=16);
- saves it from the GPU with ferry (blocking, and non_blocking: the stall until the tensors may
  change, and the whole write), safetensors.torch.save_file and torch.save.

A peer that is not installed is skipped with a line saying so. Prints GB/s per row and the
ratios ferry/peer; writes everything as JSON (--json). Every row is the best of --repeat runs,
timed on the host clock from the call until the bytes are on the GPU (torch.cuda.synchronize)
or in the files.

    python bench/ckpt/compare.py --scale 1 --repeat 3 --json /tmp/ckpt-compare.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Optional


def human(n: float) -> str:
    for u in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {u}"
        n /= 1024
    return f"{n:.1f} TiB"


# One "layer" of a transformer-like checkpoint: norms and biases (KiB), projections (MiB),
# about 81 MiB in 10 tensors; 200 layers and two 256 MiB embeddings make about 2,000 tensors
# and 16 GiB at --scale 1.
LAYER = [8 << 10, 8 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 24 << 20, 36 << 20]


def tensor_sizes(scale: float) -> list[int]:
    """Tensor sizes in bytes (bf16: even) of the generated checkpoint."""
    layers = max(2, round(200 * scale))
    return LAYER * layers + [256 << 20, 256 << 20]


def generate(d: str, scale: float, shards: int) -> tuple[str, int, int]:
    """Writes the checkpoint under `d` in `shards` shards (once: reused when its index is
    there, unless --keep was not given last time)."""
    import torch

    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        meta = json.load(open(index))
        return index, int(meta["metadata"]["total_size"]), len(meta["weight_map"])
    import ferry

    os.makedirs(d, exist_ok=True)
    sizes = tensor_sizes(scale)
    g = torch.Generator().manual_seed(0)
    t = {}
    for i, n in enumerate(sizes):
        t[f"model.layers.{i // 8}.w{i % 8}"] = torch.randint(
            -(2**15), 2**15 - 1, (n // 2,), dtype=torch.int16, generator=g
        ).view(torch.bfloat16)
    shard = max(1, sum(sizes) // shards + (256 << 20))
    ferry.save_safetensors(t, index, max_shard_size=shard)
    return index, sum(sizes), len(sizes)


def drop_cache() -> str:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "cold (page cache dropped before each run)"
    except OSError as e:
        return f"warm (cannot drop the page cache: {e})"


def best(f: Callable[[], Any], repeat: int, before: Optional[Callable[[], Any]] = None) -> float:
    out = []
    for _ in range(repeat):
        if before:
            before()
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="1: about 16 GiB in 8 shards, 2,000 tensors; 0.125: 2.5 GiB")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--dir", default="/tmp/ferry-ckpt-compare")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each load")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoint")
    a = ap.parse_args()

    import torch

    import ferry

    src = os.path.join(a.dir, f"src-{a.scale:g}")
    index, nbytes, ntensors = generate(src, a.scale, a.shards)
    files = sorted(glob.glob(os.path.join(src, "*.safetensors")))
    dev = torch.device(a.device)
    print(
        f"checkpoint: {len(files)} shards, {ntensors} bf16 tensors, {human(nbytes)} in {src}",
        flush=True,
    )
    before = None
    cache = "warm (read once before the runs)"
    if a.cold:
        cache = drop_cache()
        before = drop_cache
    else:
        for f in files:
            with open(f, "rb") as fh:
                while fh.read(256 << 20):
                    pass
    print(f"page cache: {cache}")
    rows: dict[str, dict[str, float]] = {"load": {}, "save": {}}
    missing: list[str] = []

    def sync() -> None:
        torch.cuda.synchronize(dev)

    # Loads to the GPU.
    def ferry_load() -> None:
        t = ferry.load_safetensors(index, device=a.device, framework="torch")
        sync()
        del t

    rows["load"]["ferry.load_safetensors"] = best(ferry_load, a.repeat, before)
    out = ferry.load_safetensors(index, device=a.device, framework="torch")
    out = {k: torch.empty_like(v) for k, v in out.items()}

    def ferry_into() -> None:
        ferry.load_safetensors(index, out=out)
        sync()

    rows["load"]["ferry.load_safetensors(out=state_dict)"] = best(ferry_into, a.repeat, before)
    try:
        import safetensors.torch as stt

        def st_load() -> None:
            t = {}
            for f in files:
                t.update(stt.load_file(f, device=str(dev)))
            sync()

        rows["load"]["safetensors.torch.load_file"] = best(st_load, a.repeat, before)
    except ImportError:
        missing.append("safetensors: its rows are skipped (pip install safetensors)")
    try:
        from fastsafetensors import SafeTensorsFileLoader

        def fst_load() -> None:
            loader = SafeTensorsFileLoader(
                None, str(dev), nogds=True, max_threads=16, bbuf_size_kb=16 * 1024
            )
            loader.add_filenames({0: files})
            fb = loader.copy_files_to_device()
            t = {k: fb.get_tensor(k) for k in loader.get_keys()}
            sync()
            del t
            fb.close()
            loader.close()

        rows["load"]["fastsafetensors (nogds)"] = best(fst_load, a.repeat, before)
    except ImportError:
        missing.append("fastsafetensors: its row is skipped (pip install fastsafetensors)")
    try:
        os.environ.setdefault("RUNAI_STREAMER_CONCURRENCY", "16")
        from runai_model_streamer import SafetensorsStreamer

        def runai_load() -> None:
            t = {}
            with SafetensorsStreamer() as s:
                s.stream_files(files, device=str(dev))
                for name, x in s.get_tensors():
                    t[name] = x.to(dev, non_blocking=True)
            sync()

        rows["load"]["runai SafetensorsStreamer"] = best(runai_load, a.repeat, before)
    except ImportError:
        missing.append("runai_model_streamer: its row is skipped (pip install runai-model-streamer)")

    # Saves from the GPU.
    dst = os.path.join(a.dir, "dst")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    shard = nbytes // max(1, len(files)) + (256 << 20)

    def ferry_save() -> None:
        ferry.save_safetensors(out, dst, max_shard_size=shard)

    rows["save"]["ferry.save_safetensors"] = best(ferry_save, a.repeat)
    stalls = []

    def ferry_async() -> None:
        t0 = time.perf_counter()
        req = ferry.save_safetensors(out, dst, max_shard_size=shard, non_blocking=True)
        stalls.append(time.perf_counter() - t0)
        assert req is not None
        req.wait()

    rows["save"]["ferry non_blocking (whole write)"] = best(ferry_async, a.repeat)
    rows["save"]["ferry non_blocking (caller's stall)"] = min(stalls)
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in out.items()}

    def d2h() -> None:
        for k, v in out.items():
            pinned[k].copy_(v, non_blocking=True)
        sync()

    rows["save"]["torch pinned D2H copy (the stall's floor)"] = best(d2h, a.repeat)
    del pinned
    try:
        import safetensors.torch as stt

        def st_save() -> None:
            names = list(out)
            per = max(1, len(names) // max(1, len(files)))
            for i in range(0, len(names), per):
                stt.save_file(
                    {k: out[k] for k in names[i : i + per]}, os.path.join(dst, f"st-{i}.safetensors")
                )

        rows["save"]["safetensors.torch.save_file"] = best(st_save, a.repeat)
    except ImportError:
        pass

    def torch_save() -> None:
        torch.save(out, os.path.join(dst, "torch.pt"))

    rows["save"]["torch.save"] = best(torch_save, a.repeat)
    if not a.keep:
        shutil.rmtree(dst, ignore_errors=True)

    for m in missing:
        print(f"missing: {m}")
    print(f"best of {a.repeat}, {human(nbytes)} per run, host clock:")
    report: dict[str, Any] = {
        "bytes": nbytes,
        "tensors": ntensors,
        "shards": len(files),
        "scale": a.scale,
        "page_cache": cache,
        "repeat": a.repeat,
        "missing": missing,
        "rows": {},
        "ratios": {},
    }
    for kind, r in rows.items():
        ferry_key = "ferry.load_safetensors" if kind == "load" else "ferry.save_safetensors"
        for name, s in r.items():
            gbs = nbytes / s / 1e9
            report["rows"][f"{kind}: {name}"] = {"seconds": s, "gb_per_s": gbs}
            print(f"  {kind:4s} {name:44s} {s:8.3f} s {gbs:8.2f} GB/s")
        for name, s in r.items():
            if not name.startswith("ferry") and not name.startswith("torch pinned"):
                ratio = s / r[ferry_key]
                report["ratios"][f"{kind}: ferry / {name}"] = ratio
                print(f"  {kind:4s} ferry / {name:36s} {ratio:6.2f}x")
    stall = rows["save"]["ferry non_blocking (caller's stall)"]
    floor = rows["save"]["torch pinned D2H copy (the stall's floor)"]
    report["ratios"]["save: stall / pinned D2H copy"] = stall / floor
    print(f"  save stall / pinned D2H copy {stall / floor:6.2f}x (target <= 1.1)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {a.json}")
    if not a.keep:
        shutil.rmtree(src, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
