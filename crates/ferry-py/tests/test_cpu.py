"""ferry's Python module on the CPU engine with NumPy arrays (runs in CI, no GPU needed)."""

import gc
import os
import sys
import threading
import time

import numpy as np
import pytest

import ferry

DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
    np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
]


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def test_info_is_a_dict():
    i = ferry.info()
    assert isinstance(i, dict)
    assert i["abi"] == "abi3-py39" and "float32" in i["dtypes"]
    assert "cuda_driver" in i and isinstance(i["devices"], list)


def test_import_needs_no_numpy():
    code = "import sys; sys.modules['numpy'] = None; sys.modules['torch'] = None; import ferry; ferry.info()"
    assert os.system(f'{sys.executable} -c "{code}"') == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype(dtype):
    src = sample((37, 53), dtype)
    dst = np.zeros_like(src)
    req = ferry.copy_(dst, src)
    assert req.done()
    assert dst.tobytes() == src.tobytes()


@pytest.mark.parametrize("engine", [None, "cpu1", "cpu0"])
def test_strided_and_non_contiguous(engine):
    eng = {None: None, "cpu1": ferry.CpuEngine(threads=1), "cpu0": ferry.CpuEngine()}[engine]
    big = sample((64, 96, 5), np.float32)
    cases = [
        (big[::2, 3:50:3, 1], "slice with steps"),
        (big.transpose(2, 0, 1), "permuted"),
        (big[:, :, 0].T, "transposed 2-D"),
        (big[5], "a plane"),
        (big[5, 7, 2], "numpy scalar"),
        (np.array(big[5, 7, 2]), "0-d"),
    ]
    for src, what in cases:
        if isinstance(src, np.generic):
            with pytest.raises(ferry.ArgumentError, match="read-only"):
                ferry.copy_(src, src)
        dst = np.zeros(src.shape, src.dtype)
        ferry.copy_(dst, src, engine=eng)
        np.testing.assert_array_equal(dst, src, err_msg=what)
        # And into a strided destination.
        host = np.zeros((2,) + src.shape, src.dtype)
        view = host[1, ...]
        ferry.copy_(view, src, engine=eng)
        np.testing.assert_array_equal(view, src, err_msg=what)
        assert not host[0].any()
    # Fortran order both ways.
    f = np.asfortranarray(big)
    out = np.empty_like(big)
    ferry.copy_(out, f)
    np.testing.assert_array_equal(out, big)


def test_broadcast_source_zero_stride():
    src = np.broadcast_to(np.arange(7, dtype=np.int32), (5, 7))
    dst = np.zeros((5, 7), np.int32)
    ferry.copy_(dst, src)
    np.testing.assert_array_equal(dst, src)


def test_empty_arrays():
    ferry.copy_(np.zeros((0, 4)), np.zeros((0, 4))).wait()


def test_shape_mismatch_raises():
    with pytest.raises(ferry.ArgumentError, match="shape or dtype mismatch"):
        ferry.copy_(np.zeros((3, 4), np.float32), np.zeros((4, 3), np.float32))


def test_dtype_mismatch_raises():
    with pytest.raises(ferry.ArgumentError, match="float64.*float32|float32.*float64"):
        ferry.copy_(np.zeros(8, np.float64), np.zeros(8, np.float32))


def test_read_only_destination_raises():
    dst = np.zeros(16, np.uint8)
    dst.flags.writeable = False
    with pytest.raises(ferry.ArgumentError, match="read-only"):
        ferry.copy_(dst, np.ones(16, np.uint8))
    assert not dst.any()


def test_negative_strides_raise():
    with pytest.raises(ferry.ArgumentError, match="negative strides"):
        ferry.copy_(np.zeros(8), np.arange(8.0)[::-1])


def test_overlapping_destination_raises():
    dst = np.lib.stride_tricks.as_strided(np.zeros(8), shape=(4, 4), strides=(8, 8))
    with pytest.raises(ferry.ArgumentError, match="overlapping"):
        ferry.copy_(dst, np.ones((4, 4)))


