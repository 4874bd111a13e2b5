"""``sm.amp.GradScaler``: loss scaling for float16 training, as ``torch.amp.GradScaler``.

float16 holds no value below about 6e-8: the small gradients of a float16 backward
flush to zero. The scaler multiplies the loss by ``scale`` before ``backward`` (every
gradient is then ``scale`` times larger), divides the gradients by it before the step
(:meth:`GradScaler.unscale_`), and skips the step when any gradient of any rank is inf
or NaN, halving the scale; after ``growth_interval`` steps without one it doubles it.

The inf/NaN check is one all-reduce of one number over the world: each rank looks at
the local shards of its gradients, and every rank then skips or takes the step alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import backend, comm
from ..core.dtypes import float32, is_half
from ..core.placement import placement as make_placement
from ..core.sbp import broadcast
from ..creation import tensor as make_tensor
from ..env import get_world_size
from ..tensor import GlobalTensor

__all__ = ["GradScaler"]

_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _positive(name: str, value: Any, above_one: bool = False, below_one: bool = False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            or not math.isfinite(float(value)) or not float(value) > 0:
        raise ValueError(f"GradScaler: {name} must be a finite number > 0, got {value!r}")
    v = float(value)
    if above_one and not v > 1:
        raise ValueError(f"GradScaler: {name} must be > 1, got {value!r}")
    if below_one and not v < 1:
        raise ValueError(f"GradScaler: {name} must be < 1, got {value!r}")
    return v


def scaled_dtype(outputs: GlobalTensor) -> np.dtype:
    """The dtype of ``outputs * scale``: torch's type promotion of ``outputs`` with its
    scale, a 0-d float32 tensor. A 0-d half-width loss (float16, bfloat16) is scaled in
    float32, so a float16 loss of 2.0 times 2**16 is 131072, not inf; an integer one too;
    an array of more dimensions keeps its floating dtype (a 0-d operand does not widen
    it), as a float32 or float64 loss does."""
    dt = outputs.dtype
    if dt.kind in "biu" or (outputs.ndim == 0 and is_half(dt)):
        return float32
    return dt


def _params(optimizer: Any) -> list[GlobalTensor]:
    params = getattr(optimizer, "params", None)
    if params is None:
        params = [p for g in getattr(optimizer, "param_groups", ()) for p in g["params"]]
    if not params and not hasattr(optimizer, "step"):
        raise TypeError(f"GradScaler: {type(optimizer).__name__} is not an optimizer (no "
                        f"params and no step)")
    return list(params)


class GradScaler:
    """Scale the loss, unscale the gradients, skip steps with inf/NaN gradients.

    ``GradScaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, enabled=True)``; per iteration::

        scaler.scale(loss).backward()
        scaler.unscale_(opt)          # optional: to clip the true gradients
        scaler.step(opt)              # skipped when a gradient is inf/NaN on any rank
        scaler.update()

    With ``enabled=False`` every method is a pass-through (``scale(loss)`` is ``loss``).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        if not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(f"GradScaler: enabled must be a bool, got {enabled!r}")
        if isinstance(growth_interval, (bool, np.bool_)) or \
                not isinstance(growth_interval, (int, np.integer)) or growth_interval < 1:
            raise ValueError(f"GradScaler: growth_interval must be an int >= 1, got "
                             f"{growth_interval!r}")
        self._scale = _positive("init_scale", init_scale)
        self._growth_factor = _positive("growth_factor", growth_factor, above_one=True)
        self._backoff_factor = _positive("backoff_factor", backoff_factor, below_one=True)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._enabled = bool(enabled)
        #: per optimizer (by id) this iteration: whether it was unscaled, and found_inf
        self._unscaled: dict[int, bool] = {}

    # -- the loss -------------------------------------------------------------------------
    def scale(self, outputs: Any) -> Any:
        """``outputs * scale`` (a GlobalTensor, or a list/tuple of them), in the dtype
        torch's promotion with a float32 scale gives (:func:`scaled_dtype`): float32 for
        a float16 or bfloat16 loss. The backward reaches ``outputs`` in its own dtype."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if not isinstance(outputs, GlobalTensor):
            raise TypeError(f"GradScaler.scale: outputs must be a GlobalTensor, got "
                            f"{type(outputs).__name__}")
        dt = scaled_dtype(outputs)
        wide = outputs if outputs.dtype == dt else outputs.astype(dt)
        return wide * dt.type(self._scale)

    # -- the gradients --------------------------------------------------------------------
    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and find out (one
        all-reduce over the world) whether any of them, on any rank, is inf or NaN.

        Raises
        ------
        RuntimeError
            When called twice for one optimizer before :meth:`update`.
        """
        if not self._enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("GradScaler.unscale_() has already been called on this "
                               "optimizer since the last update()")
        inv = 1.0 / self._scale
        bad = 0.0
        for p in _params(optimizer):
            g = p.grad
            if g is None:
                continue
            local = g.to_local()
            xp = backend.get_xp(g.placement.type) if g.to_local().size else np
            if local.size and not bool(xp.isfinite(local).all()):
                bad = 1.0
            g._set_data((local * local.dtype.type(inv)).astype(local.dtype, copy=False))
        flag = np.array([bad])
        comm.all_reduce(flag, comm.ReduceOp.MAX)  # the one check of every rank's gradients
        self._unscaled[id(optimizer)] = bool(flag[0] > 0)

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step()`` unless a gradient was inf/NaN (on any rank): every rank
        skips or steps alike. Unscales first unless :meth:`unscale_` already did.
        Returns what ``step`` returns, or None when skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if self._unscaled[id(optimizer)]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: float | None = None) -> None:
        """Set the scale for the next iteration: ``new_scale`` if given; else halved
        (``backoff_factor``) when a step of this iteration found inf/NaN, multiplied by
        ``growth_factor`` after ``growth_interval`` iterations in a row without one."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = _positive("new_scale", new_scale)
        elif any(self._unscaled.values()):
            self._scale *= self._backoff_factor
            self._growth_tracker = 0
        elif self._unscaled:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale *= self._growth_factor
                self._growth_tracker = 0
        self._unscaled = {}

    # -- state ----------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def is_enabled(self) -> bool:
        """Whether the scaler scales."""
        return self._enabled

    def state_dict(self) -> dict[str, GlobalTensor]:
        """The scale, factors, interval and growth tracker as 0-d float64 tensors broadcast
        over the world (saved with ``sm.save_state``, as the optimizers' state); an empty
        dict when disabled (as torch)."""
        if not self._enabled:
            return {}
        pl = make_placement("cpu", list(range(get_world_size())))
        values = (self._scale, self._growth_factor, self._backoff_factor,
                  float(self._growth_interval), float(self._growth_tracker))
        return {k: make_tensor(np.float64(v), placement=pl, sbp=broadcast)
                for k, v in zip(_KEYS, values)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values (GlobalTensors or numbers)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"GradScaler.load_state_dict: state must be a dict, got "
                            f"{type(state).__name__}")
        if not state:
            raise RuntimeError("GradScaler.load_state_dict: the state is empty (saved by a "
                               "disabled scaler)")
        missing = [k for k in _KEYS if k not in state]
        if missing:
            raise KeyError(f"GradScaler.load_state_dict: missing {missing}")

        def value(k: str) -> float:
            v = state[k]
            return float(v.numpy()) if isinstance(v, GlobalTensor) else float(v)

        self._scale = _positive("scale", value("scale"))
        self._growth_factor = _positive("growth_factor", value("growth_factor"),
                                        above_one=True)
        self._backoff_factor = _positive("backoff_factor", value("backoff_factor"),
                                         below_one=True)
        self._growth_interval = int(value("growth_interval"))
        self._growth_tracker = int(value("_growth_tracker"))

    def __repr__(self) -> str:
        return (f"GradScaler(scale={self.get_scale()}, growth_interval="
                f"{self._growth_interval}, enabled={self._enabled})")
