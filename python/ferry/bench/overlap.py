"""Overlap of D2H transfers with foreground CUDA compute: ferry against PyTorch ``to(cpu)``, beside a worker that
transfers nothing.

A port of SPDL's ``benchmark_transfer_overlap.py``, with the same command line, defaults, validation, randomized
schedules and CSV columns (this port's own columns come after them), comparing ``ferry.transfer_tensor_d2h`` with
that benchmark's reference method.

The point of a background D2H transfer is that it hides under foreground GPU work. A persistent worker thread
owns the transfers (ferry's cached copy stream, or a dedicated torch stream for the reference); the foreground
thread owns a compute stream running ``torch.mm`` on square float32 matrices, calibrated to a target duration.
Every timed block runs, in a shuffled order, compute only and, for every method, transfer only, serialized
(transfer, then compute) and concurrent (both released together from a CPU barrier; the CPU launch skew between
the two threads is recorded). From each block's paired samples: speedup = serialized / concurrent, hidden time =
serialized - concurrent, and estimated overlap = hidden / min(compute, transfer). Medians are reported with
percentile bootstrap 95% confidence intervals. Source tensors are created and validated (exact results) before
timing; warmup blocks prime pinned pools and allocators.

The harness floor: a third method, "no transfer", whose worker returns at once, runs in the same blocks. Its
transfer-only time R is the executor's round trip, and its concurrent - compute W is what the harness's own thread
wake-ups cost a concurrent block. Per method and block:
  slowdown           concurrent - compute-only: what the foreground loses beside the transfer;
  floor slowdown     W, the no-op worker's slowdown in the same block;
  excess over floor  slowdown - W: what the foreground loses to the transfer beyond the harness's own cost;
  net transfer       transfer-only - R: the transfer without the executor's round trip;
  overlap bound      min(transfer-only - W, compute) / min(compute, transfer-only): the highest estimated overlap a
                     method can score in this harness (a transfer that hides completely still leaves W in its
                     concurrent block), (T - W) / T for a transfer of T ms shorter than the compute.
Their medians over blocks (the excess with a bootstrap 95% interval) are in the table and the summary CSV.

Layouts (``--layout``): ``even`` cuts the payload as SPDL's benchmark does (sizes differ by at most one byte);
``mixed`` gives one tensor half the payload and splits the rest evenly between the n - 1 others.

Diagnostic mode (``--diagnostics-output PATH``, off by default): the same blocks, with timestamps that show where a
concurrent block loses time against compute-only. Per concurrent block and method it records the hand-off into
the block (executor wake-up and barrier: start to barrier release), the foreground's resume after the release, its
launch phase (barrier release to the last ``torch.mm`` returning, against compute-only's start to last
``torch.mm``), the GPU tail after the launches, the worker's transfer call, and for ferry its phases (first part:
start to the first part submitted; walk+submit: start to the whole batch walked and submitted, output objects
built while the copies run; wait; finish), the number of parts, and its GIL holds: the longest continuous hold of
the call, the number of holds and their histogram. ferry's columns come from its private phase stamps, present
only in builds with test hooks (the project's CMake build, not a wheel); without them the timeline is recorded and
ferry's columns stay empty. The stamps cost a few ``perf_counter_ns`` calls per block, so a diagnostic run is not
the reference run: compare its medians with each other. The rows go to PATH, tables of their medians are printed
before the summary, and the summary CSV's gil_max_hold_median_us / gil_max_hold_max_us hold the median and the
maximum over ferry's concurrent blocks of its longest hold. ``--ferry-gil-slice-us`` and ``--ferry-gil-switch-us``
set ferry's GIL pacing for A/B runs (test-hook builds only).

Usage::

    python -m ferry.bench.overlap                                   # writes /tmp/transfer_overlap.csv
    python -m ferry.bench.overlap --num-tensors 1 32 256 4096 16384 --layout mixed --output /tmp/mixed.csv
    python -m ferry.bench.overlap --num-tensors 1 4096 --diagnostics-output /tmp/diag.csv

Without CUDA (or without torch) it says so and exits 0.
"""

import argparse
import csv
import os
import random
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from datetime import datetime, timezone

import numpy as np
from ferry.bench._cli import cuda_device, default_device, non_negative_int, positive_int
from ferry.bench._gpu import torch_cuda_device
from ferry.bench.bandwidth import LAYOUTS, layout_sizes

_SCHEMA_VERSION = 1
_METHOD_NATIVE = "PyTorch to(cpu)"
_METHOD_FERRY = "ferry"
_METHOD_NOOP = "no transfer"  # the harness floor: its worker returns at once
_BARRIER_TIMEOUT_S = 30
DEFAULT_OUTPUT = "/tmp/transfer_overlap.csv"


# ---- records (SPDL's fields first, in its order: its CSV schema; this port's fields after them) ------------------


@dataclass(frozen=True)
class BenchmarkConfig:
    total_mib: tuple
    num_tensors: tuple
    matrix_size: int
    compute_target_ms: float
    compute_iterations: "int | None"
    num_warmup: int
    num_runs: int
    bootstrap_resamples: int
    seed: int
    layout: str = "even"


@dataclass(frozen=True)
class OverlapSample:
    """The four schedules of one randomized block, for one method."""

    trial: int
    schedule_order: str
    compute_only_ms: float
    transfer_only_ms: float
    serialized_ms: float
    concurrent_ms: float
    cpu_launch_skew_ms: float

    @property
    def speedup(self) -> float:
        return self.serialized_ms / self.concurrent_ms

    @property
    def hidden_ms(self) -> float:
        return self.serialized_ms - self.concurrent_ms

    @property
    def estimated_overlap_efficiency(self) -> float:
        """Hidden time over what could have been hidden; timed separately, so noise can leave [0, 1]."""
        potential = min(self.compute_only_ms, self.transfer_only_ms)
        return self.hidden_ms / potential if potential > 0 else 0.0