def test_not_an_array_raises():
    with pytest.raises(ferry.ArgumentError, match="expected an array"):
        ferry.copy_(np.zeros(3), [1, 2, 3])


def test_exception_hierarchy():
    assert issubclass(ferry.ArgumentError, ferry.FerryError)
    assert issubclass(ferry.DriverError, ferry.FerryError)
    assert issubclass(ferry.CheckpointError, ferry.FerryError)
    assert issubclass(ferry.FerryError, Exception)


def test_cuda_engine_without_driver_is_driver_error():
    if ferry.info()["cuda_driver"] is not None:
        pytest.skip("a CUDA driver is present")
    with pytest.raises(ferry.DriverError, match="driver"):
        ferry.CudaEngine(0)


def test_non_blocking_request_wait_done_and_await():
    import asyncio

    src = sample((1 << 22,), np.uint8)
    dst = np.zeros_like(src)
    req = ferry.copy_(dst, src, non_blocking=True)
    req.wait()
    assert req.done() and dst.tobytes() == src.tobytes()
    req.wait()  # waiting twice is fine

    async def main():
        d2 = np.zeros_like(src)
        await ferry.copy_(d2, src, non_blocking=True)
        return d2

    assert asyncio.run(main()).tobytes() == src.tobytes()


def test_request_repr_says_done_once_complete():
    src = sample((16,), np.uint8)
    # An empty copy completes at submit; a small one soon after. Neither was waited for.
    empty = ferry.copy_(np.zeros(0, np.uint8), src[:0], non_blocking=True)
    assert repr(empty) == "ferry.Request(done)"
    req = ferry.copy_(np.zeros_like(src), src, non_blocking=True)
    while not req.done():
        pass
    assert repr(req) == "ferry.Request(done)"


def test_request_keeps_arrays_alive():
    src = sample((1 << 24,), np.uint8)
    expect = src.tobytes()
    dst = np.zeros_like(src)
    req = ferry.copy_(dst, src, non_blocking=True)
    del src
    gc.collect()
    req.wait()
    assert dst.tobytes() == expect
    # Dropping an unfinished request waits for it.
    src2 = sample((1 << 24,), np.uint8, seed=2)
    ferry.copy_(dst, src2, non_blocking=True)
    assert dst.tobytes() == src2.tobytes()


def test_gil_released_while_copy_waits():
    # 512 MiB on one worker thread: long enough for a Python thread to count meanwhile.
    eng = ferry.CpuEngine(threads=1)
    src = np.ones(512 << 20, np.uint8)
    dst = np.zeros_like(src)
    ferry.copy_(dst, src, engine=eng)  # fault the pages in first
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0)

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.05)
    before = len(ticks)
    t0 = time.perf_counter()
    for _ in range(3):
        ferry.copy_(dst, src, engine=eng)
    took = time.perf_counter() - t0
    during = len(ticks) - before
    stop.set()
    t.join()
    assert during > 10, f"the other thread ran {during} times during {took:.3f} s of copies"


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_no_leaks_over_10000_copies():
    src = sample((64, 64), np.float32)
    dst = np.zeros_like(src)
    wide = np.zeros((32, 128), np.float32)
    for _ in range(500):
        ferry.copy_(wide[:, ::2], src[::2], non_blocking=True).wait()
    gc.collect()
    objs, rss = len(gc.get_objects()), rss_kib()
    for i in range(10_000):
        if i % 2:
            ferry.copy_(wide[:, ::2], src[::2], non_blocking=True).wait()
        else:
            ferry.copy_(dst, src)
    gc.collect()
    grew_objs, grew_rss = len(gc.get_objects()) - objs, rss_kib() - rss
    assert grew_objs < 100, f"{grew_objs} more Python objects after 10,000 copies"
    assert grew_rss < 8 * 1024, f"RSS grew {grew_rss} KiB over 10,000 copies"
    assert sys.getrefcount(src) < 10


