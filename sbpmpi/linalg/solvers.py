"""Solvers of stacks of matrices: ``solve``, ``inv``, ``matrix_power``, and the functions
of the singular values above a tolerance, ``pinv`` and ``matrix_rank``.

Each runs where the matrices' batch dims lie (:mod:`.stacks`); ``pinv`` and
``matrix_rank`` of a split non-square 2-D matrix go by TSQR (:mod:`.tall`). The
iterative and least-squares solvers are :mod:`.conjugate_gradients` (``cg``) and
:mod:`.least_squares` (``lstsq``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..core.standard_dtypes import promote
from ..ops.elementwise import broadcast_matches
from ..ops.local import run_local
from ..ops.signature import DimMatch
from ..tensor import GlobalTensor
from . import paths, tall
from .paths import explains
from .stacks import array_arg, checked, matrices, parts, real_of, stacked

__all__ = ["solve", "inv", "matrix_power", "pinv", "matrix_rank"]


def inv(x: GlobalTensor, /) -> GlobalTensor:
    """The inverses of square matrices (``LinAlgError`` where one is singular)."""
    matrices("inv", x, square=True)
    return checked("inv", x, lambda xp, a: xp.linalg.inv(a), x.shape[-2:], x.dtype)


def matrix_power(x: GlobalTensor, n: int, /) -> GlobalTensor:
    """Square matrices raised to the integer power ``n`` (negative: of the inverse)."""
    matrices("matrix_power", x, square=True)
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"linalg.matrix_power: n must be an int, got {n!r}")
    run = checked if n < 0 else stacked  # only an inverse can fail
    return run("matrix_power", x, lambda xp, a: xp.linalg.matrix_power(a, int(n)),
               x.shape[-2:], x.dtype)


def solve(x1: GlobalTensor, x2: GlobalTensor, /) -> GlobalTensor:
    """The solutions ``y`` of ``x1 @ y = x2``: ``x1`` square matrices, ``x2`` one vector
    (1-D: shape ``(M,)``) or matrices whose stack dims broadcast against ``x1``'s."""
    matrices("solve", x1, square=True)
    array_arg("solve", x2, "x2")
    if x2.dtype.kind not in "fc":
        raise TypeError(f"linalg.solve: x2 must have a floating-point dtype, got {x2.dtype}")
    m = x1.shape[-1]
    if x2.ndim == 0 or (x2.ndim == 1 and x2.shape[0] != m) or \
            (x2.ndim >= 2 and x2.shape[-2] != m):
        raise ValueError(f"linalg.solve: x2 of shape {x2.shape} must be (M,) or (..., M, K) "
                         f"for x1 of shape {x1.shape}")
    dt = promote(x1.dtype, x2.dtype)
    if x2.ndim == 1:
        batch = x1.shape[:-2]
        carried = tuple(DimMatch((d, None), d) for d in range(x1.ndim - 2))
    else:
        try:
            batch = tuple(int(n) for n in np.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
        except ValueError:
            raise ValueError(f"linalg.solve: the stack shapes of x1 {x1.shape} and x2 "
                             f"{x2.shape} cannot be broadcast together") from None
        carried = broadcast_matches([x1.shape[:-2], x2.shape[:-2]], batch)
    tail = x2.shape[-2:] if x2.ndim >= 2 else (m,)

    def run(pack: Callable[..., Any], packed: tuple[int, ...], pdt: np.dtype) -> GlobalTensor:
        return run_local("linalg.solve", (x1, x2), pack, batch + packed, pdt, carried)

    def kernel(xp: ModuleType, a: Any, b: Any) -> tuple[Any, ...]:
        return (xp.linalg.solve(a.astype(dt), b.astype(dt)),)

    return parts("solve", run, kernel, batch, (tail,), (dt,))[0]


def _rtol(name: str, x: GlobalTensor, rtol: Any) -> tuple[float | None, GlobalTensor | None]:
    """``rtol`` as a Python float (None: the default) or a global array of tolerances per
    matrix (broadcast against the batch shape)."""
    if rtol is None:
        return None, None
    if isinstance(rtol, GlobalTensor):
        if rtol.dtype.kind not in "f":
            raise TypeError(f"linalg.{name}: rtol must be real floating, got {rtol.dtype}")
        try:
            fits = np.broadcast_shapes(rtol.shape, x.shape[:-2]) == x.shape[:-2]
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"linalg.{name}: rtol of shape {rtol.shape} does not broadcast "
                             f"to the stack shape {x.shape[:-2]}")
        return None, rtol
    if isinstance(rtol, (bool, np.bool_)) or not isinstance(rtol, (int, float, np.number)):
        raise TypeError(f"linalg.{name}: rtol must be a float, a global array or None, got "
                        f"{rtol!r}")
    return float(rtol), None


