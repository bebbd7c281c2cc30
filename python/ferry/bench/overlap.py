"""Overlap of D2H transfers with foreground CUDA compute: ferry against PyTorch ``to(cpu)``.

A port of SPDL's ``benchmark_transfer_overlap.py`` (the seed), with the same command line, defaults, validation,
randomized schedules and CSV schema, comparing ``ferry.transfer_tensor_d2h`` with the seed's reference method.

The point of a background D2H transfer is that it hides under foreground GPU work. A persistent worker thread
owns the transfers (ferry's cached copy stream, or a dedicated torch stream for the reference); the foreground
thread owns a compute stream running ``torch.mm`` on square float32 matrices, calibrated to a target duration.
Every timed block runs four cases in a shuffled order: compute only, transfer only, serialized (transfer, then
compute) and concurrent (both released together from a CPU barrier; the CPU launch skew between the two threads
is recorded). From each block's paired samples: speedup = serialized / concurrent, hidden time = serialized -
concurrent, and overlap efficiency = hidden / min(compute, transfer). Medians are reported with percentile
bootstrap 95% confidence intervals. Source tensors are created and validated (exact results) before timing;
warmup blocks prime pinned pools and allocators.

Diagnostic mode (``--diagnostics-output PATH``, off by default; not part of the seed): the same blocks, with
timestamps that show where a concurrent block loses time against compute-only. Per block and method it records
the hand-off into the block (executor wake-up and barrier: start to barrier release), the foreground's resume
after the release, its launch phase (barrier release to the last ``torch.mm`` returning, against compute-only's
start to last ``torch.mm``), the GPU tail after the launches, the worker's transfer call, and for ferry its own
phases (walk, submit, GIL hand-off window, output build, wait) from its private phase stamps. The stamps cost a
few ``perf_counter_ns`` calls per block, so a diagnostic run is not the reference run: compare its medians with
each other. The rows go to PATH and a table of medians is printed before the summary. Transfer-only blocks get
rows of their own in PATH's ``_transfer`` sibling (diag.csv -> diag_transfer.csv): the block's time, ferry's phases
in it, the worker's own account of its transfer call (wall against on-CPU time, minor page faults, voluntary and
involuntary context switches: off-CPU time shows as the difference), and, taken right after the block and
untimed, a CPU probe (call_overhead's fixed Python loop) on the worker and on the main thread with the CPU each is
on, so that a slow block can be matched with a slowed vCPU. ``--warm-transfer-first`` (a diagnostic A/B) makes the
same transfer once on the worker, off the clock, before each transfer-only block.

Harness floor (``--harness-floor``; not part of the seed): a third method whose worker returns at once runs in the
same blocks. Its transfer-only time is the executor round trip and its concurrent excess over compute is what the
harness's own thread wake-ups cost a concurrent block; a table after the summary gives each method's transfer time
and overlap efficiency net of those (see _print_harness_floor).

Usage::

    python -m ferry.bench.overlap --output /tmp/overlap.csv --num-tensors 1 32 256
    python -m ferry.bench.overlap --output /tmp/overlap.csv --compute-ms 1   # transfer longer than compute
    python -m ferry.bench.overlap --output /tmp/d.csv --num-tensors 1 256 --diagnostics-output /tmp/diag.csv

Without CUDA (or without torch) it says so and exits 0.
"""

import argparse
import csv
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from datetime import datetime, timezone

import numpy as np
from ferry.bench._gpu import torch_cuda_device
from ferry.bench.call_overhead import _cpu_probe_ms

try:
    import resource  # POSIX only: the worker's page faults and context switches in diagnostic mode
except ImportError:
    resource = None

_SCHEMA_VERSION = 1
_METHOD_NATIVE = "PyTorch to(cpu)"
_METHOD_FERRY = "ferry"
_METHOD_NOOP = "no transfer"  # --harness-floor: the harness alone, its worker returning at once
_BARRIER_TIMEOUT_S = 30


# ---- records (their field order is the CSV schema, identical to the seed's) ----------------------------------------


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


# ---- the experiment --------------------------------------------------------------------------------------------------


