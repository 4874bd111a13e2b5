"""Signature rows that are exact for finite operands only, and when they may be used.

A partial operand holds the reduction's identity on some ranks (0 for partial sums,
-inf / +inf for partial max / min). Combined with a non-finite value of the other,
broadcast operand, the identity gives NaN where NumPy gives inf: ``0 * inf``,
``0 / 0``, ``-inf + inf``, and in ``x @ w`` with an inf in ``w``. These rows are
therefore used only when every broadcast operand they combine the partial input with
is a scalar for which they are exact (a scalar is part of the checked metadata, so
every rank decides alike); a tensor operand, whose values are unknown when the
signature is chosen, makes inference box the partial input first. Integer and bool
results keep every row (their identities are finite).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..sbp import Broadcast, Partial
from ..tensor import GlobalTensor
from .signature import Resolved

__all__ = ["exact", "scalar_class", "RULES"]


def _finite(v: Any) -> bool:
    return bool(np.isfinite(v))


def _finite_nonzero(v: Any) -> bool:
    return bool(np.isfinite(v)) and bool(v != 0)


def _never(v: Any) -> bool:
    return False


#: op name -> which broadcast partner values keep a row with a partial input exact
RULES: dict[str, Callable[[Any], bool]] = {
    "mul": _finite,             # (a1 + a2) * b: 0 * inf
    "div": _finite_nonzero,     # (a1 + a2) / b: 0 / 0
    "add": _finite,             # max(a_i) + b: -inf + inf
    "sub": _finite,             # max(a_i) - b, b - max(a_i)
    "matmul": _never,           # (a1 + a2) @ w: 0 * inf inside the sum (no scalar operands)
}


def exact(r: Resolved, name: str, operands: Sequence[Any], out_dtype: np.dtype) -> bool:
    """Whether row ``r`` of op ``name`` gives NumPy's result for every value of these operands."""
    ok = RULES.get(name)
    if ok is None or np.dtype(out_dtype).kind not in "fc":
        return True
    if not any(isinstance(s, Partial) for s in r.inputs):
        return True
    for s, o in zip(r.inputs, operands):
        if isinstance(s, Broadcast) and (isinstance(o, GlobalTensor) or not ok(o)):
            return False
    return True


def scalar_class(v: Any) -> tuple[bool, bool]:
    """What :func:`exact` looks at in a scalar operand (part of inference's cache key)."""
    try:
        return bool(np.isfinite(v)), bool(v == 0)
    except TypeError:
        return False, False
