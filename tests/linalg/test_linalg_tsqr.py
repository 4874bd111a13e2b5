"""QR, SVD, singular values, norms, rank and pseudo-inverse of split non-square matrices
(the tall and wide paths: TSQR), against NumPy, at n = 1..4 (issue 35).

Each case is a tall or wide matrix (uneven splits at 3 and 4 ranks, blocks of no rows
where M < p), float32, float64 or complex128, laid out by rows, by columns (converted to
the long dim), as partial sums, on a placement without rank 0, or on a 2 x 2 mesh. R's
diagonal is real non-negative and each row of V^H has its largest entry real positive, so
NumPy's factors are turned to those phases (``linalg_reference``) before the comparison;
everything else is compared as it is. Q's orthogonality is within 10 eps N, the small
results are equal bit for bit on every rank, and the long dim stays split.
"""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import pytest
from conftest import agree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linalg_cases import close, laid_out, matrices
from linalg_reference import qr_like, svd_like
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import array_api as xp
from sbpmpi.linalg import blocks

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
SOME = settings(max_examples=25, **SETTINGS)

def numpy(fn, *args, **kw):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def same_bits_everywhere(t: sm.GlobalTensor) -> None:
    """Every rank of the placement holds the same bytes of the broadcast tensor ``t``."""
    mine = hashlib.sha256(np.ascontiguousarray(t.to_local()).tobytes()).hexdigest() \
        if rank in t.placement else None
    got = {h for h in world.allgather(mine) if h is not None}
    assert len(got) == 1, f"the ranks hold {len(got)} different values of a broadcast result"


def long_dim_split(t: sm.GlobalTensor, dim: int) -> None:
    assert all(s == sm.sbp.split(dim) for s in t.sbp), t.sbp


# -- the functions against NumPy ---------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@SOME
@given(case=matrices())
def test_qr_equals_numpy_up_to_signs_with_orthonormal_q(case):
    check_qr(case)


def check_qr(case):
    value, layout = case
    x = laid_out(value, layout)
    m, n = value.shape
    assert sm.linalg.path_of("qr", x).kind == ("tall" if m > n else "wide")
    res = xp.linalg.qr(x)
    got_r = res.R.numpy()
    q, r = qr_like(*np.linalg.qr(value), got_r)
    close(res.Q, q)
    close(res.R, r)
    close(xp.linalg.qr(x, mode="r"), r)
    got_q = res.Q.numpy()
    k = min(m, n)
    eps = np.finfo(value.dtype).eps

    def check():
        d = np.diagonal(got_r)
        assert np.all(d.real >= 0) and np.all(d.imag == 0), d
        err = np.linalg.norm(got_q.conj().T @ got_q - np.eye(k), 2)
        assert err <= 10 * eps * k, f"||Q^H Q - I|| = {err} > 10 eps {k}"

    agree(check)
    if m > n:
        long_dim_split(res.Q, 0)
        same_bits_everywhere(res.R)
    else:
        long_dim_split(res.R, 1)
        same_bits_everywhere(res.Q)


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=matrices())
def test_svd_and_svdvals_equal_numpy_up_to_signs(case):
    check_svd(case)


