"""The host buffer pool: reused output memory for large conversions (NumPy only)."""

from __future__ import annotations

import mmap
import os
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from .. import config
from ..core.modes import DEFAULT_MODES, Scope, current_modes, enter, leave
from .memory import Block, BlockPool
from .node import local_ranks

__all__ = [
    "empty",
    "Reuse",
    "host_pool_limit",
    "host_pool_stats",
    "clear_host_pool",
    "map_block",
    "Block",
    "MIN_POOLED_BYTES",
]

#
# A fresh large NumPy array is fresh pages from the kernel (glibc maps allocations over its
# mmap threshold, at most 32 MiB, anew each time): every call pays page faults and zeroing,
# which costs as much as the copy itself at 64 MiB. :func:`empty` hands out large host
# arrays over blocks kept in a pool instead. Every array over a block (and every view of
# one) has one ``_Lease`` object as its NumPy base; only when the last of them is gone
# does the lease die and its block go back to the pool. So a block is never handed to a
# second array while any array over it is alive. The pool keeps at most
# ``host_pool_limit()`` idle bytes (least recently returned size classes go first; the
# setting :data:`sbpmpi.config.host_pool_bytes`); CuPy keeps its own device pool.

#: Arrays smaller than this come from ``np.empty`` (malloc reuses its heap for them); a
#: test lowers it to send every array through the pool.
MIN_POOLED_BYTES = 1 << 20


