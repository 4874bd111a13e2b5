"""The cases of the linalg tests: matrices, their layouts, and the comparison with NumPy."""

from __future__ import annotations

import numpy as np
from conftest import agree
from hypothesis import strategies as st
from mpi4py import MPI

import sbpmpi as sm

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()

LAYOUTS = ["rows", "columns", "partial", "rows on ranks 1..", "mesh"]


def tolerance(dtype) -> float:
    return 1e-4 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-9


def close(got, want) -> None:
    """``got`` (a global array) equals NumPy's ``want``: dtype, shape and values."""
    want = np.asarray(want)
    g = got.numpy()

    def check():
        assert g.dtype == want.dtype, f"dtype {g.dtype} != NumPy's {want.dtype}"
        assert g.shape == want.shape, f"shape {g.shape} != NumPy's {want.shape}"
        tol = tolerance(want.dtype)
        np.testing.assert_allclose(g, want, rtol=tol, atol=tol)

    agree(check)


def laid_out(value: np.ndarray, layout: str) -> sm.GlobalTensor:
    """``value`` split by rows or columns over every rank, as partial sums (rank 0 holds
    the value, the others zeros), by rows over every rank but 0, or on a 2 x 2 mesh at 4
    ranks (rows on one axis, columns on the other; rows alone elsewhere)."""
    if layout == "mesh" and size == 4:
        mesh = sm.placement("cpu", [[0, 1], [2, 3]])
        return sm.tensor(value, placement=mesh, sbp=[sm.sbp.split(0), sm.sbp.split(1)])
    if layout == "rows on ranks 1..":
        pl = sm.placement("cpu", list(range(1 if size > 1 else 0, size)))
        return sm.tensor(value, placement=pl, sbp=sm.sbp.split(0))
    pl = sm.placement("cpu", list(range(size)))
    if layout == "partial":
        local = value if rank == 0 else np.zeros_like(value)
        return sm.to_global(local, placement=pl, sbp=sm.sbp.partial_sum)
    return sm.tensor(value, placement=pl, sbp=sm.sbp.split(1 if layout == "columns" else 0))


@st.composite
def matrices(draw, dtypes=("float32", "float64", "complex128")):
    """(value, layout): a tall (M > N) or wide (N > M) matrix, M up to 40 and N up to 6
    (transposed for a wide one)."""
    short = draw(st.integers(1, 6))
    long = draw(st.integers(short + 1, 40))
    dtype = np.dtype(draw(st.sampled_from(list(dtypes))))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    value = rng.normal(size=(long, short))
    if dtype.kind == "c":
        value = value + 1j * rng.normal(size=(long, short))
    if draw(st.booleans()):
        value = value.T
    return np.ascontiguousarray(value).astype(dtype), draw(st.sampled_from(LAYOUTS))


def like(value: np.ndarray, x: sm.GlobalTensor, split: bool) -> sm.GlobalTensor:
    """``value`` on ``x``'s placement, split along dim 0 on its first mesh axis (broadcast
    on the others) or broadcast."""
    pl = x.placement
    first = sm.sbp.split(0) if split else sm.sbp.broadcast
    return sm.tensor(value, placement=pl, sbp=[first] + [sm.sbp.broadcast] * (pl.ndim - 1))
