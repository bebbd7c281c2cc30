"""ferry.torch.Stager's routing of the tensors ferry copies, on the CPU: which tensors go to ferry in which parts,
which become views of another's copy, and what a failed part leaves behind. ferry's transfer is replaced by a
stand-in that copies CPU tensors the way ferry copies CUDA ones (a compact copy with a storage of its own per
output), and CPU tensors are routed as CUDA ones would be. The real copies are in test_gpu_torch_stager.py.

Needs torch (CI installs it); skipped without it.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferry.torch  # noqa: E402


class StandInHandle:
    def __init__(self, copies, error):
        self.copies, self.error, self.waited = copies, error, False

    def wait(self):
        self.waited = True
        if self.error:
            raise RuntimeError("a copy of this part failed")
        return self.copies


class StandInFerry:
    """Records each part (its sources' sizes in bytes) and returns their compact copies; `fail_part` makes that
    part's wait() raise."""

    def __init__(self, fail_part=None):
        self.parts, self.handles, self.fail_part = [], [], fail_part

    def transfer_tensor_d2h_async(self, sources, device=None):
        self.parts.append([t.nbytes for t in sources])
        handle = StandInHandle([t.contiguous().clone() for t in sources], len(self.parts) - 1 == self.fail_part)
        self.handles.append(handle)
        return handle


@pytest.fixture
def stand_in(monkeypatch):
    def install(**kwargs):
        fake = StandInFerry(**kwargs)
        monkeypatch.setattr(ferry.torch, "transfer_tensor_d2h_async", fake.transfer_tensor_d2h_async)
        monkeypatch.setattr(ferry.torch, "_for_ferry", lambda t: type(t) in ferry.torch._PLAIN and not t.is_quantized)
        return fake
    return install


def same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_views_of_a_whole_storage_share_its_copy_whichever_the_walk_meets_first(stand_in):
    fake = stand_in()
    weight = torch.randn(8, 4)
    state = {"rows": weight[2:5], "embed": weight.detach(), "head": weight.detach(), "transposed": weight.t()}
    staged = ferry.torch.Stager().stage(state)
    assert fake.parts == [[weight.nbytes]]   # the storage copied once, by the tensor that is all of it
    for k, v in state.items():
        assert torch.equal(staged[k], v) and staged[k].stride() == v.stride(), k
        assert same_storage(staged[k], staged["embed"]), k


def test_views_of_a_storage_none_of_them_covers_share_one_copy_of_the_whole_storage(stand_in):
    fake = stand_in()
    flat = torch.randn(10, 4)
    state = {"first": flat[1:3], "last": flat[5:], "columns": flat.t()[:, 1:]}
    staged = ferry.torch.Stager().stage(state)
    assert fake.parts == [[flat.nbytes]]
    for k, v in state.items():
        assert torch.equal(staged[k], v) and same_storage(staged[k], staged["first"]), k


def test_a_view_whose_dtype_cannot_divide_the_storage_is_copied_on_its_own(stand_in):
    stand_in()
    raw = torch.arange(10, dtype=torch.uint8)
    state = {"bytes": raw[:8], "floats": raw[:8].view(torch.float32), "whole": raw}
    staged = ferry.torch.Stager().stage(state)
    for k, v in state.items():
        assert torch.equal(staged[k].view(torch.uint8), v.view(torch.uint8)), k
    assert same_storage(staged["bytes"], staged["whole"]) and not same_storage(staged["floats"], staged["whole"])


def test_two_storages_at_one_address_are_not_taken_for_one(stand_in):
    """A small storage that starts where a larger one does (two DLPack imports of one buffer): the larger tensor is
    not a view of the smaller one's copy."""
    stand_in()
    buffer = np.arange(100, dtype=np.float32)
    state = {"small": torch.from_numpy(buffer[:10]), "big": torch.from_numpy(buffer)}
    assert state["small"].untyped_storage().data_ptr() == state["big"].untyped_storage().data_ptr()
    staged = ferry.torch.Stager().stage(state)
    for k, v in state.items():
        assert torch.equal(staged[k], v), k


def test_an_empty_slice_does_not_make_its_storage_copied_whole(stand_in):
    fake = stand_in()
    huge = torch.zeros(1 << 20)
    state = {"empty": huge[:0], "one": huge[5:6]}
    staged = ferry.torch.Stager().stage(state)
    assert sum(map(sum, fake.parts)) == 4   # one float, not the 4 MiB storage
    assert staged["empty"].shape == (0,) and torch.equal(staged["one"], state["one"])


def test_conjugate_and_negative_views_keep_their_values(stand_in):
    stand_in()
    c = torch.randn(6, dtype=torch.complex64)
    x = torch.randn(6)
    state = {"c": c, "conj": c.conj(), "x": x, "neg": x._neg_view()}
    staged = ferry.torch.Stager().stage(state)
    for k, v in state.items():
        assert torch.equal(staged[k].resolve_conj().resolve_neg(), v.resolve_conj().resolve_neg()), k


def test_small_tensors_go_in_parts_while_the_walk_goes_on_and_a_tie_spans_them(stand_in):
    fake = stand_in()
    n = ferry.torch.FIRST_PART_TENSORS + 2 * ferry.torch.PART_TENSORS + 7
    embed = torch.randn(64, 16)
    state = {"embed": embed.detach(), **{f"layer{i}": torch.full((33,), float(i)) for i in range(n)},
             "head": embed.detach()}
    staged = ferry.torch.Stager().stage(state)
    assert [len(p) for p in fake.parts] == [ferry.torch.FIRST_PART_TENSORS, ferry.torch.PART_TENSORS,
                                           ferry.torch.PART_TENSORS, 8]
    assert all(torch.equal(staged[k], v) for k, v in state.items())
    assert same_storage(staged["embed"], staged["head"])


def test_large_tensors_go_in_one_transfer(stand_in):
    fake = stand_in()
    state = {f"w{i}": torch.full((300_000,), float(i)) for i in range(ferry.torch.FIRST_PART_TENSORS + 8)}   # 1.2 MB
    staged = ferry.torch.Stager().stage(state)
    assert [len(p) for p in fake.parts] == [len(state)]
    assert all(torch.equal(staged[k], v) for k, v in state.items())


@pytest.mark.parametrize("fail_part", [0, 1])
def test_a_failed_part_fails_the_stage_after_every_part_is_waited_for(stand_in, fail_part):
    fake = stand_in(fail_part=fail_part)
    state = {f"w{i}": torch.full((33,), float(i)) for i in range(ferry.torch.FIRST_PART_TENSORS + 10)}
    with pytest.raises(RuntimeError, match="a copy of this part failed"):
        ferry.torch.Stager().stage(state)
    assert len(fake.handles) == 2 and all(h.waited for h in fake.handles)


def nested_state(n):
    """A state dict of n small tensors in nested dicts and lists, the last ones in the last part, with a view of a
    last-part storage and a dict met twice."""
    shared = {"bias": torch.full((5,), -1.0)}
    layers = [{"w": torch.full((33,), float(i)), "pair": [torch.full((3,), float(i)), torch.zeros(2)]}
              for i in range(n)]
    last = torch.randn(8, 4)
    return {"layers": layers, "a": shared, "b": shared, "last": last, "last_rows": last[2:5]}


def assert_staged(staged, state):
    assert staged.keys() == state.keys() and staged["a"] is staged["b"]
    for got, want in zip(staged["layers"], state["layers"], strict=True):
        assert torch.equal(got["w"], want["w"]) and len(got["pair"]) == 2
        assert all(torch.equal(g, w) for g, w in zip(got["pair"], want["pair"], strict=True))
    assert torch.equal(staged["a"]["bias"], state["a"]["bias"]) and torch.equal(staged["last"], state["last"])
    assert torch.equal(staged["last_rows"], state["last_rows"]) and same_storage(staged["last_rows"], staged["last"])


@pytest.fixture
def rebuilds(monkeypatch):
    """Counts the Stager's rebuilds of the state dict and whether each may leave holes (rebuilt while the last part
    copies) or not (after it)."""
    made = []

    class Counted(ferry.torch._Rebuild):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(ferry.torch, "_Rebuild", Counted)
    return made


def test_the_state_dict_is_rebuilt_while_the_last_part_copies_and_its_tensors_fill_their_places(stand_in, rebuilds):
    fake = stand_in()
    state = nested_state(ferry.torch.PART_TENSORS)
    staged = ferry.torch.Stager().stage(state)
    assert len(fake.parts) >= 3 and len(rebuilds) == 1 and len(rebuilds[0].holes) > 0
    assert_staged(staged, state)


def test_a_tensor_in_a_tuple_makes_the_rebuild_wait_for_the_last_part(stand_in, rebuilds):
    stand_in()
    state = nested_state(ferry.torch.PART_TENSORS)
    state["tuple"] = (state["last"], 7)
    staged = ferry.torch.Stager().stage(state)
    assert len(rebuilds) == 1 and rebuilds[0].holes is None   # one rebuild, after the last part
    assert_staged(staged, state)
    assert staged["tuple"][0] is staged["last"] and staged["tuple"][1] == 7


class ConvertingDict(dict):
    """A dict whose __setitem__ stores a new list for a list (as easydict's EasyDict does): a place filled after
    the rebuild would be filled in the list it dropped."""

    def __setitem__(self, key, value):
        super().__setitem__(key, list(value) if isinstance(value, list) else value)


class TensorsOnly(dict):
    def __setitem__(self, key, value):
        if not isinstance(value, torch.Tensor):
            raise TypeError("values must be tensors")
        super().__setitem__(key, value)


def test_containers_of_other_types_are_rebuilt_after_the_last_part(stand_in, rebuilds):
    stand_in()
    state = nested_state(ferry.torch.PART_TENSORS)
    cfg = ConvertingDict()
    dict.__setitem__(cfg, "pair", [state["last"], torch.full((3,), 2.0)])
    state["cfg"] = cfg
    staged = ferry.torch.Stager().stage(state)
    assert len(rebuilds) == 1 and rebuilds[0].holes is None
    assert_staged(staged, state)
    assert staged["cfg"]["pair"][0] is staged["last"] and torch.equal(staged["cfg"]["pair"][1], torch.full((3,), 2.0))
    strict = TensorsOnly({f"w{i}": torch.full((33,), float(i)) for i in range(ferry.torch.PART_TENSORS + 40)})
    staged = ferry.torch.Stager().stage(strict)
    assert type(staged) is TensorsOnly and all(torch.equal(staged[k], v) for k, v in strict.items())


class CannotCopy:
    def __deepcopy__(self, memo):
        raise RuntimeError("cannot deep-copy")


def test_a_rebuild_that_fails_raises_after_every_part_is_waited_for(stand_in):
    fake = stand_in()
    state = nested_state(ferry.torch.PART_TENSORS)
    state["extra"] = CannotCopy()
    with pytest.raises(RuntimeError, match="cannot deep-copy"):
        ferry.torch.Stager().stage(state)
    assert len(fake.handles) >= 3 and all(h.waited for h in fake.handles)
