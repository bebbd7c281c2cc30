"""torch.ops.ferry.gemm / gemm_out on a GPU (run on the H200; skipped without torch or CUDA): eager results against
a float64 reference (fp16, bf16, fp32; row- and column-major operands; odd sizes; batches and broadcasting), the
current stream followed, torch.compile(fullgraph=True) with the default backend and with mode="reduce-overhead"
(CUDA graphs) equal to eager, gemm_out captured under torch.cuda.graph and replayed on new data, gemm's backward
against torch.matmul's (eager and compiled), and gemm_out's refusal of operands that require grad.

Error bounds: gemm_reference.py.
"""

import pytest

torch = pytest.importorskip("torch")
import ferry  # noqa: E402

if not torch.cuda.is_available() or ferry.device_count() == 0:
    pytest.skip("needs a CUDA device and torch with CUDA", allow_module_level=True)

import ferry.torch  # noqa: E402,F401  (registers the ops)

from gemm_reference import BOUND, DEV, operand, relative_error  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("a_shape, b_shape", [
    ((128, 128), (128, 128)),
    ((127, 65), (65, 129)),
    ((3, 64, 96), (3, 96, 40)),
    ((3, 64, 96), (96, 40)),
])
@pytest.mark.parametrize("a_col, b_col", [(False, False), (True, False), (False, True)])
def test_eager_gemm_matches_the_float64_reference(dtype, a_shape, b_shape, a_col, b_col):
    a, b = operand(a_shape, dtype, a_col, 1), operand(b_shape, dtype, b_col, 2)
    out = torch.ops.ferry.gemm(a, b)
    assert out.dtype == dtype and out.shape == torch.matmul(a, b).shape and out.device == DEV
    assert relative_error(out, a, b) <= BOUND[dtype]
    into = torch.full_like(out, float("nan"))
    torch.ops.ferry.gemm_out(a, b, into)
    assert torch.equal(into, out)   # the same kernel, the same bits


def test_gemm_runs_on_torchs_current_stream():
    a, b = operand((256, 256), torch.float16, seed=3), operand((256, 256), torch.float16, seed=4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)   # the inputs are written after a delay on this stream...
        a2, b2 = a * 1, b * 1
        out = torch.ops.ferry.gemm(a2, b2)  # ... and the product, on the same stream, must see them
    side.synchronize()
    assert relative_error(out, a, b) <= BOUND[torch.float16]


def layer(x, w1, w2):
    return torch.ops.ferry.gemm(torch.relu(torch.ops.ferry.gemm(x, w1)), w2) + 1


def test_compiled_with_fullgraph_matches_eager():
    x, w1, w2 = (operand(s, torch.bfloat16, seed=i) for i, s in enumerate([(64, 256), (256, 512), (512, 128)]))
    eager = layer(x, w1, w2)
    compiled = torch.compile(layer, fullgraph=True)
    for _ in range(2):
        assert torch.equal(compiled(x, w1, w2), eager)


def test_compiled_with_reduce_overhead_replays_cuda_graphs_with_new_inputs():
    shapes = [(64, 256), (256, 512), (512, 128)]
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):   # warm-up, recording, then replays: each with new values
        x, w1, w2 = (operand(s, torch.float16, seed=10 * seed + i) for i, s in enumerate(shapes))
        assert torch.equal(compiled(x, w1, w2).clone(), layer(x, w1, w2))


def test_gemm_out_captured_under_torch_cuda_graph_replays_on_new_data():
    a, b = operand((128, 64), torch.float16, seed=5), operand((64, 32), torch.float16, seed=6)
    out = torch.empty(128, 32, dtype=torch.float16, device=DEV)
    torch.ops.ferry.gemm_out(a, b, out)   # bind the launcher (compile) before capturing
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.ferry.gemm_out(a, b, out)
    for seed in range(3):
        a.copy_(operand((128, 64), torch.float16, seed=20 + seed))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out, a, b) <= BOUND[torch.float16]


@pytest.mark.parametrize("a_shape, b_shape", [((64, 96), (96, 40)), ((3, 64, 96), (96, 40)),
                                              ((1, 64, 96), (3, 96, 40))])
def test_gemm_backward_matches_torch_matmuls_and_a_compiled_training_step_matches_eager(a_shape, b_shape):
    a = operand(a_shape, torch.float32, seed=7).requires_grad_()
    b = operand(b_shape, torch.float32, seed=8).requires_grad_()
    upstream = operand(torch.matmul(a, b).shape, torch.float32, seed=9)
    grads = []
    compiled = torch.compile(lambda x, y: torch.ops.ferry.gemm(x, y), fullgraph=True)
    for fn in (torch.ops.ferry.gemm, torch.matmul, compiled):
        a.grad = b.grad = None
        torch.autograd.backward(fn(a, b), upstream)
        grads.append((a.grad.clone(), b.grad.clone()))
    for got in (grads[0], grads[2]):
        for g, want in zip(got, grads[1]):
            assert g.shape == want.shape
            assert float(torch.linalg.norm(g - want) / torch.linalg.norm(want)) <= BOUND[torch.float32]


def test_gemm_out_refuses_operands_that_require_grad_and_runs_under_no_grad():
    a = operand((64, 32), torch.float16, seed=10).requires_grad_()
    b, out = operand((32, 16), torch.float16, seed=11), torch.empty(64, 16, dtype=torch.float16, device=DEV)
    with pytest.raises(RuntimeError, match="does not support automatic differentiation"):
        torch.ops.ferry.gemm_out(a, b, out)
    with torch.no_grad():
        torch.ops.ferry.gemm_out(a, b, out)
    assert relative_error(out, a.detach(), b) <= BOUND[torch.float16]
