#!/usr/bin/env python3
"""KV-cache block swaps (issue 34): ferry.copy_blocks next to what a PyTorch user writes, on one
GPU, and what each costs a matmul running at the same time.

Run on the GPU host (PyTorch installed; vLLM is not needed; cuda-python's `cuda.bindings`, if
installed, adds a raw cuMemcpyBatchAsync row):

    PYTHONPATH=/tmp/site python3 bench/peers/kv_blocks.py --json kv_blocks.json

Tables are [num_blocks, block_bytes] uint8 tensors (one per layer, --layers of them), the
mapping a permutation of --count blocks (at most 1 GiB per table set). Methods, each timed with
the host clock around the whole call and a synchronize, median of --runs after one warm-up:
- `ferry` / `ferry leave_sms`: ferry.copy_blocks(dst, src, mapping[, leave_sms=True]);
- `torch copy_ loop`: dst[d].copy_(src[s], non_blocking=True) per block and layer (the shape
  of vLLM's former swap_blocks: one cudaMemcpyAsync per block);
- `torch index`: index_select on the source side, index_copy_ into the destination (a gather
  kernel on the GPU side, a CPU gather for host sources; for host destinations the gathered
  blocks come back with a blocking copy before the CPU index_copy_ reads them);
- `cuda.bindings batch`: one cuMemcpyBatchAsync per layer (where importable), on a stream of
  its own ordered after and before PyTorch's current stream (the driver refuses the legacy
  default stream).
Interference (--interference): a bf16 matmul loop on its own stream (about 50 ms alone), the
swap issued right after it starts; reports the matmul loop's time beside each method against
alone, and the time until both are done. Each method starts from a zeroed destination, and
its result is checked in full (every block of every layer, after a device synchronize) once
after the timed runs and once after the runs beside the matmul loop.
"""

import argparse
import json
import statistics
import time

# PyTorch and ferry are imported in main(), after the arguments, so that --help runs anywhere.
torch = None
ferry = None


def timed(fn, runs):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def tables(layers, blocks, block, where, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        t = torch.randint(0, 256, (blocks, block), dtype=torch.uint8, generator=g)
        out.append(t.pin_memory() if where == "pinned" else t.to("cuda:0"))
    return out


def batch_fn(dst, src, pairs, block):
    """One cuMemcpyBatchAsync per layer through cuda.bindings, or None where unavailable.

    cuda-bindings 12.8+ and 13.x take the same 8 arguments, (dsts, srcs, sizes, count, attrs,
    attrsIdxs, numAttrs, hStream): dsts and srcs lists of driver.CUdeviceptr (plain ints are
    refused), sizes and attrsIdxs lists of int, attrs a list of CUmemcpyAttributes. 12.x
    returns (CUresult, failIdx); 13.x, whose C function has no failIdx any more, returns
    (CUresult,). hStream must not be the legacy NULL stream, which PyTorch's default stream
    is (cuda_stream 0), so the copies go on a stream of their own.
    """
    try:
        from cuda.bindings import driver as cu  # type: ignore
    except ImportError:
        return None

    def skipped(e):
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"  cuda.bindings batch skipped: {type(e).__name__}: {first}")

    try:
        batch = cu.cuMemcpyBatchAsync
        attr = cu.CUmemcpyAttributes()
        attr.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        flags = getattr(cu, "CUmemcpyFlags", None)
        attr.flags = int(flags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE) if flags else 1
        ok = cu.CUresult.CUDA_SUCCESS
        own = torch.cuda.Stream()
        h = cu.CUstream(own.cuda_stream)
        layers = []
        for d, s in zip(dst, src):
            dp = [cu.CUdeviceptr(d.data_ptr() + di * block) for _, di in pairs]
            sp = [cu.CUdeviceptr(s.data_ptr() + si * block) for si, _ in pairs]
            layers.append((dp, sp, [block] * len(pairs)))
    except Exception as e:  # noqa: BLE001 - a binding of another shape: no row
        skipped(e)
        return None

    def run():
        cur = torch.cuda.current_stream()
        own.wait_stream(cur)
        for dp, sp, sz in layers:
            r = batch(dp, sp, sz, len(sz), [attr], [0], 1, h)
            err = r[0] if isinstance(r, tuple) else r
            if err != ok:
                at = f" (failIdx {r[1]})" if isinstance(r, tuple) and len(r) > 1 else ""
                raise RuntimeError(f"cuMemcpyBatchAsync returned {err!r}{at}")
        cur.wait_stream(own)

    try:
        run()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a binding of another shape: no row
        skipped(e)
        return None
    return run


