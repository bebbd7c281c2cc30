"""ferry.pool: the pinned host memory pool that D2H outputs live in.

One pool per process. Each part of a D2H call (a large batch is submitted in parts) takes one slab (a best-fit
range of a pinned region) for its outputs; the slab goes back to the pool when the last output viewing it is
released, and is handed out again only once the copies into it, and the work recorded on streams that use it
(``ferry.record_stream``), are known to be complete. Regions are pinned once (faulted in by several threads, then
registered with the driver) and kept until ``trim()``.

Without CUDA, ``reserve`` and ``trim`` do nothing and ``stats`` are all zero.
"""

from ._ferry import _pool_reserve, _pool_stats, _pool_trim

__all__ = ["reserve", "stats", "trim"]


def reserve(nbytes: int) -> None:
    """Ensure at least ``nbytes`` of pinned memory are free in the pool.

    Pins a new region if no free range is large enough, so that a later transfer of that size starts without
    pinning (the first transfer of a fresh 96 MiB otherwise pays the pinning, milliseconds). Raises ValueError
    for a negative size, MemoryError when the memory cannot be pinned.
    """
    _pool_reserve(nbytes)


def trim() -> None:
    """Unpin and free every pinned region that no slab uses. Slabs in use (live outputs) are untouched."""
    _pool_trim()


def stats() -> dict:
    """The pool's counters, as a new dict.

    Keys: ``bytes_pinned`` (pinned now, free or in use), ``bytes_in_use`` (held by live slabs, or by slabs whose
    copies may still run), ``bytes_peak_in_use``, ``bytes_peak_pinned``, ``regions`` (pinned regions now),
    ``pin_calls`` (regions pinned since start), ``pin_seconds`` (time spent pinning), ``hits`` (slabs served from
    pinned memory) and ``misses`` (slabs that needed a new region).
    """
    return _pool_stats()
