"""Transfers through the simulated driver: exact bytes, layouts, arguments that need a device, slab lifetime and
pool statistics, the async handle, driver faults, and leaks."""

import collections.abc
import dataclasses
import gc
import os
import sys
import threading
import tracemalloc
import types

import ferry
import numpy as np
import pytest
from ferry import _ferry
from sim_helpers import address, device, read_device

DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64, np.float16, np.float32, np.float64,
          np.complex64, np.complex128, np.bool_]


def random_array(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    if dtype is np.bool_:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


# ---- exact bytes ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_d2h_is_byte_exact_for_every_dtype(dtype):
    arrays = [random_array(shape, dtype, seed) for seed, shape in enumerate([(7,), (3, 5), (2, 3, 4), (1,)])]
    out = ferry.transfer_tensor_d2h([device(a) for a in arrays])
    for got, want in zip(out, arrays):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_strided_inputs_give_compact_exact_outputs():
    base = random_array((16, 24), np.float32)
    views = [base.T, base[::2, 1::3], base[:, 5], base[3:9, ::-1] if False else base[3:9, 2:20:4]]
    out = ferry.transfer_tensor_d2h([device(v) for v in views])
    for got, want in zip(out, views):
        assert got.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(got, want)


def test_zero_size_and_zero_dim_tensors():
    arrays = [np.zeros((0,), np.float32), np.zeros((3, 0, 2), np.int64), np.array(5.5, np.float64)]
    out = ferry.transfer_tensor_d2h([device(a) for a in arrays])
    for got, want in zip(out, arrays):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_large_and_small_tensors_together():
    """Large ones take their own DMA, small ones the gather kernel; both land exactly."""
    arrays = [random_array((3 << 20,), np.uint8, 1), random_array((100,), np.float32, 2),
              random_array((2048, 1024), np.uint8, 3)]
    out = ferry.transfer_tensor_d2h([device(a) for a in arrays])
    for got, want in zip(out, arrays):
        assert got.tobytes() == want.tobytes()


def test_many_tensors():
    arrays = [random_array((i % 17 + 1, 3), np.int16, i) for i in range(4096)]
    out = ferry.transfer_tensor_d2h([device(a) for a in arrays])
    assert all(np.array_equal(g, w) for g, w in zip(out, arrays))


def test_h2d_round_trip_through_exporters():
    arrays = [random_array((5, 7), np.float32, 4), random_array((9,), np.int8, 5), np.zeros((0, 3), np.float64)]
    on_device = ferry.transfer_tensor_h2d({"x": arrays})  # simulated device memory: ferry.SlabTensor outputs
    outs = on_device["x"]
    assert all(type(o) is ferry.SlabTensor for o in outs)
    for o, a in zip(outs, arrays):
        assert o.device == "cuda:0" and o.__dlpack_device__() == (2, 0)
        assert o.shape == a.shape and o.dtype == a.dtype.name and o.nbytes == a.nbytes
        np.testing.assert_array_equal(read_device(o, a.dtype, a.shape), a)
    back = ferry.transfer_tensor_d2h(on_device)  # SlabTensor is itself a DLPack producer on cuda:0
    for b, a in zip(back["x"], arrays):
        np.testing.assert_array_equal(b, a)


def test_h2d_outputs_stay_slab_tensors_even_where_cupy_is_importable(monkeypatch):
    """The suite must not depend on what is installed: on a GPU machine CuPy is importable, and handing it
    simulated device pointers fails in the real driver. A stand-in cupy module shows the switch at work (and,
    as the control, that the stand-in is used once the switch is off)."""
    seen = []
    fake = types.ModuleType("cupy")
    fake.from_dlpack = lambda x: seen.append(x) or ("cupy", x)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    _ferry._sim_frameworks(False)  # forget consumers looked up earlier
    out = ferry.transfer_tensor_h2d([np.arange(3)])
    assert type(out[0]) is ferry.SlabTensor and seen == []
    try:
        _ferry._sim_frameworks(True)
        control = ferry.transfer_tensor_h2d([np.arange(3)])
        assert control[0][0] == "cupy" and len(seen) == 1
    finally:
        _ferry._sim_frameworks(False)


def test_h2d_from_pinned_memory():
    """A D2H output lives in registered (pinned) memory: H2D reads it directly."""
    arrays = [random_array((33, 3), np.uint8, 6), random_array((3 << 20,), np.uint8, 7)]
    pinned = ferry.transfer_tensor_d2h([device(a) for a in arrays])
    outs = ferry.transfer_tensor_h2d(pinned)
    for o, a in zip(outs, arrays):
        np.testing.assert_array_equal(read_device(o, a.dtype, a.shape), a)


def test_h2d_passes_device_tensors_through():
    on_device = device(np.ones(3))
    host = np.arange(4.0)
    out = ferry.transfer_tensor_h2d([on_device, host])
    assert out[0] is on_device and on_device.exports == 0
    np.testing.assert_array_equal(read_device(out[1], host.dtype, host.shape), host)


def test_slab_tensor_refuses_other_devices_and_copies():
    out = ferry.transfer_tensor_h2d(np.arange(3))
    with pytest.raises(BufferError, match=r"\(1, 0\)"):
        out.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="copy"):
        out.__dlpack__(copy=True)
    assert "SlabTensor(shape=(3,)" in repr(out)


