"""Signature rows that are exact for finite operands only, and when they may be used.

A partial operand holds the reduction's identity on some ranks (0 for partial sums,
-inf / +inf for partial max / min). Combined with a non-finite value of the other,
broadcast operand, the identity gives NaN where NumPy gives inf: ``0 * inf``,
``0 / 0``, ``-inf + inf``, and in ``x @ w`` with an inf in ``w``. A scalar partner
is judged by its value when the signature is chosen (a scalar is part of the checked
metadata, so every rank decides alike); a tensor partner, whose values are unknown when
the signature is chosen, is checked when the row is about to run: if any rank's shard of it
holds inf or NaN, the op is inferred again without these rows, which boxes the partial
input first. Integer and bool results keep every row (their identities are finite).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.dtypes import is_floating
from ..core.sbp import Broadcast, Partial
from ..tensor import GlobalTensor
from .signature import Resolved

__all__ = ["exact", "risky_partners", "partners_finite", "scalar_class", "EXACT_PARTNERS"]


def _finite(v: Any) -> bool:
    return bool(np.isfinite(v))


def _finite_nonzero(v: Any) -> bool:
    return bool(np.isfinite(v)) and bool(v != 0)


def _never(v: Any) -> bool:
    return False


#: op name -> which broadcast partner values keep a row with a partial input exact
EXACT_PARTNERS: dict[str, Callable[[Any], bool]] = {
    "mul": _finite,             # (a1 + a2) * b: 0 * inf
    "div": _finite_nonzero,     # (a1 + a2) / b: 0 / 0
    "add": _finite,             # max(a_i) + b: -inf + inf
    "sub": _finite,             # max(a_i) - b, b - max(a_i)
    "matmul": _never,           # (a1 + a2) @ w: 0 * inf inside the sum (no scalar operands)
}


def exact(r: Resolved, name: str, operands: Sequence[Any], out_dtype: np.dtype,
          tensors_finite: bool = True) -> bool:
    """Whether row ``r`` of op ``name`` gives NumPy's result for these operands.

    Scalar partners are judged by value. Tensor partners pass when ``tensors_finite``
    (inference's first choice; execution checks the data before using such a row, see
    :func:`partners_finite`) and fail otherwise.
    """
    ok = EXACT_PARTNERS.get(name)
    if ok is None or (np.dtype(out_dtype).kind != "c" and not is_floating(out_dtype)):
        return True
    if not any(isinstance(s, Partial) for s in r.inputs):
        return True
    for s, o in zip(r.inputs, operands):
        if not isinstance(s, Broadcast):
            continue
        if isinstance(o, GlobalTensor):
            if not tensors_finite:
                return False
        elif not ok(o):
            return False
    return True


def risky_partners(rows: Sequence[Resolved], name: str, operands: Sequence[Any],
                   out_dtype: np.dtype) -> list[int]:
    """Tensor operands whose values decide whether ``rows`` (one per mesh axis) are exact."""
    if all(exact(r, name, operands, out_dtype, tensors_finite=False) for r in rows):
        return []
    return sorted({i for r in rows if any(isinstance(s, Partial) for s in r.inputs)
                   for i, (s, o) in enumerate(zip(r.inputs, operands))
                   if isinstance(s, Broadcast) and isinstance(o, GlobalTensor)})


def partners_finite(name: str, operands: Sequence[Any], which: Sequence[int]) -> bool:
    """This rank's verdict: the local shards of ``operands[which]`` hold only values the
    rows of ``name`` are exact for (finite; also nonzero for a divisor).

    A partner that is itself partial counts as not exact (its pending sum may overflow).
    Combine the verdicts of all ranks before acting (:func:`sbpmpi.comm.agreement.all_ok`).
    """
    for i in which:
        o = operands[i]
        if any(isinstance(s, Partial) for s in o.sbp):
            return False
        local = o.to_local()
        if not local.size:
            continue
        good = abs(local) < float("inf")
        if name == "div":
            good = good & (local != 0)
        if not bool(good.all()):
            return False
    return True


def scalar_class(v: Any) -> tuple[bool, bool]:
    """What :func:`exact` looks at in a scalar operand (part of inference's cache key)."""
    try:
        return bool(np.isfinite(v)), bool(v == 0)
    except TypeError:
        return False, False
