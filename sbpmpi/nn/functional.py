"""Functional forms of the layers: ``relu``, ``gelu``, ``softmax``, ``log_softmax``,
``cross_entropy``, ``embedding``, ``layer_norm``, ``dropout`` (``torch.nn.functional``'s
names). Each checks its arguments and calls the ops; the modules of :mod:`.layers` hold
the parameters and call these."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..core.dtypes import float32, is_floating, is_half
from ..core.sbp import Partial, Split, broadcast
from ..creation import arange, rand, tensor
from ..grad_mode import no_grad
from ..ops import losses
from ..ops.call import check_eps
from ..ops.reduction import reduced
from ..tensor import GlobalTensor

__all__ = ["relu", "gelu", "softmax", "log_softmax", "cross_entropy", "embedding",
           "layer_norm", "dropout"]


def relu(x: GlobalTensor) -> GlobalTensor:
    """``max(x, 0)`` elementwise."""
    return ops.relu(x)  # type: ignore[no-any-return]



def gelu(x: GlobalTensor, approximate: str = "none") -> GlobalTensor:
    """GELU, ``x * Phi(x)`` (``approximate="none"``, through erf) or its tanh form."""
    return ops.gelu(x, approximate=approximate)  # type: ignore[no-any-return]



def softmax(x: GlobalTensor, dim: int = -1) -> GlobalTensor:
    """``sm.softmax``: a split ``dim`` costs two all-reduces of the reduced shape."""
    return ops.softmax(x, dim)  # type: ignore[no-any-return]



def log_softmax(x: GlobalTensor, dim: int = -1) -> GlobalTensor:
    """``sm.log_softmax``: a split ``dim`` costs two all-reduces of the reduced shape."""
    return ops.log_softmax(x, dim)  # type: ignore[no-any-return]



def cross_entropy(logits: GlobalTensor, labels: Any, ignore_index: int = -100) -> GlobalTensor:
    """Mean over the batch of ``-log_softmax(logits)[i, labels[i]]`` (a 0-d tensor).

    ``logits`` has shape ``(N, C)`` in any layout: a split batch gives a partial-sum
    loss, reduced when read; split classes (vocab parallel, ``split(1)``) are never
    gathered: two all-reduces of shapes ``(N, 1)`` and ``(N, 2)`` forward, none backward.
    ``labels`` holds ``N`` integer classes in ``[0, C)``: a GlobalTensor, or an array
    made global here with the batch's split of ``logits``. Rows labelled ``ignore_index``
    contribute nothing and the mean is over the others (NaN when none is left, as
    torch). Other labels outside ``[0, C)`` add 0 to the sum but count in the mean (they
    are not checked: that would need communication).
    """
    if not isinstance(logits, GlobalTensor) or logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must be a 2-D GlobalTensor (batch, classes), "
                         f"got {getattr(logits, 'shape', type(logits).__name__)}")
    if isinstance(ignore_index, (bool, np.bool_)) or not isinstance(ignore_index,
                                                                    (int, np.integer)):
        raise TypeError(f"cross_entropy: ignore_index must be an int, got "
                        f"{type(ignore_index).__name__} {ignore_index!r}")
    ignore = int(ignore_index)
    n, c = logits.shape
    count: Any = None
    if not isinstance(labels, GlobalTensor):
        arr = np.asarray(labels)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"cross_entropy: labels must be integers, got dtype {arr.dtype}")
        if arr.shape == (n,):
            count = int(np.count_nonzero(arr != ignore))  # the whole array is on every rank
        sbp = tuple(s if isinstance(s, Split) and s.dim == 0 else broadcast for s in logits.sbp)
        labels = tensor(arr, placement=logits.placement, sbp=sbp)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: labels must be integers, got dtype {labels.dtype}")
    if labels.shape != (n,):
        raise ValueError(f"cross_entropy: labels have shape {labels.shape}, expected ({n},) "
                         f"for logits of shape {logits.shape}")
    if not is_floating(logits.dtype):
        raise TypeError(f"cross_entropy: logits must have a floating dtype, got {logits.dtype}")
    if count is not None:
        scale = 1.0 / count if count else float("nan")
        return losses.cross_entropy_loss(logits, labels, ignore, scale)
    total = losses.cross_entropy_loss(logits, labels, ignore, 1.0)
    counted = ops.astype(ops.sum(ops.ne(labels, ignore)), logits.dtype)
    return ops.div(total, counted)  # type: ignore[no-any-return]



def _rows_of(weight: GlobalTensor) -> GlobalTensor:
    """``arange(V)`` laid out like ``weight``'s rows: split(0) where the weight is split on
    dim 0, broadcast elsewhere (it tells each rank which rows its shard holds)."""
    sbp = tuple(s if isinstance(s, Split) and s.dim == 0 else broadcast for s in weight.sbp)
    return arange(weight.shape[0], placement=weight.placement, sbp=sbp)



def embedding(ids: GlobalTensor, weight: GlobalTensor) -> GlobalTensor:
    """Rows of ``weight`` (shape ``(num_embeddings, embedding_dim)``) at integer ``ids``.

    ``ids`` is a GlobalTensor of integers of any shape and layout; the result has shape
    ``ids.shape + (embedding_dim,)``. The weight may be broadcast, split on the
    embedding dim (``split(1)``: the result is split on its last dim) or on the
    vocabulary (``split(0)``: each rank looks up the ids it owns and the result is
    ``partial_sum``). Its gradient is a scatter-add of the output's gradient into the
    rows each rank owns: it arrives in the weight's layout, the weight is never gathered.
    Ids outside ``[0, num_embeddings)`` raise IndexError (on the ranks that hold them).
    """
    if not isinstance(weight, GlobalTensor) or weight.ndim != 2:
        raise ValueError(f"embedding: weight must be a 2-D GlobalTensor (num_embeddings, "
                         f"embedding_dim), got {getattr(weight, 'shape', type(weight).__name__)}")
    if not isinstance(ids, GlobalTensor) or ids.dtype.kind not in "iu":
        raise TypeError(f"embedding: ids must be a GlobalTensor of integers, got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")
    return ops.embedding(ids, weight, _rows_of(weight))  # type: ignore[no-any-return]



def layer_norm(x: GlobalTensor, weight: GlobalTensor | None = None,
               bias: GlobalTensor | None = None, eps: float = 1e-5) -> GlobalTensor:
    """Normalize over the last dim: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    ``var`` is the biased variance (as torch). Where no mesh axis splits ``x``'s last
    dim (every rank holds whole rows: broadcast, or a split batch or sequence dim), the
    normalization is one op, :func:`sbpmpi.ops.normalize`, with its own backward (a
    partial ``x`` is all-reduced first). Where the last dim is split, it is written
    with global ops: the mean and the variance are partial sums that each take one all-reduce
    of the reduced shape (``x.shape[:-1] + (1,)``), never a gather of ``x``. ``weight``
    and ``bias`` have shape ``(x.shape[-1],)`` (or are None).
    """
    if not isinstance(x, GlobalTensor) or x.ndim < 1 or not is_floating(x.dtype):
        raise TypeError(f"layer_norm: x must be a floating GlobalTensor of at least 1 dim, "
                        f"got {getattr(x, 'dtype', type(x).__name__)} of shape "
                        f"{getattr(x, 'shape', None)}")
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and (not isinstance(t, GlobalTensor) or t.shape != x.shape[-1:]):
            raise ValueError(f"layer_norm: {what} must be None or a GlobalTensor of shape "
                             f"{x.shape[-1:]}, got {getattr(t, 'shape', type(t).__name__)}")
    eps = check_eps("layer_norm", eps)
    last = x.ndim - 1
    if not any(isinstance(s, Split) and s.dim == last for s in x.sbp):
        y = ops.normalize(x, eps)
    else:
        y = _split_row_normalize(x, eps)
    if weight is not None:
        y = ops.mul(y, weight)
    if bias is not None:
        y = ops.add(y, bias)
    return y  # type: ignore[no-any-return]


def _split_row_normalize(x: GlobalTensor, eps: float) -> GlobalTensor:
    """``(x - mean) / sqrt(var + eps)`` over a split last dim, as global ops; a half-width
    ``x`` on its float32 copy, rounded once (as :func:`sbpmpi.ops.normalize` computes)."""
    xw = ops.astype(x, float32) if is_half(x.dtype) else x
    # the moments reduced here rather than left to inference: a partial mean could
    # also be consumed by making x partial too (free), which would then box
    # full-size tensors instead of the small moments
    centered = ops.sub(xw, reduced(ops.mean(xw, -1, keepdim=True)))
    var = reduced(ops.mean(ops.mul(centered, centered), -1, keepdim=True))
    # the reciprocal on the small reduced shape, then a product: a full-size div
    # costs more forward and three more full-size passes backward
    y = ops.mul(centered, ops.div(1.0, ops.sqrt(ops.add(var, eps))))
    return y if xw is x else ops.astype(y, x.dtype)



def dropout(x: GlobalTensor, p: float = 0.5, training: bool = True) -> GlobalTensor:
    """Zero each element with probability ``p`` and scale the others by ``1 / (1 - p)``.

    The mask is drawn like ``sm.rand`` (one random stream per call, on every rank): it
    depends on the seed, the call number and the global index only, so it is the same
    whatever the layout of ``x`` and the world size. ``training=False`` (or ``p == 0``)
    returns ``x`` itself.
    """
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"dropout: x must be a GlobalTensor, got {type(x).__name__}")
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.floating)) \
            or not 0 <= p <= 1:
        raise ValueError(f"dropout: p must be a probability in [0, 1], got {p!r}")
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"dropout: training must be a bool, got {type(training).__name__}")
    if not training or p == 0:
        return x
    # a partial x takes a broadcast mask: the product stays a partial of x * mask
    sbp = tuple(broadcast if isinstance(s, Partial) else s for s in x.sbp)
    with no_grad():
        u = rand(x.shape, placement=x.placement, sbp=sbp, dtype=np.float64)
        keep = ops.astype(ops.lt(u, 1.0 - float(p)), x.dtype)
        mask = ops.div(keep, 1.0 - float(p)) if p < 1 else keep
    return ops.mul(x, mask)  # type: ignore[no-any-return]
