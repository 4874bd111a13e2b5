"""One rank's block of a tall matrix: its Householder QR, and products written into its Q.

The kernels hold O(block) memory: on ``"cpu"`` with SciPy, LAPACK's ``geqrf`` and
``orgqr`` (``ungqr``) run in place on one Fortran-ordered copy of the block, which then
holds Q, and :func:`times_in_place` writes ``Q @ W`` back into it row chunk by row chunk
(without SciPy, NumPy's Householder factorization in a copy of the block, and Q made from
its reflectors chunk by chunk: two blocks); the R factor alone (:func:`r_factor`) is made
from row chunks stacked under the R of the chunks before them, so it never copies the
whole block. With CuPy on ``"cuda"``, the
backend's ``linalg.qr`` does the work (one more copy of the block).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

__all__ = ["BlockQR", "qr_block", "r_factor", "times_in_place", "conj_t", "CHUNK_BYTES"]

#: Rows are taken this many bytes at a time where a kernel works chunk by chunk.
CHUNK_BYTES = 1 << 20


def _scipy_lapack() -> ModuleType | None:
    try:
        return importlib.import_module("scipy.linalg.lapack")
    except ImportError:
        return None


_LAPACK = _scipy_lapack()


class BlockQR(NamedTuple):
    """``block = q @ r``: ``q`` (rows x k) with orthonormal columns, ``r`` (k x n) upper
    triangular (trapezoidal), ``k = min(rows, n)``."""

    q: Any
    r: Any


def _chunk_rows(n: int, itemsize: int) -> int:
    return max(n, CHUNK_BYTES // max(1, n * itemsize))


def qr_block(xp: ModuleType, block: Any, overwrite: bool = False) -> BlockQR:
    """The reduced QR of ``block`` (rows x n). With SciPy on NumPy arrays of at least as
    many rows as columns, ``q`` is Fortran-ordered and is the one copy of the block made
    (none when ``overwrite`` and the block is Fortran-ordered: it becomes ``q``)."""
    rows, n = block.shape
    if rows == 0:
        return BlockQR(xp.zeros((0, 0), dtype=block.dtype), xp.zeros((0, n), dtype=block.dtype))
    if xp is np and _LAPACK is None and rows >= n:
        return _numpy_qr(block)
    if _LAPACK is None or xp is not np or rows < n:
        q, r = xp.linalg.qr(block, mode="reduced")
        return BlockQR(q, r)
    complex_ = block.dtype.kind == "c"
    geqrf, orgqr, query = _LAPACK.get_lapack_funcs(
        ("geqrf", "ungqr" if complex_ else "orgqr", "geqrf_lwork"), (block,))
    reuse = overwrite and block.flags.f_contiguous and block.flags.writeable
    work = block if reuse else np.array(block, order="F", copy=True)
    lwork, info = query(rows, n)
    lwork = max(int(np.real(lwork)), 1)
    raw, tau, _, info = geqrf(work, lwork=lwork, overwrite_a=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"linalg: LAPACK geqrf failed (info {info})")
    r = np.triu(raw[:n])
    q, _, info = orgqr(raw, tau, lwork=lwork, overwrite_a=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"linalg: LAPACK orgqr failed (info {info})")
    return BlockQR(q, r)


def _numpy_qr(block: Any) -> BlockQR:
    """``qr_block`` with NumPy alone: its Householder factorization (``mode="raw"``: one
    copy of the block, which holds the reflectors) and Q made from the reflectors row
    chunk by row chunk, so at most two blocks are held (``mode="reduced"`` holds three:
    NumPy's LAPACK wrapper copies the factored block again to make Q)."""
    h_t, tau = np.linalg.qr(block, mode="raw")
    h = h_t.T  # rows x n: R on and above the diagonal, the reflectors below it
    n = h.shape[1]
    r = np.triu(h[:n])
    return BlockQR(_reflected_identity(h, tau), r)


def _reflected_identity(h: Any, tau: Any) -> Any:
    """``H_0 H_1 ... H_{n-1} [I; 0]`` (rows x n) for the Householder reflectors
    ``H_j = I - tau_j v_j v_j^H`` stored below the diagonal of ``h`` as LAPACK's ``geqrf``
    leaves them (``v_j`` is 1 at row j); LAPACK's ``orgqr`` (unblocked), applied backward
    so that each reflector touches columns j and up only, row chunk by row chunk."""
    rows, n = h.shape
    complex_ = h.dtype.kind == "c"
    q = np.zeros((rows, n), dtype=h.dtype)
    q[np.arange(n), np.arange(n)] = 1
    step = _chunk_rows(n, h.dtype.itemsize)
    for j in range(n - 1, -1, -1):
        if tau[j] == 0:
            continue  # H_j is the identity
        w = q[j, j:].copy()  # v_j^H Q[j:, j:], v_j's leading 1 first
        for start in range(j + 1, rows, step):
            v = h[start:start + step, j]
            w += (np.conj(v) if complex_ else v) @ q[start:start + step, j:]
        w *= tau[j]
        q[j, j:] -= w
        for start in range(j + 1, rows, step):
            q[start:start + step, j:] -= np.multiply.outer(h[start:start + step, j], w)
    return q


def r_factor(xp: ModuleType, block: Any, extra: Any = None) -> Any:
    """The R factor (min(rows, n) x n) of ``block``'s QR (of ``[block | extra]`` when
    ``extra``, rows x k, is given), from row chunks: each chunk is factored under the R
    of the chunks before it, so at most one chunk is copied."""
    rows = block.shape[0]
    n = block.shape[1] + (0 if extra is None else extra.shape[1])
    dtype = block.dtype if extra is None else np.result_type(block.dtype, extra.dtype)
    step = _chunk_rows(n, np.dtype(dtype).itemsize)
    r = xp.zeros((0, n), dtype=dtype)
    for start in range(0, rows, step):
        part = block[start:start + step]
        if extra is not None:
            part = xp.concatenate([part, extra[start:start + step]], axis=1)
        r = xp.linalg.qr(xp.concatenate([r, part]) if r.shape[0] else part, mode="r")
    return r


def conj_t(xp: ModuleType, a: Any) -> Any:
    """``a``'s conjugate transpose: a view for a real array (``conj`` would copy it)."""
    return xp.conj(a).T if a.dtype.kind == "c" else a.T


def times_in_place(xp: ModuleType, q: Any, w: Any) -> Any:
    """``q @ w``, written into ``q`` row chunk by row chunk when ``w`` is square (so no
    second block is made); a new array otherwise."""
    rows, k = q.shape
    if w.shape != (k, k) or rows == 0:
        return q @ w
    step = _chunk_rows(k, q.dtype.itemsize)
    for start in range(0, rows, step):
        q[start:start + step] = q[start:start + step] @ w
    return q
