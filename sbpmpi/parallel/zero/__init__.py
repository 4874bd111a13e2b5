"""ZeRO as layouts: optimizer state (stage 1), gradients (stage 2) and parameters
(stage 3) split over the data-parallel mesh axis (:func:`sbpmpi.nn.shard`), one small
module class per stage over a shared parameter-group type.

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
  that owns parameters) all-gathers its parameters just before its forward (a forward
  pre-hook on the layer: the model keeps its class and its ``forward``) and frees
  the gathered copies as soon as its forward returns (FSDP2's
  ``reshard_after_forward=True``); when backward reaches the layer's output it gathers
  them again, and each gradient is reduce-scattered into the split as soon as backward
  has summed it, which also frees that gathered copy. Between steps each rank holds 1/N
  of the parameters, gradients and state; during a step, at most the gathered
  parameters of the layers whose forward or backward is running.

Bucketed (the default), stages 2 and 3 make one call per layer instead of one per
parameter: a layer's leaves are packed, each rank's slices into one row of a flat
``(N, width)`` buffer (:class:`.flat.FlatGather`), whose conversion from ``split(0)`` to
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

Each stage is an ``sm.nn.Module`` around the model (:class:`~.wrapper.ZeroModule`, under
the model's own parameter names): :class:`~.stage1.ZeroStage1`,
:class:`~.stage2.ZeroStage2`, :class:`~.stage3.ZeroStage3`. They share
:class:`~.params.ShardedParam` (one parameter, where its module holds it, its leaf) and
:class:`~.params.ParamGroup` (a layer's parameters, gathered and recorded together), as
FSDP2's ``FSDPParam`` and ``FSDPParamGroup``.

The package's modules: :mod:`.validation` (the checks of :func:`shard`'s arguments),
:mod:`.layouts` (a parameter's split and whole layouts, views of its slices),
:mod:`.flat` (the flat buffers of the bucketed gathers and reduce-scatters),
:mod:`.params` (the shared parameter and parameter-group types), :mod:`.wrapper` (the
stages' common module), :mod:`.stage1`, :mod:`.stage2`, :mod:`.stage3` (one class each;
stage 3's gathering, freeing and prefetch), :mod:`.optimizer` (:class:`ShardedOptimizer`,
:class:`GatherAfterStep`) and :mod:`.backward_rules` (the backward rules of ZeRO's tape
ops, registered with the autograd engine once, here).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...autograd.rules import register_rules
from ...core.dtypes import HALF
from ...nn.mixed_precision import MixedPrecision
from .backward_rules import ZERO_BACKWARD_RULES
from .optimizer import GatherAfterStep, ShardedOptimizer, repoint
from .params import ParamGroup, ShardedParam
from .stage1 import ZeroStage1
from .stage2 import ZeroStage2
from .stage3 import ZeroStage3
from .validation import check_shard
from .wrapper import ZeroModule

__all__ = ["shard", "ZeroModule", "ZeroStage1", "ZeroStage2", "ZeroStage3", "ShardedParam",
           "ParamGroup", "ShardedOptimizer", "GatherAfterStep"]

register_rules(ZERO_BACKWARD_RULES)


def shard(module: Any, optimizer: Any, *, stage: int, axis: int = 0,
          bucketed: bool = True, prefetch: bool = True,
          mixed_precision: MixedPrecision | None = None) -> tuple[ZeroModule, Any]:
    """``(module, optimizer)`` with ZeRO ``stage`` on mesh axis ``axis`` (see the module
    docstring); use the returned pair from then on.

    Stage 1 returns a :class:`ZeroStage1` (the parameters unchanged, their gradients
    left unreduced) and a :class:`ShardedOptimizer`; stage 2 a :class:`ZeroStage2` and
    a :class:`GatherAfterStep`; stage 3 a :class:`ZeroStage3` and the optimizer, given
    the split parameters.

    ``bucketed``: stages 2 and 3 all-gather each layer's parameters in one call (a flat
    buffer; False: one call per parameter). The values are the same bit for bit.
    ``prefetch``: stage 3 starts the next layer's all-gather (non-blocking) before the
    current layer computes, in forward and in backward (bucketed only).
    """
    if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(f"shard: mixed_precision must be an sm.nn.MixedPrecision or None, "
                        f"got {type(mixed_precision).__name__}")
    if mixed_precision is not None and mixed_precision.reduce_dtype != np.float32:
        raise ValueError(f"shard: mixed_precision.reduce_dtype must be sm.float32 (ZeRO "
                         f"reduce-scatters the gradients in their dtype), got "
                         f"{mixed_precision.reduce_dtype.name}")
    check_shard(module, optimizer, stage, axis, bucketed, prefetch)
    axis = int(axis)
    out: tuple[ZeroModule, Any]
    if stage == 1:
        out = ZeroStage1(module, axis), ShardedOptimizer(optimizer, axis)
    elif stage == 2:
        two = ZeroStage2(module, axis, bool(bucketed))
        repoint(optimizer, two)
        out = two, GatherAfterStep(optimizer, two)
    else:
        low = None if mixed_precision is None or mixed_precision.param_dtype not in HALF \
            else mixed_precision.param_dtype  # gathered in half width
        three = ZeroStage3(module, axis, bool(bucketed), bool(prefetch), low)
        repoint(optimizer, three)
        out = three, optimizer
    if mixed_precision is not None:  # float32 masters (sharded), half-width compute copies
        mixed_precision.attach(out[0])
    return out
