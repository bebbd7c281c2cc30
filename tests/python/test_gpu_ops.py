"""ferry.ops on a GPU (run on the H200; skipped without torch or CUDA).

Correctness of runs against a float64 reference built from the rounded inputs (outputs poisoned with NaN first,
so an element never written fails): fp16, bf16 and fp32 operands, every major combination, odd sizes, batches,
storage offsets, alpha/beta, every operator that supports a case; the fast launcher; stream=None following torch's
current stream (ordering test with a control); op.run and the launcher captured under torch.cuda.graph (the run
lands on the capturing stream: a run on any other stream would invalidate the capture); ferry graphs with in-place
operand update; CuPy inputs; and reference counts and device memory over 10^5 calls.

Error bound (as tests/gpu/test_ops_gpu.c): ||out - ref|| / ||ref||: fp32 out from fp32 operands 1e-5, from
fp16/bf16 operands 1e-4; fp16 out 5e-3; bf16 out 1e-2.
"""

import gc
import sys

import ferry
import ferry.ops as ops
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or ferry.device_count() == 0:
    pytest.skip("needs a CUDA device and torch with CUDA", allow_module_level=True)

DEV = torch.device("cuda", 0)
SLEEP_CYCLES = 200_000_000  # ~0.1 s of torch.cuda._sleep on an H200: far longer than any GEMM here
NAN = float("nan")


def bound(in_dtype, out_dtype):
    if out_dtype is torch.bfloat16:
        return 1e-2
    if out_dtype is torch.float16:
        return 5e-3
    return 1e-5 if in_dtype is torch.float32 else 1e-4


