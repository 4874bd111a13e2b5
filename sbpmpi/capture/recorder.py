"""Recording one step: the kernels, conversions, ``.grad`` assignments and host calls it
makes, in order, over numbered value slots.

A :class:`Recording` is what one eager run of a step did (:class:`StepRecorder` makes it
through the doors of :mod:`sbpmpi.runtime.recording`). Every array a recorded call reads
is a **slot**: an input of the step (a GlobalTensor argument's shard, a host array
argument), the result of an earlier call, or an **external** array the step read but did
not make (a parameter, an optimizer buffer, a constant such as the causal mask). Arrays
seen are kept alive while recording, so an ``id`` names one array.

Nothing is trusted blindly: :func:`compare` holds two recordings of the same signature
side by side, and an external that is a different array with another value in the two
(a value made from Python state or data the step was not given), or the same array
changed between the calls by anything but a recorded host call (the optimizer's update),
or any other difference (a scalar argument, a kernel, a conversion) is a
:class:`GraphBreak` naming the op and the line of the step. A host read of a value
(``x.item()``, ``x.numpy()``, ``bool(x)``) and a collective made outside a recorded
conversion (the gradient buckets of ``DataParallel``, ``clip_grad_norm_``'s reduction,
ZeRO's gathers) raise on capture the same way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..comm.agreement import raise_if_any
from ..comm.trace import Trace, trace
from ..core.modes import current_modes, enter, leave
from ..tensor import GlobalTensor

__all__ = ["GraphBreak", "Call", "SetGrad", "HostCall", "TensorRef", "External", "Recording",
           "StepRecorder", "compare", "user_line", "is_array"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class GraphBreak(RuntimeError):
    """A step cannot be captured as a graph: what and where (raised on every rank)."""


def user_line() -> str:
    """``file:line`` of the innermost frame outside sbpmpi (the step's own code)."""
    for fr in reversed(traceback.extract_stack()):
        if not os.path.abspath(fr.filename).startswith(_PACKAGE):
            return f"{fr.filename}:{fr.lineno} ({(fr.line or '').strip()})"
    return "<unknown line>"


def is_array(a: Any) -> bool:
    """Whether ``a`` is an array (NumPy or CuPy; not a NumPy scalar): a slot of a recording."""
    return hasattr(a, "shape") and hasattr(a, "dtype") and not isinstance(a, np.generic)


@dataclass(eq=False)
class Call:
    """One recorded call: ``out = fn(args)`` with ``args[pos] = slot value`` for each
    ``(pos, slot)`` of ``refs`` and the constant ``consts[pos]`` elsewhere.

    ``kind``: "kernel", "conversion" or "tensor"; ``key``: what must be equal in two
    recordings (op, kernel, layouts, dtype); ``where``: the step's line; ``into``: the
    call's form that writes into a given array (``into(args, out, scratch)``, its
    temporaries from ``scratch``), if it has one."""

    kind: str
    name: str
    key: tuple[Any, ...]
    fn: Callable[[list[Any]], Any]
    consts: list[Any]
    refs: tuple[tuple[int, int], ...]
    out: int
    where: str
    free: tuple[int, ...] = ()  # slots dead after this call (set by the plan)
    # ``into(args, out, scratch)``: the call writing its result into ``out`` (None: it has
    # no such form); the plan gives such a call a buffer, and ``iconsts`` its scalar arguments as
    # 0-d arrays (a Python scalar would be made into a new array by every call)
    into: Callable[[list[Any], Any, Any], None] | None = None
    iconsts: list[Any] = field(default_factory=list)


@dataclass(eq=False)
class SetGrad:
    """``leaf.grad = GlobalTensor(slot value, layout, dtype)`` (None when ``slot`` < 0)."""

    leaf: GlobalTensor
    slot: int
    layout: Any
    dtype: Any
    where: str


@dataclass(frozen=True)
class TensorRef:
    """A host call's tensor argument made in the step: rebuilt from its slot at replay."""

    slot: int
    layout: Any
    dtype: Any


@dataclass(eq=False)
class HostCall:
    """``fn(*args)``: an optimizer's ``step``/``zero_grad``, a scheduler's ``step``, a
    backward hook (the data-parallel reducer's); :class:`TensorRef` arguments are
    rebuilt from their slots."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    where: str
    refs: bool = False  # whether any argument is a TensorRef


Node = Call | SetGrad | HostCall


@dataclass(eq=False)
class External:
    """An array the step read but did not make: the array and its value when first read."""

    array: Any
    snapshot: Any
    where: str


@dataclass(eq=False)
class Recording:
    """What one run of a step did (see the module docstring)."""

    values: list[Any] = field(default_factory=list)  # slot -> array (kept alive)
    ids: dict[int, int] = field(default_factory=dict)  # id(array) -> its latest slot
    inputs: list[int] = field(default_factory=list)
    externals: dict[int, External] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    # id(array) -> (tensor, array): what recorded host calls update in place
    mutated: dict[int, tuple[GlobalTensor, Any]] = field(default_factory=dict)
    conversions: list[tuple[int, int]] = field(default_factory=list)  # trace record spans
    output: Any = None

    def new_slot(self, a: Any) -> int:
        self.values.append(a)
        s = len(self.values) - 1
        self.ids[id(a)] = s
        return s

    def ref(self, a: Any) -> int:
        """The slot of array ``a``, an external one if the step did not make it."""
        s = self.ids.get(id(a))
        if s is None:
            s = self.new_slot(a)
            self.externals[s] = External(a, a.copy(), user_line())
        return s


class StepRecorder:
    """The recorder the doors talk to while a step runs (:mod:`sbpmpi.runtime.recording`)."""

    def __init__(self) -> None:
        self.rec = Recording()
        self._suspended = 0
        self._trace: Trace | None = None

    # -- inputs -----------------------------------------------------------------------------
    def add_input(self, a: Any) -> None:
        self.rec.inputs.append(self.rec.new_slot(a))

    # -- the doors ----------------------------------------------------------------------------
    def _call(self, kind: str, name: str, key: tuple[Any, ...],
              fn: Callable[[list[Any]], Any], args: Sequence[Any], out: Any,
              into: Callable[[list[Any], Any, Any], None] | None = None) -> None:
        consts: list[Any] = []
        refs: list[tuple[int, int]] = []
        for i, a in enumerate(args):
            if is_array(a):
                refs.append((i, self.rec.ref(a)))
                consts.append(None)
            else:
                consts.append(a)
        s = self.rec.new_slot(out)
        self.rec.nodes.append(Call(kind, name, key, fn, consts, tuple(refs), s, user_line(),
                                   into=into))

    def kernel(self, name: str, key: tuple[Any, ...], fn: Callable[[list[Any]], Any],
               args: Sequence[Any], out: Any,
               into: Callable[[list[Any], Any, Any], None] | None = None) -> None:
        if not self._suspended:
            self._call("kernel", name, key, fn, args, out, into)

    def conversion(self, key: tuple[Any, ...], run: Callable[[Any], Any],
                   replay: Callable[[Any], Any], local: Any) -> Any:
        if self._suspended:
            return run(local)
        t = self._trace
        n0 = len(t.records) if t is not None else 0
        out = run(local)
        if t is not None:
            self.rec.conversions.append((n0, len(t.records)))
        if out is not local:
            self._call("conversion", "to_global", key, lambda a: replay(a[0]), [local], out)
        return out

    def set_grad(self, leaf: GlobalTensor, grad: GlobalTensor | None) -> None:
        if self._suspended:
            return
        if grad is None:
            self.rec.nodes.append(SetGrad(leaf, -1, None, None, user_line()))
        else:
            self.rec.nodes.append(SetGrad(leaf, self.rec.ref(grad._local), grad._layout,
                                          grad._dtype, user_line()))

    def created(self, key: tuple[Any, ...], fn: Callable[[Any], Any], data: Any,
                out: Any, into: Callable[[list[Any], Any, Any], None] | None = None) -> None:
        """``out`` (a shard) was made by ``fn(data)`` from a host array: recorded when
        ``data`` is an input of the step (or a reshaped view of one), else ``out`` is
        an external value like any other. ``into([data], out, scratch)``: ``fn``'s form
        that writes the shard into a given array, if it has one."""
        if self._suspended or not isinstance(data, np.ndarray):
            return
        for s in self.rec.inputs:
            inp = self.rec.values[s]
            if not isinstance(inp, np.ndarray):
                continue
            if data is inp:
                self._call("tensor", "sm.tensor", key, lambda a: fn(a[0]), [inp], out, into)
                return
            if (data.size == inp.size and data.dtype == inp.dtype and inp.size
                    and data.flags.c_contiguous and inp.flags.c_contiguous
                    and data.__array_interface__["data"][0]
                    == inp.__array_interface__["data"][0]):
                shape = data.shape
                self._call("tensor", "sm.tensor", key + (shape,),
                           _reshaped(fn, shape), [inp], out,
                           None if into is None else _reshaped_into(into, shape))
                return

    def host_read(self, what: str) -> None:
        if self._suspended:
            return
        raise GraphBreak(f"sm.graph: {what} at {user_line()} reads a value on the host: a "
                         f"graph cannot hold it (move the read out of the step, after the "
                         f"call, or run this step eagerly)")

    @contextlib.contextmanager
    def host_call(self, fn: Callable[..., Any], args: tuple[Any, ...],
                  mutated: Sequence[tuple[GlobalTensor, Any]]) -> Iterator[None]:
        if self._suspended:
            yield
            return
        kept: list[Any] = []
        for a in args:
            if isinstance(a, GlobalTensor) and not a._requires_grad:
                # a value of the step (a gradient): rebuilt from its slot at replay; a
                # leaf that requires grad (a parameter) is passed as itself
                kept.append(TensorRef(self.rec.ref(a._local), a._layout, a._dtype))
            else:
                kept.append(a)
        self.rec.nodes.append(HostCall(fn, tuple(kept), user_line(),
                                       any(isinstance(a, TensorRef) for a in kept)))
        for t, a in mutated:
            self.rec.mutated[id(a)] = (t, a)
        tr = self._trace
        n0 = len(tr.records) if tr is not None else 0
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1
            if tr is not None:  # its collectives are replayed with it
                self.rec.conversions.append((n0, len(tr.records)))

    # -- the whole step ---------------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Record while the block runs; then check its collectives were all conversions."""
        if current_modes().recorder is not None:
            raise GraphBreak("sm.graph: a graph called inside the capture of another "
                             "graph (nested graphs are not supported)")
        with trace() as t:
            self._trace = t
            scope = enter("recorder", self)  # the ``recorder`` field of the scoped modes
            try:
                yield
            finally:
                leave(scope)
                self._trace = None
        inside = {i for a, b in self.rec.conversions for i in range(a, b)}
        bad = next((r for i, r in enumerate(t.records) if i not in inside), None)
        mine = None if bad is None else GraphBreak(
            f"sm.graph: the step made a {bad.op} outside a conversion or a host call the "
            f"graph can replay (clip_grad_norm_'s reduction, a ZeRO gather or a direct "
            f"sm.comm call): not capturable yet; run this step eagerly")
        # a collective or message made on some ranks only (a point-to-point transfer): the
        # ranks without one must raise too, or they would replay alone
        raise_if_any(mine, "sm.graph capture", label="sm.graph capture")


def _reshaped(fn: Callable[[Any], Any], shape: tuple[int, ...]) -> Callable[[list[Any]], Any]:
    """``fn`` of its one argument reshaped to ``shape`` (``sm.tensor`` of a reshaped input)."""
    return lambda a: fn(a[0].reshape(shape))


def _reshaped_into(into: Callable[[list[Any], Any, Any], None],
                   shape: tuple[int, ...]) -> Callable[[list[Any], Any, Any], None]:
    """``into`` of its one argument reshaped to ``shape``."""
    return lambda a, out, s: into([a[0].reshape(shape)], out, s)


def _equal(x: Any, y: Any) -> bool:
    """Whether two recorded arguments are the same value (arrays by content, NaN
    equal; global tensors: the same object)."""
    if isinstance(x, GlobalTensor) or isinstance(y, GlobalTensor):
        return x is y
    if is_array(x) or is_array(y):
        if not (is_array(x) and is_array(y)) or x.shape != y.shape or x.dtype != y.dtype:
            return False
        try:
            return bool(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True))
        except TypeError:
            return bool(np.array_equal(np.asarray(x), np.asarray(y)))
    if type(x) is not type(y):
        return False
    if isinstance(x, (float, np.floating)) and x != x:
        return bool(y != y)
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - an object without a plain equality: not equal
        return x is y


