"""Elementwise functions: every one of the standard, computed on local shards.

Elementwise functions need no communication on any layout: a split operand keeps its
split, a partial one is reduced first (see :mod:`._local`). The kernels are NumPy's
ufuncs, which follow the standard's special cases for NaN, infinities and signed zeros.
Python scalars take the dtype of the array operands (the standard's rule).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..tensor import GlobalTensor
from ._dtypes import bool as bool_
from ._dtypes import result_type
from ._local import array_arg, elementwise

#: The standard's name -> NumPy's ufunc name, for the unary functions.
UNARY: dict[str, str] = {
    "abs": "absolute", "acos": "arccos", "acosh": "arccosh", "asin": "arcsin",
    "asinh": "arcsinh", "atan": "arctan", "atanh": "arctanh", "bitwise_invert": "invert",
    "conj": "conjugate", "cos": "cos", "cosh": "cosh", "exp": "exp", "expm1": "expm1",
    "imag": "imag", "isfinite": "isfinite", "isinf": "isinf", "isnan": "isnan", "log": "log",
    "log1p": "log1p", "log2": "log2", "log10": "log10", "logical_not": "logical_not",
    "negative": "negative", "positive": "positive", "real": "real",
    "reciprocal": "reciprocal", "sign": "sign", "signbit": "signbit", "sin": "sin",
    "sinh": "sinh", "square": "square", "sqrt": "sqrt", "tan": "tan", "tanh": "tanh",
}
#: Unary rounding functions: the identity on integers (the standard keeps their dtype).
ROUNDING: dict[str, str] = {"ceil": "ceil", "floor": "floor", "trunc": "trunc",
                            "round": "round"}
#: The standard's name -> NumPy's ufunc name, for the binary functions.
BINARY: dict[str, str] = {
    "add": "add", "atan2": "arctan2", "bitwise_and": "bitwise_and",
    "bitwise_left_shift": "left_shift", "bitwise_or": "bitwise_or",
    "bitwise_right_shift": "right_shift", "bitwise_xor": "bitwise_xor",
    "copysign": "copysign", "divide": "true_divide", "equal": "equal",
    "floor_divide": "floor_divide", "greater": "greater", "greater_equal": "greater_equal",
    "hypot": "hypot", "less": "less", "less_equal": "less_equal", "logaddexp": "logaddexp",
    "logical_and": "logical_and", "logical_or": "logical_or", "logical_xor": "logical_xor",
    "maximum": "maximum", "minimum": "minimum", "multiply": "multiply",
    "nextafter": "nextafter", "not_equal": "not_equal", "pow": "power",
    "remainder": "remainder", "subtract": "subtract",
}

__all__ = [*UNARY, *ROUNDING, *BINARY, "clip", "where", "ELEMENTWISE"]


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
    gives other values for infinite and NaN parts)."""
    out = xp.expm1(a)
    if a.dtype.kind != "c":
        return out
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


#: Unary functions whose kernel is not NumPy's ufunc alone.
UNARY_KERNELS: dict[str, Callable[..., Any]] = {"expm1": _expm1, "tanh": _tanh}


