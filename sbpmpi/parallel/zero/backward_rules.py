"""The tape's backward rules of ZeRO's own steps (recorded by the stages' modules only:
:mod:`.stage1`, :mod:`.params`, :mod:`.stage3`), declared to the autograd engine once
through :func:`sbpmpi.autograd.rules.register_rules`."""

from __future__ import annotations

import numpy as np

from ... import backend
from ...autograd.rules import Rule
from ...core.layout import Layout, empty_shape
from ...core.sbp import Broadcast, partial_sum
from ...env import get_rank
from ...tape import Node
from ...tensor import GlobalTensor

__all__ = ["ZERO_BACKWARD_RULES"]


def gather_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor]:
    """Backward of a stage-3 gather: reduce-scatter into the leaf, free the gathered copy
    (backward has used it: this rule runs after every rule of its consumers)."""
    leaf = node.inputs[0]
    (gathered,) = node.args
    if g.dtype != leaf.dtype:  # gathered in half width: reduce in the leaf's float32
        g = g.astype(leaf.dtype)  # an exact widening keeps the pending sum
    gx = g.to_global(placement=leaf.placement, sbp=leaf.sbp)
    gathered.free(only=gathered.operand_of(leaf))
    return [gx]


def unreduced_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor | None]:
    """Backward of a stage-1 parameter: its gradient added to ``.grad`` unreduced,
    ``partial_sum`` on the data-parallel axis (no communication; the sum over the ranks
    is the gradient), so that the optimizer's step reduce-scatters it instead of backward
    all-reducing it."""
    (p,) = node.inputs
    (axis,) = node.args
    sbp = tuple(partial_sum if i == axis else s for i, s in enumerate(p.sbp))
    if g.dtype != p.dtype:
        g = g.astype(p.dtype)
    g = g.to_global(placement=p.placement, sbp=sbp)
    old = p.grad
    if old is not None and old.layout != g.layout:  # a .grad set by hand
        old = old.to_global(placement=p.placement, sbp=sbp)
    p._set_grad(g if old is None else GlobalTensor(old.to_local() + g.to_local(), g.layout,
                                                   p.dtype))
    return [None]


def regather_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor]:
    """Backward reaches a stage-3 layer's output: its parameters are gathered again."""
    (gathered,) = node.args
    gathered.regather()
    return [g]


def unpack_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor]:
    """Backward of cutting parameter ``i`` out of a layer's flat buffer: its gradient,
    partial on the data-parallel axis, written into a zero buffer of the flat shape (the
    engine sums the layer's parameters' buffers, one reduce-scatter sends the sum); a
    stage-3 gathered copy is freed (backward has used it)."""
    flat, i, gathered = node.args
    xp = backend.get_xp(flat.src.placement.type)
    axis = flat.axis
    sbp = tuple(partial_sum if a == axis else Broadcast() for a in range(len(g.sbp)))
    local = g.to_global(placement=flat.dst.placement, sbp=sbp).to_local()
    me = get_rank()
    buf = xp.zeros(flat.dst.local_shape(me), dtype=g.dtype)
    if flat.row >= 0:
        start = 0
        for c, (offs, shapes) in enumerate(zip(flat.offsets, flat.shapes)):
            rows = shapes[i][0]
            n = int(np.prod(shapes[i]))
            buf[c, offs[i]:offs[i] + n] = local[start:start + rows].reshape(-1)
            start += rows
    if gathered is not None:
        gathered.free(only=gathered.operand_made_by(node))
    return [GlobalTensor(buf, Layout(flat.dst.shape, flat.dst.placement, sbp), g.dtype)]


def pack_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor]:
    """Backward of packing a layer's leaves into this rank's row: the reduce-scattered
    row cut into the leaves' gradients (views)."""
    (flat,) = node.args
    local = g.to_global(placement=flat.src.placement, sbp=flat.src.sbp).to_local()
    out = []
    for i, leaf in enumerate(node.inputs):
        if flat.row < 0:
            part = local.reshape(-1)[:0].reshape(empty_shape(leaf.ndim))
        else:
            shape = flat.shapes[flat.row][i]
            off = flat.offsets[flat.row][i]
            part = local[0, off:off + int(np.prod(shape))].reshape(shape)
        out.append(GlobalTensor(part, leaf.layout, g.dtype))
    return out


#: Op name -> backward rule, for the ops that only the ZeRO stages' modules record.
ZERO_BACKWARD_RULES: dict[str, Rule] = {
    "zero_gather": gather_rule,
    "zero_unreduced": unreduced_rule,
    "zero_regather": regather_rule,
    "zero_unpack": unpack_rule,
    "zero_pack": pack_rule,
}
