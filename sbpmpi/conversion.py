"""Converting a global tensor's layout: ``x.to_global``, ``sm.boxing.box``,
``gather_global``, and the plans and explanations of a conversion (no communication for
those two).

The tensor-level face of :func:`sbpmpi.runtime.redistribute`, the one door of every
layout change: the destination layout is derived from ``placement=``/``sbp=`` by
:meth:`sbpmpi.core.layout.Layout.converted` (the arguments' one validation, on every
rank before any communication) and the local shard is converted by ``redistribute``
(which validates and plans the conversion once per layouts and dtype). ``x.to_global``
adds the cross-rank consistency check (``SBPMPI_CHECK``), described once per distinct
step by :func:`sbpmpi.runtime.step_checks.conversion_check`, over the conversion's group
(the ranks of the source and destination placements); a rank outside it makes no check
and no MPI call: its result is an empty shard in the destination layout.

In comm's checked mode (``SBPMPI_COMM_CHECK=1``) a conversion makes one agreement
exchange: the consistency check's when the caller made it (``agreed=True``), else
``redistribute``'s own on the source and destination layouts.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import backend
from .boxing.explanation import Explanation
from .boxing.plan import Plan
from .core.layout import Layout
from .core.modes import current_modes
from .core.placement import Placement
from .core.sbp import SBP, Broadcast, Partial
from .env import get_rank, get_world_size
from .runtime import explain_layouts, plan_for_layouts, redistribute
from .runtime.consistency import check_broadcast_shards, check_step, is_outside, step_ranks
from .runtime.redistribution import program_for
from .runtime.step_checks import TO_GLOBAL, conversion_check, conversion_meta, step_check
from .tensor import GlobalTensor

__all__ = ["convert", "box", "gather_global", "plan_for", "explain_conversion", "destination",
           "grad_destination"]


def destination(x: GlobalTensor, placement: Placement | None,
                sbp: SBP | Sequence[SBP] | None) -> Layout:
    """The layout of ``x.to_global(placement=placement, sbp=sbp)``, checked on every rank."""
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"x must be a GlobalTensor, got {type(x).__name__}")
    dst = x.layout.converted(placement, sbp)
    backend.check_device_available(dst.placement)  # on every rank, not only the members
    return dst


# A repeated conversion (``y = x.to_global(...)`` in a loop) finds its checked destination
# here: after a large conversion has evicted the CPU caches, validating the arguments
# again costs tens of microseconds. Entries are made only for arguments that
# :func:`destination` accepted; a conversion that changes nothing is kept as _UNCHANGED
# (the caller then gets the tensor's own layout object, and needs no comparison).
_CACHE_SIZE = 4096
_UNCHANGED: Any = object()
_destinations: dict[tuple[Any, ...], Layout] = {}  # (layout, placement, sbp) -> destination
_grad_layouts: dict[tuple[Any, ...], Layout] = {}  # (x's layout, grad_sbp) -> its layout


def _destination(x: GlobalTensor, placement: Placement | None,
                 sbp: SBP | Sequence[SBP] | None) -> Layout:
    """:func:`destination`, cached for hashable arguments; ``x.layout`` itself (the same
    object) when the conversion changes nothing."""
    if type(x) is not GlobalTensor:
        return destination(x, placement, sbp)
    src = x._layout
    key = (src, placement, tuple(sbp) if type(sbp) is list else sbp)
    try:
        dst = _destinations.get(key)
    except TypeError:  # unhashable arguments: validated every time
        dst = destination(x, placement, sbp)
        return src if dst == src else dst
    if dst is None:
        dst = destination(x, placement, sbp)
        if dst == src:
            dst = _UNCHANGED
        if len(_destinations) >= _CACHE_SIZE:
            _destinations.clear()
        _destinations[key] = dst
    return src if dst is _UNCHANGED else dst


def grad_destination(x: GlobalTensor, grad_sbp: SBP | Sequence[SBP]) -> Layout:
    """The layout of the gradient that ``x.to_global(..., grad_sbp=grad_sbp)`` passes back
    to ``x`` in backward: ``x``'s shape and placement with ``grad_sbp`` (one SBP per mesh
    axis of ``x``'s placement), checked on every rank (no communication)."""
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"x must be a GlobalTensor, got {type(x).__name__}")
    key = (x.layout, tuple(grad_sbp) if type(grad_sbp) is list else grad_sbp)
    try:
        hit = _grad_layouts.get(key)
    except TypeError:  # unhashable arguments: validated every time
        return _grad_layout(x.layout, grad_sbp)
    if hit is None:
        hit = _grad_layout(x.layout, grad_sbp)
        if len(_grad_layouts) >= _CACHE_SIZE:
            _grad_layouts.clear()
        _grad_layouts[key] = hit
    return hit


