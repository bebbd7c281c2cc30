"""ferry.ops end to end on the simulated driver: every launch computes its GEMM on the CPU from the kernel parameter
ferry built (pointers, leading dimensions, batch strides, alpha/beta, types and majors), so the results say whether
what Python handed down was right. Outputs are poisoned with NaN first whenever beta is 0.

Covered: op.run with and without artifact and checks, the fast launcher (exchange and __dlpack__ paths, equivalent
layouts, alignment), ferry graphs (capture, replay, in-place update, failure states), which stream a run goes on,
driver faults becoming exceptions, reference counts over 10^5 calls, and the Python-side cost per call (printed)."""

import gc
import os
import sys
import time
import tracemalloc

import ferry
import ferry.ops as ops
import numpy as np
import pytest
from ferry import _ferry

EX = _ferry._SimExchangeTensor  # torch's path (DLPack exchange API)
PROTO = _ferry._SimDeviceArray  # CuPy's and JAX's path (__dlpack__)


def state():
    return _ferry._ops_sim_state()


def matrix(shape, dtype, order="C", offset=0, seed=0):
    """A random matrix (or batch of them) with values in [-1, 1), row- ("C") or column-major ("F") in its last two
    dimensions, starting `offset` elements into its buffer."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    buf = np.zeros(n + offset, dtype)
    values = buf[offset:offset + n]
    values[:] = rng.uniform(-1, 1, n).astype(dtype)
    if order == "C":
        return values.reshape(shape)
    swapped = shape[:-2] + (shape[-1], shape[-2])
    return np.swapaxes(values.reshape(swapped), -1, -2)


def reference(a, b, c0, alpha, beta):
    ref = alpha * np.matmul(a.astype(np.float64), b.astype(np.float64))
    return ref + beta * c0.astype(np.float64) if beta else ref


def rel_err(out, ref):
    out = out.astype(np.float64)
    assert not np.isnan(out).any(), "an output element was never written"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def bound(out_dtype, in_dtype):
    if out_dtype == np.float16:
        return 5e-3
    return 1e-5 if in_dtype == np.float32 else 1e-4


CASES = [
    # (m, n, k, l, A type, out type, A order, B order, out order, offset)
    (128, 128, 128, 1, np.float16, np.float16, "C", "C", "C", 0),
    (1, 1, 1, 1, np.float16, np.float32, "C", "C", "C", 0),
    (65, 47, 33, 1, np.float16, np.float16, "F", "C", "C", 0),
    (64, 64, 32, 1, np.float16, np.float32, "C", "F", "F", 8),
    (31, 17, 9, 1, np.float16, np.float16, "F", "F", "C", 1),
    (40, 24, 16, 3, np.float16, np.float32, "C", "C", "C", 0),
    (33, 20, 12, 2, np.float32, np.float32, "F", "C", "F", 3),
    (16, 16, 16, 1, np.float32, np.float32, "C", "C", "C", 0),
]


def case_id(c):
    m, n, k, l, ta, tc, oa, ob, oc, off = c
    return f"{m}x{n}x{k}x{l}-{np.dtype(ta).name}-{np.dtype(tc).name}-{oa}{ob}{oc}-off{off}"


def operands(case, make=EX, alpha=1.0, beta=0.0, seed=0):
    m, n, k, l, ta, tc, oa, ob, oc, off = case
    lead = (l,) if l > 1 else ()
    a = matrix(lead + (m, k), ta, oa, off, seed)
    b = matrix((k, n), ta, ob, off, seed + 1)  # rank 2: broadcast over the batch
    c = matrix(lead + (m, n), tc, oc, off, seed + 2)
    c0 = c.copy()
    if not beta:
        c[...] = np.nan
    args = ops.GemmArguments(make(a), make(b), make(c), "float32", alpha=alpha, beta=beta)
    return args, (a, b, c, c0)


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("make", [EX, PROTO], ids=["exchange", "dlpack"])
def test_run_with_an_artifact_computes_the_gemm(case, make):
    args, (a, b, c, c0) = operands(case, make)
    op = ops.get_operators(args)[0]
    art = op.compile(args)
    op.run(args, compiled_artifact=art)
    assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= bound(c.dtype, a.dtype)


@pytest.mark.parametrize("case", CASES[:4], ids=case_id)
def test_alpha_and_beta_reach_the_kernel(case):
    args, (a, b, c, c0) = operands(case, alpha=-0.5, beta=2.0, seed=7)
    ops.get_operators(args)[0].run(args)
    assert rel_err(c, reference(a, b, c0, -0.5, 2.0)) <= bound(c.dtype, a.dtype)
    args.alpha, args.beta = 1.0, 0.0  # settable; read at the next launch
    c[...] = np.nan
    ops.get_operators(args)[0].run(args, assume_supported_args=True)
    assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= bound(c.dtype, a.dtype)


def test_every_operator_that_supports_the_case_gets_the_same_parameters():
    args, (a, b, c, c0) = operands(CASES[0])
    found = ops.get_operators(args)
    assert len(found) >= 2
    for op in found:
        c[...] = np.nan
        op.run(args, compiled_artifact=op.compile(args), assume_supported_args=True)
        assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= 5e-3, op.name
        tile = op.design
        assert state()["last_grid"] == (-(-128 // tile.tile_m) * -(-128 // tile.tile_n), 1, 1)
        assert state()["last_block"] == tile.threads


def test_run_without_an_artifact_compiles_once_per_kind():
    args, (a, b, c, c0) = operands((24, 40, 8, 1, np.float16, np.float32, "F", "F", "F", 0))
    op = ops.get_operators(args)[0]
    before = ops.cache_stats()["compiles"] + ops.cache_stats()["disk_hits"]
    for _ in range(50):
        op.run(args)
    assert ops.cache_stats()["compiles"] + ops.cache_stats()["disk_hits"] <= before + 1
    assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= 1e-4
    ops.clear_memo()  # the memo is gone: the next run finds the artifact again (disk cache), still correct
    c[...] = np.nan
    op.run(args)
    assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= 1e-4


def test_unsupported_runs_raise_with_the_reason_unless_bypassed():
    args, _ = operands(CASES[0])
    bf16_op = next(op for op in ops.operators() if op.constraints.a_types == ("bf16",))
    launches = state()["launches"]
    with pytest.raises(ferry.FerryError, match="expected bf16, got fp16") as e:
        bf16_op.run(args, compiled_artifact=ops.get_operators(args)[0].compile(args))
    assert e.value.status == "UNSUPPORTED" and state()["launches"] == launches
    other = ops.get_operators(args)[1].compile(args)
    with pytest.raises(ValueError, match="the artifact is of operator"):
        ops.get_operators(args)[0].run(args, compiled_artifact=other)


# ---- streams ------------------------------------------------------------------------------------------------------


class FakeTorchStream:
    def __init__(self, handle, device_index=0):
        self.cuda_stream, self.device_index = handle, device_index


class FakeCupyStream:
    def __init__(self, ptr, device_id=0):
        self.ptr, self.device_id = ptr, device_id


def test_stream_none_is_the_frameworks_current_stream_or_the_legacy_default():
    args, _ = operands(CASES[1])
    op = ops.get_operators(args)[0]
    op.run(args, stream=0x5555)
    op.run(args)  # the exchange API's current work stream: the simulation's is the legacy default (NULL)
    assert state()["last_stream"] == 0
    args_p, _ = operands(CASES[1], PROTO)
    op.run(args_p, stream=0x5555)
    op.run(args_p)  # no exchange API: the legacy default stream
    assert state()["last_stream"] == 0


@pytest.mark.parametrize("stream, handle", [(0x1234, 0x1234), (0, 1), (FakeTorchStream(0x777), 0x777),
                                            (FakeCupyStream(0x999), 0x999), (FakeTorchStream(0), 1)])
def test_stream_objects_and_handles(stream, handle):
    args, (a, b, c, c0) = operands(CASES[1])
    op = ops.get_operators(args)[0]
    op.run(args, stream=stream)
    assert state()["last_stream"] == handle
    launch = op.launcher(args)
    launch(*(args.A, args.B, args.out), stream=stream)
    assert state()["last_stream"] == handle
    launch(args.A, args.B, args.out, stream)
    assert state()["last_stream"] == handle


def test_remembered_stream_object_is_still_checked_for_its_device():
    args, _ = operands(CASES[1])
    op = ops.get_operators(args)[0]
    s = FakeTorchStream(0x42, 1)
    for _ in range(2):  # the second call answers from the remembered object
        with pytest.raises(ValueError, match="belongs to cuda:1"):
            op.run(args, stream=s)


# ---- the fast launcher --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("assume", [True, False])
def test_launcher_runs_new_operands_of_the_bound_layout(case, assume):
    args, _ = operands(case)
    launch = ops.get_operators(args)[0].launcher(args, assume_supported_args=assume)
    for seed in (11, 12):
        _, (a, b, c, c0) = operands(case, seed=seed)
        launch(EX(a), EX(b), EX(c))
        assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= bound(c.dtype, a.dtype)


def test_launcher_keeps_alpha_and_beta_of_its_arguments():
    case = CASES[3]
    args, _ = operands(case, alpha=3.0, beta=-1.0)
    launch = ops.get_operators(args)[0].launcher(args)
    _, (a, b, c, c0) = operands(case, alpha=3.0, beta=-1.0, seed=5)
    launch(EX(a), EX(b), EX(c))
    assert rel_err(c, reference(a, b, c0, 3.0, -1.0)) <= 1e-4


def test_launcher_general_path_releases_each_export():
    case = CASES[2]
    args, _ = operands(case)
    launch = ops.get_operators(args)[0].launcher(args, assume_supported_args=True)
    _, (a, b, c, c0) = operands(case, seed=3)
    arrays = [PROTO(a), PROTO(b), PROTO(c)]
    for _ in range(3):
        launch(*arrays)
    assert [x.exports for x in arrays] == [3, 3, 3] and [x.released for x in arrays] == [3, 3, 3]
    assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= 5e-3


def test_launcher_accepts_an_equivalent_layout():
    a = matrix((1, 64), np.float16)
    args = ops.GemmArguments(EX(a), EX(matrix((64, 32), np.float16)), EX(np.zeros((1, 32), np.float32)))
    launch = ops.get_operators(args)[0].launcher(args, assume_supported_args=True)
    odd = np.lib.stride_tricks.as_strided(a.reshape(64), (1, 64), (4096, 2))  # another stride on the size-1 dim
    b, c = matrix((64, 32), np.float16, seed=4), np.full((1, 32), np.nan, np.float32)
    launch(EX(odd), EX(b), EX(c))
    assert rel_err(c, reference(a, b, c, 1.0, 0.0)) <= 1e-4


def test_launcher_refuses_a_null_data_pointer_rather_than_run_on_the_bound_operands():
    args, _ = operands(CASES[0])
    launch = ops.get_operators(args)[0].launcher(args, assume_supported_args=True)
    _, (a, b, c, c0) = operands(CASES[0], seed=6)
    missing = EX(a)
    _ferry._sim_null_data(missing)
    launches = state()["launches"]
    with pytest.raises(ValueError, match="operand A has a NULL data pointer"):
        launch(missing, EX(b), EX(c))
    assert state()["launches"] == launches


def test_launcher_alignment_check_picks_the_operator_requirement():
    args, _ = operands(CASES[0])
    op = ops.get_operators(args)[0]
    assert op.constraints.a_align == 16
    checked, bypassed = op.launcher(args), op.launcher(args, assume_supported_args=True)
    shifted = matrix((128, 128), np.float16, offset=1)
    b, c = matrix((128, 128), np.float16), np.zeros((128, 128), np.float16)
    launches = state()["launches"]
    for launch in (checked, bypassed):
        with pytest.raises(ferry.FerryError, match="operand A") as e:
            launch(EX(shifted), EX(b), EX(c))
        assert e.value.status == "UNSUPPORTED"
    assert state()["launches"] == launches


def odd_address(shape, dtype):
    """A C-contiguous array of `shape` whose first element sits one byte past an aligned address."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.zeros(n + 8, np.uint8)[1:1 + n].view(dtype).reshape(shape)


