"""Backward rules, written with sbpmpi ops themselves, attached to the op registry.

Each rule is attached once, at import, to its op's entry in
:data:`sbpmpi.ops.registry.REGISTRY` (``attach_backward`` refuses a second one); tape
nodes that are not ops (``to_global``, the vocab-parallel cross-entropy, ZeRO's gathers)
have theirs in :data:`TAPE_ONLY_RULES`. :func:`rule_for` finds either.

``rule(node, g)`` gets the node of ``y = op(*inputs)`` and the gradient ``g`` of ``y``
(a GlobalTensor of y's shape, in whatever layout it arrived) and returns one gradient
per input (None where none is needed). Every rule is built of global ops, so each
backward step picks its SBP signature by the same inference as a forward op: the
gradient of data-parallel weights comes out ``partial_sum`` (matmul of two row splits),
a split stays split, and nothing is gathered whole unless the forward gathered too.
The engine runs rules under ``no_grad`` and casts each gradient to its input's dtype.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from .. import ops
from ..core.sbp import SBP, Broadcast, Partial, broadcast, partial_sum
from ..creation import zeros
from ..ops import elementwise as ew
from ..ops.call import norm_dim, norm_dims, shape_of
from ..ops.embedding import embedding_backward
from ..ops.inference import lazy_partial_outputs
from ..ops.linalg import matmul_nt, matmul_tn
from ..ops.losses import cross_entropy_grad, vocab_cross_entropy_grad
from ..ops.op import GlobalOp
from ..ops.registry import REGISTRY, attach_backward, backward_rule
from ..ops.shape import scatter
from ..tape import Node
from ..tensor import GlobalTensor

__all__ = ["TAPE_ONLY_RULES", "Rule", "rule_for", "unbroadcast", "expand_as", "conjugate_sbp",
           "register_rules"]

Grads = Sequence[GlobalTensor | None]
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_LN2, _LN10 = math.log(2.0), math.log(10.0)
Rule = Callable[[Node, GlobalTensor], Grads]


# ---- helpers ---------------------------------------------------------------------------------


def unbroadcast(g: GlobalTensor, shape: tuple[int, ...]) -> GlobalTensor:
    """Sum ``g`` over the dims NumPy broadcasting added or stretched to reach ``shape``.

    The sum stays local where ``g`` is split on a summed dim (a ``partial_sum``, reduced
    once where the gradient meets its operand's layout: a data-parallel bucket, say),
    whatever the reduction's cost in ``g``'s dtype (a half-width one is dearer)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and g.shape[lead + i] != 1)
    if dims:
        with lazy_partial_outputs():
            g = ops.sum(g, dims)
    return g if g.shape == shape else ops.reshape(g, shape)


def _like_sbp(x: GlobalTensor) -> tuple[SBP, ...]:
    """x's SBP with every partial axis made broadcast (a valid layout for a new value)."""
    return tuple(broadcast if isinstance(s, Partial) else s for s in x.sbp)


def expand_as(g: GlobalTensor, x: GlobalTensor) -> GlobalTensor:
    """``g`` (broadcastable to x's shape) stretched to x's shape, laid out like x.

    Adds ``g`` to zeros in x's layout, so a split of x survives (no op broadcasts a
    tensor to a larger split layout on its own).
    """
    if g.shape == x.shape:
        return g
    z = zeros(x.shape, placement=x.placement, sbp=_like_sbp(x), dtype=g.dtype)
    return ops.add(z, g)


def _zero(x: Any, g: GlobalTensor) -> GlobalTensor:
    """A zero gradient for ``x``, laid out like it (partial axes broadcast)."""
    return zeros(x.shape, placement=x.placement, sbp=_like_sbp(x), dtype=g.dtype)


