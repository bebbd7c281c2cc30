"""ferry.torch.Stager with CUDA state dicts (run on the H200; skipped without torch or CUDA): exact pinned copies
of a model's and an optimizer's state with tied weights, ordering after the current stream, pinned memory reused
by the next save of the same layout, and DCP round trips through async_save and load in both staging modes.
"""

import gc
import subprocess
import sys

import ferry
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or ferry.device_count() == 0:
    pytest.skip("needs a CUDA device and torch with CUDA", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint")

import ferry.torch  # noqa: E402
from dcp_save import async_save_supports_staging_futures, save_while_training  # noqa: E402
from torch_trees import tensors_of  # noqa: E402

DEV = torch.device("cuda", 0)
SLEEP_CYCLES = 200_000_000  # ~0.1 s of torch.cuda._sleep on an H200: far longer than the copies here


class TiedLM(torch.nn.Module):
    """A small decoder-shaped model whose output head shares the embedding's weight."""

    def __init__(self, vocab=4096, width=256):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.norm(self.mlp(self.embed(ids))))


def trained(seed=0):
    torch.manual_seed(seed)
    model = TiedLM().to(DEV)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 4096, (8, 16), device=DEV)).float().logsumexp(-1).mean().backward()
    optimizer.step()
    return model, optimizer


def test_cuda_tensors_are_staged_to_pinned_host_memory_exactly_and_tied_weights_stay_tied():
    model, optimizer = trained()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    staged = ferry.torch.Stager().stage(state)
    live, copies = list(tensors_of(state)), list(tensors_of(staged))
    assert len(live) == len(copies) and any(t.is_cuda for t in live) and any(not t.is_cuda for t in live)
    for a, b in zip(live, copies):
        assert b.device.type == "cpu"
        assert b.is_pinned() == a.is_cuda
        assert torch.equal(a.cpu(), b)
    m = staged["model"]
    assert m["embed.weight"].untyped_storage().data_ptr() == m["head.weight"].untyped_storage().data_ptr()


def test_staging_is_ordered_after_the_work_queued_on_the_current_stream():
    x = torch.zeros(16 << 20, device=DEV)
    torch.cuda._sleep(SLEEP_CYCLES)
    x.fill_(7.0)  # queued behind the sleep: a copy that does not wait for it reads zeros
    staged = ferry.torch.Stager().stage({"x": x})
    assert bool((staged["x"] == 7.0).all())


@pytest.mark.parametrize("async_staging", [False, True])
def test_the_next_save_of_the_same_layout_pins_no_new_memory(async_staging):
    if async_staging and not async_save_supports_staging_futures():
        pytest.skip(f"torch {torch.__version__}: async_save takes no Future from stage()")
    model, optimizer = trained(1)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    with ferry.torch.Stager(async_staging=async_staging) as stager:
        def save_once():
            staged = stager.stage(state)
            if async_staging:
                staged = staged.result()
            assert torch.equal(staged["model"]["norm.weight"], model.norm.weight.detach().cpu())
            del staged   # DCP drops the staged copy once written
            gc.collect()

        save_once()
        before = ferry.pool.stats()
        save_once()
        after = ferry.pool.stats()
    assert after["pin_calls"] == before["pin_calls"], (before, after)
    assert after["bytes_pinned"] == before["bytes_pinned"], (before, after)


def test_a_fresh_process_pins_within_5_percent_of_a_large_state_dict():
    """In a process of its own, so that no earlier test's pinned memory shapes the pool's growth."""
    script = (
        "import torch, ferry, ferry.torch\n"
        "state = {f'layer{i}.weight': torch.randn(1024, 1024, 8, device='cuda') for i in range(24)}\n"
        "staged = ferry.torch.Stager().stage(state)\n"
        "assert all(torch.equal(staged[k], v.cpu()) for k, v in state.items())\n"
        "print(ferry.pool.stats()['bytes_pinned'], sum(t.nbytes for t in state.values()))\n")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    pinned, size = map(int, out.split())
    assert size == 768 << 20 and pinned <= 1.05 * size, (pinned, size)


@pytest.mark.parametrize("async_staging", [False, True])
def test_dcp_async_save_from_the_gpu_then_load_round_trips_exactly(tmp_path, async_staging):
    if async_staging and not async_save_supports_staging_futures():
        pytest.skip(f"torch {torch.__version__}: async_save takes no Future from stage()")
    model, optimizer = trained(2)
    expected_model = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    save_while_training(model, {"model": model.state_dict(), "optim": optimizer.state_dict()}, tmp_path,
                        async_staging)

    fresh, fresh_optimizer = trained(3)
    loaded = {"model": fresh.state_dict(), "optim": fresh_optimizer.state_dict()}
    dcp.load(loaded, checkpoint_id=str(tmp_path))
    fresh.load_state_dict(loaded["model"])
    for k, v in fresh.state_dict().items():
        assert torch.equal(v.cpu(), expected_model[k]), k


def test_a_dtensor_on_a_cuda_mesh_is_staged_to_a_host_local_tensor():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=DEV)
    try:
        mesh = init_device_mesh("cuda", (1,))
        local = torch.randn(64, 32, device=DEV)
        dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        staged = ferry.torch.Stager().stage({"w": dt})["w"]
        assert isinstance(staged, DTensor) and staged.placements == dt.placements
        assert staged.to_local().device.type == "cpu" and staged.to_local().is_pinned()
        assert torch.equal(staged.to_local(), local.cpu())
    finally:
        dist.destroy_process_group()


