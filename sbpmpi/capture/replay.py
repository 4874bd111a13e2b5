"""``sm.graph`` and ``sm.nn.Graph``: a training step captured once, replayed after.

A graph is keyed by the **signature** of a call: each GlobalTensor argument's layout and
dtype, each host array's shape and dtype, the other arguments' values, grad mode and
the boxing cost table in use. The first two calls of a signature run the step eagerly
while it is recorded (:mod:`.recorder`); the two recordings are compared, and any
difference is a :class:`~.recorder.GraphBreak` (raised, and listed by
``sm.explain(graph)``), never a replay of a value that would change. From the third call
on, the step is **replayed** (:class:`Plan`): the recorded local kernels with the
signatures inference chose, the compiled conversion programs (their collectives), the
``.grad`` assignments and the optimizers' and schedulers' calls, in the recorded order,
over a list of value slots; no op call is built, inferred, boxed or checked, and the
consistency check (``SBPMPI_CHECK``) makes one agreement per replay, on the graph's
digest. Buffers are planned once (:func:`plan_buffers`): a kernel with a form that
writes into a given array (``ops.kernel.with_into``) writes its value into its buffer,
shared with values whose lifetimes do not overlap, taking its temporaries from the
plan's :class:`~sbpmpi.ops.kernel.Scratch` (made at the first replay, kept), and a
conversion's program gets the arrays of its first replay again (``backend.Reuse``), so
the steady state allocates only in the kernels without that form and in host calls.
Parameters and optimizer buffers are the model's own arrays, updated in place; a
``.grad`` is its gradient's buffer, overwritten in place by the next replay; the
returned tensors are new each call (detached: the step's backward is in the graph), so
a loss kept from one call stays as it was.
Replacing a parameter's array (``_set_data``: a ZeRO stage, a checkpoint loaded into a
new array) makes the next call capture again.

Python side effects of the step other than the recorded ones (a counter, a print) happen
on the captured calls only, as with ``jax.jit`` and ``torch.compile``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import backend
from ..comm.agreement import all_ok
from ..grad_mode import is_grad_enabled
from ..ops.kernel import Scratch, zero_d
from ..runtime import cost_table
from ..runtime.consistency import check_collective, check_enabled
from ..runtime.step_checks import meta_text
from ..tensor import GlobalTensor
from .recorder import (
    Call,
    GraphBreak,
    HostCall,
    Recording,
    SetGrad,
    StepRecorder,
    TensorRef,
    compare,
    is_array,
)

__all__ = ["graph", "Graph", "GraphFunction", "Plan", "GraphExplanation"]


@dataclass(frozen=True)
class Out:
    """A returned tensor: its slot, layout and dtype."""

    slot: int
    layout: Any
    dtype: np.dtype


def _output_spec(value: Any, rec: Recording) -> Any:
    """The structure of the step's return value with each tensor as an :class:`Out`."""
    if value is None:
        return None
    if isinstance(value, GlobalTensor):
        return Out(rec.ref(value._local), value._layout, value._dtype)
    if isinstance(value, (tuple, list)):
        return type(value)(_output_spec(v, rec) for v in value)
    raise GraphBreak(f"sm.graph: the step returns a {type(value).__name__}; a graph returns "
                     f"GlobalTensors, None, or tuples and lists of them (a Python value "
                     f"would be the captured call's)")


def _build_output(spec: Any, vals: list[Any]) -> Any:
    if spec is None:
        return None
    if isinstance(spec, Out):
        return GlobalTensor(vals[spec.slot], spec.layout, spec.dtype)
    return type(spec)(_build_output(s, vals) for s in spec)


def _output_slots(spec: Any) -> set[int]:
    if isinstance(spec, Out):
        return {spec.slot}
    if isinstance(spec, (tuple, list)):
        return set().union(*(_output_slots(s) for s in spec)) if spec else set()
    return set()


