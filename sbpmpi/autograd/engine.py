"""The backward pass: walk the tape from a result to the leaves, applying the rules.

Gradients are global tensors of their tensor's shape in whatever layout the rules
produce; at a leaf the gradient is boxed to the leaf's own placement and SBP (an
all-reduce for a broadcast weight under data parallelism, a local slice or a
reduce-scatter for a split one) and added to ``leaf.grad``. Everything is decided from
metadata, so every rank makes the same calls and argument errors are raised on every
rank before any communication.

The engine knows nothing of data parallelism: code above it takes part through the hooks
of :mod:`.hooks`. A leaf's hooks see each of its gradient contributions (and may take
them over: a data-parallel reducer writes them into a bucket instead of ``.grad``), the
poll hooks run before each rule (the reducers let MPI advance the buckets in flight
there), and the end hooks run once when backward ends, failed or not (the reducers wait
for their buckets, so ``.grad`` is never read in flight). With ``sm.trace()`` active
each rule leaves a mark (``"backward <op>"``, then ``"backward end"``) among the comm
records, which shows the buckets' all-reduces starting while backward computes.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..comm.trace import ACTIVE, mark
from ..core.sbp import broadcast
from ..creation import full
from ..grad_mode import no_grad
from ..ops import autocast
from ..tape import Node, differentiable
from ..tensor import GlobalTensor
from .gradients import accumulate
from .hooks import HOOKS, LeafCalls, run_hook
from .rules import rule_for

__all__ = ["backward", "accumulate"]


def _seed(root: GlobalTensor, grad: Any) -> GlobalTensor:
    if grad is None:
        if root.size != 1:
            raise RuntimeError(
                f"backward: the tensor has shape {root.shape}; a gradient can be created "
                f"implicitly only for a single-element result (a loss): pass "
                f"backward(gradient) with a GlobalTensor of shape {root.shape}")
        # the gradient of the global value is 1, held by every rank (whatever root's SBP:
        # a partial loss needs no reduction, its rule passes the gradient on)
        return full(root.shape, 1, placement=root.placement,
                    sbp=(broadcast,) * root.placement.ndim, dtype=root.dtype)
    if not isinstance(grad, GlobalTensor):
        raise TypeError(f"backward: gradient must be a GlobalTensor of shape {root.shape}, "
                        f"got {type(grad).__name__}")
    if grad.shape != root.shape:
        raise ValueError(f"backward: gradient has shape {grad.shape}, expected the shape of "
                         f"the tensor, {root.shape}")
    if not differentiable(grad.dtype):
        raise TypeError(f"backward: gradient must have a floating dtype, got {grad.dtype}")
    if grad.placement.type != root.placement.type:
        raise TypeError(f"backward: gradient lives on {grad.placement.type!r}, the tensor on "
                        f"{root.placement.type!r}")
    return grad


def _order(root: Node) -> list[Node]:
    """Nodes reachable from ``root``, each after every node that uses its result."""
    post: list[Node] = []
    seen = {id(root)}
    stack: list[tuple[Node, int]] = [(root, 0)]
    while stack:
        node, i = stack.pop()
        if i < len(node.inputs):
            stack.append((node, i + 1))
            x = node.inputs[i]
            child = x._node if isinstance(x, GlobalTensor) and node.needs[i] else None
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append((child, 0))
        else:
            post.append(node)
    return post[::-1]


def backward(root: GlobalTensor, gradient: Any = None) -> None:
    """Accumulate d(root)/d(leaf) (times ``gradient``) into ``leaf.grad`` of every leaf.

    ``gradient`` is required unless ``root`` has one element. Collective: every rank
    of the world makes the same calls.
    """
    if not isinstance(root, GlobalTensor):
        raise TypeError(f"backward: needs a GlobalTensor, got {type(root).__name__}")
    if not root._requires_grad:
        raise RuntimeError("backward: the tensor does not require grad and has no grad_fn "
                           "(make a leaf with requires_grad=True, outside sm.no_grad())")
    g = _seed(root, gradient)
    failed = True
    with no_grad(), autocast.suspended():  # rules follow the forward's dtypes
        try:
            if root._node is None:
                _to_leaf(root, g, HOOKS.root_calls(root))
            else:
                _run(root._node, g)
            if ACTIVE:
                mark("backward end")
            failed = False
        finally:
            HOOKS.end_backward(failed)  # e.g. the buckets in flight waited for


def _to_leaf(leaf: GlobalTensor, g: GlobalTensor, calls: dict[int, LeafCalls]) -> None:
    """``g`` to ``leaf``'s hooks, then, unless one took it over, into ``leaf.grad``."""
    c = calls.get(id(leaf)) if calls else None
    if c is None or not c.call(leaf, g):
        accumulate(leaf, g)


def _missing(x: Any, calls: dict[int, LeafCalls]) -> None:
    """A gradient of ``x`` that will not come: its leaf hooks are told (they count)."""
    c = calls.get(id(x))
    if c is not None:
        c.call(x, None)


def _run(root: Node, g: GlobalTensor) -> None:
    """Apply the rules from ``root`` (gradient ``g``) back to the leaves."""
    grads: dict[int, GlobalTensor] = {id(root): g}
    order = _order(root)
    calls = HOOKS.leaf_calls(order)
    polls = HOOKS.polls()
    for node in order:
        gy = grads.pop(id(node), None)
        if gy is None:
            if calls:
                for x, need in zip(node.inputs, node.needs):
                    if need:
                        _missing(x, calls)
            continue
        rule = rule_for(node.name)
        if rule is None:  # e.g. the backward-only ops, called by hand with grad on
            raise RuntimeError(f"backward: op {node.name!r} has no backward rule")
        for poll in polls:
            run_hook(poll)
        if ACTIVE:
            mark(f"backward {node.name}")
        if node.recompute is not None:  # sm.nn.checkpoint dropped its data: rerun the region
            node.recompute.restore()
        gxs = rule(node, gy)
        for x, need, gx in zip(node.inputs, node.needs, gxs):
            if not need:
                continue
            if gx is None:
                if calls:
                    _missing(x, calls)
                continue
            assert isinstance(x, GlobalTensor) and gx.shape == x.shape, (node, gx, x)
            if x._node is None:
                _to_leaf(x, gx, calls)
                continue
            if gx.dtype != x.dtype:
                gx = ops.astype(gx, x.dtype)
            key = id(x._node)
            old = grads.get(key)
            grads[key] = gx if old is None else ops.add(old, gx)
