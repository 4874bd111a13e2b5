"""Gradient buckets: data-parallel gradients reduced while backward still computes.

Under data parallelism a parameter is broadcast along the data-parallel mesh axis and its
gradient arrives ``partial_sum`` there: each rank holds the contribution of its part of
the batch. Without buckets the engine boxes each such gradient to the parameter's layout
when backward reaches the leaf, one blocking all-reduce per parameter after the compute
that produced it. A :class:`Reducer` (made by :class:`sbpmpi.nn.DataParallel`) instead
gives every eligible parameter a slot in a flat bucket buffer: the local contribution is
written (or added) there, and as soon as every slot of a bucket has had its last
gradient of this backward (the engine counts each leaf's expected gradients: a parameter
used twice gets two) the bucket's all-reduce is started
(``sm.comm.all_reduce(..., async_op=True)``), so it runs while backward computes the
gradients of the layers before. A gradient that the rules already reduced on the data
axis (a matmul whose inference moved its inputs instead of reducing its product) takes
the unbucketed road: reducing it again would send it twice; a bucket reduces only the
span of its slots that hold local gradients. Buckets are filled in reverse parameter
order (the order backward produces the gradients of a feed-forward model, as PyTorch DDP
does): the first bucket holds about ``first_bucket_bytes``, the others about
``bucket_cap_bytes``; a bucket closes with the parameter that reaches its size, and its
size is counted from global shapes, so every rank builds the same buckets.

MPI promises no progress in the background, so the engine calls :func:`progress`
between backward rules (one ``MPI_Testall`` over the buckets in flight; a progress thread
is not used: with every core computing, as on a CPU machine with a rank per core, it
slows the compute more than it hides), and :func:`finish`, at
the end of ``backward``, starts the buckets not yet started (a parameter that got no
gradient contributes zeros and keeps its ``.grad``), waits for all of them in order and
sets each parameter's ``.grad``: a GlobalTensor in the parameter's layout whose local
shard is a view into the bucket (no copy at the optimizer). ``backward`` therefore
returns only when every bucket is complete: no read of ``.grad`` and no optimizer step
can see a gradient in flight. The next backward writes the buckets again; a ``.grad``
still pointing into one (no ``zero_grad`` in between) is copied out first, and the new
gradient is added to it, as without buckets.

Inside :func:`no_sync` (or ``DataParallel.no_sync()``) nothing is reduced: the local
contributions accumulate in the buckets and ``.grad`` is their ``partial_sum`` view (its
global value is the gradient so far, reduced if it is read); the next synchronised
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
start). If a rule raises while buckets are in flight, :func:`abandon` waits for the
buckets already started (every rank started them) before the error propagates, so no
request is left behind; the watchdog and the exit watch cover these waits as any
blocking call, and end the ranks that wait on a bucket a failed rank never starts.

Reducing a bucket sums each element exactly as reducing each gradient separately would
(MPI reductions are elementwise), so the gradients are bit-identical to all-reducing every
gradient on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import backend, comm, ops
from ..comm.collective_work import CollectiveWork, all_done
from ..core.layout import Layout, empty_shape
from ..core.placement import Placement
from ..core.sbp import Broadcast, Partial, partial_sum
from ..env import get_rank
from ..runtime.consistency import (
    StepCheck,
    check_enabled,
    check_step,
    debug_enabled,
    note_known_step,
    step_check,
)
from ..tensor import GlobalTensor
from .gradients import accumulate

__all__ = ["Reducer", "no_sync", "slot_of", "add", "done", "contributions", "arrived",
           "progress", "finish", "abandon",
           "DEFAULT_BUCKET_CAP_BYTES", "DEFAULT_FIRST_BUCKET_BYTES", "INFLIGHT"]

MIB = 1 << 20
DEFAULT_BUCKET_CAP_BYTES = 25 * MIB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB

_SLOTS: dict[int, _Slot] = {}  # id(parameter) -> its slot, for the parameters of every Reducer
_TOUCHED: list[Reducer] = []  # reducers that got a gradient in the backward now running
INFLIGHT: list[CollectiveWork] = []  # started, not known complete (tested between rules)
_SYNC = [True]  # False inside sm.nn.no_sync()


@dataclass(eq=False)
class _Slot:
    """One parameter's place in a bucket."""

    param: GlobalTensor
    reducer: Reducer
    bucket: _Bucket
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


