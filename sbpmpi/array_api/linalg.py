"""The standard's ``linalg`` extension on global arrays: ``sbpmpi.array_api.linalg``.

Two kinds of function, two algorithms:

- **Decompositions and solvers** (``cholesky``, ``det``, ``diagonal``, ``eigh``,
  ``eigvalsh``, ``inv``, ``matrix_power``, ``matrix_rank``, ``pinv``, ``qr``,
  ``slogdet``, ``solve``, ``svd``, ``svdvals``) act on stacks of matrices: the last two
  dims are held whole on each rank and the stacked (batch) dims may stay split. With
  the batch dims split, every rank factors its own matrices with the backend's linalg
  module (``numpy.linalg`` on ``"cpu"``, ``cupy.linalg`` on ``"cuda"``: the kernels get
  the array module of the placement) and nothing is communicated; a split of a matrix
  dim is boxed away first (``runtime.redistribute``: the matrices are gathered). The
  results keep the batch splits of the operands; the matrix dims of the results are
  broadcast. Except at the size of the data: ``qr``, ``svd`` (``full_matrices=False``),
  ``svdvals``, ``matrix_rank``, ``pinv`` and ``matrix_norm`` (2, -2, ``"nuc"``) of a
  split non-square 2-D matrix factor it where it lies, by TSQR (:mod:`sbpmpi.linalg.tall`):
  its long dim stays split in the results, the small factors are broadcast. Q's R has a
  non-negative real diagonal there, and each row of V^H its largest entry real positive,
  so R, U and V^H equal NumPy's up to signs (phases). :func:`sbpmpi.linalg.paths.path_of`
  is the rule; ``sm.explain(xp.linalg.qr, x)`` prints the path of a call.
- **Elementwise-like functions** (``cross``, ``matmul``, ``matrix_norm``,
  ``matrix_transpose``, ``outer``, ``tensordot``, ``trace``, ``vecdot``,
  ``vector_norm``) are the namespace's distributed ops: a split of a reduced axis gives
  partial sums (or maxima) reduced across ranks, other splits stay. ``matrix_norm`` with
  ``ord`` 2, -2 or ``"nuc"`` needs the singular values (``svdvals``, above).

Functions that return several arrays (``eigh``, ``qr``, ``slogdet``, ``svd``) return
named tuples; the factorization runs once per matrix, its parts packed along one last
dim and cut apart on each rank. A factorization that fails on one rank (a singular
matrix, ...) makes every rank raise ``LinAlgError`` (one reduction of a flag per matrix).
Results equal NumPy's (``array_api_strict`` semantics) on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .. import ops
from ..core.dtypes import float32, is_floating, is_half
from ..linalg import paths, tall
from ..linalg.paths import explains
from ..linalg.results import EighResult, QRResult, SlogdetResult, SVDResult
from ..ops.elementwise import broadcast_matches
from ..ops.signature import DimMatch
from ..tensor import GlobalTensor
from ._creation import index_along
from ._dtypes import astype, result_type
from ._elementwise import abs as abs_
from ._elementwise import multiply, not_equal, real
from ._elementwise import pow as pow_
from ._linalg import matmul, matrix_transpose, tensordot, vecdot
from ._local import axis_op, elementwise, norm_axes, run_local
from ._manipulation import expand_dims, reshape
from ._statistical import any as any_
from ._statistical import max as max_
from ._statistical import min as min_
from ._statistical import sum as sum_

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer",
           "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace",
           "vecdot", "vector_norm", "EighResult", "QRResult", "SlogdetResult",
           "SVDResult"]


def _array(name: str, x: Any, what: str = "x") -> GlobalTensor:
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"linalg.{name}: {what} must be a global array, got "
                        f"{type(x).__name__}")
    return x


def _matrices(name: str, x: Any, *, square: bool = False, floating: bool = True,
              numeric: bool = False) -> GlobalTensor:
    """``x`` checked: a global array of at least 2 dims (square matrices when asked), of
    a floating (or numeric) dtype when asked."""
    _array(name, x)
    if x.ndim < 2:
        raise ValueError(f"linalg.{name}: x must have at least 2 dims, got shape {x.shape}")
    if square and x.shape[-1] != x.shape[-2]:
        raise ValueError(f"linalg.{name}: x must be a stack of square matrices, got shape "
                         f"{x.shape}")
    if floating and x.dtype.kind not in "fc":
        raise TypeError(f"linalg.{name}: x must have a floating-point dtype, got {x.dtype}")
    if numeric and x.dtype.kind not in "iufc":
        raise TypeError(f"linalg.{name}: x must have a numeric dtype, got {x.dtype}")
    return x


def _real(dt: np.dtype) -> np.dtype:
    """The real dtype of ``dt``'s precision (``dt`` itself when real)."""
    return np.empty((), dtype=dt).real.dtype


