"""Seeing where data lives: a text picture of which ranks hold which block.

``sm.visualize(x)`` draws, for a 1-D or 2-D global tensor, the grid of blocks its
layout cuts the tensor into, with the row and column ranges of each block and the
ranks that hold it, in the spirit of ``jax.debug.visualize_array_sharding``. It reads
only the layout (shape, placement, SBP): nothing is gathered or communicated.

In a cell, ``0,2`` means ranks 0 and 2 each hold a copy of the block (broadcast);
``0+1`` means the block is the elementwise sum of the arrays of ranks 0 and 1
(``partial_sum``; ``max(0,1)`` and ``min(0,1)`` for ``partial_max`` / ``partial_min``).

When the placement spans several hosts (nodes), a line lists the ranks of each node and
host boundaries are drawn with ``#`` between columns and ``=`` between rows: the blocks on
either side are held on different hosts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from .core.layout import Layout
from .core.sbp import Broadcast, Partial, Split

__all__ = ["visualize", "render", "block_owners"]


def block_owners(layout: Layout) -> dict[tuple[tuple[int, int], ...], str]:
    """Map each block's ``(start, stop)`` per dim to the expression of the ranks holding it.

    Expressions follow the mesh axes outermost first: a split axis picks one block, a
    broadcast axis lists copies (``a,b``), a partial axis combines operands (``a+b``).
    """
    pl = layout.placement
    out: dict[tuple[tuple[int, int], ...], str] = {}
    for rank in pl.rank_list:
        ranges = layout.local_ranges(rank)
        assert ranges is not None
        if ranges in out:
            continue
        coord = pl.coord_of(rank)
        assert coord is not None
        out[ranges] = _expr(layout, list(coord), 0, top=True)
    return out


def _expr(layout: Layout, coord: list[int], axis: int, top: bool = False) -> str:
    pl = layout.placement
    if axis == pl.ndim:
        return str(pl.rank_at(coord))
    s = layout.sbp[axis]
    if isinstance(s, Split) or pl.hierarchy[axis] == 1:
        return _expr(layout, coord, axis + 1, top)
    parts = []
    for i in range(pl.hierarchy[axis]):
        c = list(coord)
        c[axis] = i
        parts.append(_expr(layout, c, axis + 1))
    if isinstance(s, Broadcast):
        text = ",".join(parts)
        return text if top else f"({text})"
    assert isinstance(s, Partial)
    if s.op == "sum":
        text = "+".join(parts)
        return text if top else f"({text})"
    return f"{s.op}({','.join(parts)})"


def _cuts(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The distinct non-empty ranges of one dim, in order (they tile ``[0, n)``)."""
    return sorted({r for r in ranges if r[1] > r[0]})


def _rng(r: tuple[int, int]) -> str:
    return f"{r[0]}:{r[1]}"


def _legend(layout: Layout) -> str:
    notes = []
    kinds = {type(s) for s in layout.sbp}
    if Broadcast in kinds:
        notes.append("a,b = copies (broadcast)")
    for op in sorted({s.op for s in layout.sbp if isinstance(s, Partial)}):
        notes.append("a+b = elementwise sum of the ranks' arrays (partial_sum)" if op == "sum"
                     else f"{op}(a,b) = elementwise {op} of the ranks' arrays (partial_{op})")
    return "; ".join(notes)


def _box(header: list[str], rows: list[tuple[str, list[str]]],
         col_breaks: frozenset[int] = frozenset(),
         row_breaks: frozenset[int] = frozenset()) -> list[str]:
    """A table with a header row and one row per row block; cells centred. A host
    boundary before column ``j`` (``col_breaks``) is drawn ``#``, after row ``i``
    (``row_breaks``) ``=``."""
    ncol = len(header)
    lw = max([len(r[0]) for r in rows] + [0])
    widths = [max([len(header[j])] + [len(r[1][j]) for r in rows]) + 2 for j in range(ncol)]

    def sep(fill: str) -> str:
        return " " * lw + " +" + "+".join(fill * w for w in widths) + "+"

    def bar(j: int) -> str:
        return "#" if j in col_breaks else "|"

    lines = [" " * lw + "  " + " ".join(h.center(w) for h, w in zip(header, widths)), sep("-")]
    for i, (label, cells) in enumerate(rows):
        lines.append(label.rjust(lw) + " |" + "".join(
            (bar(j) if j else "") + c.center(w)
            for j, (c, w) in enumerate(zip(cells, widths))) + "|")
        lines.append(sep("=" if i in row_breaks else "-"))
    return lines


def _hosts_line(layout: Layout, nodes: Sequence[int]) -> str | None:
    """``hosts: node 0 ranks 0,1; node 1 ranks 2,3``, or None when the placement's ranks
    are on one host."""
    by: dict[int, list[int]] = {}
    for r in layout.placement.rank_list:
        by.setdefault(nodes[r], []).append(r)
    if len(by) < 2:
        return None
    return ("hosts: " + "; ".join(f"node {k} ranks {','.join(str(r) for r in rs)}"
                                  for k, rs in sorted(by.items()))
            + " (# between columns, = between rows: a host boundary)")