def _same_key(x: Any, y: Any, depth: int = 0) -> bool:
    """Whether two recorded keys are equal: tuples item by item, functions by code and
    captured values (a builder makes a new closure per call), others by value."""
    if depth > 8:  # a closure that reaches itself: only the same object is equal
        return x is y
    d = depth + 1
    if isinstance(x, tuple) and isinstance(y, tuple):
        return len(x) == len(y) and all(_same_key(p, q, d) for p, q in zip(x, y))
    if x is y:
        return True
    if isinstance(x, functools.partial) and isinstance(y, functools.partial):
        return (_same_key(x.func, y.func, d) and _same_key(tuple(x.args), tuple(y.args), d)
                and _same_key(tuple(sorted(x.keywords.items())),
                              tuple(sorted(y.keywords.items())), d))
    code = getattr(x, "__code__", None)
    if code is not None:
        if code is not getattr(y, "__code__", None):
            return False
        cx = tuple(c.cell_contents for c in (x.__closure__ or ()))
        cy = tuple(c.cell_contents for c in (y.__closure__ or ()))
        return _same_key(cx, cy, d) and _same_key(x.__defaults__ or (), y.__defaults__ or (), d)
    if isinstance(x, list) and isinstance(y, list):
        return _same_key(tuple(x), tuple(y), d)
    return _equal(x, y)