def _stacked(name: str, x: GlobalTensor, kernel: Callable[[ModuleType, Any], Any],
             tail: tuple[int, ...], dtype: np.dtype) -> GlobalTensor:
    """``kernel(xp, local_x)`` on stacks of matrices: the last two dims of ``x`` whole on
    each rank, its batch dims carried to the output (``x.shape[:-2] + tail``)."""
    batch = x.ndim - 2
    return axis_op(f"linalg.{name}", x, (batch, batch + 1), kernel, x.shape[:-2] + tail,
                   dtype, {d: d for d in range(batch)})


#: What a failed local factorization means, by function (the message every rank raises).
FAILURES = {"cholesky": "a matrix is not positive-definite",
            "inv": "a matrix is singular", "matrix_power": "a matrix is singular",
            "solve": "a matrix of x1 is singular"}

Runner = Callable[[Callable[..., Any], tuple[int, ...], np.dtype], GlobalTensor]


def _parts(name: str, run: Runner, kernel: Callable[..., tuple[Any, ...]],
           batch: tuple[int, ...], tails: tuple[tuple[int, ...], ...],
           dtypes: tuple[np.dtype, ...]) -> list[GlobalTensor]:
    """The results of one local ``kernel(xp, *local_operands)`` call (a factorization runs
    once), of global shapes ``batch + tail``, made by ``run(pack, tail, dtype)``.

    The parts travel packed along one last dim, in the dtype they all fit, with a flag
    per matrix: set where the backend raised ``LinAlgError`` on the rank holding it. The
    parts are cut apart on each rank (that dim is whole everywhere) and every rank
    raises ``LinAlgError`` when one failed (one reduction of the flags)."""
    packed = np.result_type(*dtypes)
    sizes = [math.prod(t) for t in tails]
    total = sum(sizes)

    def pack(xp: ModuleType, *local: Any) -> Any:
        error = getattr(xp.linalg, "LinAlgError", np.linalg.LinAlgError)
        try:
            parts = kernel(xp, *local)
        except error:
            failed = xp.zeros((total + 1,), dtype=packed)
            failed[total] = 1  # run_local broadcasts it over this rank's matrices
            return failed
        lead = parts[0].shape[:parts[0].ndim - len(tails[0])]
        return xp.concatenate([xp.reshape(part, lead + (n,)).astype(packed)
                               for part, n in zip(parts, sizes)]
                              + [xp.zeros(lead + (1,), dtype=packed)], axis=-1)

    both = run(pack, (total + 1,), packed)
    if bool(any_(both[..., total])):
        raise np.linalg.LinAlgError(f"linalg.{name}: {FAILURES.get(name, 'did not converge')}")
    out = []
    start = 0
    for tail, n, dt in zip(tails, sizes, dtypes):
        part = reshape(both[..., start:start + n], batch + tail)
        if part.dtype.kind == "c" and dt.kind != "c":
            part = real(part)  # a real part packed as complex comes back exactly
        out.append(part if part.dtype == dt else astype(part, dt))
        start += n
    return out


def _stacked_parts(name: str, x: GlobalTensor,
                   kernel: Callable[[ModuleType, Any], tuple[Any, ...]],
                   tails: tuple[tuple[int, ...], ...], dtypes: tuple[np.dtype, ...]
                   ) -> list[GlobalTensor]:
    """:func:`_parts` of ``kernel(xp, local_x)`` on stacks of matrices (:func:`_stacked`)."""

    def run(pack: Callable[..., Any], tail: tuple[int, ...], dt: np.dtype) -> GlobalTensor:
        return _stacked(name, x, pack, tail, dt)

    return _parts(name, run, kernel, x.shape[:-2], tails, dtypes)


