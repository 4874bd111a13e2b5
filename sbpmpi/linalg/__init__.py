"""``sm.linalg``: linear algebra at the size of the data (as ``torch.linalg`` beside the
tensor API).

- ``lstsq(a, b, rcond=None)``: NumPy's least squares, through QR (:mod:`.lstsq`);
- ``cg(A, b, ...)``: conjugate gradients for SPD operators (:mod:`.cg`);
- ``svd_randomized(A, k, ...)``: a truncated SVD from a seeded sketch (:mod:`.randomized`);
- ``qr``, ``svd``, ``svdvals``, ``matrix_norm``, ``matrix_rank``, ``pinv``: the functions
  of :mod:`sbpmpi.array_api.linalg` (looked up there on first use), which factor a split
  non-square matrix where it lies by TSQR (:mod:`.tsqr`, :mod:`.tall`);
- ``path_of(function, x)``: which path a call takes at a layout (:mod:`.paths`; also
  ``sm.explain(fn, x)``).

Modules: :mod:`.blocks` (one rank's Householder QR, in place), :mod:`.tsqr` (the tree of R
factors), :mod:`.tall` (the split non-square matrices), :mod:`.paths` (the rule),
:mod:`.results` (named results).
"""

from __future__ import annotations

import importlib
from typing import Any

from .cg import CGResult, cg
from .lstsq import LstsqResult, lstsq
from .paths import LinalgPath, path_of
from .randomized import svd_randomized
from .results import QRResult, SVDResult

#: Names this namespace shares with ``sm.array_api.linalg`` (the array API's own functions).
_SHARED = ("qr", "svd", "svdvals", "matrix_norm", "matrix_rank", "pinv")

__all__ = ["lstsq", "cg", "svd_randomized", "path_of", "LstsqResult", "CGResult",
           "LinalgPath", "QRResult", "SVDResult", *_SHARED]


def __getattr__(name: str) -> Any:
    if name in _SHARED:  # not imported at the top: array_api.linalg imports this package
        value = getattr(importlib.import_module("sbpmpi.array_api.linalg"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sbpmpi.linalg' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
