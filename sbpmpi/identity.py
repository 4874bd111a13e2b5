"""Identity elements of the partial reductions, per dtype."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["identity_value"]


def identity_value(op: str, dtype: Any) -> Any:
    """The value ``e`` with ``op(x, e) == x`` for every ``x`` of ``dtype``.

    0 for ``"sum"``; the lowest value of the dtype for ``"max"`` (-inf for floats);
    the highest for ``"min"``.
    """
    dt = np.dtype(dtype)
    if op == "sum":
        return dt.type(0)
    if op not in ("max", "min"):
        raise ValueError(f"reduction {op!r} is not one of 'sum', 'max', 'min'")
    if dt.kind == "b":
        return np.bool_(op == "min")
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return dt.type(info.min if op == "max" else info.max)
    if dt.kind == "f":
        return dt.type(-np.inf if op == "max" else np.inf)
    raise TypeError(f"partial_{op} is not defined for dtype {dt} (no ordering)")
