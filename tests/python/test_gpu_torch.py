"""GPU tests with torch (run on the H200; skipped without torch or CUDA).

Byte-exact D2H and H2D for many dtypes and layouts, pinned outputs, pass-through identity, slab lifetime, producer
ordering (with controls that must read stale data, so the ordering tests can fail), streams and events, the async
handle, and a foreground thread launching compute while a background thread transfers.
"""

import gc
import threading
import time

import ferry
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or ferry.device_count() == 0:
    pytest.skip("needs a CUDA device and torch with CUDA", allow_module_level=True)

DEV = torch.device("cuda", 0)
SLEEP_CYCLES = 200_000_000  # ~0.1 s of torch.cuda._sleep on an H200: far longer than any copy here

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.complex64, torch.bool]


def random_tensor(shape, dtype, seed=0, device=DEV):
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    if dtype is torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape).to(device)


def as_bytes(t):
    """The bytes of `t` in row-major order, as a 1-D uint8 CPU tensor (0-dim and zero-size tensors included)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def same_bytes(a, b):
    """Exact comparison. Random bits reinterpreted as floats contain NaNs, which torch.equal and == treat as
    different from themselves: compare the bytes, never the values."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(as_bytes(a), as_bytes(b))


def test_byte_comparison_treats_nan_bits_as_equal_and_catches_one_flipped_byte():
    """The control for same_bytes: random float bits contain NaNs (torch.equal is False on them), and a single
    wrong byte must still be caught."""
    x = random_tensor((4096,), torch.float32, 11)
    assert bool(torch.isnan(x).any())
    out = ferry.transfer_tensor_d2h(x)
    assert not torch.equal(out, x.cpu())  # NaN != NaN: why these tests compare bytes
    assert same_bytes(out, x)
    control = out.clone()
    control.view(torch.uint8)[12345] ^= 1
    assert not same_bytes(control, x)


def in_use():
    gc.collect()
    return ferry.pool.stats()["bytes_in_use"]


def test_torch_exposes_the_dlpack_exchange_api():
    capsule = type(torch.empty(1)).__dlpack_c_exchange_api__
    assert "dlpack_exchange_api" in repr(capsule)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_d2h_is_byte_exact_and_pinned(dtype):
    tensors = [random_tensor(s, dtype, i) for i, s in enumerate([(1,), (7, 3), (2, 3, 5), (1 << 20,)])]
    out = ferry.transfer_tensor_d2h(tensors, device="cuda:0")
    for got, want in zip(out, tensors):
        assert type(got) is torch.Tensor and got.device.type == "cpu"
        assert got.is_pinned()
        assert same_bytes(got, want)


def test_d2h_strided_zero_size_and_zero_dim():
    base = random_tensor((64, 48), torch.float32, 1)
    inputs = [base.t(), base[::3, 1::2], base[:, 7], base.t()[5:9], torch.empty(0, 4, device=DEV),
              torch.tensor(3.25, device=DEV), torch.empty(3, 0, device=DEV, dtype=torch.int64)]
    out = ferry.transfer_tensor_d2h(inputs)
    for got, want in zip(out, inputs):
        assert got.is_contiguous() and got.shape == want.shape and got.dtype == want.dtype
        assert same_bytes(got, want)


def test_d2h_many_small_tensors_exact():
    tensors = [random_tensor((i % 61 + 1,), torch.uint8, i) for i in range(4096)]
    out = ferry.transfer_tensor_d2h(tensors)
    assert all(same_bytes(g, w) for g, w in zip(out, tensors))


def test_host_and_other_values_pass_through_as_the_same_objects():
    host = torch.arange(5)
    batch = {"gpu": random_tensor((8,), torch.float32), "host": host, "n": 3, "s": "x", "none": None,
             "meta": {"k": [host]}}
    out = ferry.transfer_tensor_d2h(batch)
    assert out["host"] is host and out["meta"] is batch["meta"] and out["s"] is batch["s"]
    assert out["gpu"].device.type == "cpu"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device_pass_through():
    other = torch.ones(3, device="cuda:1")
    out = ferry.transfer_tensor_d2h([other, torch.ones(2, device=DEV)], device=0)
    assert out[0] is other and out[1].device.type == "cpu"


