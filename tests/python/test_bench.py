"""The Python benchmarks' logic, on the CPU: the overlap benchmark's schema (SPDL's columns first, then ferry's),
statistics, the harness floor's arithmetic, randomized schedules, layouts and diagnostic timeline, the call-overhead
summary, the bandwidth grid and CSV, every main() end to end on a numpy stand-in for torch (fake_torch.py), with and
without ferry's test hooks, the plotter on every ferry CSV schema, and the no-CUDA exits."""

import csv
import dataclasses
import importlib.util
import io
import os
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest
from ferry import _ferry
from ferry.bench import bandwidth, call_overhead, overlap, plot

sys.path.insert(0, os.path.dirname(__file__))
import fake_torch  # noqa: E402

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="matplotlib not installed")
needs_test_hooks = pytest.mark.skipif(not hasattr(_ferry, "_gil_pacing"),
                                      reason="ferry built without its test hooks")

# SPDL's benchmark_transfer_overlap.py CSV columns, in order (_SCHEMA_VERSION = 1).
SPDL_SUMMARY = """schema_version created_utc device_name device_capability torch_version cuda_version seed
schedule_seed bootstrap_seed bootstrap_resamples num_warmup num_runs total_bytes num_tensors dtype matrix_size
compute_target_ms compute_iterations method compute_median_ms compute_p95_ms transfer_median_ms transfer_p95_ms
transfer_gb_per_s serialized_median_ms serialized_p95_ms concurrent_median_ms concurrent_p95_ms speedup_median
speedup_ci_lower speedup_ci_upper hidden_median_ms estimated_overlap_efficiency_median
estimated_overlap_efficiency_ci_lower estimated_overlap_efficiency_ci_upper cpu_launch_skew_p95_ms""".split()
SPDL_RAW = """schema_version created_utc seed schedule_seed total_bytes num_tensors method trial schedule_order
compute_only_ms transfer_only_ms serialized_ms concurrent_ms speedup hidden_ms estimated_overlap_efficiency
cpu_launch_skew_ms""".split()
# ferry's columns after them.
FERRY_SUMMARY = """layout slowdown_median_ms floor_slowdown_median_ms excess_over_floor_median_ms
excess_over_floor_ci_lower_ms excess_over_floor_ci_upper_ms floor_transfer_median_ms net_transfer_median_ms
overlap_bound_median gil_max_hold_median_us gil_max_hold_max_us""".split()
FERRY_RAW = "layout slowdown_ms floor_slowdown_ms excess_over_floor_ms net_transfer_ms overlap_bound".split()


def test_overlap_csv_has_spdls_columns_first_and_in_order_then_ferrys():
    assert overlap._SCHEMA_VERSION == 1
    assert [f.name for f in dataclasses.fields(overlap.BenchmarkSummary)] == SPDL_SUMMARY + FERRY_SUMMARY
    assert [f.name for f in dataclasses.fields(overlap.RawSampleRecord)] == SPDL_RAW + FERRY_RAW


def test_overlap_command_line_keeps_spdls_defaults_and_validation():
    args = overlap._parse_args(["--output", "x.csv"])
    assert (args.total_mib, args.num_tensors, args.matrix_size, args.compute_ms, args.compute_iterations,
            args.num_warmup, args.num_runs, args.bootstrap_resamples, args.seed, args.device) == \
        ([64], [1, 32], 2048, 8.0, None, 5, 30, 2000, 0, "cuda:0")
    for bad in (["--num-runs", "1"], ["--num-tensors", "0"], ["--compute-ms", "0"], ["--num-warmup", "-1"],
                ["--layout", "odd"], ["--ferry-gil-slice-us", "-1"]):
        with pytest.raises(SystemExit):
            overlap._parse_args(["--output", "x"] + bad)


@pytest.mark.parametrize("module", [overlap, bandwidth, call_overhead])
def test_benchmarks_check_their_device_and_take_local_rank_as_the_default(module, monkeypatch):
    for bad in ("gpu3", "cuda:x", "-1"):
        with pytest.raises(SystemExit) as e:
            module._parse_args(["--device", bad])
        assert e.value.code == 2
    assert module._parse_args(["--device", "2"]).device == "cuda:2"
    monkeypatch.setenv("LOCAL_RANK", "3")
    importlib.reload(module)
    try:
        assert module._parse_args([]).device == "cuda:3"
    finally:
        monkeypatch.delenv("LOCAL_RANK")
        importlib.reload(module)
    assert module._parse_args([]).device == "cuda:0"


@pytest.mark.parametrize("module", [overlap, bandwidth, call_overhead])
def test_usage_names_the_command_that_runs_the_benchmark(module, capsys):
    with pytest.raises(SystemExit):
        module._parse_args(["--help"])
    assert capsys.readouterr().out.startswith(f"usage: python -m {module.__name__} ")


def test_call_overhead_refuses_negative_counts_and_times():
    for bad in (["--warmup", "-5"], ["--evict-mib", "-1"], ["--sleep-before-ms", "nan"], ["--sleep-before-ms", "-1"]):
        with pytest.raises(SystemExit):
            call_overhead._parse_args(bad)


def test_overlap_output_defaults_to_spdls_documented_path():
    assert overlap._parse_args([]).output == os.path.realpath("/tmp/transfer_overlap.csv")


def test_overlap_options_beyond_spdls_are_off_by_default():
    args = overlap._parse_args([])
    assert args.diagnostics_output is None and args.layout == "even"
    assert args.ferry_gil_slice_us is None and args.ferry_gil_switch_us is None


def test_sample_statistics():
    s = overlap.OverlapSample(0, "x", compute_only_ms=8.0, transfer_only_ms=2.0, serialized_ms=10.0,
                              concurrent_ms=8.5, cpu_launch_skew_ms=0.01)
    assert s.speedup == pytest.approx(10 / 8.5)
    assert s.hidden_ms == pytest.approx(1.5)
    assert s.estimated_overlap_efficiency == pytest.approx(0.75)


def test_bootstrap_interval_is_deterministic_and_brackets_the_median():
    values = [1.0, 1.1, 1.2, 1.15, 1.05, 1.3, 0.95, 1.12, 1.18, 1.08]
    lo, hi = overlap._bootstrap_median_ci(values, seed=7, num_resamples=2000)
    assert (lo, hi) == overlap._bootstrap_median_ci(values, seed=7, num_resamples=2000)
    assert lo <= overlap._percentile(values, 50) <= hi