@dataclass(frozen=True)
class FloorComparison:
    """One block of one method against the no-op worker's schedules in the same block (ms)."""

    trial: int
    slowdown_ms: float           # concurrent - compute-only
    floor_slowdown_ms: float     # the no-op worker's concurrent - compute-only
    excess_over_floor_ms: float  # slowdown - floor slowdown
    floor_transfer_ms: float     # the no-op worker's transfer-only: the executor's round trip
    net_transfer_ms: float       # transfer-only - floor transfer
    overlap_bound: float         # min(transfer-only - floor slowdown, compute) / min(compute, transfer-only)


def against_floor(samples, floor):
    """FloorComparison per block of `samples`, paired by trial with `floor` (the no-op worker's samples)."""
    floor_by_trial = {f.trial: f for f in floor}
    out = []
    for s in samples:
        f = floor_by_trial[s.trial]
        slowdown = s.concurrent_ms - s.compute_only_ms
        floor_slowdown = f.concurrent_ms - f.compute_only_ms
        # A transfer that hides completely leaves a concurrent block of max(compute + W, transfer), so it hides
        # min(transfer - W, compute) of the serialized block's time at most.
        potential = min(s.compute_only_ms, s.transfer_only_ms)
        hideable = min(s.transfer_only_ms - floor_slowdown, s.compute_only_ms)
        out.append(FloorComparison(
            trial=s.trial, slowdown_ms=slowdown, floor_slowdown_ms=floor_slowdown,
            excess_over_floor_ms=slowdown - floor_slowdown, floor_transfer_ms=f.transfer_only_ms,
            net_transfer_ms=s.transfer_only_ms - f.transfer_only_ms,
            overlap_bound=hideable / potential if potential > 0 else 0.0))
    return out


@dataclass(frozen=True)
class BenchmarkSummary:
    schema_version: int
    created_utc: str
    device_name: str
    device_capability: str
    torch_version: str
    cuda_version: str
    seed: int
    schedule_seed: int
    bootstrap_seed: int
    bootstrap_resamples: int
    num_warmup: int
    num_runs: int
    total_bytes: int
    num_tensors: int
    dtype: str
    matrix_size: int
    compute_target_ms: float
    compute_iterations: int
    method: str
    compute_median_ms: float
    compute_p95_ms: float
    transfer_median_ms: float
    transfer_p95_ms: float
    transfer_gb_per_s: float
    serialized_median_ms: float
    serialized_p95_ms: float
    concurrent_median_ms: float
    concurrent_p95_ms: float
    speedup_median: float
    speedup_ci_lower: float
    speedup_ci_upper: float
    hidden_median_ms: float
    estimated_overlap_efficiency_median: float
    estimated_overlap_efficiency_ci_lower: float
    estimated_overlap_efficiency_ci_upper: float
    cpu_launch_skew_p95_ms: float
    # This port's columns (medians over blocks of FloorComparison's fields, the excess with its 95% interval).
    layout: str
    slowdown_median_ms: float
    floor_slowdown_median_ms: float
    excess_over_floor_median_ms: float
    excess_over_floor_ci_lower_ms: float
    excess_over_floor_ci_upper_ms: float
    floor_transfer_median_ms: float
    net_transfer_median_ms: float
    overlap_bound_median: float
    gil_max_hold_median_us: "float | None"  # diagnostic mode, ferry only: its concurrent blocks' longest GIL hold
    gil_max_hold_max_us: "float | None"


@dataclass(frozen=True)
class RawSampleRecord:
    schema_version: int
    created_utc: str
    seed: int
    schedule_seed: int
    total_bytes: int
    num_tensors: int
    method: str
    trial: int
    schedule_order: str
    compute_only_ms: float
    transfer_only_ms: float
    serialized_ms: float
    concurrent_ms: float
    speedup: float
    hidden_ms: float
    estimated_overlap_efficiency: float
    cpu_launch_skew_ms: float
    # This port's columns: the block against the no-op worker's (FloorComparison).
    layout: str
    slowdown_ms: float
    floor_slowdown_ms: float
    excess_over_floor_ms: float
    net_transfer_ms: float
    overlap_bound: float


# ---- statistics ------------------------------------------------------------------------------------------------------


