"""The pieces of the planner's search, each alone (no MPI, no arrays).

The cost of a per-axis step (``axis_traffic``), the SBPs searched on each side
(``searched_dims``, ``axis_values``, ``side_values``), the moves between placements
(``cross_steps``), the graph of a conversion (``ConversionGraph``) and the search on any
graph (:mod:`sbpmpi.boxing.search`: ``distances_to``, ``edge_rank``, ``cheapest_path``,
``ranked_plans``), checked against brute force on small graphs.
"""

from __future__ import annotations

import itertools
import math

import pytest

import sbpmpi as sm
from sbpmpi.boxing.cost import DEFAULT_TABLE, factor
from sbpmpi.boxing.plan import CROSS_KINDS, Step
from sbpmpi.boxing.planner import (
    AxisTraffic,
    ConversionGraph,
    axis_traffic,
    axis_values,
    candidate_plans,
    cross_steps,
    searched_dims,
    side_values,
)
from sbpmpi.boxing.search import (
    Edge,
    InEdge,
    Node,
    cheapest_path,
    distances_to,
    edge_rank,
    ranked_plans,
)
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import Broadcast, Partial, Split, broadcast, partial_max, partial_sum, split

W = 8


def pl(ranks):
    return sm.placement("cpu", ranks, world_size=W)


# -- the cost of one per-axis step --------------------------------------------------------------

def test_axis_traffic_counts_the_bytes_of_each_kind():
    f4 = 4
    # all_gather of 8 rows of 3 over 4 ranks: 24 floats out, (p-1)/p of them arrive
    t = axis_traffic("all_gather", Split(0), Broadcast(), 4, (2, 3), (8, 3), f4)
    assert t == AxisTraffic(moved=factor("all_gather", 4) * 96, copy=0, payload=96, op=None)
    # along dim 1 the gathered blocks are unpacked: one copy of the output
    assert axis_traffic("all_gather", Split(1), Broadcast(), 4, (8, 1), (8, 3), f4).copy == 96
    t = axis_traffic("all_reduce", Partial("max"), Broadcast(), 2, (5,), (5,), f4)
    assert t == AxisTraffic(moved=factor("all_reduce", 2) * 20, copy=20, payload=20, op="max")
    t = axis_traffic("reduce_scatter", Partial("sum"), Split(0), 2, (6, 2), (3, 2), f4)
    assert t.op == "sum" and t.payload == 48 and t.copy == 0
    t = axis_traffic("all_to_all", Split(0), Split(1), 2, (3, 4), (6, 2), f4)
    assert t.payload == 2 * 48 and t.copy == 48  # packed along dim 1; dim 0 needs no unpacking
    assert axis_traffic("local_slice", Broadcast(), Split(1), 2, (6, 4), (6, 2), f4).copy == 48
    assert axis_traffic("local_fill", Broadcast(), Partial("min"), 2, (6,), (6,), f4) == \
        AxisTraffic(0.0, 24, 0, "min")
    assert axis_traffic("relabel", Broadcast(), Split(0), 1, (6,), (6,), f4) == \
        AxisTraffic(0.0, 0, 0, None)


# -- the SBPs searched ----------------------------------------------------------------------------

def test_searched_dims_are_the_split_ones_dim_0_and_the_largest():
    M = pl([0, 1])
    assert searched_dims(Layout((2, 9, 3), M, (split(2),)), Layout((2, 9, 3), M, (broadcast,))) \
        == [0, 1, 2]
    assert searched_dims(Layout((4, 4), M, (broadcast,)), Layout((4, 4), M, (broadcast,))) == [0]
    assert searched_dims(Layout((), M, (broadcast,)), Layout((), M, (partial_sum,))) == []


def test_axis_values_offer_broadcast_splits_one_partial_and_the_own_sbp():
    assert axis_values((split(1),), {"sum"}, [0]) == [[broadcast, split(0), partial_sum,
                                                        split(1)]]
    # several ops: an axis keeps its own partial only
    assert axis_values((partial_max, broadcast), {"sum", "max"}, [0]) == \
        [[broadcast, split(0), partial_max], [broadcast, split(0)]]