def conjugate_sbp(s: SBP) -> SBP:
    """The SBP a gradient takes for a forward SBP: B -> P(sum), any partial -> B, S -> S.

    The gradient of a broadcast value is the sum of its copies' gradients (so partial
    sum), and every operand of a partial value gets the whole gradient of the value
    (so broadcast; a partial_max value is a function of the global value like any
    other, the mask of its max lives in the rule of the op that made it).
    """
    if isinstance(s, Broadcast):
        return partial_sum
    if isinstance(s, Partial):
        return broadcast
    return s


def _reduced_shape(x: GlobalTensor, node: Node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(reduced dims, x's shape with them as 1) of a reduction node."""
    axes = norm_dims(node.name, node.param(1, "dim"), x.ndim)
    return axes, tuple(1 if d in axes else n for d, n in enumerate(x.shape))


# ---- rules ------------------------------------------------------------------------------------


def _add(node: Node, g: GlobalTensor) -> Grads:
    a, b = node.inputs
    return [unbroadcast(g, shape_of(a)) if node.needs[0] else None,
            unbroadcast(g, shape_of(b)) if node.needs[1] else None]


def _sub(node: Node, g: GlobalTensor) -> Grads:
    a, b = node.inputs
    return [unbroadcast(g, shape_of(a)) if node.needs[0] else None,
            unbroadcast(ops.neg(g), shape_of(b)) if node.needs[1] else None]


def _mul(node: Node, g: GlobalTensor) -> Grads:
    a, b = node.inputs
    return [unbroadcast(ops.mul(g, b), shape_of(a)) if node.needs[0] else None,
            unbroadcast(ops.mul(g, a), shape_of(b)) if node.needs[1] else None]


def _div(node: Node, g: GlobalTensor) -> Grads:
    a, b = node.inputs
    ga = unbroadcast(ops.div(g, b), shape_of(a)) if node.needs[0] else None
    gb = unbroadcast(ops.neg(ops.div(ops.mul(g, node.out), b)), shape_of(b)) \
        if node.needs[1] else None
    return [ga, gb]


def _pow(node: Node, g: GlobalTensor) -> Grads:
    a, b = node.inputs
    ga = gb = None
    if node.needs[0]:  # b * a ** (b - 1)
        bm1 = ops.sub(b, 1) if isinstance(b, GlobalTensor) else b - 1
        ga = unbroadcast(ops.mul(g, ops.mul(b, ops.pow(a, bm1))), shape_of(a))
    if node.needs[1]:  # a ** b * log(a), taken as 0 where a <= 0
        if isinstance(a, GlobalTensor):
            pos = ops.gt(a, 0)
            loga: Any = ops.where(pos, ops.log(ops.where(pos, a, 1)), 0)
        else:
            loga = math.log(a) if a > 0 else 0.0
        gb = unbroadcast(ops.mul(g, ops.mul(node.out, loga)), shape_of(b))
    return [ga, gb]


def _atan2(node: Node, g: GlobalTensor) -> Grads:
    a, b = node.inputs
    r2 = ops.add(ops.mul(a, a), ops.mul(b, b))
    return [unbroadcast(ops.div(ops.mul(g, b), r2), shape_of(a)) if node.needs[0] else None,
            unbroadcast(ops.neg(ops.div(ops.mul(g, a), r2)), shape_of(b))
            if node.needs[1] else None]


def _hypot(node: Node, g: GlobalTensor) -> Grads:
    a, b = node.inputs
    return [unbroadcast(ops.div(ops.mul(g, a), node.out), shape_of(a)) if node.needs[0] else None,
            unbroadcast(ops.div(ops.mul(g, b), node.out), shape_of(b)) if node.needs[1] else None]


def _logaddexp(node: Node, g: GlobalTensor) -> Grads:
    a, b = node.inputs
    return [unbroadcast(ops.mul(g, ops.exp(ops.sub(a, node.out))), shape_of(a))
            if node.needs[0] else None,
            unbroadcast(ops.mul(g, ops.exp(ops.sub(b, node.out))), shape_of(b))
            if node.needs[1] else None]


def _copysign(node: Node, g: GlobalTensor) -> Grads:
    """``d copysign(a, b) / da = sign(a) sign(b)`` (b's sign bit); nothing flows to b."""
    a, b = node.inputs
    ga = None
    if node.needs[0]:
        ga = unbroadcast(ops.mul(g, ops.mul(ew.copysign(1.0, a), ew.copysign(1.0, b))),
                         shape_of(a))
    return [ga, _zero(b, g) if node.needs[1] else None]


def _floor_divide(node: Node, g: GlobalTensor) -> Grads:
    """Piecewise constant: zero gradients (as torch)."""
    a, b = node.inputs
    return [_zero(a, g) if node.needs[0] else None, _zero(b, g) if node.needs[1] else None]


def _remainder(node: Node, g: GlobalTensor) -> Grads:
    """``a - b floor(a / b)``: ``g`` for a, ``-g floor(a / b)`` for b."""
    a, b = node.inputs
    return [unbroadcast(g, shape_of(a)) if node.needs[0] else None,
            unbroadcast(ops.neg(ops.mul(g, ew.floor_divide(a, b))), shape_of(b))
            if node.needs[1] else None]


def _extremum(bigger: Callable[..., Any]) -> Rule:
    def rule(node: Node, g: GlobalTensor) -> Grads:
        """maximum/minimum: the gradient goes to the winner, half each on a tie."""
        a, b = node.inputs
        half = ops.mul(g, 0.5)
        tie = ops.eq(a, b)
        ga = unbroadcast(ops.where(bigger(a, b), g, ops.where(tie, half, 0)), shape_of(a)) \
            if node.needs[0] else None
        gb = unbroadcast(ops.where(bigger(b, a), g, ops.where(tie, half, 0)), shape_of(b)) \
            if node.needs[1] else None
        return [ga, gb]

    return rule


def _where(node: Node, g: GlobalTensor) -> Grads:
    c, x, y = node.inputs
    return [None,
            unbroadcast(ops.where(c, g, 0), shape_of(x)) if node.needs[1] else None,
            unbroadcast(ops.where(c, 0, g), shape_of(y)) if node.needs[2] else None]


def _unary(f: Callable[[Node, GlobalTensor, Any], GlobalTensor]) -> Rule:
    def rule(node: Node, g: GlobalTensor) -> Grads:
        return [f(node, g, node.inputs[0])]

    return rule


UNARY: dict[str, Callable[[Node, GlobalTensor, Any], GlobalTensor]] = {
    "neg": lambda n, g, x: ops.neg(g),
    "abs": lambda n, g, x: ops.where(ops.gt(x, 0), g, ops.where(ops.lt(x, 0), ops.neg(g), 0)),
    "exp": lambda n, g, x: ops.mul(g, n.out),
    "log": lambda n, g, x: ops.div(g, x),
    "sqrt": lambda n, g, x: ops.div(g, ops.mul(n.out, 2)),
    "tanh": lambda n, g, x: ops.mul(g, ops.sub(1, ops.mul(n.out, n.out))),
    "relu": lambda n, g, x: ops.where(ops.gt(n.out, 0), g, 0),  # out > 0 iff x > 0
    "sigmoid": lambda n, g, x: ops.mul(g, ops.mul(n.out, ops.sub(1, n.out))),
    "erf": lambda n, g, x: ops.mul(g, ops.mul(ops.exp(ops.neg(ops.mul(x, x))), _TWO_OVER_SQRT_PI)),
    "gelu": lambda n, g, x: ops.gelu_backward(g, x, n.param(1, "approximate", "none")),
    "normalize": lambda n, g, x: ops.normalize_backward(g, x, n.param(1, "eps", 1e-5)),
    "astype": lambda n, g, x: g,  # the engine casts to x's dtype
    "reshape": lambda n, g, x: ops.reshape(g, x.shape),
    "positive": lambda n, g, x: g,
    "conj": lambda n, g, x: g,  # real floating tensors only carry gradients
    "real": lambda n, g, x: g,
    "imag": lambda n, g, x: _zero(x, g),
    "expm1": lambda n, g, x: ops.mul(g, ops.add(n.out, 1)),
    "log1p": lambda n, g, x: ops.div(g, ops.add(x, 1)),
    "log2": lambda n, g, x: ops.div(g, ops.mul(x, _LN2)),
    "log10": lambda n, g, x: ops.div(g, ops.mul(x, _LN10)),
    "square": lambda n, g, x: ops.mul(g, ops.mul(x, 2)),
    "reciprocal": lambda n, g, x: ops.neg(ops.mul(g, ops.mul(n.out, n.out))),
    "sin": lambda n, g, x: ops.mul(g, ew.cos(x)),
    "cos": lambda n, g, x: ops.neg(ops.mul(g, ew.sin(x))),
    "tan": lambda n, g, x: ops.mul(g, ops.add(ops.mul(n.out, n.out), 1)),
    "asin": lambda n, g, x: ops.div(g, ops.sqrt(ops.sub(1, ops.mul(x, x)))),
    "acos": lambda n, g, x: ops.neg(ops.div(g, ops.sqrt(ops.sub(1, ops.mul(x, x))))),
    "atan": lambda n, g, x: ops.div(g, ops.add(ops.mul(x, x), 1)),
    "sinh": lambda n, g, x: ops.mul(g, ew.cosh(x)),
    "cosh": lambda n, g, x: ops.mul(g, ew.sinh(x)),
    "asinh": lambda n, g, x: ops.div(g, ops.sqrt(ops.add(ops.mul(x, x), 1))),
    "acosh": lambda n, g, x: ops.div(g, ops.sqrt(ops.sub(ops.mul(x, x), 1))),
    "atanh": lambda n, g, x: ops.div(g, ops.sub(1, ops.mul(x, x))),
    # piecewise constant: zero gradient (as torch)
    "sign": lambda n, g, x: _zero(x, g),
    "ceil": lambda n, g, x: _zero(x, g),
    "floor": lambda n, g, x: _zero(x, g),
    "trunc": lambda n, g, x: _zero(x, g),
    "round": lambda n, g, x: _zero(x, g),
}


def _is_weight(x: GlobalTensor) -> bool:
    """Whether ``x`` is a leaf (a parameter) or autocast's cast of one."""
    if x.is_leaf:
        return True
    n = x._node
    return n is not None and n.name == "astype" and bool(n.inputs) and n.inputs[0].is_leaf


def _matmul(node: Node, g: GlobalTensor) -> Grads:
    """As 2-D matmul, a 1-D operand taken as a row (left) or a column (right): the
    vector, and the gradient of the result, are reshaped to the matrices NumPy treats
    them as, and each gradient back to its operand's shape."""
    a, b = node.inputs
    a2 = ops.reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = ops.reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    if a.ndim == 1 or b.ndim == 1:
        g = ops.reshape(g, g.shape[:max(a.ndim, b.ndim) - 2] + (a2.shape[-2], b2.shape[-1]))
    # a weight's gradient, contracted over the split batch, stays a local partial_sum (as
    # in unbroadcast): reduced once where it meets the weight's layout (a bucket, say)
    with lazy_partial_outputs() if _is_weight(a) else contextlib.nullcontext():
        ga = unbroadcast(matmul_nt(g, b2), a2.shape) if node.needs[0] else None
    with lazy_partial_outputs() if _is_weight(b) else contextlib.nullcontext():
        gb = unbroadcast(matmul_tn(a2, g), b2.shape) if node.needs[1] else None
    return [ga if ga is None or a.ndim > 1 else ops.reshape(ga, a.shape),
            gb if gb is None or b.ndim > 1 else ops.reshape(gb, b.shape)]


def _sum(node: Node, g: GlobalTensor) -> Grads:
    x = node.inputs[0]
    _, kshape = _reduced_shape(x, node)
    return [expand_as(ops.reshape(g, kshape) if g.shape != kshape else g, x)]


def _mean(node: Node, g: GlobalTensor) -> Grads:
    x = node.inputs[0]
    axes, kshape = _reduced_shape(x, node)
    count = math.prod(x.shape[d] for d in axes)
    gk = ops.reshape(g, kshape) if g.shape != kshape else g
    return [expand_as(ops.div(gk, count) if count else gk, x)]


def _var(node: Node, g: GlobalTensor) -> Grads:
    """``2 (x - mean) / (count - correction)`` times the gradient, spread over the reduced
    dims."""
    x = node.inputs[0]
    axes, kshape = _reduced_shape(x, node)
    count = math.prod(x.shape[d] for d in axes)
    denominator = max(count - node.param(3, "correction", 0), 0)
    gk = ops.reshape(g, kshape) if g.shape != kshape else g
    centred = ops.sub(x, ops.mean(x, axes, keepdim=True))
    return [ops.mul(centred, ops.div(ops.mul(gk, 2.0), denominator))]


def _max_min(node: Node, g: GlobalTensor) -> Grads:
    """The gradient goes to the elements equal to the result, shared evenly among ties."""
    x = node.inputs[0]
    axes, kshape = _reduced_shape(x, node)
    out = node.out if node.out.shape == kshape else ops.reshape(node.out, kshape)
    gk = g if g.shape == kshape else ops.reshape(g, kshape)
    mask = ops.eq(x, out)
    count = ops.sum(ops.astype(mask, g.dtype), axes, keepdim=True)
    return [ops.where(mask, ops.div(gk, count), 0)]


def _softmax(node: Node, g: GlobalTensor) -> Grads:
    d = norm_dim(node.name, node.param(1, "dim", -1), node.out.ndim)
    y = node.out
    s = ops.sum(ops.mul(g, y), d, keepdim=True)
    return [ops.mul(y, ops.sub(g, s))]


def _log_softmax(node: Node, g: GlobalTensor) -> Grads:
    d = norm_dim(node.name, node.param(1, "dim", -1), node.out.ndim)
    s = ops.sum(g, d, keepdim=True)
    return [ops.sub(g, ops.mul(ops.exp(node.out), s))]


def _transpose(node: Node, g: GlobalTensor) -> Grads:
    n = g.ndim
    axes: Any = node.args[1:]
    if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
        axes = tuple(axes[0])
    perm = [int(p) % n for p in axes] if axes and axes != (None,) else list(range(n))[::-1]
    inv = [0] * n
    for j, p in enumerate(perm):
        inv[p] = j
    return [ops.transpose(g, inv)]


def _getitem(node: Node, g: GlobalTensor) -> Grads:
    x = node.inputs[0]
    return [scatter(g, x.shape, node.param(1, "key"))]


def _cat(node: Node, g: GlobalTensor) -> Grads:
    d = norm_dim("cat", node.param(1, "dim", 0), g.ndim)
    out: list[GlobalTensor | None] = []
    start = 0
    for t, need in zip(node.inputs, node.needs):
        n = t.shape[d]
        key = (slice(None),) * d + (slice(start, start + n),)
        out.append(ops.getitem(g, key) if need else None)
        start += n
    return out


def _tril_triu(op: GlobalOp) -> Rule:
    def rule(node: Node, g: GlobalTensor) -> Grads:
        """The same triangle of the gradient; none for the row and column numbers."""
        return [op(g, node.param(1, "diagonal", 0)), None, None]

    return rule


def _cross_entropy(node: Node, g: GlobalTensor) -> Grads:
    logits, labels = node.inputs
    return [cross_entropy_grad(logits, labels, g, node.param(2, "ignore_index", -100),
                               node.param(3, "scale")), None]


def _vocab_cross_entropy(node: Node, g: GlobalTensor) -> Grads:
    logits, labels = node.inputs
    return [vocab_cross_entropy_grad(logits, labels, node.kwargs, g), None]


def _embedding(node: Node, g: GlobalTensor) -> Grads:
    """The weight's gradient: ``g`` scatter-added at the ids, in the rows each rank owns."""
    ids, weight, rows = node.inputs
    return [None, embedding_backward(ids, g, rows) if node.needs[1] else None, None]


def _clip(node: Node, g: GlobalTensor) -> Grads:
    """The gradient flows to ``x`` where it is within the bounds (as torch: a tie goes to
    ``x``), else to the bound that limited it."""
    x, *bounds = node.inputs
    inside = ops.astype(ops.eq(node.out, x), g.dtype)
    out: list[GlobalTensor | None] = [unbroadcast(ops.mul(g, inside), x.shape)
                                      if node.needs[0] else None]
    for i, bound in enumerate(bounds, start=1):
        if not node.needs[i]:
            out.append(None)
            continue
        hit = ops.astype(ew.logical_and(ops.ne(node.out, x), ops.eq(node.out, bound)),
                         g.dtype)
        out.append(unbroadcast(ops.mul(g, hit), bound.shape))
    return out


def _to_global(node: Node, g: GlobalTensor) -> Grads:
    """The gradient goes back to the source placement in the SBP the call's ``grad_sbp``
    asked for, else in the conjugate SBP (same cost table)."""
    src = node.inputs[0]
    sbp = node.kwargs.get("grad_sbp")
    if sbp is None:
        sbp = tuple(conjugate_sbp(s) for s in src.sbp)
    return [g.to_global(placement=src.placement, sbp=sbp)]

#: Op name -> backward rule, attached to the registry's entries below.
_OP_RULES: dict[str, Rule] = {
    "add": _add, "sub": _sub, "mul": _mul, "div": _div, "pow": _pow,
    "maximum": _extremum(ops.gt), "minimum": _extremum(ops.lt), "where": _where,
    "atan2": _atan2, "hypot": _hypot, "logaddexp": _logaddexp, "copysign": _copysign,
    "floor_divide": _floor_divide, "remainder": _remainder,
    **{name: _unary(f) for name, f in UNARY.items()},
    "matmul": _matmul, "sum": _sum, "mean": _mean, "max": _max_min, "min": _max_min,
    "var": _var, "softmax": _softmax, "log_softmax": _log_softmax, "transpose": _transpose,
    "getitem": _getitem, "cat": _cat, "cross_entropy": _cross_entropy,
    "embedding": _embedding, "tril": _tril_triu(ops.tril), "triu": _tril_triu(ops.triu),
    "clip": _clip,
}
for _name, _rule in _OP_RULES.items():
    attach_backward(_name, _rule)
del _name, _rule, _OP_RULES

#: Backward rules of tape nodes that are not ops: the conversion ``x.to_global``, the
#: vocab-parallel cross-entropy (recorded as one node over three ops), and those another
#: package declares with :func:`register_rules` (ZeRO's gathers).
TAPE_ONLY_RULES: dict[str, Rule] = {
    "to_global": _to_global, "vocab_cross_entropy": _vocab_cross_entropy,
}


def rule_for(name: str) -> Rule | None:
    """The backward rule of a tape node named ``name``: its op's, else a tape-only one."""
    rule = backward_rule(name)
    return rule if rule is not None else TAPE_ONLY_RULES.get(name)


def register_rules(rules: dict[str, Rule]) -> None:
    """Add the backward rules of tape nodes recorded outside :mod:`sbpmpi.ops` (the steps of
    :mod:`sbpmpi.zero`) to :data:`TAPE_ONLY_RULES`: the one door through which another
    package declares rules. A name that already has another rule (a registered op's, or
    another tape node's) is refused."""
    taken = sorted(name for name, rule in rules.items()
                   if name in REGISTRY or TAPE_ONLY_RULES.get(name, rule) is not rule)
    if taken:
        raise ValueError(f"register_rules: op names {taken} already have backward rules")
    TAPE_ONLY_RULES.update(rules)
