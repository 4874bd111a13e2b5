"""Fused loss ops: cross-entropy and its gradient as one global op each.

Built from the generic ops, a cross-entropy costs a dozen op calls forward and as many
backward; as one op it costs one call each way, which is what a small model's step
time is made of. Both run on rows: the batch may be split (``split(0)``, the loss is
then a partial sum) or broadcast; logits split along classes are boxed first.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..ops.call import OpCall
from ..ops.op import GlobalOp
from ..ops.signature import B, P, S, Signature
from ..tensor import GlobalTensor

__all__ = ["CROSS_ENTROPY", "CROSS_ENTROPY_GRAD", "cross_entropy", "cross_entropy_grad"]

CROSS_ENTROPY = (  # (logits (N, C), labels (N,)) -> 0-d
    Signature((S(0), S(0)), P),  # each rank sums its rows' terms
    Signature((B, B), B),
)
CROSS_ENTROPY_GRAD = (  # (logits, labels, g 0-d) -> (N, C)
    Signature((S(0), S(0), B), S(0)),
    Signature((B, B, B), B),
)


def _log_softmax_rows(xp: ModuleType, a: Any) -> Any:
    z = a - xp.max(a, axis=1, keepdims=True)
    return z - xp.log(xp.sum(xp.exp(z), axis=1, keepdims=True))


def _picked(xp: ModuleType, labels: Any, n_classes: int) -> tuple[Any, Any]:
    """Labels clipped into range, and the mask of the valid ones (others count 0)."""
    valid = (labels >= 0) & (labels < n_classes)
    return xp.where(valid, labels, 0), valid


def _build(logits: GlobalTensor, labels: GlobalTensor) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, y = local
        if a.shape[0] == 0:
            return xp.zeros((), dtype=dtype)
        logp = _log_softmax_rows(xp, a)
        idx, valid = _picked(xp, y, c)
        terms = logp[xp.arange(a.shape[0]), idx] * valid
        return xp.asarray(-xp.sum(terms) / n, dtype=dtype)

    return OpCall("cross_entropy", (logits, labels), CROSS_ENTROPY, {}, (), dtype, kernel,
                  labels=("logits", "labels"))


def _build_grad(logits: GlobalTensor, labels: GlobalTensor, g: GlobalTensor) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, y, gl = local
        p = xp.exp(_log_softmax_rows(xp, a))
        idx, valid = _picked(xp, y, c)
        rows = xp.arange(a.shape[0])
        p[rows, idx] -= valid.astype(dtype)
        return p * (gl.astype(dtype) / n)

    return OpCall("cross_entropy_grad", (logits, labels, g), CROSS_ENTROPY_GRAD, {},
                  logits.shape, dtype, kernel, labels=("logits", "labels", "g"))


cross_entropy = GlobalOp("cross_entropy", _build, CROSS_ENTROPY, doc=(
    "Mean over rows of ``-log_softmax(logits)[i, labels[i]]`` (checked arguments: "
    "``sm.nn.cross_entropy``)."))
cross_entropy_grad = GlobalOp("cross_entropy_grad", _build_grad, CROSS_ENTROPY_GRAD, doc=(
    "``g * (softmax(logits) - onehot(labels)) / N``: the gradient of cross_entropy."))
