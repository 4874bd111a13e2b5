"""The CUDA IPC protocol: run a copy schedule over the device buffers of the ranks of one node.

One call, on every rank of the node communicator:

1. ``synchronize`` the device: the work producing this rank's buffers is done.
2. Describe the buffers peers will read: the *allocation* each lies in (base, size,
   process-unique id), the offset of the data in it, and its IPC handle, exported once per
   allocation and cached (:attr:`IpcTransport.exported`). Every rank also says whether it
   can take part (its arrays are exportable device memory), and adds call metadata.
3. One ``Allgather`` of these fixed-size records. It is also the first barrier: no rank
   reads a peer's buffer before the peer's step 1 is done. If any rank cannot take part,
   every rank returns False and the caller uses the MPI path instead (all agree).
4. Map the peers' allocations it reads, once: the mapping is cached by (peer, allocation id)
   (:attr:`IpcTransport.mapped`). A new allocation of a peer whose address range overlaps a
   cached one means that one was freed: its mapping is closed first.
5. Run the schedule phase by phase; between phases, and after the last, ``synchronize``
   and a node barrier: no rank reads a buffer before it is written, nor overwrites (or
   frees, by returning) one that a peer still reads. The barriers are one-integer
   ``Allreduce(MAX)`` of an error flag, so a failure on one rank (a handle that does not
   open) raises on every rank at the next barrier instead of hanging the others.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from ..reduce_op import ReduceOp
from .device import HANDLE_BYTES, Allocation, Device
from .schedule import COPY, Schedule

__all__ = ["IpcTransport", "IpcError", "Buffer", "ROLES", "MAX_MAPPINGS"]

ROLES = ("in", "out")  # the buffers a peer may read
MAX_MAPPINGS = 256  # per transport; the least recently used mapping is closed beyond it


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
    return np.dtype([("ok", "<i8"), ("id", "<i8", (r,)), ("base", "<u8", (r,)),
                     ("size", "<u8", (r,)), ("off", "<u8", (r,)),
                     ("handle", "u1", (r, HANDLE_BYTES)), ("meta", "<i8", (max(nmeta, 1),))])


@dataclass
class _Mapping:
    peer_base: int
    size: int
    mapped: int


@dataclass
class IpcTransport:
    """The IPC protocol over ``comm`` (all its ranks on one node) with ``device``."""

    device: Device
    comm: MPI.Comm
    exported: dict[int, tuple[Allocation, bytes]] = field(default_factory=dict)
    mapped: dict[tuple[int, int | bytes], _Mapping] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=lambda: {
        "calls": 0, "fallbacks": 0, "exports": 0, "opens": 0, "closes": 0, "bytes_read": 0})
    last_error: str = ""

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    # -- export (this rank's allocations) ---------------------------------------------------

    def _export(self, ptr: int) -> tuple[Allocation, bytes] | None:
        a = self.device.allocation(ptr)
        if a is None:
            return None
        if a.id < 0:  # no process-unique id: export every time, never cache
            self.stats["exports"] += 1
            return a, self.device.export(a.base)
        hit = self.exported.get(a.id)
        if hit is not None:
            return hit
        for bid, (old, _) in list(self.exported.items()):  # freed: its range is reused
            if old.base < a.base + a.size and a.base < old.base + old.size:
                del self.exported[bid]
        handle = self.device.export(a.base)
        if len(handle) > HANDLE_BYTES:
            raise IpcError(f"IPC handle of {len(handle)} bytes exceeds {HANDLE_BYTES}")
        entry = self.exported[a.id] = (a, handle)
        self.stats["exports"] += 1
        return entry

    # -- import (peers' allocations) ---------------------------------------------------------

    def _open(self, peer: int, bid: int, base: int, size: int, handle: bytes) -> int:
        key: tuple[int, int | bytes] = (peer, bid if bid >= 0 else handle)
        m = self.mapped.pop(key, None)
        if m is None:
            for k, old in list(self.mapped.items()):
                if k[0] == peer and old.peer_base < base + size and base < old.peer_base + old.size:
                    self._close(k)  # the peer freed it: a new allocation overlaps
            while len(self.mapped) >= MAX_MAPPINGS:
                self._close(next(iter(self.mapped)))
            m = _Mapping(base, size, self.device.open(handle))
            self.stats["opens"] += 1
        self.mapped[key] = m  # most recently used last
        return m.mapped

    def _close(self, key: tuple[int, int | bytes]) -> None:
        m = self.mapped.pop(key)
        self.device.close(m.mapped)
        self.stats["closes"] += 1

    def close_all(self) -> None:
        """Unmap every peer allocation (at exit, or to release memory)."""
        for k in list(self.mapped):
            self._close(k)
        self.exported.clear()

    # -- one collective call -----------------------------------------------------------------

    def _barrier(self, err: int) -> int:
        """Synchronize, then meet every rank of the node; returns the largest error flag."""
        if not err:
            try:
                self.device.synchronize()
            except Exception:
                err = 1
        flag = np.array([err], dtype=np.int64)
        self.comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
        return int(flag[0])

    def run(self, op: str, bufs: Mapping[str, Buffer], ok: bool,
            make_schedule: Callable[[np.ndarray], Schedule], meta: Any = (),
            dtype: np.dtype | None = None, reduce_op: ReduceOp | None = None,
            export: tuple[str, ...] = ("in",),
            hooks: Mapping[int, Callable[[Mapping[str, int]], None]] | None = None) -> bool:
        """Run one collective; False (on every rank) when some rank cannot use IPC.

        ``bufs``: this rank's ``"in"`` / ``"out"`` buffers; ``ok``: this rank's arrays are
        exportable; ``meta``: int64 call metadata gathered from every rank and handed to
        ``make_schedule`` (an array of shape (ranks, len(meta))); ``export``: the roles
        the schedule reads from peers; ``hooks[n]``: called with this rank's buffer
        pointers after the barrier that opens phase n, before its moves (the inter-node
        leg of a hierarchical collective).
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
                got = self._export(b.ptr)
            except Exception as e:  # tell the peers (below), who all fall back with us
                self.last_error = f"export of {role}: {type(e).__name__}: {e}"
                got = None
            if got is None:
                ok = False
                break
            a, handle = got
            rec["id"][0, i], rec["base"][0, i], rec["size"][0, i] = a.id, a.base, a.size
            rec["off"][0, i] = b.ptr - a.base
            rec["handle"][0, i, :len(handle)] = np.frombuffer(handle, dtype=np.uint8)
        rec["ok"][0] = int(ok)
        rec["meta"][0, :meta_arr.size] = meta_arr
        recs = np.zeros(p, dtype=rec_t)
        self.comm.Allgather([rec.view(np.uint8), MPI.BYTE], [recs.view(np.uint8), MPI.BYTE])
        if not recs["ok"].all():
            self.stats["fallbacks"] += 1
            return False
        self.stats["calls"] += 1
        sched = make_schedule(recs["meta"][:, :meta_arr.size])
        err: BaseException | None = None
        local = {role: b.ptr for role, b in bufs.items()}
        keep = None
        if sched.tmp_bytes:
            local["tmp"], keep = self.device.scratch(sched.tmp_bytes)
        ptrs: dict[tuple[int, str], int] = {}

        def src_ptr(k: int, role: str) -> int:
            if k == me:
                return local[role]
            hit = ptrs.get((k, role))
            if hit is None:
                i = ROLES.index(role)
                r = recs[k]
                handle = bytes(r["handle"][i])
                base = self._open(k, int(r["id"][i]), int(r["base"][i]), int(r["size"][i]),
                                  handle)
                hit = ptrs[(k, role)] = base + int(r["off"][i])
            return hit

        failed = 0
        for n, phase in enumerate(sched.phases):
            if n:
                failed = self._barrier(int(err is not None))
                if failed:
                    break
            if err is not None:
                continue
            try:
                hook = hooks.get(n) if hooks else None
                if hook is not None:
                    hook(local)
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
            failed = self._barrier(int(err is not None)) or failed
        elif not failed:  # the last phase was local: wait for this rank's own work only
            try:
                self.device.synchronize()
            except Exception as e:
                err = e
        del keep
        if err is not None:
            raise IpcError(f"{op}: CUDA IPC failed on node rank {me}: "
                           f"{type(err).__name__}: {err}") from err
        if failed:
            raise IpcError(f"{op}: CUDA IPC failed on another rank of the node (see its "
                           "message); this rank's output is incomplete")
        return True
