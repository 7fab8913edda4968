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
"""

from ._ferry import (
    ArgumentError,
    Buffer,
    CheckpointError,
    CpuEngine,
    CudaEngine,
    DriverError,
    FerryError,
    Request,
    _load_safetensors,
    _load_safetensors_into,
    copy_,
    gather,
    info,
    pipeline,
    read_file,
    save_safetensors,
    write_file,
)

__all__ = [
    "ArgumentError",
    "Buffer",
    "CheckpointError",
    "CpuEngine",
    "CudaEngine",
    "DriverError",
    "FerryError",
    "Request",
    "copy_",
    "gather",
    "info",
    "load_safetensors",
    "pipeline",
    "read_file",
    "save_safetensors",
    "write_file",
]


def _convert(buf, framework):
    if framework == "torch":
        import torch

        return torch.from_dlpack(buf)
    if framework == "numpy":
        import numpy

        if buf.dtype == "bfloat16":
            raise ArgumentError("NumPy has no bfloat16: load with framework='torch' or 'ferry'")
        return numpy.asarray(buf)
    if framework == "cupy":
        import cupy

        return cupy.from_dlpack(buf)
    if framework == "ferry":
        return buf
    raise ArgumentError(
        f"framework={framework!r}: expected 'torch', 'numpy', 'cupy' or 'ferry'"
    )


def load_safetensors(path, device="cuda:0", names=None, framework="torch", out=None, strict=True):
    """Loads a safetensors checkpoint (or a sharded one, through its ``*.index.json``).

    ``device``: ``"cuda:N"``, ``"cpu"`` (pageable) or ``"pinned"``. ``names``: only these
    tensors. ``framework``: ``"torch"`` (default), ``"numpy"`` (host devices only),
    ``"cupy"`` or ``"ferry"`` (ferry's own ``Buffer`` objects). The arrays share ferry's
    allocation without a copy (one allocation per checkpoint, freed when the last tensor
    using it is).

    ``out``: a dict of name -> array (``model.state_dict()``, or the dict an earlier load
    returned) to fill in place instead: each array (C-contiguous, writable, host or one GPU,
    no two sharing memory) receives the tensor of its name, nothing is allocated, and ``out``
    is returned (``device``, ``names`` and ``framework`` are then not used). Every array's
    dtype, shape and size are checked against the file before a byte is read
    (``ArgumentError``). A name the checkpoint lacks is a ``CheckpointError``, or with
    ``strict=False`` that array is left as it is (a model whose tied weights the file stores
    once: drop the tied key from ``out``, as it shares memory with the one loaded).
    """
    if out is not None:
        if names is not None:
            raise ArgumentError("give names or out, not both (out's keys name the tensors)")
        _load_safetensors_into(str(path), out, strict)
        return out
    if framework not in ("torch", "numpy", "cupy", "ferry"):
        _convert(None, framework)
    return {
        name: _convert(buf, framework)
        for name, buf in _load_safetensors(str(path), device, names)
    }