def _grad_layout(src: Layout, grad_sbp: Any) -> Layout:
    try:
        layout = Layout.make(src.shape, src.placement, grad_sbp)
    except (TypeError, ValueError) as e:
        raise type(e)(f"x.to_global: grad_sbp={grad_sbp!r} is not an SBP of the gradient of x "
                      f"(shape {src.shape}, one SBP per axis of x's "
                      f"{src.placement.ndim}-d mesh): {e}") from None
    # gradients meet by addition (two uses of x, a leaf's .grad): a partial_max or
    # partial_min one could be neither added to another nor boxed to a partial_sum
    if any(isinstance(s, Partial) and s.op != "sum" for s in layout.sbp):
        raise ValueError(f"x.to_global: grad_sbp={grad_sbp!r}: a gradient is laid out as "
                         f"split, broadcast or partial_sum (gradients are summed), not "
                         f"partial_max or partial_min")
    return layout


def convert(x: GlobalTensor, placement: Placement | None = None,
            sbp: SBP | Sequence[SBP] | None = None,
            grad_sbp: SBP | Sequence[SBP] | None = None) -> GlobalTensor:
    """``x.to_global(placement, sbp, grad_sbp=grad_sbp)``: the consistency check
    (``SBPMPI_CHECK``; it covers ``grad_sbp`` when given) over the conversion's group,
    then :func:`box` (collective over that group). ``grad_sbp`` is validated here, before
    any communication of the conversion; :func:`grad_destination` gives its layout to the
    tape. A rank outside the group validates the arguments alike and gets an empty shard
    (no check, no MPI call)."""
    ranks = _conversion_ranks(x, placement)
    if is_outside(ranks):
        dst = _destination(x, placement, sbp)
        if grad_sbp is not None:
            grad_destination(x, grad_sbp)
        return _outside(x, dst)
    # checked before the arguments are validated, so that ranks passing different ones get
    # the mismatch rather than each its own error
    if grad_sbp is None:
        step = conversion_check(x, placement, sbp)
    else:
        grad_meta = conversion_meta(x, None, grad_sbp).sbp  # normalised against x's mesh
        step = step_check(TO_GLOBAL, (*conversion_meta(x, placement, sbp), grad_meta))
    agreed = check_step(TO_GLOBAL, step, ranks)
    check_broadcast_shards(x, "x.to_global input", ranks)
    dst = _destination(x, placement, sbp)
    if grad_sbp is not None:
        grad_destination(x, grad_sbp)
    return _converted(x, dst, agreed)


def _conversion_ranks(x: Any, placement: Any) -> tuple[int, ...] | None:
    """The group of ``x.to_global(placement, ...)``: the ranks of ``x``'s placement and of
    ``placement``; the world where either is not what it should be (the conversion then
    refuses it on every rank, after a world-wide check)."""
    if type(x) is not GlobalTensor:
        return None
    if placement is None:
        return step_ranks(x._layout.placement)
    if not isinstance(placement, Placement):
        return None
    return step_ranks(x._layout.placement, placement)


