"""The Python bad-input table: one call per row with one defect, through ferry's simulated driver (CUDA tensors that
live in host memory), as tests/cpu/test_bad_inputs.c is for the C API.

A row passes when the call raises the expected exception type with a message that names the offending value, or
returns the correct result (byte-exact, or the batch passed through untouched); and then nothing was lost: the
pool holds no bytes and trims to nothing pinned, no simulated device allocation, stream or event is left over, the
reference counts of everything in the batch and the keyword arguments are what they were, every DLPack export
that ferry took was released (and none it refused was touched), and a following D2H and H2D transfer is exact.

The simulation must be installed before the driver is first loaded, so the rows run in a process of their own:
the ctest entry python_bad_inputs_simulated runs this file under FERRY_TEST_SIMULATED=1, where every row is one
test (in the main suite it collects nothing). The table, as markdown (from the build directory):

    PYTHONPATH=python python3 ../tests/python/test_bad_inputs.py --table

Malformed DLPack capsules are made with ctypes here (no framework exports a negative shape); ctypes is for the
test only.
"""

import ctypes
import dataclasses
import gc
import itertools
import os
import sys
import time
import typing

import ferry
import numpy as np
import pytest
from ferry import _ferry

from dlpack_ctypes import DLDataType, DLDevice, DLTensor

HOOKS = hasattr(_ferry, "_sim_install")  # absent from wheels (built without FERRY_PYTHON_TEST_HOOKS)
SIMULATED = os.environ.get("FERRY_TEST_SIMULATED") == "1"
if HOOKS and SIMULATED:
    _ferry._sim_install()

kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat = 0, 1, 2
CUDA_ERROR_INVALID_VALUE = 1


def frozen(array):
    """Read-only: the inputs of the rows are never written, and read-only inputs are a row of their own."""
    array.flags.writeable = False
    return array


SMALL = frozen(np.arange(24, dtype=np.int32).reshape(4, 6))
BYTES = frozen(np.arange(64, dtype=np.uint8))
MILLION = 10**6
TINY = frozen((np.arange(MILLION) % 251).astype(np.uint8))  # the 10^6 one-byte tensors
SLOW = 60.0  # seconds: a call that takes longer fails its row (the C table allows 30 s for its 10^6 tensors)


def cuda(array, index=0):
    """`array` as a (simulated) CUDA tensor on cuda:<index>, exported through __dlpack__."""
    return _ferry._SimDeviceArray(array, index)


def torch_like(producer):
    """A tensor read through the DLPack exchange API, torch's path, viewing what `producer` exports."""
    return _ferry._SimExchangeTensor(producer)


# ---- malformed producers -----------------------------------------------------------------------------------------


# The deleter takes a plain address: converting it to a ctypes pointer object would run Python code.
Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", Deleter), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


@dataclasses.dataclass
class Export:
    """One live export: what its DLManagedTensorVersioned points into stays alive with it."""
    producer: "Crafted"
    managed: DLManagedTensorVersioned
    arrays: tuple
    capsule: object = None


LIVE_EXPORTS: dict = {}  # manager_ctx -> Export, until the deleter runs
_keys = itertools.count(1)


@Deleter
def _deleter(address):
    export = LIVE_EXPORTS.pop(DLManagedTensorVersioned.from_address(address).manager_ctx)
    export.producer.released += 1


NULL = object()  # shape=NULL: a NULL shape pointer


