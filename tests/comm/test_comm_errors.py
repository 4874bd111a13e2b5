"""Bad arguments to sbpmpi.comm raise clear errors on every rank, before any communication.

After each error every rank runs a barrier and a checked all_reduce: if any rank had
entered MPI with the bad call, the ranks would be out of step and the test would hang
(ended by the per-test timeout) or fail. In checked mode, ranks that call different
collectives get one error naming what differs.
"""

from __future__ import annotations

import numpy as np
import pytest
from bad_input import Row, check_row, comm_checked
from conftest import errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as C
from sbpmpi import config
from sbpmpi.comm import ReduceOp
from sbpmpi.comm.agreement import checks

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
pytestmark = pytest.mark.timeout(60)



def in_step() -> None:
    """Every rank is at the same call: a barrier and an all_reduce give the right sum."""
    C.barrier()
    x = np.array([rank + 1])
    C.all_reduce(x)
    assert x[0] == size * (size + 1) // 2


def raises(exc, match, fn, *args, **kw):
    with pytest.raises(exc, match=match):
        fn(*args, **kw)
    in_step()


@pytest.mark.mpi(min_size=1)
def test_buffer_errors_same_on_every_rank():
    a = np.zeros(4)
    nc = np.zeros(8)[::2]
    ro = np.zeros(4)
    ro.flags.writeable = False
    # non-contiguous or read-only outputs
    raises(ValueError, "must be C-contiguous", C.all_reduce, nc)
    raises(ValueError, "must be C-contiguous", C.broadcast, nc, src=0)
    raises(ValueError, "must be C-contiguous", C.reduce, nc, dst=0)
    raises(ValueError, "read-only", C.all_reduce, ro)
    raises(ValueError, "must be C-contiguous", C.all_gather, np.zeros((size, 8))[:, ::2], a)
    raises(ValueError, "must be C-contiguous", C.scatter, nc, np.zeros(4 * size), src=0)
    raises(ValueError, r"out_list\[0\] receives data", C.all_gather,
           [np.zeros(8)[::2] for _ in range(size)], a)
    # mismatched sizes
    raises(ValueError, "must have", C.all_gather, np.zeros(4 * size + 1), a)
    raises(ValueError, "arrays, expected one per rank", C.all_gather, [a] * (size + 1), a)
    raises(ValueError, "must have", C.reduce_scatter, np.zeros(2), np.zeros(2 * size + 1))
    if size > 1:
        raises(ValueError, "not divisible", C.all_to_all, np.zeros(size + 1), np.zeros(size + 1))
    raises(ValueError, "entries, expected one per rank", C.all_gather_v, np.zeros(9), a,
           [4] * (size + 1))
    raises(ValueError, "counts", C.all_gather_v, np.zeros(4 * size), a, [3] * size)
    raises(ValueError, "out has", C.all_gather_v, np.zeros(4 * size - 1), a, [4] * size)
    raises(ValueError, "non-negative", C.all_gather_v, np.zeros(9), a, [-1] * size)
    raises(TypeError, "sequence of ints", C.all_gather_v, np.zeros(9), a, "abc")
    raises(ValueError, "sum\\(counts\\)", C.reduce_scatter_v, np.zeros(1), np.zeros(5),
           [1] * size)
    raises(ValueError, "arr has", C.all_to_all_v, np.zeros(size), [1] * size,
           np.zeros(size - 1), [1] * size)
    # wrong dtype pairing, unsupported dtypes and ops
    raises(TypeError, "dtype float32 but arr has dtype float64", C.all_gather,
           np.zeros(4 * size, np.float32), a)
    raises(TypeError, "dtype", C.reduce_scatter, np.zeros(1, np.int32), np.zeros(size))
    raises(TypeError, "Python object", C.broadcast, np.array([None, 1]), src=0)
    raises(TypeError, "NumPy or CuPy array", C.all_reduce, [1.0, 2.0])
    raises(TypeError, "not defined for complex", C.all_reduce, np.zeros(2, complex),
           op=ReduceOp.MAX)
    raises(TypeError, "AVG needs a floating", C.all_reduce, np.zeros(2, np.int64),
           op=ReduceOp.AVG)
    raises(TypeError, "AVG needs a floating", C.all_reduce, np.zeros(2, bool), op=ReduceOp.AVG)
    raises(TypeError, "cannot reduce", C.all_reduce, np.zeros(2, "U2"))
    raises(TypeError, "must be a ReduceOp", C.all_reduce, a, op="sum")