def _checked(name: str, x: GlobalTensor, kernel: Callable[[ModuleType, Any], Any],
             tail: tuple[int, ...], dtype: np.dtype) -> GlobalTensor:
    """:func:`_stacked` for a kernel that may raise ``LinAlgError`` (on every rank)."""
    return _stacked_parts(name, x, lambda xp, a: (kernel(xp, a),), (tail,), (dtype,))[0]


def cholesky(x: GlobalTensor, /, *, upper: bool = False) -> GlobalTensor:
    """The Cholesky factor of Hermitian positive-definite matrices: lower triangular
    ``L`` with ``x = L @ L^H``, or upper ``U = L^H`` when ``upper``."""
    _matrices("cholesky", x, square=True)

    def kernel(xp: ModuleType, a: Any) -> Any:
        low = xp.linalg.cholesky(a)
        return xp.conj(xp.swapaxes(low, -1, -2)) if upper else low

    return _checked("cholesky", x, kernel, x.shape[-2:], x.dtype)


def cross(x1: GlobalTensor, x2: GlobalTensor, /, *, axis: int = -1) -> GlobalTensor:
    """The cross product of 3-element vectors along ``axis`` (of the broadcast shape;
    negative), with broadcasting along the other dims."""
    _array("cross", x1, "x1")
    _array("cross", x2, "x2")
    for what, a in (("x1", x1), ("x2", x2)):
        if a.dtype.kind not in "iufc":
            raise TypeError(f"linalg.cross: {what} must have a numeric dtype, got {a.dtype}")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"linalg.cross: axis must be an int, got {axis!r}")
    if not -min(x1.ndim, x2.ndim) <= axis < 0:
        raise ValueError(f"linalg.cross: axis {axis} must be negative and name a dim of both "
                         f"x1 (shape {x1.shape}) and x2 (shape {x2.shape})")
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ValueError(f"linalg.cross: axis {axis} must have size 3 in x1 and x2, got "
                         f"shapes {x1.shape} and {x2.shape}")
    try:
        shape = tuple(int(n) for n in np.broadcast_shapes(x1.shape, x2.shape))
    except ValueError:
        raise ValueError(f"linalg.cross: shapes {x1.shape} and {x2.shape} cannot be broadcast "
                         f"together") from None
    dt = result_type(x1, x2)
    d = len(shape) + axis
    carried = tuple(m for m in broadcast_matches([x1.shape, x2.shape], shape) if m.output != d)

    def kernel(xp: ModuleType, a: Any, b: Any) -> Any:
        return xp.cross(a.astype(dt), b.astype(dt), axis=axis)

    return run_local("linalg.cross", (x1, x2), kernel, shape, dt, carried)


def det(x: GlobalTensor, /) -> GlobalTensor:
    """The determinants of square matrices."""
    _matrices("det", x, square=True)
    return _stacked("det", x, lambda xp, a: xp.linalg.det(a), (), x.dtype)


def diagonal(x: GlobalTensor, /, *, offset: int = 0) -> GlobalTensor:
    """The ``offset`` diagonal of each matrix (above the main one when positive)."""
    _matrices("diagonal", x, floating=False)
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"linalg.diagonal: offset must be an int, got {offset!r}")
    n, m = x.shape[-2:]
    size = max(0, min(n + min(offset, 0), m - max(offset, 0)))

    def kernel(xp: ModuleType, a: Any) -> Any:
        return xp.diagonal(a, offset=int(offset), axis1=-2, axis2=-1)

    return _stacked("diagonal", x, kernel, (size,), x.dtype)


def eigh(x: GlobalTensor, /) -> EighResult:
    """Eigenvalues (ascending) and eigenvectors of Hermitian matrices (the lower triangle
    is read, as NumPy does)."""
    _matrices("eigh", x, square=True)
    vals, vecs = _stacked_parts("eigh", x, lambda xp, a: tuple(xp.linalg.eigh(a)),
                                (x.shape[-1:], x.shape[-2:]), (_real(x.dtype), x.dtype))
    return EighResult(vals, vecs)


