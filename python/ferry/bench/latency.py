"""Host latency of ferry.ops from Python: the CUTLASS Operator API notebook's table, reproduced.

The notebook's experiment: M=N=K=128, L=1, fp16 operands and output, fp32 accumulation, a different operand set
for every iteration (warm-up + profiled iterations, at most 110 sets), warm-up then 100 profiled iterations. Every
figure is the median over --repeats repeats, the methods interleaved within each repeat. Host figures are the time
of the calling loop divided by its iterations (the launches queue up on the GPU; the stream is synchronised outside
the timed loop); the notebook's own way, loop + final synchronisation, is in the CSV as *_e2e.

Columns:
  - ferry: the Python call (op.run, the fast launcher, GemmArguments, ...), from a plain Python loop;
  - raw: the limit, measured in this process in the same run: raw cuLaunchKernel of exactly the launch ferry makes
    (same CUfunction from the same artifact, grid, block, shared memory and parameter bytes, read back from a
    captured run), parameters built in advance, in a C loop (ferry._ferry._ops._raw_launch_time, which only the
    repository's own builds have: a wheel's run leaves these rows empty);
  - torch eager / torch graph: torch.mm(A, B, out=out) on the same operands, and 20 of them in a torch CUDA graph;
  - CUTLASS: the notebook's published figures (Python + CUTLASS DSL, TVM-FFI on, its own machine).
Rows: run without an artifact (ferry: memo hit) and with one; supports check on and bypassed; the fast call form
(op.launcher) both ways; the supports check alone; GemmArguments construction; 20 launches eager, as a torch CUDA
graph of op.run (the notebook's code), and as a ferry.ops.Graph; first compile (cold: a fresh XDG_CACHE_HOME and
an empty memo), disk-cache load, memo hit, CompiledArtifact.load. The same GEMM from other callers: through
TVM-FFI (ferry.tvm_ffi), through torch.ops.ferry.gemm_out eagerly and in torch.compile(fullgraph=True), and 20
ferry::gemm in torch.compile(mode="reduce-overhead"), with the operands marked static (read in place, as a
ferry.ops.Graph reads them) and not (copied into the graph's buffers each replay). For reference, what the callers
cost without ferry: TVM-FFI's call of its empty testing.nop with the same operands, and 20 torch.mm under
reduce-overhead. Targets: fast call form with checks bypassed <= raw + 1.0 us;
with the supports check <= that + 0.3 us; GemmArguments <= 3 us; TVM-FFI <= raw + 1.0 us; the torch op eagerly
<= torch.mm; 20 under reduce-overhead with static inputs <= 1.1 x the ferry.ops.Graph replay.

Writes a CSV (--output), a PNG of the table (--plot; needs matplotlib), and prints the table last. Without CUDA or
torch it says so and exits 0.

Usage::

    python -m ferry.bench.latency --output py_latency.csv --plot py_latency.png
"""

import argparse
import csv
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from ferry.bench._cli import cuda_device, default_device, positive_int
from ferry.bench._gpu import torch_cuda_device

SCHEMA_VERSION = 1
SETS = 110
GRAPH_RUNS = 20
FIELDS = ["schema_version", "created_utc", "device_name", "torch_version", "ferry_version", "operator", "metric",
          "unit", "ferry", "raw", "torch_eager", "torch_graph", "cutlass_notebook", "target", "met", "ferry_e2e",
          "raw_e2e", "torch_e2e", "repeats"]

# The notebook's published figures, in the unit of each row.
CUTLASS = {
    "run_noart_checked": 1.474e6,   # "Without compiled artifact": JIT-compiles on every call
    "run_art_checked": 24.18,       # "With supports check"
    "run_art_assume": 6.518,        # "Bypass supports check"
    "launcher_assume": 5.984,       # "[TVM-FFI ON] Launch host overhead"
    "supports": 24.18 - 6.518,      # the difference of the two rows above
    "args": 159.5,                  # "[TVM-FFI ON] Create args"
    "eager20": 749.6,               # "20 launches without CUDA Graph"
    "torchgraph20": 197.2,          # "20 launches with CUDA Graph"
    "compile_cold": 1469.0,         # "[TVM-FFI ON] Compile operator", ms
}