def _tolerant(name: str, x: GlobalTensor, rtol: Any, tail: tuple[int, ...],
              dtype: np.dtype, f: Callable[[ModuleType, Any, Any], Any]) -> GlobalTensor:
    """``f(xp, local_x, rtol)`` per stack, ``rtol`` a float or an array broadcast against
    the batch dims (the default: ``max(M, N) * eps``)."""
    value, array = _rtol(name, x, rtol)
    if value is None and array is None:
        value = max(x.shape[-2:]) * float(np.finfo(x.dtype).eps)
    if array is None:
        return checked(name, x, lambda xp, a: f(xp, a, value), tail, dtype)
    batch = x.shape[:-2]
    carried = broadcast_matches([batch, array.shape], batch)

    def run(pack: Callable[..., Any], packed: tuple[int, ...], dt: np.dtype) -> GlobalTensor:
        return run_local(f"linalg.{name}", (x, array), pack, batch + packed, dt, carried)

    def kernel(xp: ModuleType, a: Any, r: Any) -> tuple[Any, ...]:
        return (f(xp, a, r.astype(real_of(x.dtype))),)

    return parts(name, run, kernel, batch, (tail,), (dtype,))[0]


def _scalar_rtol(name: str, x: GlobalTensor, rtol: Any) -> float | None:
    """``rtol`` of a single matrix as a float (None: the default); a global array is
    0-d there (the stack shape is ())."""
    value, array = _rtol(name, x, rtol)
    return float(array) if array is not None else value


def _rank_path(x: Any, /, *, rtol: Any = None) -> paths.LinalgPath:
    return paths.path_of("matrix_rank", matrices("matrix_rank", x))


@explains(_rank_path)
def matrix_rank(x: GlobalTensor, /, *, rtol: Any = None) -> GlobalTensor:
    """The rank of each matrix: its singular values above ``rtol`` times the largest
    (default ``max(M, N) * eps``); ``rtol`` may be a global array per matrix."""
    matrices("matrix_rank", x)
    if _rank_path(x).kind in ("tall", "wide"):
        return tall.matrix_rank(x, _scalar_rtol("matrix_rank", x, rtol))

    def f(xp: ModuleType, a: Any, r: Any) -> Any:
        s = xp.linalg.svd(a, compute_uv=False)
        if s.shape[-1] == 0:  # empty matrices have rank 0 (and no largest value)
            return xp.zeros(s.shape[:-1], dtype=np.int64)
        tol = s.max(axis=-1, keepdims=True) * xp.asarray(r)[..., None]
        return xp.count_nonzero(s > tol, axis=-1)

    return _tolerant("matrix_rank", x, rtol, (), np.dtype(np.int64), f)


def _pinv_path(x: Any, /, *, rtol: Any = None) -> paths.LinalgPath:
    return paths.path_of("pinv", matrices("pinv", x))


@explains(_pinv_path)
def pinv(x: GlobalTensor, /, *, rtol: Any = None) -> GlobalTensor:
    """The Moore-Penrose pseudo-inverses: singular values at or below ``rtol`` times the
    largest are dropped (default ``max(M, N) * eps``)."""
    matrices("pinv", x)
    if _pinv_path(x).kind in ("tall", "wide"):
        return tall.pinv(x, _scalar_rtol("pinv", x, rtol))

    def f(xp: ModuleType, a: Any, r: Any) -> Any:
        return xp.linalg.pinv(a, rcond=xp.asarray(r))

    return _tolerant("pinv", x, rtol, x.shape[-1:] + x.shape[-2:-1], x.dtype, f)