class Plan:
    """The replay of one recording (see the module docstring)."""

    def __init__(self, rec: Recording, output: Any, name: str, signature: str) -> None:
        self.template: list[Any] = [None] * len(rec.values)
        for s, e in rec.externals.items():
            self.template[s] = e.array
        self.inputs = tuple(rec.inputs)
        self.nodes = rec.nodes
        self.owners = tuple(rec.mutated.values())
        self.output = output
        keep = set(rec.externals) | set(rec.inputs) | _output_slots(output)
        last: dict[int, int] = {}
        for i, n in enumerate(self.nodes):
            if isinstance(n, Call):
                for _, s in n.refs:
                    last[s] = i
                last.setdefault(n.out, i)  # a value nobody reads dies where it is made
            elif isinstance(n, SetGrad) and n.slot >= 0:
                last[n.slot] = i
            elif isinstance(n, HostCall):
                for a in n.args:
                    if isinstance(a, TensorRef):
                        last[a.slot] = i
        frees: dict[int, list[int]] = {}
        for s, i in last.items():
            if s not in keep:
                frees.setdefault(i, []).append(s)
        for i, n in enumerate(self.nodes):
            if isinstance(n, Call):
                n.free = tuple(frees.get(i, ()))
        self.buffers = plan_buffers(rec, keep, _output_slots(output))
        # the temporaries of the kernels' into forms, made at the first replay, kept
        self.scratch = Scratch()
        planned = [b for b in self.buffers if b is not None and type(b) is not Fresh]
        arrays = {id(b): b for b in planned}
        # what explain shows: values written into buffers, and the buffers they share
        self.buffer_use = (len(planned), len(arrays),
                           sum(int(b.nbytes) for b in arrays.values()))
        # a conversion's program gets the arrays of its first replay again (backend.Reuse)
        self.reuse: list[backend.Reuse | None] = [None] * len(rec.values)
        for n in self.nodes:
            if isinstance(n, Call) and n.kind == "conversion" and n.out not in keep:
                self.reuse[n.out] = backend.Reuse()
        # what every rank must agree on: the graph and the global signature (the nodes
        # may differ between ranks: a rank whose shard a conversion leaves as it is
        # records no call there)
        self.digest = hashlib.sha256(f"{name}\n{signature}".encode()).hexdigest()[:16]
        self.name = name
        self.replays = 0
        self.counts: dict[str, int] = {}
        for n in self.nodes:
            k = n.kind if isinstance(n, Call) else (
                "set .grad" if isinstance(n, SetGrad) else "host call")
            self.counts[k] = self.counts.get(k, 0) + 1

    def valid(self) -> bool:
        """Whether the arrays the host calls update are still their tensors' own."""
        return all(t._local is a for t, a in self.owners)

    def run(self, inputs: list[Any]) -> Any:
        """Replay with ``inputs`` (the arguments' shards and host arrays, in order)."""
        if check_enabled():
            check_collective("sm.graph replay", (self.name, self.digest))
        vals = self.template.copy()
        for s, a in zip(self.inputs, inputs):
            vals[s] = a
        bufs, reuse, scratch = self.buffers, self.reuse, self.scratch
        for n in self.nodes:
            if type(n) is Call:
                buf = bufs[n.out]
                if buf is None:
                    args = n.consts.copy()
                    for pos, s in n.refs:
                        args[pos] = vals[s]
                    r = reuse[n.out]
                    if r is None:
                        vals[n.out] = n.fn(args)
                    else:
                        with r:
                            vals[n.out] = n.fn(args)
                else:  # written into its planned buffer
                    if type(buf) is Fresh:
                        buf = buf.xp.empty(buf.shape, dtype=buf.dtype)
                    args = n.iconsts.copy()
                    for pos, s in n.refs:
                        args[pos] = vals[s]
                    n.into(args, buf, scratch)  # type: ignore[misc]
                    vals[n.out] = buf
                for s in n.free:
                    vals[s] = None
            elif type(n) is SetGrad:
                n.leaf._set_grad(None if n.slot < 0 else
                                 GlobalTensor(vals[n.slot], n.layout, n.dtype))
            else:
                assert type(n) is HostCall
                if n.refs:
                    n.fn(*[GlobalTensor(vals[a.slot], a.layout, a.dtype)
                           if type(a) is TensorRef else a for a in n.args])
                else:
                    n.fn(*n.args)
        self.replays += 1
        return _build_output(self.output, vals)


def plan_buffers(rec: Recording, keep: set[int], outputs: set[int]) -> list[Any]:
    """Slot -> the buffer a replay writes that slot's value into (None: the call makes a
    new array each replay), one per slot.

    A slot gets a buffer when its call has a form that writes into a given array
    (:attr:`Call.into`) and the slot is not the step's input or an external array; the
    buffer has the shape and dtype of the value recorded there. A returned tensor (a loss
    the caller keeps must not change at the next call; ``outputs``: their slots) gets a
    :class:`Fresh` array each replay instead. Such a call's scalar arguments are made 0-d
    arrays here (:attr:`Call.iconsts`), of the dtype NumPy's promotion gives the scalar
    with the call's array operands, so that the replay makes no array for them.

    Slots whose values live in turn share one buffer (:func:`_share`).
    """
    planned: dict[int, tuple[Any, tuple[int, ...], np.dtype]] = {}
    bufs: list[Any] = [None] * len(rec.values)
    for n in rec.nodes:
        if not isinstance(n, Call) or n.into is None or n.out in keep - outputs:
            continue
        v = rec.values[n.out]
        if not is_array(v) or not v.flags.c_contiguous:
            continue
        xp = backend.get_xp(backend.device_type_of(v))
        dtypes = [rec.values[s].dtype for _, s in n.refs]
        n.iconsts = [_scalar_array(xp, c, dtypes) for c in n.consts]
        if n.out in outputs:
            bufs[n.out] = Fresh(xp, tuple(v.shape), v.dtype)
        else:
            planned[n.out] = (xp, tuple(v.shape), v.dtype)
    _share(rec, keep, planned, bufs)
    return bufs


