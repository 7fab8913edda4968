"""ferry.copy_blocks with PyTorch on a GPU: KV-cache-shaped block tables swapped between GPU
and pinned host memory and within the GPU, as vLLM's swap_blocks, with the SMs free and left
to compute. Skipped, with the reason, without PyTorch, a CUDA driver or a GPU."""

import pytest

import ferry

from _gpu import DEV, torch  # skips this module without PyTorch, a driver or a GPU


def kv(layers, blocks, block_shape, device, seed, pin=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        t = torch.randn((blocks, *block_shape), generator=g).to(torch.bfloat16)
        t = t.pin_memory() if pin else t.to(device)
        out.append(t)
    return out


def expected(dst, src, mapping):
    out = dst.clone()
    for s, d in mapping.tolist():
        out[d] = src[s].to(out.device)
    return out


@pytest.mark.parametrize("leave_sms", [False, True])
@pytest.mark.parametrize("way", ["h2d", "d2h", "d2d"])
@pytest.mark.parametrize("block_shape", [(16, 8, 128), (16, 1, 64), (256, 8, 128)])
def test_swap_blocks_like_vllm(leave_sms, way, block_shape):
    blocks = 64
    host = lambda s: kv(2, blocks, block_shape, "cpu", s, pin=True)  # noqa: E731
    dev = lambda s: kv(2, blocks, block_shape, DEV, s)  # noqa: E731
    src, dst = {"h2d": (host(1), dev(2)), "d2h": (dev(1), host(2)), "d2d": (dev(1), dev(2))}[way]
    mapping = torch.stack([torch.randperm(blocks)[:40], torch.randperm(blocks)[:40]], dim=1)
    want = [expected(d, s, mapping) for d, s in zip(dst, src)]
    ferry.copy_blocks(dst, src, mapping, leave_sms=leave_sms)
    torch.cuda.synchronize()
    for l, (d, w) in enumerate(zip(dst, want)):
        assert torch.equal(d.cpu().view(torch.int16), w.cpu().view(torch.int16)), f"layer {l}"


def test_leave_sms_with_an_engine_made_to_leave_them():
    src = kv(2, 32, (16, 64), DEV, 5)
    dst = kv(2, 32, (16, 64), "cpu", 6, pin=True)
    mapping = torch.stack([torch.randperm(32)[:12], torch.randperm(32)[:12]], dim=1)
    want = [expected(d, s, mapping) for d, s in zip(dst, src)]
    busy = ferry.CudaEngine(0, compute_busy=True)
    assert busy.compute_busy
    ferry.copy_blocks(dst, src, mapping, leave_sms=True, engine=busy)
    torch.cuda.synchronize()
    for l, (d, w) in enumerate(zip(dst, want)):
        assert torch.equal(d.view(torch.int16), w.view(torch.int16)), f"layer {l}"
    plain = ferry.CudaEngine(0)
    if not plain.compute_busy:
        with pytest.raises(ferry.ArgumentError, match="compute_busy=True"):
            ferry.copy_blocks(dst, src, mapping, leave_sms=True, engine=plain)


def test_ordered_with_the_current_stream():
    # The source is written by a kernel on PyTorch's current stream just before the swap: the
    # swap (on that stream by default) sees it.
    src = torch.zeros((32, 4096), dtype=torch.float32, device=DEV)
    dst = torch.empty((32, 4096), dtype=torch.float32).pin_memory()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)
        src.fill_(3.0)
        ferry.copy_blocks(dst, src, [(i, 31 - i) for i in range(32)], non_blocking=True)
    s.synchronize()
    assert bool((dst == 3.0).all())


def test_refusal_on_gpu_tables_moves_nothing():
    src = kv(1, 8, (16, 64), DEV, 3)
    dst = kv(1, 8, (16, 64), DEV, 4)
    before = dst[0].clone()
    with pytest.raises(ferry.ArgumentError, match="both write destination block 2"):
        ferry.copy_blocks(dst, src, [(0, 2), (1, 2)])
    assert torch.equal(dst[0], before)
