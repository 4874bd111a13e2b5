"""Elementwise ops: binary (NumPy broadcasting, Python scalars), unary, ``where``, ``clip``.

Wildcard ``S(d)``: a split of output dim ``d`` is a split of the matching dim of each
input that has it at full size, and broadcast for an input broadcast along it (size 1,
missing, or a scalar). Partial rows hold because the op is linear (``P`` rows) or
monotone (``P(max)``/``P(min)`` rows) in that operand.

Every op is one row of one table, :data:`POINTWISE`: its kernel, the family of
:data:`LINEARITY` that gives its signature table (linearity or monotonicity in each
argument, jointly or alone: what a partial input allows, like PyTorch's pointwise
strategy with its linearity lists), the NumPy ufunc or function it answers to, its name
in the array API standard, its Python operator, and whether it has a gradient. The op
registry (:mod:`.registry`) makes every door of an op from that row.

Kernels are NumPy's (CuPy's) ufuncs on the local shards; where the array API standard
fixes a special case NumPy computes otherwise (``+-inf // finite``, complex ``expm1`` and
``tanh`` at infinities, complex ``expm1`` of ``-0 + 0j``), the kernel gives the standard's
value, whichever door the op is called by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ..backend.special import erf as _erf_of
from ..core.sbp import PARTIALS
from ..tensor import GlobalTensor
from .call import OpCall, as_dtype, operand, probe_dtype, shape_of, tensor_arg
from .kernel import with_into, zero_d
from .op import GlobalOp
from .signature import S_D, B, DimMatch, Signature

__all__ = [
    "ADD", "SUB", "MUL", "DIV", "POW", "MAXIMUM", "MINIMUM", "COMPARE", "WHERE",
    "NEG", "MONOTONE", "UNARY", "CLIP", "Pointwise", "LINEARITY", "TABLES", "Elementwise",
    "POINTWISE", "POINTWISE_OPS", "broadcast_matches", "clip",
]

# ---- signature tables (one mesh axis), generated from one rule per family ------------------
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


#: The linearity families: family name -> what its ops allow of partial inputs. A
#: monotone op must also map the reductions' identities (+-inf) to values, not NaN
#: (``log(-inf)`` is NaN, so ``log`` has no partial rows).
LINEARITY: dict[str, Pointwise] = {
    "add": Pointwise(2, (0, 1), ("sum",), (UP, UP), float_order=True),
    "sub": Pointwise(2, (0, 1), ("sum",), (UP, DOWN), float_order=True),  # b - max = min
    "mul": Pointwise(2, alone=(LINEAR, LINEAR)),
    "div": Pointwise(2, alone=(LINEAR, ())),
    "pow": Pointwise(2),
    "maximum": Pointwise(2, (0, 1), ("max",), ((("max", "max"),),) * 2),
    "minimum": Pointwise(2, (0, 1), ("min",), ((("min", "min"),),) * 2),
    "compare": Pointwise(2),  # eq ne lt le gt ge
    "binary": Pointwise(2),   # floor_divide, remainder, bitwise, atan2, ...: no partial rows
    "increasing": Pointwise(2, alone=(UP, UP), float_order=True),  # logaddexp
    "where": Pointwise(3, (1, 2), ("sum", "max", "min")),  # where(cond, x, y): selecting
    "neg": Pointwise(1, alone=(LINEAR + DOWN,), float_order=True),
    "identity": Pointwise(1, alone=(LINEAR + UP,)),  # positive
    "linear": Pointwise(1, alone=(LINEAR,)),  # real, imag, conj
    "monotone": Pointwise(1, alone=(UP,)),  # exp tanh sigmoid relu erf floor sign ...
    "unary": Pointwise(1),  # abs sqrt log sin ...: no partial rows
}

TABLES = {name: rule.table() for name, rule in LINEARITY.items()}
ADD, SUB, MUL, DIV = TABLES["add"], TABLES["sub"], TABLES["mul"], TABLES["div"]
POW, MAXIMUM, MINIMUM = TABLES["pow"], TABLES["maximum"], TABLES["minimum"]
COMPARE, WHERE, NEG = TABLES["compare"], TABLES["where"], TABLES["neg"]
MONOTONE, UNARY = TABLES["monotone"], TABLES["unary"]
#: clip(x, min, max): x, a lower and an upper bound, no partial rows (the general case:
#: a call with fewer bounds uses the table of its arity).
CLIP = Pointwise(3).table()


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


def _broadcast_shape(name: str, labels: Sequence[str],
                     shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(
            f"{name}: operand shapes "
            + ", ".join(f"{lab} {s}" for lab, s in zip(labels, shapes))
            + " cannot be broadcast together") from None


def _nary(name: str, table: tuple[Signature, ...], f: Callable[..., Any],
          labels: tuple[str, ...], doc: str, into: Callable[..., None] | None = None
          ) -> GlobalOp:
    """``into(xp, *operands, out)``: ``f`` written into ``out`` (None: ``f`` has no such
    form)."""

    def build(*args: Any) -> OpCall:
        if len(args) != len(labels):
            raise TypeError(f"{name}() takes {len(labels)} operands ({', '.join(labels)}), "
                            f"got {len(args)}")
        ops = tuple(operand(name, a, lab) for a, lab in zip(args, labels))
        if not any(isinstance(o, GlobalTensor) for o in ops):
            raise TypeError(f"{name}: at least one operand must be a GlobalTensor")
        shapes = [shape_of(o) for o in ops]
        out_shape = _broadcast_shape(name, labels, shapes)
        dtype = probe_dtype(name, lambda *z: f(np, *z), *ops)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
            return f(xp, *local)

        if into is not None:
            def kernel_into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...],
                            out: Any) -> None:
                into(xp, *local, out=out)

            with_into(kernel, kernel_into)
        return OpCall(name, ops, table, {"d": broadcast_matches(shapes, out_shape)},
                      out_shape, dtype, kernel, labels=labels)

    build.__doc__ = f"Build the OpCall of ``{name}``."
    return GlobalOp(name, build, table, doc=f"{doc} of global tensors and scalars, with "
                    f"NumPy broadcasting (signatures: ``{name}.table``).")


def _unary(name: str, table: tuple[Signature, ...], f: Callable[[ModuleType, Any], Any],
           doc: str, cast: bool = False, into: Callable[..., None] | None = None
           ) -> GlobalOp:
    """``cast``: integer/bool inputs are cast to the result dtype before ``f``; ``into``:
    ``into(xp, x, out)`` writes ``f`` into ``out`` (None: ``f`` has no such form)."""

    def build(x: Any) -> OpCall:
        x = tensor_arg(name, x)
        dtype = probe_dtype(name, lambda z: f(np, z), x)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
            a = local[0]
            if cast and a.dtype != dtype:
                a = as_dtype(a, dtype)  # float32 for a half dtype: widened, kept so
            return f(xp, a)

        if into is not None:
            def kernel_into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...],
                            out: Any) -> None:
                a = local[0]
                if cast and a.dtype != dtype:
                    a = as_dtype(a, dtype)
                into(xp, a, out=out)

            with_into(kernel, kernel_into)
        n = x.ndim
        return OpCall(name, (x,), table, {"d": tuple(DimMatch((d,), d) for d in range(n))},
                      x.shape, dtype, kernel, labels=("x",))

    build.__doc__ = f"Build the OpCall of ``{name}``."
    return GlobalOp(name, build, table, doc=f"{doc} of a global tensor "
                    f"(signatures: ``{name}.table``).")


# ---- kernels that are not one array-module function -------------------------------------------

def _sigmoid(xp: ModuleType, x: Any) -> Any:
    if x.dtype.kind not in "fc":
        x = x.astype(xp.exp(xp.zeros((), dtype=x.dtype)).dtype)
    return xp.exp(-xp.logaddexp(0, -x))  # 1 / (1 + exp(-x)) without overflow


def _relu(xp: ModuleType, x: Any) -> Any:
    return xp.maximum(x, 0)


def _relu_into(xp: ModuleType, x: Any, out: Any) -> None:
    xp.maximum(x, zero_d(xp, 0, x.dtype), out=out)


def _where_into(xp: ModuleType, cond: Any, x: Any, y: Any, out: Any) -> None:
    """``where(cond, x, y)`` written into ``out`` (``xp.where`` takes no ``out``): the
    same selection, each value cast to ``out``'s dtype as ``where`` casts it."""
    xp.copyto(out, y, casting="unsafe")
    xp.copyto(out, x, casting="unsafe", where=cond)




