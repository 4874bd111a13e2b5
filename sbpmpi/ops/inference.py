"""Signature inference: pick the cheapest valid signature for an op call (no data, no MPI).

For every placement an input lives on (in argument order) and every combination of
the op's resolved signatures over the mesh axes (one per axis, axis 0 outermost), a
:class:`Candidate` costs

* the boxing of each tensor operand from its layout to the layout the signature needs,
  ``boxing.conversion_cost`` (0 when it already has it), and
* for a partial output, the reduction it will need later: the cost of converting the
  output from its partial layout to broadcast on the partial mesh axes (an all-reduce),
  less the same charge of each partial operand the op consumes as it is (that reduction
  was owed already and the op only hands it on, so ``P * B -> P`` or ``P + P -> P`` stay
  lazy while a partial made from split or broadcast inputs pays in full). Never below 0.

A candidate that needs a conversion boxing refuses (:func:`refusal`, the rule
:func:`sbpmpi.boxing.plan.check_conversion` applies: partial_max to partial_sum, say) is
not a candidate at all: inference never offers the planner a conversion it rejects, and
raises a ValueError naming the op and the operand layouts when no row is feasible.

The cheapest total wins. Ties (totals within a relative 1e-9) go to the candidate that
boxes the fewest operands, then to the first in enumeration order: placements in
argument order, then table rows lexicographically over the mesh axes (axis 0 most
significant), wildcard rows by increasing dim. All of this is a pure function of
metadata, so every rank makes the same choice.

Inside :func:`lazy_partial_outputs` a partial output is not charged at all: the backward
rules sum a gradient over the dims broadcasting added there (``unbroadcast``), and make a
weight's gradient from its matmul, so a gradient whose batch dim is split stays a local
``partial_sum`` and is reduced once where it meets its operand's layout (a data-parallel
bucket, or the engine's conversion), not moved before the sum to avoid a reduction it
needs anyway (the charge of a half-width reduction, two collectives, made small
half-width operands move).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..boxing.plan import why_meaningless as _boxing_refusal
from ..boxing.planner import axis_change_seconds, send_recv_step
from ..core.layout import Layout
from ..core.modes import current_modes, enter, leave
from ..core.placement import Placement
from ..core.sbp import SBP, Broadcast, NdSbp, Partial
from ..runtime import conversion_cost, cost_table
from ..tensor import GlobalTensor
from . import dispatch
from .call import OpCall
from .exactness import exact, scalar_class
from .signature import Resolved, admissible, format_table, resolve

__all__ = ["Candidate", "Inference", "infer", "TIE_RTOL", "PRUNE_ABOVE", "PRUNE_KEEP",
           "AxisEstimate", "ComboRank", "axis_change_cost", "axis_reduce_cost",
           "axis_estimates", "needed_layouts", "may_be_refused", "combo_rank", "choose",
           "clear_cache", "clear_if_table_changed", "refusal", "lazy_partial_outputs"]

#: Totals within this relative distance of the cheapest count as ties.
TIE_RTOL = 1e-9


def refusal(src: Layout, dst: Layout) -> str | None:
    """Why boxing refuses to convert ``src`` to ``dst`` (same shape), or None if it can.

    The one feasibility rule, shared with the planner (it is the rule
    :func:`sbpmpi.boxing.plan.check_conversion` applies); pure metadata.
    """
    if src == dst:
        return None
    return _boxing_refusal(src, dst)


def _feasible(ops: Sequence[Any], need: Sequence[Layout | None]) -> bool:
    return all(lay is None or refusal(o.layout, lay) is None for o, lay in zip(ops, need))


def _no_row(call: OpCall) -> ValueError:
    lays = "; ".join(f"{call.label(i)} {_sbp(o.sbp)} on {o.placement.ranks.tolist()}"
                     for i, o in enumerate(call.operands) if isinstance(o, GlobalTensor))
    return ValueError(f"{call.name}: no signature can be reached from the operand layouts "
                      f"({lays}): every row needs a conversion boxing refuses (a partial "
                      f"tensor can only become a partial of the same reduction); convert "
                      f"the operands to broadcast or a split first")


def _reduced(out: Layout) -> Layout:
    return Layout(out.shape, out.placement,
                  tuple(Broadcast() if isinstance(s, Partial) else s for s in out.sbp))


_COSTS: dict[tuple[Layout, Layout, int], float] = {}
_CACHE: dict[tuple[Any, ...], tuple[tuple[Candidate, ...], int, bool]] = {}
_CACHE_SIZE = 4096
_table: list[Any] = [None]  # the cost-table version the caches were filled under


@contextmanager
def lazy_partial_outputs() -> Iterator[None]:
    """Inside, inference charges nothing for a partial output's later reduction (the
    calls' fast-path keys say so: their entries apart from those chosen with it)."""
    scope = enter("lazy_partials", True)
    try:
        yield
    finally:
        leave(scope)


