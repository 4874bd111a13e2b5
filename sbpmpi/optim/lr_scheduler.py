"""Learning-rate schedules in the torch style: they set ``"lr"`` of each parameter group::

    opt = sm.optim.AdamW(model.parameters(), lr=3e-4)
    warmup = LinearLR(opt, start_factor=0.01, total_iters=100)
    cosine = CosineAnnealingLR(opt, T_max=900)
    sched = SequentialLR(opt, [warmup, cosine], milestones=[100])
    for step in range(1000):
        ...; opt.step(); sched.step()

As torch, constructing a schedule sets each group's ``"initial_lr"`` (once) and the
learning rate of epoch 0; ``step()`` moves to the next epoch. Each learning rate is the
closed form of torch's schedule at the epoch (torch's chained updates give the same
values up to rounding). Nothing here communicates: every rank computes the same numbers.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..core.modes import current_modes

__all__ = ["LRScheduler", "LambdaLR", "LinearLR", "CosineAnnealingLR", "SequentialLR"]


def _real(owner: str, name: str, value: Any, low: float = -math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            and not hasattr(value, "__float__"):
        raise TypeError(f"{owner}: {name} must be a real number, got {type(value).__name__} "
                        f"{value!r}")
    v = float(value)
    if not (v >= low and math.isfinite(v)):
        raise ValueError(f"{owner}: {name} must be a finite number >= {low}, got {value!r}")
    return v


def _count(owner: str, name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{owner}: {name} must be an int >= {low}, got {value!r}")
    return value


class LRScheduler:
    """Base class: ``optimizer`` (anything with torch-style ``param_groups``), the epoch
    ``last_epoch`` and the groups' ``base_lrs`` (their ``"initial_lr"``).

    Subclasses give :meth:`lr_at`, the learning rates of an epoch.
    """

    def __init__(self, optimizer: Any, last_epoch: int = -1) -> None:
        owner = type(self).__name__
        groups = getattr(optimizer, "param_groups", None)
        if not isinstance(groups, list) or not groups:
            raise TypeError(f"{owner}: optimizer must be an sm.optim optimizer (with "
                            f"param_groups), got {type(optimizer).__name__}")
        if isinstance(last_epoch, bool) or not isinstance(last_epoch, int) or last_epoch < -1:
            raise ValueError(f"{owner}: last_epoch must be an int >= -1, got {last_epoch!r}")
        if last_epoch == -1:
            for g in groups:
                g.setdefault("initial_lr", g["lr"])
        else:
            for k, g in enumerate(groups):
                if "initial_lr" not in g:
                    raise KeyError(f"{owner}: param_groups[{k}] has no 'initial_lr': resuming "
                                   f"(last_epoch={last_epoch}) needs a schedule made before")
        self.optimizer = optimizer
        self.base_lrs: list[float] = [float(g["initial_lr"]) for g in groups]
        self.last_epoch = last_epoch
        self._last_lr: list[float] = [float(g["lr"]) for g in groups]
        self.step()

    def lr_at(self, epoch: int) -> list[float]:
        """The learning rate of each group at ``epoch``."""
        raise NotImplementedError

    def step(self) -> None:
        """Move to the next epoch and set each group's learning rate."""
        # a step being captured as a graph (sm.graph): replayed as a call
        if (recorder := current_modes().recorder) is not None:
            with recorder.host_call(self.step, (), ()):
                self.last_epoch += 1
                self._set(self.lr_at(self.last_epoch))
            return
        self.last_epoch += 1
        self._set(self.lr_at(self.last_epoch))

    def _set(self, lrs: Sequence[float]) -> None:
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
        self._last_lr = [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The learning rates the last :meth:`step` set, one per group."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """Plain values (no optimizer, no functions): ``last_epoch``, ``base_lrs``, ..."""
        return {k: v for k, v in vars(self).items()
                if k != "optimizer" and not callable(v) and k not in self._not_state}

    _not_state: tuple[str, ...] = ()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave (the optimizer's groups are not touched)."""
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}.load_state_dict: needs a dict, got "
                            f"{type(state).__name__}")
        self.__dict__.update(state)