def matrix(shape, dtype, major="row", offset=0, seed=0):
    """Random values in [-1, 1) of `dtype`, row- or column-major in the last two dimensions, `offset` elements into
    a larger allocation (a view with a storage offset)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    values = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    buf = torch.empty(n + offset, dtype=dtype, device=DEV)
    buf[offset:] = values.to(DEV)
    flat = buf[offset:]
    if major == "row":
        return flat.view(shape)
    swapped = tuple(shape[:-2]) + (shape[-1], shape[-2])
    return flat.view(swapped).transpose(-1, -2)


def reference(a, b, c0, alpha=1.0, beta=0.0):
    ref = alpha * torch.matmul(a.double(), b.double())
    return ref + beta * c0.double() if beta else ref


def rel_err(out, ref):
    out = out.double()
    assert not torch.isnan(out).any(), "an output element was never written (still NaN)"
    return (torch.linalg.norm(out - ref) / torch.linalg.norm(ref).clamp_min(1e-30)).item()


DTYPES = [(torch.float16, torch.float16), (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16),
          (torch.bfloat16, torch.float32), (torch.float32, torch.float32)]
SIZES = [(1, 1, 1, 1), (127, 129, 65, 1), (128, 128, 128, 1), (129, 127, 131, 1), (256, 64, 512, 1),
         (40, 24, 16, 3)]
MAJORS = [("row", "row", "row"), ("column", "row", "row"), ("row", "column", "row"), ("column", "column", "column")]


def make_case(m, n, k, l, tin, tout, majors=("row", "row", "row"), offset=0, alpha=1.0, beta=0.0, seed=0):
    lead = (l,) if l > 1 else ()
    a = matrix(lead + (m, k), tin, majors[0], offset, seed)
    b = matrix((k, n), tin, majors[1], offset, seed + 1)  # rank 2: broadcast over the batch
    c = matrix(lead + (m, n), tout, majors[2], offset, seed + 2)
    c0 = c.clone()
    if not beta:
        c.fill_(NAN)
    args = ops.GemmArguments(a, b, c, torch.float32, alpha=alpha, beta=beta)
    # The operands are complete before a test runs them on a stream of its choosing (torch's side streams do not
    # wait for the current stream: a NaN fill landing after a kernel's output reads as "never written", as seen on
    # the H200 while another process kept the GPU busy).
    torch.cuda.synchronize()
    return args, (a, b, c, c0)


@pytest.mark.parametrize("tin, tout", DTYPES, ids=lambda t: str(t).replace("torch.", ""))
@pytest.mark.parametrize("m, n, k, l", SIZES)
@pytest.mark.parametrize("majors", MAJORS, ids=lambda m: "".join(x[0] for x in m))
def test_run_matches_float64_reference(tin, tout, m, n, k, l, majors):
    args, (a, b, c, c0) = make_case(m, n, k, l, tin, tout, majors)
    found = ops.get_operators(args)
    assert found, f"no operator supports {args}"
    op = found[0]
    op.run(args, compiled_artifact=op.compile(args))
    torch.cuda.synchronize()
    err = rel_err(c, reference(a, b, c0))
    assert err <= bound(tin, tout), f"{op.name}: rel err {err:.3g}"


@pytest.mark.parametrize("tin, tout", DTYPES[:3], ids=lambda t: str(t).replace("torch.", ""))
def test_every_supporting_operator_is_correct(tin, tout):
    args, (a, b, c, c0) = make_case(129, 127, 131, 1, tin, tout, seed=3)
    ref = reference(a, b, c0)
    for op in ops.get_operators(args):
        c.fill_(NAN)
        op.run(args, compiled_artifact=op.compile(args), assume_supported_args=True)
        torch.cuda.synchronize()
        err = rel_err(c, ref)
        assert err <= bound(tin, tout), f"{op.name}: rel err {err:.3g}"


@pytest.mark.parametrize("form", ["a_rows_expanded", "b_rows_expanded", "b_rows_overlap", "a_cols_expanded"])
def test_zero_and_overlapping_leading_dimensions_on_every_supporting_operator(form):
    """Inputs whose rows repeat (an expanded row: leading dimension 0) or overlap (leading dimension 8 < 256) are
    valid operands: every operator that claims them, the TMA designs included (a tensor map of stride 0), computes
    the product of what the views show."""
    m = n = k = 256
    dtype = torch.bfloat16
    a, b = matrix((m, k), dtype, seed=7), matrix((k, n), dtype, seed=8)
    if form == "a_rows_expanded":
        a = a[:1].expand(m, k)
    elif form == "b_rows_expanded":
        b = b[:1].expand(k, n)
    elif form == "b_rows_overlap":
        b = torch.as_strided(matrix((k * 8 + n,), dtype, seed=9), (k, n), (8, 1))
    else:
        a = matrix((m, 1), dtype, seed=10).expand(m, k)  # column-major, every column the same: strides (1, 0)
    c = torch.empty((m, n), dtype=torch.float32, device=DEV)
    args = ops.GemmArguments(a, b, c, torch.float32)
    torch.cuda.synchronize()
    ref = reference(a, b, c)
    found = ops.get_operators(args)
    assert found, f"no operator supports {form}"
    for op in found:
        c.fill_(NAN)
        op.run(args, compiled_artifact=op.compile(args))
        torch.cuda.synchronize()
        err = rel_err(c, ref)
        assert err <= 1e-4, f"{op.name} on {form}: rel err {err:.3g}"


@pytest.mark.parametrize("offset", [1, 3, 8])
def test_storage_offsets_and_alpha_beta(offset):
    args, (a, b, c, c0) = make_case(65, 47, 33, 1, torch.float16, torch.float32, ("column", "row", "row"),
                                    offset=offset, alpha=-0.5, beta=2.0, seed=5)
    ops.get_operators(args)[0].run(args)
    torch.cuda.synchronize()
    assert rel_err(c, reference(a, b, c0, -0.5, 2.0)) <= 1e-4


def test_fp16_accumulation_where_an_operator_offers_it():
    a, b = matrix((64, 64), torch.float16), matrix((64, 64), torch.float16, seed=1)
    c = torch.full((64, 64), NAN, dtype=torch.float16, device=DEV)
    args = ops.GemmArguments(a, b, c, accumulator_type=torch.float16)
    found = ops.get_operators(args)
    if not found:
        pytest.skip("no operator accumulates in fp16")
    found[0].run(args)
    torch.cuda.synchronize()
    assert rel_err(c, reference(a, b, c)) <= 1e-2


# ---- the fast launcher -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("assume", [True, False])
def test_launcher_runs_new_operands(assume):
    args, _ = make_case(128, 128, 128, 1, torch.float16, torch.float16)
    op = ops.get_operators(args)[0]
    launch = op.launcher(args, op.compile(args), assume_supported_args=assume)
    for seed in range(5):
        _, (a, b, c, c0) = make_case(128, 128, 128, 1, torch.float16, torch.float16, seed=10 * seed)
        launch(a, b, c)
        torch.cuda.synchronize()
        assert rel_err(c, reference(a, b, c0)) <= 5e-3


def test_launcher_refuses_another_layout_before_launching():
    args, _ = make_case(128, 128, 128, 1, torch.float16, torch.float16)
    launch = ops.get_operators(args)[0].launcher(args)
    a = matrix((128, 128), torch.float16)
    with pytest.raises(ValueError, match="operand B is float16 on cuda:0 with shape"):
        launch(a, a.t(), a)  # transposed: column-major
    with pytest.raises(ValueError, match="operand A is bfloat16"):
        launch(a.bfloat16(), a, a)
    with pytest.raises(ValueError, match=r"shape \(64, 128\)"):
        launch(a[:64], a, a)


def test_a_negative_view_is_refused_as_an_operand_before_anything_runs():
    """torch's DLPack export describes a negative view (Tensor._neg_view(), z.conj().imag) as its memory, which holds
    the negation of its values: a kernel reading it would compute with the wrong sign."""
    args, (a, b, c, _) = make_case(128, 128, 128, 1, torch.float16, torch.float16)
    with pytest.raises(ValueError, match=r"GemmArguments: operand A is a negative view .*resolve_neg"):
        ops.GemmArguments(a._neg_view(), b, c, torch.float32)
    launch = ops.get_operators(args)[0].launcher(args)
    with pytest.raises(ValueError, match=r"Launcher: operand B is a negative view"):
        launch(a, b._neg_view(), c)
    with pytest.raises(ValueError, match=r"Launcher: operand out is a negative view"):
        launch(a, b, c._neg_view())
    launch(a, b._neg_view().resolve_neg(), c)   # the resolved copy is an ordinary operand


# ---- streams ---------------------------------------------------------------------------------------------------


def _ordering_case():
    """A run queued behind a ~0.1 s kernel that then rewrites A: it reads the new A only if it is ordered after
    the rewrite on the same stream."""
    a = torch.zeros((128, 128), dtype=torch.float16, device=DEV)
    b = torch.ones((128, 128), dtype=torch.float16, device=DEV)
    c = torch.full((128, 128), NAN, dtype=torch.float32, device=DEV)
    args = ops.GemmArguments(a, b, c)
    op = ops.get_operators(args)[0]
    return op, op.compile(args), args, a, c


def test_stream_none_follows_torchs_current_stream():
    op, art, args, a, c = _ordering_case()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        a.fill_(1.0)
        op.run(args, compiled_artifact=art)  # stream=None: torch's current stream, `side`
    side.synchronize()
    assert torch.all(c == 128.0)


def test_ordering_control_a_run_on_another_stream_reads_stale_data():
    """The control: the same run sent to a stream that does not wait for the rewrite reads the old A, so the test
    above can fail."""
    op, art, args, a, c = _ordering_case()
    torch.cuda.synchronize()
    side, other = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        a.fill_(1.0)
    op.run(args, stream=other, compiled_artifact=art)
    other.synchronize()
    stale = torch.all(c == 0.0).item()
    torch.cuda.synchronize()
    assert stale


def test_explicit_streams_torch_int_and_launcher():
    op, art, args, a, c = _ordering_case()
    side = torch.cuda.Stream()
    for stream in (side, side.cuda_stream):
        c.fill_(NAN)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            a.fill_(2.0)
        op.run(args, stream=stream, compiled_artifact=art)
        side.synchronize()
        assert torch.all(c == 256.0)
        a.zero_()
    launch = op.launcher(args, art)
    c.fill_(NAN)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        a.fill_(3.0)
        launch(a, args.B, c)  # stream=None
    side.synchronize()
    assert torch.all(c == 384.0)


def test_a_stream_of_another_device_is_refused():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two devices")
    args, _ = make_case(8, 8, 8, 1, torch.float16, torch.float16)
    with pytest.raises(ValueError, match="belongs to cuda:1"):
        ops.get_operators(args)[0].run(args, stream=torch.cuda.Stream(device=1))


# ---- CUDA graphs -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["run_stream_none", "run_current_stream", "launcher"])
def test_capture_under_torch_cuda_graph_lands_on_the_capturing_stream(form):
    sets = [make_case(128, 128, 128, 1, torch.float16, torch.float16, seed=10 * i) for i in range(3)]
    op = ops.get_operators(sets[0][0])[0]
    art = op.compile(sets[0][0])
    launch = op.launcher(sets[0][0], art, assume_supported_args=True)
    for args, _ in sets:  # eager first: the kernel is loaded and its function resolved outside the capture
        op.run(args, compiled_artifact=art)
    torch.cuda.synchronize()
    for _, (a, b, c, c0) in sets:
        c.fill_(NAN)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # a run on any stream but the capturing one would invalidate the capture here
        for args, _ in sets:
            if form == "run_stream_none":
                op.run(args, compiled_artifact=art, assume_supported_args=True)
            elif form == "run_current_stream":
                op.run(args, compiled_artifact=art, stream=torch.cuda.current_stream(), assume_supported_args=True)
            else:
                launch(args.A, args.B, args.out)
    torch.cuda.synchronize()
    for _, (a, b, c, c0) in sets:
        assert torch.isnan(c).all()  # captured, not run
    g.replay()
    torch.cuda.synchronize()
    for _, (a, b, c, c0) in sets:
        assert rel_err(c, reference(a, b, c0)) <= 5e-3
    # The graph reads the captured operands: new values in A show at the next replay.
    a0, c0_out = sets[0][1][0], sets[0][1][2]
    a0.mul_(-1)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(c0_out, reference(a0, sets[0][1][1], c0_out)) <= 5e-3


def test_ferry_graph_replay_and_update_with_new_operands():
    sets = [make_case(96, 80, 64, 1, torch.bfloat16, torch.float32, seed=7 * i) for i in range(4)]
    op = ops.get_operators(sets[0][0])[0]
    art = op.compile(sets[0][0])
    stream = torch.cuda.Stream()
    with ops.Graph(stream) as g:
        for args, _ in sets[:3]:
            g.run(op, args, compiled_artifact=art, assume_supported_args=True)
    assert len(g) == 3 and g.state == "ready"
    g.replay()
    stream.synchronize()
    for _, (a, b, c, c0) in sets[:3]:
        assert rel_err(c, reference(a, b, c0)) <= 1e-4
    new_args, (a, b, c, c0) = sets[3]
    old_out = sets[1][1][2]
    old_out.fill_(NAN)
    torch.cuda.synchronize()
    g.update(1, new_args)
    g.replay()
    stream.synchronize()
    assert rel_err(c, reference(a, b, c0)) <= 1e-4
    assert torch.isnan(old_out).all()
    other = torch.cuda.Stream()
    c.fill_(NAN)
    torch.cuda.synchronize()
    g.replay(other)
    other.synchronize()
    assert rel_err(c, reference(a, b, c0)) <= 1e-4
    g.close()


def test_ferry_graph_update_with_other_sizes():
    big, (a, b, c, c0) = make_case(200, 100, 64, 1, torch.float16, torch.float16, seed=1)
    small, (a2, b2, c2, c02) = make_case(33, 17, 9, 1, torch.float16, torch.float16, seed=2)
    op = next(o for o in ops.get_operators(big) if o.supports(small))
    stream = torch.cuda.Stream()
    with ops.Graph(stream) as g:
        g.run(op, big, compiled_artifact=op.compile(big))
    g.update(0, small)
    g.replay()
    stream.synchronize()
    assert rel_err(c2, reference(a2, b2, c02)) <= 5e-3


# ---- other frameworks ------------------------------------------------------------------------------------------


def test_cupy_operands_and_stream():
    cp = pytest.importorskip("cupy")
    rng = cp.random.RandomState(0)
    a = rng.uniform(-1, 1, (96, 64)).astype(cp.float16)
    b = rng.uniform(-1, 1, (64, 80)).astype(cp.float16)
    c = cp.full((96, 80), cp.nan, dtype=cp.float32)
    args = ops.GemmArguments(a, b, c, "float32")
    cp.cuda.Device().synchronize()  # the operands were made on CuPy's stream; the run goes on another
    stream = cp.cuda.Stream(non_blocking=True)
    ops.get_operators(args)[0].run(args, stream=stream)
    stream.synchronize()
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    assert err <= 1e-4


# ---- references and memory -------------------------------------------------------------------------------------


def test_no_reference_or_device_memory_leaks_over_1e5_calls():
    args, (a, b, c, c0) = make_case(128, 128, 128, 1, torch.float16, torch.float16)
    op = ops.get_operators(args)[0]
    art = op.compile(args)
    launch = op.launcher(args, art, assume_supported_args=True)
    stream = torch.cuda.current_stream()
    calls = [lambda: op.run(args, stream=stream, compiled_artifact=art, assume_supported_args=True),
             lambda: op.run(args), lambda: launch(a, b, c), lambda: ops.GemmArguments(a, b, c, torch.float32)]
    for call in calls:
        call()
    torch.cuda.synchronize()
    gc.collect()
    watched = (args, art, op, launch, stream, a, b, c)
    refs = [sys.getrefcount(x) for x in watched]
    memory = torch.cuda.memory_allocated()
    for call in calls:
        for i in range(25_000):
            call()
            if i % 5000 == 4999:
                torch.cuda.synchronize()
    torch.cuda.synchronize()
    gc.collect()
    assert [sys.getrefcount(x) for x in watched] == refs
    assert torch.cuda.memory_allocated() == memory
    assert rel_err(c, reference(a, b, c0)) <= 5e-3


def reference_epilogue(ref, bias, activation):
    if bias is not None:
        ref = ref + bias.double()
    if activation == "relu":
        return torch.relu(ref)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(ref, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(ref)
    return ref


@pytest.mark.parametrize("dtype, m, n, k, bias_shape, activation", [
    (torch.bfloat16, 16, 1024, 4096, "(n,)", "gelu_tanh"),   # a decode step through a linear layer: the m=16 designs
    (torch.bfloat16, 300, 1000, 520, "(n,)", "silu"),
    (torch.float16, 129, 127, 65, "(m, 1)", "relu"),
    (torch.float16, 256, 256, 256, None, "silu"),
    (torch.float32, 65, 47, 33, "(1, n)", "gelu_tanh"),
    (torch.bfloat16, 64, 256, 128, "(n,)", None),
])
def test_a_fused_epilogue_matches_torchs_linear_and_activation(dtype, m, n, k, bias_shape, activation):
    """out = activation(x @ W.T + bias), W stored n×k as nn.Linear keeps it (B column-major), against torch in
    float64 on the same rounded inputs, from every operator that supports the case."""
    x, w = matrix((m, k), dtype, seed=1), matrix((n, k), dtype, seed=2)
    shape = {"(n,)": (n,), "(1, n)": (1, n), "(m, 1)": (m, 1), None: None}[bias_shape]
    bias = None if shape is None else matrix(shape if len(shape) == 2 else (1, n), dtype, seed=3).reshape(shape)
    out = torch.full((m, n), NAN, dtype=dtype, device=DEV)
    args = ops.GemmArguments(x, w.t(), out, bias=bias, activation=activation)
    ref = reference_epilogue(x.double() @ w.double().t(), bias, activation)
    found = ops.get_operators(args)
    assert found, "no operator fuses this epilogue"
    for op in found:
        out.fill_(NAN)
        op.run(args)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), op.name
        err = float(torch.linalg.norm((out.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
        assert err <= bound(dtype, dtype), f"{op.name}: {err}"


def test_an_epilogue_is_part_of_the_compiled_kind_and_of_graph_updates():
    x, w = matrix((64, 128), torch.float16, seed=1), matrix((128, 96), torch.float16, seed=2)
    bias = matrix((1, 96), torch.float16, seed=3).reshape(96)
    out = torch.full((64, 96), NAN, dtype=torch.float16, device=DEV)
    plain = ops.GemmArguments(x, w, out)
    fused = ops.GemmArguments(x, w, out, bias=bias, activation="relu")
    assert plain.problem["kind"] != fused.problem["kind"]
    op = ops.get_operators(fused)[0]
    art = op.compile(fused)
    assert art.kind == fused.problem["kind"]
    with pytest.raises(ValueError):
        op.run(plain, compiled_artifact=art)  # an artifact of another kind
    op.run(fused, compiled_artifact=art)
    torch.cuda.synchronize()
    ref = reference_epilogue(x.double() @ w.double(), bias, "relu")
    assert rel_err(out, ref) <= 5e-3
    # captured, then updated in place to another output and another bias of the same kind
    bias2 = matrix((1, 96), torch.float16, seed=4).reshape(96)
    out2 = torch.full_like(out, NAN)
    stream = torch.cuda.Stream()
    with ops.Graph(stream) as g:
        g.run(op, fused, compiled_artifact=art)
    g.update(0, ops.GemmArguments(x, w, out2, bias=bias2, activation="relu"))
    with pytest.raises(ValueError):
        g.update(0, plain)  # another kind: the captured kernel does not fuse the same epilogue
    g.replay()
    stream.synchronize()
    assert rel_err(out2, reference_epilogue(x.double() @ w.double(), bias2, "relu")) <= 5e-3
    g.close()


# ---- 8-bit inputs ----------------------------------------------------------------------------------------------

FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


def fp8_operands(m, n, k, ta, tb, seed=0):
    """x (m×k) and a weight w (n×k), both row-major in their FP8 types; B is w.t() (column-major), as torch._scaled_mm
    takes it. Values in [-1, 1) rounded to the type."""
    return matrix((m, k), torch.float32, seed=seed).to(ta), matrix((n, k), torch.float32, seed=seed + 1).to(tb)


@pytest.mark.skipif(not FP8, reason="torch without float8 dtypes")
@pytest.mark.parametrize("ta, tb", [(FP8[0], FP8[0]), (FP8[0], FP8[-1]), (FP8[-1], FP8[0])],
                         ids=lambda t: str(t).replace("torch.float8_", ""))
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=lambda t: str(t).replace("torch.", ""))
@pytest.mark.parametrize("m, n, k", [(16, 1024, 4096), (129, 127, 160), (256, 512, 64)])
def test_fp8_with_scales_matches_a_float64_reference_and_scaled_mm(ta, tb, out_dtype, m, n, k):
    if torch.cuda.get_device_capability(DEV) < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89")
    x, w = fp8_operands(m, n, k, ta, tb)
    sa = torch.tensor(0.75, device=DEV)
    sb = torch.tensor(2.5, device=DEV)
    out = torch.full((m, n), NAN, dtype=out_dtype, device=DEV)
    args = ops.GemmArguments(x, w.t(), out, scale_a=sa, scale_b=sb)
    assert args.problem["scaled"] and args.problem["a_type"] in ("e4m3", "e5m2")
    ref = (x.double() @ w.double().t()) * 0.75 * 2.5
    found = ops.get_operators(args)
    assert found and all(("fp8" in op.name) for op in found)
    for op in found:
        out.fill_(NAN)
        op.run(args)
        torch.cuda.synchronize()
        err = rel_err(out, ref)
        # fp32 out: FP8 products are exact, but Hopper's FP8 tensor cores keep fewer bits of the running sum
        assert err <= (3e-3 if out_dtype is torch.float32 else bound(ta, out_dtype)), f"{op.name}: {err}"
    if ta is not tb or out_dtype is torch.float32 or m % 16 or n % 16:
        return  # what torch._scaled_mm takes
    # against torch's own FP8 GEMM (cuBLASLt) on the same operands: both round only at the output
    theirs = torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    assert rel_err(out, theirs.double()) <= 2 * bound(ta, out_dtype)


@pytest.mark.parametrize("m, n, k", [(16, 1024, 4096), (129, 127, 160), (256, 512, 64), (33, 64, 16)])
def test_int8_into_int32_is_exact_and_equals_int_mm(m, n, k):
    g = torch.Generator(device="cpu").manual_seed(m + n + k)
    x = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8).to(DEV)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8).to(DEV)
    out = torch.full((m, n), -(2**31), dtype=torch.int32, device=DEV)
    args = ops.GemmArguments(x, w.t(), out)
    assert args.accumulator_type == "int32" and args.problem["out_type"] == "int32"
    ref = x.cpu().long() @ w.cpu().long().t()  # exact (CUDA has no int64 matmul)
    for op in ops.get_operators(args):
        out.fill_(-(2**31))
        op.run(args)
        torch.cuda.synchronize()
        assert torch.equal(out.cpu().long(), ref), op.name
    if m > 16 and n % 8 == 0 and k % 8 == 0 and k > 16:  # what torch._int_mm takes
        assert torch.equal(out, torch._int_mm(x, w.t()))


def test_int8_with_a_scale_into_bf16_with_an_epilogue_and_graph_updates():
    """The dequantising form: bf16 = silu(scale_a·scale_b·(x @ w.t()) + bias), scales and bias on the GPU; a graph
    replays with the scales' new values without being updated."""
    g = torch.Generator(device="cpu").manual_seed(5)
    x = torch.randint(-128, 128, (64, 256), generator=g, dtype=torch.int8).to(DEV)
    w = torch.randint(-128, 128, (192, 256), generator=g, dtype=torch.int8).to(DEV)
    bias = matrix((1, 192), torch.bfloat16, seed=3).reshape(192)
    sa, sb = torch.tensor(1 / 512, device=DEV), torch.tensor(1 / 64, device=DEV)
    out = torch.full((64, 192), NAN, dtype=torch.bfloat16, device=DEV)
    args = ops.GemmArguments(x, w.t(), out, bias=bias, activation="silu", scale_a=sa, scale_b=sb)

    def ref():
        return reference_epilogue((x.double() @ w.double().t()) * sa.item() * sb.item(), bias, "silu")

    op = ops.get_operators(args)[0]
    art = op.compile(args)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with ops.Graph(stream) as graph:
        graph.run(op, args, compiled_artifact=art)
    graph.replay()
    stream.synchronize()
    assert rel_err(out, ref()) <= 1e-2
    sa.fill_(1 / 256)  # read by the kernel at every run: the replay sees it
    out.fill_(NAN)
    torch.cuda.synchronize()
    graph.replay()
    stream.synchronize()
    assert rel_err(out, ref()) <= 1e-2
    graph.close()


def test_8bit_refusals_name_what_is_wrong():
    x = torch.zeros((32, 64), dtype=torch.int8, device=DEV)
    w = torch.zeros((48, 64), dtype=torch.int8, device=DEV)
    out = torch.zeros((32, 48), dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="A row-major and B column-major"):
        ops.GemmArguments(x, w.t().contiguous(), out)
    with pytest.raises(ValueError, match="int32 output takes no epilogue"):
        ops.GemmArguments(x, w.t(), out, activation="relu")
    with pytest.raises(ValueError, match="scale_a was given without scale_b"):
        ops.GemmArguments(x, w.t(), out.float(), scale_a=torch.ones((), device=DEV))
    with pytest.raises(ValueError, match="per-tensor scale has one"):
        ops.GemmArguments(x, w.t(), out.float(), scale_a=torch.ones(2, device=DEV), scale_b=torch.ones(2, device=DEV))
    args = ops.GemmArguments(x, w.t(), out)
    args.alpha = 2.0
    op = ops.get_operators(ops.GemmArguments(x, w.t(), out))[0]
    with pytest.raises(Exception, match="int32 output takes alpha 1 and beta 0"):
        op.run(args)
