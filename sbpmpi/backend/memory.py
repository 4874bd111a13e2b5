"""Memory reuse: one type per meaning, for every layer above.

- :class:`Scratch`: temporaries by (array module, shape, dtype, number), made once and
  handed out again (a captured graph's kernels, an optimizer's update), or new each time
  (:data:`FRESH`, the eager kernels').
- :class:`Block`: memory of its own, known by the address of its first byte (a host
  pool's block, a GPU transport's device scratch buffer).
- :class:`BlockPool`: idle blocks by size class, handed out again (the host pool behind
  ``backend.empty``, the pinned staging buffers of GPU transfers).

The fourth kind of reuse, the arrays of one recorded run handed out again in order to its
later runs (a captured graph's conversions), is :class:`sbpmpi.backend.host_pool.Reuse`,
beside the ``empty`` it serves.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from types import ModuleType
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

__all__ = ["Scratch", "Temporaries", "FRESH", "Block", "BlockPool"]

#: The temporary number of :meth:`Scratch.scalars`' 0-d array (a kernel's are 0 and up).
_SCALAR = -1


class Temporaries(NamedTuple):
    """Temporaries of one shape and dtype (:meth:`Scratch.temporaries`)."""

    arrays: tuple[Any, ...]  #: uninitialised arrays, numbers 0, 1, ...
    scalar: Callable[[float], Any]  #: :meth:`Scratch.scalars` of the dtype


class Scratch:
    """Where a computation takes its temporaries.

    ``keep=False`` (:data:`FRESH`, the eager kernels'): a new array each time. ``keep=True``
    (a replay's, one per plan, shared by all its kernels; an optimizer's, shared by its
    parameters): the array of the same module, shape, dtype and number ``k`` made the
    first time, again; safe because a temporary dies when its user returns (the result
    is written into ``out``, never a temporary) and one user runs at a time. ``k`` tells
    apart the temporaries of one shape and dtype that a user needs at once. ``limit``:
    most arrays kept (all are dropped before one more is made: users of many shapes came
    and went); None keeps every one.
    """

    __slots__ = ("keep", "limit", "arrays", "sets")

    def __init__(self, keep: bool = True, limit: int | None = None) -> None:
        self.keep = keep
        self.limit = limit
        self.arrays: dict[tuple[str, tuple[int, ...], Any, int], Any] = {}
        #: the :meth:`temporaries` handed out, by (module, shape, dtype, count)
        self.sets: dict[tuple[str, tuple[int, ...], Any, int], Temporaries] = {}

    def get(self, xp: ModuleType, shape: tuple[int, ...], dtype: Any, k: int = 0) -> Any:
        """An uninitialised array of ``shape`` and ``dtype`` (temporary number ``k``)."""
        if not self.keep:
            return xp.empty(shape, dtype=dtype)
        key = (xp.__name__, shape, dtype, k)  # as given: no conversion per call
        a = self.arrays.get(key)
        if a is None:
            if self.limit is not None and len(self.arrays) >= self.limit:
                self.arrays.clear()
                self.sets.clear()
            a = self.arrays[key] = xp.empty(shape, dtype=dtype)
        return a

    def scalars(self, xp: ModuleType, dtype: Any) -> Callable[[float], Any]:
        """A function of a Python number giving it as the scalar operand of the next
        ``xp`` ufunc call on arrays of ``dtype`` (used by that call before the next one):
        on NumPy a kept 0-d array of ``dtype`` holding it, as a Python scalar is made into
        a new 0-d array by every call (the same value: NEP 50 casts the scalar to the
        array's dtype); CuPy passes a Python scalar to its kernel as it is, so it stays
        one."""
        if xp is not np:
            return _as_is
        return functools.partial(_holding, self.get(xp, (), dtype, _SCALAR))

    def temporaries(self, xp: ModuleType, shape: tuple[int, ...], dtype: Any,
                    count: int) -> Temporaries:
        """Temporaries number 0 to ``count - 1`` of ``shape`` and ``dtype`` (those
        :meth:`get` gives) and :meth:`scalars` of ``dtype``, looked up at once: a user
        that runs often on the same shapes (an optimizer's update of each parameter
        shard) pays one lookup a run."""
        key = (xp.__name__, shape, dtype, count)
        t = self.sets.get(key)  # always empty when not kept
        if t is not None:
            return t
        t = Temporaries(tuple(self.get(xp, shape, dtype, k) for k in range(count)),
                        self.scalars(xp, dtype))
        if self.keep:
            self.sets[key] = t
        return t

    @property
    def nbytes(self) -> int:
        """Bytes held for later calls."""
        return sum(int(a.nbytes) for a in self.arrays.values())


def _as_is(value: float) -> float:
    return value


def _holding(z: Any, value: float) -> Any:
    """The 0-d array ``z`` holding ``value``."""
    z[()] = value
    return z


#: New temporaries each call: what an eager kernel written as its ``into`` form uses.
FRESH = Scratch(keep=False)


class Block(NamedTuple):
    """Memory of its own: the address of its first byte, and its bytes (a ``uint8`` NumPy
    or CuPy array, which keeps the memory alive)."""

    address: int
    memory: Any


B = TypeVar("B")

#: A :class:`BlockPool` with no limit on its idle bytes.
NO_LIMIT = sys.maxsize


class BlockPool(Generic[B]):
    """Idle blocks of memory by size class, handed out again.

    :meth:`acquire` takes an idle block of the request's size class (``size_class(nbytes)``
    bytes, the most recently returned first) or makes one with ``new(size)``;
    :meth:`release` gives a block back (``size_of(block)`` its size class). The pool keeps
    at most ``per_size`` idle blocks of one size class (None: any number) and at most
    ``limit`` idle bytes in all: over it, the least recently returned size classes go
    first, and a block larger than the limit is dropped. ``read_limit`` gives the limit
    the first time it is needed and after :meth:`forget_limit` (None: no limit); a limit
    of 0 keeps nothing. Thread-safe: a block may come back from anywhere (a garbage
    collected array's base).

    Counters: ``reuses`` (requests served by an idle block), ``allocations`` (blocks
    made), ``bytes_allocated`` (their bytes), ``dropped`` (blocks not kept).
    """

    def __init__(self, new: Callable[[int], B], size_class: Callable[[int], int],
                 size_of: Callable[[B], int], per_size: int | None = None,
                 read_limit: Callable[[], int] | None = None) -> None:
        self.new = new
        self.size_class = size_class
        self.size_of = size_of
        self.per_size = per_size
        self.read_limit = read_limit
        self.lock = threading.RLock()
        self.free: OrderedDict[int, list[B]] = OrderedDict()
        self.idle = 0  #: bytes of the idle blocks
        self.limit: int | None = None  # from read_limit, on first use
        self.reuses = self.allocations = self.bytes_allocated = self.dropped = 0

    def get_limit(self) -> int:
        """Most idle bytes kept (read once, see the class docstring)."""
        if self.limit is None:
            self.limit = NO_LIMIT if self.read_limit is None else self.read_limit()
        return self.limit

    def forget_limit(self) -> None:
        """Read the limit again when next needed; idle blocks over it are freed then."""
        with self.lock:
            self.limit = None
            if self.idle > self.get_limit():
                self.clear()

    def acquire(self, nbytes: int) -> B:
        """A block of at least ``nbytes`` (its size class)."""
        return self.take(self.size_class(nbytes))

    def take(self, size: int) -> B:
        """A block of size class ``size``: an idle one, else a new one."""
        with self.lock:
            blocks = self.free.get(size)
            if blocks:
                self.idle -= size
                self.reuses += 1
                return blocks.pop()
            self.allocations += 1
            self.bytes_allocated += size
        return self.new(size)

    def release(self, block: B) -> None:
        """Keep ``block`` for a later request of its size class (dropped when over the
        pool's limits)."""
        size = self.size_of(block)
        with self.lock:
            limit = self.limit if self.limit is not None else self.get_limit()
            blocks = self.free.get(size)
            if size > limit or (blocks is not None and self.per_size is not None
                                and len(blocks) >= self.per_size):
                self.dropped += 1
                return
            if blocks is None:
                blocks = self.free[size] = []
            else:
                self.free.move_to_end(size)
            blocks.append(block)
            self.idle += size
            if self.idle > limit:
                self.trim(limit)

    def trim(self, limit: int) -> None:
        """Drop idle blocks, least recently returned size classes first, down to ``limit``."""
        with self.lock:
            while self.idle > limit:
                size, blocks = next(iter(self.free.items()))
                blocks.pop(0)
                self.idle -= size
                self.dropped += 1
                if not blocks:
                    del self.free[size]

    def cached_bytes(self) -> int:
        """Bytes of the idle blocks."""
        return self.idle

    def idle_blocks(self) -> int:
        """Number of idle blocks."""
        with self.lock:
            return sum(len(b) for b in self.free.values())

    def clear(self) -> None:
        """Drop every idle block (blocks in use come back later as usual)."""
        with self.lock:
            self.free.clear()
            self.idle = 0