def _erf(xp: ModuleType, x: Any) -> Any:
    if x.dtype.kind == "c":
        raise TypeError("erf of complex values is not supported")
    if x.dtype.kind != "f":
        x = x.astype(xp.exp(xp.zeros((), dtype=x.dtype)).dtype)
    return _erf_of(x)


def _complex_cases(xp: ModuleType, a: Any, out: Any,
                   cases: tuple[tuple[Callable[[Any, Any], Any], complex], ...]) -> Any:
    """``out`` with the standard's values where ``case(real, imag)`` holds (first match)."""
    re, im = a.real, a.imag
    for case, value in reversed(cases):
        out = xp.where(case(re, im), xp.asarray(value, dtype=out.dtype), out)
    return out


def _pos_zero(v: Any) -> Any:
    return (v == 0) & ~np.signbit(v)


def _expm1(xp: ModuleType, a: Any) -> Any:
    """NumPy's expm1, with the standard's complex special cases (NumPy's complex kernel
    gives other values for infinite and NaN parts, and ``-0 + 0j`` for ``-0 + 0j``,
    where the standard gives ``+0 + 0j`` for either zero: ``+-0 + 0j`` and, by its
    conjugate symmetry, ``+-0 - 0j`` give a real part of ``+0``, the imaginary part
    keeping the sign of the operand's)."""
    out = xp.expm1(a)
    if a.dtype.kind != "c":
        return out
    zero = xp.empty_like(out)
    zero.real = 0.0
    zero.imag = a.imag  # a signed zero where it is used
    out = xp.where((a.real == 0) & (a.imag == 0), zero, out)
    inf, nan = np.inf, np.nan
    return _complex_cases(xp, a, out, (
        (lambda r, i: (r == inf) & _pos_zero(i), complex(inf, 0.0)),
        (lambda r, i: (r == -inf) & (i == inf), complex(-1.0, 0.0)),
        (lambda r, i: (r == inf) & (i == inf), complex(inf, nan)),
        (lambda r, i: (r == -inf) & xp.isnan(i), complex(-1.0, 0.0)),
        (lambda r, i: (r == inf) & xp.isnan(i), complex(inf, nan)),
        (lambda r, i: xp.isnan(r) & _pos_zero(i), complex(nan, 0.0)),
    ))


