"""Statistical and utility functions: reductions over axes of a global array.

``sum``, ``mean``, ``max`` and ``min`` are sbpmpi's reduction ops (a split of a reduced
axis gives partial results, reduced across ranks); the others hold the reduced axes
whole on each rank (a split there is boxed first) and reduce with NumPy.
"""

from __future__ import annotations

import builtins
import math
from types import ModuleType
from typing import Any

import numpy as np

from .. import ops
from ..core.dtypes import accumulation_dtype, is_floating
from ..core.standard_dtypes import sum_dtype
from ..ops.local import axis_op, norm_axes
from ..tensor import GlobalTensor
from ._local import array_arg

__all__ = ["sum", "prod", "mean", "var", "std", "max", "min", "cumulative_sum",
           "cumulative_prod", "all", "any", "count_nonzero"]


def _floating_or_complex(dt: np.dtype) -> bool:
    """Whether ``dt`` is floating (bfloat16 included: sbpmpi's half width) or complex."""
    return dt.kind == "c" or is_floating(dt)


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool
                   ) -> tuple[tuple[int, ...], dict[int, int]]:
    kept = [d for d in range(len(shape)) if d not in axes]
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape)), {d: d for d in kept}
    return tuple(shape[d] for d in kept), {d: i for i, d in enumerate(kept)}


def _numpy_reduction(name: str, x: GlobalTensor, axis: Any, keepdims: bool, dtype: Any,
                     fn: Any) -> GlobalTensor:
    axes = norm_axes(name, axis, x.ndim)
    shape, kept = _reduced_shape(x.shape, axes, keepdims)

    def kernel(xp: ModuleType, a: Any) -> Any:
        return fn(xp, a, axes, keepdims)

    return axis_op(name, x, axes, kernel, shape, dtype, kept)


def sum(x: GlobalTensor, /, *, axis: Any = None, dtype: Any = None,  # noqa: A001
        keepdims: bool = False) -> GlobalTensor:
    """Sum over ``axis`` (all axes when None); integers sum in (u)int64 by default."""
    array_arg("sum", x)
    axes = norm_axes("sum", axis, x.ndim)
    acc = sum_dtype(x.dtype, dtype)
    src = x if x.dtype == acc else ops.astype(x, acc)
    out = ops.sum(src, axes, keepdim=bool(keepdims))
    return out if out.dtype == acc else ops.astype(out, acc)  # NumPy widens small integers


def prod(x: GlobalTensor, /, *, axis: Any = None, dtype: Any = None,
         keepdims: bool = False) -> GlobalTensor:
    """Product over ``axis``; integers multiply in (u)int64 by default."""
    array_arg("prod", x)
    acc = sum_dtype(x.dtype, dtype)
    work = accumulation_dtype(acc)  # float32 for a half-width result, rounded once
    return _numpy_reduction("prod", x, axis, keepdims, acc,
                            lambda xp, a, ax, k: xp.prod(a, axis=ax, keepdims=k, dtype=work))


def mean(x: GlobalTensor, /, *, axis: Any = None, keepdims: bool = False) -> GlobalTensor:
    """Arithmetic mean over ``axis`` (floating dtypes); NaN over an empty axis."""
    array_arg("mean", x)
    if not _floating_or_complex(x.dtype):
        raise TypeError(f"mean: x must have a floating dtype, got {x.dtype}")
    axes = norm_axes("mean", axis, x.ndim)
    if math.prod(x.shape[d] for d in axes) == 0:
        return _numpy_reduction("mean", x, axes, keepdims, x.dtype,
                                lambda xp, a, ax, k: xp.mean(a, axis=ax, keepdims=k))
    return ops.mean(x, axes, keepdim=bool(keepdims))


def _moment(name: str, x: GlobalTensor, axis: Any, correction: Any, keepdims: bool,
            root: bool) -> GlobalTensor:
    array_arg(name, x)
    if not _floating_or_complex(x.dtype):
        raise TypeError(f"{name}: x must have a floating dtype, got {x.dtype}")
    if isinstance(correction, bool) or not isinstance(correction, (int, float)):
        raise TypeError(f"{name}: correction must be a number, got {correction!r}")
    real = np.empty(0, x.dtype).real.dtype

    def fn(xp: ModuleType, a: Any, ax: tuple[int, ...], k: bool) -> Any:
        f = xp.std if root else xp.var
        return f(a, axis=ax, keepdims=k, ddof=correction)

    return _numpy_reduction(name, x, axis, keepdims, real, fn)


def var(x: GlobalTensor, /, *, axis: Any = None, correction: Any = 0.0,
        keepdims: bool = False) -> GlobalTensor:
    """Variance over ``axis`` with ``correction`` degrees of freedom removed."""
    return _moment("var", x, axis, correction, keepdims, root=False)


