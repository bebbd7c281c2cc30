"""Batch traversal and reconstruction, for every container kind, through a real (simulated) transfer."""

import collections
import dataclasses
import sys
import typing

import ferry
import numpy as np
import pytest
from sim_helpers import device

A = np.arange(6, dtype=np.int32).reshape(2, 3)


def d2h(batch, **kw):
    return ferry.transfer_tensor_d2h(batch, **kw)


def test_single_tensor_batch_gives_a_numpy_array():
    out = d2h(device(A))
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, A)


def test_list_tuple_dict_are_rebuilt_with_their_types_and_order():
    batch = [device(A), (device(A * 2), "s"), {"z": device(A * 3), "a": None, "m": 7}]
    out = d2h(batch)
    assert type(out) is list and type(out[1]) is tuple and type(out[2]) is dict
    np.testing.assert_array_equal(out[0], A)
    np.testing.assert_array_equal(out[1][0], A * 2)
    np.testing.assert_array_equal(out[2]["z"], A * 3)
    assert list(out[2]) == ["z", "a", "m"]
    assert out[1][1] is batch[1][1] and out[2]["a"] is None and out[2]["m"] is batch[2]["m"]


def test_containers_without_copied_tensors_are_the_same_objects():
    untouched = {"host": np.ones(3), "text": ["a", ("b", 1.5)], "nested": [[], {}]}
    batch = {"t": device(A), "u": untouched}
    out = d2h(batch)
    assert out is not batch
    assert out["u"] is untouched
    assert d2h(untouched) is untouched


def test_everything_that_is_not_a_source_tensor_passes_through_as_the_same_object():
    host = np.arange(3)
    other_device = device(A, index=1)  # cuda:1: not the transfer's device
    scalars = [1, 2.5, "s", b"b", None, True, 3 + 4j]
    batch = [device(A), host, other_device, *scalars]
    out = d2h(batch)
    assert out[1] is host and out[2] is other_device
    for got, want in zip(out[3:], scalars):
        assert got is want
    assert other_device.exports == 0  # not even exported: only __dlpack_device__ was asked


class Point(typing.NamedTuple):
    x: object
    y: object = "default"


def test_namedtuple_is_rebuilt_with_its_class():
    out = d2h(Point(device(A), "keep"))
    assert type(out) is Point and out.y == "keep"
    np.testing.assert_array_equal(out.x, A)


def test_tuple_and_list_subclasses_are_rebuilt_with_their_class():
    class MyTuple(tuple):
        pass

    class MyList(list):
        pass

    out = d2h(MyList([MyTuple((device(A), 1))]))
    assert type(out) is MyList and type(out[0]) is MyTuple
    np.testing.assert_array_equal(out[0][0], A)


def test_defaultdict_keeps_its_default_factory():
    batch = collections.defaultdict(list, {"a": device(A)})
    out = d2h(batch)
    assert type(out) is collections.defaultdict and out.default_factory is list
    np.testing.assert_array_equal(out["a"], A)
    assert out["missing"] == []


def test_ordered_dict_keeps_type_and_order():
    batch = collections.OrderedDict([("b", device(A)), ("a", 1)])
    out = d2h(batch)
    assert type(out) is collections.OrderedDict and list(out) == ["b", "a"]


def test_ordered_dict_keeps_an_order_changed_after_insertion():
    """An OrderedDict's order is its own, not its storage's: move_to_end changes only the former."""
    batch = collections.OrderedDict([("a", device(A)), ("b", 1), ("c", device(A * 2))])
    batch.move_to_end("a")
    batch.move_to_end("c", last=False)
    out = d2h(batch)
    assert list(out) == list(batch) == ["c", "b", "a"]
    np.testing.assert_array_equal(out["a"], A)
    np.testing.assert_array_equal(out["c"], A * 2)


