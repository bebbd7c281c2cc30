"""Without CUDA (no driver, as on CI): every batch comes back as the same object, nothing is pinned, and
nothing leaks."""

import gc
import sys
import tracemalloc

import ferry
import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("no_cuda")


def test_device_count_is_zero():
    assert ferry.device_count() == 0


@pytest.mark.parametrize("batch", [
    np.arange(4), [np.arange(4), {"a": 1}], {"x": (np.zeros(2), None)}, "text", None, 3.5, [],
])
def test_batch_is_returned_as_the_same_object(batch):
    assert ferry.transfer_tensor_d2h(batch) is batch
    assert ferry.transfer_tensor_h2d(batch) is batch


def test_async_handle_is_done_and_returns_the_batch():
    batch = {"a": np.ones(3)}
    handle = ferry.transfer_tensor_d2h_async(batch)
    assert handle.done()
    assert handle.wait() is batch
    assert handle.wait() is batch  # again: the same object
    assert "finished" in repr(handle)


def test_pool_functions_do_nothing():
    ferry.pool.reserve(1 << 20)
    ferry.pool.trim()
    stats = ferry.pool.stats()
    assert stats["bytes_pinned"] == 0 and stats["regions"] == 0
    assert set(stats) == {"bytes_pinned", "bytes_in_use", "bytes_peak_in_use", "bytes_peak_pinned", "regions",
                          "pin_calls", "pin_seconds", "hits", "misses"}


def test_pool_reserve_checks_its_argument():
    with pytest.raises(ValueError, match="-1"):
        ferry.pool.reserve(-1)
    with pytest.raises(TypeError):
        ferry.pool.reserve("1")


def test_no_reference_leaks_over_100000_calls():
    array = np.arange(8)
    batch = {"a": [array, 1], "b": "x"}
    before = (sys.getrefcount(batch), sys.getrefcount(array))
    for _ in range(1000):  # warm up allocator free lists
        ferry.transfer_tensor_d2h(batch)
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    start, _ = tracemalloc.get_traced_memory()
    for _ in range(50_000):
        ferry.transfer_tensor_d2h(batch, device=0)
        ferry.transfer_tensor_h2d_async(batch).wait()
    gc.collect()
    end, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert (sys.getrefcount(batch), sys.getrefcount(array)) == before
    assert len(gc.get_objects()) - objects < 100
    assert end - start < 64 * 1024, f"traced memory grew by {end - start} bytes"


def test_failed_calls_leak_nothing():
    batch = [np.arange(3)]
    before = sys.getrefcount(batch)
    for _ in range(10_000):
        with pytest.raises(ValueError):
            ferry.transfer_tensor_d2h(batch, device="cpu")
    assert sys.getrefcount(batch) == before


# ---- what can be checked without a driver is checked, as with one --------------------------------------------------


def test_a_bad_local_rank_is_refused_without_a_driver_too(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "abc")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        ferry.transfer_tensor_d2h([np.arange(3)])
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        ferry.transfer_tensor_h2d_async([np.arange(3)])


def test_a_batch_that_contains_itself_is_refused_without_a_driver_too():
    batch = [np.arange(3)]
    batch.append(batch)
    with pytest.raises(ValueError, match="reference cycle"):
        ferry.transfer_tensor_d2h(batch)


def test_a_batch_nested_too_deep_is_refused_without_a_driver_too():
    batch = []
    for _ in range(10**6):
        batch = [batch]
    with pytest.raises(RecursionError):
        ferry.transfer_tensor_d2h(batch)


def test_an_explicit_device_index_passes_through_without_a_driver():
    """No driver, no device count to check an index against: SPDL's contract returns the batch as it is."""
    batch = [np.arange(3)]
    assert ferry.transfer_tensor_d2h(batch, device="cuda:99") is batch
