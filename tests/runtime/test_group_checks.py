"""Checks scoped to an op's group (issue 43): a rank outside a placement pays nothing for
the ops on it.

At every size: the ops on a 2-rank placement give NumPy's values on the members; the
ranks outside it make no comm call and no agreement for them (``sm.trace``), take the
dispatch fast path after the first call (no inference, no conversion, no kernel), and
hold empty shards in the members' layouts. A divergence among the members still raises
the same error on every member (a different op, a different conversion, a diverging
local step folded into the group's own running hash), while the ranks outside go on.
Ops on overlapping placements, issued in the same order on every rank, meet in their
own communicators.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core.sbp import broadcast, split
from sbpmpi.errors import CollectiveMismatchError
from sbpmpi.ops import op as op_module
from sbpmpi.runtime import consistency

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
PAIR = [0, 1] if size > 1 else [0]


def pair_tensors() -> tuple[np.ndarray, np.ndarray, sm.GlobalTensor, sm.GlobalTensor]:
    """``x`` (5 x 3, split unevenly over the pair) and ``w`` (3 x 2, broadcast)."""
    a = np.arange(15.0).reshape(5, 3) - 4.0
    b = np.linspace(-1.0, 1.0, 6).reshape(3, 2)
    pl = sm.placement("cpu", PAIR)
    return a, b, sm.tensor(a, placement=pl, sbp=split(0)), sm.tensor(b, placement=pl,
                                                                      sbp=broadcast)


def three_ops(x: sm.GlobalTensor, w: sm.GlobalTensor) -> list[sm.GlobalTensor]:
    """The issue's loop body: a matmul and a sum, a conversion, a product and a mean."""
    return [(x @ w).sum(), x.to_global(sbp=broadcast), (x * 2).mean(dim=0)]


def errors_of(fn) -> list[str]:
    """Every rank's error type and message from ``fn()`` ("" where it raised nothing)."""
    try:
        fn()
        mine = ""
    except CollectiveMismatchError as e:
        mine = f"{type(e).__name__}: {e}"
    return world.allgather(mine)


@pytest.mark.mpi(min_size=1)
def test_ranks_outside_a_placement_make_no_call_and_no_agreement():
    a, b, x, w = pair_tensors()
    outs = three_ops(x, w)  # first calls: inference, plans, communicators made
    with sm.trace() as t:
        for _ in range(20):
            outs = three_ops(x, w)
    member = rank in PAIR
    if not member:
        assert len(t) == 0, t.ops()
        assert len(t.agreements) == 0, [r.op for r in t.agreements]
    elif len(PAIR) > 1 and consistency.check_enabled():
        # the members agree over the pair, never over the world
        assert len(t.agreements) >= 20
        assert {r.group_ranks for r in t.agreements} == {tuple(PAIR)}
        assert {r.group_ranks for r in t.records} == {tuple(PAIR)}
    # the same layouts everywhere, empty shards outside
    for got in outs:
        assert list(got.placement.rank_list) == PAIR
        if not member:
            assert got.to_local().size == 0
    # the values, read by the whole world (a world-wide conversion)
    s, full, m = (o.numpy() for o in outs)
    np.testing.assert_allclose(s, (a @ b).sum())
    np.testing.assert_array_equal(full, a)
    np.testing.assert_allclose(m, (a * 2).mean(axis=0))


@pytest.mark.mpi(min_size=1)
def test_ranks_outside_run_no_inference_conversion_or_kernel(monkeypatch):
    # O(1) Python outside: after the first call every op is a fast-path lookup and the
    # conversion returns before redistribute
    _, _, x, w = pair_tensors()
    three_ops(x, w)
    calls: list[str] = []
    real_run_call = op_module.run_call
    monkeypatch.setattr(op_module, "run_call",
                        lambda *a, **k: calls.append("run_call") or real_run_call(*a, **k))
    import sbpmpi.conversion as conversion
    real_redistribute = conversion.redistribute
    monkeypatch.setattr(conversion, "redistribute",
                        lambda *a, **k: calls.append("redistribute") or real_redistribute(*a, **k))
    for _ in range(5):
        three_ops(x, w)
    if rank not in PAIR:
        assert calls == []
    else:
        assert "redistribute" in calls  # the members convert


@pytest.mark.mpi(min_size=2)
def test_divergence_among_members_raises_the_same_error_on_every_member():
    if not consistency.check_enabled():
        pytest.skip("SBPMPI_CHECK is off")
    _, _, x, w = pair_tensors()
    three_ops(x, w)
    # a different conversion on one member
    sbp = split(1) if rank == 1 else broadcast
    got = errors_of(lambda: x.to_global(sbp=sbp) if rank in PAIR else None)
    assert got[0] and got[0] == got[1], got
    assert "x.to_global" in got[0]
    assert all(e == "" for e in got[2:]), got  # outside: no check, no error
    # a diverging local step, folded into the pair's running hash: the next check of the
    # pair names it on both members
    _ = (x * 2) if rank == 0 else (x * 3)
    got = errors_of(lambda: x.to_global(sbp=broadcast) if rank in PAIR else None)
    assert got[0] and got[0] == got[1], got
    assert "local step" in got[0]
    assert all(e == "" for e in got[2:]), got
    # and the pair goes on after the error
    np.testing.assert_array_equal(three_ops(x, w)[1].numpy(), x.numpy())


@pytest.mark.mpi(min_size=1)
def test_local_steps_outside_a_group_leave_the_world_check_alone():
    # ranks outside the pair fold nothing for the pair's local steps, so the next check of
    # the world (x.numpy()) agrees, and the pair's running hash is its own
    if not consistency.check_enabled():
        pytest.skip("SBPMPI_CHECK is off")
    a, _, x, _ = pair_tensors()
    y = x
    for _ in range(3):
        y = y + 1.0  # local steps on the pair only
    np.testing.assert_array_equal(y.numpy(), a + 3.0)


@pytest.mark.mpi(min_size=3)
def test_ops_on_overlapping_placements_meet_per_communicator():
    # [0, 1] and [1, 2] share rank 1: ops on both, in the same order on every rank, each
    # checked over its own group, and a conversion between them over their union
    a = np.arange(12.0).reshape(4, 3)
    p01, p12 = sm.placement("cpu", [0, 1]), sm.placement("cpu", [1, 2])
    x = sm.tensor(a, placement=p01, sbp=split(0))
    y = sm.tensor(a * 10, placement=p12, sbp=split(1))
    with sm.trace() as t:
        for _ in range(3):
            u = x.to_global(sbp=broadcast)
            v = y.to_global(sbp=split(0))
            z = (x * 2).to_global(placement=p12, sbp=split(0)) + v
    groups = {r.group_ranks for r in t.agreements}
    mine = {g for g in [(0, 1), (1, 2), (0, 1, 2)] if rank in g}
    if consistency.check_enabled():
        assert groups <= mine | ({tuple(range(size))} if size == 3 else set()), groups
    if rank >= 3:
        assert len(t) == 0 and len(t.agreements) == 0
    np.testing.assert_array_equal(u.numpy(), a)
    np.testing.assert_array_equal(z.numpy(), a * 2 + a * 10)
