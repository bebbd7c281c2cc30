#!/usr/bin/env python3
"""results_tables.py — turns benchmark CSV files into the markdown tables of docs/results.md, so every figure there
is read from a CSV file, not typed.

usage: python3 tools/results_tables.py FILE.csv... > tables.md
       python3 tools/results_tables.py docs/data/*.csv

The kind of each file is recognised from its header, as ferry.bench.plot does:
  - overlap summaries (`ferry bench overlap --output`, `python -m ferry.bench.overlap --output`);
  - bandwidth tables (`ferry bench bandwidth --output`, `python -m ferry.bench.bandwidth --output`), printed for
    64 MiB and 1 GiB (every payload of a file that has neither), with the cold-start rows when the file has them;
  - checkpoint staging (`python -m ferry.bench.checkpoint --output`): per state dict and method, first call and
    steady time against the limit, and the pinned memory held;
  - per-block files (overlap --samples-output, --diagnostics-output: a `trial` column) are skipped: they are
    drawn by ferry.bench.plot, not tabulated;
  - anything else with a header (call overhead, operator latency, ranks): every column, as written.
Each table is titled with its file's name. Standard library only.
"""
import csv
import os
import sys

OVERLAP_COLUMNS = {"num_tensors", "method", "compute_median_ms", "transfer_median_ms", "speedup_median",
                   "estimated_overlap_efficiency_median"}
BANDWIDTH_COLUMNS = {"direction", "total_bytes", "num_tensors", "method", "median_ms", "ratio_to_limit"}
CHECKPOINT_COLUMNS = {"state_dict", "method", "first_ms", "steady_ms", "steady_to_limit", "pinned_bytes_held"}
COLD_START = ("cold first call", "reserve", "first call after reserve", "steady")
MIB = 1 << 20


def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def table(header, body):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    return "\n".join(out)


def overlap(data, title):
    body = []
    for r in sorted(data, key=lambda r: (int(r["num_tensors"]), r["method"])):
        f = lambda k: float(r[k])
        body.append([r["num_tensors"], r["method"], f"{f('compute_median_ms'):.3f}", f"{f('transfer_median_ms'):.3f}",
                     f"{f('serialized_median_ms'):.3f}", f"{f('concurrent_median_ms'):.3f}",
                     f"{f('speedup_median'):.3f}x [{f('speedup_ci_lower'):.3f}, {f('speedup_ci_upper'):.3f}]",
                     f"{100 * f('estimated_overlap_efficiency_median'):.1f}% "
                     f"[{100 * f('estimated_overlap_efficiency_ci_lower'):.1f}, "
                     f"{100 * f('estimated_overlap_efficiency_ci_upper'):.1f}]",
                     f"{f('cpu_launch_skew_p95_ms'):.3f}"])
    r0 = data[0]
    head = (f"**{title}** — {r0['device_name']}, {r0['num_runs']} blocks after {r0['num_warmup']} warm-up, "
            f"{int(r0['total_bytes']) >> 20} MiB uint8, {r0['matrix_size']}² fp32 GEMM x {r0['compute_iterations']} "
            f"(target {r0['compute_target_ms']} ms), torch {r0['torch_version']}, CUDA {r0['cuda_version']}\n\n")
    return head + table(["tensors", "method", "compute ms", "transfer ms", "serialized ms", "concurrent ms",
                         "speedup (95% CI)", "overlap (95% CI)", "skew p95 ms"], body)


def bandwidth(data, title, sizes=(64 * MIB, 1024 * MIB)):
    by = {}
    for r in data:
        by.setdefault((r["direction"], int(r["total_bytes"]), int(r["num_tensors"])), {})[r["method"]] = r
    methods = []
    for r in data:
        if r["method"] not in methods and r["method"] not in COLD_START and r["ratio_to_limit"] != "":
            methods.append(r["method"])
    if not any(b in sizes for _, b, _ in by):
        sizes = {b for _, b, _ in by}
    body = []
    for (d, b, n), m in sorted(by.items()):
        if b not in sizes or methods[0] not in m:
            continue
        body.append([d.upper(), f"{b >> 20} MiB", n] +
                    [f"{float(m[k]['median_ms']):.3f} ({float(m[k]['ratio_to_limit']):.3f}x)" if k in m and
                     m[k]["ratio_to_limit"] != "" else "—" for k in methods])
    text = f"**{title}** — median ms (ratio to the limit of the same run)\n\n" + table(
        ["dir", "payload", "tensors"] + methods, body)
    starts = [r for r in data if r["method"] in COLD_START]
    if starts:
        text += "\n\nCold start, D2H of a fresh 96 MiB:\n\n" + table(
            ["case", "ms", "ratio to steady"], [[r["method"], r["median_ms"], r["ratio_to_limit"] or "—"] for r in starts])
    return text


def checkpoint(data, title):
    body = []
    for r in data:
        f = lambda k: float(r[k])
        body.append([r["state_dict"], r["num_tensors"], f"{int(r['total_bytes']) / 1e9:.2f}", r["method"],
                     f"{f('first_ms'):.1f} ({f('first_to_limit'):.2f}x)",
                     f"{f('steady_ms'):.2f} ({f('steady_to_limit'):.3f}x)",
                     f"{f('first_ms') / f('steady_ms'):.2f}", f"{int(r['pinned_bytes_held']) / 1e9:.2f}"])
    return (f"**{title}** — {data[0]['device_name']}; ms (ratio to the limit of the same run)\n\n" +
            table(["state dict", "tensors", "GB", "method", "first call", "steady", "first / steady",
                   "pinned GB held"], body))


def generic(data, title):
    return f"**{title}**\n\n" + table(list(data[0].keys()), [list(r.values()) for r in data])


def tables(path):
    data = rows(path)
    if not data:
        return None
    title = os.path.basename(path)
    columns = set(data[0].keys())
    if "trial" in columns:
        return None
    if OVERLAP_COLUMNS <= columns:
        return overlap(data, title)
    if BANDWIDTH_COLUMNS <= columns:
        return bandwidth(data, title)
    if CHECKPOINT_COLUMNS <= columns:
        return checkpoint(data, title)
    return generic(data, title)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    unreadable = [p for p in argv if not os.path.isfile(p)]
    if unreadable:
        print(f"results_tables.py: not a readable file: {', '.join(unreadable)} (see --help)", file=sys.stderr)
        return 2
    out = []
    for path in argv:
        text = tables(path)
        if text is None:
            print(f"results_tables.py: {path}: no rows, or per-block samples; skipped", file=sys.stderr)
        else:
            out.append(text)
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