def clear_cache() -> None:
    """Forget cached inferences, conversion costs and fast-path entries."""
    _CACHE.clear()
    _COSTS.clear()
    dispatch.clear()


def clear_if_table_changed() -> None:
    """Clear the caches (:func:`clear_cache`) when the cost table in use has changed since
    they were filled (a new :func:`sbpmpi.runtime.cost_table.version`)."""
    v = cost_table.version()
    if v != _table[0]:
        clear_cache()
        _table[0] = v


def _cost(src: Layout, dst: Layout, itemsize: int) -> float:
    """``conversion_cost``, memoised (planning a conversion is not free and candidates
    share many); the memo is cleared when the cost table changes."""
    if src == dst:
        return 0.0
    key = (src, dst, itemsize)
    c = _COSTS.get(key)
    if c is None:
        if len(_COSTS) >= 8 * _CACHE_SIZE:
            _COSTS.clear()
        c = _COSTS[key] = float(conversion_cost(src, dst, itemsize))
    return c


def _partial_cost(out: Layout, itemsize: int) -> float:
    """The cost of making each partial mesh axis of ``out`` broadcast (0 if it has none)."""
    if not any(isinstance(s, Partial) for s in out.sbp):
        return 0.0
    return _cost(out, _reduced(out), itemsize)


@dataclass(frozen=True)
class Candidate:
    """One way to run the op: a placement and a resolved signature per mesh axis."""

    placement: Placement
    signatures: tuple[Resolved, ...]
    inputs: tuple[Layout | None, ...]  # required layout per operand (None for scalars)
    output: Layout
    moved: tuple[bool, ...]  # per operand: whether it needs boxing
    boxing: tuple[float, ...]  # modelled seconds per operand
    partial: float  # net charge for the output's later reduction
    order: int  # enumeration position (the final tie-break)

    @property
    def total(self) -> float:
        """Modelled seconds: boxing plus the partial-output charge."""
        return float(sum(self.boxing)) + self.partial

    @property
    def n_boxed(self) -> int:
        """Number of operands that need boxing."""
        return sum(self.moved)

    @property
    def signature(self) -> str:
        """The per-axis signatures, ``" x "``-joined on an N-d mesh."""
        return " x ".join(str(s) for s in self.signatures)


@dataclass(frozen=True, repr=False)
class Inference:
    """The candidates of an op call with their costs, and the chosen one."""

    call: OpCall
    candidates: tuple[Candidate, ...]
    chosen: int
    estimated: bool = False  # pruned search: costs are per-axis estimates (see PRUNE_ABOVE)

    @property
    def best(self) -> Candidate:
        return self.candidates[self.chosen]

    def __str__(self) -> str:
        call = self.call
        lines = [_header(call)]
        tens = [i for i, o in enumerate(call.operands) if isinstance(o, GlobalTensor)]
        head = ["", "#", "signature"] + [f"{call.label(i)} boxing" for i in tens] + \
            ["partial out", "total", "output"]
        rows = [head]
        multi_pl = len({c.placement for c in self.candidates}) > 1
        for k, c in enumerate(self.candidates):
            row = ["*" if k == self.chosen else "", str(k), c.signature]
            for i in tens:
                lay = c.inputs[i]
                assert lay is not None
                x = call.operands[i]
                row.append("-" if not c.moved[i] else
                           f"{_sbp(x.sbp)}->{_sbp(lay.sbp)} {_us(c.boxing[i])}")
            row += [_us(c.partial) if c.partial else "-", _us(c.total), _sbp(c.output.sbp)
                    + (f" on {c.placement.ranks.tolist()}" if multi_pl else "")]
            rows.append(row)
        widths = [max(len(r[j]) for r in rows) for j in range(len(head))]
        for r in rows:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        best = self.best
        lines.append(f"chosen: #{self.chosen} {best.signature}, output sbp {_sbp(best.output.sbp)}"
                     f" on {best.placement.ranks.tolist()}, modelled cost {_us(best.total)}")
        if self.estimated:
            lines.append(f"(large search: the {PRUNE_KEEP} cheapest combinations by a per-mesh-"
                         "axis estimate, each axis costed as the single step that changes it)")
        lines.append("(costs in microseconds from boxing.conversion_cost; a partial output is "
                     "charged the all-reduce it will need later, less those its partial "
                     "operands already owed; ties go to fewer boxed operands, then table order)")
        return "\n".join(lines)

    __repr__ = __str__

    def table(self) -> str:
        """The op's signature table."""
        return format_table(self.call.name, self.call.table)