@dataclass(eq=False)
class _Bucket:
    """Parameters of one placement and dtype whose gradients are reduced together."""

    index: int
    placement: Placement
    dtype: np.dtype
    nbytes: int  # of the whole gradients (global shapes): the same on every rank
    slots: list[_Slot] = field(default_factory=list)
    flat: Any = None  # this rank's buffer (an empty one outside the placement)
    group: comm.Group | None = None  # the data-parallel ranks of this rank; None outside
    pending: int = 0  # slots still to be written before the bucket can start
    work: CollectiveWork | None = None
    started: bool = False
    plans: dict[tuple[int, int], _Plan] = field(default_factory=dict)  # by span of slots
    agreed: tuple[int, int] | None = None  # the span the ranks last agreed on


class _Plan(NamedTuple):
    """How a bucket is reduced when the slots ``span`` (first, stop) hold its local
    gradients: made once per span (the layout is fixed), agreed once."""

    step: StepCheck  # the consistency check's description, folded in once agreed
    part: Any  # the span of the bucket's buffer that is reduced


BUCKET_STEP = "gradient bucket"


def _local_span(b: _Bucket) -> tuple[int, int] | None:
    """The slots of ``b`` from the first to the last that hold local gradients (the
    others' gradients took the unbucketed road), or None."""
    first = last = -1
    for i, s in enumerate(b.slots):
        if s.local:
            if first < 0:
                first = i
            last = i
    return None if first < 0 else (first, last + 1)


def _plan(b: _Bucket, span: tuple[int, int], axis: int) -> _Plan:
    first, last = b.slots[span[0]], b.slots[span[1] - 1]
    meta = (b.placement, b.dtype, {"bucket": b.index, "axis": axis, "params": span,
                                   "bytes": b.nbytes})
    return _Plan(step_check(BUCKET_STEP, meta),
                 b.flat[first.offset:last.offset + last.view.size])


