"""Norms of global arrays: ``vector_norm`` and ``matrix_norm``.

Distributed reductions (:mod:`.reductions`): a split of a reduced axis gives partial
sums (or maxima) reduced across ranks, other splits stay. ``matrix_norm`` with ``ord``
2, -2 or ``"nuc"`` needs the singular values (:func:`.factorizations.svdvals`: by TSQR
for a split non-square matrix).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..core.dtypes import float32, is_floating, is_half
from ..ops.local import norm_axes
from ..tensor import GlobalTensor
from .factorizations import svdvals
from .reductions import largest, scalar_of, smallest, total
from .stacks import array_arg, matrices

__all__ = ["vector_norm", "matrix_norm"]


def vector_norm(x: GlobalTensor, /, *, axis: Any = None, keepdims: bool = False,
                ord: Any = 2) -> GlobalTensor:  # noqa: A002
    """The ``ord``-norm of the vectors along ``axis`` (all axes when None): ``inf`` the
    largest magnitude, ``-inf`` the smallest, ``0`` the count of nonzeros, else
    ``sum(|x|**ord)**(1/ord)``; distributed reductions (a split axis sums partials)."""
    array_arg("vector_norm", x)
    if x.dtype.kind != "c" and not is_floating(x.dtype):  # bfloat16 included
        raise TypeError(f"linalg.vector_norm: x must have a floating-point dtype, got "
                        f"{x.dtype}")
    if isinstance(ord, (bool, np.bool_)) or not isinstance(ord, (int, float, np.number)):
        raise TypeError(f"linalg.vector_norm: ord must be a number, got {ord!r}")
    axes = norm_axes("linalg.vector_norm", axis, x.ndim)
    keep = bool(keepdims)
    if is_half(x.dtype) and ord not in (0, float("inf"), float("-inf")):
        # a sum of powers: on x's float32 copy, the norm rounded once to x's dtype (the
        # ops' astype: the namespace's knows no half-width dtype)
        wide = vector_norm(ops.astype(x, float32), axis=axes, keepdims=keep, ord=ord)
        return ops.astype(wide, x.dtype)  # type: ignore[no-any-return]
    mag = ops.abs(x)
    if ord == float("inf"):
        return largest(mag, axes, keep)
    if ord == float("-inf"):
        return smallest(mag, axes, keep)
    if ord == 0:
        return total(ops.ne(x, scalar_of(0, x.dtype)), axes, keep, dtype=mag.dtype)
    if ord == 1:
        return total(mag, axes, keep)
    p = float(ord)
    summed = total(ops.pow(mag, scalar_of(p, mag.dtype)), axes, keep)
    return ops.pow(summed, scalar_of(1.0 / p, summed.dtype))  # type: ignore[no-any-return]


def matrix_norm(x: GlobalTensor, /, *, keepdims: bool = False,
                ord: Any = "fro") -> GlobalTensor:  # noqa: A002
    """The ``ord``-norm of each matrix: ``"fro"``, ``"nuc"`` (sum of singular values),
    1 / -1 (largest / smallest column sum of magnitudes), ``inf`` / ``-inf`` (row sums),
    2 / -2 (largest / smallest singular value)."""
    matrices("matrix_norm", x)
    keep = bool(keepdims)
    axes = (x.ndim - 2, x.ndim - 1)
    if isinstance(ord, str):
        if ord == "fro":
            return vector_norm(x, axis=axes, keepdims=keep)
        if ord != "nuc":
            raise ValueError(f"linalg.matrix_norm: ord {ord!r} is not 'fro', 'nuc', 1, -1, "
                             f"2, -2, inf or -inf")
    elif ord not in (1, -1, 2, -2, float("inf"), float("-inf")) or \
            isinstance(ord, (bool, np.bool_)):
        raise ValueError(f"linalg.matrix_norm: ord {ord!r} is not 'fro', 'nuc', 1, -1, 2, "
                         f"-2, inf or -inf")
    if ord in (1, -1, float("inf"), float("-inf")):
        # column sums for +-1, row sums for +-inf; then the largest or the smallest
        summed, other = (-2, -1) if ord in (1, -1) else (-1, -2)
        sums = total(ops.abs(x), summed, True)
        most = ord in (1, float("inf"))
        out = largest(sums, other, True) if most else smallest(sums, other, True)
    else:
        s = svdvals(x)
        out = total(s, -1) if ord == "nuc" else \
            largest(s, -1, False) if ord == 2 else smallest(s, -1)
        for _ in range(2):  # the namespace's expand_dims(out, axis=-1), twice
            out = ops.getitem(out, (slice(None),) * out.ndim + (None, Ellipsis))
    return out if keep else ops.reshape(out, x.shape[:-2])  # type: ignore[no-any-return]