class FrozenMapping(collections.abc.Mapping):
    """A Mapping that is not a dict, built from a dict."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, k):
        return self._data[k]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
def test_a_mapping_that_cannot_be_built_from_a_dict_says_how_ferry_called_it():
    class Registry(FrozenMapping):
        def __init__(self):
            super().__init__({"a": device(A)})

    with pytest.raises(TypeError) as e:
        d2h(Registry())
    assert e.value.__notes__ == ["while ferry rebuilt a Registry of the batch with its copied tensors, as "
                                 "cls(dict_of_items)"]
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_generic_mapping_is_rebuilt_from_a_dict():
    out = d2h(FrozenMapping({"a": device(A), "b": 2}))
    assert type(out) is FrozenMapping and out["b"] == 2
    np.testing.assert_array_equal(out["a"], A)


@dataclasses.dataclass
class Sample:
    image: object
    label: int
    derived: object = dataclasses.field(init=False)
    post_inits: typing.ClassVar[int] = 0

    def __post_init__(self):
        type(self).post_inits += 1
        self.derived = self.label * 10


def test_dataclass_is_rebuilt_without_running_init_again_and_keeps_non_init_fields():
    batch = Sample(device(A), 3)
    batch.derived = device(A + 1)  # a tensor in an init=False field
    batch.extra = "kept"           # an attribute that is not a field
    calls = Sample.post_inits
    out = d2h(batch)
    assert Sample.post_inits == calls
    assert type(out) is Sample and out.label == 3 and out.extra == "kept"
    np.testing.assert_array_equal(out.image, A)
    np.testing.assert_array_equal(out.derived, A + 1)


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: object
    b: object = None


def test_frozen_dataclass_is_rebuilt():
    out = d2h(Frozen(device(A), [device(A * 2)]))
    assert type(out) is Frozen
    np.testing.assert_array_equal(out.b[0], A * 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.a = 1


@dataclasses.dataclass(slots=True)
class Slotted:
    a: object
    b: int = 0


def test_slots_dataclass_is_rebuilt():
    out = d2h(Slotted(device(A), 5))
    assert type(out) is Slotted and out.b == 5
    np.testing.assert_array_equal(out.a, A)


@dataclasses.dataclass
class Lazy:
    a: object
    never_set: object = dataclasses.field(init=False)


def test_dataclass_with_an_unset_init_false_field():
    out = d2h(Lazy(device(A)))
    assert not hasattr(out, "never_set")
    np.testing.assert_array_equal(out.a, A)


def test_a_class_object_is_a_leaf_not_a_dataclass_instance():
    assert d2h([Sample])[0] is Sample


def test_the_same_container_twice_is_not_a_cycle():
    shared = [device(A)]
    out = d2h([shared, shared])
    np.testing.assert_array_equal(out[0][0], A)
    np.testing.assert_array_equal(out[1][0], A)


def test_deep_nesting_raises_recursion_error():
    batch = [device(A)]
    for _ in range(10_000):
        batch = [batch]
    with pytest.raises(RecursionError, match="recursion depth|deeper"):
        d2h(batch)


def test_deep_nesting_is_capped_even_with_a_raised_recursion_limit():
    """ferry's own limit keeps the C stack bounded when Python's limit would allow more."""
    batch = [device(A)]
    for _ in range(100_000):
        batch = [batch]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000_000)
    try:
        with pytest.raises(RecursionError, match="deeper than 1000"):
            d2h(batch)
    finally:
        sys.setrecursionlimit(limit)


def test_nesting_within_the_limit_works():
    batch = device(A)
    for _ in range(200):
        batch = {"k": batch}
    out = d2h(batch)
    for _ in range(200):
        out = out["k"]
    np.testing.assert_array_equal(out, A)


@pytest.mark.parametrize("make", ["list", "dict", "dataclass"])
def test_reference_cycles_raise_value_error(make):
    if make == "list":
        batch = [device(A)]
        batch.append(batch)
    elif make == "dict":
        batch = {"t": device(A)}
        batch["self"] = {"again": batch}
    else:
        batch = Sample(device(A), 1)
        batch.derived = [batch]
    with pytest.raises(ValueError, match="cycle"):
        d2h(batch)


def test_batch_without_source_tensors_is_returned_as_is_and_exports_nothing():
    other = device(A, index=1)
    batch = {"a": [1, 2], "b": other}
    assert d2h(batch) is batch
    assert other.exports == 0


# ---- shared objects, mutation during the walk -----------------------------------------------------------------------


def test_a_sub_batch_shared_many_times_is_walked_and_copied_once_and_stays_shared():
    """22 levels of [b, b] name one tensor 2^22 times; walked as a tree that is 4 M leaves (a minute and gigabytes).
    Walked once, it is 44 nodes, one copy, and the output has the input's shape of sharing."""
    x = device(A)
    b = [x]
    for _ in range(22):
        b = [b, b]
    out = d2h(b)
    level = out
    for _ in range(22):
        assert level[0] is level[1]
        level = level[0]
    np.testing.assert_array_equal(level[0], A)
    assert x.exports == 1


def test_one_tensor_in_two_places_is_copied_in_both():
    x = device(A)
    out = d2h({"a": x, "b": [x, device(A * 2)]})
    np.testing.assert_array_equal(out["a"], A)
    np.testing.assert_array_equal(out["b"][0], A)
    np.testing.assert_array_equal(out["b"][1], A * 2)