class _Runner:
    """The worker thread, the compute closure and the four timed schedules. As in the seed, each block's outputs are
    freed on the main thread, where the future hands them over, after the block's clock has stopped."""

    def __init__(self, torch, device, executor, run_compute, warm_first=False):
        self.torch, self.device, self.executor, self.run_compute = torch, device, executor, run_compute
        self.warm_first = warm_first

    def warm_up(self, transfer):
        """--warm-transfer-first: before a transfer-only block, off its clock, the worker makes the same transfer
        once and drops it, so that the timed call finds the caches and the allocator as a tight loop of calls leaves
        them rather than as the blocks in between did (a diagnostic A/B, not the seed's experiment)."""
        if not self.warm_first:
            return

        def work():
            self.torch.cuda.set_device(self.device)
            transfer()

        self.executor.submit(work).result()

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
        self.warm_up(transfer)
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
    """_Runner with timestamps (diagnostic mode): compute-only, transfer-only and concurrent blocks leave a record in
    `pending`, which _collect files under (trial, method, schedule) through note()."""

    def __init__(self, torch, device, executor, run_compute, launch, ferry_phases, warm_first=False):
        super().__init__(torch, device, executor, run_compute, warm_first)
        self.launch = launch              # {"first", "last"}: perf_counter_ns of the first and last torch.mm return
        self.ferry_phases = ferry_phases  # reads the worker thread's last ferry phase stamps
        self.pending = {}
        self.records = []

    def submit(self, transfer, barrier=None):
        record = self.pending = {}

        def work():
            self.torch.cuda.set_device(self.device)
            if barrier is not None:
                record["bg_arrive"] = time.perf_counter_ns()
                barrier.wait(timeout=_BARRIER_TIMEOUT_S)
            before = _thread_usage()
            started = record["bg_start"] = time.perf_counter_ns()
            output = transfer()
            record["bg_end"] = time.perf_counter_ns()
            record["bg_usage"] = _usage_delta(before, _thread_usage())
            record["phases"] = self.ferry_phases()
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

    def transfer_only(self, transfer):
        ms = super().transfer_only(transfer)
        record = self.pending
        # Untimed, right after the block: the speed of the CPU under each thread (call_overhead's probe) and the
        # CPU the worker is on. On the lent VM a vCPU can run 1.6-1.9x slower than the rest, and every phase of a
        # many-tensor call (CPU work) with it; these columns tell whether a slow block ran on a slow CPU.
        record["worker_probe_ms"], record["worker_cpu"] = self.executor.submit(_probe_this_thread).result()
        record["main_probe_ms"], record["main_cpu"] = _probe_this_thread()
        record["transfer_ms"] = ms
        return ms

    def note(self, trial, method, schedule):
        self.records.append((trial, method, schedule, self.pending))
        self.pending = {}


DIAGNOSTIC_FIELDS = [
    "total_bytes", "num_tensors", "method", "trial", "compute_only_ms", "compute_launch_ms", "concurrent_ms",
    "excess_ms", "handoff_ms", "fg_resume_ms", "first_mm_ms", "launch_ms", "launch_excess_ms", "gpu_tail_ms",
    "gpu_tail_excess_ms", "result_ms", "bg_resume_ms", "transfer_call_ms", "ferry_walk_ms", "ferry_submit_ms",
    "ferry_handoff_ms", "ferry_build_ms", "ferry_wait_ms", "ferry_finish_ms", "ferry_built_after_release_ms"]

_FERRY_PHASES = [("first", "start", "first_part"), ("walk", "start", "walked"), ("wait", "walked", "waited"),
                 ("finish", "waited", "finished")]


def _median(values):
    """The median of the values given (None and "" left out), NaN when none are."""
    values = [v for v in values if v is not None and v != ""]
    return _percentile(values, 50) if values else float("nan")


def _by_scenario_and_method(rows):
    """(num_tensors, method, rows) for each (total_bytes, num_tensors, method) in rows, sorted."""
    keys = sorted({(r["total_bytes"], r["num_tensors"], r["method"]) for r in rows})
    for total, n, method in keys:
        yield n, method, [r for r in rows if (r["total_bytes"], r["num_tensors"], r["method"]) == (total, n, method)]


def _ferry_phase_columns(phases, since_ns):
    """ferry_<phase>_ms columns from the worker's last phase stamps, if they belong to a call that started at or
    after since_ns (and not to an older call on the same worker)."""
    if not phases or phases.get("start") is None or phases["start"] < since_ns:
        return {}
    return {f"ferry_{name}_ms": _ms(phases[a], phases[b]) for name, a, b in _FERRY_PHASES
            if phases.get(a) is not None and phases.get(b) is not None}


