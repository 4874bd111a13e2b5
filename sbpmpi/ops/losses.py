"""Fused loss ops: cross-entropy and its gradient.

Built from the generic ops, a cross-entropy costs a dozen op calls forward and as many
backward; fused, it costs one call each way, which is what a small model's step time is
made of. Rows whose label equals ``ignore_index`` contribute nothing, and the mean is
over the other rows (``scale`` is one over their number; labels outside ``[0, C)``
otherwise contribute 0 to the sum and count in the mean).

* Classes whole (:data:`CROSS_ENTROPY`): one op on rows; the batch may be split
  (``split(0)``, the loss is then a partial sum) or broadcast.
* Classes split (vocab parallel, as DTensor's ``loss_parallel``): no rank gathers the
  logits. Forward is the row max (partial_max, one all-reduce of shape ``(N, 1)``), then
  :data:`VOCAB_STATS` gives per row the local sum of ``exp(logit - max)`` and the target
  logit where this rank holds the label's class (both partial sums: one all-reduce of
  shape ``(N, 2)``), then :data:`VOCAB_LOSS` sums the rows. Backward
  (:data:`VOCAB_GRAD`) reuses the reduced max and sums and communicates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..core.sbp import Split
from ..grad_mode import no_grad
from ..tape import record_op
from ..tensor import GlobalTensor
from .call import OpCall
from .op import GlobalOp
from .reduction import max_, reduced
from .signature import S_D, AnySplit, B, DimMatch, P, S, Signature
from .triangle import global_index

__all__ = ["CROSS_ENTROPY", "CROSS_ENTROPY_GRAD", "VOCAB_STATS", "VOCAB_LOSS", "VOCAB_GRAD",
           "cross_entropy", "cross_entropy_grad", "vocab_stats", "vocab_loss", "vocab_grad",
           "cross_entropy_loss", "vocab_cross_entropy_grad"]

S_R = AnySplit("r")

CROSS_ENTROPY = (  # (logits (N, C), labels (N,)) -> 0-d
    Signature((S(0), S(0)), P),  # each rank sums its rows' terms
    Signature((B, B), B),
)
CROSS_ENTROPY_GRAD = (  # (logits, labels, g 0-d) -> (N, C)
    Signature((S(0), S(0), B), S(0)),
    Signature((B, B, B), B),
)
# (logits (N, C), labels (N,), row max (N, 1), class numbers (1, C)) -> (N, 2)
VOCAB_STATS = (
    Signature((S_D, S_D, S_D, S_D), S_D),  # rows
    Signature((S_R, S_R, S_R, S_R), P),    # classes: partial sums
    Signature((B, B, B, B), B),
)
# (stats (N, 2), row max (N, 1), labels (N,)) -> 0-d
VOCAB_LOSS = (
    Signature((S_R, S_R, S_R), P),
    Signature((B, B, B), B),
)
# (logits, labels, row max, stats, class numbers, g 0-d) -> (N, C)
VOCAB_GRAD = (
    Signature((S_D,) * 6, S_D),
    Signature((B,) * 6, B),
    Signature((B,) * 5 + (P,), P),  # linear in g
)


def _log_softmax_rows(xp: ModuleType, a: Any) -> Any:
    z = a - xp.max(a, axis=1, keepdims=True)
    return z - xp.log(xp.sum(xp.exp(z), axis=1, keepdims=True))


def _picked(xp: ModuleType, labels: Any, n_classes: int, ignore_index: int) -> tuple[Any, Any]:
    """Labels clipped into range, and the mask of the rows that count (others add 0)."""
    valid = (labels >= 0) & (labels < n_classes) & (labels != ignore_index)
    return xp.where(valid, labels, 0), valid


def _params(ignore_index: int, scale: float) -> str:
    return f"ignore_index={ignore_index}, scale={scale!r}"


def _build(logits: GlobalTensor, labels: GlobalTensor, ignore_index: int = -100,
           scale: float | None = None) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype
    k = 1.0 / n if scale is None else float(scale)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, y = local
        if a.shape[0] == 0:
            return xp.zeros((), dtype=dtype)
        logp = _log_softmax_rows(xp, a)
        idx, valid = _picked(xp, y, c, ignore_index)
        terms = logp[xp.arange(a.shape[0]), idx] * valid
        return xp.asarray(-xp.sum(terms) * k, dtype=dtype)

    return OpCall("cross_entropy", (logits, labels), CROSS_ENTROPY, {}, (), dtype, kernel,
                  params=_params(ignore_index, k), labels=("logits", "labels"))


def _build_grad(logits: GlobalTensor, labels: GlobalTensor, g: GlobalTensor,
                ignore_index: int = -100, scale: float | None = None) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype
    k = 1.0 / n if scale is None else float(scale)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, y, gl = local
        p = xp.exp(_log_softmax_rows(xp, a))
        idx, valid = _picked(xp, y, c, ignore_index)
        rows = xp.arange(a.shape[0])
        p[rows, idx] -= 1
        return p * (valid[:, None] * (gl.astype(dtype) * k))

    return OpCall("cross_entropy_grad", (logits, labels, g), CROSS_ENTROPY_GRAD, {},
                  logits.shape, dtype, kernel, params=_params(ignore_index, k),
                  labels=("logits", "labels", "g"))


cross_entropy = GlobalOp("cross_entropy", _build, CROSS_ENTROPY, doc=(
    "``scale`` times the sum over rows of ``-log_softmax(logits)[i, labels[i]]`` (rows "
    "labelled ``ignore_index`` add 0); ``scale`` defaults to ``1 / N``. Checked arguments: "
    "``sm.nn.cross_entropy``."))
cross_entropy_grad = GlobalOp("cross_entropy_grad", _build_grad, CROSS_ENTROPY_GRAD, doc=(
    "``g * scale * (softmax(logits) - onehot(labels))`` on the rows that count: the "
    "gradient of cross_entropy."))


# ---- vocab parallel -------------------------------------------------------------------------

def _local_target(xp: ModuleType, y: Any, cols: Any, ignore_index: int) -> tuple[Any, Any]:
    """This shard's column of each row's label, and whether the shard holds it."""
    nc = cols.shape[-1]
    first = int(cols.reshape(-1)[0]) if nc else 0
    j = y.astype(xp.int64) - first
    here = (j >= 0) & (j < nc) & (y != ignore_index)
    return xp.where(here, j, 0), here


def _build_stats(logits: GlobalTensor, labels: GlobalTensor, m: GlobalTensor,
                 cols: GlobalTensor, ignore_index: int = -100) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, y, mx, cl = local
        out = xp.empty(shape, dtype=dtype)
        out[:, 0] = xp.sum(xp.exp(a - mx), axis=1)
        j, here = _local_target(xp, y, cl, ignore_index)
        out[:, 1] = a[xp.arange(a.shape[0]), j] * here if a.shape[1] else 0
        return out

    dims = {"d": (DimMatch((0, 0, 0, None), 0),), "r": (DimMatch((1, None, None, 1), None),)}
    return OpCall("vocab_stats", (logits, labels, m, cols), VOCAB_STATS, dims, (n, 2), dtype,
                  kernel, params=f"ignore_index={ignore_index}",
                  labels=("logits", "labels", "m", "cols"))


def _build_loss(stats: GlobalTensor, m: GlobalTensor, labels: GlobalTensor, c: int,
                ignore_index: int = -100, scale: float = 1.0) -> OpCall:
    dtype = stats.dtype

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        st, mx, y = local
        valid = (y >= 0) & (y < c) & (y != ignore_index)
        terms = (mx[:, 0] + xp.log(st[:, 0]) - st[:, 1]) * valid
        return xp.asarray(xp.sum(terms) * scale, dtype=dtype)

    return OpCall("vocab_loss", (stats, m, labels), VOCAB_LOSS,
                  {"r": (DimMatch((0, 0, 0), None),)}, (), dtype, kernel,
                  params=f"classes={c}, {_params(ignore_index, scale)}",
                  labels=("stats", "m", "labels"))


def _build_vocab_grad(logits: GlobalTensor, labels: GlobalTensor, m: GlobalTensor,
                      stats: GlobalTensor, cols: GlobalTensor, g: GlobalTensor,
                      ignore_index: int = -100, scale: float = 1.0) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, y, mx, st, cl, gl = local
        p = xp.exp(a - mx) / st[:, :1]
        j, here = _local_target(xp, y, cl, ignore_index)
        if a.shape[1]:
            p[xp.arange(a.shape[0]), j] -= here
        valid = (y >= 0) & (y < c) & (y != ignore_index)
        return p * (valid[:, None] * (gl.astype(dtype) * scale))

    rows = DimMatch((0, 0, 0, 0, None, None), 0)
    classes = DimMatch((1, None, None, None, 1, None), 1)
    return OpCall("vocab_grad", (logits, labels, m, stats, cols, g), VOCAB_GRAD,
                  {"d": (rows, classes)}, logits.shape, dtype, kernel,
                  params=_params(ignore_index, scale),
                  labels=("logits", "labels", "m", "stats", "cols", "g"))


vocab_stats = GlobalOp("vocab_stats", _build_stats, VOCAB_STATS, fast=False, doc=(
    "Per row: the sum of ``exp(logits - m)`` over this shard's classes and the label's "
    "logit where this shard holds it (a step of vocab-parallel cross-entropy)."))
vocab_loss = GlobalOp("vocab_loss", _build_loss, VOCAB_LOSS, doc=(
    "``scale * sum(m + log(sum_exp) - target)`` over the rows that count (a step of "
    "vocab-parallel cross-entropy)."))
vocab_grad = GlobalOp("vocab_grad", _build_vocab_grad, VOCAB_GRAD, fast=False, doc=(
    "The gradient of vocab-parallel cross-entropy on each shard of the classes, from the "
    "forward's reduced row max and sums: no communication."))


def cross_entropy_loss(logits: GlobalTensor, labels: GlobalTensor, ignore_index: int,
                       scale: float) -> GlobalTensor:
    """``scale * sum`` of the cross-entropy terms of the rows that count (checked arguments:
    ``sm.nn.cross_entropy``). Vocab parallel where a mesh axis splits the classes."""
    if not any(isinstance(s, Split) and s.dim == 1 for s in logits.sbp):
        return cross_entropy(logits, labels, ignore_index, scale)  # type: ignore[no-any-return]
    with no_grad():
        m = reduced(max_(logits, 1, keepdim=True))
        cols = global_index(logits, 1)
        stats = reduced(vocab_stats(logits, labels, m, cols, ignore_index))
        out = vocab_loss(stats, m, labels, logits.shape[1], ignore_index, scale)
    saved = {"m": m, "stats": stats, "cols": cols, "ignore_index": ignore_index,
             "scale": scale}
    return record_op("vocab_cross_entropy", (logits, labels), (logits, labels), saved, out)


def vocab_cross_entropy_grad(logits: GlobalTensor, labels: GlobalTensor,
                             saved: dict[str, Any], g: GlobalTensor) -> GlobalTensor:
    """The backward of the vocab-parallel path of :func:`cross_entropy_loss`."""
    return vocab_grad(logits, labels, saved["m"], saved["stats"],  # type: ignore[no-any-return]
                      saved["cols"], g, saved["ignore_index"], saved["scale"])

