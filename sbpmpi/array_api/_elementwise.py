"""Elementwise functions: every one of the standard, each an alias of a registered op.

The op registry (:mod:`sbpmpi.ops.registry`) names the op behind each of the standard's
elementwise names (``subtract`` is ``sm.ops.sub``, ``sin`` is ``sm.ops.sin``, ...), so
``xp.add(x, y)``, ``x + y``, ``np.add(x, y)`` and ``sm.add(x, y)`` run one op, with its
signature table (a partial sum stays lazy where the op is linear) and its kernel (NumPy's
ufuncs, with the standard's special cases where NumPy's differ). What this door adds is
the standard's argument rules: a Python scalar takes the dtype of the array operands,
and combinations the standard does not define (a Python float with an integer array,
bool with a number) raise a TypeError (:func:`._dtypes.result_type`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ops.call import tensor_arg
from ..ops.registry import REGISTRY, OpEntry, entry_for_array_api
from ..tensor import GlobalTensor
from ._dtypes import bool as bool_
from ._dtypes import result_type

#: The standard's elementwise functions (2024.12), in its order: name -> number of array
#: operands (clip takes one array and optional bounds).
STANDARD: dict[str, int] = {
    **dict.fromkeys((
        "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bitwise_invert", "ceil",
        "conj", "cos", "cosh", "exp", "expm1", "floor", "imag", "isfinite", "isinf", "isnan",
        "log", "log1p", "log2", "log10", "logical_not", "negative", "positive", "real",
        "reciprocal", "round", "sign", "signbit", "sin", "sinh", "square", "sqrt", "tan",
        "tanh", "trunc"), 1),
    **dict.fromkeys((
        "add", "atan2", "bitwise_and", "bitwise_left_shift", "bitwise_or",
        "bitwise_right_shift", "bitwise_xor", "copysign", "divide", "equal", "floor_divide",
        "greater", "greater_equal", "hypot", "less", "less_equal", "logaddexp", "logical_and",
        "logical_or", "logical_xor", "maximum", "minimum", "multiply", "nextafter",
        "not_equal", "pow", "remainder", "subtract"), 2),
    "where": 3,
    "clip": 1,
}

__all__ = [*STANDARD, "ELEMENTWISE", "STANDARD", "entry_of"]


def entry_of(name: str) -> OpEntry:
    """The registry entry behind the standard's ``name``."""
    entry = entry_for_array_api(name)
    if entry is None:
        raise LookupError(f"array API: {name!r} has no op in the registry")
    return entry