ROWS = [  # key, label, unit
    ("run_noart_checked", "op.run, no artifact (memo), supports check", "us"),
    ("run_noart_assume", "op.run, no artifact (memo), check bypassed", "us"),
    ("run_art_checked", "op.run, artifact, supports check", "us"),
    ("run_art_assume", "op.run, artifact, check bypassed", "us"),
    ("run_art_assume_none", "op.run, artifact, bypassed, stream=None", "us"),
    ("launcher_assume", "fast call form (launcher), check bypassed", "us"),
    ("launcher_checked", "fast call form (launcher), supports check", "us"),
    ("tvm_ffi", "through TVM-FFI (ferry.tvm_ffi gemm, tvm_ffi's call)", "us"),
    ("tvm_ffi_nop", "TVM-FFI's own call of an empty function, testing.nop(A, B, out)", "us"),
    ("torch_op", "torch.ops.ferry.gemm_out, eager", "us"),
    ("torch_op_compiled", "torch.ops.ferry.gemm_out in torch.compile(fullgraph=True)", "us"),
    ("supports", "op.supports(args) alone", "us"),
    ("args", "GemmArguments(...) construction", "us"),
    ("eager20", "20 launches, no graph, + sync", "us"),
    ("torchgraph20", "20 launches, torch.cuda.graph of op.run, replay + sync", "us"),
    ("ferrygraph20", "20 launches, ferry.ops.Graph, replay + sync", "us"),
    ("torch_op_ro20", "20 launches, torch.compile reduce-overhead of ferry::gemm, static inputs, + sync", "us"),
    ("torch_op_ro20_copied", "20 launches, torch.compile reduce-overhead of ferry::gemm, inputs copied, + sync", "us"),
    ("torch_mm_ro20", "20 launches, torch.compile reduce-overhead of torch.mm, static inputs, + sync", "us"),
    ("compile_cold", "compile, cold (NVRTC, fresh cache)", "ms"),
    ("compile_disk", "compile, disk cache hit (memo cleared)", "us"),
    ("compile_memo", "compile, memo hit", "us"),
    ("artifact_load", "CompiledArtifact.load(path)", "us"),
]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m ferry.bench.latency",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=positive_int, default=100, help="Profiled iterations (default: %(default)s).")
    p.add_argument("--warmup", type=int, default=10, help="Warm-up iterations (default: %(default)s).")
    p.add_argument("--repeats", type=positive_int, default=9, help="Repeats; medians reported (default: %(default)s).")
    p.add_argument("--device", type=cuda_device, default=default_device(),
                   help="CUDA device (default: LOCAL_RANK, else cuda:0).")
    p.add_argument("--output", default="py_latency.csv", help="CSV output path (default: %(default)s).")
    p.add_argument("--plot", default=None, help="PNG of the table (default: the CSV path with .png; 'none': skip).")
    args = p.parse_args(argv)
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.iters + args.warmup > SETS:
        p.error(f"--iters + --warmup must be at most {SETS} (distinct operand sets, as in the notebook)")
    return args


# ---- verdicts and output ---------------------------------------------------------------------------------------


