"""ferry.torch: staging torch state dicts to host memory through ferry, for torch.distributed.checkpoint.

``Stager`` implements DCP's ``AsyncStager`` protocol::

    import torch.distributed.checkpoint as dcp
    import ferry.torch

    stager = ferry.torch.Stager()
    future = dcp.async_save(state_dict, checkpoint_id=path, async_stager=stager)   # returns once staged
    ...  # training goes on while DCP writes the staged copy
    future.result()
    stager.close()

It also registers ferry's GEMM operators as torch custom ops, ``torch.ops.ferry.gemm(A, B)`` and
``torch.ops.ferry.gemm_out(A, B, out)`` (also ``ferry.torch.gemm`` and ``gemm_out``; torch 2.4 or later), which
work eagerly and under ``torch.compile(fullgraph=True)``.

Importing this module imports torch; ``import ferry`` never does.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
from typing import Any

import torch

from ._ferry import _EARLY_PART_MAX_MEAN_BYTES, transfer_tensor_d2h_async

__all__ = ["Stager"]
if hasattr(torch.library, "register_autograd"):   # what _torch_ops needs (torch >= 2.4); the Stager works without
    from ._torch_ops import gemm, gemm_out

    __all__ += ["gemm", "gemm_out"]

# Leaves that are immutable and hold no tensor: kept as they are instead of deep-copied.
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, torch.layout,
              torch.memory_format)


class Stager:
    """Stages a state dict for ``torch.distributed.checkpoint.async_save``: a copy in host memory that training
    cannot change.

    - CUDA tensors are copied to pinned host memory by ferry, one call per device, on ferry's copy stream, after
      the work already queued on the calling thread's current stream. The copies are compact: a non-contiguous
      tensor comes back contiguous with its shape. Tensors sharing storage (tied weights) share it in the copy,
      which holds the storage's bytes once.
    - CPU tensors are cloned; tensors on other devices are copied with ``Tensor.to("cpu")``. A DTensor keeps its
      mesh and placements around a staged local tensor.
    - Dicts (with their type, attributes and ``default_factory``), lists, tuples and named tuples are rebuilt, an
      object met twice is staged once, and every other object is deep-copied.

    ``async_staging=False`` (the default): ``stage`` returns once the copies are done, so ``async_save`` returns
    its usual Future, as with DCP's default stager, and the model may change as soon as it returns.

    ``async_staging=True``: ``stage`` returns a ``concurrent.futures.Future`` at once (a worker thread of this
    stager waits for the copies) and ``async_save`` returns an ``AsyncSaveResponse``; wait for its
    ``staging_completion`` before changing the model. This needs a torch whose ``async_save`` accepts a Future
    from ``stage`` (one that has ``AsyncSaveResponse``); ValueError otherwise.

    Memory: the staged CUDA tensors of one call view pinned slabs of ferry's pool (``ferry.pool``). Once DCP has
    written them and they are dropped, the memory goes back to the pool, so the next save of the same state dict
    reuses it without pinning; ``ferry.pool.trim()`` gives it back to the system. Keeping any staged tensor keeps
    its whole slab.

    ``device`` is not needed: each CUDA tensor is staged from its own device. Not thread-safe: use one stager per
    thread, as with DCP's stagers.
    """

    # DCP calls synchronize_staging() after stage() when this is True; stage() never leaves work for it to wait
    # for in the synchronous mode, and the asynchronous mode reports completion through its Future.
    _synchronize_after_execute: bool = False

    def __init__(self, *, async_staging: bool = False) -> None:
        if async_staging and not _async_save_accepts_futures():
            raise ValueError(
                f"Stager(async_staging=True) needs a torch whose dcp.async_save accepts a Future from stage() "
                f"(torch.distributed.checkpoint.state_dict_saver.AsyncSaveResponse); torch {torch.__version__} "
                f"has none: use async_staging=False")
        self._async = async_staging
        self._executor = (concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-stager")
                          if async_staging else None)
        # Completion of the last asynchronous staging, without its result: holding the staged dict here would
        # keep its pinned memory while the next save stages, doubling what the pool needs.
        self._last_staging: concurrent.futures.Future | None = None
        self._closed = False

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def stage(self, state_dict: Any) -> Any:
        """Returns the staged copy of ``state_dict`` (``async_staging=False``), or a Future of it."""
        if self._closed:
            raise RuntimeError("Stager.stage() after close()")
        staging = _Staging(state_dict)
        if not self._async:
            return staging.finish()
        done: concurrent.futures.Future = concurrent.futures.Future()

        def finish() -> Any:
            try:
                return staging.finish()
            finally:
                done.set_result(None)

        self._last_staging = done
        return self._executor.submit(finish)

    def synchronize_staging(self) -> None:
        """Waits until the last ``stage`` call's copies are done (immediately in the synchronous mode). Errors of
        the staging are raised by its Future, not here."""
        if self._last_staging is not None:
            self._last_staging.result()

    def close(self) -> None:
        """Waits for staging in flight and stops the worker thread. The pool's pinned memory stays for other
        users (``ferry.pool.trim()`` frees it)."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> Stager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _async_save_accepts_futures() -> bool:
    try:
        from torch.distributed.checkpoint import state_dict_saver
    except ImportError:
        return False
    return hasattr(state_dict_saver, "AsyncSaveResponse")


