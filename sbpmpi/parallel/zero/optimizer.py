"""ZeRO's optimizer wrappers: :class:`ShardedOptimizer` (stage 1: the state split, the
step reduce-scattering the gradients and all-gathering the parameters),
:class:`GatherAfterStep` (stage 2: the optimizer on the split leaves, all-gathering the
whole parameters after its step) and :func:`repoint` (stages 2 and 3: the optimizer
given the split leaves)."""

from __future__ import annotations

from typing import Any

from ... import backend
from ...core.layout import Layout
from ...core.sbp import SBP, partial_sum
from ...grad_mode import no_grad
from ...optim import recorded_step
from ...tensor import GlobalTensor
from .layouts import owned, split_sbp
from .stage2 import ZeroStage2
from .wrapper import ZeroModule

__all__ = ["ShardedOptimizer", "GatherAfterStep", "repoint"]


def repoint(optimizer: Any, sharded: ZeroModule) -> None:
    """Give ``optimizer`` the split leaves instead of the whole parameters, with its state
    boxed to their layouts (local slices: no communication)."""
    new = {id(old): leaf for old, leaf in sharded.replaced()}
    for i, p in enumerate(optimizer.params):
        leaf = new.get(id(p))
        if leaf is None:
            continue
        optimizer.params[i] = leaf
        with no_grad():
            optimizer.state[i] = {k: owned(v.to_global(sbp=leaf.sbp))
                                  for k, v in optimizer.state[i].items()}
    for group in getattr(optimizer, "param_groups", ()):  # optimizers with parameter groups
        group["params"] = [new.get(id(q), q) for q in group["params"]]


class GatherAfterStep:
    """ZeRO stage 2: ``optimizer`` (holding the split leaves of ``sharded``) whose
    :meth:`step` all-gathers the updated slices into the whole parameters (made by
    :func:`shard`); ``state_dict``/``load_state_dict`` are the optimizer's."""

    def __init__(self, optimizer: Any, sharded: ZeroStage2) -> None:
        self.optimizer = optimizer
        self.sharded = sharded

    @property
    def params(self) -> list[GlobalTensor]:
        return self.optimizer.params  # type: ignore[no-any-return]

    @property
    def state(self) -> list[dict[str, GlobalTensor]]:
        return self.optimizer.state  # type: ignore[no-any-return]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self) -> None:
        """Update each rank's slices, then all-gather the whole parameters."""
        self.optimizer.step()
        self.sharded.gather()

    def state_dict(self) -> dict[str, GlobalTensor]:
        return self.optimizer.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: Any) -> None:
        self.optimizer.load_state_dict(state)


class ShardedOptimizer:
    """ZeRO stage 1: ``optimizer`` with its state split over mesh axis ``axis`` (made by
    :func:`shard`). Each step reduce-scatters every gradient into this rank's slice (an
    unreduced one, as :class:`~.stage1.ZeroStage1` leaves it; a reduced one is sliced
    locally), updates this rank's slice of the parameter and all-gathers it;
    ``state_dict``/``load_state_dict`` keep the optimizer's names."""

    def __init__(self, optimizer: Any, axis: int) -> None:
        self.optimizer = optimizer
        self.axis = axis
        self._split: dict[int, tuple[SBP, ...]] = {}
        # the layout of an unreduced gradient (ZeroStage1's), partial on the axis
        self._unreduced: dict[int, Layout] = {}
        for i, p in enumerate(optimizer.params):
            sbp = split_sbp(p, axis)
            if sbp is None:
                continue
            self._split[i] = sbp
            self._unreduced[i] = Layout(p.shape, p.placement, tuple(
                partial_sum if a == axis else s for a, s in enumerate(p.sbp)))
            with no_grad():
                optimizer.state[i] = {k: owned(v.to_global(sbp=sbp))
                                      for k, v in optimizer.state[i].items()}

    @property
    def params(self) -> list[GlobalTensor]:
        return self.optimizer.params  # type: ignore[no-any-return]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self) -> None:
        """Reduce-scatter each gradient into this rank's slice, update the parameter's
        slice with it and the state slice, then all-gather the parameter."""
        # captured as a graph: replayed as a call that updates the parameters and the
        # state slices in place
        recorded_step(self.step, self._step, self.optimizer.params, self.optimizer.state)

    def _step(self) -> None:
        opt = self.optimizer
        name = type(opt).__name__
        with no_grad():
            for i, p in enumerate(opt.params):
                g = p.grad
                if g is None:
                    continue
                if g.layout not in (p.layout, self._unreduced.get(i)):
                    raise ValueError(f"{name}: params[{i}].grad has layout {g.layout}, the "
                                     f"parameter {p.layout}")
                opt.steps[i] += 1
                sbp = self._split.get(i)
                mine = p if sbp is None else owned(p.to_global(sbp=sbp))
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
                opt.state[i] = {k: owned(v.to_global(sbp=sbp))
                                for k, v in opt.state[i].items()}
