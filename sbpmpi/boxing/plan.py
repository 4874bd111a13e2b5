"""Boxing plans: the primitive steps that turn one layout into another (pure metadata).

A :class:`Plan` is an ordered tuple of frozen :class:`Step` records. Each step changes
the layout of the tensor in one well-defined way:

=================  =======================  ===========================================
kind               change                   what the ranks do
=================  =======================  ===========================================
local_slice        B -> S(d) on one axis    keep this rank's block (no communication)
local_fill         B -> P(op) on one axis   ranks off index 0 hold the op's identity
local_pad          S(d) -> P(op)            own block in an identity-filled tensor
relabel            any, on an axis of 1     nothing: one rank, same data
all_gather         S(d) -> B                all-gather(v) along the mesh axis (or axes)
all_reduce         P(op) -> B               all-reduce along the mesh axis (or axes)
reduce_scatter     P(op) -> S(d)            reduce-scatter(v) along the mesh axis (or axes)
all_to_all         S(i) -> S(j)             all-to-all(v) along the mesh axis
broadcast          B.. -> B.. (placements)  broadcast from one source rank
send_recv          any -> any (placements)  point-to-point blocks, then a local reduce
                                            of partial contributions if there are several
=================  =======================  ===========================================

An all_gather, all_reduce or reduce_scatter step whose groups span hosts may run
*hierarchically* (``Step.hosts`` set, named ``hier_<kind>``): inside each host and across
hosts in turn, each rank crossing with the ranks of the same local index on the other
hosts (all_reduce: reduce-scatter inside, all-reduce across on 1/m of the data,
all-gather inside; reduce_scatter: inside, then across; all_gather: across, then
inside). The SBP change is the step's kind's; only the collectives differ.

This module holds the steps, the rules saying which single-step changes are valid
(:func:`transition_kind`, :func:`span_kind`), which conversions have a meaning
(:func:`why_meaningless`) and the symbolic application of a plan (:func:`modelled_result`).
:mod:`.planner` searches for the cheapest plan; :mod:`.schedule` computes the blocks a
point-to-point step moves. Everything is a pure function of metadata.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.layout import Layout
from ..core.placement import Placement
from ..core.sbp import SBP, Broadcast, NdSbp, Partial, Split

__all__ = [
    "STEP_KINDS",
    "AXIS_KINDS",
    "CROSS_KINDS",
    "Box",
    "Step",
    "Plan",
    "PlanChoice",
    "check_conversion",
    "why_meaningless",
    "transition_kind",
    "span_kind",
    "group_of",
    "modelled_result",
    "max_local_extents",
]

AXIS_KINDS = ("local_slice", "local_fill", "local_pad", "relabel", "all_gather", "all_reduce",
              "reduce_scatter", "all_to_all")
CROSS_KINDS = ("broadcast", "send_recv")
STEP_KINDS = AXIS_KINDS + CROSS_KINDS

Box = tuple[tuple[int, int], ...]


# -- layout helpers ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=8192)
def max_local_extents(layout: Layout) -> tuple[int, ...]:
    """Largest local extent of each tensor dim over the ranks of ``layout``'s placement."""
    ext = list(layout.shape)
    h = layout.placement.hierarchy
    for a, s in enumerate(layout.sbp):
        if isinstance(s, Split):
            ext[s.dim] = -(-ext[s.dim] // h[a])
    return tuple(ext)


def group_of(pl: Placement, rank: int, axis: int, span: int = 1) -> tuple[int, ...]:
    """The ranks ``rank`` communicates with in a step on ``axis .. axis + span - 1``
    (:meth:`Placement.axis_group`)."""
    return pl.axis_group(rank, axis, span)


def _later_split(sbp: NdSbp, axis: int, dim: int) -> bool:
    return any(isinstance(s, Split) and s.dim == dim for s in sbp[axis + 1:])


def _inner_ops_match(sbp: NdSbp, axis: int, op: str) -> bool:
    return all(s.op == op for s in sbp[axis + 1:] if isinstance(s, Partial))


def reduce_ops(sbp: NdSbp) -> set[str]:
    return {s.op for s in sbp if isinstance(s, Partial)}


def transition_kind(sbp: NdSbp, hierarchy: Sequence[int], axis: int, to: SBP) -> str | None:
    """The step kind that changes mesh ``axis`` of ``sbp`` to ``to`` alone, or None.

    A split of dim d can change on one axis only when no later mesh axis splits d (a
    later split subdivides this axis's blocks). A partial axis can be reduced only when
    every later partial axis reduces with the same op (they must be reduced first).
    """
    u = sbp[axis]
    if u == to:
        return None
    if hierarchy[axis] == 1:
        return "relabel"
    if isinstance(u, Split):
        if _later_split(sbp, axis, u.dim):
            return None
        if isinstance(to, Broadcast):
            return "all_gather"
        if isinstance(to, Split):
            return None if _later_split(sbp, axis, to.dim) else "all_to_all"
        return "local_pad"
    if isinstance(u, Broadcast):
        if isinstance(to, Split):
            return None if _later_split(sbp, axis, to.dim) else "local_slice"
        return "local_fill"
    assert isinstance(u, Partial)
    if isinstance(to, Partial) or not _inner_ops_match(sbp, axis, u.op):
        return None
    if isinstance(to, Broadcast):
        return "all_reduce"
    return None if _later_split(sbp, axis, to.dim) else "reduce_scatter"


def span_kind(sbp: NdSbp, hierarchy: Sequence[int], first: int, last: int,
              to: SBP) -> str | None:
    """The kind of one collective over mesh axes ``first..last`` (all holding the same SBP,
    every axis going to ``to``), or None.

    Such a group behaves as one flattened axis of their ranks in row-major order: nested
    splits of one dim over consecutive axes are consecutive blocks. Gathers, reductions
    and reduce-scatters only; the conditions are those of a single axis, for ``last``.
    """
    u = sbp[first]
    if last <= first or u == to or any(x != u for x in sbp[first:last + 1]):
        return None
    if any(hierarchy[k] == 1 for k in range(first, last + 1)):
        return None  # relabel those axes instead
    if isinstance(u, Split):
        if isinstance(to, Broadcast) and not _later_split(sbp, last, u.dim):
            return "all_gather"
        return None
    if not isinstance(u, Partial) or isinstance(to, Partial) or \
            not _inner_ops_match(sbp, last, u.op):
        return None
    if isinstance(to, Broadcast):
        return "all_reduce"
    return None if _later_split(sbp, last, to.dim) else "reduce_scatter"


# -- what may be converted ---------------------------------------------------------------------

def why_meaningless(src: Layout, dst: Layout) -> str | None:
    """Why ``src`` -> ``dst`` has no meaning, or None when it has one.

    A partial tensor's value is the reduction of its shards; turning it into a partial
    of another reduction (partial_max to partial_sum, say) would have to invent new
    shards, so when both sides have partial axes they must all use one op. Mixed ops on
    one side are fine when the other side has no partial axis, or when the destination
    (on the same placement) only reduces some of the source's partial axes.
    """
    so, do = reduce_ops(src.sbp), reduce_ops(dst.sbp)
    if not so or not do or len(so | do) == 1:
        return None
    if src.placement == dst.placement and all(
            not isinstance(t, Partial) or s == t for s, t in zip(src.sbp, dst.sbp)):
        return None
    a = "/".join(f"partial_{o}" for o in sorted(so))
    b = "/".join(f"partial_{o}" for o in sorted(do))
    return (f"cannot convert {a} to {b}: a partial tensor can only become a partial of the "
            f"same reduction; convert to broadcast (or a split) first if you mean to reduce "
            f"it, then to {b}")


def check_conversion(src: Layout, dst: Layout) -> None:
    """Raise ValueError unless ``src`` can be converted to ``dst``."""
    if not isinstance(src, Layout) or not isinstance(dst, Layout):
        raise TypeError(f"src and dst must be Layouts, got {type(src).__name__} and "
                        f"{type(dst).__name__}")
    if src.shape != dst.shape:
        raise ValueError(f"boxing keeps the global shape, but the source has shape {src.shape} "
                         f"and the destination {dst.shape}")
    why = why_meaningless(src, dst)
    if why is not None:
        raise ValueError(why)


# -- steps and plans ---------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Step:
    """One primitive of a plan (plain data; see the module docstring for the kinds), made
    with keywords: ``Step(kind="all_gather", src=..., dst=..., axis=0, ...)``.

    ``axis``, ``frm`` and ``to``: the mesh axis and its SBP before and after (per-axis
    kinds); ``span`` > 1: the step acts on axes ``axis .. axis + span - 1`` at once, as
    one collective over their ranks (row-major), each going from ``frm`` to ``to``. ``op``: the reduction (all_reduce, reduce_scatter, the local reduce of
    send_recv) or the partial created (local_fill, local_pad). ``root``: the source
    world rank of a broadcast. ``groups``: the communicators (world ranks) it runs on.
    Byte counts are per rank, for the busiest rank; ``seconds`` is the modelled time.
    """

    kind: str
    src: Layout
    dst: Layout
    axis: int | None = None
    frm: SBP | None = None
    to: SBP | None = None
    op: str | None = None
    root: int | None = None
    groups: tuple[tuple[int, ...], ...] = ()
    send_bytes: int = 0
    recv_bytes: int = 0
    copy_bytes: int = 0
    messages: int = 0
    seconds: float = 0.0
    span: int = 1
    hosts: tuple[tuple[tuple[int, ...], ...], ...] = ()

    @property
    def axes(self) -> tuple[int, ...]:
        """The mesh axes the step acts on."""
        return () if self.axis is None else tuple(range(self.axis, self.axis + self.span))

    @property
    def axis_label(self) -> str:
        if self.axis is None:
            return "-"
        return str(self.axis) if self.span == 1 else f"{self.axis}-{self.axis + self.span - 1}"

    def apply(self, layout: Layout) -> Layout:
        """The layout after this step, computed from the step's parameters alone."""
        if self.kind in CROSS_KINDS:
            if layout != self.src:
                raise ValueError(f"{self.kind} step expects {self.src}, got {layout}")
            if self.kind == "broadcast" and not (
                    all(isinstance(s, Broadcast) for s in self.src.sbp)
                    and all(isinstance(s, Broadcast) for s in self.dst.sbp)):
                raise ValueError("a broadcast step needs broadcast layouts on both sides")
            return self.dst
        assert self.axis is not None and self.to is not None
        if layout.placement != self.src.placement:
            raise ValueError(f"{self.kind} step runs on {self.src.placement!r}, "
                             f"got a layout on {layout.placement!r}")
        a, b = self.axis, self.axis + self.span
        if any(x != self.frm for x in layout.sbp[a:b]):
            raise ValueError(f"{self.kind} step expects {self.frm} on mesh axes "
                             f"{self.axis_label}, got {sbp_text(layout.sbp[a:b])}")
        h = layout.placement.hierarchy
        kind = (transition_kind(layout.sbp, h, a, self.to) if self.span == 1
                else span_kind(layout.sbp, h, a, b - 1, self.to))
        if kind != self.kind:
            raise ValueError(f"{self.frm} -> {self.to} on mesh axes {self.axis_label} of "
                             f"{sbp_text(layout.sbp)} is a {kind} step, not {self.kind}")
        sbp = layout.sbp[:a] + (self.to,) * self.span + layout.sbp[b:]
        return Layout(layout.shape, layout.placement, sbp)

    @property
    def name(self) -> str:
        """The primitive, with (v) where block sizes differ."""
        if not self.hosts and self.kind in ("all_gather", "reduce_scatter", "all_to_all") \
                and self._uneven():
            return f"{self.kind}_v"
        if self.kind == "send_recv" and self.op is not None:
            return f"send_recv+reduce({self.op})"
        if self.hosts:
            return f"hier_{self.kind}" + ("_v" if self.kind != "all_reduce"
                                          and self._uneven() else "")
        return self.kind

    def communicators_text(self) -> str:
        """The groups it runs on; for a hierarchical step, inside and across hosts."""
        if self.hosts:
            inside = " ".join(str(list(h)) for g in self.hosts for h in g)
            across = " ".join(str([h[j] for h in g]) for g in self.hosts
                              for j in range(len(g[0])))
            return f"inside hosts {inside}; across {across}"
        return " ".join(str(list(g)) for g in self.groups) or "-"

    def _uneven(self) -> bool:
        assert self.axis is not None
        a, b = self.axis, self.axis + self.span
        p = math.prod(self.src.placement.hierarchy[a:b])
        dims = [s.dim for s in (self.frm, self.to) if isinstance(s, Split)]
        full = max_local_extents(Layout(self.src.shape, self.src.placement,
                                        self.src.sbp[:a] + (Broadcast(),) * self.span
                                        + self.src.sbp[b:]))
        return any(full[d] % p for d in dims)

    def change_text(self) -> str:
        """What changes, e.g. ``S(0) -> B`` or the two layouts of a cross-placement step."""
        if self.kind in CROSS_KINDS:
            return (f"{sbp_text(self.src.sbp)} on {ranks_text(self.src.placement)} -> "
                    f"{sbp_text(self.dst.sbp)} on {ranks_text(self.dst.placement)}")
        return f"{self.frm} -> {self.to}"

    def short(self) -> str:
        if self.kind in CROSS_KINDS:
            return f"{self.name}[{self.change_text()}]"
        word = "axis" if self.span == 1 else "axes"
        return f"{self.name}({word} {self.axis_label}: {self.change_text()})"


def sbp_text(sbp: NdSbp) -> str:
    return "(" + ", ".join(str(s) for s in sbp) + ")"


def ranks_text(pl: Placement) -> str:
    return f"{pl.type}{pl.ranks.tolist()}"


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def format_seconds(s: float) -> str:
    if s == 0:
        return "0"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


@dataclass(frozen=True)
class Plan:
    """An ordered tuple of steps converting ``src`` to ``dst`` for items of ``itemsize`` bytes."""

    src: Layout
    dst: Layout
    itemsize: int
    steps: tuple[Step, ...]

    @property
    def seconds(self) -> float:
        """Modelled time of the whole plan."""
        return sum(s.seconds for s in self.steps)

    def summary(self) -> str:
        """The steps on one line."""
        return " -> ".join(s.short() for s in self.steps) if self.steps else "(nothing to do)"

    def table(self) -> str:
        """The steps as a table."""
        head = ("#", "step", "mesh axis", "change", "communicators", "send/rank", "recv/rank",
                "est. time")
        rows = [head]
        for i, s in enumerate(self.steps, 1):
            if s.kind == "send_recv":
                comms = f"point to point, {s.messages} message{'s' if s.messages != 1 else ''}/rank"
                change = (f"{sbp_text(s.src.sbp)} -> {sbp_text(s.dst.sbp)} on "
                          f"{ranks_text(s.dst.placement)}")
            else:
                comms = s.communicators_text()
                change = s.change_text() if s.kind != "broadcast" else (
                    f"from rank {s.root} to {ranks_text(s.dst.placement)}")
            rows.append((str(i), s.name, s.axis_label, change, comms,
                         _fmt_bytes(s.send_bytes), _fmt_bytes(s.recv_bytes),
                         format_seconds(s.seconds)))
        if not self.steps:
            return "  (nothing to do: the layouts are equal)"
        widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
        right = {0, 5, 6, 7}
        return "\n".join("  " + "  ".join(cell.rjust(w) if c in right else cell.ljust(w)
                                           for c, (cell, w) in enumerate(zip(r, widths))).rstrip()
                         for r in rows)

    def __str__(self) -> str:
        return (f"boxing plan {self.src} -> {sbp_text(self.dst.sbp)} on "
                f"{ranks_text(self.dst.placement)}, {self.itemsize}-byte items, est. "
                f"{format_seconds(self.seconds)}\n{self.table()}")


@dataclass(frozen=True)
class PlanChoice:
    """The chosen plan and the rejected candidates (cheapest first)."""

    chosen: Plan
    rejected: tuple[Plan, ...]


def modelled_result(plan: Plan, start: Layout | None = None) -> Layout:
    """Apply the plan's steps symbolically to ``start`` (its source by default)."""
    layout = plan.src if start is None else start
    for s in plan.steps:
        layout = s.apply(layout)
    return layout
