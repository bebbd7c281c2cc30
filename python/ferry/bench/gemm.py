"""Device time of ferry's GEMMs against torch's (cuBLAS / cuBLASLt) on the same operands, every input family.

For each family and shape: ferry's first operator for the arguments (what ferry.ops.get_operators ranks first) and
torch's own GEMM for the same problem — torch.mm for bf16 and fp16, torch._scaled_mm for FP8 (e4m3 × e4m3 with
per-tensor scales on the device, bf16 out), torch._int_mm for int8 (int32 out) — with A m×k row-major and B given as
w.t() of a row-major n×k weight (k contiguous, as the 8-bit GEMMs need it; the same layout for every family, so the
rows compare). Each figure is the median over --repeats of --launches back-to-back launches timed with CUDA events,
the two methods alternating within each repeat. Shapes: N³ for each --size, and the LLM decode step --decode
(M×N×K, default 16×8192×8192). torch._int_mm takes no m of 16 or less: that row has no torch figure.

ratio = torch's time / ferry's time (throughput against torch's; the issue's targets: bf16/fp16 >= 0.95, FP8 and
int8 >= 0.90, the decode step >= 0.9). Writes a CSV (--output) and prints the table. Without CUDA or torch it says
so and exits 0.

Usage::

    python -m ferry.bench.gemm --output gemm.csv
"""

import argparse
import csv
import statistics
import sys
from datetime import datetime, timezone

from ferry.bench._cli import cuda_device, default_device, positive_int
from ferry.bench._gpu import torch_cuda_device

FAMILIES = ("bf16", "fp16", "fp8", "int8")
FIELDS = ["created_utc", "device_name", "torch_version", "ferry_version", "family", "m", "n", "k", "ferry_operator",
          "ferry_us", "torch_us", "ratio", "ferry_tflops", "max_rel_diff"]


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m ferry.bench.gemm", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES),
                   help="Comma-separated subset of %(default)s.")
    p.add_argument("--size", type=positive_int, action="append",
                   help="N of an N³ problem; repeatable (default: 4096 and 8192).")
    p.add_argument("--decode", default="16,8192,8192", help="M,N,K of the decode-step row ('' for none; "
                   "default %(default)s).")
    p.add_argument("--launches", type=positive_int, default=20, help="Launches per timing (default %(default)s).")
    p.add_argument("--repeats", type=positive_int, default=7, help="Timings per method (default %(default)s).")
    p.add_argument("--device", type=cuda_device, default=default_device(),
                   help="CUDA device (default: LOCAL_RANK, else cuda:0).")
    p.add_argument("--output", help="CSV file to write.")
    args = p.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        p.error(f"--families: {', '.join(bad) or 'none given'}; choose from {', '.join(FAMILIES)}")
    args.families = families
    shapes = [(s, s, s) for s in (args.size or [4096, 8192])]
    if args.decode:
        try:
            m, n, k = (int(v) for v in args.decode.split(","))
        except ValueError:
            p.error(f"--decode {args.decode!r}: expected M,N,K")
        if min(m, n, k) <= 0:
            p.error("--decode: sizes must be positive")
        shapes.append((m, n, k))
    args.shapes = shapes
    return args


def _operands(torch, family, m, n, k, device):
    """(GemmArguments keyword arguments, torch's call) for one family and shape; values in [-1, 1) (int8: all)."""
    g = torch.Generator(device=device).manual_seed(m * 31 + n * 7 + k)
    if family == "int8":
        x = torch.randint(-128, 128, (m, k), generator=g, device=device, dtype=torch.int8)
        w = torch.randint(-128, 128, (n, k), generator=g, device=device, dtype=torch.int8)
        out = torch.empty((m, n), device=device, dtype=torch.int32)
        theirs = (lambda: torch._int_mm(x, w.t())) if m > 16 else None
        return dict(A=x, B=w.t(), out=out), theirs
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float32}[family]
    x = torch.rand((m, k), generator=g, device=device, dtype=dtype) * 2 - 1
    w = torch.rand((n, k), generator=g, device=device, dtype=dtype) * 2 - 1
    if family == "fp8":
        x, w = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        sa, sb = torch.tensor(0.5, device=device), torch.tensor(2.0, device=device)
        out = torch.empty((m, n), device=device, dtype=torch.bfloat16)
        theirs = lambda: torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
        return dict(A=x, B=w.t(), out=out, scale_a=sa, scale_b=sb), theirs
    out = torch.empty((m, n), device=device, dtype=dtype)
    return dict(A=x, B=w.t(), out=out), lambda: torch.mm(x, w.t())


def _time_us(torch, fn, launches):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(launches):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1000.0 / launches


def main(argv=None):
    args = _parse(argv)
    found = torch_cuda_device("ferry.bench.gemm", args.device, "it times torch's GEMMs beside ferry's")
    if found is None:
        return 0
    torch, device = found
    import ferry
    import ferry.ops as ops

    torch.cuda.set_device(device)
    name = torch.cuda.get_device_name(device)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = []
    for family in args.families:
        if family == "fp8" and (torch.cuda.get_device_capability(device) < (8, 9) or
                                not hasattr(torch, "float8_e4m3fn")):
            print(f"fp8: skipped (needs sm_89 and torch's float8 types)", file=sys.stderr)
            continue
        for m, n, k in args.shapes:
            kw, theirs = _operands(torch, family, m, n, k, device)
            gemm_args = ops.GemmArguments(**kw)
            found_ops = ops.get_operators(gemm_args)
            if not found_ops:
                print(f"{family} {m}×{n}×{k}: no ferry operator supports it", file=sys.stderr)
                continue
            op = found_ops[0]
            art = op.compile(gemm_args)
            run = lambda: op.run(gemm_args, compiled_artifact=art, assume_supported_args=True)  # noqa: E731
            run()
            ours_out = kw["out"].clone()
            diff = float("nan")
            if theirs is not None:
                ref = theirs().double()
                diff = ((ours_out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            torch.cuda.synchronize()
            ferry_t, torch_t = [], []
            for _ in range(args.repeats):
                ferry_t.append(_time_us(torch, run, args.launches))
                if theirs is not None:
                    torch_t.append(_time_us(torch, theirs, args.launches))
            f_us = statistics.median(ferry_t)
            t_us = statistics.median(torch_t) if torch_t else float("nan")
            rows.append(dict(created_utc=created, device_name=name, torch_version=torch.__version__,
                             ferry_version=ferry.__version__, family=family, m=m, n=n, k=k, ferry_operator=op.name,
                             ferry_us=round(f_us, 2), torch_us=round(t_us, 2), ratio=round(t_us / f_us, 3),
                             ferry_tflops=round(2.0 * m * n * k / f_us / 1e6, 1), max_rel_diff=f"{diff:.2e}"))
    if args.output:
        with open(args.output, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
    print(f"{name}; median of {args.repeats} × {args.launches} launches; ratio = torch µs / ferry µs")
    print(f"{'family':6} {'M×N×K':>16} {'ferry µs':>10} {'torch µs':>10} {'ratio':>7} {'TFLOP/s':>8} {'rel diff':>9}"
          f"  ferry's operator")
    for r in rows:
        shape = f"{r['m']}×{r['n']}×{r['k']}"
        print(f"{r['family']:6} {shape:>16} {r['ferry_us']:>10} {r['torch_us']:>10} {r['ratio']:>7} "
              f"{r['ferry_tflops']:>8} {r['max_rel_diff']:>9}  {r['ferry_operator']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
