"""Layout arithmetic against a brute-force reference (np.array_split), no MPI."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import sbpmpi as sm
from sbpmpi.core.layout import Layout, balanced_range, balanced_sizes
from sbpmpi.core.sbp import broadcast, partial_max, partial_sum, split

SHAPES = [(0,), (1,), (5,), (4, 5), (3, 0), (2, 7), (7, 3, 2), (1, 1, 9)]
MESHES = [(1,), (2,), (3,), (4,), (5,), (2, 2), (1, 3), (3, 2), (2, 2, 2)]


def _pl(mesh):
    ranks = np.arange(int(np.prod(mesh))).reshape(mesh)
    return sm.placement("cpu", ranks.tolist(), world_size=ranks.size)


def _sbps(ndim):
    return [broadcast, partial_sum, partial_max] + [split(d) for d in range(ndim)]


def _reference_block(value, mesh, nd_sbp, coord):
    block = value
    for axis, s in enumerate(nd_sbp):
        if s.__class__.__name__ == "Split":
            block = np.array_split(block, mesh[axis], axis=s.dim)[coord[axis]]
    return block


def test_balanced_first_ranks_get_extra():
    assert balanced_sizes(10, 4) == (3, 3, 2, 2)
    assert balanced_sizes(2, 4) == (1, 1, 0, 0)
    assert [balanced_range(10, 4, i) for i in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mesh", MESHES)
def test_every_layout_matches_array_split(shape, mesh):
    pl = _pl(mesh)
    value = np.arange(int(np.prod(shape))).reshape(shape)
    for nd in itertools.product(_sbps(len(shape)), repeat=len(mesh)):
        lay = Layout.make(shape, pl, nd)
        for r in pl.rank_list:
            coord = pl.coord_of(r)
            ref = _reference_block(value, mesh, lay.sbp, coord)
            sl = lay.local_slice(r)
            assert value[sl].shape == lay.local_shape(r) == ref.shape
            np.testing.assert_array_equal(value[sl], ref)


def test_rank_outside_placement_has_empty_shard():
    pl = sm.placement("cpu", [1, 2], world_size=4)
    lay = Layout.make((6, 3), pl, split(0))
    assert lay.local_slice(0) is None
    assert lay.local_shape(0) == (0, 0)
    assert lay.local_shape(3) == (0, 0)
    assert lay.local_shape(1) == (3, 3)


def test_rank_order_is_kept():
    pl = sm.placement("cpu", [1, 0], world_size=2)
    lay = Layout.make((4,), pl, split(0))
    assert lay.local_slice(1) == (slice(0, 2),)
    assert lay.local_slice(0) == (slice(2, 4),)


def test_negative_split_dim_is_normalised():
    pl = _pl((2,))
    assert Layout.make((3, 4), pl, split(-1)).sbp == (split(1),)


def test_identity_op_is_that_of_the_innermost_nonzero_partial_axis():
    pl = _pl((2, 2))
    lay = Layout.make((4,), pl, (partial_sum, split(0)))
    assert [lay.identity_op(r) for r in range(4)] == [None, None, "sum", "sum"]
    lay = Layout.make((4,), pl, (partial_max, partial_sum))
    assert [lay.identity_op(r) for r in range(4)] == [None, "sum", "max", "sum"]


@pytest.mark.parametrize("mesh", MESHES)
def test_axis_groups_against_coordinates(mesh):
    """Placement.axis_groups/axis_group (the one computation of mesh-axis communicators):
    a group over axes a..a+span-1 is the ranks whose coordinates agree elsewhere, in
    row-major order over those axes."""
    pl = sm.placement("cpu", np.arange(int(np.prod(mesh)))[::-1].reshape(mesh).tolist(),
                      world_size=int(np.prod(mesh)))
    nd = len(mesh)
    for axis in range(nd):
        for span in range(1, nd - axis + 1):
            axes = range(axis, axis + span)
            want = {}
            for r in pl.rank_list:
                c = pl.coord_of(r)
                key = tuple(x for i, x in enumerate(c) if i not in axes)
                want.setdefault(key, []).append((tuple(c[i] for i in axes), r))
            groups = pl.axis_groups(axis, span)
            assert sorted(groups) == sorted(tuple(r for _, r in sorted(v))
                                            for v in want.values())
            for g in groups:
                for r in g:
                    assert pl.axis_group(r, axis, span) == g
        assert pl.axis_groups(axis - nd) == pl.axis_groups(axis)
    with pytest.raises(ValueError, match="is not in"):
        pl.axis_group(pl.size, 0)


def test_block_starts():
    from sbpmpi.core.layout import block_starts

    assert block_starts([]) == []
    assert block_starts([3, 0, 2, 5]) == [0, 3, 3, 5]