def test_side_values_hold_both_ends_and_never_mix_reductions_across_placements():
    A, B = pl([[0, 1], [2, 3]]), pl([4, 5])
    src = Layout((6, 4), A, (partial_sum, split(1)))
    same = side_values(src, Layout((6, 4), A, (partial_max, broadcast)), 0)
    assert partial_sum in same[0] and partial_max in same[0] and split(1) in same[1]
    dst = Layout((6, 4), B, (partial_max,))
    s0, s1 = side_values(src, dst, 0), side_values(src, dst, 1)
    assert all(not isinstance(v, Partial) or v == partial_sum for vals in s0 for v in vals)
    assert s1 == ((broadcast, split(0), split(1), partial_max),)


def test_cross_steps_join_only_layouts_of_one_reduction():
    A, B = pl([0, 1]), pl([2, 3, 4])
    src, dst = Layout((6,), A, (partial_sum,)), Layout((6,), B, (broadcast,))
    steps = cross_steps(src, dst, [(partial_sum,), (broadcast,)],
                        [(broadcast,), (partial_max,), (split(0),)], 4, DEFAULT_TABLE)
    pairs = [(s1, s2, st.kind) for s1, s2, st in steps]
    assert ((partial_sum,), (partial_max,), "send_recv") not in pairs
    assert ((partial_sum,), (broadcast,), "send_recv") in pairs
    assert ((broadcast,), (broadcast,), "broadcast") in pairs  # between all-broadcast layouts
    for s1, s2, st in steps:
        assert st.src == Layout((6,), A, s1) and st.dst == Layout((6,), B, s2)
    # on one placement: the one general redistribution between the two ends
    one = cross_steps(src, Layout((6,), A, (split(0),)), [], [], 4, DEFAULT_TABLE)
    assert [(s1, s2, st.kind) for s1, s2, st in one] == [((partial_sum,), (split(0),),
                                                         "send_recv")]


# -- the graph of a conversion --------------------------------------------------------------------

CONVERSIONS = [
    (Layout((5, 7), pl([[0, 1], [2, 3]]), (partial_sum, split(1))), Layout((5, 7), pl([3, 1, 0]),
                                                                          (split(0),))),
    (Layout((6, 4), pl([0, 1, 2]), (split(0),)), Layout((6, 4), pl([0, 1, 2]), (split(1),))),
    (Layout((4, 4), pl([[0, 1], [2, 3]]), (split(0), split(1))),
     Layout((4, 4), pl([[0, 1], [2, 3]]), (broadcast, partial_sum))),
    (Layout((3,), pl([0]), (broadcast,)), Layout((3,), pl([4, 5, 6, 7]), (broadcast,))),
]


@pytest.mark.parametrize("src, dst", CONVERSIONS)
def test_the_conversion_graph_holds_valid_steps_seen_from_both_ends(src, dst):
    g = ConversionGraph(src, dst, 4, DEFAULT_TABLE)
    assert g.start == Node(0, src.sbp)
    assert g.goal == Node(0 if src.placement == dst.placement else 1, dst.sbp)
    seen, todo = {g.start}, [g.start]
    while todo:  # every node reachable from the start
        n = todo.pop()
        for e in g.out_edges(n):
            st = e.step
            if st.kind in CROSS_KINDS:
                assert (n.side, e.to.side) == (0, g.goal.side)
                assert (st.src.sbp, st.dst.sbp) == (n.sbp, e.to.sbp)
            else:
                assert e.to.side == n.side and st.src.sbp == n.sbp
                assert st.apply(st.src) == st.dst and st.dst.sbp == e.to.sbp
            assert InEdge(n, st.seconds) in g.in_edges(e.to)  # the same step, seen from its end
            if e.to not in seen:
                seen.add(e.to)
                todo.append(e.to)
    assert g.goal in seen