class Crafted:
    """A DLPack producer whose descriptor is exactly what a row asks for. By default it describes `payload` (uint8,
    compact, on cuda:0); every keyword replaces one field. Each __dlpack__ call exports a new managed tensor, and
    its deleter counts the release. The capsule has no destructor (its Python code would run during deallocation,
    perhaps with an exception pending): release_untaken_exports() releases the exports nobody took."""

    def __init__(self, payload=BYTES, *, shape=None, strides=None, start=0, data=None, byte_offset=0,
                 dtype=(kDLUInt, 8, 1), ndim=None, device=(kDLCUDA, 0), exported_device=None, version=(1, 3),
                 capsule_name=b"dltensor_versioned"):
        self.payload = payload
        self.shape = list(payload.shape) if shape is None else shape
        self.strides, self.byte_offset, self.dtype, self.ndim = strides, byte_offset, dtype, ndim
        self.data = payload.__array_interface__["data"][0] + start if data is None else data
        self.device = device
        self.exported_device = device if exported_device is None else exported_device
        self.version, self.capsule_name = version, capsule_name
        self.exports = self.released = 0

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        shape = None if self.shape is NULL else (ctypes.c_int64 * max(1, len(self.shape)))(*self.shape)
        strides = None if self.strides is None else (ctypes.c_int64 * len(self.strides))(*self.strides)
        m = DLManagedTensorVersioned(major=self.version[0], minor=self.version[1], deleter=_deleter)
        t = m.dl_tensor
        t.data, t.device, t.byte_offset = self.data, DLDevice(*self.exported_device), self.byte_offset
        t.ndim = len(self.shape) if self.ndim is None else self.ndim
        t.dtype = DLDataType(*self.dtype)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)) if shape is not None else None
        t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if strides is not None else None
        export = Export(self, m, (shape, strides, self.payload))
        m.manager_ctx = key = next(_keys)
        LIVE_EXPORTS[key] = export
        export.capsule = _capsule_new(ctypes.addressof(m), self.capsule_name, None)
        self.exports += 1
        return export.capsule

    def __repr__(self):
        return "Crafted(...)"


def taken(export):
    """Whether a consumer took the export: it renames the capsule "used_..." as the protocol says."""
    return _capsule_name(export.capsule).startswith(b"used_")


def release_untaken_exports():
    """Releases the exports that no consumer took, as their capsule's destructor would."""
    for export in [e for e in LIVE_EXPORTS.values() if not taken(e)]:
        _deleter(ctypes.addressof(export.managed))


def unreleased_taken_exports():
    return sum(taken(e) for e in LIVE_EXPORTS.values())


class Odd:
    """A producer whose __dlpack_device__ and __dlpack__ answer whatever a row says (an exception: raised)."""

    def __init__(self, device=(kDLCUDA, 0), dlpack=None):
        self.answers = {"device": device, "dlpack": dlpack}

    def _answer(self, which):
        value = self.answers[which]
        if isinstance(value, BaseException):
            # A fresh exception each time: one kept here would hold its traceback, and through it this producer.
            raise type(value)(*value.args)
        return value

    def __dlpack_device__(self):
        return self._answer("device")

    def __dlpack__(self, **kwargs):
        return self._answer("dlpack")


class Stream:
    """Shaped like torch.cuda.Stream: .cuda_stream and .device_index."""

    def __init__(self, handle, device_index, label):
        self.cuda_stream, self.device_index, self.label = handle, device_index, label

    def __repr__(self):
        return f"Stream({self.label})"


class Event:
    """Shaped like torch.cuda.Event: .cuda_event (0 until its first record())."""

    def __init__(self, handle, label):
        self.cuda_event, self.label = handle, label

    def __repr__(self):
        return f"Event({self.label})"


def foreign_stream():
    """A stream of a second (non-primary) context of cuda:0, as the simulated driver answers for it."""
    handle = _ferry._sim_foreign_stream() if HOOKS else 0  # built with ROWS on import; rows run only with hooks
    return Stream(handle, 0, "another context of cuda:0")


def nested(depth):
    batch = [cuda(SMALL)]
    for _ in range(depth):
        batch = [batch]
    return batch


def cyclic_list():
    batch = [cuda(SMALL)]
    batch.append(batch)
    return batch


def cyclic_dict():
    batch = {"x": cuda(SMALL)}
    batch["inner"] = {"again": batch}
    return batch


# ---- expected outcomes -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Raises:
    type: type
    text: str | tuple  # must be in the message: the offending value (a tuple: any one of them)

    def __str__(self):
        texts = self.text if isinstance(self.text, tuple) else (self.text,)
        return f"{self.type.__name__} naming " + " or ".join(f"`{t}`" for t in texts)


@dataclasses.dataclass(frozen=True)
class Correct:
    what: str
    check: typing.Callable  # (batch, result) -> what was seen, in words; raises AssertionError when wrong

    def __str__(self):
        return f"correct result ({self.what})"


