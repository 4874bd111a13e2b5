"""Normalization over the last dim as one op, and its gradient as another: the fused
core of layer norm where every rank holds whole rows.

``normalize(x, eps)`` is ``(x - mean) / sqrt(var + eps)`` over the last dim (``var``
biased), computed in one local kernel on a few temporaries instead of a chain of
full-size global ops. It is not linear, and its moments need whole rows, so its rows are
those of softmax over the last dim: a split of a leading dim passes through, broadcast
stays broadcast; a partial input is reduced first, and a split last dim is boxed away
(:func:`sbpmpi.nn.layer_norm` takes its composed path there instead, all-reducing only
the moments). ``normalize_backward(g, x, eps)`` recomputes the moments from ``x``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..core.dtypes import accumulation_dtype
from .call import OpCall, as_dtype, check_eps, float_dtype, tensor_arg
from .kernel import Scratch, written_into, zero_d
from .op import GlobalOp
from .signature import S_D, B, DimMatch, Signature

__all__ = ["NORMALIZE", "NORMALIZE_BACKWARD", "normalize", "normalize_backward"]

NORMALIZE = (                    # S(d) for d other than the last dim
    Signature((S_D,), S_D),
    Signature((B,), B),
)
NORMALIZE_BACKWARD = (           # (g, x) alike
    Signature((S_D, S_D), S_D),
    Signature((B, B), B),
)


def _check(name: str, x: Any, eps: Any) -> float:
    """``eps``, validated alike on every rank with ``x``'s shape (metadata only)."""
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"{name}: x must have a non-empty last dim, got shape {x.shape}")
    return check_eps(name, eps)


def _row_dot(xp: ModuleType, a: Any, b: Any, out: Any) -> None:
    """``sum(a * b, axis=-1)`` written into ``out`` (a contraction: no full-size product
    is made; CuPy's einsum has no ``out``)."""
    if xp is np:
        np.einsum("...i,...i->...", a, b, out=out)
    else:
        out[...] = xp.einsum("...i,...i->...", a, b)


def _row_mean(xp: ModuleType, a: Any, out: Any) -> Any:
    """The mean over the last dim written into ``out`` (keepdims): a sum and a division by
    the count as a 0-d array of out's dtype (``mean``'s count is a new array each call)."""
    xp.sum(a, axis=-1, keepdims=True, out=out)
    out /= zero_d(xp, a.shape[-1], out.dtype)
    return out


# The kernels write into their result and take their temporaries from ``scratch`` (each
# with its own number: shapes may coincide when the last dim is 1); the eager kernels are
# these forms with new arrays (``written_into``), so eager and replayed results are
# bit-identical.
def _moments(xp: ModuleType, x: Any, eps: float, xc: Any, scratch: Scratch) -> Any:
    """``x - mean`` written into ``xc``; returns ``1 / sqrt(var + eps)`` (a temporary of
    the reduced shape, keepdims)."""
    red, dt = x.shape[:-1], xc.dtype
    m = _row_mean(xp, x, scratch.get(xp, red + (1,), dt, 0))
    xp.subtract(x, m, out=xc)
    var = scratch.get(xp, red, dt, 1)
    _row_dot(xp, xc, xc, var)
    var = var.reshape(red + (1,))
    var /= zero_d(xp, x.shape[-1], dt)
    var += zero_d(xp, eps, dt)
    xp.sqrt(var, out=var)
    return xp.divide(zero_d(xp, 1.0, dt), var, out=var)


def _normalize(xp: ModuleType, x: Any, eps: float, out: Any, scratch: Scratch) -> None:
    rstd = _moments(xp, x, eps, out, scratch)
    out *= rstd


def _normalize_grad(xp: ModuleType, g: Any, x: Any, eps: float, dx: Any,
                    scratch: Scratch) -> None:
    """``rstd (g - mean(g) - xhat mean(g xhat))`` written into ``dx``, on one full-size
    temporary."""
    xhat = scratch.get(xp, x.shape, dx.dtype, 2)
    rstd = _moments(xp, x, eps, xhat, scratch)
    xhat *= rstd
    n = x.shape[-1]
    red = x.shape[:-1]
    mg = _row_mean(xp, g, scratch.get(xp, red + (1,), dx.dtype, 3))
    mgx = scratch.get(xp, red, dx.dtype, 4)
    _row_dot(xp, g, xhat, mgx)
    mgx = mgx.reshape(red + (1,))
    mgx /= zero_d(xp, n, dx.dtype)
    xhat *= mgx
    xp.subtract(g, xhat, out=dx)
    dx -= mg
    dx *= rstd


def _build(x: Any, eps: Any = 1e-5) -> OpCall:
    """Build the OpCall of ``normalize``."""
    x = tensor_arg("normalize", x)
    e = _check("normalize", x, eps)
    dtype = float_dtype("normalize", x)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        _normalize(xp, as_dtype(local[0], dtype), e, out, scratch)

    kernel = written_into(into, accumulation_dtype(dtype))

    dims = {"d": tuple(DimMatch((k,), k) for k in range(x.ndim - 1))}
    return OpCall("normalize", (x,), NORMALIZE, dims, x.shape, dtype, kernel,
                  params=f"eps={e!r}", labels=("x",))


def _build_backward(g: Any, x: Any, eps: Any = 1e-5) -> OpCall:
    """Build the OpCall of ``normalize_backward``."""
    g, x = tensor_arg("normalize_backward", g, "g"), tensor_arg("normalize_backward", x)
    if g.shape != x.shape:
        raise ValueError(f"normalize_backward: g has shape {g.shape}, x {x.shape}: "
                         f"they must match")
    e = _check("normalize_backward", x, eps)
    dtype = float_dtype("normalize_backward", g, x)

    def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
             scratch: Scratch) -> None:
        gl, xl = (as_dtype(a, dtype) for a in local)
        _normalize_grad(xp, gl, xl, e, out, scratch)

    kernel = written_into(into, accumulation_dtype(dtype))

    dims = {"d": tuple(DimMatch((k, k), k) for k in range(x.ndim - 1))}
    return OpCall("normalize_backward", (g, x), NORMALIZE_BACKWARD, dims, x.shape, dtype,
                  kernel, params=f"eps={e!r}", labels=("g", "x"))


normalize = GlobalOp("normalize", _build, NORMALIZE, doc=(
    "``normalize(x, eps=1e-5)``: ``(x - mean) / sqrt(var + eps)`` over the last dim "
    "(biased ``var``), one local kernel; the last dim must not be split (signatures: "
    "``normalize.table``)."))
normalize_backward = GlobalOp("normalize_backward", _build_backward, NORMALIZE_BACKWARD, doc=(
    "``normalize_backward(g, x, eps=1e-5)``: the gradient of normalize, ``rstd (g - mean(g) "
    "- xhat mean(g xhat))`` over the last dim, the moments recomputed from ``x``."))