def test_a_dict_that_changes_size_while_walked_raises_runtime_error():
    batch = {"a": device(A)}

    class Grower:  # a producer whose __dlpack_device__ adds to the dict being walked
        def __dlpack_device__(self):
            batch["later"] = 1
            return (1, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("not exported")

    batch["g"] = Grower()
    with pytest.raises(RuntimeError, match="changed size while ferry walked it"):
        d2h(batch)
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_a_dict_whose_keys_change_at_the_same_size_while_walked_raises_runtime_error():
    """A key removed and another added keeps the size. With the key being walked removed, the output would hold a
    key the dict no longer has and, where the insert compacted the dict's entries, lack one it always had."""
    for earlier_keys in (0, 1, 5):  # 0 and 5: the insert compacts the entries (after0 was skipped); 1: it does not
        batch = {f"pad{i}": 1 for i in range(earlier_keys)}

        class Swapper:  # a host object whose __dlpack_device__ swaps its own key for another
            def __dlpack_device__(self):
                del batch["swap"]
                batch["new"] = 1
                return (1, 0)

            def __dlpack__(self, **kwargs):
                raise AssertionError("not exported")

        batch["swap"] = Swapper()
        for i in range(4):
            batch[f"after{i}"] = device(A * i)
        with pytest.raises(RuntimeError, match="a dict in the batch changed its keys while ferry walked it"):
            d2h(batch)
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_a_dict_subclass_iterating_over_a_key_it_does_not_hold_raises_runtime_error():
    class Liar(dict):
        def __iter__(self):
            yield from super().__iter__()
            yield "ghost"

    with pytest.raises(RuntimeError, match="a Liar in the batch iterated over key 'ghost', which it does not hold"):
        d2h(Liar(a=device(A)))
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_a_list_that_changes_size_while_walked_raises_runtime_error():
    """A list that shrinks under the walk would skip a tensor without a word; one that grows would copy more."""
    for change in (lambda: batch.pop(0), lambda: batch.append(1)):
        batch = []

        class Changer:  # a host object whose __dlpack_device__ changes the list being walked
            def __dlpack_device__(self):
                change()
                return (1, 0)

            def __dlpack__(self, **kwargs):
                raise AssertionError("not exported")

        batch += [device(A), Changer(), device(A * 2)]
        with pytest.raises(RuntimeError, match="list in the batch changed size while ferry walked it"):
            d2h(batch)
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_a_list_whose_items_shift_at_the_same_size_while_walked_raises_runtime_error():
    """Items removed and as many added keep the size but shift the others: the walk would skip one and repeat
    another, returning a list the batch never was."""
    for change in (lambda: (batch.pop(0), batch.append(device(A * 9))), lambda: (batch.insert(0, 5), batch.pop())):
        batch = []

        class Shifter:  # a host object whose __dlpack_device__ shifts the list being walked
            def __dlpack_device__(self):
                change()
                return (1, 0)

            def __dlpack__(self, **kwargs):
                raise AssertionError("not exported")

        batch += [Shifter(), device(A), device(A * 2)]
        with pytest.raises(RuntimeError, match="list in the batch changed while ferry walked it"):
            d2h(batch)
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_a_dict_losing_an_earlier_key_and_gaining_one_while_walked_raises_runtime_error():
    """A key before the one walked removed and another added: the size and the walked key's place hold, but the
    iteration then meets more entries than the dict ever held."""
    batch = {}

    class Remover:  # a host object whose __dlpack_device__ drops an earlier key and adds one at the end
        def __dlpack_device__(self):
            del batch["a"]
            batch["z"] = device(A * 3)
            return (1, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("not exported")

    batch.update(a=device(A), b=Remover(), c=device(A * 2))
    with pytest.raises(RuntimeError, match="changed its keys while ferry walked it"):
        d2h(batch)
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_keys_that_compare_equal_at_the_rebuild_raise_instead_of_losing_an_entry():
    """Keys whose __eq__ changes during the transfer would collapse into one entry of the rebuilt dict, one key
    carrying another's tensor."""
    same = [False]

    class Key:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 0

        def __eq__(self, other):
            return same[0] or (isinstance(other, Key) and other.v == self.v)

        def __repr__(self):
            return f"Key({self.v})"

    class Flip:  # a producer that makes every Key equal once the walk has read it
        def __init__(self):
            self.inner = device(A * 2)

        def __dlpack_device__(self):
            return self.inner.__dlpack_device__()

        def __dlpack__(self, **kwargs):
            same[0] = True
            return self.inner.__dlpack__(**kwargs)

    with pytest.raises(RuntimeError, match="compared equal to another key while ferry rebuilt it"):
        d2h({Key(1): device(A), Key(2): Flip()})
    assert ferry.pool.stats()["bytes_in_use"] == 0


def test_a_device_id_past_32_bits_is_no_device_and_passes_through():
    """(kDLCUDA, 2**32) must not wrap into cuda:0."""

    class FarDevice:
        def __dlpack_device__(self):
            return (2, 2**32)

        def __dlpack__(self, **kwargs):
            raise AssertionError("not exported")

    far = FarDevice()
    assert d2h([far])[0] is far


def test_a_type_error_from_dlpack_is_raised_after_one_call():
    """A producer's own TypeError is not taken for an old producer that lacks max_version: it runs once."""
    calls = []

    class Broken:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            calls.append(kwargs)
            raise TypeError("the producer is broken")

    with pytest.raises(TypeError, match="the producer is broken"):
        d2h(Broken())
    assert len(calls) == 1


def test_a_producer_without_max_version_is_asked_again_without_it():
    exported = device(A)

    class Legacy:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None):  # DLPack before 1.0: no max_version keyword
            return exported.__dlpack__(stream=stream)

    np.testing.assert_array_equal(d2h(Legacy()), A)
