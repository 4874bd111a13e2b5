"""What a point-to-point (``send_recv``) step costs its busiest rank, in closed form.

The planner prices a ``send_recv`` candidate for every pair of ND-SBPs it may join, most
of which it rejects; listing every block every rank sends would cost O(ranks^2) per
candidate. Here the busiest rank's traffic comes from the layouts' metadata alone, per
tensor dim: the blocks of a dim are nested balanced splits (:mod:`sbpmpi.core.layout`),
so the largest and smallest block, and how many blocks of one side the largest block of
the other side meets, have closed forms. O(mesh axes) per candidate, whatever the
number of ranks.

It is a model: exact for even splits (every block alike, the usual case), an upper
bound by at most one message per dim for uneven ones, and the bytes a rank keeps
locally are those of the first block (the largest). The chosen plan's blocks are
computed exactly, for this rank only, when it is compiled
(:func:`.schedule.rank_transfers`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from ..core.layout import Layout
from ..core.sbp import Broadcast, Partial
from .schedule import is_contiguous_box, relative, slots_of, split_axes, transfer_schedule

__all__ = ["P2pTraffic", "p2p_traffic", "counted_traffic", "modelled_traffic", "EXACT_PAIRS", "dim_extents", "most_blocks_met"]


class P2pTraffic(NamedTuple):
    """What a ``send_recv`` step costs its busiest rank (bytes per rank)."""

    #: most bytes one rank sends to other ranks
    send: int
    #: most bytes one rank receives from other ranks
    recv: int
    #: most messages one rank sends and receives
    messages: int
    #: most bytes one rank copies locally (kept blocks, packing, extra partial slots)
    copy: int
    #: the reduction of the partial contributions a rank receives several of (else None)
    op: str | None


def dim_extents(n: int, parts: tuple[int, ...]) -> tuple[int, int]:
    """The largest and the smallest block of ``n`` items split by ``parts`` in turn
    (nested balanced splits): ceilings and floors."""
    hi = lo = n
    for p in parts:
        hi, lo = -(-hi // p), lo // p
    return hi, lo


def most_blocks_met(n: int, mine: tuple[int, ...], other: tuple[int, ...]) -> int:
    """The most blocks of ``other``'s split of ``n`` items that one block of ``mine`` meets.

    Even splits (both block sizes divide ``n``): exact, from the offsets modulo the gcd
    of the sizes. Uneven ones: the bound of the largest block of ``mine`` over the
    smallest non-empty block of ``other``.
    """
    if n == 0:
        return 0
    p_other = math.prod(other)
    if p_other == 1:
        return 1
    count = min(p_other, n)  # the non-empty blocks
    big, small = dim_extents(n, mine)
    big_o, small_o = dim_extents(n, other)
    if big == small and big_o == small_o and big > 0:
        g = math.gcd(big, big_o)
        return min(count, (big_o - g + big - 1) // big_o + 1)
    return min(count, -(-(big - 1) // max(small_o, 1)) + 1)


def _partials(layout: Layout) -> int:
    h = layout.placement.hierarchy
    return math.prod(h[a] for a in layout.partial_axes())


def _replicas(layout: Layout) -> int:
    h = layout.placement.hierarchy
    return math.prod(h[a] for a, s in enumerate(layout.sbp) if isinstance(s, Broadcast))


def _cuts(layout: Layout, d: int) -> tuple[int, ...]:
    h = layout.placement.hierarchy
    return tuple(h[a] for a in split_axes(layout, d))


def _contiguous(piece: list[int], block: list[int], cut: list[bool]) -> bool:
    """Whether a piece of extents ``piece`` cut from a C-ordered block of ``block`` (cut
    along the dims where ``cut``) is one run (see :func:`.schedule.is_contiguous_box`)."""
    if 0 in piece:
        return True
    last = max((d for d, c in enumerate(cut) if c), default=-1)
    return all(e == 1 for e in piece[:max(last, 0)])


def _kept(src: Layout, dst: Layout, ext1: list[int], ext2: list[int]) -> int:
    """Items the rank that keeps least of its own block keeps, on one mesh (the product of
    its blocks' overlap per dim): a dim cut by the same mesh axes on both sides, or by
    one side's axes first, overlaps by the smaller block; cut otherwise, some rank's two
    blocks miss each other."""
    n = 1
    for d, (a, b) in enumerate(zip(ext1, ext2)):
        x1, x2 = split_axes(src, d), split_axes(dst, d)
        if x1[:len(x2)] != x2 and x2[:len(x1)] != x1:
            return 0
        n *= min(a, b)
    return n


# Up to this many pairs of ranks (source placement x destination placement), the traffic
# is counted block by block from the whole schedule (exact; what every plan on a few
# ranks has always been priced by); above, in closed form.
EXACT_PAIRS = 256


@functools.lru_cache(maxsize=16384)
def p2p_traffic(src: Layout, dst: Layout, itemsize: int) -> P2pTraffic:
    """The busiest rank's traffic in the ``send_recv`` step from ``src`` to ``dst``:
    counted from the whole schedule on small placements (:data:`EXACT_PAIRS`), else in
    closed form (:func:`modelled_traffic`)."""
    if src.placement.size * dst.placement.size <= EXACT_PAIRS:
        return counted_traffic(src, dst, itemsize)
    return modelled_traffic(src, dst, itemsize)


def counted_traffic(src: Layout, dst: Layout, itemsize: int) -> P2pTraffic:
    """The busiest rank's traffic, counted over every block of :func:`.schedule.transfer_schedule`
    (O(ranks^2): small placements, and the reference the tests compare with)."""
    sent: dict[int, int] = {}
    recv: dict[int, int] = {}
    msgs: dict[int, int] = {}
    copied: dict[int, int] = {}

    def add(d: dict[int, int], r: int, n: int) -> None:
        d[r] = d.get(r, 0) + n

    for t in transfer_schedule(src, dst):
        n = math.prod(b - a for a, b in t.box) * itemsize
        if t.src == t.dst:
            add(copied, t.dst, n)
            continue
        add(sent, t.src, n)
        add(recv, t.dst, n)
        add(msgs, t.src, 1)
        add(msgs, t.dst, 1)
        for lay, r in ((src, t.src), (dst, t.dst)):
            box = lay.local_ranges(r)
            assert box is not None
            if not is_contiguous_box(relative(t.box, box), [b - a for a, b in box]):
                add(copied, r, n)
    op = None
    ops = {s.op for s in src.sbp if isinstance(s, Partial)}
    for r in dst.placement.rank_list:
        k = slots_of(src, dst, r)
        if ops and k > 1:
            add(copied, r, (k - 1) * math.prod(dst.local_shape(r)) * itemsize)
            op = next(iter(ops))
    return P2pTraffic(max(sent.values(), default=0), max(recv.values(), default=0),
                      max(msgs.values(), default=0), max(copied.values(), default=0), op)


def modelled_traffic(src: Layout, dst: Layout, itemsize: int) -> P2pTraffic:
    """The busiest rank's traffic in the ``send_recv`` step from ``src`` to ``dst``.

    A block's contribution goes to every destination replica of the boxes it meets (its
    broadcast axes), spread over the source replicas (a rank that holds the block keeps
    it); each destination rank gathers one slot per contribution it reduces. Ranks in
    both placements (the same mesh) keep what their two blocks share and both send and
    receive.
    """
    shape = src.shape
    ndim = len(shape)
    q1, q2 = _partials(src), _partials(dst)
    slots = -(-q1 // q2)
    r1, r2 = _replicas(src), _replicas(dst)
    ext1 = [dim_extents(shape[d], _cuts(src, d))[0] for d in range(ndim)]
    ext2 = [dim_extents(shape[d], _cuts(dst, d))[0] for d in range(ndim)]
    met_recv = [most_blocks_met(shape[d], _cuts(dst, d), _cuts(src, d)) for d in range(ndim)]
    met_send = [most_blocks_met(shape[d], _cuts(src, d), _cuts(dst, d)) for d in range(ndim)]
    v1 = math.prod(ext1) * itemsize
    v2 = math.prod(ext2) * itemsize
    p1, p2 = src.placement, dst.placement
    same = p1.hierarchy == p2.hierarchy and p1.rank_list == p2.rank_list
    kept = _kept(src, dst, ext1, ext2) * itemsize if same else 0
    local = 1 if kept > 0 else 0
    if v2 == 0:
        return P2pTraffic(0, 0, 0, 0, None)
    recv = max(slots * v2 - kept, 0)
    recv_msgs = max(slots * math.prod(met_recv) - local, 0)
    if same:  # the mesh sends what it receives, spread alike
        send, send_msgs = recv, recv_msgs
    else:
        send = -(-r2 // r1) * v1
        send_msgs = -(-math.prod(met_send) * r2 // r1)
    share = same or any(r in p2 for r in p1.rank_list)
    piece = [min(a, b) for a, b in zip(ext1, ext2)]
    send_copy = 0 if _contiguous(piece, ext1, [m > 1 or b < a for m, a, b in
                                               zip(met_send, ext1, ext2)]) else send
    recv_copy = 0 if _contiguous(piece, ext2, [m > 1 or a < b for m, a, b in
                                               zip(met_recv, ext1, ext2)]) else recv
    slot_copy = (slots - 1) * v2
    if share:
        messages = send_msgs + recv_msgs
        copy = kept + send_copy + recv_copy + slot_copy
    else:
        messages = max(send_msgs, recv_msgs)
        copy = max(send_copy, recv_copy + slot_copy)
    ops = {s.op for s in src.sbp if isinstance(s, Partial)}
    op = next(iter(ops)) if ops and q1 > q2 else None
    return P2pTraffic(send, recv, messages, copy, op)