def std(x: GlobalTensor, /, *, axis: Any = None, correction: Any = 0.0,
        keepdims: bool = False) -> GlobalTensor:
    """Standard deviation over ``axis`` with ``correction`` degrees of freedom removed."""
    return _moment("std", x, axis, correction, keepdims, root=True)


def _extreme(name: str, x: GlobalTensor, axis: Any, keepdims: bool) -> GlobalTensor:
    array_arg(name, x)
    axes = norm_axes(name, axis, x.ndim)
    if builtins.any(x.shape[d] == 0 for d in axes):
        raise ValueError(f"{name}: cannot reduce over axis {axis!r} of size 0 in an array of "
                         f"shape {x.shape} ({name} has no identity)")
    if x.dtype.kind == "b":
        fn = np.all if name == "min" else np.any
        return _numpy_reduction(name, x, axes, keepdims, x.dtype,
                                lambda xp, a, ax, k: fn(a, axis=ax, keepdims=k))
    if x.dtype.kind == "c":
        raise TypeError(f"{name}: x must have a real dtype, got {x.dtype}")
    op = ops.max if name == "max" else ops.min
    return op(x, axes, keepdim=bool(keepdims))  # type: ignore[no-any-return]


def max(x: GlobalTensor, /, *, axis: Any = None, keepdims: bool = False  # noqa: A001
        ) -> GlobalTensor:
    """Largest element over ``axis`` (NaN wins); ValueError over an empty axis."""
    return _extreme("max", x, axis, keepdims)


def min(x: GlobalTensor, /, *, axis: Any = None, keepdims: bool = False  # noqa: A001
        ) -> GlobalTensor:
    """Smallest element over ``axis`` (NaN wins); ValueError over an empty axis."""
    return _extreme("min", x, axis, keepdims)


def _cumulative(name: str, x: GlobalTensor, axis: Any, dtype: Any, include_initial: bool
                ) -> GlobalTensor:
    array_arg(name, x)
    if axis is None:
        if x.ndim > 1:
            raise ValueError(f"{name}: axis is required for an array of {x.ndim} dims")
        axis = 0
    if x.ndim == 0:
        raise ValueError(f"{name}: x must have at least one dim")
    (d,) = norm_axes(name, axis, x.ndim)
    acc = sum_dtype(x.dtype, dtype)
    shape = tuple(n + 1 if k == d and include_initial else n for k, n in enumerate(x.shape))
    first = 0 if name == "cumulative_sum" else 1
    work = accumulation_dtype(acc)  # float32 for a half-width result, rounded once

    def kernel(xp: ModuleType, a: Any) -> Any:
        f = xp.cumsum if name == "cumulative_sum" else xp.cumprod
        out = f(a, axis=d, dtype=work)
        if include_initial:
            pad = list(out.shape)
            pad[d] = 1
            out = xp.concatenate([xp.full(pad, first, dtype=work), out], axis=d)
        return out

    return axis_op(name, x, (d,), kernel, shape, acc, {k: k for k in range(x.ndim)})


def cumulative_sum(x: GlobalTensor, /, *, axis: Any = None, dtype: Any = None,
                   include_initial: bool = False) -> GlobalTensor:
    """Running sum along ``axis`` (optional for 1-D arrays)."""
    return _cumulative("cumulative_sum", x, axis, dtype, include_initial)


def cumulative_prod(x: GlobalTensor, /, *, axis: Any = None, dtype: Any = None,
                    include_initial: bool = False) -> GlobalTensor:
    """Running product along ``axis`` (optional for 1-D arrays)."""
    return _cumulative("cumulative_prod", x, axis, dtype, include_initial)


def all(x: GlobalTensor, /, *, axis: Any = None, keepdims: bool = False  # noqa: A001
        ) -> GlobalTensor:
    """Whether every element over ``axis`` is true (nonzero; NaN counts as true)."""
    array_arg("all", x)
    return _numpy_reduction("all", x, axis, keepdims, np.bool_,
                            lambda xp, a, ax, k: xp.all(a, axis=ax, keepdims=k))


def any(x: GlobalTensor, /, *, axis: Any = None, keepdims: bool = False  # noqa: A001
        ) -> GlobalTensor:
    """Whether some element over ``axis`` is true (nonzero; NaN counts as true)."""
    array_arg("any", x)
    return _numpy_reduction("any", x, axis, keepdims, np.bool_,
                            lambda xp, a, ax, k: xp.any(a, axis=ax, keepdims=k))


def count_nonzero(x: GlobalTensor, /, *, axis: Any = None, keepdims: bool = False
                  ) -> GlobalTensor:
    """The number of nonzero elements over ``axis`` (int64)."""
    array_arg("count_nonzero", x)
    axes = norm_axes("count_nonzero", axis, x.ndim)
    nz = ops.astype(ops.ne(x, 0), np.int64) if x.dtype.kind != "b" else ops.astype(x, np.int64)
    return ops.sum(nz, axes, keepdim=bool(keepdims))
