"""``sm.nn.checkpoint``: activation recomputation, as ``torch.utils.checkpoint.checkpoint``
with ``use_reentrant=False``.

``y = sm.nn.checkpoint(fn, *args, policy="full")`` runs ``fn(*args)`` as usual, recording
its ops on the tape, then drops the data its nodes keep for their backward rules (the
activations); the region keeps its inputs, ``fn`` and its arguments, where the random
streams stood and the autocast state. When backward reaches the first node whose data was
dropped, the engine asks the region to :meth:`~_Region.restore` it: ``fn`` runs again
under the same random state (so dropout masks and every draw repeat: the generator is
counter-based) and autocast state, with grad recording on, and each dropped node gets the
data of the node the rerun recorded in its place. The tape ops of packages above autograd
(ZeRO stage 3's gathered parameters) keep their data: their package frees it after the
forward and gathers it again for backward itself; the rerun's forward hooks gather
their own copies for it. The graph is the forward's own, so the
gradients are bit-identical to those without recomputation, every gradient hook
(data-parallel buckets, ZeRO) sees the same calls, and ZeRO stage 3 gathers the
parameters again for the rerun through its forward hooks. Afterwards the random streams
are put back where they stood, as if nothing had been recomputed.

``policy``: ``"full"`` drops every node's data; ``"selective"`` keeps that of the matrix
products (their operands, the largest saved tensors to recompute: a rerun then only
refills the cheap elementwise and normalisation nodes' data); a callable
``policy(op_name) -> bool`` keeps the nodes of the ops it names. (The rerun runs the whole
region either way; a selective policy saves memory where it drops, not compute.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import random as _random
from ..grad_mode import enable_grad
from ..ops import autocast as _autocast
from ..ops.registry import REGISTRY
from ..tape import Node, capturing
from ..tensor import GlobalTensor

__all__ = ["checkpoint", "SELECTIVE_OPS"]

#: The ops whose nodes ``policy="selective"`` keeps.
SELECTIVE_OPS: frozenset[str] = frozenset({"matmul", "matmul_tn", "matmul_nt"})


def _policy(policy: Any) -> Callable[[str], bool]:
    if policy == "full":
        return lambda name: False
    if policy == "selective":
        return lambda name: name in SELECTIVE_OPS
    if callable(policy):
        return policy  # type: ignore[no-any-return]
    raise ValueError(f"checkpoint: policy must be 'full', 'selective' or a callable "
                     f"policy(op_name) -> bool, got {policy!r}")


def _owned_elsewhere(node: Node | None) -> bool:
    """Whether a node is a tape op of a package above autograd (ZeRO's gathers): that
    package frees and regathers its data itself, so a region neither drops nor refills
    it (its rerun gathers its own copies, which it frees again)."""
    return node is not None and node.name not in REGISTRY and node.name != "to_global"


def _stand_in(x: Any) -> Any:
    """A computed tensor's layout, dtype and place in the graph, without its data."""
    if not isinstance(x, GlobalTensor) or x._local is None or _owned_elsewhere(x._node):
        return x
    m = GlobalTensor(None, x.layout, x.dtype)
    m._set_node(x._node)
    return m


def _refilled(old: Any, new: Any) -> Any:
    """``old`` (a stand-in) with the data of ``new`` (the rerun's tensor in its place)."""
    if not isinstance(old, GlobalTensor) or old._local is not None:
        return old
    if not isinstance(new, GlobalTensor) or new._local is None:
        return old
    t = GlobalTensor(new._local, old.layout, old.dtype)
    t._set_node(old._node)
    return t


class _Region:
    """One ``checkpoint`` call: what it needs to rerun, and the nodes it dropped."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], rng: tuple[int, int],
                 autocast_state: _autocast.AutocastState) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.rng, self.autocast_state = rng, autocast_state
        self.nodes: list[Node] = []
        self.dropped = 0

    def drop(self, nodes: list[Node], keep: Callable[[str], bool]) -> None:
        """Drop the data of every node of ``nodes`` that ``keep`` does not name."""
        self.nodes = nodes
        for node in nodes:
            if keep(node.name) or _owned_elsewhere(node):
                continue
            node.inputs = tuple(x if x is None or not isinstance(x, GlobalTensor)
                                or x._node is None else _stand_in(x) for x in node.inputs)
            node.args = tuple(a if not isinstance(a, GlobalTensor) or a._node is None
                              else _stand_in(a) for a in node.args)
            node.out = _stand_in(node.out)
            node.recompute = self
            self.dropped += 1

    def restore(self) -> None:
        """Rerun the region and give each dropped node its data back (once)."""
        if not self.dropped:
            return
        before = _random.get_state()
        _random.set_state(self.rng)
        try:
            with capturing() as new, enable_grad(), _autocast.using(self.autocast_state):
                self.fn(*self.args, **self.kwargs)
        finally:
            _random.set_state(before)  # the streams stand where they would without a rerun
        if [n.name for n in new] != [n.name for n in self.nodes]:
            raise RuntimeError(
                f"checkpoint: the recomputation recorded {len(new)} ops "
                f"({', '.join(n.name for n in new[:6])}...), the forward {len(self.nodes)} "
                f"({', '.join(n.name for n in self.nodes[:6])}...): fn must run the same "
                f"ops each time it is called with the same arguments")
        for old, nw in zip(self.nodes, new):
            if old.recompute is not self:
                continue
            old.inputs = tuple(_refilled(o, n) for o, n in zip(old.inputs, nw.inputs))
            old.args = tuple(_refilled(o, n) for o, n in zip(old.args, nw.args))
            old.out = _refilled(old.out, nw.out)
            old.recompute = None
        self.dropped = 0
        self.nodes = []


def checkpoint(fn: Callable[..., Any], *args: Any, policy: Any = "full",
               **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, its activations recomputed in backward instead of kept.

    Parameters
    ----------
    fn : callable
        A function or module (a transformer block, say) of global tensors; it must run
        the same ops each time it is called with the same arguments.
    policy : "full", "selective" or callable
        Which nodes keep their data: none; the matrix products' (:data:`SELECTIVE_OPS`);
        those of the ops ``policy(op_name)`` names.

    Returns
    -------
    What ``fn`` returns. Gradients are bit-identical to those of ``fn(*args)``.
    """
    if not callable(fn):
        raise TypeError(f"checkpoint: fn must be callable, got {type(fn).__name__}")
    keep = _policy(policy)
    region = _Region(fn, args, kwargs, _random.get_state(), _autocast.current())
    with capturing() as nodes:
        out = fn(*args, **kwargs)
    region.drop(nodes, keep)
    return out