_IN_PROGRESS = ("in progress",)   # the walk's mark on a container being walked: meeting it again is a cycle

_dtensor_class: type | None = None


def _is_dtensor(t: torch.Tensor) -> bool:
    """Whether t is a DTensor, without importing torch.distributed for plain tensors."""
    global _dtensor_class
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return False
    if _dtensor_class is None:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:
            return False
        _dtensor_class = DTensor
    return isinstance(t, _dtensor_class)


# A stage() call hands its CUDA copies to ferry in parts as the walk finds them, so that they run while the walk
# reads the rest: the first part after this many tensors (the copies start early), each later one after PART_TENSORS
# (few calls). The parts fall at the same tensors on every save of one layout, so the pool's memory is reused. As
# in ferry's own walk, tensors averaging _EARLY_PART_MAX_MEAN_BYTES or more (a large model's) copy for far longer
# than they take to walk: they go in one transfer at the walk's end, which holds no more pinned memory than them.
FIRST_PART_TENSORS = 32
PART_TENSORS = 256


class _Part:
    """Tensors for one ferry transfer: their sources, what each output becomes (a slot for one tensor copied as it
    is; (slots, False) for one carried as integers and viewed back; (slots, True) for a storage shared by several
    tensors, copied whole), and their bytes."""

    __slots__ = ("sources", "outputs", "nbytes")

    def __init__(self) -> None:
        self.sources: list[torch.Tensor] = []
        self.outputs: list[int | tuple[list[int], bool]] = []
        self.nbytes = 0


def _for_ferry(t: torch.Tensor) -> bool:
    """Whether ferry copies t (a plain CUDA tensor); the others are staged by torch."""
    return t.is_cuda and type(t) in _PLAIN and not t.is_quantized


