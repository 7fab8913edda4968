"""Type stubs of ferry's compiled module (``ferry._ferry``); the docs are on the objects."""

import os
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Callable, Literal, Optional, Union, final, overload

# An array: anything with ``__dlpack__``, ``__array_interface__`` or
# ``__cuda_array_interface__`` (PyTorch tensors, NumPy and CuPy arrays, ferry Buffers).
_ArrayLike = Any
_StrPath = Union[str, "os.PathLike[str]"]
_Engine = Union["CpuEngine", "CudaEngine"]
_Stream = Union[int, Literal["ferry"], None]

__all__ = [
    "FerryError",
    "ArgumentError",
    "DriverError",
    "CheckpointError",
    "CpuEngine",
    "CudaEngine",
    "Request",
    "SaveRequest",
    "SaveReport",
    "Buffer",
    "Agent",
    "Region",
    "Peer",
    "RemoteRegion",
    "info",
    "_array_info",
    "copy_",
    "copy_blocks",
    "gather",
    "pipeline",
    "read_file",
    "write_file",
    "_load_safetensors",
    "_load_safetensors_into",
    "save_safetensors",
]

class FerryError(Exception): ...
class ArgumentError(FerryError): ...
class DriverError(FerryError): ...
class CheckpointError(FerryError): ...

@final
class Request:
    def wait(self) -> None: ...
    def done(self) -> bool: ...
    def __await__(self) -> Generator[Any, None, None]: ...

@final
class SaveRequest:
    def wait(self) -> SaveReport: ...
    def done(self) -> bool: ...

@final
class SaveReport:
    @property
    def bytes(self) -> int: ...
    @property
    def tensors(self) -> int: ...
    @property
    def files(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def synced(self) -> bool: ...
    @property
    def writer(self) -> Literal["buffered", "direct", "hybrid"]: ...
    @property
    def writer_note(self) -> str: ...
    @property
    def direct_bytes(self) -> int: ...
    @property
    def buffered_bytes(self) -> int: ...
    @property
    def snapshot_bytes(self) -> int: ...

@final
class CpuEngine:
    def __new__(cls, threads: int = 0) -> CpuEngine: ...
    @property
    def name(self) -> str: ...
    def barrier(self) -> None: ...

@final
class CudaEngine:
    def __new__(cls, device: int = 0, *, compute_busy: bool = False) -> CudaEngine: ...
    @property
    def device(self) -> int: ...
    @property
    def compute_busy(self) -> bool: ...
    @property
    def name(self) -> str: ...
    def barrier(self) -> None: ...

@final
class Buffer:
    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[tuple[int, int]] = None,
        dl_device: Optional[tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...

def info() -> dict[str, Any]: ...
def copy_(
    dst: _ArrayLike,
    src: _ArrayLike,
    non_blocking: bool = False,
    engine: Optional[_Engine] = None,
    stream: _Stream = None,
) -> Request: ...
def gather(
    src: _ArrayLike,
    index: _ArrayLike,
    out: _ArrayLike,
    non_blocking: bool = False,
    engine: Optional[_Engine] = None,
    stream: _Stream = None,
) -> Request: ...
def copy_blocks(
    dst: Union[_ArrayLike, Sequence[_ArrayLike]],
    src: Union[_ArrayLike, Sequence[_ArrayLike]],
    mapping: Union[_ArrayLike, Sequence[tuple[int, int]]],
    leave_sms: bool = False,
    non_blocking: bool = False,
    engine: Optional[_Engine] = None,
    stream: _Stream = None,
) -> Request: ...
def pipeline(
    src: _ArrayLike,
    out: _ArrayLike,
    stage: Callable[..., object],
    chunk_bytes: int = 1048576,
    slots: int = 3,
    engine: Optional[_Engine] = None,
) -> int: ...
def read_file(
    path: _StrPath, out: _ArrayLike, *, offset: int = 0, size: Optional[int] = None
) -> int: ...
def write_file(path: _StrPath, src: _ArrayLike, *, offset: int = 0) -> int: ...
@overload
def save_safetensors(
    tensors: dict[str, _ArrayLike],
    path: _StrPath,
    metadata: Optional[Mapping[str, str]] = None,
    max_shard_size: Optional[int] = None,
    non_blocking: Literal[False] = False,
    snapshot_bytes: Optional[int] = None,
    fsync: bool = False,
    writer: Literal["auto", "buffered", "direct", "hybrid"] = "auto",
    keep_snapshot: bool = False,
) -> SaveReport: ...
@overload
def save_safetensors(
    tensors: dict[str, _ArrayLike],
    path: _StrPath,
    metadata: Optional[Mapping[str, str]] = None,
    max_shard_size: Optional[int] = None,
    *,
    non_blocking: Literal[True],
    snapshot_bytes: Optional[int] = None,
    fsync: bool = False,
    writer: Literal["auto", "buffered", "direct", "hybrid"] = "auto",
    keep_snapshot: bool = False,
) -> SaveRequest: ...
@overload
def save_safetensors(
    tensors: dict[str, _ArrayLike],
    path: _StrPath,
    metadata: Optional[Mapping[str, str]] = None,
    max_shard_size: Optional[int] = None,
    non_blocking: bool = False,
    snapshot_bytes: Optional[int] = None,
    fsync: bool = False,
    writer: Literal["auto", "buffered", "direct", "hybrid"] = "auto",
    keep_snapshot: bool = False,
) -> Union[SaveReport, SaveRequest]: ...
def _load_safetensors(
    path: _StrPath, device: str = "cuda:0", names: Optional[Sequence[str]] = None
) -> list[tuple[str, Buffer]]: ...
def _load_safetensors_into(
    path: _StrPath, out: Mapping[str, _ArrayLike], strict: bool = True
) -> list[str]: ...
def _array_info(obj: _ArrayLike) -> dict[str, Any]: ...

@final
class Agent:
    def __new__(cls, name: str, device: Optional[int] = None) -> Agent: ...
    @property
    def socket_path(self) -> str: ...
    @property
    def name(self) -> str: ...
    def alloc(
        self,
        nbytes: int,
        kind: Literal["pageable", "pinned", "device"] = "pageable",
        shared: bool = False,
        device: int = 0,
    ) -> Region: ...
    def register(self, array: _ArrayLike) -> Region: ...
    def connect(self, path: str) -> Peer: ...
    def listen_tcp(self, addr: str, key: bytes) -> str: ...
    def connect_tcp(self, addr: str, key: bytes, streams: int | None = None) -> Peer: ...
    def write(
        self,
        remote: RemoteRegion,
        local: Region,
        segments: Sequence[tuple[int, int, int]],
        notify: Optional[bytes] = None,
    ) -> Request: ...
    def read(
        self,
        local: Region,
        remote: RemoteRegion,
        segments: Sequence[tuple[int, int, int]],
        notify: Optional[bytes] = None,
    ) -> Request: ...
    def next_notification(self, timeout: float = 0.0) -> Optional[tuple[str, bytes]]: ...

@final
class Region:
    @property
    def descriptor(self) -> bytes: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def ptr(self) -> int: ...
    def read(self, offset: int, nbytes: int) -> bytes: ...
    def write(self, offset: int, data: bytes) -> None: ...
    def deregister(self) -> None: ...

@final
class Peer:
    @property
    def name(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def alive(self) -> bool: ...
    def open(self, descriptor: bytes) -> RemoteRegion: ...
    def notify(self, message: bytes) -> None: ...

@final
class RemoteRegion:
    @property
    def nbytes(self) -> int: ...
    @property
    def descriptor(self) -> bytes: ...
