"""Executor: runs a boxing plan on this rank's shard, through :mod:`sbpmpi.comm` only.

Each step of a plan is compiled once per rank into a closure with its counts, shapes,
slices and communicator worked out; running a plan then calls the closures in turn.
Outputs are allocated once and filled in place (large host outputs and scratch buffers
reuse pooled memory, see ``backend.empty``); a block goes to MPI as it is whenever
it is contiguous, and a split along a non-leading dim is packed (or unpacked) with one
strided copy. Large reduce-scatter and all-to-all steps (``OWN_BLOCK_BYTES``) send only
the blocks meant for other ranks and handle the rank's own block locally, so it is not
copied twice (once into a send buffer, once more by MPI to itself). Every step leaves its
input untouched. The code is the same for NumPy and CuPy (``backend.get_xp``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import backend, comm
from ..boxing.plan import Box, Plan, Step, group_of
from ..boxing.schedule import Transfer, is_contiguous_box, slots_of, transfer_schedule
from ..comm.mpi_library import max_count
from ..core.dtypes import HALF
from ..core.layout import Layout, balanced_range, empty_shape
from ..core.reduction import REDUCTIONS, identity_value, reduction
from ..core.sbp import Partial, Split
from . import hierarchical
from .half_width import HalfWidthReduction, accumulate

__all__ = ["Program", "compile_plan", "TAG", "AxisSetup", "Receive", "Send", "LocalCopy", "Moves",
           "rank_moves", "run_moves"]

TAG = 23307  # tag of boxing's point-to-point messages (on WORLD)


# Point-to-point messages longer than this are sent in pieces (tests lower it).
MAX_COUNT: int | None = max_count()

# Reduce-scatter and all-to-all steps whose largest shard in the group holds at least
# this many bytes send only the blocks for other ranks (an all-to-all with nothing to
# itself) and handle this rank's own block locally: one pass over it fewer (tests lower
# it). From a mebibyte per shard up, the pass saved outweighs the extra local copy call:
# no slower than one pass in any measurement and clearly faster in some; smaller steps
# keep the one call (docs/benchmarks.md, "The own block of a step").
OWN_BLOCK_BYTES = 1 << 20

_REDUCE = {name: comm.ReduceOp[r.reduce_op] for name, r in REDUCTIONS.items()}

Fn = Callable[[Any], Any]


class Program:
    """A plan compiled for one rank: call it with the rank's shard, get the new shard."""

    __slots__ = ("plan", "fns", "out_shape", "member")

    def __init__(self, plan: Plan, fns: Sequence[Fn], out_shape: tuple[int, ...],
                 member: bool) -> None:
        self.plan = plan
        self.fns = tuple(fns)
        self.out_shape = out_shape
        self.member = member

    def __call__(self, local: Any) -> Any:
        a = local
        for f in self.fns:
            a = f(a)
        if not self.member:
            return np.empty(self.out_shape, dtype=local.dtype)
        return a

    def start(self, local: Any) -> Callable[[], Any] | None:
        """Post the messages of a program whose only step on this rank is point-to-point
        (``send_recv``) and return the function that waits and returns the new shard;
        None for any other program (run it by calling it)."""
        if len(self.fns) != 1 or not isinstance(self.fns[0], StartableFn):
            return None
        finish = self.fns[0].start(local)
        if self.member:
            return finish
        shape, dtype = self.out_shape, local.dtype

        def finish_empty() -> Any:
            finish()
            return np.empty(shape, dtype=dtype)

        return finish_empty


def compile_plan(plan: Plan, me: int) -> Program:
    """Compile ``plan`` for world rank ``me`` (creates the communicators it needs)."""
    fns: list[Fn] = []
    for st in plan.steps:
        f = _COMPILERS[st.kind](st, me)
        if f is not None:
            fns.append(f)
    dst = plan.dst
    member = me in dst.placement
    return Program(plan, fns, dst.local_shape(me) if member else empty_shape(len(dst.shape)),
                   member)


# -- packing helpers ------------------------------------------------------------------------