def _share(rec: Recording, keep: set[int],
           planned: dict[int, tuple[Any, tuple[int, ...], np.dtype]], bufs: list[Any]) -> None:
    """Give each planned slot its array in ``bufs``, one array for slots of one shape and
    dtype whose values live in turn (liveness over the recorded nodes, greedy).

    A slot's value lives from its call to its last reader. A slot read by a ``.grad``
    assignment, a host call or returned (or aliased by a value that is: the result of a
    call without a planned buffer, a conversion or a view kernel, may be a view of its
    operands, so its lifetime and escape pass to them) outlives the replay: it keeps an
    array of its own (overwritten by the next replay, as ``.grad`` is).
    """
    last: dict[int, int] = {}
    escapes: set[int] = set(keep)
    for i, n in enumerate(rec.nodes):
        if isinstance(n, Call):
            last.setdefault(n.out, i)
            for _, s in n.refs:
                last[s] = i
        elif isinstance(n, SetGrad):
            escapes.add(n.slot)
        else:
            escapes.update(a.slot for a in n.args if isinstance(a, TensorRef))
    for i in range(len(rec.nodes) - 1, -1, -1):  # readers come after: final when reached
        n = rec.nodes[i]
        if isinstance(n, Call) and n.out not in planned:  # may alias its operands
            for _, s in n.refs:
                last[s] = max(last.get(s, i), last.get(n.out, i))
                if n.out in escapes:
                    escapes.add(s)
    idle: dict[tuple[str, tuple[int, ...], np.dtype], list[Any]] = {}
    ends: dict[int, list[int]] = {}
    for i, n in enumerate(rec.nodes):
        if isinstance(n, Call) and n.out in planned:
            xp, shape, dtype = planned[n.out]
            if n.out in escapes:
                bufs[n.out] = xp.empty(shape, dtype=dtype)
            else:
                key = (xp.__name__, shape, dtype)
                free = idle.get(key)
                bufs[n.out] = free.pop() if free else xp.empty(shape, dtype=dtype)
                ends.setdefault(last.get(n.out, i), []).append(n.out)
        for s in ends.pop(i, ()):  # dead after this node: its array serves a later slot
            xp, shape, dtype = planned[s]
            idle.setdefault((xp.__name__, shape, dtype), []).append(bufs[s])


class Fresh(NamedTuple):
    """The buffer of a returned tensor: a new array each replay (the caller may keep the
    last one), written by the call's ``into`` form all the same."""

    xp: Any
    shape: tuple[int, ...]
    dtype: np.dtype


def _scalar_array(xp: Any, c: Any, dtypes: list[np.dtype]) -> Any:
    """A scalar argument ``c`` as the 0-d array NumPy's promotion makes of it with arrays
    of ``dtypes`` (NEP 50: a Python int, float or complex takes the arrays' kind's dtype);
    anything else (None, a bool, a tuple) as it is."""
    if isinstance(c, np.generic):
        return zero_d(xp, c, c.dtype)
    if isinstance(c, (int, float, complex)) and not isinstance(c, bool):
        return zero_d(xp, c, np.result_type(*dtypes, c))
    return c


def _arg_key(i: Any, a: Any) -> Any:
    if type(a) is GlobalTensor:
        return ("tensor", a._layout, a._dtype, a._requires_grad)
    if isinstance(a, np.ndarray):
        return ("array", a.shape, a.dtype)
    try:
        hash(a)
    except TypeError:
        raise TypeError(f"sm.graph: argument {i} is a {type(a).__name__}: a graph's "
                        f"arguments are GlobalTensors, NumPy arrays and hashable values "
                        f"(its signature)") from None
    return ("value", type(a), a)


@dataclass
class GraphExplanation:
    """What ``sm.explain(graph)`` shows: each signature's state and the graph breaks."""

    name: str
    signatures: list[tuple[str, str]] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    captures: int = 0

    def __str__(self) -> str:
        lines = [f"graph {self.name}: {len(self.signatures)} signature(s), "
                 f"{self.captures} captured call(s)"]
        for sig, state in self.signatures:
            lines.append(f"  {sig}\n    {state}")
        for b in self.breaks:
            lines.append(f"  graph break: {b}")
        return "\n".join(lines)


