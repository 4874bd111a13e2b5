"""Gradient buckets: which parameters' gradients are reduced together, and where each
lives in its bucket's flat buffer (:func:`build_buckets`); the reduction plan of a bucket
(:func:`plan_for`). The state of one backward is the :class:`~.reducer.Reducer`'s.

Buckets are filled in reverse parameter order (the order backward produces the gradients
of a feed-forward model, as PyTorch DDP does): the first bucket holds about
``first_bucket_bytes``, the others about ``bucket_cap_bytes``; a bucket closes with the
parameter that reaches its size, and its size is counted from global shapes, so every
rank builds the same buckets. Only parameters broadcast on the data-parallel axis get a
slot (a split one keeps the unbucketed path); one bucket holds one placement and dtype.

A bucket's ``reduce_dtype`` (``sm.nn.MixedPrecision``'s, as FSDP2's
``MixedPrecisionPolicy(reduce_dtype=)``) is the dtype its span travels in: its own dtype,
or, for a float32 (or float64) bucket, bfloat16 or float16 (:func:`reduce_dtype_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import backend, comm
from ..comm.collectives import CollectiveWork
from ..core.dtypes import HALF, as_dtype
from ..core.layout import Layout, empty_shape
from ..core.placement import Placement
from ..core.sbp import Broadcast, partial_sum
from ..env import get_rank
from ..runtime.step_checks import StepCheck, step_check
from ..tensor import GlobalTensor

__all__ = ["BucketSlot", "GradientBucket", "SlotSpan", "BucketPlan", "BUCKET_STEP",
           "build_buckets", "local_span", "plan_for", "reduce_dtype_of",
           "span_part"]

#: The consistency check's name for a bucket's reduction.
BUCKET_STEP = "gradient bucket"


@dataclass(eq=False)
class BucketSlot:
    """One parameter's place in a bucket, and what this backward has done with it."""

    param: GlobalTensor
    bucket: GradientBucket
    view: Any  # this rank's shard of the gradient, a view into bucket.flat
    offset: int  # where the view starts in bucket.flat
    partial: Layout  # the parameter's layout with partial_sum on the data-parallel axis
    filled: bool = False  # a gradient was written since the bucket was last reduced
    done: bool = False  # no more gradient comes in this backward
    local: bool = False  # the view holds local gradients to reduce (written or kept)
    prev: GlobalTensor | None = None  # the .grad the reduced gradient is added to
    local_grad: GlobalTensor | None = None  # the partial_sum view set as .grad in no_sync
    reduced: GlobalTensor | None = None  # the view set as .grad after the last reduction
    extra: GlobalTensor | None = None  # gradients that arrived already reduced, this round
    # this rank's shard of ``extra``, kept across rounds (a step makes no array for it), and
    # the arrays of the conversion that brings such a gradient to the parameter's layout
    extra_buf: Any = None
    extra_reuse: backend.Reuse = field(default_factory=backend.Reuse)


class SlotSpan(NamedTuple):
    """The slots ``first`` to ``stop - 1`` of a bucket."""

    first: int
    stop: int


class BucketPlan(NamedTuple):
    """How a bucket is reduced when one span of its slots holds its local gradients:
    made once per span (the layout is fixed), agreed once."""

    step: StepCheck  # the consistency check's description, folded in once agreed
    part: Any  # the span of the bucket's buffer that is reduced


@dataclass(eq=False)
class GradientBucket:
    """Parameters of one placement and dtype whose gradients are reduced together."""

    index: int
    placement: Placement
    dtype: np.dtype
    nbytes: int  # of the whole gradients (global shapes): the same on every rank
    slots: list[BucketSlot] = field(default_factory=list)
    flat: Any = None  # this rank's buffer (an empty one outside the placement)
    group: comm.Group | None = None  # the data-parallel ranks of this rank; None outside
    pending: int = 0  # slots still to be written before the bucket can start
    work: CollectiveWork | None = None
    plans: dict[SlotSpan, BucketPlan] = field(default_factory=dict)
    agreed: SlotSpan | None = None  # the span the ranks last agreed on
    reduce_dtype: np.dtype | None = None  # the half width it is reduced in (None: dtype)
    # the arrays of its half-width reduction, made by the first one and used again by the
    # next: a reduction reads them into the bucket before it returns
    reuse: backend.Reuse = field(default_factory=backend.Reuse)


