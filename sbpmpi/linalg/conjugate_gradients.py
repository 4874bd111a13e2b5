"""``sm.linalg.cg``: conjugate gradients for a symmetric positive-definite operator.

The vectors keep ``b``'s layout; ``A @ p`` is sbpmpi's matmul (a row-split ``A`` gathers
``p`` and keeps its rows: one all-gather of the vector per step) or the caller's
``matvec``. Every dot product is one all-reduce of a scalar (the partial sums of a split
vector reduced to a broadcast value), and the loop's decisions are made from those
broadcast values, so every rank takes the same number of steps. Without a
preconditioner a step makes two dot products (``r.r`` serves both the stopping test and
``rho``); with one, three.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..core.sbp import Broadcast, broadcast
from ..tensor import GlobalTensor
from . import tall

__all__ = ["CGResult", "cg"]

class CGResult(NamedTuple):
    """SciPy's pair: the solution, and ``info`` (0: converged; k > 0: not converged after
    ``k`` steps)."""

    x: GlobalTensor
    info: int


def _dot(u: GlobalTensor, v: GlobalTensor) -> float:
    """``u . v`` (real vectors) as a Python float on every rank: one all-reduce."""
    s = (u * v).sum()
    if not all(isinstance(p, Broadcast) for p in s.sbp):
        s = s.to_global(sbp=(broadcast,) * s.placement.ndim)
    return float(s.to_local())


def _operator(name: str, op: Any, n: int, like: GlobalTensor) -> Callable[[GlobalTensor],
                                                                          GlobalTensor]:
    if callable(op) and not isinstance(op, GlobalTensor):
        return op  # type: ignore[no-any-return]
    if not isinstance(op, GlobalTensor):
        raise TypeError(f"linalg.cg: {name} must be a global tensor or a callable, got "
                        f"{type(op).__name__}")
    if op.shape != (n, n):
        raise ValueError(f"linalg.cg: {name} must be ({n}, {n}) for b of shape {like.shape}, "
                         f"got shape {op.shape}")
    if op.dtype.kind != "f":
        raise TypeError(f"linalg.cg: {name} must have a real floating dtype, got {op.dtype}")
    if op.placement != like.placement:
        raise ValueError(f"linalg.cg: {name} and b must share a placement, got "
                         f"{op.placement} and {like.placement}")

    def matvec(v: GlobalTensor) -> GlobalTensor:
        return op @ v  # type: ignore[no-any-return]

    return matvec


def cg(A: Any, b: GlobalTensor, *, x0: GlobalTensor | None = None, rtol: float = 1e-5,
       atol: float = 0.0, maxiter: int | None = None, M: Any = None) -> CGResult:
    """Solve ``A x = b`` for symmetric positive-definite ``A`` by conjugate gradients.

    Parameters
    ----------
    A : GlobalTensor or callable
        (N, N) real, or ``matvec(v) -> A @ v`` on global (N, 1) tensors laid out as ``b``.
    b : GlobalTensor
        (N,) or (N, 1), real floating.
    x0 : GlobalTensor, optional
        The first guess (zeros).
    rtol, atol : float
        Stop when ``||r|| <= max(rtol * ||b||, atol)`` (SciPy's test).
    maxiter : int, optional
        At most this many steps (default ``10 * N``).
    M : GlobalTensor or callable, optional
        A preconditioner approximating ``A^-1`` (matrix or ``matvec``).

    Returns
    -------
    CGResult
        ``(x, info)`` shaped like ``b``; ``info`` 0 when converged, else the steps made.
    """
    if not isinstance(b, GlobalTensor):
        raise TypeError(f"linalg.cg: b must be a global tensor, got {type(b).__name__}")
    if b.ndim not in (1, 2) or (b.ndim == 2 and b.shape[1] != 1):
        raise ValueError(f"linalg.cg: b must be (N,) or (N, 1), got shape {b.shape}")
    if b.dtype.kind != "f":
        raise TypeError(f"linalg.cg: b must have a real floating dtype, got {b.dtype}")
    n = b.shape[0]
    for what, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.floating)) \
                or not v >= 0:
            raise ValueError(f"linalg.cg: {what} must be a non-negative float, got {v!r}")
    if maxiter is None:
        maxiter = 10 * n
    if isinstance(maxiter, (bool, np.bool_)) or not isinstance(maxiter, (int, np.integer)) \
            or maxiter < 0:
        raise ValueError(f"linalg.cg: maxiter must be a non-negative int, got {maxiter!r}")
    matvec = _operator("A", A, n, b)
    precondition = None if M is None else _operator("M", M, n, b)
    if x0 is not None and (not isinstance(x0, GlobalTensor) or x0.shape != b.shape):
        raise ValueError(f"linalg.cg: x0 must be a global tensor of b's shape {b.shape}")
    tall.check("cg", b, None if isinstance(A, GlobalTensor) or A is None else "matvec",
               A if isinstance(A, GlobalTensor) else None, x0, rtol, atol, int(maxiter),
               M if isinstance(M, GlobalTensor) else (None if M is None else "matvec"))

    col = b.reshape(n, 1) if b.ndim == 1 else b
    bnorm = _dot(col, col) ** 0.5
    stop = max(float(rtol) * bnorm, float(atol))
    if x0 is None:
        x = col * 0
        r = col
    else:
        x = x0.reshape(n, 1) if x0.ndim == 1 else x0
        r = col - matvec(x)
    info = 0
    rho_prev = 0.0
    p = None
    for step in range(int(maxiter) + 1):
        rr = _dot(r, r)
        if rr ** 0.5 <= stop:
            break
        if step == maxiter:
            info = int(maxiter)
            break
        z = r if precondition is None else precondition(r)
        rho = rr if precondition is None else _dot(r, z)
        p = z if p is None else z + (rho / rho_prev) * p
        q = matvec(p)
        alpha = rho / _dot(p, q)
        x = x + alpha * p
        r = r - alpha * q
        rho_prev = rho
    return CGResult(x.reshape(n) if b.ndim == 1 else x, info)
