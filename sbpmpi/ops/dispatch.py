"""Dispatch fast path: an op call seen before runs as cache lookup, local compute, wrap.

The first call of an op with given arguments goes the whole way (build the
:class:`~sbpmpi.ops.call.OpCall`, infer, box, compute). When that call needed no boxing
and no data-dependent check (a row exact for finite values only, with a tensor partner),
:func:`remember` stores what the next such call needs, keyed by :func:`key`: the op, each
GlobalTensor argument's layout and dtype, and each other argument's type and value
(scalars, dims, shapes, dtypes: everything the builder reads). A later call with an equal
key skips building and inference: :meth:`Fast.run` folds the cached step text into the
consistency check's running hash (``SBPMPI_CHECK``, tested at every call), computes the
local shard with the cached kernel and wraps it in the cached output layout.

Invalidation: :func:`clear` (called by ``inference.clear_cache``, so also when the boxing
cost table in use changes: the caller of :func:`lookup` calls
``inference.clear_if_table_changed`` first). With
``SBPMPI_DEBUG=1`` every call takes the full path (strict checks run each step).

A rank outside a call's group (the ranks of its operands' placements) remembers every
call it can key, whether the members move data or not: it makes no check and no MPI call
for it, so its repeated call is a lookup and an empty shard in the cached layout
(:data:`OUTSIDE`).
Arguments that are not plain hashable values (lists, arrays, slices) are never cached.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ..core.layout import Layout
from ..runtime.consistency import check_enabled, debug_enabled, note_known_step
from ..runtime.step_checks import StepCheck
from ..tape import record_op
from ..tensor import GlobalTensor
from .kernel import Kernel, local_result
from .precision import needs_widening

__all__ = ["Fast", "Source", "From", "OUTSIDE", "key", "lookup", "remember", "clear", "entries",
           "SIZE"]

#: Most entries kept; the cache is emptied when full (a loop has few distinct calls).
SIZE = 4096
_FAST: dict[tuple[Any, ...], Fast] = {}
_PLAIN = (bool, int, str, type(None), np.dtype, np.integer, np.bool_)
#: The ``ranks`` of an entry remembered on a rank outside the call's group: it folds
#: nothing into any check.
OUTSIDE = "outside"


def _arg_key(v: Any) -> Any:
    """A hashable stand-in for argument ``v`` equal only for calls that build alike;
    None when ``v`` cannot be keyed (the call then takes the full path)."""
    t = type(v)
    if t is GlobalTensor:
        return (v._layout, v._dtype)
    if t is float or isinstance(v, np.floating):
        return (t, v, math.copysign(1.0, v))  # -0.0 == 0.0, but their texts differ
    if isinstance(v, _PLAIN):
        return (t, v)
    if t is tuple:
        sub = tuple(_arg_key(e) for e in v)
        return None if None in sub else (t, sub)
    if isinstance(v, (complex, np.complexfloating)):
        return (t, repr(v))
    if isinstance(v, type):
        return (type, v)
    return None


def key(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The fast-path key of ``op(*args, **kwargs)``, or None when it has none."""
    parts: list[Any] = [op]
    tensors: list[Any] = []
    for a in (*args, *(kwargs[n] for n in sorted(kwargs))) if kwargs else args:
        k = _arg_key(a)
        if k is None:
            return None
        if type(a) is GlobalTensor:
            # the same tensor twice (x * x) keys apart from two tensors (x * y): remember
            # maps operands to arguments by identity
            for j, t in enumerate(tensors):
                if t is a:
                    k = ("same as", j)
                    break
            tensors.append(a)
        parts.append(k)
    if kwargs:
        parts.append(tuple(sorted(kwargs)))
    return tuple(parts)


class From(enum.Enum):
    """Where a remembered call finds an operand."""

    ARG = "positional argument"  # args[where]
    KWARG = "keyword argument"   # kwargs[where]
    VALUE = "value"              # where itself: a scalar the builder derived from the key


