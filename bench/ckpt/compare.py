"""Checkpoints at model scale, ferry against its peers, on one GPU (issue 35).

Generates a sharded bf16 checkpoint in Hugging Face's layout (8 shards x 2 GiB, about 2,000
tensors from 8 KiB to 256 MiB at --scale 1; --scale 0.125 for a quick run) under --dir, then:

- loads it to the GPU (page cache warm; --cold also drops the page cache before each run, as
  root) with ferry, safetensors.torch.load_file, fastsafetensors (nogds, 16 threads, 16 MiB
  bounce buffer) and the Run:ai Model Streamer (RUNAI_STREAMER_CONCURRENCY=16);
- loads its shards' raw bytes to the GPU with KvikIO (kvikio.CuFile.pread into one torch
  buffer per shard, every shard in flight at once: the file -> GPU floor, no tensors made);
- saves it from the GPU with ferry (blocking, and non_blocking: the stall until the tensors may
  change, and the whole write), safetensors.torch.save_file, torch.save and PyTorch DCP's
  async_save on one process (its stall, and its whole write);
- measures the disk under --dir: O_DIRECT write and read of a --disk-bytes file (2 GiB) with
  fio (best of queue depths 1, 4, 16, 64) where fio is installed, else dd (one stream); the
  table says which.

A peer that is not installed (or fails to start) is skipped with a line saying so. Prints GB/s
per row, what each row is, and the ratios ferry/peer (in GB/s: the disk rows move another
byte count); writes everything as JSON (--json). Every row is the best of --repeat runs, timed
on the host clock from the call until the bytes are on the GPU (torch.cuda.synchronize) or in
the files; before each save run (untimed) `os.sync()` writes out the page cache's dirty pages,
so no run inherits the previous one's writeback. --rows disk runs the disk rows alone (no GPU, no PyTorch: any machine).

    python bench/ckpt/compare.py --scale 1 --repeat 3 --json /tmp/ckpt-compare.json
    python bench/ckpt/compare.py --rows disk --disk-bytes 256M   # CPU-only machines
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


def dirty_limits() -> dict[str, Any]:
    """The kernel's page-cache writeback limits and the memory they are taken of: how many
    dirty bytes a writer may leave before it is throttled to the disk's rate (the save rows
    into the page cache are disk-bound beyond that)."""
    out: dict[str, Any] = {}
    for name in ("dirty_ratio", "dirty_background_ratio", "dirty_bytes", "dirty_background_bytes"):
        try:
            with open(f"/proc/sys/vm/{name}") as f:
                out[name] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            out[name] = None
    try:
        with open("/proc/meminfo") as f:
            mem = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        out["mem_available"] = mem.get("MemAvailable")
    except (OSError, ValueError):
        out["mem_available"] = None
    ratio, avail, fixed = out["dirty_ratio"], out["mem_available"], out["dirty_bytes"]
    out["dirty_limit_bytes"] = fixed if fixed else (ratio * avail // 100 if ratio and avail else None)
    return out


def drop_cache() -> str:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "cold (page cache dropped before each run)"
    except OSError as e:
        return f"warm (cannot drop the page cache: {e})"


# What each row measures (printed under the table and in --help).
ROWS = {
    "load: ferry.load_safetensors": "ferry, the sharded checkpoint to new GPU tensors (one call, all shards at once)",
    "load: ferry.load_safetensors(out=state_dict)": "ferry, into the GPU tensors of an existing state_dict (no allocation)",
    "load: safetensors.torch.load_file": "the reference loader, shard after shard, device=cuda",
    "load: fastsafetensors (nogds)": "fastsafetensors, nogds=True, 16 threads, 16 MiB bounce buffer",
    "load: runai SafetensorsStreamer": "Run:ai Model Streamer, RUNAI_STREAMER_CONCURRENCY=16, each tensor .to(cuda)",
    "load: kvikio CuFile.pread (raw shard bytes)": "KvikIO, every shard's bytes into a GPU buffer of its own, all shards in flight (no tensors made: the file -> GPU floor)",
    "save: ferry.save_safetensors": "ferry, GPU tensors to sharded files (blocking)",
    "save: ferry.save_safetensors(writer=buffered)": "ferry, blocking, the buffered writer (pwrite into the page cache)",
    "save: ferry.save_safetensors(writer=direct)": "ferry, blocking, the O_DIRECT writer (aligned windows, io_uring)",
    "save: ferry.save_safetensors(fsync=True)": "ferry, blocking, durable: every shard fsynced (and its folder) before the call returns",
    "save: ferry non_blocking (whole write)": "ferry, non_blocking=True, from the call until req.wait() returns",
    "save: ferry non_blocking (caller's stall)": "ferry, non_blocking=True, the call alone (the tensors are copied out)",
    "save: ferry non_blocking, bound >= checkpoint (caller's stall)": "ferry, non_blocking=True, snapshot_bytes = the checkpoint's size (one snapshot, not streamed), the call alone",
    "save: ferry non_blocking, bound >= checkpoint, kept (caller's stall)": "as above with keep_snapshot=True, after one untimed save: the training loop's case (the pinned memory allocated once)",
    "save: torch pinned D2H copy (the stall's floor)": "torch .copy_ of every tensor into pinned host tensors (not a save)",
    "save: safetensors.torch.save_file": "the reference writer, one file per shard's worth of tensors",
    "save: safetensors.torch.save_file + fsync": "the reference writer as above, then os.fsync of every file it wrote (durable)",
    "save: torch.save": "torch.save of the state_dict to one file",
    "save: torch DCP async_save (whole write)": "torch.distributed.checkpoint.async_save on one process, until its future is done",
    "save: torch DCP async_save (caller's stall)": "torch.distributed.checkpoint.async_save on one process, the call alone",
    "disk: O_DIRECT write": "the disk under --dir: O_DIRECT sequential write of --disk-bytes (fio or dd: see the row's note)",
    "disk: O_DIRECT read": "the disk under --dir: O_DIRECT sequential read of the same file (fio or dd: see the row's note)",
}


def parse_bytes(s: str) -> int:
    """`2G`, `256M`, `4096`: bytes (K, M, G, T are powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def disk_limits(d: str, nbytes: int, repeat: int) -> tuple[dict[str, tuple[float, int]], dict[str, str], list[str]]:
    """O_DIRECT write then read of an `nbytes` file under `d`: fio where installed (best of
    queue depths 1, 4, 16, 64, libaio, 16 MiB blocks), else dd (16 MiB blocks, one stream,
    best of `repeat`).
    Returns rows {name: (seconds, bytes)}, notes {name: how} and lines for what was skipped."""
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, "ferry-disk-limit.bin")
    rows: dict[str, tuple[float, int]] = {}
    notes: dict[str, str] = {}
    skipped: list[str] = []
    bs = 16 << 20
    count = max(1, nbytes // bs)
    nbytes = count * bs
    try:
        if shutil.which("fio"):
            for rw, name in (("write", "disk: O_DIRECT write"), ("read", "disk: O_DIRECT read")):
                best_bw, best_qd = 0.0, 0
                for qd in (1, 4, 16, 64):
                    out = subprocess.run(
                        ["fio", f"--name=ferry-{rw}", f"--filename={f}", f"--rw={rw}", f"--bs={bs}",
                         f"--size={nbytes}", "--direct=1", "--ioengine=libaio", f"--iodepth={qd}",
                         "--end_fsync=1" if rw == "write" else "--end_fsync=0",
                         "--output-format=json"],
                        check=True, capture_output=True, text=True,
                    ).stdout
                    job = json.loads(out[out.index("{"):])["jobs"][0][rw]
                    bw = float(job["bw_bytes"])
                    if bw > best_bw:
                        best_bw, best_qd = bw, qd
                rows[name] = (nbytes / best_bw, nbytes)
                notes[name] = f"fio, libaio, 16 MiB blocks, best queue depth {best_qd} of 1/4/16/64"
        elif shutil.which("dd"):
            how = f"dd, 16 MiB blocks, one stream, best of {repeat} (fio is not installed)"
            write = ["dd", "if=/dev/zero", f"of={f}", f"bs={bs}", f"count={count}", "oflag=direct",
                     "conv=fsync", "status=none"]
            read = ["dd", f"if={f}", "of=/dev/null", f"bs={bs}", "iflag=direct", "status=none"]
            for name, cmd in (("disk: O_DIRECT write", write), ("disk: O_DIRECT read", read)):
                rows[name] = (best(lambda: subprocess.run(cmd, check=True, capture_output=True, text=True), repeat), nbytes)
                notes[name] = how
        else:
            skipped.append("disk: neither fio nor dd is installed: the disk rows are skipped")
    except (subprocess.CalledProcessError, OSError, ValueError, KeyError) as e:
        err = getattr(e, "stderr", "") or str(e)
        skipped.append(f"disk: O_DIRECT on {d} failed ({err.strip()[:200]}): the disk rows are skipped")
    finally:
        if os.path.exists(f):
            os.remove(f)
    return rows, notes, skipped


class Shown(dict):
    """A kind's rows {name: (seconds, bytes)} that print each row as it is measured, so a run
    cut short by a time limit still leaves the rows it finished in its log."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def __setitem__(self, name: str, row: tuple[float, int]) -> None:
        super().__setitem__(name, row)
        sec, n = row
        key = name if self.kind == "disk" else f"{self.kind}: {name}"
        print(f"  done: {key}: {sec:.3f} s, {n / sec / 1e9:.2f} GB/s", flush=True)


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
    legend = "rows:\n" + "\n".join(f"  {k}\n      {v}" for k, v in ROWS.items())
    ap = argparse.ArgumentParser(
        description=__doc__, epilog=legend, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--scale", type=float, default=1.0, help="1: about 16 GiB in 8 shards, 2,000 tensors; 0.125: 2.5 GiB")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--dir", default="/tmp/ferry-ckpt-compare", help="where the checkpoint and the disk rows' file go")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each load")
    ap.add_argument("--rows", choices=["all", "load", "save", "disk"], default="all",
                    help="which rows: all (default), the loads (and disk), the saves (and disk), or\n"
                         "the disk alone (no GPU, no PyTorch needed)")
    ap.add_argument("--save-rows", choices=["all", "writers"], default="all",
                    help="with the saves: all of them (default), or the writers alone (ferry's default,\n"
                         "buffered and direct writers, save_file, torch.save: no fsync, snapshot or DCP\n"
                         "rows) for a short call")
    ap.add_argument("--ferry-cli", help="the ferry CLI: with a wheel whose blocking save returns no report, once,\n"
                    "untimed, `ferry save` of the same checkpoint from the GPU prints the writer ferry's\n"
                    "default save takes here (a newer wheel's report says it of each timed run)")
    ap.add_argument("--disk-bytes", default="2G", help="size of the disk rows' file (default 2G; 0: no disk rows)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoint")
    a = ap.parse_args()

    # rows[kind][name] = (seconds, bytes)
    rows: dict[str, dict[str, tuple[float, int]]] = {k: Shown(k) for k in ("load", "save", "disk")}
    notes: dict[str, str] = {}
    missing: list[str] = []
    disk_bytes = parse_bytes(a.disk_bytes)
    if disk_bytes > 0:
        d_rows, notes, skipped = disk_limits(a.dir, disk_bytes, a.repeat)
        for name, row in d_rows.items():
            rows["disk"][name] = row
        missing += skipped
    nbytes, ntensors, nfiles, cache = 0, 0, 0, "not read"
    if a.rows != "disk":
        nbytes, ntensors, nfiles, cache = gpu_rows(a, rows, missing)

    for m in missing:
        print(f"missing: {m}")
    what = f"checkpoint {human(nbytes)}" if nbytes else "no checkpoint rows"
    print(f"best of {a.repeat}, host clock; {what}; disk rows {human(disk_bytes)} each:")
    dirty = dirty_limits()
    if dirty["dirty_limit_bytes"]:
        print(f"page cache: a writer is throttled to the disk past about {human(dirty['dirty_limit_bytes'])} "
              f"of dirty pages (vm.dirty_ratio {dirty['dirty_ratio']}, vm.dirty_bytes {dirty['dirty_bytes']}, "
              f"available {human(dirty['mem_available'] or 0)})")
    report: dict[str, Any] = {
        "dirty_limits": dirty,
        "bytes": nbytes,
        "tensors": ntensors,
        "shards": nfiles,
        "scale": a.scale,
        "page_cache": cache,
        "repeat": a.repeat,
        "disk_bytes": disk_bytes,
        "missing": missing,
        "rows": {},
        "ratios": {},
        "default_writer": getattr(a, "default_writer", None),
    }
    if report["default_writer"]:
        print(f"ferry's default writer here: {report['default_writer']}")
    for kind, r in rows.items():
        for name, (sec, n) in r.items():
            gbs = n / sec / 1e9
            key = name if kind == "disk" else f"{kind}: {name}"
            note = notes.get(key, "")
            report["rows"][key] = {"seconds": sec, "bytes": n, "gb_per_s": gbs, "what": ROWS.get(key, ""), "how": note}
            print(f"  {key:58s} {sec:8.3f} s {gbs:8.2f} GB/s" + (f"  [{note}]" if note else ""))

    def gbps(kind: str, name: str) -> Optional[float]:
        r = rows[kind].get(name)
        return r[1] / r[0] / 1e9 if r else None

    for kind, ferry_key in (("load", "ferry.load_safetensors"), ("save", "ferry.save_safetensors")):
        f = gbps(kind, ferry_key)
        if f is None:
            continue
        for name in rows[kind]:
            if name.startswith("ferry") or name.startswith("torch pinned") or "stall" in name \
                    or "fsync" in name:
                continue
            ratio = f / (gbps(kind, name) or float("inf"))
            report["ratios"][f"{kind}: ferry / {name}"] = ratio
            print(f"  {kind:4s} ferry / {name:46s} {ratio:6.2f}x")
    # Durable saves against each other (the non-durable rows would flatter either side).
    f, p = gbps("save", "ferry.save_safetensors(fsync=True)"), gbps("save", "safetensors.torch.save_file + fsync")
    if f is not None and p is not None:
        report["ratios"]["save: ferry(fsync=True) / safetensors.torch.save_file + fsync"] = f / p
        print(f"  save ferry(fsync=True) / {'safetensors.torch.save_file + fsync':38s} {f / p:6.2f}x")
    for kind, ferry_key, disk_key, target in (
        ("load", "ferry.load_safetensors", "disk: O_DIRECT read", " (target >= 0.95 cold)"),
        ("save", "ferry.save_safetensors", "disk: O_DIRECT write", ""),
        ("save", "ferry.save_safetensors(fsync=True)", "disk: O_DIRECT write", " (target >= 0.9)"),
    ):
        f, d = gbps(kind, ferry_key), gbps("disk", disk_key)
        if f is not None and d is not None:
            who = "ferry" if ferry_key.endswith("safetensors") else "ferry(fsync=True)"
            report["ratios"][f"{kind}: {who} / {disk_key}"] = f / d
            print(f"  {kind:4s} {who} / {disk_key:38s} {f / d:6.2f}x (page cache: {cache}){target}")
    stall = rows["save"].get("ferry non_blocking (caller's stall)")
    floor = rows["save"].get("torch pinned D2H copy (the stall's floor)")
    if stall and floor:
        report["ratios"]["save: stall / pinned D2H copy"] = stall[0] / floor[0]
        print(f"  save stall / pinned D2H copy {stall[0] / floor[0]:6.2f}x (target <= 1.1)")
    for key in ("bound >= checkpoint", "bound >= checkpoint, kept"):
        stall = rows["save"].get(f"ferry non_blocking, {key} (caller's stall)")
        if stall and floor:
            report["ratios"][f"save: stall ({key}) / pinned D2H copy"] = stall[0] / floor[0]
            print(f"  save stall, {key} / pinned D2H copy {stall[0] / floor[0]:6.2f}x (target <= 1.1)")
    shown = [k for k in ROWS if k in report["rows"]]
    print("rows:\n" + "\n".join(f"  {k}: {ROWS[k]}" for k in shown))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1)
        print(f"wrote {a.json}")
    if not a.keep:
        try:
            os.rmdir(a.dir)  # only when nothing else is left in it
        except OSError:
            pass
    return 0


def gpu_rows(a: argparse.Namespace, rows: dict[str, dict[str, tuple[float, int]]], missing: list[str]) -> tuple[int, int, int, str]:
    """The load and save rows (PyTorch and a GPU); returns (bytes, tensors, shards, page cache)."""
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
    load = rows["load"]
    save = rows["save"]

    def sync() -> None:
        torch.cuda.synchronize(dev)

    # Loads to the GPU (also for --rows save: the saves' source tensors).
    def ferry_load() -> None:
        t = ferry.load_safetensors(index, device=a.device, framework="torch")
        sync()
        del t

    out = ferry.load_safetensors(index, device=a.device, framework="torch")
    out = {k: torch.empty_like(v) for k, v in out.items()}
    ferry.load_safetensors(index, out=out)
    sync()
    if a.rows in ("all", "load"):
        load["ferry.load_safetensors"] = (best(ferry_load, a.repeat, before), nbytes)

        def ferry_into() -> None:
            ferry.load_safetensors(index, out=out)
            sync()

        load["ferry.load_safetensors(out=state_dict)"] = (best(ferry_into, a.repeat, before), nbytes)
        peer_loads(a, files, nbytes, dev, sync, before, load, missing)

    if a.rows in ("all", "save"):
        peer_saves(a, out, files, nbytes, sync, save, missing)
    if not a.keep:
        shutil.rmtree(src, ignore_errors=True)
    return nbytes, ntensors, len(files), cache


def peer_loads(a: argparse.Namespace, files: list[str], nbytes: int, dev: Any, sync: Callable[[], None],
               before: Optional[Callable[[], Any]], load: dict[str, tuple[float, int]], missing: list[str]) -> None:
    """The peers' load rows; a peer that cannot be imported or started is skipped."""
    import torch

    try:
        import safetensors.torch as stt

        def st_load() -> None:
            t = {}
            for f in files:
                t.update(stt.load_file(f, device=str(dev)))
            sync()

        load["safetensors.torch.load_file"] = (best(st_load, a.repeat, before), nbytes)
    except ImportError as e:
        missing.append(f"safetensors: its rows are skipped ({e}; pip install safetensors)")
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

        load["fastsafetensors (nogds)"] = (best(fst_load, a.repeat, before), nbytes)
    except ImportError as e:
        missing.append(f"fastsafetensors: its row is skipped ({e}; pip install fastsafetensors)")
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

        load["runai SafetensorsStreamer"] = (best(runai_load, a.repeat, before), nbytes)
    except ImportError as e:
        missing.append(f"runai_model_streamer: its row is skipped ({e}; pip install runai-model-streamer)")
    try:
        import kvikio

        sizes = [os.path.getsize(f) for f in files]
        bufs = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]

        def kvikio_load() -> None:
            handles = [kvikio.CuFile(f, "r") for f in files]
            futures = [h.pread(b) for h, b in zip(handles, bufs)]
            for fut in futures:
                fut.get()
            for h in handles:
                h.close()
            sync()

        kvikio_load()
        # The bytes are the files': a checksum of the first shard on the GPU and on the host.
        with open(files[0], "rb") as fh:
            head = fh.read(1 << 20)
        if bytes(bufs[0][: len(head)].cpu().numpy().tobytes()) != head:
            missing.append("kvikio: the bytes read differ from the file's: its row is left out")
        else:
            load["kvikio CuFile.pread (raw shard bytes)"] = (best(kvikio_load, a.repeat, before), sum(sizes))
        del bufs
    except ImportError as e:
        missing.append(
            f"kvikio: its row is skipped ({e}; pip install the kvikio_cu13 and libkvikio_cu13 wheels)"
        )
    except Exception as e:  # no GPU reachable through KvikIO, a missing libcufile
        missing.append(f"kvikio: could not run ({type(e).__name__}: {e}): its row is skipped")


