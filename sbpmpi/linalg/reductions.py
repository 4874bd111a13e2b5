"""The reductions the norms and ``trace`` end with, by the Array API's rules: ``total``
sums in the standard's accumulator dtype (:func:`sbpmpi.core.standard_dtypes.sum_dtype`),
``smallest`` refuses an empty axis (min has no identity). Both are the ops' distributed
reductions: a split axis gives partial sums (or minima) reduced across ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..core.standard_dtypes import sum_dtype
from ..ops.local import norm_axes
from ..tensor import GlobalTensor

__all__ = ["total", "smallest", "largest", "scalar_of"]


def total(x: GlobalTensor, axis: Any, keepdims: bool = False, dtype: Any = None
          ) -> GlobalTensor:
    """The sum of ``x`` over ``axis`` in ``dtype`` (default: integers in (u)int64, floats
    in their own dtype), as the namespace's ``sum``."""
    axes = norm_axes("sum", axis, x.ndim)
    acc = sum_dtype(x.dtype, dtype)
    src = x if x.dtype == acc else ops.astype(x, acc)
    out = ops.sum(src, axes, keepdim=bool(keepdims))
    return out if out.dtype == acc else ops.astype(out, acc)  # type: ignore[no-any-return]


def smallest(x: GlobalTensor, axis: Any, keepdims: bool = False) -> GlobalTensor:
    """The smallest element of real ``x`` over ``axis``; ValueError over an empty axis."""
    axes = norm_axes("min", axis, x.ndim)
    if any(x.shape[d] == 0 for d in axes):
        raise ValueError(f"min: cannot reduce over axis {axis!r} of size 0 in an array of "
                         f"shape {x.shape} (min has no identity)")
    return ops.min(x, axes, keepdim=bool(keepdims))  # type: ignore[no-any-return]


def largest(mag: GlobalTensor, axis: Any, keepdims: bool) -> GlobalTensor:
    """The largest of the magnitudes ``mag`` over ``axis``; 0 over an empty axis, as in
    NumPy (the sum of no magnitudes)."""
    axes = norm_axes("linalg.norm", axis, mag.ndim)
    if any(mag.shape[d] == 0 for d in axes):
        return total(mag, axes, keepdims)
    return ops.max(mag, axes, keepdim=bool(keepdims))  # type: ignore[no-any-return]


def scalar_of(value: Any, dtype: np.dtype) -> Any:
    """A Python number as a NumPy scalar of ``dtype`` (the standard: a Python scalar takes
    the array's dtype)."""
    return np.asarray(value).astype(dtype)[()]
