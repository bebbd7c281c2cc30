"""PNG plots from ferry's benchmark CSV files.

Reads any mix of (the kind of each file is recognised from its header):
  - overlap summaries (SPDL's schema, then ferry's columns): ``python -m ferry.bench.overlap --output`` and
    ``ferry bench overlap --output``: paired speedup bars with their 95% CIs, and overlap efficiency bars, per
    tensor count and method;
  - overlap raw samples (SPDL's samples schema): ``--samples-output`` of either overlap benchmark: the per-block
    distributions of speedup and overlap efficiency, per tensor count and method;
  - overlap diagnostics: ``python -m ferry.bench.overlap --diagnostics-output``: the medians of where a concurrent
    block spends its excess over compute-only, per tensor count and method;
  - bandwidth tables (direction, total_bytes, num_tensors, method, median_ms, gb_per_s, ratio_to_limit):
    ``ferry bench bandwidth --output`` (C) and ``python -m ferry.bench.bandwidth --output`` (Python, PyTorch).
    All bandwidth files of one call are drawn together: GB/s against tensor count, one panel per direction and
    payload size, one line per method (labelled with its file when two files have a method of the same name);
  - ``python -m ferry.bench.call_overhead --output``: its end-to-end rows, GB/s against tensor count;
  - ``python -m ferry.bench.checkpoint --output``: each method's steady and first-call time as a multiple of the
    PCIe limit, per state dict.
One PNG per plot in --out-dir, named after the CSV (the bandwidth plot of several files: bandwidth_combined.png).
A file that is not one of these (or is empty) is skipped with a message; the exit status is 0 unless no file could
be plotted at all.

Usage::

    python -m ferry.bench.plot overlap.csv bandwidth.csv py_bandwidth.csv call_overhead.csv --out-dir plots/
"""

import argparse
import csv
import os
import sys
from collections import defaultdict

# The overlap benches' harness floor: a worker that returns at once. Its transfer is the executor's round trip, so
# its speedup and efficiency mean nothing; the benches use it for their slowdown columns.
from ferry.bench.overlap import _METHOD_NOOP as HARNESS_FLOOR_METHOD

OVERLAP_COLUMNS = {"num_tensors", "method", "speedup_median", "speedup_ci_lower", "speedup_ci_upper",
                   "estimated_overlap_efficiency_median", "estimated_overlap_efficiency_ci_lower",
                   "estimated_overlap_efficiency_ci_upper", "total_bytes"}
SAMPLES_COLUMNS = {"total_bytes", "num_tensors", "method", "trial", "speedup", "estimated_overlap_efficiency",
                   "concurrent_ms", "compute_only_ms"}
DIAGNOSTICS_COLUMNS = {"total_bytes", "num_tensors", "method", "trial", "excess_ms", "handoff_ms", "fg_resume_ms",
                       "launch_excess_ms", "gpu_tail_excess_ms", "result_ms"}
BANDWIDTH_COLUMNS = {"direction", "total_bytes", "num_tensors", "method", "median_ms", "gb_per_s"}
CALL_OVERHEAD_COLUMNS = {"experiment", "total_bytes", "num_tensors", "method", "median_ms", "gb_per_s"}
CHECKPOINT_COLUMNS = {"state_dict", "total_bytes", "num_tensors", "method", "first_ms", "steady_ms",
                      "steady_to_limit", "first_to_limit"}


class NotAFerryCSV(ValueError):
    """A file whose header is none of ferry's benchmark schemas (or that has no rows)."""


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        columns = set(reader.fieldnames or [])
    return rows, columns


def kind_of(columns):
    if CHECKPOINT_COLUMNS <= columns:
        return "checkpoint"
    if OVERLAP_COLUMNS <= columns:
        return "overlap"
    if DIAGNOSTICS_COLUMNS <= columns:
        return "diagnostics"
    if SAMPLES_COLUMNS <= columns:
        return "samples"
    if CALL_OVERHEAD_COLUMNS <= columns:
        return "call_overhead"
    if BANDWIDTH_COLUMNS <= columns:
        return "bandwidth"
    return None


