"""Activations with a parameter: ``gelu`` (exact, through erf, or its tanh approximation)
and its gradient as one op each.

GELU is neither linear nor monotone (it dips below 0 near ``x = -0.75``), so a partial
input is reduced first: its rows are those of the other unary ops (a split passes
through, broadcast stays broadcast). The gradient ``gelu_backward(g, x)`` is linear in
``g``, so a partial-sum ``g`` stays partial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..backend.special import erf as _erf_of
from .call import OpCall, probe_dtype, tensor_arg
from .elementwise import LINEAR, UNARY, Pointwise, broadcast_matches
from .op import GlobalOp
from .signature import DimMatch, Signature

__all__ = ["GELU", "GELU_BACKWARD", "APPROXIMATIONS", "gelu", "gelu_backward"]

GELU = UNARY
GELU_BACKWARD: tuple[Signature, ...] = Pointwise(2, alone=(LINEAR, ())).table()  # (g, x)
#: The values of ``approximate``.
APPROXIMATIONS = ("none", "tanh")

_SQRT_HALF = math.sqrt(0.5)
_TANH_SCALE = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _check(name: str, approximate: Any) -> str:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"{name}: approximate must be 'none' or 'tanh', got {approximate!r}")
    return str(approximate)


def _float(xp: ModuleType, a: Any, dtype: Any) -> Any:
    return a if a.dtype == dtype else a.astype(dtype)


def _gelu(xp: ModuleType, x: Any, approximate: str) -> Any:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + xp.tanh(_TANH_SCALE * (x + _CUBIC * x * x * x)))
    return 0.5 * x * (1.0 + _erf_of(x * _SQRT_HALF))


def _gelu_slope(xp: ModuleType, x: Any, approximate: str) -> Any:
    if approximate == "tanh":
        t = xp.tanh(_TANH_SCALE * (x + _CUBIC * x * x * x))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _TANH_SCALE * (
            1.0 + 3.0 * _CUBIC * x * x)
    return 0.5 * (1.0 + _erf_of(x * _SQRT_HALF)) + x * xp.exp(-0.5 * x * x) * _INV_SQRT_2PI


def _float_dtype(name: str, *xs: Any) -> Any:
    dtype = probe_dtype(name, lambda *z: sum(z) * 0.5, *xs)
    if dtype.kind != "f":
        raise TypeError(f"{name}: needs real values, got dtype "
                        f"{', '.join(str(x.dtype) for x in xs)}")
    return dtype


def _build(x: Any, approximate: str = "none") -> OpCall:
    """Build the OpCall of ``gelu``."""
    x = tensor_arg("gelu", x)
    how = _check("gelu", approximate)
    dtype = _float_dtype("gelu", x)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return _gelu(xp, _float(xp, local[0], dtype), how)

    dims = {"d": tuple(DimMatch((d,), d) for d in range(x.ndim))}
    return OpCall("gelu", (x,), GELU, dims, x.shape, dtype, kernel,
                  params=f"approximate={how!r}", labels=("x",))


def _build_backward(g: Any, x: Any, approximate: str = "none") -> OpCall:
    """Build the OpCall of ``gelu_backward``."""
    g, x = tensor_arg("gelu_backward", g, "g"), tensor_arg("gelu_backward", x)
    how = _check("gelu_backward", approximate)
    if g.shape != x.shape:
        raise ValueError(f"gelu_backward: g has shape {g.shape}, x {x.shape}: they must match")
    dtype = _float_dtype("gelu_backward", g, x)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        gl, xl = (_float(xp, a, dtype) for a in local)
        return gl * _gelu_slope(xp, xl, how)

    return OpCall("gelu_backward", (g, x), GELU_BACKWARD,
                  {"d": broadcast_matches([g.shape, x.shape], x.shape)}, x.shape, dtype,
                  kernel, params=f"approximate={how!r}", labels=("g", "x"))


gelu = GlobalOp("gelu", _build, GELU, doc=(
    "``gelu(x, approximate='none')``: ``x * Phi(x)`` with ``Phi`` the normal CDF, "
    "``0.5 x (1 + erf(x / sqrt(2)))``; ``approximate='tanh'``: ``0.5 x (1 + tanh(sqrt(2/pi) "
    "(x + 0.044715 x^3)))`` (signatures: ``gelu.table``)."))
gelu_backward = GlobalOp("gelu_backward", _build_backward, GELU_BACKWARD, doc=(
    "``gelu_backward(g, x, approximate='none')``: ``g * gelu'(x)``, the gradient of gelu."))
