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

import numpy as np

from ..core.dtypes import accumulation_dtype
from ..core.sbp import Split
from ..grad_mode import no_grad
from ..tape import record_op
from ..tensor import GlobalTensor
from .call import OpCall
from .kernel import Scratch, take_into, written_into, zero_d
from .op import GlobalOp
from .reduction import max_, reduced, softmax_into
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


# The kernels write into their result and take their temporaries from ``scratch`` (each
# with its own number), their constants 0-d arrays made once: the eager kernels are these
# forms with new arrays (``written_into``), so eager and replayed results are
# bit-identical, and a replay of a captured step allocates nothing here.
def _valid_into(xp: ModuleType, y: Any, n_classes: int, ignore_index: int, valid: Any,
                invalid: Any) -> None:
    """Whether each row counts, ``0 <= y < C`` and ``y != ignore_index``, written into
    ``valid``, and its negation into ``invalid``. Signed labels are compared once as
    their unsigned view (a negative label is a large one there), the ignored label too
    only when it lies in ``[0, C)``: few calls, which is what a small batch costs."""
    unsigned = _UNSIGNED.get(y.dtype)
    if unsigned is None or n_classes > np.iinfo(y.dtype).max:
        # unsigned labels, or classes past the labels' range: NumPy's comparisons with
        # Python ints
        valid[...] = (y >= 0) & (y < n_classes) & (y != ignore_index)
        xp.logical_not(valid, out=invalid)
        return
    xp.greater_equal(y.view(unsigned), zero_d(xp, n_classes, unsigned), out=invalid)
    if 0 <= ignore_index < n_classes:
        xp.equal(y, zero_d(xp, ignore_index, y.dtype), out=valid)
        invalid |= valid
    xp.logical_not(invalid, out=valid)


#: The unsigned dtype of each signed label dtype's view.
_UNSIGNED = {np.dtype(f"i{n}"): np.dtype(f"u{n}") for n in (1, 2, 4, 8)}


def _flat_index_into(xp: ModuleType, j: Any, away: Any, width: int, flat: Any) -> None:
    """``row * width + (0 where away else j)`` written into ``flat`` (intp): each row's
    picked entry of a C-contiguous ``(rows, width)`` array, as one index."""
    flat[...] = j
    xp.copyto(flat, zero_d(xp, 0, flat.dtype), where=away)
    flat += _row_starts(xp, flat.shape[0], width)


def _row_starts(xp: ModuleType, rows: int, width: int) -> Any:
    """``arange(rows) * width`` (intp), made once per (module, rows, width)."""
    key = (xp.__name__, rows, width)
    r = _ROW_STARTS.get(key)
    if r is None:
        if len(_ROW_STARTS) > 64:
            _ROW_STARTS.clear()
        r = _ROW_STARTS[key] = xp.arange(rows, dtype=np.intp) * width
    return r


_ROW_STARTS: dict[tuple[str, int, int], Any] = {}


def _row_weights(xp: ModuleType, valid: Any, g: Any, k: float, w: Any, gk: Any) -> None:
    """``valid[:, None] * (g * k)`` written into ``w`` (rows, 1); ``gk``: a 0-d temporary."""
    gk[...] = g
    gk *= zero_d(xp, k, gk.dtype)
    xp.copyto(w, valid.reshape(w.shape))
    w *= gk


def _params(ignore_index: int, scale: float) -> str:
    return f"ignore_index={ignore_index}, scale={scale!r}"


