"""Running a global op: :class:`GlobalOp` (what ``sm.add`` and the others are) and
:func:`run_call` (infer, box the operands, compute the local shards, wrap).

Inference (:mod:`.inference`) only chooses; this module acts on the choice: it runs the
consistency check when data moves (and notes a local step otherwise), converts each
operand with :func:`sbpmpi.runtime.redistribute`, calls the op's kernel on the local
shards and records the call for autograd. Repeated local-only calls take the dispatch
fast path (:mod:`.dispatch`).

An op's group is the ranks of its operands' placements (every candidate of inference
lies on one of them, so its conversions and output do too; the world where a partner's
data decides the output layout, ``exactness.risky_partners``): the check runs over that
group and its local steps fold into that group's running hash
(:mod:`sbpmpi.runtime.consistency`). A rank outside the group makes no check and no MPI
call for the op: it wraps an empty shard in the output layout, and remembers the call
for the fast path whatever the op moves, so that a repeated call costs it a lookup.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import backend
from ..comm.agreement import all_ok
from ..core.keywords import ALIASES, KeywordAliases
from ..core.modes import DEFAULT_MODES, current_modes
from ..env import get_rank
from ..runtime import redistribute
from ..runtime.consistency import (
    check_broadcast_shards,
    check_collective,
    check_enabled,
    debug_enabled,
    is_outside,
    note_known_step,
    note_step,
    step_group,
    step_ranks,
)
from ..runtime.step_checks import step_check
from ..tape import record_op
from ..tensor import GlobalTensor
from . import autocast, dispatch
from .call import OpCall
from .dispatch import OUTSIDE
from .exactness import partners_finite, risky_partners
from .inference import clear_if_table_changed, infer
from .kernel import local_result

__all__ = ["GlobalOp", "CallSite", "run_call"]


class CallSite(NamedTuple):
    """How an op was called: its fast-path key (:func:`.dispatch.key`) and the raw
    arguments, which :func:`.dispatch.remember` maps the call's operands back to."""

    key: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def run_call(call: OpCall, site: CallSite | None = None) -> GlobalTensor:
    """Run ``call``: infer, box the operands, compute local shards, label the output.

    ``site``: how the op was called; when given and the call runs on local shards only,
    it is remembered for the dispatch fast path (see :mod:`.dispatch`).
    """
    inf = infer(call)
    best = inf.best
    # a row exact for finite values only (P * B -> P, ...) with a tensor partner: its data
    # decides, so the ranks agree on it (one flag) and re-infer without such rows if needed;
    # every rank of the world takes part, as the output layout depends on that decision
    partners = risky_partners(best.signatures, call.name, call.operands, call.out_dtype)
    ranks = None if partners else step_ranks(*(x.placement for x in call.tensors))
    if is_outside(ranks):  # no check, no conversion, no kernel on this rank
        return _outside(call, best, site)
    group = step_group(ranks)
    meta = (call.operands, call.params)
    agreed = False  # whether the ranks agreed on this step (then on its conversions too)
    if partners or any(isinstance(o, GlobalTensor) and o.layout != lay
                       for o, lay in zip(call.operands, best.inputs)):
        # data moves: the group's ranks must agree now
        agreed = check_collective(call.name, meta, group)
    elif site is None or debug_enabled():
        note_step(call.name, meta, ranks)  # local only: verified at the group's next check
    else:  # the same, and remembered for the fast path with the step described once
        step = step_check(call.name, meta)
        if check_enabled():
            note_known_step(step, ranks)
        out = best.output
        me = get_rank()
        xp = backend.get_xp(out.placement.type) if me in out.placement else None
        dispatch.remember(site.key, site.args, site.kwargs, call.operands, call.kernel, xp,
                          output=out, dtype=call.out_dtype, shape=out.local_shape(me), step=step,
                          name=call.name, view=call.view, ranks=ranks)
    if partners and not all_ok(partners_finite(call.name, call.operands, partners), group):
        best = infer(call, exact_only=True).best  # the check above covered the operands
    for o in call.operands:
        if isinstance(o, GlobalTensor):
            check_broadcast_shards(o, f"{call.name} operand", ranks)  # SBPMPI_DEBUG=1 only
    args: list[Any] = []
    for o, lay in zip(call.operands, best.inputs):
        if not isinstance(o, GlobalTensor):
            args.append(o)
        elif o.layout == lay:  # the same on every rank: none of them converts
            args.append(o.to_local())
        else:
            assert lay is not None
            args.append(redistribute(o.to_local(), o.layout, lay, o.dtype, agreed=agreed))
    out = best.output
    me = get_rank()
    shape = out.local_shape(me)
    # a view op whose operand moved gives a copy: known from the layouts, so the same on
    # every rank (whether a rank's buffers happen to overlap is not)
    view = call.view and call.operands[0].layout == best.inputs[0]
    if me not in out.placement:
        result = GlobalTensor(np.empty(shape, dtype=call.out_dtype), out, call.out_dtype)
    else:
        xp = backend.get_xp(out.placement.type)
        shards = [o.to_local() for o in call.operands if isinstance(o, GlobalTensor)]
        res = local_result(call.name, call.kernel, xp, args, shape, call.out_dtype, out,
                           shards=shards, view=view)
        result = GlobalTensor(res, out, call.out_dtype)
    if view:
        result._mark_view(call.operands[0])
    elif call.view:
        result._mark_copy(copy_note(call, best.inputs[0]))
    return result


