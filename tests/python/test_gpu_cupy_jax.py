"""GPU tests with CuPy and JAX inputs (run on the H200; each part skipped when its framework or CUDA is missing).

The output rule under test: D2H CuPy -> numpy, JAX -> JAX CPU array; H2D numpy -> CuPy, JAX CPU -> JAX GPU.
"""

import os

import ferry
import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch and CuPy here

if ferry.device_count() == 0:
    pytest.skip("needs a CUDA device", allow_module_level=True)


def random_array(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    if dtype is np.bool_:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def test_byte_comparison_catches_one_flipped_byte_where_nan_values_would_not_compare():
    """The control for the byte comparisons below: random float bits hold NaNs (== is False on them), and one
    wrong byte must still show."""
    a = random_array((4096,), np.float32, 11)
    assert np.isnan(a).any() and not (a == a.copy()).all()
    b = a.copy()
    assert b.tobytes() == a.tobytes()
    b.view(np.uint8)[12345] ^= 1
    assert b.tobytes() != a.tobytes()


SHAPES_DTYPES = [((17,), np.uint8), ((5, 9), np.float32), ((3, 4, 5), np.int64), ((2, 3), np.float16),
                 ((0, 3), np.float32), ((), np.float64), ((1 << 20,), np.uint8), ((8,), np.bool_)]


# JAX works in 32 bits unless jax_enable_x64 is set: no 64-bit types in its cases.
JAX_SHAPES_DTYPES = [(s, d) for s, d in SHAPES_DTYPES if np.dtype(d).itemsize < 8]


# ---- CuPy ------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


def test_cupy_d2h_gives_exact_numpy_arrays(cp):
    hosts = [random_array(s, d, i) for i, (s, d) in enumerate(SHAPES_DTYPES)]
    out = ferry.transfer_tensor_d2h([cp.asarray(h) for h in hosts])
    for got, want in zip(out, hosts):
        assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_cupy_strided_inputs(cp):
    base = cp.asarray(random_array((40, 30), np.int32, 1))
    views = [base.T, base[::2, 3::4], base[:, 5]]
    out = ferry.transfer_tensor_d2h(views)
    for got, want in zip(out, views):
        assert got.shape == want.shape and got.tobytes() == cp.asnumpy(want).tobytes()


def test_cupy_producer_orders_its_pending_work_before_the_copy(cp):
    """CuPy's __dlpack__(stream=<ferry's copy stream>) makes the copy wait for CuPy's current stream."""
    x = cp.zeros(1 << 22, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    for _ in range(20):  # enough queued work that an unordered copy would read zeros
        x += 1
    out = ferry.transfer_tensor_d2h(x)
    assert (out == 20).all()


def test_numpy_h2d_gives_exact_cupy_arrays(cp):
    hosts = [random_array(s, d, i) for i, (s, d) in enumerate(SHAPES_DTYPES)]
    out = ferry.transfer_tensor_h2d({"h": hosts})
    for got, want in zip(out["h"], hosts):
        assert isinstance(got, cp.ndarray) and got.device.id == 0
        assert cp.asnumpy(got).tobytes() == want.tobytes()


def test_cupy_d2h_then_h2d_round_trip(cp):
    x = cp.asarray(random_array((333, 7), np.float64, 2))
    back = ferry.transfer_tensor_h2d(ferry.transfer_tensor_d2h(x))
    # Random bits as float64 include NaNs, for which == is False: compare bytes.
    assert isinstance(back, cp.ndarray) and back.shape == x.shape and back.dtype == x.dtype
    assert cp.asnumpy(back).tobytes() == cp.asnumpy(x).tobytes()


def test_cupy_stream_and_event_arguments(cp):
    x = cp.asarray(random_array((1000,), np.int16, 3))
    stream = cp.cuda.Stream(non_blocking=True)
    np.testing.assert_array_equal(ferry.transfer_tensor_d2h(x, device=0, stream=stream), cp.asnumpy(x))
    event = cp.cuda.Event()
    event.record()
    np.testing.assert_array_equal(ferry.transfer_tensor_d2h(x, producer_event=event), cp.asnumpy(x))


# ---- JAX -------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    return jax


def platform(array):
    return next(iter(array.devices())).platform


def test_jax_d2h_gives_exact_jax_cpu_arrays(jax):
    gpu = jax.devices("gpu")[0]
    hosts = [random_array(s, d, i) for i, (s, d) in enumerate(JAX_SHAPES_DTYPES)]
    out = ferry.transfer_tensor_d2h([jax.device_put(h, gpu) for h in hosts])
    for got, want in zip(out, hosts):
        assert platform(got) == "cpu"
        assert np.asarray(got).tobytes() == want.tobytes() and got.shape == want.shape


def test_jax_h2d_gives_exact_jax_gpu_arrays(jax):
    cpu = jax.devices("cpu")[0]
    hosts = [random_array(s, d, i) for i, (s, d) in enumerate(JAX_SHAPES_DTYPES)]
    out = ferry.transfer_tensor_h2d([jax.device_put(h, cpu) for h in hosts], device=0)
    for got, want in zip(out, hosts):
        assert platform(got) == "gpu"
        assert np.asarray(got).tobytes() == want.tobytes()


def test_jax_round_trip_in_a_nested_batch(jax):
    gpu = jax.devices("gpu")[0]
    batch = {"a": jax.device_put(random_array((64, 64), np.float32, 5), gpu), "meta": ("x", 1)}
    out = ferry.transfer_tensor_d2h(batch)
    assert out["meta"] is batch["meta"]
    assert np.asarray(out["a"]).tobytes() == np.asarray(batch["a"]).tobytes()
