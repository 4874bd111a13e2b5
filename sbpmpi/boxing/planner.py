"""The planner: the cheapest plan from one layout to another under the cost table.

It searches the graph whose nodes are ND-SBPs on the source and the destination
placement and whose edges are the steps of :mod:`.plan`, each weighted by the cost
table (:mod:`.cost`): per-axis (or several-axes) collectives and local steps on each
placement, and point-to-point or broadcast moves between them. The cheapest path wins;
the best path through every other first step is kept as a rejected candidate. Pure:
the same on every rank, without MPI and without arrays.

Where the cost table has a topology (the job spans hosts), a gather, reduction or
reduce-scatter whose groups span hosts evenly (the same number ``m >= 2`` of each group's
ranks on each of its hosts) has a second, hierarchical edge beside the flat one
(:func:`hierarchical_step`): the search takes whichever is cheaper. Without a topology
the graph, and so every plan, is what it is on one host.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import SBP, Broadcast, NdSbp, Partial, Split
from .cost import (
    DEFAULT_TABLE,
    CostTable,
    Topology,
    copy_seconds,
    factor,
    group_seconds,
    half_width_seconds,
    network_seconds,
    primitive_seconds,
    step_seconds,
)
from .p2p_cost import EXACT_PAIRS, P2pTraffic, p2p_traffic
from .plan import (
    Plan,
    PlanChoice,
    Step,
    check_conversion,
    max_local_extents,
    reduce_ops,
    span_kind,
    transition_kind,
)
from .schedule import broadcast_members, transfer_schedule
from .search import Edge, InEdge, Node, ranked_plans

__all__ = ["candidate_plans", "plan_conversion", "send_recv_step", "axis_change_seconds",
           "host_split", "hierarchical_step", "axis_steps",
           "AxisTraffic", "axis_traffic", "searched_dims", "axis_values", "side_values",
           "cross_steps", "ConversionGraph"]


# -- steps with their costs ---------------------------------------------------------------------

class AxisTraffic(NamedTuple):
    """What a per-axis step costs the busiest rank of its group, in bytes."""

    #: bytes sent (and received) over the network
    moved: float
    #: bytes copied locally (packing, unpacking, a copy to reduce into, a fill)
    copy: int
    #: bytes the primitive's modelled time is charged for
    payload: int
    #: the reduction (all_reduce, reduce_scatter) or the partial created (local_fill, local_pad)
    op: str | None


def axis_traffic(kind: str, frm: SBP, to: SBP, p: int, in_ext: tuple[int, ...],
                 out_ext: tuple[int, ...], itemsize: int) -> AxisTraffic:
    """The bytes of a ``kind`` step from ``frm`` to ``to`` over ``p`` ranks, from the largest
    local extents before and after it. A block along a dim with a larger dim in front of
    it is packed or unpacked: one copy."""
    n_in = math.prod(in_ext) * itemsize
    n_out = math.prod(out_ext) * itemsize
    if kind == "all_gather":
        assert isinstance(frm, Split)
        copy = n_out if math.prod(out_ext[:frm.dim]) > 1 else 0
        return AxisTraffic(factor(kind, p) * n_out, copy, n_out, None)
    if kind == "all_reduce":
        assert isinstance(frm, Partial)
        # the reduction runs in place on a copy of the input
        return AxisTraffic(factor(kind, p) * n_in, n_in, n_in, frm.op)
    if kind == "reduce_scatter":
        assert isinstance(frm, Partial) and isinstance(to, Split)
        copy = n_in if math.prod(in_ext[:to.dim]) > 1 else 0
        return AxisTraffic(factor(kind, p) * n_in, copy, n_in, frm.op)
    if kind == "all_to_all":
        assert isinstance(frm, Split) and isinstance(to, Split)
        copy = (n_in if math.prod(in_ext[:to.dim]) > 1 else 0) + \
               (n_out if math.prod(out_ext[:frm.dim]) > 1 else 0)
        return AxisTraffic(factor(kind, p) * p * n_in, copy, p * n_in, None)
    if kind == "local_slice":
        assert isinstance(to, Split)
        return AxisTraffic(0.0, n_out if math.prod(in_ext[:to.dim]) > 1 else 0, 0, None)
    if kind in ("local_fill", "local_pad"):
        assert isinstance(to, Partial)
        return AxisTraffic(0.0, n_out, 0, to.op)
    return AxisTraffic(0.0, 0, 0, None)  # relabel


# kinds that run on each rank alone: charged for their copies and the step, nothing sent
_LOCAL_KINDS = ("local_slice", "local_fill", "local_pad", "relabel")


@functools.lru_cache(maxsize=16384)
def _axis_step(kind: str, src: Layout, axis: int, to: SBP, itemsize: int,
               table: CostTable, span: int = 1) -> Step:
    """The ``kind`` step changing mesh axes ``axis .. axis + span - 1`` of ``src`` to ``to``,
    with its modelled cost."""
    pl = src.placement
    dst = Layout(src.shape, pl, src.sbp[:axis] + (to,) * span + src.sbp[axis + span:])
    frm = src.sbp[axis]
    dev = pl.type
    p = math.prod(pl.hierarchy[axis:axis + span])
    t = axis_traffic(kind, frm, to, p, max_local_extents(src), max_local_extents(dst), itemsize)
    if kind in _LOCAL_KINDS:
        return Step(kind=kind, src=src, dst=dst, axis=axis, frm=frm, to=to, op=t.op,
                    groups=pl.axis_groups(axis), copy_bytes=t.copy,
                    seconds=copy_seconds(t.copy, dev, table) + step_seconds(dev, table),
                    span=span)
    groups = pl.axis_groups(axis, span)
    if itemsize == 2 and kind in ("all_reduce", "reduce_scatter"):  # float16, bfloat16
        secs = half_width_seconds(kind, p, t.payload, dev, table)
    else:
        secs = group_seconds(kind, groups, t.payload, dev, table)
    secs += copy_seconds(t.copy, dev, table, ops=0) + step_seconds(dev, table)
    nb = int(math.ceil(t.moved))
    return Step(kind=kind, src=src, dst=dst, axis=axis, frm=frm, to=to, op=t.op,
                groups=groups, send_bytes=nb, recv_bytes=nb,
                copy_bytes=t.copy, seconds=secs, span=span)


# kinds with a hierarchical form, and the legs of each: (primitive, where, share of the
# step's payload): "inside" a host (groups of m), "across" hosts (groups of k)
_HIER_LEGS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "all_reduce": (("reduce_scatter", "inside", "all"), ("all_reduce", "across", "1/m"),
                   ("all_gather", "inside", "all")),
    "reduce_scatter": (("reduce_scatter", "inside", "all"), ("reduce_scatter", "across", "1/m")),
    "all_gather": (("all_gather", "across", "1/m"), ("all_gather", "inside", "all")),
}


def host_split(groups: Sequence[Sequence[int]], topology: Topology | None,
               ) -> tuple[tuple[tuple[int, ...], ...], ...] | None:
    """Each group's ranks split by host (:meth:`Topology.by_node`), when every group spans
    at least 2 hosts with the same number ``m >= 2`` of its ranks on each; else None (the
    hierarchical form would be the flat collective, or is not defined)."""
    if topology is None:
        return None
    out = []
    for g in groups:
        parts = topology.by_node(g)
        if len(parts) < 2 or len(parts[0]) < 2 or len({len(x) for x in parts}) != 1:
            return None
        out.append(parts)
    return tuple(out)


@functools.lru_cache(maxsize=16384)
def hierarchical_step(flat: Step, itemsize: int, table: CostTable) -> Step | None:
    """The hierarchical form of the collective step ``flat`` (see :mod:`.plan`), with its
    modelled cost, or None where its groups do not span hosts evenly.

    Its legs are costed as collectives on their own groups (:func:`group_seconds`: the
    legs inside a host on the buffers' row, the leg across on the network with the ranks
    of a host sharing its link), plus the copies of the flat step, a reorder of the whole
    buffer for a gather or reduce-scatter (their blocks travel grouped by local index),
    and one step cost per leg.
    """
    if flat.kind not in _HIER_LEGS:
        return None
    hosts = host_split(flat.groups, table.topology)
    if hosts is None:
        return None
    m = len(hosts[0][0])
    inside = [h for g in hosts for h in g]
    across = [tuple(h[j] for h in g) for g in hosts for j in range(m)]
    src, dst = flat.src, flat.dst
    p = len(flat.groups[0])
    assert flat.frm is not None and flat.to is not None
    t = axis_traffic(flat.kind, flat.frm, flat.to, p, max_local_extents(src),
                     max_local_extents(dst), itemsize)
    dev = src.placement.type
    secs = moved = 0.0
    for prim, where, share in _HIER_LEGS[flat.kind]:
        groups = inside if where == "inside" else across
        n = t.payload / m if share == "1/m" else float(t.payload)
        secs += group_seconds(prim, groups, n, dev, table) + step_seconds(dev, table)
        moved += factor(prim, len(groups[0])) * n
    copy = t.copy + (t.payload if flat.kind != "all_reduce" else 0)
    secs += copy_seconds(copy, dev, table, ops=0)
    nb = int(math.ceil(moved))
    return Step(kind=flat.kind, src=src, dst=dst, axis=flat.axis, frm=flat.frm, to=flat.to,
                op=flat.op, groups=flat.groups, send_bytes=nb, recv_bytes=nb, copy_bytes=copy,
                seconds=secs, span=flat.span, hosts=hosts)


def axis_steps(kind: str, src: Layout, axis: int, to: SBP, itemsize: int, table: CostTable,
               span: int = 1) -> tuple[Step, ...]:
    """The ``kind`` step changing mesh axes ``axis .. axis + span - 1`` of ``src`` to ``to``:
    the flat one, and its hierarchical form where the table's topology gives one."""
    flat = _axis_step(kind, src, axis, to, itemsize, table, span)
    if table.topology is None:
        return (flat,)
    hier = hierarchical_step(flat, itemsize, table)
    return (flat,) if hier is None else (flat, hier)


