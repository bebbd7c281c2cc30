"""torch.ops.ferry.gemm / gemm_out on the CPU: registered by importing ferry.torch, their fake implementations
(shapes, broadcasting, every error) on the meta device, one bound launcher per distinct problem (ferry.ops stood in
for), and no graph break under torch.compile(fullgraph=True) in a subprocess that gives the ops a CPU kernel of its
own (the real kernel needs a GPU: test_gpu_torch_ops.py)."""

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import ferry.torch  # noqa: E402,F401  (registers the ops)
from ferry import _torch_ops  # noqa: E402


def meta(*shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_importing_ferry_torch_registers_both_ops():
    assert torch.ops.ferry.gemm.default is not None and torch.ops.ferry.gemm_out.default is not None
    assert ferry.torch.gemm is _torch_ops.gemm and ferry.torch.gemm_out is _torch_ops.gemm_out


@pytest.mark.parametrize("a_shape, b_shape, out_shape", [
    ((64, 32), (32, 16), (64, 16)),
    ((3, 64, 32), (3, 32, 16), (3, 64, 16)),
    ((3, 64, 32), (32, 16), (3, 64, 16)),      # a rank-2 B is broadcast over A's batch
    ((1, 64, 32), (5, 32, 16), (5, 64, 16)),   # so is a batch-1 A
    ((0, 64, 32), (32, 16), (0, 64, 16)),      # a batch of 0 stays 0, as in torch.matmul
    ((1, 64, 32), (0, 32, 16), (0, 64, 16)),
])
def test_the_fake_implementation_gives_the_products_shape_and_dtype(a_shape, b_shape, out_shape):
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        out = torch.ops.ferry.gemm(meta(*a_shape, dtype=dtype), meta(*b_shape, dtype=dtype))
        assert out.shape == out_shape and out.dtype == dtype and out.device.type == "meta"
        a, b, out = meta(*a_shape, dtype=dtype), meta(*b_shape, dtype=dtype), meta(*out_shape, dtype=dtype)
        torch.ops.ferry.gemm_out(a, b, out)


@pytest.mark.parametrize("a, b, message", [
    (meta(4), meta(4, 2), "rank 2 or 3"),
    (meta(2, 2, 2, 2), meta(2, 2), "rank 2 or 3"),
    (meta(4, 8), meta(8, 2, dtype=torch.float32), "float16 and torch.float32"),
    (meta(4, 8, dtype=torch.int8), meta(8, 2, dtype=torch.int8), "float16, bfloat16 or float32"),
    (meta(4, 8), meta(7, 2), "A's k (8) is not B's k (7)"),
    (meta(2, 4, 8), meta(3, 8, 2), "batches of 2 (A) and 3 (B)"),
])
def test_bad_operands_raise_value_errors_naming_what_is_wrong(a, b, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        torch.ops.ferry.gemm(a, b)


def test_gemm_out_checks_its_output():
    with pytest.raises(ValueError, match=r"out must be torch.float16 \(4, 2\)"):
        torch.ops.ferry.gemm_out(meta(4, 8), meta(8, 2), meta(4, 3))
    with pytest.raises(ValueError, match="out must be"):
        torch.ops.ferry.gemm_out(meta(4, 8), meta(8, 2), meta(4, 2, dtype=torch.float32))


def test_a_cpu_tensor_has_no_kernel():
    with pytest.raises(NotImplementedError, match="ferry::gemm"):
        torch.ops.ferry.gemm(torch.ones(2, 2, dtype=torch.float16), torch.ones(2, 2, dtype=torch.float16))


class _StandInOps:
    """ferry.ops with the operator search, compile and launcher counted and run on the CPU."""

    def __init__(self, supported=True):
        self.compiles, self.launches, self.supported = 0, 0, supported
        outer = self

        class Args:
            def __init__(self, A, B, out, accumulator_type):
                assert accumulator_type is torch.float32
                self.problem = (tuple(A.shape), tuple(B.shape))

        class Op:
            def compile(self, args):
                outer.compiles += 1
                return "artifact"

            def launcher(self, args, artifact):
                def launch(a, b, out):
                    outer.launches += 1
                    out.copy_(torch.matmul(a.float(), b.float()).to(out.dtype))
                return launch

        self.GemmArguments = Args
        self.get_operators = lambda args: [Op()] if outer.supported else []


def test_each_distinct_problem_compiles_once_and_binds_one_launcher(monkeypatch):
    stand_in = _StandInOps()
    monkeypatch.setattr(_torch_ops, "ops", stand_in)
    monkeypatch.setattr(_torch_ops, "_launchers", {})
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    out = torch.empty(4, 2)
    for _ in range(3):
        _torch_ops._launcher(a, b, out)(a, b, out)
    assert stand_in.compiles == 1 and stand_in.launches == 3
    assert torch.allclose(out, a @ b)
    at = b.t().contiguous().t()  # the same shape, column-major: another problem
    _torch_ops._launcher(a, at, out)(a, at, out)
    assert stand_in.compiles == 2 and len(_torch_ops._launchers) == 2


def test_a_view_of_a_known_layout_at_a_less_aligned_address_binds_its_own_launcher(monkeypatch):
    """The operator chosen for an aligned operand may need that alignment: a window of the same shape and strides
    starting 8 bytes further on is another problem, with its own search, not that operator's refusal."""
    stand_in = _StandInOps()
    monkeypatch.setattr(_torch_ops, "ops", stand_in)
    monkeypatch.setattr(_torch_ops, "_launchers", {})
    x, w = torch.randn(64, 136, dtype=torch.float16), torch.randn(128, 64, dtype=torch.float16)
    out = torch.empty(64, 64, dtype=torch.float16)
    for start in (0, 4, 8, 0):  # 0, 8 and 16 bytes into each row, then the first again
        _torch_ops._launcher(x[:, start:start + 128], w, out)
    assert stand_in.compiles == 2 and len(_torch_ops._launchers) == 2  # 16-byte aligned (0, 8) and 8-byte (4)


def test_the_launcher_table_starts_again_past_its_bound(monkeypatch):
    stand_in = _StandInOps()
    monkeypatch.setattr(_torch_ops, "ops", stand_in)
    monkeypatch.setattr(_torch_ops, "_launchers", {})
    monkeypatch.setattr(_torch_ops, "_LAUNCHERS_KEPT", 4)
    for m in range(1, 7):
        a, b = torch.randn(m, 8), torch.randn(8, 2)
        _torch_ops._launcher(a, b, torch.empty(m, 2))
    assert stand_in.compiles == 6 and len(_torch_ops._launchers) == 2


def test_a_problem_no_operator_supports_is_a_value_error(monkeypatch):
    monkeypatch.setattr(_torch_ops, "ops", _StandInOps(supported=False))
    monkeypatch.setattr(_torch_ops, "_launchers", {})
    with pytest.raises(ValueError, match="no ferry operator supports"):
        _torch_ops._launcher(torch.randn(4, 8), torch.randn(8, 2), torch.empty(4, 2))


COMPILE_CHECK = textwrap.dedent("""
    import torch, ferry.torch
    from torch._dynamo.utils import counters

    calls = []

    @torch.library.register_kernel("ferry::gemm", "cpu")
    def _(a, b):
        calls.append("gemm")
        return torch.matmul(a.float(), b.float()).to(a.dtype)

    @torch.library.register_kernel("ferry::gemm_out", "cpu")
    def _(a, b, out):
        calls.append("gemm_out")
        out.copy_(torch.matmul(a.float(), b.float()).to(a.dtype))

    def f(a, b, c):
        h = torch.relu(torch.ops.ferry.gemm(a, b)) + 1
        out = torch.empty(h.shape[0], c.shape[1], dtype=h.dtype)
        torch.ops.ferry.gemm_out(h, c, out)
        return out * 2

    a, b, c = (torch.randn(16, 32), torch.randn(32, 8), torch.randn(8, 4))
    eager = f(a, b, c)
    calls.clear()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        assert torch.equal(compiled(a, b, c), eager)
    assert calls == ["gemm", "gemm_out"] * 2, calls   # the ops themselves ran, once per call, not a decomposition
    assert not counters["graph_break"], dict(counters["graph_break"])
    print("compiled ok")
""")


def test_a_function_calling_the_ops_compiles_with_fullgraph_and_matches_eager():
    # In a subprocess: the CPU kernels it registers must not outlive the test in this process.
    done = subprocess.run([sys.executable, "-c", COMPILE_CHECK], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "compiled ok" in done.stdout, done.stdout + done.stderr


AUTOGRAD_CHECK = textwrap.dedent("""
    import torch, ferry.torch

    torch.library.register_kernel("ferry::gemm", "cpu")(lambda a, b: torch.matmul(a, b))

    def gemm_out_kernel(a, b, out):
        out.copy_(torch.matmul(a, b))

    # ferry's own gemm_out kernel body, its grad check included, with a CPU launch standing in
    from ferry import _torch_ops
    _torch_ops._launcher = lambda a, b, out: gemm_out_kernel
    torch.library.register_kernel("ferry::gemm_out", "cpu")(_torch_ops.gemm_out)

    for a_shape, b_shape in [((5, 3), (3, 4)), ((2, 5, 3), (3, 4)), ((1, 5, 3), (2, 3, 4)), ((2, 5, 3), (1, 3, 4)),
                             ((2, 5, 3), (2, 3, 4))]:
        a = torch.randn(a_shape, dtype=torch.float32, requires_grad=True)
        b = torch.randn(b_shape, dtype=torch.float32, requires_grad=True)
        upstream = torch.randn(torch.matmul(a, b).shape)
        torch.autograd.backward(torch.ops.ferry.gemm(a, b), upstream)
        got = a.grad, b.grad
        a.grad = b.grad = None
        torch.autograd.backward(torch.matmul(a, b), upstream)
        assert got[0].shape == a.shape and got[1].shape == b.shape, (a_shape, b_shape)
        assert torch.allclose(got[0], a.grad, atol=1e-5) and torch.allclose(got[1], b.grad, atol=1e-5), a_shape

    a, b, out = torch.randn(5, 3, requires_grad=True), torch.randn(3, 4), torch.empty(5, 4)
    try:
        torch.ops.ferry.gemm_out(a, b, out)
        raise SystemExit("gemm_out accepted an operand that requires grad")
    except RuntimeError as e:
        assert "does not support automatic differentiation" in str(e), e
    version = out._version
    with torch.no_grad():
        torch.ops.ferry.gemm_out(a, b, out)
    assert out._version > version and torch.allclose(out, a.detach() @ b)
    print("autograd ok")
""")


def test_gemm_has_a_backward_and_gemm_out_refuses_operands_that_require_grad():
    done = subprocess.run([sys.executable, "-c", AUTOGRAD_CHECK], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "autograd ok" in done.stdout, done.stdout + done.stderr