# ---- overlap: the harness floor's arithmetic, on hand-made blocks ----------------------------------------------


def _sample(trial, compute, transfer, serialized, concurrent):
    return overlap.OverlapSample(trial, "", compute_only_ms=compute, transfer_only_ms=transfer,
                                 serialized_ms=serialized, concurrent_ms=concurrent, cpu_launch_skew_ms=0.01)


# Three blocks. The no-op worker: concurrent - compute W = 0.3, 0.1, 0.5; round trip R = 0.4, 0.2, 0.6.
FLOOR = [_sample(0, 8.0, 0.4, 8.4, 8.3), _sample(1, 8.0, 0.2, 8.2, 8.1), _sample(2, 9.0, 0.6, 9.6, 9.5)]
# A method: slowdown 0.4, 0.9, 0.6 -> excess 0.1, 0.8, 0.1; transfer 1.7, 1.7, 2.3 -> net 1.3, 1.5, 1.7. The
# medians of the per-block differences (excess 0.1, net 1.5) differ from the differences of the medians (0.3, 1.3).
METHOD = [_sample(0, 8.0, 1.7, 9.7, 8.4), _sample(1, 8.0, 1.7, 9.7, 8.9), _sample(2, 9.0, 2.3, 11.3, 9.6)]


def test_floor_comparison_pairs_each_block_with_the_no_op_workers_same_block():
    rows = overlap.against_floor(METHOD, list(reversed(FLOOR)))  # paired by trial, not by position
    assert [r.trial for r in rows] == [0, 1, 2]
    assert [r.slowdown_ms for r in rows] == pytest.approx([0.4, 0.9, 0.6])
    assert [r.floor_slowdown_ms for r in rows] == pytest.approx([0.3, 0.1, 0.5])
    assert [r.excess_over_floor_ms for r in rows] == pytest.approx([0.1, 0.8, 0.1])
    assert [r.floor_transfer_ms for r in rows] == pytest.approx([0.4, 0.2, 0.6])
    assert [r.net_transfer_ms for r in rows] == pytest.approx([1.3, 1.5, 1.7])
    # (T - W) / min(compute, T): the most the estimated overlap can score when the transfer hides completely.
    assert [r.overlap_bound for r in rows] == pytest.approx([1.4 / 1.7, 1.6 / 1.7, 1.8 / 2.3])


def test_a_fully_hidden_transfer_scores_exactly_its_bound_and_a_faster_one_scores_lower():
    # Both hide completely (concurrent = the floor's): same foreground cost, yet the faster transfer scores less.
    floor = [_sample(0, 8.0, 0.4, 8.4, 8.3)]
    for transfer, score in ((1.7, 1.4 / 1.7), (0.9, 0.6 / 0.9)):
        method = [_sample(0, 8.0, transfer, 8.0 + transfer, 8.3)]
        (row,) = overlap.against_floor(method, floor)
        assert method[0].estimated_overlap_efficiency == pytest.approx(row.overlap_bound) == pytest.approx(score)
        assert row.excess_over_floor_ms == pytest.approx(0.0)


def test_the_overlap_bound_of_a_transfer_longer_than_the_compute_is_the_compute_hidden_whole():
    floor = [_sample(0, 8.0, 0.4, 8.4, 8.3)]
    (row,) = overlap.against_floor([_sample(0, 8.0, 12.0, 20.0, 12.0)], floor)
    assert row.overlap_bound == pytest.approx(1.0)  # hides all 8 ms of compute: 8 / min(8, 12)
    (row,) = overlap.against_floor([_sample(0, 8.0, 8.2, 16.2, 8.3)], floor)
    assert row.overlap_bound == pytest.approx(7.9 / 8.0)  # 8.2 - 0.3 of the compute's 8 ms at most


def _summary(samples, floor, method="ferry", holds=()):
    config = overlap.BenchmarkConfig(total_mib=(64,), num_tensors=(1,), matrix_size=2048, compute_target_ms=8.0,
                                     compute_iterations=None, num_warmup=0, num_runs=len(samples),
                                     bootstrap_resamples=200, seed=0, layout="mixed")
    return overlap._summarize(fake_torch.make_torch(), samples, floor, created="now", device="cuda:0",
                              config=config, total_bytes=64 << 20, num_tensors=1, iterations=10, method=method,
                              schedule_seed=0, bootstrap_seed=0, gil_max_hold_us=holds)


def test_summary_reports_medians_of_the_per_block_differences():
    s = _summary(METHOD, FLOOR)
    assert s.slowdown_median_ms == pytest.approx(0.6) and s.floor_slowdown_median_ms == pytest.approx(0.3)
    assert s.excess_over_floor_median_ms == pytest.approx(0.1)
    assert s.excess_over_floor_ci_lower_ms <= 0.1 + 1e-9 <= s.excess_over_floor_ci_upper_ms + 2e-9
    assert s.floor_transfer_median_ms == pytest.approx(0.4) and s.net_transfer_median_ms == pytest.approx(1.5)
    assert s.overlap_bound_median == pytest.approx(1.4 / 1.7) and s.layout == "mixed"


def test_summary_keeps_spdls_figures_as_spdl_computes_them():
    s = _summary(METHOD, FLOOR)
    assert (s.compute_median_ms, s.transfer_median_ms, s.serialized_median_ms, s.concurrent_median_ms) == \
        pytest.approx((8.0, 1.7, 9.7, 8.9))
    assert s.hidden_median_ms == pytest.approx(1.3)  # serialized - concurrent: 1.3, 0.8, 1.7
    # The median of the per-block ratios 1.3 / 1.7, 0.8 / 1.7, 1.7 / 2.3 (not a ratio of medians).
    assert s.estimated_overlap_efficiency_median == pytest.approx(1.7 / 2.3)
    assert s.transfer_gb_per_s == pytest.approx((64 << 20) / 1.7e6)


