"""Point-to-point schedules: which block goes from which rank to which (pure metadata).

Used by the ``send_recv`` and ``broadcast`` steps, which move a tensor between two
placements (or redistribute it arbitrarily on one).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..core.layout import Layout
from .plan import Box

__all__ = ["Transfer", "transfer_schedule", "slots_of", "is_contiguous_box", "relative",
           "broadcast_members", "BroadcastMembers", "PartialIndex"]


def is_contiguous_box(box: Box, shape: Sequence[int]) -> bool:
    """True when the sub-box ``box`` (start, stop per dim) of a C-ordered array is one run."""
    ext = [b - a for a, b in box]
    if any(e == 0 for e in ext):
        return True
    k = -1
    for d in range(len(shape) - 1, -1, -1):
        if ext[d] != shape[d]:
            k = d
            break
    return all(e == 1 for e in ext[:max(k, 0)])


def relative(box: Box, origin: Box) -> Box:
    """``box`` in coordinates relative to the start of ``origin``."""
    return tuple((a - o, b - o) for (a, b), (o, _) in zip(box, origin))


@dataclass(frozen=True)
class Transfer:
    """Block ``box`` (global ranges) from world rank ``src`` to ``dst``, into slot ``slot``.

    A destination rank gathers one slot per partial contribution it reduces locally.
    """

    src: int
    dst: int
    slot: int
    box: Box


class PartialIndex(NamedTuple):
    """Where a rank sits among the partial sub-mesh of a layout (its partial mesh axes)."""

    #: the rank's place in the sub-mesh (row-major over the partial axes; 0 without any)
    place: int
    #: the number of ranks of the sub-mesh: the partial contributions (1 without any)
    size: int


def _partial_index(layout: Layout, coord: Sequence[int]) -> PartialIndex:
    """The :class:`PartialIndex` of the rank at mesh coordinate ``coord``."""
    h = layout.placement.hierarchy
    idx, q = 0, 1
    for a in layout.partial_axes():
        idx = idx * h[a] + coord[a]
        q *= h[a]
    return PartialIndex(idx, q)


def slots_of(src: Layout, dst: Layout, rank: int) -> int:
    """How many partial contributions ``rank`` of ``dst`` receives in a send_recv step."""
    c = dst.placement.coord_of(rank)
    if c is None:
        return 0
    mine = _partial_index(dst, c)
    q1 = _partial_index(src, (0,) * src.placement.ndim).size
    return len(range(mine.place, q1, mine.size))


@functools.lru_cache(maxsize=4096)
def transfer_schedule(src: Layout, dst: Layout) -> tuple[Transfer, ...]:
    """Blocks that move from ``src`` to ``dst`` (same shape, any placements).

    Source contribution q (the index among the partial sub-mesh; 0 without partial axes)
    goes to the destination ranks with partial index q mod Q2 (Q2 the size of the
    destination's partial sub-mesh), so each contribution counts exactly once. Each
    needed block comes from one replica: the destination rank itself when it holds
    one, else the replicas in turn. Empty blocks are not sent.
    """
    q1 = _partial_index(src, (0,) * src.placement.ndim).size
    by_q: list[dict[Box, list[int]]] = [{} for _ in range(q1)]
    for r in src.placement.rank_list:
        c = src.placement.coord_of(r)
        assert c is not None
        rng = src.local_ranges(r)
        assert rng is not None
        by_q[_partial_index(src, c).place].setdefault(rng, []).append(r)
    out: list[Transfer] = []
    for k2, r2 in enumerate(dst.placement.rank_list):
        c2 = dst.placement.coord_of(r2)
        assert c2 is not None
        mine = _partial_index(dst, c2)
        b2 = dst.local_ranges(r2)
        assert b2 is not None
        if any(b == a for a, b in b2):
            continue
        for slot, q in enumerate(range(mine.place, q1, mine.size)):
            for b1, ranks in by_q[q].items():
                inter = tuple((max(a1, a2), min(e1, e2)) for (a1, e1), (a2, e2) in zip(b1, b2))
                if any(b <= a for a, b in inter):
                    continue
                src_rank = r2 if r2 in ranks else ranks[k2 % len(ranks)]
                out.append(Transfer(src_rank, r2, slot, inter))
    return tuple(out)


class BroadcastMembers(NamedTuple):
    """The source rank of a broadcast step and its communicator (world ranks, sorted)."""

    root: int
    group: tuple[int, ...]


def broadcast_members(src: Layout, dst: Layout) -> BroadcastMembers:
    """Root and communicator of a broadcast step: the root and the ranks of ``dst`` that
    lack the value."""
    p1, p2 = src.placement, dst.placement
    inside = [r for r in p1.rank_list if r in p2]
    root = inside[0] if inside else p1.rank_list[0]
    return BroadcastMembers(root, tuple(sorted({root, *(r for r in p2.rank_list if r not in p1)})))
