"""``sm.linalg.lstsq``: NumPy's least squares on global tensors, through QR (never ``a^H a``).

- **Tall** ``a`` (M > N, split): ``[a | b]`` is reduced by TSQR to its R factor alone,
  ``[[R, c], [0, T]]``: ``R`` is ``a``'s, ``c = Q^H b`` and the columns of ``T`` hold the
  residuals. The tree's root solves ``R x = c`` through the SVD of ``R`` (the minimum-norm
  solution when ``a`` is rank-deficient, as NumPy's) and broadcasts the solution, the
  residuals, the rank and the singular values. Each rank holds one chunk of its rows
  beyond its blocks of ``a`` and ``b``.
- **Wide** ``a`` (N > M, split): ``a^H = Q R`` by TSQR; the minimum-norm solution is
  ``Q pinv(R^H) b``, split along N like ``a``'s columns.
- Otherwise (broadcast, square or empty ``a``): ``a`` and ``b`` are gathered and each rank
  calls the backend's ``lstsq``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .. import backend, comm
from ..core.sbp import Broadcast, Split, broadcast
from ..env import get_rank, get_world_size
from ..tensor import GlobalTensor
from . import blocks, paths, tall
from .tsqr import Root, real_dtype

__all__ = ["LstsqResult", "lstsq"]


class LstsqResult(NamedTuple):
    """NumPy's four results: the solution, the sums of squared residuals ((K,), (1,) for a
    1-D ``b``, or (0,) when ``a`` is rank-deficient or M <= N), the rank of ``a`` and its
    singular values (descending)."""

    solution: GlobalTensor
    residuals: GlobalTensor
    rank: int
    singular_values: GlobalTensor


def _arguments(a: Any, b: Any, rcond: Any) -> tuple[np.dtype, float | None]:
    for what, v in (("a", a), ("b", b)):
        if not isinstance(v, GlobalTensor):
            raise TypeError(f"linalg.lstsq: {what} must be a global tensor, got "
                            f"{type(v).__name__}")
        if v.dtype.kind not in "fc":
            raise TypeError(f"linalg.lstsq: {what} must have a floating-point dtype, got "
                            f"{v.dtype}")
    if a.ndim != 2:
        raise ValueError(f"linalg.lstsq: a must be 2-D, got shape {a.shape}")
    if b.ndim not in (1, 2) or b.shape[0] != a.shape[0]:
        raise ValueError(f"linalg.lstsq: b must be ({a.shape[0]},) or ({a.shape[0]}, K) for a "
                         f"of shape {a.shape}, got shape {b.shape}")
    if b.placement != a.placement:
        raise ValueError(f"linalg.lstsq: a and b must share a placement, got "
                         f"{a.placement} and {b.placement}")
    if rcond is not None and (isinstance(rcond, (bool, np.bool_)) or
                              not isinstance(rcond, (int, float, np.floating, np.integer))):
        raise TypeError(f"linalg.lstsq: rcond must be a float or None, got {rcond!r}")
    return np.result_type(a.dtype, b.dtype), None if rcond is None else float(rcond)


def _lstsq_path(a: Any, b: Any = None, rcond: Any = None) -> paths.LinalgPath:
    if not isinstance(a, GlobalTensor):
        raise TypeError(f"linalg.lstsq: a must be a global tensor, got {type(a).__name__}")
    return paths.path_of("lstsq", a)


@paths.explains(_lstsq_path)
def lstsq(a: GlobalTensor, b: GlobalTensor, rcond: float | None = None) -> LstsqResult:
    """The least-squares solution of ``a @ x = b`` with NumPy's signature and results.

    Parameters
    ----------
    a : GlobalTensor
        (M, N), floating.
    b : GlobalTensor
        (M,) or (M, K), on ``a``'s placement.
    rcond : float, optional
        Singular values at or below ``rcond`` times the largest count as zero (default:
        ``eps * max(M, N)``, NumPy's).

    Returns
    -------
    LstsqResult
        ``(solution, residuals, rank, singular_values)`` as ``numpy.linalg.lstsq``; the
        solution is split along N when ``a`` is wide and split, broadcast otherwise.
    """
    dt, value = _arguments(a, b, rcond)
    m, n = a.shape
    cut = float(np.finfo(dt).eps) * max(m, n) if value is None else value
    path = _lstsq_path(a)
    tall.check("lstsq", a, b, value)
    if path.kind == "tall":
        return _tall(a, b, dt, cut)
    if path.kind == "wide":
        return _wide(a, b, dt, cut)
    return _gathered(a, b, dt, cut)


def _columns(b: GlobalTensor) -> int:
    return 1 if b.ndim == 1 else b.shape[1]


def _tall(a: GlobalTensor, b: GlobalTensor, dt: np.dtype, cut: float) -> LstsqResult:
    view = tall.tall_view(a)
    xp, m, n = view.xp, view.long, view.short
    k = _columns(b)
    b = b.to_global(sbp=(Split(0),) * b.placement.ndim)
    real = real_dtype(dt)
    size = n * k + k + 1 + n
    payload = None
    if view.team.me is not None:
        rows = view.block.shape[0]
        r_aug = blocks.r_factor(xp, view.block.astype(dt, copy=False),
                                xp.reshape(b.to_local(), (rows, k)).astype(dt, copy=False))

        def at_root(r: Any) -> Root:
            sol, s, rank = tall.solve_with_r(xp, r[:n, :n], r[:n, n:], cut)
            res = xp.sum(xp.abs(r[n:, n:]) ** 2, axis=0)
            return Root(xp.concatenate([xp.reshape(sol, (-1,)).astype(dt), res.astype(dt),
                                        xp.asarray([rank], dtype=dt), s.astype(dt)]), None)

        payload = tall.tree("lstsq", xp, r_aug, view.team, n + k, at_root, payload_size=size,
                            columns=0, want_w=False).payload
    rank = _shared_int(a, payload, n * k + k)
    sol = res = s = None
    if payload is not None:
        sol = xp.reshape(payload[:n * k], (n, k) if b.ndim == 2 else (n,))
        res = xp.real(payload[n * k:n * k + k]).astype(real)
        s = xp.real(payload[n * k + k + 1:]).astype(real)
        if rank < n or m <= n:
            res = res[:0]
    nres = k if rank == n and m > n else 0
    whole = (broadcast,) * a.placement.ndim
    return LstsqResult(tall.made(xp, sol, (n, k) if b.ndim == 2 else (n,), a, whole, dt),
                       tall.made(xp, res, (nres,), a, whole, real), rank,
                       tall.made(xp, s, (n,), a, whole, real))


def _wide(a: GlobalTensor, b: GlobalTensor, dt: np.dtype, cut: float) -> LstsqResult:
    view = tall.tall_view(a)  # a^H (N x M) split by rows
    xp, big, small = view.xp, view.long, view.short
    k = _columns(b)
    b = b.to_global(sbp=(broadcast,) * b.placement.ndim)
    real = real_dtype(dt)
    x_local = s = payload = None
    if view.team.me is not None:
        factors = blocks.qr_block(xp, view.block.astype(dt, copy=False))
        rhs = xp.reshape(b.to_local(), (small, k)).astype(dt, copy=False)

        def at_root(r: Any) -> Root:
            # a = R^H Q^H: the minimum-norm solution is Q pinv(R^H) b
            y, sv, rank = tall.solve_with_r(xp, xp.conj(r).T, rhs, cut)
            return Root(xp.concatenate([xp.asarray([rank], dtype=dt), sv.astype(dt)]), y)

        leaf = tall.tree("lstsq", xp, factors.r, view.team, small, at_root,
                         payload_size=1 + small, columns=k, want_w=True)
        payload = leaf.payload
        x_local = factors.q @ leaf.w
        if b.ndim == 1:
            x_local = xp.reshape(x_local, (-1,))
        s = xp.real(payload[1:]).astype(real)
    rank = _shared_int(a, payload, 0)
    along = (Split(0),) * a.placement.ndim
    whole = (broadcast,) * a.placement.ndim
    shape = (big, k) if b.ndim == 2 else (big,)
    return LstsqResult(tall.made(xp, x_local, shape, a, along, dt),
                       tall.made(xp, xp.zeros((0,), dtype=real), (0,), a, whole, real), rank,
                       tall.made(xp, s, (small,), a, whole, real))


def _shared_int(a: GlobalTensor, payload: Any, at: int) -> int:
    """The integer at ``payload[at]`` (the rank), the same on every rank: when the
    placement leaves ranks out (they hold no payload), they get it from its first rank."""
    value = -1 if payload is None else int(round(float(np.real(payload[at]))))
    if len(a.placement.rank_list) == get_world_size():
        return value
    return int(comm.broadcast_object(value, src=a.placement.rank_list[0]))


def _gathered(a: GlobalTensor, b: GlobalTensor, dt: np.dtype, cut: float) -> LstsqResult:
    whole = (broadcast,) * a.placement.ndim
    if not all(isinstance(s, Broadcast) for s in a.sbp):
        a = a.to_global(sbp=whole)
    if not all(isinstance(s, Broadcast) for s in b.sbp):
        b = b.to_global(sbp=whole)
    xp = backend.get_xp(a.placement.type)
    m, n = a.shape
    real = real_dtype(dt)
    sol = res = s = None
    rank = 0
    if get_rank() in a.placement:
        sol, res, rank, s = xp.linalg.lstsq(a.to_local().astype(dt, copy=False),
                                            b.to_local().astype(dt, copy=False), rcond=cut)
        rank = int(rank)
    rank = _shared_int(a, None if sol is None else np.asarray([rank]), 0)
    k = _columns(b)
    nres = k if rank == n and m > n else 0
    return LstsqResult(tall.made(xp, sol, (n, k) if b.ndim == 2 else (n,), a, whole, dt),
                       tall.made(xp, res, (nres,), a, whole, real), rank,
                       tall.made(xp, s, (min(m, n),), a, whole, real))
