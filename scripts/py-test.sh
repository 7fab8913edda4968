#!/usr/bin/env bash
# The Python module (crates/ferry-py): a venv, maturin, the wheel built and installed, pytest.
# The CPU tests run everywhere; tests/test_gpu.py reports itself skipped without PyTorch or a
# CUDA driver. The type stubs shipped in the wheel (python/ferry/_ferry.pyi, py.typed) are
# checked with `mypy --strict` against the installed package and a typed usage file, and by
# mypy's stubtest against the built module. PY_VENV
# picks the venv's folder (default target/py-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PY_VENV:-target/py-venv}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "maturin>=1.5,<2" "numpy>=1.22" pytest safetensors mypy
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
"$venv/bin/maturin" build --release -q -m crates/ferry-py/Cargo.toml -o "$wheels"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheels"/ferry-*.whl
"$venv/bin/python" -m pytest -q -rs crates/ferry-py/tests
# The stubs as a user's type checker sees them: from the installed wheel (py.typed), run
# outside the source tree so that the installed package, not python/ferry, is found.
py=$(cd "$venv" && pwd)/bin/python
cd crates/ferry-py/tests
"$py" -m mypy --strict --cache-dir=/dev/null -p ferry
"$py" -m mypy --strict --cache-dir=/dev/null typed_usage.py
# ... and the stubs against the compiled module itself: every name, signature and default.
"$py" -m mypy.stubtest ferry
