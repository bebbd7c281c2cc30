"""Helpers of the torch tests: the tensors of a nested state dict, in order."""

import torch


def tensors_of(obj):
    """Every tensor of obj (dicts, lists and tuples walked), in order; a tensor met twice is yielded twice."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_of(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_of(v)
