"""The halo plan (pure): every rank's padded shard, assembled by running every rank's plan
of one placement in one process (each receive matched, in order, with the peer's send),
equals the window of ``np.pad`` of the whole array; each rank talks to neighbours only.

Meshes up to 8 ranks (1-D, 2-D, a dim split by two mesh axes, broadcast axes), uneven and
empty blocks, every boundary, depths 0 to 5 (larger than a neighbour's block).
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque

import numpy as np
import pytest

import sbpmpi as sm
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import Broadcast, Partial, Split
from sbpmpi.runtime.halo import _source, check_layout, halo_plan

MODES = {"periodic": "wrap", "reflect": "symmetric", "nearest": "edge", "constant": "constant"}


def padded_whole(whole, depth, boundary, value):
    """np.pad of the whole array per axis ('none': no padding)."""
    out = whole
    for d, (dd, b) in enumerate(zip(depth, boundary)):
        if b == "none" or dd == 0:
            continue
        width = [(0, 0)] * whole.ndim
        width[d] = (dd, dd)
        kw = {"constant_values": value} if b == "constant" else {}
        out = np.pad(out, width, mode=MODES[b], **kw)
    return out


def expected_window(whole, layout, rank, depth, boundary, value):
    """This rank's padded shard, cut from np.pad of the whole array."""
    full = padded_whole(whole, depth, boundary, value)
    key = []
    for (a, b), n, dd, bd in zip(layout.local_ranges(rank), whole.shape, depth, boundary):
        if bd == "none":
            key.append(slice(max(a - dd, 0), min(b + dd, n)))
        else:
            key.append(slice(a, b + 2 * dd))  # shifted by the padding
    return full[tuple(key)]


def simulate(whole, layout, depth, boundary, value):
    """Every member's padded shard, by running every rank's plan in this process."""
    depth, boundary = tuple(depth), tuple(boundary)
    ranks = layout.placement.rank_list
    plans = {r: halo_plan(layout, depth, boundary, r) for r in ranks}
    local = {r: whole[layout.local_slice(r)] for r in ranks}
    sent = defaultdict(deque)  # (src, dst) -> messages in posting order
    for r in ranks:
        for p in plans[r].sends:
            sent[r, p.peer].append(take(local[r], p.src))
    out = {}
    for r in ranks:
        plan = plans[r]
        padded = np.full(plan.padded_shape, value if plan.fill else -999, whole.dtype)
        for p in plan.local:
            padded[p.dst] = take(local[r], p.src)
        for p in plan.recvs:
            msg = sent[p.peer, r].popleft()
            assert msg.shape == padded[p.dst].shape, (r, p)
            padded[p.dst] = msg
        out[r] = padded
    assert all(not q for q in sent.values()), "messages sent but never received"
    return plans, out


def take(a, src):
    out = a[tuple(s if isinstance(s, slice) else slice(None) for s in src)]
    for d, s in enumerate(src):
        if not isinstance(s, slice):
            out = np.take(out, np.asarray(s), axis=d)
    return out


CASES = [  # (shape, mesh, sbp)
    ((10,), (1,), [Split(0)]),
    ((10,), (4,), [Split(0)]),
    ((3,), (5,), [Split(0)]),  # empty blocks
    ((7,), (8,), [Split(0)]),
    ((9, 5), (3,), [Split(1)]),
    ((9, 5), (3,), [Split(0)]),
    ((9, 5), (2, 3), [Split(0), Split(1)]),
    ((5, 7), (2, 2), [Split(1), Split(0)]),
    ((2, 3), (2, 4), [Split(0), Split(1)]),  # empty blocks on both dims
    ((11, 4), (2, 3), [Split(0), Split(0)]),  # one dim cut by two mesh axes
    ((6, 5), (2, 2), [Broadcast(), Split(1)]),  # a broadcast mesh axis: two exchanges
    ((4, 3, 5), (2, 2, 2), [Split(2), Split(0), Split(1)]),
]
BOUNDARIES = ["none", "periodic", "reflect", "nearest", "constant"]