def axis_change_seconds(src: Layout, axis: int, to: SBP, itemsize: int,
                        table: CostTable | None = None) -> float | None:
    """Modelled seconds of the one step that changes mesh ``axis`` of ``src`` to ``to`` alone.

    0 when it already is ``to``; None when no single step does it (the planner would
    need several). Cheap (no search): op inference uses it to estimate candidates on
    large meshes.
    """
    if src.sbp[axis] == to:
        return 0.0
    kind = transition_kind(src.sbp, src.placement.hierarchy, axis, to)
    if kind is None:
        return None
    return min(st.seconds for st in axis_steps(kind, src, axis, to, itemsize,
                                                table or DEFAULT_TABLE))


def _cross_device(src: Layout, dst: Layout) -> str:
    return "cuda" if "cuda" in (src.placement.type, dst.placement.type) else "cpu"


@functools.lru_cache(maxsize=16384)
def send_recv_step(src: Layout, dst: Layout, itemsize: int, table: CostTable) -> Step:
    """The point-to-point step moving ``src`` to ``dst``, with its modelled cost: the
    busiest rank's bytes and messages (:func:`.p2p_cost.p2p_traffic`), never the list of
    every rank's blocks."""
    t = p2p_traffic(src, dst, itemsize)
    dev = _cross_device(src, dst)
    nb = max(t.send, t.recv)
    secs = primitive_seconds("p2p", t.messages, nb, dev, table) if t.messages else 0.0
    if table.topology is not None and t.messages:
        secs = max(secs, _crossing_p2p_seconds(src, dst, t, itemsize, table))
    secs = secs + copy_seconds(t.copy, dev, table) + step_seconds(dev, table)
    return Step(kind="send_recv", src=src, dst=dst, op=t.op, send_bytes=t.send,
                recv_bytes=t.recv, copy_bytes=t.copy, messages=t.messages, seconds=secs)