def eigvalsh(x: GlobalTensor, /) -> GlobalTensor:
    """Eigenvalues (ascending) of Hermitian matrices."""
    _matrices("eigvalsh", x, square=True)
    return _checked("eigvalsh", x, lambda xp, a: xp.linalg.eigvalsh(a), x.shape[-1:],
                    _real(x.dtype))


def inv(x: GlobalTensor, /) -> GlobalTensor:
    """The inverses of square matrices (``LinAlgError`` where one is singular)."""
    _matrices("inv", x, square=True)
    return _checked("inv", x, lambda xp, a: xp.linalg.inv(a), x.shape[-2:], x.dtype)


def matrix_power(x: GlobalTensor, n: int, /) -> GlobalTensor:
    """Square matrices raised to the integer power ``n`` (negative: of the inverse)."""
    _matrices("matrix_power", x, square=True)
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"linalg.matrix_power: n must be an int, got {n!r}")
    run = _checked if n < 0 else _stacked  # only an inverse can fail
    return run("matrix_power", x, lambda xp, a: xp.linalg.matrix_power(a, int(n)),
               x.shape[-2:], x.dtype)


def _rtol(name: str, x: GlobalTensor, rtol: Any) -> tuple[float | None, GlobalTensor | None]:
    """``rtol`` as a Python float (None: the default) or a global array of tolerances per
    matrix (broadcast against the batch shape)."""
    if rtol is None:
        return None, None
    if isinstance(rtol, GlobalTensor):
        if rtol.dtype.kind not in "f":
            raise TypeError(f"linalg.{name}: rtol must be real floating, got {rtol.dtype}")
        try:
            fits = np.broadcast_shapes(rtol.shape, x.shape[:-2]) == x.shape[:-2]
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"linalg.{name}: rtol of shape {rtol.shape} does not broadcast "
                             f"to the stack shape {x.shape[:-2]}")
        return None, rtol
    if isinstance(rtol, (bool, np.bool_)) or not isinstance(rtol, (int, float, np.number)):
        raise TypeError(f"linalg.{name}: rtol must be a float, a global array or None, got "
                        f"{rtol!r}")
    return float(rtol), None


def _tolerant(name: str, x: GlobalTensor, rtol: Any, tail: tuple[int, ...],
              dtype: np.dtype, f: Callable[[ModuleType, Any, Any], Any]) -> GlobalTensor:
    """``f(xp, local_x, rtol)`` per stack, ``rtol`` a float or an array broadcast against
    the batch dims (the default: ``max(M, N) * eps``)."""
    value, array = _rtol(name, x, rtol)
    if value is None and array is None:
        value = max(x.shape[-2:]) * float(np.finfo(x.dtype).eps)
    if array is None:
        return _checked(name, x, lambda xp, a: f(xp, a, value), tail, dtype)
    batch = x.shape[:-2]
    carried = broadcast_matches([batch, array.shape], batch)

    def run(pack: Callable[..., Any], packed: tuple[int, ...], dt: np.dtype) -> GlobalTensor:
        return run_local(f"linalg.{name}", (x, array), pack, batch + packed, dt, carried)

    def kernel(xp: ModuleType, a: Any, r: Any) -> tuple[Any, ...]:
        return (f(xp, a, r.astype(_real(x.dtype))),)

    return _parts(name, run, kernel, batch, (tail,), (dtype,))[0]


def _scalar_rtol(name: str, x: GlobalTensor, rtol: Any) -> float | None:
    """``rtol`` of a single matrix as a float (None: the default); a global array is
    0-d there (the stack shape is ())."""
    value, array = _rtol(name, x, rtol)
    return float(array) if array is not None else value


def _rank_path(x: Any, /, *, rtol: Any = None) -> paths.LinalgPath:
    return paths.path_of("matrix_rank", _matrices("matrix_rank", x))