@pytest.mark.parametrize("shape,mesh,sbp", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("depth", [1, 3])
def test_padded_shards_equal_np_pad_windows(shape, mesh, sbp, boundary, depth):
    size = int(np.prod(mesh))
    placement = sm.placement("cpu", np.arange(size).reshape(mesh), world_size=8)
    layout = Layout.make(shape, placement, sbp)
    whole = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1
    d, b = (depth,) * len(shape), (boundary,) * len(shape)
    _, got = simulate(whole, layout, d, b, -7.0)
    for r, padded in got.items():
        np.testing.assert_array_equal(padded, expected_window(whole, layout, r, d, b, -7.0),
                                      err_msg=f"rank {r}")


@pytest.mark.parametrize("depth,boundary", [((2, 0), ("periodic", "reflect")),
                                            ((0, 4), ("none", "nearest")),
                                            ((5, 1), ("reflect", "constant")),
                                            ((1, 6), ("constant", "periodic"))])
def test_depth_and_boundary_per_axis(depth, boundary):
    placement = sm.placement("cpu", np.arange(6).reshape(2, 3), world_size=8)
    layout = Layout.make((7, 4), placement, [Split(0), Split(1)])
    whole = np.random.default_rng(1).standard_normal((7, 4))
    _, got = simulate(whole, layout, depth, boundary, 0.5)
    for r, padded in got.items():
        np.testing.assert_array_equal(padded, expected_window(whole, layout, r, depth, boundary,
                                                              0.5), err_msg=f"rank {r}")


def test_a_rank_talks_to_its_neighbours_only():
    # 64 ranks on an 8x8 mesh, depth 1, periodic: 8 peers (4 sides, 4 corners) each
    placement = sm.placement("cpu", np.arange(64).reshape(8, 8), world_size=64)
    layout = Layout.make((80, 80), placement, [Split(0), Split(1)])
    plan = halo_plan(layout, (1, 1), ("periodic", "periodic"), 27)
    assert len({p.peer for p in plan.recvs}) == 8 and len(plan.recvs) == 8
    assert len({p.peer for p in plan.sends}) == 8 and len(plan.sends) == 8
    # a 1-D split of 1,000 ranks: two neighbours, whatever the world
    placement = sm.placement("cpu", list(range(1000)), world_size=1000)
    plan = halo_plan(Layout.make((10_000,), placement, [Split(0)]), (2,), ("none",), 500)
    assert sorted(p.peer for p in plan.recvs) == [499, 501]


@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("boundary", ["periodic", "reflect", "nearest"])
def test_source_index_is_np_pad_far_beyond_the_edge(n, boundary):
    depth = 3 * n + 2
    idx = np.pad(np.arange(n), depth, mode=MODES[boundary])
    assert [_source(p, n, boundary) for p in range(-depth, n + depth)] == idx.tolist()


def test_partial_and_empty_wrapped_axes_are_refused():
    placement = sm.placement("cpu", [0, 1], world_size=8)
    with pytest.raises(ValueError, match="partial"):
        check_layout(Layout.make((4,), placement, [Partial("sum")]), (1,), ("none",), "halo")
    with pytest.raises(ValueError, match="length 0"):
        check_layout(Layout.make((0,), placement, [Split(0)]), (1,), ("periodic",), "halo")
    check_layout(Layout.make((0,), placement, [Split(0)]), (1,), ("constant",), "halo")


def test_every_mesh_of_up_to_four_ranks():
    # the layouts the MPI test runs, checked here for every rank at once
    for mesh in [(1,), (2,), (3,), (4,), (1, 2), (2, 1), (2, 2), (1, 3), (3, 1)]:
        size = int(np.prod(mesh))
        placement = sm.placement("cpu", np.arange(size).reshape(mesh), world_size=size)
        sbps = [[Split(0), Split(1)], [Split(1), Split(0)]] if len(mesh) == 2 else \
            [[Split(0)], [Split(1)]]
        for sbp, b, depth in itertools.product(sbps, BOUNDARIES, [1, 3]):
            layout = Layout.make((5, 2), placement, sbp)
            whole = np.arange(10.0).reshape(5, 2)
            _, got = simulate(whole, layout, (depth, depth), (b, b), 9.0)
            for r, padded in got.items():
                np.testing.assert_array_equal(
                    padded, expected_window(whole, layout, r, (depth,) * 2, (b,) * 2, 9.0))