class _Staging:
    """One stage() call: the walk, which submits the copies, then finish(), which waits and rebuilds.

    The walk turns the state dict into nodes: a tensor's is its slot, an int (most of a state dict: cheap to make
    and to rebuild), the others a tuple whose first item says what it is:
      slot                        the tensor staged into results[slot]
      ("dtensor", slot, source)   a DTensor whose local tensor is staged into results[slot]
      ("dict", source, items)     items: [(key, node)]; rebuilt from a shallow copy of source
      ("list", source, nodes)
      ("tuple", source, nodes)    tuple, named tuple or other tuple subclass
      ("keep", obj)               an immutable leaf, kept
      ("copy", obj)               any other leaf, deep-copied
    A tensor met twice has one slot, and other nodes are memoised by the id of their object, so an object met
    twice is staged once and rebuilt shared.

    Tensors on one storage share one copy of it. A CUDA tensor that is its whole storage (offset 0, contiguous,
    every byte) is copied as soon as the walk meets it, and the other tensors on that storage become views of its
    copy. Every other tensor waits for the walk's end, where the tensors of a storage without such a copy are
    copied together as the whole storage, or one by one when one of them cannot view it.
    """

    def __init__(self, state_dict: Any) -> None:
        self._nodes: dict[int, tuple] = {}
        self._sources: list[torch.Tensor] = []   # tensors to stage, by slot
        self._slot_of: dict[int, int] = {}       # id(tensor) -> slot
        self._whole: dict[tuple, int] = {}       # storage key -> slot of the tensor whose copy is that storage
        self._views: list[tuple[int, int]] = []  # (slot, slot of the whole storage's copy it views)
        self._later: list[tuple[int, tuple]] = []   # (slot, storage key) staged at the walk's end
        self._parts: dict[int, _Part] = {}      # per device, the part not yet handed to ferry
        self._devices_started: set[int] = set()   # devices whose first part went to ferry
        # Per part handed to ferry and not yet placed: its handle and what each output becomes (_Part.outputs).
        self._pending: list[tuple[Any, list[int | tuple[list[int], bool]]]] = []
        self.results: list[torch.Tensor | None] = []   # by slot
        # Whether finish() may rebuild while the last part copies: every tensor sits in a dict or a list of the
        # built-in types, whose places can be filled afterwards (not in a tuple, a DTensor or at the root, nor in a
        # container type whose __setitem__ might copy or refuse the placeholder).
        self._early_rebuild = True
        try:
            self._root = self._walk(state_dict)
            if type(self._root) is int:
                self._early_rebuild = False
            self._stage_the_rest()
        except BaseException:
            self._drain()
            raise

    # ---- the walk --------------------------------------------------------------------------------------------

    def _walk(self, obj: Any) -> int | tuple:
        if type(obj) in _PLAIN or (isinstance(obj, torch.Tensor) and not _is_dtensor(obj)):   # its slot is its memo
            return self._slot(obj)
        node = self._nodes.get(id(obj))
        if node is _IN_PROGRESS:
            raise ValueError(f"the state dict contains itself: a {type(obj).__name__} holds itself, directly or "
                             f"through other containers")
        if node is not None:
            return node
        self._nodes[id(obj)] = _IN_PROGRESS
        if isinstance(obj, _IMMUTABLE):
            node = ("keep", obj)
        elif isinstance(obj, torch.Tensor):
            node = ("dtensor", self._slot(obj._local_tensor), obj)
            self._early_rebuild = False
        elif isinstance(obj, dict):   # plain tensors go straight to _slot: a call less for most of a state dict
            walk, slot = self._walk, self._slot
            node = ("dict", obj, [(key, slot(value) if type(value) in _PLAIN else walk(value))
                                  for key, value in obj.items()])
            if type(obj) is not dict and type(obj) is not collections.OrderedDict:
                self._early_rebuild = False
        elif isinstance(obj, list):
            node = ("list", obj, [self._walk(value) for value in obj])
            if type(obj) is not list:
                self._early_rebuild = False
        elif isinstance(obj, tuple):
            node = ("tuple", obj, [self._walk(value) for value in obj])
            if any(type(item) is int for item in node[2]):
                self._early_rebuild = False
        else:
            node = ("copy", obj)
        self._nodes[id(obj)] = node   # the state dict keeps obj alive, so its id is not reused during the walk
        return node

    def _slot(self, t: torch.Tensor) -> int:
        """t's slot; a tensor met for the first time is routed: a CUDA tensor that is its whole storage goes to
        ferry now, a tensor on a storage copied whole already becomes a view of that copy, any other waits for
        the walk's end."""
        slot = self._slot_of.get(id(t))
        if slot is not None:
            return slot
        slot = self._slot_of[id(t)] = len(self._sources)
        self._sources.append(t)
        self.results.append(None)
        key, whole_storage = _storage_of(t, slot)
        whole = self._whole.get(key)
        if whole is not None:
            if self._sources[whole].nbytes % t.element_size() == 0:
                self._views.append((slot, whole))
                return slot
        elif whole_storage and _for_ferry(t):
            self._whole[key] = slot
            self._queue_tensor(key[1], t, slot)
            return slot
        self._later.append((slot, key))
        return slot

    # ---- the copies ------------------------------------------------------------------------------------------

    def _queue_tensor(self, device: int, t: torch.Tensor, slot: int) -> None:
        """Queues one tensor copied as it is into results[slot] (viewed back to its dtype if carried as integers)."""
        source = t.detach() if t.requires_grad else t
        exported = _exportable(source)
        self._queue(device, exported, slot if exported is source else ([slot], False))

    def _queue(self, device: int, source: torch.Tensor, output: int | tuple[list[int], bool]) -> None:
        part = self._parts.get(device)
        if part is None:
            part = self._parts[device] = _Part()
        part.sources.append(source)
        part.outputs.append(output)
        part.nbytes += source.nbytes
        count = len(part.sources)
        if (count >= (PART_TENSORS if device in self._devices_started else FIRST_PART_TENSORS)
                and part.nbytes < count * _EARLY_PART_MAX_MEAN_BYTES):
            self._hand_over(device)

    def _hand_over(self, device: int) -> None:
        """Hands a device's part to ferry, then places the part before it, whose copies are likely done by now,
        while this one's run."""
        part = self._parts.pop(device)
        self._pending.append((transfer_tensor_d2h_async(part.sources, device=device), part.outputs))
        self._devices_started.add(device)
        if len(self._pending) > 1:
            self._place(*self._pending.pop(0))

    def _stage_the_rest(self) -> None:
        """At the walk's end: the tensors that waited are grouped by storage and copied, and the last parts handed
        to ferry; then tensors not on a CUDA device are staged by torch, while ferry's copies run."""
        by_storage: dict[tuple, list[int]] = {}
        for slot, key in self._later:
            whole = self._whole.get(key)   # a tensor copied whole met after this one
            if whole is not None and self._sources[whole].nbytes % self._sources[slot].element_size() == 0:
                self._views.append((slot, whole))
            else:
                by_storage.setdefault(key, []).append(slot)
        here = []
        for slots in by_storage.values():
            first = self._sources[slots[0]]
            shared = len(slots) > 1 and _can_share(first, [self._sources[s] for s in slots])
            if not _for_ferry(first):
                here.append((slots, shared))
            elif shared:
                storage = torch.empty(0, dtype=torch.uint8, device=first.device).set_(first.untyped_storage())
                self._queue(first.get_device(), storage, (slots, True))
            else:
                for slot in slots:
                    t = self._sources[slot]
                    self._queue_tensor(t.get_device(), t, slot)
        for device in list(self._parts):
            self._hand_over(device)
        for slots, shared in here:
            self._stage_here(slots, shared)

    def _stage_here(self, slots: list[int], shared: bool) -> None:
        """Tensors that are not on a CUDA device, and tensor subclasses ferry cannot export (quantized wrappers and
        the like), staged with torch on the calling thread."""
        first = self._sources[slots[0]]
        if shared:
            storage = first.untyped_storage()
            copy_of_storage = storage.clone() if first.device.type == "cpu" else storage.cpu()
            whole = torch.empty(0, dtype=torch.uint8).set_(copy_of_storage)
            for slot in slots:
                self.results[slot] = _view_of(whole, self._sources[slot])
            return
        for slot in slots:
            t = self._sources[slot].detach()
            self.results[slot] = t.clone() if t.device.type == "cpu" else t.to("cpu", copy=True)

    def _drain(self) -> None:
        """Waits for the parts handed to ferry (their errors are dropped: the walk's own error is raised), so that
        a failed stage() leaves no copy running and returns their memory to the pool."""
        pending, self._pending = self._pending, []
        for handle, _ in pending:
            try:
                handle.wait()
            except Exception:   # noqa: BLE001 - the caller raises the walk's error
                pass

    def _place(self, handle: Any, outputs: list[int | tuple[list[int], bool]]) -> None:
        """Waits for one part's copies and puts its outputs in their slots: a tensor as itself (viewed back to its
        dtype when it was carried as integers), a shared storage as each member's view of it."""
        copies = handle.wait()
        if copies and not copies[0].is_cpu:   # ferry copies every tensor of a call, or passes them all through
            raise RuntimeError(
                f"ferry did not copy a tensor on {copies[0].device}: ferry sees no CUDA driver or device while torch "
                f"does (ferry.device_count() is 0?)")
        results = self.results
        for output, copied in zip(outputs, copies):
            if type(output) is int:
                results[output] = copied
                continue
            slots, shared = output
            if not shared:
                results[slots[0]] = copied.view(self._sources[slots[0]].dtype)
            else:
                for slot in slots:
                    results[slot] = _view_of(copied, self._sources[slot])

    def finish(self) -> Any:
        """Waits for the copies and rebuilds the state dict around them. The containers are rebuilt while the last
        part copies, with its tensors' places left to fill once it is done, when every tensor sits in a dict or a
        list (_early_rebuild); otherwise the rebuild waits for it. Every part is waited for before an error (of a
        part or of the rebuild) is raised."""
        pending, self._pending = self._pending, []
        last = pending.pop() if pending else None
        error = None
        for handle, outputs in pending:
            try:
                self._place(handle, outputs)
            except Exception as e:   # noqa: BLE001 - raised once every part is done
                error = error or e
        early = None
        if last is not None and error is None and self._early_rebuild:
            try:
                self._make_views()
                early = _Rebuild(self.results, holes_allowed=True)
                root = early.node(self._root)
            except Exception as e:   # noqa: BLE001 - raised once the last part is done too
                error, early = e, None
        if last is not None:
            try:
                self._place(*last)
            except Exception as e:   # noqa: BLE001 - as above
                error = error or e
        if error is not None:
            raise error
        self._make_views()
        if early is None:
            return _Rebuild(self.results).node(self._root)
        results = self.results
        for container, key, slot in early.holes:
            container[key] = results[slot]
        return root

    def _make_views(self) -> None:
        """The results of the tensors that view a storage copied whole, where that copy is placed already."""
        results, left = self.results, []
        for slot, whole in self._views:
            if results[whole] is None:
                left.append((slot, whole))
            elif results[slot] is None:
                copy_of_storage = results[whole].reshape(-1).view(torch.uint8)
                results[slot] = _view_of(copy_of_storage, self._sources[slot])
        self._views = left