def _standard_scalars(name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The operands with each Python scalar in the dtype the standard gives it (the array
    operands' promoted dtype); a TypeError for a combination the standard does not define."""
    for a in args:
        if not isinstance(a, (GlobalTensor, int, float, complex, np.generic)):
            raise TypeError(f"{name}: arguments must be global arrays or Python scalars, got "
                            f"{type(a).__name__} {a!r}")
    if not any(isinstance(a, GlobalTensor) for a in args):
        raise TypeError(f"{name}: at least one argument must be a global array")
    if all(isinstance(a, GlobalTensor) for a in args):
        return args
    common = result_type(*args)
    return tuple(a if isinstance(a, GlobalTensor) else np.asarray(a).astype(common)[()]
                 for a in args)


def _function(name: str) -> Callable[..., GlobalTensor]:
    entry = entry_of(name)
    op = entry.op
    f: Callable[..., GlobalTensor]
    if STANDARD[name] == 1:
        def unary(x: GlobalTensor, /) -> GlobalTensor:
            return op(tensor_arg(name, x))  # type: ignore[no-any-return]
        f = unary
    else:
        def binary(x1: Any, x2: Any, /) -> GlobalTensor:
            return op(*_standard_scalars(name, (x1, x2)))  # type: ignore[no-any-return]
        f = binary
    f.__name__ = f.__qualname__ = name
    f.__doc__ = (f"The standard's ``{name}``: :func:`sbpmpi.ops.{entry.name}` (its signatures "
                 f"and kernel), with the standard's scalar rules.")
    return f


def clip(x: GlobalTensor, /, min: Any = None, max: Any = None) -> GlobalTensor:  # noqa: A002
    """``x`` limited to ``[min, max]`` (either may be None, a Python scalar or a global
    array); the result has the dtype of ``x`` (:func:`sbpmpi.ops.clip`)."""
    tensor_arg("clip", x)
    return REGISTRY["clip"].op(x, min, max)  # type: ignore[no-any-return]


def where(condition: GlobalTensor, x1: Any, x2: Any, /) -> GlobalTensor:
    """Elements of ``x1`` where ``condition`` is true, else of ``x2`` (global arrays or
    Python scalars), with broadcasting (:func:`sbpmpi.ops.where`)."""
    tensor_arg("where", condition, "condition")
    if condition.dtype != bool_:
        raise TypeError(f"where: condition must be a bool array, got dtype {condition.dtype}")
    for a in (x1, x2):
        if not isinstance(a, (GlobalTensor, int, float, complex, np.generic)):
            raise TypeError(f"where: arguments must be global arrays or Python scalars, got "
                            f"{type(a).__name__} {a!r}")
    dt = result_type(x1, x2)
    x1, x2 = (a if isinstance(a, GlobalTensor) else np.asarray(a).astype(dt)[()]
              for a in (x1, x2))
    out = REGISTRY["where"].op(condition, x1, x2)
    return out if out.dtype == dt else out.astype(dt)  # type: ignore[no-any-return]


# One module-level name per function (the namespace imports them by name).
abs = _function("abs")  # noqa: A001
acos = _function("acos")
acosh = _function("acosh")
asin = _function("asin")
asinh = _function("asinh")
atan = _function("atan")
atanh = _function("atanh")
bitwise_invert = _function("bitwise_invert")
ceil = _function("ceil")
conj = _function("conj")
cos = _function("cos")
cosh = _function("cosh")
exp = _function("exp")
expm1 = _function("expm1")
floor = _function("floor")
imag = _function("imag")
isfinite = _function("isfinite")
isinf = _function("isinf")
isnan = _function("isnan")
log = _function("log")
log1p = _function("log1p")
log2 = _function("log2")
log10 = _function("log10")
logical_not = _function("logical_not")
negative = _function("negative")
positive = _function("positive")
real = _function("real")
reciprocal = _function("reciprocal")
round = _function("round")  # noqa: A001
sign = _function("sign")
signbit = _function("signbit")
sin = _function("sin")
sinh = _function("sinh")
square = _function("square")
sqrt = _function("sqrt")
tan = _function("tan")
tanh = _function("tanh")
trunc = _function("trunc")
add = _function("add")
atan2 = _function("atan2")
bitwise_and = _function("bitwise_and")
bitwise_left_shift = _function("bitwise_left_shift")
bitwise_or = _function("bitwise_or")
bitwise_right_shift = _function("bitwise_right_shift")
bitwise_xor = _function("bitwise_xor")
copysign = _function("copysign")
divide = _function("divide")
equal = _function("equal")
floor_divide = _function("floor_divide")
greater = _function("greater")
greater_equal = _function("greater_equal")
hypot = _function("hypot")
less = _function("less")
less_equal = _function("less_equal")
logaddexp = _function("logaddexp")
logical_and = _function("logical_and")
logical_or = _function("logical_or")
logical_xor = _function("logical_xor")
maximum = _function("maximum")
minimum = _function("minimum")
multiply = _function("multiply")
nextafter = _function("nextafter")
not_equal = _function("not_equal")
pow = _function("pow")  # noqa: A001
remainder = _function("remainder")
subtract = _function("subtract")

#: Every elementwise function of the namespace by name.
ELEMENTWISE: dict[str, Callable[..., GlobalTensor]] = {
    name: globals()[name] for name in STANDARD}
