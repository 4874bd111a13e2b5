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

__all__ = ["box", "gather_global", "conversion_cost"]


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


def conversion_cost(src: Layout, dst: Layout, itemsize: int, device_type: str = "cpu") -> float:
    """Modelled seconds to convert a tensor from ``src`` to ``dst`` (placeholder model).

    Per-rank bytes for p ranks on one mesh axis: S->S (p-1)/p|T|/p, S->B (p-1)/p|T|,
    P->S (p-1)/p|T|, P->B 2(p-1)/p|T|; B->S, S->P, B->P are local. The planned engine
    replaces this with its cost table.
    """
    from ..sbp import Broadcast, Partial, Split

    if src == dst:
        return 0.0
    nbytes = float(np.prod(src.shape, dtype=np.float64)) * itemsize
    alpha, beta = 5e-6, 1e-10
    if src.placement != dst.placement or len(src.sbp) != len(dst.sbp):
        return alpha + beta * nbytes
    t = 0.0
    for axis, (a, b) in enumerate(zip(src.sbp, dst.sbp)):
        p = src.placement.hierarchy[axis]
        if a == b or p == 1:
            continue
        f = (p - 1) / p
        if isinstance(a, Split) and isinstance(b, Split):
            t += alpha + beta * f * nbytes / p
        elif isinstance(a, Split) and isinstance(b, Broadcast):
            t += alpha + beta * f * nbytes
        elif isinstance(a, Partial) and isinstance(b, Split):
            t += alpha + beta * f * nbytes
        elif isinstance(a, Partial) and isinstance(b, Broadcast):
            t += 2 * alpha + beta * 2 * f * nbytes
        elif isinstance(a, Partial) and isinstance(b, Partial):
            t += 3 * alpha + beta * 3 * f * nbytes
    return t
