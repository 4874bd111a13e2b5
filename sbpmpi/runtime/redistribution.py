"""Run a layout conversion on local arrays: the one door from layouts to communication.

``redistribute(local, src, dst, dtype)`` takes this rank's shard of a tensor laid out as
``src`` and returns its shard laid out as ``dst``. It knows layouts and local arrays,
not ``GlobalTensor``; ``x.to_global`` (through :mod:`sbpmpi.conversion`), the operands
the ops box, the gradients autograd boxes and the checkpoints' conversions all call it.

There is one cache: ``(src, dst, dtype, cost-table version) -> compiled program``. A hit
runs the program; a miss plans the conversion with the cost table in use (the planner
validates it: the same error on every rank, before any communication), checks the dtype
and compiles the plan for this rank. In comm's checked mode (``SBPMPI_COMM_CHECK=1``) the
conversion is agreed on as a whole first (unless the caller's consistency check covered
it: ``agreed=True``) and its collectives skip their own exchange.

:func:`start_redistribute` is the same door, non-blocking where the conversion is one
all-gather of equal blocks (ZeRO stage 3 prefetches a layer's parameters with it while
the current layer computes); it returns a :class:`PendingConversion` to ``wait()`` on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import backend, comm
from ..boxing.cost import CostTable
from ..boxing.explanation import Explanation
from ..boxing.plan import Plan, Step, group_of, why_meaningless
from ..boxing.planner import candidate_plans, plan_conversion
from ..comm.agreement import checks
from ..core.layout import Layout
from ..core.modes import current_modes
from ..core.sbp import Split, check_partials
from ..env import get_rank
from . import cost_table
from .consistency import agree_on_conversion
from .execute import Program, compile_plan

__all__ = ["redistribute", "start_redistribute", "PendingConversion", "program_for", "clear_cache", "plan_for_layouts", "explain_layouts",
           "conversion_cost", "check_dtype"]

_CACHE_SIZE = 4096
_programs: dict[tuple[Layout, Layout, np.dtype, int], Program | None] = {}
_MISSING = object()


def clear_cache() -> None:
    """Forget the compiled programs (they are rebuilt on the next conversion)."""
    _programs.clear()


def check_dtype(src: Layout, dst: Layout, dtype: np.dtype) -> None:
    """TypeError (on every rank) for a partial kind ``dtype`` has no reduction for."""
    check_partials(src.sbp + dst.sbp, dtype)


def program_for(src: Layout, dst: Layout, dtype: Any) -> Program | None:
    """The compiled program converting ``src`` to ``dst`` on this rank (None: no change).

    Validated and planned on the first call for these layouts, dtype and cost table;
    cached after that. Only :func:`redistribute` runs it.
    """
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    key = (src, dst, dtype, cost_table.version())
    prog = _programs.get(key, _MISSING)
    if prog is not _MISSING:
        return prog  # type: ignore[return-value]
    prog = None
    if src != dst:
        plan = plan_conversion(src, dst, dtype.itemsize, cost_table.get_cost_table())
        check_dtype(src, dst, dtype)
        prog = compile_plan(plan, get_rank())
    if len(_programs) >= _CACHE_SIZE:
        _programs.clear()
    _programs[key] = prog
    return prog


def redistribute(local: Any, src: Layout, dst: Layout, dtype: Any, *,
                 agreed: bool = False) -> Any:
    """This rank's shard of the tensor laid out as ``dst``, from its shard ``local`` as ``src``.

    Collective over the ranks of both layouts' placements (every rank of the world may
    call it; ranks outside both return an empty shard). ``local`` is returned unchanged
    when ``src == dst``; the result may share memory with ``local`` where the shard is
    unchanged (a view, as NumPy slicing gives).

    ``agreed``: the caller's consistency check covered this conversion on every rank of
    the world; in comm's checked mode it then makes no agreement exchange of its own.
    Without it, checked mode makes one, and every rank of the world must call
    ``redistribute`` (members of neither placement too).
    """
    # a step being captured as a graph (sm.graph): replayed as this call
    if (recorder := current_modes().recorder) is not None:
        return recorder.conversion(
            (src, dst, np.dtype(dtype)), lambda a: _redistribute(a, src, dst, dtype, agreed),
            lambda a: _redistribute(a, src, dst, dtype, True), local)
    return _redistribute(local, src, dst, dtype, agreed)


def _redistribute(local: Any, src: Layout, dst: Layout, dtype: Any, agreed: bool) -> Any:
    if not checks.checking():
        prog = program_for(src, dst, dtype)
        return local if prog is None else prog(local)
    if not agreed:  # before anything returns: a rank with nothing to do takes part too
        agree_on_conversion(src, dst, np.dtype(dtype))
    prog = program_for(src, dst, dtype)
    if prog is None:
        return local
    with checks.agreed():  # agreed as a whole: its collectives skip their own exchange
        return prog(local)


class PendingConversion:
    """A conversion started by :func:`start_redistribute`: :meth:`wait` returns the shard
    (:meth:`test` lets MPI advance it and says whether it is done)."""

    __slots__ = ("_out", "_work", "_finish")

    def __init__(self, out: Any, work: comm.CollectiveWork | None,
                 finish: Callable[[], Any] | None = None) -> None:
        self._out = out
        self._work = work
        self._finish = finish  # a point-to-point program's wait, which makes the shard

    def test(self) -> bool:
        if self._finish is not None:
            return False  # its messages are tested by waiting (a pipeline waits where used)
        return self._work is None or self._work.test()

    def wait(self) -> Any:
        """This rank's shard in the destination layout (blocks until it has arrived)."""
        if self._finish is not None:
            finish, self._finish = self._finish, None
            self._out = finish()
        if self._work is not None:
            self._work.wait()
            self._work = None
        return self._out


