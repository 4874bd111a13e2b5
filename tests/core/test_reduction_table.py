"""The one reduction table (sbpmpi.core.reduction) agrees with the layouts and comm."""

from __future__ import annotations

import numpy as np
import pytest

from sbpmpi import comm
from sbpmpi.core.reduction import REDUCTIONS, identity_value, reduction
from sbpmpi.core.sbp import Partial


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_row_matches_partial_and_comm(name):
    r = reduction(name)
    assert r.name == name
    assert str(Partial(name)) == r.display
    assert comm.ReduceOp[r.reduce_op].name == r.reduce_op
    assert r.ufunc_of(np) is getattr(np, r.ufunc)
    assert r.idempotent == (name != "sum")


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.int64, np.float16, np.float32,
                                   np.float64])
def test_identity_is_neutral(name, dtype):
    r = reduction(name)
    e = identity_value(name, dtype)
    assert np.dtype(type(e)) == np.dtype(dtype)
    if np.dtype(dtype).kind == "b":
        xs = np.array([False, True])
    else:
        xs = np.array([0, 1, 5], dtype=dtype)
    if name == "sum" and np.dtype(dtype).kind == "b":
        out = np.logical_or(xs, e)  # boolean partial sum is "or"
    else:
        out = r.ufunc_of(np)(xs, e)
    np.testing.assert_array_equal(out, xs)


def test_unknown_and_unordered():
    with pytest.raises(ValueError, match="not one of 'sum', 'max', 'min'"):
        reduction("prod")
    with pytest.raises(ValueError, match="not one of 'sum', 'max', 'min'"):
        Partial("prod")
    with pytest.raises(TypeError, match="no ordering"):
        identity_value("max", np.complex64)
    assert identity_value("sum", np.complex64) == 0


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduce_and_order_columns(name):
    r = reduction(name)
    a = np.array([[3, -1], [2, 7]])
    assert r.reduce_of(np) is getattr(np, name)
    np.testing.assert_array_equal(r.reduce_of(np)(a, axis=0), r.ufunc_of(np).reduce(a, axis=0))
    assert r.ordered == (name != "sum")
    assert r.defined_for(np.float32) and r.defined_for(np.bool_)
    assert r.defined_for(np.complex64) == (name == "sum")
    if not r.defined_for(np.complex64):
        with pytest.raises(TypeError, match="no ordering"):
            r.identity(np.complex64)
