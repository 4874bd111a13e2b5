"""The ``linalg`` extension of ``sbpmpi.array_api`` against NumPy, at n = 1..4 (issue 23).

Every test draws its cases with Hypothesis (derandomized, no example database, so every
rank draws the same examples), computes the same thing with ``numpy.linalg`` on the whole
array and compares on every rank. Inputs come in four layouts: split on a stacked (batch)
dim, split on one of the two matrix dims (gathered by the function), and broadcast; the
splits are uneven at 3 and 4 ranks.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import agree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linalg_reference import qr_like, svd_like
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import array_api as xp

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
SOME = settings(max_examples=20, **SETTINGS)

LAYOUTS = ["batch", "rows", "columns", "broadcast"]
#: the layouts of a stack: LAYOUTS, and split on dim 0 of a placement without rank 0
STACK_LAYOUTS = LAYOUTS + ["batch on ranks 1.."]


def close(got, want, exact=False) -> None:
    """``got`` (a global array) equals NumPy's ``want``: dtype, shape and values."""
    want = np.asarray(want)
    g = got.numpy()

    def check():
        assert g.dtype == want.dtype, f"dtype {g.dtype} != NumPy's {want.dtype}"
        assert g.shape == want.shape, f"shape {g.shape} != NumPy's {want.shape}"
        if exact:
            np.testing.assert_array_equal(g, want)
        else:
            single = want.dtype in (np.float32, np.complex64)
            np.testing.assert_allclose(g, want, rtol=1e-4 if single else 1e-9,
                                       atol=1e-4 if single else 1e-9, equal_nan=True)

    agree(check)


def numpy(fn, *args, **kw):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def laid_out(value: np.ndarray, layout: str, placement=None) -> sm.GlobalTensor:
    """``value`` on ``placement`` (default: every rank; "... on ranks 1..": all ranks but
    rank 0 when there are several) split on dim 0 ("batch"; the first matrix dim when
    there is no batch dim), on the last but one dim ("rows"), the last ("columns"), or
    broadcast."""
    kind, _, on = layout.partition(" on ")
    if placement is None:
        placement = sm.placement("cpu", list(range(1 if on and size > 1 else 0, size)))
    dim = {"batch": 0, "rows": value.ndim - 2, "columns": value.ndim - 1}.get(kind)
    sbp = sm.sbp.broadcast if dim is None or value.ndim == 0 else sm.sbp.split(max(dim, 0))
    return sm.tensor(value, placement=placement, sbp=sbp)


@st.composite
def stacks(draw, dtypes=("float32", "float64", "complex128"), square=False, min_side=0,
           kind="any"):
    """(value, layout): a stack of 0..2 batch dims of matrices, the matrices ``kind``
    "any", "spd" (Hermitian positive-definite) or "invertible" (diagonally dominant)."""
    batch = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=2)))
    m = draw(st.integers(min_side, 5))
    n = m if square or kind != "any" else draw(st.integers(min_side, 5))
    dtype = np.dtype(draw(st.sampled_from(list(dtypes))))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    value = rng.normal(size=batch + (m, n))
    if dtype.kind == "c":
        value = value + 1j * rng.normal(size=batch + (m, n))
    if kind == "spd":
        value = value @ np.conj(np.swapaxes(value, -1, -2)) + m * np.eye(m)
    elif kind == "invertible":
        value = value + 3 * m * np.eye(m)
    return value.astype(dtype), draw(st.sampled_from(STACK_LAYOUTS))


# -- the extension is present -----------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_linalg_extension_is_present_with_every_function_of_the_standard():
    names = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
             "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer",
             "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace",
             "vecdot", "vector_norm"]
    assert hasattr(xp, "linalg")
    assert [n for n in names if not callable(getattr(xp.linalg, n, None))] == []
    # the main namespace's linear algebra is the extension's
    for n in ("matmul", "matrix_transpose", "tensordot", "vecdot"):
        assert getattr(xp.linalg, n) is getattr(xp, n)


# -- decompositions and solvers: stacks of matrices ---------------------------------------------

