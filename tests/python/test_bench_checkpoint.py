"""The checkpoint benchmark's logic on the CPU, with real torch: the state dicts' shapes against the models they
imitate (on the meta device), the whole main() on CPU tensors with torch's CUDA calls stood in for (every method but
DCP's pinned stager, which needs an accelerator), its check catching wrong bytes, the targets, the plot, --list and
the no-CUDA exit. What it measures is the GPU run's; nothing here times anything.
"""

import contextlib
import csv
import importlib.util

import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
from ferry.bench import checkpoint, plot, state_dicts  # noqa: E402


def test_state_dicts_have_the_parameter_counts_of_the_models_they_imitate():
    expected = {"llama-1b-adam": 1.2358e9, "llama-7b": 6.7384e9, "resnet50-adam": 25.557e6}
    for name, params in expected.items():
        state = state_dicts.STATE_DICTS[name][1](torch, "meta")
        model = {id(t): t for name, t in state["model"].items() if "running_" not in name and t.is_floating_point()}
        counted = sum(t.numel() for t in model.values())
        assert abs(counted - params) / params < 2e-3, (name, counted)


def test_tied_embeddings_are_one_tensor_under_two_names_and_adam_holds_it_once():
    state = state_dicts.STATE_DICTS["llama-1b-adam"][1](torch, "meta")
    model = state["model"]
    assert model["lm_head.weight"] is model["model.embed_tokens.weight"]
    distinct = {id(t) for t in model.values()}
    assert len(state["optim"]["state"]) == len(distinct) == len(model) - 1
    step = state["optim"]["state"][0]["step"]
    assert step.device.type == "cpu" and step.dim() == 0


def test_resnet50_keeps_batch_norm_buffers_and_int64_counters():
    model = state_dicts.STATE_DICTS["resnet50-adam"][1](torch, "meta")["model"]
    counters = [k for k in model if k.endswith("num_batches_tracked")]
    assert len(counters) == 53 and all(model[k].dtype == torch.int64 for k in counters)
    assert model["fc.weight"].shape == (1000, 2048) and model["layer4.2.conv3.weight"].shape == (2048, 512, 1, 1)


class _Stream:
    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


class _CudaRuntime:
    def cudaHostRegister(self, ptr, size, flags):
        return 0

    def cudaHostUnregister(self, ptr):
        return 0


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """main() on CPU tensors: torch's CUDA calls stood in for, the device is the CPU."""
    monkeypatch.setattr(checkpoint, "torch_cuda_device", lambda *a: (torch, torch.device("cpu")))
    for name, value in {"set_device": lambda d: None, "get_device_name": lambda d: "CPU stand-in",
                        "synchronize": lambda d=None: None, "empty_cache": lambda: None,
                        "Stream": lambda d=None: _Stream(), "current_stream": lambda d=None: _Stream(),
                        "stream": lambda s: contextlib.nullcontext(), "cudart": lambda: _CudaRuntime()}.items():
        monkeypatch.setattr(torch.cuda, name, value)


METHODS_ON_CPU = [m for m in checkpoint.METHODS if m != checkpoint.DCP_PINNED]


def test_main_stages_a_state_dict_with_every_method_and_writes_its_csv_table_and_targets(cpu_as_gpu, tmp_path,
                                                                                           capsys):
    out = tmp_path / "checkpoint.csv"
    assert checkpoint.main(["--state-dicts", "resnet50-adam", "--repeats", "2", "--output", str(out),
                            "--methods", *METHODS_ON_CPU]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["method"] for r in rows] == METHODS_ON_CPU
    assert all(r["state_dict"] == "resnet50-adam" and int(r["num_tensors"]) == 803 for r in rows)
    assert all(float(r["first_ms"]) > 0 and float(r["steady_ms"]) > 0 for r in rows)
    text = capsys.readouterr().out
    assert "targets:" in text and "Stager steady" in text and "CSV:" in text