def host_copy(out, want):
    """`out` is a fresh, writable, compact host copy of `want`'s bytes."""
    assert isinstance(out, np.ndarray), f"got a {type(out).__name__}"
    assert out.shape == want.shape and out.dtype == want.dtype, f"got {out.dtype}{out.shape}"
    assert out.tobytes() == want.tobytes(), "the bytes differ"
    assert out.flags.writeable and out.flags.c_contiguous, "not a writable compact array"
    assert not np.shares_memory(out, want), "the output shares memory with the input"


def exact(want):
    def check(batch, out):
        host_copy(out, want)
        return "byte-exact, writable copy"
    return Correct("byte-exact", check)


def exact_on_device(want):
    def check(batch, out):
        assert type(out) is ferry.SlabTensor, f"got a {type(out).__name__}"
        assert out.device == "cuda:0" and out.shape == want.shape
        assert _ferry._sim_read(out) == want.tobytes(), "the bytes differ"
        return "byte-exact on cuda:0"
    return Correct("byte-exact", check)


def exact_bytes(want):
    """For torch-like outputs, built through the exchange API: compared by their bytes."""
    def check(batch, out):
        assert type(out) is _ferry._SimExchangeTensor and out.device == (kDLCPU, 0), f"got {out!r}"
        assert out.tobytes() == want.tobytes(), "the bytes differ"
        return "byte-exact, host tensor"
    return Correct("byte-exact", check)


def million_exact(batch, out):
    assert type(out) is list and len(out) == MILLION
    host_copy(out[-1], TINY[-1:])
    got = np.concatenate(out)
    assert got.tobytes() == TINY.tobytes(), "the bytes differ"
    return f"byte-exact, {MILLION:,} outputs"


def passed_through(batch, out):
    assert out is batch, "not the same object"
    for leaf in batch if isinstance(batch, list) else [batch]:
        assert getattr(leaf, "exports", 0) == 0, "exported although it is not ferry's to copy"
    return "passed through untouched, not exported"


UNTOUCHED = Correct("passed through", passed_through)


# ---- the rows ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    input: str
    batch: typing.Callable  # builds the batch: fresh objects for every run
    expect: object          # Raises or Correct
    fn: typing.Callable = ferry.transfer_tensor_d2h
    kwargs: dict = dataclasses.field(default_factory=dict)
    wait: bool = False      # fn is an _async form: the result is handle.wait()'s
    fault: tuple = None     # (driver call, nth, CUresult) armed for the call: what a real driver would answer

    def call(self):
        def shown(name, v):
            handle = name in ("stream", "producer_event") and isinstance(v, int) and v > 255
            text = hex(v) if handle else repr(v)
            return text if len(text) <= 40 else type(v).__name__
        args = "".join(f", {k}={shown(k, v)}" for k, v in self.kwargs.items())
        return f"{self.fn.__name__}(batch{args})" + (".wait()" if self.wait else "")


D2H, H2D = ferry.transfer_tensor_d2h, ferry.transfer_tensor_h2d
D2H_ASYNC = ferry.transfer_tensor_d2h_async