# ---- producers, streams, events -----------------------------------------------------------------------------------


def test_producers_are_released_after_the_copies():
    inputs = [device(random_array((4,), np.int32, i)) for i in range(5)]
    ferry.transfer_tensor_d2h(inputs)
    assert [(i.exports, i.released) for i in inputs] == [(1, 1)] * 5


def test_producers_are_asked_to_order_their_work_on_the_copy_stream():
    x = device(A := np.arange(3))
    ferry.transfer_tensor_d2h(x)
    assert isinstance(x.last_stream, int) and x.last_stream > 2  # a real stream handle, not a default stream


def test_explicit_stream_is_given_to_producers():
    x = device(np.arange(3))
    ferry.transfer_tensor_d2h(x, device=0, stream=0xABC00)
    assert x.last_stream == 0xABC00


def test_producer_event_means_no_producer_synchronisation():
    x = device(np.arange(3))
    out = ferry.transfer_tensor_d2h(x, producer_event=0x1234)
    assert x.last_stream == -1
    np.testing.assert_array_equal(out, np.arange(3))


def test_stream_objects_are_read_without_the_framework():
    class CudaStream:
        def __cuda_stream__(self):
            return (0, 0xBEEF00)

    for stream, seen in ((types.SimpleNamespace(cuda_stream=0xC0FFEE, device_index=0), 0xC0FFEE),
                         (types.SimpleNamespace(ptr=0xFACE00, device_id=0), 0xFACE00), (CudaStream(), 0xBEEF00),
                         (types.SimpleNamespace(cuda_stream=0, device_index=0), 1)):  # default stream: legacy
        x = device(np.arange(2))
        ferry.transfer_tensor_d2h(x, device="cuda:0", stream=stream)
        assert x.last_stream == seen


def test_stream_on_another_device_raises_value_error_naming_both():
    stream = types.SimpleNamespace(cuda_stream=0xC0FFEE, device_index=1, __repr__=None)
    with pytest.raises(ValueError, match="cuda:1.*cuda:0"):
        ferry.transfer_tensor_d2h(device(np.arange(2)), device=0, stream=stream)


@pytest.mark.parametrize("spelling", [1, "cuda:1", types.SimpleNamespace(type="cuda", index=1)])
def test_unavailable_device_index_raises_runtime_error_naming_it(spelling):
    with pytest.raises(RuntimeError, match="cuda:1.*1 CUDA device") as e:
        ferry.transfer_tensor_d2h([device(np.arange(2))], device=spelling)
    assert e.value.status == "DEVICE_UNAVAILABLE"