def _probe_this_thread():
    """(the CPU probe on the calling thread in ms, the CPU it is running on: field 39 of /proc/thread-self/stat)."""
    probe_ms = _cpu_probe_ms(repeats=5)
    try:
        with open("/proc/thread-self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        cpu = -1
    return probe_ms, cpu


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None) if resource else None  # Linux's


def _thread_usage():
    """(CPU time of the calling thread in ms, its minor page faults, voluntary and involuntary context switches; the
    last three None where the platform cannot tell one thread's)."""
    cpu_ms = time.thread_time_ns() / 1e6
    if _RUSAGE_THREAD is None:
        return cpu_ms, None, None, None
    ru = resource.getrusage(_RUSAGE_THREAD)
    return cpu_ms, ru.ru_minflt, ru.ru_nvcsw, ru.ru_nivcsw


# What the transfer call cost its thread, the differences of _thread_usage() across it. On-CPU time well under the
# call's wall time means the thread was off the CPU (preempted, or blocked: on the GIL, a lock, the copies); equal to
# it means the time went to work on the CPU, where caches and clock speed decide.
_USAGE_FIELDS = ["worker_call_cpu_ms", "worker_call_minflt", "worker_call_nvcsw", "worker_call_nivcsw"]


def _usage_delta(before, after):
    return {k: None if a is None or b is None else b - a for k, a, b in zip(_USAGE_FIELDS, before, after)}

TRANSFER_DIAGNOSTIC_FIELDS = [
    "total_bytes", "num_tensors", "method", "trial", "transfer_ms", "worker_probe_ms", "worker_cpu", "main_probe_ms",
    "main_cpu", "worker_call_ms", *_USAGE_FIELDS, "ferry_walk_ms", "ferry_submit_ms", "ferry_handoff_ms",
    "ferry_build_ms", "ferry_wait_ms", "ferry_finish_ms"]


def _transfer_rows(records, total_bytes, num_tensors):
    """Per (trial, method): the transfer-only block, ferry's phases in it and the CPU probes taken after it."""
    rows = []
    for trial, method, schedule, r in records:
        if schedule != "transfer" or "transfer_ms" not in r:
            continue
        row = dict(total_bytes=total_bytes, num_tensors=num_tensors, method=method, trial=trial,
                   **{k: r[k] for k in ("transfer_ms", "worker_probe_ms", "worker_cpu", "main_probe_ms", "main_cpu")},
                   worker_call_ms=_ms(r["bg_start"], r["bg_end"]), **r["bg_usage"])
        row.update(_ferry_phase_columns(r.get("phases"), r["bg_start"]))
        rows.append(row)
    return rows


def _print_transfer_diagnostics(rows):
    """Medians of the transfer-only blocks, and the transfer time split by the worker's CPU probe: if the blocks
    whose worker sat on a slow CPU are the slow ones, the harness's slowdown is the VM's and not the harness's."""
    print("\nTransfer-only blocks (medians, ms; probe = call_overhead's CPU probe on that thread right after the "
          "block, lower is faster)")
    print(f"{'Tensors':>7}  {'Method':<16}{'xfer':>7}{'worker probe':>13}{'main probe':>11}"
          f"{'xfer | fast worker':>19}{'xfer | slow worker':>19}  ferry walk/submit/handoff/build/wait")
    for n, method, g in _by_scenario_and_method(rows):
        probe = _median([r["worker_probe_ms"] for r in g])
        fast = _median([r["transfer_ms"] for r in g if r["worker_probe_ms"] <= probe])
        slow = _median([r["transfer_ms"] for r in g if r["worker_probe_ms"] > probe])
        ferry = ""
        if any(r.get("ferry_walk_ms") is not None for r in g):
            ferry = "/".join(f"{_median([r.get(f'ferry_{p}_ms') for r in g]):.3f}"
                             for p in ("walk", "submit", "handoff", "build", "wait"))
        print(f"{n:>7}  {method:<16}{_median([r['transfer_ms'] for r in g]):7.3f}{probe:13.2f}"
              f"{_median([r['main_probe_ms'] for r in g]):11.2f}{fast:19.3f}{slow:19.3f}  {ferry}")
    cpus = sorted({r["worker_cpu"] for r in rows})
    print(f"worker thread seen on CPUs {cpus}; fast/slow worker: the blocks whose worker probe is at or below / "
          "above its median")
    print("The worker's transfer call in those blocks (medians): wall and on-CPU time (ms), minor page faults, "
          "voluntary and involuntary context switches")
    print(f"{'Tensors':>7}  {'Method':<16}{'wall':>8}{'on CPU':>8}{'faults':>8}{'vol cs':>8}{'invol cs':>9}")
    for n, method, g in _by_scenario_and_method(rows):
        m = {k: _median([r.get(k) for r in g]) for k in ("worker_call_ms", *_USAGE_FIELDS)}
        print(f"{n:>7}  {method:<16}{m['worker_call_ms']:8.3f}{m['worker_call_cpu_ms']:8.3f}"
              f"{m['worker_call_minflt']:8.0f}{m['worker_call_nvcsw']:8.0f}{m['worker_call_nivcsw']:9.0f}")


