"""Embedding lookup and its gradient (a scatter-add), with vocabulary-parallel rows.

``embedding(ids, weight, rows)`` gathers rows of ``weight`` (shape ``(V, D)``) at the
integer ``ids`` (any shape): the result has shape ``ids.shape + (D,)``. ``rows`` is
``arange(V)`` laid out like the weight's rows (``split(0)`` where the weight is split
on the vocabulary, broadcast elsewhere); it tells each rank which rows its shard of
the weight holds, which no kernel could know from the shard alone. ``sm.nn.embedding``
makes it.

On one mesh axis the ids may be split (each rank looks up its own ids), the weight split
on the embedding dim (the output is split on its last dim) or on the vocabulary (each
rank looks up the ids it owns and writes zeros elsewhere: the output is ``partial_sum``).
The gradient, ``embedding_backward``, mirrors these rows: with the vocabulary split each
rank adds the output gradient into the rows it owns, so the weight's gradient arrives in
the weight's layout and the weight is never gathered.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..core.dtypes import accumulation_dtype
from ..tensor import GlobalTensor
from .call import OpCall, tensor_arg
from .kernel import Scratch, take_into, written_into, zero_d
from .op import GlobalOp
from .signature import PMAX, PMIN, S_D, B, DimMatch, P, S, Signature

__all__ = ["EMBEDDING", "EMBEDDING_BACKWARD", "embedding", "embedding_backward"]

EMBEDDING = (  # (ids (...), weight (V, D), rows (V,)) -> (..., D)
    Signature((S_D, B, B), S_D),        # ids split: each rank looks up its own ids
    Signature((B, S(1), B), S(-1)),     # embedding dim split
    Signature((B, S(0), S(0)), P),      # vocabulary split: own rows, zeros elsewhere
    Signature((B, B, B), B),
    Signature((B, P, B), P),            # a lookup is linear in the weight...
    Signature((B, PMAX, B), PMAX),      # ...and selects values, so max/min pass through
    Signature((B, PMIN, B), PMIN),
)
EMBEDDING_BACKWARD = (  # (ids (...), g (..., D), rows (V,)) -> (V, D)
    Signature((S_D, S_D, B), P),        # ids split: each rank adds its ids' rows
    Signature((B, S(-1), B), S(1)),     # embedding dim split
    Signature((B, B, S(0)), S(0)),      # vocabulary split: each rank adds into its rows
    Signature((B, B, B), B),
    Signature((B, P, B), P),            # linear in g
)


def _check(name: str, ids: Any, table: Any, rows: Any, table_what: str
           ) -> tuple[GlobalTensor, GlobalTensor, GlobalTensor]:
    ids = tensor_arg(name, ids, "ids")
    table = tensor_arg(name, table, table_what)
    rows = tensor_arg(name, rows, "rows")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name}: ids must have an integer dtype, got {ids.dtype}")
    if rows.dtype.kind not in "iu" or rows.ndim != 1:
        raise TypeError(f"{name}: rows must be a 1-D integer tensor (arange of the "
                        f"vocabulary size), got dtype {rows.dtype} and shape {rows.shape}")
    return ids, table, rows


def _own_rows(xp: ModuleType, ids: Any, rows: Any, count: int, idx: Any, owned: Any,
              tmp: Any) -> None:
    """Indices into this rank's shard written into ``idx`` (int64; 0 where not owned), the
    mask of owned ids into ``owned``, and its negation into ``tmp``."""
    start = int(rows[0]) if rows.size else 0
    idx[...] = ids
    idx -= zero_d(xp, start, np.int64)
    xp.greater_equal(idx, zero_d(xp, 0, np.int64), out=owned)
    xp.less(idx, zero_d(xp, count, np.int64), out=tmp)
    owned &= tmp
    xp.logical_not(owned, out=tmp)
    xp.copyto(idx, zero_d(xp, 0, np.int64), where=tmp)


# The kernels write into their result and take their temporaries from ``scratch``: the
# eager kernels are these forms with new arrays (``written_into``), so eager and replayed
# results are bit-identical, and a replay of a captured step allocates nothing here.
def _build(ids: Any, weight: Any, rows: Any) -> OpCall:
    """Build the OpCall of ``embedding``."""
    ids, weight, rows = _check("embedding", ids, weight, rows, "weight")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), "
                         f"got shape {weight.shape}")
    vocab = weight.shape[0]
    if rows.shape != (vocab,):
        raise ValueError(f"embedding: rows has shape {rows.shape}, expected ({vocab},) for a "
                         f"weight of shape {weight.shape}")
    dtype = weight.dtype

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        a, w, r = local
        if a.size:
            lo, hi = (scratch.get(xp, (), a.dtype, i) for i in (0, 1))
            xp.min(a, out=lo)
            xp.max(a, out=hi)
            if int(lo) < 0 or int(hi) >= vocab:
                bad = int(lo) if int(lo) < 0 else int(hi)
                raise IndexError(f"embedding: index {bad} is out of range for a weight of "
                                 f"{vocab} rows")
        if w.shape[0] == vocab:
            take_into(xp, w, a, out, axis=0)
            return
        if w.shape[0] == 0:
            out[...] = zero_d(xp, 0, out.dtype)
            return
        idx = scratch.get(xp, a.shape, np.int64, 2)
        owned, tmp = (scratch.get(xp, a.shape, np.bool_, i) for i in (3, 4))
        _own_rows(xp, a, r, w.shape[0], idx, owned, tmp)
        take_into(xp, w, idx, out, axis=0)
        xp.copyto(out, zero_d(xp, 0, out.dtype), where=tmp[..., None])  # not this rank's

    kernel = written_into(into, dtype)

    dims = {"d": tuple(DimMatch((d, None, None), d) for d in range(ids.ndim))}
    return OpCall("embedding", (ids, weight, rows), EMBEDDING, dims,
                  ids.shape + (weight.shape[1],), dtype, kernel,
                  labels=("ids", "weight", "rows"))


def _build_backward(ids: Any, g: Any, rows: Any) -> OpCall:
    """Build the OpCall of ``embedding_backward``."""
    ids, g, rows = _check("embedding_backward", ids, g, rows, "g")
    if g.shape[:-1] != ids.shape or g.ndim != ids.ndim + 1:
        raise ValueError(f"embedding_backward: g has shape {g.shape}, expected ids' shape "
                         f"{ids.shape} and one more dim")
    vocab = rows.shape[0]
    dtype = g.dtype

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        a, gl, r = local
        out[...] = zero_d(xp, 0, out.dtype)
        if out.size == 0 or a.size == 0:
            return
        idx = scratch.get(xp, a.shape, np.int64, 0)
        owned, tmp = (scratch.get(xp, a.shape, np.bool_, i) for i in (1, 2))
        _own_rows(xp, a, r, shape[0], idx, owned, tmp)
        g2 = gl.reshape(-1, shape[1])
        if shape[0] == vocab:
            xp.add.at(out, idx.reshape(-1), g2)
            return
        # this rank owns some rows only: the others' ids add into one more row, dropped
        # (a masked selection would make new arrays; the owned rows add in the same order)
        acc = scratch.get(xp, (shape[0] + 1, shape[1]), out.dtype, 3)
        acc[...] = zero_d(xp, 0, out.dtype)
        xp.copyto(idx, zero_d(xp, shape[0], np.int64), where=tmp)
        xp.add.at(acc, idx.reshape(-1), g2)
        out[...] = acc[:-1]

    kernel = written_into(into, accumulation_dtype(dtype))

    dims = {"d": tuple(DimMatch((d, d, None), None) for d in range(ids.ndim))}
    return OpCall("embedding_backward", (ids, g, rows), EMBEDDING_BACKWARD, dims,
                  (vocab, g.shape[-1]), dtype, kernel, labels=("ids", "g", "rows"))


embedding = GlobalOp("embedding", _build, EMBEDDING, doc=(
    "``embedding(ids, weight, rows)``: ``weight[ids]`` for integer ``ids`` of any shape, "
    "with ``rows = arange(V)`` laid out like the weight's rows (``sm.nn.embedding`` makes "
    "it; signatures: ``embedding.table``)."))
embedding_backward = GlobalOp("embedding_backward", _build_backward, EMBEDDING_BACKWARD, doc=(
    "``embedding_backward(ids, g, rows)``: zeros of shape ``(V, D)`` with each row of "
    "``g`` added at its id: the gradient of embedding's weight."))
