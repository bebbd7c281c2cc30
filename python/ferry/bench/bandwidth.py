"""Bandwidth of D2H and H2D from Python: ferry against PyTorch and the link's limit, on the grid of the C benchmark.

The Python half of the bandwidth comparison: ``ferry bench bandwidth`` (bench/bandwidth.c) measures ferry's
C API against the raw driver primitives; this program measures what a Python caller gets, with the same payload
sizes, tensor counts and CSV schema (direction, total_bytes, num_tensors, method, median_ms, gb_per_s,
ratio_to_limit), so ``python -m ferry.bench.plot`` draws both files together.

Methods, each timed end to end on the host (the call, its outputs created, the copies finished), medians of
``--repeats`` after two untimed calls:
  limit (1 raw copy)   one ``copy_`` of the whole payload between a device tensor and a preallocated pinned tensor
                       on a side stream, then synchronize: the link's limit in this run, the reference of every
                       ratio in the same (direction, size) cell;
  torch to(cpu) loop   SPDL's reference: ``[t.to("cpu", non_blocking=True) for t in tensors]`` on a side stream
                       that waits for the current stream, then synchronize (H2D: ``torch to(cuda) loop``, the same
                       with ``.to(device, non_blocking=True)`` from pinned host tensors);
  ferry python         ``ferry.transfer_tensor_d2h(tensors)`` / ``ferry.transfer_tensor_h2d(tensors)``.
The tensors are uint8 views of one buffer cut as the C benchmark and SPDL cut them (the first total mod N are
one byte longer); device bytes are random, the host buffer is pinned and holds the same bytes (H2D reads pinned
memory, as in the C benchmark). Every method's output is checked byte for byte in cells up to 64 MiB.

Grid: sizes 4K 64K 1M 16M 64M 256M 1G and counts 1 32 256 4096 16384 (counts that would make tensors under 4
bytes are skipped, as in C). ferry and the limit run the whole grid. PyTorch's loop costs microseconds per tensor
in Python whatever the size, so a torch cell is skipped when its second untimed call predicts more than
``--torch-budget-s`` (default 2.5 s) for the timed repeats; the skipped cells are listed at the end. On an H200
only the 16384-tensor cells come near it (~10 us per tensor for the loop: ~0.16 s per call, ~1.8 s for 11
repeats).

Usage::

    python -m ferry.bench.bandwidth --output py_bandwidth.csv
    python -m ferry.bench.plot bandwidth.csv py_bandwidth.csv --out-dir plots/

Without CUDA (or without torch) it says so and exits 0.
"""

import argparse
import os
import re
import statistics
import sys
import time
from ferry.bench._cli import cuda_device, default_device, non_negative_float, positive_int
from ferry.bench._gpu import torch_cuda_device

FIELDS = ["direction", "total_bytes", "num_tensors", "method", "median_ms", "gb_per_s", "ratio_to_limit"]
DEFAULT_SIZES = ["4K", "64K", "1M", "16M", "64M", "256M", "1G"]
DEFAULT_COUNTS = [1, 32, 256, 4096, 16384]
LIMIT, FERRY = "limit (1 raw copy)", "ferry python"
TORCH = {"d2h": "torch to(cpu) loop", "h2d": "torch to(cuda) loop"}
VALIDATE_UP_TO = 64 << 20
WARMUP = 2


def parse_size(text):
    """'4K', '64M', '1G' or a byte count -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", str(text), re.IGNORECASE)
    if not m or int(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a size like 4K, 64M, 1G; got {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m ferry.bench.bandwidth",
                                description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="py_bandwidth.csv", help="CSV output path (default: %(default)s).")
    p.add_argument("--device", type=cuda_device, default=default_device(),
                   help="CUDA device (default: LOCAL_RANK, else cuda:0).")
    p.add_argument("--sizes", type=parse_size, nargs="+", default=[parse_size(s) for s in DEFAULT_SIZES],
                   help="Payload sizes (default: " + " ".join(DEFAULT_SIZES) + ").")
    p.add_argument("--num-tensors", type=positive_int, nargs="+", default=DEFAULT_COUNTS,
                   help="Tensor counts (default: " + " ".join(map(str, DEFAULT_COUNTS)) + ").")
    p.add_argument("--repeats", type=positive_int, default=11, help="Timed calls per cell (median reported).")
    p.add_argument("--directions", nargs="+", choices=["d2h", "h2d"], default=["d2h", "h2d"],
                   help="Directions to measure (default: both).")
    p.add_argument("--torch-budget-s", type=non_negative_float, default=2.5,
                   help="Skip a PyTorch cell whose timed repeats are predicted to take longer (0: never skip).")
    return p.parse_args(argv)


def split_sizes(total, n):
    """SPDL's split of `total` bytes into n tensors: the first (total mod n) are one byte longer."""
    size, rest = divmod(total, n)
    return [size + (i < rest) for i in range(n)]


LAYOUTS = ("even", "mixed")


