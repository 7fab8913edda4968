"""__cuda_array_interface__'s `stream` (version 3) as ferry reads it, checked without a GPU
(ferry._ferry._array_info parses the interface only): None or absent asks for no
synchronization, 1 and 2 are the legacy and per-thread default streams, other ints are
handles, 0 and non-ints are refused."""

import pytest

import ferry
from ferry._ferry import _array_info


class Cai:
    def __init__(self, **extra):
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": (4, 8),
            "typestr": "<f4",
            "data": (0x7F00_0000_0000, False),
            "strides": None,
            **extra,
        }


@pytest.mark.parametrize("stream,want", [(None, None), (1, 1), (2, 2), (0x5555_1234, 0x5555_1234)])
def test_stream_read(stream, want):
    info = _array_info(Cai(stream=stream))
    assert info["stream"] == want
    assert info["shape"] == [4, 8] and info["dtype"] == "float32"
    assert info["kind"].startswith("device")


def test_stream_absent():
    assert _array_info(Cai())["stream"] is None


@pytest.mark.parametrize("bad", [0, -3, "s", 1.5])
def test_stream_refused(bad):
    with pytest.raises(ferry.ArgumentError, match="stream"):
        _array_info(Cai(stream=bad))