def _crossing_p2p_seconds(src: Layout, dst: Layout, t: P2pTraffic, itemsize: int,
                          table: CostTable) -> float:
    """The time of a point-to-point step's messages between hosts on the network: the
    busiest host's link (bytes out or in) and the most such messages of one rank. Counted
    over the schedule on small placements (as :func:`.p2p_cost.p2p_traffic`); above, each
    rank's bytes are taken to cross, the ranks of one host sharing its link."""
    topo = table.topology
    assert topo is not None
    if src.placement.size * dst.placement.size > EXACT_PAIRS:
        per_host: dict[int, int] = {}
        for r in set(src.placement.rank_list) | set(dst.placement.rank_list):
            per_host[topo.nodes[r]] = per_host.get(topo.nodes[r], 0) + 1
        if len(per_host) < 2:
            return 0.0
        return network_seconds("p2p", t.messages,
                               max(per_host.values()) * max(t.send, t.recv), table)
    out: dict[int, int] = {}
    into: dict[int, int] = {}
    msgs: dict[int, int] = {}
    for tr in transfer_schedule(src, dst):
        a, b = topo.nodes[tr.src], topo.nodes[tr.dst]
        if a == b:
            continue
        n = math.prod(hi - lo for lo, hi in tr.box) * itemsize
        out[a] = out.get(a, 0) + n
        into[b] = into.get(b, 0) + n
        msgs[tr.src] = msgs.get(tr.src, 0) + 1
        msgs[tr.dst] = msgs.get(tr.dst, 0) + 1
    if not msgs:
        return 0.0
    load = max(max(out.values(), default=0), max(into.values(), default=0))
    return network_seconds("p2p", max(msgs.values()), load, table)


