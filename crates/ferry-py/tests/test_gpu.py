"""ferry's Python module with PyTorch (and CuPy) on a GPU. Skipped, with the reason, where
there is no CUDA driver, no GPU or no PyTorch. Every result is byte-checked."""

import gc

import pytest

import ferry

from _gpu import DEV, torch  # skips this module without PyTorch, a driver or a GPU

DTYPES = [
    torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
]


def rand(shape, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape).to(device)


def same(a, b, what):
    a, b = a.cpu(), b.cpu()
    assert a.shape == b.shape and a.dtype == b.dtype, what
    if not torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
        diff = (a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).nonzero()
        raise AssertionError(f"{what}: {len(diff)} bytes differ, first at byte {diff[0].tolist()}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_both_ways(dtype):
    src = rand((129, 257), dtype)
    dev = torch.zeros_like(src, device=DEV)
    ferry.copy_(dev, src)
    same(dev, src, f"h2d {dtype}")
    back = torch.zeros_like(src)
    ferry.copy_(back, dev)
    same(back, src, f"d2h {dtype}")


@pytest.mark.parametrize("size", [4 << 10, 3 << 20, 64 << 20], ids=["4KiB", "3MiB", "64MiB"])
@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_sizes_pageable_and_pinned(size, pinned):
    src = rand((size,), torch.uint8, seed=size)
    if pinned:
        src = src.pin_memory()
    dev = torch.empty(size, dtype=torch.uint8, device=DEV)
    ferry.copy_(dev, src)
    same(dev, src, f"h2d {size} bytes pinned={pinned}")
    back = torch.zeros(size, dtype=torch.uint8)
    if pinned:
        back = back.pin_memory()
    req = ferry.copy_(back, dev, non_blocking=True)
    req.wait()
    assert req.done()
    same(back, src, f"d2h {size} bytes pinned={pinned}")


def test_strided_both_ways_and_device_to_device():
    big = rand((64, 96, 5), torch.float32)
    for src, what in [(big[::2, 3:50:3, 1], "steps"), (big.permute(2, 0, 1), "permuted"), (big[:, :, 0].t(), "transposed")]:
        dev = torch.zeros(src.shape, dtype=src.dtype, device=DEV)
        ferry.copy_(dev, src)
        same(dev, src, f"h2d {what}")
        dev_t = torch.zeros((2,) + tuple(src.shape), dtype=src.dtype, device=DEV)[1]
        ferry.copy_(dev_t, dev)
        same(dev_t, src, f"d2d {what}")
        host = torch.zeros((2,) + tuple(src.shape), dtype=src.dtype)[1]
        ferry.copy_(host, dev_t)
        same(host, src, f"d2h {what}")


def test_errors():
    with pytest.raises(ferry.ArgumentError, match="mismatch"):
        ferry.copy_(torch.zeros(4, device=DEV), torch.zeros(5))
    with pytest.raises(ferry.ArgumentError, match="mismatch"):
        ferry.copy_(torch.zeros(4, device=DEV), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ferry.ArgumentError, match="conj"):
        ferry.copy_(torch.zeros(4, dtype=torch.complex64, device=DEV), torch.ones(4, dtype=torch.complex64).conj())
    ro = torch.zeros(4).numpy()
    ro.flags.writeable = False
    with pytest.raises(ferry.ArgumentError, match="read-only"):
        ferry.copy_(ro, torch.ones(4, device=DEV))


@pytest.mark.parametrize("how", ["explicit", "current"])
def test_on_current_stream(how):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.full((1 << 24,), 3.0, device=DEV)
        for _ in range(20):
            x = x * 1.0  # queue work on s ahead of the copy
        y = x * 2
        host = torch.zeros(1 << 24)
        if how == "explicit":
            ferry.copy_(host, y, stream=s.cuda_stream)
        else:
            ferry.copy_(host, y)  # PyTorch's current stream (s) by default
        back = torch.empty_like(y)
        ferry.copy_(back, host, non_blocking=True)
        z = back + 1  # ordered after the upload on s
    torch.cuda.synchronize()
    assert bool((host == 6.0).all()), f"{how}: copy ran before the stream's kernels"
    assert bool((z == 7.0).all()), f"{how}: kernel ran before the upload"


def test_gather_pageable_rows_to_gpu():
    src = rand((20000, 1024), torch.float32)
    idx = torch.randint(0, 20000, (5000,), dtype=torch.int64)
    out = torch.zeros((5000, 1024), device=DEV)
    ferry.gather(src, idx, out)
    same(out, src[idx], "gather pageable -> device")
    out_h = torch.zeros((5000, 1024))
    ferry.gather(out, torch.arange(4999, -1, -1), out_h)
    same(out_h, src[idx].flip(0), "gather device -> host")


def test_safetensors_to_gpu(tmp_path):
    st = pytest.importorskip("safetensors.torch", reason="needs safetensors")
    tensors = {f"t{i}": rand((33, 65), d, seed=i) for i, d in enumerate(DTYPES) if d != torch.complex64}
    path = tmp_path / "m.safetensors"
    st.save_file(tensors, str(path))
    got = ferry.load_safetensors(path, device=DEV)
    for k, v in tensors.items():
        assert got[k].device == torch.device(DEV), k
        same(got[k], v, f"load {k}")
    ferry.save_safetensors(got, tmp_path / "back.safetensors")
    ref = st.load_file(str(tmp_path / "back.safetensors"))
    for k, v in tensors.items():
        same(ref[k], v, f"save {k}")
    del got
    gc.collect()


def test_cupy_if_installed(tmp_path):
    cp = pytest.importorskip("cupy", reason="needs CuPy")
    a = cp.arange(1 << 16, dtype=cp.float32)[::2]
    h = torch.zeros(1 << 15)
    ferry.copy_(h, a)
    assert bool((h == torch.arange(0, 1 << 16, 2, dtype=torch.float32)).all())
    ferry.save_safetensors({"a": cp.ascontiguousarray(a)}, tmp_path / "c.safetensors")
    back = ferry.load_safetensors(tmp_path / "c.safetensors", device=DEV, framework="cupy")
    assert bool((back["a"] == a).all())
