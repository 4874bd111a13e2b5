"""Local arrays to the shards of one global tensor: the checks and the plan (pure metadata).

``sm.to_global(local, placement=..., sbp=...)`` takes one array from each rank of the
placement. After the metadata exchange every rank knows every array's shape and dtype
(a :class:`LocalShard` per rank); :func:`plan_assembly` then checks them and plans the
data movement, identically on every rank and before any data moves:

- ``split(d)``: the global tensor is the arrays concatenated along ``d`` (N-d meshes: along
  each mesh axis that splits ``d``). Arrays that already are the layout's balanced split
  stay where they are; uneven ones (1-d meshes) reach it by point-to-point moves in
  which each rank sends only the rows another rank must hold (:func:`row_moves`, as
  :class:`~.schedule.Transfer` blocks): no rank ever holds more than its own array and
  its own shard;
- ``broadcast``: along each broadcast mesh axis the first rank's array is sent to the
  others (:attr:`AssemblyPlan.broadcast_axes`);
- ``partial_*``: the arrays' reduction; nothing moves.

:mod:`sbpmpi.runtime.assembly` runs the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.layout import Layout, balanced_sizes, block_starts
from ..core.placement import Placement
from ..core.sbp import SBP, Broadcast, NdSbp, Split, check_partials, normalize_nd_sbp
from .plan import Box
from .schedule import Transfer

__all__ = ["LocalShard", "RowMove", "AssemblyPlan", "check_shards", "global_shape", "row_moves",
           "plan_assembly"]


@dataclass(frozen=True)
class LocalShard:
    """What the metadata exchange tells every rank about one rank's local array."""

    shape: tuple[int, ...]
    #: ``np.dtype(...).str`` (the same text for the same dtype on every rank; bfloat16's
    #: name, which ``np.dtype`` reads back)
    dtype: str


@dataclass(frozen=True)
class RowMove:
    """Rows ``[start, stop)`` of the split dim (global indices) that the rank at position
    ``src`` of the placement holds and the rank at position ``dst`` must hold."""

    src: int
    dst: int
    start: int
    stop: int


@dataclass(frozen=True)
class AssemblyPlan:
    """How the local arrays become the shards of ``layout`` (see the module docstring).

    ``sources``: the box of the global tensor each rank's array holds, in the placement's
    rank order. ``rebalanced``: the arrays are not the balanced split, so each rank's
    shard is new memory filled by ``moves`` (blocks between world ranks; a block whose
    source and destination are the same rank is copied locally). ``broadcast_axes``: the
    mesh axes (of more than one rank) whose first rank's shard is sent to the others.
    """

    layout: Layout
    dtype: np.dtype
    sources: tuple[Box, ...]
    rebalanced: bool
    moves: tuple[Transfer, ...]
    broadcast_axes: tuple[int, ...]

    def source_box(self, rank: int) -> Box | None:
        """The box of the global tensor world rank ``rank``'s array holds (None outside)."""
        coord = self.layout.placement.coord_of(rank)
        if coord is None:
            return None
        return self.sources[self.layout.placement.rank_list.index(rank)]


def check_shards(placement: Placement, shards: Sequence[LocalShard]) -> None:
    """Raise unless the arrays (``shards``, one per rank of ``placement`` in its rank order)
    share one dtype and one number of dims. The same error on every rank, naming the
    ranks and their values."""
    ranks = placement.rank_list
    first = shards[0]
    for r, s in zip(ranks, shards):
        if s.dtype != first.dtype:
            raise TypeError(
                f"to_global: local arrays must share one dtype, but rank {ranks[0]} has "
                f"{np.dtype(first.dtype)} and rank {r} has {np.dtype(s.dtype)}")
    if len({len(s.shape) for s in shards}) != 1:
        raise ValueError(f"to_global: local arrays must have the same number of dims, got shapes "
                         f"{[s.shape for s in shards]} on ranks {list(ranks)}")


def _check_unsplit_dims(placement: Placement, nd_sbp: NdSbp,
                        shapes: Sequence[tuple[int, ...]]) -> None:
    """Raise unless every dim no mesh axis splits has one extent on every rank."""
    ranks = placement.rank_list
    split_dims = {s.dim for s in nd_sbp if isinstance(s, Split)}
    for r, shape in zip(ranks, shapes):
        for d in range(len(shape)):
            if d not in split_dims and shape[d] != shapes[0][d]:
                raise ValueError(
                    f"to_global: shards cannot form one global tensor: rank {r} has shape "
                    f"{shape} but rank {ranks[0]} has {shapes[0]} (dim {d} is not split, so "
                    f"it must be equal on every rank)")


