"""torch custom ops over ferry's GEMM operators, registered when ``ferry.torch`` is imported.

``torch.ops.ferry.gemm(A, B)`` returns ``A @ B``; ``torch.ops.ferry.gemm_out(A, B, out)`` writes it into ``out``.
A and B are fp16, bf16 or fp32 CUDA tensors of one dtype, of rank 2 (m x k, k x n) or 3 with a leading batch (a
rank-2 or batch-1 operand is broadcast), row- or column-major; the product accumulates in fp32 and has A's dtype.
Both ops have a fake implementation, so a function that calls them traces under ``torch.compile(fullgraph=True)``
without a graph break, and they launch on torch's current stream, so ``mode="reduce-overhead"`` captures them in
its CUDA graphs.

Each distinct problem (device, dtypes, shapes, strides) finds its best operator, compiles it (NVRTC once, then the
memo or the disk cache) and binds a ``ferry.ops.Launcher`` the first time; later calls with that problem reuse it.

``gemm`` is differentiable (its backward is two ``torch.matmul`` calls, summed over a broadcast batch).
``gemm_out``, like torch's ``out=`` functions, is not: it raises when grad mode is on and an operand requires grad.

The ops are defined with ``torch.library.Library`` rather than ``torch.library.custom_op``: the same schema, fake
implementations and autograd, without custom_op's Python layers around every eager call (several microseconds,
more than the launch itself).
"""

import torch  # no `from __future__ import annotations`: torch.library reads the ops' signatures as objects

from . import ops

__all__ = ["gemm", "gemm_out"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LAUNCHERS_KEPT = 1024  # distinct problems bound at once; past that the table starts again (dynamic shapes)
_launchers: dict[tuple, ops.Launcher] = {}


def _batch(t: torch.Tensor) -> int:
    return t.shape[0] if t.dim() == 3 else 1


def _output_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    """The product's shape, after the checks every implementation makes (ValueError naming the values)."""
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise ValueError(f"ferry::gemm: A and B must have rank 2 or 3, got A {tuple(a.shape)} and B {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in _DTYPES:
        raise ValueError(f"ferry::gemm: A and B must both be float16, bfloat16 or float32, got {a.dtype} and "
                         f"{b.dtype}")
    if a.device != b.device:
        raise ValueError(f"ferry::gemm: A is on {a.device} and B on {b.device}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"ferry::gemm: A {tuple(a.shape)} and B {tuple(b.shape)}: A's k ({a.shape[-1]}) is not "
                         f"B's k ({b.shape[-2]})")
    la, lb = _batch(a), _batch(b)
    if la != lb and 1 not in (la, lb):
        raise ValueError(f"ferry::gemm: batches of {la} (A) and {lb} (B): one must be 1 or both equal")
    mn = (a.shape[-2], b.shape[-1])
    # a batch of 1 (or a rank-2 operand) broadcasts to the other's, 0 included, as torch.matmul does
    return mn if a.dim() == 2 and b.dim() == 2 else (lb if la == 1 else la, *mn)


def _check_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    shape = _output_shape(a, b)
    if tuple(out.shape) != shape or out.dtype != a.dtype or out.device != a.device:
        raise ValueError(f"ferry::gemm_out: out must be {a.dtype} {shape} on {a.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")


def _launcher(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> ops.Launcher:
    """The launcher bound to this problem. A new problem is checked here, once (ValueError naming the operands);
    a known one is the same shapes, strides, types and address alignment (up to 16 bytes: the operator chosen for
    an aligned operand may need it), and the launcher compares each call's layouts in C."""
    key = (a.device, a.dtype, a.shape, b.shape, out.shape, a.stride(), b.stride(), out.stride(),
           a.data_ptr() & 15, b.data_ptr() & 15, out.data_ptr() & 15)
    launch = _launchers.get(key)
    if launch is None:
        _check_out(a, b, out)
        args = ops.GemmArguments(A=a, B=b, out=out, accumulator_type=torch.float32)
        candidates = ops.get_operators(args)
        if not candidates:
            raise ValueError(f"ferry::gemm: no ferry operator supports A {tuple(a.shape)} {a.dtype} strides "
                             f"{a.stride()}, B {tuple(b.shape)} strides {b.stride()} on {a.device}")
        op = candidates[0]
        launch = op.launcher(args, op.compile(args))
        if len(_launchers) >= _LAUNCHERS_KEPT:
            _launchers.clear()
        _launchers[key] = launch
    return launch


_library = torch.library.Library("ferry", "DEF")
_library.define("gemm_out(Tensor a, Tensor b, Tensor(a!) out) -> ()")
_library.define("gemm(Tensor a, Tensor b) -> Tensor")


def gemm_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b on torch's current stream."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or out.requires_grad):
        raise RuntimeError("ferry::gemm_out: an out= function does not support automatic differentiation; use "
                           "ferry::gemm, or call it under torch.no_grad()")
    _launcher(a, b, out)(a, b, out)


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, a new tensor, on torch's current stream."""
    out = torch.empty(_output_shape(a, b), dtype=a.dtype, device=a.device)
    _launcher(a, b, out)(a, b, out)
    return out


_library.impl("gemm_out", gemm_out, "CUDA")
_library.impl("gemm", gemm, "CUDA")
# gemm_out's grad check is in its kernel, as torch's out= functions do it: nothing runs at the autograd key.
_library.impl("gemm_out", torch.library.fallthrough_kernel, "Autograd")


@torch.library.register_fake("ferry::gemm_out", lib=_library)
def _(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    _check_out(a, b, out)


@torch.library.register_fake("ferry::gemm", lib=_library)
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(_output_shape(a, b))


def _sum_to(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """An operand's gradient: summed over the batch it was broadcast across (rank 2, or a batch of 1)."""
    if grad.shape == like.shape:
        return grad
    return grad.sum(0) if like.dim() == 2 else grad.sum(0, keepdim=True)


def _save_operands(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _gemm_backward(ctx, grad: torch.Tensor):
    a, b = ctx.saved_tensors
    grad_a = _sum_to(torch.matmul(grad, b.mT), a) if ctx.needs_input_grad[0] else None
    grad_b = _sum_to(torch.matmul(a.mT, grad), b) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


torch.library.register_autograd("ferry::gemm", _gemm_backward, setup_context=_save_operands, lib=_library)
