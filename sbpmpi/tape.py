"""The tape: one :class:`Node` per op result that needs a gradient.

An op's result that depends on a tensor requiring grad (while grad mode is on) gets a
node naming the op, its operands as the op call normalised them, its raw arguments
(for the backward rule's dims, keys, ...) and a detached view of the result (rules such
as ``exp`` reuse it). The node holds the operands, so the graph stays alive as long as
the result does; backward walks it from the result to the leaves.

A node keeps its operands' and result's data only where the op's backward rule reads
them (:data:`SAVES`): an ``add`` keeps the shapes and the graph of a computed operand,
not its array, so the forward's temporaries (``x @ W`` before ``+ b``) are freed when the
program drops them, as a hand-written NumPy step frees them, instead of living until
backward. Leaves are always kept as they are (backward adds into their ``.grad``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .core.dtypes import is_floating
from .core.layout import Layout
from .core.modes import current_modes, enter, leave
from .grad_mode import is_grad_enabled
from .tensor import GlobalTensor

__all__ = ["Node", "Saves", "SAVES", "capturing", "held_bytes", "record_op", "record_conversion", "differentiable", "detached",
           "check_requires_grad", "check_grad_value"]


@dataclass(eq=False)
class Node:
    """One recorded op: ``name``, its ``inputs`` (GlobalTensors and scalars), the raw
    ``args``/``kwargs`` it was called with, its result ``out`` (detached) and, per input,
    whether a gradient must flow there (``needs``)."""

    name: str
    inputs: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: GlobalTensor
    needs: tuple[bool, ...] = field(default=())
    #: an activation recomputation that dropped this node's data (``sm.nn.checkpoint``):
    #: the engine calls its ``restore()`` before the rule, which puts the data back
    recompute: Any = None

    def param(self, index: int, name: str, default: Any = None) -> Any:
        """Argument ``name`` of the call, given by position ``index`` or by keyword."""
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[index] if index < len(self.args) else default

    def __repr__(self) -> str:
        return f"<grad_fn {self.name} of shape {self.out.shape}>"


class Saves(NamedTuple):
    """What an op's backward rule reads besides shapes, layouts and the graph: the data
    of its computed (non-leaf) operands, the data of its result."""

    operands: bool
    result: bool


#: Ops whose rule reads less than everything (the others keep both): the rules of
#: :mod:`.rules` use only the metadata of what is not kept (``relu``'s mask comes from
#: its result).
SAVES: dict[str, Saves] = {
    "add": Saves(False, False), "sub": Saves(False, False), "neg": Saves(False, False),
    "reshape": Saves(False, False), "astype": Saves(False, False),
    "sum": Saves(False, False), "mean": Saves(False, False), "getitem": Saves(False, False),
    "transpose": Saves(False, False), "cat": Saves(False, False),
    "relu": Saves(False, True),
    "mul": Saves(True, False), "where": Saves(True, False), "maximum": Saves(True, False),
    "minimum": Saves(True, False), "matmul": Saves(True, False),
    "cross_entropy": Saves(True, False), "normalize": Saves(True, False),
}


def _metadata(x: GlobalTensor) -> GlobalTensor:
    """``x``'s layout, dtype and place in the graph without its array (a kernel handed it
    fails: no rule may read it)."""
    m = GlobalTensor(None, x._layout, x._dtype)
    m._set_node(x._node)
    return m


def _saved(name: str, operands: tuple[Any, ...], args: tuple[Any, ...], out: GlobalTensor
           ) -> tuple[tuple[Any, ...], tuple[Any, ...], GlobalTensor]:
    """(operands, args, result) as the node of ``name`` keeps them (:data:`SAVES`)."""
    saves = SAVES.get(name)
    if saves is None:
        return operands, args, detached(out)
    if not saves.operands:
        light = {id(x): _metadata(x) for x in operands
                 if isinstance(x, GlobalTensor) and x._node is not None}
        if light:
            operands = tuple(light.get(id(x), x) for x in operands)
            args = tuple(light.get(id(a), a) for a in args)
    return operands, args, detached(out) if saves.result else _metadata(out)


def differentiable(dtype: np.dtype) -> bool:
    """Real floating dtypes carry gradients (complex ones are not supported yet: their
    rules need conjugates); bfloat16 is one of them."""
    return is_floating(dtype)


def detached(x: GlobalTensor) -> GlobalTensor:
    """``x``'s data and layout, without autograd state."""
    return GlobalTensor(x._local, x._layout, x._dtype)