_PLAIN = (torch.Tensor, torch.nn.Parameter)   # the tensor types ferry copies; a DTensor is staged by its local tensor
_STRIDED = torch.strided


# dtypes every DLPack consumer and producer knows; a tensor of another dtype (float8, sub-byte, ...) is copied as
# integers of its element's size and viewed back, so DLPack's coverage of new dtypes never matters here.
_DLPACK_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128}
_CARRIERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _exportable(t: torch.Tensor) -> torch.Tensor:
    carrier = None if t.dtype in _DLPACK_DTYPES else _CARRIERS.get(t.element_size())
    return t if carrier is None else t.view(carrier)


def _storage_of(t: torch.Tensor, slot: int) -> tuple[tuple, bool]:
    """(key, whole): tensors with equal keys share a storage (its device type, device index, address and size: two
    storages can start at one address); a tensor without a strided storage of its own bytes keys on its slot, and
    so does one whose views would lose a flag (conjugate, negative) or that holds nothing. whole: t's compact copy
    is its storage's bytes (it starts at the storage's start, is contiguous and ends at its end)."""
    if type(t) not in _PLAIN or t.layout is not _STRIDED or t.is_quantized or t.is_conj() or t.is_neg():
        return ("alone", slot), False
    size = t.nbytes
    if not size:
        return ("alone", slot), False
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return ("alone", slot), False
    pointer, nbytes = storage.data_ptr(), storage.nbytes()
    if not pointer:
        return ("alone", slot), False
    key = ("cuda" if t.is_cuda else t.device.type, t.get_device(), pointer, nbytes)
    return key, size == nbytes and t.storage_offset() == 0 and t.is_contiguous()


