"""Elementwise ops: binary (NumPy broadcasting, Python scalars), unary, ``where``.

Wildcard ``S(d)``: a split of output dim ``d`` is a split of the matching dim of each
input that has it at full size, and broadcast for an input broadcast along it (size 1,
missing, or a scalar). Partial rows hold because the op is linear (``P`` rows) or
monotone (``P(max)``/``P(min)`` rows) in that operand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..tensor import GlobalTensor
from .call import OpCall, operand, probe_dtype, tensor_arg
from .inference import GlobalOp
from .signature import PMAX, PMIN, S_D, B, DimMatch, P, Signature

__all__ = [
    "ADD", "SUB", "MUL", "DIV", "POW", "MAXIMUM", "MINIMUM", "COMPARE", "WHERE",
    "NEG", "MONOTONE", "UNARY",
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "where", "neg", "abs", "exp", "log", "sqrt", "tanh", "relu", "sigmoid",
    "broadcast_matches",
]

# ---- signature tables (one mesh axis) ------------------------------------------------------
ADD = (
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
    Signature((P, P), P),                       # (a1 + a2) + (b1 + b2)
    Signature((PMAX, B), PMAX, when="float"),   # max(a_i) + b = max(a_i + b)
    Signature((B, PMAX), PMAX, when="float"),
    Signature((PMIN, B), PMIN, when="float"),
    Signature((B, PMIN), PMIN, when="float"),
)
SUB = (
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
    Signature((P, P), P),
    Signature((PMAX, B), PMAX, when="float"),
    Signature((B, PMAX), PMIN, when="float"),   # b - max(a_i) = min(b - a_i)
    Signature((PMIN, B), PMIN, when="float"),
    Signature((B, PMIN), PMAX, when="float"),
)
MUL = (
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
    Signature((P, B), P),                       # (a1 + a2) * b
    Signature((B, P), P),
)
DIV = (
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
    Signature((P, B), P),                       # (a1 + a2) / b
)
POW = (
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
)
MAXIMUM = (
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
    Signature((PMAX, PMAX), PMAX),
    Signature((PMAX, B), PMAX),
    Signature((B, PMAX), PMAX),
)
MINIMUM = (
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
    Signature((PMIN, PMIN), PMIN),
    Signature((PMIN, B), PMIN),
    Signature((B, PMIN), PMIN),
)
COMPARE = (  # eq ne lt le gt ge
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
)
WHERE = (  # where(cond, x, y)
    Signature((S_D, S_D, S_D), S_D),
    Signature((B, B, B), B),
    Signature((B, P, P), P),                    # selecting is linear in x and y together
    Signature((B, PMAX, PMAX), PMAX),
    Signature((B, PMIN, PMIN), PMIN),
)
NEG = (
    Signature((S_D,), S_D),
    Signature((B,), B),
    Signature((P,), P),
    Signature((PMAX,), PMIN, when="float"),     # -max(a_i) = min(-a_i)
    Signature((PMIN,), PMAX, when="float"),
)
MONOTONE = (  # exp tanh sigmoid relu: f(max(a_i)) = max(f(a_i))
    Signature((S_D,), S_D),
    Signature((B,), B),
    Signature((PMAX,), PMAX),
    Signature((PMIN,), PMIN),
)
UNARY = (  # abs sqrt log
    Signature((S_D,), S_D),
    Signature((B,), B),
)


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


def _binary(name: str, table: tuple[Signature, ...], f: Callable[..., Any]) -> GlobalOp:
    return _nary(name, table, f, ("a", "b"))


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


add = _binary("add", ADD, lambda xp, a, b: xp.add(a, b))
sub = _binary("sub", SUB, lambda xp, a, b: xp.subtract(a, b))
mul = _binary("mul", MUL, lambda xp, a, b: xp.multiply(a, b))
div = _binary("div", DIV, lambda xp, a, b: xp.true_divide(a, b))
pow = _binary("pow", POW, lambda xp, a, b: xp.power(a, b))  # noqa: A001
maximum = _binary("maximum", MAXIMUM, lambda xp, a, b: xp.maximum(a, b))
minimum = _binary("minimum", MINIMUM, lambda xp, a, b: xp.minimum(a, b))
eq = _binary("eq", COMPARE, lambda xp, a, b: xp.equal(a, b))
ne = _binary("ne", COMPARE, lambda xp, a, b: xp.not_equal(a, b))
lt = _binary("lt", COMPARE, lambda xp, a, b: xp.less(a, b))
le = _binary("le", COMPARE, lambda xp, a, b: xp.less_equal(a, b))
gt = _binary("gt", COMPARE, lambda xp, a, b: xp.greater(a, b))
ge = _binary("ge", COMPARE, lambda xp, a, b: xp.greater_equal(a, b))
where = _nary("where", WHERE, lambda xp, c, x, y: xp.where(c, x, y), ("cond", "x", "y"))

neg = _unary("neg", NEG, lambda xp, x: xp.negative(x))
abs = _unary("abs", UNARY, lambda xp, x: xp.abs(x))  # noqa: A001
exp = _unary("exp", MONOTONE, lambda xp, x: xp.exp(x))
log = _unary("log", UNARY, lambda xp, x: xp.log(x))
sqrt = _unary("sqrt", UNARY, lambda xp, x: xp.sqrt(x))
tanh = _unary("tanh", MONOTONE, lambda xp, x: xp.tanh(x))
relu = _unary("relu", MONOTONE, lambda xp, x: xp.maximum(x, 0))
sigmoid = _unary("sigmoid", MONOTONE, _sigmoid, float_args=True)
