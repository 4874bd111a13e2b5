"""Planning at scale, without MPI: virtual worlds of 1,024 and 16,384 ranks choose the
same steps as 4 ranks, and one rank's point-to-point blocks are its own part of the
whole schedule (computed without listing every rank's blocks)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import sbpmpi as sm
from sbpmpi.boxing.p2p_cost import counted_traffic, modelled_traffic
from sbpmpi.boxing.planner import plan_conversion
from sbpmpi.boxing.schedule import rank_transfers, transfer_schedule
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import Partial, broadcast, partial_sum, split


def line(n):
    return sm.placement("cpu", list(range(n)), world_size=n)


def grid(n):
    rows = 1 << ((n.bit_length() - 1) // 2)
    return sm.placement("cpu", np.arange(n).reshape(rows, n // rows).tolist(), world_size=n)


# name -> (shape for n ranks, mesh, source sbp, destination sbp); blocks of a size whose
# best plan is the same at every n (per-rank bytes alike, so no bandwidth/latency flip)
CONVERSIONS = {
    "S(0)->B": (lambda n: (8 * n, 1024), line, split(0), broadcast),
    "P->S(1)": (lambda n: (2, 256 * n + 3), line, partial_sum, split(1)),
    "S(0)->S(1) uneven": (lambda n: (16 * n + 3, 4096 + 5), line, split(0), split(1)),
    "(S(0), P)->(B, S(1))": (lambda n: (8 * n + 1, 3), grid, (split(0), partial_sum),
                             (broadcast, split(1))),
}


def kinds(name, n):
    shape, mesh, s1, s2 = CONVERSIONS[name]
    pl = mesh(n)
    plan = plan_conversion(Layout.make(shape(n), pl, s1), Layout.make(shape(n), pl, s2), 4)
    return [s.kind for s in plan.steps]


@pytest.mark.parametrize("n", [1024, 16384])
@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_large_worlds_choose_the_steps_of_four_ranks(name, n):
    want = kinds(name, 4)
    assert want and "send_recv" not in want
    assert kinds(name, n) == want


def test_four_rank_choices_are_the_collectives_expected():
    assert kinds("S(0)->B", 4) == ["all_gather"]
    assert kinds("P->S(1)", 4) == ["reduce_scatter"]
    assert kinds("S(0)->S(1) uneven", 4) == ["all_to_all"]
    assert kinds("(S(0), P)->(B, S(1))", 4) == ["reduce_scatter", "all_gather"]


W = 8


def pl(ranks):
    return sm.placement("cpu", ranks, world_size=W)


def sbps(ndim):
    return [broadcast, Partial("sum")] + [split(d) for d in range(ndim)]


@pytest.mark.parametrize("p1,p2", [
    (pl([0, 1, 2]), pl([3, 4])), (pl([[0, 1], [2, 3]]), pl([4, 1, 0])),
    (pl([0, 1]), pl([[1, 0], [2, 3]])), (pl([[0, 1, 2], [3, 4, 5]]), pl([[5, 4], [3, 2], [1, 0]])),
    (pl([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]), pl([[0, 1, 2, 3], [4, 5, 6, 7]])),
], ids=["3->2", "2x2->3", "2->2x2", "2x3->3x2", "2x2x2->2x4"])
def test_one_ranks_transfers_are_its_part_of_the_whole_schedule(p1, p2):
    for shape in [(5, 7), (0, 4), (9,)] if p1.size * p2.size < 36 else [(5, 7)]:
        for s1 in itertools.product(sbps(len(shape)), repeat=p1.ndim):
            for s2 in itertools.product(sbps(len(shape)), repeat=p2.ndim):
                src, dst = Layout.make(shape, p1, s1), Layout.make(shape, p2, s2)
                whole = transfer_schedule(src, dst)
                for r in range(W):
                    want = sorted((t.src, t.dst, t.slot, t.box) for t in whole
                                  if r in (t.src, t.dst))
                    got = sorted((t.src, t.dst, t.slot, t.box)
                                 for t in rank_transfers(src, dst, r))
                    assert got == want, (src, dst, r)


def test_one_rank_of_a_large_world_receives_its_block_once():
    n = 4096
    src = Layout.make((4 * n + 3, 2 * n + 1), line(n), split(0))
    dst = Layout.make((4 * n + 3, 2 * n + 1), line(n), split(1))
    for me in (5, n - 1):
        mine = rank_transfers(src, dst, me)
        assert all(me in (t.src, t.dst) for t in mine)
        box = dst.local_ranges(me)
        cover = np.zeros([b - a for a, b in box], dtype=int)
        for t in mine:
            if t.dst == me:
                cover[tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(t.box, box))] += 1
        assert (cover == 1).all()
        # it sends its rows' share of every column block: one message per other rank
        assert sum(t.src == me and t.dst != me for t in mine) == n - 1


@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("s1,s2,same", [
    (split(0), broadcast, True), (split(0), split(1), True), (broadcast, split(1), True),
    (partial_sum, split(0), True), (partial_sum, broadcast, True), (split(1), split(1), False),
    (broadcast, broadcast, False), (split(0), split(1), False), (partial_sum, split(0), False),
])
def test_closed_form_traffic_is_the_counted_traffic_for_even_splits(n, s1, s2, same):
    a = line(2 * n)
    one = sm.placement("cpu", list(range(n)), world_size=2 * n)
    other = one if same else sm.placement("cpu", list(range(n, 2 * n)), world_size=2 * n)
    src, dst = Layout.make((8 * n, 4 * n), one, s1), Layout.make((8 * n, 4 * n), other, s2)
    assert a.size == 2 * n
    assert modelled_traffic(src, dst, 4) == counted_traffic(src, dst, 4)
