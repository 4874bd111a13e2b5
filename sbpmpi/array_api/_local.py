"""Namespace functions that are not registered ops, computed on local shards (creation
functions of index arrays, sorting and searching steps, axis-wise functions).

Each is an :class:`~sbpmpi.ops.OpCall` whose signature table has two rows: split a dim
the function carries whole (``S(d)`` on every operand holding it) and broadcast. Dims
the function mixes (a reduced axis, a sorted axis, a flipped axis) are never split, so
inference boxes an operand split along one (through ``runtime.redistribute``) and
partial operands are reduced first. The kernels are NumPy's (CuPy's) own functions on
the local shards, so special cases (NaN, infinities, signed zeros) are theirs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..core.dtypes import float32, is_half
from ..ops import OpCall, run_call
from ..ops.call import shape_of, tensor_arg
from ..ops.elementwise import broadcast_matches
from ..ops.signature import S_D, B, DimMatch, Signature
from ..tensor import GlobalTensor
from ._dtypes import result_type

__all__ = ["run_local", "elementwise", "axis_op", "norm_axes"]


def _table(n: int) -> tuple[Signature, ...]:
    return (Signature((S_D,) * n, S_D), Signature((B,) * n, B))


def run_local(name: str, operands: Sequence[Any], kernel: Callable[..., Any],
              out_shape: tuple[int, ...], dtype: np.dtype,
              carried: tuple[DimMatch, ...]) -> GlobalTensor:
    """Run ``kernel(xp, *local_operands)`` on each rank's shards; ``carried``: the dims
    each output dim is (may stay split in). A kernel's result is broadcast to the local
    output shape when it has fewer elements (``broadcast_to``)."""
    ops_ = tuple(operands)

    def k(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = xp.asarray(kernel(xp, *local))
            if res.shape != shape:  # a kernel may leave broadcasting to the output to here
                res = xp.broadcast_to(res, shape)
            if is_half(dtype) and res.dtype == float32:
                return res  # computed from widened operands: local_result rounds it once
            return res.astype(dtype, copy=True)

    call = OpCall(name, ops_, _table(len(ops_)), {"d": carried}, tuple(out_shape),
                  np.dtype(dtype), k, labels=tuple(f"x{i + 1}" for i in range(len(ops_))))
    return run_call(call)


def elementwise(name: str, f: Callable[..., Any], *args: Any,
                dtype: np.dtype | None = None, scalar_dtype: np.dtype | None = None
                ) -> GlobalTensor:
    """``f(xp, *args)`` elementwise with broadcasting, on global arrays and Python scalars;
    the result dtype is ``dtype``, else NumPy's for the promoted operands. Python scalars
    become ``scalar_dtype``, else the dtype the arguments promote to."""
    if not any(isinstance(a, GlobalTensor) for a in args):
        raise TypeError(f"{name}: at least one argument must be a global array")
    for a in args:
        if not isinstance(a, (GlobalTensor, int, float, complex, np.generic)):
            raise TypeError(f"{name}: arguments must be global arrays or Python scalars, got "
                            f"{type(a).__name__} {a!r}")
    shapes = [shape_of(a) for a in args]
    try:
        out_shape = tuple(int(n) for n in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{name}: shapes {', '.join(map(str, shapes))} cannot be broadcast "
                         f"together") from None
    # a Python scalar takes the arrays' dtype (the standard's rule), as a NumPy scalar
    common = result_type(*args) if scalar_dtype is None else scalar_dtype
    operands = [a if isinstance(a, GlobalTensor) else np.asarray(a).astype(common)[()]
                for a in args]
    if dtype is None:
        stand = [np.ones((), dtype=a.dtype) if isinstance(a, GlobalTensor) else a
                 for a in operands]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dtype = np.asarray(f(np, *stand)).dtype

    def kernel(xp: ModuleType, *local: Any) -> Any:
        return f(xp, *local)

    return run_local(name, operands, kernel, out_shape, np.dtype(dtype),
                     broadcast_matches(shapes, out_shape))


def array_arg(name: str, x: Any) -> GlobalTensor:
    """``x`` if it is a global array, else a TypeError naming ``name`` (the ops' one check,
    :func:`sbpmpi.ops.call.tensor_arg`)."""
    return tensor_arg(name, x)


def norm_axes(name: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None: all, an int, or a tuple of ints) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"{name}: axis must be an int, a tuple of ints or None, got {axis!r}")
        if not -ndim <= a < max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise IndexError(f"{name}: axis {a} is out of range for an array of {ndim} dims")
        out.append(int(a) % max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: axis {axis!r} names an axis more than once")
    return tuple(sorted(out))


def axis_op(name: str, x: GlobalTensor, whole: tuple[int, ...], kernel: Callable[..., Any],
            out_shape: tuple[int, ...], dtype: Any, kept: dict[int, int],
            *others: GlobalTensor) -> GlobalTensor:
    """``kernel(xp, local_x, *local_others)`` with the dims ``whole`` of ``x`` held whole on
    each rank; ``kept`` maps the other dims of ``x`` to output dims (``others`` have the
    shape of ``x``)."""
    tensor_arg(name, x)
    n = 1 + len(others)
    carried = tuple(DimMatch((d,) * n, j) for d, j in kept.items() if d not in whole)
    return run_local(name, (x, *others), kernel, out_shape, np.dtype(dtype), carried)