def test_local_rank_selects_the_default_device(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(RuntimeError, match="cuda:3 \\(LOCAL_RANK\\)"):
        ferry.transfer_tensor_d2h([device(np.arange(2))])
    monkeypatch.setenv("LOCAL_RANK", "0")
    np.testing.assert_array_equal(ferry.transfer_tensor_d2h(device(np.arange(2))), np.arange(2))
    monkeypatch.setenv("LOCAL_RANK", "zero")
    with pytest.raises(ValueError, match='LOCAL_RANK="zero"'):
        ferry.transfer_tensor_d2h([device(np.arange(2))])
    # An explicit device does not read LOCAL_RANK.
    np.testing.assert_array_equal(ferry.transfer_tensor_d2h(device(np.arange(2)), device=0), np.arange(2))


def test_cuda_without_index_is_the_default_device_when_torch_is_not_loaded():
    assert "torch" not in sys.modules
    np.testing.assert_array_equal(ferry.transfer_tensor_d2h(device(np.arange(2)), device="cuda"), np.arange(2))


# ---- slab lifetime and the pool ------------------------------------------------------------------------------------


def in_use():
    return ferry.pool.stats()["bytes_in_use"]


def test_outputs_share_one_slab_which_returns_to_the_pool_with_the_last_output():
    gc.collect()
    assert in_use() == 0
    a, b = ferry.transfer_tensor_d2h([device(np.arange(1000)), device(np.arange(2000.0))])
    held = in_use()
    assert held > 0
    assert abs(address(b) - address(a)) < held  # both views of one slab
    del a
    assert in_use() == held  # b still views it
    del b
    assert in_use() == 0


def test_one_array_in_two_places_through_dlpack_is_copied_once():
    a = np.arange(100, dtype=np.int64)
    d = device(a)
    out = ferry.transfer_tensor_d2h([d, {"again": d}, device(a), device(a[::2])])
    assert out[0] is out[1]["again"] is out[2] and out[3] is not out[0]
    assert out[0].tobytes() == a.tobytes() and out[3].tobytes() == a[::2].tobytes()


def test_dropped_outputs_let_the_pool_reuse_the_slab():
    first = ferry.transfer_tensor_d2h(device(np.arange(4096)))
    where = address(first)
    del first
    hits = ferry.pool.stats()["hits"]
    second = ferry.transfer_tensor_d2h(device(np.arange(4096)))
    assert address(second) == where
    assert ferry.pool.stats()["hits"] == hits + 1


def test_kept_outputs_are_never_reused():
    kept = [ferry.transfer_tensor_d2h(device(np.full(4096, i))) for i in range(8)]
    assert len({address(k) for k in kept}) == 8
    for i, k in enumerate(kept):
        np.testing.assert_array_equal(k, np.full(4096, i))


def test_slab_of_a_copy_still_running_is_not_reused():
    """While the (simulated) copies have not completed, a released slab stays parked, out of the free list."""
    _ferry._sim_hold(True)
    handle = ferry.transfer_tensor_d2h_async(device(np.arange(4096)))
    assert not handle.done()
    del handle  # waits for its copies (synchronising releases the hold)
    assert in_use() == 0


def test_exporters_keep_the_slab_alive():
    out = ferry.transfer_tensor_h2d(np.arange(100))  # a SlabTensor (device memory)
    counters = _ferry._sim_counters()
    capsule = out.__dlpack__(max_version=(1, 3))
    del out
    assert _ferry._sim_counters()["device_allocations"] == counters["device_allocations"]
    del capsule  # unconsumed capsule: its destructor releases the last reference
    assert _ferry._sim_counters()["device_allocations"] == counters["device_allocations"] - 1


def test_reserve_and_trim():
    gc.collect()
    ferry.pool.trim()
    assert ferry.pool.stats()["bytes_pinned"] == 0
    ferry.pool.reserve(40 << 20)
    stats = ferry.pool.stats()
    assert stats["bytes_pinned"] >= 40 << 20 and stats["regions"] == 1
    kept = ferry.transfer_tensor_d2h(device(np.arange(10)))
    ferry.pool.trim()
    assert ferry.pool.stats()["bytes_pinned"] >= 40 << 20  # in use: untouched
    del kept
    ferry.pool.trim()
    assert ferry.pool.stats()["bytes_pinned"] == 0


# ---- the async handle -----------------------------------------------------------------------------------------------


def test_async_handle_done_then_wait_returns_the_same_batch():
    _ferry._sim_hold(True)
    batch = {"a": device(np.arange(5)), "b": "s"}
    handle = ferry.transfer_tensor_d2h_async(batch)
    assert not handle.done() and repr(handle) == "<ferry.Transfer d2h submitted, 1 tensor(s)>"
    out = handle.wait()
    assert handle.done() and repr(handle) == "<ferry.Transfer d2h finished, 1 tensor(s)>"
    assert handle.wait() is out
    np.testing.assert_array_equal(out["a"], np.arange(5))
    assert out["b"] is batch["b"]


def test_async_handle_waited_from_several_threads():
    arrays = [np.arange(i, i + 64) for i in range(32)]
    _ferry._sim_hold(True)
    handle = ferry.transfer_tensor_d2h_async([device(a) for a in arrays])
    results = []
    threads = [threading.Thread(target=lambda: results.append(handle.wait())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(results[0], arrays))


def test_a_handle_in_a_reference_cycle_is_collected_and_returns_its_pinned_memory():
    """b.handle = transfer(b): the handle holds the batch, the batch holds the handle. The collector must see the
    handle's references to break the cycle, or the slab stays pinned for good."""
    gc.collect()

    @dataclasses.dataclass
    class Batch:
        x: object
        handle: object = None

    b = Batch(device(np.arange(1000)))
    _ferry._sim_hold(True)  # the copies still "run" when the cycle is dropped: clearing must wait for them
    b.handle = ferry.transfer_tensor_d2h_async([b])
    assert in_use() > 0
    del b
    gc.collect()
    assert in_use() == 0


def test_wait_called_again_while_the_same_thread_rebuilds_raises_instead_of_deadlocking():
    handle = None
    seen = []

    class Rebuilt(collections.abc.Mapping):  # its constructor runs during the rebuild, inside wait()
        def __init__(self, items=()):
            self._d = dict(items)
            if handle is not None and not seen:
                try:
                    handle.wait()
                except RuntimeError as e:
                    seen.append(str(e))

        def __getitem__(self, k):
            return self._d[k]

        def __iter__(self):
            return iter(self._d)

        def __len__(self):
            return len(self._d)

    handle = ferry.transfer_tensor_d2h_async(Rebuilt({"a": device(np.arange(5))}))
    out = handle.wait()
    assert seen and "called again while this thread is finishing" in seen[0]
    np.testing.assert_array_equal(out["a"], np.arange(5))
    assert handle.wait() is out
    del handle, out  # the class's closure and the handle form a cycle: collect it
    gc.collect()
    assert in_use() == 0


def test_a_wait_on_another_thread_sleeps_until_the_finishing_thread_is_done():
    started, release = threading.Event(), threading.Event()
    handle = None

    class Slow(collections.abc.Mapping):  # blocks the finishing thread inside the rebuild until told
        def __init__(self, items=()):
            self._d = dict(items)
            if handle is not None and not started.is_set():
                started.set()
                release.wait(10)

        def __getitem__(self, k):
            return self._d[k]

        def __iter__(self):
            return iter(self._d)

        def __len__(self):
            return len(self._d)

    handle = ferry.transfer_tensor_d2h_async(Slow({"a": device(np.arange(5))}))
    results = []
    finisher = threading.Thread(target=lambda: results.append(handle.wait()))
    finisher.start()
    assert started.wait(10)
    other = threading.Thread(target=lambda: results.append(handle.wait()))
    other.start()
    other.join(0.3)
    assert other.is_alive() and handle.done()  # waiting for the finisher, not deadlocked
    release.set()
    finisher.join(10)
    other.join(10)
    assert len(results) == 2 and results[0] is results[1]
    del handle, results
    gc.collect()
    assert in_use() == 0


def test_transfers_from_many_threads():
    errors = []

    def work(seed):
        try:
            for i in range(50):
                a = random_array((seed + 1, i + 1), np.float32, seed * 100 + i)
                out = ferry.transfer_tensor_d2h({"a": device(a)})
                assert out["a"].tobytes() == a.tobytes()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---- driver faults --------------------------------------------------------------------------------------------------

CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_LAUNCH_FAILED = 719


def test_a_failing_copy_raises_ferry_error_with_the_driver_details_and_leaks_nothing():
    gc.collect()
    counters = _ferry._sim_counters()
    x = device(np.arange(3 << 20, dtype=np.uint8))  # large: its own DMA
    _ferry._sim_fault("cuMemcpyAsync", 1, CUDA_ERROR_LAUNCH_FAILED)
    with pytest.raises(ferry.FerryError) as e:
        ferry.transfer_tensor_d2h([x])
    err = e.value
    assert err.status == "DRIVER_ERROR" and err.call == "cuMemcpyAsync"
    assert err.cu_result == CUDA_ERROR_LAUNCH_FAILED and "CUDA_ERROR_LAUNCH_FAILED" in str(err)
    assert ".c:" in err.where
    assert x.exports == x.released == 1
    assert in_use() == 0
    assert _ferry._sim_counters()["device_allocations"] == counters["device_allocations"]


def test_failing_to_pin_raises_memory_error():
    ferry.pool.trim()
    _ferry._sim_fault("cuMemHostRegister", 0, CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(MemoryError) as e:
        ferry.transfer_tensor_d2h(device(np.arange(10)))
    assert e.value.status == "OUT_OF_HOST_MEMORY" and e.value.call == "cuMemHostRegister"
    _ferry._sim_fault("", 0, 0)
    np.testing.assert_array_equal(ferry.transfer_tensor_d2h(device(np.arange(10))), np.arange(10))


def test_failing_device_allocation_in_h2d_raises_memory_error():
    _ferry._sim_fault("cuMemAllocFromPoolAsync", 0, CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(MemoryError) as e:
        ferry.transfer_tensor_h2d([np.arange(10)])
    assert e.value.status == "OUT_OF_DEVICE_MEMORY"


def test_a_failure_in_the_async_path_is_raised_by_wait_every_time():
    _ferry._sim_fault("cuMemcpyAsync", 0, CUDA_ERROR_LAUNCH_FAILED)
    with pytest.raises(ferry.FerryError):
        ferry.transfer_tensor_d2h_async(device(np.arange(3 << 20, dtype=np.uint8)))


def test_a_failed_wait_raised_again_does_not_grow_its_traceback():
    """Each later wait() raises the stored exception afresh: its traceback is not extended call after call."""
    _ferry._sim_hold(True)
    h = ferry.transfer_tensor_d2h_async(device(np.arange(3 << 20, dtype=np.uint8)))
    _ferry._sim_fault("cuEventQuery", 1, 700)
    assert h.done()
    lengths = []
    for _ in range(50):
        with pytest.raises(ferry.FerryError) as e:
            h.wait()
        tb, n = e.value.__traceback__, 0
        while tb:
            n, tb = n + 1, tb.tb_next
        lengths.append(n)
    assert len(set(lengths)) == 1, lengths
    assert "failed: FerryError" in repr(h)
    del h, e
    assert in_use() == 0


CUDA_ERROR_ILLEGAL_ADDRESS = 700


def test_a_copy_error_seen_by_done_is_raised_by_every_wait():
    """A poll that sees the copies fail must not let a later wait() hand the outputs back as valid."""
    _ferry._sim_hold(True)  # the copies stay in flight, so done() has to ask the driver
    h = ferry.transfer_tensor_d2h_async(device(np.arange(3 << 20, dtype=np.uint8)))
    _ferry._sim_fault("cuEventQuery", 1, CUDA_ERROR_ILLEGAL_ADDRESS)
    assert h.done()
    for _ in range(2):
        with pytest.raises(ferry.FerryError) as e:
            h.wait()
        assert e.value.call == "cuEventQuery" and e.value.cu_result == CUDA_ERROR_ILLEGAL_ADDRESS
    del h
    assert in_use() == 0


def test_done_stays_false_while_another_thread_is_in_wait_before_the_copies_end():
    """wait() marks the handle as being finished before it waits for the copies: a poll from another thread in that
    window must still ask the copies, or a producer recycling its buffers would overwrite them mid-copy. The window
    is made visible through sys.getswitchinterval, which wait() calls (GIL sharing) before it waits."""
    _ferry._sim_hold(True)  # the simulated copies stay pending until something waits for them
    h = ferry.transfer_tensor_d2h_async([device(np.arange(10))])
    assert not h.done()
    answers, ask, answered = {}, threading.Event(), threading.Event()

    def poller():
        ask.wait(10)
        answers["done"] = h.done()
        answered.set()

    t = threading.Thread(target=poller)
    t.start()
    real, armed = sys.getswitchinterval, [True]

    def pause():  # on the waiting thread, inside wait(), before the copies are waited for
        if armed[0]:
            armed[0] = False
            ask.set()
            answered.wait(10)
        return real()

    sys.getswitchinterval = pause
    try:
        out = h.wait()
    finally:
        sys.getswitchinterval = real
    t.join(10)
    assert answers == {"done": False}
    np.testing.assert_array_equal(out[0], np.arange(10))
    assert h.done()


def test_a_wait_interrupted_by_a_signal_handler_can_be_retried():
    """Ctrl-C (a signal handler's exception) at a release point of wait() is not the copies' error: the transfer
    stays whole, and the next wait() returns the batch."""
    import signal

    data = [np.arange(i % 13 + 1, dtype=np.int32) for i in range(100_000)]
    batch = [device(a) for a in data]
    armed = [False]

    def interrupt(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    inside = 0
    try:
        for attempt in range(40):
            h = ferry.transfer_tensor_d2h_async(batch)
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, 0.0005 * (attempt % 20 + 1), 0.0005)
                h.wait()
            except KeyboardInterrupt:
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                armed[0] = False
            assert "failed" not in repr(h)  # an interrupt is not the transfer's outcome
            if "submitted" in repr(h):  # interrupted inside wait(): the job was kept for the next one
                inside += 1
                out = h.wait()
                assert len(out) == len(data)
                assert all(np.array_equal(a, o) for a, o in zip(data, out))
                assert "finished" in repr(h)
                del out
            del h
            if inside >= 2:
                break
    finally:
        signal.signal(signal.SIGALRM, previous)
    if not inside:
        pytest.skip("no signal landed inside wait() in 40 tries")
    gc.collect()
    assert in_use() == 0


# ---- leaks ----------------------------------------------------------------------------------------------------------


def test_no_leaks_over_100000_calls():
    arrays = [np.arange(16, dtype=np.float32), np.arange(6, dtype=np.int8).reshape(2, 3)]
    inputs = [device(a) for a in arrays]
    batch = {"t": inputs, "meta": ("id", 7)}
    for _ in range(500):
        ferry.transfer_tensor_d2h(batch)
    gc.collect()
    refs = [sys.getrefcount(o) for o in (batch, *inputs, *arrays)]
    counters = _ferry._sim_counters()
    objects = len(gc.get_objects())
    tracemalloc.start()
    start, _ = tracemalloc.get_traced_memory()
    for i in range(50_000):
        out = ferry.transfer_tensor_d2h(batch)
        back = ferry.transfer_tensor_h2d_async(out["t"]).wait()
    del out, back
    gc.collect()
    end, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [sys.getrefcount(o) for o in (batch, *inputs, *arrays)] == refs
    assert len(gc.get_objects()) - objects < 100
    assert end - start < 256 * 1024, f"traced memory grew by {end - start} bytes"
    now = _ferry._sim_counters()
    assert now["device_allocations"] == counters["device_allocations"]
    # ferry keeps a small free list of events: a few more may be alive, never one per call.
    assert now["events"] <= counters["events"] + 8 and now["streams"] == counters["streams"]
    assert in_use() == 0
    assert all(i.exports == i.released for i in inputs)


def test_failed_calls_leak_nothing():
    x = device(np.arange(3 << 20, dtype=np.uint8))
    before = sys.getrefcount(x)
    for _ in range(200):
        _ferry._sim_fault("cuMemcpyAsync", 1, CUDA_ERROR_LAUNCH_FAILED)
        with pytest.raises(ferry.FerryError):
            ferry.transfer_tensor_d2h({"x": x})
    assert sys.getrefcount(x) == before
    assert x.exports == x.released == 200
    assert in_use() == 0


# ---- memory used by streams after it is dropped -------------------------------------------------------------------


def test_a_recorded_stream_keeps_the_memory_out_of_the_pool_until_its_work_is_done():
    """A D2H output handed to work on a stream (a non-blocking copy back to the GPU), then dropped: the pool must
    not hand the memory out before that stream's work, queued before the drop, has run."""
    out = ferry.transfer_tensor_d2h(device(np.arange(1000)))
    ferry.record_stream(out, 0x5150)  # a stream handle of cuda:0 in the simulation
    _ferry._sim_hold(True)  # the stream's work is still running
    del out
    assert in_use() > 0
    _ferry._sim_hold(False)  # ... and now it is done
    assert in_use() == 0


def test_dropping_a_torch_output_waits_for_the_current_stream():
    out = ferry.transfer_tensor_d2h([_ferry._SimExchangeTensor(np.arange(1000))])
    _ferry._sim_hold(True)
    del out  # the releasing thread's current stream (torch's) is recorded by default
    assert in_use() > 0
    _ferry._sim_hold(False)
    assert in_use() == 0


def test_record_stream_on_an_empty_output_is_a_no_op():
    empty, full = ferry.transfer_tensor_d2h([device(np.zeros((0, 3), np.float32)), device(np.arange(5))])
    ferry.record_stream(full, 0x5150)
    assert ferry.record_stream(empty, 0x5150) is None


def test_a_stream_whose_device_index_is_past_32_bits_is_refused():
    class Stream:
        cuda_stream = 0x5150
        device_index = 2**32  # would wrap onto cuda:0

    with pytest.raises(ValueError, match="past any device"):
        ferry.transfer_tensor_d2h(device(np.arange(4)), device=0, stream=Stream())


def test_an_error_about_one_tensor_names_its_index_in_the_batch():
    """Past the first part (64 tensors) and past 1024, the index is the batch's, not the part's."""
    nine_d = np.zeros((2,) * 9, np.float32).transpose(tuple(range(8, -1, -1)))  # 9 non-mergeable dimensions
    for before in (100, 1500):
        with pytest.raises(ferry.FerryError, match=f"tensor {before}: .*9 non-mergeable"):
            ferry.transfer_tensor_d2h([device(np.arange(4)) for _ in range(before)] + [device(nine_d)])
    assert in_use() == 0


def test_record_stream_refuses_what_is_not_a_ferry_output():
    with pytest.raises(ValueError, match="not an output of a ferry transfer"):
        ferry.record_stream(device(np.arange(4)), 0x5150)
    with pytest.raises(TypeError, match="expected an output tensor"):
        ferry.record_stream([1, 2], 0x5150)
    out = ferry.transfer_tensor_d2h(device(np.arange(4)))
    with pytest.raises(ValueError, match="context"):
        ferry.record_stream(out, _ferry._sim_foreign_stream())
