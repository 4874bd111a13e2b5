"""Reductions of half-width values (float16, bfloat16) that keep the sum.

MPI has no float16 or bfloat16 addition; an emulated per-element MPI operation would add
in half width at every step of the reduction tree, in Python. Here the blocks travel in
half width (half the bytes of float32) and each rank sums the blocks it owns in float32,
rounding once:

- reduce-scatter: one all-to-all of the half-width blocks, then the float32 sum of the
  rank's own block and the blocks received (:func:`accumulate`);
- all-reduce: that reduce-scatter over a flat cut of the buffer into ``p`` near-equal
  pieces, then a half-width all-gather of the rounded pieces
  (:meth:`HalfWidthReduction.all_reduce`): the bytes of a ring all-reduce.

``max`` and ``min`` are exact in any width: they reduce the half-width blocks directly.
The cost model charges these schedules (:func:`sbpmpi.boxing.cost.half_width_seconds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import backend, comm
from ..core.dtypes import float32
from ..core.layout import balanced_range
from ..core.reduction import reduction

__all__ = ["HalfWidthReduction", "accumulate"]


def accumulate(xp: Any, ufunc: Any, own: Any, parts: Sequence[Any], op: str) -> Any:
    """``own`` reduced with ``parts`` by ``ufunc``: in float32 for a sum (one rounding back
    to the half dtype by the caller's assignment), in the dtype itself for max and min."""
    # arrays from backend.empty: a captured graph's conversion gets the same ones again
    # (backend.Reuse), so its replays make none
    if op != "sum":
        acc = backend.empty(xp, own.shape, own.dtype)
        acc[...] = own
        for part in parts:
            ufunc(acc, part, out=acc)
        return acc
    acc = backend.empty(xp, own.shape, float32)
    acc[...] = own
    wide = None
    for part in parts:
        if wide is None or wide.shape != part.shape:
            wide = backend.empty(xp, part.shape, float32)
        wide[...] = part  # exact: float32 holds every half-width value
        acc += wide
    return acc


class HalfWidthReduction:
    """The all-reduce of a half-width buffer over ``group`` (``p`` ranks; this rank is
    number ``k`` in it) by partial ``op``."""

    def __init__(self, xp: Any, group: comm.Group, p: int, k: int, op: str) -> None:
        self.xp, self.group, self.p, self.k, self.op = xp, group, p, k, op
        self.ufunc = reduction(op).ufunc_of(xp)

    def all_reduce(self, a: Any) -> Any:
        """A new array: ``a`` reduced over the group, every rank alike."""
        xp, p, k = self.xp, self.p, self.k
        flat = xp.ascontiguousarray(a).reshape(-1)
        n = flat.size
        cuts = [balanced_range(n, p, q) for q in range(p)]
        counts = [hi - lo for lo, hi in cuts]
        lo, hi = cuts[k]
        mine = counts[k]
        # every piece but this rank's own to its owner; this rank gets its piece from each
        send_counts = [0 if q == k else c for q, c in enumerate(counts)]
        recv_counts = [0 if q == k else mine for q in range(p)]
        send_displs = [lo_q for lo_q, _ in cuts]
        recv_displs = [0] * p
        off = 0
        for q in range(p):
            recv_displs[q] = off
            off += recv_counts[q]
        rbuf = backend.empty(xp, off, flat.dtype)
        if p > 1:
            comm.all_to_all_v(rbuf, recv_counts, flat, send_counts, recv_displs, send_displs,
                              self.group)
        parts = [rbuf[recv_displs[q]:recv_displs[q] + mine] for q in range(p) if q != k]
        piece = backend.empty(xp, mine, flat.dtype)
        piece[...] = accumulate(xp, self.ufunc, flat[lo:hi], parts, self.op)
        out = backend.empty(xp, a.shape, a.dtype)
        if p > 1:
            comm.all_gather_v(out.reshape(-1), piece, counts, None, self.group)
        else:
            out.reshape(-1)[...] = piece
        return out