def test_an_operand_not_aligned_to_its_elements_is_refused_for_every_operator():
    """The SIMT design asks no alignment of its own, but every kernel loads whole elements: a float32 operand at an
    odd address would fault on the GPU (a sticky error), so the arguments refuse it, and a launcher given one too."""
    a, b = odd_address((32, 16), np.float32), matrix((16, 24), np.float32, seed=1)
    c = np.zeros((32, 24), np.float32)
    with pytest.raises(ValueError, match="operand A: its first element, at 0x[0-9a-f]+, is not aligned to its 4-byte"):
        ops.GemmArguments(EX(a), EX(b), EX(c))
    good = ops.GemmArguments(EX(a.copy()), EX(b), EX(c))
    simt = [op for op in ops.get_operators(good) if op.constraints.a_align == 1][0]
    launches = state()["launches"]
    for launch in (simt.launcher(good), simt.launcher(good, assume_supported_args=True)):
        with pytest.raises(ferry.FerryError, match="operand A: its address is not aligned to its elements"):
            launch(EX(a), EX(b), EX(c))
    assert state()["launches"] == launches


def test_a_bias_or_scale_not_aligned_to_its_elements_is_refused():
    a, b, c = matrix((32, 16), np.float16), matrix((16, 24), np.float16, seed=1), np.zeros((32, 24), np.float32)
    with pytest.raises(ValueError, match="bias: its first element, at 0x[0-9a-f]+, is not aligned to its 4-byte"):
        ops.GemmArguments(EX(a), EX(b), EX(c), bias=EX(odd_address((24,), np.float32)))
    one = np.ones(1, np.float32)
    with pytest.raises(ValueError, match="scale_a: its element, at 0x[0-9a-f]+, is not aligned to 4 bytes"):
        ops.GemmArguments(EX(a), EX(b), EX(c), scale_a=EX(odd_address((1,), np.float32)), scale_b=EX(one))