def _breaks(cuts: list[tuple[int, int]], hosts_of: Any) -> frozenset[int]:
    """Indices ``j`` where block ``j`` is held on other hosts than block ``j - 1``."""
    return frozenset(j for j in range(1, len(cuts)) if hosts_of(cuts[j]) != hosts_of(cuts[j - 1]))


def render(layout: Layout, dtype: Any = None, nodes: Sequence[int] | None = None) -> str:
    """The picture of ``layout`` as text (pure: no MPI, no data). ``nodes``: the node
    (host) of every world rank, to mark host boundaries (none marked without it)."""
    pl = layout.placement
    sbp = ", ".join(str(s) for s in layout.sbp)
    dt = f" {np.dtype(dtype)}" if dtype is not None else ""
    head = (f"global tensor {layout.shape}{dt} on {pl.type} ranks {pl.ranks.tolist()} "
            f"(mesh {pl.hierarchy}), sbp=({sbp})")
    owners = block_owners(layout)
    empty = [r for r in pl.rank_list
             if any(b <= a for a, b in (layout.local_ranges(r) or ()))]
    lines = [head]
    if nodes is not None and max(pl.rank_list) >= len(nodes):
        nodes = None  # a layout of a larger world than the one given: no hosts known
    hosts = _hosts_line(layout, nodes) if nodes is not None else None
    if hosts:
        lines.append(hosts)
    held: dict[tuple[tuple[int, int], ...], frozenset[int]] = {}
    if hosts and nodes is not None:
        for r in pl.rank_list:
            rr = layout.local_ranges(r)
            assert rr is not None
            held[rr] = held.get(rr, frozenset()) | {nodes[r]}
    nd = layout.ndim
    if nd == 0:
        lines.append(f"scalar held by {owners[()]}")
    elif nd in (1, 2):
        full = {k: v for k, v in owners.items() if all(b > a for a, b in k)}
        if not full:
            lines.append("(the tensor has no elements)")
        elif nd == 1:
            cols = _cuts([k[0] for k in full])
            lines += _box([_rng(c) for c in cols], [("", [full[(c,)] for c in cols])],
                          _breaks(cols, lambda c: held.get((c,))))
        else:
            rows = _cuts([k[0] for k in full])
            cols = _cuts([k[1] for k in full])

            def col_hosts(c: tuple[int, int]) -> tuple[Any, ...]:
                return tuple(held.get((r, c)) for r in rows)

            def row_hosts(r: tuple[int, int]) -> tuple[Any, ...]:
                return tuple(held.get((r, c)) for c in cols)

            row_breaks = frozenset(j - 1 for j in _breaks(rows, row_hosts))
            lines += _box([_rng(c) for c in cols],
                          [(_rng(r), [full.get((r, c), "?") for c in cols]) for r in rows],
                          _breaks(cols, col_hosts), row_breaks)
        if nd == 2 and full:
            lines.append("rows down, columns across; each cell names the ranks holding the block")
        elif full:
            lines.append("element ranges across; each cell names the ranks holding the block")
    else:
        lines.append(f"{nd}-d tensor: blocks listed (the grid picture shows 1-D and 2-D tensors)")
        for k, v in sorted(owners.items()):
            if all(b > a for a, b in k):
                lines.append(f"  [{', '.join(_rng(r) for r in k)}]  held by {v}")
    if empty:
        lines.append(f"ranks holding an empty block: {','.join(str(r) for r in empty)}")
    legend = _legend(layout)
    if legend:
        lines.append(legend)
    return "\n".join(line.rstrip() for line in lines)


def visualize(x: Any, *, rank: int | None = 0, file: IO[str] | None = None) -> str:
    """Print which ranks hold which block of the global tensor ``x``; return the text.

    Where the placement spans hosts, host boundaries are marked (see the module
    docstring).

    Parameters
    ----------
    x : GlobalTensor or Layout
        The tensor to draw (only its layout is read; no communication).
    rank : int or None
        The world rank that prints (default 0); None prints on every rank. Every rank
        returns the text.
    file : text stream, optional
        Where to print (default ``sys.stdout``).
    """
    from .env import get_rank, topology
    from .tensor import GlobalTensor

    if isinstance(x, GlobalTensor):
        text = render(x.layout, x.dtype, topology())
    elif isinstance(x, Layout):
        text = render(x, nodes=topology())
    else:
        raise TypeError(f"visualize takes a GlobalTensor or a Layout, got {type(x).__name__}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise TypeError(f"rank must be an int or None, got {type(rank).__name__} {rank!r}")
    if rank is None or get_rank() == rank:
        print(text, file=file or sys.stdout, flush=True)
    return text
