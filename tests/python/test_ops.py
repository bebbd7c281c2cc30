"""ferry.ops on the CPU (CI has no GPU): the surface, GemmArguments' validation (numpy inputs, and the test hooks'
tensors that say they live on cuda:N), target and capability checks, discovery and support reasons, compiling
with a forced target (FERRY_ARCH=sm_90: NVRTC needs no GPU), artifacts saved, loaded and refused when damaged,
and the launcher's argument checks. Nothing here launches a kernel on a real GPU: tests that would reach a launch
(or a driver call with a made-up stream) run only where there is no CUDA (`no_cuda`).

Runs, launchers and graphs end to end (results checked) are in ops_simulated/, through the simulated driver."""

import gc
import inspect
import os
import pathlib
import sys

import ferry
import ferry.ops as ops
import numpy as np
import pytest
from ferry import _ferry

HOOKS = hasattr(_ferry, "_SimExchangeTensor")
needs_hooks = pytest.mark.skipif(not HOOKS, reason="ferry._ferry was built without FERRY_PYTHON_TEST_HOOKS")
PACKAGE = pathlib.Path(ferry.__file__).parent


def dev(array, device=0):
    """`array` as a tensor on cuda:<device>, read through the exchange API (torch's path). Nothing dereferences it
    here: the C library validates layouts without touching memory."""
    return _ferry._SimExchangeTensor(np.asarray(array), device)


def dev_protocol(array, device=0):
    """The same through __dlpack__ (CuPy's and JAX's path)."""
    return _ferry._SimDeviceArray(np.asarray(array), device)


def f16(*shape):
    return np.ones(shape, np.float16)


@pytest.fixture
def sm90(monkeypatch, tmp_path):
    """A forced target and a private disk cache."""
    monkeypatch.setenv("FERRY_ARCH", "sm_90")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    yield


@pytest.fixture
def args128():
    return ops.GemmArguments(dev(f16(128, 128)), dev(f16(128, 128)), dev(f16(128, 128)), "float32")


# ---- surface ---------------------------------------------------------------------------------------------------


def test_ops_is_exported_with_the_notebook_names():
    assert ferry.ops is ops
    for name in ("GemmArguments", "get_operators", "Operator", "CompiledArtifact", "Status", "Graph", "Launcher",
                 "device_supports", "target_sm", "clear_memo", "cache_stats", "get_operator", "operators"):
        assert name in ops.__all__ and hasattr(ops, name), name


def test_stubs_cover_every_name():
    stub = (PACKAGE / "ops.pyi").read_text()
    for name in ops.__all__:
        assert f"class {name}" in stub or f"def {name}(" in stub, name


@pytest.mark.parametrize("fn, params", [
    (ops.Operator.run, ["self", "args", "stream", "compiled_artifact", "assume_supported_args"]),
    (ops.Operator.compile, ["self", "args", "target_sm"]),
    (ops.Operator.launcher, ["self", "args", "compiled_artifact", "assume_supported_args"]),
    (ops.get_operators, ["args", "target_sm", "metadata_filter"]),
    (ops.GemmArguments, ["A", "B", "out", "accumulator_type", "alpha", "beta", "bias", "activation", "scale_a",
                           "scale_b"]),
])
def test_signatures(fn, params):
    assert list(inspect.signature(fn).parameters) == params


def test_docstrings_state_the_contract():
    assert "current stream" in ops.Operator.run.__doc__ and "torch.cuda.graph" in ops.Operator.run.__doc__
    assert "keeps references" in ops.GemmArguments.__doc__.replace("\n", " ")
    assert "alignment" in ops.Launcher.__doc__ and "Ownership" in ops.Launcher.__doc__
    assert "Ownership" in ops.Graph.__doc__
    assert "BAD_ARTIFACT" in ops.CompiledArtifact.load.__doc__
    assert "FERRY_ARCH" in ops.target_sm.__doc__


@pytest.mark.parametrize("cls", [ops.Operator, ops.Status, ops.CompiledArtifact, ops.Launcher])
def test_runtime_objects_cannot_be_constructed_directly(cls):
    with pytest.raises(TypeError):
        cls()


# ---- GemmArguments ---------------------------------------------------------------------------------------------