@pytest.mark.mpi(min_size=1)
def test_rank_errors_same_on_every_rank():
    a = np.zeros(3)
    raises(ValueError, f"src={size} is not a rank of the group", C.broadcast, a, src=size)
    raises(ValueError, "dst=-1 is not a rank", C.reduce, a, dst=-1)
    raises(ValueError, "is not a rank", C.gather, a, np.zeros(3 * size), dst=size + 3)
    raises(ValueError, "is not a rank", C.scatter_v, a, a, [3] * size, src=size)
    raises(TypeError, "must be an int world rank", C.broadcast, a, src=1.0)
    raises(TypeError, "must be an int world rank", C.broadcast, a, src=True)
    raises(TypeError, "group must be", C.all_reduce, a, group="world")
    raises(ValueError, "would deadlock", C.send, a, dst=rank)
    raises(ValueError, "would deadlock", C.recv, a, src=rank)
    raises(ValueError, "tag must be", C.isend, a, dst=rank, tag=-1)
    raises(ValueError, "is not a rank", C.isend, a, dst=size)
    raises(ValueError, "required on dst", C.gather, a, None, dst=rank)  # every rank is dst
    raises(ValueError, "required on src", C.scatter, a, None, src=rank)


@pytest.mark.mpi(min_size=2)
def test_non_member_of_group_raises():
    g = C.new_group([0])
    if rank == 0:
        x = np.array([5.0])
        C.all_reduce(x, group=g)
        assert x[0] == 5.0
    else:
        with pytest.raises(ValueError, match="is not a member"):
            C.all_reduce(np.zeros(1), group=g)
    if rank < size - 1:
        with pytest.raises(ValueError, match="is not a rank of the group"):
            C.broadcast(np.zeros(1), src=size - 1, group=C.new_group(list(range(size - 1))))
    in_step()


@pytest.mark.mpi(min_size=2)
def test_recv_size_mismatch_is_reported(chk):
    if rank == 0:
        C.send(np.arange(3.0), dst=1, tag=11)
    elif rank == 1:
        with pytest.raises(ValueError, match="received 3 elements .* buffer of 5"):
            C.recv(np.zeros(5), src=0, tag=11)
    in_step()


@pytest.mark.mpi(min_size=2)
def test_checked_mode_turns_one_rank_errors_into_errors_everywhere():
    with config.override(comm_check=True):
        # only the last rank passes a bad output buffer
        out = np.zeros(3 * size + (1 if rank == size - 1 else 0))
        with pytest.raises(ValueError, match=rf"raised on group rank {size - 1}"):
            C.all_gather(out, np.zeros(3))
        in_step()
        # ranks disagree on the size: nobody enters MPI
        with pytest.raises(ValueError, match="ranks disagree on size"):
            C.all_reduce(np.zeros(2 + rank))
        in_step()
        with pytest.raises(ValueError, match="ranks disagree on dtype"):
            C.broadcast(np.zeros(2, np.float32 if rank else np.float64), src=0)
        in_step()
        with pytest.raises(ValueError, match="ranks disagree on src"):
            C.broadcast(np.zeros(2), src=rank)
        in_step()
        counts = [1 + (rank == 1 and r == 1) for r in range(size)]  # rank 1 thinks 2
        with pytest.raises(ValueError, match="ranks disagree on counts"):
            C.all_gather_v(np.zeros(4 * size), np.zeros(counts[rank]), counts)
        in_step()
        # only dst forgets its output
        with pytest.raises(ValueError, match="required on dst"):
            C.gather(np.zeros(1), None, dst=1)
        in_step()
        # all_to_all_v: rank 0 sends one element more to rank 1 than rank 1 expects
        ic = [1 + (rank == 0 and j == 1) for j in range(size)]
        with pytest.raises(ValueError, match="group rank 0 sends in_counts\\[1\\] = 2"):
            C.all_to_all_v(np.zeros(size), [1] * size, np.zeros(sum(ic)), ic)
        in_step()
        # and a good call still works, and returns the right values
        x = np.arange(3.0) + rank
        C.all_reduce(x)
        assert (x == sum(np.arange(3.0) + r for r in range(size))).all()


