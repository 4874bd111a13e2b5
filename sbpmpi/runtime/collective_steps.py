"""The per-axis steps of a plan compiled for one rank: collectives along mesh axes
(all_gather, all_reduce, reduce_scatter, all_to_all, flat or across hosts) and the local
steps (local_slice, local_fill, local_pad, relabel).

Each compiler takes a :class:`~sbpmpi.boxing.plan.Step` and this rank, works out the
counts, shapes, slices and communicator once, and returns the closure that runs the
step (None where this rank has nothing to do). Large reduce-scatter and all-to-all steps
(:data:`OWN_BLOCK_BYTES`) send only the blocks meant for other ranks and handle the
rank's own block locally, so it is not copied twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .. import backend, comm
from ..boxing.plan import Step, group_of
from ..core.dtypes import HALF
from ..core.layout import Layout, balanced_range
from ..core.reduction import REDUCTIONS, identity_value, reduction
from ..core.sbp import Partial, Split
from . import hierarchical
from .half_width import HalfWidthReduction, accumulate
from .packing import contiguous as _contiguous
from .packing import counts as _counts
from .packing import displs as _displs
from .packing import full as _full
from .packing import pack as _pack
from .packing import unpack as _unpack

__all__ = ["OWN_BLOCK_BYTES", "AxisSetup", "AXIS_COMPILERS"]

# Reduce-scatter and all-to-all steps whose largest shard in the group holds at least
# this many bytes send only the blocks for other ranks (an all-to-all with nothing to
# itself) and handle this rank's own block locally: one pass over it fewer (tests lower
# it). From a mebibyte per shard up, the pass saved outweighs the extra local copy call:
# no slower than one pass in any measurement and clearly faster in some; smaller steps
# keep the one call (docs/benchmarks.md, "The own block of a step").
OWN_BLOCK_BYTES = 1 << 20

_REDUCE = {name: comm.ReduceOp[r.reduce_op] for name, r in REDUCTIONS.items()}

Fn = Callable[[Any], Any]


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
    # (the members' shards differ only along dim i, by the extents si: a block holds
    # rest * si[member] * sj[block] elements; O(group), not O(group^2))
    rest = math.prod(n for d, n in enumerate(in_shape) if d not in (i, j))
    even = len({rest * a * b for a in set(si) for b in set(sj)}) == 1
    largest = rest * max(si) * sum(sj)  # elements of the group's largest shard
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


AXIS_COMPILERS: dict[str, Callable[[Step, int], Fn | None]] = {
    "all_gather": _all_gather,
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "local_slice": _local_slice,
    "local_fill": _local_fill,
    "local_pad": _local_pad,
    "relabel": _relabel,
}
