"""The reduction vocabulary of the partial layouts: one table, no MPI.

Every place that needs to know what ``"sum"``, ``"max"`` or ``"min"`` means
(its display name, its identity per dtype, its array ufunc, its collective op)
reads it here. The collective op is named by the member name of
:class:`sbpmpi.comm.ReduceOp` so this module stays free of MPI; ``comm``
resolves it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .dtypes import is_floating

__all__ = ["Reduction", "REDUCTIONS", "NAMES", "reduction", "identity_value"]


@dataclass(frozen=True)
class Reduction:
    """One partial kind: ``op(a, b)`` elementwise, associative and commutative."""

    name: str        # "sum" | "max" | "min" (the ``Partial.op`` string)
    display: str     # short form in layouts: "P", "P(max)", "P(min)"
    ufunc: str       # name of the array-module ufunc (numpy/cupy): "add", "maximum", ...
    reduce_op: str   # member name of sbpmpi.comm.ReduceOp: "SUM", "MAX", "MIN"
    idempotent: bool  # op(x, x) == x (max, min): duplicates do not change the result
    ordered: bool    # needs ordered values (max, min): not defined for complex dtypes
    reduce: str      # array-module function reducing along axes: "sum", "max", "min"

    def ufunc_of(self, xp: ModuleType = np) -> Any:
        """The elementwise ufunc of ``xp`` (numpy or cupy) that combines two operands."""
        return getattr(xp, self.ufunc)

    def reduce_of(self, xp: ModuleType = np) -> Any:
        """The function of ``xp`` (numpy or cupy) that reduces an array along axes."""
        return getattr(xp, self.reduce)

    def defined_for(self, dtype: Any) -> bool:
        """Whether this reduction is defined for ``dtype`` (max and min need an order, so
        not complex)."""
        return not self.ordered or np.dtype(dtype).kind != "c"

    def identity(self, dtype: Any) -> Any:
        """The value ``e`` with ``op(x, e) == x`` for every ``x`` of ``dtype``.

        0 for sum; the lowest value of the dtype for max (-inf for floats); the
        highest for min.
        """
        dt = np.dtype(dtype)
        if self.name == "sum":
            return dt.type(0)
        if dt.kind == "b":
            return np.bool_(self.name == "min")
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return dt.type(info.min if self.name == "max" else info.max)
        if is_floating(dt):
            return dt.type(-np.inf if self.name == "max" else np.inf)
        raise TypeError(f"partial_{self.name} is not defined for dtype {dt} (no ordering)")


REDUCTIONS: dict[str, Reduction] = {
    "sum": Reduction("sum", "P", "add", "SUM", idempotent=False, ordered=False, reduce="sum"),
    "max": Reduction("max", "P(max)", "maximum", "MAX", idempotent=True, ordered=True,
                     reduce="max"),
    "min": Reduction("min", "P(min)", "minimum", "MIN", idempotent=True, ordered=True,
                     reduce="min"),
}

#: The names of the table, as error messages list them: "'sum', 'max', 'min'".
NAMES = ", ".join(map(repr, REDUCTIONS))


def reduction(op: str) -> Reduction:
    """The table row of ``op``; ValueError when it is not one of 'sum', 'max', 'min'."""
    try:
        return REDUCTIONS[op]
    except (KeyError, TypeError):
        raise ValueError(f"reduction {op!r} is not one of {NAMES}") from None


@functools.lru_cache(maxsize=128)
def identity_value(op: str, dtype: Any) -> Any:
    """The identity of reduction ``op`` for ``dtype`` (see :meth:`Reduction.identity`);
    made once per (op, dtype): a NumPy scalar made from a Python float is an allocation
    each time, in every conversion that fills a partial's non-holding ranks."""
    return reduction(op).identity(dtype)