ROWS = [
    # -- producers' descriptors (__dlpack__ capsules, made with ctypes)
    Row("capsule with data NULL and 64 bytes", lambda: Crafted(data=0),
        Raises(ValueError, "data is NULL but the tensor holds 64 bytes")),
    Row("capsule with data NULL and shape [0]", lambda: Crafted(data=0, shape=[0]),
        exact(np.zeros(0, np.uint8))),
    Row("capsule with shape NULL and ndim 2", lambda: Crafted(shape=NULL, ndim=2),
        Raises(ValueError, "shape is NULL with ndim 2")),
    Row("shape [4, -5]", lambda: Crafted(shape=[4, -5]), Raises(ValueError, "dimension 1 is negative (-5)")),
    Row("shape [2^63-1, 3]: the element count overflows int64", lambda: Crafted(shape=[2**63 - 1, 3]),
        Raises(OverflowError, "overflows 64 bits at dimension 1 (3)")),
    Row("shape [2^31, 2^30] of float64: the byte size overflows",
        lambda: Crafted(shape=[2**31, 2**30], dtype=(kDLFloat, 64, 1)),
        Raises(OverflowError, "overflows 64 bits at dimension 1 (1073741824)")),
    Row("strides [-2^20] from address 0x1000: below address 0",
        lambda: Crafted(shape=[4], strides=[-2**20], data=0x1000),
        Raises(OverflowError, "strides [-1048576] reach 3145728 bytes below")),
    Row("strides [2^62-1, 1] of float32: the extent passes 2^64",
        lambda: Crafted(shape=[2, 2], strides=[2**62 - 1, 1], dtype=(kDLFloat, 32, 1)),
        Raises(OverflowError, "strides [4611686018427387903, 1]")),
    Row("byte_offset 2^64-9: the address wraps", lambda: Crafted(byte_offset=2**64 - 9),
        Raises(OverflowError, "byte_offset 18446744073709551607 wraps")),
    Row("strides [-1] (a buffer read backwards: legal)", lambda: Crafted(shape=[64], strides=[-1], start=63),
        exact(BYTES[::-1])),
    Row("ndim -1", lambda: Crafted(ndim=-1), Raises(ValueError, "ndim is -1")),
    Row("ndim 17", lambda: Crafted(shape=[1] * 17), Raises(ValueError, "ndim is 17")),
    Row("ndim 2^31-1", lambda: Crafted(ndim=2**31 - 1), Raises(ValueError, "ndim is 2147483647")),
    Row("dtype bits 0", lambda: Crafted(dtype=(kDLUInt, 0, 1)), Raises(ValueError, "(bits=0, lanes=1)")),
    Row("dtype lanes 0", lambda: Crafted(dtype=(kDLUInt, 8, 0)), Raises(ValueError, "(bits=8, lanes=0)")),
    Row("dtype of 4 bits (sub-byte)", lambda: Crafted(dtype=(kDLInt, 4, 1)),
        Raises(ferry.FerryError, "dtype of 4 bits x 1 lanes is not a whole number of bytes")),
    Row("dtype code 99 (unknown to DLPack), numpy output", lambda: Crafted(shape=[16], dtype=(99, 32, 1)),
        Raises(BufferError, "output 0 (DLPack dtype code 99, 32 bits, 1 lanes)")),
    Row("dtype float32 x 4 lanes, numpy output", lambda: Crafted(shape=[4], dtype=(kDLFloat, 32, 4)),
        Raises(BufferError, "output 0 (DLPack dtype code 2, 32 bits, 4 lanes)")),
    Row("dtype float32 x 4 lanes after 100 good tensors (its part the second)",
        lambda: [Crafted(np.full(64, i, np.uint8)) for i in range(100)] + [Crafted(shape=[4], dtype=(kDLFloat, 32, 4))],
        Raises(BufferError, "output 100 (DLPack dtype code 2, 32 bits, 4 lanes)")),
    Row("dtype code 99 through the exchange API (torch's path)",
        lambda: torch_like(Crafted(shape=[16], dtype=(99, 32, 1), device=(kDLCPU, 0))), exact_bytes(BYTES)),
    Row("DLPack 2.0 capsule (another ABI)", lambda: Crafted(version=(2, 0)),
        Raises(BufferError, "exported DLPack 2.x")),
    Row("capsule named 'not_a_tensor'", lambda: Crafted(capsule_name=b"not_a_tensor"),
        Raises(TypeError, 'capsule object "not_a_tensor"')),
    Row("__dlpack__ returns 5, not a capsule", lambda: Odd(dlpack=5), Raises(TypeError, "returned 5, not a DLPack")),
    Row("__dlpack__ raises", lambda: Odd(dlpack=KeyError("producer failed")), Raises(KeyError, "producer failed")),
    Row("__dlpack_device__ returns 'cuda'", lambda: Odd(device="cuda"), Raises(TypeError, "returned 'cuda'")),
    Row("__dlpack_device__ returns (2, 2^80)", lambda: Odd(device=(2, 2**80)),
        Raises(TypeError, "returned (2, 1208925819614629174706176)")),
    Row("__dlpack_device__ raises", lambda: Odd(device=OSError("no device")), Raises(OSError, "no device")),
    Row("capsule on the CPU where __dlpack_device__ said cuda:0",
        lambda: Crafted(exported_device=(kDLCPU, 0)), Raises(BufferError, "on device (1, 0)")),
    Row("shape [4, -5] through the exchange API",
        lambda: torch_like(Crafted(shape=[4, -5], device=(kDLCPU, 0))),
        Raises(ValueError, "dimension 1 is negative (-5)")),
    Row("shape [4, -5], async form", lambda: Crafted(shape=[4, -5]),
        Raises(ValueError, "dimension 1 is negative (-5)"), fn=D2H_ASYNC, wait=True),
    Row("dtype code 99, numpy output, async form", lambda: Crafted(shape=[16], dtype=(99, 32, 1)),
        Raises(BufferError, "dtype code 99"), fn=D2H_ASYNC, wait=True),
    Row("H2D: host capsule with data NULL and 64 bytes", lambda: Crafted(data=0, device=(kDLCPU, 0)),
        Raises(ValueError, "data is NULL but the tensor holds 64 bytes"), fn=H2D),
    Row("H2D: host capsule with shape [4, -5]", lambda: Crafted(shape=[4, -5], device=(kDLCPU, 0)),
        Raises(ValueError, "dimension 1 is negative (-5)"), fn=H2D),
    # -- tensors that are not the transfer's to copy
    Row("a tensor on cuda:1 in a cuda:0 transfer", lambda: [cuda(SMALL, 1)], UNTOUCHED),
    Row("device_type 999, device_id -3", lambda: [Crafted(device=(999, -3))], UNTOUCHED),
    Row("device (kDLCUDA, 2^32): no device, not cuda:0", lambda: [Crafted(device=(kDLCUDA, 2**32))], UNTOUCHED),
    Row("H2D: a CUDA tensor", lambda: [cuda(SMALL)], UNTOUCHED, fn=H2D),
    # -- read-only inputs
    Row("read-only numpy array on cuda:0", lambda: cuda(SMALL), exact(SMALL)),
    Row("read-only numpy array through the exchange API", lambda: torch_like(SMALL), exact_bytes(SMALL)),
    Row("H2D: read-only numpy array", lambda: SMALL, exact_on_device(SMALL), fn=H2D),
    # -- device, stream and event arguments
    Row("device 'cpu'", lambda: cuda(SMALL), Raises(ValueError, "got 'cpu'"), kwargs={"device": "cpu"}),
    Row("device 'cuda:x'", lambda: cuda(SMALL), Raises(ValueError, "'cuda:x'"), kwargs={"device": "cuda:x"}),
    Row("device -1", lambda: cuda(SMALL), Raises(ValueError, "got -1"), kwargs={"device": -1}),
    Row("device 1 on a 1-device machine", lambda: cuda(SMALL),
        Raises(RuntimeError, "cuda:1 (requested) is not available: this process sees 1 CUDA device"),
        kwargs={"device": 1}),
    Row("device 2^70", lambda: cuda(SMALL), Raises(ValueError, "1180591620717411303424"),
        kwargs={"device": 2**70}),
    Row("device 1.5", lambda: cuda(SMALL), Raises(TypeError, "got 1.5"), kwargs={"device": 1.5}),
    Row("stream without device", lambda: cuda(SMALL), Raises(ValueError, "stream=5 was given without device="),
        kwargs={"stream": 5}),
    Row("stream of cuda:1, device 0", lambda: cuda(SMALL),
        Raises(ValueError, "Stream(cuda:1) belongs to cuda:1, but the transfer is on cuda:0"),
        kwargs={"device": 0, "stream": Stream(0x5100, 1, "cuda:1")}),
    Row("stream of another context of cuda:0", lambda: cuda(SMALL),
        Raises(ValueError, "other than its primary context"), kwargs={"device": 0, "stream": foreign_stream()}),
    Row("stream -5", lambda: cuda(SMALL), Raises(ValueError, "stream -5 is not a valid CUDA handle"),
        kwargs={"device": 0, "stream": -5}),
    Row("stream 's'", lambda: cuda(SMALL), Raises(TypeError, "got 's' (str)"), kwargs={"device": 0, "stream": "s"}),
    Row("stream 0xdead, not a stream (the driver's refusal, simulated)", lambda: cuda(SMALL),
        Raises(ferry.FerryError, "finding the device of stream 0xdead: cuStreamGetCtx failed"),
        kwargs={"device": 0, "stream": 0xDEAD}, fault=("cuStreamGetCtx", 1, CUDA_ERROR_INVALID_VALUE)),
    Row("producer_event 'e'", lambda: cuda(SMALL), Raises(TypeError, "got 'e' (str)"),
        kwargs={"producer_event": "e"}),
    Row("producer_event -3", lambda: cuda(SMALL), Raises(ValueError, "producer_event -3 is not a valid CUDA handle"),
        kwargs={"producer_event": -3}),
    Row("producer_event never recorded (handle 0)", lambda: cuda(SMALL),
        Raises(ValueError, "Event(unrecorded) has no CUDA event yet"),
        kwargs={"producer_event": Event(0, "unrecorded")}),
    Row("producer_event of another device (legal: the driver orders across devices)", lambda: cuda(SMALL),
        exact(SMALL), kwargs={"producer_event": Event(0xE100, "cuda:1")}),
    Row("producer_event 0xbad, not an event (the driver's refusal, simulated)", lambda: cuda(SMALL),
        Raises(ferry.FerryError, "producer_event 0xbad"), kwargs={"producer_event": 0xBAD},
        fault=("cuStreamWaitEvent", 1, CUDA_ERROR_INVALID_VALUE)),
    # -- batch structure
    # Which limit is met first depends on the interpreter: Python 3.11 counts the walk's C recursion against
    # sys.getrecursionlimit() (its message), 3.12 does not, and ferry's own 1000-container limit speaks.
    Row("batch nested 10^4 lists deep", lambda: nested(10**4),
        Raises(RecursionError, ("while walking a batch for ferry", "nested deeper than 1000 containers"))),
    Row("a list that contains itself", cyclic_list,
        Raises(ValueError, "reference cycle: a list (list) contains itself")),
    Row("a dict that contains itself (one level down)", cyclic_dict,
        Raises(ValueError, "reference cycle: a mapping (dict) contains itself")),
    Row("10^6 tensors of 1 byte in one batch", lambda: [cuda(TINY[i:i + 1]) for i in range(MILLION)],
        Correct("byte-exact", million_exact)),
]


