"""sm.autocast: which ops run in the low dtype, which in float32, nesting, values against
NumPy, and gradients through it (check_grad, float32 inputs) at n = 1..4."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core.dtypes import eps
from sbpmpi.testing import Input, check_grad

comm = MPI.COMM_WORLD
size = comm.Get_size()
HALVES = [sm.bfloat16, sm.float16]
IDS = ["bfloat16", "float16"]


def _pl():
    return sm.placement("cpu", list(range(size)))


def _x(*shape, sbp=None):
    v = (np.arange(np.prod(shape)).reshape(shape) % 13 - 6) / 8
    return v.astype(np.float32), sm.tensor(v.astype(np.float32), placement=_pl(),
                                           sbp=sbp or sm.sbp.split(0))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_which_ops_run_low_and_which_float32(dt):
    pl = _pl()
    _, x = _x(7, 4)
    lin = sm.nn.Linear(4, 3, placement=pl)
    a3 = sm.tensor(np.ones((2, 5, 4), np.float32), placement=pl, sbp=sm.sbp.split(1))
    b3 = sm.tensor(np.ones((2, 4, 3), np.float32), placement=pl, sbp=sm.sbp.broadcast)
    with sm.autocast(dtype=dt):
        y = lin(x)
        assert y.dtype == dt and lin.weight.dtype == np.float32  # weights stay float32
        assert (x @ lin.weight).dtype == dt
        assert sm.matmul(a3, b3).dtype == dt  # batched
        for z in (sm.softmax(y, 1), sm.log_softmax(y, 1), y.sum(), sm.mean(y, 0),
                  sm.var(y, 1), sm.nn.functional.layer_norm(y),
                  sm.nn.functional.cross_entropy(y, np.array([0, 1, 2, 0, 1, 2, 0]))):
            assert z.dtype == np.float32, z
        assert (y + y).dtype == dt  # others: the dtypes they are given
        with sm.autocast(dtype=dt, enabled=False):
            assert lin(x).dtype == np.float32
            assert (x @ lin.weight).dtype == np.float32
        assert lin(x).dtype == dt  # on again after the nested block
        x64 = x.astype(np.float64)
        assert (x64 @ x64.T).dtype == np.float64  # float64 is never autocast
    # outside: untouched, bfloat16 stays bfloat16
    assert lin(x).dtype == np.float32
    h = x.astype(dt)
    assert (h @ h.T).dtype == dt and sm.softmax(h, 1).dtype == dt


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_linear_under_autocast_equals_numpy(dt):
    pl = _pl()
    xv, x = _x(9, 6)
    lin = sm.nn.Linear(6, 5, placement=pl)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    with sm.autocast(dtype=dt):
        got = lin(x).numpy()
        sm_ = sm.softmax(lin(x), 1).numpy()
    low = (xv.astype(dt).astype(np.float32) @ w.astype(dt).astype(np.float32)).astype(dt)
    want = (low.astype(np.float32) + b.astype(dt).astype(np.float32)).astype(dt)
    e = np.exp(want.astype(np.float32) - want.astype(np.float32).max(1, keepdims=True))
    soft = e / e.sum(1, keepdims=True)

    def check():
        assert got.dtype == dt and sm_.dtype == np.float32
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   rtol=eps(dt), atol=eps(dt))
        np.testing.assert_allclose(sm_, soft, rtol=1e-5, atol=1e-6)

    agree(check)


def _tol(dt):
    return 8 * eps(dt)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_gradients_through_autocast(dt):
    pl = [_pl()]
    tol = _tol(dt)

    def under(f):
        def run(*a):
            with sm.autocast(dtype=dt):
                return f(*a)
        return run

    # matmul: the float32 inputs' gradients through the low-dtype copies
    check_grad(under(lambda a, b: a @ b), np.matmul,
               [Input((5, 3), np.float32), Input((3, 4), np.float32)], placements=pl,
               rtol=tol, atol=tol, name="autocast matmul", max_combos=6)
    # linear with bias then softmax (float32 inside autocast)
    check_grad(under(lambda a, w, b: sm.softmax(a @ w + b.astype(dt), 1)),
               lambda a, w, b: _softmax(a @ w + b, 1),
               [Input((5, 3), np.float32, -1, 1), Input((3, 4), np.float32, -1, 1),
                Input((4,), np.float32, -1, 1)], placements=pl, rtol=tol, atol=tol,
               name="autocast linear+softmax", max_combos=6)
    # layer norm of a low-dtype matmul
    check_grad(under(lambda a, w: sm.nn.functional.layer_norm(a @ w)),
               lambda a, w: _layer_norm(a @ w),
               [Input((5, 3), np.float32, -1, 1), Input((3, 4), np.float32, -1, 1)],
               placements=pl, rtol=4 * tol, atol=4 * tol, name="autocast layer_norm",
               max_combos=6)


def _softmax(z, axis):
    e = np.exp(z - z.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _layer_norm(z, e=1e-5):
    return (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + e)


@pytest.mark.mpi(min_size=1)
def test_backward_inside_the_block_equals_backward_outside():
    pl = _pl()
    _, x = _x(6, 4)
    lin = sm.nn.Linear(4, 3, placement=pl)
    grads = []
    for inside in (False, True):
        lin.zero_grad() if hasattr(lin, "zero_grad") else None
        lin.weight.grad = None
        with sm.autocast():
            loss = sm.softmax(lin(x), 1).sum()
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        grads.append(lin.weight.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])


def test_bad_arguments():
    with pytest.raises(ValueError, match="autocast: dtype must be"):
        sm.autocast(dtype=np.float32)
    with pytest.raises(TypeError, match="enabled must be a bool"):
        sm.autocast(enabled=1)
    assert sm.amp.autocast is sm.autocast
