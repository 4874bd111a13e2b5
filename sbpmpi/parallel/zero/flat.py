"""The flat buffers of bucketed stages 2 and 3: a layer's parameters packed into one row
a rank of an ``(N, width)`` tensor, so that one conversion all-gathers them (and, in
backward, one reduce-scatters their gradients)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import backend
from ...core.layout import Layout, empty_shape
from ...core.sbp import Broadcast, split
from ...env import get_rank
from ...runtime import PendingConversion, start_redistribute
from ...tensor import GlobalTensor

__all__ = ["FlatGather", "flat_gather", "PendingGather", "start_flat"]


@dataclass(frozen=True)
class FlatGather:
    """One all-gather for the parameters of a layer: each rank packs its slices of them,
    one after the other, into a row of ``width`` elements (padded to the longest rank's);
    the rows are the ``split(0)`` shards of an ``(N, width)`` tensor that one conversion to
    broadcast all-gathers, and every rank cuts the whole parameters out of the rows. Pure
    copies: the parameters are bit-identical to gathering each on its own."""

    src: Layout  # (N, width), split(0) on the data-parallel axis
    dst: Layout  # (N, width), broadcast
    offsets: tuple[tuple[int, ...], ...]  # [axis coordinate][parameter] -> start in the row
    shapes: tuple[tuple[tuple[int, ...], ...], ...]  # [axis coordinate][parameter] -> shape
    row: int  # this rank's coordinate on the axis (-1 outside the placement)
    axis: int  # the data-parallel mesh axis


def flat_gather(leaves: list[GlobalTensor], axis: int) -> FlatGather | None:
    """The :class:`FlatGather` of ``leaves`` (None when they cannot share one: one
    parameter, several placements or dtypes, or a split on another mesh axis)."""
    pl, dtype = leaves[0].placement, leaves[0].dtype
    if len(leaves) < 2 or any(x.placement != pl or x.dtype != dtype or any(
            not isinstance(s, Broadcast) for i, s in enumerate(x.sbp) if i != axis)
            for x in leaves):
        return None
    me = get_rank()
    group = pl.axis_group(me if me in pl else int(pl.ranks.flat[0]), axis)
    shapes = tuple(tuple(x.layout.local_shape(r) for x in leaves) for r in group)
    offsets = tuple(tuple(int(o) for o in np.cumsum([0] + [int(np.prod(sh)) for sh in row])[:-1])
                    for row in shapes)
    width = max(1, max(int(sum(int(np.prod(sh)) for sh in row)) for row in shapes))
    n = len(group)
    sbp = tuple(split(0) if i == axis else Broadcast() for i in range(pl.ndim))
    return FlatGather(Layout((n, width), pl, sbp),
                       Layout((n, width), pl, (Broadcast(),) * pl.ndim),
                       offsets, shapes, group.index(me) if me in pl else -1, axis)


@dataclass(eq=False)
class PendingGather:
    """A layer's all-gather in flight: :meth:`wait` gives the whole parameters' shards."""

    flat: FlatGather | None
    leaves: list[GlobalTensor]
    dtype: np.dtype  # the gathered dtype
    pending: PendingConversion | None = None
    ready: list[Any] | None = None

    def wait(self) -> list[Any]:
        if self.ready is None:
            assert self.flat is not None and self.pending is not None
            rows = self.pending.wait()
            f, n = self.flat, len(self.leaves)
            if f.row < 0:
                xp = backend.get_xp(f.src.placement.type)
                self.ready = [xp.empty(empty_shape(x.ndim), dtype=self.dtype)
                              for x in self.leaves]
            else:
                self.ready = [backend.get_xp(f.src.placement.type).concatenate(
                    [rows[c, offs[i]:offs[i] + int(np.prod(sh[i]))].reshape(sh[i])
                     for c, (offs, sh) in enumerate(zip(f.offsets, f.shapes))])
                    for i in range(n)]
            self.pending = None
        return self.ready


def start_flat(flat: FlatGather, leaves: list[GlobalTensor],
               dtype: np.dtype | None = None) -> PendingGather:
    """Start the one all-gather of ``leaves`` (collective; non-blocking), in ``dtype``
    (the leaves' when None; a narrower one rounds each value once, as a cast)."""
    xp = backend.get_xp(flat.src.placement.type)
    dtype = leaves[0].dtype if dtype is None else np.dtype(dtype)
    if flat.row < 0:
        row = xp.empty(empty_shape(2), dtype=dtype)
    else:
        row = xp.zeros((1, flat.src.shape[1]), dtype=dtype)
        for x, off in zip(leaves, flat.offsets[flat.row]):
            local = x.to_local()
            row[0, off:off + local.size] = local.reshape(-1)
    return PendingGather(flat, leaves, dtype,
                         start_redistribute(row, flat.src, flat.dst, dtype))
