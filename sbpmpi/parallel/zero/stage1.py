"""ZeRO stage 1 on the module's side: the parameters stay as they are; each forward
records them on the tape so that backward leaves their gradients unreduced (the
:class:`~.optimizer.ShardedOptimizer`'s step reduce-scatters them)."""

from __future__ import annotations

from typing import Any

from ...tape import detached, record_op
from .wrapper import ZeroModule

__all__ = ["ZeroStage1"]


class ZeroStage1(ZeroModule):
    """ZeRO stage 1: the module's parameters kept whole; their gradients left unreduced
    (``.grad`` is ``partial_sum`` on the axis, every rank holding its whole contribution:
    the global value is the gradient, reduced if it is read)."""

    stage = 1

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward on its parameters, each recorded as ``zero_unreduced``
        (whose backward rule adds the gradient to ``.grad`` unreduced)."""
        for sp in self.sharded:
            sp.hold(record_op("zero_unreduced", (sp.param,), (self.axis,), {},
                              detached(sp.param)))
        try:
            return self.module(*args, **kwargs)
        finally:
            for sp in self.sharded:
                sp.hold(sp.param)
