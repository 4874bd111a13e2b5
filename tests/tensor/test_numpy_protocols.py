"""Python and NumPy protocols of GlobalTensor (scalar conversions, ufuncs, array functions, __array__), at n = 1..4.

Every test computes the same thing with NumPy on the whole array, compares on every
rank, and checks that every rank got the same value or the same error.
"""

from __future__ import annotations

import operator

import numpy as np
import pytest
from conftest import assert_same_on_all_ranks, errors_of, op_placements
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.tensor import GlobalTensor

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def placements():
    return op_placements(size)


def sbps(pl, ndim):
    one = [sm.sbp.broadcast, sm.sbp.split(0), sm.sbp.partial_sum]
    return [(s,) * pl.ndim for s in one if ndim > 0 or not isinstance(s, sm.sbp.Split)]


def layouts(value):
    for pl in placements():
        for sbp in sbps(pl, np.ndim(value)):
            yield sm.tensor(np.asarray(value), placement=pl, sbp=sbp)


def np_outcome(fn, a):
    """What NumPy does: ("value", v) or (error type name,)."""
    try:
        return ("value", fn(a))
    except (TypeError, ValueError) as e:
        return (type(e).__name__,)


def sm_outcome(fn, x):
    try:
        got = ("value", fn(x))
    except (TypeError, ValueError) as e:
        got = (type(e).__name__,)
    assert_same_on_all_ranks(got)
    return got


VALUES = [np.array(0.0), np.array(2.5), np.array(-3), np.array(True), np.array([0.0]),
          np.array([4.0]), np.array([1.0, 2.0, 3.0]), np.zeros((0,)), np.array([[7]])]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("conv", [bool, float, int, complex, operator.index],
                         ids=["bool", "float", "int", "complex", "index"])
def test_scalar_conversions_follow_numpy(conv):
    for a in VALUES:
        want = np_outcome(conv, a)
        for x in layouts(a):
            if isinstance(x.sbp[0], sm.sbp.Partial) and a.dtype == bool:
                continue
            got = sm_outcome(conv, x)
            assert got == want, (conv, a, x, got, want)


@pytest.mark.mpi(min_size=1)
def test_if_on_a_comparison_is_an_error_on_every_rank_not_a_silent_branch():
    a = np.array([1.0, 2.0, 3.0])
    for x in layouts(a):
        kind, msg = errors_of(lambda x=x: bool(x == x + 1))
        assert kind == "ValueError" and "ambiguous" in msg
        kind, msg = errors_of(lambda x=x: bool(sm.tensor(
            np.zeros(0), placement=x.placement, sbp=(sm.sbp.broadcast,) * x.placement.ndim)))
        assert kind == "ValueError" and "empty" in msg
    for x in layouts(np.array([0.0])):
        b = bool(x)  # one element: its value, as NumPy
        assert_same_on_all_ranks(b)
        assert b is bool(np.array([0.0])) is False
    for x in layouts(np.arange(6.0)):
        s = float(x.sum())
        assert_same_on_all_ranks(s)
        assert s == float(np.arange(6.0).sum()) == 15.0
        assert int(x.max()) == 5 and bool(x.max() > 4) is True
        i = sm.tensor(np.array(2), placement=x.placement, sbp=(sm.sbp.broadcast,) * x.placement.ndim)
        assert [1, 2, 3, 4, 5, 6][i] == 3


UNARY = [np.exp, np.log, np.sqrt, np.tanh, np.negative, np.absolute, np.abs]
BINARY = [np.add, np.subtract, np.multiply, np.divide, np.true_divide, np.power, np.maximum,
          np.minimum, np.equal, np.not_equal, np.less, np.less_equal, np.greater,
          np.greater_equal]


@pytest.mark.mpi(min_size=1)
def test_ufuncs_return_global_tensors_equal_to_numpy():
    a = np.linspace(0.5, 3.0, 12).reshape(4, 3)
    b = np.linspace(-1.0, 2.0, 12).reshape(4, 3)
    for pl in placements():
        for sbp in [(sm.sbp.split(0),) * pl.ndim, (sm.sbp.broadcast,) * pl.ndim]:
            x = sm.tensor(a, placement=pl, sbp=sbp)
            y = sm.tensor(b, placement=pl, sbp=sbp)
            for f in UNARY:
                r = f(x)
                assert isinstance(r, GlobalTensor), f
                np.testing.assert_allclose(r.numpy(), f(a), err_msg=f.__name__)
            for f in BINARY:
                for args, ref in (((x, y), (a, b)), ((x, 2.0), (a, 2.0)),
                                  ((np.float64(3.0), y), (3.0, b))):
                    r = f(*args)
                    assert isinstance(r, GlobalTensor), f
                    np.testing.assert_allclose(r.numpy(), f(*ref), err_msg=f.__name__)
            r = np.matmul(x, y.T)
            assert isinstance(r, GlobalTensor)
            np.testing.assert_allclose(r.numpy(), a @ b.T)
            r = np.float64(2.0) * x  # a NumPy scalar on the left: ufunc dispatch
            assert isinstance(r, GlobalTensor)
            np.testing.assert_allclose(r.numpy(), 2 * a)


