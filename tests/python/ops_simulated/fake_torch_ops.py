"""A numpy-backed stand-in for the slice of torch that ferry.bench.latency uses, for running its whole main() on the
simulated driver: tensors are numpy arrays exported through __dlpack__ as if on cuda:0 (so ferry reads them, and
the simulation computes ferry's launches into them), streams are made-up handles, and torch.cuda.graph is a
capture through the simulated driver's table (_ops_sim_capture), as torch's is through the real one. Nothing here
measures anything; it is for the benchmark's plumbing."""

import contextlib
import itertools
import types

import numpy as np
from ferry import _ferry

float16, float32 = np.float16, np.float32
__version__ = "0.0-fake"
_handles = itertools.count(0x1000, 0x10)


class Stream:
    def __init__(self, device=None):
        self.cuda_stream = next(_handles)
        self.device_index = 0

    def synchronize(self):
        pass


_current = [Stream()]
_current[0].cuda_stream = 0  # torch's default stream: the legacy default stream


class Tensor:
    def __init__(self, array):
        self.a = array

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return _ferry._SimDeviceArray(self.a).__dlpack__(stream=stream, max_version=max_version)

    def __dlpack_device__(self):
        return (2, 0)

    def fill_(self, value):
        self.a[...] = value
        return self

    def float(self):
        return Tensor(self.a.astype(np.float32))

    def half(self):
        return Tensor(self.a.astype(np.float16))

    def __matmul__(self, other):
        return Tensor(self.a @ other.a)


def randint(low, high, size, device=None, dtype=None):
    return Tensor(np.random.default_rng(len(_current) + next(_handles)).integers(low, high, size).astype(dtype))


def empty(size, device=None, dtype=None):
    return Tensor(np.empty(size, dtype))


def mm(a, b, out=None):
    out.a[...] = (a.a.astype(np.float32) @ b.a.astype(np.float32)).astype(out.a.dtype)
    return out


def equal(x, y):
    return np.array_equal(x.a, y.a)


def device(spec):
    return types.SimpleNamespace(type=str(spec).split(":")[0], index=0)


class CUDAGraph:
    def __init__(self):
        self.exec = None

    def __del__(self):
        if self.exec is not None:
            _ferry._ops_sim_exec_destroy(self.exec)

    def replay(self):
        if self.exec is not None:
            _ferry._ops_sim_replay(self.exec, _current[-1].cuda_stream)


@contextlib.contextmanager
def _graph(g):
    capture = Stream()
    _ferry._ops_sim_capture(capture.cuda_stream)
    _current.append(capture)
    try:
        yield
    finally:
        _current.pop()
        g.exec = _ferry._ops_sim_capture_end(capture.cuda_stream)


@contextlib.contextmanager
def _stream(s):
    _current.append(s)
    try:
        yield
    finally:
        _current.pop()


cuda = types.SimpleNamespace(
    is_available=lambda: True, set_device=lambda d: None, get_device_name=lambda d=None: "ferry simulated device",
    Stream=Stream, stream=_stream, current_stream=lambda device=None: _current[-1], CUDAGraph=CUDAGraph,
    graph=_graph, synchronize=lambda: None)
