"""Property test: random shapes, meshes, SBPs and placements; boxing keeps the value.

Hypothesis draws the same examples on every rank (derandomized, no database, no
health checks that depend on timing), and every check is made collective, so a
failure on one rank fails all ranks alike and shrinking stays in step.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.boxing.plan import why_meaningless
from sbpmpi.boxing.reference import assemble
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import Partial

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


def _meshes(k: int) -> list[tuple[int, ...]]:
    return [(k,)] + [(a, k // a) for a in range(1, k + 1) if k % a == 0]


@st.composite
def placements(draw: st.DrawFn) -> sm.Placement:
    ranks = draw(st.permutations(list(range(size))))
    k = draw(st.integers(1, size))
    mesh = draw(st.sampled_from(_meshes(k)))
    return sm.placement("cpu", np.array(ranks[:k]).reshape(mesh).tolist())


def sbp_for(draw: st.DrawFn, pl: sm.Placement, ndim: int, op: str) -> tuple:
    one = [sm.sbp.broadcast, Partial(op)] + [sm.sbp.split(d) for d in range(ndim)]
    return tuple(draw(st.sampled_from(one)) for _ in range(pl.ndim))


@st.composite
def conversions(draw: st.DrawFn):
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    op = draw(st.sampled_from(["sum", "max", "min"]))
    p1, p2 = draw(placements()), draw(placements())
    s1, s2 = sbp_for(draw, p1, len(shape), op), sbp_for(draw, p2, len(shape), op)
    dtype = draw(st.sampled_from([np.float64, np.int32]))
    seed = draw(st.integers(0, 2**16))
    return shape, p1, s1, p2, s2, dtype, seed


@pytest.mark.mpi(min_size=1)
@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck), print_blob=False)
@given(case=conversions())
def test_random_conversions_keep_the_value(case):
    shape, p1, s1, p2, s2, dtype, seed = case
    src, dst = Layout.make(shape, p1, s1), Layout.make(shape, p2, s2)
    assume(why_meaningless(src, dst) is None)
    value = np.random.default_rng(seed).integers(-20, 20, size=shape).astype(dtype)
    x = sm.tensor(value, placement=p1, sbp=s1)
    y = x.to_global(placement=p2, sbp=s2)
    errors = []
    got = y.numpy()
    if got.shape != value.shape or not np.array_equal(got, value):
        errors.append(f"numpy() {got.ravel()[:6]} != {value.ravel()[:6]}")
    local = y.to_local()
    if rank in p2:
        if tuple(local.shape) != dst.local_shape(rank):
            errors.append(f"local shape {local.shape} != {dst.local_shape(rank)}")
        elif not dst.partial_axes() and not np.array_equal(local, value[dst.local_slice(rank)]):
            errors.append("to_local differs from the NumPy slice")
    elif local.size != 0:
        errors.append("a rank outside the placement holds data")
    if dst.partial_axes():
        shards = world.allgather(local if rank in p2 else None)
        whole = assemble(np, dst, {r: shards[r] for r in p2.rank_list})
        if not np.array_equal(whole, value):
            errors.append("the shards do not reduce to the value")
    everyone = [f"rank {r}: {e}" for r, errs in enumerate(world.allgather(errors)) for e in errs]
    assert not everyone, f"{src} -> {dst}: " + "; ".join(everyone)