@functools.lru_cache(maxsize=4096)
def _broadcast_step(src: Layout, dst: Layout, itemsize: int, table: CostTable) -> Step | None:
    """The broadcast step from ``src`` to ``dst`` (all broadcast), or None when every rank
    of ``dst`` already holds the value."""
    members = broadcast_members(src, dst)
    p = len(members.group)
    if p < 2:
        return None
    n = math.prod(src.shape) * itemsize
    dev = _cross_device(src, dst)
    secs = group_seconds("broadcast", (members.group,), n, dev, table) + step_seconds(dev, table)
    copy = 0
    if src.placement.type != dst.placement.type:
        copy = n
        secs += copy_seconds(n, dev, table)
    moved = int(math.ceil(factor("broadcast", p) * n))
    return Step(kind="broadcast", src=src, dst=dst, root=members.root, groups=(members.group,),
                send_bytes=moved, recv_bytes=moved, copy_bytes=copy, seconds=secs)


# -- the graph of a conversion ------------------------------------------------------------------

def searched_dims(src: Layout, dst: Layout) -> list[int]:
    """The tensor dims a split may take on the way: those split by either side, dim 0 and
    the largest dim (the first of equal ones)."""
    shape = src.shape
    dims = {s.dim for s in src.sbp + dst.sbp if isinstance(s, Split)}
    if shape:
        dims.add(0)
        dims.add(max(range(len(shape)), key=lambda d: (shape[d], -d)))
    return sorted(dims)


def axis_values(sbp: NdSbp, ops: set[str], dims: Sequence[int]) -> list[list[SBP]]:
    """The SBPs each mesh axis may take in the search, starting from ``sbp``: broadcast,
    the splits of ``dims``, the partial of the one op in ``ops`` (or the axis's own
    partial when there are several), and the axis's own SBP."""
    vals: list[list[SBP]] = []
    for own in sbp:
        v: list[SBP] = [Broadcast(), *(Split(d) for d in dims)]
        if len(ops) == 1:
            v.append(Partial(next(iter(ops))))
        elif isinstance(own, Partial):
            v.append(own)
        if own not in v:
            v.append(own)
        vals.append(v)
    return vals


def side_values(src: Layout, dst: Layout, side: int) -> tuple[tuple[SBP, ...], ...]:
    """The SBPs each mesh axis of side ``side`` (0: the source placement, 1: the
    destination's) may take in the search of ``src`` -> ``dst``.

    On one placement: the values of :func:`axis_values` from the source, with the
    destination's SBP added; the partials of every op either side uses are allowed. Across
    placements: each side from its own SBP, a partial only when both sides together use
    one op (a step between placements cannot turn one reduction into another).
    """
    dims = searched_dims(src, dst)
    ops = reduce_ops(src.sbp) | reduce_ops(dst.sbp)
    if src.placement == dst.placement:
        vals = axis_values(src.sbp, ops, dims)
        for a, want in enumerate(dst.sbp):
            if want not in vals[a]:
                vals[a].append(want)
    else:
        vals = axis_values(src.sbp if side == 0 else dst.sbp, ops if len(ops) == 1 else set(),
                           dims)
    return tuple(tuple(v) for v in vals)