@explains(_rank_path)
def matrix_rank(x: GlobalTensor, /, *, rtol: Any = None) -> GlobalTensor:
    """The rank of each matrix: its singular values above ``rtol`` times the largest
    (default ``max(M, N) * eps``); ``rtol`` may be a global array per matrix."""
    _matrices("matrix_rank", x)
    if _rank_path(x).kind in ("tall", "wide"):
        return tall.matrix_rank(x, _scalar_rtol("matrix_rank", x, rtol))

    def f(xp: ModuleType, a: Any, r: Any) -> Any:
        s = xp.linalg.svd(a, compute_uv=False)
        if s.shape[-1] == 0:  # empty matrices have rank 0 (and no largest value)
            return xp.zeros(s.shape[:-1], dtype=np.int64)
        tol = s.max(axis=-1, keepdims=True) * xp.asarray(r)[..., None]
        return xp.count_nonzero(s > tol, axis=-1)

    return _tolerant("matrix_rank", x, rtol, (), np.dtype(np.int64), f)


def _pinv_path(x: Any, /, *, rtol: Any = None) -> paths.LinalgPath:
    return paths.path_of("pinv", _matrices("pinv", x))


@explains(_pinv_path)
def pinv(x: GlobalTensor, /, *, rtol: Any = None) -> GlobalTensor:
    """The Moore-Penrose pseudo-inverses: singular values at or below ``rtol`` times the
    largest are dropped (default ``max(M, N) * eps``)."""
    _matrices("pinv", x)
    if _pinv_path(x).kind in ("tall", "wide"):
        return tall.pinv(x, _scalar_rtol("pinv", x, rtol))

    def f(xp: ModuleType, a: Any, r: Any) -> Any:
        return xp.linalg.pinv(a, rcond=xp.asarray(r))

    return _tolerant("pinv", x, rtol, x.shape[-1:] + x.shape[-2:-1], x.dtype, f)


def _qr_path(x: Any, /, *, mode: str = "reduced") -> paths.LinalgPath:
    return paths.path_of("qr", _matrices("qr", x), square_factor=mode == "complete")


@explains(_qr_path)
def qr(x: GlobalTensor, /, *, mode: str = "reduced") -> Any:
    """The QR factorization of each matrix; ``mode`` ``"reduced"`` (``Q`` is M x K),
    ``"complete"`` (``Q`` is M x M) or ``"r"`` (NumPy's: ``R`` alone, not a tuple)."""
    _matrices("qr", x)
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
        return _checked("qr", x, lambda xp, a: xp.linalg.qr(a, mode="r"), (min(m, n), n),
                        x.dtype)
    q, r = _stacked_parts("qr", x, lambda xp, a: tuple(xp.linalg.qr(a, mode=mode)),
                          ((m, k), (k, n)), (x.dtype, x.dtype))
    return QRResult(q, r)


def slogdet(x: GlobalTensor, /) -> SlogdetResult:
    """Sign and natural log of the absolute value of each determinant (0 and ``-inf``
    for a singular matrix)."""
    _matrices("slogdet", x, square=True)
    sign, logabs = _stacked_parts("slogdet", x, lambda xp, a: tuple(xp.linalg.slogdet(a)),
                                  ((), ()), (x.dtype, _real(x.dtype)))
    return SlogdetResult(sign, logabs)