def test_numpy_operands_are_refused_naming_the_device():
    with pytest.raises(ValueError, match="operand A is on cpu, not on a CUDA device"):
        ops.GemmArguments(f16(4, 4), f16(4, 4), f16(4, 4))


def test_a_non_tensor_is_a_type_error_naming_the_operand():
    with pytest.raises(TypeError, match="operand B is a list"):
        ops.GemmArguments(f16(4, 4), [1, 2], f16(4, 4))


def test_missing_operand_is_a_type_error():
    with pytest.raises(TypeError, match="missing required argument 'out'"):
        ops.GemmArguments(f16(4, 4), f16(4, 4))
    with pytest.raises(TypeError, match="unexpected keyword argument 'C'"):
        ops.GemmArguments(A=f16(4, 4), B=f16(4, 4), C=f16(4, 4))


@pytest.mark.parametrize("acc", ["int8", "bfloat16", np.int64, 3])
def test_bad_accumulator_type_is_named(acc):
    with pytest.raises(ValueError, match="accumulator_type="):
        ops.GemmArguments(f16(4, 4), f16(4, 4), f16(4, 4), accumulator_type=acc)


@needs_hooks
@pytest.mark.parametrize("acc, name", [(None, "fp32"), ("fp32", "fp32"), ("float16", "fp16"), (np.float32, "fp32"),
                                       (np.dtype("float16"), "fp16"), ("F32", "fp32"), ("half", "fp16")])
def test_accumulator_type_forms(acc, name):
    a = dev(f16(8, 8))
    args = ops.GemmArguments(a, a, dev(f16(8, 8)), accumulator_type=acc)
    assert args.problem["accumulator_type"] == name


@needs_hooks
@pytest.mark.parametrize("make", [dev, dev_protocol], ids=["exchange", "dlpack"])
def test_valid_arguments_describe_the_problem(make):
    a = np.zeros((3, 64, 32), np.float16)
    b = np.asfortranarray(np.zeros((32, 48), np.float16))  # column-major, broadcast over the batch
    out = np.zeros((3, 64, 48), np.float32)
    args = ops.GemmArguments(make(a), make(b), make(out), np.float32, alpha=2.0, beta=0.5)
    p = args.problem
    assert (p["m"], p["n"], p["k"], p["l"]) == (64, 48, 32, 3)
    assert (p["a_major"], p["b_major"], p["out_major"]) == ("row", "column", "row")
    assert (p["lda"], p["ldb"], p["ldc"]) == (32, 32, 48)
    assert (p["batch_a"], p["batch_b"], p["batch_c"]) == (64 * 32, 0, 64 * 48)
    assert (p["a_type"], p["out_type"]) == ("fp16", "fp32")
    assert args.alpha == 2.0 and args.beta == 0.5 and args.device == 0
    args.alpha, args.beta = 3, 0
    assert (args.alpha, args.beta) == (3.0, 0.0)
    assert "m=64, n=48, k=32, l=3" in repr(args) and "column-major" in repr(args)


@needs_hooks
@pytest.mark.parametrize("bad, match", [
    (dict(A=np.zeros((8, 8), np.int32)), "operand A is int32; GEMM inputs are"),
        (dict(A=np.zeros((8, 8), np.uint8)), "operand A: dtype uint8 is not a GEMM type"),
    (dict(B=np.zeros((8, 8), np.float64)), "operand B: dtype float64"),
    (dict(B=np.zeros((9, 8), np.float16)), r"shapes do not chain: A is 8×8, B 9×8"),
    (dict(out=np.zeros(8, np.float16)), "operand out has rank 1"),
    (dict(A=np.zeros((8, 16), np.float16)[:, ::2]), r"neither row-major .* nor column-major"),
    (dict(out=np.broadcast_to(np.zeros((1, 8), np.float16), (8, 8))), "its elements overlap, and it is written"),
])
def test_invalid_layouts_are_refused_naming_the_values(bad, match):
    operands = dict(A=f16(8, 8), B=f16(8, 8), out=f16(8, 8))
    operands.update(bad)
    with pytest.raises(ValueError, match=match):
        ops.GemmArguments(**{k: dev(v) for k, v in operands.items()})