class GraphFunction:
    """A step function captured as a graph per signature (what ``sm.graph(fn)`` returns)."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"sm.graph: needs a callable step, got {type(fn).__name__}")
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__qualname__", type(fn).__name__))
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self._pending: dict[tuple[Any, ...], Recording] = {}
        self.breaks: list[str] = []
        self.captures = 0
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def _signature(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        parts = [_arg_key(i, a) for i, a in enumerate(args)]
        parts += [(k, _arg_key(k, kwargs[k])) for k in sorted(kwargs)]
        return (tuple(parts), is_grad_enabled(), cost_table.version())

    @staticmethod
    def _inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        out = []
        for a in (*args, *(kwargs[k] for k in sorted(kwargs))):
            if type(a) is GlobalTensor:
                out.append(a._local)
            elif isinstance(a, np.ndarray):
                out.append(a)
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self._signature(args, kwargs)
        plan = self._plans.get(key)
        if plan is not None:
            if plan.valid():
                return plan.run(self._inputs(args, kwargs))
            del self._plans[key]  # a parameter's array was replaced: capture again
        return self._capture(key, args, kwargs)

    def _capture(self, key: tuple[Any, ...], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        rec = StepRecorder()
        for a in self._inputs(args, kwargs):
            rec.add_input(a)
        try:
            with rec.recording():
                out = self.fn(*args, **kwargs)
            spec = _output_spec(out, rec.rec)
            prev = self._pending.pop(key, None)
            if prev is not None:
                # the arrays compared are shards: every rank learns whether any found a
                # difference, so all replay or all raise
                mine: GraphBreak | None = None
                try:
                    compare(prev, rec.rec)
                except GraphBreak as e:
                    mine = e
                if not all_ok(mine is None, label="sm.graph capture"):
                    raise mine or GraphBreak(
                        "sm.graph: another rank found that two calls of the step differ "
                        "(see its error): it cannot be replayed")
        except GraphBreak as e:
            self._pending.pop(key, None)
            self.breaks.append(str(e))
            raise
        self.captures += 1
        if prev is None:
            rec.rec.values = []  # the step's values: only the comparison's facts are kept
            self._pending[key] = rec.rec
        else:
            self._plans[key] = Plan(rec.rec, spec, self.name, meta_text(key[0]))
            rec.rec.values = []
            for ext in rec.rec.externals.values():
                ext.snapshot = None
        return out

    def explain(self) -> GraphExplanation:
        """Each signature's state (recorded once, or replayed with its counts of
        kernels, conversions, ``.grad`` assignments and host calls) and the breaks."""
        ex = GraphExplanation(self.name, breaks=list(self.breaks), captures=self.captures)
        for key in self._pending:
            ex.signatures.append((meta_text(key[0]), "recorded once: the next call with "
                                  "this signature records again and compares"))
        for key, plan in self._plans.items():
            counts = ", ".join(f"{v} {k}" for k, v in sorted(plan.counts.items()))
            values, arrays, nbytes = plan.buffer_use
            ex.signatures.append((meta_text(key[0]), f"replayed {plan.replays} time(s): "
                                  f"{counts}; {values} values written into {arrays} "
                                  f"buffers of {nbytes} bytes, kernels' temporaries "
                                  f"{plan.scratch.nbytes} bytes; digest {plan.digest}"))
        return ex


def graph(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Capture a training step as a graph: ``@sm.graph`` or ``sm.graph(step)``.

    The first two calls of each signature (arguments' layouts, shapes and dtypes) run
    the step eagerly while recording it, and check that both did the same; later calls
    replay it without op dispatch (see :mod:`sbpmpi.capture.replay`). Captured and eager
    steps give bit-identical results. What cannot be captured (a host read of a value,
    data-dependent control flow, a collective outside a conversion) raises
    :class:`~sbpmpi.capture.GraphBreak` naming the op and the line, listed by
    ``sm.explain(step)``.
    """
    if fn is None:
        return functools.partial(graph, name=name)
    return GraphFunction(fn, name)


class Graph:
    """OneFlow's ``nn.Graph``: subclass it, define ``build(*args)`` (the step: forward,
    backward, optimizer update), call the instance; it is captured and replayed as
    :func:`graph` does."""

    def build(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}: an sm.nn.Graph defines build()")

    def _graph(self) -> GraphFunction:
        g = self.__dict__.get("_sm_graph")
        if g is None:
            g = self.__dict__["_sm_graph"] = GraphFunction(self.build, type(self).__name__)
        return g  # type: ignore[no-any-return]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._graph()(*args, **kwargs)

    def explain(self) -> GraphExplanation:
        """As :meth:`GraphFunction.explain`."""
        return self._graph().explain()
