"""The backward pass: walk the tape from a result to the leaves, applying the rules.

Gradients are global tensors of their tensor's shape in whatever layout the rules
produce; at a leaf the gradient is boxed to the leaf's own placement and SBP (an
all-reduce for a broadcast weight under data parallelism, a local slice or a
reduce-scatter for a split one) and added to ``leaf.grad``. Everything is decided from
metadata, so every rank makes the same calls and argument errors are raised on every
rank before any communication.

Parameters of a :class:`sbpmpi.nn.DataParallel` model take another road at the leaf:
their gradient is written into a bucket of :mod:`.buckets`, whose all-reduce starts as
soon as the bucket is full; the loop lets MPI advance the buckets in flight between rules
and waits for all of them before ``backward`` returns (so ``.grad`` is never read in
flight). With ``sm.trace()`` active each rule leaves a mark (``"backward <op>"``, then
``"backward end"``) among the comm records, which shows the buckets' all-reduces starting
while backward computes.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..comm.trace import ACTIVE, mark
from ..core.sbp import broadcast
from ..creation import full
from ..grad_mode import no_grad
from ..tape import Node, differentiable
from ..tensor import GlobalTensor
from . import buckets
from .gradients import accumulate
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
    with no_grad():
        try:
            if root._node is None:
                _to_leaf(root, g)
                slot = buckets.slot_of(root)
                if slot is not None:
                    buckets.done(slot)
            else:
                _run(root._node, g)
            if ACTIVE:
                mark("backward end")
            buckets.finish()
        except BaseException:
            buckets.abandon()  # no bucket left in flight
            raise


def _to_leaf(leaf: GlobalTensor, g: GlobalTensor) -> None:
    """``g`` into ``leaf``'s bucket when it has one, else :func:`accumulate`."""
    slot = buckets.slot_of(leaf)
    if slot is None:
        accumulate(leaf, g)
    else:
        buckets.add(slot, g)


def _run(root: Node, g: GlobalTensor) -> None:
    """Apply the rules from ``root`` (gradient ``g``) back to the leaves."""
    grads: dict[int, GlobalTensor] = {id(root): g}
    order = _order(root)
    # a bucketed leaf's slot is complete when its last gradient has come (a parameter
    # used twice gets two), so the engine counts them down
    expected = buckets.contributions(order)
    for node in order:
        gy = grads.pop(id(node), None)
        if gy is None:
            if expected:
                for x, need in zip(node.inputs, node.needs):
                    if need:
                        buckets.arrived(x, expected)
            continue
        rule = rule_for(node.name)
        if rule is None:  # e.g. the backward-only ops, called by hand with grad on
            raise RuntimeError(f"backward: op {node.name!r} has no backward rule")
        if buckets.INFLIGHT:
            buckets.progress()
        if ACTIVE:
            mark(f"backward {node.name}")
        gxs = rule(node, gy)
        for x, need, gx in zip(node.inputs, node.needs, gxs):
            if not need:
                continue
            if gx is None:
                if expected:
                    buckets.arrived(x, expected)
                continue
            assert isinstance(x, GlobalTensor) and gx.shape == x.shape, (node, gx, x)
            if x._node is None:
                _to_leaf(x, gx)
                if expected:
                    buckets.arrived(x, expected)
                continue
            if gx.dtype != x.dtype:
                gx = ops.astype(gx, x.dtype)
            key = id(x._node)
            old = grads.get(key)
            grads[key] = gx if old is None else ops.add(old, gx)


