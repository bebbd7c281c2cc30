"""ferry's GEMM operators through Apache TVM-FFI: a library any TVM-FFI host can load.

``libferry_tvm_ffi.so`` (in ``ferry/lib``) exports the TVM-FFI function ``gemm(A, B, out)``: out = A @ B with the
best ferry operator for the problem, on the stream TVM-FFI's environment holds for the operands' device (from
Python, tvm_ffi sets torch's current stream when it is given torch tensors). A, B and out are fp16, bf16 or fp32
CUDA tensors, rank 2 or 3 with a batch, row- or column-major; the product accumulates in fp32. From Python::

    import ferry.tvm_ffi
    gemm = ferry.tvm_ffi.load()["gemm"]
    gemm(a, b, out)                       # torch (or any DLPack) tensors

A C or C++ host loads the same library with TVM-FFI's module loader (or dlopen) and calls ``__tvm_ffi_gemm``.
Errors come back as TVM-FFI errors: ValueError for operands ferry cannot take (the message names them), TypeError
for arguments that are not three tensors, RuntimeError otherwise. The library carries its own copy of libferry, so
its compiled-kernel memo is not the ``ferry.ops`` one.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["library_path", "load"]

_LIBRARY = "libferry_tvm_ffi.so"


def library_path() -> str:
    """The provider library's path. FileNotFoundError when this build of ferry has none (it is built where the
    apache-tvm-ffi package that supplies DLPack's header also has TVM-FFI's C API and library)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", _LIBRARY)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: this ferry was built without the TVM-FFI provider (apache-tvm-ffi's C API "
                                f"and library were not found at build time)")
    return path


def load() -> Any:
    """The provider as a ``tvm_ffi.Module`` (imports tvm_ffi); ``load()["gemm"]`` is the function."""
    import tvm_ffi

    return tvm_ffi.load_module(library_path())
