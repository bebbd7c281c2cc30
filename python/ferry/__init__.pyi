# Type stubs for ferry (implemented in C by ferry._ferry). The docstrings of the runtime objects are the contract;
# these stubs repeat the signatures and the ownership rules for type checkers and editors.

from typing import Any, Generic, Protocol, TypeVar, final

from . import ops as ops
from . import pool as pool

__version__: str
DLPACK_VERSION: tuple[int, int]

T = TypeVar("T")

class _CudaStreamLike(Protocol):
    def __cuda_stream__(self) -> tuple[int, int]: ...

# device: None (LOCAL_RANK, else cuda:0), an int index, "cuda", "cuda:N", or a torch.device (anything with
# .type == "cuda" and .index).
_Device = int | str | Any | None
# stream: an int CUstream handle, torch.cuda.Stream (.cuda_stream), a CuPy stream (.ptr), or __cuda_stream__.
_Stream = int | _CudaStreamLike | Any | None
# producer_event: an int CUevent handle, torch.cuda.Event (.cuda_event) or a CuPy Event (.ptr).
_Event = int | Any | None

class FerryError(RuntimeError):
    """A CUDA driver call or ferry itself failed. The ValueError/RuntimeError/MemoryError/OverflowError/OSError that
    ferry raises for a status of its C library carry the same attributes (those of argument checks made before the
    C library is called do not)."""

    status: str
    cu_result: int
    cu_name: str
    call: str
    where: str

@final
class SlabTensor:
    """One transfer output viewing the transfer's slab, exported through DLPack. Holds the slab until it and
    every array imported from it are gone."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

@final
class Transfer(Generic[T]):
    """A submitted transfer. Holds inputs, outputs and the slab until wait() returns; dropping it un-waited
    waits for the copies."""

    def wait(self) -> T:
        """Wait (GIL released) and return the rebuilt batch; the same object on every call."""
    def done(self) -> bool:
        """True once the copies finished (or failed, or nothing was copied). Never blocks."""

def transfer_tensor_d2h(
    batch: T, /, *, device: _Device = None, stream: _Stream = None, producer_event: _Event = None
) -> T:
    """Copy the CUDA tensors of `batch` on `device` to pinned host memory; return the batch rebuilt around the
    copies. Outputs view pinned slabs (one per part), each returned to the pool when its last output is released."""

def transfer_tensor_h2d(
    batch: T, /, *, device: _Device = None, stream: _Stream = None, producer_event: _Event = None
) -> T:
    """Copy the host tensors of `batch` to `device`; return the batch rebuilt around the device copies."""

def transfer_tensor_d2h_async(
    batch: T, /, *, device: _Device = None, stream: _Stream = None, producer_event: _Event = None
) -> Transfer[T]:
    """Submit transfer_tensor_d2h and return a handle at once; handle.wait() returns the batch."""

def transfer_tensor_h2d_async(
    batch: T, /, *, device: _Device = None, stream: _Stream = None, producer_event: _Event = None
) -> Transfer[T]:
    """Submit transfer_tensor_h2d and return a handle at once; handle.wait() returns the batch."""

def device_count() -> int:
    """Number of CUDA devices this process sees; 0 without a driver or a device."""

def record_stream(output: Any, stream: Any) -> None:
    """Makes the memory of a ferry output wait for the work queued on `stream` before ferry reuses it."""
