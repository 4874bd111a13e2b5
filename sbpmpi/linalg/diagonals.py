"""The diagonals of stacks of matrices: ``diagonal`` and ``trace``."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..ops.elementwise import broadcast_matches
from ..ops.local import index_along, run_local
from ..tensor import GlobalTensor
from .reductions import total
from .stacks import matrices, stacked

__all__ = ["diagonal", "trace"]


def diagonal(x: GlobalTensor, /, *, offset: int = 0) -> GlobalTensor:
    """The ``offset`` diagonal of each matrix (above the main one when positive)."""
    matrices("diagonal", x, floating=False)
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"linalg.diagonal: offset must be an int, got {offset!r}")
    n, m = x.shape[-2:]
    size = max(0, min(n + min(offset, 0), m - max(offset, 0)))

    def kernel(xp: ModuleType, a: Any) -> Any:
        return xp.diagonal(a, offset=int(offset), axis1=-2, axis2=-1)

    return stacked("diagonal", x, kernel, (size,), x.dtype)


def trace(x: GlobalTensor, /, *, offset: int = 0, dtype: Any = None) -> GlobalTensor:
    """The sum of each matrix's ``offset`` diagonal, in ``dtype`` (default as ``sum``:
    integers in the default integer dtype)."""
    matrices("trace", x, floating=False, numeric=True)
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"linalg.trace: offset must be an int, got {offset!r}")
    k = int(offset)

    def kernel(xp: ModuleType, a: Any, i: Any, j: Any) -> Any:
        return xp.where(j - i == k, a, xp.zeros((), dtype=a.dtype))

    # the diagonal masked in place (elementwise, with index vectors), so a split matrix
    # dim stays split and the sum over the matrix dims adds partial sums
    rows = index_along(x.shape[-2], x.placement, True)
    cols = index_along(x.shape[-1], x.placement, False)
    shapes = [x.shape, rows.shape, cols.shape]
    on_diagonal = run_local("linalg.trace", (x, rows, cols), kernel, x.shape, x.dtype,
                            broadcast_matches(shapes, x.shape))
    return total(on_diagonal, (-2, -1), dtype=dtype)
