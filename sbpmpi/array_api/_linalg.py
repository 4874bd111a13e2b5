"""Linear algebra in the main namespace: matmul, matrix_transpose, tensordot, vecdot.

``matmul`` and ``tensordot`` are sbpmpi's matmul op (its signatures split rows, columns,
the contracted dim or batch dims); ``vecdot`` holds the contracted axis whole.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from .. import ops
from ..ops.call import tensor_arg
from ..tensor import GlobalTensor
from ._dtypes import result_type
from ._local import axis_op, norm_axes
from ._manipulation import broadcast_arrays, permute_dims

__all__ = ["matmul", "matrix_transpose", "tensordot", "vecdot"]


_x = tensor_arg


def matmul(x1: GlobalTensor, x2: GlobalTensor, /) -> GlobalTensor:
    """Matrix product with NumPy's rules (1-D operands are a row or a column, then dropped):
    :func:`sbpmpi.ops.matmul`, with the standard's dtype promotion."""
    _x("matmul", x1, "x1")
    _x("matmul", x2, "x2")
    dt = result_type(x1, x2)
    out = ops.matmul(x1, x2)
    return out if out.dtype == dt else ops.astype(out, dt)  # type: ignore[no-any-return]


def matrix_transpose(x: GlobalTensor, /) -> GlobalTensor:
    """``x`` with its last two axes swapped."""
    _x("matrix_transpose", x, "x")
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose: x must have at least 2 dims, got shape {x.shape}")
    n = x.ndim
    return permute_dims(x, tuple(range(n - 2)) + (n - 1, n - 2))


def tensordot(x1: GlobalTensor, x2: GlobalTensor, /, *, axes: Any = 2) -> GlobalTensor:
    """Sum of products over ``axes`` (an int: the last of ``x1`` with the first of ``x2``;
    or two sequences of axes)."""
    _x("tensordot", x1, "x1")
    _x("tensordot", x2, "x2")
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        if not 0 <= axes <= min(x1.ndim, x2.ndim):
            raise ValueError(f"tensordot: axes={axes} must be in [0, {min(x1.ndim, x2.ndim)}]")
        a1 = tuple(range(x1.ndim - axes, x1.ndim))
        a2 = tuple(range(axes))
    else:
        s1, s2 = axes
        a1 = tuple(norm_axes("tensordot", a, x1.ndim)[0] for a in s1)
        a2 = tuple(norm_axes("tensordot", a, x2.ndim)[0] for a in s2)
        if len(a1) != len(a2):
            raise ValueError(f"tensordot: axes {axes} must name as many axes of x1 as of x2")
    for i, j in zip(a1, a2):
        if x1.shape[i] != x2.shape[j]:
            raise ValueError(f"tensordot: axis {i} of x1 (size {x1.shape[i]}) and axis {j} of "
                             f"x2 (size {x2.shape[j]}) differ")
    free1 = tuple(d for d in range(x1.ndim) if d not in a1)
    free2 = tuple(d for d in range(x2.ndim) if d not in a2)
    k = math.prod(x1.shape[d] for d in a1)
    m = math.prod(x1.shape[d] for d in free1)
    n = math.prod(x2.shape[d] for d in free2)
    a = ops.reshape(permute_dims(x1, free1 + a1), (m, k))
    b = ops.reshape(permute_dims(x2, a2 + free2), (k, n))
    out = matmul(a, b)
    return ops.reshape(out, tuple(x1.shape[d] for d in free1) + tuple(x2.shape[d] for d in free2)
                       )  # type: ignore[no-any-return]


def vecdot(x1: GlobalTensor, x2: GlobalTensor, /, *, axis: int = -1) -> GlobalTensor:
    """Dot product of vectors along ``axis`` (``x1`` conjugated), with broadcasting."""
    _x("vecdot", x1, "x1")
    _x("vecdot", x2, "x2")
    dt = result_type(x1, x2)
    a, b = broadcast_arrays(x1, x2)
    if a.ndim == 0:
        raise ValueError("vecdot: operands must have at least one dim")
    (d,) = norm_axes("vecdot", axis, a.ndim)
    if x1.shape[axis] != x2.shape[axis]:
        raise ValueError(f"vecdot: axis {axis} has size {x1.shape[axis]} in x1 and "
                         f"{x2.shape[axis]} in x2")
    shape = tuple(s for k, s in enumerate(a.shape) if k != d)
    kept = {k: (k if k < d else k - 1) for k in range(a.ndim) if k != d}

    def kernel(xp: ModuleType, p: Any, q: Any) -> Any:
        return xp.sum(xp.conj(p.astype(dt)) * q.astype(dt), axis=d, dtype=dt)

    return axis_op("vecdot", a, (d,), kernel, shape, dt, kept, b)
