"""Boxing: conversion of a global tensor between SBPs and placements.

Three separable parts: the planner (:mod:`.plan`, pure metadata), the cost table
(:mod:`.cost`, one alpha-beta model; :func:`calibrate` measures it) and the executor
(:mod:`.execute`, runs a plan through :mod:`sbpmpi.comm`). :mod:`.reference` is the
simple assemble-and-slice oracle the tests compare with.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import comm
from ..creation import check_device_available
from ..env import get_rank, get_world_size
from ..layout import Layout
from ..placement import Placement
from ..reduction import identity_value
from ..sbp import SBP, Broadcast, Partial
from ..tensor import GlobalTensor
from .calibrate import calibrate
from .cost import CostTable, get_cost_table, set_cost_table
from .execute import Program, compile_plan
from .explanation import Explanation
from .plan import Plan, PlanChoice, Step, check_conversion, meaningful, modelled_result
from .planner import candidate_plans, plan_conversion

__all__ = [
    "box", "gather_global", "conversion_cost", "explain_conversion", "calibrate",
    "plan_for", "Plan", "PlanChoice", "Step", "Explanation", "CostTable",
    "get_cost_table", "set_cost_table", "candidate_plans", "plan_conversion",
    "modelled_result", "check_conversion",
]


def _dst_layout(x: GlobalTensor, placement: Placement | None,
                sbp: SBP | Sequence[SBP] | None) -> Layout:
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"x must be a GlobalTensor, got {type(x).__name__}")
    if placement is None:
        placement = x.placement
    if not isinstance(placement, Placement):
        raise TypeError(f"placement must be an sm.placement, got {type(placement).__name__}")
    if sbp is None:
        if placement.ndim != x.placement.ndim:
            raise ValueError(
                f"sbp is required when the mesh changes from {x.placement.ndim}-d to "
                f"{placement.ndim}-d")
        sbp = x.sbp
    check_device_available(placement)  # on every rank, not only the placement's members
    return Layout.make(x.shape, placement, sbp)


def _check_dtype(src: Layout, dst: Layout, dtype: np.dtype) -> None:
    for s in src.sbp + dst.sbp:
        if isinstance(s, Partial):
            identity_value(s.op, dtype)  # TypeError for reductions the dtype lacks


_programs: dict[tuple[Any, ...], tuple[CostTable, Program]] = {}


def _program(src: Layout, dst: Layout, itemsize: int) -> Program:
    table = get_cost_table()
    key = (src, dst, itemsize, id(table))
    hit = _programs.get(key)
    if hit is not None:
        return hit[1]
    plan = plan_conversion(src, dst, itemsize, table)
    prog = compile_plan(plan, get_rank())
    if len(_programs) > 4096:
        _programs.clear()
    _programs[key] = (table, prog)
    return prog


def plan_for(x: GlobalTensor, placement: Placement | None = None,
             sbp: SBP | Sequence[SBP] | None = None) -> Plan:
    """The plan ``box(x, placement, sbp)`` runs (no communication)."""
    dst = _dst_layout(x, placement, sbp)
    check_conversion(x.layout, dst)
    _check_dtype(x.layout, dst, x.dtype)
    return plan_conversion(x.layout, dst, x.dtype.itemsize)


_fast: dict[tuple[Any, ...], tuple[Layout, Program | None, CostTable]] = {}


def box(x: GlobalTensor, placement: Placement | None = None,
        sbp: SBP | Sequence[SBP] | None = None) -> GlobalTensor:
    """Return ``x`` converted to ``placement`` and ``sbp`` (collective over the world).

    Every rank must make the same call. Arguments are checked before any communication,
    so an invalid conversion raises the same error on every rank. The result may share
    memory with ``x`` where a shard is unchanged (a view, as NumPy slicing gives).
    """
    table = get_cost_table()
    key: tuple[Any, ...] | None = None
    if isinstance(x, GlobalTensor) and not comm.checking():
        # a repeated conversion skips validation and planning: same key, same answer
        key = (x.layout, placement, tuple(sbp) if isinstance(sbp, list) else sbp, x.dtype,
               id(table))
        try:
            hit = _fast.get(key)
        except TypeError:  # unhashable arguments: take the slow path, which explains
            hit, key = None, None
        if hit is not None:
            dst, prog, _ = hit
            return x if prog is None else GlobalTensor(prog(x.to_local()), dst, x.dtype)
    dst = _dst_layout(x, placement, sbp)
    src = x.layout
    prog = None
    if dst != src:
        check_conversion(src, dst)
        _check_dtype(src, dst, x.dtype)
        if comm.checking():
            _agree(src, dst, x.dtype)
        prog = _program(src, dst, x.dtype.itemsize)
    if key is not None:
        if len(_fast) > 4096:
            _fast.clear()
        _fast[key] = (dst, prog, table)
    return x if prog is None else GlobalTensor(prog(x.to_local()), dst, x.dtype)


def _agree(src: Layout, dst: Layout, dtype: np.dtype) -> None:
    """Checked mode: every rank must ask for the same conversion."""
    sig = (str(src), str(dst), dtype.str)
    sigs = comm.all_gather_object(sig)
    for r, s in enumerate(sigs):
        if s != sigs[0]:
            raise ValueError(f"box: ranks disagree on the conversion: rank 0 converts "
                             f"{sigs[0][0]} to {sigs[0][1]} ({np.dtype(sigs[0][2])}) but rank "
                             f"{r} converts {s[0]} to {s[1]} ({np.dtype(s[2])})")


@functools.lru_cache(maxsize=8)
def _world(size: int) -> Placement:
    return Placement("cpu", list(range(size)))


def gather_global(x: GlobalTensor) -> np.ndarray:
    """The whole value of ``x`` as a new NumPy array on every world rank (collective)."""
    world = _world(get_world_size())
    y = box(x, world, (Broadcast(),))
    out = y.to_local()
    local = x.to_local()
    if isinstance(local, np.ndarray) and np.may_share_memory(out, local):
        out = out.copy()
    return out  # type: ignore[no-any-return]


def conversion_cost(src: Layout, dst: Layout, itemsize: int, device_type: str = "cpu") -> float:
    """Modelled seconds of the cheapest plan from ``src`` to ``dst`` (no communication).

    ``inf`` for conversions without a meaning (partial_max to partial_sum, say). Each
    step is charged with the parameters of the device type it runs on; ``device_type``
    is kept for callers that pass it.
    """
    if src == dst:
        return 0.0
    if src.shape == dst.shape and meaningful(src, dst) is not None:
        return float("inf")
    return plan_conversion(src, dst, int(itemsize)).seconds


def explain_conversion(x: GlobalTensor, placement: Placement | None = None,
                       sbp: SBP | Sequence[SBP] | None = None) -> Explanation:
    """The plan ``x.to_global(placement=..., sbp=...)`` would run, and the rejected ones.

    No communication; ``str()`` of the result is a readable table.
    """
    dst = _dst_layout(x, placement, sbp)
    check_conversion(x.layout, dst)
    _check_dtype(x.layout, dst, x.dtype)
    table = get_cost_table()
    return Explanation(candidate_plans(x.layout, dst, x.dtype.itemsize, table), x.dtype, table)