def test_alpha_or_beta_past_float32_is_an_overflow_error_not_an_infinite_output():
    args, _ = operands(CASES[0])
    with pytest.raises(OverflowError, match="alpha=1e\\+40 is past float32's range"):
        ops.GemmArguments(args.A, args.B, args.out, alpha=1e40)
    with pytest.raises(OverflowError, match="beta=-1e\\+39 is past float32's range"):
        args.beta = -1e39
    args.alpha = float("inf")  # asked for in so many words: kept
    assert args.alpha == float("inf") and args.beta == 0.0


def test_an_output_overlapping_an_input_is_refused():
    buf = matrix((64, 64), np.float32)
    b = matrix((64, 64), np.float32, seed=1)
    with pytest.raises(ValueError, match="out overlaps A"):
        ops.GemmArguments(EX(buf), EX(b), EX(buf))
    with pytest.raises(ValueError, match="out overlaps B"):
        ops.GemmArguments(EX(b[:32]), EX(buf), EX(buf[16:48]))
    ops.GemmArguments(EX(buf[:32]), EX(b), EX(buf[32:]))  # halves of one buffer: no overlap


def test_a_launcher_refuses_an_out_overlapping_an_input_or_the_bias():
    X = matrix((3, 16, 16), np.float32)
    b = matrix((16, 16), np.float32, seed=1)
    args = ops.GemmArguments(EX(X[0:2].copy()), EX(b), EX(np.zeros((2, 16, 16), np.float32)))
    launches = state()["launches"]
    for assume in (False, True):
        launch = ops.get_operators(args)[0].launcher(args, assume_supported_args=assume)
        with pytest.raises(ValueError, match="out .* overlaps A"):
            launch(EX(X[0:2]), EX(b), EX(X[1:3]))
        with pytest.raises(ValueError, match="out .* overlaps B"):
            launch(EX(X[0:2].copy()), EX(X[2]), EX(X[1:3]))
    buf = np.zeros(16 * 16, np.float32)  # the bias is the first row of the buffer a later out takes
    with_bias = ops.GemmArguments(EX(X[0]), EX(b), EX(np.zeros((16, 16), np.float32)), bias=EX(buf[:16]))
    launch = ops.get_operators(with_bias)[0].launcher(with_bias)
    with pytest.raises(ValueError, match="out .* overlaps the bias"):
        launch(EX(X[0]), EX(b), EX(buf.reshape(16, 16)))
    assert state()["launches"] == launches


