"""Checked by `mypy --strict` (scripts/py-test.sh), not run by pytest: ferry's type stubs
against ordinary calls, so that a stub out of step with the module fails CI."""

from __future__ import annotations

import pathlib

import ferry


def usage(dst: object, src: object, path: pathlib.Path) -> int:
    req: ferry.Request = ferry.copy_(dst, src, non_blocking=True, stream="ferry")
    req.wait()
    done: bool = req.done()
    eng = ferry.CpuEngine(threads=2)
    name: str = eng.name
    eng.barrier()
    ferry.gather(src, src, dst, engine=eng).wait()
    chunks: int = ferry.pipeline(src, dst, lambda i, o, n: None, chunk_bytes=1 << 16, slots=2)
    n: int = ferry.write_file(path, src, offset=0)
    n += ferry.read_file(str(path), dst, offset=0, size=None)
    report: ferry.SaveReport = ferry.save_safetensors({"w": src}, path, metadata={"format": "np"})
    written: int = report.bytes
    request: ferry.SaveRequest = ferry.save_safetensors({"w": src}, path, non_blocking=True)
    ran: str = request.wait().writer
    weights = ferry.load_safetensors(path, device="cpu", framework="numpy")
    bufs = ferry.load_safetensors(path, device="cpu", framework="ferry")
    shape: list[int] = ferry._ferry._load_safetensors(path, "cpu", None)[0][1].shape
    info = ferry.info()
    try:
        ferry.CudaEngine(0)
    except ferry.DriverError as e:
        print(e, info["cuda_error"])
    except ferry.ArgumentError:
        pass
    return chunks + n + len(weights) + len(bufs) + len(shape) + int(done) + len(name) + written + len(ran)