def _even_gather(src: Layout, prog: Program | None, me: int) -> Step | None:
    """The program's one step when it is an all-gather of equal blocks along dim 0 (one
    ``MPI_Iallgather`` does it), else None."""
    if prog is None or len(prog.plan.steps) != 1 or me not in src.placement:
        return None
    st = prog.plan.steps[0]
    if st.kind != "all_gather" or not isinstance(st.frm, Split) or st.frm.dim != 0:
        return None
    assert st.axis is not None
    group = group_of(src.placement, me, st.axis, st.span)
    return st if len({src.local_shape(r) for r in group}) == 1 else None


def start_redistribute(local: Any, src: Layout, dst: Layout, dtype: Any) -> PendingConversion:
    """Start :func:`redistribute` (collective, on every rank of the world in the same
    order as the other conversions and collectives); ``wait()`` on the result gives the
    shard.

    Non-blocking when the conversion is one all-gather of equal blocks along dim 0 on
    one mesh axis (``comm.all_gather(..., async_op=True)``), or one point-to-point step
    (``send_recv``: between placements, a pipeline's activations and gradients;
    ``isend``/``irecv`` posted now, waited for by ``wait()``): ``local`` must not be
    written before the wait. Any other conversion runs now and its handle is complete.
    """
    dtype = np.dtype(dtype)
    if checks.checking():  # as redistribute does, before anything returns
        agree_on_conversion(src, dst, dtype)
    prog = program_for(src, dst, dtype)
    if prog is not None and not checks.checking():
        finish = prog.start(local)
        if finish is not None:
            return PendingConversion(None, None, finish)
    me = get_rank()
    st = _even_gather(src, prog, me)
    if st is None:
        return PendingConversion(redistribute(local, src, dst, dtype, agreed=True), None)
    assert st.axis is not None
    xp = backend.get_xp(src.placement.type)
    out = xp.empty(dst.local_shape(me), dtype=dtype)
    group = comm.get_group(group_of(src.placement, me, st.axis, st.span))
    send = xp.ascontiguousarray(local).reshape(-1)
    if checks.checking():
        with checks.agreed():
            work = comm.all_gather(out.reshape(-1), send, group, async_op=True)
    else:
        work = comm.all_gather(out.reshape(-1), send, group, async_op=True)
    return PendingConversion(out, work)


def plan_for_layouts(src: Layout, dst: Layout, dtype: Any) -> Plan:
    """The plan :func:`redistribute` runs from ``src`` to ``dst`` (no communication)."""
    dtype = np.dtype(dtype)
    plan = plan_conversion(src, dst, dtype.itemsize, cost_table.get_cost_table())
    check_dtype(src, dst, dtype)
    return plan


def explain_layouts(src: Layout, dst: Layout, dtype: Any) -> Explanation:
    """The chosen plan from ``src`` to ``dst`` and the rejected ones (no communication)."""
    dtype = np.dtype(dtype)
    table: CostTable = cost_table.get_cost_table()
    choice = candidate_plans(src, dst, dtype.itemsize, table)
    check_dtype(src, dst, dtype)
    return Explanation(choice, dtype, table)


def conversion_cost(src: Layout, dst: Layout, itemsize: int) -> float:
    """Modelled seconds of the cheapest plan from ``src`` to ``dst`` (no communication).

    ``inf`` for conversions without a meaning (partial_max to partial_sum, say). Each
    step is charged with the parameters of the device type it runs on (the placement's).
    """
    if src == dst:
        return 0.0
    if src.shape == dst.shape and why_meaningless(src, dst) is not None:
        return float("inf")
    return plan_conversion(src, dst, int(itemsize), cost_table.get_cost_table()).seconds
