"""Point-to-point schedules: which block goes from which rank to which (pure metadata).

Used by the ``send_recv`` and ``broadcast`` steps, which move a tensor between two
placements (or redistribute it arbitrarily on one).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..core.layout import Layout, balanced_range, shard_ranges
from ..core.sbp import Broadcast
from .plan import Box

__all__ = ["Transfer", "transfer_schedule", "slots_of", "is_contiguous_box", "relative",
           "broadcast_members", "BroadcastMembers", "PartialIndex", "rank_transfers", "Cut",
           "cuts_meeting", "split_axes"]


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


# -- one rank's part of a schedule, in O(its peers) ------------------------------------------------
#
# The blocks of a layout along one tensor dim are the nested balanced splits of the mesh
# axes that split that dim (in axis order): closed-form offsets, so the blocks that meet
# a range are found by descending the splits, never by listing every rank's block.

class Cut(NamedTuple):
    """A block along one tensor dim: its index on each mesh axis that splits the dim (in
    axis order) and its ``[start, stop)``."""

    position: tuple[int, ...]
    start: int
    stop: int


def split_axes(layout: Layout, dim: int) -> tuple[int, ...]:
    """The mesh axes that split tensor dim ``dim`` of ``layout``, in axis order."""
    return tuple(a for a, s in enumerate(layout.sbp) if getattr(s, "dim", None) == dim)


def _block_of(n: int, parts: int, x: int) -> int:
    """The index of the balanced block of ``n`` items in ``parts`` that holds item ``x``."""
    q, r = divmod(n, parts)
    big = r * (q + 1)
    return x // (q + 1) if x < big else r + (x - big) // q


def cuts_meeting(lo: int, hi: int, start: int, stop: int,
                 sizes: Sequence[int]) -> list[Cut]:
    """The non-empty blocks of ``[start, stop)`` split by mesh axes of ``sizes`` in turn
    (nested balanced splits) that meet ``[lo, hi)``; O(the blocks found) per level."""
    if not sizes:
        return [Cut((), start, stop)] if max(lo, start) < min(hi, stop) else []
    n, p = stop - start, sizes[0]
    a, b = max(lo, start), min(hi, stop)
    if a >= b:
        return []
    out: list[Cut] = []
    for k in range(_block_of(n, p, a - start), _block_of(n, p, b - 1 - start) + 1):
        s, e = balanced_range(n, p, k)
        for c in cuts_meeting(lo, hi, start + s, start + e, sizes[1:]):
            out.append(Cut((k, *c.position), c.start, c.stop))
    return out


def _partial_coords(layout: Layout, place: int) -> dict[int, int]:
    """The coordinates on the partial mesh axes of partial index ``place``."""
    h = layout.placement.hierarchy
    out: dict[int, int] = {}
    for a in reversed(layout.partial_axes()):
        place, out[a] = divmod(place, h[a])
    return out


def _free_axes(layout: Layout) -> tuple[int, ...]:
    """The broadcast mesh axes of ``layout``: a block's replicas differ only along them."""
    return tuple(a for a, s in enumerate(layout.sbp) if isinstance(s, Broadcast))


def _row_major(hierarchy: Sequence[int], coord: Sequence[int]) -> int:
    i = 0
    for n, c in zip(hierarchy, coord):
        i = i * n + c
    return i


def _chosen_source(src: Layout, holder: dict[int, int], box: Box, place: int, r2: int,
                   k2: int) -> int:
    """The rank of ``src`` that sends its block ``box`` (partial index ``place``; held at
    mesh coordinates ``holder`` on its split and partial axes) to destination rank ``r2``
    (position ``k2`` of the destination placement), as :func:`transfer_schedule` chooses
    it: ``r2`` itself when it holds that block, else the replicas in turn."""
    c = src.placement.coord_of(r2)
    if c is not None and src.local_ranges(r2) == box and _partial_index(src, c).place == place:
        return r2
    pl = src.placement
    free = _free_axes(src)
    j = k2 % math.prod(pl.hierarchy[a] for a in free)
    coord = dict(holder)
    for a in reversed(free):
        j, coord[a] = divmod(j, pl.hierarchy[a])
    return pl.rank_at(tuple(coord.get(a, 0) for a in range(pl.ndim)))


