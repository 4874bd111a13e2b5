"""``sm.linalg``'s solvers against NumPy at n = 1..4 (issue 35): ``lstsq`` (NumPy's four
results, through QR), ``cg`` (NumPy's solve within ``rtol``; one all-reduce per dot
product) and ``svd_randomized`` (the same factors at every layout and world size: each
equals one NumPy implementation of the algorithm on the same seeded sketch).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from linalg_cases import LAYOUTS, close, laid_out, like, matrices, tolerance
from linalg_reference import svd_like
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core import random as counter_random

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

SETTINGS = dict(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
SOME = settings(max_examples=25, **SETTINGS)


# -- lstsq ----------------------------------------------------------------------------------

def check_lstsq(value: np.ndarray, rhs: np.ndarray, x: sm.GlobalTensor, b: sm.GlobalTensor,
                rcond) -> None:
    got = sm.linalg.lstsq(x, b, rcond=rcond)
    want = np.linalg.lstsq(value, rhs, rcond=rcond)
    assert got._fields == ("solution", "residuals", "rank", "singular_values")
    close(got.solution, want[0])
    close(got.residuals, want[1])
    assert isinstance(got.rank, int) and got.rank == want[2], (got.rank, want[2])
    close(got.singular_values, want[3])


@pytest.mark.mpi(min_size=1)
@SOME
@given(case=matrices(), k=st.integers(0, 3), rhs_split=st.booleans(),
       rcond=st.sampled_from([None, 1e-3]))
def test_lstsq_equals_numpy(case, k, rhs_split, rcond):
    value, layout = case
    m = value.shape[0]
    rng = np.random.default_rng(m)
    rhs = rng.normal(size=(m, k) if k else (m,)).astype(value.dtype)
    x = laid_out(value, layout)
    assert sm.linalg.path_of("lstsq", x).kind == ("tall" if m > value.shape[1] else "wide")
    check_lstsq(value, rhs, x, like(rhs, x, rhs_split), rcond)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(23, 4), (4, 23)])
def test_lstsq_of_a_rank_deficient_matrix_is_the_minimum_norm_solution(shape):
    rng = np.random.default_rng(11)
    value = rng.normal(size=(shape[0], 2)) @ rng.normal(size=(2, shape[1]))  # rank 2
    rhs = rng.normal(size=(shape[0], 2))
    x = laid_out(value, "rows")
    check_lstsq(value, rhs, x, like(rhs, x, True), None)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["square", "broadcast"])
def test_lstsq_of_square_and_broadcast_matrices_is_numpys(layout):
    rng = np.random.default_rng(12)
    value = rng.normal(size=(6, 6) if layout == "square" else (9, 4))
    rhs = rng.normal(size=value.shape[0])
    pl = sm.placement("cpu", list(range(size)))
    x = sm.tensor(value, placement=pl,
                  sbp=sm.sbp.split(0) if layout == "square" else sm.sbp.broadcast)
    assert sm.linalg.path_of("lstsq", x).kind == ("gathered" if layout == "square" else "local")
    check_lstsq(value, rhs, x, like(rhs, x, True), None)


@pytest.mark.mpi(min_size=1)
def test_lstsq_arguments_are_checked_on_every_rank():
    pl = sm.placement("cpu", list(range(size)))
    a = sm.tensor(np.ones((8, 2)), placement=pl, sbp=sm.sbp.split(0))
    cases = [
        (TypeError, lambda: sm.linalg.lstsq(np.ones((8, 2)), a[:, 0])),
        (ValueError, lambda: sm.linalg.lstsq(a, sm.tensor(np.ones(7), placement=pl,
                                                          sbp=sm.sbp.split(0)))),
        (TypeError, lambda: sm.linalg.lstsq(a, sm.tensor(np.ones(8, dtype=np.int64),
                                                         placement=pl, sbp=sm.sbp.split(0)))),
        (TypeError, lambda: sm.linalg.lstsq(a, a[:, 0], rcond="small")),
        (ValueError, lambda: sm.linalg.lstsq(sm.tensor(np.ones((2, 8, 2)), placement=pl,
                                                       sbp=sm.sbp.split(0)), a[:, 0])),
    ]
    for err, call in cases:
        with pytest.raises(err, match="linalg.lstsq"):
            call()


# -- cg -------------------------------------------------------------------------------------

def spd(n: int, dtype, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(n, n))
    return (m @ m.T / n + np.eye(n)).astype(dtype), rng.normal(size=n).astype(dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("operator", ["matrix", "matvec", "preconditioned", "x0"])
def test_cg_converges_to_numpys_solve_within_rtol(dtype, operator):
    n = 41
    a, rhs = spd(n, dtype)
    pl = sm.placement("cpu", list(range(size)))
    A = sm.tensor(a, placement=pl, sbp=sm.sbp.split(0))
    b = sm.tensor(rhs, placement=pl, sbp=sm.sbp.split(0))
    rtol = 1e-4 if dtype == "float32" else 1e-10
    kw: dict = {}
    op = A
    if operator == "matvec":
        op = lambda v: A @ v  # noqa: E731
    elif operator == "preconditioned":
        kw["M"] = sm.tensor(np.diag(1 / np.diag(a)).astype(dtype), placement=pl,
                            sbp=sm.sbp.split(0))
    elif operator == "x0":
        kw["x0"] = sm.tensor(np.ones(n, dtype=dtype), placement=pl, sbp=sm.sbp.split(0))
    x, info = sm.linalg.cg(op, b, rtol=rtol, **kw)
    assert info == 0
    assert x.shape == (n,) and x.dtype == np.dtype(dtype) and x.sbp == b.sbp
    got = x.numpy()
    want = np.linalg.solve(a.astype(float), rhs.astype(float))

    def check():
        residual = np.linalg.norm(a.astype(float) @ got - rhs) / np.linalg.norm(rhs)
        assert residual <= rtol * 1.01 + (1e-6 if dtype == "float32" else 0), residual
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err <= np.linalg.cond(a.astype(float)) * residual + 1e-6, err

    agree(check)


@pytest.mark.mpi(min_size=2)
def test_cg_makes_one_all_reduce_per_dot_product_and_reports_no_convergence():
    n, steps = 40, 5
    a, rhs = spd(n, np.float64, seed=1)
    pl = sm.placement("cpu", list(range(size)))
    A = sm.tensor(a, placement=pl, sbp=sm.sbp.split(0))
    b = sm.tensor(rhs, placement=pl, sbp=sm.sbp.split(0))
    with sm.trace() as t:
        x, info = sm.linalg.cg(A, b, rtol=1e-14, maxiter=steps)
    assert info == steps
    # ||b||, then r.r and p.Ap at each step, and r.r after the last
    assert t.count("all_reduce") == 1 + 2 * steps + 1, str(t)
    # the same steps by NumPy
    xs, r = np.zeros(n), rhs.copy()
    p = r.copy()
    for _ in range(steps):
        q = a @ p
        alpha = (r @ r) / (p @ q)
        xs, r_new = xs + alpha * p, r - alpha * q
        p = r_new + (r_new @ r_new) / (r @ r) * p
        r = r_new
    close(x, xs)


@pytest.mark.mpi(min_size=1)
def test_cg_arguments_are_checked_on_every_rank():
    pl = sm.placement("cpu", list(range(size)))
    b = sm.tensor(np.ones(6), placement=pl, sbp=sm.sbp.split(0))
    A = sm.tensor(np.eye(6), placement=pl, sbp=sm.sbp.split(0))
    cases = [
        (ValueError, lambda: sm.linalg.cg(sm.tensor(np.eye(5), placement=pl,
                                                    sbp=sm.sbp.split(0)), b)),
        (TypeError, lambda: sm.linalg.cg(np.eye(6), b)),
        (ValueError, lambda: sm.linalg.cg(A, b, rtol=-1.0)),
        (ValueError, lambda: sm.linalg.cg(A, b, maxiter=1.5)),
        (TypeError, lambda: sm.linalg.cg(A, sm.tensor(np.ones(6, dtype=np.int64),
                                                      placement=pl, sbp=sm.sbp.split(0)))),
    ]
    for err, call in cases:
        with pytest.raises(err, match="linalg.cg"):
            call()


# -- svd_randomized ----------------------------------------------------------------------------

def reference_randomized(value: np.ndarray, k: int, oversample: int, n_iter: int, seed: int):
    """The algorithm on the whole matrix in NumPy: the same sketch (the counter-based
    generator), QRs with non-negative diagonals, V^H rows with their largest entry real
    positive; a wide matrix through its conjugate transpose."""
    wide = value.shape[1] > value.shape[0]
    a = value.conj().T if wide else value
    n = a.shape[1]
    width = min(k + oversample, n)
    omega = counter_random.normal(np, (n, width), ((0, n), (0, width)), seed, 0)

    def orth(y):
        q, r = np.linalg.qr(y)
        d = np.diagonal(r)
        return q * np.where(d == 0, 1, d / np.where(d == 0, 1, np.abs(d)))[None, :]

    q = orth(a @ omega.astype(a.dtype))
    for _ in range(n_iter):
        q = orth(a @ orth(a.conj().T @ q))
    u, s, vh = np.linalg.svd(q.conj().T @ a, full_matrices=False)
    top = np.argmax(np.abs(vh), axis=1)
    ph = vh[np.arange(len(top)), top] / np.abs(vh[np.arange(len(top)), top])
    u, vh = u * ph[None, :], np.conj(ph)[:, None] * vh
    u, s, vh = (q @ u)[:, :k], s[:k], vh[:k]
    return (vh.conj().T, s, u.conj().T) if wide else (u, s, vh)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", LAYOUTS + ["broadcast"])
@pytest.mark.parametrize("shape", [(120, 9), (9, 120), (30, 30)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_svd_randomized_gives_the_same_factors_at_every_layout(layout, shape, dtype):
    rng = np.random.default_rng(21)
    # a decaying spectrum: the sketch finds the leading triplets well
    left, _ = np.linalg.qr(rng.normal(size=(shape[0], min(shape))))
    right, _ = np.linalg.qr(rng.normal(size=(shape[1], min(shape))))
    value = ((left * 0.7 ** np.arange(min(shape))) @ right.T).astype(dtype)
    if layout == "broadcast":
        x = sm.tensor(value, placement=sm.placement("cpu", list(range(size))),
                      sbp=sm.sbp.broadcast)
    else:
        x = laid_out(value, layout)
    k = 4
    got = sm.linalg.svd_randomized(x, k, oversample=3, n_iter=2, seed=5)
    u, s, vh = reference_randomized(value.astype(np.float64), k, 3, 2, 5)
    tol = max(tolerance(dtype), 1e-8)
    for g, w in zip(got, (u, s, vh)):
        assert g.dtype == np.dtype(dtype)
        gv = g.numpy()

        def check(gv=gv, w=w):
            np.testing.assert_allclose(gv, w, rtol=tol * 10, atol=tol * 10)

        agree(check)
    # and it is the SVD: the leading singular values and vectors of the matrix
    u0, s0, vh0 = np.linalg.svd(value.astype(np.float64), full_matrices=False)
    u0, vh0 = svd_like(u0[:, :k], vh0[:k], got.Vh.numpy().astype(np.float64))

    def accurate():
        np.testing.assert_allclose(got.S.numpy(), s0[:k], rtol=1e-3)
        np.testing.assert_allclose(got.U.numpy(), u0, atol=1e-2)

    agree(accurate)


@pytest.mark.mpi(min_size=1)
def test_svd_randomized_arguments_are_checked_on_every_rank():
    pl = sm.placement("cpu", list(range(size)))
    a = sm.tensor(np.ones((8, 3)), placement=pl, sbp=sm.sbp.split(0))
    cases = [
        (ValueError, lambda: sm.linalg.svd_randomized(a, 4)),
        (ValueError, lambda: sm.linalg.svd_randomized(a, 0)),
        (ValueError, lambda: sm.linalg.svd_randomized(a, 2, oversample=-1)),
        (ValueError, lambda: sm.linalg.svd_randomized(a, 2, seed=1.5)),
        (TypeError, lambda: sm.linalg.svd_randomized(np.ones((8, 3)), 2)),
    ]
    for err, call in cases:
        with pytest.raises(err, match="linalg.svd_randomized"):
            call()