def peer_saves(a: argparse.Namespace, out: dict[str, Any], files: list[str], nbytes: int, sync: Callable[[], None],
               save: dict[str, tuple[float, int]], missing: list[str]) -> None:
    """ferry's and the peers' save rows, from the GPU tensors `out`."""
    import torch

    import ferry

    dst = os.path.join(a.dir, "dst")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    shard = nbytes // max(1, len(files)) + (256 << 20)

    # Untimed, before every save run: the page cache's dirty pages written out, so that no run
    # starts with the previous one's writeback still under way (each row writes the whole
    # checkpoint; without this the first row met an empty dirty budget and the later ones the
    # kernel's throttling of the earlier rows' bytes).
    settle = os.sync

    ran: list[str] = []

    def ferry_save() -> None:
        r = ferry.save_safetensors(out, dst, max_shard_size=shard)
        if hasattr(r, "writer"):  # a SaveReport (wheels before it returned None)
            ran.append(f"{r.writer} ({r.writer_note}); {r.bytes / r.seconds / 1e9:.2f} GB/s inside the call")

    save["ferry.save_safetensors"] = (best(ferry_save, a.repeat, settle), nbytes)
    if ran:
        a.default_writer = "; ".join(dict.fromkeys(w.split(";")[0] for w in ran)) + f" (runs: {' | '.join(ran)})"
    elif a.ferry_cli:
        a.default_writer = cli_writer(a, files, settle)
    for writer in ("buffered", "direct"):
        save[f"ferry.save_safetensors(writer={writer})"] = (
            best(lambda w=writer: ferry.save_safetensors(out, dst, max_shard_size=shard, writer=w), a.repeat, settle),
            nbytes,
        )
    quick = a.save_rows == "writers"
    if quick:
        peer_writers(a, out, files, dst, nbytes, save, missing, settle)
        if not a.keep:
            shutil.rmtree(dst, ignore_errors=True)
        return
    # Durable: every shard on the disk when the call returns.
    save["ferry.save_safetensors(fsync=True)"] = (
        best(lambda: ferry.save_safetensors(out, dst, max_shard_size=shard, fsync=True), a.repeat, settle),
        nbytes,
    )
    stalls = []

    def ferry_async() -> None:
        t0 = time.perf_counter()
        req = ferry.save_safetensors(out, dst, max_shard_size=shard, non_blocking=True)
        stalls.append(time.perf_counter() - t0)
        assert req is not None
        req.wait()

    save["ferry non_blocking (whole write)"] = (best(ferry_async, a.repeat, settle), nbytes)
    save["ferry non_blocking (caller's stall)"] = (min(stalls), nbytes)
    # The training loop's case: the bound holds the whole checkpoint and the snapshot's memory
    # is kept between saves (one untimed save first allocates it; older wheels lack the option).
    keep = "keep_snapshot" in (getattr(ferry.save_safetensors, "__text_signature__", "") or "")
    extra = {"keep_snapshot": True} if keep else {}
    whole = []

    def ferry_async_whole() -> None:
        t0 = time.perf_counter()
        req = ferry.save_safetensors(out, dst, max_shard_size=shard, non_blocking=True,
                                     snapshot_bytes=nbytes + (64 << 20), **extra)
        whole.append(time.perf_counter() - t0)
        assert req is not None
        req.wait()

    ferry_async_whole()
    whole.clear()
    best(ferry_async_whole, a.repeat, settle)
    key = "ferry non_blocking, bound >= checkpoint, kept (caller's stall)" if keep else \
        "ferry non_blocking, bound >= checkpoint (caller's stall)"
    save[key] = (min(whole), nbytes)
    if keep:  # frees the kept memory (a non-blocking save without the option)
        freer = os.path.join(a.dir, "free.safetensors")
        req = ferry.save_safetensors({"x": next(iter(out.values())).reshape(-1)[:1]}, freer, non_blocking=True)
        assert req is not None
        req.wait()
        os.remove(freer)
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in out.items()}

    def d2h() -> None:
        for k, v in out.items():
            pinned[k].copy_(v, non_blocking=True)
        sync()

    save["torch pinned D2H copy (the stall's floor)"] = (best(d2h, a.repeat), nbytes)
    del pinned
    st_run = peer_writers(a, out, files, dst, nbytes, save, missing, settle)
    if st_run is not None:
        st_save: Callable[[], None] = st_run

        def st_save_durable() -> None:
            st_save()
            for f in glob.glob(os.path.join(dst, "st-*.safetensors")):
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

        save["safetensors.torch.save_file + fsync"] = (best(st_save_durable, a.repeat, settle), nbytes)
        for f in glob.glob(os.path.join(dst, "st-*.safetensors")):
            os.remove(f)
    dcp_save(a, out, dst, nbytes, save, missing, settle)
    if not a.keep:
        shutil.rmtree(dst, ignore_errors=True)


