"""The Python benchmarks' logic, on the CPU: the overlap benchmark's schema (SPDL's), statistics, randomized
schedules and diagnostic timeline, the call-overhead summary, the bandwidth grid and CSV, every main() end to end
on a numpy stand-in for torch (fake_torch.py), the plotter on every ferry CSV schema, and the no-CUDA exits."""

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
from ferry.bench import bandwidth, call_overhead, overlap, plot

sys.path.insert(0, os.path.dirname(__file__))
import fake_torch  # noqa: E402

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="matplotlib not installed")

# SPDL's CSV columns, in order (benchmark_transfer_overlap.py, _SCHEMA_VERSION = 1).
SEED_SUMMARY = """schema_version created_utc device_name device_capability torch_version cuda_version seed
schedule_seed bootstrap_seed bootstrap_resamples num_warmup num_runs total_bytes num_tensors dtype matrix_size
compute_target_ms compute_iterations method compute_median_ms compute_p95_ms transfer_median_ms transfer_p95_ms
transfer_gb_per_s serialized_median_ms serialized_p95_ms concurrent_median_ms concurrent_p95_ms speedup_median
speedup_ci_lower speedup_ci_upper hidden_median_ms estimated_overlap_efficiency_median
estimated_overlap_efficiency_ci_lower estimated_overlap_efficiency_ci_upper cpu_launch_skew_p95_ms""".split()
SEED_RAW = """schema_version created_utc seed schedule_seed total_bytes num_tensors method trial schedule_order
compute_only_ms transfer_only_ms serialized_ms concurrent_ms speedup hidden_ms estimated_overlap_efficiency
cpu_launch_skew_ms""".split()


def test_overlap_csv_schema_is_the_seeds():
    assert overlap._SCHEMA_VERSION == 1
    assert [f.name for f in dataclasses.fields(overlap.BenchmarkSummary)] == SEED_SUMMARY
    assert [f.name for f in dataclasses.fields(overlap.RawSampleRecord)] == SEED_RAW


def test_overlap_command_line_matches_the_seed():
    args = overlap._parse_args(["--output", "x.csv"])
    assert (args.total_mib, args.num_tensors, args.matrix_size, args.compute_ms, args.compute_iterations,
            args.num_warmup, args.num_runs, args.bootstrap_resamples, args.seed, args.device) == \
        ([64], [1, 32], 2048, 8.0, None, 5, 30, 2000, 0, "cuda:0")
    for bad in (["--num-runs", "1"], ["--num-tensors", "0"], ["--compute-ms", "0"], ["--num-warmup", "-1"], []):
        with pytest.raises(SystemExit):
            overlap._parse_args(bad if not bad or bad[0] == "--output" else ["--output", "x"] + bad)


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


def _raw(method, trial, compute, transfer, serialized, concurrent):
    return overlap.RawSampleRecord(
        schema_version=1, created_utc="", seed=0, schedule_seed=0, total_bytes=64 << 20, num_tensors=1,
        method=method, trial=trial, schedule_order="", compute_only_ms=compute, transfer_only_ms=transfer,
        serialized_ms=serialized, concurrent_ms=concurrent, speedup=serialized / concurrent,
        hidden_ms=serialized - concurrent, estimated_overlap_efficiency=0.0, cpu_launch_skew_ms=0.0)


def test_harness_floor_nets_out_the_harness_own_hand_offs(capsys):
    # The no-op worker: round trip 0.4 ms, concurrent 0.3 ms over compute. A method with transfer 1.7 ms whose
    # concurrent block equals the no-op's hides all it can: 1.4 of 1.4 ms, 100% net (82% by the estimated overlap).
    raw = []
    for trial in range(3):
        raw.append(_raw(overlap._METHOD_NOOP, trial, 8.0, 0.4, 8.4, 8.3))
        raw.append(_raw("ferry", trial, 8.0, 1.7, 9.7, 8.3))
        raw.append(_raw("slow", trial, 8.0, 1.7, 9.7, 9.0))
    overlap._print_harness_floor(raw)
    out = capsys.readouterr().out
    ferry_row = next(line for line in out.splitlines() if " ferry " in line)
    assert ferry_row.split()[2:] == ["0.400", "0.300", "1.300", "100.0%"]
    slow_row = next(line for line in out.splitlines() if " slow " in line)
    assert slow_row.split()[-1] == "50.0%"  # 0.7 ms hidden of 1.4 possible


def test_benchmarks_exit_zero_without_cuda(capsys, no_cuda, tmp_path):
    assert overlap.main(["--output", str(tmp_path / "o.csv")]) == 0
    assert call_overhead.main(["--output", str(tmp_path / "c.csv")]) == 0
    assert bandwidth.main(["--output", str(tmp_path / "b.csv")]) == 0
    assert call_overhead.main(["--in-thread", "--output", str(tmp_path / "t.csv")]) == 0  # from a worker thread
    out = capsys.readouterr().out
    assert out.count("Nothing to do") == 4


def test_call_overhead_cpu_probe_measures_a_positive_time():
    assert 0 < call_overhead._cpu_probe_ms(repeats=3) < 10_000


