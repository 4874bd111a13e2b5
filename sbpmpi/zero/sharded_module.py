"""ZeRO stages 1-3 on the module's side: :class:`ShardedModule` replaces the parameters
by ``split(0)`` leaves (stages 2, 3), records the forward's whole parameters on the tape
so that backward reduce-scatters their gradients (or, stage 1, leaves them unreduced),
and in stage 3 gathers each layer's parameters around its forward and backward, frees
them after and prefetches the next layer's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backend
from ..core.layout import Layout
from ..env import get_rank
from ..grad_mode import no_grad
from ..runtime import redistribute
from ..tape import detached, record_conversion, record_op
from ..tensor import GlobalTensor
from .flat import FlatGather, PendingGather, flat_gather, start_flat
from .layouts import owned, owner_of, split_sbp, view_of, whole_sbp

__all__ = ["ShardedModule"]


@dataclass(eq=False)
class _Slot:
    """One sharded parameter: the split leaf and where the module holds it."""

    owner: Any
    attr: str
    leaf: GlobalTensor
    whole: GlobalTensor | None = None  # stage 2: the whole parameter every rank keeps


@dataclass(eq=False)
class _Gathered:
    """The gathered copies of one stage-3 layer's parameters made by one forward call:
    the tensors sharing each gathered shard (the forward's operand and the tape's
    detached copy), freed and gathered again as backward needs them."""

    unit: _Unit
    copies: list[tuple[_Slot, list[GlobalTensor]]] = field(default_factory=list)
    held: bool = False


@dataclass(eq=False)
class _Unit:
    """A layer: a submodule that owns sharded parameters, all-gathered together."""

    module: Any
    slots: list[_Slot]
    forward: Any  # the submodule's own forward
    flat: FlatGather | None  # None: one all-gather per parameter
    wholes: tuple[Layout, ...]  # the whole parameters' layouts
    nbytes: int  # this rank's bytes of the whole parameters

    def start(self) -> PendingGather:
        """Start gathering the whole parameters (collective; non-blocking when flat)."""
        leaves = [s.leaf.detach() for s in self.slots]
        if self.flat is not None:
            return start_flat(self.flat, leaves)
        return PendingGather(None, leaves, ready=[
            redistribute(x.to_local(), x.layout, w, x.dtype) for x, w in zip(leaves, self.wholes)])

    def gather(self) -> list[Any]:
        """The local shards of the whole parameters (collective)."""
        return self.start().wait()


class ShardedModule:
    """ZeRO stage 1, 2 or 3: ``module`` (made by :func:`shard`); for stages 2 and 3 with
    its parameters as ``split(0)`` leaves over mesh axis ``axis``.

    ``parameters()``, ``state_dict()`` and ``load_state_dict()`` are the module's, under
    the module's own names (stages 2 and 3: holding the split leaves). Stage 1 keeps the
    parameters and leaves each gradient unreduced (``partial_sum`` on the axis, whole on
    every rank: the optimizer's step reduce-scatters it); stage 2 also keeps every whole
    parameter (:meth:`gather` refreshes them from the leaves); stage 3 gathers each
    layer's parameters around its forward and backward only.
    """

    def __init__(self, module: Any, axis: int, stage: int = 3, bucketed: bool = True,
                 prefetch: bool = True) -> None:
        self.module = module
        self.prefetch = prefetch and bucketed
        self._order: list[_Unit] = []  # stage 3: the layers in the order forward calls them
        self._prefetched: tuple[_Unit, PendingGather] | None = None
        self.axis = axis
        self.stage = stage
        self.replaced: list[tuple[GlobalTensor, GlobalTensor]] = []  # (whole, split leaf)
        self._slots: list[_Slot] = []
        self.gathered_bytes = 0  # stage 3: bytes of gathered parameters held now
        self.peak_gathered_bytes = 0  # and at most since reset_peak()
        # stage 1: the parameters whose gradients stay unreduced (owner, name, parameter)
        self._unreduced: list[tuple[Any, str, GlobalTensor]] = []
        for name, p in module.named_parameters():
            sbp = split_sbp(p, axis)
            if sbp is None:
                continue
            owner, attr = owner_of(module, name)
            if stage == 1:
                self._unreduced.append((owner, attr, p))
                continue
            with no_grad():
                if stage == 2:
                    # the leaf is a view of this rank's rows of the whole parameter kept
                    # by every rank: the optimizer updates those rows in place
                    whole = GlobalTensor(p.to_local(), p.layout, p.dtype)
                    leaf = view_of(whole, sbp).requires_grad_()
                else:
                    whole = None
                    leaf = owned(p.detach().to_global(sbp=sbp)).requires_grad_()
            setattr(owner, attr, leaf)
            self.replaced.append((p, leaf))
            self._slots.append(_Slot(owner, attr, leaf, whole))
        self._units: list[_Unit] = []
        for owner in dict.fromkeys(s.owner for s in self._slots):
            slots = [s for s in self._slots if s.owner is owner]
            leaves = [s.leaf for s in slots]
            wholes = tuple(Layout(x.shape, x.placement, whole_sbp(x, axis)) for x in leaves)
            unit = _Unit(owner, slots, owner.forward,
                         flat_gather(leaves, axis) if bucketed else None, wholes,
                         sum(int(np.prod(w.local_shape(get_rank()))) * x.dtype.itemsize
                             for w, x in zip(wholes, leaves)))
            self._units.append(unit)
            if stage == 3:
                # the layer's own calls (from its parent's forward) gather around it
                owner.forward = self._layer_forward(unit)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward: stage 1 on the parameters, recorded so that backward
        leaves their gradients unreduced; stage 2 on the whole parameters, recorded as
        conversions of the leaves; stage 3 with each layer gathering its own."""
        if self.stage == 3:
            self._drain()  # a prefetch the last step did not use
            return self.module(*args, **kwargs)
        if self.stage == 1:
            for owner, attr, p in self._unreduced:
                setattr(owner, attr, record_op("zero_unreduced", (p,), (self.axis,), {},
                                               detached(p)))
            try:
                return self.module(*args, **kwargs)
            finally:
                for owner, attr, p in self._unreduced:
                    setattr(owner, attr, p)
        for unit in self._units:
            wholes = [s.whole.to_local() for s in unit.slots if s.whole is not None]
            for s, w in zip(unit.slots, self._record_wholes(unit, wholes, None)):
                setattr(s.owner, s.attr, w)
        try:
            return self.module(*args, **kwargs)
        finally:
            for s in self._slots:
                setattr(s.owner, s.attr, s.leaf)

    def gather(self) -> None:
        """Stage 2: all-gather the leaves (updated by the optimizer) into the whole
        parameters (collective)."""
        with no_grad():
            for unit in self._units:
                for s, whole in zip(unit.slots, unit.gather()):
                    assert s.whole is not None
                    dst = s.whole.to_local()
                    if dst.size:
                        dst[...] = whole

    def reset_peak(self) -> None:
        """Start counting :attr:`peak_gathered_bytes` again from the bytes held now."""
        self.peak_gathered_bytes = self.gathered_bytes

    def held_parameters(self) -> list[GlobalTensor]:
        """The parameter tensors this rank holds between steps: the leaves, and for stage
        2 the whole parameters (whose local shards the leaves are views of)."""
        if self.stage == 2:
            return [s.whole for s in self._slots if s.whole is not None] + [
                p for p in self.parameters() if all(p is not s.leaf for s in self._slots)]
        return self.parameters()

    # -- stage 3: gather around each layer ------------------------------------------------

    def _layer_forward(self, unit: _Unit) -> Any:
        def forward(*args: Any, **kwargs: Any) -> Any:
            g = _Gathered(unit)
            if unit not in self._order:
                self._order.append(unit)
            with no_grad():
                wholes = self._acquire(unit)
            g.held = True
            k = self._order.index(unit)
            self._start_prefetch(self._order[k + 1] if k + 1 < len(self._order) else None)
            for s, w in zip(unit.slots, self._record_wholes(unit, wholes, g)):
                g.copies.append((s, [w] if w._node is None else [w, w._node.out]))
                setattr(unit.module, s.attr, w)
            try:
                out = unit.forward(*args, **kwargs)
            finally:
                for s in unit.slots:
                    setattr(unit.module, s.attr, s.leaf)
                self._free(g)
            if isinstance(out, GlobalTensor) and out.requires_grad and any(
                    w.requires_grad for _, ws in g.copies for w in ws[:1]):
                # backward reaches this node before any rule of the layer: gather again
                out = record_op("zero_regather", (out,), (self, g), {}, detached(out))
            return out
        return forward

    def _record_wholes(self, unit: _Unit, wholes: list[Any], g: _Gathered | None
                       ) -> list[GlobalTensor]:
        """The whole parameters of ``unit`` (local shards ``wholes``) as tape results of
        its leaves, so that backward reduce-scatters their gradients into the leaves: one
        conversion per parameter, or, bucketed, one for the layer (``zero_pack`` and
        ``zero_unpack`` around the flat buffer's conversion). ``g``: stage 3's gathered copies,
        freed once their gradients have left."""
        dtype = unit.slots[0].leaf.dtype
        made = [GlobalTensor(local, layout, dtype) for local, layout in zip(wholes, unit.wholes)]
        if unit.flat is None:
            if g is None:
                return [record_conversion(s.leaf, w) for s, w in zip(unit.slots, made)]
            return [record_op("zero_gather", (s.leaf,), (self, g), {}, w)
                    for s, w in zip(unit.slots, made)]
        leaves = tuple(s.leaf for s in unit.slots)
        f = unit.flat
        me = get_rank()
        xp = backend.get_xp(f.src.placement.type)
        # the flat buffers' values are never read by backward: zero-stride placeholders
        row = GlobalTensor(xp.broadcast_to(xp.zeros((), dtype), f.src.local_shape(me)),
                           f.src, dtype)
        row = record_op("zero_pack", leaves, (f,), {}, row)
        if row._node is None:
            return made
        rows = GlobalTensor(xp.broadcast_to(xp.zeros((), dtype), f.dst.local_shape(me)),
                            f.dst, dtype)
        rows = record_conversion(row, rows)  # backward: one reduce-scatter for the layer
        return [record_op("zero_unpack", (rows,), (f, i, self, g), {}, w)
                for i, w in enumerate(made)]

    def _acquire(self, unit: _Unit) -> list[Any]:
        """``unit``'s whole parameters: the prefetched ones, or gathered now."""
        if self._prefetched is not None and self._prefetched[0] is unit:
            pending = self._prefetched[1]
            self._prefetched = None
            return pending.wait()
        self._drain()
        out = unit.gather()
        self._held(unit.nbytes)
        return out

    def _start_prefetch(self, unit: _Unit | None) -> None:
        """Start gathering ``unit``'s parameters (the layer computed next), if enabled."""
        if unit is None or not self.prefetch:
            return
        self._drain()
        self._prefetched = (unit, unit.start())
        self._held(unit.nbytes)

    def _drain(self) -> None:
        """Complete and drop a prefetch nobody used (every rank alike: no request left)."""
        if self._prefetched is not None:
            unit, pending = self._prefetched
            self._prefetched = None
            pending.wait()
            self._held(-unit.nbytes)

    def _held(self, nbytes: int) -> None:
        self.gathered_bytes += nbytes
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def _free(self, g: _Gathered, only: GlobalTensor | None = None) -> None:
        """Drop the gathered shards of ``g`` (of the copy ``only`` when given)."""
        if not g.held:
            return
        freed = 0
        for _, ws in g.copies:
            if only is not None and ws[0] is not only:
                continue
            local = ws[0].to_local()
            if local.size:
                freed += int(local.nbytes)
                empty = local[:0].copy()  # no reference to the buffer; a use fails (wrong shape)
                for w in ws:
                    w._set_data(empty)
        self.gathered_bytes -= freed
        if only is None or all(ws[0].to_local().size == 0 for _, ws in g.copies):
            g.held = False

    def _regather(self, g: _Gathered) -> None:
        """Gather ``g``'s parameters again (before backward runs the layer's rules)."""
        if g.held:
            return
        with no_grad():
            wholes = self._acquire(g.unit)
            g.held = True
            k = self._order.index(g.unit)
            self._start_prefetch(self._order[k - 1] if k > 0 else None)
        for (_, ws), local in zip(g.copies, wholes):
            for w in ws:
                w._set_data(local)

    # -- the module's names ---------------------------------------------------------------

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, GlobalTensor]]:
        return self.module.named_parameters(prefix)  # type: ignore[no-any-return]

    def parameters(self) -> list[GlobalTensor]:
        return self.module.parameters()  # type: ignore[no-any-return]

    def zero_grad(self) -> None:
        self.module.zero_grad()

    def state_dict(self) -> dict[str, GlobalTensor]:
        return self.module.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: Any) -> None:
        """Copy the values into the leaves (and, stage 2, gather the whole parameters)."""
        self.module.load_state_dict(state)
        if self.stage == 2:
            self.gather()
