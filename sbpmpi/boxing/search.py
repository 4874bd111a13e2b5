"""The cheapest-path search of the planner, on any graph of layouts (pure).

A node is an ND-SBP on one side of a conversion (side 0: the source placement; side 1:
the destination placement when it differs); an edge is a :class:`~.plan.Step` weighted by
its modelled seconds. :mod:`.planner` builds the graph of a conversion; this module
finds, for every node, the cheapest cost to the goal (:func:`distances_to`), the path
that reaches it (:func:`cheapest_path`) and the ranked plans through each first step
(:func:`ranked_plans`). Each piece is a small function of its arguments, testable alone.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import NamedTuple, Protocol

from ..core.layout import Layout
from ..core.sbp import NdSbp
from .plan import AXIS_KINDS, Plan, PlanChoice, Step

__all__ = ["Node", "Edge", "InEdge", "Graph", "distances_to", "edge_rank", "cheapest_path",
           "ranked_plans"]


class Node(NamedTuple):
    """An ND-SBP on one side of the conversion (0: source placement, 1: destination)."""

    side: int
    sbp: NdSbp


class Edge(NamedTuple):
    """A step out of a node: the node it reaches and the step."""

    to: Node
    step: Step


class InEdge(NamedTuple):
    """A step into a node, seen from its end: where it starts and its modelled seconds."""

    frm: Node
    seconds: float


class Graph(Protocol):
    """What the search needs of a graph: the edges out of and into a node."""

    def out_edges(self, node: Node) -> list[Edge]: ...

    def in_edges(self, node: Node) -> list[InEdge]: ...


def distances_to(goal: Node, graph: Graph) -> dict[Node, float]:
    """The cheapest modelled seconds from every node that reaches ``goal`` (reverse Dijkstra)."""
    dist: dict[Node, float] = {goal: 0.0}
    tie = itertools.count(1)  # equal distances pop in insertion order: deterministic
    heap: list[tuple[float, int, Node]] = [(0.0, 0, goal)]
    while heap:
        d, _, node = heapq.heappop(heap)
        if d > dist.get(node, math.inf):
            continue
        for e in graph.in_edges(node):
            nd = d + e.seconds
            if nd < dist.get(e.frm, math.inf):
                dist[e.frm] = nd
                heapq.heappush(heap, (nd, next(tie), e.frm))
    return dist


def edge_rank(edge: Edge, dist: dict[Node, float]) -> tuple[float, int]:
    """How good ``edge`` is as the next step: the seconds to the goal through it, then
    per-axis steps before steps between placements (at equal cost, fewer ranks talk)."""
    return (edge.step.seconds + dist.get(edge.to, math.inf),
            0 if edge.step.kind in AXIS_KINDS else 1)


def cheapest_path(start: Node, goal: Node, graph: Graph, dist: dict[Node, float]) -> list[Step]:
    """The steps of the cheapest path from ``start`` to ``goal``, following ``dist`` (of
    :func:`distances_to`); the first of equally good edges wins."""
    path: list[Step] = []
    node = start
    for _ in range(len(dist) + 1):
        if node == goal:
            return path
        best = min(graph.out_edges(node), key=lambda e: edge_rank(e, dist))
        path.append(best.step)
        node = best.to
    raise RuntimeError("boxing plan search did not converge (internal error)")


def ranked_plans(src: Layout, dst: Layout, itemsize: int, start: Node, goal: Node,
                 graph: Graph) -> PlanChoice:
    """The cheapest plan and, as rejected candidates, the best plan through every other
    first step out of ``start`` (cheapest first; at equal cost, fewer steps first)."""
    dist = distances_to(goal, graph)
    if start not in dist:
        raise RuntimeError(f"boxing found no plan from {src} to {dst} (internal error)")
    cands: dict[tuple[Step, ...], Plan] = {}
    for e in graph.out_edges(start):
        if e.to not in dist:
            continue
        path = tuple([e.step] + cheapest_path(e.to, goal, graph, dist))
        cands.setdefault(path, Plan(src, dst, itemsize, path))
    # stable sort: ties keep the (deterministic) order of the first steps
    ranked = sorted(cands.values(), key=lambda p: (p.seconds, len(p.steps)))
    return PlanChoice(ranked[0], tuple(ranked[1:]))