class Reducer:
    """The buckets of a set of parameters (see the module docstring).

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
    """

    def __init__(self, params: Iterable[GlobalTensor], axis: int = 0,
                 bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
                 first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES) -> None:
        params = list(params)
        for name, v in (("bucket_cap_bytes", bucket_cap_bytes),
                        ("first_bucket_bytes", first_bucket_bytes)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"Reducer: {name} must be a non-negative int, got {v!r}")
        seen: set[int] = set()
        for i, p in enumerate(params):
            if not isinstance(p, GlobalTensor):
                raise TypeError(f"Reducer: params[{i}] must be a GlobalTensor, got "
                                f"{type(p).__name__}")
            if not (p.is_leaf and p.requires_grad):
                raise ValueError(f"Reducer: params[{i}] must be a leaf that requires grad")
            if id(p) in _SLOTS or id(p) in seen:
                raise ValueError(f"Reducer: params[{i}] (shape {p.shape}) already has a "
                                 f"gradient bucket (wrap a model in one DataParallel only)")
            seen.add(id(p))
            nd = p.placement.ndim
            if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) \
                    or not 0 <= axis < nd:
                raise ValueError(f"Reducer: axis must be a mesh axis of params[{i}]'s "
                                 f"{nd}-d placement (0..{nd - 1}), got {axis!r}")
        self.axis = int(axis)
        self.require_sync = True
        self._syncing = True
        self.buckets: list[_Bucket] = []
        self._next = 0  # index of the next bucket to start
        self._closed = False
        self._build(params, int(bucket_cap_bytes), int(first_bucket_bytes))

    # -- construction -----------------------------------------------------------------------

    def _build(self, params: Sequence[GlobalTensor], cap: int, first: int) -> None:
        me = get_rank()
        open_: dict[tuple[Placement, np.dtype], _Bucket] = {}
        members: list[tuple[GlobalTensor, _Bucket]] = []
        for p in reversed(params):
            if not isinstance(p.sbp[self.axis], Broadcast):
                continue
            key = (p.placement, p.dtype)
            b = open_.get(key)
            if b is None:
                b = open_[key] = _Bucket(len(self.buckets), p.placement, p.dtype, 0)
                self.buckets.append(b)
            members.append((p, b))
            b.nbytes += p.size * p.dtype.itemsize
            if b.nbytes >= (first if b.index == 0 else cap):
                del open_[key]
        for b in self.buckets:
            ps = [p for p, pb in members if pb is b]
            shapes = [p.layout.local_shape(me) if me in b.placement else empty_shape(p.ndim)
                      for p in ps]
            xp = backend.get_xp(b.placement.type)
            b.flat = xp.zeros(sum(int(np.prod(s)) for s in shapes), dtype=b.dtype)
            if me in b.placement:
                b.group = comm.get_group(b.placement.axis_group(me, self.axis))
            off = 0
            for p, s in zip(ps, shapes):
                n = int(np.prod(s))
                sbp = tuple(partial_sum if i == self.axis else x for i, x in enumerate(p.sbp))
                slot = _Slot(p, self, b, b.flat[off:off + n].reshape(s), off,
                             Layout(p.shape, p.placement, sbp))
                off += n
                b.slots.append(slot)
                _SLOTS[id(p)] = slot
            b.pending = len(b.slots)

    def close(self) -> None:
        """Give the parameters back to the unbucketed path (the wrapper was dropped)."""
        if self._closed:
            return
        self._closed = True
        for b in self.buckets:
            for s in b.slots:
                if _SLOTS.get(id(s.param)) is s:
                    del _SLOTS[id(s.param)]

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

    # -- one backward -----------------------------------------------------------------------

    def _touch(self) -> None:
        if self not in _TOUCHED:
            _TOUCHED.append(self)
            self._syncing = self.require_sync and _SYNC[0]

    def _write(self, slot: _Slot, g: GlobalTensor) -> None:
        """Add the gradient ``g`` (one contribution) to ``slot``."""
        p = slot.param
        if g.dtype != p.dtype:
            g = ops.astype(g, p.dtype)
        local = None
        if g.layout == slot.partial:
            local = g.to_local()
        elif isinstance(g.sbp[self.axis], Partial) and g.placement == p.placement:
            local = g.to_global(sbp=slot.partial.sbp).to_local()  # e.g. another axis' split
        else:
            # the rules already reduced it on the data axis (moving the inputs was cheaper
            # than reducing the product): reducing it again in the bucket would send it
            # twice, so it takes the unbucketed road
            g = g.to_global(placement=p.placement, sbp=p.sbp)
            slot.extra = g if slot.extra is None else ops.add(slot.extra, g)
        if not slot.filled:
            slot.filled = True
            slot.local = self._begin(slot)
            if not slot.local:
                if local is not None:
                    slot.view[...] = local
                    slot.local = True
                else:
                    slot.view[...] = 0
                return
        if local is not None:
            slot.view += local
            slot.local = True

    def _begin(self, slot: _Slot) -> bool:
        """First gradient of ``slot`` this round: True to add to the bucket's content
        (local gradients accumulated under no_sync), False to overwrite it."""
        p, cur = slot.param, slot.param._grad
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

    def _done(self, slot: _Slot) -> None:
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

    def _unused(self, slot: _Slot) -> None:
        """``slot`` got no gradient this round: the bucket sends its kept local sum
        (no_sync) or zeros, and its ``.grad`` stays as it is."""
        p = slot.param
        if slot.local_grad is not None and p._grad is slot.local_grad:
            slot.local = True
            return
        if p._grad is not None and p._grad is slot.reduced:
            p._set_grad(GlobalTensor(slot.view.copy(), slot.reduced.layout, p.dtype))
        slot.view[...] = 0

    def _start_ready(self) -> None:
        """Start, in order, the buckets whose slots are all complete."""
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._start(self.buckets[self._next])
            self._next += 1

    def _start(self, b: _Bucket) -> None:
        """Start the reduction of ``b`` (none when no slot holds local gradients: every
        rank decides alike, from layouts)."""
        b.started = True
        span = _local_span(b)
        if span is None or b.placement.hierarchy[self.axis] == 1:  # nothing to sum over
            return
        plan = b.plans.get(span)
        if plan is None:
            plan = b.plans[span] = _plan(b, span, self.axis)
        if span != b.agreed or debug_enabled():
            # a layout not yet agreed: one exchange, every rank raises if they differ
            if check_step(BUCKET_STEP, plan.step):
                b.agreed = span
        elif check_enabled():
            # the agreed layout again: folded into the running hash that the next
            # check on the world compares, no exchange of its own
            note_known_step(plan.step)
        if b.group is not None and plan.part.size:
            b.work = comm.all_reduce(plan.part, comm.ReduceOp.SUM, b.group, async_op=True)
            INFLIGHT.append(b.work)

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

    def _set_reduced(self, s: _Slot) -> None:
        p = s.param
        r = GlobalTensor(s.view, p.layout, p.dtype) if s.local else None
        s.reduced, s.local_grad = r, None
        if s.prev is None and s.extra is None:
            p._set_grad(r)
        else:
            p._set_grad(s.prev)
            for g in (r, s.extra):
                if g is not None:
                    accumulate(p, g)
        s.prev = s.extra = None

    def _set_local(self, s: _Slot) -> None:
        p = s.param
        loc = GlobalTensor(s.view, s.partial, p.dtype) if s.local else None
        if s.prev is None and s.extra is None:
            s.local_grad = loc
            p._set_grad(loc)
        else:  # add to the kept .grad now (boxed to the parameter's layout)
            p._set_grad(s.prev)
            for g in (None if loc is None else GlobalTensor(s.view.copy(), s.partial, p.dtype),
                      s.extra):
                if g is not None:
                    accumulate(p, g)
            s.local_grad = None
        s.prev = s.extra = None

    def _reset(self, b: _Bucket) -> None:
        if b.work is not None and b.work in INFLIGHT:
            INFLIGHT.remove(b.work)
        b.work, b.started, b.pending = None, False, len(b.slots)
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


