"""Ops refuse bad arguments with the same error on every rank, before any communication,
at n = 1..4: the rows of the bad input matrix (tests/bad_input.py) for ops, and every rank
still in step after the errors.
"""

from __future__ import annotations

import numpy as np
import pytest
from bad_input import Row, check_row
from mpi4py import MPI

import sbpmpi as sm

size = MPI.COMM_WORLD.Get_size()
S0, S1 = sm.sbp.split(0), sm.sbp.split(1)
B = sm.sbp.broadcast


def full():
    return sm.placement("cpu", list(range(size)))


@pytest.mark.mpi(min_size=1)
def test_errors_are_raised_on_every_rank_before_communication():
    pl = full()
    a = sm.randn(4, 5, placement=pl, sbp=S0)
    b = sm.randn(6, 3, placement=pl, sbp=S1)
    with pytest.raises(ValueError, match="contracted dims differ"):
        sm.matmul(a, b)
    with pytest.raises(ValueError, match="sum: dim 3 is out of range for a tensor of 2 dims"):
        a.sum(3)
    with pytest.raises(IndexError, match="out of bounds"):
        a[7]
    with pytest.raises(TypeError, match="sm.tensor"):
        a + np.ones(5)
    # every rank is still in step: a collective right after works
    np.testing.assert_array_equal(a.numpy().shape, (4, 5))


BAD_INPUTS = [
    Row("matmul-shapes",
        lambda c: sm.matmul(c.x, sm.zeros(5, 2, placement=c.pl, sbp=B)), ValueError,
        "matmul: a has shape (4, 6) and b has shape (5, 2)", needs="sbpmpi.ops:matmul"),
    Row("matmul-0d", lambda c: sm.matmul(c.x, sm.zeros((), placement=c.pl, sbp=B)),
        ValueError, "matmul needs at least 1 dim", needs="sbpmpi.ops:matmul"),
    Row("add-broadcast-shapes", lambda c: c.x + sm.zeros(5, placement=c.pl, sbp=B), ValueError,
        "cannot be broadcast together", needs="sbpmpi.ops:add"),
    Row("sum-dim-out-of-range", lambda c: c.x.sum(dim=2), ValueError,
        "dim 2 is out of range for a tensor of 2 dims", needs="sbpmpi.ops:sum"),
    Row("reshape-size", lambda c: c.x.reshape(5, 5), ValueError,
        "cannot reshape a tensor of shape (4, 6)", needs="sbpmpi.ops:reshape"),
    Row("transpose-axes", lambda c: c.x.transpose(0, 0), ValueError, "transpose: axes",
        needs="sbpmpi.ops:transpose"),
    Row("getitem-out-of-bounds", lambda c: c.x[7], IndexError,
        "index 7 is out of bounds for dim 0 of size 4", needs="sbpmpi.ops:getitem"),
    Row("cat-empty", lambda c: sm.cat([], 0), ValueError, "cat: needs at least one tensor",
        needs="sbpmpi.ops:cat"),
    Row("softmax-dim", lambda c: sm.softmax(c.x, 3), ValueError, "out of range",
        needs="sbpmpi.ops:softmax"),
]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("row", BAD_INPUTS, ids=[r.id for r in BAD_INPUTS])
def test_bad_op_input_raises_the_same_error_on_every_rank(bad_input_ctx, row, request):
    check_row(row, bad_input_ctx, request)