# ---- overlap: diagnostic mode ---------------------------------------------------------------------------------------


def test_diagnostic_timeline_adds_up_to_the_excess_and_reads_ferry_phases(capsys):
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
        calls["phases"] = {"start": start, "walked": start + 1000, "submitted": start + 3000,
                           "handed": start + 4000, "built": start + 9000, "waited": None, "finished": None}
        return [1]

    with ThreadPoolExecutor(max_workers=1) as executor:
        runner = overlap._DiagnosticRunner(fake, 0, executor, run_compute, launch, lambda: calls.get("phases"))
        samples = overlap._collect(runner, {"ferry": transfer, "other": lambda: [2]}, num_warmup=1, num_runs=3,
                                   seed=5)
    assert all(len(v) == 3 for v in samples.values())
    rows = overlap._diagnostic_rows(runner.records, 64 << 20, 32)
    assert sorted((r["method"], r["trial"]) for r in rows) == [(m, t) for m in ("ferry", "other") for t in range(3)]
    for r in rows:
        parts = r["handoff_ms"] + r["fg_resume_ms"] + r["launch_excess_ms"] + r["gpu_tail_excess_ms"] + r["result_ms"]
        assert r["excess_ms"] == pytest.approx(parts, abs=1e-6)
        assert 0 < r["first_mm_ms"] < r["launch_ms"] and r["compute_launch_ms"] > 0
        assert r["num_tensors"] == 32 and r["total_bytes"] == 64 << 20
    ferry_rows = [r for r in rows if r["method"] == "ferry"]
    assert all(r["ferry_walk_ms"] == pytest.approx(0.001) and r["ferry_build_ms"] == pytest.approx(0.005)
               for r in ferry_rows)
    # The other method's block must not pick up ferry's stamps from an earlier call on the same worker.
    assert all("ferry_walk_ms" not in r for r in rows if r["method"] == "other")
    overlap._print_diagnostics(rows)
    assert "0.001/0.002/0.001/0.005" in capsys.readouterr().out
    # Transfer-only blocks: one row per (trial, method), with both threads' CPU probes taken after the block.
    trows = overlap._transfer_rows(runner.records, 64 << 20, 32)
    assert sorted((r["method"], r["trial"]) for r in trows) == [(m, t) for m in ("ferry", "other") for t in range(3)]
    assert all(r["transfer_ms"] >= 1.0 or r["method"] == "other" for r in trows)  # ferry's stand-in sleeps 1 ms
    assert all(r["worker_probe_ms"] > 0 and r["main_probe_ms"] > 0 and r["worker_cpu"] >= 0 for r in trows)
    # The worker's own account of the call: ferry's stand-in sleeps 1 ms, off the CPU, so its on-CPU time is a
    # small part of its wall time and the sleep is a voluntary switch.
    for r in trows:
        assert 0 <= r["worker_call_cpu_ms"] <= r["worker_call_ms"] + 0.05 and r["worker_call_ms"] <= r["transfer_ms"]
        assert r["worker_call_minflt"] >= 0 and r["worker_call_nivcsw"] >= 0
    ferry_trows = [r for r in trows if r["method"] == "ferry"]
    assert all(r["worker_call_ms"] >= 1.0 and r["worker_call_cpu_ms"] < 0.5 * r["worker_call_ms"] and
               r["worker_call_nvcsw"] >= 1 for r in ferry_trows)
    assert all(r["ferry_build_ms"] == pytest.approx(0.005) for r in trows if r["method"] == "ferry")
    assert all("ferry_walk_ms" not in r for r in trows if r["method"] == "other")
    overlap._print_transfer_diagnostics(trows)
    out = capsys.readouterr().out
    assert "Transfer-only blocks" in out and "0.001/0.002/0.001/0.005/nan" in out
    assert "wall  on CPU  faults  vol cs invol cs" in out


def test_overlap_flags_beyond_the_seeds_are_off_by_default():
    args = overlap._parse_args(["--output", "x.csv"])
    assert args.diagnostics_output is None and args.ferry_gil_handoff_us is None
    assert not args.warm_transfer_first and not args.harness_floor


@pytest.mark.parametrize("warm_first", [False, True])
def test_outputs_are_freed_on_the_main_thread_and_the_warm_up_call_is_off_the_clock(warm_first):
    """SPDL's script drops every block's outputs on the main thread. --warm-transfer-first adds one untimed call on the
    worker before each transfer-only block (its output dropped there), and none before the other schedules."""
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(set_device=lambda d: None))
    freed_on, calls = [], []

    class Output:
        def __init__(self, block):
            calls.append(block)

        def __del__(self):
            freed_on.append(threading.get_ident())

    def slow_first_time():  # the first call takes 0.2 s, the rest none
        out = [Output("transfer")]
        if calls.count("transfer") == 1:
            time.sleep(0.2)
        return out

    with ThreadPoolExecutor(max_workers=1) as executor:
        worker = executor.submit(threading.get_ident).result()
        runner = overlap._Runner(fake, 0, executor, lambda: None, warm_first)
        transfer_ms = runner.transfer_only(slow_first_time)
        runner.serialized(lambda: [Output("serialized")])
        runner.concurrent(lambda: [Output("concurrent")])
    main = threading.get_ident()
    if warm_first:
        assert calls == ["transfer", "transfer", "serialized", "concurrent"]
        assert freed_on == [worker, main, main, main]
    else:
        assert calls == ["transfer", "serialized", "concurrent"]
        assert freed_on == [main] * 3
    assert (transfer_ms < 200) == warm_first  # the slow first call is the warm-up's, off the clock, or the timed one


