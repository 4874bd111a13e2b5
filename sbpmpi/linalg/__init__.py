"""``sm.linalg``: sbpmpi's linear algebra, every function of it (as ``torch.linalg`` beside
the tensor API). ``sm.array_api.linalg`` is its Array API face (the standard's names and
signatures, imported from here).

- products (:mod:`.products`): ``matmul``, ``matrix_transpose``, ``tensordot``,
  ``vecdot``, ``outer``, ``cross``; the diagonals (:mod:`.diagonals`): ``diagonal``,
  ``trace``;
- factorizations (:mod:`.factorizations`): ``cholesky``, ``det``, ``eigh``, ``eigvalsh``,
  ``qr``, ``slogdet``, ``svd``, ``svdvals``; ``svd_randomized(A, k, ...)``: a truncated
  SVD from a seeded sketch (:mod:`.randomized`);
- solvers (:mod:`.solvers`): ``solve``, ``inv``, ``matrix_power``, ``pinv``,
  ``matrix_rank``; ``lstsq(a, b, rcond=None)``: NumPy's least squares, through QR
  (:mod:`.least_squares`); ``cg(A, b, ...)``: conjugate gradients for SPD operators
  (:mod:`.conjugate_gradients`);
- norms (:mod:`.norms`): ``vector_norm``, ``matrix_norm``;
- ``path_of(function, x)``: which path a call takes at a layout (:mod:`.paths`; also
  ``sm.explain(fn, *args)``).

The factorizations and solvers act on stacks of matrices where their batch dims lie
(:mod:`.stacks`); a split non-square 2-D matrix is factored where it lies, by TSQR
(:mod:`.blocks`: one rank's Householder QR, in place; :mod:`.tsqr`: the tree of R
factors; :mod:`.tall`: split non-square matrices). :mod:`.results` holds the named
results (``SVDResult``, ``QRResult``, ...). ``sm.matmul`` is the matmul op
(:mod:`sbpmpi.ops.linalg`, registered with the core's ops); ``sm.linalg.matmul`` is the
Array API's (that op, with the standard's dtype promotion).
"""

from __future__ import annotations

from .conjugate_gradients import CGResult, cg
from .diagonals import diagonal, trace
from .factorizations import cholesky, det, eigh, eigvalsh, qr, slogdet, svd, svdvals
from .least_squares import LstsqResult, lstsq
from .norms import matrix_norm, vector_norm
from .paths import LinalgPath, path_of
from .products import cross, matmul, matrix_transpose, outer, tensordot, vecdot
from .randomized import svd_randomized
from .results import EighResult, QRResult, SlogdetResult, SVDResult
from .solvers import inv, matrix_power, matrix_rank, pinv, solve

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer",
           "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace",
           "vecdot", "vector_norm", "EighResult", "QRResult", "SlogdetResult",
           "SVDResult", "lstsq", "cg", "svd_randomized", "path_of", "LstsqResult",
           "CGResult", "LinalgPath"]
