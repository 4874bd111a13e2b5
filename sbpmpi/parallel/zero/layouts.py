"""The layouts of a sharded parameter: its ``split(0)`` and whole SBP on the
data-parallel axis, views and owned copies of its slices."""

from __future__ import annotations

from ...core.layout import Layout
from ...core.sbp import SBP, Broadcast, split
from ...env import get_rank
from ...tensor import GlobalTensor

__all__ = ["split_sbp", "whole_sbp", "owned", "view_of"]


def split_sbp(p: GlobalTensor, axis: int) -> tuple[SBP, ...] | None:
    """``p``'s SBP with ``split(0)`` on ``axis``; None when ``p`` is not shardable there."""
    if p.ndim == 0 or not isinstance(p.sbp[axis], Broadcast):
        return None
    return tuple(split(0) if i == axis else s for i, s in enumerate(p.sbp))


def owned(x: GlobalTensor) -> GlobalTensor:
    """``x`` with a shard of its own (a conversion to a split may return a view)."""
    return GlobalTensor(x.to_local().copy(), x.layout, x.dtype)


def view_of(whole: GlobalTensor, sbp: tuple[SBP, ...]) -> GlobalTensor:
    """``whole`` laid out as ``sbp`` (a split of it), its shard a view of ``whole``'s where
    this rank's block lies inside the block it holds (else a copy: with ``split(0)`` on
    two mesh axes, say, the blocks are cut in another order)."""
    layout = Layout(whole.shape, whole.placement, sbp)

    def inside(rank: int) -> bool:
        mine, held = layout.local_ranges(rank), whole.layout.local_ranges(rank)
        assert mine is not None and held is not None
        return all(h0 <= a and b <= h1 for (a, b), (h0, h1) in zip(mine, held))

    # decided from metadata for every rank of the placement: all ranks take one road
    if not all(inside(int(r)) for r in whole.placement.ranks.flat):
        return owned(whole.to_global(sbp=sbp))
    mine, held = layout.local_ranges(get_rank()), whole.layout.local_ranges(get_rank())
    if mine is None or held is None:  # outside the placement: an empty shard, as whole's
        return GlobalTensor(whole.to_local(), layout, whole.dtype)
    box = tuple(slice(a - h, b - h) for (a, b), (h, _) in zip(mine, held))
    return GlobalTensor(whole.to_local()[box], layout, whole.dtype)


def whole_sbp(leaf: GlobalTensor, axis: int) -> tuple[SBP, ...]:
    """``leaf``'s SBP with broadcast on ``axis`` (the whole parameter's)."""
    return tuple(Broadcast() if i == axis else s for i, s in enumerate(leaf.sbp))