def _tanh(xp: ModuleType, a: Any) -> Any:
    """NumPy's tanh; for complex ``+-inf + bj`` with finite ``b``: ``+-1`` with a zero
    imaginary part of the sign of ``b`` (the standard's case; NumPy's complex kernel may
    give NaN, depending on its code path)."""
    out = xp.tanh(a)
    if a.dtype.kind != "c":
        return out
    fix = xp.isinf(a.real) & xp.isfinite(a.imag)
    value = xp.empty_like(out)
    value.real = xp.sign(a.real)
    value.imag = xp.where(xp.signbit(a.imag), -0.0, 0.0)
    return xp.where(fix, value, out)


def _floor_divide(xp: ModuleType, a: Any, b: Any) -> Any:
    """NumPy's floor_divide with the standard's special cases for infinite operands:
    ``+-inf // finite`` is an infinity and ``finite // +-inf`` a zero of the quotient's
    sign (NumPy gives NaN, or -1 for a negative quotient)."""
    q = xp.floor_divide(a, b)
    if q.dtype.kind != "f":
        return q
    exact = (xp.isinf(a) & xp.isfinite(b) & (b != 0)) | (xp.isfinite(a) & xp.isinf(b))
    return xp.where(exact, a / b, q)


def _rounding(fn: str) -> Callable[[ModuleType, Any], Any]:
    """``fn`` of floats; integers unchanged, in their dtype (the standard's rule, and
    NumPy's); bools as NumPy rounds them."""
    def kernel(xp: ModuleType, a: Any) -> Any:
        return a.copy() if a.dtype.kind in "iu" else getattr(xp, fn)(a)

    return kernel


