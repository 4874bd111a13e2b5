"""The checks of :func:`sbpmpi.nn.shard`'s arguments, made alike on every rank before
any communication."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...nn.module import Module
from ...optim import Optimizer

__all__ = ["check_shard"]


def check_shard(module: Any, optimizer: Any, stage: Any, axis: Any, bucketed: Any,
                prefetch: Any) -> None:
    """Raise (TypeError or ValueError, naming the argument and its value) unless the
    arguments of :func:`sbpmpi.nn.shard` make sense together; metadata only."""
    if not isinstance(module, Module):
        raise TypeError(f"shard: module must be an sm.nn.Module, got {type(module).__name__}")
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"shard: optimizer must be an sm.optim optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(stage, (bool, np.bool_)) or stage not in (1, 2, 3):
        raise ValueError(f"shard: stage must be 1, 2 or 3, got {stage!r}")
    params = module.parameters()
    if not params:
        raise ValueError("shard: the module has no parameters")
    if {id(p) for p in params} != {id(p) for p in optimizer.params}:
        raise ValueError("shard: the optimizer must hold exactly the module's parameters "
                         "(make it with module.parameters())")
    nd = params[0].placement.ndim
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) \
            or not 0 <= axis < nd or any(p.placement.ndim != nd for p in params):
        raise ValueError(f"shard: axis must be a mesh axis of the parameters' {nd}-d "
                         f"placement (0..{nd - 1}), got {axis!r}")
    for name, flag in (("bucketed", bucketed), ("prefetch", prefetch)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"shard: {name} must be a bool, got {type(flag).__name__} "
                            f"{flag!r}")
