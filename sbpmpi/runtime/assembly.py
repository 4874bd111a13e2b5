"""Run the plan of ``sm.to_global`` of local arrays (:mod:`sbpmpi.boxing.assembly`).

:func:`assemble` turns this rank's local array into its shard of the planned layout,
through :mod:`sbpmpi.comm` only: uneven split arrays move to the balanced split by the
point-to-point blocks of the plan (the executor of boxing's ``send_recv`` steps,
:func:`.execute.run_moves`), so a rank receives only the rows it must hold and never
more than its own shard; along each broadcast mesh axis the first rank's shard is
broadcast to the others. The caller's array is never written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend, comm
from ..boxing.assembly import AssemblyPlan
from ..env import get_rank
from .execute import rank_moves, run_moves

__all__ = ["assemble"]


def assemble(local: Any, plan: AssemblyPlan, *, owned: bool = False) -> Any:
    """This rank's shard of ``plan.layout`` from its local array ``local`` (None or anything
    outside the placement).

    Collective over the ranks of the plan's placement (ranks outside return an empty
    shard at once). ``owned``: ``local`` is this call's to write into (else it is, or
    views, the caller's array, which stays unchanged). A balanced split or partial shard
    is returned as it is, without a copy, unless it is read-only (a memory-mapped file,
    say): a shard must be writable.
    """
    layout = plan.layout
    me = get_rank()
    if me not in layout.placement:
        return np.empty(layout.local_shape(me), dtype=plan.dtype)
    if plan.rebalanced:
        return _rebalanced(local, plan, me)
    if not owned and isinstance(local, np.ndarray) and not local.flags.writeable:
        local, owned = local.copy(), True
    if plan.broadcast_axes:
        return _broadcast_along_axes(local, plan, me, owned)
    return local


def _rebalanced(local: Any, plan: AssemblyPlan, me: int) -> Any:
    """This rank's balanced shard, in new memory, from the planned row moves."""
    layout = plan.layout
    dst_box = layout.local_ranges(me)
    moves = rank_moves(plan.moves, me, plan.source_box(me), dst_box)
    xp = backend.get_xp(layout.placement.type)
    out = backend.empty(xp, layout.local_shape(me), plan.dtype)
    backend.synchronize(local)  # a GPU array is complete before MPI reads it
    run_moves(moves, local, [out], xp, xp, layout.placement.type, True)
    return out


def _broadcast_along_axes(local: Any, plan: AssemblyPlan, me: int, owned: bool) -> Any:
    """The first rank's shard along each broadcast mesh axis, on every rank of the axis."""
    pl = plan.layout.placement
    arr = local
    for axis in plan.broadcast_axes:
        group = comm.get_group(pl.axis_group(me, axis))
        root = group.ranks[0]
        if (me != root and not owned) or not arr.flags.c_contiguous:
            arr, owned = arr.copy(order="C"), True  # the caller's array stays unchanged
        backend.synchronize(arr)
        comm.broadcast(arr, src=root, group=group)
    return arr
