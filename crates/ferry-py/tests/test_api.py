"""The Python API as a new user meets it: docs on everything, real defaults in signatures,
stubs in the package, `framework` chosen from what is installed, argument errors in ferry's
words (the argument and its value named), overlap errors in offsets."""

import importlib.resources
import inspect
import os

import numpy as np
import pytest

import ferry
import ferry._ferry as _ferry

SECTIONS = ("Returns", "Example")


def _public_callables():
    for name in ferry.__all__:
        obj = getattr(ferry, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            continue
        yield name, obj


def test_every_function_class_and_method_has_a_docstring():
    missing = []
    for name, obj in _public_callables():
        doc = inspect.getdoc(obj) or ""
        if "Example" not in doc or "see the module documentation" in doc:
            missing.append(name)
        if inspect.isroutine(obj):
            for section in ("Args" if inspect.signature(obj).parameters else "Returns",) + SECTIONS:
                if section not in doc:
                    missing.append(f"{name}: {section}")
        if isinstance(obj, type):
            for attr, member in vars(obj).items():
                if attr.startswith("__") and attr not in ("__dlpack__", "__await__"):
                    continue
                if not (inspect.getdoc(member) or "").strip():
                    missing.append(f"{name}.{attr}")
    for exc in (ferry.FerryError, ferry.ArgumentError, ferry.DriverError, ferry.CheckpointError):
        if not (exc.__doc__ or "").strip():
            missing.append(exc.__name__)
    assert missing == []


def test_methods_say_what_they_return_and_raise():
    for meth in (ferry.Request.wait, ferry.CpuEngine.barrier, ferry.CudaEngine.barrier):
        doc = inspect.getdoc(meth)
        assert "Returns" in doc and "Raises" in doc and "Example" in doc, meth


def test_module_docs_list_everything():
    for name in ferry.__all__:
        assert name in ferry.__doc__, name
    for name in ("copy_", "gather", "pipeline", "read_file", "write_file", "save_safetensors",
                 "info", "Request", "CpuEngine", "CudaEngine", "Buffer", "ArgumentError"):
        assert name in _ferry.__doc__, name
    assert _ferry.__doc__.strip() != "The module."


def test_signatures_show_real_defaults():
    # Was: chunk_bytes=Ellipsis (PyO3 could not render `1 << 20`).
    sig = inspect.signature(ferry.pipeline)
    assert sig.parameters["chunk_bytes"].default == 1 << 20
    assert sig.parameters["slots"].default == 3
    assert inspect.signature(ferry.read_file).parameters["offset"].default == 0
    assert inspect.signature(ferry.read_file).parameters["size"].default is None
    assert inspect.signature(ferry.write_file).parameters["offset"].default == 0
    assert inspect.signature(ferry.copy_).parameters["non_blocking"].default is False
    assert inspect.signature(ferry.CpuEngine).parameters["threads"].default == 0
    assert inspect.signature(ferry.CudaEngine).parameters["device"].default == 0
    assert inspect.signature(ferry.CudaEngine).parameters["compute_busy"].default is False
    assert inspect.signature(ferry.load_safetensors).parameters["framework"].default is None
    for name, obj in _public_callables():
        if inspect.isroutine(obj):
            assert "Ellipsis" not in str(inspect.signature(obj)), name


def test_stubs_and_py_typed_ship_in_the_package():
    pkg = importlib.resources.files("ferry")
    assert pkg.joinpath("py.typed").is_file()
    stub = pkg.joinpath("_ferry.pyi").read_text()
    for name in ferry.__all__:
        if name != "load_safetensors":
            assert name in stub, name


@pytest.fixture
def ckpt(tmp_path):
    p = tmp_path / "m.safetensors"
    ferry.save_safetensors({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, p)
    return p


def test_framework_defaults_to_what_is_installed(ckpt, monkeypatch):
    has_torch = ferry._installed("torch")
    got = ferry.load_safetensors(ckpt, device="cpu")
    if not has_torch:
        # Was: ModuleNotFoundError: No module named 'torch' (the default was "torch").
        assert isinstance(got["w"], np.ndarray)
    np.testing.assert_array_equal(np.asarray(got["w"]), np.arange(6).reshape(2, 3))
    # Nothing usable installed: the error names the framework to pass.
    monkeypatch.setattr(ferry, "_installed", lambda m: False)
    with pytest.raises(ferry.ArgumentError, match='framework="numpy"'):
        ferry.load_safetensors(ckpt, device="cpu")
    with pytest.raises(ferry.ArgumentError, match='framework="numpy"'):
        ferry.load_safetensors(ckpt, device="cpu", framework="torch")
    # "ferry" needs nothing.
    assert ferry.load_safetensors(ckpt, device="cpu", framework="ferry")["w"].shape == [2, 3]


def test_framework_torch_without_torch_is_an_argument_error(ckpt):
    if ferry._installed("torch"):
        pytest.skip("PyTorch is installed")
    with pytest.raises(ferry.ArgumentError, match="'torch' is not installed"):
        ferry.load_safetensors(ckpt, device="cpu", framework="torch")


A = np.zeros(8, dtype=np.uint8)


class _Iface:
    """An object exporting a hand-written __array_interface__."""

    def __init__(self, **kw):
        base = {"version": 3, "shape": (8,), "typestr": "|u1", "data": (A.ctypes.data, False)}
        base.update(kw)
        self.__array_interface__ = base


@pytest.mark.parametrize(
    "call, needle",
    [
        # Each was OverflowError / TypeError in PyO3's words, without the argument's name.
        (lambda: ferry.pipeline(A, A.copy(), lambda i, o, n: None, chunk_bytes=-1), "chunk_bytes=-1"),
        (lambda: ferry.pipeline(A, A.copy(), lambda i, o, n: None, slots="3"), "slots='3'"),
        (lambda: ferry.pipeline(A, A.copy(), lambda i, o, n: None, chunk_bytes=2**64), "chunk_bytes=18446744073709551616"),
        (lambda: ferry.read_file("f", A, offset=-1), "offset=-1"),
        (lambda: ferry.read_file("f", A, size=-5), "size=-5"),
        (lambda: ferry.read_file("f", A, offset=1.5), "offset=1.5"),
        (lambda: ferry.write_file("f", A, offset=-1), "offset=-1"),
        (lambda: ferry.read_file(b"f", A), "path=b'f'"),
        (lambda: ferry.write_file(b"f", A), "path=b'f'"),
        (lambda: ferry.save_safetensors({"a": A}, b"x"), "path=b'x'"),
        (lambda: ferry.save_safetensors({"a": A}, "x", metadata={"a": 1}), "metadata\\[\"a\"\\] = 1"),
        (lambda: ferry.save_safetensors({"a": A}, "x", metadata={1: "a"}), "metadata key 1"),
        (lambda: ferry.save_safetensors({"a": A}, "x", metadata="a"), "metadata='a'"),
        (lambda: ferry.save_safetensors([A], "x"), "tensors"),
        (lambda: ferry.load_safetensors("x", device=0), "device=0"),
        (lambda: ferry.load_safetensors("x", device="cpu", names="w"), "names='w'"),
        (lambda: ferry.pipeline(A, A.copy(), lambda i, o, n: None, chunk_bytes=0), "chunk_bytes=0: expected 1 or more"),
        (lambda: ferry.pipeline(A, A.copy(), lambda i, o, n: None, slots=0), "slots=0: expected 1 or more"),
        (lambda: ferry.copy_(A, A.copy(), engine=3), "engine=3"),
        (lambda: ferry.CpuEngine(10**6), "threads=1000000: .*at most"),
        (lambda: ferry.CpuEngine(-1), "threads=-1"),
        (lambda: ferry.CpuEngine("4"), "threads='4'"),
        (lambda: ferry.CudaEngine(-1), "device=-1"),
        (lambda: ferry.copy_(A, A.copy(), stream=-1), "stream=-1"),
        (lambda: ferry.copy_(A, A.copy(), non_blocking="yes"), "non_blocking='yes'"),
        (lambda: ferry.gather(A.reshape(2, 4), np.zeros(1, np.int64), A[:4].reshape(1, 4), non_blocking=2), "non_blocking=2"),
        (lambda: ferry.load_safetensors("x", out={}, strict="no"), "strict='no'"),
        (lambda: ferry.copy_(A.copy(), _Iface(shape="ab")), "\\['shape'\\] = 'ab'"),
        (lambda: ferry.copy_(A.copy(), _Iface(shape=(-8,))), "\\['shape'\\] = \\(-8,\\)"),
        (lambda: ferry.copy_(A.copy(), _Iface(strides=(2**63,))), "\\['strides'\\] = \\(9223372036854775808,\\)"),
        (lambda: ferry.copy_(A.copy(), _Iface(typestr=4)), "\\['typestr'\\] = 4"),
        (lambda: ferry.copy_(A.copy(), _Iface(data="p")), "\\['data'\\] = 'p'"),
        (lambda: ferry.copy_(A.copy(), _Iface(offset=-1)), "\\['offset'\\]=-1"),
    ],
)
def test_argument_errors_name_the_argument_and_value(call, needle):
    with pytest.raises(ferry.ArgumentError, match=needle):
        call()


def test_os_path_like_paths_still_work(tmp_path):
    class P(os.PathLike):
        def __fspath__(self):
            return str(tmp_path / "p.bin")

    assert ferry.write_file(P(), np.arange(4, dtype=np.uint8)) == 4
    out = np.zeros(4, dtype=np.uint8)
    assert ferry.read_file(P(), out) == 4
    assert list(out) == [0, 1, 2, 3]


def test_overlap_error_names_offsets_not_addresses():
    a = np.arange(16, dtype=np.float32)
    with pytest.raises(ferry.ArgumentError, match="overlap") as e:
        # Was: "source bytes 94823..94883 and destination bytes ..." (raw addresses).
        ferry.copy_(a[1:], a[:-1])
    msg = str(e.value)
    assert "source bytes 0..60" in msg and "destination bytes 4..64" in msg, msg
    assert str(a.ctypes.data) not in msg


def test_checkpoint_file_errors_are_also_os_errors(tmp_path):
    # Was: only CheckpointError, where read_file raised FileNotFoundError for the same file.
    missing = tmp_path / "nope.safetensors"
    for exc in (FileNotFoundError, ferry.CheckpointError):
        with pytest.raises(exc, match="nope.safetensors"):
            ferry.load_safetensors(missing, device="cpu", framework="numpy")
    with pytest.raises(FileNotFoundError, match="nodir"):
        ferry.save_safetensors({"a": A}, tmp_path / "nodir" / "x.safetensors")
    # A folder is a model's folder (its index or its one file); an empty one names the lack.
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ferry.CheckpointError, match="holds no checkpoint"):
        ferry.load_safetensors(empty, device="cpu", framework="numpy")