def test_requires_grad_and_parameters_are_copied_detached():
    p = torch.nn.Parameter(torch.randn(4, 4, device=DEV))
    out = ferry.transfer_tensor_d2h([p, p * 2])
    assert not out[0].requires_grad and torch.equal(out[0], p.detach().cpu())
    assert torch.equal(out[1], (p * 2).detach().cpu())


def test_a_weight_tied_under_two_names_is_copied_once_and_comes_back_as_one_tensor():
    embed = torch.nn.Embedding(4096, 1024).to(DEV)
    head = torch.nn.Linear(1024, 4096, bias=False).to(DEV)
    head.weight = embed.weight
    state = torch.nn.ModuleDict({"embed": embed, "head": head}).state_dict()
    assert state["embed.weight"] is not state["head.weight"]   # state_dict() gives each name its own tensor
    gc.collect()
    before = ferry.pool.stats()["bytes_in_use"]
    out = ferry.transfer_tensor_d2h(state)
    assert out["embed.weight"] is out["head.weight"] and torch.equal(out["head.weight"], embed.weight.detach().cpu())
    assert ferry.pool.stats()["bytes_in_use"] - before < 2 * embed.weight.nbytes


def test_conjugate_and_negative_views_keep_their_values_and_bits_both_ways():
    """torch's DLPack export describes a lazily conjugated or negated view as its memory, whose values differ from
    the view's: the copies hold the memory, and the outputs get the bits back, on the host and on the device."""
    z = torch.randn(4, 6, dtype=torch.complex64, device=DEV)
    x = torch.randn(4, 6, device=DEV)
    inputs = [z.conj(), z.conj().t(), z.conj().imag, x._neg_view(), x._neg_view()[1:, ::2], z, x]
    assert all(v.is_conj() or v.is_neg() for v in inputs[:5])

    def check(outputs, device):
        for got, want in zip(outputs, inputs, strict=True):
            assert got.device.type == device and got.shape == want.shape and got.dtype == want.dtype
            assert got.is_conj() == want.is_conj() and got.is_neg() == want.is_neg()
            assert torch.equal(got.resolve_conj().resolve_neg().cpu(), want.resolve_conj().resolve_neg().cpu())

    host = ferry.transfer_tensor_d2h(inputs)
    check(host, "cpu")
    check(ferry.transfer_tensor_h2d(host, device=DEV), "cuda")


@pytest.mark.parametrize("pinned", [False, True])
def test_h2d_is_byte_exact(pinned):
    host = [random_tensor(s, d, i, device="cpu") for i, (s, d) in
            enumerate([((5, 7), torch.float32), ((1 << 20,), torch.uint8), ((3,), torch.bfloat16),
                       ((0, 2), torch.int32), ((4, 6), torch.float64)])]
    if pinned:
        host = [h.pin_memory() for h in host]
    strided = host[0].t()
    out = ferry.transfer_tensor_h2d(host + [strided], device=DEV)
    for got, want in zip(out, host + [strided]):
        assert got.device == DEV and got.shape == want.shape and got.dtype == want.dtype
        assert same_bytes(got, want)


def test_h2d_passes_device_tensors_through():
    g = torch.ones(2, device=DEV)
    out = ferry.transfer_tensor_h2d([g, torch.zeros(3)])
    assert out[0] is g and out[1].device == DEV


def test_round_trip_d2h_then_h2d():
    x = {"a": random_tensor((123, 45), torch.float16, 3), "b": [random_tensor((9,), torch.int64, 4)]}
    back = ferry.transfer_tensor_h2d(ferry.transfer_tensor_d2h(x))
    assert back["a"].device == DEV and same_bytes(back["a"], x["a"]) and same_bytes(back["b"][0], x["b"][0])


# ---- slab lifetime -----------------------------------------------------------------------------------------------