# -- checked mode: ranks that call different collectives --------------------------------------

def test_comm_check_message_names_the_differing_fields():
    msg = checks.disagreement((("call", "all_to_all_v"), ("dtype", "<f8"), ("counts", (1, 2))),
                               2, (("call", "all_to_all_v"), ("dtype", "<f8"),
                                   ("counts", (0, 0))))
    assert msg.startswith("all_to_all_v: ranks disagree on counts: ")
    msg = checks.disagreement((("call", "all_to_all_v"), ("dtype", "<f8"), ("counts", (1, 2))),
                               2, (("call", "all_to_all"), ("dtype", "<f8"), ("block", 0)))
    assert "ranks called different collectives" in msg
    assert "group rank 0 called all_to_all_v(dtype=<f8, counts=(1, 2))" in msg
    assert "group rank 2 called all_to_all(dtype=<f8, block=0)" in msg


@pytest.mark.mpi(min_size=2)
def test_ranks_calling_different_collectives_get_one_clear_error_in_checked_mode():
    with sm.config.override(comm_check=True):
        out = np.zeros(size)
        src = np.ones(size)
        if rank == 0:
            fn = lambda: sm.comm.all_to_all_v(out, [1] * size, src, [1] * size)  # noqa: E731
        else:
            fn = lambda: sm.comm.all_to_all(out, src)  # noqa: E731
        kind, msg = errors_of(fn)
        assert kind == "ValueError" and "ranks called different collectives" in msg, msg


# -- bad arguments: the rows of the bad input matrix (bad_input.py) ---------------------------

BAD_INPUTS = [
    Row("comm-broadcast-src", lambda c: sm.comm.broadcast(np.zeros(2), src=size), ValueError,
        f"src={size} is not a rank of the group"),
    Row("comm-broadcast-list", lambda c: sm.comm.broadcast([1.0], src=0), TypeError,
        "arr must be a NumPy or CuPy array, got list"),
    Row("comm-all_reduce-op-str", lambda c: sm.comm.all_reduce(np.zeros(2), op="sum"),
        TypeError, "op must be a ReduceOp"),
    Row("comm-send-out-of-range", lambda c: sm.comm.send(np.zeros(2), dst=size), ValueError,
        f"dst={size} is not a rank of the group", needs="sbpmpi.comm:send"),
    Row("comm-all_reduce-noncontiguous",
        lambda c: sm.comm.all_reduce(np.zeros((4, 4))[:, 0]), ValueError, "C-contiguous"),
    Row("comm-new_group-duplicate", lambda c: sm.comm.new_group([0, 0]), ValueError,
        "group ranks must be distinct"),
    Row("comm-get_group-out-of-range", lambda c: sm.comm.get_group([size]), ValueError,
        f"group ranks [{size}] are out of range for a world of {size}"),
    Row("comm-gather-list-length-checked",
        lambda c: comm_checked(lambda: sm.comm.gather(np.zeros(2), [np.zeros(2)] * (size + 1),
                                                      dst=0)),
        ValueError, f"gather_list has {size + 1} arrays", needs="sbpmpi.comm:gather"),
]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("row", BAD_INPUTS, ids=[r.id for r in BAD_INPUTS])
def test_bad_comm_input_raises_the_same_error_on_every_rank(bad_input_ctx, row, request):
    check_row(row, bad_input_ctx, request)
