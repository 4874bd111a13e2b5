"""Gradient clipping: ``clip_grad_norm_`` (one all-reduce for all parameters)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from .. import backend, ops
from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import PARTIALS, Broadcast, broadcast
from ..env import get_rank
from ..grad_mode import no_grad
from ..ops.reduction import reduced
from ..tensor import GlobalTensor

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters: GlobalTensor | Iterable[GlobalTensor], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> GlobalTensor:
    """Scale every gradient by ``max_norm / (total_norm + 1e-6)`` when that is below 1.

    ``total_norm`` is the ``norm_type`` norm of all gradients together (``inf``: the
    largest absolute value), returned as a 0-d broadcast tensor on the parameters'
    placement (when they have several, a 1-D placement of all their ranks). It costs one all-reduce for all parameters: each rank adds up its shards'
    terms, counting a shard held on several ranks of a broadcast mesh axis once (on the
    axis's first rank), and one reduction sums (or, for ``inf``, takes the max of) the
    ranks' terms. A partial gradient is reduced first (its shards' terms are not terms of
    the sum). Gradients are replaced by scaled copies, never scaled in place (a gradient
    tensor may be shared by several leaves). Collective.
    """
    params = [parameters] if isinstance(parameters, GlobalTensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, GlobalTensor):
            raise TypeError(f"clip_grad_norm_: parameters[{i}] must be a GlobalTensor, got "
                            f"{type(p).__name__}")
    if not params:
        raise ValueError("clip_grad_norm_: got no parameters")
    for name, v in (("max_norm", max_norm), ("norm_type", norm_type)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                np.floating)) or not v > 0:
            raise ValueError(f"clip_grad_norm_: {name} must be a positive number, got {v!r}")
    kinds = {p.placement.type for p in params}
    if len(kinds) > 1:
        raise ValueError(f"clip_grad_norm_: parameters live on several device types "
                         f"{sorted(kinds)}")
    norm_type = float(norm_type)
    grads = []
    for p in params:
        grads.append(None if p.grad is None else reduced(p.grad))
    present = [g for g in grads if g is not None]
    dtype = np.result_type(*[g.dtype for g in present]) if present else params[0].dtype
    places = {p.placement for p in params}
    where = places.pop() if len(places) == 1 else Placement(
        params[0].placement.type, sorted({r for p in params for r in p.placement.rank_list}))
    total = _norm_of(present, norm_type, where, np.dtype(dtype))
    value = float(total.item())
    if error_if_nonfinite and not math.isfinite(value):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                           f"gradients is {value}")
    coef = float(max_norm) / (value + 1e-6)
    if coef < 1:
        for p, g in zip(params, grads):
            if g is not None:
                with no_grad():
                    p.grad = ops.mul(g, np.asarray(coef, dtype=g.dtype)[()]).to_global(
                        sbp=p.sbp)
    return total



def _norm_of(grads: Sequence[GlobalTensor], norm_type: float, placement: Placement,
             dtype: np.dtype) -> GlobalTensor:
    """The ``norm_type`` norm of all ``grads`` (no partial ones) by one all-reduce."""
    me = get_rank()
    term = 0.0
    for g in grads:
        coord = g.placement.coord_of(me)
        if coord is None or any(isinstance(s, Broadcast) and c != 0
                                for s, c in zip(g.sbp, coord)):
            continue  # not held here, or a copy counted on the axis's first rank
        local = g.to_local()
        if not local.size:
            continue
        a = backend.get_xp(g.placement.type).abs(local.astype(np.float64))
        if norm_type == math.inf:
            term = max(term, float(a.max()))
        else:
            term += float((a ** norm_type).sum())
    kind = "max" if norm_type == math.inf else "sum"
    layout = Layout.make((), placement, (PARTIALS[kind],) * placement.ndim)
    # the local term on the placement's ranks (a partial value), reduced by one all-reduce
    local_term = backend.get_xp(placement.type).asarray(term, dtype=np.float64) \
        if me in placement else np.empty((), dtype=np.float64)
    reduced = GlobalTensor(local_term, layout, np.dtype(np.float64)).to_global(
        sbp=(broadcast,) * placement.ndim)
    with no_grad():
        out = reduced if norm_type in (1.0, math.inf) else ops.pow(reduced, 1.0 / norm_type)
        return out.astype(dtype) if dtype != np.float64 else out  # type: ignore[no-any-return]