def test_slab_returns_to_the_pool_with_the_last_output_and_is_reused():
    assert in_use() == 0
    a, b = ferry.transfer_tensor_d2h([random_tensor((1 << 20,), torch.uint8), random_tensor((100,), torch.float32)])
    held = in_use()
    assert held > 0
    del a
    assert in_use() == held
    where = b.data_ptr()
    del b
    assert in_use() == 0
    hits = ferry.pool.stats()["hits"]
    c, _ = ferry.transfer_tensor_d2h([random_tensor((1 << 20,), torch.uint8), random_tensor((100,), torch.float32)])
    assert ferry.pool.stats()["hits"] == hits + 1
    assert abs(c.data_ptr() - where) < held  # the same slab again


def test_kept_outputs_are_never_overwritten():
    kept = [ferry.transfer_tensor_d2h(torch.full((1 << 16,), i, dtype=torch.int32, device=DEV)) for i in range(16)]
    assert len({k.data_ptr() for k in kept}) == 16
    for i, k in enumerate(kept):
        assert torch.equal(k, torch.full((1 << 16,), i, dtype=torch.int32))


# ---- ordering ------------------------------------------------------------------------------------------------------


def slow_fill(x, value, stream=None):
    """Writes `value` into x on `stream` (current if None) after ~0.1 s of GPU sleep."""
    with torch.cuda.stream(stream or torch.cuda.current_stream()):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(value)


def test_copies_wait_for_the_current_stream():
    x = torch.zeros(1 << 20, dtype=torch.int32, device=DEV)
    torch.cuda.synchronize()
    slow_fill(x, 7)
    out = ferry.transfer_tensor_d2h(x)
    assert bool((out == 7).all())


def test_copies_wait_for_producer_event_and_a_stale_event_reads_stale_data():
    x = torch.zeros(1 << 20, dtype=torch.int32, device=DEV)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    before = torch.cuda.Event()
    before.record(side)  # control: readiness marked before the write
    slow_fill(x, 3, side)
    stale = ferry.transfer_tensor_d2h(x, producer_event=before)
    assert bool((stale == 0).all()), "control: the copy did not run ahead of the producer"
    after = torch.cuda.Event()
    after.record(side)
    out = ferry.transfer_tensor_d2h(x, producer_event=after)
    assert bool((out == 3).all())
    torch.cuda.synchronize()


def test_current_stream_of_the_calling_thread_is_what_orders():
    """Work on a non-current stream is not waited for (SPDL's contract): pass producer_event for it."""
    x = torch.zeros(1 << 20, dtype=torch.int32, device=DEV)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    slow_fill(x, 5, side)
    stale = ferry.transfer_tensor_d2h(x)
    assert bool((stale == 0).all()), "control: a non-current stream was waited for"
    torch.cuda.current_stream().wait_stream(side)
    assert bool((ferry.transfer_tensor_d2h(x) == 5).all())


def test_explicit_streams():
    x = random_tensor((1000,), torch.float32, 8)
    for stream in (torch.cuda.Stream(), torch.cuda.current_stream(), torch.cuda.default_stream(),
                   torch.cuda.Stream().cuda_stream):
        assert same_bytes(ferry.transfer_tensor_d2h(x, device=DEV, stream=stream), x)
    with pytest.raises(ValueError, match="without device"):
        ferry.transfer_tensor_d2h(x, stream=torch.cuda.Stream())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_stream_on_another_device_raises_value_error():
    with pytest.raises(ValueError, match="cuda:1"):
        ferry.transfer_tensor_d2h(torch.ones(2, device=DEV), device=0, stream=torch.cuda.Stream(device=1))


def test_unavailable_device_raises_runtime_error():
    n = torch.cuda.device_count()
    with pytest.raises(RuntimeError, match=f"cuda:{n}"):
        ferry.transfer_tensor_d2h(torch.ones(2, device=DEV), device=n)


def test_cuda_without_index_means_torchs_current_device():
    x = random_tensor((10,), torch.int16, 9)
    assert same_bytes(ferry.transfer_tensor_d2h(x, device="cuda"), x)
    assert same_bytes(ferry.transfer_tensor_d2h(x, device=torch.device("cuda")), x)


# ---- async handle and threads --------------------------------------------------------------------------------------