def test_a_bias_or_scale_inside_out_is_refused():
    a, b, c = matrix((8, 8), np.float32), matrix((8, 16), np.float32, seed=1), matrix((8, 16), np.float32, seed=2)
    with pytest.raises(ValueError, match="bias overlaps out"):
        ops.GemmArguments(EX(a), EX(b), EX(c), bias=EX(c[0]))
    with pytest.raises(ValueError, match="scale_a overlaps out"):
        ops.GemmArguments(EX(a), EX(b), EX(c), scale_a=EX(c[0, 0:1]), scale_b=EX(np.ones(1, np.float32)))


class _ReadOnlyDeviceMatrix:
    """A float32 matrix on (simulated) cuda:0 whose producer exports it read-only (DLPack 1.x's READ_ONLY flag)."""

    def __init__(self, array):
        self.array, self.live = array, []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        import ctypes

        sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
        from dlpack_ctypes import DLDataType, DLDevice, DLTensor

        deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

        class Managed(ctypes.Structure):
            _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                        ("deleter", deleter), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

        shape = (ctypes.c_int64 * 2)(*self.array.shape)
        no_op = deleter(lambda address: None)
        m = Managed(1, 1, None, no_op, 1)  # flags: DLPACK_FLAG_BITMASK_READ_ONLY
        m.dl_tensor = DLTensor(self.array.ctypes.data, DLDevice(2, 0), 2, DLDataType(2, 32, 1),
                               ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), None, 0)
        self.live.append((m, shape, no_op))
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(m), b"dltensor_versioned", None)