def _part(fn: str) -> Callable[[ModuleType, Any], Any]:
    """``real``/``imag`` in a new array (NumPy's may be a view of the operand)."""
    def kernel(xp: ModuleType, a: Any) -> Any:
        return xp.array(getattr(xp, fn)(a), copy=True)

    return kernel


class Elementwise(NamedTuple):
    """One pointwise op of :data:`POINTWISE`.

    ``kernel``: the array-module function's name, or ``f(xp, *local operands)``;
    ``family``: its rule in :data:`LINEARITY`; ``numpy``: the NumPy ufunc (NEP 13) or
    function (NEP 18) it answers to; ``array_api``: its name in the standard;
    ``operator``: its Python operator symbol (``"abs"`` for ``abs(x)``); ``grad``:
    whether it has a backward rule (ops of bool and integer results have none);
    ``cast``: integer/bool inputs are cast to the result dtype before the kernel.
    """

    kernel: str | Callable[..., Any]
    family: str
    numpy: str | None = None
    array_api: str | None = None
    operator: str | None = None
    grad: bool = True
    cast: bool = False


E = Elementwise
#: Every pointwise op. Short names (add, sub, ...) are sbpmpi's; the others are the
#: standard's, which NumPy and the array API share.
POINTWISE: dict[str, Elementwise] = {
    # name                   kernel                family       NumPy          array API       operator
    "add": E("add", "add", "add", "add", "+"),
    "sub": E("subtract", "sub", "subtract", "subtract", "-"),
    "mul": E("multiply", "mul", "multiply", "multiply", "*"),
    "div": E("true_divide", "div", "divide", "divide", "/"),
    "pow": E("power", "pow", "power", "pow", "**"),
    "floor_divide": E(_floor_divide, "binary", "floor_divide", "floor_divide", "//"),
    "remainder": E("remainder", "binary", "remainder", "remainder", "%"),
    "maximum": E("maximum", "maximum", "maximum", "maximum"),
    "minimum": E("minimum", "minimum", "minimum", "minimum"),
    "eq": E("equal", "compare", "equal", "equal", "==", grad=False),
    "ne": E("not_equal", "compare", "not_equal", "not_equal", "!=", grad=False),
    "lt": E("less", "compare", "less", "less", "<", grad=False),
    "le": E("less_equal", "compare", "less_equal", "less_equal", "<=", grad=False),
    "gt": E("greater", "compare", "greater", "greater", ">", grad=False),
    "ge": E("greater_equal", "compare", "greater_equal", "greater_equal", ">=", grad=False),
    "bitwise_and": E("bitwise_and", "binary", "bitwise_and", "bitwise_and", "&", grad=False),
    "bitwise_or": E("bitwise_or", "binary", "bitwise_or", "bitwise_or", "|", grad=False),
    "bitwise_xor": E("bitwise_xor", "binary", "bitwise_xor", "bitwise_xor", "^", grad=False),
    "bitwise_left_shift": E("left_shift", "binary", "left_shift", "bitwise_left_shift", "<<",
                            grad=False),
    "bitwise_right_shift": E("right_shift", "binary", "right_shift", "bitwise_right_shift",
                             ">>", grad=False),
    "logical_and": E("logical_and", "binary", "logical_and", "logical_and", grad=False),
    "logical_or": E("logical_or", "binary", "logical_or", "logical_or", grad=False),
    "logical_xor": E("logical_xor", "binary", "logical_xor", "logical_xor", grad=False),
    "atan2": E("arctan2", "binary", "arctan2", "atan2"),
    "copysign": E("copysign", "binary", "copysign", "copysign"),
    "hypot": E("hypot", "binary", "hypot", "hypot"),
    "logaddexp": E("logaddexp", "increasing", "logaddexp", "logaddexp"),
    "nextafter": E("nextafter", "binary", "nextafter", "nextafter", grad=False),
    "where": E("where", "where", "where", "where"),
    "neg": E("negative", "neg", "negative", "negative", "-"),
    "positive": E("positive", "identity", "positive", "positive", "+"),
    "abs": E("absolute", "unary", "absolute", "abs", "abs"),
    "bitwise_invert": E("invert", "unary", "invert", "bitwise_invert", "~", grad=False),
    "logical_not": E("logical_not", "unary", "logical_not", "logical_not", grad=False),
    "exp": E("exp", "monotone", "exp", "exp"),
    "expm1": E(_expm1, "monotone", "expm1", "expm1"),
    "log": E("log", "unary", "log", "log"),
    "log1p": E("log1p", "unary", "log1p", "log1p"),
    "log2": E("log2", "unary", "log2", "log2"),
    "log10": E("log10", "unary", "log10", "log10"),
    "sqrt": E("sqrt", "unary", "sqrt", "sqrt"),
    "square": E("square", "unary", "square", "square"),
    "reciprocal": E("reciprocal", "unary", "reciprocal", "reciprocal"),
    "sin": E("sin", "unary", "sin", "sin"),
    "cos": E("cos", "unary", "cos", "cos"),
    "tan": E("tan", "unary", "tan", "tan"),
    "asin": E("arcsin", "unary", "arcsin", "asin"),
    "acos": E("arccos", "unary", "arccos", "acos"),
    "atan": E("arctan", "monotone", "arctan", "atan"),
    "sinh": E("sinh", "monotone", "sinh", "sinh"),
    "cosh": E("cosh", "unary", "cosh", "cosh"),
    "tanh": E(_tanh, "monotone", "tanh", "tanh"),
    "asinh": E("arcsinh", "monotone", "arcsinh", "asinh"),
    "acosh": E("arccosh", "unary", "arccosh", "acosh"),
    "atanh": E("arctanh", "unary", "arctanh", "atanh"),
    "sign": E("sign", "monotone", "sign", "sign"),
    "signbit": E("signbit", "unary", "signbit", "signbit", grad=False),
    "isfinite": E("isfinite", "unary", "isfinite", "isfinite", grad=False),
    "isinf": E("isinf", "unary", "isinf", "isinf", grad=False),
    "isnan": E("isnan", "unary", "isnan", "isnan", grad=False),
    "ceil": E(_rounding("ceil"), "monotone", "ceil", "ceil"),
    "floor": E(_rounding("floor"), "monotone", "floor", "floor"),
    "trunc": E(_rounding("trunc"), "monotone", "trunc", "trunc"),
    "round": E(_rounding("round"), "monotone", "round", "round"),
    "conj": E("conjugate", "linear", "conjugate", "conj"),
    "real": E(_part("real"), "linear", "real", "real"),
    "imag": E(_part("imag"), "linear", "imag", "imag"),
    "relu": E(_relu, "monotone"),
    "sigmoid": E(_sigmoid, "monotone", cast=True),
    "erf": E(_erf, "monotone", cast=True),
}
del E
_LABELS = {2: ("a", "b"), 3: ("cond", "x", "y")}
#: The forms writing into a given array of the kernels that are not one ufunc.
_INTO: dict[Callable[..., Any], Callable[..., None]] = {_relu: _relu_into}