def solve(x1: GlobalTensor, x2: GlobalTensor, /) -> GlobalTensor:
    """The solutions ``y`` of ``x1 @ y = x2``: ``x1`` square matrices, ``x2`` one vector
    (1-D: shape ``(M,)``) or matrices whose stack dims broadcast against ``x1``'s."""
    _matrices("solve", x1, square=True)
    _array("solve", x2, "x2")
    if x2.dtype.kind not in "fc":
        raise TypeError(f"linalg.solve: x2 must have a floating-point dtype, got {x2.dtype}")
    m = x1.shape[-1]
    if x2.ndim == 0 or (x2.ndim == 1 and x2.shape[0] != m) or \
            (x2.ndim >= 2 and x2.shape[-2] != m):
        raise ValueError(f"linalg.solve: x2 of shape {x2.shape} must be (M,) or (..., M, K) "
                         f"for x1 of shape {x1.shape}")
    dt = result_type(x1, x2)
    if x2.ndim == 1:
        batch = x1.shape[:-2]
        carried = tuple(DimMatch((d, None), d) for d in range(x1.ndim - 2))
    else:
        try:
            batch = tuple(int(n) for n in np.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
        except ValueError:
            raise ValueError(f"linalg.solve: the stack shapes of x1 {x1.shape} and x2 "
                             f"{x2.shape} cannot be broadcast together") from None
        carried = broadcast_matches([x1.shape[:-2], x2.shape[:-2]], batch)
    tail = x2.shape[-2:] if x2.ndim >= 2 else (m,)

    def run(pack: Callable[..., Any], packed: tuple[int, ...], pdt: np.dtype) -> GlobalTensor:
        return run_local("linalg.solve", (x1, x2), pack, batch + packed, pdt, carried)

    def kernel(xp: ModuleType, a: Any, b: Any) -> tuple[Any, ...]:
        return (xp.linalg.solve(a.astype(dt), b.astype(dt)),)

    return _parts("solve", run, kernel, batch, (tail,), (dt,))[0]


def _svd_path(x: Any, /, *, full_matrices: bool = True) -> paths.LinalgPath:
    return paths.path_of("svd", _matrices("svd", x), square_factor=bool(full_matrices))


@explains(_svd_path)
def svd(x: GlobalTensor, /, *, full_matrices: bool = True) -> SVDResult:
    """The singular value decomposition of each matrix; ``U`` is M x M and ``Vh`` N x N
    when ``full_matrices``, else M x K and K x N."""
    _matrices("svd", x)
    path = _svd_path(x, full_matrices=full_matrices)
    if path.kind == "refused":
        raise ValueError(f"linalg.svd: full_matrices=True of x {x.shape}: {path.why}")
    if path.kind in ("tall", "wide"):
        return SVDResult(*tall.svd(x))
    m, n = x.shape[-2:]
    k = min(m, n)
    full = bool(full_matrices)
    u, s, vh = _stacked_parts("svd", x,
                              lambda xp, a: tuple(xp.linalg.svd(a, full_matrices=full)),
                              ((m, m if full else k), (k,), (n if full else k, n)),
                              (x.dtype, _real(x.dtype), x.dtype))
    return SVDResult(u, s, vh)


def _svdvals_path(x: Any, /) -> paths.LinalgPath:
    return paths.path_of("svdvals", _matrices("svdvals", x))


@explains(_svdvals_path)
def svdvals(x: GlobalTensor, /) -> GlobalTensor:
    """The singular values of each matrix, in descending order."""
    if _svdvals_path(x).kind in ("tall", "wide"):
        return tall.svdvals(x)
    return _checked("svdvals", x, lambda xp, a: xp.linalg.svd(a, compute_uv=False),
                    (min(x.shape[-2:]),), _real(x.dtype))


def outer(x1: GlobalTensor, x2: GlobalTensor, /) -> GlobalTensor:
    """The outer product of two vectors (elementwise, so splits of either stay)."""
    for what, a in (("x1", x1), ("x2", x2)):
        _array("outer", a, what)
        if a.ndim != 1:
            raise ValueError(f"linalg.outer: {what} must be 1-D, got shape {a.shape}")
        if a.dtype.kind not in "iufc":
            raise TypeError(f"linalg.outer: {what} must have a numeric dtype, got {a.dtype}")
    return multiply(reshape(x1, (x1.shape[0], 1)), reshape(x2, (1, x2.shape[0])))


def trace(x: GlobalTensor, /, *, offset: int = 0, dtype: Any = None) -> GlobalTensor:
    """The sum of each matrix's ``offset`` diagonal, in ``dtype`` (default as ``sum``:
    integers in the default integer dtype)."""
    _matrices("trace", x, floating=False, numeric=True)
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"linalg.trace: offset must be an int, got {offset!r}")
    k = int(offset)

    def kernel(xp: ModuleType, a: Any, i: Any, j: Any) -> Any:
        return xp.where(j - i == k, a, xp.zeros((), dtype=a.dtype))

    # the diagonal masked in place (elementwise, with index vectors), so a split matrix
    # dim stays split and the sum over the matrix dims adds partial sums
    rows, cols = index_along(x.shape[-2], x.placement, True), index_along(x.shape[-1], x.placement, False)
    on_diagonal = elementwise("linalg.trace", kernel, x, rows, cols, dtype=x.dtype)
    return sum_(on_diagonal, axis=(-2, -1), dtype=dtype)


