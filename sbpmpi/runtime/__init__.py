"""The runtime: conversions run on local arrays.

:func:`redistribute` is the one function that runs a conversion, with one program cache
(:func:`start_redistribute` starts one without waiting, where it can);
:mod:`.execute` compiles plans into programs of :mod:`sbpmpi.comm` calls;
:mod:`.assembly` runs the plan of ``sm.to_global`` of local arrays (point-to-point row
moves, broadcasts along broadcast mesh axes);
:mod:`.cost_table` keeps the cost table in use and :func:`calibrate` measures one.
Nothing here knows ``GlobalTensor``.
"""

from __future__ import annotations

from .calibrate import calibrate
from .cost_table import get_cost_table, set_cost_table
from .redistribution import (
    PendingConversion,
    check_dtype,
    conversion_cost,
    explain_layouts,
    plan_for_layouts,
    redistribute,
    start_redistribute,
)

__all__ = ["redistribute", "start_redistribute", "PendingConversion", "plan_for_layouts", "explain_layouts",
           "conversion_cost", "check_dtype", "calibrate", "get_cost_table", "set_cost_table"]
