"""PNG plots from ferry's benchmark CSV files.

Reads any mix of:
  - overlap summaries (the seed's schema): ``python -m ferry.bench.overlap --output`` and ``ferry bench overlap
    --output``: paired speedup bars with their 95% CIs, and overlap efficiency bars, per tensor count and method;
  - bandwidth tables: ``ferry bench bandwidth --output`` (direction, total_bytes, num_tensors, method, median_ms,
    gb_per_s, ratio_to_limit): GB/s against tensor count, one line per method, one panel per direction;
  - ``python -m ferry.bench.call_overhead --output``: its end-to-end rows, GB/s against tensor count.
The kind of each file is recognised from its header. One PNG per plot, named after the CSV, in --out-dir.

Usage::

    python -m ferry.bench.plot overlap.csv bandwidth.csv call_overhead.csv --out-dir plots/
"""

import argparse
import csv
import os
import sys
from collections import defaultdict

OVERLAP_COLUMNS = {"num_tensors", "method", "speedup_median", "speedup_ci_lower", "speedup_ci_upper",
                   "estimated_overlap_efficiency_median", "estimated_overlap_efficiency_ci_lower",
                   "estimated_overlap_efficiency_ci_upper", "total_bytes"}
BANDWIDTH_COLUMNS = {"direction", "total_bytes", "num_tensors", "method", "median_ms", "gb_per_s"}
CALL_OVERHEAD_COLUMNS = {"experiment", "total_bytes", "num_tensors", "method", "median_ms", "gb_per_s"}


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return rows, set(rows[0]) if rows else set()


def kind_of(columns):
    if OVERLAP_COLUMNS <= columns:
        return "overlap"
    if CALL_OVERHEAD_COLUMNS <= columns:
        return "call_overhead"
    if BANDWIDTH_COLUMNS <= columns:
        return "bandwidth"
    return None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title_suffix(rows):
    name = rows[0].get("device_name") if rows else None
    return f" — {name}" if name else ""


def plot_overlap(rows, stem, out_dir):
    """Speedup and efficiency bars, grouped by (payload, tensor count), one bar per method, with CI whiskers."""
    plt = _pyplot()
    groups = sorted({(int(r["total_bytes"]), int(r["num_tensors"])) for r in rows})
    methods = sorted({r["method"] for r in rows})
    by_key = {(int(r["total_bytes"]), int(r["num_tensors"]), r["method"]): r for r in rows}
    written = []
    for metric, label, scale, ref in (("speedup", "paired speedup (serialized / concurrent)", 1.0, 1.0),
                                      ("estimated_overlap_efficiency", "estimated overlap efficiency (%)", 100.0,
                                       None)):
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) * len(methods)), 4.5))
        width = 0.8 / max(1, len(methods))
        for m_index, method in enumerate(methods):
            xs, heights, lows, highs = [], [], [], []
            for g_index, (total, count) in enumerate(groups):
                r = by_key.get((total, count, method))
                if r is None:
                    continue
                median = float(r[f"{metric}_median"]) * scale
                xs.append(g_index + (m_index - (len(methods) - 1) / 2) * width)
                heights.append(median)
                lows.append(median - float(r[f"{metric}_ci_lower"]) * scale)
                highs.append(float(r[f"{metric}_ci_upper"]) * scale - median)
            ax.bar(xs, heights, width, yerr=[lows, highs], capsize=3, label=method)
        if ref is not None:
            ax.axhline(ref, color="gray", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{total >> 20} MiB\n{count} tensor(s)" for total, count in groups])
        ax.set_ylabel(label)
        ax.set_title(f"D2H / compute overlap{_title_suffix(rows)} (median, 95% CI)")
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, f"{stem}_{'speedup' if metric == 'speedup' else 'efficiency'}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def plot_bandwidth(rows, stem, out_dir, panel_key, title):
    """GB/s against tensor count, one line per method, one panel per value of panel_key (direction...)."""
    plt = _pyplot()
    series = defaultdict(lambda: defaultdict(list))  # panel -> method -> [(n, gb/s)]
    for r in rows:
        try:
            n, gbps = int(r["num_tensors"]), float(r["gb_per_s"])
        except (TypeError, ValueError):
            continue
        series[panel_key(r)][r["method"]].append((n, gbps))
    # Keep only curves: a method measured at one tensor count only (a cold-start row) is not a line.
    panels = {p: {m: sorted(v) for m, v in methods.items() if len({n for n, _ in v}) > 1}
              for p, methods in series.items()}
    panels = {p: m for p, m in panels.items() if m}
    if not panels:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (panel, methods) in zip(axes[0], sorted(panels.items())):
        for method, points in sorted(methods.items()):
            ax.plot([n for n, _ in points], [g for _, g in points], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tensors in the batch")
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.set_title(panel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}{_title_suffix(rows)}")
    fig.tight_layout()
    path = os.path.join(out_dir, f"{stem}_bandwidth.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def plot_file(path, out_dir):
    rows, columns = read_csv(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    kind = kind_of(columns)
    if kind == "overlap":
        return plot_overlap(rows, stem, out_dir)
    if kind == "bandwidth":
        return plot_bandwidth(rows, stem, out_dir,
                              lambda r: f"{r['direction'].upper()}, {int(r['total_bytes']) >> 20} MiB total",
                              "Bandwidth against tensor count")
    if kind == "call_overhead":
        e2e = [r for r in rows if r["experiment"] == "e2e" and r["method"] not in ("ferry submit", "ferry wait")]
        return plot_bandwidth(e2e, stem, out_dir, lambda r: f"D2H from Python, {int(r['total_bytes']) >> 20} MiB",
                              "End-to-end D2H from Python")
    raise ValueError(f"{path}: not a ferry benchmark CSV (columns: {sorted(columns)})")


def main(argv=None):
    p = argparse.ArgumentParser(description="PNG plots from ferry benchmark CSV files.")
    p.add_argument("csv", nargs="+", help="CSV files from ferry.bench.overlap / call_overhead or `ferry bench`.")
    p.add_argument("--out-dir", default=".", help="Directory for the PNG files (default: %(default)s).")
    args = p.parse_args(argv)
    try:
        _pyplot()
    except ImportError:
        print("plot: matplotlib is not installed (pip install matplotlib). Nothing to do.")
        return 0
    os.makedirs(args.out_dir, exist_ok=True)
    for path in args.csv:
        for png in plot_file(path, args.out_dir):
            print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
