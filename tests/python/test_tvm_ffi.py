"""The TVM-FFI provider on the CPU: tvm_ffi loads libferry_tvm_ffi.so and finds gemm, and every argument error comes
back as a TVM-FFI error of the right kind with a message naming what is wrong (numpy operands stand in: the checks
run before any device is needed). Results on the GPU: test_gpu_tvm_ffi.py."""

import numpy as np
import pytest

tvm_ffi = pytest.importorskip("tvm_ffi")

import ferry.tvm_ffi  # noqa: E402


@pytest.fixture(scope="module")
def gemm():
    try:
        return ferry.tvm_ffi.load()["gemm"]
    except FileNotFoundError as error:
        pytest.skip(str(error))


def test_the_library_exports_gemm_and_nothing_of_libferry():
    path = ferry.tvm_ffi.library_path()
    with open(path, "rb") as f:
        data = f.read()
    assert b"__tvm_ffi_gemm" in data
    module = ferry.tvm_ffi.load()
    assert callable(module["gemm"])


def test_host_operands_are_a_value_error_naming_the_device(gemm):
    a, b, out = (np.zeros(s, np.float16) for s in [(4, 8), (8, 2), (4, 2)])
    with pytest.raises(ValueError, match="ferry gemm: checking the operands: .*(CUDA|device)"):
        gemm(a, b, out)


def test_a_wrong_argument_count_or_type_is_a_type_error(gemm):
    a = np.zeros((4, 8), np.float16)
    with pytest.raises(TypeError, match="expected 3 arguments"):
        gemm(a, a)
    with pytest.raises(TypeError, match="B must be a tensor"):
        gemm(a, 3, a)


def test_a_missing_library_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ferry.tvm_ffi, "_LIBRARY", "libferry_tvm_ffi_absent.so")
    with pytest.raises(FileNotFoundError, match="built without the TVM-FFI provider"):
        ferry.tvm_ffi.library_path()