def _diagnostic_rows(records, total_bytes, num_tensors):
    """Per (trial, method): the concurrent block's timeline against the same trial's compute-only block (ms).

    concurrent - compute = handoff + fg_resume + launch_excess + gpu_tail_excess + result, where
      handoff          start -> barrier release (executor wake-up + barrier; the release is the later arrival)
      fg_resume        release -> the foreground passes the barrier (its wake-up, and the GIL if the worker has it)
      launch_excess    (foreground pass -> last torch.mm returned) - (compute-only start -> last torch.mm)
      gpu_tail_excess  (last torch.mm -> compute synchronized) - the same in compute-only
      result           compute synchronized -> the worker's future collected
    launch_ms is the foreground's launch phase asked for: barrier release -> last torch.mm returned."""
    compute = {trial: r for trial, method, schedule, r in records if schedule == "compute"}
    rows = []
    for trial, method, schedule, r in records:
        c = compute.get(trial)
        if schedule != "concurrent" or not c or "end" not in r:
            continue
        release = max(r["fg_arrive"], r["bg_arrive"])
        compute_launch = _ms(c["start"], c["last"])
        compute_tail = _ms(c["last"], c["compute_end"])
        row = dict(total_bytes=total_bytes, num_tensors=num_tensors, method=method, trial=trial,
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
        ferry = _ferry_phase_columns(r.get("phases"), r["bg_pass"])
        row.update(ferry)
        if ferry and r["phases"].get("built") is not None:
            row["ferry_built_after_release_ms"] = _ms(release, r["phases"]["built"])
        rows.append(row)
    return rows


def _print_diagnostics(rows):
    """Medians per (tensors, method) of the timeline pieces (medians do not add up exactly)."""
    print("\nDiagnostics (medians, ms): excess = concurrent - compute ~ handoff + resume + launch+ + tail+ + "
          "result; launch = barrier release -> last torch.mm returned (compute-only: start -> last torch.mm)")
    print(f"{'Tensors':>7}  {'Method':<16}{'excess':>7}{'handoff':>8}{'resume':>7}{'launch+':>8}{'tail+':>7}"
          f"{'result':>7}  {'1st mm':>7}{'launch':>7}{'(alone)':>8}  {'xfer':>6}  ferry walk/submit/handoff/build")
    for n, method, g in _by_scenario_and_method(rows):
        col = {k: _median([r.get(k) for r in g]) for k in DIAGNOSTIC_FIELDS[4:]}
        ferry = ""
        if col["ferry_walk_ms"] == col["ferry_walk_ms"]:
            ferry = "/".join(f"{col[f'ferry_{p}_ms']:.3f}" for p in ("walk", "submit", "handoff", "build"))
        print(f"{n:>7}  {method:<16}{col['excess_ms']:7.3f}{col['handoff_ms']:8.3f}{col['fg_resume_ms']:7.3f}"
              f"{col['launch_excess_ms']:8.3f}{col['gpu_tail_excess_ms']:7.3f}{col['result_ms']:7.3f}  "
              f"{col['first_mm_ms']:7.3f}{col['launch_ms']:7.3f}{col['compute_launch_ms']:8.3f}  "
              f"{col['transfer_call_ms']:6.3f}  {ferry}")


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


def _source_tensors(torch, total_bytes, num_tensors, device):
    if num_tensors > total_bytes:
        raise ValueError(f"Cannot split {total_bytes} bytes into {num_tensors} nonempty tensors.")
    size, rest = divmod(total_bytes, num_tensors)
    return [torch.randint(0, 256, (size + (i < rest),), dtype=torch.uint8, device=device)
            for i in range(num_tensors)]


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
                if note:
                    note(trial, method, "transfer")
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


def _summarize(torch, samples, *, created, device, config, total_bytes, num_tensors, iterations, method,
               schedule_seed, bootstrap_seed):
    def col(name):
        return [getattr(s, name) for s in samples]

    speedup_ci = _bootstrap_median_ci(col("speedup"), seed=bootstrap_seed, num_resamples=config.bootstrap_resamples)
    efficiency_ci = _bootstrap_median_ci(col("estimated_overlap_efficiency"), seed=bootstrap_seed + 1,
                                         num_resamples=config.bootstrap_resamples)
    transfer_median = _percentile(col("transfer_only_ms"), 50)
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
        cpu_launch_skew_p95_ms=_percentile(col("cpu_launch_skew_ms"), 95))