def _node_text(n: Node) -> str:
    if isinstance(n, Call):
        return f"{n.kind} {n.name}"
    if isinstance(n, SetGrad):
        return "set .grad"
    return f"call {getattr(n.fn, '__qualname__', n.fn)}"


def compare(a: Recording, b: Recording) -> None:
    """Raise :class:`GraphBreak` where two recordings of one signature differ (see the
    module docstring); return when ``b`` may be replayed for this signature."""
    if len(a.nodes) != len(b.nodes):
        i = next((i for i, (x, y) in enumerate(zip(a.nodes, b.nodes))
                  if _node_text(x) != _node_text(y)), min(len(a.nodes), len(b.nodes)))
        where = b.nodes[i].where if i < len(b.nodes) else a.nodes[i].where
        raise GraphBreak(f"sm.graph: two calls of the step with the same signature ran "
                         f"{len(a.nodes)} and {len(b.nodes)} steps, first apart at step {i} "
                         f"({where}): data-dependent control flow cannot be captured")
    for i, (x, y) in enumerate(zip(a.nodes, b.nodes)):
        if type(x) is not type(y) or _node_text(x) != _node_text(y):
            raise GraphBreak(f"sm.graph: step {i} was {_node_text(x)} in one call and "
                             f"{_node_text(y)} in the next ({y.where}): data-dependent "
                             f"control flow cannot be captured")
        if isinstance(x, Call) and isinstance(y, Call):
            same = (_same_key(x.key, y.key) and x.refs == y.refs and x.out == y.out
                    and all(_equal(p, q) for p, q in zip(x.consts, y.consts)))
            if not same:
                raise GraphBreak(f"sm.graph: {y.kind} {y.name} at {y.where} has other "
                                 f"arguments in two calls of the same signature (a value "
                                 f"from Python state, such as a random stream's counter or "
                                 f"a step count): it cannot be replayed")
        elif isinstance(x, SetGrad) and isinstance(y, SetGrad):
            if x.leaf is not y.leaf or x.slot != y.slot:
                raise GraphBreak(f"sm.graph: .grad set at {y.where} differs between two "
                                 f"calls: it cannot be replayed")
        elif isinstance(x, HostCall) and isinstance(y, HostCall):
            if x.fn != y.fn or not all(_equal(p, q) for p, q in zip(x.args, y.args)):
                raise GraphBreak(f"sm.graph: {_node_text(y)} at {y.where} differs between "
                                 f"two calls: it cannot be replayed")
    if set(a.externals) != set(b.externals):
        raise GraphBreak("sm.graph: the step read other arrays from outside in two calls of "
                         "the same signature: it cannot be replayed")
    for s, eb in b.externals.items():
        ea = a.externals[s]
        if ea.array is eb.array:
            if not _equal(ea.snapshot, eb.snapshot) and id(eb.array) not in b.mutated:
                raise GraphBreak(f"sm.graph: an array read at {eb.where} was changed "
                                 f"between two calls by something the graph does not "
                                 f"replay (only the optimizers' updates are): it cannot be "
                                 f"captured")
        elif not _equal(ea.snapshot, eb.snapshot):
            raise GraphBreak(f"sm.graph: a value read at {eb.where} is made outside the "
                             f"graph and differs between two calls (from data or Python "
                             f"state the step was not given as an argument, or a gradient "
                             f"accumulated over calls): pass it as an argument of the "
                             f"step, or zero the gradients in the step")
