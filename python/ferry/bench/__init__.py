"""ferry's Python benchmarks (run them with ``python -m``; each has ``--help``):

- ``ferry.bench.call_overhead``: end-to-end D2H from Python (1, 256, 4096 tensors) against the raw copy and
  PyTorch, and the call overhead for one small tensor.
- ``ferry.bench.overlap``: SPDL's transfer/compute overlap experiment, ferry against PyTorch ``to(cpu)`` beside a
  worker that transfers nothing (the harness floor).
- ``ferry.bench.bandwidth``: D2H and H2D from Python on the C benchmark's grid of sizes and tensor counts, against
  PyTorch and the link's limit.
- ``ferry.bench.latency``: the operator runtime's host latency, the CUTLASS notebook's table from Python.
- ``ferry.bench.checkpoint``: staging model-shaped state dicts (GB-scale) to host memory, ferry and
  ``ferry.torch.Stager`` against PyTorch's loops and torch DCP's stagers, first call and steady, x the PCIe limit.
- ``ferry.bench.plot``: PNG plots from the benchmarks' CSV files (Python and the C ``ferry bench`` ones).
"""
