"""Hierarchical collectives: the legs of a boxing step whose group spans hosts.

A group of ``k`` hosts with ``m`` of its ranks on each (``hosts[h][l]``: the rank of local
index ``l`` on host ``h``, as :func:`sbpmpi.boxing.planner.host_split` gives them) runs a
collective in legs, each rank crossing hosts only with the ranks of its own local index:

- all-reduce: reduce-scatter inside the host (local rank ``l`` keeps block ``l`` of ``m``
  balanced blocks), all-reduce of that block across hosts, all-gather inside the host;
- reduce-scatter: the blocks grouped by local index (a "column": the blocks of the
  ranks ``hosts[*][l]``), reduce-scatter of the columns inside the host, reduce-scatter of
  column ``l`` across hosts;
- all-gather: all-gather of the blocks of column ``l`` across hosts, all-gather of the
  columns inside the host, the blocks put back in group order.

Each leg moves ``1/m`` of the bytes across hosts that the flat collective would: the legs
inside a host run on shared memory. The functions take flat C-contiguous buffers and
counts in group order, like the flat calls of :mod:`sbpmpi.comm` they replace; they are
the CPU form of the GPU transport's hierarchy (:mod:`sbpmpi.comm.gpu.hier`) and work on
device arrays too, through the same ``comm`` calls. Every rank of the group must call
with the same ``hosts`` and counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import backend, comm
from ..core.layout import balanced_range

__all__ = ["HostGroups", "host_groups", "all_reduce", "reduce_scatter_v", "all_gather_v"]

Hosts = tuple[tuple[int, ...], ...]


class HostGroups(NamedTuple):
    """This rank's place in a group split by host: its host ``h`` and local index ``l``,
    and the communicators inside its host and across hosts (its column)."""

    hosts: Hosts
    group: tuple[int, ...]
    h: int
    l: int  # noqa: E741 - the local index, as in the docs
    inside: comm.Group
    across: comm.Group


def host_groups(group: Sequence[int], hosts: Hosts, me: int) -> HostGroups:
    """The :class:`HostGroups` of world rank ``me`` (collective over the members of the
    two communicators on first use: every rank builds its host's, then its column's)."""
    for h, ranks in enumerate(hosts):
        if me in ranks:
            l = ranks.index(me)  # noqa: E741
            inside = comm.get_group(ranks)
            across = comm.get_group(tuple(r[l] for r in hosts))
            return HostGroups(hosts, tuple(group), h, l, inside, across)
    raise ValueError(f"rank {me} is not in the hosts {hosts} of the group {list(group)}")


def _position(g: HostGroups) -> dict[int, int]:
    return {r: i for i, r in enumerate(g.group)}


def _columns(g: HostGroups, counts: Sequence[int]) -> list[list[tuple[int, int, int]]]:
    """For each local index: its blocks as (count, offset in group order), host order."""
    pos = _position(g)
    offs = [0]
    for c in counts:
        offs.append(offs[-1] + c)
    m = len(g.hosts[0])
    return [[(counts[pos[r[j]]], offs[pos[r[j]]], pos[r[j]]) for r in g.hosts]
            for j in range(m)]


def _gather(out: Any, src: Any, counts: Sequence[int], group: comm.Group) -> None:
    """All-gather on ``group``: the equal-block call where the blocks are equal (MPICH's
    all-gather-v of equal blocks ran 10 to 25 times slower than its all-gather between
    hosts on TCP, docs/benchmarks.md "Across hosts"), else the -v call."""
    if len(set(counts)) == 1:
        comm.all_gather(out, src, group)
    else:
        comm.all_gather_v(out, src, counts, None, group)


def _reduce_scatter(out: Any, src: Any, counts: Sequence[int], op: comm.ReduceOp,
                    group: comm.Group) -> None:
    """Reduce-scatter on ``group``: the equal-block call where the blocks are equal."""
    if len(set(counts)) == 1:
        comm.reduce_scatter(out, src, op, group)
    else:
        comm.reduce_scatter_v(out, src, counts, op, group)


def all_reduce(xp: Any, buf: Any, op: comm.ReduceOp, g: HostGroups) -> None:
    """All-reduce the flat ``buf`` (of array module ``xp``) in place over the group of ``g``."""
    n = buf.shape[0]
    m = len(g.hosts[0])
    ranges = [balanced_range(n, m, j) for j in range(m)]
    counts = [b - a for a, b in ranges]
    lo, hi = ranges[g.l]
    part = backend.empty(xp, (hi - lo,), buf.dtype)
    _reduce_scatter(part, buf, counts, op, g.inside)
    comm.all_reduce(part, op, g.across)
    _gather(buf, part, counts, g.inside)


def reduce_scatter_v(xp: Any, out: Any, src: Any, counts: Sequence[int], op: comm.ReduceOp,
                     g: HostGroups) -> None:
    """Reduce the flat ``src`` (blocks of ``counts`` in group order) over the group; this
    rank's block lands in ``out``."""
    cols = _columns(g, counts)
    col_sizes = [sum(c for c, _, _ in col) for col in cols]
    packed = backend.empty(xp, (sum(col_sizes),), src.dtype)
    o = 0
    for col in cols:
        for c, off, _ in col:
            packed[o:o + c] = src[off:off + c]
            o += c
    mine = backend.empty(xp, (col_sizes[g.l],), src.dtype)
    _reduce_scatter(mine, packed, col_sizes, op, g.inside)
    _reduce_scatter(out, mine, [c for c, _, _ in cols[g.l]], op, g.across)


def all_gather_v(xp: Any, out: Any, src: Any, counts: Sequence[int], g: HostGroups) -> None:
    """Gather the flat blocks of the group (``counts`` in group order) into ``out``."""
    cols = _columns(g, counts)
    col_sizes = [sum(c for c, _, _ in col) for col in cols]
    mine = backend.empty(xp, (col_sizes[g.l],), src.dtype)
    _gather(mine, src, [c for c, _, _ in cols[g.l]], g.across)
    every = backend.empty(xp, (sum(col_sizes),), src.dtype)
    _gather(every, mine, col_sizes, g.inside)
    o = 0
    for col in cols:
        for c, off, _ in col:
            out[off:off + c] = every[o:o + c]
            o += c