def _can_share(first: torch.Tensor, members: list[torch.Tensor]) -> bool:
    """Whether the members can all be rebuilt as views of one byte copy of their storage: plain strided tensors
    whose element size divides the storage's size (a uint8 copy is viewed as each member's dtype)."""
    nbytes = first.untyped_storage().nbytes()
    return all(nbytes % m.element_size() == 0 for m in members)


def _view_of(whole: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """member's view of `whole`, a uint8 host copy of member's whole storage."""
    typed = whole.view(member.dtype)
    return typed.as_strided(member.size(), member.stride(), typed.storage_offset() + member.storage_offset())


class _Rebuild:
    """Builds the staged objects from the walk's nodes; a node met twice gives the same object.

    With holes_allowed (the walk found every tensor in a dict or a list of the built-in types: _early_rebuild), a
    tensor whose result is not placed yet (None) leaves a hole, recorded in `holes` as (container, key or index,
    slot), to fill later."""

    def __init__(self, results: list[torch.Tensor | None], holes_allowed: bool = False) -> None:
        self._results = results
        self._built: dict[int, Any] = {}
        self._deepcopy_memo: dict[int, Any] = {}
        self.holes: list[tuple[Any, Any, int]] | None = [] if holes_allowed else None

    def node(self, node: int | tuple) -> Any:
        if type(node) is int:
            return self._results[node]
        built = self._built.get(id(node), self)
        if built is not self:
            return built
        kind = node[0]
        if kind == "keep":
            built = node[1]
        elif kind == "dtensor":
            source = node[2]
            # DTensor.from_local would move the local tensor back to the mesh's device; the constructor does not.
            built = type(source)(self._results[node[1]], source._spec, requires_grad=False)
        elif kind == "dict":
            built = copy.copy(node[1])   # keeps the dict's type, default_factory and attributes
            if getattr(built, "__dict__", None):
                built.__dict__ = copy.deepcopy(built.__dict__, self._deepcopy_memo)
            self._built[id(node)] = built
            results, rebuild = self._results, self.node
            for key, value in node[2]:
                if type(value) is int:
                    tensor = built[key] = results[value]
                    if tensor is None:
                        self.holes.append((built, key, value))
                else:
                    built[key] = rebuild(value)
            return built
        elif kind == "list":
            built = copy.copy(node[1])
            self._built[id(node)] = built
            items = node[2]
            built[:] = [self._results[value] if type(value) is int else self.node(value) for value in items]
            for index, value in enumerate(items):
                if type(value) is int and self._results[value] is None:
                    self.holes.append((built, index, value))
            return built
        elif kind == "tuple":
            items = [self.node(value) for value in node[2]]
            cls = type(node[1])
            if cls is tuple:
                built = tuple(items)
            elif hasattr(cls, "_fields"):
                built = cls(*items)
            else:
                built = cls(items)
        else:
            built = copy.deepcopy(node[1], self._deepcopy_memo)
        self._built[id(node)] = built
        return built
