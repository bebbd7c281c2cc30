"""A numpy-backed stand-in for the slice of torch (and of ferry's transfer functions) that the Python benchmarks use,
so their whole main() runs on the CPU machine: argument handling, the timing loops, validation, CSV and tables.
Nothing here measures anything; the GPU runs are the lead's. Installed per test with install(monkeypatch)."""

import contextlib
import types

import numpy as np


class Device:
    def __init__(self, kind, index=None):
        if isinstance(kind, Device):
            kind, index = kind.type, kind.index
        if ":" in str(kind):
            kind, index = str(kind).split(":")
            index = int(index)
        self.type, self.index = str(kind), (0 if index is None and kind == "cuda" else index)

    def __eq__(self, other):
        other = other if isinstance(other, Device) else Device(other)
        return (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __repr__(self):
        return f"device(type={self.type!r}, index={self.index})"


uint8, float32 = np.uint8, np.float32


class Tensor:
    def __init__(self, array, device="cpu", pinned=False):
        self.a = array
        self.device = Device(device)
        self.pinned = pinned

    dtype = property(lambda self: self.a.dtype)
    shape = property(lambda self: self.a.shape)

    def numel(self):
        return self.a.size

    def __getitem__(self, key):
        return Tensor(self.a[key], self.device, self.pinned)

    def split(self, sizes):
        edges = np.cumsum([0] + list(sizes))
        return tuple(Tensor(self.a[a:b], self.device, self.pinned) for a, b in zip(edges[:-1], edges[1:]))

    def reshape(self, *shape):
        return Tensor(self.a.reshape(*shape), self.device, self.pinned)

    def copy_(self, other, non_blocking=False):
        self.a[...] = other.a
        return self

    def to(self, device, non_blocking=False):
        return Tensor(self.a.copy(), device)

    def cpu(self):
        return self.to("cpu")

    def is_pinned(self):
        return self.pinned

    def all(self):
        return Tensor(np.array(self.a.all()), self.device)

    def item(self):
        return self.a.item()


def randint(low, high, size, dtype=uint8, device="cpu", generator=None):
    return Tensor(np.random.default_rng(0).integers(low, high, size=size).astype(dtype), device)


def randn(*shape, device="cpu"):
    return Tensor(np.random.default_rng(0).standard_normal(shape).astype(float32), device)


def empty(n, dtype=uint8, pin_memory=False, device="cpu"):
    return Tensor(np.zeros(n, dtype), device, pin_memory)


def empty_like(t):
    return Tensor(np.zeros_like(t.a), t.device)


def equal(a, b):
    return a.a.shape == b.a.shape and bool((a.a.view(np.uint8) == b.a.view(np.uint8)).all())


def cat(parts):
    return Tensor(np.concatenate([p.a for p in parts]), parts[0].device if parts else "cpu")


def mm(a, b, out=None):
    out.a[...] = a.a @ b.a
    return out


def isfinite(t):
    return Tensor(np.isfinite(t.a), t.device)


class Stream:
    def __init__(self, device=None):
        pass

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


_current = Stream()


def _assert_close(a, b, rtol=0, atol=0):
    assert equal(a, b)


def make_torch():
    cuda = types.SimpleNamespace(
        is_available=lambda: True, set_device=lambda d: None, synchronize=lambda device=None: None,
        get_device_name=lambda d=None: "Fake GPU", current_device=lambda: 0, Stream=Stream,
        current_stream=lambda device=None: _current, stream=lambda s: contextlib.nullcontext(),
        get_device_capability=lambda d=None: (9, 0))
    return types.SimpleNamespace(
        __version__="0.0-fake", cuda=cuda, device=Device, Tensor=Tensor, uint8=uint8, float32=float32,
        randint=randint, randn=randn, empty=empty, empty_like=empty_like, equal=equal, cat=cat, mm=mm,
        isfinite=isfinite, manual_seed=lambda s: None, version=types.SimpleNamespace(cuda="13.0"),
        testing=types.SimpleNamespace(assert_close=_assert_close))


class _Handle:
    def __init__(self, out):
        self.out = out

    def wait(self):
        return self.out


def _d2h(batch, device=None, **kw):
    return [Tensor(t.a.copy(), "cpu", pinned=True) for t in batch] if isinstance(batch, list) else \
        Tensor(batch.a.copy(), "cpu", pinned=True)


def _h2d(batch, device=None, **kw):
    return [Tensor(t.a.copy(), device or "cuda:0") for t in batch]


def install(monkeypatch):
    """torch -> the stand-in; ferry's transfer functions and device_count -> copies on the stand-in's tensors."""
    import sys

    import ferry

    monkeypatch.setitem(sys.modules, "torch", make_torch())
    monkeypatch.setattr(ferry, "device_count", lambda: 1)
    monkeypatch.setattr(ferry, "transfer_tensor_d2h", _d2h)
    monkeypatch.setattr(ferry, "transfer_tensor_h2d", _h2d)
    monkeypatch.setattr(ferry, "transfer_tensor_d2h_async", lambda batch, **kw: _Handle(_d2h(batch, **kw)))