class LambdaLR(LRScheduler):
    """``lr = initial_lr * lr_lambda(epoch)`` (one function, or one per group)."""

    _not_state = ("lr_lambdas",)

    def __init__(self, optimizer: Any, lr_lambda: Callable[[int], float]
                 | Sequence[Callable[[int], float]], last_epoch: int = -1) -> None:
        n = len(getattr(optimizer, "param_groups", ()) or ())
        fns: list[Any] = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(fns) != n or not all(callable(f) for f in fns):
            raise ValueError(f"LambdaLR: lr_lambda must be a function or a list of {n} "
                             f"functions (one per parameter group), got {lr_lambda!r}")
        self.lr_lambdas = fns
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> list[float]:
        return [base * float(f(epoch)) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class LinearLR(LRScheduler):
    """Linear warmup (or decay) of the factor from ``start_factor`` to ``end_factor``
    over ``total_iters`` epochs, then constant:
    ``lr = initial_lr * (start + (end - start) * min(epoch, total_iters) / total_iters)``."""

    def __init__(self, optimizer: Any, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        self.start_factor = _real("LinearLR", "start_factor", start_factor)
        self.end_factor = _real("LinearLR", "end_factor", end_factor, 0.0)
        if not 0 < self.start_factor <= 1 or not 0 <= self.end_factor <= 1:
            raise ValueError(f"LinearLR: start_factor must lie in (0, 1] and end_factor in "
                             f"[0, 1], got {start_factor!r} and {end_factor!r}")
        self.total_iters = _count("LinearLR", "total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> list[float]:
        f = self.start_factor + (self.end_factor - self.start_factor) * \
            min(epoch, self.total_iters) / self.total_iters
        return [base * f for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``."""

    def __init__(self, optimizer: Any, T_max: int, eta_min: float = 0.0,  # noqa: N803
                 last_epoch: int = -1) -> None:
        self.T_max = _count("CosineAnnealingLR", "T_max", T_max)
        self.eta_min = _real("CosineAnnealingLR", "eta_min", eta_min, 0.0)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> list[float]:
        c = (1 + math.cos(math.pi * epoch / self.T_max)) / 2
        return [self.eta_min + (base - self.eta_min) * c for base in self.base_lrs]


class SequentialLR(LRScheduler):
    """``schedulers[k]`` from epoch ``milestones[k - 1]`` on, each counting its epochs from
    its milestone (warmup then cosine: ``SequentialLR(opt, [LinearLR(...),
    CosineAnnealingLR(...)], milestones=[warmup_steps])``)."""

    _not_state = ("_schedulers",)

    def __init__(self, optimizer: Any, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int], last_epoch: int = -1) -> None:
        scheds = list(schedulers)
        if not scheds or not all(isinstance(s, LRScheduler) for s in scheds):
            raise TypeError(f"SequentialLR: schedulers must be a non-empty list of schedules, "
                            f"got {schedulers!r}")
        if any(s.optimizer is not optimizer for s in scheds):
            raise ValueError("SequentialLR: every schedule must belong to the optimizer given")
        ms = list(milestones)
        if len(ms) != len(scheds) - 1:
            raise ValueError(f"SequentialLR: needs {len(scheds) - 1} milestones for "
                             f"{len(scheds)} schedules, got {ms}")
        for a, b in zip([0, *ms], ms):
            _count("SequentialLR", "milestones entry", b)
            if b <= a:
                raise ValueError(f"SequentialLR: milestones must increase, got {ms}")
        self._schedulers = scheds
        self.milestones = ms
        for g in optimizer.param_groups:  # the sub-schedules' constructions moved it
            g["lr"] = g.get("initial_lr", g["lr"])
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> list[float]:
        k = bisect.bisect_right(self.milestones, epoch)
        start = self.milestones[k - 1] if k else 0
        sched = self._schedulers[k]
        sched.last_epoch = epoch - start
        lrs = sched.lr_at(sched.last_epoch)
        sched._last_lr = list(lrs)
        return lrs
