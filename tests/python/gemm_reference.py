"""Helpers of the GPU GEMM tests: operands of exactly representable values and the error against a float64
reference, with the bounds of test_gpu_ops.py (||out - ref|| / ||ref||: fp32 1e-5, fp16 5e-3, bf16 1e-2)."""

import torch

DEV = torch.device("cuda", 0)
BOUND = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 1e-2}


def operand(shape, dtype, column_major=False, seed=0):
    """Values in [-1, 1) of `dtype` on the GPU, row-major, or column-major in the last two dimensions."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype).to(DEV)
    return values.transpose(-1, -2).contiguous().transpose(-1, -2) if column_major else values


def relative_error(out, a, b):
    ref = torch.matmul(a.double(), b.double())
    return float(torch.linalg.norm((out.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