def _pointwise(name: str) -> GlobalOp:
    row = POINTWISE[name]
    fn = row.kernel
    into: Callable[..., None] | None = _INTO.get(fn) if callable(fn) else None
    if isinstance(fn, str):
        fname = fn

        def f(xp: ModuleType, *args: Any) -> Any:
            return getattr(xp, fname)(*args)

        if isinstance(getattr(np, fname, None), np.ufunc):
            def into(xp: ModuleType, *args: Any, out: Any) -> None:
                getattr(xp, fname)(*args, out=out)
        elif fname == "where":
            into = _where_into
    else:
        f = fn
    doc = f"Elementwise ``{name}``"
    arity = LINEARITY[row.family].arity
    if arity == 1:
        return _unary(name, TABLES[row.family], f, doc, cast=row.cast, into=into)
    return _nary(name, TABLES[row.family], f, _LABELS[arity], doc, into=into)


#: Every pointwise op by name (the GlobalOps of :data:`POINTWISE`).
POINTWISE_OPS: dict[str, GlobalOp] = {name: _pointwise(name) for name in POINTWISE}

# One module-level name per op, for ``sm.ops.<name>`` and static checkers.
(add, sub, mul, div, pow, floor_divide, remainder, maximum, minimum,  # noqa: A001
 eq, ne, lt, le, gt, ge, bitwise_and, bitwise_or, bitwise_xor, bitwise_left_shift,
 bitwise_right_shift, logical_and, logical_or, logical_xor, atan2, copysign, hypot, logaddexp,
 nextafter, where, neg, positive, abs, bitwise_invert, logical_not, exp, expm1, log, log1p,
 log2, log10, sqrt, square, reciprocal, sin, cos, tan, asin, acos, atan, sinh, cosh, tanh,
 asinh, acosh, atanh, sign, signbit, isfinite, isinf, isnan, ceil, floor, trunc, round,
 conj, real, imag, relu, sigmoid, erf) = POINTWISE_OPS.values()