@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(square=True, kind="spd"), upper=st.booleans())
def test_cholesky_lower_and_upper_factors_equal_numpy(case, upper):
    value, layout = case
    low = np.linalg.cholesky(value)
    want = np.conj(np.swapaxes(low, -1, -2)) if upper else low
    close(xp.linalg.cholesky(laid_out(value, layout), upper=upper), want)


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(square=True))
def test_det_and_slogdet_equal_numpy(case):
    value, layout = case
    x = laid_out(value, layout)
    close(xp.linalg.det(x), np.linalg.det(value))
    res = xp.linalg.slogdet(x)
    sign, logabs = np.linalg.slogdet(value)
    assert res._fields == ("sign", "logabsdet")
    close(res.sign, sign)
    close(res.logabsdet, logabs)


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(square=True, kind="spd"))
def test_eigh_and_eigvalsh_equal_numpy(case):
    value, layout = case
    x = laid_out(value, layout)
    w, v = np.linalg.eigh(value)
    res = xp.linalg.eigh(x)
    assert res._fields == ("eigenvalues", "eigenvectors")
    close(res.eigenvalues, w)
    close(res.eigenvectors, v)
    close(xp.linalg.eigvalsh(x), np.linalg.eigvalsh(value))


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(square=True, kind="invertible"), n=st.integers(-3, 4))
def test_inv_and_matrix_power_equal_numpy(case, n):
    value, layout = case
    x = laid_out(value, layout)
    close(xp.linalg.inv(x), np.linalg.inv(value))
    close(xp.linalg.matrix_power(x, n), np.linalg.matrix_power(value, n))


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(), rtol=st.sampled_from([None, 0.1, 0.5, "array"]))
def test_matrix_rank_and_pinv_with_rtol_equal_numpy(case, rtol):
    value, layout = case
    # low-rank matrices so that the tolerance matters
    value = (value @ np.swapaxes(value, -1, -2) @ value).astype(value.dtype)
    x = laid_out(value, layout)
    if rtol == "array":
        tol = np.linspace(0.01, 0.6, num=int(np.prod(value.shape[:-2])))
        tol = tol.reshape(value.shape[:-2])
        arg = laid_out(tol, "batch" if tol.ndim else "broadcast", x.placement)
    else:
        tol = max(value.shape[-2:]) * np.finfo(value.dtype).eps if rtol is None else rtol
        arg = rtol
    close(xp.linalg.matrix_rank(x, rtol=arg), np.linalg.matrix_rank(value, rtol=tol),
          exact=True)
    close(xp.linalg.pinv(x, rtol=arg), np.linalg.pinv(value, rcond=np.asarray(tol)))


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(), mode=st.sampled_from(["reduced", "complete"]))
def test_qr_equals_numpy_in_both_modes(case, mode):
    value, layout = case
    q, r = np.linalg.qr(value, mode=mode)
    x = laid_out(value, layout)
    res = xp.linalg.qr(x, mode=mode)
    assert res._fields == ("Q", "R")
    if sm.linalg.path_of("qr", x, square_factor=mode == "complete").kind in ("tall", "wide"):
        q, r = qr_like(q, r, res.R.numpy())  # TSQR's R: a non-negative diagonal
    close(res.Q, q)
    close(res.R, r)
    if mode == "reduced":  # NumPy's mode "r": R alone
        close(xp.linalg.qr(x, mode="r"), r)


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(), full=st.booleans())
def test_svd_and_svdvals_equal_numpy(case, full):
    value, layout = case
    x = laid_out(value, layout)
    u, s, vh = np.linalg.svd(value, full_matrices=full)
    res = xp.linalg.svd(x, full_matrices=full)
    assert res._fields == ("U", "S", "Vh")
    if sm.linalg.path_of("svd", x, square_factor=full).kind in ("tall", "wide"):
        u, vh = svd_like(u, vh, res.Vh.numpy())  # singular vectors up to phases
    close(res.U, u)
    close(res.S, s)
    close(res.Vh, vh)
    close(xp.linalg.svdvals(x), np.linalg.svd(value, compute_uv=False))


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(dtypes=("float64", "complex128"), square=True, kind="invertible"),
       rhs=st.sampled_from(["vector", "matrices", "broadcast stack"]), k=st.integers(0, 3),
       rhs_layout=st.sampled_from(LAYOUTS))
