"""The steps between placements compiled for one rank: point-to-point moves
(``send_recv``: this rank's blocks only, from :func:`~sbpmpi.boxing.schedule.rank_transfers`,
O(its peers)) and the broadcast from one rank.

A block goes to MPI as it is whenever it is contiguous, else through a scratch array;
messages longer than :data:`MAX_COUNT` elements travel in pieces. :func:`rank_moves` and
:func:`run_moves` also serve ``sm.to_global`` of local arrays (:mod:`.assembly`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import backend, comm
from ..boxing.plan import Box, Step
from ..boxing.schedule import Transfer, is_contiguous_box, rank_transfers, slots_of
from ..comm.mpi_library import max_count
from ..core.dtypes import HALF
from ..core.layout import empty_shape
from ..core.reduction import identity_value, reduction
from ..core.sbp import Partial
from .half_width import accumulate
from .packing import contiguous as _contiguous
from .packing import full as _full

__all__ = ["TAG", "MAX_COUNT", "Receive", "Send", "LocalCopy", "Moves", "MovesInFlight",
           "rank_moves", "run_moves", "start_moves", "StartableFn", "P2P_COMPILERS"]

TAG = 23307  # tag of boxing's point-to-point messages (on WORLD)

# Point-to-point messages longer than this are sent in pieces (tests lower it).
MAX_COUNT: int | None = max_count()

Fn = Callable[[Any], Any]


def _pieces(buf: Any, limit: int | None) -> list[Any]:
    """``buf`` (contiguous) as messages of at most ``limit`` elements (itself if it fits)."""
    if limit is None or buf.size <= limit:
        return [buf]
    flat = buf.reshape(-1)
    return [flat[i:i + limit] for i in range(0, flat.size, limit)]


def _slices(box: Box, origin: Box) -> tuple[slice, ...]:
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


def _on_device_type(x: Any, same: bool, device_type: str) -> Any:
    """``x`` as an array of ``device_type`` (a copy unless ``same``: it already is one)."""
    return x if same else backend.to_device(x, device_type)


class Receive(NamedTuple):
    """A block this rank receives from world rank ``peer`` into output slot ``slot`` at
    ``at``: straight into place when ``contiguous``, else through a scratch array of
    ``shape``."""

    peer: int
    slot: int
    at: tuple[slice, ...]
    contiguous: bool
    shape: tuple[int, ...]


class Send(NamedTuple):
    """A block of this rank's input (at ``at``) sent to world rank ``peer``."""

    peer: int
    at: tuple[slice, ...]


class LocalCopy(NamedTuple):
    """A block this rank holds and keeps: input ``src_at`` to slot ``slot`` at ``dst_at``."""

    slot: int
    src_at: tuple[slice, ...]
    dst_at: tuple[slice, ...]


class PendingCopy(NamedTuple):
    """A block received into a temporary array (``buf``, from ``backend.empty``), copied
    into slot ``slot`` at ``at`` once its message has arrived."""

    slot: int
    at: tuple[slice, ...]
    buf: Any


class Moves(NamedTuple):
    """The blocks of a point-to-point schedule that concern one rank."""

    receives: tuple[Receive, ...]
    sends: tuple[Send, ...]
    copies: tuple[LocalCopy, ...]


def rank_moves(transfers: Sequence[Transfer], me: int, src_box: Box | None,
               dst_box: Box | None) -> Moves:
    """This rank's part of ``transfers`` (global boxes): what it receives into its output
    block ``dst_box``, sends from its input block ``src_box`` and copies locally."""
    receives: list[Receive] = []
    sends: list[Send] = []
    copies: list[LocalCopy] = []
    out_shape = None if dst_box is None else [b - a for a, b in dst_box]
    for t in transfers:
        if t.dst == me:
            assert dst_box is not None and out_shape is not None
            idx2 = _slices(t.box, dst_box)
            if t.src == me:
                assert src_box is not None
                copies.append(LocalCopy(t.slot, _slices(t.box, src_box), idx2))
            else:
                rel = tuple((s.start, s.stop) for s in idx2)
                receives.append(Receive(t.src, t.slot, idx2, is_contiguous_box(rel, out_shape),
                                        tuple(b - a for a, b in t.box)))
        elif t.src == me:
            assert src_box is not None
            sends.append(Send(t.dst, _slices(t.box, src_box)))
    return Moves(tuple(receives), tuple(sends), tuple(copies))


class MovesInFlight(NamedTuple):
    """The messages of :func:`start_moves` in flight, and the scratch blocks to copy into
    place once they have arrived."""

    works: tuple[comm.Work, ...]
    later: tuple[PendingCopy, ...]
    bufs: Sequence[Any]

    def finish(self) -> None:
        """Wait for every message, then copy the scratch blocks into place."""
        for w in self.works:
            w.wait()
        for sc in self.later:
            self.bufs[sc.slot][sc.at] = sc.buf


