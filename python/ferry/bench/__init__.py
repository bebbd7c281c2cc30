"""ferry's Python benchmarks (run them with ``python -m``; each has ``--help``):

- ``ferry.bench.call_overhead``: end-to-end D2H from Python (1, 256, 4096 tensors) against the raw copy and
  PyTorch, and the call overhead for one small tensor.
- ``ferry.bench.overlap``: SPDL's transfer/compute overlap experiment, ferry against PyTorch ``to(cpu)`` beside a
  worker that transfers nothing (the harness floor).
- ``ferry.bench.plot``: PNG plots from the benchmarks' CSV files (Python and the C ``ferry bench`` ones).
"""
