"""``tril`` and ``triu``: keep the lower or upper triangle of the last two dims.

A shard needs the global row and column numbers of its elements. They come in as two
more operands, ``arange`` columns laid out like the tensor's last two dims (built on
each rank without communication), so a split of rows or columns passes through with
exact uneven blocks and nothing is gathered. Zeroing entries is linear and leaves 0 in
every operand of a partial value, so each partial kind passes through as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from .. import backend
from ..core.layout import Layout
from ..core.sbp import Broadcast, Split
from ..env import get_rank
from ..tensor import GlobalTensor
from .call import OpCall, tensor_arg
from .elementwise import broadcast_matches
from .op import GlobalOp
from .signature import PMAX, PMIN, S_D, B, P, Signature

__all__ = ["TRIANGLE", "tril", "triu", "global_index"]

TRIANGLE = (  # (x, row numbers (m, 1), column numbers (1, n)) -> x's shape
    Signature((S_D, S_D, S_D), S_D),
    Signature((B, B, B), B),
    Signature((P, B, B), P),
    Signature((PMAX, B, B), PMAX),
    Signature((PMIN, B, B), PMIN),
)


def global_index(x: GlobalTensor, dim: int) -> GlobalTensor:
    """The numbers ``0 .. x.shape[dim] - 1`` along ``dim`` (size 1 on every other dim of
    x's last two), split wherever x splits ``dim`` and broadcast elsewhere: each shard
    holds the global indices of x's shard. No communication."""
    n = x.ndim
    shape = tuple(x.shape[k] if k == dim else 1 for k in range(n - 2, n))
    sbp = tuple(Split(dim - (n - 2)) if isinstance(s, Split) and s.dim == dim else Broadcast()
                for s in x.sbp)
    lay = Layout(shape, x.placement, sbp)
    me = get_rank()
    sl = lay.local_slice(me)
    if sl is None:
        return GlobalTensor(np.empty(lay.local_shape(me), dtype=np.int64), lay,
                            np.dtype(np.int64))
    xp = backend.get_xp(x.placement.type)
    whole = xp.arange(x.shape[dim], dtype=xp.int64).reshape(shape)
    return GlobalTensor(xp.ascontiguousarray(whole[sl]), lay, np.dtype(np.int64))


def _triangle(name: str, lower: bool) -> GlobalOp:
    def build(x: Any, diagonal: Any = 0) -> OpCall:
        x = tensor_arg(name, x)
        if x.ndim < 2:
            raise ValueError(f"{name}: x has shape {x.shape}; it needs at least 2 dims")
        if isinstance(diagonal, (bool, np.bool_)) or not isinstance(diagonal, (int, np.integer)):
            raise TypeError(f"{name}: diagonal must be an int, got {type(diagonal).__name__} "
                            f"{diagonal!r}")
        k = int(diagonal)
        rows, cols = global_index(x, x.ndim - 2), global_index(x, x.ndim - 1)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
            a, r, c = local
            keep = (c - r <= k) if lower else (c - r >= k)
            return xp.where(keep, a, xp.zeros((), dtype=a.dtype))

        dims = {"d": broadcast_matches([x.shape, rows.shape, cols.shape], x.shape)}
        return OpCall(name, (x, rows, cols), TRIANGLE, dims, x.shape, x.dtype, kernel,
                      params=f"diagonal={k}", labels=("x", "rows", "cols"))

    build.__doc__ = f"Build the OpCall of ``{name}``."
    part = "lower" if lower else "upper"
    rel = "<=" if lower else ">="
    return GlobalOp(name, build, TRIANGLE, fast=False, doc=(
        f"``{name}(x, diagonal=0)``: the {part} triangle of the last two dims (entries "
        f"with column - row {rel} ``diagonal``), zeros elsewhere (signatures: "
        f"``{name}.table``)."))


tril = _triangle("tril", lower=True)
triu = _triangle("triu", lower=False)