def _default_limit() -> int:
    """An eighth of the machine's memory shared by its ranks, at least 64 MiB."""
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        phys = 8 << 30
    try:
        local = max(1, local_ranks().size)
    except RuntimeError:
        local = 1
    return max(64 << 20, phys // 8 // local)


def _size_class(nbytes: int) -> int:
    """Bytes of the block that serves ``nbytes``: rounded up to 1/16 of its power of two
    (at most 6.25% more), so sizes that differ a little share blocks."""
    step = max(4096, 1 << max(0, nbytes.bit_length() - 5))
    return -(-nbytes // step) * step


_HUGE_PAGE = 2 << 20


def map_block(size: int) -> Block:
    """``size`` bytes of fresh memory of its own, from ``mmap``, and their address.

    Not from ``np.empty``: once glibc has freed a large mapping it raises its mmap
    threshold (up to 32 MiB) and serves blocks of that size from the heap, where they
    start anywhere and are only partly backed by huge pages, so a conversion in a loop
    touches fresh small pages on every call. Blocks of their own bring a conversion in a
    loop back to the raw MPI call's time (docs/benchmarks.md, "The host buffer pool").

    A block of 2 MiB or more starts on a 2 MiB boundary and its whole 2 MiB pages are
    marked for transparent huge pages (where the system has them); the rest keeps
    ordinary pages, so no block holds more memory than it uses. A dropped block goes
    back to the system at once. The pool maps every block through this name: a test
    may replace it (to see the pool under memory pressure, say).
    """
    huge = size // _HUGE_PAGE * _HUGE_PAGE  # bytes in whole huge pages
    length = size + (_HUGE_PAGE if huge else 0)  # room to start on a huge-page boundary
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    # private: an anonymous mapping is shared memory by default, which THP leaves alone
    mm = mmap.mmap(-1, length, flags=private) if private else mmap.mmap(-1, length)
    whole = np.frombuffer(mm, dtype=np.uint8)
    base = whole.__array_interface__["data"][0]
    skip = -base % _HUGE_PAGE if huge else 0
    if huge and hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE, skip, huge)
        except OSError:  # THP not configured: ordinary pages
            pass
    return Block(base + skip, whole[skip:skip + size])


def _new_block(size: int) -> Block:
    """A block of ``size`` bytes for the host pool (its idle blocks are freed first if
    memory is short)."""
    try:
        return map_block(size)
    except (MemoryError, OSError):  # idle blocks are the first thing to give up
        _HOST_POOL.clear()
        try:
            return map_block(size)
        except OSError as e:
            raise MemoryError(f"cannot map a host buffer of {size} bytes: {e}") from e


def _read_limit() -> int:
    value = config.host_pool_bytes.value
    return _default_limit() if value is None else value


#: The idle blocks; a block goes back when the last array over it is garbage (``_Lease``).
_HOST_POOL: BlockPool[Block] = BlockPool(_new_block, _size_class,
                                         lambda b: int(b.memory.size), read_limit=_read_limit)


class _Lease:
    """The NumPy base of every array over one pooled block; returns the block when it dies."""

    __slots__ = ("entry", "__array_interface__")
    entry: Block
    __array_interface__: dict[str, Any]

    def __del__(self) -> None:
        try:  # runs once per pooled array
            _HOST_POOL.release(self.entry)
        except Exception:  # interpreter shutdown: module state may already be gone
            pass


class _Spec(NamedTuple):
    """What :func:`empty` needs of a request (shape, dtype), parsed once per pair."""

    nbytes: int
    size_class: int  # bytes of the block that serves it (_size_class)
    shape: tuple[int, ...]
    typestr: str  # the dtype's, or "|u1" for a structured or sub-array dtype
    plain: bool  # a plain number type: the block is viewed as the dtype in one step


# (shape, dtype) -> its _Spec, or None for dtypes never pooled
_SPECS: dict[tuple[Any, Any], _Spec | None] = {}


def _spec(shape: Any, dtype: Any) -> _Spec | None:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dt = np.dtype(dtype)
    if dt.hasobject:
        return None
    n = dt.itemsize
    for s in shape:
        n *= s
    plain = dt.fields is None and dt.subdtype is None
    return _Spec(n, _size_class(n), shape, dt.str if plain else "|u1", plain)


def empty(xp: ModuleType, shape: int | tuple[int, ...], dtype: Any) -> Any:
    """``xp.empty(shape, dtype)`` (C order); large NumPy arrays over reused pooled memory.

    The memory is handed out again only after every array over it (views included) is
    garbage: it is never shared by two live arrays. The setting ``host_pool_bytes``
    (``SBPMPI_HOST_POOL_BYTES``; ``0``: off) caps the idle memory the pool keeps.
    """
    modes = current_modes()  # per thread: another thread's arrays are its own
    if modes is not DEFAULT_MODES and modes.reuse is not None:
        return modes.reuse.empty(xp, shape, dtype)  # a captured graph's conversion
    return _empty(xp, shape, dtype)


class Reuse:
    """The arrays :func:`empty` made during one run of a recorded call, handed out again
    in the same order by its later runs (a captured graph's conversions, see
    :mod:`sbpmpi.capture.replay`): a run of the same program on arrays of the same
    shapes asks for the same arrays in the same order, so its steady state makes none.

    The arrays are kept by this object (never returned to the pool), so a later run
    overwrites what the earlier one left in them: its user must not need them then.
    A request of another shape or dtype than recorded gets a new array.
    """

    __slots__ = ("arrays", "recorded", "pos", "scope")

    def __init__(self) -> None:
        self.arrays: list[Any] = []
        self.recorded = False
        self.pos = 0
        self.scope: Scope | None = None  # while entered: the ``reuse`` field of the modes

    def empty(self, xp: ModuleType, shape: int | tuple[int, ...], dtype: Any) -> Any:
        if not self.recorded:
            a = _empty(xp, shape, dtype)
            self.arrays.append(a)
            return a
        i = self.pos
        self.pos = i + 1
        if i < len(self.arrays):
            a = self.arrays[i]
            shp = (shape,) if isinstance(shape, int) else tuple(shape)
            if a.shape == shp and a.dtype == dtype and isinstance(a, np.ndarray) == (xp is np):
                return a
        return _empty(xp, shape, dtype)

    def __enter__(self) -> Reuse:
        self.scope = enter("reuse", self)
        self.pos = 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.scope is not None:
            leave(self.scope)
            self.scope = None
        self.recorded = True


def _empty(xp: ModuleType, shape: int | tuple[int, ...], dtype: Any) -> Any:
    if xp is not np:
        return xp.empty(shape, dtype=dtype)
    try:
        spec = _SPECS[shape, dtype]
    except KeyError:
        spec = _spec(shape, dtype)
        if len(_SPECS) > 1024:
            _SPECS.clear()
        _SPECS[shape, dtype] = spec
    except TypeError:  # an unhashable shape (a list)
        spec = _spec(shape, dtype)
    pool = _HOST_POOL
    if spec is None or spec.nbytes < MIN_POOLED_BYTES or not (pool.limit or pool.get_limit()):
        return np.empty(shape, dtype=dtype)
    entry = pool.take(spec.size_class)
    lease = _Lease()
    lease.entry = entry
    if spec.plain:  # one step
        lease.__array_interface__ = {"data": (entry.address, False), "shape": spec.shape,
                                     "typestr": spec.typestr, "version": 3}
        return np.asarray(lease)
    lease.__array_interface__ = {"data": (entry.address, False), "shape": (spec.nbytes,),
                                 "typestr": "|u1", "version": 3}
    return np.asarray(lease).view(dtype).reshape(spec.shape)


def host_pool_limit() -> int:
    """Most idle bytes the host pool keeps (0: the pool is off)."""
    return _HOST_POOL.get_limit()


def _follow_setting(_: object) -> None:
    """The setting ``host_pool_bytes`` changed: idle blocks over the new limit are freed."""
    _HOST_POOL.forget_limit()


config.on_update("host_pool_bytes", _follow_setting)


def host_pool_stats() -> dict[str, int]:
    """The host pool's counters: idle bytes and blocks, limit, hits, misses, dropped blocks."""
    pool = _HOST_POOL
    with pool.lock:
        return {"idle_bytes": pool.idle, "idle_blocks": pool.idle_blocks(),
                "limit": pool.get_limit(), "hits": pool.reuses, "misses": pool.allocations,
                "dropped": pool.dropped}


def clear_host_pool() -> None:
    """Free every idle block of the host pool (arrays in use keep theirs)."""
    _HOST_POOL.clear()
