"""The named results of the factorizations, shared by ``sm.linalg`` and ``sm.array_api.linalg``."""

from __future__ import annotations

from typing import NamedTuple

from ..tensor import GlobalTensor

__all__ = ["EighResult", "QRResult", "SlogdetResult", "SVDResult"]


class EighResult(NamedTuple):
    """``eigh``'s result: eigenvalues in ascending order and the eigenvectors (columns)."""

    eigenvalues: GlobalTensor
    eigenvectors: GlobalTensor


class QRResult(NamedTuple):
    """``qr``'s result: ``x = Q @ R``."""

    Q: GlobalTensor
    R: GlobalTensor


class SlogdetResult(NamedTuple):
    """``slogdet``'s result: ``det(x) = sign * exp(logabsdet)``."""

    sign: GlobalTensor
    logabsdet: GlobalTensor


class SVDResult(NamedTuple):
    """``svd``'s result: ``x = U @ diag(S) @ Vh``, ``S`` in descending order."""

    U: GlobalTensor
    S: GlobalTensor
    Vh: GlobalTensor
