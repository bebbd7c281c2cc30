"""The TVM-FFI provider on the CPU: tvm_ffi loads libferry_tvm_ffi.so and finds gemm, and every argument error comes
back as a TVM-FFI error of the right kind with a message naming what is wrong (numpy operands stand in: the checks
run before any device is needed). Without a driver, with FERRY_ARCH=sm_90, a valid CUDA problem given as DLTensor
pointers (never dereferenced) finds its operator and stops at the launch. Results on the GPU: test_gpu_tvm_ffi.py."""

import os
import subprocess
import sys
import textwrap

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


STAND_IN_DEVICE = textwrap.dedent("""
    import ctypes, sys
    import tvm_ffi, tvm_ffi.libinfo, ferry, ferry.tvm_ffi
    if ferry.device_count() > 0:
        print("skip: a driver and a device are here; the fake pointers would be launched"); sys.exit(0)

    from dlpack_ctypes import DLDataType, DLDevice, DLTensor   # the test directory is on PYTHONPATH

    class Any(ctypes.Structure):
        _fields_ = [("type_index", ctypes.c_int32), ("zero_padding", ctypes.c_uint32), ("v_ptr", ctypes.c_void_p)]

    class ByteArray(ctypes.Structure):
        _fields_ = [("data", ctypes.c_char_p), ("size", ctypes.c_size_t)]

    KDLCUDA, KDLFLOAT, DLTENSOR_PTR = 2, 2, 7
    runtime = ctypes.CDLL(tvm_ffi.libinfo.find_libtvm_ffi())
    provider = ctypes.CDLL(ferry.tvm_ffi.library_path())
    keep = []

    def tensor(rows, cols, address):
        shape = (ctypes.c_int64 * 2)(rows, cols)
        t = DLTensor(address, DLDevice(KDLCUDA, 0), 2, DLDataType(KDLFLOAT, 16, 1), shape, None, 0)
        keep.extend([shape, t])
        return t

    def call(a, b, out):
        args = (Any * 3)(*[Any(DLTENSOR_PTR, 0, ctypes.addressof(t)) for t in (a, b, out)])
        result = Any(0, 0, None)
        if provider.__tvm_ffi_gemm(None, args, 3, ctypes.byref(result)) == 0:
            return "ok", ""
        error = ctypes.c_void_p()
        runtime.TVMFFIErrorMoveFromRaised(ctypes.byref(error))
        kind, message = (ByteArray * 2).from_address(error.value + 24)   # the cell after the 24-byte object header
        text = kind.data[:kind.size].decode(), message.data[:message.size].decode()
        runtime.TVMFFIObjectDecRef(error)
        return text

    base = 0x7f0000000000   # device addresses never dereferenced: ferry checks and plans, the launch needs a driver
    a, b, out = tensor(128, 64, base), tensor(64, 32, base + (1 << 20)), tensor(128, 32, base + (2 << 20))
    for _ in range(2):   # the second call repeats the first problem: this thread remembered its layouts
        print("valid:", *call(a, b, out))
    print("mismatched k:", *call(a, tensor(63, 32, base + (3 << 20)), out))
    print("null A:", *call(tensor(128, 64, 0), b, out))   # the remembered layout, no data: not the last call's A
""")


def test_a_valid_cuda_problem_finds_its_operator_and_stops_at_the_launch_without_a_driver():
    here = os.path.dirname(os.path.abspath(__file__))   # for dlpack_ctypes
    env = dict(os.environ, FERRY_ARCH="sm_90", PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get(
        "PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", STAND_IN_DEVICE], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    if done.stdout.startswith("skip:"):
        pytest.skip(done.stdout.strip())
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stdout + done.stderr
    for line in lines[:2]:   # past the checks and the operator search: the launch needs the driver
        assert line.startswith("valid: RuntimeError ferry gemm: running the operator:"), line
    assert lines[2].startswith("mismatched k: ValueError ferry gemm: checking the operands:"), lines[2]
    assert lines[3].startswith("null A: ValueError ferry gemm: checking the operands:") and "NULL" in lines[3], lines[3]