def _build(logits: GlobalTensor, labels: GlobalTensor, ignore_index: int = -100,
           scale: float | None = None) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype
    k = 1.0 / n if scale is None else float(scale)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        a, y = local
        rows, dt = a.shape[0], out.dtype
        if rows == 0:
            out[...] = zero_d(xp, 0, dt)
            return
        logp = scratch.get(xp, a.shape, dt, 3)
        softmax_into(xp, a, 1, logp, scratch, log=True)
        valid, invalid = (scratch.get(xp, y.shape, np.bool_, i) for i in (4, 5))
        _valid_into(xp, y, c, ignore_index, valid, invalid)
        flat = scratch.get(xp, y.shape, np.intp, 6)
        _flat_index_into(xp, y, invalid, a.shape[1], flat)
        terms = scratch.get(xp, y.shape, dt, 7)
        take_into(xp, logp.reshape(-1), flat, terms)
        xp.copyto(terms, zero_d(xp, 0, dt), where=invalid)  # rows that do not count add 0
        total = scratch.get(xp, (), dt, 8)
        xp.sum(terms, out=total)
        xp.multiply(total, zero_d(xp, -k, dt), out=out)  # -(sum) k: negation is exact

    kernel = written_into(into, accumulation_dtype(dtype))

    return OpCall("cross_entropy", (logits, labels), CROSS_ENTROPY, {}, (), dtype, kernel,
                  params=_params(ignore_index, k), labels=("logits", "labels"))


def _build_grad(logits: GlobalTensor, labels: GlobalTensor, g: GlobalTensor,
                ignore_index: int = -100, scale: float | None = None) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype
    k = 1.0 / n if scale is None else float(scale)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        a, y, gl = local
        if out.size == 0:
            return
        dt = out.dtype
        softmax_into(xp, a, 1, out, scratch, log=True)
        xp.exp(out, out=out)
        valid, invalid = (scratch.get(xp, y.shape, np.bool_, i) for i in (4, 5))
        _valid_into(xp, y, c, ignore_index, valid, invalid)
        flat = scratch.get(xp, y.shape, np.intp, 6)
        _flat_index_into(xp, y, invalid, a.shape[1], flat)
        picked = scratch.get(xp, y.shape, dt, 7)
        p = out.reshape(-1)
        take_into(xp, p, flat, picked)  # softmax minus the one-hot label
        picked -= zero_d(xp, 1, dt)
        xp.put(p, flat, picked, mode="clip")
        w = scratch.get(xp, (a.shape[0], 1), dt, 8)
        _row_weights(xp, valid, gl, k, w, scratch.get(xp, (), dt, 9))
        out *= w

    kernel = written_into(into, accumulation_dtype(dtype))

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

def _local_target(xp: ModuleType, y: Any, cols: Any, ignore_index: int, j: Any, here: Any,
                  tmp: Any) -> None:
    """This shard's column of each row's label written into ``j`` (int64; meaningful where
    the shard holds it) and whether it does into ``here`` (``tmp``: a boolean temporary)."""
    nc = cols.shape[-1]
    first = int(cols.reshape(-1)[0]) if nc else 0
    j[...] = y
    j -= zero_d(xp, first, np.int64)
    xp.greater_equal(j, zero_d(xp, 0, np.int64), out=here)
    xp.less(j, zero_d(xp, nc, np.int64), out=tmp)
    here &= tmp
    if y.dtype.kind == "i":
        xp.not_equal(y, zero_d(xp, ignore_index, np.int64), out=tmp)
    else:
        tmp[...] = y != ignore_index
    here &= tmp


def _held_index(xp: ModuleType, y: Any, cols: Any, ignore_index: int, width: int,
                scratch: Scratch) -> tuple[Any, Any, Any]:
    """Whether this shard of the classes holds each row's label, the negation, and the
    flat index of the label's entry in a C-contiguous ``(rows, width)`` shard (0 of the
    row where not held); temporaries 1 to 4."""
    j = scratch.get(xp, y.shape, np.int64, 1)
    here, away = (scratch.get(xp, y.shape, np.bool_, i) for i in (2, 3))
    _local_target(xp, y, cols, ignore_index, j, here, away)
    xp.logical_not(here, out=away)
    flat = scratch.get(xp, y.shape, np.intp, 4)
    _flat_index_into(xp, j, away, width, flat)
    return here, away, flat