# ---- clip: x limited to [min, max] -------------------------------------------------------------

def _clip_kernel(lo: bool, hi: bool) -> Callable[..., Any]:
    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, *b = local
        out = a
        if lo:
            m = b[0]
            out = xp.where(xp.isnan(m) if m.dtype.kind in "fc" else False, m,
                           xp.maximum(out, m))
        if hi:
            m = b[-1]
            out = xp.where(xp.isnan(m) if m.dtype.kind in "fc" else False, m,
                           xp.minimum(out, m))
        return xp.array(out, copy=True)

    return kernel


def _clip(x: Any, min: Any = None, max: Any = None) -> OpCall:  # noqa: A002
    """Build the OpCall of ``clip``."""
    x = tensor_arg("clip", x)
    bounds = []
    for what, b in (("min", min), ("max", max)):
        if b is None:
            continue
        if not isinstance(b, GlobalTensor):
            b = operand("clip", b, what)
            b = np.asarray(b).astype(x.dtype)[()]  # a scalar bound takes x's dtype
        bounds.append((what, b))
    labels = ("x", *(w for w, _ in bounds))
    ops = (x, *(b for _, b in bounds))
    shapes = [shape_of(o) for o in ops]
    out_shape = _broadcast_shape("clip", labels, shapes)
    table = Pointwise(len(ops)).table()
    return OpCall("clip", ops, table, {"d": broadcast_matches(shapes, out_shape)}, out_shape,
                  x.dtype, _clip_kernel(min is not None, max is not None), labels=labels)


clip = GlobalOp("clip", _clip, CLIP, doc=(
    "``clip(x, min=None, max=None)``: ``x`` limited to ``[min, max]`` (either may be None, "
    "a scalar or a global tensor; a NaN bound gives NaN), in the dtype of ``x`` "
    "(signatures: ``clip.table``, of the call's arity)."))