def test_gather_rows():
    src = sample((1000, 33), np.float32)
    idx = np.random.default_rng(1).integers(0, 1000, size=257).astype(np.int64)
    out = np.zeros((257, 33), np.float32)
    ferry.gather(src, idx, out)
    np.testing.assert_array_equal(out, src[idx])
    # Into a strided out (every other row of a bigger array).
    big = np.zeros((514, 33), np.float32)
    ferry.gather(src, idx, big[::2])
    np.testing.assert_array_equal(big[::2], src[idx])
    assert not big[1::2].any()


def test_gather_errors():
    src = np.zeros((10, 4), np.float32)
    with pytest.raises(ferry.ArgumentError, match="outside"):
        ferry.gather(src, np.array([3, 10], np.int64), np.zeros((2, 4), np.float32))
    with pytest.raises(ferry.ArgumentError, match="int64"):
        ferry.gather(src, np.array([1, 2], np.int32), np.zeros((2, 4), np.float32))
    with pytest.raises(ferry.ArgumentError, match="out must be"):
        ferry.gather(src, np.array([1, 2], np.int64), np.zeros((3, 4), np.float32))
    # Nothing to copy, the index still checked (these once returned success, out untouched).
    out = np.full((2, 4), 7, np.float32)
    with pytest.raises(ferry.ArgumentError, match="outside src's 0 rows"):
        ferry.gather(np.zeros((0, 4), np.float32), np.array([0, 5], np.int64), out)
    with pytest.raises(ferry.ArgumentError, match="outside src's 3 rows"):
        ferry.gather(
            np.zeros((3, 0), np.float32), np.array([-1, 99], np.int64), np.zeros((2, 0), np.float32)
        )
    ferry.gather(np.zeros((3, 0), np.float32), np.array([2, 0], np.int64), np.zeros((2, 0), np.float32))


def test_odd_typestr_refused():
    # A type string whose third byte is inside a character once panicked.
    buf = np.zeros(4, np.uint8)

    class A:
        __array_interface__ = dict(
            shape=(4,), typestr="<\u00e9", data=(buf.ctypes.data, False), version=3
        )

    with pytest.raises(ferry.ArgumentError, match="unsupported array type string"):
        ferry.copy_(A(), A())


SAVE_DTYPES = [d for d in DTYPES if d not in (np.complex64, np.complex128)]


def test_safetensors_round_trip(tmp_path):
    tensors = {f"t_{np.dtype(d).name}": sample((3, 5, 7), d, seed=i) for i, d in enumerate(SAVE_DTYPES)}
    tensors["scalar"] = np.array(3.5, np.float32)
    tensors["empty"] = np.zeros((0, 3), np.float32)
    path = tmp_path / "m.safetensors"
    ferry.save_safetensors(tensors, path, metadata={"format": "np"})
    back = ferry.load_safetensors(path, device="cpu", framework="numpy")
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert back[k].tobytes() == v.tobytes(), k
    some = ferry.load_safetensors(path, device="cpu", names=["t_int16"], framework="numpy")
    assert list(some) == ["t_int16"]
    try:
        from safetensors.numpy import load_file, save_file
    except ImportError:
        return
    ref = load_file(str(path))
    for k, v in tensors.items():
        assert ref[k].tobytes() == v.tobytes(), k
    path2 = tmp_path / "ref.safetensors"
    save_file({k: v for k, v in tensors.items()}, str(path2))
    mine = ferry.load_safetensors(path2, device="cpu", framework="numpy")
    for k, v in tensors.items():
        assert mine[k].tobytes() == v.tobytes(), k


def test_loaded_arrays_outlive_everything(tmp_path):
    path = tmp_path / "m.safetensors"
    ferry.save_safetensors({"a": np.arange(1000, dtype=np.int64)}, path)
    a = ferry.load_safetensors(path, device="cpu", framework="numpy")["a"]
    gc.collect()
    np.testing.assert_array_equal(a, np.arange(1000))
    buf = ferry.load_safetensors(path, device="cpu", framework="ferry")["a"]
    assert buf.shape == [1000] and buf.dtype == "int64" and buf.device == "cpu"
    assert np.from_dlpack(buf)[999] == 999


