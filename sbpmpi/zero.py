"""ZeRO as layouts: optimizer state (stage 1), gradients (stage 2) and parameters
(stage 3) split over the data-parallel mesh axis (:func:`sbpmpi.nn.shard`).

Under data parallelism every rank holds the whole of each parameter (broadcast on the
data-parallel axis), its whole gradient and its whole optimizer state. ZeRO (DeepSpeed)
and PyTorch's FSDP keep only a slice per rank; in SBP terms the slice is ``split(0)`` on
that axis and the all-gathers and reduce-scatters are conversions:

* stage 1: the optimizer state tensors are ``split(0)``. Backward leaves each gradient
  unreduced: ``.grad`` is ``partial_sum`` on the axis, every rank holding its whole
  contribution (the gradients are not sharded in memory; the global value is the
  gradient, so reading it, ``.grad.numpy()`` say, sums it then, and ``.grad.to_global(
  sbp=broadcast)`` gives a reduced copy at the cost of an all-reduce). A step
  reduce-scatters each gradient into this rank's slice (the conversion from
  ``partial_sum`` to ``split(0)``), updates this rank's slice of the parameter and
  all-gathers the updated parameter: the bytes of stage 2 and of DP's all-reduce,
  instead of an all-reduce and an all-gather;
* stage 2: the optimizer is given ``split(0)`` leaves, each a view of this rank's rows of
  the whole parameter, which every rank keeps (broadcast). The forward uses the whole
  parameter as it is (no communication) but records it as the conversion of the split
  leaf, so backward reduce-scatters each gradient straight into the split (the
  conversion's backward rule) instead of all-reducing it; the optimizer updates the
  slice (its state is split like the leaf) and :class:`GatherAfterStep` all-gathers the
  updated slices into the whole parameters after each step;
* stage 3: the parameters themselves are ``split(0)`` leaves. Each layer (a submodule
  that owns parameters) all-gathers its parameters just before its forward and frees
  the gathered copies as soon as its forward returns (FSDP2's
  ``reshard_after_forward=True``); when backward reaches the layer's output it gathers
  them again, and each gradient is reduce-scattered into the split as soon as backward
  has summed it, which also frees that gathered copy. Between steps each rank holds 1/N
  of the parameters, gradients and state; during a step, at most the gathered
  parameters of the layers whose forward or backward is running.

Bucketed (the default), stages 2 and 3 make one call per layer instead of one per
parameter: a layer's leaves are packed, each rank's slices into one row of a flat
``(N, width)`` buffer (:class:`_FlatGather`), whose conversion from ``split(0)`` to
broadcast is the layer's one all-gather; backward writes each parameter's gradient into
a zero buffer of the flat shape, the engine sums them, and the conversion's backward
rule (``partial_sum`` to ``split(0)``) is the layer's one reduce-scatter, whose row each
rank cuts into its leaves' gradients. The steps are tape ops (``zero_pack``,
``to_global``, ``zero_unpack``) with rules of their own. Copies and the same elementwise
sums over the same ranks as the per-parameter calls.

Bytes handed to MPI per step: DP, stage 1 and stage 2 move about twice the parameter
bytes over the wire (an all-reduce, or a reduce-scatter and an all-gather: ``2P(N-1)/N``
a rank in a ring); stage 3 three times (two all-gathers and a reduce-scatter).

Parameters that are not broadcast on the axis (tensor-parallel splits, say) and 0-d ones
are left as they are. Training gives the unsharded run's results (the same sums, in
another order: equal within float rounding); checkpoints name and box every tensor by
its global value, so a state saved under any stage loads under any other, on any world
size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import backend
from .autograd.mode import no_grad
from .autograd.rules import RULES
from .autograd.tape import Node, detached, record_conversion, record_op
from .core.layout import Layout, empty_shape
from .core.sbp import SBP, Broadcast, partial_sum, split
from .env import get_rank
from .runtime import PendingConversion, redistribute, start_redistribute
from .tensor import GlobalTensor

__all__ = ["shard", "ShardedModule", "ShardedOptimizer", "GatherAfterStep"]


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


def shard(module: Any, optimizer: Any, *, stage: int, axis: int = 0,
          bucketed: bool = True, prefetch: bool = True) -> tuple[Any, Any]:
    """``(module, optimizer)`` with ZeRO ``stage`` on mesh axis ``axis`` (see the module
    docstring); use the returned pair from then on.

    Stage 1 returns a :class:`ShardedModule` (the parameters unchanged, their gradients
    left unreduced) and a :class:`ShardedOptimizer`; stage 2 a :class:`ShardedModule`
    and a :class:`GatherAfterStep`; stage 3 a :class:`ShardedModule` and the optimizer,
    given the split parameters.

    ``bucketed``: stages 2 and 3 all-gather each layer's parameters in one call (a flat
    buffer; False: one call per parameter). The values are the same bit for bit.
    ``prefetch``: stage 3 starts the next layer's all-gather (non-blocking) before the
    current layer computes, in forward and in backward (bucketed only).
    """
    _check(module, optimizer, stage, axis)
    for name, flag in (("bucketed", bucketed), ("prefetch", prefetch)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"shard: {name} must be a bool, got {type(flag).__name__} "
                            f"{flag!r}")
    sharded = ShardedModule(module, int(axis), stage, bool(bucketed), bool(prefetch))
    if stage == 1:
        return sharded, ShardedOptimizer(optimizer, int(axis))
    _repoint(optimizer, sharded)
    return sharded, (GatherAfterStep(optimizer, sharded) if stage == 2 else optimizer)


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


def _view_of(whole: GlobalTensor, sbp: tuple[SBP, ...]) -> GlobalTensor:
    """``whole`` laid out as ``sbp`` (a split of it), its shard a view of ``whole``'s where
    this rank's block lies inside the block it holds (else a copy: with ``split(0)`` on
    two mesh axes, say, the blocks are cut in another order)."""
    layout = Layout(whole.shape, whole.placement, sbp)

    def inside(rank: int) -> bool:
        mine, held = layout.local_ranges(rank), whole.layout.local_ranges(rank)
        assert mine is not None and held is not None
        return all(h0 <= a and b <= h1 for (a, b), (h0, h1) in zip(mine, held))

    # decided from metadata for every rank of the placement: all ranks take one road
    if not all(inside(int(r)) for r in whole.placement.ranks.flat):
        return _owned(whole.to_global(sbp=sbp))
    mine, held = layout.local_ranges(get_rank()), whole.layout.local_ranges(get_rank())
    if mine is None or held is None:  # outside the placement: an empty shard, as whole's
        return GlobalTensor(whole.to_local(), layout, whole.dtype)
    box = tuple(slice(a - h, b - h) for (a, b), (h, _) in zip(mine, held))
    return GlobalTensor(whole.to_local()[box], layout, whole.dtype)


def _owner(module: Any, dotted: str) -> tuple[Any, str]:
    """The object holding parameter ``dotted`` (``"l1.weight"``, ``"layers.0.bias"``) and
    the attribute name."""
    *path, name = dotted.split(".")
    obj = module
    for part in path:
        obj = obj[int(part)] if isinstance(obj, (list, tuple)) else getattr(obj, part)
    return obj, name


def _whole_sbp(leaf: GlobalTensor, axis: int) -> tuple[SBP, ...]:
    return tuple(Broadcast() if i == axis else s for i, s in enumerate(leaf.sbp))


@dataclass(eq=False)
class _Slot:
    """One sharded parameter: the split leaf and where the module holds it."""

    owner: Any
    attr: str
    leaf: GlobalTensor
    whole: GlobalTensor | None = None  # stage 2: the whole parameter every rank keeps


@dataclass(frozen=True)
class _FlatGather:
    """One all-gather for the parameters of a layer: each rank packs its slices of them,
    one after the other, into a row of ``width`` elements (padded to the longest rank's);
    the rows are the ``split(0)`` shards of an ``(N, width)`` tensor that one conversion to
    broadcast all-gathers, and every rank cuts the whole parameters out of the rows. Pure
    copies: the parameters are bit-identical to gathering each on its own."""

    src: Layout  # (N, width), split(0) on the data-parallel axis
    dst: Layout  # (N, width), broadcast
    offsets: tuple[tuple[int, ...], ...]  # [axis coordinate][parameter] -> start in the row
    shapes: tuple[tuple[tuple[int, ...], ...], ...]  # [axis coordinate][parameter] -> shape
    row: int  # this rank's coordinate on the axis (-1 outside the placement)
    axis: int  # the data-parallel mesh axis


def _flat_gather(leaves: list[GlobalTensor], axis: int) -> _FlatGather | None:
    """The :class:`_FlatGather` of ``leaves`` (None when they cannot share one: one
    parameter, several placements or dtypes, or a split on another mesh axis)."""
    pl, dtype = leaves[0].placement, leaves[0].dtype
    if len(leaves) < 2 or any(x.placement != pl or x.dtype != dtype or any(
            not isinstance(s, Broadcast) for i, s in enumerate(x.sbp) if i != axis)
            for x in leaves):
        return None
    me = get_rank()
    group = pl.axis_group(me if me in pl else int(pl.ranks.flat[0]), axis)
    shapes = tuple(tuple(x.layout.local_shape(r) for x in leaves) for r in group)
    offsets = tuple(tuple(int(o) for o in np.cumsum([0] + [int(np.prod(sh)) for sh in row])[:-1])
                    for row in shapes)
    width = max(1, max(int(sum(int(np.prod(sh)) for sh in row)) for row in shapes))
    n = len(group)
    sbp = tuple(split(0) if i == axis else Broadcast() for i in range(pl.ndim))
    return _FlatGather(Layout((n, width), pl, sbp),
                       Layout((n, width), pl, (Broadcast(),) * pl.ndim),
                       offsets, shapes, group.index(me) if me in pl else -1, axis)


@dataclass(eq=False)
class _PendingGather:
    """A layer's all-gather in flight: :meth:`wait` gives the whole parameters' shards."""

    flat: _FlatGather | None
    leaves: list[GlobalTensor]
    pending: PendingConversion | None = None
    ready: list[Any] | None = None

    def wait(self) -> list[Any]:
        if self.ready is None:
            assert self.flat is not None and self.pending is not None
            rows = self.pending.wait()
            f, n = self.flat, len(self.leaves)
            if f.row < 0:
                xp = backend.get_xp(f.src.placement.type)
                self.ready = [xp.empty(empty_shape(x.ndim), dtype=x.dtype) for x in self.leaves]
            else:
                self.ready = [backend.get_xp(f.src.placement.type).concatenate(
                    [rows[c, offs[i]:offs[i] + int(np.prod(sh[i]))].reshape(sh[i])
                     for c, (offs, sh) in enumerate(zip(f.offsets, f.shapes))])
                    for i in range(n)]
            self.pending = None
        return self.ready


def _start_flat(flat: _FlatGather, leaves: list[GlobalTensor]) -> _PendingGather:
    """Start the one all-gather of ``leaves`` (collective; non-blocking)."""
    xp = backend.get_xp(flat.src.placement.type)
    dtype = leaves[0].dtype
    if flat.row < 0:
        row = xp.empty(empty_shape(2), dtype=dtype)
    else:
        row = xp.zeros((1, flat.src.shape[1]), dtype=dtype)
        for x, off in zip(leaves, flat.offsets[flat.row]):
            local = x.to_local()
            row[0, off:off + local.size] = local.reshape(-1)
    return _PendingGather(flat, leaves, start_redistribute(row, flat.src, flat.dst, dtype))


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
    flat: _FlatGather | None  # None: one all-gather per parameter
    wholes: tuple[Layout, ...]  # the whole parameters' layouts
    nbytes: int  # this rank's bytes of the whole parameters

    def start(self) -> _PendingGather:
        """Start gathering the whole parameters (collective; non-blocking when flat)."""
        leaves = [s.leaf.detach() for s in self.slots]
        if self.flat is not None:
            return _start_flat(self.flat, leaves)
        return _PendingGather(None, leaves, ready=[
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
        self._prefetched: tuple[_Unit, _PendingGather] | None = None
        self.axis = axis
        self.stage = stage
        self.replaced: list[tuple[GlobalTensor, GlobalTensor]] = []  # (whole, split leaf)
        self._slots: list[_Slot] = []
        self.gathered_bytes = 0  # stage 3: bytes of gathered parameters held now
        self.peak_gathered_bytes = 0  # and at most since reset_peak()
        # stage 1: the parameters whose gradients stay unreduced (owner, name, parameter)
        self._unreduced: list[tuple[Any, str, GlobalTensor]] = []
        for name, p in module.named_parameters():
            sbp = _split_sbp(p, axis)
            if sbp is None:
                continue
            owner, attr = _owner(module, name)
            if stage == 1:
                self._unreduced.append((owner, attr, p))
                continue
            with no_grad():
                if stage == 2:
                    # the leaf is a view of this rank's rows of the whole parameter kept
                    # by every rank: the optimizer updates those rows in place
                    whole = GlobalTensor(p.to_local(), p.layout, p.dtype)
                    leaf = _view_of(whole, sbp).requires_grad_()
                else:
                    whole = None
                    leaf = _owned(p.detach().to_global(sbp=sbp)).requires_grad_()
            setattr(owner, attr, leaf)
            self.replaced.append((p, leaf))
            self._slots.append(_Slot(owner, attr, leaf, whole))
        self._units: list[_Unit] = []
        for owner in dict.fromkeys(s.owner for s in self._slots):
            slots = [s for s in self._slots if s.owner is owner]
            leaves = [s.leaf for s in slots]
            wholes = tuple(Layout(x.shape, x.placement, _whole_sbp(x, axis)) for x in leaves)
            unit = _Unit(owner, slots, owner.forward,
                         _flat_gather(leaves, axis) if bucketed else None, wholes,
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
        conversion per parameter, or, bucketed, one for the layer (``_pack`` and
        ``_unpack`` around the flat buffer's conversion). ``g``: stage 3's gathered copies,
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
                    w._local = empty
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
                w._local = local

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


def _gather_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor]:
    """Backward of a stage-3 gather: reduce-scatter into the leaf, free the gathered copy
    (backward has used it: this rule runs after every rule of its consumers)."""
    leaf = node.inputs[0]
    sharded, gathered = node.args
    gx = g.to_global(placement=leaf.placement, sbp=leaf.sbp)
    sharded._free(gathered, only=next(ws[0] for s, ws in gathered.copies if s.leaf is leaf))
    return [gx]


def _unreduced_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor | None]:
    """Backward of a stage-1 parameter: its gradient added to ``.grad`` unreduced,
    ``partial_sum`` on the data-parallel axis (no communication; the sum over the ranks
    is the gradient), so that the optimizer's step reduce-scatters it instead of backward
    all-reducing it."""
    (p,) = node.inputs
    (axis,) = node.args
    sbp = tuple(partial_sum if i == axis else s for i, s in enumerate(p.sbp))
    if g.dtype != p.dtype:
        g = g.astype(p.dtype)
    g = g.to_global(placement=p.placement, sbp=sbp)
    old = p._grad
    if old is not None and old.layout != g.layout:  # a .grad set by hand
        old = old.to_global(placement=p.placement, sbp=sbp)
    p._grad = g if old is None else GlobalTensor(old.to_local() + g.to_local(), g.layout,
                                                 p.dtype)
    return [None]


def _regather_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor]:
    """Backward reaches a stage-3 layer's output: its parameters are gathered again."""
    sharded, gathered = node.args
    sharded._regather(gathered)
    return [g]


def _unpack_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor]:
    """Backward of cutting parameter ``i`` out of a layer's flat buffer: its gradient,
    partial on the data-parallel axis, written into a zero buffer of the flat shape (the
    engine sums the layer's parameters' buffers, one reduce-scatter sends the sum); a
    stage-3 gathered copy is freed (backward has used it)."""
    flat, i, sharded, gathered = node.args
    xp = backend.get_xp(flat.src.placement.type)
    axis = flat.axis
    sbp = tuple(partial_sum if a == axis else Broadcast() for a in range(len(g.sbp)))
    local = g.to_global(placement=flat.dst.placement, sbp=sbp).to_local()
    me = get_rank()
    buf = xp.zeros(flat.dst.local_shape(me), dtype=g.dtype)
    if flat.row >= 0:
        start = 0
        for c, (offs, shapes) in enumerate(zip(flat.offsets, flat.shapes)):
            rows = shapes[i][0]
            n = int(np.prod(shapes[i]))
            buf[c, offs[i]:offs[i] + n] = local[start:start + rows].reshape(-1)
            start += rows
    if gathered is not None:
        sharded._free(gathered, only=next(ws[0] for _, ws in gathered.copies
                                          if ws[0]._node is node))
    return [GlobalTensor(buf, Layout(flat.dst.shape, flat.dst.placement, sbp), g.dtype)]