def test_an_out_exported_read_only_is_refused_and_left_as_it_was():
    a, b = matrix((16, 16), np.float32), matrix((16, 16), np.float32, seed=1)
    const = np.full((16, 16), 7.0, np.float32)
    with pytest.raises(ValueError, match="operand out .* read-only"):
        ops.GemmArguments(EX(a), EX(b), _ReadOnlyDeviceMatrix(const))
    args = ops.GemmArguments(EX(a), EX(b), EX(np.zeros((16, 16), np.float32)))
    launch = ops.get_operators(args)[0].launcher(args)
    with pytest.raises(ValueError, match="operand out .* read-only"):
        launch(EX(a), EX(b), _ReadOnlyDeviceMatrix(const))
    assert np.all(const == 7.0)


def test_empty_operands_with_meaningless_strides_are_accepted_and_launch_nothing():
    """NumPy gives zero-size arrays zero strides; an empty operand's strides say nothing about its layout."""
    A, B = np.zeros((0, 32, 16), np.float16), np.zeros((0, 16, 24), np.float16)
    C = np.zeros((0, 32, 24), np.float32)
    args = ops.GemmArguments(EX(A), EX(B), EX(C))
    assert args.problem["l"] == 0
    launches = state()["launches"]
    ops.get_operators(args)[0].run(args)
    assert state()["launches"] == launches
    col = np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), (0, 32, 24), (3072, 4, 128))
    assert ops.GemmArguments(EX(A), EX(B), EX(col)).problem["out_major"] == "column"  # usable strides are kept


def test_messages_name_devices_and_graph_states_plainly():
    args, _ = operands(CASES[0])
    with pytest.raises(ValueError, match="bias is on cpu; it must be on out's device, cuda:0"):
        ops.GemmArguments(args.A, args.B, args.out, bias=EX(np.zeros(128, np.float16), -1))
    g = ops.Graph(0x60)
    g.run(ops.get_operators(args)[0], args)
    g.end()
    g.close()
    with pytest.raises(ValueError, match="the graph is closed; capture a new Graph"):
        g.replay()


# ---- ferry graphs -------------------------------------------------------------------------------------------------


PERSISTENT_CHILD = """
import os, sys
import numpy as np
os.environ["FERRY_EXPERIMENTAL_DESIGNS"] = "1"   # read when the registry first fills: in this process, below
from ferry import _ferry
_ferry._sim_install()
_ferry._ops_sim_install()
import ferry.ops as ops
EX = _ferry._SimExchangeTensor
rng = np.random.default_rng(5)
for l, (m, n, k) in ((1, (300, 600, 520)), (3, (40, 600, 64))):
    a = rng.uniform(-1, 1, (l, m, k)).astype(np.float16).squeeze(0 if l == 1 else None)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    c = np.full(a.shape[:-1] + (n,), np.nan, np.float16)
    args = ops.GemmArguments(EX(a), EX(b), EX(c), "float32")
    found = [o for o in ops.get_operators(args) if o.name == "gemm_wgmma_f16_128x256x64_s4_persistent"]
    assert found, [o.name for o in ops.get_operators(args)]
    op = found[0]
    op.run(args)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    err = np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err < 5e-3, err
    st = _ferry._ops_sim_state()
    tiles = -(-m // 128) * -(-n // 256) * l
    assert st["last_grid"] == (min(tiles, 132), 1, 1), (st["last_grid"], tiles)
    assert st["last_block"] == 384, st["last_block"]
print("ok")
"""


