"""Stacks of matrices factored where they lie: the machinery of the decompositions and
solvers of ``sm.linalg`` (:mod:`.factorizations`, :mod:`.solvers`).

The last two dims are held whole on each rank and the stacked (batch) dims may stay
split: every rank factors its own matrices with the backend's linalg module
(``numpy.linalg`` on ``"cpu"``, ``cupy.linalg`` on ``"cuda"``: the kernels get the
array module of the placement) and nothing is communicated; a split of a matrix dim is
boxed away first (``runtime.redistribute``: the matrices are gathered). The results keep
the batch splits of the operands; their matrix dims are broadcast.

A function with several results runs its factorization once per matrix: the parts
travel packed along one last dim and are cut apart on each rank. A factorization that
fails on one rank (a singular matrix, ...) makes every rank raise ``LinAlgError`` (one
reduction of a flag per matrix).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .. import ops
from ..ops.local import axis_op
from ..tensor import GlobalTensor

__all__ = ["array_arg", "matrices", "real_of", "stacked", "FAILURES", "Runner", "parts",
           "stacked_parts", "checked", "any_true"]


def array_arg(name: str, x: Any, what: str = "x") -> GlobalTensor:
    """``x`` if it is a global array, else a TypeError naming ``linalg.<name>``."""
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"linalg.{name}: {what} must be a global array, got "
                        f"{type(x).__name__}")
    return x


def matrices(name: str, x: Any, *, square: bool = False, floating: bool = True,
             numeric: bool = False) -> GlobalTensor:
    """``x`` checked: a global array of at least 2 dims (square matrices when asked), of
    a floating (or numeric) dtype when asked."""
    array_arg(name, x)
    if x.ndim < 2:
        raise ValueError(f"linalg.{name}: x must have at least 2 dims, got shape {x.shape}")
    if square and x.shape[-1] != x.shape[-2]:
        raise ValueError(f"linalg.{name}: x must be a stack of square matrices, got shape "
                         f"{x.shape}")
    if floating and x.dtype.kind not in "fc":
        raise TypeError(f"linalg.{name}: x must have a floating-point dtype, got {x.dtype}")
    if numeric and x.dtype.kind not in "iufc":
        raise TypeError(f"linalg.{name}: x must have a numeric dtype, got {x.dtype}")
    return x


def real_of(dt: np.dtype) -> np.dtype:
    """The real dtype of ``dt``'s precision (``dt`` itself when real)."""
    return np.empty((), dtype=dt).real.dtype


def stacked(name: str, x: GlobalTensor, kernel: Callable[[ModuleType, Any], Any],
            tail: tuple[int, ...], dtype: np.dtype) -> GlobalTensor:
    """``kernel(xp, local_x)`` on stacks of matrices: the last two dims of ``x`` whole on
    each rank, its batch dims carried to the output (``x.shape[:-2] + tail``)."""
    batch = x.ndim - 2
    return axis_op(f"linalg.{name}", x, (batch, batch + 1), kernel, x.shape[:-2] + tail,
                   dtype, {d: d for d in range(batch)})


def any_true(x: GlobalTensor) -> GlobalTensor:
    """Whether some element of ``x`` is true (0-d, on every rank)."""
    axes = tuple(range(x.ndim))
    return axis_op("any", x, axes, lambda xp, a: xp.any(a, axis=axes, keepdims=False), (),
                   np.bool_, {})


#: What a failed local factorization means, by function (the message every rank raises).
FAILURES = {"cholesky": "a matrix is not positive-definite",
            "inv": "a matrix is singular", "matrix_power": "a matrix is singular",
            "solve": "a matrix of x1 is singular"}

Runner = Callable[[Callable[..., Any], tuple[int, ...], np.dtype], GlobalTensor]


def parts(name: str, run: Runner, kernel: Callable[..., tuple[Any, ...]],
          batch: tuple[int, ...], tails: tuple[tuple[int, ...], ...],
          dtypes: tuple[np.dtype, ...]) -> list[GlobalTensor]:
    """The results of one local ``kernel(xp, *local_operands)`` call (a factorization runs
    once), of global shapes ``batch + tail``, made by ``run(pack, tail, dtype)``.

    The parts travel packed along one last dim, in the dtype they all fit, with a flag
    per matrix: set where the backend raised ``LinAlgError`` on the rank holding it. The
    parts are cut apart on each rank (that dim is whole everywhere) and every rank
    raises ``LinAlgError`` when one failed (one reduction of the flags)."""
    packed = np.result_type(*dtypes)
    sizes = [math.prod(t) for t in tails]
    total = sum(sizes)

    def pack(xp: ModuleType, *local: Any) -> Any:
        error = getattr(xp.linalg, "LinAlgError", np.linalg.LinAlgError)
        try:
            found = kernel(xp, *local)
        except error:
            failed = xp.zeros((total + 1,), dtype=packed)
            failed[total] = 1  # run_local broadcasts it over this rank's matrices
            return failed
        lead = found[0].shape[:found[0].ndim - len(tails[0])]
        return xp.concatenate([xp.reshape(part, lead + (n,)).astype(packed)
                               for part, n in zip(found, sizes)]
                              + [xp.zeros(lead + (1,), dtype=packed)], axis=-1)

    both = run(pack, (total + 1,), packed)
    if bool(any_true(both[..., total])):
        raise np.linalg.LinAlgError(f"linalg.{name}: {FAILURES.get(name, 'did not converge')}")
    out = []
    start = 0
    for tail, n, dt in zip(tails, sizes, dtypes):
        part = ops.reshape(both[..., start:start + n], batch + tail)
        if part.dtype.kind == "c" and dt.kind != "c":
            part = ops.real(part)  # type: ignore[attr-defined]  # installed from the registry
        out.append(part if part.dtype == dt else ops.astype(part, dt))
        start += n
    return out


def stacked_parts(name: str, x: GlobalTensor,
                  kernel: Callable[[ModuleType, Any], tuple[Any, ...]],
                  tails: tuple[tuple[int, ...], ...], dtypes: tuple[np.dtype, ...]
                  ) -> list[GlobalTensor]:
    """:func:`parts` of ``kernel(xp, local_x)`` on stacks of matrices (:func:`stacked`)."""

    def run(pack: Callable[..., Any], tail: tuple[int, ...], dt: np.dtype) -> GlobalTensor:
        return stacked(name, x, pack, tail, dt)

    return parts(name, run, kernel, x.shape[:-2], tails, dtypes)


def checked(name: str, x: GlobalTensor, kernel: Callable[[ModuleType, Any], Any],
            tail: tuple[int, ...], dtype: np.dtype) -> GlobalTensor:
    """:func:`stacked` for a kernel that may raise ``LinAlgError`` (on every rank)."""
    return stacked_parts(name, x, lambda xp, a: (kernel(xp, a),), (tail,), (dtype,))[0]
