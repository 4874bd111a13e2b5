"""Matmul and a two-layer MLP forward pass in data, tensor (model) and 2-D parallel layouts.

Every value is compared with NumPy on the whole arrays; inferred signatures are checked
against the cost table (boxing.conversion_cost) recomputed here, and the communication
an op runs is read from ``sm.trace()``.
"""

from __future__ import annotations

import numpy as np
import pytest
from cost_oracle import independent_total
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import boxing
from sbpmpi.core.sbp import Partial, broadcast, split

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
S0, S1, B, P = split(0), split(1), broadcast, sm.sbp.partial_sum


def full(device_type):
    return sm.placement(device_type, list(range(size)))


def mesh(device_type):
    return sm.placement(device_type, [[0, 1], [2, 3]])


def randn(*shape, pl, sbp):
    return sm.randn(*shape, placement=pl, sbp=sbp, dtype=np.float64)


def assert_cheapest(inf):
    """The chosen candidate is the cheapest by the cost table (ties: fewer boxings, order)."""
    totals = [independent_total(inf.call, c) for c in inf.candidates]
    best = min(totals)
    tied = [k for k, t in enumerate(totals) if t <= best * (1 + 1e-9) + 1e-15]
    assert inf.chosen == min(tied, key=lambda k: (inf.candidates[k].n_boxed, k)), str(inf)


def boxing_ops(inf, operands):
    """The comm calls of boxing the operands the chosen signature moves, run on their own."""
    with sm.trace() as t:
        for o, need in zip(operands, inf.best.inputs):
            if isinstance(o, sm.GlobalTensor) and need != o.layout:
                boxing.box(o, placement=need.placement, sbp=need.sbp)
    return t.ops()


# ---- data and model parallel: one matmul, no communication ---------------------------------

@pytest.mark.mpi(min_size=1)
def test_data_parallel_matmul(device_type):
    pl = full(device_type)
    x, w = randn(4, 5, pl=pl, sbp=S0), randn(5, 8, pl=pl, sbp=B)
    with sm.trace() as t:
        y = sm.matmul(x, w)
    assert len(t) == 0, str(t)
    assert y.sbp == (S0,) and y.shape == (4, 8) and y.placement == pl
    np.testing.assert_allclose(y.numpy(), x.numpy() @ w.numpy(), rtol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_model_parallel_matmul(device_type):
    pl = full(device_type)
    x, w = randn(4, 5, pl=pl, sbp=B), randn(5, 8, pl=pl, sbp=S1)
    with sm.trace() as t:
        y = x @ w
    assert len(t) == 0, str(t)
    assert y.sbp == (S1,) and y.shape == (4, 8)
    np.testing.assert_allclose(y.numpy(), x.numpy() @ w.numpy(), rtol=1e-12)


# ---- the matmul signatures ------------------------------------------------------------------

MATMUL_SIGNATURES = [((S0, B), S0), ((B, S1), S1), ((S1, S0), P), ((P, B), P), ((B, P), P), ((B, B), B)]


@pytest.mark.mpi(min_size=1)
def test_every_matmul_signature():
    pl = full("cpu")
    rng = np.random.default_rng(8)
    a_val, b_val = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    for (sa, sb), out in MATMUL_SIGNATURES:
        a = sm.tensor(a_val, placement=pl, sbp=sa)
        b = sm.tensor(b_val, placement=pl, sbp=sb)
        inf = sm.explain(sm.matmul, a, b)
        assert [c.signature for c in inf.candidates] == [
            "(S(0), B) -> S(0)", "(B, S(1)) -> S(1)", "(S(1), S(0)) -> P", "(P, B) -> P",
            "(B, P) -> P", "(B, B) -> B"]
        row = next(c for c in inf.candidates if c.output.sbp == (out,)
                   and c.inputs[0].sbp == (sa,) and c.inputs[1].sbp == (sb,))
        assert row.boxing == (0.0, 0.0)
        assert_cheapest(inf)
        if not isinstance(out, Partial):  # no boxing and no pending reduction: free
            assert inf.best is row
        y = sm.matmul(a, b)
        assert y.sbp == inf.best.output.sbp
        np.testing.assert_allclose(y.numpy(), a_val @ b_val, rtol=1e-12, atol=1e-12)


# ---- automatic boxing between two model-parallel layers -------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("n_out", [64, 3])
def test_chained_model_parallel_layers(device_type, n_out):
    pl = full(device_type)
    x = randn(4, 8, pl=pl, sbp=B)
    w0 = randn(8, 8, pl=pl, sbp=S1)
    w1 = randn(8, n_out, pl=pl, sbp=S1)
    with sm.trace() as t0:
        y0 = sm.matmul(x, w0)
    assert y0.sbp == (S1,) and len(t0) == 0, str(t0)
    inf = sm.explain(sm.matmul, y0, w1)
    assert_cheapest(inf)
    best = inf.best
    assert best.output.placement == pl
    expect_ops = boxing_ops(inf, (y0, w1))
    with sm.trace() as t1:
        y1 = sm.matmul(y0, w1)
    assert y1.sbp == best.output.sbp
    assert t1.ops() == expect_ops, f"{t1}\nexpected {expect_ops}\n{inf}"
    if size > 1 and n_out == 64:
        # y0 (4x8) is much smaller than w1 (8x64) and than the (4x64) output: the cheapest
        # plan all-gathers y0, as OneFlow does; no all-reduce runs
        assert best.signature == "(B, S(1)) -> S(1)", str(inf)
        assert any("gather" in op for op in t1.ops()) and t1.count("all_reduce") == 0, str(t1)
    np.testing.assert_allclose(y1.numpy(), x.numpy() @ w0.numpy() @ w1.numpy(), rtol=1e-10)


# ---- 2-D SBP -------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=4)
def test_matmul_on_a_2d_mesh(device_type):
    pl = mesh(device_type)
    x = randn(4, 5, pl=pl, sbp=(S0, B))
    w = randn(5, 6, pl=pl, sbp=(B, S1))
    with sm.trace() as t:
        y = sm.matmul(x, w)
    assert len(t) == 0, str(t)
    assert y.sbp == (S0, S1) and y.shape == (4, 6)
    ref = x.numpy() @ w.numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-12)
    if rank < 4:
        r, c = divmod(rank, 2)
        np.testing.assert_allclose(sm.backend.asnumpy(y.to_local()),
                                   ref[2 * r:2 * r + 2, 3 * c:3 * c + 3], rtol=1e-12)