def _largest(mag: GlobalTensor, axis: Any, keepdims: bool) -> GlobalTensor:
    """The largest of the magnitudes ``mag`` over ``axis``; 0 over an empty axis, as in
    NumPy (the sum of no magnitudes)."""
    axes = norm_axes("linalg.norm", axis, mag.ndim)
    if any(mag.shape[d] == 0 for d in axes):
        return sum_(mag, axis=axes, keepdims=keepdims)
    return max_(mag, axis=axes, keepdims=keepdims)


def vector_norm(x: GlobalTensor, /, *, axis: Any = None, keepdims: bool = False,
                ord: Any = 2) -> GlobalTensor:  # noqa: A002
    """The ``ord``-norm of the vectors along ``axis`` (all axes when None): ``inf`` the
    largest magnitude, ``-inf`` the smallest, ``0`` the count of nonzeros, else
    ``sum(|x|**ord)**(1/ord)``; distributed reductions (a split axis sums partials)."""
    _array("vector_norm", x)
    if x.dtype.kind != "c" and not is_floating(x.dtype):  # bfloat16 included
        raise TypeError(f"linalg.vector_norm: x must have a floating-point dtype, got "
                        f"{x.dtype}")
    if isinstance(ord, (bool, np.bool_)) or not isinstance(ord, (int, float, np.number)):
        raise TypeError(f"linalg.vector_norm: ord must be a number, got {ord!r}")
    axes = norm_axes("linalg.vector_norm", axis, x.ndim)
    keep = bool(keepdims)
    if is_half(x.dtype) and ord not in (0, float("inf"), float("-inf")):
        # a sum of powers: on x's float32 copy, the norm rounded once to x's dtype (the
        # ops' astype: the namespace's knows no half-width dtype)
        wide = vector_norm(ops.astype(x, float32), axis=axes, keepdims=keep, ord=ord)
        return ops.astype(wide, x.dtype)  # type: ignore[no-any-return]
    mag = abs_(x)
    if ord == float("inf"):
        return _largest(mag, axes, keep)
    if ord == float("-inf"):
        return min_(mag, axis=axes, keepdims=keep)
    if ord == 0:
        return sum_(not_equal(x, 0), axis=axes, keepdims=keep, dtype=mag.dtype)
    if ord == 1:
        return sum_(mag, axis=axes, keepdims=keep)
    p = float(ord)
    total = sum_(pow_(mag, p), axis=axes, keepdims=keep)
    return pow_(total, 1.0 / p)


def matrix_norm(x: GlobalTensor, /, *, keepdims: bool = False,
                ord: Any = "fro") -> GlobalTensor:  # noqa: A002
    """The ``ord``-norm of each matrix: ``"fro"``, ``"nuc"`` (sum of singular values),
    1 / -1 (largest / smallest column sum of magnitudes), ``inf`` / ``-inf`` (row sums),
    2 / -2 (largest / smallest singular value)."""
    _matrices("matrix_norm", x)
    keep = bool(keepdims)
    axes = (x.ndim - 2, x.ndim - 1)
    if isinstance(ord, str):
        if ord == "fro":
            return vector_norm(x, axis=axes, keepdims=keep)
        if ord != "nuc":
            raise ValueError(f"linalg.matrix_norm: ord {ord!r} is not 'fro', 'nuc', 1, -1, "
                             f"2, -2, inf or -inf")
    elif ord not in (1, -1, 2, -2, float("inf"), float("-inf")) or \
            isinstance(ord, (bool, np.bool_)):
        raise ValueError(f"linalg.matrix_norm: ord {ord!r} is not 'fro', 'nuc', 1, -1, 2, "
                         f"-2, inf or -inf")
    if ord in (1, -1, float("inf"), float("-inf")):
        # column sums for +-1, row sums for +-inf; then the largest or the smallest
        summed, other = (-2, -1) if ord in (1, -1) else (-1, -2)
        sums = sum_(abs_(x), axis=summed, keepdims=True)
        largest = ord in (1, float("inf"))
        out = _largest(sums, other, True) if largest else min_(sums, axis=other, keepdims=True)
    else:
        s = svdvals(x)
        out = sum_(s, axis=-1) if ord == "nuc" else \
            _largest(s, -1, False) if ord == 2 else min_(s, axis=-1)
        out = expand_dims(expand_dims(out, axis=-1), axis=-1)
    return out if keep else reshape(out, x.shape[:-2])
