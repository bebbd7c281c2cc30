#!/usr/bin/env python3
"""results_tables.py — turns a results directory of tools/h200_suite.sh into the markdown tables of
docs/results.md, so every figure there is read from a run's CSV files, not typed.

usage: python3 tools/results_tables.py RESULTS_DIR > tables.md
Reads whichever of these exist: overlap.csv, overlap_1ms.csv, py_overlap.csv, py_overlap_1ms.csv (the seed's
summary schema), bandwidth.csv (C) and py_bandwidth.csv (Python), py_call_overhead.csv, latency.csv (C operators),
py_latency.csv (Python operators), ranks.csv. Standard library only.
"""
import csv
import os
import sys


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table(header, body):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    return "\n".join(out)


def overlap(path, title):
    body = []
    for r in sorted(rows(path), key=lambda r: (int(r["num_tensors"]), r["method"])):
        f = lambda k: float(r[k])
        body.append([r["num_tensors"], r["method"], f"{f('compute_median_ms'):.3f}", f"{f('transfer_median_ms'):.3f}",
                     f"{f('serialized_median_ms'):.3f}", f"{f('concurrent_median_ms'):.3f}",
                     f"{f('speedup_median'):.3f}x [{f('speedup_ci_lower'):.3f}, {f('speedup_ci_upper'):.3f}]",
                     f"{100 * f('estimated_overlap_efficiency_median'):.1f}% [{100 * f('estimated_overlap_efficiency_ci_lower'):.1f}, "
                     f"{100 * f('estimated_overlap_efficiency_ci_upper'):.1f}]",
                     f"{f('cpu_launch_skew_p95_ms'):.3f}"])
    r0 = rows(path)[0]
    head = (f"**{title}** — {r0['device_name']}, {r0['num_runs']} blocks after {r0['num_warmup']} warm-up, "
            f"{int(r0['total_bytes']) >> 20} MiB uint8, {r0['matrix_size']}² fp32 GEMM x {r0['compute_iterations']} "
            f"(target {r0['compute_target_ms']} ms), torch {r0['torch_version']}, CUDA {r0['cuda_version']}\n\n")
    return head + table(["tensors", "method", "compute ms", "transfer ms", "serialized ms", "concurrent ms",
                         "speedup (95% CI)", "overlap (95% CI)", "skew p95 ms"], body)


def bandwidth(path, title, sizes=None):
    data = rows(path)
    by = {}
    for r in data:
        by.setdefault((r["direction"], int(r["total_bytes"]), int(r["num_tensors"])), {})[r["method"]] = r
    cold = ("cold first call", "reserve", "first call after reserve", "steady")
    methods = []
    for r in data:
        if r["method"] not in methods and r["method"] not in cold and r["ratio_to_limit"] != "":
            methods.append(r["method"])
    body = []
    for (d, b, n), m in sorted(by.items()):
        if sizes and b not in sizes:
            continue
        if not all(k in m for k in methods[:1]):
            continue
        body.append([d.upper(), f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB", n] +
                    [f"{float(m[k]['median_ms']):.3f} ({float(m[k]['ratio_to_limit']):.3f}x)" if k in m and
                     m[k]["ratio_to_limit"] != "" else "—" for k in methods])
    text = f"**{title}** — median ms (ratio to the limit of the same run)\n\n" + table(["dir", "payload", "tensors"] + methods, body)
    starts = [r for r in data if r["method"] in cold]
    if starts and sizes:
        text += "\n\nCold start, D2H of a fresh 96 MiB:\n\n" + table(
            ["case", "ms", "ratio to steady"], [[r["method"], r["median_ms"], r["ratio_to_limit"] or "—"] for r in starts])
    return text


def generic(path, title):
    data = rows(path)
    return f"**{title}**\n\n" + table(list(data[0].keys()), [list(r.values()) for r in data])


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    d = sys.argv[1]
    out = []
    for name, title in [("overlap.csv", "C, compute 8 ms"), ("overlap_1ms.csv", "C, compute 1 ms"),
                        ("py_overlap.csv", "Python, compute 8 ms"), ("py_overlap_1ms.csv", "Python, compute 1 ms")]:
        if os.path.exists(os.path.join(d, name)):
            out.append(overlap(os.path.join(d, name), f"Overlap, {title}"))
    mib = 1 << 20
    if os.path.exists(os.path.join(d, "bandwidth.csv")):
        out.append(bandwidth(os.path.join(d, "bandwidth.csv"), "Bandwidth (C), 64 MiB and 1 GiB", {64 * mib, 1024 * mib}))
        out.append(bandwidth(os.path.join(d, "bandwidth.csv"), "Bandwidth (C), all sizes"))
    if os.path.exists(os.path.join(d, "py_bandwidth.csv")):
        out.append(bandwidth(os.path.join(d, "py_bandwidth.csv"), "Bandwidth (Python, with PyTorch)"))
    for name, title in [("py_call_overhead.csv", "Python call overhead"), ("latency.csv", "Operator host latency (C)"),
                        ("py_latency.csv", "Operator host latency (Python)"), ("ranks.csv", "Ranks (torchrun)")]:
        if os.path.exists(os.path.join(d, name)):
            out.append(generic(os.path.join(d, name), title))
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
