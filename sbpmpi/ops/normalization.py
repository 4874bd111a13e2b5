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

from .call import OpCall, as_dtype, check_eps, float_dtype, tensor_arg
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


def _moments(xp: ModuleType, x: Any, eps: float) -> tuple[Any, Any]:
    """``x - mean`` (a new array) and ``1 / sqrt(var + eps)`` (of the reduced shape)."""
    xc = x - xp.mean(x, axis=-1, keepdims=True)
    # the sum of squares as a contraction: no full-size square is allocated
    var = xp.einsum("...i,...i->...", xc, xc)[..., None]
    var /= x.shape[-1]
    var += eps
    xp.sqrt(var, out=var)
    return xc, xp.divide(1.0, var, out=var)


def _normalize(xp: ModuleType, x: Any, eps: float) -> Any:
    xhat, rstd = _moments(xp, x, eps)
    xhat *= rstd
    return xhat


def _normalize_grad(xp: ModuleType, g: Any, x: Any, eps: float) -> Any:
    """``rstd (g - mean(g) - xhat mean(g xhat))``, on two full-size temporaries."""
    xhat, rstd = _moments(xp, x, eps)
    xhat *= rstd
    n = x.shape[-1]
    mg = xp.mean(g, axis=-1, keepdims=True)
    mgx = xp.einsum("...i,...i->...", g, xhat)[..., None]
    mgx /= n
    xhat *= mgx
    dx = xp.subtract(g, xhat)
    dx -= mg
    dx *= rstd
    return dx


def _build(x: Any, eps: Any = 1e-5) -> OpCall:
    """Build the OpCall of ``normalize``."""
    x = tensor_arg("normalize", x)
    e = _check("normalize", x, eps)
    dtype = float_dtype("normalize", x)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        return _normalize(xp, as_dtype(local[0], dtype), e)

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

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        gl, xl = (as_dtype(a, dtype) for a in local)
        return _normalize_grad(xp, gl, xl, e)

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