def _meeting_blocks(layout: Layout, box: Box) -> list[tuple[dict[int, int], Box]]:
    """The blocks of ``layout`` (their coordinates on the split mesh axes, and their boxes
    cut to ``box``) that meet ``box``."""
    pl = layout.placement
    per_dim: list[list[tuple[dict[int, int], tuple[int, int]]]] = []
    for d, (a, b) in enumerate(box):
        axes = split_axes(layout, d)
        if not axes:
            per_dim.append([({}, (a, b))] if a < b else [])
            continue
        cuts = cuts_meeting(a, b, 0, layout.shape[d], [pl.hierarchy[x] for x in axes])
        per_dim.append([(dict(zip(axes, c.position)), (max(a, c.start), min(b, c.stop)))
                        for c in cuts])
    out = []
    for combo in itertools.product(*per_dim):
        coord: dict[int, int] = {}
        for fixed, _ in combo:
            coord.update(fixed)
        out.append((coord, tuple(r for _, r in combo)))
    return out


def _receives(src: Layout, dst: Layout, me: int) -> list[Transfer]:
    """The transfers of :func:`transfer_schedule` into ``me``."""
    c2 = dst.placement.coord_of(me)
    b2 = dst.local_ranges(me)
    if c2 is None or b2 is None or any(b == a for a, b in b2):
        return []
    q1 = _partial_index(src, (0,) * src.placement.ndim).size
    mine = _partial_index(dst, c2)
    k2 = _row_major(dst.placement.hierarchy, c2)
    out: list[Transfer] = []
    for slot, q in enumerate(range(mine.place, q1, mine.size)):
        for fixed, inter in _meeting_blocks(src, b2):
            holder = {**fixed, **_partial_coords(src, q)}
            sender = _chosen_source(src, holder, _block_box(src, fixed), q, me, k2)
            out.append(Transfer(sender, me, slot, inter))
    return out


def _block_box(layout: Layout, fixed: dict[int, int]) -> Box:
    """The box of the block at coordinates ``fixed`` on the split mesh axes."""
    c = tuple(fixed.get(a, 0) for a in range(layout.placement.ndim))
    return shard_ranges(layout.shape, layout.placement.hierarchy, layout.sbp, c)


def _sends(src: Layout, dst: Layout, me: int) -> list[Transfer]:
    """The transfers of :func:`transfer_schedule` out of ``me`` to other ranks: to each
    destination rank whose block meets ``me``'s and does not hold ``me``'s block itself,
    when ``me`` is the replica whose turn it is (its place among the replicas)."""
    c1 = src.placement.coord_of(me)
    b1 = src.local_ranges(me)
    if c1 is None or b1 is None or any(b == a for a, b in b1):
        return []
    q = _partial_index(src, c1).place
    pl1, pl2 = src.placement, dst.placement
    h1, h2 = pl1.hierarchy, pl2.hierarchy
    q2 = _partial_index(dst, (0,) * pl2.ndim).size
    place = q % q2
    slot = (q - place) // q2
    fixed_p = _partial_coords(dst, place)
    free1 = _free_axes(src)
    replicas = math.prod(h1[a] for a in free1)
    turn = _row_major([h1[a] for a in free1], [c1[a] for a in free1])
    kept = [a for a in range(pl1.ndim) if a not in free1]  # a holder's coordinates there
    free2 = _free_axes(dst)
    out: list[Transfer] = []
    for fixed, inter in _meeting_blocks(dst, b1):
        for vals in itertools.product(*(range(h2[a]) for a in free2)):
            coord = {**fixed, **fixed_p, **dict(zip(free2, vals))}
            c2 = tuple(coord.get(a, 0) for a in range(pl2.ndim))
            if _row_major(h2, c2) % replicas != turn:
                continue
            r2 = pl2.rank_at(c2)
            c = pl1.coord_of(r2)
            if c is not None and all(c[a] == c1[a] for a in kept):
                continue  # r2 holds the block itself (or is me)
            out.append(Transfer(me, r2, slot, inter))
    return out


@functools.lru_cache(maxsize=4096)
def rank_transfers(src: Layout, dst: Layout, me: int) -> tuple[Transfer, ...]:
    """The transfers of :func:`transfer_schedule` that concern world rank ``me`` (sent,
    received or kept), computed from ``me``'s own blocks: O(its peers), not O(ranks^2).
    The same transfers as filtering the whole schedule (their order may differ; each pair
    of ranks exchanges at most one block)."""
    return tuple(_receives(src, dst, me) + _sends(src, dst, me))
