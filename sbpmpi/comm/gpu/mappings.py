"""The process's CUDA IPC state: its exported handles and its mappings of peers' allocations.

One :class:`MappingCache` per device, so one per process (:meth:`MappingCache.of`), shared
by the transports of every group: boxing on a 2x2 mesh calls collectives on the groups
{0,1}, {2,3}, {0,2}, {1,3} and WORLD over the same pool allocations, and CUDA keeps one
mapping of a handle per process (a second ``cudaIpcOpenMemHandle`` in one context returns
the same pointer and adds a reference; each ``cudaIpcCloseMemHandle`` drops one, the last
unmaps). So the mappings belong to the process: one open and one close per allocation,
however many groups and buffers of a call read it, and one place that knows whether a
close still owes CUDA a reference. Entries are keyed by the exporting process (a token each
process puts in its records) and the allocation's process-unique buffer id (the handle
itself where the driver gives none), and are reference-counted here (CUDA's count stays
at one).

Release protocol: **a mapping lives for one collective call.** Every call maps what it
reads through a :class:`Lease`, and releases the lease after the device work that reads the
peers is done and *before* the node barrier after which no rank reads a peer any more
(:mod:`.ipc`). When a call returns, no peer maps this rank's allocations, so the exporter
may free them at any time after: CuPy's ``free_all_blocks``, its retry after an
out-of-memory error, or the pool giving a block to another array never meet a live mapping
(CUDA leaves freeing a mapped allocation undefined; in practice the peer's mapping keeps
the memory, out of reach of every process). Nothing is kept between calls, so long runs
hold no device memory for IPC.

Chosen by correctness first: the exporter cannot know when CuPy frees an allocation, and
the peers that map it may be in other groups, so a mapping kept past the call that opened
it can outlive the allocation. The price is one ``cudaIpcOpenMemHandle`` /
``cudaIpcCloseMemHandle`` pair per peer allocation and call, to be measured on a GPU. If it
is too dear, the faster protocol keeps mappings across calls under two rules: the exporter
holds a reference to every allocation it exported (so the pool cannot free it), and a
group drops both sides together in a collective release step (at a budget of exported
bytes every rank computes from the gathered records, and in a ``free_all_blocks``
wrapper that every rank calls), with the references counted per group here.

Exported handles are kept per allocation id (``cudaIpcGetMemHandle`` is cheap, but each
export is a driver call); a new allocation overlapping a kept one means that one was freed.

A close that fails (``cudaIpcCloseMemHandle`` returning an error) leaves the mapping's
reference open in CUDA. Forgotten here, it would never be closed: a later open of that
handle would only add a reference to it, and the mapping would outlive every call (and the
allocation it maps). So a mapping is forgotten only once its close succeeded: until then it
stays in the cache with no reference, the next call that reads that allocation uses it as
it is (no second reference), and its next release tries the close again.
"""

from __future__ import annotations

import secrets
import weakref
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .device import HANDLE_BYTES, Allocation, Device

__all__ = ["MappingCache", "Lease", "MappingKey", "Export", "Acquired"]


class MappingKey(NamedTuple):
    """A peer allocation, the same in every group: its exporting process and its id."""

    exporter: int  # the exporting process's token
    allocation: int | bytes  # its buffer id, or its handle where the driver gives no id


class Export(NamedTuple):
    """An allocation of this process as peers see it: where it is, its handle, and whether
    the handle was made by this call (for the counters)."""

    allocation: Allocation
    handle: bytes
    fresh: bool


class Acquired(NamedTuple):
    """A peer allocation mapped here: its base in this process, and whether it was opened
    by this call."""

    base: int
    opened: bool


def _overlap(a: Allocation, b: Allocation) -> bool:
    return a.base < b.base + b.size and b.base < a.base + a.size


@dataclass
class _Mapping:
    mapped: int  # the allocation's base in this process
    refs: int


