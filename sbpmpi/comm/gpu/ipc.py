"""The CUDA IPC protocol: run a copy schedule over the device buffers of the ranks of one node.

A call has two parts, with the group's decision between them.

Before the decision, on each rank alone (:func:`make_offer`):

1. ``synchronize`` the device: the work producing this rank's buffers, on any stream, is
   done.
2. Describe the buffers peers may read: the *allocation* each lies in (base, size,
   process-unique id), the offset of the data in it, and its IPC handle, exported once per
   allocation (:class:`.mappings.MappingCache`, one per process). A rank whose arrays
   cannot be exported (host memory, stream-ordered or managed memory, a failing export)
   makes an offer that is not ready, and says why.

The group then agrees, in one small exchange over all its ranks (:mod:`.route`), whether
every rank is ready. Only then does any rank call :meth:`IpcTransport.run`, so a rank that
cannot take the IPC path makes the whole group fall back before anyone enters a phase, on
one node or across nodes alike.

On every rank of the node (:meth:`IpcTransport.run`, one :class:`_Call`):

3. One ``Allgather`` of fixed-size records (the offer, this process's token, call
   metadata). It is also the first barrier: no rank reads a peer's buffer before the
   peer's step 1 is done.
4. Map the peers' allocations it reads, once per call, through the process-wide cache
   (keyed by the exporting process and the allocation; a :class:`.mappings.Lease` holds
   them for the call).
5. Run the schedule phase by phase; between phases, and after the last, ``synchronize``
   and a node barrier: no rank reads a buffer before it is written, nor overwrites (or
   frees, by returning) one that a peer still reads, and a failure in any phase, the
   last included, raises on every rank. At the first barrier after which this
   rank reads no peer, it releases its lease *before* meeting the others, so when a call
   returns no peer maps this rank's allocations and they may be freed (the release
   protocol: :mod:`.mappings`).

The barriers are one small ``Allreduce(MAX)`` of an error flag and of the number of
barriers this rank's schedule holds, so that a failure on one rank (a scratch buffer that
cannot be allocated, a handle that does not open, a failing hook) raises on every rank at
the next barrier, with every failing rank's cause, instead of hanging the others; and a
schedule whose phase count differs between ranks (a bug: :mod:`.schedule` builds them
equal) raises on every rank at the first barrier instead of leaving ranks at different
barriers.

The error path keeps the order of the good one: before every barrier, and before a
mapping is closed, the device is synchronised, failure or not, so that no copy out of a
peer's mapping is still in flight when the mapping closes or when the barrier lets the
peer free the buffer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from ..reduce_op import ReduceOp
from .device import HANDLE_BYTES, Device
from .mappings import Export, Lease, MappingCache
from .schedule import COPY, Move, Schedule

__all__ = ["IpcTransport", "IpcError", "Buffer", "Offer", "ROLES", "make_offer",
           "reads_peers_from", "Hook"]

ROLES = ("in", "out")  # the buffers a peer may read

# hooks[n](this rank's buffer pointers, the node's failure or None): the inter-node leg
Hook = Callable[[Mapping[str, int], "str | None"], None]


class IpcError(RuntimeError):
    """A CUDA IPC step failed on some rank of the node."""


@dataclass(frozen=True)
class Buffer:
    """A buffer of this rank: its device pointer and size in bytes."""

    ptr: int
    nbytes: int


class Offer(NamedTuple):
    """This rank's part of one call, made before the group decides: its buffers, the exports
    of those peers may read, and whether it can take the IPC path (``reason``: why not)."""

    bufs: Mapping[str, Buffer]
    exports: Mapping[str, Export]
    ready: bool
    reason: str = ""


def make_offer(device: Device, bufs: Mapping[str, Buffer], roles: Sequence[str],
               ready: bool = True) -> Offer:
    """Steps 1 and 2, local: synchronize, then export the buffers of ``roles`` (those peers
    may read). ``ready=False`` (this rank's arrays are not the device's): nothing is done.
    Never raises: a failure makes an offer that is not ready."""
    if not ready:
        return Offer(bufs, {}, False, "its arrays are not exportable device arrays")
    try:
        device.synchronize()
    except Exception as e:
        return Offer(bufs, {}, False, f"synchronize: {type(e).__name__}: {e}")
    cache = MappingCache.of(device)
    exports: dict[str, Export] = {}
    for role in roles:
        b = bufs.get(role)
        if b is None or b.nbytes == 0:
            continue
        try:
            got = cache.export(b.ptr)
        except Exception as e:
            return Offer(bufs, {}, False, f"export of {role}: {type(e).__name__}: {e}")
        if got is None:
            return Offer(bufs, {}, False, f"its {role} buffer lies in memory that CUDA IPC "
                                          "cannot share")
        exports[role] = got
    return Offer(bufs, exports, True)


@functools.cache
def _record_dtype(nmeta: int) -> np.dtype:
    r = len(ROLES)
    return np.dtype([("ok", "<i8"), ("proc", "<i8"), ("id", "<i8", (r,)), ("base", "<u8", (r,)),
                     ("size", "<u8", (r,)), ("off", "<u8", (r,)),
                     ("handle", "u1", (r, HANDLE_BYTES)), ("meta", "<i8", (max(nmeta, 1),))])


def _record(offer: Offer, token: int, meta: np.ndarray) -> np.ndarray:
    """This rank's record of step 3 (one element of :func:`_record_dtype`)."""
    rec = np.zeros(1, dtype=_record_dtype(meta.size))
    for i, role in enumerate(ROLES):
        e = offer.exports.get(role)
        if e is None:
            continue
        b = offer.bufs[role]
        a = e.allocation
        rec["id"][0, i], rec["base"][0, i], rec["size"][0, i] = a.id, a.base, a.size
        rec["off"][0, i] = b.ptr - a.base
        rec["handle"][0, i, :len(e.handle)] = np.frombuffer(e.handle, dtype=np.uint8)
    rec["ok"][0] = int(offer.ready)
    rec["proc"][0] = token
    rec["meta"][0, :meta.size] = meta
    return rec


