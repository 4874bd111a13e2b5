"""ZeRO stage 3 on the module's side: the parameters are ``split(0)`` leaves; each layer
(a module that owns sharded parameters) gathers them around its forward through forward
hooks (FSDP2's pre- and post-forward), frees them after, gathers them again when backward
reaches the layer, and prefetches the next layer's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ...autograd.hooks import HookHandle
from ...grad_mode import no_grad
from ...nn.module import Module
from ...tape import Node, detached, record_op
from ...tensor import GlobalTensor
from .flat import PendingGather
from .layouts import owned
from .params import ParamGroup, ShardedParam, param_groups
from .wrapper import ZeroModule

__all__ = ["ZeroStage3", "GatheredCopies", "GatheredCopy"]


class GatheredCopy(NamedTuple):
    """One parameter's gathered whole in one forward call: the tensors that share its
    shard (the forward's operand first, then the tape's detached copy of it, if any)."""

    param: ShardedParam
    tensors: list[GlobalTensor]

    @property
    def operand(self) -> GlobalTensor:
        return self.tensors[0]


@dataclass(eq=False)
class GatheredCopies:
    """The gathered whole parameters of one layer made by one forward call, freed and
    gathered again as backward needs them (the backward rules of its tape ops call
    :meth:`free` and :meth:`regather`)."""

    stage: ZeroStage3
    group: ParamGroup
    copies: list[GatheredCopy] = field(default_factory=list)
    held: bool = False

    def free(self, only: GlobalTensor | None = None) -> None:
        """Drop the gathered shards (of the copy whose operand is ``only``, when given)."""
        self.stage.free(self, only)

    def regather(self) -> None:
        """Gather the parameters again (before backward runs the layer's rules)."""
        self.stage.regather(self)

    def operand_of(self, leaf: GlobalTensor) -> GlobalTensor:
        """The forward's operand gathered from ``leaf``."""
        return next(c.operand for c in self.copies if c.param.leaf is leaf)

    def operand_made_by(self, node: Node) -> GlobalTensor:
        """The forward's operand that tape node ``node`` recorded."""
        return next(c.operand for c in self.copies if c.operand._node is node)


class Prefetch(NamedTuple):
    """A layer's all-gather started ahead of its forward (or backward)."""

    group: ParamGroup
    pending: PendingGather


class ZeroStage3(ZeroModule):
    """ZeRO stage 3: the parameters are ``split(0)`` leaves over mesh axis ``axis``; each
    layer all-gathers its parameters just before its forward and frees the gathered
    copies as soon as its forward returns (FSDP2's ``reshard_after_forward=True``); when
    backward reaches the layer's output it gathers them again, and each gradient is
    reduce-scattered into the split as soon as backward has summed it, which also frees
    that gathered copy. ``bucketed``: one all-gather and one reduce-scatter per layer;
    ``prefetch`` (bucketed only): the next layer's all-gather starts before the current
    layer computes, in forward and in backward.

    ``gather_dtype`` (``sm.nn.MixedPrecision``'s half-width ``param_dtype``): the layers
    gather their parameters in it (half the bytes; the float32 leaves stay the masters,
    their gradients reduce-scattered in float32). ``gathered_bytes`` counts the gathered
    parameter bytes held now,
    ``peak_gathered_bytes`` the most since ``reset_peak()``.
    """

    stage = 3

    def __init__(self, module: Module, axis: int, bucketed: bool = True,
                 prefetch: bool = True, gather_dtype: np.dtype | None = None) -> None:
        super().__init__(module, axis)
        for sp in self.sharded:
            with no_grad():
                sp.leaf = owned(sp.param.detach().to_global(sbp=sp.split)).requires_grad_()
            sp.hold(sp.leaf)
        self.groups: list[ParamGroup] = param_groups(self.sharded, axis, bucketed, gather_dtype)
        self.prefetch = prefetch and bucketed
        self._order: list[ParamGroup] = []  # the layers in the order forward calls them
        self._prefetched: Prefetch | None = None
        # id(group) -> its gathered copies held now (a layer called twice holds two):
        # a held layer needs no prefetch (a model's own parameters, gathered around its
        # whole forward and held through backward, say)
        self._holding: dict[int, int] = {}
        self.gathered_bytes = 0
        self.peak_gathered_bytes = 0
        self._hook_handles: list[HookHandle] = []
        for group in self.groups:
            self._hook_layer(group)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward, each layer gathering its own parameters."""
        self._drain()  # a prefetch the last step did not use
        return self.module(*args, **kwargs)

    # -- around each layer's forward ------------------------------------------------------

    def _hook_layer(self, group: ParamGroup) -> None:
        """Forward hooks on ``group``'s module: gather before, free after (also when its
        forward raises)."""
        calls: list[GatheredCopies] = []  # this layer's forward calls in progress

        def before(module: Module, args: tuple[Any, ...]) -> None:
            calls.append(self._gather_for_forward(group))

        def after(module: Module, args: tuple[Any, ...], out: Any) -> Any:
            return self._after_forward(calls.pop(), out)

        self._hook_handles.append(group.module.register_forward_pre_hook(before))
        self._hook_handles.append(group.module.register_forward_hook(after, always_call=True))

    def _gather_for_forward(self, group: ParamGroup) -> GatheredCopies:
        g = GatheredCopies(self, group)
        if group not in self._order:
            self._order.append(group)
        with no_grad():
            wholes = self._acquire(group)
        self._hold(g)
        k = self._order.index(group)
        self._start_prefetch(self._order[k + 1] if k + 1 < len(self._order) else None)
        for sp, w in zip(group.params, group.record_wholes(wholes, g)):
            g.copies.append(GatheredCopy(sp, [w] if w._node is None else [w, w._node.out]))
            sp.hold(w)
        return g

    def _after_forward(self, g: GatheredCopies, out: Any) -> Any:
        for sp in g.group.params:
            sp.hold(sp.leaf)
        self.free(g)
        if isinstance(out, GlobalTensor) and out.requires_grad and any(
                c.operand.requires_grad for c in g.copies):
            # backward reaches this node before any rule of the layer: gather again
            return record_op("zero_regather", (out,), (g,), {}, detached(out))
        return None

    # -- gathering, prefetching and freeing -----------------------------------------------

    def _acquire(self, group: ParamGroup) -> list[Any]:
        """``group``'s whole parameters: the prefetched ones, or gathered now."""
        if self._prefetched is not None and self._prefetched.group is group:
            pending = self._prefetched.pending
            self._prefetched = None
            return pending.wait()
        self._drain()
        out = group.gather()
        self._held(group.nbytes)
        return out

    def _start_prefetch(self, group: ParamGroup | None) -> None:
        """Start gathering ``group``'s parameters (the layer computed next), if enabled."""
        if group is None or not self.prefetch or self._holding.get(id(group)):
            return
        self._drain()
        self._prefetched = Prefetch(group, group.start())
        self._held(group.nbytes)

    def _drain(self) -> None:
        """Complete and drop a prefetch nobody used (every rank alike: no request left)."""
        if self._prefetched is not None:
            group, pending = self._prefetched
            self._prefetched = None
            pending.wait()
            self._held(-group.nbytes)

    def _hold(self, g: GatheredCopies) -> None:
        g.held = True
        self._holding[id(g.group)] = self._holding.get(id(g.group), 0) + 1

    def _held(self, nbytes: int) -> None:
        self.gathered_bytes += nbytes
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def free(self, g: GatheredCopies, only: GlobalTensor | None = None) -> None:
        """Drop the gathered shards of ``g`` (of the copy whose operand is ``only``, when
        given)."""
        if not g.held:
            return
        freed = 0
        for c in g.copies:
            if only is not None and c.operand is not only:
                continue
            local = c.operand.to_local()
            if local.size:
                freed += int(local.nbytes)
                empty = local[:0].copy()  # no reference to the buffer; a use fails (wrong shape)
                for w in c.tensors:
                    w._set_data(empty)
        self.gathered_bytes -= freed
        if only is None or all(c.operand.to_local().size == 0 for c in g.copies):
            g.held = False
            self._holding[id(g.group)] -= 1

    def regather(self, g: GatheredCopies) -> None:
        """Gather ``g``'s parameters again (before backward runs the layer's rules)."""
        if g.held:
            return
        with no_grad():
            wholes = self._acquire(g.group)
            self._hold(g)
            k = self._order.index(g.group)
            self._start_prefetch(self._order[k - 1] if k > 0 else None)
        for c, local in zip(g.copies, wholes):
            for w in c.tensors:
                w._set_data(local)