def check_svd(case):
    value, layout = case
    x = laid_out(value, layout)
    m, n = value.shape
    u, s, vh = np.linalg.svd(value, full_matrices=False)
    res = xp.linalg.svd(x, full_matrices=False)
    u, vh = svd_like(u, vh, res.Vh.numpy())
    close(res.U, u)
    close(res.S, s)
    close(res.Vh, vh)
    close(xp.linalg.svdvals(x), s)
    same_bits_everywhere(res.S)
    if m > n:
        long_dim_split(res.U, 0)
        same_bits_everywhere(res.Vh)
    else:
        long_dim_split(res.Vh, 1)
        same_bits_everywhere(res.U)


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=matrices(), ord=st.sampled_from([2, -2, "nuc"]))
def test_matrix_norms_of_the_singular_values_equal_numpy(case, ord):
    value, layout = case
    close(xp.linalg.matrix_norm(laid_out(value, layout), ord=ord),
          np.linalg.matrix_norm(value, ord=ord))


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=matrices(), rank_=st.integers(1, 3), rtol=st.sampled_from([None, 1e-6, 0.3]))
def test_matrix_rank_and_pinv_of_low_rank_matrices_equal_numpy(case, rank_, rtol):
    value, layout = case
    m, n = value.shape
    k = min(rank_, m, n)
    # a product of M x k and k x N: rank k, its other singular values rounding errors
    value = (value[:, :k] @ value[:k, :]).astype(value.dtype)
    x = laid_out(value, layout)
    tol = max(m, n) * np.finfo(value.dtype).eps if rtol is None else rtol
    if rtol is None and value.dtype == np.float32:
        tol = rtol = 1e-4  # float32's rounding errors stand too close to the default
    close(xp.linalg.matrix_rank(x, rtol=rtol), np.asarray(np.linalg.matrix_rank(value, rtol=tol)))
    got = xp.linalg.pinv(x, rtol=rtol)
    close(got, numpy(np.linalg.pinv, value, rcond=tol))
    long_dim_split(got, 1 if m > n else 0)


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=matrices())
def test_without_scipy_qr_and_svd_equal_numpy(case):
    # each block's Q made from NumPy's Householder reflectors (issue 41: two blocks held,
    # not three)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(blocks, "_LAPACK", None)
        check_qr(case)
        check_svd(case)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("lapack", ["scipy", "numpy"])
def test_a_zero_column_gives_q_times_r_equal_to_the_matrix(lapack):
    # a zero column makes a reflector with tau = 0 (the identity); Q and R are not
    # unique there, so the factors are checked by Q R = A and Q^T Q = I
    value = np.random.default_rng(8).normal(size=(203, 6))
    value[:, 2] = 0
    with pytest.MonkeyPatch.context() as mp:
        if lapack == "numpy":
            mp.setattr(blocks, "_LAPACK", None)
        res = xp.linalg.qr(laid_out(value, "rows"))
        s = xp.linalg.svd(laid_out(value, "rows"), full_matrices=False).S.numpy()
    q, r = res.Q.numpy(), res.R.numpy()

    def check():
        np.testing.assert_allclose(q @ r, value, atol=1e-13)
        assert np.linalg.norm(q.T @ q - np.eye(6), 2) <= 60 * np.finfo(float).eps
        np.testing.assert_allclose(s, np.linalg.svd(value, compute_uv=False), atol=1e-13)

    agree(check)


@pytest.mark.mpi(min_size=1)
def test_without_scipy_an_ill_conditioned_matrix_keeps_q_orthonormal():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(blocks, "_LAPACK", None)
        test_an_ill_conditioned_matrix_keeps_q_orthonormal()


# -- layouts, agreement, stability, errors -----------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_a_matrix_with_more_ranks_than_rows_has_empty_blocks():
    value = np.random.default_rng(3).normal(size=(3, 2))  # 3 rows: at 4 ranks one has none
    x = laid_out(value, "rows")
    res = xp.linalg.qr(x)
    q, r = qr_like(*np.linalg.qr(value), res.R.numpy())
    close(res.Q, q)
    close(res.R, r)
    close(xp.linalg.svdvals(x), np.linalg.svd(value, compute_uv=False))


@pytest.mark.mpi(min_size=1)
def test_an_ill_conditioned_matrix_keeps_q_orthonormal():
    # condition number 1e12: CholeskyQR would lose every digit of orthogonality; TSQR
    # (Householder all the way) keeps it at eps
    rng = np.random.default_rng(5)
    m, n = 203, 8
    left, _ = np.linalg.qr(rng.normal(size=(m, n)))
    right, _ = np.linalg.qr(rng.normal(size=(n, n)))
    value = (left * np.logspace(0, -12, n)) @ right.T
    res = xp.linalg.qr(laid_out(value, "rows"))
    q = res.Q.numpy()

    def check():
        assert np.linalg.norm(q.T @ q - np.eye(n), 2) <= 10 * np.finfo(float).eps * n
        np.testing.assert_allclose(q @ res.R.numpy(), value, atol=1e-14)

    agree(check)


