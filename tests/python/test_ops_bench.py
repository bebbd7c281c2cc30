"""ferry.bench.latency on the CPU: its arguments, the targets' verdicts, the CSV, the table and the plot from
synthetic figures, and the exits without torch or without CUDA. The measurement itself needs the H200."""

import csv
import importlib.util
import sys
import types

import pytest
from ferry.bench import latency

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="matplotlib not installed")

META = dict(schema_version=1, created_utc="2026-12-02T00:00:00+00:00", device_name="NVIDIA H200",
            torch_version="2.11.0", ferry_version="0.1.0", operator="gemm_mma_f16_64x64x32_s3")


def figures(**over):
    f = {key: 5.0 for key, _, _ in latency.ROWS}
    f.update(raw=4.0, launcher_assume=4.6, launcher_checked=4.8, args=1.2, compile_cold=30.0, tvm_ffi=4.8)
    for key, _, _ in latency.ROWS:
        f[f"raw_{key}"] = 4.0
        f[f"torch_{key}"] = 13.4
    f.update(over)
    return f


def test_defaults_are_the_notebooks():
    opts = latency.parse_args([])
    assert (opts.iters, opts.warmup) == (100, 10) and opts.iters + opts.warmup <= latency.SETS == 110


@pytest.mark.parametrize("argv", [["--iters", "101"], ["--warmup", "-1"], ["--iters", "0"], ["--repeats", "x"]])
def test_bad_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as e:
        latency.parse_args(argv)
    assert e.value.code == 2


def test_help_describes_the_experiment(capsys):
    with pytest.raises(SystemExit):
        latency.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "notebook" in out and "--output" in out and "--plot" in out


ALL_MET = {"launcher_assume": 1, "launcher_checked": 1, "args": 1, "tvm_ffi": 1, "torch_op": 1, "torch_op_ro20": 1}


@pytest.mark.parametrize("over, missed", [
    ({}, None),
    ({"launcher_assume": 5.1}, "launcher_assume"),
    ({"launcher_checked": 5.0}, "launcher_checked"),
    ({"args": 3.5}, "args"),
    ({"tvm_ffi": 5.1}, "tvm_ffi"),                  # raw 4.0 + 1.0
    ({"torch_op": 13.5}, "torch_op"),               # torch.mm 13.4
    ({"torch_op_ro20": 5.6}, "torch_op_ro20"),      # 1.1 x the ferry graph's 5.0
])
def test_targets_give_ok_or_miss(over, missed):
    rows = latency.build_rows(figures(**over), META, 9)
    by_label = {label: key for key, label, _ in latency.ROWS}
    got = {by_label[r["metric"]]: r["met"] for r in rows if r["met"] != ""}
    assert got == {**ALL_MET, **({missed: 0} if missed else {})}


def test_a_missing_figure_gives_no_verdict():
    f = figures()
    del f["raw"]
    rows = latency.build_rows(f, META, 9)
    fast = next(r for r in rows if r["metric"].startswith("fast call form (launcher), check bypassed"))
    assert fast["met"] == "" and fast["target"]


def test_csv_and_table(tmp_path):
    rows = latency.build_rows(figures(launcher_assume=5.5), META, 9)
    path = tmp_path / "out" / "py_latency.csv"
    latency.write_csv(str(path), rows)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == latency.FIELDS
        read = list(reader)
    assert len(read) == len(latency.ROWS)
    cold = next(r for r in read if r["metric"].startswith("compile, cold"))
    assert cold["unit"] == "ms" and float(cold["cutlass_notebook"]) == 1469.0
    table = latency.format_table(rows)
    assert table.splitlines()[0].startswith("metric") and "MISS" in table and "<= 3 us ok" in table
    assert "159.5" in table  # the notebook's GemmArguments figure


@needs_matplotlib
def test_plot_writes_a_png(tmp_path):
    rows = latency.build_rows(figures(), META, 9)
    path = latency.plot(rows, str(tmp_path / "p" / "latency.png"))
    assert path and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_without_torch_it_says_so_and_exits_0(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert latency.main([]) == 0
    assert "torch is not installed" in capsys.readouterr().out


def test_without_cuda_it_says_so_and_exits_0(monkeypatch, capsys):
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert latency.main(["--output", "unused.csv"]) == 0
    assert "no CUDA device" in capsys.readouterr().out