def test_the_no_op_workers_own_row_is_the_floor_with_no_excess():
    s = _summary(FLOOR, FLOOR, method=overlap._METHOD_NOOP)
    assert s.slowdown_median_ms == pytest.approx(s.floor_slowdown_median_ms) == pytest.approx(0.3)
    assert s.excess_over_floor_median_ms == 0 and s.net_transfer_median_ms == 0


def test_summary_gil_columns_are_the_median_and_max_of_the_blocks_longest_holds_and_empty_without_them():
    s = _summary(METHOD, FLOOR, holds=[30.0, 45.0, 38.0])
    assert (s.gil_max_hold_median_us, s.gil_max_hold_max_us) == (38.0, 45.0)
    s = _summary(METHOD, FLOOR)
    assert s.gil_max_hold_median_us is None and s.gil_max_hold_max_us is None


def test_raw_records_carry_each_blocks_comparison_with_the_floor():
    config = overlap.BenchmarkConfig((64,), (1,), 2048, 8.0, None, 0, 3, 200, 0, "even")
    rows = overlap._raw_records(METHOD, FLOOR, created="now", config=config, schedule_seed=0, total_bytes=1,
                                num_tensors=1, method="ferry")
    assert [r.excess_over_floor_ms for r in rows] == pytest.approx([0.1, 0.8, 0.1])
    assert [r.net_transfer_ms for r in rows] == pytest.approx([1.3, 1.5, 1.7])
    assert [r.hidden_ms for r in rows] == pytest.approx([1.3, 0.8, 1.7]) and rows[0].layout == "even"


def test_table_prints_the_floor_columns_and_explains_the_estimated_overlaps_bound(capsys):
    overlap._print_table([_summary(METHOD, FLOOR), _summary(FLOOR, FLOOR, method=overlap._METHOD_NOOP)])
    out = capsys.readouterr().out
    ferry_row = next(line for line in out.splitlines() if " ferry " in line)
    assert "|    0.600   0.300   0.100 [" in ferry_row and ferry_row.endswith("   1.500")
    assert "82.4%" in ferry_row  # the bound, (1.7 - 0.3) / 1.7
    assert "(T - W) / T" in out and "Judge by the slowdown" in out


# ---- overlap: schedules, layouts --------------------------------------------------------------------------------


class FakeRunner:
    """Deterministic timings, recording the order the schedules ran in."""

    def __init__(self):
        self.log = []

    def run_compute(self):
        self.log.append("compute")

    def compute_only(self):
        self.log.append("compute")
        return 8.0

    def transfer_only(self, transfer):
        self.log.append(f"{transfer}:transfer")
        return 2.0

    def serialized(self, transfer):
        self.log.append(f"{transfer}:serialized")
        return 10.0

    def concurrent(self, transfer):
        self.log.append(f"{transfer}:concurrent")
        return 8.5, 0.02


def test_blocks_run_every_schedule_once_in_a_seeded_random_order():
    runner = FakeRunner()
    methods = {"A": "A", "B": "B"}
    samples = overlap._collect(runner, methods, num_warmup=0, num_runs=6, seed=3)
    assert set(samples) == {"A", "B"} and all(len(v) == 6 for v in samples.values())
    orders = [s.schedule_order for s in samples["A"]]
    assert len(set(orders)) > 1  # shuffled
    for order in orders:
        assert sorted(order.split("|")) == sorted(["compute"] + [f"{m}:{s}" for m in "AB"
                                                                 for s in ("transfer", "serialized", "concurrent")])
    again = overlap._collect(FakeRunner(), methods, num_warmup=0, num_runs=6, seed=3)
    assert [s.schedule_order for s in again["A"]] == orders
    assert samples["B"][0].estimated_overlap_efficiency == pytest.approx(0.75)


def test_even_layout_is_spdls_split():
    assert bandwidth.layout_sizes(10, 4) == [3, 3, 2, 2] == bandwidth.split_sizes(10, 4)
    assert bandwidth.layout_sizes(64 << 20, 16384) == [4096] * 16384


def test_mixed_layout_is_half_the_payload_in_one_tensor_and_the_rest_split_evenly():
    sizes = bandwidth.layout_sizes(64 << 20, 16384, "mixed")
    assert len(sizes) == 16384 and sum(sizes) == 64 << 20
    assert sizes[0] == 32 << 20 and max(sizes[1:]) - min(sizes[1:]) <= 1
    assert bandwidth.layout_sizes(11, 4, "mixed") == [5, 2, 2, 2]
    assert bandwidth.layout_sizes(7, 1, "mixed") == [7]


def test_layouts_refuse_payloads_that_cannot_give_every_tensor_a_byte():
    with pytest.raises(ValueError, match="Cannot split 4 bytes into 5 nonempty"):
        bandwidth.layout_sizes(4, 5)
    with pytest.raises(ValueError, match="one tensor of 2 bytes and 4 nonempty"):
        bandwidth.layout_sizes(5, 5, "mixed")  # 5 bytes: 2 in the big one, 3 left for 4 tensors
    with pytest.raises(ValueError, match="unknown layout"):
        bandwidth.layout_sizes(8, 2, "odd")


def test_source_tensors_follow_the_layout():
    torch = fake_torch.make_torch()
    tensors = overlap._source_tensors(torch, 1 << 20, 16384, "cuda:0", "mixed")
    assert [t.numel() for t in tensors] == bandwidth.layout_sizes(1 << 20, 16384, "mixed")
    assert all(t.dtype == torch.uint8 and t.device == "cuda:0" for t in tensors)


def test_benchmarks_exit_zero_without_cuda(capsys, no_cuda, tmp_path):
    assert overlap.main(["--output", str(tmp_path / "o.csv")]) == 0
    assert overlap.main([]) == 0  # --output is optional
    assert call_overhead.main(["--output", str(tmp_path / "c.csv")]) == 0
    assert bandwidth.main(["--output", str(tmp_path / "b.csv")]) == 0
    assert call_overhead.main(["--in-thread", "--output", str(tmp_path / "t.csv")]) == 0  # from a worker thread
    out = capsys.readouterr().out
    assert out.count("Nothing to do") == 5


def test_call_overhead_cpu_probe_measures_a_positive_time():
    assert 0 < call_overhead._cpu_probe_ms(repeats=3) < 10_000


# ---- overlap: diagnostic mode ---------------------------------------------------------------------------------------