@pytest.mark.mpi(min_size=1)
def test_ufunc_out_methods_and_unknown_ufuncs_are_refused_on_every_rank():
    pl = placements()[0]
    x = sm.tensor(np.ones((4, 3)), placement=pl, sbp=sm.sbp.split(0))
    kind, msg = errors_of(lambda: np.exp(x, out=np.empty((4, 3))))
    assert kind == "TypeError" and "out=" in msg and "np.exp" in msg and "GlobalTensor" in msg
    kind, msg = errors_of(lambda: np.add.reduce(x))
    assert kind == "TypeError" and "np.add.reduce" in msg and "x.numpy()" in msg
    kind, msg = errors_of(lambda: np.cbrt(x))  # a ufunc no registered op answers
    assert kind == "TypeError" and "np.cbrt" in msg and "x.numpy()" in msg
    kind, msg = errors_of(lambda: np.gcd(x.astype(np.int64), 2))
    assert kind == "TypeError" and "np.gcd" in msg and "x.numpy()" in msg
    kind, msg = errors_of(lambda: np.add(x, 1, dtype=np.float32))
    assert kind == "TypeError" and "dtype" in msg


@pytest.mark.mpi(min_size=1)
def test_array_functions_run_as_sbpmpi_ops():
    a = np.arange(24.0).reshape(4, 6) - 7.5
    for pl in placements():
        for sbp in [(sm.sbp.split(0),) * pl.ndim, (sm.sbp.split(1),) * pl.ndim,
                    (sm.sbp.broadcast,) * pl.ndim]:
            x = sm.tensor(a, placement=pl, sbp=sbp)
            checks = [
                (np.sum(x), np.sum(a)), (np.sum(x, axis=0), np.sum(a, axis=0)),
                (np.sum(x, axis=1, keepdims=True), np.sum(a, axis=1, keepdims=True)),
                (np.mean(x, axis=0), np.mean(a, axis=0)), (np.max(x, axis=1), np.max(a, axis=1)),
                (np.min(x), np.min(a)), (np.amax(x, 0), np.amax(a, 0)),
                (np.transpose(x), np.transpose(a)), (np.reshape(x, (6, 4)), np.reshape(a, (6, 4))),
                (np.concatenate([x, x], axis=1), np.concatenate([a, a], axis=1)),
                (np.where(x > 0, x, 0.0), np.where(a > 0, a, 0.0)),
                (np.exp(np.sum(x, axis=0) / 100), np.exp(np.sum(a, axis=0) / 100)),
            ]
            for got, want in checks:
                assert isinstance(got, GlobalTensor)
                np.testing.assert_allclose(got.numpy(), want)
            assert np.shape(x) == a.shape and np.ndim(x) == 2 and np.size(x) == 24


@pytest.mark.mpi(min_size=1)
def test_other_numpy_functions_name_the_function_and_suggest_numpy():
    pl = placements()[0]
    x = sm.tensor(np.ones((4, 3)), placement=pl, sbp=sm.sbp.split(0))
    for fn, name in ((lambda: np.allclose(x, x), "np.allclose"),
                     (lambda: np.median(x), "np.median"),
                     (lambda: np.sum(x, out=np.empty(())), "np.sum"),
                     (lambda: np.where(x > 0), "np.where")):
        kind, msg = errors_of(fn)
        assert kind == "TypeError" and name in msg and "x.numpy()" in msg, msg


@pytest.mark.mpi(min_size=1)
def test_array_honours_copy():
    a = np.arange(6.0).reshape(2, 3)
    pl = placements()[0]
    x = sm.tensor(a, placement=pl, sbp=sm.sbp.split(0))
    np.testing.assert_array_equal(np.asarray(x), a)
    np.testing.assert_array_equal(np.array(x, dtype=np.float32), a.astype(np.float32))
    np.testing.assert_array_equal(np.array(x, copy=True), a)
    kind, msg = errors_of(lambda: np.asarray(x, copy=False))
    assert kind == "ValueError" and "copy" in msg