def _unary(name: str, ufunc: str) -> Callable[[GlobalTensor], GlobalTensor]:
    kernel = UNARY_KERNELS.get(name) or (lambda xp, a: getattr(xp, ufunc)(a))

    def f(x: GlobalTensor, /) -> GlobalTensor:
        array_arg(name, x)
        return elementwise(name, kernel, x)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Elementwise ``{name}`` of a global array (NumPy's ``{ufunc}`` on each shard)."
    return f


def _rounding(name: str, fn: str) -> Callable[[GlobalTensor], GlobalTensor]:
    def kernel(xp: ModuleType, a: Any) -> Any:
        return a.copy() if a.dtype.kind in "biu" else getattr(xp, fn)(a)

    def f(x: GlobalTensor, /) -> GlobalTensor:
        array_arg(name, x)
        return elementwise(name, kernel, x, dtype=x.dtype)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = (f"Elementwise ``{name}`` of a global array (integers are returned "
                 f"unchanged, in their dtype).")
    return f


def _floor_divide(xp: ModuleType, a: Any, b: Any) -> Any:
    """NumPy's floor_divide with the standard's special cases for infinite operands:
    ``+-inf // finite`` is an infinity and ``finite // +-inf`` a zero of the quotient's
    sign (NumPy gives NaN, or -1 for a negative quotient)."""
    q = xp.floor_divide(a, b)
    if q.dtype.kind != "f":
        return q
    exact = (xp.isinf(a) & xp.isfinite(b) & (b != 0)) | (xp.isfinite(a) & xp.isinf(b))
    return xp.where(exact, a / b, q)


#: Binary functions whose kernel is not NumPy's ufunc alone.
KERNELS: dict[str, Callable[..., Any]] = {"floor_divide": _floor_divide}


def _binary(name: str, ufunc: str) -> Callable[[Any, Any], GlobalTensor]:
    kernel = KERNELS.get(name) or (lambda xp, a, b: getattr(xp, ufunc)(a, b))

    def f(x1: Any, x2: Any, /) -> GlobalTensor:
        return elementwise(name, kernel, x1, x2)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = (f"Elementwise ``{name}`` of global arrays or Python scalars, with "
                 f"broadcasting (NumPy's ``{ufunc}`` on each shard).")
    return f


# One module-level name per function (the namespace imports them by name).
abs = _unary("abs", "absolute")  # noqa: A001
acos = _unary("acos", "arccos")
acosh = _unary("acosh", "arccosh")
asin = _unary("asin", "arcsin")
asinh = _unary("asinh", "arcsinh")
atan = _unary("atan", "arctan")
atanh = _unary("atanh", "arctanh")
bitwise_invert = _unary("bitwise_invert", "invert")
conj = _unary("conj", "conjugate")
cos = _unary("cos", "cos")
cosh = _unary("cosh", "cosh")
exp = _unary("exp", "exp")
expm1 = _unary("expm1", "expm1")
imag = _unary("imag", "imag")
isfinite = _unary("isfinite", "isfinite")
isinf = _unary("isinf", "isinf")
isnan = _unary("isnan", "isnan")
log = _unary("log", "log")
log1p = _unary("log1p", "log1p")
log2 = _unary("log2", "log2")
log10 = _unary("log10", "log10")
logical_not = _unary("logical_not", "logical_not")
negative = _unary("negative", "negative")
positive = _unary("positive", "positive")
real = _unary("real", "real")
reciprocal = _unary("reciprocal", "reciprocal")
sign = _unary("sign", "sign")
signbit = _unary("signbit", "signbit")
sin = _unary("sin", "sin")
sinh = _unary("sinh", "sinh")
square = _unary("square", "square")
sqrt = _unary("sqrt", "sqrt")
tan = _unary("tan", "tan")
tanh = _unary("tanh", "tanh")
ceil = _rounding("ceil", "ceil")
floor = _rounding("floor", "floor")
trunc = _rounding("trunc", "trunc")
round = _rounding("round", "round")  # noqa: A001
add = _binary("add", "add")
atan2 = _binary("atan2", "arctan2")
bitwise_and = _binary("bitwise_and", "bitwise_and")
bitwise_left_shift = _binary("bitwise_left_shift", "left_shift")
bitwise_or = _binary("bitwise_or", "bitwise_or")
bitwise_right_shift = _binary("bitwise_right_shift", "right_shift")
bitwise_xor = _binary("bitwise_xor", "bitwise_xor")
copysign = _binary("copysign", "copysign")
divide = _binary("divide", "true_divide")
equal = _binary("equal", "equal")
floor_divide = _binary("floor_divide", "floor_divide")
greater = _binary("greater", "greater")
greater_equal = _binary("greater_equal", "greater_equal")
hypot = _binary("hypot", "hypot")
less = _binary("less", "less")
less_equal = _binary("less_equal", "less_equal")
logaddexp = _binary("logaddexp", "logaddexp")
logical_and = _binary("logical_and", "logical_and")
logical_or = _binary("logical_or", "logical_or")
logical_xor = _binary("logical_xor", "logical_xor")
maximum = _binary("maximum", "maximum")
minimum = _binary("minimum", "minimum")
multiply = _binary("multiply", "multiply")
nextafter = _binary("nextafter", "nextafter")
not_equal = _binary("not_equal", "not_equal")
pow = _binary("pow", "power")  # noqa: A001
remainder = _binary("remainder", "remainder")
subtract = _binary("subtract", "subtract")

#: Every elementwise function of the namespace by name.
ELEMENTWISE: dict[str, Callable[..., GlobalTensor]] = {
    name: globals()[name] for name in (*UNARY, *ROUNDING, *BINARY)}


def clip(x: GlobalTensor, /, min: Any = None, max: Any = None) -> GlobalTensor:  # noqa: A002
    """``x`` limited to ``[min, max]`` (either may be None, a Python scalar or a global
    array); the result has the dtype of ``x``."""
    array_arg("clip", x)
    bounds = [b for b in (min, max) if b is not None]
    lo, hi = min is not None, max is not None

    def kernel(xp: ModuleType, a: Any, *b: Any) -> Any:
        out = a
        if lo:
            out = xp.where(xp.isnan(b[0]) if b[0].dtype.kind in "fc" else False, b[0],
                           xp.maximum(out, b[0]))
        if hi:
            m = b[-1]
            out = xp.where(xp.isnan(m) if m.dtype.kind in "fc" else False, m,
                           xp.minimum(out, m))
        return xp.array(out, copy=True)

    def scalar_ok(b: Any) -> Any:
        return b if isinstance(b, GlobalTensor) else np.asarray(b).astype(x.dtype)[()]

    return elementwise("clip", kernel, x, *map(scalar_ok, bounds), dtype=x.dtype,
                       scalar_dtype=x.dtype)


def where(condition: GlobalTensor, x1: Any, x2: Any, /) -> GlobalTensor:
    """Elements of ``x1`` where ``condition`` is true, else of ``x2`` (global arrays or
    Python scalars), with broadcasting."""
    array_arg("where", condition)
    if condition.dtype != bool_:
        raise TypeError(f"where: condition must be a bool array, got dtype {condition.dtype}")
    dt = result_type(x1, x2)
    return elementwise("where", lambda xp, c, a, b: xp.where(c, a, b), condition, x1, x2,
                       dtype=dt, scalar_dtype=dt)