def _outside(call: OpCall, best: Any, site: CallSite | None) -> GlobalTensor:
    """The result of ``call`` on a rank outside its group: an empty shard in the output
    layout (marked a view or a copy as on the members), remembered for the fast path."""
    out = best.output
    me = get_rank()
    shape = out.local_shape(me)
    result = GlobalTensor(np.empty(shape, dtype=call.out_dtype), out, call.out_dtype)
    view = call.view and call.operands[0].layout == best.inputs[0]
    if view:
        result._mark_view(call.operands[0])
    elif call.view:  # a copy: its note names the move, so it is not remembered
        result._mark_copy(copy_note(call, best.inputs[0]))
        return result
    if site is not None and not debug_enabled():
        dispatch.remember(site.key, site.args, site.kwargs, call.operands, call.kernel, None,
                          output=out, dtype=call.out_dtype, shape=shape, step=None,
                          name=call.name, view=view, ranks=OUTSIDE)
    return result


def copy_note(call: OpCall, moved_to: Any) -> str:
    """What made the result of view op ``call`` a copy: its operand moved to ``moved_to``."""
    x = call.operands[0]
    sbp = ", ".join(repr(s) for s in x.sbp)
    to = ", ".join(repr(s) for s in moved_to.sbp) if moved_to is not None else "?"
    return (f"{call.name}({call.params}) of a tensor of shape {x.shape} laid out as ({sbp}) "
            f"had to move it to ({to}) first: the selection crosses its layout")


class GlobalOp:
    """A global op: calling it runs the op; ``.build`` makes the :class:`OpCall` only.

    ``.table`` is the op's signature table (plain data).
    """

    def __init__(self, name: str, build: Callable[..., OpCall], table: Any,
                 doc: str | None = None, fast: bool = True) -> None:
        self.__name__ = name
        self.__qualname__ = name
        self.__doc__ = doc or build.__doc__
        self.name = name
        self.build = build
        self.table = table
        #: whether repeated local-only calls take the dispatch fast path (the builder's
        #: kernel and operands then depend on the keyed arguments only: see .dispatch)
        self.fast = fast

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An op class with a ``__call__`` of its own (var's, softmax's composed paths)
        gets the keyword aliases before it, as :meth:`__call__` has them."""
        super().__init_subclass__(**kwargs)
        own = vars(cls).get("__call__")
        if own is not None:
            cls.__call__ = _with_canonical_keywords(own)  # type: ignore[method-assign]

    @functools.cached_property
    def keyword_aliases(self) -> KeywordAliases:
        """The NumPy/torch keyword aliases the builder's parameters take (``axis=`` for
        ``dim=``, ...: :mod:`sbpmpi.core.keywords`), found on first need."""
        return KeywordAliases.of(self.build, self.name)

    def canonical_keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with NumPy's keywords renamed to the op's own (``sm.sum(x, axis=0)``
        as ``dim=0``); the same dict, at the cost of one set test, when none is given."""
        if kwargs and not ALIASES.keys().isdisjoint(kwargs):
            return self.keyword_aliases.canonical(kwargs)
        return kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs = self.canonical_keywords(kwargs)
        modes = current_modes()
        plain = modes is DEFAULT_MODES  # no mode on (the common case): one test
        if not plain and modes.autocast.enabled:
            # inside sm.autocast: the operands cast as its lists say
            args, kwargs = autocast.cast_operands(self.name, args, kwargs)
        k = dispatch.key(self, args, kwargs) if self.fast else None
        if k is not None and not plain and modes.lazy_partials:
            k = (*k, "lazy partial outputs")  # chosen without the partial charge
        if k is not None:
            clear_if_table_changed()  # a new cost table empties the caches
            hit = dispatch.lookup(k)
            if hit is not None:  # seen before: lookup, local compute, wrap
                return hit.run(args, kwargs)
        call = self.build(*args, **kwargs)
        out = run_call(call, None if k is None else CallSite(k, args, kwargs))
        return record_op(self.name, call.operands, args, kwargs, out)  # autograd

    def __repr__(self) -> str:
        return f"<sbpmpi op {self.name}>"


def _with_canonical_keywords(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` (a GlobalOp subclass's ``__call__``) with NumPy's keywords renamed to the
    op's own first (``axis=`` to ``dim=``)."""
    @functools.wraps(call)
    def wrapped(self: GlobalOp, *args: Any, **kwargs: Any) -> Any:
        return call(self, *args, **self.canonical_keywords(kwargs))
    return wrapped