class SideEdge(NamedTuple):
    """A step between two ND-SBPs of one placement."""

    to: NdSbp
    step: Step


class _SideGraph:
    """Per-axis steps between the ND-SBPs of one placement (cached, shared by searches):
    ``adj`` the steps out of each ND-SBP; :meth:`out_edges` and :meth:`in_edges` the same
    steps as search edges of one side, made once per side."""

    __slots__ = ("adj", "_out", "_in")

    def __init__(self, adj: dict[NdSbp, list[SideEdge]]) -> None:
        self.adj = adj
        self._out: dict[int, dict[NdSbp, list[Edge]]] = {}
        self._in: dict[int, dict[NdSbp, list[InEdge]]] = {}

    def out_edges(self, side: int) -> dict[NdSbp, list[Edge]]:
        """The steps out of each ND-SBP, as edges between nodes of side ``side``."""
        got = self._out.get(side)
        if got is None:
            got = self._out[side] = {
                s: [Edge(Node(side, e.to), e.step) for e in outs] for s, outs in self.adj.items()}
        return got

    def in_edges(self, side: int) -> dict[NdSbp, list[InEdge]]:
        """The steps into each ND-SBP, as edges between nodes of side ``side``."""
        got = self._in.get(side)
        if got is None:
            got = self._in[side] = {}
            for s, outs in self.adj.items():
                for e in outs:
                    got.setdefault(e.to, []).append(InEdge(Node(side, s), e.step.seconds))
        return got


@functools.lru_cache(maxsize=1024)
def _side_graph(shape: tuple[int, ...], pl: Placement, itemsize: int, table: CostTable,
                values: tuple[tuple[SBP, ...], ...]) -> _SideGraph:
    states = [tuple(t) for t in itertools.product(*values)]
    valid = set(states)
    return _SideGraph({s: _steps_from(s, shape, pl, itemsize, table, values, valid)
                       for s in states})


def _steps_from(s: NdSbp, shape: tuple[int, ...], pl: Placement, itemsize: int,
                table: CostTable, values: tuple[tuple[SBP, ...], ...],
                valid: set[NdSbp]) -> list[SideEdge]:
    """The steps out of ``s`` that reach an ND-SBP of ``valid``: one mesh axis at a time,
    then several consecutive axes at once (one collective over their ranks)."""
    h = pl.hierarchy
    lay = Layout(shape, pl, s)
    out: list[SideEdge] = []
    for a in range(pl.ndim):
        for v in values[a]:
            kind = transition_kind(s, h, a, v)
            if kind is None:
                continue
            t = s[:a] + (v,) + s[a + 1:]
            if t in valid:
                out.extend(SideEdge(t, st) for st in axis_steps(kind, lay, a, v, itemsize, table))
    for a in range(pl.ndim):
        for b in range(a + 1, pl.ndim):
            for v in values[a]:
                kind = span_kind(s, h, a, b, v)
                if kind is None:
                    continue
                t = s[:a] + (v,) * (b - a + 1) + s[b + 1:]
                if t in valid:
                    out.extend(SideEdge(t, st) for st in axis_steps(kind, lay, a, v, itemsize,
                                                                    table, b - a + 1))
    return out


def cross_steps(src: Layout, dst: Layout, sources: Sequence[NdSbp], targets: Sequence[NdSbp],
                itemsize: int, table: CostTable) -> list[tuple[NdSbp, NdSbp, Step]]:
    """The moves between the placements (or the one general redistribution on one
    placement): a send_recv step, plus a broadcast step between all-broadcast layouts of
    two placements, from the source's ``sources`` to ``targets`` on the destination's.

    Only pairs of ND-SBPs the moves can join: each side with at most one reduction, and
    the same one when both have partial axes.
    """
    same = src.placement == dst.placement
    if same:
        pairs = [(src.sbp, dst.sbp)]
    else:
        pairs = [(src.sbp, s2) for s2 in targets] + \
                [(s1, dst.sbp) for s1 in sources if s1 != src.sbp]
    out: list[tuple[NdSbp, NdSbp, Step]] = []
    for s1, s2 in pairs:
        o1, o2 = reduce_ops(s1), reduce_ops(s2)
        if len(o1) > 1 or len(o2) > 1 or (o1 and o2 and o1 != o2):
            continue
        l1 = Layout(src.shape, src.placement, s1)
        l2 = Layout(src.shape, dst.placement, s2)
        out.append((s1, s2, send_recv_step(l1, l2, itemsize, table)))
        if not same and all(isinstance(x, Broadcast) for x in s1 + s2):
            b = _broadcast_step(l1, l2, itemsize, table)
            if b is not None:
                out.append((s1, s2, b))
    return out


