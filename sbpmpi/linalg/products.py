"""Products of global arrays: ``matmul``, ``matrix_transpose``, ``tensordot``, ``vecdot``
(also in the Array API's main namespace), ``outer`` and ``cross``.

``matmul`` and ``tensordot`` are sbpmpi's matmul op (its signatures split rows, columns,
the contracted dim or batch dims) with the standard's dtype promotion; ``vecdot`` and
``cross`` hold the contracted axis whole; ``outer`` is elementwise, so splits of either
vector stay.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from .. import ops
from ..core.standard_dtypes import promote
from ..ops.call import tensor_arg
from ..ops.elementwise import broadcast_matches
from ..ops.local import axis_op, broadcast_arrays, norm_axes, run_local
from ..tensor import GlobalTensor
from .stacks import array_arg

__all__ = ["matmul", "matrix_transpose", "tensordot", "vecdot", "outer", "cross"]


def _permuted(x: GlobalTensor, axes: tuple[int, ...]) -> GlobalTensor:
    """``x`` with its axes in the order ``axes`` (the namespace's ``permute_dims``)."""
    if x.ndim == 0:
        return ops.reshape(x, ())  # type: ignore[no-any-return]
    return ops.transpose(x, *axes)  # type: ignore[no-any-return]


def matmul(x1: GlobalTensor, x2: GlobalTensor, /) -> GlobalTensor:
    """Matrix product with NumPy's rules (1-D operands are a row or a column, then dropped):
    :func:`sbpmpi.ops.matmul`, with the standard's dtype promotion."""
    tensor_arg("matmul", x1, "x1")
    tensor_arg("matmul", x2, "x2")
    dt = promote(x1.dtype, x2.dtype)
    out = ops.matmul(x1, x2)
    return out if out.dtype == dt else ops.astype(out, dt)  # type: ignore[no-any-return]


def matrix_transpose(x: GlobalTensor, /) -> GlobalTensor:
    """``x`` with its last two axes swapped."""
    tensor_arg("matrix_transpose", x, "x")
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose: x must have at least 2 dims, got shape {x.shape}")
    n = x.ndim
    return ops.transpose(x, *range(n - 2), n - 1, n - 2)  # type: ignore[no-any-return]


def tensordot(x1: GlobalTensor, x2: GlobalTensor, /, *, axes: Any = 2) -> GlobalTensor:
    """Sum of products over ``axes`` (an int: the last of ``x1`` with the first of ``x2``;
    or two sequences of axes)."""
    tensor_arg("tensordot", x1, "x1")
    tensor_arg("tensordot", x2, "x2")
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
    a = ops.reshape(_permuted(x1, free1 + a1), (m, k))
    b = ops.reshape(_permuted(x2, a2 + free2), (k, n))
    out = matmul(a, b)
    return ops.reshape(out, tuple(x1.shape[d] for d in free1) + tuple(x2.shape[d] for d in free2)
                       )  # type: ignore[no-any-return]


def vecdot(x1: GlobalTensor, x2: GlobalTensor, /, *, axis: int = -1) -> GlobalTensor:
    """Dot product of vectors along ``axis`` (``x1`` conjugated), with broadcasting."""
    tensor_arg("vecdot", x1, "x1")
    tensor_arg("vecdot", x2, "x2")
    dt = promote(x1.dtype, x2.dtype)
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


def cross(x1: GlobalTensor, x2: GlobalTensor, /, *, axis: int = -1) -> GlobalTensor:
    """The cross product of 3-element vectors along ``axis`` (of the broadcast shape;
    negative), with broadcasting along the other dims."""
    array_arg("cross", x1, "x1")
    array_arg("cross", x2, "x2")
    for what, a in (("x1", x1), ("x2", x2)):
        if a.dtype.kind not in "iufc":
            raise TypeError(f"linalg.cross: {what} must have a numeric dtype, got {a.dtype}")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"linalg.cross: axis must be an int, got {axis!r}")
    if not -min(x1.ndim, x2.ndim) <= axis < 0:
        raise ValueError(f"linalg.cross: axis {axis} must be negative and name a dim of both "
                         f"x1 (shape {x1.shape}) and x2 (shape {x2.shape})")
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ValueError(f"linalg.cross: axis {axis} must have size 3 in x1 and x2, got "
                         f"shapes {x1.shape} and {x2.shape}")
    try:
        shape = tuple(int(n) for n in np.broadcast_shapes(x1.shape, x2.shape))
    except ValueError:
        raise ValueError(f"linalg.cross: shapes {x1.shape} and {x2.shape} cannot be broadcast "
                         f"together") from None
    dt = promote(x1.dtype, x2.dtype)
    d = len(shape) + axis
    carried = tuple(m for m in broadcast_matches([x1.shape, x2.shape], shape) if m.output != d)

    def kernel(xp: ModuleType, a: Any, b: Any) -> Any:
        return xp.cross(a.astype(dt), b.astype(dt), axis=axis)

    return run_local("linalg.cross", (x1, x2), kernel, shape, dt, carried)


def outer(x1: GlobalTensor, x2: GlobalTensor, /) -> GlobalTensor:
    """The outer product of two vectors (elementwise, so splits of either stay)."""
    for what, a in (("x1", x1), ("x2", x2)):
        array_arg("outer", a, what)
        if a.ndim != 1:
            raise ValueError(f"linalg.outer: {what} must be 1-D, got shape {a.shape}")
        if a.dtype.kind not in "iufc":
            raise TypeError(f"linalg.outer: {what} must have a numeric dtype, got {a.dtype}")
    return ops.mul(ops.reshape(x1, (x1.shape[0], 1)),  # type: ignore[no-any-return]
                   ops.reshape(x2, (1, x2.shape[0])))