def _sbp(nd: NdSbp) -> str:
    return "(" + ", ".join(str(s) for s in nd) + ")" if len(nd) > 1 else str(nd[0])


def _us(t: float) -> str:
    if t == float("inf"):
        return "inf"
    return f"{t * 1e6:.3g}us" if t else "0"


def _header(call: OpCall) -> str:
    parts = []
    for i, o in enumerate(call.operands):
        if isinstance(o, GlobalTensor):
            parts.append(f"{call.label(i)}: {o.shape} {o.dtype} {_sbp(o.sbp)} on "
                         f"{o.placement.ranks.tolist()}")
        else:
            parts.append(f"{call.label(i)}: scalar {o!r}")
    if call.params:
        parts.append(call.params)
    return f"{call.name}({'; '.join(parts)}) -> {call.out_shape} {call.out_dtype}"


def _placements(call: OpCall) -> list[Placement]:
    pls: list[Placement] = []
    for x in call.tensors:
        if x.placement not in pls:
            pls.append(x.placement)
    if not pls:
        raise TypeError(f"{call.name}: needs at least one GlobalTensor operand")
    types = {p.type for p in pls}
    if len(types) > 1:
        desc = ", ".join(f"{call.label(i)} on {o.placement.type!r}"
                         for i, o in enumerate(call.operands) if isinstance(o, GlobalTensor))
        raise TypeError(f"{call.name}: operands live on different device types ({desc}); "
                        f"move them to one with x.to_global(placement=...)")
    return pls


def _key(call: OpCall) -> tuple[Any, ...]:
    ops = tuple((o.layout, o.dtype) if isinstance(o, GlobalTensor)
                else (type(o), scalar_class(o)) for o in call.operands)
    return (call.name, call.table, tuple(sorted(call.dims.items())), call.out_shape,
            call.out_dtype, ops)


def infer(call: OpCall, exact_only: bool = False) -> Inference:
    """Enumerate and cost every candidate of ``call``; choose one (no communication).

    Results are cached per (op, table, operand layouts and dtypes), and cleared when the
    boxing cost table changes, as the choice depends on nothing else; every rank makes
    the same calls, so the caches agree.
    """
    pls = _placements(call)
    clear_if_table_changed()
    lazy = current_modes().lazy_partials
    key = (*_key(call), exact_only, lazy)
    hit = _CACHE.get(key)
    if hit is not None:
        return Inference(call, *hit)
    ops = call.operands
    is_t = [isinstance(o, GlobalTensor) for o in ops]
    in_ndims = [o.ndim if t else 0 for o, t in zip(ops, is_t)]
    in_dtypes = [o.dtype if t else None for o, t in zip(ops, is_t)]
    rows = resolve(call.table, call.dims, in_ndims, len(call.out_shape),
                   fixed=[not t for t in is_t])
    rows = tuple(r for r in rows if admissible(r, in_dtypes, call.out_dtype)
                 and exact(r, call.name, ops, call.out_dtype, tensors_finite=not exact_only))
    if not rows:
        raise RuntimeError(f"{call.name}: no signature applies (internal error: the table "
                           f"lacks an all-broadcast row)")
    out_item = call.out_dtype.itemsize
    cands: list[Candidate] = []
    estimated = False
    for pl in pls:
        if len(rows) ** pl.ndim > PRUNE_ABOVE and all(x.placement == pl for x in call.tensors):
            kept = _estimated(call, pl, rows, len(cands))
            if kept:  # else every kept estimate was refused: search them all
                cands.extend(kept)
                estimated = True
                continue
        for combo in itertools.product(rows, repeat=pl.ndim):
            need = tuple(Layout(o.shape, pl, tuple(r.inputs[i] for r in combo)) if is_t[i]
                         else None for i, o in enumerate(ops))
            if not _feasible(ops, need):
                continue
            moved = tuple(lay is not None and lay != o.layout for o, lay in zip(ops, need))
            costs = tuple(_cost(o.layout, lay, o.dtype.itemsize) if m and lay is not None
                          else 0.0 for o, lay, m in zip(ops, need, moved))
            out = Layout(call.out_shape, pl, tuple(r.output for r in combo))
            charge = 0.0 if lazy else _partial_cost(out, out_item)
            if charge:
                owed = sum(_partial_cost(o.layout, o.dtype.itemsize)
                           for o, t, m in zip(ops, is_t, moved) if t and not m)
                charge = max(0.0, charge - owed)
            cands.append(Candidate(pl, tuple(combo), need, out, moved, costs, charge,
                                   len(cands)))
    if not cands:
        raise _no_row(call)
    result = (tuple(cands), choose(cands), estimated)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()
    _CACHE[key] = result
    return Inference(call, *result)


