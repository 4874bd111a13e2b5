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
from ..core.dtypes import accumulation_dtype
from .call import OpCall, as_dtype, float_dtype, tensor_arg
from .elementwise import LINEAR, UNARY, Pointwise, broadcast_matches
from .kernel import Scratch, written_into, zero_d
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


def _tanh_term(xp: ModuleType, x: Any, t: Any) -> Any:
    """``tanh(sqrt(2/pi) (x + 0.044715 x^3))`` written into ``t``."""
    dt = t.dtype
    xp.multiply(x, x, out=t)
    t *= zero_d(xp, _CUBIC, dt)
    t += zero_d(xp, 1.0, dt)
    t *= x
    t *= zero_d(xp, _TANH_SCALE, dt)
    return xp.tanh(t, out=t)


def _erf_term(xp: ModuleType, x: Any, t: Any) -> Any:
    """``erf(x / sqrt(2))`` written into ``t`` (of x's dtype)."""
    xp.multiply(x, zero_d(xp, _SQRT_HALF, t.dtype), out=t)
    return _erf_of(t, out=t)


# Both kernels write into their result and at most two temporaries (from ``scratch``),
# their constants 0-d arrays made once (a Python scalar is made into a new array by every
# ufunc call): GELU is a chain of cheap elementwise steps, and a fresh array per step costs
# more than the step. The eager kernels are these forms with new arrays (``written_into``),
# so eager and replayed results are bit-identical.
def _gelu(xp: ModuleType, x: Any, approximate: str, y: Any) -> None:
    """``gelu(x)`` written into ``y``."""
    if approximate == "tanh":
        _tanh_term(xp, x, y)
    else:
        _erf_term(xp, x, y)
    y += zero_d(xp, 1.0, y.dtype)
    y *= x
    y *= zero_d(xp, 0.5, y.dtype)


def _gelu_grad(xp: ModuleType, g: Any, x: Any, approximate: str, t: Any,
               scratch: Scratch) -> None:
    """``g * gelu'(x)`` written into ``t``."""
    dt = t.dtype
    w = scratch.get(xp, x.shape, dt)
    if approximate == "tanh":
        # 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        _tanh_term(xp, x, t)
        xp.multiply(t, t, out=w)
        xp.subtract(zero_d(xp, 1.0, dt), w, out=w)
        v = scratch.get(xp, x.shape, dt, 1)
        xp.multiply(x, x, out=v)
        v *= zero_d(xp, 3.0 * _CUBIC, dt)
        v += zero_d(xp, 1.0, dt)
        w *= v
        w *= x
        w *= zero_d(xp, 0.5 * _TANH_SCALE, dt)
    else:
        # 0.5 (1 + erf(x / sqrt(2))) + x exp(-x^2 / 2) / sqrt(2 pi)
        _erf_term(xp, x, t)
        xp.multiply(x, x, out=w)
        w *= zero_d(xp, -0.5, dt)
        xp.exp(w, out=w)
        w *= x
        w *= zero_d(xp, _INV_SQRT_2PI, dt)
    t += zero_d(xp, 1.0, dt)
    t *= zero_d(xp, 0.5, dt)
    t += w
    t *= g


def _build(x: Any, approximate: str = "none") -> OpCall:
    """Build the OpCall of ``gelu``."""
    x = tensor_arg("gelu", x)
    how = _check("gelu", approximate)
    dtype = float_dtype("gelu", x)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        _gelu(xp, as_dtype(local[0], dtype), how, out)

    kernel = written_into(into, accumulation_dtype(dtype))

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

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        gl, xl = (as_dtype(a, dtype) for a in local)
        _gelu_grad(xp, gl, xl, how, out, scratch)

    kernel = written_into(into, accumulation_dtype(dtype))

    return OpCall("gelu_backward", (g, x), GELU_BACKWARD,
                  {"d": broadcast_matches([g.shape, x.shape], x.shape)}, x.shape, dtype,
                  kernel, params=f"approximate={how!r}", labels=("g", "x"))


gelu = GlobalOp("gelu", _build, GELU, doc=(
    "``gelu(x, approximate='none')``: ``x * Phi(x)`` with ``Phi`` the normal CDF, "
    "``0.5 x (1 + erf(x / sqrt(2)))``; ``approximate='tanh'``: ``0.5 x (1 + tanh(sqrt(2/pi) "
    "(x + 0.044715 x^3)))`` (signatures: ``gelu.table``)."))
gelu_backward = GlobalOp("gelu_backward", _build_backward, GELU_BACKWARD, doc=(
    "``gelu_backward(g, x, approximate='none')``: ``g * gelu'(x)``, the gradient of gelu."))