def test_main_catches_a_method_that_stages_wrong_bytes(cpu_as_gpu, tmp_path, monkeypatch, capsys):
    def wrong(state, **kwargs):
        return checkpoint._map_tensors(torch, state, torch.zeros_like)

    monkeypatch.setattr(ferry, "transfer_tensor_d2h", wrong)
    out = tmp_path / "x.csv"
    assert checkpoint.main(["--state-dicts", "resnet50-adam", "--repeats", "1", "--output", str(out),
                            "--methods", "ferry", "torch to(cpu) loop"]) == 1
    assert "resnet50-adam: ferry: RuntimeError: tensor 0 of the state dict was not staged exactly" in \
        capsys.readouterr().out
    methods = [line.split(",")[3] for line in out.read_text().splitlines()[1:]]
    assert methods == [checkpoint.LIMIT, checkpoint.TORCH_LOOP]  # the failed method leaves no row, the next runs


def test_a_dcp_stager_that_stages_once_only_is_made_anew_for_each_call(cpu_as_gpu, tmp_path, monkeypatch, capsys):
    from torch.distributed.checkpoint import staging

    made = []

    class StagesOnce(staging.DefaultStager):  # as torch 2.11's: its second stage() raises KeyError
        def __init__(self, options):
            super().__init__(options)
            self.used = False
            made.append(self)

        def stage(self, state_dict, **kwargs):
            if self.used:
                raise KeyError(type)
            self.used = True
            return super().stage(state_dict, **kwargs)

    monkeypatch.setattr(staging, "DefaultStager", StagesOnce)
    assert checkpoint.main(["--state-dicts", "resnet50-adam", "--repeats", "3", "--output", str(tmp_path / "x.csv"),
                            "--methods", checkpoint.DCP_DEFAULT]) == 0
    assert "stages once only" in capsys.readouterr().err
    assert len(made) == 1 + 4  # the probe, then one per call: the first and 3 steady


def test_targets_compare_ferry_with_the_limit_pytorch_and_dcp():
    def row(method, first, steady, held=0):
        return dict(state_dict="sd", num_tensors=100, total_bytes=10 << 30, method=method, first_ms=first,
                    steady_ms=steady, steady_to_limit=steady / 100.0, pinned_bytes_held=held)

    rows = [row(checkpoint.LIMIT, 100, 100), row(checkpoint.FERRY, 240, 101, 10 << 30),
            row(checkpoint.TORCH_PREALLOC, 300, 100), row(checkpoint.STAGER, 250, 110),
            row(checkpoint.DCP_DEFAULT, 1000, 200)]
    verdicts = [ok for _, ok in checkpoint.target_lines(rows)]
    # steady 1.01x <= 1.02 (100 MiB tensors); first 240 <= 2.5 x 101; first 240 > 0.66 x 300; pinned 10 GiB <=
    # 1.05 x 10 GiB; Stager steady 110 > 200 / 2; Stager first 250 <= 1000 / 2
    assert verdicts == [True, True, False, True, False, True]


def test_list_and_the_no_cuda_exit(capsys, no_cuda, tmp_path):
    assert checkpoint.main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert "llama-7b-adam" in listing and "67.38" in listing
    assert checkpoint.main(["--output", str(tmp_path / "x.csv")]) == 0
    assert "Nothing to do." in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_the_checkpoint_csv_plots(cpu_as_gpu, tmp_path):
    out = tmp_path / "checkpoint.csv"
    checkpoint.main(["--state-dicts", "resnet50-adam", "--repeats", "1", "--output", str(out), "--methods",
                     "ferry", checkpoint.DCP_DEFAULT])
    written = plot.plot_files([str(out)], str(tmp_path))
    assert [p.endswith("checkpoint_checkpoint.png") for p in written] == [True]


def test_help_lists_the_methods_and_the_state_dicts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        checkpoint.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert all(m in text for m in checkpoint.METHODS) and "llama-1b-adam" in text