def _print_row(s):
    print(f"  {s.method:<6} compute={s.compute_median_ms:7.3f} ms  transfer={s.transfer_median_ms:7.3f} ms  "
          f"serialized={s.serialized_median_ms:7.3f} ms  concurrent={s.concurrent_median_ms:7.3f} ms  "
          f"speedup={s.speedup_median:5.2f}x  estimated_overlap={s.estimated_overlap_efficiency_median * 100:6.1f}%")


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


def _run(torch, ferry, config, device, diagnostics=False, harness_floor=False, warm_first=False):
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
    summaries, raw, diagnostic_rows, transfer_rows = [], [], [], []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-d2h-benchmark") as executor:
        if diagnostics:
            from ferry import _ferry

            runner = _DiagnosticRunner(torch, device, executor, run_compute, launch, _ferry._last_phases,
                                       warm_first)
        else:
            runner = _Runner(torch, device, executor, run_compute, warm_first)
        for index, (total_bytes, count) in enumerate(scenarios):
            print(f"\n{total_bytes / (1 << 20):.0f} MiB in {count} tensor(s), {iterations} compute iteration(s)")
            tensors = _source_tensors(torch, total_bytes, count, device)
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
            if harness_floor:
                methods[_METHOD_NOOP] = list
            scenario_seed = config.seed + index * 1009
            per_method = _collect(runner, methods, num_warmup=config.num_warmup, num_runs=config.num_runs,
                                  seed=scenario_seed)
            if diagnostics:
                diagnostic_rows.extend(_diagnostic_rows(runner.records, total_bytes, count))
                transfer_rows.extend(_transfer_rows(runner.records, total_bytes, count))
                runner.records = []
            for method_index, (method, samples) in enumerate(per_method.items()):
                bootstrap_seed = scenario_seed + method_index * 17
                summary = _summarize(torch, samples, created=created, device=device, config=config,
                                     total_bytes=total_bytes, num_tensors=count, iterations=iterations,
                                     method=method, schedule_seed=scenario_seed, bootstrap_seed=bootstrap_seed)
                summaries.append(summary)
                _print_row(summary)
                raw.extend(RawSampleRecord(
                    schema_version=_SCHEMA_VERSION, created_utc=created, seed=config.seed,
                    schedule_seed=scenario_seed, total_bytes=total_bytes, num_tensors=count, method=method,
                    trial=s.trial, schedule_order=s.schedule_order, compute_only_ms=s.compute_only_ms,
                    transfer_only_ms=s.transfer_only_ms, serialized_ms=s.serialized_ms,
                    concurrent_ms=s.concurrent_ms, speedup=s.speedup, hidden_ms=s.hidden_ms,
                    estimated_overlap_efficiency=s.estimated_overlap_efficiency,
                    cpu_launch_skew_ms=s.cpu_launch_skew_ms) for s in samples)
            del tensors
    return summaries, raw, diagnostic_rows, transfer_rows