#: Above this many combinations of rows over the mesh axes of one placement, inference
#: estimates instead of planning every conversion (see :func:`_estimated`).
PRUNE_ABOVE = 64
#: How many of the estimated combinations are kept as candidates (the cheapest ones).
PRUNE_KEEP = 8


class AxisEstimate(NamedTuple):
    """The estimated cost of one table row on one mesh axis (the pruned search)."""

    boxing: tuple[float, ...]  # per operand: the single step that changes that axis (0: none)
    charge: float  # the partial output's later reduction on that axis, less what is owed


class ComboRank(NamedTuple):
    """How the pruned search orders a combination of rows (one per mesh axis)."""

    total: float  # estimated seconds (inf when boxing refuses a conversion)
    moved: int  # operands boxed on some axis
    order: int  # enumeration position: rows lexicographically, axis 0 most significant


def axis_change_cost(lay: Layout, a: int, to: SBP, item: int, table: Any) -> float:
    """Seconds to change mesh axis ``a`` of ``lay`` to ``to``: the single step that does
    it; else through broadcast on that axis; else one general point-to-point
    redistribution (a valid plan, so an upper bound of the planner's optimum); inf when
    boxing refuses the change."""
    v = axis_change_seconds(lay, a, to, item, table)
    if v is not None:
        return v
    dst = Layout(lay.shape, lay.placement, lay.sbp[:a] + (to,) + lay.sbp[a + 1:])
    mid = Layout(lay.shape, lay.placement, lay.sbp[:a] + (Broadcast(),) + lay.sbp[a + 1:])
    v1 = axis_change_seconds(lay, a, Broadcast(), item, table)
    v2 = axis_change_seconds(mid, a, to, item, table)
    if v1 is not None and v2 is not None:
        return v1 + v2
    if refusal(lay, dst) is not None:
        return float("inf")
    return send_recv_step(lay, dst, item, table).seconds


def axis_reduce_cost(lay: Layout, a: int, item: int, table: Any) -> float:
    """Seconds to make a partial mesh axis ``a`` of ``lay`` broadcast (0 if no step does)."""
    v = axis_change_seconds(lay, a, Broadcast(), item, table)
    return 0.0 if v is None else v


def axis_estimates(call: OpCall, pl: Placement, rows: Sequence[Resolved], table: Any
                   ) -> list[list[AxisEstimate]]:
    """Per mesh axis ``a`` of ``pl`` and row ``k``: :class:`AxisEstimate` (``[a][k]``).

    An operand's boxing is the change of its axis ``a`` alone; the partial-output charge
    is the all-reduce of a partial output on that axis, less that of an operand the row
    consumes as it is (partial on that axis already)."""
    ops = call.operands
    out: list[list[AxisEstimate]] = []
    for a in range(pl.ndim):
        per_row = []
        for r in rows:
            box = tuple(axis_change_cost(o.layout, a, r.inputs[i], o.dtype.itemsize, table)
                        if isinstance(o, GlobalTensor) else 0.0 for i, o in enumerate(ops))
            charge = 0.0
            if isinstance(r.output, Partial) and not current_modes().lazy_partials:
                out_a = Layout(call.out_shape, pl, tuple(r.output if b == a else Broadcast()
                                                         for b in range(pl.ndim)))
                charge = axis_reduce_cost(out_a, a, call.out_dtype.itemsize, table)
                owed = sum(axis_reduce_cost(o.layout, a, o.dtype.itemsize, table)
                           for i, o in enumerate(ops) if isinstance(o, GlobalTensor)
                           and isinstance(o.sbp[a], Partial) and o.sbp[a] == r.inputs[i])
                charge = max(0.0, charge - owed)
            per_row.append(AxisEstimate(box, charge))
        out.append(per_row)
    return out