@pytest.mark.parametrize("src, dst", CONVERSIONS)
def test_the_search_on_the_conversion_graph_is_the_planners_choice(src, dst):
    g = ConversionGraph(src, dst, 4, DEFAULT_TABLE)
    choice = ranked_plans(src, dst, 4, g.start, g.goal, g)
    assert choice == candidate_plans(src, dst, 4)
    assert choice.chosen.seconds == pytest.approx(distances_to(g.goal, g)[g.start])


# -- the search on any graph ----------------------------------------------------------------------

class ToyGraph:
    """A graph given by its edges (start, end, seconds, kind), nodes on side 0."""

    def __init__(self, edges):
        lay = Layout((2,), pl([0]), (broadcast,))
        self.edges = [(Node(0, (a,)), Node(0, (b,)),
                       Step(kind=kind, src=lay, dst=lay, seconds=w)) for a, b, w, kind in edges]

    def out_edges(self, node):
        return [Edge(b, st) for a, b, st in self.edges if a == node]

    def in_edges(self, node):
        return [InEdge(a, st.seconds) for a, b, st in self.edges if b == node]


def node(name):
    return Node(0, (name,))


def bellman_ford(graph, goal, nodes):
    dist = {n: math.inf for n in nodes}
    dist[goal] = 0.0
    for _ in nodes:
        for a, b, st in graph.edges:
            dist[a] = min(dist[a], st.seconds + dist[b])
    return {n: d for n, d in dist.items() if d < math.inf}


TOY = [("a", "b", 1.0, "relabel"), ("b", "d", 2.0, "relabel"), ("a", "c", 2.0, "send_recv"),
       ("c", "d", 1.0, "relabel"), ("a", "d", 5.0, "relabel"), ("d", "a", 0.5, "relabel"),
       ("e", "a", 1.0, "relabel")]


def test_distances_to_the_goal_match_brute_force():
    g = ToyGraph(TOY)
    nodes = [node(x) for x in "abcdef"]
    for goal in nodes:
        assert distances_to(goal, g) == pytest.approx(bellman_ford(g, goal, nodes))
    assert node("f") not in distances_to(node("d"), g)  # no way from f


def test_edge_rank_prefers_the_cheaper_way_then_per_axis_steps():
    g = ToyGraph(TOY)
    dist = distances_to(node("d"), g)
    ranks = {e.to.sbp[0]: edge_rank(e, dist) for e in g.out_edges(node("a"))}
    assert ranks == {"b": (3.0, 0), "c": (3.0, 1), "d": (5.0, 0)}


def test_cheapest_path_follows_the_distances():
    g = ToyGraph(TOY)
    dist = distances_to(node("d"), g)
    path = cheapest_path(node("e"), node("d"), g, dist)
    assert sum(st.seconds for st in path) == dist[node("e")] == 4.0
    assert [st.kind for st in path] == ["relabel"] * 3  # via b, not via c at equal cost
    assert cheapest_path(node("d"), node("d"), g, dist) == []


def test_ranked_plans_keep_the_best_plan_through_each_first_step():
    g = ToyGraph(TOY)
    lay = Layout((2,), pl([0]), (broadcast,))
    choice = ranked_plans(lay, lay, 4, node("a"), node("d"), g)
    assert [p.seconds for p in (choice.chosen, *choice.rejected)] == [3.0, 3.0, 5.0]
    assert [p.steps[0].kind for p in (choice.chosen, *choice.rejected)] == \
        ["relabel", "send_recv", "relabel"]
    with pytest.raises(RuntimeError, match="found no plan"):
        ranked_plans(lay, lay, 4, node("f"), node("d"), g)


def test_every_small_conversion_costs_its_distance():
    M = pl([[0, 1], [2, 3]])
    one = [broadcast, partial_sum, split(0), split(1)]
    for s1, s2 in itertools.product(itertools.product(one, repeat=2), repeat=2):
        src, dst = Layout((4, 6), M, s1), Layout((4, 6), M, s2)
        if src == dst:
            continue
        g = ConversionGraph(src, dst, 4, DEFAULT_TABLE)
        assert candidate_plans(src, dst, 4).chosen.seconds == \
            pytest.approx(distances_to(g.goal, g)[g.start])
