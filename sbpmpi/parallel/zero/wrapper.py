"""``ZeroModule``: what the three ZeRO stages' modules share. Each is an ``sm.nn.Module``
around the model, under the model's own parameter names (a checkpoint saved under any
stage loads under any other, or without ZeRO); the model keeps its class and its
``forward``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...nn.module import Module
from ...tensor import GlobalTensor
from .params import ShardedParam, shardable_params

__all__ = ["ZeroModule"]


class ZeroModule(Module):
    """The model ``module`` under a ZeRO stage on mesh axis ``axis`` (made by
    :func:`sbpmpi.nn.shard`).

    ``parameters()``, ``named_parameters()``, ``state_dict()``, ``load_state_dict()``,
    ``zero_grad()``, ``train()`` and ``eval()`` are the module's, under its own names
    (stages 2 and 3: holding the split leaves). ``sharded`` lists the parameters the stage
    shards (those broadcast on ``axis``; the others are left as they are).
    """

    #: the ZeRO stage (1, 2 or 3)
    stage: int = 0
    #: bytes of gathered whole parameters held now, and at most since :meth:`reset_peak`
    #: (stage 3 gathers; the others hold none)
    gathered_bytes: int = 0
    peak_gathered_bytes: int = 0

    def __init__(self, module: Module, axis: int) -> None:
        self.module = module
        self.axis = axis
        self.sharded: list[ShardedParam] = shardable_params(module, axis)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # the module's names: the wrapper adds no prefix (FSDP2 keeps the module's too)
    def _members(self) -> Iterator[tuple[str, Any]]:
        return self.module._members()

    def modules(self) -> Iterator[Module]:
        yield self
        yield from self.module.modules()

    def reset_peak(self) -> None:
        """Start counting :attr:`peak_gathered_bytes` again from the bytes held now."""
        self.peak_gathered_bytes = self.gathered_bytes

    def replaced(self) -> list[tuple[GlobalTensor, GlobalTensor]]:
        """``(parameter, leaf)`` of each parameter the stage replaced by a split leaf."""
        return [(sp.param, sp.leaf) for sp in self.sharded if sp.leaf is not sp.param]

    def held_parameters(self) -> list[GlobalTensor]:
        """The parameter tensors this rank holds between steps."""
        return self.parameters()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.module!r}, axis={self.axis})"
