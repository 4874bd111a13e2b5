"""Neural networks on global tensors, with torch's names: modules and containers, layers,
their functional forms, gradient clipping, data parallelism and ZeRO.

- :mod:`.module`: ``Module``, the base class.
- :mod:`.containers`: ``ModuleList``, ``Sequential``.
- :mod:`.layers`: ``Linear``, ``Embedding``, ``LayerNorm``, ``Dropout``.
- :mod:`.functional`: ``relu``, ``gelu``, ``softmax``, ``log_softmax``, ``cross_entropy``,
  ``embedding``, ``layer_norm``, ``dropout``.
- :mod:`.clip`: ``clip_grad_norm_``.
- ``DataParallel``, ``no_sync`` and ``shard`` (ZeRO) are the parallel wing's
  (:mod:`sbpmpi.parallel`), shown here under the names torch gives them. The wing builds
  on this package, so it is the composition root (``sbpmpi/__init__``) that installs
  them here, from above (:mod:`sbpmpi.names_from_above`); this package names no layer
  above it.

Layouts are the user's choice, per parameter (see :mod:`.layers`). Backward gives each
parameter its gradient in its own layout, so any :mod:`sbpmpi.optim` optimizer updates
it locally.
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import names_from_above as _above
from .clip import clip_grad_norm_
from .containers import ModuleList, Sequential
from .functional import (
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    log_softmax,
    relu,
    softmax,
)
from .layers import Dropout, Embedding, LayerNorm, Linear
from .mixed_precision import MixedPrecision
from .module import Module
from .recompute import checkpoint

__all__ = ["Module", "ModuleList", "Sequential", "Linear", "Embedding", "LayerNorm", "Dropout",
           "relu", "gelu", "softmax", "log_softmax", "cross_entropy", "embedding", "layer_norm",
           "dropout", "clip_grad_norm_", "checkpoint", "MixedPrecision", "DataParallel", "no_sync", "shard", "Graph"]

#: Names that moved, kept for one release: ``sm.nn.<old>`` -> ``sm.<new>``.
_MOVED = {"save_training_state": "checkpoint.save_training_state",
          "load_training_state": "checkpoint.load_training_state"}


def __dir__() -> list[str]:
    # the names loaded on first use too (autodoc, completion)
    return sorted(set(globals()) | _above.names(__name__) | {"Graph"})


def __getattr__(name: str) -> Any:
    if name in _above.names(__name__):  # DataParallel, no_sync, shard
        value = globals()[name] = _above.load(__name__, name)
        return value
    if name == "Graph":  # OneFlow's nn.Graph: a step captured and replayed (sm.graph)
        from ..capture import Graph

        value = globals()[name] = Graph
        return value
    if name in _MOVED:
        from .. import checkpoint

        warnings.warn(f"sm.nn.{name} moved to sm.{_MOVED[name]}; the old name goes in the "
                      f"next release", DeprecationWarning, stacklevel=2)
        return getattr(checkpoint, name)
    raise AttributeError(f"module 'sbpmpi.nn' has no attribute {name!r}")
