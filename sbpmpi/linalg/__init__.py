"""``sm.linalg``: linear algebra at the size of the data (as ``torch.linalg`` beside the
tensor API).

- ``lstsq(a, b, rcond=None)``: NumPy's least squares, through QR (:mod:`.least_squares`);
- ``cg(A, b, ...)``: conjugate gradients for SPD operators (:mod:`.conjugate_gradients`);
- ``svd_randomized(A, k, ...)``: a truncated SVD from a seeded sketch (:mod:`.randomized`);
- ``path_of(function, x)``: which path a call takes at a layout (:mod:`.paths`; also
  ``sm.explain(fn, *args)``).

The decompositions (``qr``, ``svd``, ``svdvals``, ``matrix_norm``, ``matrix_rank``,
``pinv``) are the Array API's, in ``sm.array_api.linalg``: there they factor a split
non-square matrix where it lies, by TSQR (:mod:`.tsqr`, :mod:`.tall`).

Modules: :mod:`.blocks` (one rank's Householder QR, in place), :mod:`.tsqr` (the tree of R
factors), :mod:`.tall` (split non-square matrices), :mod:`.paths` (the rule),
:mod:`.results` (the named results, ``SVDResult`` and ``QRResult`` among them, shared with
``sm.array_api.linalg``).
"""

from __future__ import annotations

from .conjugate_gradients import CGResult, cg
from .least_squares import LstsqResult, lstsq
from .paths import LinalgPath, path_of
from .randomized import svd_randomized

__all__ = ["lstsq", "cg", "svd_randomized", "path_of", "LstsqResult", "CGResult",
           "LinalgPath"]
