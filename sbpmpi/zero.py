"""ZeRO as layouts: optimizer state (stage 1) and parameters (stage 3) split over the
data-parallel mesh axis (:func:`sbpmpi.nn.shard`).

Under data parallelism every rank holds the whole of each parameter (broadcast on the
data-parallel axis), its whole gradient and its whole optimizer state. ZeRO (DeepSpeed)
and PyTorch's FSDP keep only a slice per rank; in SBP terms the slice is ``split(0)`` on
that axis and the all-gathers and reduce-scatters are conversions:

* stage 1: the optimizer state tensors are ``split(0)``; a step updates this rank's
  slice of each parameter (the slices of a broadcast parameter and gradient are local
  views, no communication) and all-gathers the updated parameter;
* stage 3: the parameters themselves are ``split(0)`` leaves; each forward all-gathers
  them (``p.to_global(sbp=broadcast)``, recorded on the tape), so backward reduce-scatters
  each gradient straight into the split (the conversion's backward rule), and the
  optimizer, given the split leaves, keeps its state split and updates locally. The
  gathered copies live until the graph is dropped after backward (FSDP2 with
  ``reshard_after_forward=False``); between steps each rank holds 1/N of the parameters,
  gradients and state. Bytes sent per step: an all-gather and a reduce-scatter of the
  parameters, as the all-reduce of data parallelism.

Stage 2 (gradients reduce-scattered, parameters kept whole) is not offered: stage 3 here
reduce-scatters the gradients with the same bytes and holds less.

Parameters that are not broadcast on the axis (tensor-parallel splits, say) and 0-d ones
are left as they are. Training gives the unsharded run's results (the same sums, in
another order: equal within float rounding); checkpoints name and box every tensor by
its global value, so a state saved under any stage loads under any other, on any world
size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from . import backend
from .autograd.mode import no_grad
from .core.sbp import SBP, Broadcast, split
from .tensor import GlobalTensor

__all__ = ["shard", "ShardedModule", "ShardedOptimizer"]


def _split_sbp(p: GlobalTensor, axis: int) -> tuple[SBP, ...] | None:
    """``p``'s SBP with ``split(0)`` on ``axis``; None when ``p`` is not shardable there."""
    if p.ndim == 0 or not isinstance(p.sbp[axis], Broadcast):
        return None
    return tuple(split(0) if i == axis else s for i, s in enumerate(p.sbp))


def _check(module: Any, optimizer: Any, stage: Any, axis: Any) -> None:
    from .optim import Optimizer

    # sm.nn.shard checks the type itself; a module here needs what ShardedModule calls
    # (sbpmpi.nn imports this module: no import back)
    if not callable(module) or not callable(getattr(module, "named_parameters", None)):
        raise TypeError(f"shard: module must be an sm.nn.Module, got {type(module).__name__}")
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"shard: optimizer must be an sm.optim optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(stage, (bool, np.bool_)) or stage not in (1, 2, 3):
        raise ValueError(f"shard: stage must be 1, 2 or 3, got {stage!r}")
    if stage == 2:
        raise ValueError("shard: stage 2 is not offered: stage=3 reduce-scatters the "
                         "gradients too, with the same bytes, and holds less")
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


def shard(module: Any, optimizer: Any, *, stage: int, axis: int = 0) -> tuple[Any, Any]:
    """``(module, optimizer)`` with ZeRO ``stage`` on mesh axis ``axis`` (see the module
    docstring); use the returned pair from then on."""
    _check(module, optimizer, stage, axis)
    if stage == 1:
        return module, ShardedOptimizer(optimizer, int(axis))
    sharded = ShardedModule(module, int(axis))
    _repoint(optimizer, sharded)
    return sharded, optimizer


def _repoint(optimizer: Any, sharded: ShardedModule) -> None:
    """Give ``optimizer`` the split leaves instead of the whole parameters, with its state
    boxed to their layouts (local slices: no communication)."""
    new = {id(old): leaf for old, leaf in sharded.replaced}
    for i, p in enumerate(optimizer.params):
        leaf = new.get(id(p))
        if leaf is None:
            continue
        optimizer.params[i] = leaf
        with no_grad():
            optimizer.state[i] = {k: _owned(v.to_global(sbp=leaf.sbp))
                                  for k, v in optimizer.state[i].items()}
    for group in getattr(optimizer, "param_groups", ()):  # optimizers with parameter groups
        group["params"] = [new.get(id(q), q) for q in group["params"]]


def _owned(x: GlobalTensor) -> GlobalTensor:
    """``x`` with a shard of its own (a conversion to a split may return a view)."""
    return GlobalTensor(x.to_local().copy(), x.layout, x.dtype)


