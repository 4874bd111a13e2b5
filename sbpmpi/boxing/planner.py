"""The planner: the cheapest plan from one layout to another under the cost table.

It searches the graph whose nodes are ND-SBPs on the source and the destination
placement and whose edges are the steps of :mod:`.plan`, each weighted by the cost
table (:mod:`.cost`): per-axis (or several-axes) collectives and local steps on each
placement, and point-to-point or broadcast moves between them. The cheapest path wins;
the best path through every other first step is kept as a rejected candidate. Pure:
the same on every rank, without MPI and without arrays.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Sequence

from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import SBP, Broadcast, NdSbp, Partial, Split
from .cost import DEFAULT_TABLE, CostTable, copy_seconds, factor, primitive_seconds, step_seconds
from .plan import (
    AXIS_KINDS,
    Plan,
    PlanChoice,
    Step,
    check_conversion,
    max_local_extents,
    reduce_ops,
    span_kind,
    transition_kind,
)
from .schedule import broadcast_members, is_contiguous_box, relative, slots_of, transfer_schedule

__all__ = ["candidate_plans", "plan_conversion", "send_recv_step", "axis_change_seconds"]


# -- steps with their costs ---------------------------------------------------------------------

@functools.lru_cache(maxsize=16384)
def _axis_step(kind: str, src: Layout, axis: int, to: SBP, itemsize: int,
               table: CostTable, span: int = 1) -> Step:
    pl = src.placement
    sbp = src.sbp[:axis] + (to,) * span + src.sbp[axis + span:]
    dst = Layout(src.shape, pl, sbp)
    frm = src.sbp[axis]
    p = math.prod(pl.hierarchy[axis:axis + span])
    dev = pl.type
    in_ext, out_ext = max_local_extents(src), max_local_extents(dst)
    n_in = math.prod(in_ext) * itemsize
    n_out = math.prod(out_ext) * itemsize
    op = None
    copy = 0
    if kind == "all_gather":
        assert isinstance(frm, Split)
        copy = n_out if math.prod(out_ext[:frm.dim]) > 1 else 0
        moved = factor("all_gather", p) * n_out
        secs = primitive_seconds("all_gather", p, n_out, dev, table)
    elif kind == "all_reduce":
        assert isinstance(frm, Partial)
        op = frm.op
        copy = n_in  # the reduction runs in place on a copy of the input
        moved = factor("all_reduce", p) * n_in
        secs = primitive_seconds("all_reduce", p, n_in, dev, table)
    elif kind == "reduce_scatter":
        assert isinstance(frm, Partial) and isinstance(to, Split)
        op = frm.op
        copy = n_in if math.prod(in_ext[:to.dim]) > 1 else 0
        moved = factor("reduce_scatter", p) * n_in
        secs = primitive_seconds("reduce_scatter", p, n_in, dev, table)
    elif kind == "all_to_all":
        assert isinstance(frm, Split) and isinstance(to, Split)
        copy = (n_in if math.prod(in_ext[:to.dim]) > 1 else 0) + \
               (n_out if math.prod(out_ext[:frm.dim]) > 1 else 0)
        moved = factor("all_to_all", p) * p * n_in
        secs = primitive_seconds("all_to_all", p, p * n_in, dev, table)
    else:
        moved = 0.0
        secs = 0.0
        if kind == "local_slice":
            assert isinstance(to, Split)
            copy = n_out if math.prod(in_ext[:to.dim]) > 1 else 0
        elif kind in ("local_fill", "local_pad"):
            assert isinstance(to, Partial)
            op = to.op
            copy = n_out
        secs = copy_seconds(copy, dev, table) + step_seconds(dev, table)
        return Step(kind, src, dst, axis, frm, to, op, None, pl.axis_groups(axis), 0, 0, copy,
                    0, secs, span)
    secs += copy_seconds(copy, dev, table, ops=0) + step_seconds(dev, table)
    nb = int(math.ceil(moved))
    return Step(kind, src, dst, axis, frm, to, op, None, pl.axis_groups(axis, span), nb, nb,
                copy, 0, secs, span)


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
    return _axis_step(kind, src, axis, to, itemsize, table or DEFAULT_TABLE).seconds


def _cross_device(src: Layout, dst: Layout) -> str:
    return "cuda" if "cuda" in (src.placement.type, dst.placement.type) else "cpu"


@functools.lru_cache(maxsize=16384)
def send_recv_step(src: Layout, dst: Layout, itemsize: int, table: CostTable) -> Step:
    """The point-to-point step moving ``src`` to ``dst``, with its modelled cost."""
    sched = transfer_schedule(src, dst)
    sent: dict[int, int] = {}
    recv: dict[int, int] = {}
    msgs: dict[int, int] = {}
    copied: dict[int, int] = {}
    for t in sched:
        n = math.prod(b - a for a, b in t.box) * itemsize
        if t.src == t.dst:
            copied[t.dst] = copied.get(t.dst, 0) + n
            continue
        sent[t.src] = sent.get(t.src, 0) + n
        recv[t.dst] = recv.get(t.dst, 0) + n
        msgs[t.src] = msgs.get(t.src, 0) + 1
        msgs[t.dst] = msgs.get(t.dst, 0) + 1
        r1 = src.local_ranges(t.src)
        r2 = dst.local_ranges(t.dst)
        assert r1 is not None and r2 is not None
        if not is_contiguous_box(relative(t.box, r1), [b - a for a, b in r1]):
            copied[t.src] = copied.get(t.src, 0) + n
        if not is_contiguous_box(relative(t.box, r2), [b - a for a, b in r2]):
            copied[t.dst] = copied.get(t.dst, 0) + n
    reduce_op = None
    src_ops = reduce_ops(src.sbp)
    if src_ops:
        reduce_op = next(iter(src_ops))
        for r in dst.placement.rank_list:
            k = slots_of(src, dst, r)
            if k > 1:
                copied[r] = copied.get(r, 0) + (k - 1) * math.prod(dst.local_shape(r)) * itemsize
    dev = _cross_device(src, dst)
    ms = max(msgs.values(), default=0)
    nb = max(max(sent.values(), default=0), max(recv.values(), default=0))
    cb = max(copied.values(), default=0)
    secs = (primitive_seconds("p2p", ms, nb, dev, table) if ms else 0.0) + \
        copy_seconds(cb, dev, table) + step_seconds(dev, table)
    if reduce_op is not None and not any(slots_of(src, dst, r) > 1
                                         for r in dst.placement.rank_list):
        reduce_op = None
    pairs = tuple(sorted({(t.src, t.dst) for t in sched if t.src != t.dst}))
    return Step("send_recv", src, dst, op=reduce_op, groups=pairs,
                send_bytes=max(sent.values(), default=0), recv_bytes=max(recv.values(), default=0),
                copy_bytes=cb, messages=ms, seconds=secs)


@functools.lru_cache(maxsize=4096)
def _broadcast_step(src: Layout, dst: Layout, itemsize: int, table: CostTable) -> Step | None:
    root, group = broadcast_members(src, dst)
    if len(group) < 2:
        return None
    n = math.prod(src.shape) * itemsize
    dev = _cross_device(src, dst)
    secs = primitive_seconds("broadcast", len(group), n, dev, table) + step_seconds(dev, table)
    copy = 0
    if src.placement.type != dst.placement.type:
        copy = n
        secs += copy_seconds(n, dev, table)
    moved = int(math.ceil(factor("broadcast", len(group)) * n))
    return Step("broadcast", src, dst, root=root, groups=(group,), send_bytes=moved,
                recv_bytes=moved, copy_bytes=copy, seconds=secs)


# -- search -----------------------------------------------------------------------------------

Node = tuple[int, NdSbp]


def _values(sbp_side: NdSbp, ndim_mesh: int, ops: set[str],
            dims: Sequence[int]) -> list[list[SBP]]:
    vals: list[list[SBP]] = []
    for a in range(ndim_mesh):
        v: list[SBP] = [Broadcast(), *(Split(d) for d in dims)]
        if len(ops) == 1:
            v.append(Partial(next(iter(ops))))
        elif isinstance(sbp_side[a], Partial):
            v.append(sbp_side[a])
        if sbp_side[a] not in v:
            v.append(sbp_side[a])
        vals.append(v)
    return vals


def _split_dims(src: Layout, dst: Layout) -> list[int]:
    shape = src.shape
    dims = {s.dim for s in src.sbp + dst.sbp if isinstance(s, Split)}
    if shape:
        dims.add(0)
        dims.add(max(range(len(shape)), key=lambda d: (shape[d], -d)))
    return sorted(dims)


class _SideGraph:
    """Per-axis steps between the ND-SBPs of one placement (cached, shared by searches)."""

    __slots__ = ("adj", "radj")

    def __init__(self, adj: dict[NdSbp, list[tuple[NdSbp, Step]]]) -> None:
        self.adj = adj
        self.radj: dict[NdSbp, list[tuple[NdSbp, float]]] = {}
        for n, outs in adj.items():
            for m, st in outs:
                self.radj.setdefault(m, []).append((n, st.seconds))


@functools.lru_cache(maxsize=1024)
def _side_graph(shape: tuple[int, ...], pl: Placement, itemsize: int, table: CostTable,
                values: tuple[tuple[SBP, ...], ...]) -> _SideGraph:
    h = pl.hierarchy
    states = [tuple(t) for t in itertools.product(*values)]
    valid = set(states)
    adj: dict[NdSbp, list[tuple[NdSbp, Step]]] = {}
    for s in states:
        lay = Layout(shape, pl, s)
        out = adj.setdefault(s, [])
        for a in range(pl.ndim):
            for v in values[a]:
                kind = transition_kind(s, h, a, v)
                if kind is None:
                    continue
                t = s[:a] + (v,) + s[a + 1:]
                if t in valid:
                    out.append((t, _axis_step(kind, lay, a, v, itemsize, table)))
        # several consecutive axes at once: one collective over their ranks
        for a in range(pl.ndim):
            for b in range(a + 1, pl.ndim):
                for v in values[a]:
                    kind = span_kind(s, h, a, b, v)
                    if kind is None:
                        continue
                    t = s[:a] + (v,) * (b - a + 1) + s[b + 1:]
                    if t in valid:
                        out.append((t, _axis_step(kind, lay, a, v, itemsize, table,
                                                  b - a + 1)))
    return _SideGraph(adj)


def _search(src: Layout, dst: Layout, itemsize: int, table: CostTable) -> PlanChoice:
    same = src.placement == dst.placement
    sides = [src.placement] if same else [src.placement, dst.placement]
    dims = _split_dims(src, dst)
    ops = reduce_ops(src.sbp) | reduce_ops(dst.sbp)
    last = len(sides) - 1
    start: Node = (0, src.sbp)
    goal: Node = (last, dst.sbp)
    single = ops if len(ops) == 1 else set()
    graphs: list[_SideGraph] = []
    for k, pl in enumerate(sides):
        if same:
            vals = _values(src.sbp, pl.ndim, ops, dims)
            for a in range(pl.ndim):
                if dst.sbp[a] not in vals[a]:
                    vals[a].append(dst.sbp[a])
        else:
            vals = _values(src.sbp if k == 0 else dst.sbp, pl.ndim, single, dims)
        graphs.append(_side_graph(src.shape, pl, itemsize, table,
                                  tuple(tuple(v) for v in vals)))
    # moves between placements (or one general redistribution on one placement)
    cross: dict[Node, list[tuple[Node, Step]]] = {}
    cross_in: dict[Node, list[tuple[Node, float]]] = {}
    if same:
        pairs = [(src.sbp, dst.sbp)]
    else:
        pairs = [(src.sbp, s2) for s2 in graphs[last].adj] + \
                [(s1, dst.sbp) for s1 in graphs[0].adj if s1 != src.sbp]
    for s1, s2 in pairs:
        o1, o2 = reduce_ops(s1), reduce_ops(s2)
        if len(o1) > 1 or len(o2) > 1 or (o1 and o2 and o1 != o2):
            continue
        l1 = Layout(src.shape, sides[0], s1)
        l2 = Layout(src.shape, sides[last], s2)
        steps = [send_recv_step(l1, l2, itemsize, table)]
        if not same and all(isinstance(x, Broadcast) for x in s1 + s2):
            b = _broadcast_step(l1, l2, itemsize, table)
            if b is not None:
                steps.append(b)
        for st in steps:
            cross.setdefault((0, s1), []).append(((last, s2), st))
            cross_in.setdefault((last, s2), []).append(((0, s1), st.seconds))

    def out_edges(n: Node) -> list[tuple[Node, Step]]:
        k, s = n
        own = [((k, t), st) for t, st in graphs[k].adj.get(s, ())]
        return own + cross.get(n, [])

    def in_edges(n: Node) -> list[tuple[Node, float]]:
        k, s = n
        return [((k, t), w) for t, w in graphs[k].radj.get(s, ())] + cross_in.get(n, [])

    # distances to the goal (reverse Dijkstra)
    dist: dict[Node, float] = {goal: 0.0}
    heap: list[tuple[float, int, Node]] = [(0.0, 0, goal)]
    tie = itertools.count(1)
    while heap:
        d, _, n = heapq.heappop(heap)
        if d > dist.get(n, math.inf):
            continue
        for m, w in in_edges(n):
            nd = d + w
            if nd < dist.get(m, math.inf):
                dist[m] = nd
                heapq.heappush(heap, (nd, next(tie), m))
    if start not in dist:
        raise RuntimeError(f"boxing found no plan from {src} to {dst} (internal error)")

    def follow(n: Node) -> list[Step]:
        path: list[Step] = []
        for _ in range(len(dist) + 1):
            if n == goal:
                return path
            m, st = min(out_edges(n), key=lambda e: _st_key(e, dist))
            path.append(st)
            n = m
        raise RuntimeError("boxing plan search did not converge (internal error)")

    cands: dict[tuple[Step, ...], Plan] = {}
    for m, st in out_edges(start):
        if m not in dist:
            continue
        path = tuple([st] + follow(m))
        cands.setdefault(path, Plan(src, dst, itemsize, path))
    # stable sort: ties keep the (deterministic) order of the first steps
    ranked = sorted(cands.values(), key=lambda p: (p.seconds, len(p.steps)))
    return PlanChoice(ranked[0], tuple(ranked[1:]))


def _st_key(e: tuple[Node, Step], dist: dict[Node, float]) -> tuple[float, int]:
    m, st = e
    return (st.seconds + dist.get(m, math.inf), 0 if st.kind in AXIS_KINDS else 1)


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