def _print_harness_floor(raw):
    """--harness-floor: what the seed's harness costs by itself, and each method's figures net of it.

    The no-transfer method runs the same blocks with a worker that returns at once. Its transfer-only time is the
    executor round trip R (two thread wake-ups), and its concurrent - compute (same block) is the harness's own
    excess W (executor and barrier wake-ups before the compute starts). A method can hide at most T - W of its
    transfer-only time T behind the compute in this harness, so per block: overlap net of the harness =
    (serialized - concurrent) / (T - W), and transfer net of the harness = T - R. Medians over blocks."""
    by_key = {}
    for r in raw:
        by_key.setdefault((r.total_bytes, r.num_tensors, r.trial), {})[r.method] = r
    rows = {}
    for (total, n, _), block in by_key.items():
        floor = block.get(_METHOD_NOOP)
        if floor is None:
            continue
        w = floor.concurrent_ms - floor.compute_only_ms
        for method, r in block.items():
            if method == _METHOD_NOOP:
                continue
            d = rows.setdefault((total, n, method), {"R": [], "W": [], "net_t": [], "net_eff": []})
            d["R"].append(floor.transfer_only_ms)
            d["W"].append(w)
            d["net_t"].append(r.transfer_only_ms - floor.transfer_only_ms)
            possible = r.transfer_only_ms - w
            if possible > 0:
                d["net_eff"].append((r.serialized_ms - r.concurrent_ms) / possible)
    if not rows:
        return
    print("\nHarness floor (a worker that returns at once, in the same blocks): R = its transfer-only (executor round "
          "trip), W = its concurrent - compute; net of the harness: transfer - R, and (serialized - concurrent) / "
          "(transfer - W). Medians over blocks, ms.")
    print(f"{'Tensors':>7}  {'Method':<16}{'R':>7}{'W':>7}{'transfer-R':>11}{'overlap net':>12}")
    for (total, n, method), d in sorted(rows.items()):
        eff = f"{_median(d['net_eff']) * 100:10.1f}%" if d["net_eff"] else f"{'n/a':>11}"
        print(f"{n:>7}  {method:<16}{_median(d['R']):7.3f}{_median(d['W']):7.3f}{_median(d['net_t']):11.3f} {eff}")


def _print_table(summaries):
    print("\nTensors  Method           Compute    Transfer  Serialized  Concurrent  Paired speedup (95% CI)   "
          "Overlap (95% CI)        Skew p95")
    for s in sorted(summaries, key=lambda s: (s.total_bytes, s.num_tensors, s.method)):
        print(f"{s.num_tensors:>7}  {s.method:<15} {s.compute_median_ms:7.3f} ms {s.transfer_median_ms:7.3f} ms "
              f"{s.serialized_median_ms:8.3f} ms {s.concurrent_median_ms:8.3f} ms  "
              f"{s.speedup_median:5.3f}x [{s.speedup_ci_lower:5.3f}, {s.speedup_ci_upper:5.3f}]  "
              f"{s.estimated_overlap_efficiency_median * 100:5.1f}% [{s.estimated_overlap_efficiency_ci_lower * 100:5.1f}, "
              f"{s.estimated_overlap_efficiency_ci_upper * 100:5.1f}]  {s.cpu_launch_skew_p95_ms:6.3f} ms")


# ---- command line (names, defaults and validation as the seed's) ------------------------------------------------


def _positive_int(value):
    parsed = int(value)
    if parsed <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return parsed


def _non_negative_int(value):
    parsed = int(value)
    if parsed < 0:
        raise argparse.ArgumentTypeError("must be non-negative")
    return parsed


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
    p = argparse.ArgumentParser(description="Benchmark overlap between D2H transfer and CUDA compute "
                                            "(ferry against PyTorch to(cpu)).")
    p.add_argument("--output", type=os.path.realpath, required=True, help="Summary CSV output path.")
    p.add_argument("--samples-output", type=os.path.realpath, help="Optional per-trial CSV output path.")
    p.add_argument("--device", default="cuda:0", help="CUDA device to use.")
    p.add_argument("--total-mib", type=_positive_int, nargs="+", default=[64],
                   help="Fixed total payload sizes in MiB.")
    p.add_argument("--num-tensors", type=_positive_int, nargs="+", default=[1, 32],
                   help="Tensor counts to test for each fixed payload size.")
    p.add_argument("--matrix-size", type=_positive_int, default=2048,
                   help="Square float32 matrix size for foreground torch.mm work.")
    p.add_argument("--compute-ms", type=_positive_float, default=8.0,
                   help="Independent target duration used to calibrate foreground compute.")
    p.add_argument("--compute-iterations", type=_positive_int,
                   help="Skip calibration and use this many torch.mm calls per sample.")
    p.add_argument("--num-warmup", type=_non_negative_int, default=5, help="Warmup blocks per scenario.")
    p.add_argument("--num-runs", type=_at_least_two_int, default=30,
                   help="Paired randomized timing blocks per scenario.")
    p.add_argument("--bootstrap-resamples", type=_positive_int, default=2000,
                   help="Bootstrap resamples for paired median confidence intervals.")
    p.add_argument("--seed", type=int, default=0, help="Randomization seed.")
    # Not in the seed: diagnostics and ferry's own setting, both off / at ferry's default unless given.
    p.add_argument("--diagnostics-output", type=os.path.realpath,
                   help="Diagnostic mode: per-block timeline CSV (barrier release, launch phase, ferry's phases) "
                        "and a table of its medians; transfer-only blocks with CPU probes go to PATH's _transfer "
                        "sibling. Off by default.")
    p.add_argument("--ferry-gil-handoff-us", type=_non_negative_int,
                   help="ferry's GIL hand-off window in microseconds (0: none), for A/B runs; default: ferry's "
                        "own. A setting of the library, not of the harness.")
    p.add_argument("--gc-freeze", action="store_true",
                   help="gc.freeze() once everything is imported, so that the cyclic garbage collector's full "
                        "collections skip the modules' objects (a diagnostic; not part of the seed).")
    p.add_argument("--warm-transfer-first", action="store_true",
                   help="Before each transfer-only block, off its clock, run the same transfer once on the worker "
                        "and drop it, so the timed call starts from the state a tight loop of calls leaves (a "
                        "diagnostic A/B: whether the harness's slower calls come from the state the other blocks "
                        "leave behind; not part of the seed).")
    p.add_argument("--harness-floor", action="store_true",
                   help="Also run a method whose worker returns at once, and print each method's transfer time and "
                        "overlap net of the harness's own thread hand-offs (not part of the seed).")
    return p.parse_args(argv)


