"""The Python benchmarks' logic, on the CPU: the overlap benchmark's schema (the seed's), statistics and randomized
schedules, the plotter on both CSV schemas, and the no-CUDA exits."""

import csv
import dataclasses
import importlib.util

import pytest
from ferry.bench import call_overhead, overlap, plot

# The seed's CSV columns, in order (benchmark_transfer_overlap.py, _SCHEMA_VERSION = 1).
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


def test_benchmarks_exit_zero_without_cuda(capsys, no_cuda, tmp_path):
    assert overlap.main(["--output", str(tmp_path / "o.csv")]) == 0
    assert call_overhead.main(["--output", str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    assert "Nothing to do" in out


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
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
