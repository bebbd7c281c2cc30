"""ferry's GEMM from JAX through jax-tvm-ffi (run on the H200; skipped without a GPU, JAX with CUDA, tvm_ffi or
jax_tvm_ffi): the provider's gemm registered as an XLA FFI target, called from jax.jit, against a float64 reference
(fp16, bf16, fp32), and under a jitted loop that XLA may capture as a CUDA graph (allow_cuda_graph=True).

Error bound (as test_gpu_ops.py): ||out - ref|| / ||ref||: fp32 1e-5, fp16 5e-3, bf16 1e-2.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch and CuPy here
jax = pytest.importorskip("jax")
pytest.importorskip("tvm_ffi")
jax_tvm_ffi = pytest.importorskip("jax_tvm_ffi")
try:
    jax.devices("gpu")
except RuntimeError:
    pytest.skip("needs JAX with a CUDA device", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402

import ferry.tvm_ffi  # noqa: E402

BOUND = {jnp.float32: 1e-5, jnp.float16: 5e-3, jnp.bfloat16: 1e-2}
jax_tvm_ffi.register_ffi_target("ferry_gemm", ferry.tvm_ffi.load()["gemm"], ["args", "rets"], platform="gpu",
                                allow_cuda_graph=True)


def gemm(a, b):
    out = jax.ShapeDtypeStruct(a.shape[:-1] + b.shape[-1:], a.dtype)
    return jax.ffi.ffi_call("ferry_gemm", out)(a, b)


def operands(m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    a = jnp.asarray(rng.uniform(-1, 1, (m, k)), dtype=dtype)
    b = jnp.asarray(rng.uniform(-1, 1, (k, n)), dtype=dtype)
    return a, b


def relative_error(out, a, b):
    ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    return float(np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("m, k, n", [(128, 128, 128), (127, 65, 129)])
def test_jitted_gemm_through_jax_tvm_ffi_matches_the_float64_reference(dtype, m, k, n):
    a, b = operands(m, k, n, dtype, seed=m + n)
    out = jax.jit(gemm)(a, b)
    assert out.shape == (m, n) and out.dtype == dtype
    assert relative_error(out, a, b) <= BOUND[dtype]


def test_a_jitted_loop_of_gemms_matches_the_reference():
    a, b = operands(128, 128, 128, jnp.float32, seed=7)

    @jax.jit
    def four(a, b):
        for _ in range(4):
            a = gemm(a, b) * 0.05
        return a

    expected = np.asarray(a, np.float64)
    for _ in range(4):
        expected = (expected @ np.asarray(b, np.float64)) * 0.05
    got = np.asarray(four(a, b), np.float64)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-4