def reduce_dtype_of(dtype: np.dtype, reduce_dtype: np.dtype | None) -> np.dtype | None:
    """The half width a bucket of ``dtype`` is reduced in for the policy's
    ``reduce_dtype`` (None: its own dtype). Only a wider floating bucket narrows: a
    float32 ``reduce_dtype`` leaves a float64 bucket float64, as before the policy."""
    if reduce_dtype is None or as_dtype(reduce_dtype) not in HALF \
            or np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    return as_dtype(reduce_dtype)


def build_buckets(params: Sequence[GlobalTensor], axis: int, cap: int,
                  first: int, reduce_dtype: np.dtype | None = None) -> list[GradientBucket]:
    """The buckets of ``params`` (in the order the model uses them) on mesh axis ``axis``,
    in start order, each with its slots and this rank's zeroed buffer (reduced in
    ``reduce_dtype`` where :func:`reduce_dtype_of` says so)."""
    buckets: list[GradientBucket] = []
    open_: dict[tuple[Placement, np.dtype], GradientBucket] = {}
    members: list[tuple[GlobalTensor, GradientBucket]] = []
    for p in reversed(params):
        if not isinstance(p.sbp[axis], Broadcast):
            continue
        key = (p.placement, p.dtype)
        b = open_.get(key)
        if b is None:
            b = open_[key] = GradientBucket(len(buckets), p.placement, p.dtype, 0,
                                            reduce_dtype=reduce_dtype_of(p.dtype, reduce_dtype))
            buckets.append(b)
        members.append((p, b))
        b.nbytes += p.size * p.dtype.itemsize
        if b.nbytes >= (first if b.index == 0 else cap):
            del open_[key]
    me = get_rank()
    for b in buckets:
        ps = [p for p, pb in members if pb is b]
        shapes = [p.layout.local_shape(me) if me in b.placement else empty_shape(p.ndim)
                  for p in ps]
        xp = backend.get_xp(b.placement.type)
        b.flat = xp.zeros(sum(int(np.prod(s)) for s in shapes), dtype=b.dtype)
        if me in b.placement:
            b.group = comm.get_group(b.placement.axis_group(me, axis))
        off = 0
        for p, s in zip(ps, shapes):
            n = int(np.prod(s))
            sbp = tuple(partial_sum if i == axis else x for i, x in enumerate(p.sbp))
            b.slots.append(BucketSlot(p, b, b.flat[off:off + n].reshape(s), off,
                                      Layout(p.shape, p.placement, sbp)))
            off += n
        b.pending = len(b.slots)
    return buckets


def local_span(b: GradientBucket) -> SlotSpan | None:
    """The slots of ``b`` from the first to the last that hold local gradients (the
    others' gradients took the unbucketed road), or None."""
    first = last = -1
    for i, s in enumerate(b.slots):
        if s.local:
            if first < 0:
                first = i
            last = i
    return None if first < 0 else SlotSpan(first, last + 1)


def span_part(b: GradientBucket, span: SlotSpan) -> Any:
    """The part of ``b``'s buffer that the slots of ``span`` hold (a view)."""
    first, last = b.slots[span.first], b.slots[span.stop - 1]
    return b.flat[first.offset:last.offset + last.view.size]


def plan_for(b: GradientBucket, span: SlotSpan, axis: int) -> BucketPlan:
    """The reduction of ``b`` when ``span`` holds its local gradients."""
    meta = (b.placement, b.dtype, {"bucket": b.index, "axis": axis,
                                   "params": (span.first, span.stop), "bytes": b.nbytes,
                                   "reduce_dtype": str(b.dtype if b.reduce_dtype is None
                                                       else b.reduce_dtype)})
    return BucketPlan(step_check(BUCKET_STEP, meta), span_part(b, span))
