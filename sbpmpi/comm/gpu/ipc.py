"""The CUDA IPC protocol: run a copy schedule over the device buffers of the ranks of one node.

One call, on every rank of the node communicator:

1. ``synchronize`` the device: the work producing this rank's buffers is done.
2. Describe the buffers peers will read: the *allocation* each lies in (base, size,
   process-unique id), the offset of the data in it, and its IPC handle, exported once per
   allocation (:class:`.mappings.MappingCache`, one per process). Every rank also says
   whether it can take part (its arrays are exportable device memory), and adds its
   process token and call metadata.
3. One ``Allgather`` of these fixed-size records. It is also the first barrier: no rank
   reads a peer's buffer before the peer's step 1 is done. If any rank cannot take part,
   every rank returns False and the caller uses the MPI path instead (all agree).
4. Map the peers' allocations it reads, once per call, through the process-wide cache
   (keyed by the exporting process and the allocation; a :class:`.mappings.Lease` holds
   them for the call).
5. Run the schedule phase by phase; between phases, and after the last, ``synchronize``
   and a node barrier: no rank reads a buffer before it is written, nor overwrites (or
   frees, by returning) one that a peer still reads. At the first barrier after which this
   rank reads no peer, it releases its lease *before* meeting the others, so when a call
   returns no peer maps this rank's allocations and they may be freed (the release
   protocol: :mod:`.mappings`). The barriers are one-integer ``Allreduce(MAX)`` of an
   error flag, so a failure on one rank (a scratch buffer that cannot be allocated, a
   handle that does not open, a failing hook) raises on every rank at the next barrier,
   with every failing rank's cause, instead of hanging the others.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from ..reduce_op import ReduceOp
from .device import HANDLE_BYTES, Device
from .mappings import Lease, MappingCache
from .schedule import COPY, Schedule

__all__ = ["IpcTransport", "IpcError", "Buffer", "ROLES"]

ROLES = ("in", "out")  # the buffers a peer may read


class IpcError(RuntimeError):
    """A CUDA IPC step failed on some rank of the node."""


@dataclass(frozen=True)
class Buffer:
    """A buffer of this rank: its device pointer and size in bytes."""

    ptr: int
    nbytes: int


@functools.cache
def _record_dtype(nmeta: int) -> np.dtype:
    r = len(ROLES)
    return np.dtype([("ok", "<i8"), ("proc", "<i8"), ("id", "<i8", (r,)), ("base", "<u8", (r,)),
                     ("size", "<u8", (r,)), ("off", "<u8", (r,)),
                     ("handle", "u1", (r, HANDLE_BYTES)), ("meta", "<i8", (max(nmeta, 1),))])


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
        """The peer allocations this process maps now (empty between calls)."""
        return dict(self.mappings.mapped)

    def close_all(self) -> None:
        """Unmap every peer allocation and forget the exports (when the device changes)."""
        self.mappings.close_all()

    # -- one collective call -----------------------------------------------------------------

    def _meet(self, err: BaseException | None, lease: Lease | None) -> tuple[int, BaseException | None]:
        """Synchronize, release ``lease`` (when this rank reads no peer any more), then meet
        every rank of the node; returns (the largest error flag, this rank's error)."""
        if err is None:
            try:
                self.device.synchronize()
            except Exception as e:
                err = e
        if lease is not None:
            err = self._release(lease, err)
        flag = np.array([int(err is not None)], dtype=np.int64)
        self.comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
        return int(flag[0]), err

    def _causes(self, err: BaseException | None) -> str:
        """Collective over the node, after a barrier that reported a failure: every failing
        rank's cause."""
        mine = f"node rank {self.rank}: {type(err).__name__}: {err}" if err is not None else ""
        return "; ".join(c for c in self.comm.allgather(mine) if c)

    def _release(self, lease: Lease, err: BaseException | None) -> BaseException | None:
        try:
            lease.release()
        except Exception as e:
            err = err or e
        self.stats["closes"] += lease.closes
        lease.closes = 0
        return err

    def run(self, op: str, bufs: Mapping[str, Buffer], ok: bool,
            make_schedule: Callable[[np.ndarray], Schedule], meta: Any = (),
            dtype: np.dtype | None = None, reduce_op: ReduceOp | None = None,
            export: tuple[str, ...] = ("in",),
            hooks: Mapping[int, Callable[[Mapping[str, int], str | None], None]] | None = None,
            ) -> bool:
        """Run one collective; False (on every rank) when some rank cannot use IPC.

        ``bufs``: this rank's ``"in"`` / ``"out"`` buffers; ``ok``: this rank's arrays are
        exportable; ``meta``: int64 call metadata gathered from every rank and handed to
        ``make_schedule`` (an array of shape (ranks, len(meta))); ``export``: the roles
        the schedule reads from peers; ``hooks[n]``: called with this rank's buffer
        pointers and None after the barrier that opens phase n, before its moves (the
        inter-node leg of a hierarchical collective); once the call has failed on this
        rank or its node, called with the failure instead, so that it only tells its
        partners outside the node (and raises) rather than leave them waiting.
        """
        me, p = self.rank, self.size
        meta_arr = np.asarray(meta, dtype=np.int64).reshape(-1)
        rec_t = _record_dtype(meta_arr.size)
        rec = np.zeros(1, dtype=rec_t)
        try:
            self.device.synchronize()
        except Exception:
            ok = False
        for i, role in enumerate(ROLES):
            b = bufs.get(role)
            if not ok or role not in export or b is None or b.nbytes == 0:
                continue
            try:
                got = self.mappings.export(b.ptr)
            except Exception as e:  # tell the peers (below), who all fall back with us
                self.last_error = f"export of {role}: {type(e).__name__}: {e}"
                got = None
            if got is None:
                ok = False
                break
            a, handle, fresh = got
            self.stats["exports"] += fresh
            rec["id"][0, i], rec["base"][0, i], rec["size"][0, i] = a.id, a.base, a.size
            rec["off"][0, i] = b.ptr - a.base
            rec["handle"][0, i, :len(handle)] = np.frombuffer(handle, dtype=np.uint8)
        rec["ok"][0] = int(ok)
        rec["proc"][0] = self.mappings.token
        rec["meta"][0, :meta_arr.size] = meta_arr
        recs = np.zeros(p, dtype=rec_t)
        self.comm.Allgather([rec.view(np.uint8), MPI.BYTE], [recs.view(np.uint8), MPI.BYTE])
        if not recs["ok"].all():
            self.stats["fallbacks"] += 1
            return False
        self.stats["calls"] += 1
        sched = make_schedule(recs["meta"][:, :meta_arr.size])
        # reads_peers[n]: this rank reads a peer in phase n or later (else its lease goes)
        reads_peers = [any(mv.src != me for ph in sched.phases[n:] for mv in ph)
                       for n in range(len(sched.phases) + 1)]
        lease = Lease(self.mappings)
        err: BaseException | None = None
        local = {role: b.ptr for role, b in bufs.items()}
        keep = None
        try:  # inside the protocol: a rank that cannot allocate fails every rank at a barrier
            if sched.tmp_bytes:
                local["tmp"], keep = self.device.scratch(sched.tmp_bytes)
        except Exception as e:
            err = e
        ptrs: dict[tuple[int, str], int] = {}

        def src_ptr(k: int, role: str) -> int:
            if k == me:
                return local[role]
            hit = ptrs.get((k, role))
            if hit is None:
                i = ROLES.index(role)
                r = recs[k]
                base = lease.map(int(r["proc"]), int(r["id"][i]), bytes(r["handle"][i]))
                hit = ptrs[(k, role)] = base + int(r["off"][i])
            return hit

        causes: str | None = None  # the node's failure, agreed at a barrier, once known
        try:
            for n, phase in enumerate(sched.phases):
                if n:
                    flag, err = self._meet(err, None if reads_peers[n] else lease)
                    if flag and causes is None:
                        causes = self._causes(err)
                hook = hooks.get(n) if hooks else None
                if causes is not None or err is not None:
                    # no more moves; a hook still runs, told of the failure: its partners
                    # outside the node must not wait for it
                    if hook is not None:
                        try:
                            hook(local, causes or f"node rank {me}: {type(err).__name__}: {err}")
                        except Exception as e:
                            err = err or e
                    continue
                try:
                    if hook is not None:
                        hook(local, None)
                    for mv in phase:
                        s = src_ptr(mv.src, mv.src_buf) + mv.src_off
                        d = local[mv.dst_buf] + mv.dst_off
                        if mv.kind == COPY:
                            self.device.copy(d, s, mv.nbytes)
                        else:
                            assert dtype is not None and reduce_op is not None
                            self.device.reduce(d, s, mv.nbytes, dtype, reduce_op)
                        if mv.src != me:
                            self.stats["bytes_read"] += mv.nbytes
                except Exception as e:  # finish the protocol, then raise on every rank
                    err = e
            if sched.final_barrier:  # the same on every rank
                flag, err = self._meet(err, lease)
                if flag and causes is None:
                    causes = self._causes(err)
            elif causes is None and err is None:  # the last phase was local: this rank's
                try:                               # own work only
                    self.device.synchronize()
                except Exception as e:
                    err = e
        finally:
            self.stats["opens"] += lease.opens
            if lease.keys:  # only after a failure: release what is left (best effort)
                try:
                    self.device.synchronize()
                except Exception:
                    pass
                err = self._release(lease, err)
            del keep
        if causes is not None:  # agreed: every rank names every failing rank's cause
            raise IpcError(f"{op}: CUDA IPC failed on {causes}") from err
        if err is not None:
            raise IpcError(f"{op}: CUDA IPC failed on node rank {me}: "
                           f"{type(err).__name__}: {err}") from err
        return True