def reads_peers_from(sched: Schedule, me: int) -> list[bool]:
    """``[n]``: rank ``me`` reads a peer's buffer in phase ``n`` or later (``n`` up to the
    number of phases; the last entry is False). Its lease is released at the first barrier
    where this turns False."""
    return [any(mv.src != me for ph in sched.phases[n:] for mv in ph)
            for n in range(len(sched.phases) + 1)]


class BufferKey(NamedTuple):
    """A buffer some move reads: the rank (in the node) that owns it, and its role."""

    rank: int
    role: str


class Sources:
    """Where this rank's moves read: its own buffers, or peers' buffers mapped through the
    call's lease (each peer allocation mapped once per call)."""

    def __init__(self, me: int, local: Mapping[str, int], recs: np.ndarray, lease: Lease) -> None:
        self.me, self.local, self.recs, self.lease = me, local, recs, lease
        self._mapped: dict[BufferKey, int] = {}

    def pointer(self, rank: int, role: str) -> int:
        """The address, in this process, of buffer ``role`` of node rank ``rank``."""
        if rank == self.me:
            return self.local[role]
        key = BufferKey(rank, role)
        hit = self._mapped.get(key)
        if hit is None:
            i = ROLES.index(role)
            r = self.recs[rank]
            base = self.lease.map(int(r["proc"]), int(r["id"][i]), bytes(r["handle"][i]))
            hit = self._mapped[key] = base + int(r["off"][i])
        return hit


class Meeting(NamedTuple):
    """What one node barrier told this rank."""

    failed: bool  # some rank of the node reported a failure
    same_plan: bool  # every rank's schedule holds the same number of barriers