def targets(figures):
    """The targets as (key, text, met) for the keys they apply to; met is None when a figure is missing."""

    def known(*values):
        return all(v is not None and not math.isnan(v) for v in values)

    raw = figures.get("raw")
    fast, checked, args = figures.get("launcher_assume"), figures.get("launcher_checked"), figures.get("args")
    tvm, op_eager, mm = figures.get("tvm_ffi"), figures.get("torch_op"), figures.get("torch_torch_op")
    ro20, graph20 = figures.get("torch_op_ro20"), figures.get("ferrygraph20")
    return {
        "tvm_ffi": ("<= raw + 1.0 us", tvm <= raw + 1.0 if known(tvm, raw) else None),
        "torch_op": ("<= torch.mm", op_eager <= mm if known(op_eager, mm) else None),
        "torch_op_ro20": ("<= 1.1 x ferry.ops.Graph", ro20 <= 1.1 * graph20 if known(ro20, graph20) else None),
        "launcher_assume": ("<= raw + 1.0 us", fast <= raw + 1.0 if known(fast, raw) else None),
        "launcher_checked": ("<= bypassed + 0.3 us", checked <= fast + 0.3 if known(fast, checked) else None),
        "args": ("<= 3 us", args <= 3.0 if known(args) else None),
    }


def build_rows(figures, meta, repeats):
    """CSV rows from the measured figures: a dict key -> value, with "<key>_e2e", "raw_<key>", "torch_<key>"... as
    the measuring code filled them."""
    verdicts = targets(figures)
    rows = []
    for key, label, unit in ROWS:
        target, met = verdicts.get(key, ("", None))
        rows.append(dict(meta, metric=label, unit=unit, ferry=_fmt(figures.get(key)),
                         raw=_fmt(figures.get(f"raw_{key}")), torch_eager=_fmt(figures.get(f"torch_{key}")),
                         torch_graph=_fmt(figures.get(f"torchgraph_{key}")), cutlass_notebook=_fmt(CUTLASS.get(key)),
                         target=target, met="" if met is None else int(met), ferry_e2e=_fmt(figures.get(f"{key}_e2e")),
                         raw_e2e=_fmt(figures.get(f"raw_{key}_e2e")), torch_e2e=_fmt(figures.get(f"torch_{key}_e2e")),
                         repeats=repeats))
    return rows


def _fmt(value):
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else round(float(value), 4)


def write_csv(path, rows):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def format_table(rows):
    """The table, compact: one line per row with the targets' verdicts."""

    def cell(v):
        if v == "" or v is None:
            return "-"
        v = float(v)
        return f"{v:.4g}" if v >= 1000 else f"{v:.3f}" if v < 100 else f"{v:.1f}"

    lines = [f"{'metric':<55} {'unit':>4} {'ferry':>9} {'raw':>9} {'torch':>9} {'torch g':>9} {'CUTLASS':>9}  target",
             "-" * 120]
    for r in rows:
        verdict = "" if r["met"] == "" else ("ok" if r["met"] else "MISS")
        lines.append(f"{r['metric']:<55} {r['unit']:>4} {cell(r['ferry']):>9} {cell(r['raw']):>9} "
                     f"{cell(r['torch_eager']):>9} {cell(r['torch_graph']):>9} {cell(r['cutlass_notebook']):>9}  "
                     f"{r['target']} {verdict}".rstrip())
    return "\n".join(lines)