class Source(NamedTuple):
    """Where one operand of a remembered call comes from (see :class:`From`)."""

    kind: From
    where: Any

    def get(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.kind is From.ARG:
            return args[self.where]
        if self.kind is From.KWARG:
            return kwargs[self.where]
        return self.where


@dataclass(frozen=True, eq=False)
class Fast:
    """What a repeated local-only call needs: where its operands come from, the kernel,
    the output layout and dtype, this rank's output shard shape, and the step's check
    with the group whose running hash it folds into (``ranks``: a step group of
    :func:`sbpmpi.runtime.consistency.step_ranks`, or :data:`OUTSIDE`, with no step)."""

    name: str
    sources: tuple[Source, ...]  # per operand
    identity: bool  # operands are exactly the positional args
    kernel: Kernel
    xp: ModuleType | None  # None: this rank is outside the output placement
    output: Layout
    dtype: np.dtype
    shape: tuple[int, ...]
    step: StepCheck | None  # what consistency.note_step folds (a function of the key)
    view: bool = False  # a view op (getitem): the result views operand 0 (nothing moved)
    widened: bool = False  # half-width operands computed in float32 (ops.precision)
    ranks: tuple[int, ...] | str | None = None  # the step's group, or OUTSIDE

    def operands(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if self.identity:
            return args
        return tuple(s.get(args, kwargs) for s in self.sources)

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> GlobalTensor:
        """Run the call: fold the step into the check, compute, wrap, record for autograd."""
        ops = self.operands(args, kwargs)
        if self.step is not None and check_enabled():
            note_known_step(self.step, self.ranks)  # type: ignore[arg-type]
        xp = self.xp
        if xp is None:
            out = GlobalTensor(np.empty(self.shape, dtype=self.dtype), self.output, self.dtype)
        else:
            # nothing moved: the kernel's operands are the shards themselves
            local = [o._local if type(o) is GlobalTensor else o for o in ops]
            out = GlobalTensor(local_result(self.name, self.kernel, xp, local, self.shape,
                                            self.dtype, self.output, shards=local,
                                            view=self.view, widened=self.widened),
                               self.output, self.dtype)
        if self.view:  # remembered calls moved nothing: a view op's result is a view
            out._mark_view(ops[0])
        for o in ops:  # the autograd hook acts only when an operand requires grad
            if type(o) is GlobalTensor and o._requires_grad:
                return record_op(self.name, ops, args, kwargs, out)
        return out


def lookup(k: tuple[Any, ...]) -> Fast | None:
    """The entry for key ``k``, if any and if the fast path may be taken now (the caller
    has checked the cost table: ``inference.clear_if_table_changed``)."""
    hit = _FAST.get(k)
    if hit is None or debug_enabled():
        return None
    return hit


def remember(k: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
             operands: tuple[Any, ...], kernel: Any, xp: ModuleType | None, *, output: Layout,
             dtype: np.dtype, shape: tuple[int, ...], step: StepCheck | None, name: str,
             view: bool = False, ranks: tuple[int, ...] | str | None = None) -> None:
    """Store the entry of a call that ran on local shards only, or of any call on a rank
    outside its group (``ranks`` :data:`OUTSIDE`, no ``step``; see the module doc)."""
    sources: list[Source] = []
    for o in operands:
        src: Source | None = None
        for i, a in enumerate(args):
            if a is o:
                src = Source(From.ARG, i)
                break
        if src is None:
            for n, a in kwargs.items():
                if a is o:
                    src = Source(From.KWARG, n)
                    break
        if src is None:
            if isinstance(o, GlobalTensor):
                return  # an operand the builder made: not a function of the key
            src = Source(From.VALUE, o)  # a scalar the builder derived from keyed arguments
        sources.append(src)
    identity = len(operands) == len(args) and all(
        s.kind is From.ARG and s.where == i for i, s in enumerate(sources))
    if len(_FAST) >= SIZE:
        _FAST.clear()
    _FAST[k] = Fast(name, tuple(sources), identity, kernel, xp, output, np.dtype(dtype),
                    tuple(shape), step, view, needs_widening(name, operands), ranks)


def clear() -> None:
    """Forget every entry."""
    _FAST.clear()


def entries() -> int:
    """How many calls the fast path holds (for tests and diagnostics)."""
    return len(_FAST)