def _needs(x: Any) -> bool:
    return isinstance(x, GlobalTensor) and x._requires_grad


def record_op(name: str, operands: tuple[Any, ...], args: tuple[Any, ...],
              kwargs: dict[str, Any], out: GlobalTensor) -> GlobalTensor:
    """Attach a node to ``out`` when grad mode is on and an operand requires grad."""
    if not _enabled_for(operands, out):
        return out
    needs = tuple(_needs(o) for o in operands)
    operands, args, kept = _saved(name, operands, args, out)
    node = Node(name, operands, args, kwargs, kept, needs)
    out._set_node(node)
    nodes = current_modes().tape_capture
    if nodes is not None:
        nodes.append(node)
    return out


def record_conversion(src: GlobalTensor, out: GlobalTensor,
                      grad: Layout | None = None) -> GlobalTensor:
    """Record ``out = src.to_global(...)`` (a new tensor: never ``src`` itself).

    ``grad``: the layout of the gradient the conversion passes back to ``src`` (from
    ``grad_sbp``, :func:`sbpmpi.conversion.grad_destination`); None for the conjugate of
    ``src``'s SBP. The node keeps its SBP as the keyword ``grad_sbp``."""
    if not _enabled_for((src,), out):
        return out
    if out is src:
        out = detached(src)
    kwargs = {} if grad is None else {"grad_sbp": grad.sbp}
    node = Node("to_global", (src,), (), kwargs, detached(out), (True,))
    out._set_node(node)
    nodes = current_modes().tape_capture
    if nodes is not None:
        nodes.append(node)
    return out


@contextmanager
def capturing() -> Iterator[list[Node]]:
    """The nodes recorded while the block runs (an activation recomputation's region,
    ``sm.nn.checkpoint``), in order; an inner block's nodes are its own. The list is the
    ``tape_capture`` field of the scoped modes (:mod:`sbpmpi.core.modes`)."""
    nodes: list[Node] = []
    scope = enter("tape_capture", nodes)
    try:
        yield nodes
    finally:
        leave(scope)


def _enabled_for(operands: tuple[Any, ...], out: GlobalTensor) -> bool:
    return (is_grad_enabled() and differentiable(out.dtype)
            and any(_needs(o) for o in operands))


def check_requires_grad(x: GlobalTensor, flag: Any) -> bool:
    """The value of ``x.requires_grad_(flag)``, checked: a bool, a floating dtype, a leaf."""
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(f"requires_grad must be a bool, got {type(flag).__name__} {flag!r}")
    if flag and not differentiable(x.dtype):
        raise TypeError(f"requires_grad=True needs a real floating dtype: a tensor of dtype "
                        f"{x.dtype} has no gradient (cast it with x.astype(np.float32))")
    if x._node is not None and not flag:
        raise RuntimeError("requires_grad_(False) on a non-leaf tensor: use x.detach()")
    return bool(flag)


def check_grad_value(x: GlobalTensor, g: Any) -> GlobalTensor | None:
    """A value for ``x.grad``: None or a GlobalTensor of x's shape, placement and SBP."""
    if g is None:
        return None
    if not isinstance(g, GlobalTensor):
        raise TypeError(f"x.grad must be None or a GlobalTensor, got {type(g).__name__}")
    if g.layout != x.layout:
        raise ValueError(f"x.grad must have x's shape, placement and SBP ({x.layout}), got "
                         f"{g.layout}")
    return g


def held_bytes(root: GlobalTensor) -> int:
    """Bytes of the arrays the tape behind ``root`` keeps on this rank: the data of the
    computed tensors its nodes hold for their rules (leaves, which live anyway, not
    counted), each array once (a view counts as its base). The activation memory that
    ``sm.nn.checkpoint`` trades for a second forward."""
    seen_nodes: set[int] = set()
    seen_arrays: set[int] = set()
    total = 0
    stack = [root._node] if root._node is not None else []
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        for x in (*node.inputs, *node.args, node.out):
            if not isinstance(x, GlobalTensor):
                continue
            if x._node is not None and id(x._node) not in seen_nodes:
                stack.append(x._node)
            if x is node.out or x._node is not None:
                a = x._local
                if a is None:
                    continue
                base = a.base if getattr(a, "base", None) is not None else a
                if id(base) not in seen_arrays:
                    seen_arrays.add(id(base))
                    # a pooled array's base is the pool's lease of its block, no array:
                    # the array's own bytes (backend.empty)
                    total += int(getattr(base, "nbytes", a.nbytes))
    return total
