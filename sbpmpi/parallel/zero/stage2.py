"""ZeRO stage 2 on the module's side: the optimizer updates ``split(0)`` leaves, each a
view of this rank's rows of the whole parameter every rank keeps; each forward uses the
whole parameters, recorded as conversions of the leaves, so that backward reduce-scatters
their gradients straight into the split."""

from __future__ import annotations

from typing import Any

from ...grad_mode import no_grad
from ...nn.module import Module
from ...tensor import GlobalTensor
from .layouts import view_of
from .params import ParamGroup, param_groups
from .wrapper import ZeroModule

__all__ = ["ZeroStage2"]


class ZeroStage2(ZeroModule):
    """ZeRO stage 2: the parameters are ``split(0)`` leaves over mesh axis ``axis``,
    views of the whole parameters every rank keeps (:meth:`gather` refreshes those from
    the leaves after a step); the gradients are reduce-scattered in backward and held
    split. ``bucketed``: one reduce-scatter and one all-gather per layer."""

    stage = 2

    def __init__(self, module: Module, axis: int, bucketed: bool = True) -> None:
        super().__init__(module, axis)
        for sp in self.sharded:
            with no_grad():
                # the leaf is a view of this rank's rows of the whole parameter kept by
                # every rank: the optimizer updates those rows in place
                sp.whole = GlobalTensor(sp.param.to_local(), sp.param.layout, sp.param.dtype)
                sp.leaf = view_of(sp.whole, sp.split).requires_grad_()
            sp.hold(sp.leaf)
        self.groups: list[ParamGroup] = param_groups(self.sharded, axis, bucketed)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward on the whole parameters, recorded as conversions of the
        leaves."""
        for group in self.groups:
            wholes = [sp.whole.to_local() for sp in group.params if sp.whole is not None]
            for sp, w in zip(group.params, group.record_wholes(wholes)):
                sp.hold(w)
        try:
            return self.module(*args, **kwargs)
        finally:
            for sp in self.sharded:
                sp.hold(sp.leaf)

    def gather(self) -> None:
        """All-gather the leaves (updated by the optimizer) into the whole parameters
        (collective)."""
        with no_grad():
            for group in self.groups:
                for sp, whole in zip(group.params, group.gather()):
                    assert sp.whole is not None
                    dst = sp.whole.to_local()
                    if dst.size:
                        dst[...] = whole

    def held_parameters(self) -> list[GlobalTensor]:
        """The whole parameters (whose local shards the leaves are views of) and the
        parameters not sharded."""
        leaves = {id(sp.leaf) for sp in self.sharded}
        return [sp.whole for sp in self.sharded if sp.whole is not None] + [
            p for p in self.parameters() if id(p) not in leaves]

    def load_state_dict(self, state: Any) -> None:
        """Copy the values into the leaves, then gather the whole parameters."""
        super().load_state_dict(state)
        self.gather()
