"""Factorizations of stacks of matrices: ``cholesky``, ``det``, ``eigh``, ``eigvalsh``,
``qr``, ``slogdet``, ``svd``, ``svdvals``.

Each factors the matrices where their batch dims lie (:mod:`.stacks`), except at the
size of the data: ``qr``, ``svd`` (``full_matrices=False``) and ``svdvals`` of a split
non-square 2-D matrix factor it where it lies, by TSQR (:mod:`.tall`): its long dim stays
split in the results, the small factors are broadcast. Q's R has a non-negative real
diagonal there, and each row of V^H its largest entry real positive, so R, U and V^H
equal NumPy's up to signs (phases). :func:`.paths.path_of` is the rule;
``sm.explain(sm.linalg.qr, x)`` prints the path of a call.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..tensor import GlobalTensor
from . import paths, tall
from .paths import explains
from .results import EighResult, QRResult, SlogdetResult, SVDResult
from .stacks import checked, matrices, real_of, stacked, stacked_parts

__all__ = ["cholesky", "det", "eigh", "eigvalsh", "qr", "slogdet", "svd", "svdvals"]


def cholesky(x: GlobalTensor, /, *, upper: bool = False) -> GlobalTensor:
    """The Cholesky factor of Hermitian positive-definite matrices: lower triangular
    ``L`` with ``x = L @ L^H``, or upper ``U = L^H`` when ``upper``."""
    matrices("cholesky", x, square=True)

    def kernel(xp: ModuleType, a: Any) -> Any:
        low = xp.linalg.cholesky(a)
        return xp.conj(xp.swapaxes(low, -1, -2)) if upper else low

    return checked("cholesky", x, kernel, x.shape[-2:], x.dtype)


def det(x: GlobalTensor, /) -> GlobalTensor:
    """The determinants of square matrices."""
    matrices("det", x, square=True)
    return stacked("det", x, lambda xp, a: xp.linalg.det(a), (), x.dtype)


def eigh(x: GlobalTensor, /) -> EighResult:
    """Eigenvalues (ascending) and eigenvectors of Hermitian matrices (the lower triangle
    is read, as NumPy does)."""
    matrices("eigh", x, square=True)
    vals, vecs = stacked_parts("eigh", x, lambda xp, a: tuple(xp.linalg.eigh(a)),
                                (x.shape[-1:], x.shape[-2:]), (real_of(x.dtype), x.dtype))
    return EighResult(vals, vecs)


def eigvalsh(x: GlobalTensor, /) -> GlobalTensor:
    """Eigenvalues (ascending) of Hermitian matrices."""
    matrices("eigvalsh", x, square=True)
    return checked("eigvalsh", x, lambda xp, a: xp.linalg.eigvalsh(a), x.shape[-1:],
                    real_of(x.dtype))


def _qr_path(x: Any, /, *, mode: str = "reduced") -> paths.LinalgPath:
    return paths.path_of("qr", matrices("qr", x), square_factor=mode == "complete")


@explains(_qr_path)
def qr(x: GlobalTensor, /, *, mode: str = "reduced") -> Any:
    """The QR factorization of each matrix; ``mode`` ``"reduced"`` (``Q`` is M x K),
    ``"complete"`` (``Q`` is M x M) or ``"r"`` (NumPy's: ``R`` alone, not a tuple)."""
    matrices("qr", x)
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"linalg.qr: mode {mode!r} is not 'reduced', 'complete' or 'r'")
    path = _qr_path(x, mode=mode)
    if path.kind == "refused":
        raise ValueError(f"linalg.qr: mode 'complete' of x {x.shape}: {path.why}")
    if path.kind in ("tall", "wide"):
        q_t, r_t = tall.qr(x, mode)
        return r_t if q_t is None else QRResult(q_t, r_t)
    m, n = x.shape[-2:]
    k = m if mode == "complete" else min(m, n)
    if mode == "r":
        return checked("qr", x, lambda xp, a: xp.linalg.qr(a, mode="r"), (min(m, n), n),
                        x.dtype)
    q, r = stacked_parts("qr", x, lambda xp, a: tuple(xp.linalg.qr(a, mode=mode)),
                          ((m, k), (k, n)), (x.dtype, x.dtype))
    return QRResult(q, r)


def slogdet(x: GlobalTensor, /) -> SlogdetResult:
    """Sign and natural log of the absolute value of each determinant (0 and ``-inf``
    for a singular matrix)."""
    matrices("slogdet", x, square=True)
    sign, logabs = stacked_parts("slogdet", x, lambda xp, a: tuple(xp.linalg.slogdet(a)),
                                  ((), ()), (x.dtype, real_of(x.dtype)))
    return SlogdetResult(sign, logabs)


def _svd_path(x: Any, /, *, full_matrices: bool = True) -> paths.LinalgPath:
    return paths.path_of("svd", matrices("svd", x), square_factor=bool(full_matrices))


@explains(_svd_path)
def svd(x: GlobalTensor, /, *, full_matrices: bool = True) -> SVDResult:
    """The singular value decomposition of each matrix; ``U`` is M x M and ``Vh`` N x N
    when ``full_matrices``, else M x K and K x N."""
    matrices("svd", x)
    path = _svd_path(x, full_matrices=full_matrices)
    if path.kind == "refused":
        raise ValueError(f"linalg.svd: full_matrices=True of x {x.shape}: {path.why}")
    if path.kind in ("tall", "wide"):
        return SVDResult(*tall.svd(x))
    m, n = x.shape[-2:]
    k = min(m, n)
    full = bool(full_matrices)
    u, s, vh = stacked_parts("svd", x,
                              lambda xp, a: tuple(xp.linalg.svd(a, full_matrices=full)),
                              ((m, m if full else k), (k,), (n if full else k, n)),
                              (x.dtype, real_of(x.dtype), x.dtype))
    return SVDResult(u, s, vh)


def _svdvals_path(x: Any, /) -> paths.LinalgPath:
    return paths.path_of("svdvals", matrices("svdvals", x))


@explains(_svdvals_path)
def svdvals(x: GlobalTensor, /) -> GlobalTensor:
    """The singular values of each matrix, in descending order."""
    if _svdvals_path(x).kind in ("tall", "wide"):
        return tall.svdvals(x)
    return checked("svdvals", x, lambda xp, a: xp.linalg.svd(a, compute_uv=False),
                    (min(x.shape[-2:]),), real_of(x.dtype))
