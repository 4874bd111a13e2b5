"""The standard's ``linalg`` extension on global arrays: ``sbpmpi.array_api.linalg``, the
Array API face of ``sm.linalg`` (every function here is ``sm.linalg``'s own, imported).

The decompositions and solvers act on stacks of matrices: the last two dims are held
whole on each rank and the batch dims may stay split (each rank factors its own
matrices, nothing is communicated); a split non-square 2-D matrix is factored where it
lies, by TSQR. The products and norms are distributed ops: a split of a reduced axis
gives partial sums reduced across ranks. Functions with several results return named
tuples; a factorization that fails on one rank makes every rank raise ``LinAlgError``.
Results equal NumPy's (``array_api_strict`` semantics) on every rank. ``docs/linalg.md``
and ``docs/array_api.md`` tell the paths.
"""

from __future__ import annotations

from ..linalg import (
    EighResult,
    QRResult,
    SlogdetResult,
    SVDResult,
    cholesky,
    cross,
    det,
    diagonal,
    eigh,
    eigvalsh,
    inv,
    matmul,
    matrix_norm,
    matrix_power,
    matrix_rank,
    matrix_transpose,
    outer,
    pinv,
    qr,
    slogdet,
    solve,
    svd,
    svdvals,
    tensordot,
    trace,
    vecdot,
    vector_norm,
)

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer",
           "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace",
           "vecdot", "vector_norm", "EighResult", "QRResult", "SlogdetResult",
           "SVDResult"]