class MappingCache:
    """Exports and mappings of one device (one process), shared by every transport.

    ``token``: this process's id in the records (nonzero, random: threads standing in for
    ranks in tests each have their own device, hence their own token).
    """

    _of: weakref.WeakKeyDictionary[Any, MappingCache] = weakref.WeakKeyDictionary()

    def __init__(self, device: Device) -> None:
        self.device = device
        self.token = secrets.randbits(62) + 1
        self.exported: dict[int, Export] = {}  # allocation id -> its export (fresh=False)
        self.mapped: dict[MappingKey, _Mapping] = {}

    @classmethod
    def of(cls, device: Device) -> MappingCache:
        """The cache of ``device`` (made on first use)."""
        hit = cls._of.get(device)
        if hit is None:
            hit = cls._of[device] = cls(device)
        return hit

    def __len__(self) -> int:
        return len(self.mapped)

    # -- export (this process's allocations) ------------------------------------------------

    def export(self, ptr: int) -> Export | None:
        """The export of the allocation holding ``ptr``, or None when it cannot be shared."""
        a = self.device.allocation(ptr)
        if a is None:
            return None
        if a.id < 0:  # no process-unique id: export every time, never keep
            return Export(a, self._handle(a), True)
        hit = self.exported.get(a.id)
        if hit is not None:
            return hit
        for bid, old in list(self.exported.items()):  # freed: its range is reused
            if _overlap(old.allocation, a):
                del self.exported[bid]
        handle = self._handle(a)
        self.exported[a.id] = Export(a, handle, False)
        return Export(a, handle, True)

    def _handle(self, a: Allocation) -> bytes:
        handle = self.device.export(a.base)
        if len(handle) > HANDLE_BYTES:
            raise ValueError(f"IPC handle of {len(handle)} bytes exceeds {HANDLE_BYTES}")
        return handle

    # -- mappings (peers' allocations) -------------------------------------------------------

    def acquire(self, key: MappingKey, handle: bytes) -> Acquired:
        """The peer allocation ``key`` mapped here, with one more reference (a mapping whose
        close failed is still open: it is used as it is)."""
        m = self.mapped.get(key)
        if m is not None:
            m.refs += 1
            return Acquired(m.mapped, False)
        m = self.mapped[key] = _Mapping(self.device.open(handle), 1)
        return Acquired(m.mapped, True)

    def release(self, key: MappingKey) -> bool:
        """Drop one reference; closes the mapping at the last (returns True then). A failed
        close raises and keeps the mapping (still open in CUDA), without a reference."""
        m = self.mapped[key]
        if m.refs <= 0:
            raise KeyError(f"{key} has no reference to release")
        m.refs -= 1
        if m.refs:
            return False
        self.device.close(m.mapped)  # raises: the mapping stays, open, for the next call
        del self.mapped[key]
        return True

    def close_all(self) -> None:
        """Close every mapping and forget the exports (when the device changes). Every
        close is tried; those that fail stay (without references), the first failure is
        raised."""
        self.exported.clear()
        first: BaseException | None = None
        for key, m in list(self.mapped.items()):
            try:
                self.device.close(m.mapped)
            except Exception as e:
                m.refs = 0
                first = first or e
                continue
            del self.mapped[key]
        if first is not None:
            raise first


@dataclass
class Lease:
    """The mappings one collective call holds; :meth:`release` drops them together."""

    cache: MappingCache
    keys: list[MappingKey] = field(default_factory=list)
    opens: int = 0
    closes: int = 0

    def map(self, exporter: int, buffer_id: int, handle: bytes) -> int:
        """The base, in this process, of the peer allocation (exporter, buffer_id)."""
        key = MappingKey(exporter, buffer_id if buffer_id >= 0 else handle)
        got = self.cache.acquire(key, handle)
        self.keys.append(key)
        self.opens += got.opened
        return got.base

    def release(self) -> None:
        """Release every mapping of the lease (all of them, even when one close fails;
        the first failure is raised after)."""
        keys, self.keys = self.keys, []
        first: BaseException | None = None
        for key in keys:
            try:
                self.closes += self.cache.release(key)
            except Exception as e:
                first = first or e
        if first is not None:
            raise first
