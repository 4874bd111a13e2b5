"""Reductions (sum, mean, max, min over a dim, several dims or all) and softmax."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..core.reduction import REDUCTIONS, identity_value
from ..core.sbp import PARTIALS, Partial
from .call import OpCall, norm_dim, norm_dims, probe_dtype, tensor_arg
from .op import GlobalOp
from .signature import S_D, AnySplit, B, DimMatch, Signature

__all__ = ["SUM", "MEAN", "MAX", "MIN", "SOFTMAX", "sum_", "mean", "max_", "min_", "softmax",
           "log_softmax"]

S_R = AnySplit("r")  # a reduced dim; S_D is a kept dim



def _table(p: Partial) -> tuple[Signature, ...]:
    """The signatures of the reduction whose partial kind is ``p`` (sum, max or min)."""
    return (
        Signature((S_D,), S_D),  # split of a kept dim passes through
        Signature((S_R,), p),    # split of a reduced dim: partial results
        Signature((B,), B),
        Signature((p,), p),      # reducing operands of the same reduction
    )


SUM, MAX, MIN = (_table(PARTIALS[n]) for n in ("sum", "max", "min"))
MEAN = SUM                       # local sum / global count
SOFTMAX = (                      # softmax, log_softmax: S(d) for d other than the softmax dim
    Signature((S_D,), S_D),
    Signature((B,), B),
)


_NUMPY: dict[str, Callable[..., Any]] = {
    "mean": np.mean, **{name: r.reduce_of(np) for name, r in REDUCTIONS.items()}}
# Reductions whose ufunc has no identity (max, min): NumPy refuses them over an empty dim.
_NO_IDENTITY = frozenset(n for n, r in REDUCTIONS.items() if r.ufunc_of(np).identity is None)


def _reduction(name: str, table: tuple[Signature, ...], kind: str) -> GlobalOp:
    f = _NUMPY[kind]

    def build(x: Any, dim: Any = None, keepdim: bool = False) -> OpCall:
        x = tensor_arg(name, x)
        axes = norm_dims(name, dim, x.ndim)
        if not isinstance(keepdim, (bool, np.bool_)):
            raise TypeError(f"{name}: keepdim must be a bool, got {type(keepdim).__name__} "
                            f"{keepdim!r}")
        keepdim = bool(keepdim)
        if kind in _NO_IDENTITY:
            for d in axes:
                if x.shape[d] == 0:
                    raise ValueError(f"{name}: cannot reduce over dim {d} of size 0 in a tensor "
                                     f"of shape {x.shape} ({kind} has no identity)")
        kept = [d for d in range(x.ndim) if d not in axes]
        if keepdim:
            out_shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
            out_of = {d: d for d in kept}
        else:
            out_shape = tuple(x.shape[d] for d in kept)
            out_of = {d: i for i, d in enumerate(kept)}
        dtype = probe_dtype(name, lambda z: f(z.reshape(1), axis=0), x)
        dims = {"d": tuple(DimMatch((d,), out_of[d]) for d in kept),
                "r": tuple(DimMatch((d,), None) for d in axes)}
        count = math.prod(x.shape[d] for d in axes)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
            a = local[0]
            if kind == "mean":
                acc = np.float32 if dtype == np.float16 else dtype
                s = xp.sum(a, axis=axes, keepdims=keepdim, dtype=acc)
                return (s / count).astype(dtype)
            if kind in _NO_IDENTITY and any(a.shape[d] == 0 for d in axes):
                # this rank holds none of a split dim: the partial's identity
                return xp.full(shape, identity_value(kind, dtype), dtype=dtype)
            return REDUCTIONS[kind].reduce_of(xp)(a, axis=axes, keepdims=keepdim)

        params = f"dim={dim!r}" + (", keepdim=True" if keepdim else "")
        return OpCall(name, (x,), table, dims, out_shape, dtype, kernel, params=params,
                      labels=("x",))

    build.__doc__ = f"Build the OpCall of ``{name}``."
    return GlobalOp(name, build, table, doc=(
        f"``{name}`` of a global tensor over ``dim`` (an int, a tuple of ints, or None for "
        f"all dims), keeping reduced dims as size 1 when ``keepdim`` (signatures: "
        f"``{name}.table``)."))


sum_ = _reduction("sum", SUM, "sum")
mean = _reduction("mean", MEAN, "mean")
max_ = _reduction("max", MAX, "max")
min_ = _reduction("min", MIN, "min")


def _softmax(name: str, log: bool) -> GlobalOp:
    def build(x: Any, dim: Any = -1) -> OpCall:
        x = tensor_arg(name, x)
        d = norm_dim(name, dim, x.ndim)
        if x.shape[d] == 0:
            raise ValueError(f"{name}: dim {d} of a tensor of shape {x.shape} is empty")
        dtype = probe_dtype(name, lambda z: np.exp(z), x)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
            a = local[0]
            if a.dtype != dtype:
                a = a.astype(dtype)
            z = a - xp.max(a, axis=d, keepdims=True)
            e = xp.exp(z)
            s = xp.sum(e, axis=d, keepdims=True)
            return z - xp.log(s) if log else e / s

        dims = {"d": tuple(DimMatch((k,), k) for k in range(x.ndim) if k != d)}
        return OpCall(name, (x,), SOFTMAX, dims, x.shape, dtype, kernel, params=f"dim={dim!r}",
                      labels=("x",))

    build.__doc__ = f"Build the OpCall of ``{name}``."
    return GlobalOp(name, build, SOFTMAX, doc=(
        f"``{name}`` of a global tensor along ``dim`` (signatures: ``{name}.table``; a "
        f"tensor split or partial along ``dim`` is boxed first)."))


softmax = _softmax("softmax", log=False)
log_softmax = _softmax("log_softmax", log=True)
