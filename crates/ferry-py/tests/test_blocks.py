"""ferry.copy_blocks on the CPU engine with NumPy arrays (runs in CI, no GPU needed): block
tables as vLLM's swap_blocks takes them, checked against NumPy's own indexing."""

import numpy as np
import pytest

import ferry


def tables(layers, blocks, block_shape, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    n = blocks * int(np.prod(block_shape)) * np.dtype(dtype).itemsize
    return [
        rng.integers(0, 256, size=n, dtype=np.uint8).view(dtype).reshape((blocks, *block_shape))
        for _ in range(layers)
    ]


def expected(dst, src, mapping):
    out = dst.copy()
    for s, d in mapping:
        out[d] = src[s]
    return out


@pytest.mark.parametrize("block_shape", [(16, 8, 64), (1,), (3, 5)])
def test_one_table_matches_numpy(block_shape):
    src = tables(1, 40, block_shape, seed=1)[0]
    dst = tables(1, 30, block_shape, seed=2)[0]
    before = dst.copy()
    mapping = np.array([[0, 29], [39, 0], [5, 6], [6, 7], [7, 8], [20, 3]], np.int64)
    ferry.copy_blocks(dst, src, mapping)
    np.testing.assert_array_equal(dst, expected(before, src, mapping))


def test_random_mappings_and_forms():
    rng = np.random.default_rng(7)
    for _ in range(30):
        nsrc, ndst = rng.integers(1, 50, size=2)
        k = int(rng.integers(0, ndst + 1))
        d = rng.permutation(ndst)[:k]
        s = rng.integers(0, nsrc, size=k)
        src = tables(1, nsrc, (4, 3), np.float32, seed=int(rng.integers(1 << 30)))[0]
        dst = tables(1, ndst, (4, 3), np.float32, seed=int(rng.integers(1 << 30)))[0]
        want = expected(dst, src, zip(s, d))
        form = rng.integers(3)
        if form == 0:
            m = np.stack([s, d], axis=1).astype(np.int64)
        elif form == 1:
            m = [(int(a), int(b)) for a, b in zip(s, d)]
        else:
            # A strided (n, 2) view: every other row of a bigger array.
            big = np.zeros((2 * k, 2), np.int64)
            big[::2, 0], big[::2, 1] = s, d
            m = big[::2]
        ferry.copy_blocks(dst, src, m)
        np.testing.assert_array_equal(dst, want)


def test_several_tables_are_one_request():
    src = tables(4, 16, (8, 32), seed=3)
    dst = tables(4, 12, (8, 32), seed=4)
    before = [t.copy() for t in dst]
    mapping = [(15, 0), (3, 11), (4, 5)]
    req = ferry.copy_blocks(dst, src, mapping, non_blocking=True)
    req.wait()
    for d, b, s in zip(dst, before, src):
        np.testing.assert_array_equal(d, expected(b, s, mapping))


def test_refusals_move_nothing():
    src = tables(2, 8, (4,), np.int32, seed=5)
    dst = tables(2, 6, (4,), np.int32, seed=6)
    before = [t.copy() for t in dst]
    with pytest.raises(ferry.ArgumentError, match="entry 1: source block 8 is past"):
        ferry.copy_blocks(dst, src, [(0, 0), (8, 1)])
    with pytest.raises(ferry.ArgumentError, match="entry 0: destination block 6 is past.*table pair 0"):
        ferry.copy_blocks(dst, src, [(0, 6)])
    with pytest.raises(ferry.ArgumentError, match="entries 0 and 2 both write destination block 3"):
        ferry.copy_blocks(dst, src, [(0, 3), (1, 4), (2, 3)])
    with pytest.raises(ferry.ArgumentError, match="negative"):
        ferry.copy_blocks(dst, src, [(-1, 0)])
    with pytest.raises(ferry.ArgumentError, match="block sizes differ"):
        ferry.copy_blocks(dst, tables(2, 8, (5,), np.int32), [(0, 0)])
    with pytest.raises(ferry.ArgumentError, match="block sizes differ"):
        ferry.copy_blocks([dst[0], np.zeros((6, 8), np.int32)], src, [(0, 0)])
    with pytest.raises(ferry.ArgumentError, match="2 destination tables but 1 source"):
        ferry.copy_blocks(dst, src[:1], [(0, 0)])
    with pytest.raises(ferry.ArgumentError, match="shape \\(n, 2\\)"):
        ferry.copy_blocks(dst, src, np.array([0, 1], np.int64))
    with pytest.raises(ferry.ArgumentError, match="array of blocks"):
        ferry.copy_blocks(dst[0][:, ::2], src[0][:, ::2], [(0, 0)])
    with pytest.raises(ferry.ArgumentError, match="leave_sms"):
        ferry.copy_blocks(dst, src, [(0, 0)], leave_sms="yes")
    for d, b in zip(dst, before):
        np.testing.assert_array_equal(d, b)


def test_empty_mapping_and_empty_tables():
    src = tables(1, 4, (2,), seed=8)[0]
    dst = np.zeros((4, 2), np.float16)
    ferry.copy_blocks(dst, src, np.zeros((0, 2), np.int64)).wait()
    ferry.copy_blocks(dst, src, []).wait()
    assert not dst.any()
    with pytest.raises(ferry.ArgumentError, match="past the table's end"):
        ferry.copy_blocks(np.zeros((0, 2), np.float16), src, [(0, 0)])
    # leave_sms on host tables: the CPU engine, nothing else changes.
    ferry.copy_blocks(dst, src, [(1, 2)], leave_sms=True)
    np.testing.assert_array_equal(dst[2], src[1])
    # ... also named: a CPU engine never uses the SMs.
    ferry.copy_blocks(dst, src, [(0, 3)], leave_sms=True, engine=ferry.CpuEngine()).wait()
    np.testing.assert_array_equal(dst[3], src[0])


def test_leave_sms_with_an_explicit_cuda_engine():
    if ferry.info()["cuda_driver"] is None:
        pytest.skip("no CUDA driver")
    busy = ferry.CudaEngine(0, compute_busy=True)
    assert busy.compute_busy
    assert ferry.CudaEngine(0, compute_busy=True) is not None  # one per device, shared
    with pytest.raises(ferry.ArgumentError, match="compute_busy"):
        ferry.CudaEngine(0, compute_busy="yes")
    plain = ferry.CudaEngine(0)
    src = tables(1, 4, (2,), seed=9)[0]
    dst = np.zeros((4, 2), np.float16)
    if not plain.compute_busy:  # FERRY_CUDA_COMPUTE_BUSY=1 makes every engine leave the SMs
        with pytest.raises(ferry.ArgumentError, match="compute_busy=True"):
            ferry.copy_blocks(dst, src, [(1, 2)], leave_sms=True, engine=plain)
        assert not dst.any(), "refused before any byte moved"
    # The busy engine is taken (the copy itself is test_gpu_blocks.py's, on GPU tables): here,
    # pageable tables on both sides, it is refused as any CUDA engine refuses them.
    with pytest.raises(ferry.ArgumentError, match="cannot copy pageable"):
        ferry.copy_blocks(dst, src, [(1, 2)], leave_sms=True, engine=busy)