@contextlib.contextmanager
def no_sync() -> Iterator[None]:
    """``with sm.nn.no_sync():`` backward reduces no bucket of any
    :class:`~sbpmpi.nn.DataParallel` (gradient accumulation); the next backward outside
    reduces the accumulated sum."""
    old, _SYNC[0] = _SYNC[0], False
    try:
        yield
    finally:
        _SYNC[0] = old


# -- the engine's hooks ---------------------------------------------------------------------

def slot_of(leaf: GlobalTensor) -> _Slot | None:
    """The bucket slot of ``leaf`` (None: not bucketed)."""
    return _SLOTS.get(id(leaf)) if _SLOTS else None


def add(slot: _Slot, g: GlobalTensor) -> None:
    """Add one gradient contribution ``g`` to ``slot``'s parameter."""
    slot.reducer._touch()
    slot.reducer._write(slot, g)


def done(slot: _Slot) -> None:
    """``slot``'s parameter gets no more gradient in this backward: start the buckets
    that are complete."""
    slot.reducer._touch()
    slot.reducer._done(slot)


def contributions(order: Iterable[Any]) -> dict[int, list[Any]]:
    """For the tape nodes ``order`` (a backward's), the gradients each bucketed leaf will
    get: ``id(leaf) -> [slot, count]`` (empty when no parameter is bucketed)."""
    out: dict[int, list[Any]] = {}
    if not _SLOTS:
        return out
    for node in order:
        for x, need in zip(node.inputs, node.needs):
            if need and isinstance(x, GlobalTensor) and x._node is None:
                slot = _SLOTS.get(id(x))
                if slot is not None:
                    out.setdefault(id(x), [slot, 0])[1] += 1
    return out


def arrived(leaf: GlobalTensor, counts: dict[int, list[Any]]) -> None:
    """One of ``leaf``'s expected gradients came (or will not come): the last one makes
    its slot complete."""
    entry = counts.get(id(leaf))
    if entry is not None:
        entry[1] -= 1
        if entry[1] == 0:
            done(entry[0])


def progress() -> None:
    """Let MPI advance the buckets in flight (one ``MPI_Testall`` over all of them; the
    list empties once all are complete)."""
    if all_done(INFLIGHT):
        INFLIGHT.clear()


def finish() -> None:
    """End of a backward: every bucket started, waited for, its ``.grad`` set."""
    try:
        while _TOUCHED:
            _TOUCHED[0]._finish()
            _TOUCHED.pop(0)
    except BaseException:
        abandon()
        raise


def abandon() -> None:
    """A backward failed: wait for the started buckets, forget the round."""
    try:
        for r in _TOUCHED:
            r._abandon()
    finally:
        _TOUCHED.clear()
        INFLIGHT.clear()