def test_sharded_checkpoint(tmp_path):
    import json

    ferry.save_safetensors({"a": np.arange(10, dtype=np.float32)}, tmp_path / "s1.safetensors")
    ferry.save_safetensors({"b": np.ones((2, 2), np.int8)}, tmp_path / "s2.safetensors")
    (tmp_path / "m.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})
    )
    got = ferry.load_safetensors(tmp_path / "m.safetensors.index.json", device="cpu", framework="numpy")
    np.testing.assert_array_equal(got["a"], np.arange(10))
    np.testing.assert_array_equal(got["b"], np.ones((2, 2)))


def test_load_into_existing_arrays(tmp_path):
    tensors = {f"t_{np.dtype(d).name}": sample((3, 5, 7), d, seed=i) for i, d in enumerate(SAVE_DTYPES)}
    tensors["scalar"] = np.array(3.5, np.float32)
    tensors["empty"] = np.zeros((0, 3), np.float32)
    path = tmp_path / "m.safetensors"
    ferry.save_safetensors(tensors, path)
    out = {k: np.zeros_like(v) for k, v in tensors.items()}
    ids = {k: id(v) for k, v in out.items()}
    assert ferry.load_safetensors(path, out=out) is out
    for k, v in tensors.items():
        assert id(out[k]) == ids[k], k  # filled in place
        assert out[k].tobytes() == v.tobytes(), k
    # A subset, reloaded into the same memory: a view into a larger array works (contiguous).
    big = np.zeros(1000, np.int16)
    view = big[100 : 100 + 105].reshape(3, 5, 7)
    ferry.load_safetensors(path, out={"t_int16": view})
    assert view.tobytes() == tensors["t_int16"].tobytes()
    assert (big[:100] == 0).all() and (big[205:] == 0).all()


def test_load_into_refuses_mismatches_before_writing(tmp_path):
    path = tmp_path / "m.safetensors"
    ferry.save_safetensors({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int8)}, path)

    def untouched(out, msg, exc=ferry.ArgumentError):
        with pytest.raises(exc, match=msg):
            ferry.load_safetensors(path, out=out)
        for k, v in out.items():
            assert (v == 7).all(), f"{k} was written"

    good = lambda: np.full((2, 3), 7, np.float32)  # noqa: E731
    untouched({"w": good(), "b": np.full(3, 7, np.int16)}, "expects I16, the tensor is I8")
    untouched({"w": good(), "b": np.full((3, 1), 7, np.int8)}, r"expects shape \[3, 1\]")
    untouched({"w": np.full((3, 2), 7, np.float32)}, r"expects shape \[3, 2\], the tensor's is \[2, 3\]")
    untouched({"w": good(), "nope": np.full(3, 7, np.int8)}, "no tensor `nope`", ferry.CheckpointError)
    ro = good()
    ro.flags.writeable = False
    untouched({"w": ro}, "read-only")
    untouched({"w": np.full((3, 2), 7, np.float32).T}, "contiguous")
    with pytest.raises(ferry.ArgumentError, match="names or out"):
        ferry.load_safetensors(path, names=["w"], out={"w": good()})
    with pytest.raises(ferry.ArgumentError, match="keys must be str"):
        ferry.load_safetensors(path, out={1: good()})
    with pytest.raises(ferry.ArgumentError, match="dict"):
        ferry.load_safetensors(path, out=[good()])
    # Two names over the same memory (tied weights) or overlapping views: their reads would
    # race, so both are refused before anything is read.
    shared = good()
    untouched({"w": shared, "w2": shared}, "share memory")
    big = np.full(10, 7, np.int8)
    untouched({"b": big[0:3], "c": big[2:5]}, "share memory")


