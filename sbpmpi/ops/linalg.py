"""Matrix product of global tensors (2-D and batched, NumPy ``matmul`` semantics)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..core.sbp import Split
from ..tensor import GlobalTensor
from .call import OpCall, arg_summary, probe_dtype
from .kernel import with_into
from .op import GlobalOp
from .signature import AnySplit, B, DimMatch, P, S, Signature

__all__ = ["MATMUL", "MATMUL_MV", "MATMUL_VM", "MATMUL_VV", "MATMUL_TABLES", "matmul", "matmul_tn",
           "matmul_nt", "batch_matches", "local_matmul"]

S_BATCH = AnySplit("batch")

# a: (..., m, k) @ b: (..., k, n) -> (..., m, n); S(-2) is the second-to-last dim of that operand.
MATMUL = (
    Signature((S(-2), B), S(-2)),          # rows of a: data parallel
    Signature((B, S(-1)), S(-1)),          # columns of b: model parallel
    Signature((S(-1), S(-2)), P),          # the contracted dim k: partial sums
    Signature((P, B), P),
    Signature((B, P), P),
    Signature((B, B), B),
    Signature((S_BATCH, S_BATCH), S_BATCH),  # batch dims pass through
)
# NumPy's 1-D operands: a vector on the left is a row (its one dim is k, the output has no
# m), a vector on the right a column (its one dim is k, the output has no n).
MATMUL_MV = (  # a: (..., m, k) @ v: (k,) -> (..., m)
    Signature((S(-2), B), S(-1)),
    Signature((S(-1), S(0)), P),
    Signature((P, B), P),
    Signature((B, P), P),
    Signature((B, B), B),
    Signature((S_BATCH, S_BATCH), S_BATCH),
)
MATMUL_VM = (  # v: (k,) @ b: (..., k, n) -> (..., n)
    Signature((B, S(-1)), S(-1)),
    Signature((S(0), S(-2)), P),
    Signature((P, B), P),
    Signature((B, P), P),
    Signature((B, B), B),
    Signature((S_BATCH, S_BATCH), S_BATCH),
)
MATMUL_VV = (  # v: (k,) @ w: (k,) -> (): the inner product
    Signature((S(0), S(0)), P),
    Signature((P, B), P),
    Signature((B, P), P),
    Signature((B, B), B),
)
#: The table of a call by (a is 1-D, b is 1-D).
MATMUL_TABLES = {(False, False): MATMUL, (False, True): MATMUL_MV, (True, False): MATMUL_VM,
                 (True, True): MATMUL_VV}


def _build(a: Any, b: Any) -> OpCall:
    """Build the OpCall of ``matmul``."""
    for what, x in (("a", a), ("b", b)):
        if not isinstance(x, GlobalTensor):
            raise TypeError(f"matmul: {what} must be a GlobalTensor, got {arg_summary(x)} "
                            f"(matmul takes no scalars; use mul)")
        if x.ndim < 1:
            raise ValueError(f"matmul: {what} has shape {x.shape}; matmul needs at least 1 dim "
                             f"(use mul for a 0-d operand)")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if ka != kb:
        raise ValueError(f"matmul: a has shape {a.shape} and b has shape {b.shape}: the "
                         f"contracted dims differ (a's last dim {ka} != b's "
                         f"{'second-to-last' if b.ndim > 1 else 'only'} dim {kb})")
    try:
        batch = tuple(int(n) for n in np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError:
        raise ValueError(f"matmul: batch dims {a.shape[:-2]} of a and {b.shape[:-2]} of b "
                         f"cannot be broadcast together") from None
    out_shape = batch + a.shape[-2:-1] + (b.shape[-1:] if b.ndim > 1 else ())
    dtype = probe_dtype("matmul", lambda x, y: np.matmul(x[None, None], y[None, None]), a, b)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return local_matmul(xp, local[0], local[1])

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any) -> None:
        local_matmul(xp, local[0], local[1], out)

    with_into(kernel, into)

    table = MATMUL_TABLES[a.ndim == 1, b.ndim == 1]
    return OpCall("matmul", (a, b), table, {"batch": batch_matches(a, b, batch)}, out_shape,
                  dtype, kernel, labels=("a", "b"))


def local_matmul(xp: ModuleType, a: Any, b: Any, out: Any = None) -> Any:
    """``xp.matmul(a, b)`` of two shards; a stack of rows times one matrix (a linear
    layer's ``(batch, seq, in) @ (in, out)``) as one ``(batch * seq, in)`` product.

    NumPy runs a stack as one BLAS call per matrix; one tall call is faster and gives the
    same values up to float rounding. ``b`` may be a transposed view. ``out``: a
    C-contiguous array of the result's shape and dtype to write into (returned).
    """
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:
        rows = math.prod(a.shape[:-1])
        flat = None if out is None else out.reshape(rows, b.shape[-1])
        res = xp.matmul(a.reshape(rows, a.shape[-1]), b, out=flat)
        return res.reshape(a.shape[:-1] + b.shape[-1:]) if out is None else out
    return xp.matmul(a, b, out=out)


def batch_matches(a: GlobalTensor, b: GlobalTensor, batch: tuple[int, ...]
                  ) -> tuple[DimMatch, ...]:
    """Per batch dim of the result, the matching dim of a and of b (None: broadcast; a
    1-D operand has no batch dims)."""
    nb = len(batch)
    matches = []
    for d in range(nb):
        ins: list[int | None] = []
        for x in (a, b):
            j = d - (nb - max(x.ndim - 2, 0))
            ins.append(j if j >= 0 and x.shape[j] == batch[d] else None)
        matches.append(DimMatch(tuple(ins), d))
    return tuple(matches)


matmul = GlobalOp("matmul", _build, MATMUL, doc=(
    "Matrix product ``a @ b`` of global tensors with NumPy's rules: 2-D, batched with "
    "broadcast batch dims, or 1-D operands (a vector on the left is a row, on the right a "
    "column, and that dim is dropped from the result; two vectors give their 0-d inner "
    "product). The output SBP follows from the cheapest signature in ``matmul.table`` "
    "(1-D operands: ``MATMUL_MV``, ``MATMUL_VM``, ``MATMUL_VV``)."))


# ---- matmul with one operand transposed: the backward of matmul, without copies --------------

def _swap_split(p: Any) -> Any:
    """split(-1) <-> split(-2): the pattern of an operand seen through a transpose."""
    if isinstance(p, Split) and p.dim in (-1, -2):
        return Split(-3 - p.dim)
    return p


def _transposed_matmul(name: str, which: int) -> GlobalOp:
    """``a^T @ b`` (which=0) or ``a @ b^T`` (which=1), transposing the last two dims.

    The table is matmul's, with the transposed operand's row/column splits swapped, so
    inference sees exactly the choices of ``matmul(transpose(a), b)``; the kernel hands
    BLAS the transposed view instead of copying it.
    """
    table = tuple(Signature(tuple(_swap_split(q) if i == which else q
                                  for i, q in enumerate(sig.inputs)), sig.output, sig.when)
                  for sig in MATMUL)

    def build(a: GlobalTensor, b: GlobalTensor) -> OpCall:
        shapes = [list(a.shape), list(b.shape)]
        shapes[which][-2:] = shapes[which][-2:][::-1]
        sa, sb = shapes
        if sa[-1] != sb[-2]:
            raise ValueError(f"{name}: contracted dims differ: {a.shape} and {b.shape}")
        batch = tuple(int(n) for n in np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2])))
        dtype = np.result_type(a.dtype, b.dtype)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...],
                   out: Any = None) -> Any:
            x, y = local
            if which == 0:
                x = xp.swapaxes(x, -1, -2)
            else:
                y = xp.swapaxes(y, -1, -2)
            return local_matmul(xp, x, y, out)

        with_into(kernel, kernel)

        return OpCall(name, (a, b), table, {"batch": batch_matches(a, b, batch)},
                      batch + (sa[-2], sb[-1]), np.dtype(dtype), kernel, labels=("a", "b"))

    return GlobalOp(name, build, table, doc=f"``{name}(a, b)``: " + (
        "``a^T @ b``" if which == 0 else "``a @ b^T``") + " over the last two dims.")


matmul_tn = _transposed_matmul("matmul_tn", 0)
matmul_nt = _transposed_matmul("matmul_nt", 1)
