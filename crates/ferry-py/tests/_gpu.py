"""The GPU test files' common start (`from _gpu import torch, DEV`): PyTorch imported, or the
importing test module skipped with the reason (no PyTorch, no CUDA driver, no GPU)."""

import pytest

import ferry

torch = pytest.importorskip("torch", reason="needs PyTorch")
if ferry.info()["cuda_driver"] is None:
    pytest.skip(f"skipped: no CUDA driver ({ferry.info()['cuda_error']})", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("skipped: PyTorch sees no GPU", allow_module_level=True)

DEV = "cuda:0"