def test_load_into_strict_false_skips_names_the_file_lacks(tmp_path):
    path = tmp_path / "m.safetensors"
    ferry.save_safetensors({"w": np.arange(6, dtype=np.float32)}, path)
    out = {"w": np.zeros(6, np.float32), "lm_head": np.full(4, 7, np.float32)}
    with pytest.raises(ferry.CheckpointError, match="lm_head"):
        ferry.load_safetensors(path, out=out)
    assert ferry.load_safetensors(path, out=out, strict=False) is out
    np.testing.assert_array_equal(out["w"], np.arange(6))
    assert (out["lm_head"] == 7).all()


def test_checkpoint_errors(tmp_path):
    with pytest.raises(ferry.CheckpointError, match="nope"):
        ferry.load_safetensors(tmp_path / "nope.safetensors", device="cpu", framework="numpy")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ferry.CheckpointError):
        ferry.load_safetensors(bad, device="cpu", framework="numpy")
    with pytest.raises(ferry.ArgumentError, match="framework"):
        ferry.load_safetensors(bad, device="cpu", framework="jax")
    with pytest.raises(ferry.ArgumentError, match="device"):
        ferry.load_safetensors(bad, device="tpu")
    with pytest.raises(ferry.ArgumentError, match="contiguous"):
        ferry.save_safetensors({"x": np.zeros((4, 4)).T}, tmp_path / "x.safetensors")


class _TorchLike:
    """Stands in for a torch.Tensor on the CPU: the accessors ferry's fast path reads."""

    __module__ = "torch"

    def __init__(self, a):
        self.a = a
        self.shape = a.shape
        self.dtype = f"torch.{a.dtype.name}"
        self.is_cpu = True

    def data_ptr(self):
        return self.a.__array_interface__["data"][0]

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def get_device(self):
        return -1


def test_torch_fast_path_strided():
    src = sample((40, 30), np.int16)
    dst = np.zeros((30, 40), np.int16)
    ferry.copy_(_TorchLike(dst), _TorchLike(src.T))
    np.testing.assert_array_equal(dst, src.T)
    with pytest.raises(ferry.ArgumentError, match="negative strides"):
        ferry.copy_(_TorchLike(dst), _TorchLike(src.T[::-1]))


def test_stream_argument_checked():
    a, b = np.zeros(4), np.ones(4)
    with pytest.raises(ferry.ArgumentError, match="needs a copy that involves GPU memory"):
        ferry.copy_(a, b, stream=5)
    with pytest.raises(ferry.ArgumentError, match="stream=.mine.: expected None"):
        ferry.copy_(a, b, stream="mine")
    ferry.copy_(a, b, stream="ferry")
    ferry.copy_(a, b, stream=None)
    assert (a == 1).all()


class _DlpackOnly:
    """Exposes an array through DLPack alone (as a PyTorch CPU tensor or JAX array does)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None, **kw):
        return self.a.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int64, np.float16, np.complex128], ids=lambda d: np.dtype(d).name)
def test_dlpack_in_strided(dtype):
    src = sample((24, 36), dtype)
    dst = np.zeros((36, 24), dtype)
    ferry.copy_(dst, _DlpackOnly(src.T))
    np.testing.assert_array_equal(dst, src.T)
    # Through a ferry-owned buffer and back: DLPack out, DLPack in.
    before = len(gc.get_objects())
    for _ in range(200):
        ferry.copy_(dst, _DlpackOnly(src.T), non_blocking=True).wait()
    gc.collect()
    assert len(gc.get_objects()) - before < 50


def test_engine_arguments_out_of_range():
    # Negative counts were OverflowErrors, a million threads were started until the system
    # refused one.
    for bad in (lambda: ferry.CpuEngine(-1), lambda: ferry.CpuEngine(10**6)):
        with pytest.raises(ferry.ArgumentError):
            bad()
    with pytest.raises(ferry.ArgumentError, match="device=-1: expected an int from 0"):
        ferry.CudaEngine(-1)