@pytest.mark.mpi(min_size=1)
def test_nan_input_raises_linalg_error_on_every_rank():
    value = np.ones((13, 3))
    value[-1, 1] = np.nan  # on the last rank
    x = laid_out(value, "rows")
    with pytest.raises(np.linalg.LinAlgError, match="linalg.svd"):
        xp.linalg.svd(x, full_matrices=False)
    # the next call still works on every rank
    close(xp.linalg.svdvals(laid_out(np.eye(5, 3), "rows")), np.ones(3))


@pytest.mark.mpi(min_size=1)
def test_the_paths_at_each_layout_and_explain():
    tall = np.ones((12, 3))
    pl = sm.placement("cpu", list(range(size)))
    rows = sm.tensor(tall, placement=pl, sbp=sm.sbp.split(0))
    cases = [
        (sm.linalg.path_of("qr", rows), "tall"),
        (sm.linalg.path_of("svd", sm.tensor(tall.T, placement=pl, sbp=sm.sbp.split(0))), "wide"),
        (sm.linalg.path_of("qr", sm.tensor(tall, placement=pl, sbp=sm.sbp.broadcast)), "local"),
        (sm.linalg.path_of("qr", sm.tensor(np.ones((4, 4)), placement=pl, sbp=sm.sbp.split(0))),
         "gathered"),
        (sm.linalg.path_of("inv", sm.tensor(np.ones((4, 4)), placement=pl, sbp=sm.sbp.split(0))),
         "gathered"),
        (sm.linalg.path_of("qr", sm.tensor(np.ones((2, 4, 3)), placement=pl,
                                           sbp=sm.sbp.split(0))), "local"),
        (sm.linalg.path_of("qr", sm.tensor(np.ones((2, 4, 3)), placement=pl,
                                           sbp=sm.sbp.split(1))), "gathered"),
        (sm.linalg.path_of("qr", rows, square_factor=True), "gathered"),
    ]
    for path, kind in cases:
        assert path.kind == kind, str(path)
    shown = sm.explain(xp.linalg.qr, rows)
    assert shown.kind == "tall" and "TSQR" in str(shown)
    assert sm.explain(sm.linalg.lstsq, rows, rows[:, 0]).kind == "tall"
    assert sm.explain(xp.linalg.svd, rows, full_matrices=True).kind == "gathered"


@pytest.mark.mpi(min_size=1)
def test_a_complete_factor_too_large_to_gather_is_refused_on_every_rank():
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(np.ones((4097, 2)), placement=pl, sbp=sm.sbp.split(0))  # Q: 134 MB
    assert sm.linalg.path_of("qr", x, square_factor=True).kind == "refused"
    with pytest.raises(ValueError, match="linalg.qr: mode 'complete'.*mode='reduced'"):
        xp.linalg.qr(x, mode="complete")
    with pytest.raises(ValueError, match="linalg.svd: full_matrices=True"):
        xp.linalg.svd(x)
    with pytest.raises(ValueError, match="linalg.qr: mode 'raw'"):
        xp.linalg.qr(x, mode="raw")


@pytest.mark.mpi(min_size=1)
def test_cuda_placements_factor_on_the_gpu(device_type):
    value = np.random.default_rng(7).normal(size=(29, 4))
    pl = sm.placement(device_type, list(range(size)))
    x = sm.tensor(value, placement=pl, sbp=sm.sbp.split(0))
    res = xp.linalg.qr(x)
    q, r = qr_like(*np.linalg.qr(value), res.R.numpy())
    close(res.Q, q)
    close(res.R, r)
    u, s, vh = np.linalg.svd(value, full_matrices=False)
    got = xp.linalg.svd(x, full_matrices=False)
    u, vh = svd_like(u, vh, got.Vh.numpy())
    close(got.U, u)
    close(got.S, s)
    close(xp.linalg.pinv(x), np.linalg.pinv(value))
    assert sm.backend.device_type_of(res.Q.to_local()) == device_type
