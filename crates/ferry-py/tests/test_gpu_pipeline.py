"""ferry.pipeline with a Python stage on the CUDA engine (PyTorch): outputs equal a sequential
reference computed with PyTorch on the CPU, for K in {1, 2, 3}, host and device sources and
destinations, a ragged last chunk; a raising stage stops the pipeline with its chunk; a stage
that keeps a slot is refused; a stage working on PyTorch's default stream (not the compute
stream) is still ordered. Skipped, with the reason, without PyTorch, a CUDA driver or a GPU."""

import pytest

import ferry

from _gpu import DEV, torch  # skips this module without PyTorch, a driver or a GPU



def stage(inp, out, index, stream):
    """out = inp * 3 + index (uint8, wrapping), on the compute stream."""
    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        i = torch.from_dlpack(inp)
        o = torch.from_dlpack(out)
        torch.mul(i, 3, out=o)
        o.add_(index & 255)


def reference(src, chunk):
    b = src.contiguous().view(torch.uint8).reshape(-1).cpu()
    res = torch.empty_like(b)
    for k, start in enumerate(range(0, b.numel(), chunk)):
        res[start : start + chunk] = b[start : start + chunk] * 3 + (k & 255)
    return res


def check(out, ref, what):
    got = out.contiguous().view(torch.uint8).reshape(-1).cpu()
    bad = (got != ref).nonzero()
    if len(bad):
        i = bad[0].item()
        raise AssertionError(
            f"{what}: {len(bad)} of {ref.numel()} bytes differ, first at byte {i}: "
            f"got {got[i].item()}, expected {ref[i].item()}"
        )


def rand_bytes(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize(
    "where", ["pageable-pageable", "pinned-pinned", "device-device", "pageable-device"]
)
@pytest.mark.parametrize("chunk", [1 << 16, 3 << 20])
def test_matches_cpu_reference(k, where, chunk):
    size = 20 * chunk + 12_345  # ragged last chunk
    src = rand_bytes(size, seed=k * 7 + chunk)
    s_where, d_where = where.split("-")
    s = {"pageable": src, "pinned": src.pin_memory(), "device": src.to(DEV)}[s_where]
    out = torch.zeros(size, dtype=torch.uint8)
    out = {"pageable": out, "pinned": out.pin_memory(), "device": out.to(DEV)}[d_where]
    n = ferry.pipeline(
        s, out, stage, chunk_bytes=chunk, slots=k, engine=ferry.CudaEngine(0)
    )
    assert n == -(-size // chunk)
    check(out, reference(src, chunk), f"K={k} {where} chunk={chunk}")


def test_device_arrays_pick_the_cuda_engine_and_typed_views():
    src = torch.arange(300_001, dtype=torch.float32, device=DEV)
    out = torch.empty_like(src)

    def double(inp, o, index, stream):
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            torch.from_dlpack(o).view(torch.float32).copy_(
                torch.from_dlpack(inp).view(torch.float32) * 2
            )

    ferry.pipeline(src, out, double, chunk_bytes=1 << 16, slots=2)
    assert torch.equal(out, src * 2)


def test_cuda_array_interface_slots():
    src = rand_bytes(1_000_003, seed=5)
    out = torch.zeros_like(src)

    def via_cai(inp, o, index, stream):
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            i = torch.as_tensor(inp, device=DEV)
            t = torch.as_tensor(o, device=DEV)
            torch.mul(i, 3, out=t)
            t.add_(index & 255)

    ferry.pipeline(src, out, via_cai, chunk_bytes=1 << 16, slots=3, engine=ferry.CudaEngine(0))
    check(out, reference(src, 1 << 16), "__cuda_array_interface__ slots")


def test_stage_on_the_default_stream_is_ordered():
    # The stage ignores the compute stream: torch.from_dlpack on the default stream makes it
    # wait for the slot, and ferry makes the compute stream wait for it after the call.
    src = rand_bytes(8 << 20, seed=9)
    out = torch.zeros_like(src)

    def slow(inp, o, index, stream):
        i = torch.from_dlpack(inp)
        t = torch.from_dlpack(o)
        t.copy_(i)
        for _ in range(20):  # long enough that a missing order would show
            t.mul_(1)
        torch.mul(i, 3, out=t)
        t.add_(index & 255)

    ferry.pipeline(src, out, slow, chunk_bytes=1 << 20, slots=2, engine=ferry.CudaEngine(0))
    check(out, reference(src, 1 << 20), "stage on the default stream")


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("bad", [0, 4, 9])
def test_raising_stage_stops_with_its_chunk(k, bad):
    src = rand_bytes(10 * 4096, seed=bad)
    out = torch.zeros(src.numel(), dtype=torch.uint8, device=DEV)
    seen = []

    def failing(inp, o, index, stream):
        seen.append(index)
        if index == bad:
            raise ValueError(f"boom {index}")
        stage(inp, o, index, stream)

    with pytest.raises(ValueError, match=f"boom {bad}") as ei:
        ferry.pipeline(src, out, failing, chunk_bytes=4096, slots=k)
    assert ei.value.chunk == bad
    assert max(seen) == bad
    # The engine is usable again.
    ferry.pipeline(src, out, stage, chunk_bytes=4096, slots=k)
    check(out, reference(src, 4096), "after a failed run")


def test_kept_slot_refused():
    src = rand_bytes(4096 * 4, seed=1)
    out = torch.zeros_like(src, device=DEV)
    kept = []

    def keeps_tensor(inp, o, index, stream):
        kept.append(torch.from_dlpack(inp))

    with pytest.raises(ferry.ArgumentError, match="kept a slot") as ei:
        ferry.pipeline(src, out, keeps_tensor, chunk_bytes=4096)
    assert ei.value.chunk == 0
    kept.clear()

    def keeps_slot(inp, o, index, stream):
        kept.append(inp)

    with pytest.raises(ferry.ArgumentError, match="kept a slot"):
        ferry.pipeline(src, out, keeps_slot, chunk_bytes=4096)
    # A kept slot refuses to export anything afterwards.
    with pytest.raises(ferry.ArgumentError, match="no longer valid"):
        kept[0].__dlpack__()
    kept.clear()


def test_cpu_engine_refuses_device_arrays():
    src = torch.zeros(4096, dtype=torch.uint8, device=DEV)
    with pytest.raises(ferry.ArgumentError, match="not in host memory"):
        ferry.pipeline(src, torch.zeros_like(src), stage, engine=ferry.CpuEngine())