def _phases(start, max_hold_us=40.0, parts=3):
    return {"start": start, "first_part": start + 1000, "walked": start + 5000, "waited": start + 9000,
            "finished": start + 10000, "max_hold_ns": int(max_hold_us * 1000), "holds": 4,
            "hold_hist": (1, 2, 1, 0, 0, 0, 0, 0), "parts": parts}


def test_diagnostic_timeline_adds_up_to_the_excess_and_reads_ferry_phases_and_gil_holds(capsys):
    """concurrent - compute = handoff + fg_resume + launch_excess + gpu_tail_excess + result, block by block."""
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(set_device=lambda d: None))
    launch = {"first": 0, "last": 0}

    def run_compute():
        time.sleep(0.001)
        launch["first"] = time.perf_counter_ns()
        time.sleep(0.001)
        launch["last"] = time.perf_counter_ns()
        time.sleep(0.002)

    calls = {}

    def transfer():
        start = time.perf_counter_ns()
        time.sleep(0.001)
        calls["phases"] = _phases(start)
        return [1]

    with ThreadPoolExecutor(max_workers=1) as executor:
        runner = overlap._DiagnosticRunner(fake, 0, executor, run_compute, launch, lambda: calls.get("phases"))
        samples = overlap._collect(runner, {"ferry": transfer, "other": lambda: [2]}, num_warmup=1, num_runs=3,
                                   seed=5)
    assert all(len(v) == 3 for v in samples.values())
    rows = overlap._diagnostic_rows(runner.records, 64 << 20, 32, "mixed")
    assert sorted((r["method"], r["trial"]) for r in rows) == [(m, t) for m in ("ferry", "other") for t in range(3)]
    for r in rows:
        parts = r["handoff_ms"] + r["fg_resume_ms"] + r["launch_excess_ms"] + r["gpu_tail_excess_ms"] + r["result_ms"]
        assert r["excess_ms"] == pytest.approx(parts, abs=1e-6)
        assert 0 < r["first_mm_ms"] < r["launch_ms"] and r["compute_launch_ms"] > 0
        assert r["num_tensors"] == 32 and r["total_bytes"] == 64 << 20 and r["layout"] == "mixed"
        assert set(r) <= set(overlap.DIAGNOSTIC_FIELDS)
    ferry_rows = [r for r in rows if r["method"] == "ferry"]
    for r in ferry_rows:
        assert (r["ferry_first_part_ms"], r["ferry_walk_submit_ms"], r["ferry_wait_ms"], r["ferry_finish_ms"]) == \
            pytest.approx((0.001, 0.005, 0.004, 0.001))
        assert (r["ferry_parts"], r["ferry_holds"], r["ferry_max_hold_us"]) == (3, 4, 40.0)
        assert [r[f"ferry_holds_{b}"] for b in overlap.HOLD_BUCKETS] == [1, 2, 1, 0, 0, 0, 0, 0]
        assert r["ferry_walked_after_release_ms"] > 0
    # The other method's block must not pick up ferry's stamps from an earlier call on the same worker.
    assert all("ferry_walk_submit_ms" not in r and "ferry_max_hold_us" not in r
               for r in rows if r["method"] == "other")
    overlap._print_diagnostics(rows)
    overlap._print_gil_holds(rows)
    out = capsys.readouterr().out
    assert "0.001/0.005/0.004/0.001, 3" in out
    gil_row = next(line for line in out.split("GIL holds")[1].splitlines() if " ferry " in line)
    assert gil_row.split()[2:] == ["40.0", "40.0", "4", "3", "3", "6", "3", "0", "0", "0", "0", "0"]


def test_diagnostic_rows_without_test_hooks_keep_the_timeline_and_leave_ferrys_columns_out():
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(set_device=lambda d: None))
    launch = {"first": 0, "last": 0}

    def run_compute():
        launch["first"] = launch["last"] = time.perf_counter_ns()

    with ThreadPoolExecutor(max_workers=1) as executor:
        runner = overlap._DiagnosticRunner(fake, 0, executor, run_compute, launch, None)
        overlap._collect(runner, {"ferry": lambda: [1]}, num_warmup=0, num_runs=2, seed=1)
    rows = overlap._diagnostic_rows(runner.records, 1, 1)
    assert len(rows) == 2 and all("excess_ms" in r and "ferry_max_hold_us" not in r for r in rows)


def test_outputs_are_freed_on_the_main_thread():
    """As in SPDL's benchmark, every block's outputs are dropped on the main thread, after its clock stopped."""
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(set_device=lambda d: None))
    freed_on = []

    class Output:
        def __del__(self):
            freed_on.append(threading.get_ident())

    with ThreadPoolExecutor(max_workers=1) as executor:
        runner = overlap._Runner(fake, 0, executor, lambda: None)
        runner.transfer_only(lambda: [Output()])
        runner.serialized(lambda: [Output()])
        runner.concurrent(lambda: [Output()])
    assert freed_on == [threading.get_ident()] * 3


# ---- call overhead ------------------------------------------------------------------------------------------------


def test_call_overhead_summary_reads_the_small_rows_and_prints_ferrys_phases_and_parts():
    rows = [dict(experiment="e2e", num_tensors=1, method="raw copy", median_ms=1.3)]
    for n, parts in ((1, 1), (256, 4)):
        rows += [dict(experiment="e2e", num_tensors=n, method=m, median_ms=v, parts=parts if m == "ferry" else "")
                 for m, v in (("ferry", 1.25), ("ferry async", 1.26), ("ferry submit", 0.04), ("ferry wait", 1.22),
                              ("torch to(cpu)", 1.8), ("ferry: first part", 0.01), ("ferry: walk+submit", 0.1),
                              ("ferry: wait", 1.1), ("ferry: finish", 0.02))]
    rows += [dict(experiment="small", num_tensors=1, method=m, median_ms=v)
             for m, v in (("torch to(cpu)", 0.026), ("ferry", 0.009), ("ferry bare", 0.0085))]
    args = types.SimpleNamespace(total_mib=64, repeats=30, num_tensors=[1, 256], small_bytes=1024, layout="mixed")
    out = io.StringIO()
    sys.stdout, saved = out, sys.stdout
    try:
        call_overhead._print_table(rows, args, {1: {"ferry": 0.0, "ferry async": 0.1}})
    finally:
        sys.stdout = saved
    text = out.getvalue()
    assert "nan" not in text  # the small rows are looked up by tensor count, not by byte count
    assert "torch to(cpu) 26.0 us, ferry [t] 9.0 us (0.35x, target <=1.5 ok), ferry t 8.5 us (0.33x)" in text
    assert "1.260ms =  0.040ms +  1.220ms" in text and "(mixed layout)" in text
    assert "    256  first part 0.010  walk+submit 0.100  wait 1.100  finish 0.020  parts 4" in text
    assert "first part 0.010  walk+submit 0.100  wait 1.100  finish 0.020  parts 1  gc ferry 0.000" in text


