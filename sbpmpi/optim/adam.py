"""Adam and AdamW, as ``torch.optim.Adam`` and ``torch.optim.AdamW``, and the moment
updates they share."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..tensor import GlobalTensor
from .optimizer import Optimizer, check_number

__all__ = ["Adam", "AdamW", "moments", "moments_promoted"]


def moments(xp: Any, s: Callable[[float], Any], m: Any, v: Any, g: Any, *, b1: float,
            b2: float, t: Any) -> None:
    """Adam's ``m = b1 m + (1 - b1) g`` and ``v = b2 v + (1 - b2) g^2`` in place, with the
    scratch array ``t`` for the temporaries and ``s`` for the scalars
    (:meth:`~sbpmpi.backend.memory.Scratch.scalars`)."""
    xp.multiply(m, s(b1), out=m)
    xp.multiply(g, s(1 - b1), out=t)
    xp.add(m, t, out=m)
    xp.multiply(v, s(b2), out=v)
    xp.multiply(g, g, out=t)
    xp.multiply(t, s(1 - b2), out=t)
    xp.add(v, t, out=v)


def moments_promoted(m: Any, v: Any, g: Any, b1: float, b2: float) -> None:
    """:func:`moments` with NumPy's promotion and its temporaries (a gradient or state
    of another dtype than its parameter)."""
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * (g * g)


class Adam(Optimizer):
    """Adam (as torch.optim.Adam, L2 weight decay added to the gradient).

    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``. ``params`` may be
    parameter groups (see :class:`Optimizer`).
    """

    buffers = ("exp_avg", "exp_avg_sq")
    hyper = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, params: Iterable[GlobalTensor] | Iterable[Mapping[str, Any]],
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})

    def _check_option(self, name: str, value: Any) -> Any:
        owner = type(self).__name__
        if name != "betas":
            return super()._check_option(name, value)
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise TypeError(f"{owner}: betas must be a pair of floats, got {value!r}")
        return (check_number(owner, "betas[0]", value[0], 0.0, 1.0, open_high=True),
                check_number(owner, "betas[1]", value[1], 0.0, 1.0, open_high=True))

    def _update(self, xp: Any, p: Any, g: Any, state: dict[str, Any], step: int,
                group: Mapping[str, Any]) -> None:
        b1, b2 = group["betas"]
        w = self._temporaries(xp, p, g, state)
        if w is None:  # mixed dtypes: NumPy's promotion, with its temporaries
            if group["weight_decay"]:
                g = g + group["weight_decay"] * p
            m, v = state["exp_avg"], state["exp_avg_sq"]
            moments_promoted(m, v, g, b1, b2)
            denom = xp.sqrt(v / (1 - b2 ** step)) + group["eps"]
            p -= (group["lr"] / (1 - b1 ** step)) * (m / denom)
            return
        # the same arithmetic in the same order, into the scratch arrays
        (t1, t2), s = w
        if group["weight_decay"]:
            xp.multiply(p, s(group["weight_decay"]), out=t1)
            g = xp.add(g, t1, out=t1)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        moments(xp, s, m, v, g, b1=b1, b2=b2, t=t2)
        xp.divide(v, s(1 - b2 ** step), out=t2)
        xp.sqrt(t2, out=t2)
        xp.add(t2, s(group["eps"]), out=t2)  # denom
        xp.divide(m, t2, out=t2)
        xp.multiply(t2, s(group["lr"] / (1 - b1 ** step)), out=t2)
        xp.subtract(p, t2, out=p)


class AdamW(Adam):
    """AdamW (as torch.optim.AdamW): Adam with decoupled weight decay.

    ``p *= 1 - lr * weight_decay``, then ``m = b1 m + (1 - b1) g``,
    ``v = b2 v + (1 - b2) g^2``, ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t)
    + eps)``. Give biases and norm weights a group with ``weight_decay=0.0`` to leave
    them undecayed (see :class:`Optimizer`).
    """

    def __init__(self, params: Iterable[GlobalTensor] | Iterable[Mapping[str, Any]],
                 lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        super().__init__(params, lr, betas, eps, weight_decay)

    def _update(self, xp: Any, p: Any, g: Any, state: dict[str, Any], step: int,
                group: Mapping[str, Any]) -> None:
        b1, b2 = group["betas"]
        lr = group["lr"]
        w = self._temporaries(xp, p, g, state)
        if w is None:  # mixed dtypes: NumPy's promotion, with its temporaries
            if group["weight_decay"]:
                p *= 1 - lr * group["weight_decay"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            moments_promoted(m, v, g, b1, b2)
            denom = xp.sqrt(v) / math.sqrt(1 - b2 ** step) + group["eps"]
            p -= (lr / (1 - b1 ** step)) * (m / denom)
            return
        # the same arithmetic in the same order, into the scratch array
        (_, t2), s = w
        if group["weight_decay"]:
            xp.multiply(p, s(1 - lr * group["weight_decay"]), out=p)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        moments(xp, s, m, v, g, b1=b1, b2=b2, t=t2)
        xp.sqrt(v, out=t2)
        xp.divide(t2, s(math.sqrt(1 - b2 ** step)), out=t2)
        xp.add(t2, s(group["eps"]), out=t2)  # denom
        xp.divide(m, t2, out=t2)
        xp.multiply(t2, s(lr / (1 - b1 ** step)), out=t2)
        xp.subtract(p, t2, out=p)
