"""Reference conversion: assemble the whole global value, then re-slice.

Correct for every layout and simple to read; the planned boxing engine is
checked against it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..core.layout import Layout
from ..core.reduction import identity_value, reduction
from ..core.sbp import Broadcast, Partial, Split

__all__ = ["assemble", "slice_for"]


def _reduce(xp: ModuleType, op: str, parts: list[Any]) -> Any:
    out = parts[0].copy()
    f = reduction(op).ufunc_of(xp)
    for p in parts[1:]:
        f(out, p, out=out)  # the sum of bools is "or" (NumPy's and CuPy's add)
    return out


def assemble(xp: ModuleType, layout: Layout, shards: dict[int, Any]) -> Any:
    """Global value from the shard of every rank of ``layout.placement`` (world rank -> array).

    Mesh axis 0 is outermost: a split concatenates, a broadcast takes index 0,
    a partial reduces the sub-values of the sub-meshes.
    """
    pl = layout.placement

    def rec(axis: int, prefix: tuple[int, ...]) -> Any:
        if axis == pl.ndim:
            return shards[pl.rank_at(prefix)]
        s = layout.sbp[axis]
        n = pl.hierarchy[axis]
        if isinstance(s, Broadcast):
            return rec(axis + 1, prefix + (0,))
        parts = [rec(axis + 1, prefix + (i,)) for i in range(n)]
        if isinstance(s, Split):
            return xp.concatenate(parts, axis=s.dim)
        assert isinstance(s, Partial)
        return _reduce(xp, s.op, parts)

    return rec(0, ())


def slice_for(xp: ModuleType, value: Any, layout: Layout, rank: int) -> Any:
    """This ``rank``'s shard of the global ``value`` under ``layout`` (a new array).

    Partial axes keep the value at index 0 and the reduction's identity elsewhere.
    """
    sl = layout.local_slice(rank)
    if sl is None:
        return xp.empty(layout.local_shape(rank), dtype=value.dtype)
    part = xp.ascontiguousarray(value[sl])
    op = layout.identity_op(rank)
    if op is not None:
        part = xp.full(part.shape, identity_value(op, value.dtype), dtype=value.dtype)
    return part