def test_async_handle_is_not_done_while_the_producer_runs():
    x = torch.zeros(1 << 20, dtype=torch.int32, device=DEV)
    torch.cuda.synchronize()
    slow_fill(x, 9)
    handle = ferry.transfer_tensor_d2h_async({"x": x})
    assert not handle.done()
    out = handle.wait()
    assert handle.done() and handle.wait() is out
    assert bool((out["x"] == 9).all())


def test_foreground_compute_proceeds_during_a_background_transfer():
    """The background thread spends its time in ferry with the GIL released; the foreground keeps launching."""
    batch = [random_tensor((64 << 20,), torch.uint8, i) for i in range(4)]  # 256 MiB: ~5 ms per transfer
    a = torch.randn(256, 256, device=DEV)
    window = {}

    def background():
        window["start"] = time.perf_counter()
        for _ in range(20):
            ferry.transfer_tensor_d2h(batch)
        window["end"] = time.perf_counter()

    ferry.transfer_tensor_d2h(batch)  # warm: pool pinned
    # Warm the foreground too: the first torch.mm creates the cuBLAS handle and loads modules (often > 100 ms,
    # with the GIL released), which would otherwise outlast the whole background window.
    torch.mm(a, a)
    torch.cuda.synchronize()
    stamps = []
    worker = threading.Thread(target=background)
    worker.start()
    while worker.is_alive():
        torch.mm(a, a)
        stamps.append(time.perf_counter())
    worker.join()
    inside = [s for s in stamps if window["start"] <= s <= window["end"]]
    duration = window["end"] - window["start"]
    assert duration > 0.02
    # Launching a 256^3 mm costs ~10 us; a thread starved by a held GIL would manage a handful in the window.
    assert len(inside) > 200, f"only {len(inside)} foreground launches in {duration * 1e3:.1f} ms"
    torch.cuda.synchronize()


def test_transfers_from_many_threads_are_exact():
    errors = []

    def work(seed):
        try:
            for i in range(30):
                t = random_tensor((seed + 1, i + 17), torch.float32, seed * 1000 + i)
                out = ferry.transfer_tensor_d2h({"t": t}, producer_event=None)
                assert same_bytes(out["t"], t)
        except Exception as e:  # collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


# ---- many and tiny, parts ------------------------------------------------------------------------------------------


def fast_random_tensors(sizes, seed):
    """Tensors of the given byte sizes, random, made on the GPU in one go (16384 host-made tensors take seconds)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    flat = torch.randint(0, 256, (sum(sizes),), dtype=torch.uint8, device=DEV, generator=g)
    return [t.clone() for t in flat.split(sizes)]


def test_d2h_16384_tensors_of_4_kib_are_exact():
    tensors = fast_random_tensors([4096] * 16384, 21)
    out = ferry.transfer_tensor_d2h(tensors)
    assert all(o.is_pinned() for o in out[:3])
    assert torch.equal(torch.cat(out), torch.cat(tensors).cpu())


def test_d2h_one_large_tensor_among_thousands_of_small_ones_is_exact():
    sizes = [3000 + (i % 97) for i in range(4000)]
    tensors = fast_random_tensors(sizes, 22)
    tensors.insert(1717, random_tensor((32 << 20,), torch.uint8, 23))
    out = ferry.transfer_tensor_d2h({"batch": tensors})["batch"]
    assert torch.equal(out[1717], tensors[1717].cpu())
    assert torch.equal(torch.cat(out[:1717] + out[1718:]), torch.cat(tensors[:1717] + tensors[1718:]).cpu())


@pytest.fixture
def tiny_parts():
    """Release points every few tensors (test-hook builds): a batch goes to ferry in many small parts."""
    from ferry import _ferry

    if not hasattr(_ferry, "_gil_pacing"):
        pytest.skip("needs the test hooks (the project's own build)")
    old = _ferry._gil_pacing(1, None)
    yield
    _ferry._gil_pacing(*old)


def test_a_batch_in_many_parts_is_exact_and_waits_for_the_producer(tiny_parts):
    x = torch.zeros(1 << 20, dtype=torch.int32, device=DEV)
    tensors = fast_random_tensors([1000 + i for i in range(2000)], 24)
    torch.cuda.synchronize()
    slow_fill(x, 11)  # the current stream: every part must wait for it, the first as the last
    out = ferry.transfer_tensor_d2h(tensors + [x])
    assert bool((out[-1] == 11).all())
    assert torch.equal(torch.cat(out[:-1]), torch.cat(tensors).cpu())


def test_a_torch_tensor_after_a_first_part_of_other_producers_is_still_ordered(tiny_parts):
    """The first parts hold only CuPy arrays (ordered through their own __dlpack__); the torch tensor that comes
    later must still wait for torch's current stream."""
    cupy = pytest.importorskip("cupy")
    others = [cupy.arange(100 + i, dtype=cupy.int32) for i in range(64)]
    x = torch.zeros(1 << 20, dtype=torch.int32, device=DEV)
    torch.cuda.synchronize()
    slow_fill(x, 13)
    out = ferry.transfer_tensor_d2h(others + [x])
    assert bool((out[-1] == 13).all())
    for got, want in zip(out[:-1], others):
        assert (got == cupy.asnumpy(want)).all()