def global_shape(placement: Placement, nd_sbp: NdSbp,
                 shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The global shape the arrays of ``shapes`` (in the placement's rank order) form: a
    split dim is the sum of its extents along the mesh axes that split it (over the ranks
    at coordinate 0 of every other axis), any other dim the first rank's extent."""
    ranks = placement.rank_list
    out = list(shapes[0])
    for d in range(len(out)):
        axes = [a for a, s in enumerate(nd_sbp) if isinstance(s, Split) and s.dim == d]
        if not axes:
            continue
        total = 0
        for r, shape in zip(ranks, shapes):
            c = placement.coord_of(r)
            assert c is not None
            if all(c[a] == 0 for a in range(placement.ndim) if a not in axes):
                total += shape[d]
        out[d] = total
    return tuple(out)


def row_moves(counts: Sequence[int], targets: Sequence[int]) -> tuple[RowMove, ...]:
    """The moves that turn rows held as ``counts`` (rank position i holds the i-th run of
    ``counts[i]`` rows of the concatenation) into rows held as ``targets``: each run of
    rows that one position holds and another must hold, in order (positions that keep
    rows appear too, with ``src == dst``). Empty runs are left out; every row is in
    exactly one move. A pure function of the counts, O(len(counts))."""
    if sum(counts) != sum(targets):
        raise ValueError(f"row_moves: {sum(counts)} rows held but {sum(targets)} wanted")
    moves: list[RowMove] = []
    i = j = 0
    row = 0  # the first row not yet assigned
    end_i, end_j = counts[0] if counts else 0, targets[0] if targets else 0
    while i < len(counts) and j < len(targets):
        stop = min(end_i, end_j)
        if stop > row:
            moves.append(RowMove(i, j, row, stop))
            row = stop
        if end_i <= end_j:  # position i has no rows left
            i += 1
            if i < len(counts):
                end_i += counts[i]
        else:
            j += 1
            if j < len(targets):
                end_j += targets[j]
    return tuple(moves)


def _split_box(shape: tuple[int, ...], dim: int, start: int, stop: int) -> Box:
    return tuple((start, stop) if d == dim else (0, n) for d, n in enumerate(shape))


def plan_assembly(placement: Placement, sbp: SBP | Sequence[SBP],
                  shards: Sequence[LocalShard]) -> AssemblyPlan:
    """Check the arrays described by ``shards`` (one per rank of ``placement``, in its rank
    order) against ``sbp`` and plan how they become the shards of one global tensor.

    The same result, or the same error, on every rank: a pure function of the exchanged
    metadata, O(number of ranks). Raises TypeError (dtypes differ, or a partial the dtype has no reduction
    for) or ValueError (dims differ, a dim no mesh axis splits differs, uneven shards on
    an N-d mesh) naming the ranks and their values.
    """
    check_shards(placement, shards)
    shapes = [s.shape for s in shards]
    nd_sbp = normalize_nd_sbp(sbp, placement.ndim, len(shapes[0]))
    dtype = np.dtype(shards[0].dtype)
    check_partials(nd_sbp, dtype)  # partial_max/min of complex: the same error on every rank
    _check_unsplit_dims(placement, nd_sbp, shapes)
    layout = Layout(global_shape(placement, nd_sbp, shapes), placement, nd_sbp)
    ranks = placement.rank_list
    balanced = all(layout.local_shape(r) == shape for r, shape in zip(ranks, shapes))
    broadcast_axes = tuple(a for a, s in enumerate(nd_sbp)
                           if isinstance(s, Broadcast) and placement.hierarchy[a] > 1)
    if balanced:
        sources = tuple(layout.local_ranges(r) or () for r in ranks)
        return AssemblyPlan(layout, dtype, sources, False, (), broadcast_axes)
    if placement.ndim != 1:
        raise ValueError(
            f"to_global: shard shapes {shapes} on ranks {list(ranks)} do not form a "
            f"balanced {tuple(nd_sbp)} layout of {layout.shape} on mesh "
            f"{placement.hierarchy}; on an N-d mesh shards must be balanced")
    # one mesh axis, a split dim whose extents differ from the balanced ones
    split = nd_sbp[0]
    assert isinstance(split, Split)
    d = split.dim
    counts = [shape[d] for shape in shapes]
    starts = block_starts(counts)
    sources = tuple(_split_box(layout.shape, d, a, a + n) for a, n in zip(starts, counts))
    moves = tuple(Transfer(ranks[m.src], ranks[m.dst], 0, _split_box(layout.shape, d, m.start,
                                                                        m.stop))
                  for m in row_moves(counts, balanced_sizes(layout.shape[d], len(ranks))))
    return AssemblyPlan(layout, dtype, sources, True, moves, ())