@dataclass
class IpcTransport:
    """The IPC protocol over ``comm`` (all its ranks on one node) with ``device``.

    ``mappings``: the process's exports and mappings (the device's
    :class:`.mappings.MappingCache` unless given), shared with every other transport.
    """

    device: Device
    comm: MPI.Comm
    mappings: MappingCache = None  # type: ignore[assignment]  # set in __post_init__
    stats: dict[str, int] = field(default_factory=lambda: {
        "calls": 0, "fallbacks": 0, "exports": 0, "opens": 0, "closes": 0, "bytes_read": 0})
    last_error: str = ""

    def __post_init__(self) -> None:
        if self.mappings is None:
            self.mappings = MappingCache.of(self.device)

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    @property
    def mapped(self) -> dict[Any, Any]:
        """The peer allocations this process maps now (empty between calls, unless a close
        failed: see :mod:`.mappings`)."""
        return dict(self.mappings.mapped)

    def close_all(self) -> None:
        """Unmap every peer allocation and forget the exports (when the device changes)."""
        self.mappings.close_all()

    def run(self, op: str, offer: Offer, make_schedule: Callable[[np.ndarray], Schedule],
            meta: Any = (), dtype: np.dtype | None = None, reduce_op: ReduceOp | None = None,
            hooks: Mapping[int, Hook] | None = None) -> bool:
        """Run one collective from this rank's ``offer``; False (on every rank) when some
        rank's offer is not ready (the group's decision normally came first: see
        :mod:`.route`).

        ``meta``: int64 call metadata gathered from every rank and handed to
        ``make_schedule`` (an array of shape (ranks, len(meta))), which may raise: it sees
        the same array on every rank, so every rank raises alike, before any move (the
        ranks' arguments disagree: all-to-all-v's counts); ``hooks[n]``: called with
        this rank's buffer pointers and None after the barrier that opens phase n, before
        its moves (the inter-node leg of a hierarchical collective); once the call has
        failed on this rank or its node, called with the failure instead, so that it only
        tells its partners outside the node (and raises) rather than leave them waiting.
        """
        meta_arr = np.asarray(meta, dtype=np.int64).reshape(-1)
        recs = self._gather_records(offer, meta_arr)
        if not recs["ok"].all():
            self.stats["fallbacks"] += 1
            if not offer.ready:
                self.last_error = offer.reason
            return False
        self.stats["exports"] += sum(e.fresh for e in offer.exports.values())
        sched = make_schedule(recs["meta"][:, :meta_arr.size])
        self.stats["calls"] += 1
        _Call(self, op, offer, recs, sched, dtype=dtype, reduce_op=reduce_op,
              hooks=hooks or {}).execute()
        return True

    def _gather_records(self, offer: Offer, meta: np.ndarray) -> np.ndarray:
        """Step 3: every rank's record, in node rank order (the first barrier)."""
        rec = _record(offer, self.mappings.token, meta)
        recs = np.zeros(self.size, dtype=rec.dtype)
        self.comm.Allgather([rec.view(np.uint8), MPI.BYTE], [recs.view(np.uint8), MPI.BYTE])
        return recs