@needs_hooks
def test_operands_on_different_devices_are_refused():
    with pytest.raises(ValueError, match="different devices: A on cuda:0, B on cuda:1"):
        ops.GemmArguments(dev(f16(8, 8), 0), dev(f16(8, 8), 1), dev(f16(8, 8), 0))


@needs_hooks
def test_arguments_keep_their_operands_and_release_exports():
    arrays = [dev_protocol(f16(16, 16)) for _ in range(3)]
    before = [sys.getrefcount(x) for x in arrays]
    args = ops.GemmArguments(*arrays)
    # one reference from the arguments, one from the producer's export they hold
    assert [sys.getrefcount(x) for x in arrays] == [n + 2 for n in before]
    assert args.A is arrays[0] and args.B is arrays[1] and args.out is arrays[2]
    assert [x.exports for x in arrays] == [1, 1, 1] and [x.released for x in arrays] == [0, 0, 0]
    del args
    gc.collect()
    assert [sys.getrefcount(x) for x in arrays] == before
    assert [x.released for x in arrays] == [1, 1, 1]


@needs_hooks
def test_failed_construction_releases_everything():
    good = dev_protocol(f16(8, 8))
    bad = dev_protocol(np.zeros((8, 8), np.int8))
    before = sys.getrefcount(good), sys.getrefcount(bad)
    for _ in range(100):
        with pytest.raises(ValueError):
            ops.GemmArguments(good, bad, good)
    assert (sys.getrefcount(good), sys.getrefcount(bad)) == before
    assert good.exports == good.released and bad.exports == bad.released


@needs_hooks
def test_construction_does_not_leak_over_many_calls():
    import tracemalloc

    a, b, c = dev(f16(32, 32)), dev(f16(32, 32)), dev(f16(32, 32))
    refs = [sys.getrefcount(x) for x in (a, b, c)]
    for _ in range(1000):
        ops.GemmArguments(a, b, c)
    tracemalloc.start()
    first = tracemalloc.get_traced_memory()[0]
    for _ in range(20000):
        ops.GemmArguments(a, b, c, accumulator_type="fp32", alpha=1.0)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - first
    tracemalloc.stop()
    assert grown < 64 * 1024, grown
    assert [sys.getrefcount(x) for x in (a, b, c)] == refs


# ---- targets ---------------------------------------------------------------------------------------------------


def test_target_sm_honours_ferry_arch(monkeypatch):
    for text, sm in [("sm_90", 90), ("90", 90), ("9.0", 90), ("sm_90a", 90), ("sm_120", 120)]:
        monkeypatch.setenv("FERRY_ARCH", text)
        assert ops.target_sm() == sm


def test_unreadable_ferry_arch_is_a_value_error_naming_it(monkeypatch):
    monkeypatch.setenv("FERRY_ARCH", "hopper")
    with pytest.raises(ValueError, match="FERRY_ARCH=\"hopper\""):
        ops.target_sm()


def test_device_supports_answers_with_a_reason(monkeypatch):
    monkeypatch.setenv("FERRY_ARCH", "sm_90")
    assert ops.device_supports("90") and ops.device_supports(80) and ops.device_supports("sm_80")
    status = ops.device_supports("100")
    assert not status and "needs sm_100 or newer; FERRY_ARCH=sm_90 is sm_90" in status.error
    assert ops.device_supports("90").error is None
    assert "Status(ok)" in repr(ops.device_supports("90"))
    with pytest.raises(ValueError, match="min_sm='ninety'"):
        ops.device_supports("ninety")


@pytest.mark.usefixtures("no_cuda")
def test_without_a_gpu_or_ferry_arch_there_is_no_target(monkeypatch):
    monkeypatch.delenv("FERRY_ARCH", raising=False)
    status = ops.device_supports("80")
    assert not status and "set FERRY_ARCH" in status.error
    with pytest.raises(RuntimeError, match="libcuda"):
        ops.target_sm()


# ---- discovery and supports ------------------------------------------------------------------------------------


