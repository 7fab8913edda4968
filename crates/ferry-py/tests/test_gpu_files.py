"""On a GPU: ferry.read_file / write_file with PyTorch tensors and CuPy arrays (byte-checked
against the file), the producer's stream ordered before the I/O, and copies ordered after the
stream a __cuda_array_interface__ names (CuPy). Skipped, with the reason, without PyTorch, a
CUDA driver or a GPU (CuPy tests: without CuPy)."""

import pytest

import ferry

from _gpu import DEV, torch  # skips this module without PyTorch, a driver or a GPU



def first_diff(a, b):
    bad = (a != b).nonzero()
    return None if len(bad) == 0 else bad[0].item()


@pytest.mark.parametrize("size", [4096, (3 << 20) + 5, 64 << 20], ids=["4KiB", "3MiB+5", "64MiB"])
def test_torch_read_write_roundtrip(tmp_path, size):
    g = torch.Generator().manual_seed(size)
    host = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)
    p = tmp_path / "t.bin"
    p.write_bytes(host.numpy().tobytes())
    dev = torch.zeros(size, dtype=torch.uint8, device=DEV)
    assert ferry.read_file(p, dev) == size
    i = first_diff(dev.cpu(), host)
    assert i is None, f"read_file {size} bytes: first differing byte {i}"
    # A part at an offset, "up to" the end.
    part = torch.zeros(1000, dtype=torch.uint8, device=DEV)
    assert ferry.read_file(p, part, offset=size - 600) == 600
    assert torch.equal(part[:600].cpu(), host[-600:]) and int(part[600:].sum()) == 0
    # Back out, from a tensor PyTorch is still writing on its current stream.
    src = torch.empty(size, dtype=torch.uint8, device=DEV)
    src.copy_(host.to(DEV, non_blocking=True))
    src.add_(1)  # queued: write_file must wait for it
    q = tmp_path / "u.bin"
    assert ferry.write_file(q, src) == size
    want = (host + 1).numpy().tobytes()
    got = q.read_bytes()
    assert got == want, f"write_file {size} bytes differ"


def test_torch_typed_tensor(tmp_path):
    a = torch.randn(512, 1024, device=DEV)
    p = tmp_path / "f.bin"
    assert ferry.write_file(p, a) == a.numel() * 4
    b = torch.empty_like(a)
    assert ferry.read_file(p, b) == a.numel() * 4
    assert torch.equal(a, b)


def test_cupy_read_file(tmp_path):
    cp = pytest.importorskip("cupy", reason="needs CuPy")
    import numpy as np

    host = np.random.default_rng(3).integers(0, 256, size=(9 << 20) + 3, dtype=np.uint8)
    p = tmp_path / "c.bin"
    p.write_bytes(host.tobytes())
    buf = cp.zeros(host.size, dtype=cp.uint8)
    assert ferry.read_file(p, buf) == host.size
    np.testing.assert_array_equal(cp.asnumpy(buf), host)
    assert ferry.write_file(tmp_path / "d.bin", buf) == host.size
    assert (tmp_path / "d.bin").read_bytes() == host.tobytes()


class OnlyCai:
    """A CuPy array seen only through __cuda_array_interface__, with an explicit stream."""

    def __init__(self, arr, stream):
        d = dict(arr.__cuda_array_interface__)
        d["version"] = 3
        d["stream"] = stream
        self.__cuda_array_interface__ = d
        self.arr = arr


def test_cai_stream_orders_the_copy():
    cp = pytest.importorskip("cupy", reason="needs CuPy")
    import numpy as np

    n = 64 << 20
    x = cp.zeros(n, dtype=cp.uint8)
    cp.cuda.runtime.deviceSynchronize()
    s = cp.cuda.Stream(non_blocking=True)
    rounds = 200  # about 10 ms of kernels at H200 bandwidth; uint8 does not wrap
    for attempt in range(3):
        x.fill(0)
        cp.cuda.runtime.deviceSynchronize()
        with s:
            for _ in range(rounds):  # tens of ms of queued work on a non-blocking stream
                cp.add(x, 1, out=x)
        out = np.zeros(n, dtype=np.uint8)
        # ferry's own streams: ordered with nothing but the interface's stream.
        ferry.copy_(out, OnlyCai(x, s.ptr), stream="ferry")
        bad = np.flatnonzero(out != rounds)
        assert bad.size == 0, (
            f"attempt {attempt}: {bad.size} bytes not yet {rounds} (first at {bad[0]}: "
            f"{out[bad[0]]}): the copy did not wait for the producer's stream"
        )
    s.synchronize()


def test_cai_stream_none_and_legacy():
    cp = pytest.importorskip("cupy", reason="needs CuPy")
    import numpy as np

    x = cp.arange(1 << 20, dtype=cp.int32)
    cp.cuda.runtime.deviceSynchronize()
    for stream in (None, 1, 2):
        out = np.zeros(1 << 20, dtype=np.int32)
        ferry.copy_(out, OnlyCai(x, stream))
        np.testing.assert_array_equal(out, np.arange(1 << 20, dtype=np.int32), err_msg=f"stream={stream}")
    with pytest.raises(ferry.ArgumentError, match="stream 0"):
        ferry.copy_(np.zeros(1 << 20, dtype=np.int32), OnlyCai(x, 0))


def test_load_safetensors_into_torch_tensors(tmp_path):
    """out= fills existing GPU tensors in place (a model's state dict), byte-checked, after the
    work PyTorch queued on them."""
    ts = {
        "w": torch.randn(1024, 513, device=DEV, dtype=torch.bfloat16),
        "b": torch.arange(7, device=DEV, dtype=torch.int64),
        "s": torch.tensor(2.5, device=DEV),
    }
    path = tmp_path / "m.safetensors"
    ferry.save_safetensors(ts, path)
    out = {k: torch.empty_like(v) for k, v in ts.items()}
    ptrs = {k: v.data_ptr() for k, v in out.items()}
    torch.cuda._sleep(50_000_000)  # keeps the stream busy for tens of ms before the fills
    for v in out.values():
        v.fill_(0)  # queued on the current stream: must land before the load's writes
    assert ferry.load_safetensors(path, out=out) is out
    for k, v in ts.items():
        assert out[k].data_ptr() == ptrs[k], k
        assert torch.equal(out[k], v), k
    with pytest.raises(ferry.ArgumentError, match="expects"):
        ferry.load_safetensors(path, out={"w": torch.empty(1024, 513, device=DEV)})
