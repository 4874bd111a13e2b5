"""Ops beyond the harness: the harness catches wrong ops, mixed placements, partial inputs,
errors raised identically on every rank, and explain under MPI."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.ops import GlobalOp, OpCall
from sbpmpi.ops.signature import S_D, B, DimMatch, P, Signature
from sbpmpi.testing import Input, check_op

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
S0, S1 = sm.sbp.split(0), sm.sbp.split(1)


def assert_same_on_all_ranks(value):
    vals = comm.allgather(value)
    assert all(v == vals[0] for v in vals), vals


def full():
    return sm.placement("cpu", list(range(size)))


def _unary_op(name, table, kernel):
    """A custom op built the way sbpmpi's own are (a user could do the same)."""
    def build(x):
        dims = {"d": tuple(DimMatch((d,), d) for d in range(x.ndim))}
        return OpCall(name, (x,), table, dims, x.shape, x.dtype,
                      lambda xp, local, shape: kernel(xp, local[0]), labels=("x",))
    return GlobalOp(name, build, table)


@pytest.mark.mpi(min_size=2)
def test_harness_catches_a_wrong_signature():
    # exp is not linear: a table claiming (P,) -> P gives wrong values for partial inputs
    bad = _unary_op("bad_exp", (Signature((P,), P), Signature((S_D,), S_D),
                                Signature((B,), B)), lambda xp, a: xp.exp(a))
    with pytest.raises(AssertionError, match=r"bad_exp: \d+ failure"):
        check_op(bad, np.exp, [Input((3, 4))], placements=[full()], sbps=[[sm.sbp.partial_sum]])
    good = _unary_op("good_exp", (Signature((S_D,), S_D), Signature((B,), B)),
                     lambda xp, a: xp.exp(a))
    report = check_op(good, np.exp, [Input((3, 4))], placements=[full()])
    assert report.cases == 6 and not report.failures


@pytest.mark.mpi(min_size=2)
def test_harness_checks_every_broadcast_copy():
    # numpy() reads one copy of a broadcast tensor; the harness also checks every rank's shard
    me = rank
    bad = _unary_op("bad_copy", (Signature((B,), B),),
                    lambda xp, a: a + (1.0 if me == size - 1 else 0.0))
    with pytest.raises(AssertionError, match=f"rank {size - 1} shard"):
        check_op(bad, lambda a: a, [Input((3, 4))], placements=[full()],
                 sbps=[[sm.sbp.broadcast]])


@pytest.mark.mpi(min_size=2)
def test_operands_on_different_placements():
    rng = np.random.default_rng(2)
    a_val, b_val = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    pls = [full(), sm.placement("cpu", list(range(size))[::-1]), sm.placement("cpu", [size - 1]),
           sm.placement("cpu", list(range(1, size)))]
    for pa in pls:
        for pb in pls:
            a = sm.tensor(a_val, placement=pa, sbp=S0)
            b = sm.tensor(b_val, placement=pb, sbp=sm.sbp.broadcast)
            inf = sm.explain(sm.matmul, a, b)
            y = sm.matmul(a, b)
            assert y.placement in (pa, pb) and y.placement == inf.best.placement
            np.testing.assert_allclose(y.numpy(), a_val @ b_val, rtol=1e-12)
            z = sm.add(a, sm.tensor(a_val, placement=pb, sbp=S1))
            np.testing.assert_allclose(z.numpy(), 2 * a_val, rtol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_partial_inputs_are_never_wrong():
    pl = full()
    rng = np.random.default_rng(3)
    v = rng.standard_normal((4, 6))
    parts = [rng.standard_normal((4, 6)) for _ in range(size)]
    parts[0] = v - sum(parts[1:])
    x = sm.to_global(parts[rank], placement=pl, sbp=sm.sbp.partial_sum)
    with sm.trace() as t:
        y = x * 2.0                    # linear: stays partial, nothing moves
    assert y.sbp == (sm.sbp.partial_sum,) and len(t) == 0, str(t)
    np.testing.assert_allclose(y.numpy(), 2 * v, rtol=1e-12)
    for f, ref in [(lambda a: a + 1.0, lambda a: a + 1.0), (sm.exp, np.exp),
                   (sm.relu, lambda a: np.maximum(a, 0)),
                   (lambda a: a.softmax(0), lambda a: np.exp(a) / np.exp(a).sum(0))]:
        out = f(x)                     # not linear: the partial input is boxed first
        assert sm.sbp.partial_sum not in out.sbp
        np.testing.assert_allclose(out.numpy(), ref(v), rtol=1e-12)
    # x * x is linear in one factor: (x1 + x2) * x may stay partial
    np.testing.assert_allclose((x * x).numpy(), v * v, rtol=1e-12)
    s = (x * 3.0).sum()                # a sum of a partial sum: one small reduction at the end
    np.testing.assert_allclose(s.item(), 3 * v.sum(), rtol=1e-12)


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


@pytest.mark.mpi(min_size=1)
def test_explain_is_the_same_on_every_rank():
    pl = full()
    y0 = sm.randn(4, 8, placement=pl, sbp=S1)
    w1 = sm.randn(8, 6, placement=pl, sbp=S1)
    text = str(sm.explain(sm.matmul, y0, w1))
    assert_same_on_all_ranks(text)
    assert text.count("\n*") == 1
    assert_same_on_all_ranks(str(sm.explain(y0, sbp=sm.sbp.broadcast)))


@pytest.mark.mpi(min_size=1)
def test_chained_ops_on_uneven_layouts():
    # 5 rows over 2..4 ranks are uneven; slices of a split dim box correctly
    pl = full()
    rng = np.random.default_rng(4)
    v = rng.standard_normal((5, 7))
    x = sm.tensor(v, placement=pl, sbp=S0)
    got = ((x[1:4] * 2.0 - x[0:3]).T @ x[::2, :]).sum(1, keepdim=True).softmax(0)
    e = ((v[1:4] * 2.0 - v[0:3]).T @ v[::2, :]).sum(1, keepdims=True)
    ref = np.exp(e - e.max(0)) / np.exp(e - e.max(0)).sum(0)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10)