def _size_label(nbytes):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


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
    rows = [r for r in rows if r["method"] != HARNESS_FLOOR_METHOD]
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
        ax.set_xticklabels([f"{_size_label(total)}\n{count} tensor(s)" for total, count in groups])
        ax.set_ylabel(label)
        ax.set_title(f"D2H / compute overlap{_title_suffix(rows)} (median, 95% CI)")
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, f"{stem}_{'speedup' if metric == 'speedup' else 'efficiency'}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def plot_samples(rows, stem, out_dir):
    """Per-block distributions (box plots) of paired speedup and overlap efficiency, per (payload, tensor count),
    one box per method."""
    plt = _pyplot()
    rows = [r for r in rows if r["method"] != HARNESS_FLOOR_METHOD]
    groups = sorted({(int(r["total_bytes"]), int(r["num_tensors"])) for r in rows})
    methods = sorted({r["method"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 2.4 * len(groups) * len(methods)), 4.5), squeeze=False)
    for ax, (column, label, scale) in zip(axes[0], (("speedup", "paired speedup (serialized / concurrent)", 1.0),
                                                     ("estimated_overlap_efficiency", "overlap efficiency (%)",
                                                      100.0))):
        width = 0.8 / max(1, len(methods))
        for m_index, method in enumerate(methods):
            data, xs = [], []
            for g_index, group in enumerate(groups):
                values = [float(r[column]) * scale for r in rows
                          if (int(r["total_bytes"]), int(r["num_tensors"])) == group and r["method"] == method]
                if values:
                    data.append(values)
                    xs.append(g_index + (m_index - (len(methods) - 1) / 2) * width)
            if not data:
                continue
            parts = ax.boxplot(data, positions=xs, widths=width * 0.9, patch_artist=True, manage_ticks=False,
                               medianprops=dict(color="black"))
            color = f"C{m_index}"
            for box in parts["boxes"]:
                box.set_facecolor(color)
                box.set_alpha(0.5)
            ax.plot([], [], color=color, linewidth=6, alpha=0.5, label=method)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{_size_label(total)}\n{count} tensor(s)" for total, count in groups])
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("D2H / compute overlap, per-block distributions")
    fig.tight_layout()
    path = os.path.join(out_dir, f"{stem}_distributions.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


DIAGNOSTIC_PARTS = [("handoff_ms", "hand-off into the block (executor + barrier)"),
                    ("fg_resume_ms", "foreground resume after the barrier"),
                    ("launch_excess_ms", "launch phase, over compute-only"),
                    ("gpu_tail_excess_ms", "GPU tail, over compute-only"),
                    ("result_ms", "collecting the worker's result")]


def plot_diagnostics(rows, stem, out_dir):
    """Stacked medians of the parts of a concurrent block's excess over compute-only, with the measured median
    excess as a marker (medians do not add up exactly)."""
    plt = _pyplot()

    def median(values):
        values = sorted(float(v) for v in values if v not in (None, ""))
        if not values:
            return 0.0
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    keys = sorted({(int(r["num_tensors"]), r["method"]) for r in rows})
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(keys)), 4.5))
    bottoms_pos, bottoms_neg = [0.0] * len(keys), [0.0] * len(keys)
    for p_index, (column, label) in enumerate(DIAGNOSTIC_PARTS):
        heights = [median(r[column] for r in rows if (int(r["num_tensors"]), r["method"]) == k) for k in keys]
        bottoms = [bp if h >= 0 else bn for h, bp, bn in zip(heights, bottoms_pos, bottoms_neg)]
        ax.bar(range(len(keys)), heights, 0.6, bottom=bottoms, label=label, color=f"C{p_index}")
        for i, h in enumerate(heights):
            if h >= 0:
                bottoms_pos[i] += h
            else:
                bottoms_neg[i] += h
    excess = [median(r["excess_ms"] for r in rows if (int(r["num_tensors"]), r["method"]) == k) for k in keys]
    ax.plot(range(len(keys)), excess, "k_", markersize=28, markeredgewidth=2, label="concurrent - compute (median)")
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{n} tensor(s)\n{method}" for n, method in keys], fontsize=8)
    ax.set_ylabel("ms (medians over blocks)")
    ax.set_title("Where a concurrent block loses time against compute-only")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, f"{stem}_excess.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def plot_bandwidth_grid(sources, name, out_dir, title):
    """GB/s against tensor count from one or more bandwidth tables: a panel per (direction, payload size), rows
    by direction, a line per (file, method). `sources` is [(stem, rows)]."""
    plt = _pyplot()
    owners = defaultdict(set)
    for stem, rows in sources:
        for r in rows:
            owners[r["method"]].add(stem)
    series = defaultdict(lambda: defaultdict(list))  # (direction, bytes) -> label -> [(n, gb/s)]
    for stem, rows in sources:
        for r in rows:
            try:
                n, gbps, total = int(r["num_tensors"]), float(r["gb_per_s"]), int(r["total_bytes"])
            except (TypeError, ValueError):
                continue
            label = r["method"] if len(owners[r["method"]]) == 1 else f"{r['method']} [{stem}]"
            series[(r["direction"].lower(), total)][label].append((n, gbps))
    # Keep only curves: a method measured at one tensor count only (a cold-start row) is not a line.
    panels = {p: {m: sorted(v) for m, v in methods.items() if len({n for n, _ in v}) > 1}
              for p, methods in series.items()}
    panels = {p: m for p, m in panels.items() if m}
    if not panels:
        return []
    directions = sorted({d for d, _ in panels})
    sizes = sorted({b for _, b in panels})
    labels = sorted({m for methods in panels.values() for m in methods})
    colors = {m: f"C{i % 10}" for i, m in enumerate(labels)}
    fig, axes = plt.subplots(len(directions), len(sizes), figsize=(3.4 * len(sizes), 3.0 * len(directions) + 1.2),
                             squeeze=False)
    for row, direction in enumerate(directions):
        for col, size in enumerate(sizes):
            ax = axes[row][col]
            methods = panels.get((direction, size))
            if not methods:
                ax.set_visible(False)
                continue
            for method, points in sorted(methods.items()):
                ax.plot([n for n, _ in points], [g for _, g in points], marker="o", markersize=3, label=method,
                        color=colors[method])
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{direction.upper()}, {_size_label(size)}", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=7)
            if row == len(directions) - 1:
                ax.set_xlabel("tensors in the batch", fontsize=8)
            if col == 0:
                ax.set_ylabel("GB/s", fontsize=8)
    handles = [plt.Line2D([], [], color=colors[m], marker="o", markersize=3, label=m) for m in labels]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
    fig.suptitle(f"{title}{_title_suffix(sources[0][1])}")
    fig.tight_layout(rect=(0, 0.1 if len(labels) > 4 else 0.07, 1, 1))
    path = os.path.join(out_dir, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


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


def plot_checkpoint(rows, stem, out_dir):
    """Two panels, steady and first call, each method's time as a multiple of the limit (log scale), grouped by
    state dict."""
    plt = _pyplot()
    state_dicts = list(dict.fromkeys(r["state_dict"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by_key = {(r["state_dict"], r["method"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 2.2 * len(state_dicts) * 2), 4.8), sharey=True)
    width = 0.8 / max(1, len(methods))
    for ax, (column, title) in zip(axes, (("steady_to_limit", "steady"), ("first_to_limit", "first call"))):
        for m_index, method in enumerate(methods):
            xs, heights = [], []
            for s_index, sd in enumerate(state_dicts):
                r = by_key.get((sd, method))
                if r is not None:
                    xs.append(s_index + (m_index - (len(methods) - 1) / 2) * width)
                    heights.append(float(r[column]))
            ax.bar(xs, heights, width, label=method)
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")
        ax.set_xticks(range(len(state_dicts)))
        ax.set_xticklabels([f"{sd}\n{_size_label(int(by_key[(sd, methods[0])]['total_bytes']))}"
                            if (sd, methods[0]) in by_key else sd for sd in state_dicts], fontsize=8)
        ax.set_title(f"{title}: time / PCIe limit")
    axes[0].set_ylabel("x the limit (one raw copy), log scale")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"Staging state dicts to host memory{_title_suffix(rows)}")
    fig.tight_layout()
    path = os.path.join(out_dir, f"{stem}_checkpoint.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def plot_file(path, out_dir):
    """Plots one CSV on its own. Raises NotAFerryCSV for a file of no known schema or without rows."""
    rows, columns = read_csv(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    kind = kind_of(columns)
    if kind is None:
        raise NotAFerryCSV(f"{path}: not a ferry benchmark CSV (columns: {sorted(columns)})")
    if not rows:
        raise NotAFerryCSV(f"{path}: {kind} CSV without rows")
    if kind == "checkpoint":
        return plot_checkpoint(rows, stem, out_dir)
    if kind == "overlap":
        return plot_overlap(rows, stem, out_dir)
    if kind == "samples":
        return plot_samples(rows, stem, out_dir)
    if kind == "diagnostics":
        return plot_diagnostics(rows, stem, out_dir)
    if kind == "bandwidth":
        return plot_bandwidth_grid([(stem, rows)], f"{stem}_bandwidth", out_dir, "Bandwidth against tensor count")
    e2e = [r for r in rows if r["experiment"] == "e2e" and r["method"] in E2E_METHODS]
    return plot_bandwidth(e2e, stem, out_dir, lambda r: f"D2H from Python, {_size_label(int(r['total_bytes']))}",
                          "End-to-end D2H from Python")


E2E_METHODS = ("raw copy", "ferry", "ferry async", "torch to(cpu)")


def plot_files(paths, out_dir, log=None):
    """Plots every file; bandwidth tables together. Returns the PNG paths; skipped files are reported on `log`
    (stderr by default)."""
    log = log or sys.stderr
    written, bandwidth = [], []
    for path in paths:
        try:
            rows, columns = read_csv(path)
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            print(f"plot: {path}: skipped, cannot read it as CSV ({e})", file=log)
            continue
        if kind_of(columns) == "bandwidth" and rows:
            bandwidth.append((os.path.splitext(os.path.basename(path))[0], rows))
            continue
        try:
            written.extend(plot_file(path, out_dir))
        except NotAFerryCSV as e:
            print(f"plot: {e}; skipped", file=log)
    if len(bandwidth) == 1:
        stem = bandwidth[0][0]
        written.extend(plot_bandwidth_grid(bandwidth, f"{stem}_bandwidth", out_dir, "Bandwidth against tensor count"))
    elif bandwidth:
        written.extend(plot_bandwidth_grid(bandwidth, "bandwidth_combined", out_dir,
                                           "Bandwidth against tensor count (" +
                                           ", ".join(stem for stem, _ in bandwidth) + ")"))
    return written


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ferry.bench.plot",
                                description="PNG plots from ferry benchmark CSV files.")
    p.add_argument("csv", nargs="+", help="CSV files from ferry.bench.overlap / call_overhead / bandwidth / "
                                          "checkpoint or `ferry bench`; files of other kinds are skipped with a "
                                          "message.")
    p.add_argument("--out-dir", default=".", help="Directory for the PNG files (default: %(default)s).")
    args = p.parse_args(argv)
    try:
        _pyplot()
    except ImportError:
        print("plot: matplotlib is not installed (pip install matplotlib). Nothing to do.")
        return 0
    os.makedirs(args.out_dir, exist_ok=True)
    written = plot_files(args.csv, args.out_dir)
    for png in written:
        print(png)
    if not written:
        print("plot: no plot written (no ferry benchmark CSV among the files)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
