"""Partial sums of float16 and bfloat16 reduced with float32 accumulation, at n = 1..4.

The half-width blocks travel in half width (all-to-all, then an all-gather for a
broadcast result) and are summed in float32 with one rounding: the result equals the
float32 sum of the shards rounded once, which an emulated half-width reduction (a
rounding at every addition) misses; the bytes handed to MPI (``sm.trace``) are half
those of the float32 reduction (for P -> S) or of its all-reduce plus one piece (P -> B).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.boxing.cost import DEFAULT_TABLE, Topology, half_width_seconds, primitive_seconds

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
HALVES = [sm.float16, sm.bfloat16]
IDS = ["float16", "bfloat16"]


def _partial(shards_f32, dt, pl):
    """A partial_sum tensor whose rank r holds ``shards_f32[r]`` rounded to ``dt``."""
    v = shards_f32[rank].astype(dt)
    return sm.to_global(v, placement=pl, sbp=sm.sbp.partial_sum), \
        sum(s.astype(dt).astype(np.float32) for s in shards_f32)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
@pytest.mark.parametrize("dst", ["split0", "split1", "broadcast"])
def test_partial_sum_is_the_float32_sum_rounded_once(dt, dst):
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(3)
    # many values near 1 plus small ones: half-width addition in sequence would drop them
    shards = [(1 + rng.random((7, 5)) * 0.01 + (q == 0) * 3).astype(np.float32)
              for q in range(size)]
    x, total = _partial(shards, dt, pl)
    sbp = {"split0": sm.sbp.split(0), "split1": sm.sbp.split(1),
           "broadcast": sm.sbp.broadcast}[dst]
    y = x.to_global(sbp=sbp)
    assert y.dtype == dt
    got = y.numpy()
    want = total.astype(dt)  # the float32 sum, rounded once
    agree(lambda: np.testing.assert_array_equal(got, want))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
@pytest.mark.parametrize("op", ["max", "min"])
def test_partial_max_and_min_of_half_values(dt, op):
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(4)
    vals = [(rng.integers(-64, 64, (6, 3)) / 8).astype(dt) for _ in range(size)]
    x = sm.to_global(vals[rank], placement=pl, sbp=getattr(sm.sbp, f"partial_{op}"))
    got = x.to_global(sbp=sm.sbp.broadcast).numpy()
    want = getattr(np, f"{op}imum").reduce(np.stack(vals), axis=0)
    agree(lambda: np.testing.assert_array_equal(got, want))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_half_width_reduction_hands_mpi_half_the_bytes(dt):
    # the flat plans' bytes: on a job across hosts the planner would choose the
    # hierarchical ones (tests/boxing/test_hierarchical.py counts those), so the table in
    # use here says the ranks share one host
    prev = sm.boxing.set_cost_table(DEFAULT_TABLE.with_topology(Topology((0,) * size)))
    try:
        _count_half_and_float32_bytes(dt)
    finally:
        sm.boxing.set_cost_table(prev)


def _count_half_and_float32_bytes(dt):
    pl = sm.placement("cpu", list(range(size)))
    v = np.ones((512 * size, 64), np.float32)  # large enough for collectives, not p2p
    counted = {}
    for d in (np.float32, dt):
        for dst in (sm.sbp.split(0), sm.sbp.broadcast):
            x = sm.to_global(v.astype(d), placement=pl, sbp=sm.sbp.partial_sum)
            with sm.trace() as t:
                x.to_global(sbp=dst)
            counted[np.dtype(d).name, str(dst)] = t.nbytes()
    n, p = v.size, size  # n is a multiple of p here
    s0, b = str(sm.sbp.split(0)), str(sm.sbp.broadcast)
    half = np.dtype(dt).name
    # float32, P -> S: MPI's reduce-scatter is handed the whole buffer (4n bytes), of which
    # it sends (p-1)/p; P -> B at this size: that reduce-scatter and an all-gather of the
    # piece (the planner's cheapest plan): 4n (1 + 1/p)
    assert counted["float32", s0] == 4 * n
    assert counted["float32", b] == 4 * n + 4 * n // p
    # half width, P -> S: the all-to-all is handed the blocks for the other ranks only,
    # exactly what goes on the wire: half of float32's reduce-scatter
    assert 2 * counted[half, s0] == counted["float32", s0] * (p - 1) // p
    # P -> B: that all-to-all (2n(p-1)/p) and the all-gather of this rank's rounded sums
    # (2n/p handed over, sent to p-1 ranks): 4n(p-1)/p on the wire against the 8n(p-1)/p
    # of float32's reduce-scatter and all-gather; handed to MPI: at most half of float32's
    assert counted[half, b] == 2 * n * (p - 1) // p + 2 * n // p
    assert 2 * counted[half, b] <= counted["float32", b]


def test_the_cost_model_charges_the_half_width_schedule():
    nbytes = 1 << 20
    for p in (2, 4, 8):
        rs = half_width_seconds("reduce_scatter", p, nbytes)
        ar = half_width_seconds("all_reduce", p, nbytes)
        assert rs > primitive_seconds("all_to_all", p, p * nbytes, "cpu", DEFAULT_TABLE)
        assert ar > rs + primitive_seconds("all_gather", p, nbytes, "cpu", DEFAULT_TABLE) * 0.99
    assert half_width_seconds("all_reduce", 1, nbytes) == 0.0


def test_the_planner_costs_two_byte_reductions_with_it():
    from sbpmpi.boxing.planner import axis_change_seconds
    from sbpmpi.core.layout import Layout
    pl = sm.Placement("cpu", list(range(4)), world_size=4)
    src = Layout.make((1024, 256), pl, sm.sbp.partial_sum)
    for to, kind in ((sm.sbp.broadcast, "all_reduce"), (sm.sbp.split(0), "reduce_scatter")):
        half = axis_change_seconds(src, 0, to, 2)
        single = axis_change_seconds(src, 0, to, 4)
        want = half_width_seconds(kind, 4, 1024 * 256 * 2)
        assert half is not None and single is not None
        assert half >= want  # the schedule, plus the step's fixed cost and copies
        assert half != single / 2  # not float32's cost at half the bytes


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
@pytest.mark.parametrize("shape", [(7, 5), (1,), (2 * size + 1, 3)])
def test_the_half_width_all_reduce_step(dt, shape):
    from sbpmpi import comm as smcomm
    from sbpmpi.runtime.half_width import HalfWidthReduction
    rng = np.random.default_rng(6)
    shards = [(1 + rng.random(shape) * 0.01).astype(dt) for _ in range(size)]
    group = smcomm.get_group(list(range(size)))
    red = HalfWidthReduction(np, group, size, rank, "sum")
    with sm.trace() as t:
        got = red.all_reduce(shards[rank])
    want = sum(s.astype(np.float32) for s in shards).astype(dt)
    assert got.dtype == dt and got.shape == shape
    np.testing.assert_array_equal(got, want)
    assert all(r.dtype == np.dtype(dt).name for r in t)  # nothing travels in float32


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dt", HALVES, ids=IDS)
def test_a_widening_cast_keeps_a_half_width_partial_sum_partial(dt):
    """astype(float32) of a half-width partial_sum: each part cast (exact), no message;
    its value is the float32 sum of the parts, without a rounding to half width."""
    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(8)
    shards = [(1 + rng.random((5, 3)) * 0.01).astype(dt) for _ in range(size)]
    x = sm.to_global(shards[rank], placement=pl, sbp=sm.sbp.partial_sum)
    with sm.trace() as t:
        y = x.astype(np.float32)
    assert len(t) == 0 and y.sbp == (sm.sbp.partial_sum,) and y.dtype == np.float32
    want = sum(s.astype(np.float32) for s in shards)
    got = y.numpy()
    agree(lambda: np.testing.assert_allclose(got, want, rtol=1e-6))