# ---- memory used by other streams after an output is dropped -------------------------------------------------------


def test_a_dropped_d2h_output_read_later_on_a_side_stream_waits_for_record_stream():
    """An output copied back to the GPU on a side stream (queued behind a long kernel), then dropped: without
    record_stream the next transfer reuses the memory and the late copy reads its bytes (the control); with it,
    the memory is kept until the side stream's work is done."""
    x = random_tensor((1 << 24,), torch.uint8, 31)
    y = random_tensor((1 << 24,), torch.uint8, 32)
    side = torch.cuda.Stream()
    for protect in (False, True):
        ferry.pool.trim()
        out = ferry.transfer_tensor_d2h(x)
        where = out.data_ptr()
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            late = out.to(DEV, non_blocking=True)
        if protect:
            ferry.record_stream(out, side)
        del out  # the main thread's current stream is not `side`: only record_stream covers it
        again = ferry.transfer_tensor_d2h(y)
        side.synchronize()
        if protect:
            assert torch.equal(late, x), "the memory was reused under the side stream's copy"
        else:
            assert again.data_ptr() == where, "control: the pool did not reuse the slab, so nothing was tested"
            assert not torch.equal(late, x), "control: the late copy was not overwritten"
        del again, late
    torch.cuda.synchronize()


def test_a_dropped_h2d_output_read_by_a_side_stream_kernel_waits_for_record_stream():
    src = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    other = torch.full((1 << 20,), -1.0).pin_memory()
    side = torch.cuda.Stream()
    out = ferry.transfer_tensor_h2d(src)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        doubled = out * 2
    ferry.record_stream(out, side)
    del out
    for _ in range(4):  # transfers that would reuse the device memory at once if it were free
        ferry.transfer_tensor_h2d(other)
    side.synchronize()
    assert torch.equal(doubled.cpu(), src * 2)


def test_dropping_a_torch_output_waits_for_the_dropping_threads_current_stream():
    """The default: a non-blocking copy on the current stream, then the output dropped, is safe without
    record_stream."""
    x = random_tensor((1 << 24,), torch.uint8, 33)
    y = random_tensor((1 << 24,), torch.uint8, 34)
    out = ferry.transfer_tensor_d2h(x)
    torch.cuda._sleep(SLEEP_CYCLES)
    late = out.to(DEV, non_blocking=True)
    del out
    again = ferry.transfer_tensor_d2h(y)
    torch.cuda.synchronize()
    assert torch.equal(late, x)
    del again


def test_releasing_outputs_during_a_graph_capture_leaves_the_capture_valid():
    """torch.cuda.graph captures in global mode: ferry's release of an H2D output's device memory (an event on the
    legacy default stream) and of a D2H output must not invalidate it."""
    dev_out = ferry.transfer_tensor_h2d(torch.arange(1000, dtype=torch.float32).pin_memory())
    host_out = ferry.transfer_tensor_d2h(random_tensor((1000,), torch.float32, 35))
    a = torch.ones(1000, device=DEV)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        b = a * 3
        del dev_out, host_out
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(b, a * 3)