def needed_layouts(call: OpCall, pl: Placement, rows: Sequence[Resolved],
                   ks: Sequence[int]) -> tuple[Layout | None, ...]:
    """The layout each operand needs under rows ``ks`` (one per mesh axis; None: a scalar)."""
    return tuple(Layout(o.shape, pl, tuple(rows[k].inputs[i] for k in ks))
                 if isinstance(o, GlobalTensor) else None
                 for i, o in enumerate(call.operands))


def may_be_refused(call: OpCall, rows: Sequence[Resolved]) -> bool:
    """Whether boxing may refuse a conversion some combination of ``rows`` needs: only a
    partial operand boxed to a partial layout can be refused (see :func:`refusal`)."""
    return any(isinstance(o, GlobalTensor) and any(isinstance(s, Partial) for s in o.sbp)
               and any(isinstance(r.inputs[i], Partial) for r in rows)
               for i, o in enumerate(call.operands))


def combo_rank(call: OpCall, pl: Placement, rows: Sequence[Resolved],
               est: Sequence[Sequence[AxisEstimate]], ks: tuple[int, ...],
               check_refusal: bool) -> ComboRank:
    """The estimate of the combination ``ks`` of rows (one per mesh axis): the sum over its
    axes; inf when ``check_refusal`` and boxing refuses a conversion it needs (the
    per-axis estimates cannot see that a whole layout is unreachable)."""
    ops = call.operands
    ok = not check_refusal or _feasible(ops, needed_layouts(call, pl, rows, ks))
    total = sum(sum(est[a][k].boxing) + est[a][k].charge for a, k in enumerate(ks)) if ok \
        else float("inf")
    moved = sum(1 for i, o in enumerate(ops) if isinstance(o, GlobalTensor) and any(
        est[a][k].boxing[i] or rows[k].inputs[i] != o.sbp[a] for a, k in enumerate(ks)))
    order = 0
    for k in ks:
        order = order * len(rows) + k
    return ComboRank(total, moved, order)


def _estimated(call: OpCall, pl: Placement, rows: Sequence[Resolved],
               start: int) -> list[Candidate]:
    """The :data:`PRUNE_KEEP` cheapest combinations of ``rows`` over the mesh axes of ``pl``.

    The exhaustive search plans every operand conversion of every combination (``rows **
    mesh ndim`` of them, seconds on a 3-D mesh). Here each (mesh axis, row) is costed
    once (:func:`axis_estimates`), and a combination's estimate is the sum over its axes
    (:func:`combo_rank`); the cheapest combinations are kept, with these estimates as
    their costs. Pure and deterministic: every rank chooses alike.
    """
    est = axis_estimates(call, pl, rows, cost_table.get_cost_table())
    check_refusal = may_be_refused(call, rows)

    def rank(ks: tuple[int, ...]) -> ComboRank:
        return combo_rank(call, pl, rows, est, ks, check_refusal)

    best = heapq.nsmallest(PRUNE_KEEP, itertools.product(range(len(rows)), repeat=pl.ndim),
                           key=rank)
    out: list[Candidate] = []
    for ks in best:
        need = needed_layouts(call, pl, rows, ks)
        if not _feasible(call.operands, need):
            continue
        moved = tuple(lay is not None and lay != o.layout
                      for o, lay in zip(call.operands, need))
        costs = tuple(sum(est[a][k].boxing[i] for a, k in enumerate(ks)) if moved[i] else 0.0
                      for i in range(len(call.operands)))
        charge = sum(est[a][k].charge for a, k in enumerate(ks))
        combo = tuple(rows[k] for k in ks)
        out_lay = Layout(call.out_shape, pl, tuple(r.output for r in combo))
        out.append(Candidate(pl, combo, need, out_lay, moved, costs, charge,
                             start + rank(ks).order))
    return out


def choose(cands: Sequence[Candidate]) -> int:
    """Index of the cheapest candidate; ties: fewer boxed operands, then enumeration order."""
    best = min(c.total for c in cands)
    tol = TIE_RTOL * abs(best) + 1e-15
    tied = [k for k, c in enumerate(cands) if c.total <= best + tol]
    return min(tied, key=lambda k: (cands[k].n_boxed, cands[k].order))