def test_call_overhead_verdict_says_n_a_for_a_missing_row():
    assert call_overhead._verdict(float("nan"), 1.5) == "n/a"
    assert call_overhead._verdict(1.2, 1.5) == "ok" and call_overhead._verdict(1.6, 1.5) == "MISS"


# ---- bandwidth -----------------------------------------------------------------------------------------------------


def test_bandwidth_grid_matches_the_c_benchmark():
    args = bandwidth._parse_args([])
    assert args.sizes == [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    assert args.num_tensors == [1, 32, 256, 4096, 16384] and args.repeats == 11
    grid = bandwidth.cells(args.sizes, args.num_tensors)
    assert (4096, 4096) not in grid and (4096, 1024) not in grid and (4096, 256) in grid  # tensors >= 4 bytes
    assert (1 << 30, 16384) in grid and len(grid) == 33
    assert bandwidth.split_sizes(10, 4) == [3, 3, 2, 2]
    assert [bandwidth.parse_size(t) for t in ("4K", "64m", "1G", "1MiB", "512")] == [4096, 64 << 20, 1 << 30,
                                                                                    1 << 20, 512]
    with pytest.raises(Exception):
        bandwidth.parse_size("1T")


def test_bandwidth_rows_are_formatted_as_the_c_benchmark_writes_them():
    row = bandwidth.format_row("d2h", 67108864, 256, "ferry python", 1.2862, 1.25)
    assert list(row) == bandwidth.FIELDS
    assert bandwidth.FIELDS == "direction,total_bytes,num_tensors,method,median_ms,gb_per_s,ratio_to_limit".split(",")
    assert row == dict(direction="d2h", total_bytes=67108864, num_tensors=256, method="ferry python",
                       median_ms="1.28620", gb_per_s="52.176", ratio_to_limit="1.0290")


def test_bandwidth_timer_skips_over_budget_and_checks_the_first_output():
    seen = []
    assert bandwidth._timed(lambda: time.sleep(0.01) or [1], 100, lambda: None, budget_s=0.5,
                            check=seen.append) is None
    assert seen == [[1]]
    assert bandwidth._timed(lambda: 7, 5, lambda: None, budget_s=0.5) >= 0


# ---- every main() on the stand-in ------------------------------------------------------------------------------


def test_bandwidth_main_on_a_stand_in(monkeypatch, tmp_path, capsys):
    fake_torch.install(monkeypatch)
    path = tmp_path / "py_bandwidth.csv"
    assert bandwidth.main(["--output", str(path), "--sizes", "4K", "64K", "--num-tensors", "1", "32", "4096",
                           "--repeats", "2"]) == 0
    with open(path, newline="") as f:
        assert f.readline().strip() == ",".join(bandwidth.FIELDS)
    rows = list(csv.DictReader(open(path, newline="")))
    cells = {(r["direction"], int(r["total_bytes"]), int(r["num_tensors"])) for r in rows}
    assert (("d2h", 4096, 4096) not in cells) and ("h2d", 65536, 4096) in cells and len(cells) == 2 * 5
    methods = {(r["direction"], r["method"]) for r in rows}
    assert methods == {("d2h", "limit (1 raw copy)"), ("d2h", "torch to(cpu) loop"), ("d2h", "ferry python"),
                       ("h2d", "limit (1 raw copy)"), ("h2d", "torch to(cuda) loop"), ("h2d", "ferry python")}
    assert all(r["ratio_to_limit"] == "1.0000" for r in rows if r["method"].startswith("limit"))
    assert "ferry python" in capsys.readouterr().out
    # A budget nothing fits in: every torch cell skipped and listed, the rest of the grid still measured.
    assert bandwidth.main(["--output", str(path), "--sizes", "4K", "--num-tensors", "1", "32", "--repeats", "2",
                           "--torch-budget-s", "1e-12"]) == 0
    rows = list(csv.DictReader(open(path, newline="")))
    assert not [r for r in rows if r["method"].startswith("torch")] and len(rows) == 2 * 2 * 2
    assert "PyTorch cells skipped" in capsys.readouterr().out


def test_bandwidth_main_catches_wrong_bytes(monkeypatch, tmp_path):
    fake_torch.install(monkeypatch)
    import ferry

    def corrupt(batch, **kw):
        out = fake_torch._d2h(batch)
        out[-1].a[-1] ^= 1
        return out

    monkeypatch.setattr(ferry, "transfer_tensor_d2h", corrupt)
    with pytest.raises(RuntimeError, match="wrong bytes"):
        bandwidth.main(["--output", str(tmp_path / "b.csv"), "--sizes", "4K", "--num-tensors", "32",
                        "--repeats", "1", "--directions", "d2h"])


def test_call_overhead_main_on_a_stand_in(monkeypatch, tmp_path, capsys):
    fake_torch.install(monkeypatch)
    path = tmp_path / "c.csv"
    assert call_overhead.main(["--output", str(path), "--total-mib", "1", "--num-tensors", "1", "8",
                               "--repeats", "3", "--warmup", "1", "--small-calls", "20"]) == 0
    out = capsys.readouterr().out
    summary = out.split("one 1024-byte tensor:")[1]
    assert "nan" not in summary and "target <=1.5" in summary
    with open(path, newline="") as f:
        assert f.readline().strip() == ",".join(call_overhead.FIELDS)
    rows = list(csv.DictReader(open(path, newline="")))
    methods = {r["method"] for r in rows if r["experiment"] == "e2e" and r["num_tensors"] == "8"}
    assert {"ferry", "ferry async", "ferry submit", "ferry wait", "torch to(cpu)"} <= methods
    assert {r["layout"] for r in rows if r["experiment"] == "e2e" and r["method"] != "raw copy"} == {"even"}


def test_call_overhead_main_moves_16384_tensors_in_the_mixed_layout(monkeypatch, tmp_path, capsys):
    fake_torch.install(monkeypatch)
    seen = []
    real = fake_torch._d2h

    def d2h(batch, **kw):
        seen.append([t.numel() for t in batch] if isinstance(batch, list) else None)
        return real(batch, **kw)

    monkeypatch.setattr(sys.modules["ferry"], "transfer_tensor_d2h", d2h)
    path = tmp_path / "c.csv"
    assert call_overhead.main(["--output", str(path), "--total-mib", "1", "--num-tensors", "16384", "--layout",
                               "mixed", "--repeats", "2", "--warmup", "0", "--small-calls", "5"]) == 0
    assert seen[0] == bandwidth.layout_sizes(1 << 20, 16384, "mixed")
    rows = list(csv.DictReader(open(path, newline="")))
    assert {(r["num_tensors"], r["layout"]) for r in rows if r["method"] == "ferry" and r["experiment"] == "e2e"} \
        == {("16384", "mixed")}


def test_call_overhead_main_catches_wrong_bytes_in_the_mixed_layout(monkeypatch, tmp_path):
    fake_torch.install(monkeypatch)

    def corrupt(batch, **kw):
        out = fake_torch._d2h(batch)
        out[-1].a[-1] ^= 1
        return out

    monkeypatch.setattr(sys.modules["ferry"], "transfer_tensor_d2h", corrupt)
    with pytest.raises(RuntimeError, match="wrong bytes for 64 tensors"):
        call_overhead.main(["--output", str(tmp_path / "c.csv"), "--total-mib", "1", "--num-tensors", "64",
                            "--layout", "mixed", "--repeats", "1", "--warmup", "0"])


# ---- overlap main() on the stand-in -------------------------------------------------------------------------------


def _overlap_args(tmp_path, *extra, counts=("1", "4")):
    return ["--output", str(tmp_path / "py_overlap.csv"), "--num-tensors", *counts, "--total-mib", "1",
            "--matrix-size", "16", "--compute-iterations", "2", "--num-runs", "3", "--num-warmup", "1",
            "--bootstrap-resamples", "20", *extra]


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_overlap_main_runs_the_no_op_worker_in_every_block_and_writes_spdls_columns_first(monkeypatch, tmp_path,
                                                                                          capsys):
    fake_torch.install(monkeypatch)
    samples_path = str(tmp_path / "samples.csv")
    assert overlap.main(_overlap_args(tmp_path, "--samples-output", samples_path)) == 0
    with open(tmp_path / "py_overlap.csv", newline="") as f:
        assert f.readline().strip().split(",") == SPDL_SUMMARY + FERRY_SUMMARY
    with open(samples_path, newline="") as f:
        assert f.readline().strip().split(",") == SPDL_RAW + FERRY_RAW
    rows = _read(tmp_path / "py_overlap.csv")
    assert sorted((r["num_tensors"], r["method"]) for r in rows) == sorted(
        (n, m) for n in ("1", "4") for m in ("PyTorch to(cpu)", "ferry", "no transfer"))
    for r in rows:
        assert r["gil_max_hold_median_us"] == r["gil_max_hold_max_us"] == ""  # not in diagnostic mode
        assert r["layout"] == "even"
    floor = [r for r in rows if r["method"] == "no transfer"]
    assert all(float(r["excess_over_floor_median_ms"]) == 0 and float(r["net_transfer_median_ms"]) == 0
               for r in floor)
    raw = _read(samples_path)
    for r in raw:
        assert "no transfer:concurrent" in r["schedule_order"] and "no transfer:transfer" in r["schedule_order"]
        assert float(r["excess_over_floor_ms"]) == pytest.approx(float(r["slowdown_ms"]) -
                                                                 float(r["floor_slowdown_ms"]))
    out = capsys.readouterr().out
    assert "Slowdown   Floor  Excess [95% CI]" in out and "(T - W) / T" in out


def test_overlap_main_writes_the_default_output_without_output(monkeypatch, tmp_path):
    fake_torch.install(monkeypatch)
    monkeypatch.setattr(overlap, "DEFAULT_OUTPUT", str(tmp_path / "default.csv"))
    args = _overlap_args(tmp_path)[2:]  # without --output
    assert overlap.main(args) == 0
    assert len(_read(tmp_path / "default.csv")) == 2 * 3


def test_overlap_main_moves_16384_tensors_in_the_mixed_layout(monkeypatch, tmp_path):
    fake_torch.install(monkeypatch)
    args = _overlap_args(tmp_path, "--layout", "mixed", "--num-runs", "2", "--num-warmup", "0", counts=("16384",))
    assert overlap.main(args) == 0
    rows = _read(tmp_path / "py_overlap.csv")
    assert {(r["num_tensors"], r["layout"]) for r in rows} == {("16384", "mixed")} and len(rows) == 3


def test_overlap_main_validates_the_mixed_layout_byte_for_byte(monkeypatch, tmp_path):
    fake_torch.install(monkeypatch)

    def corrupt(batch, **kw):  # one bit of the last small tensor
        out = fake_torch._d2h(batch)
        out[-1].a[-1] ^= 1
        return out

    monkeypatch.setattr(sys.modules["ferry"], "transfer_tensor_d2h", corrupt)
    with pytest.raises(AssertionError):
        overlap.main(_overlap_args(tmp_path, "--layout", "mixed", counts=("64",)))


def test_overlap_main_refuses_a_payload_its_layout_cannot_cut_before_any_work(monkeypatch, tmp_path):
    fake_torch.install(monkeypatch)
    with pytest.raises(ValueError, match="nonempty"):
        overlap.main(_overlap_args(tmp_path, counts=("1", str((1 << 20) + 1))))
    assert not (tmp_path / "py_overlap.csv").exists()


@needs_test_hooks
def test_overlap_main_with_diagnostics_reads_ferrys_gil_holds_sets_its_pacing_then_every_csv_plots(
        monkeypatch, tmp_path, capsys):
    fake_torch.install(monkeypatch)
    ferry = sys.modules["ferry"]
    calls = []

    def d2h(batch, **kw):  # the stand-in's copy, with phase stamps as ferry's test hooks give them
        start = time.perf_counter_ns()
        out = fake_torch._d2h(batch)
        calls.append(_phases(start, max_hold_us=10.0 * (len(calls) % 5 + 1), parts=2))
        return out

    monkeypatch.setattr(ferry, "transfer_tensor_d2h", d2h)
    monkeypatch.setattr(_ferry, "_last_phases", lambda: calls[-1] if calls else None)
    before = _ferry._gil_pacing()
    files = {k: str(tmp_path / f"{k}.csv") for k in ("py_overlap", "py_overlap_samples", "py_diag")}
    assert overlap.main(_overlap_args(tmp_path, "--samples-output", files["py_overlap_samples"],
                                      "--diagnostics-output", files["py_diag"], "--ferry-gil-slice-us", "20",
                                      "--ferry-gil-switch-us", "30")) == 0
    assert _ferry._gil_pacing() == before  # set for the run, restored after
    out = capsys.readouterr().out
    assert "ferry GIL pacing: slice 20 us, switch interval 30 us; diagnostic mode" in out
    assert "Diagnostics (medians, ms)" in out and "ferry's GIL holds in the concurrent blocks" in out
    diag = _read(files["py_diag"])
    # 2 tensor counts x 3 methods (PyTorch, ferry, no transfer) x 3 blocks
    assert len(diag) == 2 * 3 * 3 and list(diag[0]) == overlap.DIAGNOSTIC_FIELDS
    assert all(r["ferry_max_hold_us"] == "" for r in diag if r["method"] != "ferry")
    for r in _read(files["py_overlap"]):
        if r["method"] != "ferry":
            assert r["gil_max_hold_median_us"] == r["gil_max_hold_max_us"] == ""
            continue
        holds = [float(d["ferry_max_hold_us"]) for d in diag
                 if d["method"] == "ferry" and d["num_tensors"] == r["num_tensors"]]
        assert len(holds) == 3 and all(d["ferry_parts"] == "2" for d in diag if d["method"] == "ferry")
        assert float(r["gil_max_hold_median_us"]) == sorted(holds)[1]
        assert float(r["gil_max_hold_max_us"]) == max(holds)
    if importlib.util.find_spec("matplotlib") is None:
        return
    assert plot.main(list(files.values()) + ["--out-dir", str(tmp_path / "png")]) == 0
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == [
        "py_diag_excess.png", "py_overlap_efficiency.png", "py_overlap_samples_distributions.png",
        "py_overlap_speedup.png"]


def _without_test_hooks(monkeypatch):
    for name in ("_phase_timing", "_last_phases", "_gil_pacing"):
        monkeypatch.delattr(_ferry, name, raising=False)


def test_overlap_pacing_options_fail_clearly_without_test_hooks(monkeypatch, tmp_path, capsys):
    fake_torch.install(monkeypatch)
    _without_test_hooks(monkeypatch)
    assert overlap.main(_overlap_args(tmp_path, "--ferry-gil-slice-us", "20")) == 2
    assert "need a ferry built with its test hooks" in capsys.readouterr().err
    assert not (tmp_path / "py_overlap.csv").exists()


def test_overlap_runs_without_test_hooks_and_its_diagnostics_keep_the_timeline(monkeypatch, tmp_path, capsys):
    fake_torch.install(monkeypatch)
    _without_test_hooks(monkeypatch)
    assert overlap.main(_overlap_args(tmp_path)) == 0
    diag_path = str(tmp_path / "diag.csv")
    assert overlap.main(_overlap_args(tmp_path, "--diagnostics-output", diag_path)) == 0
    assert "Diagnostic mode without ferry's test hooks" in capsys.readouterr().out
    diag = _read(diag_path)
    assert len(diag) == 2 * 3 * 3 and all(r["excess_ms"] != "" and r["ferry_max_hold_us"] == "" for r in diag)
    assert all(r["gil_max_hold_max_us"] == "" for r in _read(tmp_path / "py_overlap.csv"))


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


@needs_matplotlib
def test_plots_from_both_schemas(tmp_path):
    summary = []
    for n in (1, 32, 256):
        for method, speed in (("ferry", 1.25), ("PyTorch to(cpu)", 1.16)):
            row = {name: 0 for name in SPDL_SUMMARY}
            row.update(total_bytes=64 << 20, num_tensors=n, method=method, device_name="Test GPU",
                       speedup_median=speed, speedup_ci_lower=speed - 0.01, speedup_ci_upper=speed + 0.01,
                       estimated_overlap_efficiency_median=0.9, estimated_overlap_efficiency_ci_lower=0.88,
                       estimated_overlap_efficiency_ci_upper=0.93)
            summary.append(row)
    write_rows(tmp_path / "overlap.csv", summary)
    bandwidth = [dict(direction=d, total_bytes=64 << 20, num_tensors=n, method=m, median_ms=1.3, gb_per_s=g,
                      ratio_to_limit=1.0)
                 for d in ("d2h", "h2d") for n in (1, 32, 256, 4096)
                 for m, g in (("ferry", 50 - n / 1000), ("raw 1 copy (limit)", 55))]
    bandwidth.append(dict(direction="d2h", total_bytes=96 << 20, num_tensors=1, method="cold first call",
                          median_ms=7.9, gb_per_s=12.7, ratio_to_limit=""))
    write_rows(tmp_path / "bandwidth.csv", bandwidth)
    written = []
    assert plot.main([str(tmp_path / "overlap.csv"), str(tmp_path / "bandwidth.csv"),
                      "--out-dir", str(tmp_path / "png")]) == 0
    written = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert written == ["bandwidth_bandwidth.png", "overlap_efficiency.png", "overlap_speedup.png"]
    assert all((tmp_path / "png" / name).stat().st_size > 10_000 for name in written)


def test_plot_rejects_unknown_csv(tmp_path):
    write_rows(tmp_path / "x.csv", [{"a": 1}])
    with pytest.raises(ValueError, match="not a ferry benchmark CSV"):
        plot.plot_file(str(tmp_path / "x.csv"), str(tmp_path))


@needs_matplotlib
def test_plot_skips_unknown_and_empty_csvs_with_a_message_and_plots_the_rest(tmp_path, capsys):
    write_rows(tmp_path / "x.csv", [{"a": 1}])
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header_only.csv").write_text(",".join(SPDL_SUMMARY) + "\n")
    samples = []
    for trial in range(5):
        for method, speed in (("ferry", 1.16), ("raw cuMemcpyAsync loop", 1.15)):
            row = {name: 0 for name in SPDL_RAW}
            row.update(total_bytes=64 << 20, num_tensors=256, method=method, trial=trial, speedup=speed + trial / 100,
                       estimated_overlap_efficiency=0.95 + trial / 100, concurrent_ms=7.9, compute_only_ms=7.9)
            samples.append(row)
    write_rows(tmp_path / "overlap_samples.csv", samples)  # SPDL's samples schema, as the C bench writes it
    paths = [str(tmp_path / n) for n in ("x.csv", "empty.csv", "header_only.csv", "overlap_samples.csv")]
    assert plot.main(paths + ["--out-dir", str(tmp_path / "png")]) == 0
    err = capsys.readouterr().err
    assert "x.csv: not a ferry benchmark CSV" in err and "empty.csv" in err and "without rows" in err
    assert [p.name for p in (tmp_path / "png").iterdir()] == ["overlap_samples_distributions.png"]
    assert plot.main([paths[0], "--out-dir", str(tmp_path / "png")]) == 1  # nothing plottable at all


@needs_matplotlib
def test_plot_draws_the_c_and_python_bandwidth_tables_together(tmp_path, capsys):
    c_rows = [dict(direction=d, total_bytes=t, num_tensors=n, method=m, median_ms=1.0, gb_per_s=g,
                   ratio_to_limit=1.0)
              for d in ("d2h", "h2d") for t in (4096, 64 << 20) for n in (1, 32, 256)
              for m, g in (("limit (1 raw copy)", 55), ("ferry", 50 - n / 100), ("raw per-tensor loop", 40))]
    c_rows.append(dict(direction="d2h", total_bytes=96 << 20, num_tensors=1, method="cold first call",
                       median_ms=7.9, gb_per_s=12.7, ratio_to_limit=""))
    py_rows = [dict(direction=d, total_bytes=t, num_tensors=n, method=m, median_ms=1.0, gb_per_s=g,
                    ratio_to_limit=1.0)
               for d in ("d2h", "h2d") for t in (4096, 64 << 20) for n in (1, 32, 256)
               for m, g in (("limit (1 raw copy)", 54), ("ferry python", 49), (bandwidth.TORCH[d], 30))]
    write_rows(tmp_path / "bandwidth.csv", c_rows)
    write_rows(tmp_path / "py_bandwidth.csv", py_rows)
    sources = [("bandwidth", c_rows), ("py_bandwidth", py_rows)]
    assert plot.main([str(tmp_path / "bandwidth.csv"), str(tmp_path / "py_bandwidth.csv"),
                      "--out-dir", str(tmp_path / "png")]) == 0
    assert [p.name for p in (tmp_path / "png").iterdir()] == ["bandwidth_combined.png"]
    assert plot._size_label(4096) == "4 KiB" and plot._size_label(1 << 30) == "1 GiB"
    assert plot._size_label(96 << 20) == "96 MiB" and plot._size_label(1536) == "1.5 KiB"
    # Same-named methods of the two files are told apart by file; the others keep their names.
    import matplotlib.pyplot as plt

    labels = []
    real_legend = plt.Figure.legend

    def spy(self, *a, handles=(), **kw):
        labels.extend(h.get_label() for h in handles)
        return real_legend(self, *a, handles=handles, **kw)

    plt.Figure.legend = spy
    try:
        plot.plot_bandwidth_grid([(s, [dict(r, total_bytes=str(r["total_bytes"])) for r in rows])
                                  for s, rows in sources], "x", str(tmp_path), "t")
    finally:
        plt.Figure.legend = real_legend
    assert "limit (1 raw copy) [bandwidth]" in labels and "limit (1 raw copy) [py_bandwidth]" in labels
    assert "ferry" in labels and "ferry python" in labels and "torch to(cpu) loop" in labels


def test_the_python_call_probe_has_help_and_says_so_without_a_gpu():
    """tools/probe_python_calls.py: --help, and without a GPU (or torch) a line saying so and exit status 0."""
    import subprocess
    probe = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "probe_python_calls.py")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    shown = subprocess.run([sys.executable, probe, "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert shown.returncode == 0 and "usage: probe_python_calls.py" in shown.stdout
    ran = subprocess.run([sys.executable, probe, "64"], capture_output=True, text=True, timeout=300, env=env)
    assert ran.returncode == 0 and "nothing to measure" in ran.stdout


def test_the_gpu_suite_script_lists_its_parts_refuses_unknown_ones_and_archives_a_failing_run(tmp_path):
    """tools/h200_suite.sh: --help lists the parts and ARCHIVE; an unknown part is a usage error (2) that runs
    nothing; a part that fails (here: no build to run) makes the run fail, and ARCHIVE holds its log and the suite's."""
    import subprocess
    import tarfile
    suite = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "h200_suite.sh")
    shown = subprocess.run(["bash", suite, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "usage: tools/h200_suite.sh" in shown.stdout
    assert "pycheckpointquick" in shown.stdout and "ARCHIVE" in shown.stdout
    results, archive = tmp_path / "results", tmp_path / "run.tar.gz"
    env = dict(os.environ, BUILD=str(tmp_path / "no-build"), ARCHIVE=str(archive))
    unknown = subprocess.run(["bash", suite, "--results", str(results), "no-such-part"], capture_output=True,
                             text=True, timeout=60, env=env)
    assert unknown.returncode == 2 and "unknown part 'no-such-part'" in unknown.stdout
    assert not archive.exists()
    failed = subprocess.run(["bash", suite, "--results", str(results), "tests"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert failed.returncode != 0 and "failed parts: tests" in failed.stdout
    with tarfile.open(archive) as tar:
        names = {os.path.normpath(n) for n in tar.getnames()}
    assert {"suite.log", "tests.log"} <= names