def _build_stats(logits: GlobalTensor, labels: GlobalTensor, m: GlobalTensor,
                 cols: GlobalTensor, ignore_index: int = -100) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        a, y, mx, cl = local
        dt = out.dtype
        e = scratch.get(xp, a.shape, dt, 0)
        xp.subtract(a, mx, out=e)
        xp.exp(e, out=e)
        xp.sum(e, axis=1, out=out[:, 0])
        if not a.shape[1]:
            out[:, 1] = zero_d(xp, 0, dt)
            return
        here, away, flat = _held_index(xp, y, cl, ignore_index, a.shape[1], scratch)
        target = scratch.get(xp, y.shape, dt, 5)
        take_into(xp, a.reshape(-1), flat, target)
        xp.copyto(target, zero_d(xp, 0, dt), where=away)  # held by another shard: 0
        out[:, 1] = target

    kernel = written_into(into, accumulation_dtype(dtype))

    dims = {"d": (DimMatch((0, 0, 0, None), 0),), "r": (DimMatch((1, None, None, 1), None),)}
    return OpCall("vocab_stats", (logits, labels, m, cols), VOCAB_STATS, dims, (n, 2), dtype,
                  kernel, params=f"ignore_index={ignore_index}",
                  labels=("logits", "labels", "m", "cols"))


def _build_loss(stats: GlobalTensor, m: GlobalTensor, labels: GlobalTensor, c: int,
                ignore_index: int = -100, scale: float = 1.0) -> OpCall:
    dtype = stats.dtype

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        st, mx, y = local
        dt = out.dtype
        valid, invalid = (scratch.get(xp, y.shape, np.bool_, i) for i in (0, 1))
        _valid_into(xp, y, c, ignore_index, valid, invalid)
        terms = scratch.get(xp, y.shape, dt, 2)
        xp.log(st[:, 0], out=terms)
        xp.add(mx[:, 0], terms, out=terms)
        terms -= st[:, 1]
        xp.copyto(terms, zero_d(xp, 0, dt), where=invalid)  # rows that do not count add 0
        total = scratch.get(xp, (), dt, 3)
        xp.sum(terms, out=total)
        xp.multiply(total, zero_d(xp, scale, dt), out=out)

    kernel = written_into(into, accumulation_dtype(dtype))

    return OpCall("vocab_loss", (stats, m, labels), VOCAB_LOSS,
                  {"r": (DimMatch((0, 0, 0), None),)}, (), dtype, kernel,
                  params=f"classes={c}, {_params(ignore_index, scale)}",
                  labels=("stats", "m", "labels"))


def _build_vocab_grad(logits: GlobalTensor, labels: GlobalTensor, m: GlobalTensor,
                      stats: GlobalTensor, cols: GlobalTensor, g: GlobalTensor, *,
                      ignore_index: int = -100, scale: float = 1.0) -> OpCall:
    n, c = logits.shape
    dtype = logits.dtype

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        a, y, mx, st, cl, gl = local
        if out.size == 0:
            return
        dt = out.dtype
        xp.subtract(a, mx, out=out)
        xp.exp(out, out=out)
        out /= st[:, :1]
        here, away, flat = _held_index(xp, y, cl, ignore_index, a.shape[1], scratch)
        picked, held = (scratch.get(xp, y.shape, dt, i) for i in (5, 6))
        p = out.reshape(-1)
        take_into(xp, p, flat, picked)  # minus the one-hot label where held
        xp.copyto(held, here)
        picked -= held
        xp.put(p, flat, picked, mode="clip")
        valid = scratch.get(xp, y.shape, np.bool_, 7)
        _valid_into(xp, y, c, ignore_index, valid, away)  # away is free again
        w = scratch.get(xp, (a.shape[0], 1), dt, 8)
        _row_weights(xp, valid, gl, scale, w, scratch.get(xp, (), dt, 9))
        out *= w

    kernel = written_into(into, accumulation_dtype(dtype))

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
                      saved["cols"], g, ignore_index=saved["ignore_index"],
                      scale=saved["scale"])