def plot(rows, path):
    """A PNG of the table: per row, bars for ferry, raw, torch (eager, graph) and the notebook's CUTLASS figure, on
    a log axis (in microseconds; the ms rows converted). Returns the path, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series = [("ferry", "ferry (Python)", "#1f77b4"), ("raw", "raw cuLaunchKernel (C)", "#7f7f7f"),
              ("torch_eager", "torch.mm eager", "#ff7f0e"), ("torch_graph", "torch.mm, torch graph", "#ffbb78"),
              ("cutlass_notebook", "CUTLASS notebook", "#2ca02c")]
    shown = [r for r in rows if r["ferry"] != ""]
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(shown) + 1.5))
    height = 0.8 / len(series)
    for s, (column, label, color) in enumerate(series):
        ys, xs = [], []
        for i, r in enumerate(shown):
            if r[column] == "":
                continue
            scale = 1000.0 if r["unit"] == "ms" else 1.0
            ys.append(i + (s - len(series) / 2 + 0.5) * height)
            xs.append(float(r[column]) * scale)
        ax.barh(ys, xs, height=height, color=color, label=label)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([r["metric"] + (f"  [{r['target']}: {'ok' if r['met'] else 'MISS'}]" if r["met"] != "" else "")
                        for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("microseconds (log scale; lower is better)")
    first = rows[0] if rows else {}
    ax.set_title(f"ferry.ops host latency, 128x128x128 fp16 GEMM — {first.get('device_name', '')}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---- measuring -------------------------------------------------------------------------------------------------


def _median(values):
    return statistics.median(values) if values else float("nan")


def _loop_timer(stream, warmup, iters):
    """time_loop(fn) -> (host_us, e2e_us) per iteration: fn(lo, hi) runs iterations [lo, hi) (a different operand
    set each); a warm-up pass, then the timed pass; the stream is synchronised before each pass and after."""

    def time_loop(fn):
        stream.synchronize()
        fn(0, warmup)
        stream.synchronize()
        t0 = time.perf_counter_ns()
        fn(warmup, warmup + iters)
        t1 = time.perf_counter_ns()
        stream.synchronize()
        t2 = time.perf_counter_ns()
        return (t1 - t0) / iters / 1e3, (t2 - t0) / iters / 1e3

    return time_loop


def _per_call_us(fn, calls):
    t0 = time.perf_counter_ns()
    fn(calls)
    return (time.perf_counter_ns() - t0) / calls / 1e3


def _attempt(problems, what, fn, passing=()):
    """fn() or, when it raises, None with the problem recorded: one broken part of the experiment (a capture that
    fails, the raw timer) must not lose the figures of all the others on a GPU run. Exceptions of the types in
    `passing` go to the caller instead."""
    try:
        return fn()
    except passing:
        raise
    except Exception as e:  # noqa: BLE001 (reported, and the run fails at the end)
        problems.append(f"{what}: {type(e).__name__}: {e}")
        print(f"latency: {what} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def _reach(torch, As, Bs, outs, problems):
    """The same GEMM from the other callers ferry serves, as loop functions fn(lo, hi) like measure()'s: through
    TVM-FFI, and through the torch custom op eagerly and compiled. A caller that cannot be set up (no tvm_ffi, a
    torch without custom ops) is recorded in `problems` and left out."""
    found = {}

    def tvm_ffi():
        import ferry.tvm_ffi

        gemm = ferry.tvm_ffi.load()["gemm"]
        gemm(As[0], Bs[0], outs[0])

        def loop(lo, hi):
            for i in range(lo, hi):
                gemm(As[i], Bs[i], outs[i])
        return loop

    def tvm_ffi_nop():   # what TVM-FFI's call costs with these operands before any function runs
        import tvm_ffi

        nop = tvm_ffi.get_global_func("testing.nop")
        if nop is None:
            raise AttributeError("this tvm_ffi has no testing.nop")
        nop(As[0], Bs[0], outs[0])

        def loop(lo, hi):
            for i in range(lo, hi):
                nop(As[i], Bs[i], outs[i])
        return loop

    def torch_op():
        import ferry.torch  # noqa: F401  (registers torch.ops.ferry)

        gemm_out = torch.ops.ferry.gemm_out.default
        gemm_out(As[0], Bs[0], outs[0])

        def loop(lo, hi):
            for i in range(lo, hi):
                gemm_out(As[i], Bs[i], outs[i])
        return loop

    def torch_op_compiled():
        import ferry.torch  # noqa: F401

        compiled = torch.compile(lambda a, b, out: torch.ops.ferry.gemm_out(a, b, out), fullgraph=True)
        compiled(As[0], Bs[0], outs[0])   # compiles (seconds), then every call reuses it

        def loop(lo, hi):
            for i in range(lo, hi):
                compiled(As[i], Bs[i], outs[i])
        return loop

    for key, make in (("tvm_ffi", tvm_ffi), ("tvm_ffi_nop", tvm_ffi_nop), ("torch_op", torch_op),
                      ("torch_op_compiled", torch_op_compiled)):
        loop = _unless_unavailable(key, lambda: _attempt(problems, f"setting up {key}", make, _UNAVAILABLE))
        if loop is not None:
            found[key] = loop
    return found


# What a caller that this installation lacks raises while it is set up (no tvm_ffi, a ferry built without the
# TVM-FFI provider, a torch without torch.library.custom_op): its rows stay empty, as the raw timer's do without
# the test hooks, and that is not a failure.
_UNAVAILABLE = (ImportError, FileNotFoundError, AttributeError)


def _unless_unavailable(what, fn):
    try:
        return fn()
    except _UNAVAILABLE as e:
        print(f"latency: {what} is not available here ({type(e).__name__}: {e}); its row stays empty",
              file=sys.stderr)
        return None


def _reduce_overhead20(torch, As, Bs, static, matmul):
    """A replay function for 20 calls of `matmul` (ferry::gemm, or torch.mm for reference) compiled with
    mode="reduce-overhead" (torch's CUDA graphs): the compiled function is warmed up and recorded before it is
    timed. Static inputs (marked as parameters are) are read where they are, as a ferry.ops.Graph reads its
    operands; other inputs are copied into the graph's own buffers before each replay, two copies per GEMM."""
    if static:
        for t in (*As, *Bs):
            torch._dynamo.mark_static_address(t)
    else:   # fresh tensors: a mark is kept on the tensor and would reach the static case
        As, Bs = [a.clone() for a in As], [b.clone() for b in Bs]

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def twenty(As, Bs):
        return [matmul(a, b) for a, b in zip(As, Bs)]

    for _ in range(3):
        twenty(As, Bs)
    return lambda: twenty(As, Bs)


def measure(opts, torch, ops, device):  # noqa: C901 (one experiment, read top to bottom)
    """Runs the experiment; returns (figures, operator name, problems): figures a part could not measure are
    missing, and `problems` says why (also a wrong result)."""
    figures, problems = {}, []
    total = opts.warmup + opts.iters
    stream = torch.cuda.Stream(device)
    torch.cuda.set_device(device)
    with torch.cuda.stream(stream):
        # The notebook's operands: values in {-1, 0, 1}, so fp16 results are exact and checkable.
        As = [torch.randint(-1, 2, (128, 128), device=device, dtype=torch.float16) for _ in range(SETS)]
        Bs = [torch.randint(-1, 2, (128, 128), device=device, dtype=torch.float16) for _ in range(SETS)]
        outs = [torch.empty((128, 128), device=device, dtype=torch.float16) for _ in range(SETS)]
        args = [ops.GemmArguments(A=As[i], B=Bs[i], out=outs[i], accumulator_type=torch.float32)
                for i in range(SETS)]
        op = ops.get_operators(args[0], target_sm=ops.target_sm())[0]
        print(f"latency: operator {op.name} ({op.design.instruction}, tile {op.design.tile_m}x{op.design.tile_n}"
              f"x{op.design.tile_k}, {op.design.stages} stages)", file=sys.stderr)

        # ---- compile: cold (fresh cache home, empty memo), disk hit, memo hit, artifact load ----
        home = tempfile.mkdtemp(prefix="ferry-py-latency-")
        saved_home = os.environ.get("XDG_CACHE_HOME")
        try:
            cold = []
            for r in range(3):
                os.environ["XDG_CACHE_HOME"] = os.path.join(home, f"cold{r}")
                ops.clear_memo()
                t0 = time.perf_counter_ns()
                op.compile(args[0])
                cold.append((time.perf_counter_ns() - t0) / 1e6)
            figures["compile_cold"] = _median(cold)
            os.environ["XDG_CACHE_HOME"] = os.path.join(home, "warm")
            ops.clear_memo()
            path = os.path.join(home, "gemm.ferry")
            op.compile(args[0]).save(path)
            disk, load = [], []
            for _ in range(15):
                ops.clear_memo()
                t0 = time.perf_counter_ns()
                op.compile(args[0])
                disk.append((time.perf_counter_ns() - t0) / 1e3)
                ops.clear_memo()
                t0 = time.perf_counter_ns()
                ops.CompiledArtifact.load(path)
                load.append((time.perf_counter_ns() - t0) / 1e3)
            figures["compile_disk"], figures["artifact_load"] = _median(disk), _median(load)
            ops.clear_memo()
            art = op.compile(args[0])
            compile_ = op.compile
            figures["compile_memo"] = _median([_per_call_us(lambda n: [compile_(args[0]) for _ in range(n)], 1000)
                                               for _ in range(opts.repeats)])
        finally:
            if saved_home is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = saved_home
            shutil.rmtree(home, ignore_errors=True)

        # ---- the per-call rows, interleaved per repeat ----
        run = op.run
        launch = op.launcher(args[0], art, assume_supported_args=True)
        launch_checked = op.launcher(args[0], art)
        mm = torch.mm
        s = stream  # the notebook passes torch.cuda.current_stream(); it is `stream` here
        op.run(args[0])  # the memo entry for the no-artifact rows (compiled above: a memo hit)

        def run_noart_checked(lo, hi):
            for i in range(lo, hi):
                run(args[i], stream=s)

        def run_noart_assume(lo, hi):
            for i in range(lo, hi):
                run(args[i], stream=s, assume_supported_args=True)

        def run_art_checked(lo, hi):
            for i in range(lo, hi):
                run(args[i], stream=s, compiled_artifact=art)

        def run_art_assume(lo, hi):
            for i in range(lo, hi):
                run(args[i], stream=s, compiled_artifact=art, assume_supported_args=True)

        def run_art_assume_none(lo, hi):
            for i in range(lo, hi):
                run(args[i], compiled_artifact=art, assume_supported_args=True)

        def launcher_assume(lo, hi):
            for i in range(lo, hi):
                launch(As[i], Bs[i], outs[i])

        def launcher_checked(lo, hi):
            for i in range(lo, hi):
                launch_checked(As[i], Bs[i], outs[i])

        def torch_mm(lo, hi):
            for i in range(lo, hi):
                mm(As[i], Bs[i], out=outs[i])

        methods = dict(run_noart_checked=run_noart_checked, run_noart_assume=run_noart_assume,
                       run_art_checked=run_art_checked, run_art_assume=run_art_assume,
                       run_art_assume_none=run_art_assume_none, launcher_assume=launcher_assume,
                       launcher_checked=launcher_checked, torch=torch_mm)
        methods.update(_reach(torch, As, Bs, outs, problems))
        time_loop = _loop_timer(stream, opts.warmup, opts.iters)
        host = {k: [] for k in methods}
        e2e = {k: [] for k in methods}
        raw_host, raw_e2e = [], []
        supports, construct = [], []
        ops_c = ops._c
        supports_fn = op.supports
        GemmArguments = ops.GemmArguments
        f32 = torch.float32
        # The raw timer is built only into the project's own builds (FERRY_PYTHON_TEST_HOOKS): it loads libcuda
        # itself, which the wheel does not. Without it the limit's rows stay empty; that is not a failure.
        launch_info, raw_ok = None, hasattr(ops_c, "_raw_launch_time")
        if not raw_ok:
            print("latency: the raw cuLaunchKernel limit needs ferry built from the repository with "
                  "FERRY_PYTHON_TEST_HOOKS=ON (a wheel leaves it out); its rows stay empty", file=sys.stderr)
        for _ in range(opts.repeats):
            raw = _attempt(problems, "raw cuLaunchKernel timer", lambda: ops_c._raw_launch_time(
                art, args[:total], stream, opts.iters, opts.warmup)) if raw_ok else None
            raw_ok = raw is not None
            if raw:
                raw_host.append(raw[0])
                raw_e2e.append(raw[1])
                launch_info = raw[2]
            for key, fn in methods.items():
                h, e = time_loop(fn)
                host[key].append(h)
                e2e[key].append(e)

            def check(n):
                for i in range(n):
                    supports_fn(args[i % total])

            def make(n):
                for i in range(n):
                    j = i % total
                    GemmArguments(A=As[j], B=Bs[j], out=outs[j], accumulator_type=f32)

            supports.append(_per_call_us(check, 10 * total))
            construct.append(_per_call_us(make, 10 * total))
        figures["raw"] = _median(raw_host)
        for key in methods:
            if key == "torch":
                continue
            figures[key], figures[f"{key}_e2e"] = _median(host[key]), _median(e2e[key])
            figures[f"raw_{key}"], figures[f"raw_{key}_e2e"] = figures["raw"], _median(raw_e2e)
            figures[f"torch_{key}"], figures[f"torch_{key}_e2e"] = _median(host["torch"]), _median(e2e["torch"])
        figures["supports"], figures["args"] = _median(supports), _median(construct)
        print(f"latency: raw launch {launch_info}", file=sys.stderr)

        # ---- 20 launches: eager, a torch CUDA graph of op.run (the notebook's code), a ferry graph ----
        def capture_op_run():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(GRAPH_RUNS):
                    op.run(args[i], compiled_artifact=art, stream=torch.cuda.current_stream(),
                           assume_supported_args=True)
            return g

        def capture_mm():
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(GRAPH_RUNS):
                    torch.mm(As[i], Bs[i], out=outs[i])
            return g

        def capture_ferry():
            with ops.Graph(stream) as g:
                for i in range(GRAPH_RUNS):
                    g.run(op, args[i], compiled_artifact=art, assume_supported_args=True)
            return g

        g = _attempt(problems, "torch.cuda.graph capture of op.run", capture_op_run)
        tg = _attempt(problems, "torch.cuda.graph capture of torch.mm", capture_mm)
        fg = _attempt(problems, "ferry.ops.Graph capture", capture_ferry)
        stream.synchronize()
        references = [(As[i].float() @ Bs[i].float()).half() for i in range(GRAPH_RUNS)]
        for name, graph in (("torch graph of op.run", g), ("ferry graph", fg)):
            if graph is None:
                continue
            for i in range(GRAPH_RUNS):  # what the graph must produce, checked after its first replay
                outs[i].fill_(float("nan"))
            graph.replay()
            stream.synchronize()
            wrong = [i for i in range(GRAPH_RUNS) if not torch.equal(outs[i], references[i])]
            if wrong:
                problems.append(f"the {name} computed wrong outputs {wrong}")

        def twenty(fn):
            samples = []
            for _ in range(2):
                fn()
            stream.synchronize()
            for _ in range(opts.iters):
                t0 = time.perf_counter_ns()
                fn()
                stream.synchronize()
                samples.append((time.perf_counter_ns() - t0) / 1e3)
            return statistics.mean(samples)

        def eager_ferry():
            for i in range(GRAPH_RUNS):
                run(args[i], compiled_artifact=art, stream=s, assume_supported_args=True)

        def eager_torch():
            for i in range(GRAPH_RUNS):
                mm(As[i], Bs[i], out=outs[i])

        cases = dict(eager20=eager_ferry, torch_eager20=eager_torch)
        for key, static, name in (("torch_op_ro20_copied", False, "ferry::gemm"),
                                  ("torch_op_ro20", True, "ferry::gemm"), ("torch_mm_ro20", True, "torch.mm")):
            what = f"torch.compile reduce-overhead of 20 {name} ({'static' if static else 'copied'} inputs)"

            def make(static=static, name=name):
                import ferry.torch  # noqa: F401  (registers torch.ops.ferry)
                matmul = torch.mm if name == "torch.mm" else torch.ops.ferry.gemm
                return _reduce_overhead20(torch, As[:GRAPH_RUNS], Bs[:GRAPH_RUNS], static, matmul)
            ro20 = _unless_unavailable(what, lambda what=what, make=make: _attempt(problems, what, make,
                                                                                   _UNAVAILABLE))
            if ro20 is not None:
                cases[key] = ro20
        for key, graph in (("torchgraph20", g), ("ferrygraph20", fg), ("torch_graph20", tg)):
            if graph is not None:
                cases[key] = graph.replay
        samples = {k: [] for k in cases}
        raw20 = []
        for _ in range(opts.repeats):
            for key, fn in cases.items():
                samples[key].append(twenty(fn))
            if raw_ok:
                raw = _attempt(problems, "raw cuLaunchKernel timer, 20 launches",
                               lambda: ops_c._raw_launch_time(art, args[:GRAPH_RUNS], stream, GRAPH_RUNS, 0))
                raw_ok = raw is not None
                if raw:
                    raw20.append(raw[1] * GRAPH_RUNS)
        for key in ("eager20", "torchgraph20", "ferrygraph20", "torch_op_ro20", "torch_op_ro20_copied",
                    "torch_mm_ro20"):
            figures[key] = _median(samples.get(key, []))
            figures[f"torch_{key}"] = _median(samples["torch_eager20"])
            figures[f"torchgraph_{key}"] = _median(samples.get("torch_graph20", []))
        figures["raw_eager20"] = _median(raw20)

        # ---- correctness of the timed runs: every out is A @ B exactly (values in {-1, 0, 1}) ----
        stream.synchronize()
        for i in range(total):
            outs[i].fill_(float("nan"))
        for i in range(total):
            run(args[i], compiled_artifact=art, assume_supported_args=True)
        stream.synchronize()
        wrong = [i for i in range(total) if not torch.equal(outs[i], (As[i].float() @ Bs[i].float()).half())]
        if wrong:
            problems.append(f"ferry computed wrong outputs {wrong[:10]}")
        if fg is not None:
            fg.close()
        del g, tg
    return figures, op.name, problems


def main(argv=None):
    opts = parse_args(argv)
    found = torch_cuda_device("latency", opts.device, "this benchmark runs the notebook's experiment with torch "
                              "tensors")
    if found is None:
        return 0
    torch, device = found
    import ferry
    import ferry.ops as ops

    status = ops.device_supports("80")
    if not status:
        print(f"latency: the GEMM operators need sm_80 or newer: {status.error}")
        return 0
    figures, op_name, problems = measure(opts, torch, ops, device)
    meta = dict(schema_version=SCHEMA_VERSION, created_utc=datetime.now(timezone.utc).isoformat(),
                device_name=torch.cuda.get_device_name(device), torch_version=torch.__version__,
                ferry_version=ferry.__version__, operator=op_name)
    rows = build_rows(figures, meta, opts.repeats)
    write_csv(opts.output, rows)
    png = None
    if opts.plot != "none":
        png = plot(rows, opts.plot or os.path.splitext(opts.output)[0] + ".png")
    print(f"\nferry.ops host latency on {meta['device_name']} (torch {meta['torch_version']}), operator {op_name}, "
          f"128x128x128 fp16 -> fp16, fp32 accumulation; {opts.iters} iterations x {opts.repeats} repeats, medians")
    print("host us per call: the calling loop's time / iterations (launches queue up); 20-launch rows include the "
          "sync;\nraw = cuLaunchKernel of the same launch from C, this run; torch g = torch.mm in a torch CUDA graph; "
          "CUTLASS = the notebook's figures")
    print(f"CSV: {opts.output}" + (f"   plot: {png}" if png else "   (no plot: matplotlib missing or --plot none)"))
    print()
    print(format_table(rows))
    missed = [r["metric"] for r in rows if r["met"] == 0]
    print(f"\ntargets: {'all met' if not missed else 'MISSED: ' + '; '.join(missed)}")
    if problems:
        print("PROBLEMS (figures missing or results wrong; exit status 1):\n  " + "\n  ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