def _outside(x: GlobalTensor, dst: Layout) -> GlobalTensor:
    """``x`` converted to ``dst`` on a rank outside both placements: nothing moves, but the
    conversion is validated as on the members (its cached program)."""
    if dst is x._layout:
        return x
    program_for(x._layout, dst, x._dtype)  # a conversion without a meaning raises here too
    return GlobalTensor(np.empty(dst.local_shape(get_rank()), dtype=x._dtype), dst, x._dtype)


def box(x: GlobalTensor, placement: Placement | None = None,
        sbp: SBP | Sequence[SBP] | None = None, *, agreed: bool = False) -> GlobalTensor:
    """Return ``x`` converted to ``placement`` and ``sbp`` (collective over the world).

    Every rank must make the same call. Arguments are checked before any communication,
    so an invalid conversion raises the same error on every rank. A new layout gives a
    tensor in its own memory (writes into it never reach ``x``); ``x`` itself when the
    layout is unchanged. ``agreed``: the caller's consistency check already covered this conversion (checked
    mode then makes no exchange of its own).
    """
    return _converted(x, _destination(x, placement, sbp), agreed)


def _converted(x: GlobalTensor, dst: Layout, agreed: bool) -> GlobalTensor:
    """``x`` converted to the checked layout ``dst`` (from :func:`_destination`) by
    :func:`redistribute`; ``x`` itself when ``dst`` is its layout object."""
    src = x._layout
    local = redistribute(x._local, src, dst, x._dtype, agreed=agreed)
    if dst is src:  # unchanged: _destination hands back the tensor's own layout
        return x
    # a step may keep (a view of) this rank's shard: a block of a broadcast, the root's
    # share of a partial. The result owns its memory, so that writes into it (x[k] = v,
    # in place) never reach x on the ranks where the step kept it.
    if getattr(local, "base", None) is not None or local is x._local:
        xp = backend.get_xp(dst.placement.type) if backend.is_device_array(local) else np
        if xp.may_share_memory(local, x._local):
            # backend.empty: a call that reuses its arrays (backend.Reuse) gets this one too
            kept, local = local, backend.empty(xp, local.shape, local.dtype)
            xp.copyto(local, kept)
            # a step being captured as a graph: the copy is replayed too
            if (recorder := current_modes().recorder) is not None:
                recorder.kernel("copy", ("copy", dst), lambda a: a[0].copy(), [kept], local,
                                lambda a, out, s: xp.copyto(out, a[0]))
    return GlobalTensor(local, dst, x._dtype)


@functools.lru_cache(maxsize=8)
def _world(size: int) -> Placement:
    return Placement("cpu", list(range(size)))


def gather_global(x: GlobalTensor, *, agreed: bool = False) -> np.ndarray:
    """The whole value of ``x`` as a new NumPy array on every world rank (collective).

    ``agreed``: as for :func:`box`."""
    # a step being captured as a graph (sm.graph) cannot read a value
    if (recorder := current_modes().recorder) is not None:
        recorder.host_read(f"a read of the value of a tensor of shape {x.shape}")
    world = _world(get_world_size())
    y = box(x, world, (Broadcast(),), agreed=agreed)
    out = y.to_local()
    local = x.to_local()
    if isinstance(local, np.ndarray) and np.may_share_memory(out, local):
        out = out.copy()
    return out  # type: ignore[no-any-return]


def plan_for(x: GlobalTensor, placement: Placement | None = None,
             sbp: SBP | Sequence[SBP] | None = None) -> Plan:
    """The plan ``box(x, placement, sbp)`` runs (no communication)."""
    return plan_for_layouts(x.layout, destination(x, placement, sbp), x.dtype)


def explain_conversion(x: GlobalTensor, placement: Placement | None = None,
                       sbp: SBP | Sequence[SBP] | None = None) -> Explanation:
    """The plan ``x.to_global(placement=..., sbp=...)`` would run, and the rejected ones.

    No communication; ``str()`` of the result is a readable table.
    """
    return explain_layouts(x.layout, destination(x, placement, sbp), x.dtype)
