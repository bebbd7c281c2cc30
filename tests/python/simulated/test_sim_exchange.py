"""The DLPack exchange-API path (torch's) through the simulated driver, with _SimExchangeTensor playing torch:
exact bytes both ways, outputs built through managed_tensor_to_py_object_no_sync, no leaks; the GIL hand-off
window of the synchronous transfers, and the private phase stamps the benchmarks read."""

import gc
import sys
import threading
import time
import tracemalloc

import ferry
import numpy as np
import pytest
from ferry import _ferry

X = _ferry._SimExchangeTensor


def random_array(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def phases_us():
    """The last job's phase stamps of this thread, in microseconds from its start (None when not reached)."""
    ph = _ferry._last_phases()
    return {k: None if v is None else (v - ph["start"]) / 1e3 for k, v in ph.items()}


@pytest.fixture
def timing():
    old = _ferry._phase_timing(True)
    yield
    _ferry._phase_timing(old)


@pytest.fixture
def other_thread():
    """Another Python thread, idle: the window is for handing the GIL to someone, so it needs one to exist."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    yield t
    stop.set()
    t.join()


@pytest.fixture
def window():
    """Sets the hand-off window for one test, restoring ferry's default after it."""
    default = _ferry._gil_handoff_us()
    yield lambda us: _ferry._gil_handoff_us(us)
    _ferry._gil_handoff_us(default)


# ---- the exchange path ----------------------------------------------------------------------------------------------


def test_d2h_through_the_exchange_api_is_byte_exact_for_layouts_and_dtypes():
    base = random_array((16, 24), np.float32, 1)
    arrays = [base, base.T, base[::2, 1::3], random_array((7,), np.float16, 2), random_array((3, 5), np.int64, 3),
              np.zeros((0, 4), np.float32), np.array(2.5)]
    out = ferry.transfer_tensor_d2h({"t": [X(a) for a in arrays], "other": "kept"})
    assert out["other"] == "kept"
    for got, want in zip(out["t"], arrays):
        assert type(got) is X and got.device == (1, 0) and got.shape == want.shape
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_many_tensors_of_mixed_ranks_and_strides_in_one_batch_are_byte_exact():
    """500 tensors of rank 0 to 5, compact, transposed and reversed, in one batch: the tape's arrays grow many times
    over during the walk, and every output keeps its own shape."""
    rng = np.random.default_rng(7)
    arrays = []
    for i in range(500):
        rank = i % 6
        a = random_array(tuple(int(d) for d in rng.integers(1, 4, size=rank)), np.int16, i)
        if a.ndim >= 2 and i % 3 == 0:
            a = a.swapaxes(0, a.ndim - 1)  # strided
        elif a.ndim >= 1 and i % 3 == 1:
            a = a[::-1]  # negative stride
        arrays.append(a)
    out = ferry.transfer_tensor_d2h([X(a) for a in arrays])
    for got, want in zip(out, arrays, strict=True):
        assert got.shape == want.shape
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_h2d_through_the_exchange_api_is_byte_exact_and_device_tensors_pass_through():
    on_device = X(np.arange(4), device=0)
    hosts = [random_array((9, 3), np.float64, 4), random_array((5,), np.uint8, 5).reshape(5)]
    out = ferry.transfer_tensor_h2d([on_device] + [X(h, device=-1) for h in hosts])
    assert out[0] is on_device
    for got, want in zip(out[1:], hosts):
        assert got.device == (2, 0) and got.tobytes() == want.tobytes()


def test_exchange_outputs_hold_the_slab_until_the_last_one_dies():
    out = ferry.transfer_tensor_d2h([X(np.arange(100)), X(np.arange(50))])
    assert ferry.pool.stats()["bytes_in_use"] > 0
    del out[0]
    assert ferry.pool.stats()["bytes_in_use"] > 0
    del out
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_exchange_path_leaks_nothing_over_20000_calls(other_thread):
    arrays = [np.arange(16, dtype=np.float32), np.arange(6, dtype=np.int8).reshape(2, 3)]
    batch = [X(a) for a in arrays] * 20  # 40 outputs, another thread: the window is in play (copies done at once)
    for _ in range(200):
        ferry.transfer_tensor_d2h(batch)
    gc.collect()
    refs = [sys.getrefcount(o) for o in (*batch[:2], *arrays)]
    objects = len(gc.get_objects())
    tracemalloc.start()
    start, _ = tracemalloc.get_traced_memory()
    for _ in range(20_000):
        out = ferry.transfer_tensor_d2h(batch)
    del out
    gc.collect()
    end, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [sys.getrefcount(o) for o in (*batch[:2], *arrays)] == refs
    assert len(gc.get_objects()) - objects < 100
    assert end - start < 256 * 1024, f"traced memory grew by {end - start} bytes"
    assert ferry.pool.stats()["bytes_in_use"] == 0


# ---- phase stamps ------------------------------------------------------------------------------------------------


def test_phase_stamps_are_off_by_default_and_ordered_when_on(timing):
    seen = {}

    def fresh_thread():  # the stamps are per thread: a new thread has none, and timing off records none
        old = _ferry._phase_timing(False)
        ferry.transfer_tensor_d2h(X(np.arange(3)))
        seen["off"] = _ferry._last_phases()
        _ferry._phase_timing(old)

    t = threading.Thread(target=fresh_thread)
    t.start()
    t.join()
    assert set(seen["off"]) == {"start", "walked", "submitted", "handed", "built", "waited", "finished"}
    assert all(v is None for v in seen["off"].values())
    before = time.perf_counter_ns()
    ferry.transfer_tensor_d2h([X(np.arange(3))])
    after = time.perf_counter_ns()
    ph = _ferry._last_phases()
    order = [ph[k] for k in ("start", "walked", "submitted", "handed", "built", "waited", "finished")]
    assert before <= order[0] and order == sorted(order) and order[-1] <= after  # the clock of perf_counter_ns


# ---- the GIL hand-off window ---------------------------------------------------------------------------------------


def test_sync_transfer_of_many_torch_outputs_opens_the_window_while_copies_run(timing, window, other_thread):
    window(20_000)
    _ferry._sim_hold(True)  # the copies stay "in flight" until ferry waits for them
    ferry.transfer_tensor_d2h([X(np.full(10, i, np.uint8)) for i in range(64)])
    ph = phases_us()
    assert ph["handed"] - ph["submitted"] >= 19_900, ph


def test_no_window_when_no_other_python_thread_exists(timing, window):
    assert threading.active_count() == 1, f"this test needs to be alone: {threading.enumerate()}"
    window(20_000)
    _ferry._sim_hold(True)
    ferry.transfer_tensor_d2h([X(np.full(10, i, np.uint8)) for i in range(64)])
    ph = phases_us()
    assert ph["handed"] - ph["submitted"] < 10_000, ph


def test_no_window_for_few_outputs_for_the_async_form_or_when_turned_off(timing, window, other_thread):
    window(20_000)
    _ferry._sim_hold(True)
    ferry.transfer_tensor_d2h([X(np.full(10, i, np.uint8)) for i in range(31)])  # under the threshold
    ph = phases_us()
    assert ph["handed"] - ph["submitted"] < 10_000, ph
    _ferry._sim_hold(True)
    many = [X(np.full(10, i, np.uint8)) for i in range(64)]
    ferry.transfer_tensor_d2h_async(many).wait()  # the async caller wants control back at once
    ph = phases_us()
    assert ph["handed"] - ph["submitted"] < 10_000, ph
    window(0)
    _ferry._sim_hold(True)
    ferry.transfer_tensor_d2h(many)
    ph = phases_us()
    assert ph["handed"] - ph["submitted"] < 10_000, ph


@pytest.fixture
def slow_submit():
    """Makes the simulated submission slow for one test (every event record sleeps), restoring it after."""
    yield lambda us: _ferry._sim_submit_delay_us(us)
    _ferry._sim_submit_delay_us(0)


def test_no_second_window_when_the_submission_released_the_gil_for_a_whole_one(timing, window, other_thread,
                                                                                 slow_submit):
    """Thousands of tensors take ~0.3 ms to submit, with the GIL released: a waiter had its window already, and
    another would only delay the build (see python/src/transfer.c)."""
    many = [X(np.full(10, i, np.uint8)) for i in range(64)]
    window(20_000)
    slow_submit(25_000)  # the submission alone outlasts the window
    _ferry._sim_hold(True)
    ferry.transfer_tensor_d2h(many)
    ph = phases_us()
    assert ph["submitted"] - ph["walked"] >= 24_000, ph
    assert ph["handed"] - ph["submitted"] < 10_000, ph
    slow_submit(1_000)  # a submission shorter than the window still gets one
    _ferry._sim_hold(True)
    ferry.transfer_tensor_d2h(many)
    ph = phases_us()
    assert ph["submitted"] - ph["walked"] < 20_000, ph
    assert ph["handed"] - ph["submitted"] >= 19_900, ph


def test_submit_delay_hook_is_validated(slow_submit):
    with pytest.raises(ValueError, match="-5"):
        _ferry._sim_submit_delay_us(-5)
    assert slow_submit(7) == 0 and slow_submit(0) == 7


def test_window_ends_as_soon_as_the_copies_are_done(timing, window, other_thread):
    window(200_000)  # 0.2 s unless cut short
    ferry.transfer_tensor_d2h([X(np.full(10, i, np.uint8)) for i in range(64)])  # copies complete at once here
    ph = phases_us()
    assert ph["handed"] - ph["submitted"] < 50_000, ph


def test_another_thread_runs_python_during_the_window(timing, window):
    """What the window is for: a thread waiting for the GIL gets it while the copies run, before the outputs are
    built (brief releases would not let it in; see python/src/transfer.c)."""
    window(20_000)  # generous, so that the test does not depend on this machine's thread wake-up latency
    stamps, stop = [], threading.Event()

    def other():
        while not stop.is_set():
            stamps.append(time.perf_counter_ns())

    batch = [X(np.full(10, i, np.uint8)) for i in range(64)]
    t = threading.Thread(target=other)
    t.start()
    try:
        _ferry._sim_hold(True)
        ferry.transfer_tensor_d2h(batch)
        ph = _ferry._last_phases()
    finally:
        stop.set()
        t.join()
    inside = [s for s in stamps if ph["submitted"] <= s <= ph["handed"]]
    assert inside, "the other thread never ran during the hand-off window"


def test_handoff_setting_is_validated(window):
    with pytest.raises(ValueError, match="-1"):
        _ferry._gil_handoff_us(-1)
    with pytest.raises(TypeError):
        _ferry._gil_handoff_us(1, 2)
    old = _ferry._gil_handoff_us(50)
    assert _ferry._gil_handoff_us() == 50 and isinstance(old, int)
