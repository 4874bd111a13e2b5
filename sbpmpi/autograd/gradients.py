"""Adding a gradient into a leaf's ``.grad``, in the leaf's own layout (used by the
backward engine and by the gradient buckets)."""

from __future__ import annotations

from .. import ops
from ..core.sbp import Partial, broadcast
from ..tensor import GlobalTensor

__all__ = ["accumulate"]


def accumulate(leaf: GlobalTensor, g: GlobalTensor) -> None:
    """Add ``g`` to ``leaf.grad``, boxed to the leaf's placement, SBP and dtype."""
    if g.dtype != leaf.dtype:
        g = ops.astype(g, leaf.dtype)
    g = _in_layout_of(leaf, g)
    leaf._set_grad(g if leaf._grad is None else _in_layout_of(leaf, ops.add(leaf._grad, g)))


def _in_layout_of(leaf: GlobalTensor, g: GlobalTensor) -> GlobalTensor:
    """``g`` boxed to ``leaf``'s placement and SBP."""
    if g.layout == leaf.layout:
        return g
    if any(isinstance(s, Partial) and s.op != "sum" for s in leaf.sbp):
        # partial_max/min leaf: a partial_sum gradient (or sum of two gradients) cannot
        # become one directly, it is reduced first (a broadcast value is a valid
        # partial_max value)
        g = g.to_global(placement=leaf.placement, sbp=tuple(
            broadcast if isinstance(s, Partial) else s for s in leaf.sbp))
    return g.to_global(placement=leaf.placement, sbp=leaf.sbp)