def test_operators_are_listed_once_with_metadata():
    everything = ops.operators()
    assert len(everything) >= 2 and len({op.name for op in everything}) == len(everything)
    assert ops.operators()[0] is everything[0]
    simt = ops.get_operator("gemm_simt_64x64x16")
    md = simt.metadata
    assert md.name == simt.name and md.builtin is True
    assert md.design.instruction == "simt.fma" and md.design.tile_m == 64 and simt.design is md.design
    assert set(md.constraints.a_types) == {"fp16", "bf16", "fp32"}
    assert "row" in md.constraints.a_majors and md.constraints.min_sm >= 50
    assert "gemm_simt_64x64x16" in repr(simt)
    with pytest.raises(KeyError, match="no_such_op"):
        ops.get_operator("no_such_op")


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_get_operators_best_first_and_filtered(args128):
    found = ops.get_operators(args128)
    assert found and found[0].design.instruction.startswith("mma")
    assert all(op.supports(args128) for op in found)
    assert found == ops.get_operators(args128, target_sm="sm_90") == ops.get_operators(args128, target_sm=90)
    simt_only = ops.get_operators(args128, metadata_filter=lambda md: md.design.instruction == "simt.fma")
    assert [op.name for op in simt_only] == ["gemm_simt_64x64x16"]
    assert all(op.constraints.min_sm <= 75 for op in ops.get_operators(args128, target_sm=75))


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_get_operators_checks_its_arguments(args128):
    with pytest.raises(TypeError, match="GemmArguments"):
        ops.get_operators("not args")
    with pytest.raises(ValueError, match="target_sm='sm_x'"):
        ops.get_operators(args128, target_sm="sm_x")
    with pytest.raises(TypeError, match="metadata_filter must be callable"):
        ops.get_operators(args128, metadata_filter=3)
    with pytest.raises(ZeroDivisionError):
        ops.get_operators(args128, metadata_filter=lambda md: 1 / 0)


@needs_hooks
def test_supports_gives_the_reason():
    args = ops.GemmArguments(dev(f16(64, 64)), dev(f16(64, 64)), dev(f16(64, 64)))
    bf16_op = next(op for op in ops.operators() if op.constraints.a_types == ("bf16",))
    status = bf16_op.supports(args)
    assert not status and status.error == "operand A: expected bf16, got fp16"
    assert "expected bf16" in repr(status)
    assert ops.get_operator("gemm_simt_64x64x16").supports(args)


@needs_hooks
def test_supports_names_a_misaligned_operand():
    buffer = np.zeros(64 * 64 + 1, np.float16)
    shifted = buffer[1:].reshape(64, 64)  # 2-byte aligned
    args = ops.GemmArguments(dev(shifted), dev(f16(64, 64)), dev(f16(64, 64)))
    strict = next(op for op in ops.operators() if op.constraints.a_align == 16 and "fp16" in op.constraints.a_types)
    status = strict.supports(args)
    assert not status and "operand A" in status.error and "16" in status.error


# ---- compile and artifacts -------------------------------------------------------------------------------------


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_compile_for_a_forced_target_and_the_caches(args128):
    op = ops.get_operators(args128)[0]
    ops.clear_memo()  # an earlier test may have compiled the same kernel in this process (on the H200 one did)
    before = ops.cache_stats()
    art = op.compile(args128)
    assert art.target_sm == 90 and art.operator is op and art.kind == args128.problem["kind"]
    assert art.cubin[:4] == b"\x7fELF" and "sm_90" in repr(art)
    again = op.compile(args128)
    after = ops.cache_stats()
    assert after["memo_hits"] > before["memo_hits"]
    # The first compile either wrote the disk cache or found the artifact there already: the user's cache is shared
    # with earlier processes (on the H200 machine the C suites had compiled the same kernel before this test ran).
    wrote_or_found = (after["disk_writes"] - before["disk_writes"]) + (after["disk_hits"] - before["disk_hits"])
    assert wrote_or_found >= 1 and after["disk_enabled"]
    assert again.cubin == art.cubin
    ops.clear_memo()
    third = op.compile(args128)  # from the disk cache, verified
    assert ops.cache_stats()["disk_hits"] >= before["disk_hits"] + 1 and third.cubin == art.cubin
    assert op.compile(args128, target_sm="sm_80").target_sm == 80


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_compile_refuses_unsupported_arguments(args128):
    bf16_op = next(op for op in ops.operators() if op.constraints.a_types == ("bf16",))
    with pytest.raises(ferry.FerryError, match="expected bf16, got fp16") as e:
        bf16_op.compile(args128)
    assert e.value.status == "UNSUPPORTED"
    with pytest.raises(ferry.FerryError, match="sm_50|older|min") as e:
        ops.get_operators(args128)[0].compile(args128, target_sm=50)


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_artifact_save_load_round_trip(args128, tmp_path):
    op = ops.get_operators(args128)[0]
    art = op.compile(args128)
    path = tmp_path / "gemm.ferry"
    art.save(path)
    loaded = ops.CompiledArtifact.load(str(path))
    assert (loaded.operator, loaded.target_sm, loaded.kind, loaded.cubin) == (op, 90, art.kind, art.cubin)


