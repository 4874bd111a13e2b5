"""The ops' dispatch fast path and the generated pointwise signature tables.

A repeated op call with equal argument layouts, dtypes and values runs from the cache
(no build, no inference): every result is compared with NumPy on the whole array, and the
cache's invalidation (a new cost table), its keys (an aliased tensor argument, scalar
values, -0.0) and the consistency check's fold of local steps are exercised.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.boxing import get_cost_table, set_cost_table
from sbpmpi.errors import CollectiveMismatchError
from sbpmpi.ops import dispatch, elementwise
from sbpmpi.ops.signature import PMAX, PMIN, S_D, B, P, Signature
from sbpmpi.runtime import consistency

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
S0 = sm.sbp.split(0)


# ---- the generated tables equal the hand-written ones they replaced ------------------------
LITERAL = {
    "ADD": (
        Signature((S_D, S_D), S_D), Signature((B, B), B), Signature((P, P), P),
        Signature((PMAX, B), PMAX, when="float"), Signature((B, PMAX), PMAX, when="float"),
        Signature((PMIN, B), PMIN, when="float"), Signature((B, PMIN), PMIN, when="float"),
    ),
    "SUB": (
        Signature((S_D, S_D), S_D), Signature((B, B), B), Signature((P, P), P),
        Signature((PMAX, B), PMAX, when="float"), Signature((B, PMAX), PMIN, when="float"),
        Signature((PMIN, B), PMIN, when="float"), Signature((B, PMIN), PMAX, when="float"),
    ),
    "MUL": (Signature((S_D, S_D), S_D), Signature((B, B), B), Signature((P, B), P),
            Signature((B, P), P)),
    "DIV": (Signature((S_D, S_D), S_D), Signature((B, B), B), Signature((P, B), P)),
    "POW": (Signature((S_D, S_D), S_D), Signature((B, B), B)),
    "MAXIMUM": (Signature((S_D, S_D), S_D), Signature((B, B), B),
                Signature((PMAX, PMAX), PMAX), Signature((PMAX, B), PMAX),
                Signature((B, PMAX), PMAX)),
    "MINIMUM": (Signature((S_D, S_D), S_D), Signature((B, B), B),
                Signature((PMIN, PMIN), PMIN), Signature((PMIN, B), PMIN),
                Signature((B, PMIN), PMIN)),
    "COMPARE": (Signature((S_D, S_D), S_D), Signature((B, B), B)),
    "WHERE": (Signature((S_D, S_D, S_D), S_D), Signature((B, B, B), B),
              Signature((B, P, P), P), Signature((B, PMAX, PMAX), PMAX),
              Signature((B, PMIN, PMIN), PMIN)),
    "NEG": (Signature((S_D,), S_D), Signature((B,), B), Signature((P,), P),
            Signature((PMAX,), PMIN, when="float"), Signature((PMIN,), PMAX, when="float")),
    "MONOTONE": (Signature((S_D,), S_D), Signature((B,), B), Signature((PMAX,), PMAX),
                 Signature((PMIN,), PMIN)),
    "UNARY": (Signature((S_D,), S_D), Signature((B,), B)),
}


@pytest.mark.parametrize("name", sorted(LITERAL))
def test_generated_table_equals_literal(name):
    assert getattr(elementwise, name) == LITERAL[name]


def test_ops_use_generated_tables():
    ops = sm.ops
    assert ops.add.table is elementwise.ADD and ops.where.table is elementwise.WHERE
    assert ops.neg.table is elementwise.NEG and ops.relu.table is elementwise.MONOTONE


# ---- the fast path -------------------------------------------------------------------------
def _pair(seed: int, shape=(8, 6), dtype=np.float32):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal(shape).astype(dtype)
    pl = sm.placement("cpu", list(range(size)))
    return a, b, sm.tensor(a, placement=pl, sbp=S0), sm.tensor(b, placement=pl, sbp=S0)


@pytest.mark.mpi(min_size=1)
def test_repeated_calls_hit_and_stay_correct():
    sm.ops.inference.clear_cache()
    for seed in range(3):  # same layouts, new data: the second and third calls hit
        a, b, x, y = _pair(seed)
        k = dispatch.key(sm.ops.add, (x, y), {})
        assert (dispatch.lookup(k) is not None) == (seed > 0)
        np.testing.assert_array_equal((x + y).numpy(), a + b)
        np.testing.assert_allclose((x @ y.T.to_global(sbp=sm.sbp.broadcast)).numpy(), a @ b.T,
                                   rtol=1e-5)
        np.testing.assert_allclose(x.sum(0).numpy(), a.sum(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(sm.relu(x).numpy(), np.maximum(a, 0))
        assert dispatch.lookup(k) is not None


@pytest.mark.mpi(min_size=1)
def test_aliased_argument_keys_apart():
    a, b, x, y = _pair(1)
    for _ in range(2):  # both orders, each twice (the second from the cache)
        np.testing.assert_array_equal((x * y).numpy(), a * b)
        np.testing.assert_array_equal((x * x).numpy(), a * a)
        np.testing.assert_array_equal((y * x).numpy(), b * a)
        np.testing.assert_array_equal(sm.where(x > y, x, x).numpy(), a)
        np.testing.assert_array_equal(sm.where(x > y, x, y).numpy(), np.where(a > b, a, b))


@pytest.mark.mpi(min_size=1)
def test_scalars_key_by_type_and_value():
    a, _, x, _ = _pair(2)
    for _ in range(2):
        for s in (2.0, 3.0, 2, np.float32(2.5), 0.0, -0.0, True):
            got = (x * s).numpy()
            want = a * s
            assert got.dtype == want.dtype, s
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(x.sum(dim=1, keepdim=True).numpy(), a.sum(1, keepdims=True))
        np.testing.assert_array_equal(x.sum(1).numpy(), a.sum(1))


@pytest.mark.mpi(min_size=1)
def test_new_cost_table_empties_the_cache():
    a, b, x, y = _pair(3)
    _ = x + y
    _ = x + y
    assert dispatch.entries() > 0
    t = get_cost_table()
    set_cost_table(dataclasses.replace(t, source="test copy"))  # another object, same values
    try:
        np.testing.assert_array_equal((x - y).numpy(), a - b)  # any op call checks the table
        assert dispatch.lookup(dispatch.key(sm.ops.add, (x, y), {})) is None
        np.testing.assert_array_equal((x + y).numpy(), a + b)
    finally:
        set_cost_table(None)
    np.testing.assert_array_equal((x + y).numpy(), a + b)


@pytest.mark.mpi(min_size=1)
def test_partner_with_inf_is_not_cached():
    # P * B: exact for a finite partner only; its data decides, so never from the cache
    pl = sm.placement("cpu", list(range(size)))
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    xp = sm.tensor(a, placement=pl, sbp=sm.sbp.broadcast).to_global(sbp=sm.sbp.partial_sum)
    for w in (np.ones((3, 4)), np.full((3, 4), np.inf), np.ones((3, 4))):
        wb = sm.tensor(w, placement=pl, sbp=sm.sbp.broadcast)
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal((xp * wb).numpy(), a * w)


@pytest.mark.mpi(min_size=1)
def test_check_off_and_on_at_run_time():
    a, b, x, y = _pair(4)
    with sm.config.override(check=sm.config.check.value):
        for value in (False, True, False):
            sm.config.update(check=value)  # SBPMPI_CHECK=0/1, changed at run time
            for _ in range(2):
                np.testing.assert_array_equal((x + y).numpy(), a + b)


@pytest.mark.mpi(min_size=2)
def test_diverging_cached_steps_are_reported():
    # both ops cached on every rank; then the ranks diverge on a local-only step: the next
    # communicating step reports it on every rank
    _, _, x, y = _pair(5)
    for _ in range(2):
        _ = x + y
        _ = x * y
    assert dispatch.lookup(dispatch.key(sm.ops.mul, (x, y), {})) is not None
    if not consistency.check_enabled():
        pytest.skip("SBPMPI_CHECK is off")
    _ = (x + y) if rank == 0 else (x * y)
    with pytest.raises(CollectiveMismatchError, match="local step"):
        x.numpy()


@pytest.mark.mpi(min_size=1)
def test_autograd_records_cached_calls():
    a, b, x, y = _pair(6, dtype=np.float64)
    _ = x * y  # cached without grad
    for _ in range(2):  # the same key with a tensor that requires grad: recorded
        w = sm.tensor(b, placement=x.placement, sbp=S0).requires_grad_()
        assert dispatch.lookup(dispatch.key(sm.ops.mul, (x, w), {})) is not None
        (x * w).sum().backward()
        assert w.grad is not None
        np.testing.assert_allclose(w.grad.numpy(), a)