class _Call:
    """One collective call of :meth:`IpcTransport.run` on this rank, after the records:
    the phases, the barriers between them, and the error path."""

    def __init__(self, t: IpcTransport, op: str, offer: Offer, recs: np.ndarray,
                 sched: Schedule, *, dtype: np.dtype | None, reduce_op: ReduceOp | None,
                 hooks: Mapping[int, Hook]) -> None:
        self.t, self.dev, self.op, self.sched = t, t.device, op, sched
        self.me = t.rank
        self.dtype, self.reduce_op, self.hooks = dtype, reduce_op, hooks
        self.local = {role: b.ptr for role, b in offer.bufs.items()}
        self.lease = Lease(t.mappings)
        self.sources = Sources(self.me, self.local, recs, self.lease)
        self.reads_peers = reads_peers_from(sched, self.me)
        self.err: BaseException | None = None  # this rank's first failure
        self.causes: str | None = None  # the node's failure, agreed at a barrier
        self.plan_error: str | None = None  # the ranks' schedules disagree (a bug)
        self.keep: Any = None  # the scratch buffer, alive for the call

    # -- the call -------------------------------------------------------------------------------

    def execute(self) -> None:
        """Allocate scratch, run every phase with its barriers, clean up; raise on every
        rank of the node when any failed."""
        try:
            self._scratch()
            for n, phase in enumerate(self.sched.phases):
                if n:
                    self.meet(release=not self.reads_peers[n])
                    if self.plan_error:
                        break  # every rank stops at this barrier
                self.run_phase(n, phase)
            else:
                self.finish()
        finally:
            self.cleanup()
        self.raise_if_failed()

    def finish(self) -> None:
        """After the last phase: the final barrier, the same on every rank, even where the
        last phase reads no peer (all-reduce's local copy back), so that a failure there
        raises on every rank too."""
        self.meet(release=True)

    def _scratch(self) -> None:
        # inside the protocol: a rank that cannot allocate fails every rank at a barrier
        if not self.sched.tmp_bytes:
            return
        try:
            s = self.dev.scratch(self.sched.tmp_bytes)
            self.local["tmp"], self.keep = s.address, s.memory
        except Exception as e:
            self.err = e

    def settle(self) -> None:
        """Wait for this rank's queued device work (after a failure too: copies out of peer
        mappings must complete before any mapping closes or any barrier is met); a failing
        synchronize becomes this rank's error."""
        try:
            self.dev.synchronize()
        except Exception as e:
            self.err = self.err or e

    def release(self) -> None:
        """Close this call's mappings (after :meth:`settle`); a failed close is this rank's
        error (the cache remembers the mapping: :mod:`.mappings`)."""
        try:
            self.lease.release()
        except Exception as e:
            self.err = self.err or e
        self.t.stats["closes"] += self.lease.closes
        self.lease.closes = 0

    def meet(self, release: bool) -> Meeting:
        """Settle, release the lease (when this rank reads no peer any more), then meet every
        rank of the node; the first failure it reports is named on every rank."""
        self.settle()
        if release:
            self.release()
        n = self.sched.barriers()
        flag = np.array([int(self.err is not None), n, -n], dtype=np.int64)
        self.t.comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
        got = Meeting(bool(flag[0]), int(flag[1]) == -int(flag[2]))
        if not got.same_plan and self.plan_error is None:
            self.plan_error = (f"the ranks' schedules hold from {-int(flag[2])} to "
                               f"{int(flag[1])} barriers (a bug of the schedule)")
        elif got.failed and self.causes is None:
            self.causes = self._node_causes()
        return got

    def _node_causes(self) -> str:
        """Collective over the node, after a barrier that reported a failure: every failing
        rank's cause."""
        err = self.err
        mine = f"node rank {self.me}: {type(err).__name__}: {err}" if err is not None else ""
        return "; ".join(c for c in self.t.comm.allgather(mine) if c)

    def run_phase(self, n: int, phase: Sequence[Move]) -> None:
        """Phase ``n``: its hook, then its moves (none once the call has failed: the hook is
        told of the failure instead)."""
        hook = self.hooks.get(n)
        if self.causes is not None or self.err is not None:
            if hook is not None:  # its partners outside the node must not wait for it
                try:
                    hook(self.local, self.causes or
                         f"node rank {self.me}: {type(self.err).__name__}: {self.err}")
                except Exception as e:
                    self.err = self.err or e
            return
        try:
            if hook is not None:
                hook(self.local, None)
            for mv in phase:
                self._move(mv)
        except Exception as e:  # finish the protocol, then raise on every rank
            self.err = e

    def _move(self, mv: Move) -> None:
        s = self.sources.pointer(mv.src, mv.src_buf) + mv.src_off
        d = self.local[mv.dst_buf] + mv.dst_off
        if mv.kind == COPY:
            self.dev.copy(d, s, mv.nbytes)
        else:
            assert self.dtype is not None and self.reduce_op is not None
            self.dev.reduce(d, s, mv.nbytes, self.dtype, self.reduce_op)
        if mv.src != self.me:
            self.t.stats["bytes_read"] += mv.nbytes

    def cleanup(self) -> None:
        """Count the opens; after a failure, release what the lease still holds (settled
        first); free the scratch buffer."""
        self.t.stats["opens"] += self.lease.opens
        self.lease.opens = 0
        if self.lease.keys:
            self.settle()
            self.release()
        self.keep = None

    def raise_if_failed(self) -> None:
        if self.plan_error is not None:
            raise IpcError(f"{self.op}: CUDA IPC stopped at its first barrier: "
                           f"{self.plan_error}") from self.err
        if self.causes is not None:  # agreed: every rank names every failing rank's cause
            raise IpcError(f"{self.op}: CUDA IPC failed on {self.causes}") from self.err
        if self.err is not None:
            raise IpcError(f"{self.op}: CUDA IPC failed on node rank {self.me}: "
                           f"{type(self.err).__name__}: {self.err}") from self.err