@needs_hooks
@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "other_format"])
def test_damaged_artifacts_are_refused(args128, tmp_path, damage):
    path = tmp_path / "gemm.ferry"
    ops.get_operators(args128)[0].compile(args128).save(path)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"\x7fELF" + bytes(200))
    path.write_bytes(bytes(data))
    with pytest.raises(ferry.FerryError) as e:
        ops.CompiledArtifact.load(path)
    assert e.value.status == "BAD_ARTIFACT" and str(path) in str(e.value)


def test_missing_artifact_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError, match="nothing-here"):
        ops.CompiledArtifact.load(tmp_path / "nothing-here.ferry")


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_saving_into_a_missing_directory_is_an_os_error(args128, tmp_path):
    art = ops.get_operators(args128)[0].compile(args128)
    with pytest.raises(OSError, match="no/such/dir"):
        art.save(tmp_path / "no" / "such" / "dir" / "a.ferry")


# ---- run, launcher, graph: argument checks ------------------------------------------------------------------------


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_run_checks_its_arguments_before_any_driver_call(args128):
    op = ops.get_operators(args128)[0]
    with pytest.raises(TypeError, match="GemmArguments"):
        op.run(None)
    with pytest.raises(TypeError, match="compiled_artifact must be a ferry.ops.CompiledArtifact"):
        op.run(args128, compiled_artifact="art")
    with pytest.raises(TypeError, match="stream"):
        op.run(args128, stream="s")
    with pytest.raises(ValueError, match="-5"):
        op.run(args128, stream=-5)
    with pytest.raises(TypeError, match="multiple values for argument 'stream'"):
        op.run(args128, None, stream=None)
    with pytest.raises(TypeError, match="at most 4 positional"):
        op.run(args128, None, None, False, 5)


class FakeTorchStream:
    """Shaped like torch.cuda.Stream: .cuda_stream and .device_index."""

    def __init__(self, handle, device_index):
        self.cuda_stream, self.device_index = handle, device_index


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_a_stream_of_another_device_is_refused(args128):
    op = ops.get_operators(args128)[0]
    with pytest.raises(ValueError, match="belongs to cuda:1, but the operands are on cuda:0"):
        op.run(args128, stream=FakeTorchStream(1234, 1))


@needs_hooks
@pytest.mark.usefixtures("sm90", "no_cuda")
def test_run_without_a_driver_is_a_runtime_error(args128):
    op = ops.get_operators(args128)[0]
    art = op.compile(args128)
    with pytest.raises(RuntimeError, match="libcuda"):
        op.run(args128, compiled_artifact=art, assume_supported_args=True)
    with pytest.raises(RuntimeError, match="libcuda"):
        op.run(args128)


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_launcher_binds_only_what_it_supports(args128):
    op = ops.get_operators(args128)[0]
    bf16_op = next(o for o in ops.operators() if o.constraints.a_types == ("bf16",))
    with pytest.raises(ferry.FerryError, match="expected bf16"):
        bf16_op.launcher(args128)
    other = ops.get_operator("gemm_simt_64x64x16").compile(args128)
    with pytest.raises(ValueError, match="the artifact is of operator gemm_simt_64x64x16"):
        op.launcher(args128, other)
    launch = op.launcher(args128, assume_supported_args=True)
    assert launch.operator is op and launch.compiled_artifact.operator is op and launch.assume_supported_args
    assert "support check bypassed" in repr(launch)
    assert not op.launcher(args128).assume_supported_args