def _pack_rule(node: Node, g: GlobalTensor) -> list[GlobalTensor]:
    """Backward of packing a layer's leaves into this rank's row: the reduce-scattered
    row cut into the leaves' gradients (views)."""
    (flat,) = node.args
    local = g.to_global(placement=flat.src.placement, sbp=flat.src.sbp).to_local()
    out = []
    for i, leaf in enumerate(node.inputs):
        if flat.row < 0:
            part = local.reshape(-1)[:0].reshape(empty_shape(leaf.ndim))
        else:
            shape = flat.shapes[flat.row][i]
            off = flat.offsets[flat.row][i]
            part = local[0, off:off + int(np.prod(shape))].reshape(shape)
        out.append(GlobalTensor(part, leaf.layout, g.dtype))
    return out


# the tape's rules for ZeRO's own steps (only recorded by ShardedModule)
RULES["zero_gather"] = _gather_rule
RULES["zero_unreduced"] = _unreduced_rule
RULES["zero_regather"] = _regather_rule
RULES["zero_unpack"] = _unpack_rule
RULES["zero_pack"] = _pack_rule


class GatherAfterStep:
    """ZeRO stage 2: ``optimizer`` (holding the split leaves of ``sharded``) whose
    :meth:`step` all-gathers the updated slices into the whole parameters (made by
    :func:`shard`); ``state_dict``/``load_state_dict`` are the optimizer's."""

    def __init__(self, optimizer: Any, sharded: ShardedModule) -> None:
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
    unreduced one, as :class:`ShardedModule` leaves it; a reduced one is sliced
    locally), updates this rank's slice of the parameter and all-gathers it;
    ``state_dict``/``load_state_dict`` keep the optimizer's names."""

    def __init__(self, optimizer: Any, axis: int) -> None:
        self.optimizer = optimizer
        self.axis = axis
        self._split: dict[int, tuple[SBP, ...]] = {}
        # the layout of an unreduced gradient (ShardedModule's stage 1), partial on the axis
        self._unreduced: dict[int, Layout] = {}
        for i, p in enumerate(optimizer.params):
            sbp = _split_sbp(p, axis)
            if sbp is None:
                continue
            self._split[i] = sbp
            self._unreduced[i] = Layout(p.shape, p.placement, tuple(
                partial_sum if a == axis else s for a, s in enumerate(p.sbp)))
            with no_grad():
                optimizer.state[i] = {k: _owned(v.to_global(sbp=sbp))
                                      for k, v in optimizer.state[i].items()}

    @property
    def params(self) -> list[GlobalTensor]:
        return self.optimizer.params  # type: ignore[no-any-return]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self) -> None:
        """Reduce-scatter each gradient into this rank's slice, update the parameter's
        slice with it and the state slice, then all-gather the parameter."""
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
