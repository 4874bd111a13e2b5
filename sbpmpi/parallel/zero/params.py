"""The types every ZeRO stage shares (as FSDP2's ``FSDPParam`` and ``FSDPParamGroup``):
:class:`ShardedParam`, one parameter and where its module holds it, and
:class:`ParamGroup`, the sharded parameters of one module (a layer), gathered together
and recorded on the tape together, so that backward reduce-scatters their gradients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import backend
from ...core.layout import Layout
from ...core.sbp import SBP
from ...env import get_rank
from ...nn.module import Module
from ...runtime import redistribute
from ...tape import record_conversion, record_op
from ...tensor import GlobalTensor
from .flat import FlatGather, PendingGather, flat_gather, start_flat
from .layouts import split_sbp, whole_sbp

__all__ = ["ShardedParam", "ParamGroup", "shardable_params", "param_groups"]


@dataclass(eq=False)
class ShardedParam:
    """One parameter under ZeRO: the module attribute that holds it, the parameter as the
    model had it, its ``split(0)`` SBP on the data-parallel axis, and the leaf the
    optimizer updates (the parameter itself in stage 1, its split in stages 2 and 3)."""

    owner: Module
    attr: str
    param: GlobalTensor  # the model's parameter, broadcast on the axis
    split: tuple[SBP, ...]
    leaf: GlobalTensor
    whole: GlobalTensor | None = None  # stage 2: the whole parameter every rank keeps

    def hold(self, value: GlobalTensor) -> None:
        """Put ``value`` where the module reads the parameter (its attribute)."""
        setattr(self.owner, self.attr, value)


def shardable_params(module: Module, axis: int) -> list[ShardedParam]:
    """The parameters of ``module`` that ZeRO shards on mesh axis ``axis`` (broadcast
    there, not 0-d), in ``named_parameters`` order, each with its owner found by path
    (a list attribute or a ``ModuleList`` alike)."""
    owners = dict(module.named_modules())
    out = []
    for name, p in module.named_parameters():
        sbp = split_sbp(p, axis)
        if sbp is None:
            continue
        path, _, attr = name.rpartition(".")
        out.append(ShardedParam(owners[path], attr, p, sbp, p))
    return out


@dataclass(eq=False)
class ParamGroup:
    """The sharded parameters one module owns: all-gathered together (one call when
    ``flat``) and recorded on the tape together; gathered in ``dtype`` when given
    (stage 3 under ``sm.nn.MixedPrecision``: the half-width ``param_dtype``, half the
    bytes), else in the leaves' dtype."""

    module: Module
    params: list[ShardedParam]
    flat: FlatGather | None  # None: one all-gather per parameter
    wholes: tuple[Layout, ...]  # the whole parameters' layouts
    nbytes: int  # this rank's bytes of the whole parameters (as gathered)
    dtype: np.dtype | None = None  # the dtype gathered in (None: the leaves')

    @property
    def gathered_dtype(self) -> np.dtype:
        return self.params[0].leaf.dtype if self.dtype is None else self.dtype

    def start(self) -> PendingGather:
        """Start gathering the whole parameters (collective; non-blocking when flat)."""
        leaves = [sp.leaf.detach() for sp in self.params]
        dt = self.gathered_dtype
        if self.flat is not None:
            return start_flat(self.flat, leaves, dt)
        return PendingGather(None, leaves, dt, ready=[
            redistribute(x.to_local().astype(dt, copy=False), x.layout, w, dt)
            for x, w in zip(leaves, self.wholes)])

    def gather(self) -> list[Any]:
        """The local shards of the whole parameters (collective)."""
        return self.start().wait()

    def record_wholes(self, wholes: list[Any], gathered: Any = None) -> list[GlobalTensor]:
        """The whole parameters (local shards ``wholes``) as tape results of the leaves,
        so that backward reduce-scatters their gradients into the leaves: one conversion
        per parameter, or, flat, one for the group (``zero_pack`` and ``zero_unpack``
        around the flat buffer's conversion). ``gathered``: stage 3's copies of this
        forward call, which the backward rules free once their gradients have left."""
        dtype = self.params[0].leaf.dtype
        made = [GlobalTensor(local, layout, self.gathered_dtype)
                for local, layout in zip(wholes, self.wholes)]
        if self.flat is None:
            if gathered is None:
                return [record_conversion(sp.leaf, w) for sp, w in zip(self.params, made)]
            return [record_op("zero_gather", (sp.leaf,), (gathered,), {}, w)
                    for sp, w in zip(self.params, made)]
        leaves = tuple(sp.leaf for sp in self.params)
        f = self.flat
        me = get_rank()
        xp = backend.get_xp(f.src.placement.type)
        # the flat buffers' values are never read by backward: zero-stride placeholders,
        # in the leaves' dtype (the gradients are reduce-scattered in it, float32 under
        # MixedPrecision, whatever width the parameters were gathered in)
        row = GlobalTensor(xp.broadcast_to(xp.zeros((), dtype), f.src.local_shape(me)),
                           f.src, dtype)
        row = record_op("zero_pack", leaves, (f,), {}, row)
        if row._node is None:
            return made
        rows = GlobalTensor(xp.broadcast_to(xp.zeros((), dtype), f.dst.local_shape(me)),
                            f.dst, dtype)
        rows = record_conversion(row, rows)  # backward: one reduce-scatter for the group
        return [record_op("zero_unpack", (rows,), (f, i, gathered), {}, w)
                for i, w in enumerate(made)]


def param_groups(params: list[ShardedParam], axis: int, bucketed: bool,
                 dtype: np.dtype | None = None) -> list[ParamGroup]:
    """``params`` grouped by the module that holds them, in first-use order (gathered in
    ``dtype`` when given)."""
    groups = []
    me = get_rank()
    for owner in dict.fromkeys(sp.owner for sp in params):
        mine = [sp for sp in params if sp.owner is owner]
        leaves = [sp.leaf for sp in mine]
        wholes = tuple(Layout(x.shape, x.placement, whole_sbp(x, axis)) for x in leaves)
        groups.append(ParamGroup(
            owner, mine, flat_gather(leaves, axis) if bucketed else None, wholes,
            sum(int(np.prod(w.local_shape(me))) * (x.dtype if dtype is None else dtype).itemsize
                for w, x in zip(wholes, leaves)), dtype))
    return groups
