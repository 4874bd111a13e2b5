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
from .call import OpCall, as_dtype, float_dtype, tensor_arg
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


def _square(xp: ModuleType, x: Any) -> Any:
    """``x * x`` in a new array (an array also for 0-d ``x``: later steps write into it)."""
    return xp.multiply(x, x, out=xp.empty_like(x))


def _tanh_term(xp: ModuleType, x: Any) -> Any:
    """``tanh(sqrt(2/pi) (x + 0.044715 x^3))`` in a new array, written in place."""
    t = _square(xp, x)
    t *= _CUBIC
    t += 1.0
    t *= x
    t *= _TANH_SCALE
    return xp.tanh(t, out=t)


def _erf_term(xp: ModuleType, x: Any) -> Any:
    """``erf(x / sqrt(2))`` in x's dtype, a new array."""
    e = _erf_of(x * _SQRT_HALF)
    return e if e.dtype == x.dtype else e.astype(x.dtype)


# Both kernels work in place on the one or two temporaries they allocate: GELU is a
# chain of cheap elementwise steps, and a fresh array per step costs more than the step.
def _gelu(xp: ModuleType, x: Any, approximate: str) -> Any:
    y = _tanh_term(xp, x) if approximate == "tanh" else _erf_term(xp, x)
    y += 1.0
    y *= x
    y *= 0.5
    return y


def _gelu_grad(xp: ModuleType, g: Any, x: Any, approximate: str) -> Any:
    """``g * gelu'(x)``."""
    if approximate == "tanh":
        # 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        t = _tanh_term(xp, x)
        w = _square(xp, t)
        xp.subtract(1.0, w, out=w)
        v = _square(xp, x)
        v *= 3.0 * _CUBIC
        v += 1.0
        w *= v
        w *= x
        w *= 0.5 * _TANH_SCALE
    else:
        # 0.5 (1 + erf(x / sqrt(2))) + x exp(-x^2 / 2) / sqrt(2 pi)
        t = _erf_term(xp, x)
        w = _square(xp, x)
        w *= -0.5
        xp.exp(w, out=w)
        w *= x
        w *= _INV_SQRT_2PI
    t += 1.0
    t *= 0.5
    t += w
    t *= g
    return t


def _build(x: Any, approximate: str = "none") -> OpCall:
    """Build the OpCall of ``gelu``."""
    x = tensor_arg("gelu", x)
    how = _check("gelu", approximate)
    dtype = float_dtype("gelu", x)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return _gelu(xp, as_dtype(local[0], dtype), how)

    dims = {"d": tuple(DimMatch((d,), d) for d in range(x.ndim))}
    return OpCall("gelu", (x,), GELU, dims, x.shape, dtype, kernel,
                  params=f"approximate={how!r}", labels=("x",))


def _build_backward(g: Any, x: Any, approximate: str = "none") -> OpCall:
    """Build the OpCall of ``gelu_backward``."""
    g, x = tensor_arg("gelu_backward", g, "g"), tensor_arg("gelu_backward", x)
    how = _check("gelu_backward", approximate)
    if g.shape != x.shape:
        raise ValueError(f"gelu_backward: g has shape {g.shape}, x {x.shape}: they must match")
    dtype = float_dtype("gelu_backward", g, x)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        gl, xl = (as_dtype(a, dtype) for a in local)
        return _gelu_grad(xp, gl, xl, how)

    return OpCall("gelu_backward", (g, x), GELU_BACKWARD,
                  {"d": broadcast_matches([g.shape, x.shape], x.shape)}, x.shape, dtype,
                  kernel, params=f"approximate={how!r}", labels=("g", "x"))


gelu = GlobalOp("gelu", _build, GELU, doc=(
    "``gelu(x, approximate='none')``: ``x * Phi(x)`` with ``Phi`` the normal CDF, "
    "``0.5 x (1 + erf(x / sqrt(2)))``; ``approximate='tanh'``: ``0.5 x (1 + tanh(sqrt(2/pi) "
    "(x + 0.044715 x^3)))`` (signatures: ``gelu.table``)."))
gelu_backward = GlobalOp("gelu_backward", _build_backward, GELU_BACKWARD, doc=(
    "``gelu_backward(g, x, approximate='none')``: ``g * gelu'(x)``, the gradient of gelu."))