def _transfer_diagnostics_path(path):
    """The transfer-only blocks' rows go beside the concurrent blocks': diag.csv -> diag_transfer.csv."""
    root, ext = os.path.splitext(path)
    return f"{root}_transfer{ext or '.csv'}"


def main(argv=None):
    args = _parse_args(argv)
    found = torch_cuda_device("overlap", args.device, "the foreground work and the reference method need it")
    if found is None:
        return 0
    torch, device = found
    import ferry

    config = BenchmarkConfig(
        total_mib=tuple(args.total_mib), num_tensors=tuple(args.num_tensors), matrix_size=args.matrix_size,
        compute_target_ms=args.compute_ms, compute_iterations=args.compute_iterations, num_warmup=args.num_warmup,
        num_runs=args.num_runs, bootstrap_resamples=args.bootstrap_resamples, seed=args.seed)
    from ferry import _ferry

    if args.ferry_gil_handoff_us is not None:
        _ferry._gil_handoff_us(args.ferry_gil_handoff_us)
    diagnostics = args.diagnostics_output is not None
    print("D2H transfer / foreground CUDA compute overlap benchmark")
    print(f"Device: {torch.cuda.get_device_name(device)}")
    print(f"ferry {ferry.__version__} against PyTorch to(cpu) (a naive reference); compare overlap within each "
          "method.")
    print(f"ferry GIL hand-off window: {_ferry._gil_handoff_us()} us"
          + ("; diagnostic mode (timestamps on)" if diagnostics else ""))
    if args.gc_freeze:
        import gc

        gc.collect()
        gc.freeze()
        print(f"gc.freeze(): {gc.get_freeze_count()} objects left out of collections")
    old_timing = _ferry._phase_timing(diagnostics)
    try:
        summaries, raw, diagnostic_rows, transfer_rows = _run(torch, ferry, config, device, diagnostics,
                                                               args.harness_floor, args.warm_transfer_first)
    finally:
        _ferry._phase_timing(old_timing)
    _write_csv(summaries, args.output, BenchmarkSummary)
    if diagnostics:
        _write_rows(diagnostic_rows, args.diagnostics_output, DIAGNOSTIC_FIELDS)
        _write_rows(transfer_rows, _transfer_diagnostics_path(args.diagnostics_output), TRANSFER_DIAGNOSTIC_FIELDS)
        _print_diagnostics(diagnostic_rows)
        _print_transfer_diagnostics(transfer_rows)
    _print_table(summaries)
    if args.harness_floor:
        _print_harness_floor(raw)
    print(f"\nSummary saved to: {args.output}")
    if args.samples_output:
        _write_csv(raw, args.samples_output, RawSampleRecord)
        print(f"Raw samples saved to: {args.samples_output}")
    if diagnostics:
        transfer_path = _transfer_diagnostics_path(args.diagnostics_output)
        print(f"Diagnostics saved to: {args.diagnostics_output} and {transfer_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
