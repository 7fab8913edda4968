"""A safetensors checkpoint in the page cache (and cold) -> GPU 0: ferry next to its peers.

Run on the GPU host (PyTorch, safetensors and CuPy installed; KvikIO from carried wheels):

    python3 bench/peers/checkpoint_load.py --ferry ./ferry --gib 4 --out results.json

Every figure is the caller's view: host clock around the whole call, the GPU synchronized
before the clock stops, median of --repeat runs after one warm-up. The file holds 64 float32
tensors; every loader reads the same file. `ferry load` runs as a subprocess (`--json`): its own
timed load (`seconds`) and the process's wall time, which adds process start, CUDA context
creation and the allocation, are both reported.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def timed(fn, repeat):
    fn()  # warm-up (CUDA context, allocator, page cache)
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out), min(out), max(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--path", default="/tmp/ferry-ckpt.safetensors")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cold", action="store_true", help="also try cold-cache reads (drop_caches)")
    a = ap.parse_args()

    import torch
    from safetensors.torch import load_file, save_file

    n = 64
    per = int(a.gib * (1 << 30)) // n // 4
    if not os.path.exists(a.path) or os.path.getsize(a.path) < a.gib * (1 << 30):
        g = torch.Generator().manual_seed(1)
        save_file({f"layer{i}.weight": torch.randn(per, generator=g) for i in range(n)}, a.path)
    size = os.path.getsize(a.path)
    with open(a.path, "rb") as f:  # into the page cache
        while f.read(64 << 20):
            pass
    res = {"file_bytes": size, "tensors": n, "rows": []}

    def row(name, med, lo, hi, note=""):
        r = {"name": name, "s": med, "min_s": lo, "max_s": hi, "gb_per_s": size / med / 1e9, "note": note}
        res["rows"].append(r)
        print(f"{name:55s} {size / med / 1e9:7.2f} GB/s  ({med * 1e3:8.1f} ms, {lo * 1e3:.1f}..{hi * 1e3:.1f}) {note}", flush=True)

    def st_load():
        d = load_file(a.path, device="cuda:0")
        torch.cuda.synchronize()
        del d

    row("safetensors.torch.load_file(device='cuda:0')", *timed(st_load, a.repeat))

    ferry_runs = []

    def ferry_load(extra=()):
        p = subprocess.run([a.ferry, "load", a.path, "--device", "cuda:0", "--json", *extra],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(p.stderr)
        ferry_runs.append(json.loads(p.stdout))

    med, lo, hi = timed(ferry_load, a.repeat)
    loads = [r.get("load", r) for r in ferry_runs[1:]]
    inner = statistics.median([r["seconds"] for r in loads])
    setup = statistics.median([r.get("setup_seconds", 0.0) for r in loads])
    row("ferry load --device cuda:0 (process wall)", med, lo, hi, "start + context + alloc + load")
    row("ferry load --device cuda:0 (its load)", inner, inner, inner, f"setup {setup * 1e3:.1f} ms; path: {loads[-1].get('io_path')}")

    try:
        import ferry

        def ferry_inproc():
            d = ferry.load_safetensors(a.path, device="cuda:0")
            torch.cuda.synchronize()
            del d

        row("ferry.load_safetensors(device='cuda:0'), in process", *timed(ferry_inproc, a.repeat),
            "Python module; torch tensors")

        # Into tensors that already exist (a model's state dict): no allocation, as KvikIO's
        # reads into a preallocated buffer below. Checked against a load of its own.
        ref = ferry.load_safetensors(a.path, device="cuda:0")
        out = {k: torch.empty_like(v) for k, v in ref.items()}

        def ferry_into():
            ferry.load_safetensors(a.path, out=out)
            torch.cuda.synchronize()

        row("ferry.load_safetensors(out=existing tensors), in process", *timed(ferry_into, a.repeat),
            "no allocation")
        res["load_into_matches"] = all(torch.equal(out[k], v) for k, v in ref.items())
        if not res["load_into_matches"]:
            print("ferry.load_safetensors(out=...): tensors differ from the reference load", flush=True)
        del ref, out
    except Exception as e:  # the module not installed
        print(f"ferry module: not measured: {e}", flush=True)
        res["ferry_module_error"] = str(e)

    # KvikIO's CuFile.read and ferry.read_file fill the same preallocated CuPy buffer with the
    # same bytes (the whole file), timed alike; after each, the buffer's checksums are compared
    # with the file's (read on the host), the buffer zeroed before each loader's runs.
    try:
        import cupy
        import numpy

        buf = cupy.empty(size, dtype=cupy.uint8)
        host = numpy.memmap(a.path, dtype=numpy.uint8, mode="r")
        want = (int(host.sum(dtype=numpy.uint64)), int(host[1::7].sum(dtype=numpy.uint64)))
        del host
    except Exception as e:  # no CuPy
        print(f"kvikio, ferry.read_file: not measured: {e}", flush=True)
        res["cupy_error"] = res["kvikio_error"] = str(e)
        buf = None

    def same_bytes(name):
        got = (int(cupy.sum(buf, dtype=cupy.uint64)), int(cupy.sum(buf[1::7], dtype=cupy.uint64)))
        res.setdefault("buffer_checks", {})[name] = got == want
        if got != want:
            print(f"{name}: the buffer's checksums {got} differ from the file's {want}", flush=True)

    if buf is not None:
        try:
            import kvikio
            import kvikio.defaults

            for threads in (1, 8, 16, 32):
                try:
                    kvikio.defaults.set({"num_threads": threads})
                except Exception:
                    kvikio.defaults.num_threads_reset(threads)

                def kv():
                    with kvikio.CuFile(a.path, "r") as f:
                        f.read(buf)
                    cupy.cuda.runtime.deviceSynchronize()

                buf.fill(0)
                name = f"kvikio CuFile.read, {threads} threads"
                row(name, *timed(kv, a.repeat),
                    f"compat mode: {kvikio.defaults.is_compat_mode_preferred() if hasattr(kvikio.defaults, 'is_compat_mode_preferred') else '?'}")
                same_bytes(name)
        except Exception as e:  # not installed, or no cuFile
            print(f"kvikio: not measured: {e}", flush=True)
            res["kvikio_error"] = str(e)

        try:
            import ferry

            def fr():
                n = ferry.read_file(a.path, buf)
                cupy.cuda.runtime.deviceSynchronize()
                if n != size:
                    raise RuntimeError(f"ferry.read_file read {n} of {size} bytes")

            buf.fill(0)
            name = "ferry.read_file into the CuPy buffer"
            row(name, *timed(fr, a.repeat), "same buffer and bytes as kvikio CuFile.read")
            same_bytes(name)
        except Exception as e:  # the module not installed
            print(f"ferry.read_file: not measured: {e}", flush=True)
            res["ferry_read_file_error"] = str(e)
        del buf

    if a.cold:
        def drop():
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        try:
            drop()
            t = time.perf_counter()
            subprocess.run(["dd", f"if={a.path}", "of=/dev/null", "bs=16M", "iflag=direct"],
                           check=True, capture_output=True)
            dd = time.perf_counter() - t
            row("dd iflag=direct bs=16M (disk O_DIRECT sequential)", dd, dd, dd, "cold")
            drop()
            ferry_runs.clear()
            t = time.perf_counter()
            ferry_load(("--direct",))
            w = time.perf_counter() - t
            row("ferry load --direct, cold cache (process wall)", w, w, w, "cold")
            r = ferry_runs[-1].get("load", ferry_runs[-1])
            row("ferry load --direct, cold cache (its load)", r["seconds"], r["seconds"], r["seconds"], f"path: {r.get('io_path')}")
        except Exception as e:
            print(f"cold: not measured: {e}", flush=True)
            res["cold_error"] = str(e)

    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
