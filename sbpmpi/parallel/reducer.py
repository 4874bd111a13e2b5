"""The :class:`Reducer`: data-parallel gradients reduced in buckets while backward still
computes, through the engine's hooks (:mod:`sbpmpi.autograd.hooks`).

Under data parallelism a parameter is broadcast along the data-parallel mesh axis and its
gradient arrives ``partial_sum`` there: each rank holds the contribution of its part of
the batch. Without buckets the engine boxes each such gradient to the parameter's layout
when backward reaches the leaf, one blocking all-reduce per parameter after the compute
that produced it. A reducer (made by :class:`~.data_parallel.DataParallel`) instead gives
every eligible parameter a slot in a flat bucket buffer (:mod:`.buckets`) and registers
the engine's hooks, as torch's DDP reducer does:

- a **leaf hook** on each bucketed parameter takes its gradients over: the local
  contribution is written (or added) into the slot, and when the engine says it was the
  parameter's last gradient of this backward (a parameter used twice gets two) and every
  slot of a bucket is complete, the bucket's all-reduce is started
  (``sm.comm.all_reduce(..., async_op=True)``), so it runs while backward computes the
  gradients of the layers before. A gradient that the rules already reduced on the data
  axis (a matmul whose inference moved its inputs instead of reducing its product) takes
  the unbucketed road: reducing it again would send it twice; a bucket reduces only the
  span of its slots that hold local gradients;
- a **poll hook**: MPI promises no progress in the background, so before each backward
  rule the reducer tests its buckets in flight (one ``MPI_Testall``; a progress thread
  is not used: with every core computing, as on a CPU machine with a rank per core, it
  slows the compute more than it hides);
- an **end-of-backward hook** starts the buckets not yet started (a parameter that got no
  gradient contributes zeros and keeps its ``.grad``), waits for all of them in order and
  sets each parameter's ``.grad``: a GlobalTensor in the parameter's layout whose local
  shard is a view into the bucket (no copy at the optimizer). ``backward`` therefore
  returns only when every bucket is complete: no read of ``.grad`` and no optimizer step
  can see a gradient in flight. The next backward writes the buckets again; a ``.grad``
  still pointing into one (no ``zero_grad`` in between) is copied out first, and the new
  gradient is added to it, as without buckets.

The reducer owns all its state (slots, buckets, the requests in flight, whether this
backward touched it); :meth:`Reducer.close` removes its hooks and gives the parameters
back to the unbucketed path.

Inside :func:`no_sync` (or ``DataParallel.no_sync()``) nothing is reduced: the local
contributions accumulate in the buckets and ``.grad`` is their ``partial_sum`` view
(its global value is the gradient so far, reduced if it is read); the next synchronised
backward adds its contributions and reduces the accumulated sum once, as DDP's
``no_sync`` does for gradient accumulation.

Every rank of the world starts the buckets in the same order. The layout of a bucket's
reduction (its placement, dtype, index, the span of slots that hold local gradients) is
fixed by the parameters' layouts, so it is agreed once: the first start of a bucket (and
one whose span differs from the span last agreed) passes the consistency check of
:func:`sbpmpi.runtime.consistency.check_step` (one small exchange), so ranks that disagree
raise on every rank instead of posting mismatched reductions; later starts of the same
layout exchange nothing: their description is folded into the running hash that the
next check on the world compares, as local steps are (``SBPMPI_DEBUG=1`` checks every
start). If a rule raises while buckets are in flight, the end hook (told the backward
failed) waits for the buckets already started (every rank started them) before the error
propagates, so no request is left behind; the watchdog and the exit watch cover these
waits as any blocking call, and end the ranks that wait on a bucket a failed rank never
starts.

Reducing a bucket sums each element exactly as reducing each gradient separately would
(MPI reductions are elementwise), so the gradients are bit-identical to all-reducing every
gradient on its own.

**Half-width reduction** (``reduce_dtype`` bfloat16 or float16, from
``sm.nn.MixedPrecision``, as FSDP2's ``MixedPrecisionPolicy(reduce_dtype=)`` and DDP's
``bf16_compress_hook``): the span of a float32 bucket is cast to the half dtype, reduced
by :class:`sbpmpi.runtime.half_width.HalfWidthReduction` (one all-to-all of the
half-width pieces, a float32 sum of the pieces a rank owns rounded once, one half-width
all-gather: half the bytes of the float32 all-reduce, on the wire and as ``sm.trace``
counts them) and cast back into the bucket, so the float32 masters' ``.grad`` hold
``half(sum_float32(half(g_r)))``. MPI cannot add half-width values; an emulated MPI
operation would add in half width at every step of its tree, in Python. The partial
gradients are already parts of the global loss's gradient (the loss's mean is over
the global batch), so nothing is divided before the cast: a float16 value overflows only
where the sum itself, or one rank's part, is beyond float16's range, and then the inf
reaches every rank (the all-gather hands every rank the same rounded sums), where
``sm.amp.GradScaler`` sees it and every rank skips the step. A world of one on the axis
still rounds (the same values at every size). This reduction blocks at the bucket's
start (the comm layer has no non-blocking all-to-all): the overlap with backward is the
float32 path's only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .. import backend, comm, ops
from ..autograd.gradients import accumulate
from ..autograd.hooks import (
    HookHandle,
    leaf_hooks,
    register_backward_end_hook,
    register_leaf_hook,
    register_poll_hook,
)
from ..comm.collectives import CollectiveWork, all_done
from ..core.dtypes import as_dtype, is_bfloat16
from ..core.modes import current_modes, enter, leave
from ..core.sbp import Partial
from ..runtime.consistency import check_enabled, check_step, debug_enabled, note_known_step
from ..runtime.half_width import HalfWidthReduction
from ..tensor import GlobalTensor
from .buckets import (
    BUCKET_STEP,
    BucketSlot,
    GradientBucket,
    build_buckets,
    local_span,
    plan_for,
    span_part,
)

__all__ = ["Reducer", "no_sync", "MIB", "DEFAULT_BUCKET_CAP_BYTES",
           "DEFAULT_FIRST_BUCKET_BYTES"]

MIB = 1 << 20
DEFAULT_BUCKET_CAP_BYTES = 25 * MIB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB

@contextlib.contextmanager
def no_sync() -> Iterator[None]:
    """``with sm.nn.no_sync():`` backward reduces no bucket of any
    :class:`~sbpmpi.nn.DataParallel` (gradient accumulation); the next backward outside
    reduces the accumulated sum."""
    # the ``no_sync`` field of the scoped modes (per thread, as grad mode); each reducer
    # reads it once per backward
    scope = enter("no_sync", True)
    try:
        yield
    finally:
        leave(scope)


class Reducer:
    """The buckets of a set of parameters and the engine hooks that fill and reduce them
    (see the module docstring).

    Parameters
    ----------
    params : iterable of GlobalTensor
        The parameters, in the order the model uses them (a module's ``parameters()``).
        Those that are broadcast on mesh axis ``axis`` get a slot; the others (split
        on that axis, for instance) keep the unbucketed path.
    axis : int
        The data-parallel mesh axis (the one the batch is split along).
    bucket_cap_bytes, first_bucket_bytes : int
        Bucket sizes in bytes (PyTorch DDP's 25 MiB and 1 MiB by default).
    reduce_dtype : numpy dtype or None
        bfloat16 or float16: float32 (and float64) buckets are reduced in that half width
        (see the module docstring); None or another dtype: in their own dtype.
    """

    def __init__(self, params: Iterable[GlobalTensor], axis: int = 0,
                 bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
                 first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
                 reduce_dtype: np.dtype | None = None) -> None:
        params = list(params)
        _check(params, axis, bucket_cap_bytes, first_bucket_bytes)
        self.axis = int(axis)
        self.require_sync = True  # False inside self.no_sync()
        self.buckets: list[GradientBucket] = build_buckets(
            params, self.axis, int(bucket_cap_bytes), int(first_bucket_bytes),
            None if reduce_dtype is None else as_dtype(reduce_dtype))
        self._slots: dict[int, BucketSlot] = {
            id(s.param): s for b in self.buckets for s in b.slots}
        self._syncing = True  # this backward reduces (read from the modes at its start)
        self._touched = False  # this backward gave a gradient to a slot
        self._next = 0  # index of the next bucket to start
        self._in_flight: list[CollectiveWork] = []  # started, not known complete
        self._wide: dict[np.dtype, np.ndarray] = {}  # see _widened
        self._handles: list[HookHandle] = [
            register_leaf_hook(s.param, self.leaf_gradient) for s in self._slots.values()]
        self._handles += [register_poll_hook(self.poll),
                          register_backward_end_hook(self.end_backward)]

    def close(self) -> None:
        """Remove the hooks: the parameters go back to the unbucketed path (the wrapper
        was dropped or closed)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    @property
    def closed(self) -> bool:
        return not self._handles

    @property
    def in_flight(self) -> int:
        """How many bucket reductions are started and not known complete."""
        return len(self._in_flight)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, backward accumulates local gradients without reducing them."""
        old, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = old

    def layout(self) -> list[list[str]]:
        """The buckets, in start order, as lists of parameter shapes (for tests and docs)."""
        return [[str(s.param.shape) for s in b.slots] for b in self.buckets]

    # -- the engine's hooks -----------------------------------------------------------------

    def leaf_gradient(self, leaf: GlobalTensor, grad: GlobalTensor | None, last: bool) -> bool:
        """Leaf hook: ``grad`` (one contribution, or None for one that does not come)
        into ``leaf``'s slot; after the ``last``, start the buckets that are complete.
        Takes every gradient over."""
        slot = self._slots[id(leaf)]
        if not self._touched:
            self._touched = True
            self._syncing = self.require_sync and not current_modes().no_sync
        if grad is not None:
            self._write(slot, grad)
        if last:
            self._done(slot)
        return True

    def poll(self) -> None:
        """Poll hook: let MPI advance the buckets in flight (one ``MPI_Testall``)."""
        if self._in_flight and all_done(self._in_flight):
            self._in_flight.clear()

    def end_backward(self, failed: bool) -> None:
        """End hook: every bucket started, waited for, its ``.grad`` set; or, when the
        backward ``failed``, the started buckets waited for and the round forgotten."""
        if not self._touched:
            return
        try:
            if failed:
                self._abandon()
            else:
                try:
                    self._finish()
                except BaseException:
                    self._abandon()
                    raise
        finally:
            self._touched = False
            self._in_flight.clear()

    # -- one backward -----------------------------------------------------------------------

    def _write(self, slot: BucketSlot, g: GlobalTensor) -> None:
        """Add the gradient ``g`` (one contribution) to ``slot``."""
        p = slot.param
        if g.dtype != p.dtype and not (g.layout == slot.partial
                                       and np.can_cast(g.dtype, p.dtype, "safe")):
            g = ops.astype(g, p.dtype)
        local = None
        if g.layout == slot.partial:
            # a narrower gradient (half-width under autocast, float32 masters) is widened
            # exactly as it is written or added into the bucket: astype's bits, no array
            local = g.to_local()
        elif isinstance(g.sbp[self.axis], Partial) and g.placement == p.placement:
            local = g.to_global(sbp=slot.partial.sbp).to_local()  # e.g. another axis' split
        else:
            # the rules already reduced it on the data axis (moving the inputs was cheaper
            # than reducing the product): reducing it again in the bucket would send it
            # twice, so it takes the unbucketed road, summed in the slot's own buffer
            with slot.extra_reuse:  # its arrays are read into extra_buf below, then dead
                g = g.to_global(placement=p.placement, sbp=p.sbp)
            _add_extra(slot, g)
        if not slot.filled:
            slot.filled = True
            slot.local = self._begin(slot)
            if not slot.local:
                if local is not None:
                    slot.view[...] = local
                    slot.local = True
                else:
                    slot.view.fill(0)  # no 0-d array for the 0
                return
        if local is not None:
            if isinstance(local, np.ndarray) and is_bfloat16(local.dtype):
                local = self._widened(local, slot.view.dtype)
            slot.view += local
            slot.local = True

    def _widened(self, local: Any, dtype: np.dtype) -> Any:
        """``local`` (bfloat16) copied into the reducer's one widening buffer: NumPy adds
        ml_dtypes' bfloat16 to float32 through a cast buffer of the operand's size made per
        call; an assignment casts without one."""
        n = local.size
        buf = self._wide.get(dtype)
        if buf is None or buf.size < n:
            buf = self._wide[dtype] = np.empty(n, dtype=dtype)
        w = buf[:n].reshape(local.shape)
        w[...] = local
        return w

    def _begin(self, slot: BucketSlot) -> bool:
        """First gradient of ``slot`` this round: True to add to the bucket's content
        (local gradients accumulated under no_sync), False to overwrite it."""
        p, cur = slot.param, slot.param.grad
        slot.prev = None
        if cur is not None and cur is slot.local_grad:
            return True
        slot.local_grad = None
        if cur is not None and cur is slot.reduced:
            # the last reduced gradient lives in the bucket: copy it out before overwriting
            cur = GlobalTensor(cur.to_local().copy(), cur.layout, cur.dtype)
            p._set_grad(cur)
        slot.prev = cur
        return False

    def _done(self, slot: BucketSlot) -> None:
        """No more gradient comes to ``slot`` in this backward: start the buckets that
        are complete."""
        if slot.done:
            return
        slot.done = True
        if not slot.filled:
            self._unused(slot)
        b = slot.bucket
        b.pending -= 1
        if b.pending == 0 and self._syncing:
            self._start_ready()

    def _unused(self, slot: BucketSlot) -> None:
        """``slot`` got no gradient this round: the bucket sends its kept local sum
        (no_sync) or zeros, and its ``.grad`` stays as it is."""
        p = slot.param
        if slot.local_grad is not None and p.grad is slot.local_grad:
            slot.local = True
            return
        if p.grad is not None and p.grad is slot.reduced:
            p._set_grad(GlobalTensor(slot.view.copy(), slot.reduced.layout, p.dtype))
        slot.view.fill(0)  # no 0-d array for the 0

    def _start_ready(self) -> None:
        """Start, in order, the buckets whose slots are all complete."""
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._start(self.buckets[self._next])
            self._next += 1

    def _start(self, b: GradientBucket) -> None:
        """Start the reduction of ``b`` (none when no slot holds local gradients: every
        rank decides alike, from layouts)."""
        span = local_span(b)
        if span is None:
            return
        if b.placement.hierarchy[self.axis] == 1:  # nothing to sum over
            if b.reduce_dtype is not None and b.group is not None:
                _round_to(b, span_part(b, span))  # as if reduced in half width
            return
        plan = b.plans.get(span)
        if plan is None:
            plan = b.plans[span] = plan_for(b, span, self.axis)
        if span != b.agreed or debug_enabled():
            # a layout not yet agreed: one exchange, every rank raises if they differ
            if check_step(BUCKET_STEP, plan.step):
                b.agreed = span
        elif check_enabled():
            # the agreed layout again: folded into the running hash that the next
            # check on the world compares, no exchange of its own
            note_known_step(plan.step)
        if b.group is not None and plan.part.size:
            if b.reduce_dtype is not None:  # blocking: see the module docstring
                _half_width_all_reduce(b, plan.part)
                return
            b.work = comm.all_reduce(plan.part, comm.ReduceOp.SUM, b.group, async_op=True)
            self._in_flight.append(b.work)

    def _finish(self) -> None:
        """End of backward: start the rest, wait in order, set ``.grad``."""
        if not self._syncing:
            for b in self.buckets:
                for s in b.slots:
                    if s.filled:
                        self._set_local(s)
                self._reset(b)
            return
        for b in self.buckets[self._next:]:
            for s in b.slots:
                if not s.done:
                    s.done = True
                    if not s.filled:
                        self._unused(s)
            b.pending = 0
            self._start(b)
        self._next = len(self.buckets)
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
            for s in b.slots:
                if s.filled or s.local:
                    self._set_reduced(s)
            self._reset(b)

    def _set_reduced(self, s: BucketSlot) -> None:
        p = s.param
        r = GlobalTensor(s.view, p.layout, p.dtype) if s.local else None
        s.reduced, s.local_grad = r, None
        extra = s.extra
        if s.prev is None and extra is None:
            p._set_grad(r)
        elif s.prev is None and r is not None and extra is not None \
                and extra.layout == r.layout and extra.dtype == r.dtype:
            # r + extra (what accumulate gives) in r's own memory, the bucket's view
            s.view += extra.to_local()
            p._set_grad(r)
        else:
            p._set_grad(s.prev)
            for g in (r, _owned_extra(s, s.prev is None and r is None)):
                if g is not None:
                    accumulate(p, g)
        s.prev = s.extra = None

    def _set_local(self, s: BucketSlot) -> None:
        p = s.param
        loc = GlobalTensor(s.view, s.partial, p.dtype) if s.local else None
        if s.prev is None and s.extra is None:
            s.local_grad = loc
            p._set_grad(loc)
        else:  # add to the kept .grad now (boxed to the parameter's layout)
            p._set_grad(s.prev)
            for g in (None if loc is None else GlobalTensor(s.view.copy(), s.partial, p.dtype),
                      _owned_extra(s, s.prev is None and loc is None)):
                if g is not None:
                    accumulate(p, g)
            s.local_grad = None
        s.prev = s.extra = None

    def _reset(self, b: GradientBucket) -> None:
        if b.work is not None and b.work in self._in_flight:
            self._in_flight.remove(b.work)
        b.work, b.pending = None, len(b.slots)
        for s in b.slots:
            s.filled = s.done = s.local = False
        self._next = 0

    def _abandon(self) -> None:
        """A rule raised: complete the buckets already started, forget this round."""
        try:
            for b in self.buckets:
                if b.work is not None:
                    b.work.wait()
        finally:
            for b in self.buckets:
                for s in b.slots:
                    if s.filled and s.prev is not None:
                        s.param._set_grad(s.prev)
                    s.prev = s.extra = None
                self._reset(b)


def _add_extra(slot: BucketSlot, g: GlobalTensor) -> None:
    """Add ``g`` (in the parameter's layout and dtype) to ``slot.extra``, in the slot's
    buffer kept across rounds: the same sum as ``ops.add``, without a new array."""
    local = g.to_local()
    buf = slot.extra_buf
    if slot.extra is None:
        if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
            buf = slot.extra_buf = local.copy()
        else:
            buf[...] = local
        slot.extra = GlobalTensor(buf, g.layout, g.dtype)
    else:
        buf += local


def _owned_extra(s: BucketSlot, becomes_grad: bool) -> GlobalTensor | None:
    """``s.extra``, copied out of the slot's buffer when it ``becomes_grad`` as it is
    (the next round overwrites the buffer; a ``.grad`` must stay)."""
    e = s.extra
    if e is None or not becomes_grad:
        return e
    return GlobalTensor(e.to_local().copy(), e.layout, e.dtype)


def _narrowed(b: GradientBucket, part: Any) -> Any:
    """``part`` rounded to ``b.reduce_dtype`` in a new array, which the bucket's next
    half-width reduction gets again (``backend.Reuse``, entered by the caller)."""
    assert b.reduce_dtype is not None
    low = backend.empty(backend.get_xp(b.placement.type), part.shape, b.reduce_dtype)
    low[...] = part
    return low


def _round_to(b: GradientBucket, part: Any) -> None:
    """Round ``part`` to ``b.reduce_dtype`` in place (its dtype is wider)."""
    with b.reuse:
        part[...] = _narrowed(b, part)


def _half_width_all_reduce(b: GradientBucket, part: Any) -> None:
    """``part`` (float32) summed over ``b``'s group in ``b.reduce_dtype``, in place: the
    half-width pieces travel, each is summed in float32 and rounded once, and the rounded
    sums come back into ``part`` (an exact widening)."""
    assert b.group is not None and b.reduce_dtype is not None
    xp = backend.get_xp(b.placement.type)
    with b.reuse:
        part[...] = HalfWidthReduction(xp, b.group, b.group.size, b.group.rank,
                                       "sum").all_reduce(_narrowed(b, part))


def _check(params: list[GlobalTensor], axis: int, cap: int, first: int) -> None:
    """Raise unless the arguments of :class:`Reducer` make sense (metadata only)."""
    for name, v in (("bucket_cap_bytes", cap), ("first_bucket_bytes", first)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"Reducer: {name} must be a non-negative int, got {v!r}")
    seen: set[int] = set()
    for i, p in enumerate(params):
        if not isinstance(p, GlobalTensor):
            raise TypeError(f"Reducer: params[{i}] must be a GlobalTensor, got "
                            f"{type(p).__name__}")
        if not (p.is_leaf and p.requires_grad):
            raise ValueError(f"Reducer: params[{i}] must be a leaf that requires grad")
        if id(p) in seen or any(isinstance(getattr(h, "__self__", None), Reducer)
                                for h in leaf_hooks(p)):
            raise ValueError(f"Reducer: params[{i}] (shape {p.shape}) already has a "
                             f"gradient bucket (wrap a model in one DataParallel only)")
        seen.add(id(p))
        nd = p.placement.ndim
        if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) \
                or not 0 <= axis < nd:
            raise ValueError(f"Reducer: axis must be a mesh axis of params[{i}]'s "
                             f"{nd}-d placement (0..{nd - 1}), got {axis!r}")