def _percentile(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _bootstrap_median_ci(values, *, seed, num_resamples):
    """Percentile-bootstrap 95% interval of the median."""
    data = np.asarray(values, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(data), size=(num_resamples, len(data)))
    medians = np.median(data[picks], axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def _ms(start_ns, end_ns):
    return (end_ns - start_ns) / 1e6


def _median(values):
    """The median of the values given (None and "" left out), NaN when none are."""
    values = [v for v in values if v is not None and v != ""]
    return _percentile(values, 50) if values else float("nan")


# ---- the experiment --------------------------------------------------------------------------------------------------


class _Runner:
    """The worker thread, the compute closure and the four timed schedules. As in SPDL's benchmark, each block's
    outputs are freed on the main thread, where the future hands them over, after the block's clock has stopped."""

    def __init__(self, torch, device, executor, run_compute):
        self.torch, self.device, self.executor, self.run_compute = torch, device, executor, run_compute

    def submit(self, transfer, barrier=None):
        """Runs one transfer on the worker; the future's result is (output, start_ns)."""

        def work():
            self.torch.cuda.set_device(self.device)
            if barrier is not None:
                barrier.wait(timeout=_BARRIER_TIMEOUT_S)
            started = time.perf_counter_ns()
            return transfer(), started

        return self.executor.submit(work)

    def compute_only(self):
        start = time.perf_counter_ns()
        self.run_compute()
        return _ms(start, time.perf_counter_ns())

    def transfer_only(self, transfer):
        start = time.perf_counter_ns()
        result = self.submit(transfer).result()
        end = time.perf_counter_ns()
        del result
        return _ms(start, end)

    def serialized(self, transfer):
        start = time.perf_counter_ns()
        result = self.submit(transfer).result()
        self.run_compute()
        end = time.perf_counter_ns()
        del result
        return _ms(start, end)

    def concurrent(self, transfer):
        barrier = threading.Barrier(2)
        start = time.perf_counter_ns()
        future = self.submit(transfer, barrier)
        barrier.wait(timeout=_BARRIER_TIMEOUT_S)
        compute_started = time.perf_counter_ns()
        self.run_compute()
        output, transfer_started = future.result()
        end = time.perf_counter_ns()
        skew = _ms(min(compute_started, transfer_started), max(compute_started, transfer_started))
        return _ms(start, end), skew


class _DiagnosticRunner(_Runner):
    """_Runner with timestamps (diagnostic mode): compute-only and concurrent blocks leave a record in `pending`,
    which _collect files under (trial, method, schedule) through note()."""

    def __init__(self, torch, device, executor, run_compute, launch, ferry_phases):
        super().__init__(torch, device, executor, run_compute)
        self.launch = launch              # {"first", "last"}: perf_counter_ns of the first and last torch.mm return
        self.ferry_phases = ferry_phases  # the worker thread's last ferry phase stamps, or None without test hooks
        self.pending = {}
        self.records = []

    def submit(self, transfer, barrier=None):
        record = self.pending = {}

        def work():
            self.torch.cuda.set_device(self.device)
            if barrier is not None:
                record["bg_arrive"] = time.perf_counter_ns()
                barrier.wait(timeout=_BARRIER_TIMEOUT_S)
            started = record["bg_start"] = time.perf_counter_ns()
            output = transfer()
            record["bg_end"] = time.perf_counter_ns()
            record["phases"] = self.ferry_phases() if self.ferry_phases else None
            return output, started

        return self.executor.submit(work)

    def compute_only(self):
        start = time.perf_counter_ns()
        self.run_compute()
        end = time.perf_counter_ns()
        self.pending = dict(start=start, first=self.launch["first"], last=self.launch["last"], compute_end=end)
        return _ms(start, end)

    def concurrent(self, transfer):
        barrier = threading.Barrier(2)
        start = time.perf_counter_ns()
        future = self.submit(transfer, barrier)
        record = self.pending
        record["fg_arrive"] = time.perf_counter_ns()
        barrier.wait(timeout=_BARRIER_TIMEOUT_S)
        compute_started = time.perf_counter_ns()
        self.run_compute()
        compute_end = time.perf_counter_ns()
        output, transfer_started = future.result()
        end = time.perf_counter_ns()
        record.update(start=start, fg_pass=compute_started, bg_pass=transfer_started, first=self.launch["first"],
                      last=self.launch["last"], compute_end=compute_end, end=end)
        skew = _ms(min(compute_started, transfer_started), max(compute_started, transfer_started))
        return _ms(start, end), skew

    def note(self, trial, method, schedule):
        self.records.append((trial, method, schedule, self.pending))
        self.pending = {}


# ferry's phases from its stamps: (column, from, to). Its first part's copies start at "first_part"; the walk, the
# submission of every part and the build of the output objects (while the copies run) end at "walked".
_FERRY_PHASES = [("ferry_first_part_ms", "start", "first_part"), ("ferry_walk_submit_ms", "start", "walked"),
                 ("ferry_wait_ms", "walked", "waited"), ("ferry_finish_ms", "waited", "finished")]
# ferry's GIL hold histogram: holds shorter than 25, 50, 100, 200, 400, 800, 1600 us, and longer.
HOLD_BUCKETS = ["lt25us", "lt50us", "lt100us", "lt200us", "lt400us", "lt800us", "lt1600us", "ge1600us"]
_HOLD_FIELDS = [f"ferry_holds_{b}" for b in HOLD_BUCKETS]

DIAGNOSTIC_FIELDS = [
    "total_bytes", "num_tensors", "layout", "method", "trial", "compute_only_ms", "compute_launch_ms",
    "concurrent_ms", "excess_ms", "handoff_ms", "fg_resume_ms", "first_mm_ms", "launch_ms", "launch_excess_ms",
    "gpu_tail_ms", "gpu_tail_excess_ms", "result_ms", "bg_resume_ms", "transfer_call_ms",
    *(name for name, _, _ in _FERRY_PHASES), "ferry_walked_after_release_ms", "ferry_parts", "ferry_holds",
    "ferry_max_hold_us", *_HOLD_FIELDS]


def _ferry_columns(phases, since_ns):
    """ferry's diagnostic columns from the worker's last phase stamps, if they belong to a call that started at or
    after since_ns (and not to an older call on the same worker); {} otherwise."""
    if not phases or phases.get("start") is None or phases["start"] < since_ns:
        return {}
    row = {name: _ms(phases[a], phases[b]) for name, a, b in _FERRY_PHASES
           if phases.get(a) is not None and phases.get(b) is not None}
    if phases.get("max_hold_ns") is not None:
        row.update(ferry_parts=phases.get("parts"), ferry_holds=phases.get("holds"),
                   ferry_max_hold_us=phases["max_hold_ns"] / 1e3)
        row.update(zip(_HOLD_FIELDS, phases.get("hold_hist") or ()))
    return row


def _by_scenario_and_method(rows):
    """(num_tensors, method, rows) for each (total_bytes, num_tensors, method) in rows, sorted."""
    keys = sorted({(r["total_bytes"], r["num_tensors"], r["method"]) for r in rows})
    for total, n, method in keys:
        yield n, method, [r for r in rows if (r["total_bytes"], r["num_tensors"], r["method"]) == (total, n, method)]


def _diagnostic_rows(records, total_bytes, num_tensors, layout="even"):
    """Per (trial, method): the concurrent block's timeline against the same trial's compute-only block (ms).

    concurrent - compute = handoff + fg_resume + launch_excess + gpu_tail_excess + result, where
      handoff          start -> barrier release (executor wake-up + barrier; the release is the later arrival)
      fg_resume        release -> the foreground passes the barrier (its wake-up, and the GIL if the worker has it)
      launch_excess    (foreground pass -> last torch.mm returned) - (compute-only start -> last torch.mm)
      gpu_tail_excess  (last torch.mm -> compute synchronized) - the same in compute-only
      result           compute synchronized -> the worker's future collected
    launch_ms is the foreground's launch phase: barrier release -> last torch.mm returned."""
    compute = {trial: r for trial, method, schedule, r in records if schedule == "compute"}
    rows = []
    for trial, method, schedule, r in records:
        c = compute.get(trial)
        if schedule != "concurrent" or not c or "end" not in r:
            continue
        release = max(r["fg_arrive"], r["bg_arrive"])
        compute_launch = _ms(c["start"], c["last"])
        compute_tail = _ms(c["last"], c["compute_end"])
        row = dict(total_bytes=total_bytes, num_tensors=num_tensors, layout=layout, method=method, trial=trial,
                   compute_only_ms=_ms(c["start"], c["compute_end"]), compute_launch_ms=compute_launch,
                   concurrent_ms=_ms(r["start"], r["end"]),
                   handoff_ms=_ms(r["start"], release), fg_resume_ms=_ms(release, r["fg_pass"]),
                   first_mm_ms=_ms(release, r["first"]), launch_ms=_ms(release, r["last"]),
                   launch_excess_ms=_ms(r["fg_pass"], r["last"]) - compute_launch,
                   gpu_tail_ms=_ms(r["last"], r["compute_end"]),
                   gpu_tail_excess_ms=_ms(r["last"], r["compute_end"]) - compute_tail,
                   result_ms=_ms(r["compute_end"], r["end"]), bg_resume_ms=_ms(release, r["bg_pass"]),
                   transfer_call_ms=_ms(r["bg_pass"], r["bg_end"]))
        row["excess_ms"] = row["concurrent_ms"] - row["compute_only_ms"]
        # Phase stamps belong to this block only if ferry's call started after the worker passed the barrier.
        ferry = _ferry_columns(r.get("phases"), r["bg_pass"])
        row.update(ferry)
        if ferry and r["phases"].get("walked") is not None:
            row["ferry_walked_after_release_ms"] = _ms(release, r["phases"]["walked"])
        rows.append(row)
    return rows


def _print_diagnostics(rows):
    """Medians per (tensors, method) of the timeline pieces (medians do not add up exactly)."""
    print("\nDiagnostics (medians, ms): excess = concurrent - compute ~ handoff + resume + launch+ + tail+ + "
          "result; launch = barrier release -> last torch.mm returned (compute-only: start -> last torch.mm)")
    print(f"{'Tensors':>7}  {'Method':<16}{'excess':>7}{'handoff':>8}{'resume':>7}{'launch+':>8}{'tail+':>7}"
          f"{'result':>7}  {'1st mm':>7}{'launch':>7}{'(alone)':>8}  {'xfer':>6}  "
          "ferry first part/walk+submit/wait/finish, parts")
    for n, method, g in _by_scenario_and_method(rows):
        col = {k: _median([r.get(k) for r in g]) for k in DIAGNOSTIC_FIELDS[5:]}
        ferry = ""
        if col["ferry_walk_submit_ms"] == col["ferry_walk_submit_ms"]:  # not NaN: ferry's stamps are there
            ferry = "/".join(f"{col[name]:.3f}" for name, _, _ in _FERRY_PHASES)
            if col["ferry_parts"] == col["ferry_parts"]:
                ferry += f", {col['ferry_parts']:.0f}"
        print(f"{n:>7}  {method:<16}{col['excess_ms']:7.3f}{col['handoff_ms']:8.3f}{col['fg_resume_ms']:7.3f}"
              f"{col['launch_excess_ms']:8.3f}{col['gpu_tail_excess_ms']:7.3f}{col['result_ms']:7.3f}  "
              f"{col['first_mm_ms']:7.3f}{col['launch_ms']:7.3f}{col['compute_launch_ms']:8.3f}  "
              f"{col['transfer_call_ms']:6.3f}  {ferry}")


def _print_gil_holds(rows):
    """ferry's GIL holds in its concurrent blocks: the longest continuous hold of a call (median and max over
    blocks), holds and parts per call (medians), and the holds of all blocks by length."""
    rows = [r for r in rows if r.get("ferry_max_hold_us") is not None]
    if not rows:
        return
    print("\nferry's GIL holds in the concurrent blocks: longest continuous hold of a call (median, max over blocks; "
          "us), holds and parts per call (medians), and every hold of those calls by length (counts)")
    print(f"{'Tensors':>7}  {'Method':<16}{'max hold':>9}{'(max)':>9}{'holds':>7}{'parts':>7}  "
          + "".join(f"{'<' + b[2:] if b.startswith('lt') else '>=' + b[2:]:>9}" for b in HOLD_BUCKETS))
    for n, method, g in _by_scenario_and_method(rows):
        holds = [r["ferry_max_hold_us"] for r in g]
        hist = [sum(int(r.get(f) or 0) for r in g) for f in _HOLD_FIELDS]
        print(f"{n:>7}  {method:<16}{_median(holds):9.1f}{max(holds):9.1f}"
              f"{_median([r.get('ferry_holds') for r in g]):7.0f}{_median([r.get('ferry_parts') for r in g]):7.0f}  "
              + "".join(f"{h:9d}" for h in hist))


def _calibrate(run_compute_n, target_ms):
    """Iterations of the foreground matmul that take about target_ms (up to four rounds of three samples)."""
    iterations = 1
    for _ in range(4):
        samples = []
        for _ in range(3):
            start = time.perf_counter_ns()
            run_compute_n(iterations)
            samples.append(_ms(start, time.perf_counter_ns()))
        measured = _percentile(samples, 50)
        estimate = max(1, min(100_000, round(iterations * target_ms / max(measured, 0.001))))
        if estimate == iterations:
            break
        iterations = estimate
    return iterations


def _source_tensors(torch, total_bytes, num_tensors, device, layout="even"):
    return [torch.randint(0, 256, (size,), dtype=torch.uint8, device=device)
            for size in layout_sizes(total_bytes, num_tensors, layout)]


def _collect(runner, methods, *, num_warmup, num_runs, seed):
    """Warmup blocks, then num_runs randomized blocks; returns {method: [OverlapSample]}."""
    for _ in range(num_warmup):
        runner.run_compute()
        for transfer in methods.values():
            runner.transfer_only(transfer)
            runner.concurrent(transfer)
    rng = random.Random(seed)
    cases = [("compute", "")] + [(m, s) for m in methods for s in ("transfer", "serialized", "concurrent")]
    samples = {m: [] for m in methods}
    for trial in range(num_runs):
        order = list(cases)
        rng.shuffle(order)
        label = "|".join(m if m == "compute" else f"{m}:{s}" for m, s in order)
        compute_ms = 0.0
        results = {m: {"transfer": 0.0, "serialized": 0.0, "concurrent": 0.0, "skew": 0.0} for m in methods}
        note = getattr(runner, "note", None)  # the diagnostic runner files its timestamps
        for method, schedule in order:
            if method == "compute":
                compute_ms = runner.compute_only()
                if note:
                    note(trial, "compute", "compute")
            elif schedule == "transfer":
                results[method]["transfer"] = runner.transfer_only(methods[method])
            elif schedule == "serialized":
                results[method]["serialized"] = runner.serialized(methods[method])
            else:
                results[method]["concurrent"], results[method]["skew"] = runner.concurrent(methods[method])
                if note:
                    note(trial, method, "concurrent")
        for method, r in results.items():
            samples[method].append(OverlapSample(trial, label, compute_ms, r["transfer"], r["serialized"],
                                                 r["concurrent"], r["skew"]))
    return samples


def _summarize(torch, samples, floor, *, created, device, config, total_bytes, num_tensors, iterations, method,
               schedule_seed, bootstrap_seed, gil_max_hold_us=()):
    """One summary row: SPDL's figures from `samples`, then this port's against `floor` (the no-op worker's
    samples of the same blocks) and, in diagnostic mode, ferry's longest GIL holds (us, one per block)."""
    def col(name, rows=samples):
        return [getattr(s, name) for s in rows]

    speedup_ci = _bootstrap_median_ci(col("speedup"), seed=bootstrap_seed, num_resamples=config.bootstrap_resamples)
    efficiency_ci = _bootstrap_median_ci(col("estimated_overlap_efficiency"), seed=bootstrap_seed + 1,
                                         num_resamples=config.bootstrap_resamples)
    transfer_median = _percentile(col("transfer_only_ms"), 50)
    vs_floor = against_floor(samples, floor)
    excess = col("excess_over_floor_ms", vs_floor)
    excess_ci = _bootstrap_median_ci(excess, seed=bootstrap_seed + 2, num_resamples=config.bootstrap_resamples)
    holds = list(gil_max_hold_us)
    major, minor = torch.cuda.get_device_capability(device)
    return BenchmarkSummary(
        schema_version=_SCHEMA_VERSION, created_utc=created, device_name=torch.cuda.get_device_name(device),
        device_capability=f"{major}.{minor}", torch_version=str(torch.__version__),
        cuda_version=str(torch.version.cuda or "unknown"), seed=config.seed, schedule_seed=schedule_seed,
        bootstrap_seed=bootstrap_seed, bootstrap_resamples=config.bootstrap_resamples, num_warmup=config.num_warmup,
        num_runs=config.num_runs, total_bytes=total_bytes, num_tensors=num_tensors, dtype="torch.uint8",
        matrix_size=config.matrix_size, compute_target_ms=config.compute_target_ms, compute_iterations=iterations,
        method=method,
        compute_median_ms=_percentile(col("compute_only_ms"), 50),
        compute_p95_ms=_percentile(col("compute_only_ms"), 95),
        transfer_median_ms=transfer_median, transfer_p95_ms=_percentile(col("transfer_only_ms"), 95),
        transfer_gb_per_s=total_bytes / (transfer_median * 1_000_000),
        serialized_median_ms=_percentile(col("serialized_ms"), 50),
        serialized_p95_ms=_percentile(col("serialized_ms"), 95),
        concurrent_median_ms=_percentile(col("concurrent_ms"), 50),
        concurrent_p95_ms=_percentile(col("concurrent_ms"), 95),
        speedup_median=_percentile(col("speedup"), 50), speedup_ci_lower=speedup_ci[0],
        speedup_ci_upper=speedup_ci[1], hidden_median_ms=_percentile(col("hidden_ms"), 50),
        estimated_overlap_efficiency_median=_percentile(col("estimated_overlap_efficiency"), 50),
        estimated_overlap_efficiency_ci_lower=efficiency_ci[0],
        estimated_overlap_efficiency_ci_upper=efficiency_ci[1],
        cpu_launch_skew_p95_ms=_percentile(col("cpu_launch_skew_ms"), 95),
        layout=config.layout,
        slowdown_median_ms=_percentile(col("slowdown_ms", vs_floor), 50),
        floor_slowdown_median_ms=_percentile(col("floor_slowdown_ms", vs_floor), 50),
        excess_over_floor_median_ms=_percentile(excess, 50),
        excess_over_floor_ci_lower_ms=excess_ci[0], excess_over_floor_ci_upper_ms=excess_ci[1],
        floor_transfer_median_ms=_percentile(col("floor_transfer_ms", vs_floor), 50),
        net_transfer_median_ms=_percentile(col("net_transfer_ms", vs_floor), 50),
        overlap_bound_median=_percentile(col("overlap_bound", vs_floor), 50),
        gil_max_hold_median_us=_percentile(holds, 50) if holds else None,
        gil_max_hold_max_us=max(holds) if holds else None)


def _raw_records(samples, floor, *, created, config, schedule_seed, total_bytes, num_tensors, method):
    return [RawSampleRecord(
        schema_version=_SCHEMA_VERSION, created_utc=created, seed=config.seed, schedule_seed=schedule_seed,
        total_bytes=total_bytes, num_tensors=num_tensors, method=method, trial=s.trial,
        schedule_order=s.schedule_order, compute_only_ms=s.compute_only_ms, transfer_only_ms=s.transfer_only_ms,
        serialized_ms=s.serialized_ms, concurrent_ms=s.concurrent_ms, speedup=s.speedup, hidden_ms=s.hidden_ms,
        estimated_overlap_efficiency=s.estimated_overlap_efficiency, cpu_launch_skew_ms=s.cpu_launch_skew_ms,
        layout=config.layout, slowdown_ms=f.slowdown_ms, floor_slowdown_ms=f.floor_slowdown_ms,
        excess_over_floor_ms=f.excess_over_floor_ms, net_transfer_ms=f.net_transfer_ms,
        overlap_bound=f.overlap_bound) for s, f in zip(samples, against_floor(samples, floor))]


def _print_row(s):
    print(f"  {s.method:<15} compute={s.compute_median_ms:7.3f} ms  transfer={s.transfer_median_ms:7.3f} ms  "
          f"serialized={s.serialized_median_ms:7.3f} ms  concurrent={s.concurrent_median_ms:7.3f} ms  "
          f"speedup={s.speedup_median:5.2f}x  estimated_overlap={s.estimated_overlap_efficiency_median * 100:6.1f}%  "
          f"slowdown={s.slowdown_median_ms:6.3f} ms  excess={s.excess_over_floor_median_ms:6.3f} ms")


def _write_rows(rows, path, names):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=names)
        writer.writeheader()
        for r in rows:
            writer.writerow({n: r.get(n, "") for n in names})


def _write_csv(records, path, record_type):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    names = [f.name for f in fields(record_type)]
    with open(path, "w", encoding="utf-8", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=names)
        writer.writeheader()
        for r in records:
            writer.writerow({n: getattr(r, n) for n in names})


def _run(torch, ferry, config, device, hooks=None, diagnostics=False):
    """The whole experiment; `hooks` is ferry's test-hook module (phase stamps) or None."""
    torch.manual_seed(config.seed)
    torch.cuda.set_device(device)
    device = torch.device("cuda", torch.cuda.current_device())
    n = config.matrix_size
    left, right = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    product = torch.empty_like(left)
    compute_stream = torch.cuda.Stream(device=device)
    compute_stream.wait_stream(torch.cuda.current_stream(device))
    launch = {"first": 0, "last": 0}

    if not diagnostics:
        def run_compute_n(iterations):
            with torch.cuda.stream(compute_stream):
                for _ in range(iterations):
                    torch.mm(left, right, out=product)
            compute_stream.synchronize()
            return product
    else:
        def run_compute_n(iterations):  # the same launches, stamped after the first and the last
            with torch.cuda.stream(compute_stream):
                torch.mm(left, right, out=product)
                launch["first"] = time.perf_counter_ns()
                for _ in range(iterations - 1):
                    torch.mm(left, right, out=product)
                launch["last"] = time.perf_counter_ns()
            compute_stream.synchronize()
            return product

    run_compute_n(1)
    iterations = config.compute_iterations or _calibrate(run_compute_n, config.compute_target_ms)

    def run_compute():
        return run_compute_n(iterations)

    run_compute()
    if not torch.isfinite(product).all().item():
        raise RuntimeError("Foreground matrix multiplication produced non-finite output.")

    created = datetime.now(timezone.utc).isoformat()
    scenarios = [(mib << 20, count) for mib in config.total_mib for count in config.num_tensors]
    random.Random(config.seed).shuffle(scenarios)
    summaries, raw, diagnostic_rows = [], [], []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-d2h-benchmark") as executor:
        if diagnostics:
            runner = _DiagnosticRunner(torch, device, executor, run_compute, launch,
                                       hooks._last_phases if hooks else None)
        else:
            runner = _Runner(torch, device, executor, run_compute)
        for index, (total_bytes, count) in enumerate(scenarios):
            print(f"\n{total_bytes / (1 << 20):.0f} MiB in {count} tensor(s) ({config.layout}), {iterations} "
                  "compute iteration(s)")
            tensors = _source_tensors(torch, total_bytes, count, device, config.layout)
            torch.cuda.synchronize(device)
            native_stream = torch.cuda.Stream(device=device)

            def native(tensors=tensors, stream=native_stream):
                producer = torch.cuda.current_stream(tensors[0].device)
                if producer != stream:
                    stream.wait_stream(producer)
                with torch.cuda.stream(stream):
                    out = [t.to("cpu", non_blocking=True) for t in tensors]
                stream.synchronize()
                return out

            def with_ferry(tensors=tensors):
                return ferry.transfer_tensor_d2h(tensors, device=device)

            methods = {_METHOD_NATIVE: native, _METHOD_FERRY: with_ferry}
            expected = [t.cpu() for t in tensors]
            for transfer in methods.values():  # validate exact results, priming each method on the worker
                output, _ = runner.submit(transfer).result()
                for got, want in zip(output, expected, strict=True):
                    torch.testing.assert_close(got, want, rtol=0, atol=0)
                del output
            del expected
            methods[_METHOD_NOOP] = list  # the harness floor: a worker that returns at once
            scenario_seed = config.seed + index * 1009
            per_method = _collect(runner, methods, num_warmup=config.num_warmup, num_runs=config.num_runs,
                                  seed=scenario_seed)
            ferry_holds = []  # ferry's longest GIL hold in each concurrent block (diagnostic mode)
            if diagnostics:
                rows = _diagnostic_rows(runner.records, total_bytes, count, config.layout)
                runner.records = []
                diagnostic_rows.extend(rows)
                ferry_holds = [r["ferry_max_hold_us"] for r in rows
                               if r["method"] == _METHOD_FERRY and r.get("ferry_max_hold_us") is not None]
            floor = per_method[_METHOD_NOOP]
            for method_index, (method, samples) in enumerate(per_method.items()):
                bootstrap_seed = scenario_seed + method_index * 17
                summary = _summarize(torch, samples, floor, created=created, device=device, config=config,
                                     total_bytes=total_bytes, num_tensors=count, iterations=iterations,
                                     method=method, schedule_seed=scenario_seed, bootstrap_seed=bootstrap_seed,
                                     gil_max_hold_us=ferry_holds if method == _METHOD_FERRY else ())
                summaries.append(summary)
                _print_row(summary)
                raw.extend(_raw_records(samples, floor, created=created, config=config, schedule_seed=scenario_seed,
                                        total_bytes=total_bytes, num_tensors=count, method=method))
            del tensors
    return summaries, raw, diagnostic_rows


FLOOR_EXPLANATION = textwrap.fill(
    "How to read it: slowdown = concurrent - compute-only, what the foreground loses beside the transfer (medians "
    "over blocks); floor = the same for the no-transfer worker in the same blocks (the harness's own thread "
    "wake-ups, W); excess = slowdown - floor per block, with its 95% interval: what the transfer itself costs the "
    "foreground; net xfer = transfer-only - the no-transfer worker's (the executor's round trip). The estimated "
    "overlap, hidden / min(compute, transfer), cannot be used to rank methods in a harness with fixed costs: a "
    "concurrent block takes at least compute + W even when the transfer hides completely, so a transfer of T ms "
    "(shorter than the compute) hides at most T - W and scores at most (T - W) / T (the 'bound' column). W is "
    "the same for every method, so the faster the transfer, the lower its bound: a faster transfer scores a lower "
    "overlap for the same foreground cost. Judge by the slowdown and excess columns.", width=118)


def _print_table(summaries):
    print("\nTensors  Layout  Method            Compute Transfer  Serial. Concur.  Speedup [95% CI]       "
          "Est. overlap [95% CI]   bound  Skew p95 | Slowdown   Floor  Excess [95% CI]          Net xfer  (ms)")
    for s in sorted(summaries, key=lambda s: (s.total_bytes, s.num_tensors, s.method)):
        print(f"{s.num_tensors:>7}  {s.layout:<6}  {s.method:<16}{s.compute_median_ms:8.3f}{s.transfer_median_ms:9.3f}"
              f"{s.serialized_median_ms:9.3f}{s.concurrent_median_ms:8.3f}  "
              f"{s.speedup_median:5.3f}x [{s.speedup_ci_lower:5.3f}, {s.speedup_ci_upper:5.3f}]  "
              f"{s.estimated_overlap_efficiency_median * 100:5.1f}% "
              f"[{s.estimated_overlap_efficiency_ci_lower * 100:5.1f}, "
              f"{s.estimated_overlap_efficiency_ci_upper * 100:5.1f}] {s.overlap_bound_median * 100:5.1f}%"
              f"{s.cpu_launch_skew_p95_ms:9.3f} | {s.slowdown_median_ms:8.3f}{s.floor_slowdown_median_ms:8.3f}  "
              f"{s.excess_over_floor_median_ms:6.3f} [{s.excess_over_floor_ci_lower_ms:6.3f}, "
              f"{s.excess_over_floor_ci_upper_ms:6.3f}]  {s.net_transfer_median_ms:8.3f}")
    print(FLOOR_EXPLANATION)


# ---- command line (SPDL's names, defaults and validation, then this port's options) ------------------------------


def _at_least_two_int(value):
    parsed = int(value)
    if parsed < 2:
        raise argparse.ArgumentTypeError("must be at least 2")
    return parsed


def _positive_float(value):
    parsed = float(value)
    if parsed <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return parsed


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m ferry.bench.overlap",
                                description="Benchmark overlap between D2H transfer and CUDA compute "
                                            "(ferry against PyTorch to(cpu), beside a worker that transfers "
                                            "nothing).")
    p.add_argument("--output", type=os.path.realpath, default=os.path.realpath(DEFAULT_OUTPUT),
                   help=f"Summary CSV output path (default: {DEFAULT_OUTPUT}).")
    p.add_argument("--samples-output", type=os.path.realpath, help="Optional per-trial CSV output path.")
    p.add_argument("--device", type=cuda_device, default=default_device(), help="CUDA device to use.")
    p.add_argument("--total-mib", type=positive_int, nargs="+", default=[64],
                   help="Fixed total payload sizes in MiB.")
    p.add_argument("--num-tensors", type=positive_int, nargs="+", default=[1, 32],
                   help="Tensor counts to test for each fixed payload size.")
    p.add_argument("--matrix-size", type=positive_int, default=2048,
                   help="Square float32 matrix size for foreground torch.mm work.")
    p.add_argument("--compute-ms", type=_positive_float, default=8.0,
                   help="Independent target duration used to calibrate foreground compute.")
    p.add_argument("--compute-iterations", type=positive_int,
                   help="Skip calibration and use this many torch.mm calls per sample.")
    p.add_argument("--num-warmup", type=non_negative_int, default=5, help="Warmup blocks per scenario.")
    p.add_argument("--num-runs", type=_at_least_two_int, default=30,
                   help="Paired randomized timing blocks per scenario.")
    p.add_argument("--bootstrap-resamples", type=positive_int, default=2000,
                   help="Bootstrap resamples for paired median confidence intervals.")
    p.add_argument("--seed", type=int, default=0, help="Randomization seed.")
    p.add_argument("--layout", choices=LAYOUTS, default="even",
                   help="How the payload is cut: even (sizes differ by at most one byte; default) or mixed (one "
                        "tensor of half the payload, the rest split evenly between the others).")
    p.add_argument("--diagnostics-output", type=os.path.realpath,
                   help="Diagnostic mode: per-block timeline CSV (barrier release, launch phase, ferry's phases, "
                        "parts and GIL holds) and tables of its medians. Off by default.")
    p.add_argument("--ferry-gil-slice-us", type=non_negative_int,
                   help="ferry's longest GIL hold between release points in microseconds (0: no release points), "
                        "for A/B runs; default: ferry's own. Needs a build with test hooks.")
    p.add_argument("--ferry-gil-switch-us", type=non_negative_int,
                   help="The switch interval ferry sets while other threads exist, in microseconds (0: leave "
                        "CPython's), for A/B runs; default: ferry's own. Needs a build with test hooks.")
    return p.parse_args(argv)


