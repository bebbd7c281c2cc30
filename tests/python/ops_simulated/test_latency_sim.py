"""python -m ferry.bench.latency end to end on the simulated driver with a numpy stand-in for torch: the whole
experiment's plumbing (operands, compile rows with fresh cache homes, every timed call form, the notebook's
torch.cuda.graph capture of op.run, ferry's graph, the correctness checks after the replays and the runs), the CSV,
the table and the verdicts. The raw-launch timer needs the real driver, so it is replaced by a stand-in here; its
figures and all others are meaningless on this machine."""

import csv
import os
import sys

import ferry.ops
import pytest
from ferry.bench import latency

sys.path.insert(0, os.path.dirname(__file__))
import fake_torch_ops  # noqa: E402


class _RawStandIn:
    """ferry.ops._c with the raw-launch timer replaced (it opens the real libcuda)."""

    def __init__(self, real):
        self._real = real
        self.raw_calls = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _raw_launch_time(self, artifact, args, stream, iters, warmup):
        assert isinstance(artifact, ferry.ops.CompiledArtifact) and len(args) >= iters
        self.raw_calls.append((iters, warmup))
        return 3.9, 4.3, {"grid": (4, 1, 1)}


def test_latency_main_runs_end_to_end(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", fake_torch_ops)
    stand_in = _RawStandIn(ferry.ops._c)
    monkeypatch.setattr(ferry.ops, "_c", stand_in)
    out = tmp_path / "py_latency.csv"
    assert latency.main(["--iters", "3", "--warmup", "2", "--repeats", "1", "--output", str(out),
                         "--plot", "none"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "ferry.ops host latency on ferry simulated device" in printed and "targets:" in printed
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["metric"] for r in rows] == [label for _, label, _ in latency.ROWS]
    # The other callers need the real torch (custom ops, torch.compile) and tvm_ffi beside it: left out here.
    others = {label for key, label, _ in latency.ROWS if key.startswith(("tvm_ffi", "torch_op", "torch_mm"))}
    assert len(others) == 7 and captured.err.count("is not available here") == 7
    for r in rows:
        assert (r["ferry"] == "") if r["metric"] in others else float(r["ferry"]) > 0, r["metric"]
    fast = next(r for r in rows if r["metric"].startswith("fast call form (launcher), check bypassed"))
    assert float(fast["raw"]) == 3.9 and fast["target"] == "<= raw + 1.0 us" and fast["met"] in ("0", "1")
    assert (3, 2) in stand_in.raw_calls and (latency.GRAPH_RUNS, 0) in stand_in.raw_calls
    assert ferry.ops.cache_stats()["compiles"] >= 3  # three cold compiles, each in a fresh cache home


def test_a_broken_part_loses_only_its_figures_and_fails_the_run(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", fake_torch_ops)
    stand_in = _RawStandIn(ferry.ops._c)

    def broken(*args):
        stand_in.raw_calls.append(args[3:])
        raise RuntimeError("no libcuda here")

    stand_in._raw_launch_time = broken
    monkeypatch.setattr(ferry.ops, "_c", stand_in)
    out = tmp_path / "py_latency.csv"
    assert latency.main(["--iters", "2", "--warmup", "1", "--repeats", "2", "--output", str(out),
                         "--plot", "none"]) == 1
    printed = capsys.readouterr().out
    assert "PROBLEMS" in printed and "raw cuLaunchKernel timer: RuntimeError: no libcuda here" in printed
    assert len(stand_in.raw_calls) == 1  # not retried once broken
    with open(out, newline="") as f:
        rows = {r["metric"]: r for r in csv.DictReader(f)}
    fast = rows["fast call form (launcher), check bypassed"]
    assert fast["raw"] == "" and fast["met"] == "" and float(fast["ferry"]) > 0


class _WheelStandIn:
    """ferry.ops._c as a wheel has it: no raw-launch timer (it is built only with FERRY_PYTHON_TEST_HOOKS)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        if name == "_raw_launch_time":
            raise AttributeError(name)
        return getattr(self._real, name)


def test_without_the_raw_timer_the_limit_rows_stay_empty_and_the_run_passes(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", fake_torch_ops)
    monkeypatch.setattr(ferry.ops, "_c", _WheelStandIn(ferry.ops._c))
    out = tmp_path / "py_latency.csv"
    assert latency.main(["--iters", "2", "--warmup", "1", "--repeats", "1", "--output", str(out),
                         "--plot", "none"]) == 0
    captured = capsys.readouterr()
    assert "PROBLEMS" not in captured.out and "FERRY_PYTHON_TEST_HOOKS" in captured.err
    with open(out, newline="") as f:
        rows = {r["metric"]: r for r in csv.DictReader(f)}
    fast = rows["fast call form (launcher), check bypassed"]
    assert fast["raw"] == "" and float(fast["ferry"]) > 0