# ---- running a row -----------------------------------------------------------------------------------------------


def quiet_state():
    """What must be back where it was after a row: pool bytes in use, simulated device allocations, streams, events.
    Trimmed first: ferry keeps free events for reuse, and trim() destroys them (a leaked one stays alive), but only
    while some region is pinned, hence the reserve."""
    gc.collect()
    ferry.pool.reserve(1)
    ferry.pool.trim()
    counters = _ferry._sim_counters()
    return {"pool bytes in use": ferry.pool.stats()["bytes_in_use"],
            **{k: counters[k] for k in ("device_allocations", "streams", "events")}}


def reachable(batch, kwargs):
    """The batch's containers and leaves and the keyword arguments, each once (cycles and depth are fine), without
    the ints, strings and other immutable atoms whose reference counts the interpreter shares."""
    atoms = (int, float, str, bytes, bool, type(None))
    seen, found, todo = set(), [], [batch, *kwargs.values()]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or type(obj) in atoms:
            continue
        seen.add(id(obj))
        found.append(obj)
        if isinstance(obj, (list, tuple)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
    return found


def good_transfers():
    """A D2H and an H2D that must be exact after any row: the pool and the thread's streams are not poisoned."""
    out = ferry.transfer_tensor_d2h([cuda(SMALL)])
    host_copy(out[0], SMALL)
    on_device = ferry.transfer_tensor_h2d(SMALL)
    assert _ferry._sim_read(on_device) == SMALL.tobytes()


def outcome_of(row, batch):
    """Runs the row's call; returns (True, result) or (False, (exception type, message))."""
    if row.fault:
        _ferry._sim_fault(*row.fault)
    try:
        result = row.fn(batch, **row.kwargs)
        return True, (result.wait() if row.wait else result)
    except Exception as e:  # noqa: BLE001 - the row says which exception it wants
        return False, (type(e), str(e))
    finally:
        _ferry._sim_fault("", 0, 0)


def judge(expect, batch, returned, value):
    """Returns (problem or None, what happened in words)."""
    if isinstance(expect, Raises):
        if returned:
            return f"returned a {type(value).__name__} instead of raising", "returned"
        exc_type, message = value
        said = f"{exc_type.__name__}: {message}"
        if exc_type is not expect.type:
            return f"raised {exc_type.__name__}, expected {expect.type.__name__}", said
        texts = expect.text if isinstance(expect.text, tuple) else (expect.text,)
        if not any(t in message for t in texts):
            return f"the message does not contain {' or '.join(map(repr, texts))}", said
        return None, said
    if not returned:
        exc_type, message = value
        said = f"{exc_type.__name__}: {message}"
        return f"raised {said}", said
    try:
        return None, expect.check(batch, value)
    except AssertionError as e:
        return f"wrong result: {e}", "wrong result"


def run_row(row):
    """Runs one row and the checks after it; returns (problems, what happened in words)."""
    before = quiet_state()
    leaked_before = unreleased_taken_exports()  # a row that failed before must not fail the ones after it
    batch = row.batch()
    watched = reachable(batch, row.kwargs)
    refs = [sys.getrefcount(o) for o in watched]
    start = time.perf_counter()
    returned, value = outcome_of(row, batch)
    seconds = time.perf_counter() - start
    problem, said = judge(row.expect, batch, returned, value)
    problems = [problem] if problem else []
    if seconds > SLOW:
        problems.append(f"took {seconds:.0f} s")
    if returned and seconds > 1:
        said += f", {seconds:.1f} s"
    del value

    release_untaken_exports()
    after = quiet_state()
    problems += [f"{k}: {before[k]} before, {after[k]} after" for k in before if after[k] != before[k]]
    if [sys.getrefcount(o) for o in watched] != refs:
        problems.append("reference counts of the inputs changed")
    if unreleased := [o for o in watched if getattr(o, "exports", 0) != getattr(o, "released", 0)]:
        problems.append(f"{len(unreleased)} producers exported more than was released")
    del batch, watched, unreleased
    gc.collect()  # torch-like tensors release the exports they hold only now
    if n := unreleased_taken_exports() - leaked_before:
        problems.append(f"{n} DLPack exports taken were never released")
    try:
        good_transfers()
    except Exception as e:  # noqa: BLE001
        problems.append(f"the next transfer failed: {type(e).__name__}: {e}")
    ferry.pool.trim()
    if ferry.pool.stats()["bytes_pinned"] or _ferry._sim_counters()["registered_ranges"]:
        problems.append("pinned memory is left after trim()")
    return problems, said


def warm_up():
    """The first transfer creates the thread's copy streams and events, which live for the thread: before the rows."""
    good_transfers()


# ---- pytest: one test per row, in a simulated process ---------------------------------------------------------


if SIMULATED:
    @pytest.fixture(scope="module", autouse=True)
    def _warm():
        warm_up()

    @pytest.mark.parametrize("row", ROWS, ids=[r.input for r in ROWS])
    def test_row(row):
        problems, said = run_row(row)
        assert not problems, f"{row.input}: {'; '.join(problems)} (got {said})"


# ---- the table ---------------------------------------------------------------------------------------------------


def table():
    """Runs every row and prints the markdown table; returns the number of failed rows."""
    def cell(text):
        return text.replace("|", "\\|").replace("\n", " ")

    print("| # | input | call | expected | result |")
    print("|---|---|---|---|---|")
    failed = 0
    for i, row in enumerate(ROWS, 1):
        problems, said = run_row(row)
        failed += bool(problems)
        verdict = f"**FAIL**: {'; '.join(problems)} (got {said})" if problems else f"ok: {said}"
        print(f"| {i} | {cell(row.input)} | `{cell(row.call())}` | {cell(str(row.expect))} | {cell(verdict)} |",
              flush=True)
    print(f"\n{len(ROWS)} rows, {failed} failed")
    return failed


if __name__ == "__main__":
    if sys.argv[1:] != ["--table"]:
        sys.exit(f"usage: {sys.argv[0]} --table   (run every row through the simulated driver, print markdown)")
    if not HOOKS:
        sys.exit("ferry._ferry was built without FERRY_PYTHON_TEST_HOOKS: no simulated driver")
    _ferry._sim_install()
    warm_up()
    sys.exit(1 if table() else 0)
