"""ferry.torch.Stager on the CPU: the staged copy's contract (every tensor copied, containers rebuilt with their
types, other objects deep-copied, sharing kept), torch DCP's AsyncStager protocol, and DCP round trips through
async_save and load, both staging modes. The CUDA path (ferry's copies) is in test_gpu_torch_stager.py.

Needs torch (CI installs it); skipped without it.
"""

import collections
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import ferry.torch  # noqa: E402
from dcp_save import async_save_supports_staging_futures, save_while_training  # noqa: E402
from torch_trees import tensors_of  # noqa: E402

Point = collections.namedtuple("Point", "x y")


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def test_every_tensor_is_a_copy_with_the_same_values_and_training_cannot_change_it():
    model, optimizer = model_and_optimizer()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    staged = ferry.torch.Stager().stage(state)

    live, copies = list(tensors_of(state)), list(tensors_of(staged))
    assert len(live) == len(copies) > 10
    for a, b in zip(live, copies):
        assert torch.equal(a, b)
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    optimizer.param_groups[0]["lr"] = 0.5   # a scheduler changes the live param_groups in place
    for k, v in before.items():
        assert torch.equal(staged["model"][k], v), k
    assert staged["optim"]["param_groups"][0]["lr"] == 1e-3


def test_containers_keep_their_types_and_attributes_and_other_objects_are_deep_copied():
    class Box:
        def __init__(self, items):
            self.items = items

    factory_dict = collections.defaultdict(list, {"a": torch.ones(2)})
    state = {
        "ordered": collections.OrderedDict(w=torch.zeros(3)),
        "default": factory_dict,
        "point": Point(torch.ones(1), 7),
        "tuple": (1, "two", torch.arange(3)),
        "size": torch.Size([2, 3]),
        "box": Box([1, 2]),
        "none": None,
    }
    state["ordered"]._metadata = {"": {"version": 1}}
    staged = ferry.torch.Stager().stage(state)

    assert type(staged["ordered"]) is collections.OrderedDict
    assert staged["ordered"]._metadata == {"": {"version": 1}}
    assert staged["ordered"]._metadata is not state["ordered"]._metadata
    assert type(staged["default"]) is collections.defaultdict and staged["default"].default_factory is list
    assert type(staged["point"]) is Point and staged["point"].y == 7
    assert staged["tuple"][:2] == (1, "two") and torch.equal(staged["tuple"][2], torch.arange(3))
    assert staged["size"] == torch.Size([2, 3])
    assert type(staged["box"]) is Box and staged["box"].items == [1, 2] and staged["box"] is not state["box"]
    assert staged["none"] is None
    assert staged is not state and staged["ordered"] is not state["ordered"]


def test_an_object_met_twice_is_staged_once_and_shared_in_the_copy():
    shared_list = [torch.ones(4)]
    t = torch.arange(6.0)
    staged = ferry.torch.Stager().stage({"a": shared_list, "b": shared_list, "t1": t, "t2": t})
    assert staged["a"] is staged["b"] and staged["a"] is not shared_list
    assert staged["t1"] is staged["t2"]


def test_tensors_sharing_storage_share_it_in_the_copy_with_their_views():
    """Tied weights: state_dict() returns one detached tensor per name, all on one storage."""
    weight = torch.randn(8, 4)
    state = {"embed": weight.detach(), "head": weight.detach(), "rows": weight[2:5], "transposed": weight.t()}
    staged = ferry.torch.Stager().stage(state)
    pointers = {v.untyped_storage().data_ptr() for v in staged.values()}
    assert len(pointers) == 1 and pointers != {weight.untyped_storage().data_ptr()}
    for k, v in state.items():
        assert torch.equal(staged[k], v) and staged[k].stride() == v.stride(), k


def test_a_storage_whose_size_a_member_dtype_cannot_divide_is_copied_per_tensor():
    raw = torch.arange(10, dtype=torch.uint8)  # 10 bytes: not a whole number of float32
    as_bytes, head = raw[:8], raw[:8].view(torch.float32)
    staged = ferry.torch.Stager().stage({"bytes": as_bytes, "floats": head})
    assert torch.equal(staged["bytes"], as_bytes)
    assert torch.equal(staged["floats"].view(torch.uint8), head.view(torch.uint8))


def test_parameters_and_tensors_requiring_grad_are_staged_detached():
    p = torch.nn.Parameter(torch.randn(3))
    staged = ferry.torch.Stager().stage({"p": p})
    assert not staged["p"].requires_grad and torch.equal(staged["p"], p.detach())


def test_a_state_dict_that_contains_itself_is_refused_with_a_clear_error():
    state = {"w": torch.ones(1)}
    state["self"] = [state]
    with pytest.raises(ValueError, match="contains itself"):
        ferry.torch.Stager().stage(state)


def test_the_stager_follows_dcp_async_stager_protocol():
    from torch.distributed.checkpoint.staging import AsyncStager

    stager = ferry.torch.Stager()
    assert isinstance(stager, AsyncStager)
    assert stager.should_synchronize_after_execute is False
    stager.synchronize_staging()  # nothing staged asynchronously: returns at once
    stager.close()
    with pytest.raises(RuntimeError, match="after close"):
        stager.stage({"w": torch.ones(1)})


@pytest.mark.parametrize("async_staging", [False, True])
def test_dcp_async_save_through_the_stager_then_load_round_trips_exactly(tmp_path, async_staging):
    if async_staging and not async_save_supports_staging_futures():
        pytest.skip(f"torch {torch.__version__}: async_save takes no Future from stage()")
    model, optimizer = model_and_optimizer()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    save_while_training(model, {"model": model.state_dict()}, tmp_path, async_staging)

    fresh, _ = model_and_optimizer()
    with torch.no_grad():
        for p in fresh.parameters():
            p.fill_(3.0)
    loaded = {"model": fresh.state_dict()}
    dcp.load(loaded, checkpoint_id=str(tmp_path))
    fresh.load_state_dict(loaded["model"])
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, expected[k]), k


def test_async_staging_returns_a_future_and_synchronize_staging_waits_for_it():
    if not async_save_supports_staging_futures():
        pytest.skip(f"torch {torch.__version__}: async_save takes no Future from stage()")
    with ferry.torch.Stager(async_staging=True) as stager:
        future = stager.stage({"w": torch.arange(5)})
        stager.synchronize_staging()
        assert future.done() and torch.equal(future.result()["w"], torch.arange(5))


def test_dtensor_keeps_its_mesh_and_placements_around_a_staged_local_tensor():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    if not dist.is_available():
        pytest.skip("torch built without torch.distributed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        local = torch.arange(12.0).reshape(4, 3)
        dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        staged = ferry.torch.Stager().stage({"w": dt})["w"]
        assert isinstance(staged, DTensor)
        assert staged.placements == dt.placements and staged.device_mesh == mesh
        assert torch.equal(staged.to_local(), local)
        assert staged.to_local().untyped_storage().data_ptr() != local.untyped_storage().data_ptr()
    finally:
        dist.destroy_process_group()


def test_import_ferry_does_not_import_torch():
    code = "import sys, ferry, ferry.pool, ferry.ops; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
