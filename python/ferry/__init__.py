"""ferry: batched GPU <-> host tensor transfers on a cached copy stream into a pinned pool.

The transfer functions follow SPDL's ``spdl.io.transfer_tensor_d2h`` contract (nested batches, a per-thread copy
stream, ``producer_event``, pinned outputs, ``LOCAL_RANK`` default device, pass-through without CUDA) and work
with any DLPack producer: torch through its C exchange API, CuPy, JAX and numpy through ``__dlpack__``.

Everything here is implemented in C (``ferry._ferry``) over libferry's public C API; this module only re-exports.

    >>> import ferry
    >>> cpu_batch = ferry.transfer_tensor_d2h({"scores": scores_on_cuda0}, device="cuda:0")
    >>> handle = ferry.transfer_tensor_d2h_async(batch, producer_event=event)   # from a background thread
    >>> cpu_batch = handle.wait()

See ``help(ferry.transfer_tensor_d2h)`` for the contract, the output framework rule and ownership.

``ferry.ops`` is the operator half: GEMM operators (discovery, support checks, compile once, a fast launch path,
CUDA graphs) with the CUTLASS Operator API's names; see ``help(ferry.ops)``.
"""

from ._ferry import (
    DLPACK_VERSION,
    FerryError,
    SlabTensor,
    Transfer,
    __version__,
    device_count,
    record_stream,
    transfer_tensor_d2h,
    transfer_tensor_d2h_async,
    transfer_tensor_h2d,
    transfer_tensor_h2d_async,
)
from . import ops, pool

__all__ = [
    "DLPACK_VERSION",
    "FerryError",
    "SlabTensor",
    "Transfer",
    "__version__",
    "device_count",
    "ops",
    "pool",
    "record_stream",
    "transfer_tensor_d2h",
    "transfer_tensor_d2h_async",
    "transfer_tensor_h2d",
    "transfer_tensor_h2d_async",
]