def _contiguous(xp: Any, a: Any) -> Any:
    """``a`` itself when C-contiguous, else a C-contiguous copy of the same shape."""
    if a.flags.c_contiguous:
        return a
    out = backend.empty(xp, a.shape, a.dtype)
    out[...] = a
    return out


def _full(xp: Any, shape: tuple[int, ...], value: Any, dtype: Any) -> Any:
    """A new array of ``shape`` filled with ``value`` (from ``backend.empty``)."""
    out = backend.empty(xp, shape, dtype)
    out.fill(value)
    return out


def _pack(x: Any, dim: int, sizes: Sequence[int], flat: Any, skip: int = -1) -> None:
    """Write the blocks of ``x`` along ``dim`` (of ``sizes``) one after another into ``flat``,
    leaving out block ``skip`` (none by default)."""
    _blocks(x, dim, sizes, flat, skip, True)


def _unpack(flat: Any, dim: int, sizes: Sequence[int], out: Any, skip: int = -1) -> None:
    """Inverse of :func:`_pack`: ``out`` along ``dim`` is the blocks of ``flat`` in turn
    (block ``skip`` of ``out`` is left as it is)."""
    _blocks(out, dim, sizes, flat, skip, False)


def _blocks(x: Any, dim: int, sizes: Sequence[int], flat: Any, skip: int, pack: bool) -> None:
    """Copy the blocks of ``x`` along ``dim`` but ``skip`` to (``pack``) or from ``flat``,
    where they lie one after another, each in C order."""
    shape = x.shape
    pre, n, post = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    x3 = x.reshape(pre, n, post)
    p = len(sizes)
    if n % p == 0 and all(s == n // p for s in sizes):  # one strided copy per run of blocks
        b = n // p
        blocks = x3.reshape(pre, p, b, post).transpose(1, 0, 2, 3)
        pairs: tuple[tuple[Any, Any], ...]
        if 0 <= skip < p:  # the blocks before and after the one left out
            f4 = flat[:(p - 1) * pre * b * post].reshape(p - 1, pre, b, post)
            pairs = ((f4[:skip], blocks[:skip]), (f4[skip:], blocks[skip + 1:]))
        else:
            pairs = ((flat[:p * pre * b * post].reshape(p, pre, b, post), blocks),)
        for f, blk in pairs:
            if pack:
                f[...] = blk
            else:
                blk[...] = f
        return
    off = o = 0
    for q, s in enumerate(sizes):
        if q != skip:
            cnt = pre * s * post
            f3 = flat[off:off + cnt].reshape(pre, s, post)
            if pack:
                f3[...] = x3[:, o:o + s, :]
            else:
                x3[:, o:o + s, :] = f3
            off += cnt
        o += s


def _counts(shape: Sequence[int], dim: int, sizes: Sequence[int]) -> list[int]:
    """Elements of each block when ``shape`` is cut into ``sizes`` along ``dim``."""
    rest = math.prod(n for i, n in enumerate(shape) if i != dim)
    return [rest * s for s in sizes]


class AxisSetup(NamedTuple):
    """What a per-axis step needs on this rank: the array module, the communicator along
    the step's mesh axes, its size and this rank's index in it."""

    xp: Any
    group: comm.Group
    size: int
    position: int


def _axis_setup(st: Step, me: int) -> AxisSetup | None:
    """The :class:`AxisSetup` of ``st`` on world rank ``me``; None outside the placement."""
    pl = st.src.placement
    if me not in pl:
        return None
    assert st.axis is not None
    xp = backend.get_xp(pl.type)
    group = comm.get_group(group_of(pl, me, st.axis, st.span))
    return AxisSetup(xp, group, group.size, group.ranks.index(me))


def _host_groups(st: Step, me: int, group: comm.Group) -> hierarchical.HostGroups | None:
    """For a hierarchical step (``st.hosts``), this rank's communicators inside its host
    and across hosts; None for a flat step."""
    if not st.hosts:
        return None
    i = st.groups.index(group.ranks)
    return hierarchical.host_groups(group.ranks, st.hosts[i], me)


def _extents(layout: Layout, ranks: Sequence[int], dim: int) -> list[int]:
    """Extent along ``dim`` of each rank's block (the blocks of a group, in group order)."""
    return [layout.local_shape(r)[dim] for r in ranks]


# -- per-axis steps -------------------------------------------------------------------------

def _all_gather(st: Step, me: int) -> Fn | None:
    s = _axis_setup(st, me)
    if s is None:
        return None
    xp, group, p, _ = s
    assert isinstance(st.frm, Split)
    d = st.frm.dim
    out_shape = st.dst.local_shape(me)
    sizes = _extents(st.src, group.ranks, d)  # consecutive blocks, in group order
    counts = _counts(out_shape, d, sizes)
    even = len(set(counts)) == 1
    direct = math.prod(out_shape[:d]) <= 1
    hier = _host_groups(st, me, group)

    def gather(out_flat: Any, src: Any) -> None:
        if hier is not None:
            hierarchical.all_gather_v(xp, out_flat, src.reshape(-1), counts, hier)
        elif even:
            comm.all_gather(out_flat, src.reshape(-1), group)
        else:
            comm.all_gather_v(out_flat, src.reshape(-1), counts, None, group)

    def run(a: Any) -> Any:
        src = _contiguous(xp, a)
        out = backend.empty(xp, out_shape, src.dtype)
        if direct:
            gather(out.reshape(-1), src)
        else:
            tmp = backend.empty(xp, sum(counts), src.dtype)
            gather(tmp, src)
            _unpack(tmp, d, sizes, out)
        return out

    return run


def _all_reduce(st: Step, me: int) -> Fn | None:
    s = _axis_setup(st, me)
    if s is None:
        return None
    xp, group, p, k = s
    assert isinstance(st.frm, Partial)
    op = _REDUCE[st.frm.op]
    hier = _host_groups(st, me, group)

    half = HalfWidthReduction(xp, group, p, k, st.frm.op)

    def run(a: Any) -> Any:
        if a.dtype in HALF:  # MPI cannot add them: blocks in half width, sums in float32
            return half.all_reduce(a)
        out = backend.empty(xp, a.shape, a.dtype)  # comm reduces in place; the input stays
        out[...] = a
        if hier is not None:
            hierarchical.all_reduce(xp, out.reshape(-1), op, hier)
        else:
            comm.all_reduce(out, op, group)
        return out

    return run


def _reduce_scatter(st: Step, me: int) -> Fn | None:
    s = _axis_setup(st, me)
    if s is None:
        return None
    xp, group, p, k = s
    assert isinstance(st.frm, Partial) and isinstance(st.to, Split)
    op = _REDUCE[st.frm.op]
    red = st.frm.op
    ufunc = reduction(red).ufunc_of(xp)
    d = st.to.dim
    in_shape = st.src.local_shape(me)  # alike on every rank of the group (a partial axis)
    out_shape = st.dst.local_shape(me)
    sizes = _extents(st.dst, group.ranks, d)
    counts = _counts(in_shape, d, sizes)
    even = len(set(counts)) == 1
    direct = math.prod(in_shape[:d]) <= 1
    # large shards (see OWN_BLOCK_BYTES): the blocks for other ranks travel in one
    # all-to-all, and this rank reduces its own block with what it receives straight
    # into the output (MPI's reduce-scatter would first copy the own block)
    own = (slice(None),) * d + (slice(sum(sizes[:k]), sum(sizes[:k + 1])),)
    send_counts = [0 if q == k else c for q, c in enumerate(counts)]
    recv_counts = [0 if q == k else counts[k] for q in range(p)]
    send_displs = _displs(send_counts if not direct else counts)
    recv_displs = _displs(recv_counts)
    n_send = sum(send_counts) if not direct else sum(counts)
    n_recv = sum(recv_counts)
    large = sum(counts)
    hier = _host_groups(st, me, group)

    def whole(a: Any) -> Any:
        src = _contiguous(xp, a)
        if not direct:
            tmp = backend.empty(xp, sum(counts), src.dtype)
            _pack(src, d, sizes, tmp)
            src = tmp
        out = backend.empty(xp, out_shape, src.dtype)
        if hier is not None:
            hierarchical.reduce_scatter_v(xp, out.reshape(-1), src.reshape(-1), counts, op,
                                          hier)
        elif even:
            comm.reduce_scatter(out.reshape(-1), src.reshape(-1), op, group)
        else:
            comm.reduce_scatter_v(out.reshape(-1), src.reshape(-1), counts, op, group)
        return out

    def run(a: Any) -> Any:
        dt = a.dtype
        half = dt in HALF  # MPI cannot add them: the all-to-all, and sums in float32
        if not half and (hier is not None or large * dt.itemsize < OWN_BLOCK_BYTES):
            return whole(a)
        if direct:
            sbuf = _contiguous(xp, a).reshape(-1)
        else:
            sbuf = backend.empty(xp, n_send, dt)
            _pack(a, d, sizes, sbuf, k)
        rbuf = backend.empty(xp, n_recv, dt)
        comm.all_to_all_v(rbuf, recv_counts, sbuf, send_counts, recv_displs, send_displs,
                          group)
        out = backend.empty(xp, out_shape, dt)
        if p == 1:
            out[...] = a[own]
            return out
        n = counts[k]
        parts = [rbuf[o:o + n].reshape(out_shape) for q, o in enumerate(recv_displs) if q != k]
        if half:
            out[...] = accumulate(xp, ufunc, a[own], parts, red)
            return out
        ufunc(a[own], parts[0], out=out)
        for part in parts[1:]:
            ufunc(out, part, out=out)
        return out

    return run


def _all_to_all(st: Step, me: int) -> Fn | None:
    s = _axis_setup(st, me)
    if s is None:
        return None
    xp, group, p, k = s
    assert isinstance(st.frm, Split) and isinstance(st.to, Split)
    i, j = st.frm.dim, st.to.dim
    in_shape = st.src.local_shape(me)
    out_shape = st.dst.local_shape(me)
    sj = _extents(st.dst, group.ranks, j)
    si = _extents(st.src, group.ranks, i)
    in_counts = _counts(in_shape, j, sj)
    out_counts = _counts(out_shape, i, si)
    # one decision for the whole group, from global metadata: every rank must make the
    # same MPI call (Alltoall or Alltoallv), even a rank whose own blocks look even
    shards = [_counts(st.src.local_shape(r), j, sj) for r in group.ranks]
    even = len({c for cs in shards for c in cs}) == 1
    largest = max(sum(cs) for cs in shards)  # elements of the group's largest shard
    pack = math.prod(in_shape[:j]) > 1
    unpack = math.prod(out_shape[:i]) > 1
    # large shards: this rank's own block is copied straight from the input into place
    # and only the others travel (count 0 to itself): one copy of 1/p of the data instead
    # of two (pack, then MPI's copy to itself), and the scratch buffers shrink by 1/p
    own_in = (slice(None),) * j + (slice(sum(sj[:k]), sum(sj[:k + 1])),)
    own_out = (slice(None),) * i + (slice(sum(si[:k]), sum(si[:k + 1])),)
    send_counts = [0 if q == k else c for q, c in enumerate(in_counts)]
    recv_counts = [0 if q == k else c for q, c in enumerate(out_counts)]
    send_displs = _displs(send_counts if pack else in_counts)
    recv_displs = _displs(recv_counts if unpack else out_counts)
    n_send = sum(send_counts) if pack else sum(in_counts)
    n_recv = sum(recv_counts)

    def whole(a: Any) -> Any:
        src = _contiguous(xp, a)
        dt = src.dtype
        if pack:
            tmp = backend.empty(xp, sum(in_counts), dt)
            _pack(src, j, sj, tmp)
            src = tmp
        out = backend.empty(xp, out_shape, dt)
        rbuf = backend.empty(xp, sum(out_counts), dt) if unpack else out.reshape(-1)
        if even:
            comm.all_to_all(rbuf, src.reshape(-1), group)
        else:
            comm.all_to_all_v(rbuf, out_counts, src.reshape(-1), in_counts, None, None, group)
        if unpack:
            _unpack(rbuf, i, si, out)
        return out

    def run(a: Any) -> Any:
        if largest * a.dtype.itemsize < OWN_BLOCK_BYTES:
            return whole(a)
        dt = a.dtype
        out = backend.empty(xp, out_shape, dt)
        if pack:
            sbuf = backend.empty(xp, n_send, dt)
            _pack(a, j, sj, sbuf, k)
        else:
            sbuf = _contiguous(xp, a).reshape(-1)
        rbuf = backend.empty(xp, n_recv, dt) if unpack else out.reshape(-1)
        comm.all_to_all_v(rbuf, recv_counts, sbuf, send_counts, recv_displs, send_displs,
                          group)
        out[own_out] = a[own_in]
        if unpack:
            _unpack(rbuf, i, si, out, k)
        return out

    return run


def _displs(counts: Sequence[int]) -> list[int]:
    """Offsets of blocks of ``counts`` elements laid one after another."""
    out, o = [], 0
    for c in counts:
        out.append(o)
        o += c
    return out


def _local_slice(st: Step, me: int) -> Fn | None:
    s = _axis_setup(st, me)
    if s is None:
        return None
    xp, _, p, k = s
    assert isinstance(st.to, Split)
    d = st.to.dim
    lo, hi = balanced_range(st.src.local_shape(me)[d], p, k)
    idx = (slice(None),) * d + (slice(lo, hi),)

    def run(a: Any) -> Any:
        return _contiguous(xp, a[idx])  # a view when the block is contiguous

    return run


def _local_fill(st: Step, me: int) -> Fn | None:
    s = _axis_setup(st, me)
    if s is None:
        return None
    xp, _, _, k = s
    if k == 0:
        return None  # keeps the value
    op = st.dst.identity_op(me)
    assert op is not None
    shape = st.dst.local_shape(me)

    def run(a: Any) -> Any:
        return _full(xp, shape, identity_value(op, a.dtype), a.dtype)

    return run


def _pad_op(layout: Layout, axis: int, coord: Sequence[int]) -> str:
    """Identity used around the block: the innermost later partial axis where this rank is
    off index 0 (its whole shard is that op's identity), else the new partial's op."""
    op = layout.sbp[axis]
    assert isinstance(op, Partial)
    name = op.op
    for b in range(axis + 1, len(layout.sbp)):
        sb = layout.sbp[b]
        if isinstance(sb, Partial) and coord[b] != 0:
            name = sb.op
    return name


def _local_pad(st: Step, me: int) -> Fn | None:
    s = _axis_setup(st, me)
    if s is None:
        return None
    xp, _, p, k = s
    assert isinstance(st.frm, Split) and st.axis is not None
    d = st.frm.dim
    shape = st.dst.local_shape(me)
    coord = st.dst.placement.coord_of(me)
    assert coord is not None
    op = _pad_op(st.dst, st.axis, coord)
    lo, hi = balanced_range(shape[d], p, k)
    idx = (slice(None),) * d + (slice(lo, hi),)

    def run(a: Any) -> Any:
        out = _full(xp, shape, identity_value(op, a.dtype), a.dtype)
        out[idx] = a
        return out

    return run


def _relabel(st: Step, me: int) -> Fn | None:
    return None


# -- steps between placements ---------------------------------------------------------------

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


class _Scratch(NamedTuple):
    """A block received into scratch memory, copied into slot ``slot`` at ``at`` after."""

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
    later: tuple[_Scratch, ...]
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
    later: list[_Scratch] = []
    limit = MAX_COUNT
    for rv in moves.receives:
        if rv.contiguous:
            target = bufs[rv.slot][rv.at] if rv.at else bufs[rv.slot]
        else:
            target = backend.empty(xp_out, rv.shape, dt)
            later.append(_Scratch(rv.slot, rv.at, target))
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
    moves = rank_moves(transfer_schedule(src, dst), me, src.local_ranges(me),
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


_COMPILERS: dict[str, Callable[[Step, int], Fn | None]] = {
    "all_gather": _all_gather,
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "local_slice": _local_slice,
    "local_fill": _local_fill,
    "local_pad": _local_pad,
    "relabel": _relabel,
    "send_recv": _send_recv,
    "broadcast": _broadcast,
}
