"""Helpers for the simulated-driver tests."""

import numpy as np
from ferry import _ferry


def device(array, index=0):
    """`array` as a (simulated) CUDA tensor on cuda:<index>: ferry sees a DLPack producer on that device."""
    return _ferry._SimDeviceArray(np.asarray(array), index)


def read_device(obj, dtype, shape):
    """The contents of an output in simulated device memory (an H2D output), as a numpy array."""
    return np.frombuffer(_ferry._sim_read(obj), dtype=dtype).reshape(shape)


def address(array):
    """Address of a numpy array's first element."""
    return array.__array_interface__["data"][0]