# ---- call overhead ------------------------------------------------------------------------------------------------


def test_call_overhead_summary_reads_the_small_rows():
    """The summary looked the small rows up by byte count instead of tensor count and printed nan."""
    rows = [dict(experiment="e2e", num_tensors=1, method="raw copy", median_ms=1.3)]
    for n in (1, 256):
        rows += [dict(experiment="e2e", num_tensors=n, method=m, median_ms=v) for m, v in
                 (("ferry", 1.25), ("ferry async", 1.26), ("ferry submit", 0.04), ("ferry wait", 1.22),
                  ("torch to(cpu)", 1.8), ("ferry: walk", 0.01), ("ferry: build", 0.1))]
    rows += [dict(experiment="small", num_tensors=1, method=m, median_ms=v)
             for m, v in (("torch to(cpu)", 0.026), ("ferry", 0.009), ("ferry bare", 0.0085))]
    args = types.SimpleNamespace(total_mib=64, repeats=30, num_tensors=[1, 256], small_bytes=1024)
    out = io.StringIO()
    sys.stdout, saved = out, sys.stdout
    try:
        call_overhead._print_table(rows, args, {1: {"ferry": 0.0, "ferry async": 0.1}})
    finally:
        sys.stdout = saved
    text = out.getvalue()
    assert "nan" not in text.split("one 1024-byte")[1]
    assert "torch to(cpu) 26.0 us, ferry [t] 9.0 us (0.35x, target <=1.5 ok), ferry t 8.5 us (0.33x)" in text
    assert "1.260ms =  0.040ms +  1.220ms" in text and "walk 0.010" in text and "gc ferry 0.000" in text


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
    rows = list(csv.DictReader(open(path, newline="")))
    methods = {r["method"] for r in rows if r["experiment"] == "e2e" and r["num_tensors"] == "8"}
    assert {"ferry", "ferry async", "ferry submit", "ferry wait", "torch to(cpu)"} <= methods


def test_overlap_main_on_a_stand_in_with_diagnostics_then_every_csv_plots(monkeypatch, tmp_path, capsys):
    from ferry import _ferry

    fake_torch.install(monkeypatch)
    default = _ferry._gil_handoff_us()
    files = {k: str(tmp_path / f"{k}.csv") for k in ("py_overlap", "py_overlap_samples", "py_diag")}
    try:
        rc = overlap.main(["--output", files["py_overlap"], "--samples-output", files["py_overlap_samples"],
                           "--diagnostics-output", files["py_diag"], "--num-tensors", "1", "4", "--total-mib", "1",
                           "--matrix-size", "16", "--compute-iterations", "2", "--num-runs", "3",
                           "--num-warmup", "1", "--bootstrap-resamples", "20", "--ferry-gil-handoff-us", "0",
                           "--harness-floor"])
        assert _ferry._gil_handoff_us() == 0  # the flag sets ferry's knob
    finally:
        _ferry._gil_handoff_us(default)
    assert rc == 0
    out = capsys.readouterr().out
    assert "ferry GIL hand-off window: 0 us; diagnostic mode" in out
    assert "Diagnostics (medians, ms)" in out and "Harness floor" in out
    diag = list(csv.DictReader(open(files["py_diag"], newline="")))
    # 2 tensor counts x 3 methods (PyTorch, ferry, no transfer) x 3 blocks
    assert len(diag) == 2 * 3 * 3 and set(diag[0]) == set(overlap.DIAGNOSTIC_FIELDS)
    transfer_diag = list(csv.DictReader(open(str(tmp_path / "py_diag_transfer.csv"), newline="")))
    assert len(transfer_diag) == 2 * 3 * 3 and set(transfer_diag[0]) == set(overlap.TRANSFER_DIAGNOSTIC_FIELDS)
    assert "Transfer-only blocks" in out
    if importlib.util.find_spec("matplotlib") is None:
        return
    assert plot.main(list(files.values()) + ["--out-dir", str(tmp_path / "png")]) == 0
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == [
        "py_diag_excess.png", "py_overlap_efficiency.png", "py_overlap_samples_distributions.png",
        "py_overlap_speedup.png"]


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
            row = {name: 0 for name in SEED_SUMMARY}
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
    (tmp_path / "header_only.csv").write_text(",".join(SEED_SUMMARY) + "\n")
    samples = []
    for trial in range(5):
        for method, speed in (("ferry", 1.16), ("raw cuMemcpyAsync loop", 1.15)):
            row = {name: 0 for name in SEED_RAW}
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
