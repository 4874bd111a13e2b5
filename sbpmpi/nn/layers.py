"""Layers with parameters: ``Linear``, ``Embedding``, ``LayerNorm``, ``Dropout``.

Layouts are the user's choice, per parameter: data parallelism keeps weights broadcast
and splits the batch, tensor parallelism splits ``Linear.weight`` (shape ``(in, out)``,
``y = x @ weight + bias``) by columns (``split(1)``: the output is split) or rows
(``split(0)``: the output is a partial sum, reduced where an op needs it), and an N-d
placement combines them per mesh axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import ops
from ..core.placement import Placement
from ..core.sbp import SBP, Broadcast, Partial, Split, broadcast, split
from ..creation import ones, rand, randn, zeros
from ..grad_mode import no_grad
from ..ops import autocast
from ..tensor import GlobalTensor
from .functional import dropout, embedding, layer_norm
from .module import Module

__all__ = ["Linear", "Embedding", "LayerNorm", "Dropout"]


def _param_sbp(owner: str, placement: Any, sbp: SBP | Sequence[SBP] | None,
               what: str = "sbp") -> tuple[SBP, ...]:
    """A parameter's SBP: broadcast by default, never partial (``what`` names it in the
    error)."""
    if not isinstance(placement, Placement):
        raise TypeError(f"{owner}: placement= must be an sm.placement, got "
                        f"{type(placement).__name__}")
    out = (broadcast,) * placement.ndim if sbp is None else \
        ((sbp,) if isinstance(sbp, (Split, Broadcast, Partial)) else tuple(sbp))
    if any(isinstance(s, Partial) for s in out):
        raise ValueError(f"{owner}: {what} {out} is partial; use broadcast or split")
    return out



def _positive(owner: str, name: str, n: Any) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {n!r}")
    return int(n)



def _bias_sbp(weight_sbp: Sequence[SBP]) -> tuple[SBP, ...]:
    """Bias (shape ``(out,)``) follows the weight's output dim: split where it is split(1)."""
    return tuple(split(0) if isinstance(s, Split) and s.dim == 1 else broadcast
                 for s in weight_sbp)



class Linear(Module):
    """``y = x @ weight + bias`` with ``weight`` of shape ``(in_features, out_features)``.

    Weights and bias start uniform in ``[-1/sqrt(in), 1/sqrt(in)]`` (as torch), drawn by
    ``sm.rand``: the values depend on the seed only, not on the layout or world size.

    Parameters
    ----------
    in_features, out_features : int
    bias : bool
    placement : Placement
        Where the parameters live.
    sbp : SBP or sequence of SBP
        The weight's SBP (default broadcast on every mesh axis): ``split(1)`` splits
        the outputs (column parallel), ``split(0)`` the inputs (row parallel).
    bias_sbp : optional
        Default: ``split(0)`` on the mesh axes where the weight is ``split(1)``,
        broadcast elsewhere.
    dtype : default float32
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
                 bias_sbp: SBP | Sequence[SBP] | None = None, dtype: Any = np.float32) -> None:
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Linear: {name} must be a positive int, got {n!r}")
        wsbp = _param_sbp("Linear", placement, sbp, what="weight sbp")
        self.in_features, self.out_features = int(in_features), int(out_features)
        k = 1.0 / math.sqrt(self.in_features)
        with no_grad():
            w = rand(self.in_features, self.out_features, placement=placement, sbp=wsbp,
                     dtype=dtype) * (2 * k) - k
        self.weight = w.detach().requires_grad_()
        self.bias: GlobalTensor | None = None
        if bias:
            bsbp = _bias_sbp(wsbp) if bias_sbp is None else bias_sbp
            with no_grad():
                b = rand(self.out_features, placement=placement, sbp=bsbp,
                         dtype=dtype) * (2 * k) - k
            self.bias = b.detach().requires_grad_()

    def forward(self, x: GlobalTensor) -> GlobalTensor:
        y = ops.matmul(x, self.weight)
        if self.bias is None:
            return y
        low = autocast.low_dtype()  # inside sm.autocast the bias joins in the low dtype
        return ops.add(y, self.bias if low is None or y.dtype != low else self.bias.astype(low))

    def __repr__(self) -> str:
        return (f"Linear({self.in_features}, {self.out_features}, bias={self.bias is not None},"
                f" sbp={tuple(self.weight.sbp)})")



class Embedding(Module):
    """A lookup table: ``Embedding(V, D)(ids) == embedding(ids, weight)``, ``weight`` of
    shape ``(V, D)`` drawn from N(0, 1) (as torch) by ``sm.randn``.

    ``sbp`` is the weight's SBP (default broadcast): ``split(0)`` for a vocabulary-parallel
    table, ``split(1)`` to split the embedding dim.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *,
                 placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
                 dtype: Any = np.float32) -> None:
        self.num_embeddings = _positive("Embedding", "num_embeddings", num_embeddings)
        self.embedding_dim = _positive("Embedding", "embedding_dim", embedding_dim)
        wsbp = _param_sbp("Embedding", placement, sbp)
        self.weight = randn(self.num_embeddings, self.embedding_dim, placement=placement,
                            sbp=wsbp, dtype=dtype).requires_grad_()

    def forward(self, ids: GlobalTensor) -> GlobalTensor:
        return embedding(ids, self.weight)

    def __repr__(self) -> str:
        return (f"Embedding({self.num_embeddings}, {self.embedding_dim}, "
                f"sbp={tuple(self.weight.sbp)})")



class LayerNorm(Module):
    """:func:`layer_norm` over the last dim, of size ``dim``, with a learned ``weight``
    (ones) and ``bias`` (zeros, unless ``bias=False``); ``sbp`` is theirs (default
    broadcast; ``split(0)`` matches activations split on their last dim)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, *,
                 placement: Placement | None = None, sbp: SBP | Sequence[SBP] | None = None,
                 dtype: Any = np.float32) -> None:
        self.dim = _positive("LayerNorm", "dim", dim)
        self.eps = float(eps)
        psbp = _param_sbp("LayerNorm", placement, sbp)
        self.weight = ones(self.dim, placement=placement, sbp=psbp, dtype=dtype).requires_grad_()
        self.bias: GlobalTensor | None = None
        if bias:
            self.bias = zeros(self.dim, placement=placement, sbp=psbp,
                              dtype=dtype).requires_grad_()

    def forward(self, x: GlobalTensor) -> GlobalTensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    def __repr__(self) -> str:
        return f"LayerNorm({self.dim}, eps={self.eps}, bias={self.bias is not None})"



class Dropout(Module):
    """:func:`dropout` with probability ``p`` while ``training`` (see :meth:`Module.eval`)."""

    def __init__(self, p: float = 0.5) -> None:
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.floating)) \
                or not 0 <= p <= 1:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p!r}")
        self.p = float(p)

    def forward(self, x: GlobalTensor) -> GlobalTensor:
        return dropout(x, self.p, self.training)

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"