def _owner(module: Any, dotted: str) -> tuple[Any, str]:
    """The object holding parameter ``dotted`` (``"l1.weight"``, ``"layers.0.bias"``) and
    the attribute name."""
    *path, name = dotted.split(".")
    obj = module
    for part in path:
        obj = obj[int(part)] if isinstance(obj, (list, tuple)) else getattr(obj, part)
    return obj, name


class ShardedModule:
    """ZeRO stage 3: ``module`` with its parameters split over mesh axis ``axis``,
    all-gathered at each forward (made by :func:`shard`).

    ``parameters()``, ``state_dict()`` and ``load_state_dict()`` are the module's, under
    the module's own names, holding the split leaves.
    """

    def __init__(self, module: Any, axis: int) -> None:
        self.module = module
        self.axis = axis
        self.replaced: list[tuple[GlobalTensor, GlobalTensor]] = []  # (whole, split leaf)
        self._slots: list[tuple[Any, str, GlobalTensor]] = []  # (owner, attribute, leaf)
        for name, p in module.named_parameters():
            sbp = _split_sbp(p, axis)
            if sbp is None:
                continue
            with no_grad():
                leaf = _owned(p.detach().to_global(sbp=sbp)).requires_grad_()
            owner, attr = _owner(module, name)
            setattr(owner, attr, leaf)
            self.replaced.append((p, leaf))
            self._slots.append((owner, attr, leaf))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward on the gathered parameters (differentiable all-gathers)."""
        for owner, attr, leaf in self._slots:
            whole = tuple(Broadcast() if i == self.axis else s for i, s in enumerate(leaf.sbp))
            setattr(owner, attr, leaf.to_global(sbp=whole))
        try:
            return self.module(*args, **kwargs)
        finally:
            for owner, attr, leaf in self._slots:
                setattr(owner, attr, leaf)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, GlobalTensor]]:
        return self.module.named_parameters(prefix)  # type: ignore[no-any-return]

    def parameters(self) -> list[GlobalTensor]:
        return self.module.parameters()  # type: ignore[no-any-return]

    def zero_grad(self) -> None:
        self.module.zero_grad()

    def state_dict(self) -> dict[str, GlobalTensor]:
        return self.module.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: Any) -> None:
        self.module.load_state_dict(state)


class ShardedOptimizer:
    """ZeRO stage 1: ``optimizer`` with its state split over mesh axis ``axis`` (made by
    :func:`shard`). Each step updates this rank's slice of every parameter and
    all-gathers it; ``state_dict``/``load_state_dict`` keep the optimizer's names."""

    def __init__(self, optimizer: Any, axis: int) -> None:
        self.optimizer = optimizer
        self.axis = axis
        self._split: dict[int, tuple[SBP, ...]] = {}
        for i, p in enumerate(optimizer.params):
            sbp = _split_sbp(p, axis)
            if sbp is None:
                continue
            self._split[i] = sbp
            with no_grad():
                optimizer.state[i] = {k: _owned(v.to_global(sbp=sbp))
                                      for k, v in optimizer.state[i].items()}

    @property
    def params(self) -> list[GlobalTensor]:
        return self.optimizer.params  # type: ignore[no-any-return]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self) -> None:
        """Update each parameter's slice with its state slice, then all-gather it."""
        opt = self.optimizer
        name = type(opt).__name__
        with no_grad():
            for i, p in enumerate(opt.params):
                g = p.grad
                if g is None:
                    continue
                if g.layout != p.layout:
                    raise ValueError(f"{name}: params[{i}].grad has layout {g.layout}, the "
                                     f"parameter {p.layout}")
                opt.steps[i] += 1
                sbp = self._split.get(i)
                mine = p if sbp is None else _owned(p.to_global(sbp=sbp))
                grad = g if sbp is None else g.to_global(sbp=sbp)
                local = mine.to_local()
                if local.size:
                    # optimizers with parameter groups take the group's options too
                    group = (opt.param_groups[opt.group_of[i]],) \
                        if hasattr(opt, "group_of") else ()
                    opt._update(backend.get_xp(p.placement.type), local, grad.to_local(),
                                {k: v.to_local() for k, v in opt.state[i].items()},
                                opt.steps[i], *group)
                if sbp is not None:
                    whole = mine.to_global(sbp=p.sbp)
                    dst = p.to_local()
                    if dst.size:
                        dst[...] = whole.to_local()

    def state_dict(self) -> dict[str, GlobalTensor]:
        return self.optimizer.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: Any) -> None:
        """Restore (the optimizer boxes each tensor to its parameter's layout), then split
        the state again."""
        opt = self.optimizer
        opt.load_state_dict(state)
        with no_grad():
            for i, sbp in self._split.items():
                opt.state[i] = {k: _owned(v.to_global(sbp=sbp))
                                for k, v in opt.state[i].items()}
