"""ferry: move bytes between host memory, GPUs and files on the hardware's DMA engines.

Arrays are anything with ``__dlpack__``, ``__array_interface__`` or
``__cuda_array_interface__`` (PyTorch tensors, NumPy and CuPy arrays). Nothing here imports
PyTorch, NumPy or CuPy until asked to build one of their arrays.

    import ferry, torch
    src = torch.randn(1 << 20)                   # pageable host memory
    dst = torch.empty(1 << 20, device="cuda")
    ferry.copy_(dst, src)                        # blocking, as tensor.copy_
    req = ferry.copy_(dst, src, non_blocking=True); req.wait()
    weights = ferry.load_safetensors("model.safetensors", device="cuda:0")

Functions (``help(ferry.NAME)`` for each one's arguments, errors and an example):

- ``copy_(dst, src, non_blocking=False, engine=None, stream=None)``: copies one array into
  another (host or GPU, strided too) and returns a ``Request``.
- ``copy_blocks(dst, src, mapping, leave_sms=False, non_blocking=False, engine=None,
  stream=None)``: the blocks a ``(src_block, dst_block)`` mapping names between block tables
  (a KV cache's swap, as vLLM's ``swap_blocks``), every table in one request.
- ``gather(src, index, out, non_blocking=False, engine=None, stream=None)``: rows
  ``index[i]`` of a 2-D array into row ``i`` of ``out``.
- ``pipeline(src, out, stage, chunk_bytes=1048576, slots=3, engine=None)``: a Python stage
  over chunks, with copies in and out overlapping it (double/triple buffering).
- ``read_file(path, out, *, offset=0, size=None)`` / ``write_file(path, src, *, offset=0)``:
  a file's bytes into an array, or an array's bytes into a file.
- ``load_safetensors(path, device="cuda:0", names=None, framework=None, out=None,
  strict=True)`` / ``save_safetensors(tensors, path, metadata=None, max_shard_size=None,
  non_blocking=False, snapshot_bytes=None, fsync=False, writer="auto", keep_snapshot=False)``:
  checkpoints (a folder or ``*.index.json``: sharded; ``writer``: buffered, ``O_DIRECT``
  or both at once, ``hybrid``, the default's choice for a large save from a GPU; ``keep_snapshot``: a non-blocking save's host memory reused by the next).
- ``info()``: the version, the CUDA driver and devices ferry sees, the dtypes.

Classes:

- ``Request``: a copy in flight: ``wait()``, ``done()``, ``await request``.
- ``SaveRequest``: a ``save_safetensors(..., non_blocking=True)`` being written: ``wait()``
  (returns its ``SaveReport``), ``done()``.
- ``SaveReport``: what a save did (``bytes``, ``seconds``, ``files``, the ``writer`` that ran
  and why): a blocking ``save_safetensors`` returns it.
- ``CpuEngine(threads=0)``, ``CudaEngine(device=0)``: the engines (``engine=`` arguments).
- ``Buffer``: a tensor in memory ferry allocated (``load_safetensors(framework="ferry")``).
- ``Agent(name, device=None)``, ``Region``, ``Peer``, ``RemoteRegion``: registered memory
  moved between processes of one host (as NIXL's agents): ``agent.alloc``, ``agent.connect``,
  ``peer.open(descriptor)``, ``agent.write`` / ``agent.read`` of segment lists.

Exceptions: ``FerryError`` and its subclasses ``ArgumentError`` (a bad argument, named with
its value), ``DriverError`` (the CUDA driver) and ``CheckpointError`` (a safetensors file);
files that cannot be opened, read or written raise Python's own ``FileNotFoundError``,
``PermissionError``, ``IsADirectoryError``, ... with ferry's message (for a checkpoint's
file, an exception that is both that and a ``CheckpointError``).

Type stubs ship with the package (``py.typed``).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

from ._ferry import (
    Agent,
    ArgumentError,
    Buffer,
    CheckpointError,
    CpuEngine,
    CudaEngine,
    DriverError,
    FerryError,
    Peer,
    Region,
    RemoteRegion,
    Request,
    SaveReport,
    SaveRequest,
    _load_safetensors,
    _load_safetensors_into,
    copy_,
    copy_blocks,
    gather,
    info,
    pipeline,
    read_file,
    save_safetensors,
    write_file,
)

__all__ = [
    "Agent",
    "ArgumentError",
    "Buffer",
    "CheckpointError",
    "CpuEngine",
    "CudaEngine",
    "DriverError",
    "FerryError",
    "Peer",
    "Region",
    "RemoteRegion",
    "Request",
    "SaveReport",
    "SaveRequest",
    "copy_",
    "copy_blocks",
    "gather",
    "info",
    "load_safetensors",
    "pipeline",
    "read_file",
    "save_safetensors",
    "write_file",
]


_FRAMEWORKS = ("torch", "numpy", "cupy", "ferry")


def _installed(module: str) -> bool:
    import importlib.util
    import sys

    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _framework(framework: Optional[str], device: str) -> str:
    """The framework a load's arrays are made in: ``framework`` checked (its module installed),
    or for ``None`` the first installed of PyTorch, then NumPy (host devices) or CuPy (GPUs)."""
    host = device in ("cpu", "pinned")
    gpu = isinstance(device, str) and (
        device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())
    )
    if not host and not gpu:
        # The device is checked first: a framework chosen for a device that is not one would
        # be the wrong error.
        raise ArgumentError(
            f'device={device!r}: expected "cpu", "pinned" or "cuda:N"'
        )
    if framework is None:
        if _installed("torch"):
            return "torch"
        if host and _installed("numpy"):
            return "numpy"
        if not host and _installed("cupy"):
            return "cupy"
        raise ArgumentError(
            "framework=None: PyTorch is not installed (nor "
            + ("NumPy" if host else "CuPy")
            + '); pass framework="numpy" (host devices), framework="cupy" (GPUs) or '
            'framework="ferry" (ferry\'s own Buffer objects)'
        )
    if framework not in _FRAMEWORKS:
        raise ArgumentError(
            f"framework={framework!r}: expected None, 'torch', 'numpy', 'cupy' or 'ferry'"
        )
    if framework != "ferry" and not _installed(framework):
        raise ArgumentError(
            f"framework={framework!r}: the module {framework!r} is not installed; pass "
            'framework="numpy" (host devices), framework="cupy" (GPUs) or framework="ferry"'
        )
    return framework


def _convert(buf: Buffer, framework: str) -> Any:
    if framework == "torch":
        import torch  # type: ignore[import-not-found,unused-ignore]

        return torch.from_dlpack(buf)
    if framework == "numpy":
        import numpy

        if buf.dtype == "bfloat16":
            raise ArgumentError("NumPy has no bfloat16: load with framework='torch' or 'ferry'")
        return numpy.asarray(buf)
    if framework == "cupy":
        import cupy  # type: ignore[import-not-found,unused-ignore]

        return cupy.from_dlpack(buf)
    return buf


def load_safetensors(
    path: Union[str, os.PathLike[str]],
    device: str = "cuda:0",
    names: Optional[Sequence[str]] = None,
    framework: Optional[str] = None,
    out: Optional[dict[str, Any]] = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Loads a safetensors checkpoint (or a sharded one, through its ``*.index.json``).

    The arrays share ferry's allocation without a copy (one allocation per checkpoint, freed
    when the last tensor using it is).

    Args:
        path (str | os.PathLike[str]): the ``.safetensors`` file or the ``*.index.json``.
        device (str): ``"cuda:N"`` (or ``"cuda"``), ``"cpu"`` (pageable) or ``"pinned"``.
        names (list[str] | None): only these tensors (default: all).
        framework (str | None): ``"torch"``, ``"numpy"`` (host devices only), ``"cupy"`` or
            ``"ferry"`` (ferry's own ``Buffer`` objects). Default: PyTorch if installed, else
            NumPy for host devices or CuPy for GPUs.
        out (dict | None): a dict of name -> array (``model.state_dict()``, or the dict an
            earlier load returned) to fill in place instead: each array (C-contiguous,
            writable, host or one GPU, no two sharing memory) receives the tensor of its name,
            nothing is allocated, and ``out`` is returned (``device``, ``names`` and
            ``framework`` are then not used). Every array's dtype, shape and size are checked
            against the file before a byte is read.
        strict (bool): with ``out``, a name the checkpoint lacks is a ``CheckpointError``;
            ``strict=False`` leaves that array as it is (tied weights a file stores once).

    Returns:
        dict[str, array]: name -> array, in file order (or ``out``, filled).

    Raises:
        ArgumentError: a bad argument (named with its value), a framework not installed, an
            ``out`` array whose dtype, shape or size differs from its tensor's.
        CheckpointError: the file cannot be read or is not a valid checkpoint (the message
            names the file and tensor).
        DriverError: a CUDA failure.

    Example:
        >>> weights = ferry.load_safetensors("model.safetensors", device="cpu",
        ...                                  framework="numpy")
        >>> ferry.load_safetensors("model.safetensors", out=model.state_dict())
    """
    if out is not None:
        if names is not None:
            raise ArgumentError("give names or out, not both (out's keys name the tensors)")
        _load_safetensors_into(path, out, strict)
        return out
    fw = _framework(framework, device)
    return {
        name: _convert(buf, fw)
        for name, buf in _load_safetensors(path, device, names)
    }