# ---- two-layer MLP forward --------------------------------------------------------------------

def mlp(x, w1, b1, w2, b2):
    return sm.matmul(sm.relu(sm.matmul(x, w1) + b1), w2) + b2


def mlp_ref(x, w1, b1, w2, b2):
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def run_mlp(pl, sx, sw1, sb1, sw2, sb2):
    sm.manual_seed(11)
    args = [randn(6, 5, pl=pl, sbp=sx), randn(5, 8, pl=pl, sbp=sw1), randn(8, pl=pl, sbp=sb1),
            randn(8, 3, pl=pl, sbp=sw2), randn(3, pl=pl, sbp=sb2)]
    values = [a.numpy() for a in args]
    with sm.trace() as t:
        h = sm.relu(sm.matmul(args[0], args[1]) + args[2])
    y = mlp(*args)
    np.testing.assert_allclose(y.numpy(), mlp_ref(*values), rtol=1e-10, atol=1e-12)
    assert y.shape == (6, 3) and y.placement == pl
    return h, t, y


@pytest.mark.mpi(min_size=1)
def test_mlp_data_parallel(device_type):
    pl = full(device_type)
    h, t, y = run_mlp(pl, S0, B, B, B, B)
    assert h.sbp == (S0,) and y.sbp == (S0,) and len(t) == 0, str(t)
    with sm.trace() as t:  # the whole forward pass communicates nothing
        mlp(*[randn(6, 5, pl=pl, sbp=S0), randn(5, 8, pl=pl, sbp=B), randn(8, pl=pl, sbp=B),
              randn(8, 3, pl=pl, sbp=B), randn(3, pl=pl, sbp=B)])
    assert len(t) == 0, str(t)


@pytest.mark.mpi(min_size=1)
def test_mlp_tensor_parallel(device_type):
    # Megatron style: column-parallel first layer, row-parallel second layer
    pl = full(device_type)
    h, t, y = run_mlp(pl, B, S1, S0, S0, B)
    assert h.sbp == (S1,) and len(t) == 0, str(t)   # the first layer runs without talking


@pytest.mark.mpi(min_size=4)
def test_mlp_2d(device_type):
    pl = mesh(device_type)
    h, t, y = run_mlp(pl, (S0, B), (B, S1), (B, S0), (B, S0), (B, B))
    assert h.sbp == (S0, S1) and len(t) == 0, str(t)
