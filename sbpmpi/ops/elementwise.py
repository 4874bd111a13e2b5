"""Elementwise ops: binary (NumPy broadcasting, Python scalars), unary, ``where``.

Wildcard ``S(d)``: a split of output dim ``d`` is a split of the matching dim of each
input that has it at full size, and broadcast for an input broadcast along it (size 1,
missing, or a scalar). Partial rows hold because the op is linear (``P`` rows) or
monotone (``P(max)``/``P(min)`` rows) in that operand.

Every op comes from one table, :data:`POINTWISE` (its array function and its rule), and
its signature table from that rule in :data:`RULES` (linearity or monotonicity in each
argument, jointly or alone: what a partial input allows), like PyTorch's pointwise
strategy with its linearity table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..backend.special import erf as _erf_of
from ..core.sbp import PARTIALS
from ..tensor import GlobalTensor
from .call import OpCall, operand, probe_dtype, tensor_arg
from .op import GlobalOp
from .signature import S_D, B, DimMatch, Signature

__all__ = [
    "ADD", "SUB", "MUL", "DIV", "POW", "MAXIMUM", "MINIMUM", "COMPARE", "WHERE",
    "NEG", "MONOTONE", "UNARY", "Pointwise", "RULES", "TABLES", "POINTWISE",
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "where", "neg", "abs", "exp", "log", "sqrt", "tanh", "relu", "sigmoid", "erf",
    "broadcast_matches",
]

# ---- signature tables (one mesh axis), generated from one rule per op ----------------------
#: ``alone`` entries: partial kind of the one partial argument -> partial kind of the output.
LINEAR = (("sum", "sum"),)                    # f(a1 + a2, b) = f(a1, b) + f(a2, b)
UP = (("max", "max"), ("min", "min"))         # increasing: f(max(a_i)) = max(f(a_i))
DOWN = (("max", "min"), ("min", "max"))       # decreasing: f(max(a_i)) = min(f(a_i))


@dataclass(frozen=True)
class Pointwise:
    """What a pointwise op allows of partial inputs on one mesh axis.

    ``joint``/``joint_kinds``: the op commutes with a reduction of these kinds applied to
    the ``joint`` arguments together (all partial of that kind, the others broadcast),
    e.g. ``(a1 + a2) + (b1 + b2)``. ``alone[i]``: the kinds a partial argument ``i`` may
    have while the others are broadcast, and the output's kind (linearity or
    monotonicity in that argument). ``float_order``: those max/min rows are exact only
    with floating dtypes (the reduction identities are infinities, e.g.
    ``max(a_i) + b = max(a_i + b)`` needs ``-inf + b = -inf``).
    """

    arity: int
    joint: tuple[int, ...] = ()
    joint_kinds: tuple[str, ...] = ()
    alone: tuple[tuple[tuple[str, str], ...], ...] = ()
    float_order: bool = False

    def table(self) -> tuple[Signature, ...]:
        """The signature table: split and broadcast rows, joint rows (by ``joint_kinds``),
        then single-partial rows by kind (sum, max, min), each by argument."""
        n = self.arity
        rows = [Signature((S_D,) * n, S_D), Signature((B,) * n, B)]
        for kind in self.joint_kinds:
            p = PARTIALS[kind]
            rows.append(Signature(tuple(p if i in self.joint else B for i in range(n)), p))
        for kind in PARTIALS:
            when = "float" if self.float_order and kind != "sum" else ""
            for i, allowed in enumerate(self.alone):
                out = dict(allowed).get(kind)
                if out is not None:
                    ins = tuple(PARTIALS[kind] if j == i else B for j in range(n))
                    rows.append(Signature(ins, PARTIALS[out], when=when))
        return tuple(rows)


#: One rule per family of pointwise ops.
RULES: dict[str, Pointwise] = {
    "add": Pointwise(2, (0, 1), ("sum",), (UP, UP), float_order=True),
    "sub": Pointwise(2, (0, 1), ("sum",), (UP, DOWN), float_order=True),  # b - max = min
    "mul": Pointwise(2, alone=(LINEAR, LINEAR)),
    "div": Pointwise(2, alone=(LINEAR, ())),
    "pow": Pointwise(2),
    "maximum": Pointwise(2, (0, 1), ("max",), ((("max", "max"),),) * 2),
    "minimum": Pointwise(2, (0, 1), ("min",), ((("min", "min"),),) * 2),
    "compare": Pointwise(2),  # eq ne lt le gt ge
    "where": Pointwise(3, (1, 2), ("sum", "max", "min")),  # where(cond, x, y): selecting
    "neg": Pointwise(1, alone=(LINEAR + DOWN,), float_order=True),
    "monotone": Pointwise(1, alone=(UP,)),  # exp tanh sigmoid relu erf
    "unary": Pointwise(1),  # abs sqrt log
}

TABLES = {name: rule.table() for name, rule in RULES.items()}
ADD, SUB, MUL, DIV = TABLES["add"], TABLES["sub"], TABLES["mul"], TABLES["div"]
POW, MAXIMUM, MINIMUM = TABLES["pow"], TABLES["maximum"], TABLES["minimum"]
COMPARE, WHERE, NEG = TABLES["compare"], TABLES["where"], TABLES["neg"]
MONOTONE, UNARY = TABLES["monotone"], TABLES["unary"]


def broadcast_matches(shapes: Sequence[tuple[int, ...]],
                      out_shape: tuple[int, ...]) -> tuple[DimMatch, ...]:
    """Per output dim, the matching dim of each input (None where it is broadcast)."""
    n = len(out_shape)
    out = []
    for d in range(n):
        ins: list[int | None] = []
        for shp in shapes:
            j = d - (n - len(shp))
            ins.append(j if j >= 0 and shp[j] == out_shape[d] else None)
        out.append(DimMatch(tuple(ins), d))
    return tuple(out)


def _shape(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, GlobalTensor) else ()


def _nary(name: str, table: tuple[Signature, ...], f: Callable[..., Any],
          labels: tuple[str, ...]) -> GlobalOp:
    def build(*args: Any) -> OpCall:
        if len(args) != len(labels):
            raise TypeError(f"{name}() takes {len(labels)} operands ({', '.join(labels)}), "
                            f"got {len(args)}")
        ops = tuple(operand(name, a, lab) for a, lab in zip(args, labels))
        if not any(isinstance(o, GlobalTensor) for o in ops):
            raise TypeError(f"{name}: at least one operand must be a GlobalTensor")
        shapes = [_shape(o) for o in ops]
        try:
            out_shape = tuple(int(n) for n in np.broadcast_shapes(*shapes))
        except ValueError:
            raise ValueError(
                f"{name}: operand shapes "
                + ", ".join(f"{lab} {s}" for lab, s in zip(labels, shapes))
                + " cannot be broadcast together") from None
        dtype = probe_dtype(name, lambda *z: f(np, *z), *ops)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
            return f(xp, *local)

        return OpCall(name, ops, table, {"d": broadcast_matches(shapes, out_shape)},
                      out_shape, dtype, kernel, labels=labels)

    build.__doc__ = f"Build the OpCall of ``{name}``."
    return GlobalOp(name, build, table, doc=f"Elementwise ``{name}`` of global tensors "
                    f"and scalars, with NumPy broadcasting (signatures: ``{name}.table``).")


def _unary(name: str, table: tuple[Signature, ...], f: Callable[[ModuleType, Any], Any],
           float_args: bool = False) -> GlobalOp:
    """``float_args``: integer/bool inputs are cast to the result dtype before ``f``."""

    def build(x: Any) -> OpCall:
        x = tensor_arg(name, x)
        dtype = probe_dtype(name, lambda z: f(np, z), x)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
            a = local[0]
            if float_args and a.dtype != dtype:
                a = a.astype(dtype)
            return f(xp, a)

        n = x.ndim
        return OpCall(name, (x,), table, {"d": tuple(DimMatch((d,), d) for d in range(n))},
                      x.shape, dtype, kernel, labels=("x",))

    build.__doc__ = f"Build the OpCall of ``{name}``."
    return GlobalOp(name, build, table, doc=f"Elementwise ``{name}`` of a global tensor "
                    f"(signatures: ``{name}.table``).")


def _sigmoid(xp: ModuleType, x: Any) -> Any:
    if x.dtype.kind not in "fc":
        x = x.astype(xp.exp(xp.zeros((), dtype=x.dtype)).dtype)
    return xp.exp(-xp.logaddexp(0, -x))  # 1 / (1 + exp(-x)) without overflow


def _relu(xp: ModuleType, x: Any) -> Any:
    return xp.maximum(x, 0)


def _erf(xp: ModuleType, x: Any) -> Any:
    if x.dtype.kind == "c":
        raise TypeError("erf of complex values is not supported")
    if x.dtype.kind != "f":
        x = x.astype(xp.exp(xp.zeros((), dtype=x.dtype)).dtype)
    return _erf_of(x)


#: Every pointwise op: name -> (array-module function name, or a kernel ``f(xp, *args)``;
#: the rule of :data:`RULES` that gives its signature table).
POINTWISE: dict[str, tuple[str | Callable[..., Any], str]] = {
    "add": ("add", "add"),
    "sub": ("subtract", "sub"),
    "mul": ("multiply", "mul"),
    "div": ("true_divide", "div"),
    "pow": ("power", "pow"),
    "maximum": ("maximum", "maximum"),
    "minimum": ("minimum", "minimum"),
    "eq": ("equal", "compare"),
    "ne": ("not_equal", "compare"),
    "lt": ("less", "compare"),
    "le": ("less_equal", "compare"),
    "gt": ("greater", "compare"),
    "ge": ("greater_equal", "compare"),
    "where": ("where", "where"),
    "neg": ("negative", "neg"),
    "abs": ("abs", "unary"),
    "exp": ("exp", "monotone"),
    "log": ("log", "unary"),
    "sqrt": ("sqrt", "unary"),
    "tanh": ("tanh", "monotone"),
    "relu": (_relu, "monotone"),
    "sigmoid": (_sigmoid, "monotone"),
    "erf": (_erf, "monotone"),
}
_FLOAT_ARGS = ("sigmoid", "erf")  # integer/bool inputs are cast to the result dtype first
_LABELS = {2: ("a", "b"), 3: ("cond", "x", "y")}


def _pointwise(name: str) -> GlobalOp:
    fn, rule = POINTWISE[name]
    if isinstance(fn, str):
        fname = fn

        def f(xp: ModuleType, *args: Any) -> Any:
            return getattr(xp, fname)(*args)
    else:
        f = fn
    arity = RULES[rule].arity
    if arity == 1:
        return _unary(name, TABLES[rule], f, float_args=name in _FLOAT_ARGS)
    return _nary(name, TABLES[rule], f, _LABELS[arity])


add, sub, mul, div, pow, maximum, minimum = map(  # noqa: A001
    _pointwise, ("add", "sub", "mul", "div", "pow", "maximum", "minimum"))
eq, ne, lt, le, gt, ge, where = map(_pointwise, ("eq", "ne", "lt", "le", "gt", "ge", "where"))
neg, abs, exp, log, sqrt, tanh, relu, sigmoid, erf = map(  # noqa: A001
    _pointwise, ("neg", "abs", "exp", "log", "sqrt", "tanh", "relu", "sigmoid", "erf"))