def layout_sizes(total, n, layout="even"):
    """Sizes of n nonempty tensors holding `total` bytes. even: split_sizes. mixed: one tensor of half the payload
    first, then n - 1 tensors splitting the rest as split_sizes does (a single tensor holds everything). Raises
    ValueError when the tensors cannot all be nonempty."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    if n > total:
        raise ValueError(f"Cannot split {total} bytes into {n} nonempty tensors.")
    if layout == "even" or n == 1:
        return split_sizes(total, n)
    big = total // 2
    if n - 1 > total - big:
        raise ValueError(f"Cannot split {total} bytes into one tensor of {big} bytes and {n - 1} nonempty tensors.")
    return [big] + split_sizes(total - big, n - 1)


def cells(sizes, counts):
    """(total_bytes, num_tensors) in grid order, without counts that make tensors under 4 bytes (as in C)."""
    return [(total, n) for total in sizes for n in counts if total // n >= 4]


def format_row(direction, total, n, method, median_ms, limit_ms):
    """A CSV row formatted as bench/bandwidth.c writes it."""
    gbps = total / (median_ms * 1e6) if median_ms > 0 else 0.0
    return dict(direction=direction, total_bytes=total, num_tensors=n, method=method, median_ms=f"{median_ms:.5f}",
                gb_per_s=f"{gbps:.3f}", ratio_to_limit=f"{median_ms / limit_ms:.4f}")


def _timed(fn, repeats, sync, budget_s=0.0, check=None):
    """Median wall ms of fn() (each call after a device synchronize; its result dropped after the clock stops),
    after WARMUP untimed calls; `check` sees the first call's result. None when the second untimed call predicts
    more than budget_s for the timed calls (budget_s 0: never)."""
    elapsed = 0.0
    for w in range(WARMUP):
        sync()
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
        if w == 0 and check is not None:
            check(out)
        del out
    if budget_s > 0 and elapsed * repeats > budget_s:
        return None
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter_ns()
        out = fn()
        end = time.perf_counter_ns()
        del out
        samples.append((end - start) / 1e6)
    return statistics.median(samples)


def main(argv=None):
    args = _parse_args(argv)
    found = torch_cuda_device("bandwidth", args.device, "this benchmark compares against PyTorch")
    if found is None:
        return 0
    torch, device = found
    import ferry

    torch.cuda.set_device(device)
    sync = torch.cuda.synchronize
    grid = cells(args.sizes, args.num_tensors)
    largest = max(total for total, _ in grid)
    name = torch.cuda.get_device_name(device)
    print(f"bandwidth from Python on {name}: sizes {args.sizes}, counts {args.num_tensors}, "
          f"{args.repeats} repeats", file=sys.stderr)

    # One random device buffer, the same bytes in one pinned host buffer, and a device target for the H2D limit.
    source = torch.randint(0, 256, (largest,), dtype=torch.uint8, device=device)
    pinned = torch.empty(largest, dtype=torch.uint8, pin_memory=True)
    pinned.copy_(source)
    target = torch.empty_like(source)
    side = torch.cuda.Stream(device)

    def on_side(work):
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            out = work()
        side.synchronize()
        return out

    rows, skipped = [], []
    for direction in args.directions:
        h2d = direction == "h2d"
        for total, n in grid:
            print(f"  {direction.upper()} {total} bytes in {n} tensors", file=sys.stderr)
            sizes = split_sizes(total, n)
            inputs = list((pinned if h2d else source)[:total].split(sizes))

            def check(out, n=n, total=total):
                """The output holds the source bytes (the device buffer; the pinned one is a copy of it)."""
                if total > VALIDATE_UP_TO:
                    return
                parts = [out] if isinstance(out, torch.Tensor) else out
                if len(parts) not in (1, n):
                    raise RuntimeError(f"{direction} {total} bytes in {n} tensors: {len(parts)} outputs")
                flat = torch.cat([p.reshape(-1).to(device) for p in parts])
                if flat.numel() != total or not torch.equal(flat, source[:total]):
                    raise RuntimeError(f"{direction} {total} bytes in {n} tensors: wrong bytes")

            if h2d:
                limit = lambda: on_side(lambda: target[:total].copy_(pinned[:total], non_blocking=True))
                loop = lambda: on_side(lambda: [t.to(device, non_blocking=True) for t in inputs])
                with_ferry = lambda: ferry.transfer_tensor_h2d(inputs, device=device)
            else:
                limit = lambda: on_side(lambda: pinned[:total].copy_(source[:total], non_blocking=True))
                loop = lambda: on_side(lambda: [t.to("cpu", non_blocking=True) for t in inputs])
                with_ferry = lambda: ferry.transfer_tensor_d2h(inputs, device=device)
            limit_ms = _timed(limit, args.repeats, sync, check=check)
            measured = [(LIMIT, limit_ms)]
            torch_ms = _timed(loop, args.repeats, sync, args.torch_budget_s, check=check)
            if torch_ms is None:
                skipped.append((direction, total, n))
            else:
                measured.append((TORCH[direction], torch_ms))
            measured.append((FERRY, _timed(with_ferry, args.repeats, sync, check=check)))
            for method, ms in measured:
                rows.append(format_row(direction, total, n, method, ms, limit_ms))
            del inputs

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8", newline="") as f:
        f.write(",".join(FIELDS) + "\n")
        for r in rows:
            f.write(",".join(str(r[k]) for k in FIELDS) + "\n")
    _print_table(rows, skipped, args)
    print(f"\nCSV: {args.output}")
    return 0


def _print_table(rows, skipped, args):
    print(f"\n{'dir':<4} {'bytes':>10} {'tensors':>8} {'method':<20} {'median_ms':>10} {'GB/s':>9} {'x limit':>9}")
    for r in rows:
        print(f"{r['direction'].upper():<4} {r['total_bytes']:>10} {r['num_tensors']:>8} {r['method']:<20} "
              f"{float(r['median_ms']):10.4f} {float(r['gb_per_s']):9.2f} {float(r['ratio_to_limit']):9.3f}")
    if skipped:
        cells_text = ", ".join(f"{d.upper()} {t} B x {n}" for d, t, n in skipped)
        print(f"PyTorch cells skipped (predicted over {args.torch_budget_s:g} s for {args.repeats} repeats): "
              f"{cells_text}")


if __name__ == "__main__":
    sys.exit(main())