class ConversionGraph:
    """The search graph of one conversion: the per-placement graphs (one side on one
    placement, two across placements) and the moves between the sides."""

    __slots__ = ("start", "goal", "_out", "_in", "_cross", "_cross_in")

    def __init__(self, src: Layout, dst: Layout, itemsize: int, table: CostTable) -> None:
        same = src.placement == dst.placement
        placements = [src.placement] if same else [src.placement, dst.placement]
        sides = [_side_graph(src.shape, pl, itemsize, table, side_values(src, dst, k))
                 for k, pl in enumerate(placements)]
        self._out = [g.out_edges(k) for k, g in enumerate(sides)]
        self._in = [g.in_edges(k) for k, g in enumerate(sides)]
        last = len(placements) - 1
        self.start = Node(0, src.sbp)
        self.goal = Node(last, dst.sbp)
        self._cross: dict[Node, list[Edge]] = {}
        self._cross_in: dict[Node, list[InEdge]] = {}
        for s1, s2, st in cross_steps(src, dst, list(sides[0].adj), list(sides[last].adj),
                                      itemsize, table):
            a, b = Node(0, s1), Node(last, s2)
            self._cross.setdefault(a, []).append(Edge(b, st))
            self._cross_in.setdefault(b, []).append(InEdge(a, st.seconds))

    def out_edges(self, node: Node) -> list[Edge]:
        """The steps out of ``node``: its placement's, then the moves between placements."""
        own = self._out[node.side].get(node.sbp, _NONE)
        cross = self._cross.get(node)
        return own + cross if cross else own

    def in_edges(self, node: Node) -> list[InEdge]:
        """The steps into ``node``, with their seconds."""
        own = self._in[node.side].get(node.sbp, _NONE)
        cross = self._cross_in.get(node)
        return own + cross if cross else own


_NONE: list = []  # no edges (shared, never written)


def _search(src: Layout, dst: Layout, itemsize: int, table: CostTable) -> PlanChoice:
    graph = ConversionGraph(src, dst, itemsize, table)
    return ranked_plans(src, dst, itemsize, graph.start, graph.goal, graph)


@functools.lru_cache(maxsize=2048)
def _choice(src: Layout, dst: Layout, itemsize: int, table: CostTable) -> PlanChoice:
    check_conversion(src, dst)
    if src == dst:
        return PlanChoice(Plan(src, dst, itemsize, ()), ())
    return _search(src, dst, itemsize, table)


def candidate_plans(src: Layout, dst: Layout, itemsize: int,
                    table: CostTable | None = None) -> PlanChoice:
    """The cheapest plan from ``src`` to ``dst`` and the rejected candidates.

    Candidates are the best plans through each possible first step. Raises ValueError
    for conversions without a meaning (see :func:`why_meaningless`): this is the
    conversion's one validation, made once per cached plan, which
    :func:`sbpmpi.runtime.redistribute` relies on.
    """
    if isinstance(itemsize, bool) or not isinstance(itemsize, int) or itemsize <= 0:
        raise ValueError(f"itemsize must be a positive int, got {itemsize!r}")
    return _choice(src, dst, itemsize, table or DEFAULT_TABLE)


def plan_conversion(src: Layout, dst: Layout, itemsize: int,
                    table: CostTable | None = None) -> Plan:
    """The cheapest plan from ``src`` to ``dst`` under ``table`` (the current one by default)."""
    return candidate_plans(src, dst, itemsize, table).chosen