def run_moves(moves: Moves, a: Any, bufs: Sequence[Any], xp_in: Any, xp_out: Any,
              out_type: str, same_type: bool) -> None:
    """Send the blocks of ``a`` (arrays of ``xp_in``) and receive into ``bufs`` (one per
    slot, arrays of ``xp_out`` on device type ``out_type``): non-blocking messages of at
    most ``MAX_COUNT`` elements, local blocks copied while they travel. ``same_type``: the
    input already is of ``out_type``."""
    start_moves(moves, a, bufs, xp_in, xp_out, out_type, same_type).finish()


def start_moves(moves: Moves, a: Any, bufs: Sequence[Any], xp_in: Any, xp_out: Any,
                out_type: str, same_type: bool) -> MovesInFlight:
    """:func:`run_moves` without its wait: the messages are posted and the local blocks
    copied; ``finish()`` on the result completes it (``a`` must not be written before)."""
    dt = a.dtype
    works: list[comm.Work] = []
    later: list[PendingCopy] = []
    limit = MAX_COUNT
    for rv in moves.receives:
        if rv.contiguous:
            target = bufs[rv.slot][rv.at] if rv.at else bufs[rv.slot]
        else:
            target = backend.empty(xp_out, rv.shape, dt)
            later.append(PendingCopy(rv.slot, rv.at, target))
        for piece in _pieces(target, limit):
            works.append(comm.irecv(piece, rv.peer, TAG))
    for sd in moves.sends:
        for piece in _pieces(_contiguous(xp_in, a[sd.at] if sd.at else a), limit):
            works.append(comm.isend(piece, sd.peer, TAG))
    for cp in moves.copies:
        bufs[cp.slot][cp.dst_at] = _on_device_type(a[cp.src_at], same_type, out_type)
    return MovesInFlight(tuple(works), tuple(later), bufs)


def _send_recv(st: Step, me: int) -> Fn | None:
    src, dst = st.src, st.dst
    in1, in2 = me in src.placement, me in dst.placement
    if not in1 and not in2:
        return None
    moves = rank_moves(rank_transfers(src, dst, me), me, src.local_ranges(me),
                       dst.local_ranges(me))
    t2 = dst.placement.type
    same_type = src.placement.type == t2
    xp2 = backend.get_xp(t2) if in2 else np
    xp1 = backend.get_xp(src.placement.type) if in1 else np
    out_shape = dst.local_shape(me)
    nslots = slots_of(src, dst, me)
    fill = None
    if in2 and nslots == 0:
        ops = [s.op for s in dst.sbp if isinstance(s, Partial)]
        fill = ops[0]
    red = st.op
    ufunc = None
    if in2 and nslots > 1:
        assert red is not None
        ufunc = reduction(red).ufunc_of(xp2)
    ndim = len(dst.shape)

    def start(a: Any) -> Callable[[], Any]:
        dt = a.dtype
        bufs: list[Any] = []
        out = None
        if in2:
            if fill is not None:
                out = _full(xp2, out_shape, identity_value(fill, dt), dt)
            else:
                out = backend.empty(xp2, out_shape, dt)
            bufs = [out] + [backend.empty(xp2, out_shape, dt) for _ in range(nslots - 1)]
        flight = start_moves(moves, a, bufs, xp1, xp2, t2, same_type)

        def finish() -> Any:
            flight.finish()
            if ufunc is not None and dt in HALF:  # summed in float32, rounded once
                assert red is not None and out is not None
                out[...] = accumulate(xp2, ufunc, out, bufs[1:], red)
            elif ufunc is not None:
                for b in bufs[1:]:
                    ufunc(out, b, out=out)
            if out is None:
                return np.empty(empty_shape(ndim), dtype=dt)
            return out

        return finish

    return StartableFn(start)


class StartableFn:
    """A compiled step that can also be started without waiting (the point-to-point
    ``send_recv`` step): ``start(a)`` posts its messages and returns the function that
    waits for them and returns the new shard; calling it runs both at once."""

    __slots__ = ("start",)

    def __init__(self, start: Callable[[Any], Callable[[], Any]]) -> None:
        self.start = start

    def __call__(self, a: Any) -> Any:
        return self.start(a)()


def _broadcast(st: Step, me: int) -> Fn | None:
    src, dst = st.src, st.dst
    in1, in2 = me in src.placement, me in dst.placement
    root = st.root
    assert root is not None
    ranks = st.groups[0]
    if not in2 and me != root:
        return None
    group = comm.get_group(ranks) if me in ranks else None
    t2 = dst.placement.type
    same_type = src.placement.type == t2
    xp1 = backend.get_xp(src.placement.type) if in1 else np
    xp2 = backend.get_xp(t2) if in2 else np
    shape = dst.local_shape(me)
    ndim = len(dst.shape)

    def run(a: Any) -> Any:
        if me == root:
            buf = _contiguous(xp1, a)
            comm.broadcast(buf, root, group)
            return _on_device_type(buf, same_type, t2) if in2 else np.empty(empty_shape(ndim), a.dtype)
        if group is not None:
            out = backend.empty(xp2, shape, a.dtype)
            comm.broadcast(out, root, group)
            return out
        return _on_device_type(a, same_type, t2)  # already holds the value

    return run


P2P_COMPILERS: dict[str, Callable[[Step, int], Fn | None]] = {
    "send_recv": _send_recv,
    "broadcast": _broadcast,
}