def test_the_persistent_wgmma_design_launches_a_block_per_multiprocessor_over_every_batch(tmp_path):
    """FERRY_EXPERIMENTAL_DESIGNS=1 (read at the registry's first use, so in a process of its own): the persistent
    design is found on the sm_90 simulation, its grid is min(tiles × batches, 132 multiprocessors) in one row of
    384-thread blocks, and the GEMM its parameters describe is right."""
    import os
    import subprocess

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    env.pop("FERRY_ARCH", None)
    done = subprocess.run([sys.executable, "-c", PERSISTENT_CHILD], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_graph_capture_replay_and_update():
    case = (48, 40, 24, 1, np.float16, np.float32, "C", "C", "C", 0)
    sets = [operands(case, seed=10 * i) for i in range(4)]
    op = ops.get_operators(sets[0][0])[0]
    art = op.compile(sets[0][0])
    with ops.Graph(0xABC) as g:
        assert g.state == "capturing" and state()["capturing"]
        idx = [g.run(op, args, compiled_artifact=art, assume_supported_args=True) for args, _ in sets[:3]]
    assert idx == [0, 1, 2] and len(g) == 3 and g.state == "ready" and not state()["capturing"]
    for _, (a, b, c, c0) in sets[:3]:
        assert np.isnan(c).all()  # captured, not run
    g.replay()
    assert state()["last_stream"] == 0xABC
    for _, (a, b, c, c0) in sets[:3]:
        assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= 1e-4
    new_args, (a, b, c, c0) = sets[3]
    old_out = sets[1][1][2]
    old_out[...] = np.nan
    g.update(1, new_args)
    assert g.runs[1] is new_args
    g.replay(0xDEF)
    assert state()["last_stream"] == 0xDEF
    assert rel_err(c, reference(a, b, c0, 1.0, 0.0)) <= 1e-4
    assert np.isnan(old_out).all()  # run 1 no longer writes the old output
    g.close()
    assert g.state == "closed" and len(g) == 0


def test_graph_keeps_each_runs_arguments_alive():
    case = CASES[1]
    args, _ = operands(case)
    op = ops.get_operators(args)[0]
    before = sys.getrefcount(args)
    live = state()["live_graphs"], state()["live_execs"]
    g = ops.Graph(0x10)
    g.run(op, args)
    g.end()
    assert sys.getrefcount(args) == before + 1
    other, _ = operands(case, seed=9)
    g.update(0, other)
    assert sys.getrefcount(args) == before
    del g
    gc.collect()
    assert (state()["live_graphs"], state()["live_execs"]) == live


def test_graph_states_are_enforced():
    args, _ = operands(CASES[1])
    op = ops.get_operators(args)[0]
    g = ops.Graph(0x20)
    with pytest.raises(ValueError, match="the graph is capturing"):
        g.replay()
    g.run(op, args)
    g.end()
    with pytest.raises(ValueError, match="the graph is ready"):
        g.run(op, args)
    with pytest.raises(IndexError, match="run 5 does not exist"):
        g.update(5, args)
    bigger, _ = operands(CASES[0])
    with pytest.raises((ValueError, ferry.FerryError)):
        g.update(0, bigger)  # another operator's kind: refused by the C library
    with pytest.raises(TypeError, match="op must be a ferry.ops.Operator"):
        ops.Graph(0x21).run("op", args)


def test_an_exception_inside_the_capture_discards_it():
    args, _ = operands(CASES[1])
    with pytest.raises(KeyError):
        with ops.Graph(0x30) as g:
            g.run(ops.get_operators(args)[0], args)
            raise KeyError("inside")
    assert g.state == "broken" and not state()["capturing"]
    with pytest.raises(ValueError, match="broken"):
        g.replay()


def test_a_failed_instantiation_leaves_a_broken_graph():
    args, _ = operands(CASES[1])
    g = ops.Graph(0x40)
    g.run(ops.get_operators(args)[0], args)
    _ferry._sim_fault("cuGraphInstantiateWithFlags", 1, 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(ferry.FerryError) as e:
        g.end()
    assert e.value.call == "cuGraphInstantiateWithFlags" and g.state == "broken" and not state()["capturing"]


@pytest.mark.parametrize("call", ["cuStreamGetCaptureInfo", "cuGraphNodeGetType"])
def test_a_run_that_fails_after_its_kernel_was_captured_breaks_the_capture(call):
    """The capture then holds a node the graph keeps neither the operands nor the artifact for: it must never be
    instantiated, or a replay would run the failed GEMM on memory that may be gone."""
    args, _ = operands(CASES[1])
    op = ops.get_operators(args)[0]
    before = sys.getrefcount(args)
    g = ops.Graph(0x50)
    _ferry._sim_fault(call, 1, 1)
    with pytest.raises(ferry.FerryError) as e:
        g.run(op, args)
    assert e.value.call == call and sys.getrefcount(args) == before
    with pytest.raises(ValueError, match="run 0 of this graph failed after its kernel was captured"):
        g.run(op, args)
    with pytest.raises(ValueError, match="the capture is discarded"):
        g.end()
    assert g.state == "broken" and not state()["capturing"]
    with pytest.raises(ValueError, match="broken"):
        g.replay()


# ---- faults, reference counts, cost ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["run", "launcher"])
def test_a_failing_launch_is_a_ferry_error_naming_the_call(path):
    args, _ = operands(CASES[0])
    op = ops.get_operators(args)[0]
    art = op.compile(args)
    launch = op.launcher(args, art)
    _ferry._sim_fault("cuLaunchKernel", 1, 700)  # CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(ferry.FerryError) as e:
        if path == "run":
            op.run(args, compiled_artifact=art, assume_supported_args=True)
        else:
            launch(args.A, args.B, args.out)
    assert e.value.call == "cuLaunchKernel" and e.value.cu_result == 700 and e.value.status == "DRIVER_ERROR"


def test_no_reference_or_memory_leaks_over_1e5_calls():
    _ferry._ops_sim_compute(False)
    args, (a, b, c, c0) = operands(CASES[0])
    op = ops.get_operators(args)[0]
    art = op.compile(args)
    launch = op.launcher(args, art, assume_supported_args=True)
    tensors = (args.A, args.B, args.out)
    stream = FakeTorchStream(0x99)
    calls = [lambda: op.run(args, stream=stream, compiled_artifact=art, assume_supported_args=True),
             lambda: op.run(args, compiled_artifact=art), lambda: launch(*tensors), lambda: launch(*tensors, stream)]
    for call in calls:
        call()
    gc.collect()  # objects of earlier tests that still hold the (shared) Operator
    refs = [sys.getrefcount(x) for x in (args, art, op, launch, stream) + tensors]
    tracemalloc.start()
    first = tracemalloc.get_traced_memory()[0]
    for call in calls:
        for _ in range(25_000):
            call()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - first
    tracemalloc.stop()
    assert [sys.getrefcount(x) for x in (args, art, op, launch, stream) + tensors] == refs
    assert grown < 64 * 1024, grown


def test_python_side_cost_per_call_is_printed():
    """Not a benchmark (the CI machine is not the H200): the cost of each call form when the driver call is a
    no-op, to see where Python-side time goes. The H200 figures come from python -m ferry.bench.latency."""
    _ferry._ops_sim_compute(False)
    args, (a, b, c, c0) = operands(CASES[0])
    op = ops.get_operators(args)[0]
    art = op.compile(args)
    launch = op.launcher(args, art, assume_supported_args=True)
    checked = op.launcher(args, art)
    A, B, C = args.A, args.B, args.out
    run = op.run
    n = 50_000

    def per_call(fn):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter_ns()
            fn()
            best = min(best, (time.perf_counter_ns() - t0) / n / 1e3)
        return best

    def loop_launch():
        for _ in range(n):
            launch(A, B, C)

    def loop_checked():
        for _ in range(n):
            checked(A, B, C)

    def loop_run():
        for _ in range(n):
            run(args, compiled_artifact=art, assume_supported_args=True)

    def loop_args():
        for _ in range(n):
            ops.GemmArguments(A, B, C, "float32")

    def loop_empty():
        for _ in range(n):
            pass

    figures = {name: per_call(fn) for name, fn in [("empty loop", loop_empty), ("launcher", loop_launch),
                                                   ("launcher, checked", loop_checked), ("op.run", loop_run),
                                                   ("GemmArguments", loop_args)]}
    print("\nPython-side cost per call on this machine (simulated no-op launch), best of 5:")
    for name, us in figures.items():
        print(f"  {name:<18} {us:7.3f} us")
    assert figures["launcher"] < 50 and figures["GemmArguments"] < 100  # sanity only


def activated(x, activation):
    if activation == "relu":
        return np.maximum(x, 0)
    if activation == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    if activation == "silu":
        return x / (1 + np.exp(-x))
    return x


@pytest.mark.parametrize("bias_shape,activation", [("(n,)", "gelu_tanh"), ("(m, 1)", "silu"), (None, "relu"),
                                                    ("(1, n)", None)])
@pytest.mark.parametrize("make", [EX, PROTO], ids=["exchange", "dlpack"])
def test_a_fused_epilogue_reaches_the_kernel(bias_shape, activation, make):
    m, n, k = 40, 24, 16
    a, b = matrix((m, k), np.float16), matrix((k, n), np.float16, seed=1)
    c = np.full((m, n), np.nan, np.float32)
    shape = {"(n,)": (n,), "(1, n)": (1, n), "(m, 1)": (m, 1), None: None}[bias_shape]
    bias = None if shape is None else matrix((1, int(np.prod(shape))), np.float32, seed=3).reshape(shape)
    args = ops.GemmArguments(make(a), make(b), make(c), bias=None if bias is None else make(bias),
                             activation=activation)
    mode = "none" if bias is None else "column" if bias_shape == "(m, 1)" else "row"
    assert (args.problem["bias"], args.problem["activation"]) == (mode, activation or "identity")
    assert args.activation == activation and (args.bias is None) == (bias is None)
    ops.get_operators(args)[0].run(args)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if bias is not None:
        ref = ref + bias.astype(np.float64)  # (n,), (1, n) and (m, 1) broadcast as the epilogue adds them
    assert rel_err(c, activated(ref, activation)) <= 1e-5


def test_a_wrong_epilogue_is_refused_with_its_reason():
    a, b, c = matrix((8, 8), np.float16), matrix((8, 8), np.float16), np.zeros((8, 16), np.float16)
    b = matrix((8, 16), np.float16)
    with pytest.raises(ValueError, match="gelu_tanh"):
        ops.GemmArguments(EX(a), EX(b), EX(c), activation="gelu")  # torch's default GELU is the erf form
    with pytest.raises(ValueError, match="it must be out's, fp16"):
        ops.GemmArguments(EX(a), EX(b), EX(c), bias=EX(np.zeros(16, np.float32)))
    with pytest.raises(ValueError, match="has 8 elements"):
        ops.GemmArguments(EX(a), EX(b), EX(c), bias=EX(np.zeros(8, np.float16)))
    with pytest.raises(ValueError, match=r"bias has rank 2 and shape \(8, 16\)"):
        ops.GemmArguments(EX(a), EX(b), EX(c), bias=EX(np.zeros((8, 16), np.float16)))  # a full matrix: not a bias
    with pytest.raises(ValueError, match="bias has rank 3"):
        ops.GemmArguments(EX(a), EX(b), EX(c), bias=EX(np.zeros((1, 1, 16), np.float16)))
    with pytest.raises(ValueError, match="stride 2"):
        ops.GemmArguments(EX(a), EX(b), EX(c), bias=EX(np.zeros(32, np.float16)[::2]))


def test_a_launcher_with_an_epilogue_accepts_an_equivalent_layout_and_keeps_its_bias_alive():
    a = matrix((1, 64), np.float16)
    bias = matrix((1, 32), np.float32, seed=5).reshape(32)
    args = ops.GemmArguments(EX(a), EX(matrix((64, 32), np.float16)), EX(np.zeros((1, 32), np.float32)),
                             bias=EX(bias), activation="relu")
    held = sys.getrefcount(args)
    launch = ops.get_operators(args)[0].launcher(args, assume_supported_args=True)
    assert sys.getrefcount(args) == held + 1  # every call reads the bias: the launcher keeps the arguments
    plain = ops.GemmArguments(EX(a), EX(matrix((64, 32), np.float16)), EX(np.zeros((1, 32), np.float32)))
    held = sys.getrefcount(plain)
    plain_launch = ops.get_operators(plain)[0].launcher(plain)
    assert sys.getrefcount(plain) == held and plain_launch is not None  # without a bias, nothing is kept
    expected = bias.copy()
    del args, bias
    gc.collect()
    odd = np.lib.stride_tricks.as_strided(a.reshape(64), (1, 64), (4096, 2))  # another stride on the size-1 dim
    b, c = matrix((64, 32), np.float16, seed=4), np.full((1, 32), np.nan, np.float32)
    launch(EX(odd), EX(b), EX(c))
    ref = np.maximum(np.matmul(a.astype(np.float64), b.astype(np.float64)) + expected, 0)
    assert rel_err(c, ref) <= 1e-5