def cli_writer(a: argparse.Namespace, files: list[str], settle: Callable[[], None]) -> str:
    """The writer (and why) of `ferry save` of the checkpoint's folder from the GPU into a
    folder of its own with the default writer: untimed, `settle` before, its files removed."""
    out = os.path.join(a.dir, "cli-dst")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    settle()
    try:
        r = subprocess.run([a.ferry_cli, "save", os.path.dirname(files[0]), out, "--device", "cuda", "--json"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return f"ferry save failed ({r.returncode}): {r.stderr.strip()[-300:]}"
        v = json.loads(r.stdout)
        sv = v.get("save", v)
        return f"{sv.get('writer')} ({sv.get('writer_note')}); {sv.get('gb_per_s', 0):.2f} GB/s"
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        return f"ferry save could not run: {e}"
    finally:
        shutil.rmtree(out, ignore_errors=True)


def peer_writers(a: argparse.Namespace, out: dict[str, Any], files: list[str], dst: str, nbytes: int,
                 save: dict[str, tuple[float, int]], missing: list[str],
                 settle: Callable[[], None]) -> Optional[Callable[[], None]]:
    """The peers' writers into the page cache: `safetensors.torch.save_file` (one file per
    shard's worth of tensors) and `torch.save`; returns the save_file run (None without
    safetensors) with its files left for a durable row, torch.save's removed."""
    import torch

    st_save: Optional[Callable[[], None]] = None
    try:
        import safetensors.torch as stt

        def st_run() -> None:
            names = list(out)
            per = max(1, len(names) // max(1, len(files)))
            for i in range(0, len(names), per):
                stt.save_file(
                    {k: out[k] for k in names[i : i + per]}, os.path.join(dst, f"st-{i}.safetensors")
                )

        save["safetensors.torch.save_file"] = (best(st_run, a.repeat, settle), nbytes)
        st_save = st_run
    except ImportError as e:
        missing.append(f"safetensors: its save row is skipped ({e})")

    def torch_save() -> None:
        torch.save(out, os.path.join(dst, "torch.pt"))

    # One peer's files on disk at a time (the disk holds the source, ferry's copy and one more).
    for f in glob.glob(os.path.join(dst, "st-*.safetensors")):
        os.remove(f)
    save["torch.save"] = (best(torch_save, a.repeat, settle), nbytes)
    os.remove(os.path.join(dst, "torch.pt"))
    return st_save


def dcp_save(a: argparse.Namespace, out: dict[str, Any], dst: str, nbytes: int,
             save: dict[str, tuple[float, int]], missing: list[str], settle: Callable[[], None]) -> None:
    """PyTorch DCP's async_save on one process (a gloo group of one, made here if none is):
    the call (the stall) and the call until its future is done (the whole write); `settle`
    (untimed) before each run, after the previous run's files are removed."""
    try:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        made = False
        if not dist.is_initialized():
            store = os.path.join(a.dir, f"dcp-store-{os.getpid()}")
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
            made = True
        stalls = []
        where = os.path.join(dst, "dcp")

        def dcp_async() -> None:
            t0 = time.perf_counter()
            fut = dcp.async_save(out, checkpoint_id=where)
            stalls.append(time.perf_counter() - t0)
            fut.result()

        def fresh() -> None:  # untimed: each run writes a new checkpoint, one on disk at a time
            shutil.rmtree(where, ignore_errors=True)
            settle()

        save["torch DCP async_save (whole write)"] = (best(dcp_async, a.repeat, fresh), nbytes)
        fresh()
        save["torch DCP async_save (caller's stall)"] = (min(stalls), nbytes)
        if made:
            dist.destroy_process_group()
    except ImportError as e:
        missing.append(f"torch.distributed.checkpoint: its rows are skipped ({e})")
    except Exception as e:  # a torch without async_save, no gloo
        missing.append(f"torch DCP async_save: could not run ({type(e).__name__}: {e}): its rows are skipped")


if __name__ == "__main__":
    sys.exit(main())
