"""Non-blocking collectives: ``sm.comm.all_reduce(..., async_op=True)`` and its
:class:`~sbpmpi.comm.CollectiveWork`, on every array backend, against NumPy.

Inputs are small integers (exact sums), different on every rank, so a missing or doubled
contribution changes the result.
"""

from __future__ import annotations

import numpy as np
import pytest
from comm_helpers import data, reference
from mpi4py import MPI

from sbpmpi import comm as C
from sbpmpi import trace
from sbpmpi.comm import CollectiveWork, ReduceOp
from sbpmpi.comm.collectives import all_done

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG])
def test_started_all_reduce_equals_numpy_on_every_backend(chk, array_backend, op):
    be = array_backend
    for n in (0, 1, 7, 70_000):
        dt = np.float64
        want = reference(np.stack([data(r, n, dt, seed=n) for r in range(size)]), op, size)
        x = be.mk(data(rank, n, dt, seed=n))
        work = C.all_reduce(x, op, async_op=True)
        chk.true(isinstance(work, CollectiveWork), repr(work))
        while not work.test():  # polling drives MPI; wait() after completion is a no-op
            pass
        chk.true(work.wait() and work.is_completed(), repr(work))
        chk.same(be.host(x), want, f"{be} {op.name} n={n}")


@pytest.mark.mpi(min_size=1)
def test_several_started_reductions_complete_in_any_wait_order(chk, array_backend):
    be = array_backend
    xs = [be.mk(data(rank, 5 + i, np.float32, seed=i)) for i in range(3)]
    works = [C.all_reduce(x, async_op=True) for x in xs]
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(xs):
        want = np.stack([data(r, 5 + i, np.float32, seed=i) for r in range(size)]).sum(0)
        chk.same(be.host(x), want.astype(np.float32), f"{be} reduction {i}")


@pytest.mark.mpi(min_size=1)
def test_polling_several_started_reductions_at_once_completes_all(chk, array_backend):
    be = array_backend
    sizes = (0, 3, 70_000, 11)
    xs = [be.mk(data(rank, n, np.float64, seed=i)) for i, n in enumerate(sizes)]
    works = [C.all_reduce(x, async_op=True) for x in xs]
    polls = 1
    while not all_done(works):  # one MPI_Testall per poll drives all of them
        polls += 1
    chk.true(all(w.is_completed() for w in works), repr(works))
    chk.true(all_done(works) and all_done([]), "done stays done; nothing to wait for is done")
    for i, (n, x) in enumerate(zip(sizes, xs)):
        want = np.stack([data(r, n, np.float64, seed=i) for r in range(size)]).sum(0)
        chk.same(be.host(x), want, f"{be} reduction {i} (n={n}) after {polls} polls")


@pytest.mark.mpi(min_size=2)
def test_started_all_reduce_on_a_group(chk):
    members = [0, 1]
    g = C.new_group(members)
    x = np.full(4, float(rank + 1))
    if rank in members:
        C.all_reduce(x, group=g, async_op=True).wait()
        chk.same(x, np.full(4, 3.0))
    else:
        chk.same(x, np.full(4, float(rank + 1)))


@pytest.mark.mpi(min_size=1)
def test_trace_records_the_start_of_a_non_blocking_call(chk):
    x = np.ones(3)
    with trace() as t:
        w = C.all_reduce(x, async_op=True)
        C.all_reduce(np.ones(2))
        w.wait()
    chk.true([(r.op, r.nbytes, r.nonblocking) for r in t] ==
             [("all_reduce", 24, True), ("all_reduce", 16, False)], str(list(t)))
    chk.true(t[0].seq < t[1].seq, "records are numbered in call order")
    chk.true("all_reduce 24 B" in t.timeline() and "(started)" in t.timeline(), t.timeline())


@pytest.mark.mpi(min_size=1)
def test_async_op_must_be_a_bool_on_every_rank(chk):
    from conftest import errors_of

    got = errors_of(lambda: C.all_reduce(np.ones(2), async_op=1))
    chk.true(got == ("TypeError", "all_reduce: async_op must be a bool, got int 1"), str(got))
    got = errors_of(lambda: C.all_reduce(np.ones((2, 2))[:, 0], async_op=True))
    chk.true(got[0] == "ValueError" and "C-contiguous" in got[1], str(got))
