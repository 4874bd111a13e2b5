"""Which ops compute in float32 when given half-width operands.

float16 and bfloat16 hold about 3 and 2 decimal digits: a sum of many of them rounded at
every step (NumPy's float16 ``sum``, a matmul's dot products, the mean and variance of
layer norm, softmax's normaliser, the log-sum-exp of cross-entropy) loses the value. The
kernels of the ops named here get their half-width operands widened to float32 and their
result rounded once to the op's dtype (:func:`widened`, called by
:func:`.kernel.local_result` on both the full path and the dispatch fast path), as
cuBLAS and every mixed-precision stack accumulate. Such a kernel computes in the dtype
its operands come in (``accumulation_dtype`` of the op's: ``call.as_dtype``, a scratch
``out`` from ``written_into(into, accumulation_dtype(dtype))``) and never casts back to
the half dtype itself: ``local_result`` rounds once, and refuses a half-width result from
widened operands as an internal error (a cast back had summed in half width: issue 41).
Composite forms over a split reduced dim (``mean``, ``var``, layer norm, ``vector_norm``)
run on a float32 copy and round their total once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.dtypes import HALF, float32

__all__ = ["FLOAT32_KERNELS", "needs_widening", "widen", "widened"]

#: Ops whose kernels sum or chain many values (or evaluate a polynomial): run in float32
#: on half-width operands.
FLOAT32_KERNELS: frozenset[str] = frozenset({
    "matmul", "matmul_tn", "matmul_nt",            # dot products
    "sum", "mean", "var", "std", "prod",           # reductions
    "cumulative_sum", "cumulative_prod",           # running sums and products
    "softmax", "log_softmax", "sum_exp", "softmax_finish",
    "normalize", "normalize_backward",             # layer norm's mean and variance
    "cross_entropy", "cross_entropy_grad", "vocab_stats", "vocab_loss", "vocab_grad",
    "embedding_backward",                          # rows added up with np.add.at
    "gelu", "gelu_backward", "erf",                # erf/tanh polynomials
})


def needs_widening(name: str, args: Sequence[Any]) -> bool:
    """Whether op ``name`` computes in float32 on these operands (arrays or tensors): it
    accumulates and one of them is half-width. A function of the dtypes alone, so the
    dispatch fast path decides it once per entry."""
    return name in FLOAT32_KERNELS and any(getattr(a, "dtype", None) in HALF for a in args)


def widen(args: Sequence[Any]) -> list[Any]:
    """``args`` with their half-width arrays as float32."""
    return [a.astype(float32) if getattr(a, "dtype", None) in HALF else a for a in args]


def widened(name: str, args: Sequence[Any]) -> Sequence[Any]:
    """``args`` with their half-width arrays as float32 when op ``name`` accumulates."""
    return widen(args) if needs_widening(name, args) else args
