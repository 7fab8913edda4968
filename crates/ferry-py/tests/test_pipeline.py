"""ferry.pipeline with a Python stage on the CPU engine: outputs equal a NumPy reference for
several chunk sizes and slots 1..4 (ragged last chunk, empty and strided sources), a stage's
exception propagates with its chunk, the GIL is released while ferry copies."""

import threading
import time

import numpy as np
import pytest

import ferry


def stage(inp, out, index):
    out[:] = inp * np.uint8(3) + np.uint8(index & 255)


def reference(src, chunk):
    b = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
    res = np.empty_like(b)
    for k, start in enumerate(range(0, b.size, chunk)):
        res[start : start + chunk] = b[start : start + chunk] * np.uint8(3) + np.uint8(k & 255)
    return res


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
@pytest.mark.parametrize("chunk", [1, 7, 4096, 65536, 1 << 20])
def test_matches_numpy(slots, chunk):
    rng = np.random.default_rng(chunk * 10 + slots)
    size = 3_001 if chunk < 100 else 300_001  # ragged last chunk
    src = rng.integers(0, 256, size=size, dtype=np.uint8)
    out = np.zeros_like(src)
    n = ferry.pipeline(src, out, stage, chunk_bytes=chunk, slots=slots)
    assert n == -(-src.size // chunk)
    np.testing.assert_array_equal(out, reference(src, chunk))


def test_typed_arrays_and_views():
    src = np.arange(10_000, dtype=np.float32)
    out = np.empty_like(src)

    def double(inp, o, _):
        o.view(np.float32)[:] = inp.view(np.float32) * 2

    ferry.pipeline(src, out, double, chunk_bytes=4096, slots=2)
    np.testing.assert_array_equal(out, src * 2)


def test_strided_source():
    base = np.arange(64 * 100, dtype=np.int32).reshape(64, 100)
    src = base[::2, ::3]
    out = np.empty(src.shape, dtype=np.int32)

    def copy(inp, o, _):
        o[:] = inp

    ferry.pipeline(src, out, copy, chunk_bytes=1000, slots=3)
    np.testing.assert_array_equal(out, src)


def test_empty_source():
    calls = []
    src = np.empty(0, dtype=np.uint8)
    out = np.empty(0, dtype=np.uint8)
    assert ferry.pipeline(src, out, lambda *a: calls.append(a), chunk_bytes=64) == 0
    assert calls == []


@pytest.mark.parametrize("slots", [1, 3])
@pytest.mark.parametrize("k", [0, 5, 9])
def test_exception_carries_chunk(slots, k):
    src = np.arange(10 * 100, dtype=np.uint8)
    out = np.zeros_like(src)
    seen = []

    def failing(inp, o, index):
        seen.append(index)
        if index == k:
            raise ValueError(f"boom {index}")
        o[:] = inp

    with pytest.raises(ValueError, match=f"boom {k}") as ei:
        ferry.pipeline(src, out, failing, chunk_bytes=100, slots=slots)
    assert ei.value.chunk == k
    assert max(seen) == k
    # The pipeline stopped and the engine is usable again.
    ferry.pipeline(src, out, lambda i, o, _: o.__setitem__(slice(None), i), chunk_bytes=100)
    np.testing.assert_array_equal(out, src)


def test_bad_arguments():
    src = np.zeros(100, dtype=np.uint8)
    with pytest.raises(ferry.ArgumentError):
        ferry.pipeline(src, np.zeros(99, dtype=np.uint8), stage)
    with pytest.raises(ferry.ArgumentError):
        ferry.pipeline(src, np.zeros(100, dtype=np.uint8), "not callable")
    ro = np.zeros(100, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ferry.ArgumentError):
        ferry.pipeline(src, ro, stage)
    with pytest.raises(ferry.ArgumentError):
        ferry.pipeline(src, np.zeros(100, dtype=np.uint8), stage, chunk_bytes=0)


def test_gil_released():
    # The stage runs on a ferry thread while the caller is blocked in pipeline(): a caller
    # holding the GIL would deadlock here. Another Python thread also keeps running.
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    idents = set()
    before = []

    def slow(inp, o, index):
        idents.add(threading.get_ident())
        if index == 0:
            before.append(count[0])
        o[:] = inp

    try:
        src = np.ones(64 << 20, dtype=np.uint8)
        out = np.empty_like(src)
        start = time.monotonic()
        ferry.pipeline(src, out, slow, chunk_bytes=1 << 20, slots=3)
        assert time.monotonic() - start < 60
    finally:
        stop.set()
        t.join()
    assert threading.get_ident() not in idents
    assert count[0] > before[0]
    np.testing.assert_array_equal(out, src)


def test_no_leak():
    src = np.arange(4096, dtype=np.uint8)
    out = np.empty_like(src)
    threads = threading.active_count()
    for _ in range(2000):
        ferry.pipeline(src, out, stage, chunk_bytes=1024, slots=2)
    assert threading.active_count() == threads


def test_kept_view_refused():
    kept = []
    src = np.arange(1000, dtype=np.uint8)
    out = np.empty_like(src)
    with pytest.raises(ferry.ArgumentError, match="kept a view") as ei:
        ferry.pipeline(src, out, lambda i, o, k: kept.append(i[1:]), chunk_bytes=100)
    assert ei.value.chunk == 0
    kept.clear()


def test_kept_slot_object_refused_and_dead():
    # The array's `.base` (the slot object behind the view) kept past the call once gave a
    # way back to the slot's memory after the pipeline freed it (a crash).
    kept = []

    def keep_base(i, o, k):
        o[:] = i
        kept.append(o.base)

    src = np.arange(4 << 20, dtype=np.uint8)
    out = np.zeros_like(src)
    with pytest.raises(ferry.ArgumentError, match="kept a view") as ei:
        ferry.pipeline(src, out, keep_base)
    assert ei.value.chunk == 0
    with pytest.raises(ferry.ArgumentError, match="only valid during"):
        np.asarray(kept[0])
    kept.clear()


def test_rows_larger_than_chunks():
    # A strided source's chunk is a whole row: rows of 2 MB through the default 1 MiB chunk
    # (the slots were once written past their end).
    a = np.arange(8 * 600_000, dtype=np.float32).reshape(8, 600_000)[:, :500_000]
    out = np.zeros(8 * 500_000, np.float32)
    ferry.pipeline(a, out, lambda i, o, k: o.__setitem__(slice(None), i))
    assert np.array_equal(out, a.reshape(-1))
