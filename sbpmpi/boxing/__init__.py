"""Boxing: how a global tensor's layout is converted, as pure functions of metadata.

The planner (:mod:`.plan`: the steps; :mod:`.planner`: their costs and the graph of a
conversion; :mod:`.search`: the cheapest path and the candidate plans), the cost model
(:mod:`.cost`, one alpha-beta table), the transfer schedule of a send/recv step
(:mod:`.schedule`), the plan of ``sm.to_global`` of local arrays (:mod:`.assembly`: the
checks of the exchanged shard shapes and the point-to-point row moves of uneven
splits), the explanation of a choice (:mod:`.explanation`) and the simple
assemble-and-slice oracle the tests compare with (:mod:`.reference`). Nothing here
communicates or touches array data: :mod:`sbpmpi.runtime` runs the plans.

The public ``sm.boxing`` namespace also offers the functions that act on tensors or on
this rank's cost table (``box``, ``gather_global``, ``plan_for``, ``explain_conversion``,
``conversion_cost``, ``calibrate``, ``get_cost_table``, ``set_cost_table``). They live
in the layers above (:mod:`sbpmpi.conversion`, :mod:`sbpmpi.runtime`), which the
composition root installs here (:mod:`sbpmpi.names_from_above`), imported on first use:
this package names no layer above it, and importing it stays pure.
"""

from __future__ import annotations

from typing import Any

from .. import names_from_above as _above
from .cost import CostTable
from .explanation import Explanation
from .plan import Plan, PlanChoice, Step, check_conversion, modelled_result
from .planner import candidate_plans, plan_conversion

__all__ = [
    "Plan", "PlanChoice", "Step", "Explanation", "CostTable", "candidate_plans",
    "plan_conversion", "modelled_result", "check_conversion",
    # installed from above by the composition root (sbpmpi/__init__)
    "box", "gather_global", "plan_for", "explain_conversion", "conversion_cost",
    "calibrate", "get_cost_table", "set_cost_table",
]


def __getattr__(name: str) -> Any:
    if name in _above.names(__name__):
        value = globals()[name] = _above.load(__name__, name)  # looked up once
        return value
    raise AttributeError(f"module 'sbpmpi.boxing' has no attribute {name!r}")
