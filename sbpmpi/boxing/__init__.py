"""Boxing: conversion of a global tensor between SBPs and placements."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import backend, comm
from ..env import get_rank, get_world_size
from ..layout import Layout
from ..placement import Placement
from ..sbp import SBP
from ..tensor import GlobalTensor
from .reference import assemble, slice_for

__all__ = ["box", "gather_global"]


def gather_global(x: GlobalTensor) -> np.ndarray:
    """The whole value of ``x`` as a NumPy array on every world rank (collective)."""
    layout = x.layout
    counts = [int(np.prod(layout.local_shape(r))) if r in layout.placement else 0
              for r in range(get_world_size())]
    local = np.ascontiguousarray(backend.asnumpy(x.to_local())).reshape(-1)
    flat = np.empty(sum(counts), dtype=x.dtype)
    comm.all_gather_v(flat, local if counts[get_rank()] else local[:0], counts)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    shards = {r: flat[offsets[r]:offsets[r + 1]].reshape(layout.local_shape(r))
              for r in layout.placement.rank_list}
    return np.ascontiguousarray(assemble(np, layout, shards))


def box(x: GlobalTensor, placement: Placement | None = None,
        sbp: SBP | Sequence[SBP] | None = None) -> GlobalTensor:
    """Return ``x`` converted to ``placement`` and ``sbp`` (collective)."""
    if placement is None:
        placement = x.placement
    if not isinstance(placement, Placement):
        raise TypeError(f"placement must be an sm.placement, got {type(placement).__name__}")
    if sbp is None:
        if placement.ndim != x.placement.ndim:
            raise ValueError(
                f"sbp is required when the mesh changes from {x.placement.ndim}-d to "
                f"{placement.ndim}-d"
            )
        sbp = x.sbp
    dst = Layout.make(x.shape, placement, sbp)
    if dst == x.layout:
        return x
    value = gather_global(x)
    xp = np if get_rank() not in placement else backend.get_xp(placement.type)
    local = slice_for(xp, xp.asarray(value), dst, get_rank())
    return GlobalTensor(local, dst, x.dtype)
