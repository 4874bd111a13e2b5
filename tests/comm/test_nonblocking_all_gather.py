"""The non-blocking all-gather: ``sm.comm.all_gather(..., async_op=True)`` on every array
backend, and :func:`sbpmpi.runtime.start_redistribute` (a started conversion), against
NumPy and against the blocking calls.

Inputs differ on every rank, so a missing, doubled or misplaced block changes the result.
"""

from __future__ import annotations

import numpy as np
import pytest
from comm_helpers import data
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as C
from sbpmpi.comm import CollectiveWork
from sbpmpi.core.layout import Layout
from sbpmpi.runtime import PendingConversion, redistribute, start_redistribute

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
S, B = sm.sbp.split, sm.sbp.broadcast


@pytest.mark.mpi(min_size=1)
def test_started_all_gather_equals_numpy_on_every_backend(chk, array_backend):
    be = array_backend
    for n in (0, 1, 7, 70_000):
        want = np.stack([data(r, n, np.float64, seed=n) for r in range(size)])
        x = be.mk(data(rank, n, np.float64, seed=n))
        out = be.mk(np.zeros((size, n)))
        work = C.all_gather(out, x, async_op=True)
        chk.true(isinstance(work, CollectiveWork), repr(work))
        while not work.test():  # polling drives MPI
            pass
        chk.true(work.wait(), repr(work))
        chk.same(be.host(out), want, f"{be} n={n}")


@pytest.mark.mpi(min_size=1)
def test_started_all_gather_refuses_a_list_and_a_non_bool_on_every_rank():
    from conftest import errors_of

    assert errors_of(lambda: C.all_gather([np.ones(2)] * size, np.ones(2), async_op=True)) \
        == ("TypeError", "all_gather: async_op=True needs one output array, got a list")
    assert errors_of(lambda: C.all_gather(np.ones(2 * size), np.ones(2), async_op=1)) == (
        "TypeError", "all_gather: async_op must be a bool, got int 1")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("rows", [size, 2 * size + 1])  # equal blocks (started), uneven
def test_started_conversion_equals_the_blocking_one_and_numpy(rows):
    pl = sm.placement("cpu", list(range(size)))
    whole = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * (1 + 1e-3)
    src, dst = Layout((rows, 3), pl, (S(0),)), Layout((rows, 3), pl, (B,))
    local = sm.tensor(whole, placement=pl, sbp=S(0)).to_local()
    with sm.trace() as t:
        pending = start_redistribute(local, src, dst, whole.dtype)
        got = pending.wait()
    assert isinstance(pending, PendingConversion)
    if size > 1:  # equal blocks: one started all-gather; uneven: the blocking program
        assert [r.nonblocking for r in t] == ([True] if rows == size else [False])
    np.testing.assert_array_equal(got, whole)
    np.testing.assert_array_equal(got, redistribute(local, src, dst, whole.dtype))
    assert pending.test()
