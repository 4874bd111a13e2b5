"""``sm.linalg.svd_randomized``: the truncated SVD of a large matrix from a random sketch.

Halko, Martinsson and Tropp's range finder with power iterations, on the matrix laid out
along its long dim (the rows of a tall or square matrix, the columns of a wide one,
whose conjugate transpose is then factored). With ``l = k + oversample`` columns:

1. ``Y = A Omega``, ``Omega`` (N x l) drawn from the counter-based generator with
   ``seed`` (each value a function of the seed and its index only), so the sketch, and
   with it the result, does not depend on the layout or the world size;
2. ``Q = qr(Y).Q`` by TSQR, R's diagonal non-negative (Q is then unique);
3. ``n_iter`` times: ``Z = A^H Q`` (a sum over the ranks, N x l), ``Z = qr(Z).Q`` (on one
   rank, broadcast), ``Q = qr(A Z).Q`` (TSQR);
4. ``B = Q^H A`` (a sum over the ranks, l x N), ``B = U_B S V^H`` (on one rank, rows of
   ``V^H`` with their largest entry real positive), ``U = Q U_B``; the first ``k``.

Each rank holds its block of A, M_i x l and N x l more. Results equal across layouts
and world sizes up to rounding (the order of the sums).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..core import random as _random
from ..core.sbp import Split, broadcast
from ..tensor import GlobalTensor
from . import blocks, tall
from .results import SVDResult
from .tsqr import on_first, real_dtype

__all__ = ["svd_randomized"]


def _int(name: str, v: Any, low: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < low:
        raise ValueError(f"linalg.svd_randomized: {name} must be an int >= {low}, got {v!r}")
    return int(v)


def _times(xp: ModuleType, block: Any, small: Any) -> Any:
    """``block @ small``, Fortran-ordered (``(small^T block^T)^T``): the layout the QR that
    follows factors in place."""
    return (small.T @ block.T).T


def svd_randomized(A: GlobalTensor, k: int, *, oversample: int = 10, n_iter: int = 4,
                   seed: int = 0) -> SVDResult:
    """The ``k`` leading singular triplets of ``A`` (2-D, real or complex floating).

    Returns an :class:`SVDResult` ``(U, S, Vh)``:
    ``U`` (M x k), ``S`` (k,) descending, ``Vh`` (k x N); the long dim of ``A`` stays split
    in ``U`` (tall) or ``Vh`` (wide), the other factors are broadcast.
    """
    if not isinstance(A, GlobalTensor):
        raise TypeError(f"linalg.svd_randomized: A must be a global tensor, got "
                        f"{type(A).__name__}")
    if A.ndim != 2 or A.dtype.kind not in "fc":
        raise ValueError(f"linalg.svd_randomized: A must be a 2-D floating matrix, got shape "
                         f"{A.shape} and dtype {A.dtype}")
    m, n = A.shape
    k = _int("k", k, 1)
    if k > min(m, n):
        raise ValueError(f"linalg.svd_randomized: k={k} exceeds min(M, N) = {min(m, n)} "
                         f"for A of shape {A.shape}")
    oversample = _int("oversample", oversample, 0)
    n_iter = _int("n_iter", n_iter, 0)
    seed = _int("seed", seed, 0)
    tall.check("svd_randomized", A, k, oversample, n_iter, seed)
    view = tall.tall_view(A)  # square: by rows
    xp, team = view.xp, view.team
    big, small = view.long, view.short
    width = min(k + oversample, small)
    dt = A.dtype
    real = real_dtype(dt)
    u_local = s = vh = None
    if team.me is not None:
        block = view.block
        omega = _random.normal(xp, (small, width), ((0, small), (0, width)), seed, 0)
        q = tall.orthonormal("svd_randomized", xp, _times(xp, block, omega.astype(dt)), team,
                              overwrite=True)

        def orthonormal_small(z: Any) -> Any:
            q0, r0 = xp.linalg.qr(z, mode="reduced")
            return q0 * tall.phases(xp, xp.diagonal(r0))[None, :]

        for _ in range(n_iter):
            z = on_first("svd_randomized", xp, blocks.conj_t(xp, block) @ q, team,
                         orthonormal_small, small * width)
            del q  # before the next sketch: one M_i x l block at a time
            q = tall.orthonormal("svd_randomized", xp,
                                 _times(xp, block, xp.reshape(z, (small, width))), team,
                                 overwrite=True)

        def factor(b: Any) -> Any:
            u_b, s_b, vh_b = tall.signed_svd(xp, b)
            return xp.concatenate([xp.reshape(u_b[:, :k], (-1,)), s_b[:k].astype(dt),
                                   xp.reshape(vh_b[:k], (-1,))])

        packed = on_first("svd_randomized", xp, blocks.conj_t(xp, q) @ block, team, factor,
                          width * k + k + k * small)
        u_b = xp.reshape(packed[:width * k], (width, k))
        s = xp.real(packed[width * k:width * k + k]).astype(real)
        vh = xp.reshape(packed[width * k + k:], (k, small))
        u_local = q @ u_b
    along = (Split(1 if view.wide else 0),) * A.placement.ndim
    whole = (broadcast,) * A.placement.ndim
    s_glob = tall.made(xp, s, (k,), view.x, whole, real)
    if not view.wide:
        return SVDResult(tall.made(xp, u_local, (big, k), view.x, along, dt), s_glob,
                         tall.made(xp, vh, (k, small), view.x, whole, dt))
    # A^H = U' S V'^H, so A = V' S U'^H
    u = None if vh is None else blocks.conj_t(xp, vh)
    vh_local = None if u_local is None else blocks.conj_t(xp, u_local)
    return SVDResult(tall.made(xp, u, (small, k), view.x, whole, dt), s_glob,
                     tall.made(xp, vh_local, (k, big), view.x, along, dt))
