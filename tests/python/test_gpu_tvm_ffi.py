"""The TVM-FFI provider on a GPU (run on the H200; skipped without torch, CUDA or tvm_ffi): gemm through
tvm_ffi.load_module against a float64 reference (fp16, bf16, fp32; column-major and batched operands), on torch's
current stream, and captured in a CUDA graph through tvm_ffi.use_torch_stream.

Error bounds: gemm_reference.py.
"""

import pytest

torch = pytest.importorskip("torch")
tvm_ffi = pytest.importorskip("tvm_ffi")
import ferry  # noqa: E402

if not torch.cuda.is_available() or ferry.device_count() == 0:
    pytest.skip("needs a CUDA device and torch with CUDA", allow_module_level=True)

import ferry.tvm_ffi  # noqa: E402

from gemm_reference import BOUND, DEV, operand, relative_error  # noqa: E402

gemm = ferry.tvm_ffi.load()["gemm"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("a_shape, b_shape, b_col", [((128, 128), (128, 128), False), ((127, 65), (65, 129), True),
                                                     ((3, 64, 96), (3, 96, 40), False)])
def test_gemm_through_tvm_ffi_matches_the_float64_reference(dtype, a_shape, b_shape, b_col):
    a, b = operand(a_shape, dtype, seed=1), operand(b_shape, dtype, b_col, seed=2)
    out = torch.full(torch.matmul(a, b).shape, float("nan"), dtype=dtype, device=DEV)
    gemm(a, b, out)
    torch.cuda.synchronize()
    assert relative_error(out, a, b) <= BOUND[dtype]


def test_gemm_runs_on_torchs_current_stream():
    a, b = operand((256, 256), torch.float16, seed=3), operand((256, 256), torch.float16, seed=4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        a2, b2 = a * 1, b * 1
        out = torch.empty(256, 256, dtype=torch.float16, device=DEV)
        gemm(a2, b2, out)
    side.synchronize()
    assert relative_error(out, a, b) <= BOUND[torch.float16]


def test_gemm_captured_in_a_cuda_graph_replays_on_new_data():
    a, b = operand((128, 64), torch.float16, seed=5), operand((64, 32), torch.float16, seed=6)
    out = torch.empty(128, 32, dtype=torch.float16, device=DEV)
    gemm(a, b, out)   # compile before capturing
    graph = torch.cuda.CUDAGraph()
    with tvm_ffi.use_torch_stream(torch.cuda.graph(graph)):
        gemm(a, b, out)
    for seed in range(3):
        a.copy_(operand((128, 64), torch.float16, seed=20 + seed))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out, a, b) <= BOUND[torch.float16]


def test_calls_that_alternate_layouts_and_alignments_each_get_their_own_problem():
    """The provider repeats a thread's last problem only when all three layouts and alignments are the same: calls
    that alternate shapes, majors and an operand 2 bytes off its 16-byte alignment must each be right."""
    base = torch.full((4096 + 8,), float("nan"), dtype=torch.float16, device=DEV)
    offset_a = base[1:1 + 64 * 64].view(64, 64)   # 2 bytes past an aligned address: another problem
    cases = []
    for seed, (a_shape, b_shape, b_col) in enumerate([((64, 64), (64, 64), False), ((64, 64), (64, 64), True),
                                                      ((64, 64), (64, 48), False), ((64, 64), (64, 64), False)]):
        a, b = operand(a_shape, torch.float16, seed=40 + seed), operand(b_shape, torch.float16, b_col, seed=50 + seed)
        cases.append((a, b, torch.empty(a_shape[0], b_shape[1], dtype=torch.float16, device=DEV)))
    offset_a.copy_(cases[0][0])
    cases.append((offset_a, cases[0][1], torch.empty(64, 64, dtype=torch.float16, device=DEV)))
    for _ in range(2):
        for a, b, out in cases + cases[::-1]:
            out.fill_(float("nan"))
            gemm(a, b, out)
            torch.cuda.synchronize()
            assert relative_error(out, a, b) <= BOUND[torch.float16]