@needs_hooks
@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("which, bad, match", [
    (1, f16(128, 64), r"operand B is float16 on cuda:0 with shape \(128, 64\) strides \(64, 1\); the launcher was "
                      r"bound to float16 on cuda:0 with shape \(128, 128\) strides \(128, 1\)"),
    (0, np.ones((128, 128), np.float32), "operand A is float32 on cuda:0"),
    (2, np.asfortranarray(f16(128, 128)), r"operand out is float16 on cuda:0 with shape \(128, 128\) strides "
                                          r"\(1, 128\)"),
    (0, f16(2, 128, 128), r"shape \(2, 128, 128\)"),
])
def test_launcher_refuses_other_layouts_naming_both(args128, which, bad, match):
    launch = ops.get_operators(args128)[0].launcher(args128, assume_supported_args=True)
    operands = [dev(f16(128, 128)) for _ in range(3)]
    operands[which] = dev(bad)
    with pytest.raises(ValueError, match=match):
        launch(*operands)


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_launcher_refuses_another_device_and_non_tensors(args128):
    launch = ops.get_operators(args128)[0].launcher(args128, assume_supported_args=True)
    a = dev(f16(128, 128))
    with pytest.raises(ValueError, match="operand out is float16 on cuda:1"):
        launch(a, a, dev(f16(128, 128), 1))
    with pytest.raises(TypeError, match="operand B is a str"):
        launch(a, "B", a)
    with pytest.raises(TypeError, match="missing required argument 'out'"):
        launch(a, a)
    with pytest.raises(TypeError, match="stream"):
        launch(a, a, a, stream=object())


@needs_hooks
@pytest.mark.usefixtures("sm90")
def test_launcher_refuses_a_misaligned_pointer_when_checks_are_bypassed(args128):
    op = ops.get_operators(args128)[0]
    assert op.constraints.a_align == 16
    launch = op.launcher(args128, assume_supported_args=True)
    shifted = np.zeros(128 * 128 + 1, np.float16)[1:].reshape(128, 128)
    a, out = dev(f16(128, 128)), dev(f16(128, 128))  # out of its own: an out that is B is refused as an overlap
    with pytest.raises(ferry.FerryError, match="operand A") as e:
        launch(dev(shifted), a, out)
    assert e.value.status == "UNSUPPORTED"


@needs_hooks
@pytest.mark.usefixtures("sm90", "no_cuda")
def test_launcher_accepts_an_equivalent_layout_then_needs_the_driver():
    a = np.ones((1, 64), np.float16)  # one row: its row stride cannot matter
    args = ops.GemmArguments(dev(a), dev(f16(64, 64)), dev(f16(1, 64)))
    launch = ops.get_operators(args)[0].launcher(args, assume_supported_args=True)
    odd = np.lib.stride_tricks.as_strided(np.ones(64, np.float16), (1, 64), (4096, 2))
    with pytest.raises(RuntimeError, match="libcuda"):  # past every check: the launch itself needs a driver
        launch(dev(odd), dev(f16(64, 64)), dev(f16(1, 64)))
    with pytest.raises(RuntimeError, match="libcuda"):  # and through __dlpack__ as well
        launch(dev_protocol(a), dev_protocol(f16(64, 64)), dev_protocol(f16(1, 64)))


@pytest.mark.usefixtures("no_cuda")
def test_graph_needs_a_stream_of_its_own_and_a_driver():
    with pytest.raises(ValueError, match="stream of your own"):
        ops.Graph(None)
    with pytest.raises(ValueError, match="legacy default stream"):
        ops.Graph(0)
    with pytest.raises(RuntimeError, match="libcuda"):
        ops.Graph(1234)
    with pytest.raises(TypeError):
        ops.Graph()


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.skipif(not hasattr(ops._c, "_raw_launch_time"),
                    reason="ferry._ferry was built without FERRY_PYTHON_TEST_HOOKS (a wheel): no raw timer")
def test_raw_launch_timer_checks_its_arguments():
    with pytest.raises(TypeError, match="missing required argument"):
        ops._c._raw_launch_time(None, [], 0, 1)
    with pytest.raises(TypeError, match="an artifact is needed"):
        ops._c._raw_launch_time(None, [], 0, 1, 0)
