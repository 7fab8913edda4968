"""ferry.read_file / ferry.write_file on host arrays (NumPy): bytes round-trip at offsets,
"up to N" counts at the end of the file, typed and 0-d arrays, errors naming the file."""

import os

import numpy as np
import pytest

import ferry


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    b = rng.integers(0, 256, size=(5 << 20) + 123, dtype=np.uint8)
    p = tmp_path / "data.bin"
    p.write_bytes(b.tobytes())
    return p, b


def test_read_whole_and_at_offsets(data):
    p, b = data
    out = np.zeros_like(b)
    assert ferry.read_file(p, out) == b.size
    np.testing.assert_array_equal(out, b)
    for off, size in [(0, 1), (4095, 8193), (1 << 20, 3 << 20), (b.size - 7, 7)]:
        out = np.zeros(size, dtype=np.uint8)
        assert ferry.read_file(str(p), out, offset=off) == size
        np.testing.assert_array_equal(out, b[off : off + size], err_msg=f"offset {off} size {size}")


def test_read_up_to_the_end(data):
    p, b = data
    out = np.full(1000, 7, dtype=np.uint8)
    assert ferry.read_file(p, out, offset=b.size - 100) == 100
    np.testing.assert_array_equal(out[:100], b[-100:])
    assert (out[100:] == 7).all()  # nothing written past what was read
    assert ferry.read_file(p, out, offset=b.size) == 0
    assert ferry.read_file(p, out, offset=b.size + 10) == 0


def test_read_size(data):
    p, b = data
    out = np.zeros(4096, dtype=np.uint8)
    assert ferry.read_file(p, out, offset=10, size=100) == 100
    np.testing.assert_array_equal(out[:100], b[10:110])
    assert (out[100:] == 0).all()
    assert ferry.read_file(p, out, size=0) == 0
    with pytest.raises(ferry.ArgumentError, match="size=4097"):
        ferry.read_file(p, out, size=4097)


def test_typed_roundtrip(tmp_path):
    a = np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000)
    p = tmp_path / "f.bin"
    assert ferry.write_file(p, a) == a.nbytes
    assert os.path.getsize(p) == a.nbytes
    back = np.empty_like(a)
    assert ferry.read_file(p, back) == a.nbytes
    np.testing.assert_array_equal(back, a)


def test_write_at_offset_keeps_the_rest(tmp_path):
    p = tmp_path / "w.bin"
    base = np.full(10_000, 1, dtype=np.uint8)
    ferry.write_file(p, base)
    patch = np.full(100, 9, dtype=np.uint8)
    assert ferry.write_file(p, patch, offset=5000) == 100
    got = np.fromfile(p, dtype=np.uint8)
    want = base.copy()
    want[5000:5100] = 9
    np.testing.assert_array_equal(got, want)
    # Past the end: the file grows (the gap reads as zeros).
    ferry.write_file(p, patch, offset=20_000)
    assert os.path.getsize(p) == 20_100


def test_strided_and_readonly_refused(data, tmp_path):
    p, b = data
    out = np.zeros(200, dtype=np.uint8)
    with pytest.raises(ferry.ArgumentError, match="not C-contiguous"):
        ferry.read_file(p, out[::2])
    with pytest.raises(ferry.ArgumentError, match="not C-contiguous"):
        ferry.write_file(tmp_path / "x", out[::2])
    ro = np.zeros(10, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ferry.ArgumentError, match="read-only"):
        ferry.read_file(p, ro)


def test_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.bin"
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        ferry.read_file(missing, np.zeros(10, dtype=np.uint8))
    # Python's own exceptions, for reading and writing alike (write_file onto a directory was
    # a FerryError "... (os error 21)").
    (tmp_path / "adir").mkdir()
    with pytest.raises(IsADirectoryError, match="adir"):
        ferry.read_file(tmp_path / "adir", np.zeros(10, dtype=np.uint8))
    with pytest.raises(IsADirectoryError, match="adir"):
        ferry.write_file(tmp_path / "adir", np.zeros(10, dtype=np.uint8))
    with pytest.raises(FileNotFoundError, match="nodir"):
        ferry.write_file(tmp_path / "nodir" / "f", np.zeros(10, dtype=np.uint8))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes any file")
def test_permission_error_reading_and_writing(tmp_path):
    p = tmp_path / "locked.bin"
    p.write_bytes(b"x" * 16)
    p.chmod(0)
    try:
        with pytest.raises(PermissionError, match="locked.bin"):
            ferry.read_file(p, np.zeros(16, dtype=np.uint8))
        with pytest.raises(PermissionError, match="locked.bin"):
            ferry.write_file(p, np.zeros(16, dtype=np.uint8))
    finally:
        p.chmod(0o600)


def test_permission_error_in_a_read_only_directory(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into any directory")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="ro"):
            ferry.write_file(d / "new.bin", np.zeros(4, dtype=np.uint8))
    finally:
        d.chmod(0o700)