def test_solve_with_vectors_and_broadcast_stacks_equals_numpy(case, rhs, k, rhs_layout):
    value, layout = case
    m = value.shape[-1]
    rng = np.random.default_rng(m + k)
    if rhs == "vector":
        b = rng.normal(size=(m,))
    elif rhs == "matrices":
        b = rng.normal(size=value.shape[:-2] + (m, k))
    else:  # a stack dim of size 1 in x1 broadcast against one of x2 (and x2 of more dims)
        b = rng.normal(size=(2,) + (1,) * (value.ndim - 2) + (m, k))
    x1 = laid_out(value, layout)
    close(xp.linalg.solve(x1, laid_out(b, rhs_layout, x1.placement)), np.linalg.solve(value, b))


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(dtypes=("int16", "float32", "complex128"), min_side=0),
       offset=st.integers(-6, 6), dtype=st.sampled_from([None, xp.float64]))
def test_diagonal_and_trace_equal_numpy(case, offset, dtype):
    value, layout = case
    x = laid_out(value, layout)
    close(xp.linalg.diagonal(x, offset=offset),
          np.diagonal(value, offset=offset, axis1=-2, axis2=-1), exact=True)
    if dtype is not None and value.dtype.kind == "c":
        return
    want = numpy(np.trace, value, offset=offset, axis1=-2, axis2=-1,
                 dtype=None if dtype is None and value.dtype.kind != "i" else
                 (np.int64 if dtype is None else np.float64))
    close(xp.linalg.trace(x, offset=offset, dtype=dtype), want)


# -- elementwise-like functions: distributed reductions -----------------------------------------

@pytest.mark.mpi(min_size=1)
@SOME
@given(batch1=st.lists(st.integers(1, 4), max_size=2),
       ones=st.lists(st.booleans(), min_size=2, max_size=2),
       axis_last=st.booleans(), dtypes=st.sampled_from([("int32", "int64"),
                                                        ("float32", "float64")]),
       layouts=st.tuples(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS)))
def test_cross_with_broadcasting_equals_numpy(batch1, ones, axis_last, dtypes, layouts):
    rng = np.random.default_rng(len(batch1))
    shape1 = tuple(batch1) + ((3, 2) if not axis_last else (2, 3))
    shape2 = tuple(1 if o and i < len(batch1) else n
                   for i, (n, o) in enumerate(zip(shape1, ones + [False] * 4)))
    a = rng.integers(-9, 9, size=shape1).astype(dtypes[0])
    b = rng.integers(-9, 9, size=shape2).astype(dtypes[1])
    axis = -1 if axis_last else -2
    close(xp.linalg.cross(laid_out(a, layouts[0]), laid_out(b, layouts[1]), axis=axis),
          np.cross(a, b, axis=axis), exact=True)


@pytest.mark.mpi(min_size=1)
@SOME
@given(n=st.integers(0, 6), m=st.integers(0, 6),
       dtypes=st.sampled_from([("int8", "int64"), ("float32", "float64"), ("uint8", "int16")]),
       layouts=st.tuples(st.sampled_from(["split", "broadcast"]),
                         st.sampled_from(["split", "broadcast"])))
def test_outer_equals_numpy(n, m, dtypes, layouts):
    a = np.arange(n).astype(dtypes[0])
    b = (np.arange(m) - 2).astype(dtypes[1])
    x1 = laid_out(a, "batch" if layouts[0] == "split" else "broadcast")
    x2 = laid_out(b, "batch" if layouts[1] == "split" else "broadcast")
    close(xp.linalg.outer(x1, x2), np.outer(a, b), exact=True)


@pytest.mark.mpi(min_size=1)
@SOME
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=3),
       dtype=st.sampled_from(["float32", "float64", "complex128"]),
       ord=st.sampled_from([2, 1, 0, -1, -2, 3, 0.5, -1.5, np.inf, -np.inf]),
       axis_pick=st.integers(0, 6), keepdims=st.booleans(), split=st.integers(0, 2))
