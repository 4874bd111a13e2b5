"""Converting a global tensor's layout: ``sm.boxing.box``, ``gather_global``, and the
plans and explanations of a conversion (no communication for those two).

The tensor-level face of :func:`sbpmpi.runtime.redistribute`: the destination layout is
derived from ``placement=``/``sbp=`` by :meth:`sbpmpi.core.layout.Layout.converted`,
checked on every rank before any communication, and the local shard is converted by the
runtime. ``x.to_global`` adds the cross-rank consistency check (``SBPMPI_CHECK``).

In comm's checked mode (``SBPMPI_COMM_CHECK=1``) a conversion makes one agreement
exchange: the consistency check's when the caller made it (``agreed=True``), else one of
its own on the source and destination layouts; its collectives then run inside
:func:`sbpmpi.comm.checks.agreed` and skip their own exchange.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import backend, comm
from .boxing.explanation import Explanation
from .boxing.plan import Plan
from .comm import agreement
from .comm.checks import agreed as agreed_calls
from .comm.exit_agreement import group_lines
from .core.layout import Layout
from .core.placement import Placement
from .core.sbp import SBP, Broadcast
from .env import get_world_size
from .errors import CollectiveMismatchError
from .runtime import explain_layouts, plan_for_layouts, program_for
from .runtime.consistency import (
    check_broadcast_shards,
    check_known_step,
    conversion_meta,
    step_text,
)
from .tensor import GlobalTensor

__all__ = ["convert", "box", "gather_global", "plan_for", "explain_conversion", "destination"]


def destination(x: GlobalTensor, placement: Placement | None,
                sbp: SBP | Sequence[SBP] | None) -> Layout:
    """The layout of ``x.to_global(placement=placement, sbp=sbp)``, checked on every rank."""
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"x must be a GlobalTensor, got {type(x).__name__}")
    dst = x.layout.converted(placement, sbp)
    backend.check_device_available(dst.placement)  # on every rank, not only the members
    return dst


# A repeated conversion (``y = x.to_global(...)`` in a loop) finds its destination and
# the text and fingerprint of its consistency check here, in one lookup: after a large
# conversion has evicted the CPU caches, each further lookup or description costs tens
# of microseconds. Entries are made only for arguments the full path has validated.
_Target = tuple[Layout, str, int]  # (checked destination, check text, its fingerprint)
_targets: dict[tuple[Any, ...], _Target] = {}  # (layout, dtype, placement, sbp) -> target


def _known(x: GlobalTensor, placement: Placement | None,
           sbp: SBP | Sequence[SBP] | None) -> tuple[tuple[Any, ...] | None, _Target | None]:
    """The cache key of converting ``x`` (None: not cached) and its target if cached."""
    if type(x) is not GlobalTensor:
        return None, None
    key = (x._layout, x._dtype, placement, tuple(sbp) if type(sbp) is list else sbp)
    try:
        return key, _targets.get(key)
    except TypeError:  # unhashable arguments: the full path explains
        return None, None


def _target(x: GlobalTensor, placement: Placement | None,
            sbp: SBP | Sequence[SBP] | None) -> _Target:
    """The destination of ``x.to_global(placement, sbp)`` (checked on every rank) and the
    step text and fingerprint of its consistency check."""
    key, target = _known(x, placement, sbp)
    if target is not None:
        return target
    dst = destination(x, placement, sbp)
    text, fp = step_text(TO_GLOBAL, conversion_meta(x, placement, sbp))
    target = (dst, text, fp)
    if key is not None:
        if len(_targets) >= 4096:
            _targets.clear()
        _targets[key] = target
    return target


TO_GLOBAL = "x.to_global"


def convert(x: GlobalTensor, placement: Placement | None = None,
            sbp: SBP | Sequence[SBP] | None = None) -> GlobalTensor:
    """``x.to_global(placement, sbp)``: the consistency check (``SBPMPI_CHECK``), then
    :func:`box` (collective over the world)."""
    target = _known(x, placement, sbp)[1]
    # arguments seen before: the check's text as described then; else described now
    # (and checked before the arguments are validated, so that ranks passing different
    # ones get the mismatch rather than each its own error)
    text, fp = target[1:] if target is not None else \
        step_text(TO_GLOBAL, conversion_meta(x, placement, sbp))
    agreed = check_known_step(TO_GLOBAL, text, fp)
    check_broadcast_shards(x, "x.to_global input")
    if target is None:
        return box(x, placement, sbp, agreed=agreed)
    return _convert(x, target[0], agreed)


def box(x: GlobalTensor, placement: Placement | None = None,
        sbp: SBP | Sequence[SBP] | None = None, *, agreed: bool = False) -> GlobalTensor:
    """Return ``x`` converted to ``placement`` and ``sbp`` (collective over the world).

    Every rank must make the same call. Arguments are checked before any communication,
    so an invalid conversion raises the same error on every rank. The result may share
    memory with ``x`` where a shard is unchanged (a view, as NumPy slicing gives).
    ``agreed``: the caller's consistency check already covered this conversion (checked
    mode then makes no exchange of its own).
    """
    return _convert(x, _target(x, placement, sbp)[0], agreed)


def _convert(x: GlobalTensor, dst: Layout, agreed: bool) -> GlobalTensor:
    """``x`` converted to the checked layout ``dst``."""
    src = x.layout
    checked = comm.checking()
    if checked and not agreed:  # before anything returns: a no-op rank takes part too
        _agree(src, dst, x.dtype)
    prog = program_for(src, dst, x.dtype)  # None (cached) when dst == src
    if prog is None:
        return x
    if not checked:
        return GlobalTensor(prog(x.to_local()), dst, x.dtype)
    with agreed_calls():  # agreed as a whole: its collectives skip their own exchange
        return GlobalTensor(prog(x.to_local()), dst, x.dtype)


def _agree(src: Layout, dst: Layout, dtype: np.dtype) -> None:
    """Checked mode: every rank must ask for the same conversion (one agreement exchange)."""
    sig = (str(src), str(dst), dtype.str)
    text = f"box({sig[0]} -> {sig[1]}, {dtype})"
    sigs = agreement.agree(agreement.fingerprint_of(repr(sig)), "box", text,
                           lambda: (text, sig))
    if sigs is None:
        return
    if not all(isinstance(d, tuple) and len(d) == 3 for _, d in sigs):  # another kind of step
        lines = group_lines([str(t) for t, _ in sigs], agreement.members(None)[1])
        raise CollectiveMismatchError("ranks disagree on a collective step:\n" + "\n".join(lines))
    for r, (_, s) in enumerate(sigs):
        if s != sigs[0][1]:
            s0 = sigs[0][1]
            raise ValueError(f"box: ranks disagree on the conversion: rank 0 converts "
                             f"{s0[0]} to {s0[1]} ({np.dtype(s0[2])}) but rank "
                             f"{r} converts {s[0]} to {s[1]} ({np.dtype(s[2])})")


@functools.lru_cache(maxsize=8)
def _world(size: int) -> Placement:
    return Placement("cpu", list(range(size)))


def gather_global(x: GlobalTensor, *, agreed: bool = False) -> np.ndarray:
    """The whole value of ``x`` as a new NumPy array on every world rank (collective).

    ``agreed``: as for :func:`box`."""
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