def test_tensors_of_every_dtype_are_staged_exactly_float8_included():
    dtypes = [torch.bool, torch.uint8, torch.int16, torch.int64, torch.float16, torch.bfloat16, torch.float64,
              torch.complex64]
    dtypes += [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d]
    def random(dtype):
        size = torch.empty((), dtype=dtype).element_size()
        top = 2 if dtype == torch.bool else 256  # torch's own copies turn a bool byte other than 0 or 1 into 1
        return torch.randint(0, top, (3, 1000 * size), dtype=torch.uint8).to(DEV).view(dtype)

    state = {}
    for dtype in dtypes:
        state[str(dtype)] = random(dtype)             # compact: one DMA
        state[str(dtype) + ".t"] = random(dtype).t()  # strided, its storage its own: gathered, comes back compact
        base = random(dtype)
        state[str(dtype) + ".rows"], state[str(dtype) + ".cols"] = base[1:], base[:, 5:]  # one storage, two views
    staged = ferry.torch.Stager().stage(state)
    for k, v in state.items():
        got = staged[k]
        assert got.dtype == v.dtype and got.shape == v.shape and got.is_pinned(), k
        assert torch.equal(got.contiguous().view(torch.uint8), v.contiguous().cpu().view(torch.uint8)), k


def test_tensors_on_one_storage_share_one_copy_whatever_order_the_walk_meets_them_in():
    """A tensor that is its whole storage is copied as the walk meets it, and the storage's other tensors view its
    copy whether the walk meets them before or after it; a storage with no such tensor is copied whole once."""
    weight = torch.randn(8, 4, device=DEV)
    tied = {"rows": weight[2:5], "embed": weight.detach(), "head": weight.detach(), "transposed": weight.t()}
    flat = torch.randn(10, 4, device=DEV)
    partial = {"first": flat[1:3], "last": flat[5:], "columns": flat.t()[:, 1:]}
    raw = torch.randint(0, 256, (10,), dtype=torch.uint8, device=DEV)   # 10 bytes: no whole float32 view
    odd = {"bytes": raw[:8], "floats": raw[:8].view(torch.float32), "whole": raw}
    staged = ferry.torch.Stager().stage({"tied": tied, "partial": partial, "odd": odd})
    for group, live in (("tied", tied), ("partial", partial), ("odd", odd)):
        for k, v in live.items():
            got = staged[group][k]
            assert got.is_pinned() and got.dtype == v.dtype and got.shape == v.shape, (group, k)
            assert torch.equal(got.contiguous().view(torch.uint8), v.contiguous().cpu().view(torch.uint8)), (group, k)
    for group in ("tied", "partial"):
        assert len({t.untyped_storage().data_ptr() for t in staged[group].values()}) == 1, group
    odd_staged = staged["odd"]
    assert odd_staged["bytes"].untyped_storage().data_ptr() == odd_staged["whole"].untyped_storage().data_ptr()
    assert odd_staged["floats"].untyped_storage().data_ptr() != odd_staged["whole"].untyped_storage().data_ptr()


def test_a_state_dict_of_many_parts_keeps_tied_weights_tied_across_them():
    """The copies go to ferry in parts as the walk finds them; a weight tied between the first and the last part
    is still one copy."""
    parts = ferry.torch.FIRST_PART_TENSORS + 2 * ferry.torch.PART_TENSORS + 7
    embed = torch.randn(64, 16, device=DEV)
    state = {"embed": embed.detach()}
    state.update({f"layer{i}": torch.full((33,), float(i), device=DEV) for i in range(parts)})
    state["head"] = embed.detach()
    staged = ferry.torch.Stager().stage(state)
    assert all(torch.equal(staged[k], v.cpu()) for k, v in state.items())
    assert staged["embed"].untyped_storage().data_ptr() == staged["head"].untyped_storage().data_ptr()


def test_a_tensor_ferry_refuses_after_parts_were_handed_over_fails_the_stage_and_returns_their_memory():
    state = {f"w{i}": torch.randn(1024, device=DEV) for i in range(ferry.torch.FIRST_PART_TENSORS + 10)}
    state["sparse"] = torch.eye(4, device=DEV).to_sparse()   # no DLPack export: refused by ferry at the walk's end
    gc.collect()
    in_use = ferry.pool.stats()["bytes_in_use"]
    with pytest.raises(Exception, match="(?i)sparse|dlpack|strided|layout"):
        ferry.torch.Stager().stage(state)
    gc.collect()
    assert ferry.pool.stats()["bytes_in_use"] == in_use
    del state["sparse"]
    staged = ferry.torch.Stager().stage(state)   # the pool still serves the next stage
    assert all(torch.equal(staged[k], v.cpu()) for k, v in state.items())


def test_conjugate_negative_and_empty_views_are_staged_with_their_values_and_leave_the_storage_shared_by_the_rest():
    """A lazily conjugated or negated view keeps its flag's meaning, and an empty slice neither copies nor breaks
    its storage's sharing: the other tensors on each storage still view one copy."""
    z = torch.randn(6, 5, dtype=torch.complex64, device=DEV)
    x = torch.randn(6, 5, device=DEV)
    state = {"z": z, "z.conj": z.conj(), "z.rows.conj": z[1:4].conj(), "x": x, "x.neg": torch._neg_view(x),
             "x.empty": x[3:3], "x.rows": x[2:]}
    assert state["z.conj"].is_conj() and state["x.neg"].is_neg()
    staged = ferry.torch.Stager().stage(state)
    for k, v in state.items():
        got = staged[k]
        assert got.dtype == v.dtype and got.shape == v.shape and got.device.type == "cpu", k
        assert torch.equal(got.resolve_conj().resolve_neg(), v.resolve_conj().resolve_neg().cpu()), k
    assert staged["x.rows"].untyped_storage().data_ptr() == staged["x"].untyped_storage().data_ptr()