def test_vector_norm_equals_numpy(shape, dtype, ord, axis_pick, keepdims, split):
    rng = np.random.default_rng(len(shape))
    value = rng.normal(size=shape).astype(dtype)
    if value.size:
        value[(0,) * len(shape)] = 0  # a zero for ord 0 and the negative orders
    nd = len(shape)
    axis = [None, -1, 0, (0, nd - 1), tuple(range(nd)), nd - 1, None][axis_pick]
    if isinstance(axis, tuple):
        axis = tuple(sorted(set(axis)))
    d = min(split, nd - 1)
    x = sm.tensor(value, placement=sm.placement("cpu", list(range(size))), sbp=sm.sbp.split(d))
    try:
        want = numpy(np.linalg.vector_norm, value, axis=axis, keepdims=keepdims, ord=ord)
    except ValueError:  # the smallest of no magnitudes, as NumPy
        with pytest.raises(ValueError):
            xp.linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=ord)
        return
    close(xp.linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=ord), want)


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=stacks(), keepdims=st.booleans(),
       ord=st.sampled_from(["fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf]))
def test_matrix_norm_equals_numpy(case, keepdims, ord):
    value, layout = case
    x = laid_out(value, layout)
    try:
        want = np.linalg.matrix_norm(value, keepdims=keepdims, ord=ord)
    except ValueError:  # the smallest of no sums or singular values, as NumPy
        with pytest.raises(ValueError):
            xp.linalg.matrix_norm(x, keepdims=keepdims, ord=ord)
        return
    close(xp.linalg.matrix_norm(x, keepdims=keepdims, ord=ord), want)


# -- layouts ------------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_split_stacks_stay_split_and_split_matrices_come_back_whole():
    value = np.random.default_rng(0).normal(size=(5, 3, 3)) + 3 * np.eye(3)
    batch = xp.linalg.inv(laid_out(value, "batch"))
    assert batch.sbp == (sm.sbp.split(0),)
    for layout in ("rows", "columns"):
        out = xp.linalg.inv(laid_out(value, layout))
        assert all(s not in (sm.sbp.split(1), sm.sbp.split(2)) for s in out.sbp), out.sbp
        close(out, np.linalg.inv(value))
    # a split reduced axis sums partial results: still NumPy's values
    x = laid_out(value, "columns")
    close(xp.linalg.matrix_norm(x, ord=1), np.linalg.matrix_norm(value, ord=1))
    close(xp.linalg.trace(x), np.trace(value, axis1=-2, axis2=-1))


# -- errors: the same on every rank, before any communication ----------------------------------

@pytest.mark.mpi(min_size=1)
def test_invalid_arguments_raise_on_every_rank():
    sq = laid_out(np.eye(3), "batch")
    rect = laid_out(np.ones((2, 3)), "batch")
    ints = laid_out(np.eye(3, dtype=np.int64), "batch")
    vec = laid_out(np.ones(3), "batch")
    cases = [
        (TypeError, lambda: xp.linalg.inv(ints)),
        (ValueError, lambda: xp.linalg.det(rect)),
        (ValueError, lambda: xp.linalg.cholesky(vec)),
        (ValueError, lambda: xp.linalg.qr(sq, mode="raw")),
        (ValueError, lambda: xp.linalg.cross(rect, laid_out(np.ones((2, 2)), "batch"))),
        (ValueError, lambda: xp.linalg.solve(sq, laid_out(np.ones(4), "batch"))),
        (ValueError, lambda: xp.linalg.matrix_norm(sq, ord=3)),
        (ValueError, lambda: xp.linalg.outer(sq, vec)),
        (TypeError, lambda: xp.linalg.vector_norm(ints)),
        (TypeError, lambda: xp.linalg.matrix_power(sq, 1.5)),
        (TypeError, lambda: xp.linalg.det(np.eye(3))),
        (ValueError, lambda: xp.linalg.matrix_rank(laid_out(np.ones((2, 3, 3)), "batch"),
                                                   rtol=laid_out(np.ones((4, 2)), "batch"))),
    ]
    for err, call in cases:
        with pytest.raises(err, match="linalg"):
            call()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["batch", "rows", "broadcast", "batch on ranks 1.."])
def test_a_failed_factorization_on_one_rank_raises_on_every_rank(layout):
    # the last matrix of the stack (on the last rank when the stack is split) fails
    eye = np.stack([np.eye(3)] * 4)
    singular = eye.copy()
    singular[-1] = 0
    indefinite = eye.copy()
    indefinite[-1, 0, 0] = -1
    x = laid_out(singular, layout)
    for call, match in [(lambda: xp.linalg.inv(x), "linalg.inv: a matrix is singular"),
                        (lambda: xp.linalg.solve(x, laid_out(np.ones(3), "batch", x.placement)),
                         "linalg.solve: a matrix of x1 is singular"),
                        (lambda: xp.linalg.matrix_power(x, -2), "singular"),
                        (lambda: xp.linalg.cholesky(laid_out(indefinite, layout)),
                         "not positive-definite")]:
        with pytest.raises(np.linalg.LinAlgError, match=match):
            call()
    # the stack without the failing matrix still works, on every rank
    close(xp.linalg.inv(laid_out(singular[:3], layout)), np.linalg.inv(singular[:3]))
