"""Stochastic gradient descent, as ``torch.optim.SGD``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..tensor import GlobalTensor
from .optimizer import Optimizer

__all__ = ["SGD"]


class SGD(Optimizer):
    """Stochastic gradient descent with momentum and weight decay (as torch.optim.SGD).

    ``g = grad + weight_decay * p``; ``buf = momentum * buf + g`` (when momentum > 0);
    ``p -= lr * buf`` (or ``lr * g``). ``params`` may be parameter groups (see
    :class:`Optimizer`).
    """

    hyper = ("lr", "momentum", "weight_decay")

    def __init__(self, params: Iterable[GlobalTensor] | Iterable[Mapping[str, Any]],
                 lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum,
                                  "weight_decay": weight_decay})

    def _buffers(self, group: Mapping[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",) if group["momentum"] else ()

    def _update(self, xp: Any, p: Any, g: Any, state: dict[str, Any], step: int,
                group: Mapping[str, Any]) -> None:
        w = self._temporaries(xp, p, g, state)
        if w is None:  # mixed dtypes: NumPy's promotion, with its temporaries
            if group["weight_decay"]:
                g = g + group["weight_decay"] * p
            if group["momentum"]:
                buf = state["momentum_buffer"]
                buf *= group["momentum"]
                buf += g
                g = buf
            p -= group["lr"] * g
            return
        # the same arithmetic in the same order, into the scratch arrays
        (t1, t2), s = w
        if group["weight_decay"]:
            xp.multiply(p, s(group["weight_decay"]), out=t1)
            g = xp.add(g, t1, out=t1)
        if group["momentum"]:
            buf = state["momentum_buffer"]
            xp.multiply(buf, s(group["momentum"]), out=buf)
            xp.add(buf, g, out=buf)
            g = buf
        xp.multiply(g, s(group["lr"]), out=t2)
        xp.subtract(p, t2, out=p)
