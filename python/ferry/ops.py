"""ferry.ops: GEMM operators from Python with the lowest call overhead (the CUTLASS Operator API's names).

Everything here is implemented in C (``ferry._ferry._ops``) over libferry's operator runtime (``ferry/ops.h``): the
arguments are validated once into a compact problem, support checks are integer compares, compiling is NVRTC
once with an in-memory memo and a verified disk cache, and a run is a parameter copy and one ``cuLaunchKernel``.
This module only re-exports. The notebook's pattern::

    import torch, ferry.ops as ops

    args = ops.GemmArguments(A=a, B=b, out=c, accumulator_type=torch.float32)    # validated once (~1 µs)
    op = ops.get_operators(args, target_sm=ops.target_sm())[0]                    # best first
    art = op.compile(args)                                                        # NVRTC or a cache, once
    op.run(args, compiled_artifact=art, assume_supported_args=True)               # on torch's current stream

    launch = op.launcher(args, art, assume_supported_args=True)                   # the fast call form
    launch(a2, b2, c2)                                                            # tensors only, per call

    with ops.Graph(stream) as g:                                                  # ferry's own CUDA graphs
        i = g.run(op, args, compiled_artifact=art)
    g.replay(); g.update(i, other_args)                                           # new operands, no recapture

``op.run`` also captures under ``torch.cuda.graph(...)``: with ``stream=None`` it asks torch for its current
stream at every call (through the DLPack exchange API), which inside the capture is the capturing stream.

Errors go through ferry's one status -> exception table: ValueError for bad arguments (messages name the operand
and the values), ferry.FerryError (status ``UNSUPPORTED``, ``COMPILE_FAILED``, ``BAD_ARTIFACT``, ...) for the
runtime, RuntimeError without a driver or device, OSError for artifact files that cannot be read or written.
``FERRY_ARCH=sm_90`` makes ``target_sm()``, ``get_operators`` and ``compile`` work on a machine without a GPU.
"""

from ._ferry import _ops as _c

GemmArguments = _c.GemmArguments
Operator = _c.Operator
Status = _c.Status
CompiledArtifact = _c.CompiledArtifact
Launcher = _c.Launcher
Graph = _c.Graph
OperatorMetadata = _c.OperatorMetadata
Design = _c.Design
Constraints = _c.Constraints

get_operators = _c.get_operators
get_operator = _c.get_operator
operators = _c.operators
target_sm = _c.target_sm
device_supports = _c.device_supports
clear_memo = _c.clear_memo
cache_stats = _c.cache_stats

__all__ = [
    "CompiledArtifact",
    "Constraints",
    "Design",
    "GemmArguments",
    "Graph",
    "Launcher",
    "Operator",
    "OperatorMetadata",
    "Status",
    "cache_stats",
    "clear_memo",
    "device_supports",
    "get_operator",
    "get_operators",
    "operators",
    "target_sm",
]