def methods(dst, src, pairs, block, dev_idx):
    mapping = torch.tensor(pairs, dtype=torch.int64)
    s_idx = mapping[:, 0]
    d_idx = mapping[:, 1]
    s_on = s_idx.to(src[0].device)
    d_on = d_idx.to(dst[0].device)

    def copy_loop():
        for d, s in zip(dst, src):
            for si, di in pairs:
                d[di].copy_(s[si], non_blocking=True)

    def index():
        for d, s in zip(dst, src):
            picked = s.index_select(0, s_on)
            if d.is_cuda:
                d.index_copy_(0, d_on, picked.to(d.device, non_blocking=True))
            else:
                # A host destination: .to("cpu", non_blocking=True) hands back a pinned
                # buffer that the GPU is still filling, and the CPU index_copy_ reads it at
                # once (the H100 run's first d2h row: "torch index: layer 0 block 188
                # differs"). The copy back is waited for before the CPU scatter reads it.
                d.index_copy_(0, d_on, picked.to(d.device))

    out = {
        "ferry": lambda: ferry.copy_blocks(dst, src, mapping),
        "ferry leave_sms": lambda: ferry.copy_blocks(dst, src, mapping, leave_sms=True),
        "torch copy_ loop": copy_loop,
        "torch index": index,
    }
    b = batch_fn(dst, src, pairs, block)
    if b is not None:
        out["cuda.bindings batch"] = b
    return out


def reset(dst):
    """Zeroes the destination tables, so that each method's check sees only what it wrote."""
    torch.cuda.synchronize()
    for d in dst:
        d.zero_()
    torch.cuda.synchronize()


def check(dst, src, pairs, name):
    """Every block of every layer, read once all of the device's streams are done."""
    torch.cuda.synchronize()
    s_idx = torch.tensor([si for si, _ in pairs], dtype=torch.int64)
    d_idx = torch.tensor([di for _, di in pairs], dtype=torch.int64)
    for li, (d, s) in enumerate(zip(dst, src)):
        got = d.cpu().index_select(0, d_idx)
        want = s.cpu().index_select(0, s_idx)
        if not torch.equal(got, want):
            k = int((got != want).any(dim=1).nonzero()[0, 0])
            raise SystemExit(f"{name}: layer {li} block {pairs[k][1]} differs")


def matmul_loop(n_iter, a, b, stream):
    with torch.cuda.stream(stream):
        for _ in range(n_iter):
            torch.matmul(a, b)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="8K,32K,64K,512K,2M")
    p.add_argument("--counts", default="256,4096")
    p.add_argument("--ways", default="h2d,d2h,d2d")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--no-interference", dest="interference", action="store_false")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    global torch, ferry
    import torch
    import ferry

    unit = {"K": 1 << 10, "M": 1 << 20}
    sizes = [int(s[:-1]) * unit[s[-1]] for s in a.sizes.split(",")]
    rows = []
    mm_a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    mm_b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    # Matmuls for about 50 ms alone.
    t = timed(lambda: matmul_loop(4, mm_a, mm_b, side), 3)
    mm_iter = max(1, int(4 * 0.05 / t))
    marks = []

    def alone():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(side)
        matmul_loop(mm_iter, mm_a, mm_b, side)
        e1.record(side)
        marks.append((e0, e1))

    timed(alone, 5)
    mm_alone = statistics.median(e0.elapsed_time(e1) / 1e3 for e0, e1 in marks[1:])
    print(f"matmul loop alone: {mm_alone * 1e3:.2f} ms ({mm_iter} x 8192^3 bf16)")
    for way in a.ways.split(","):
        for block in sizes:
            for count in [int(c) for c in a.counts.split(",")]:
                if count * block * a.layers > (1 << 30):
                    continue
                sw, dw = {"h2d": ("pinned", "cuda"), "d2h": ("cuda", "pinned"), "d2d": ("cuda", "cuda")}[way]
                src = tables(a.layers, count, block, sw, 1)
                dst = tables(a.layers, count, block, dw, 2)
                perm = torch.randperm(count, generator=torch.Generator().manual_seed(3)).tolist()
                pairs = list(zip(range(count), perm))
                payload = count * block * a.layers
                row = {"way": way, "block": block, "count": count, "layers": a.layers, "gbps": {}, "busy": {}}
                for name, fn in methods(dst, src, pairs, block, "cuda:0").items():
                    if name == "torch copy_ loop" and count * a.layers > 20000:
                        continue
                    reset(dst)
                    sec = timed(fn, a.runs)
                    check(dst, src, pairs, name)
                    row["gbps"][name] = payload / sec / 1e9
                    if a.interference:
                        marks = []

                        def both():
                            e0 = torch.cuda.Event(enable_timing=True)
                            e1 = torch.cuda.Event(enable_timing=True)
                            e0.record(side)
                            matmul_loop(mm_iter, mm_a, mm_b, side)
                            e1.record(side)
                            fn()
                            marks.append((e0, e1))

                        reset(dst)
                        tb = timed(both, 3)
                        check(dst, src, pairs, f"{name} with matmul")
                        # The matmul loop's own GPU time beside the copy (events on its stream).
                        mm_with = statistics.median(e0.elapsed_time(e1) / 1e3 for e0, e1 in marks[1:])
                        row["busy"][name] = {"both_ms": tb * 1e3, "matmul_slowdown": mm_with / mm_alone}
                line = "  ".join(f"{k} {v:.2f}" for k, v in row["gbps"].items())
                print(f"{way} {count} x {block // 1024} KiB x {a.layers} layers GB/s: {line}")
                if row["busy"]:
                    line = "  ".join(
                        f"{k} {v['both_ms']:.1f} ms ({v['matmul_slowdown']:.3f}x)" for k, v in row["busy"].items()
                    )
                    print(f"    with matmul (both done, matmul slowdown): {line}")
                rows.append(row)
                del src, dst
    out = {"matmul_alone_ms": mm_alone * 1e3, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