def _test_hooks():
    """ferry's private test-hook functions (builds with FERRY_PYTHON_TEST_HOOKS), or None in a wheel."""
    from ferry import _ferry

    needed = ("_phase_timing", "_last_phases", "_gil_pacing")
    return _ferry if all(hasattr(_ferry, name) for name in needed) else None


def main(argv=None):
    args = _parse_args(argv)
    hooks = _test_hooks()
    pacing = (args.ferry_gil_slice_us, args.ferry_gil_switch_us)
    if pacing != (None, None) and hooks is None:
        print("overlap: --ferry-gil-slice-us and --ferry-gil-switch-us need a ferry built with its test hooks (the "
              "project's CMake build with FERRY_PYTHON_TEST_HOOKS=ON); this ferry has none.", file=sys.stderr)
        return 2
    found = torch_cuda_device("overlap", args.device, "the foreground work and the reference method need it")
    if found is None:
        return 0
    torch, device = found
    import ferry

    config = BenchmarkConfig(
        total_mib=tuple(args.total_mib), num_tensors=tuple(args.num_tensors), matrix_size=args.matrix_size,
        compute_target_ms=args.compute_ms, compute_iterations=args.compute_iterations, num_warmup=args.num_warmup,
        num_runs=args.num_runs, bootstrap_resamples=args.bootstrap_resamples, seed=args.seed, layout=args.layout)
    for mib in config.total_mib:  # a payload that cannot be cut fails before any work
        for count in config.num_tensors:
            layout_sizes(mib << 20, count, config.layout)
    diagnostics = args.diagnostics_output is not None
    print("D2H transfer / foreground CUDA compute overlap benchmark")
    print(f"Device: {torch.cuda.get_device_name(device)}")
    print(f"ferry {ferry.__version__} against PyTorch to(cpu) (a naive reference), beside a worker that transfers "
          "nothing (the harness floor); compare overlap within each method.")
    old_pacing = hooks._gil_pacing(*pacing) if hooks else None
    old_timing = hooks._phase_timing(diagnostics) if hooks else None
    if hooks:
        slice_us, switch_us = hooks._gil_pacing()
        print(f"ferry GIL pacing: slice {slice_us} us, switch interval {switch_us} us"
              + ("; diagnostic mode (timestamps on)" if diagnostics else ""))
    elif diagnostics:
        print("Diagnostic mode without ferry's test hooks: the timeline only; ferry's phases and GIL holds need "
              "the project's CMake build.")
    try:
        summaries, raw, diagnostic_rows = _run(torch, ferry, config, device, hooks, diagnostics)
    finally:
        if hooks:
            hooks._phase_timing(old_timing)
            hooks._gil_pacing(*old_pacing)
    _write_csv(summaries, args.output, BenchmarkSummary)
    if diagnostics:
        _write_rows(diagnostic_rows, args.diagnostics_output, DIAGNOSTIC_FIELDS)
        _print_diagnostics(diagnostic_rows)
        _print_gil_holds(diagnostic_rows)
    _print_table(summaries)
    print(f"\nSummary saved to: {args.output}")
    if args.samples_output:
        _write_csv(raw, args.samples_output, RawSampleRecord)
        print(f"Raw samples saved to: {args.samples_output}")
    if diagnostics:
        print(f"Diagnostics saved to: {args.diagnostics_output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
