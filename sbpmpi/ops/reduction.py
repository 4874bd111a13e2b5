"""Reductions (sum, mean, max, min over a dim, several dims or all), var and softmax.

``softmax`` and ``log_softmax`` of a tensor split along their dim never gather it: they
run as three ops, a max over the dim (partial_max, made broadcast by one all-reduce of
the reduced shape), the sum of ``exp(x - max)`` (partial sum, one more all-reduce of
the reduced shape), and the elementwise finish on the shards. Otherwise they are one op.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ..core.dtypes import accumulation_dtype, float32, is_floating, is_half
from ..core.modes import current_modes
from ..core.reduction import REDUCTIONS, identity_value
from ..core.sbp import PARTIALS, Broadcast, Partial, Split
from ..grad_mode import no_grad
from ..tape import record_op
from ..tensor import GlobalTensor
from . import autocast
from .call import OpCall, as_dtype, norm_dim, norm_dims, probe_dtype, tensor_arg
from .elementwise import broadcast_matches, mul, sub
from .kernel import Scratch, with_into, written_into
from .op import GlobalOp
from .shape import astype
from .signature import S_D, AnySplit, B, DimMatch, P, Signature

__all__ = ["SUM", "MEAN", "MAX", "MIN", "VAR", "SOFTMAX", "SUM_EXP", "SOFTMAX_FINISH", "sum_", "mean",
           "max_", "min_", "var", "softmax", "log_softmax", "softmax_into", "sum_exp",
           "softmax_finish",
           "reduced"]

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
SUM_EXP = (                      # sum_exp(x, m) over one dim, m of the reduced shape
    Signature((S_D, S_D), S_D),  # a kept dim
    Signature((S_R, B), P),      # the summed dim: partial sums
    Signature((B, B), B),
)
SOFTMAX_FINISH = (               # softmax_finish(x, m, s): S(d) for every dim, the softmax
    Signature((S_D, S_D, S_D), S_D),  # dim's with m and s broadcast
    Signature((B, B, B), B),
)


_NUMPY: dict[str, Callable[..., Any]] = {
    "mean": np.mean, **{name: r.reduce_of(np) for name, r in REDUCTIONS.items()}}
# Reductions whose ufunc has no identity (max, min): NumPy refuses them over an empty dim.
_NO_IDENTITY = frozenset(n for n, r in REDUCTIONS.items() if r.ufunc_of(np).identity is None)


class ReducedShape(NamedTuple):
    """The result of reducing ``axes`` of a shape: the dims kept (in order), the result's
    shape, and where each kept dim lands in it."""

    kept: list[int]
    shape: tuple[int, ...]
    out_of: dict[int, int]


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool) -> ReducedShape:
    kept = [d for d in range(len(shape)) if d not in axes]
    if keepdim:
        return ReducedShape(kept, tuple(1 if d in axes else n for d, n in enumerate(shape)),
                            {d: d for d in kept})
    return ReducedShape(kept, tuple(shape[d] for d in kept), {d: i for i, d in enumerate(kept)})


def _reduction(name: str, table: tuple[Signature, ...], kind: str,
               op_class: type[GlobalOp] = GlobalOp) -> GlobalOp:
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
        kept, out_shape, out_of = _reduced_shape(x.shape, axes, keepdim)
        dtype = probe_dtype(name, lambda z: f(z.reshape(1), axis=0), x)
        dims = {"d": tuple(DimMatch((d,), out_of[d]) for d in kept),
                "r": tuple(DimMatch((d,), None) for d in axes)}
        count = math.prod(x.shape[d] for d in axes)

        def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
            a = local[0]
            if kind == "mean":
                # float32 for a half-width x (its shard already widened by local_result,
                # which rounds this once to the op's dtype)
                acc = accumulation_dtype(dtype)
                s = xp.sum(a, axis=axes, keepdims=keepdim, dtype=acc)
                return s / count
            if kind in _NO_IDENTITY and any(a.shape[d] == 0 for d in axes):
                # this rank holds none of a split dim: the partial's identity
                return xp.full(shape, identity_value(kind, dtype), dtype=dtype)
            return REDUCTIONS[kind].reduce_of(xp)(a, axis=axes, keepdims=keepdim)

        def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...],
                 out: Any) -> None:
            a = local[0]
            if kind in _NO_IDENTITY and any(a.shape[d] == 0 for d in axes):
                out.fill(identity_value(kind, dtype))
            else:
                REDUCTIONS[kind].reduce_of(xp)(a, axis=axes, keepdims=keepdim, out=out)

        if kind != "mean":  # mean divides and casts: replayed as it runs
            with_into(kernel, into)
        params = f"dim={dim!r}" + (", keepdim=True" if keepdim else "")
        return OpCall(name, (x,), table, dims, out_shape, dtype, kernel, params=params,
                      labels=("x",))

    build.__doc__ = f"Build the OpCall of ``{name}``."
    return op_class(name, build, table, doc=(
        f"``{name}`` of a global tensor over ``dim`` (an int, a tuple of ints, or None for "
        f"all dims), keeping reduced dims as size 1 when ``keepdim`` (signatures: "
        f"``{name}.table``)."))


class _Mean(GlobalOp):
    """mean: one op; for a half-width ``x`` split along a reduced dim, the mean of its
    float32 copy rounded once to ``x``'s dtype (the cross-rank sum of the partial means
    then runs in float32 too, rather than on partials each rounded to the half dtype)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_modes().autocast.enabled:  # as GlobalOp.__call__: float32 operands inside autocast
            args, kwargs = autocast.cast_operands(self.name, args, kwargs)
        x = args[0] if args else kwargs.get("x")
        if isinstance(x, GlobalTensor) and is_half(x.dtype) \
                and any(isinstance(s, Split) for s in x.sbp):  # else: no build here
            call = self.build(*args, **kwargs)  # checks the arguments alike on every rank
            axes = tuple(d for m in call.dims["r"] if (d := m.inputs[0]) is not None)
            if _splits_any(x, axes):
                keepdim = len(call.out_shape) == x.ndim and bool(axes)
                with no_grad():
                    wide = astype(x, float32)
                    out = astype(super().__call__(wide, axes, keepdim=keepdim), x.dtype)
                return record_op(self.name, (x,), args, kwargs, out)
        return super().__call__(*args, **kwargs)


def _splits_any(x: GlobalTensor, dims: Sequence[int]) -> bool:
    """Whether a mesh axis splits ``x`` along one of ``dims``."""
    return any(isinstance(s, Split) and s.dim in dims for s in x.sbp)


sum_ = _reduction("sum", SUM, "sum")
mean = _reduction("mean", MEAN, "mean", _Mean)
max_ = _reduction("max", MAX, "max")
min_ = _reduction("min", MIN, "min")


VAR = (                          # var over reduced dims: kept dims pass through
    Signature((S_D,), S_D),
    Signature((B,), B),
)


def _var_args(x: Any, dim: Any, keepdim: Any, correction: Any
              ) -> tuple[GlobalTensor, tuple[int, ...], bool, float]:
    x = tensor_arg("var", x)
    axes = norm_dims("var", dim, x.ndim)
    if isinstance(correction, (bool, np.bool_)) or not isinstance(
            correction, (int, float, np.integer, np.floating)):
        raise TypeError(f"var: correction must be a number, got {type(correction).__name__} "
                        f"{correction!r}")
    if not isinstance(keepdim, (bool, np.bool_)):
        raise TypeError(f"var: keepdim must be a bool, got {type(keepdim).__name__} {keepdim!r}")
    if x.dtype.kind != "c" and not is_floating(x.dtype):
        raise TypeError(f"var: needs a floating dtype, got {x.dtype}")
    return x, axes, bool(keepdim), float(correction)


def _var(x: Any, dim: Any = None, keepdim: bool = False, correction: int | float = 0) -> OpCall:
    """Build the OpCall of ``var`` (the one-kernel form, every reduced dim held whole)."""
    x, axes, keepdim, correction = _var_args(x, dim, keepdim, correction)
    count = math.prod(x.shape[d] for d in axes)
    kept, out_shape, out_of = _reduced_shape(x.shape, axes, keepdim)
    dtype = x.dtype
    denominator = max(count - correction, 0)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a = local[0]
        with np.errstate(all="ignore"):  # an empty dim or no degrees of freedom: NaN/inf
            c = a - xp.mean(a, axis=axes, keepdims=True)
            return xp.sum(c * c, axis=axes, keepdims=keepdim) / denominator

    dims = {"d": tuple(DimMatch((d,), out_of[d]) for d in kept)}
    params = f"dim={dim!r}" + (", keepdim=True" if keepdim else "") + \
        (f", correction={correction!r}" if correction else "")
    return OpCall("var", (x,), VAR, dims, out_shape, dtype, kernel, params=params,
                  labels=("x",))


class _Var(GlobalOp):
    """var: one local kernel when every reduced dim is held whole; when a mesh axis splits
    a reduced dim or ``x`` is partial, a composition of ``mean``, ``sub``, ``mul`` and
    ``sum`` (a split reduced dim then costs one all-reduce of the reduced shape, the mean,
    and leaves the result a partial sum: nothing is gathered)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_modes().autocast.enabled:  # as GlobalOp.__call__: float32 operands inside autocast
            args, kwargs = autocast.cast_operands(self.name, args, kwargs)
        x = args[0] if args else kwargs.get("x")
        if isinstance(x, GlobalTensor) and any(not isinstance(s, Broadcast) for s in x.sbp):
            call = self.build(*args, **kwargs)  # checks the arguments alike on every rank
            kept = {m.inputs[0] for m in call.dims["d"]}
            if any(isinstance(s, Partial) or (isinstance(s, Split) and s.dim not in kept)
                   for s in x.sbp):
                with no_grad():
                    out = _composed_var(*_var_args(*_var_params(args, kwargs)))
                return record_op(self.name, (x,), args, kwargs, out)
        return super().__call__(*args, **kwargs)


def _var_params(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """``var``'s (x, dim, keepdim, correction) from a call's arguments."""
    names = ("x", "dim", "keepdim", "correction")
    given = dict(zip(names, args))
    given.update(kwargs)
    return (given.get("x"), given.get("dim"), given.get("keepdim", False),
            given.get("correction", 0))


def _composed_var(x: GlobalTensor, axes: tuple[int, ...], keepdim: bool,
                  correction: float) -> GlobalTensor:
    """var as global ops; a half-width ``x`` on its float32 copy, the result rounded once
    (its mean rounded to the half dtype would shift every centred value by up to half an
    ulp of the mean, which can be most of the spread)."""
    count = math.prod(x.shape[d] for d in axes)
    xw = astype(x, float32) if is_half(x.dtype) else x
    centred = sub(xw, mean(xw, axes, keepdim=True))
    out = sum_(mul(centred, centred), axes, keepdim=keepdim) / max(count - correction, 0)
    return out if xw is x else astype(out, x.dtype)


var = _Var("var", _var, VAR, doc=(
    "Variance of ``x`` over ``dim`` (an int, a tuple of ints, or None for all dims): "
    "``sum((x - mean)**2) / (count - correction)``, as ``torch.var`` (signatures: "
    "``var.table`` when the reduced dims are held whole; when a mesh axis splits one, a "
    "mean all-reduce of the reduced shape and a partial-sum result, nothing gathered)."))


def _sum_exp(x: Any, m: Any, dim: int) -> OpCall:
    """Build the OpCall of ``sum_exp``."""
    d = norm_dim("sum_exp", dim, x.ndim)
    kshape = tuple(1 if k == d else n for k, n in enumerate(x.shape))
    if m.shape != kshape:
        raise ValueError(f"sum_exp: m has shape {m.shape}, expected {kshape}")
    # float32 for a half-width x: the partial sums of the normaliser travel and are
    # added up in float32, and softmax_finish rounds its result once
    dtype = accumulation_dtype(x.dtype)

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, mx = local
        return xp.sum(xp.exp(a - mx), axis=d, keepdims=True)

    dims = {"d": tuple(DimMatch((k, k), k) for k in range(x.ndim) if k != d),
            "r": (DimMatch((d, None), None),)}
    return OpCall("sum_exp", (x, m), SUM_EXP, dims, kshape, dtype, kernel,
                  params=f"dim={d}", labels=("x", "m"))


sum_exp = GlobalOp("sum_exp", _sum_exp, SUM_EXP, doc=(
    "``sum_exp(x, m, dim)``: ``sum(exp(x - m), dim, keepdim=True)`` for ``m`` of the "
    "reduced shape (a step of softmax on a split dim; float32 for a half-width ``x``)."))


def _softmax_finish(x: Any, m: Any, s: Any, log: bool) -> OpCall:
    """Build the OpCall of ``softmax_finish``."""
    name = "softmax_finish"
    if not (x.ndim == m.ndim == s.ndim):
        raise ValueError(f"{name}: x {x.shape}, m {m.shape} and s {s.shape} differ in dims")
    dtype = x.dtype

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, mx, sx = local
        return (a - mx) - xp.log(sx) if log else xp.exp(a - mx) / sx

    dims = {"d": broadcast_matches([x.shape, m.shape, s.shape], x.shape)}
    return OpCall(name, (x, m, s), SOFTMAX_FINISH, dims, x.shape, dtype, kernel,
                  params=f"log={bool(log)}", labels=("x", "m", "s"))


softmax_finish = GlobalOp("softmax_finish", _softmax_finish, SOFTMAX_FINISH, doc=(
    "``softmax_finish(x, m, s, log)``: ``exp(x - m) / s`` (``log``: ``x - m - log(s)``), "
    "``m`` and ``s`` broadcast along the softmax dim (a step of softmax on a split dim)."))


def reduced(x: GlobalTensor) -> GlobalTensor:
    """``x`` with each partial mesh axis made broadcast (an all-reduce; ``x`` itself when it
    has none)."""
    sbp = tuple(B if isinstance(s, Partial) else s for s in x.sbp)
    return x if sbp == x.sbp else x.to_global(sbp=sbp)


class _Softmax(GlobalOp):
    """softmax / log_softmax: one op, or three when the softmax dim is split."""

    def __init__(self, name: str, build: Any, log: bool) -> None:
        super().__init__(name, build, SOFTMAX, doc=(
            f"``{name}`` of a global tensor along ``dim`` (signatures: ``{name}.table`` "
            f"when ``dim`` is not split; when it is, a max all-reduce and a sum all-reduce of "
            f"the reduced shape, nothing gathered)."))
        self.log = log

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_modes().autocast.enabled:  # as GlobalOp.__call__: float32 operands inside autocast
            args, kwargs = autocast.cast_operands(self.name, args, kwargs)
        x = args[0] if args else kwargs.get("x")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
        if isinstance(x, GlobalTensor) and isinstance(dim, (int, np.integer)) \
                and not isinstance(dim, (bool, np.bool_)) and -x.ndim <= dim < x.ndim \
                and any(isinstance(s, Split) and s.dim == dim % x.ndim for s in x.sbp):
            call = self.build(*args, **kwargs)  # checks the arguments alike on every rank
            d = int(dim) % x.ndim
            with no_grad():
                xf = x if x.dtype == call.out_dtype else x.astype(call.out_dtype)
                m = reduced(max_(xf, d, keepdim=True))  # used twice: reduced once
                s = sum_exp(xf, m, d)
                out = softmax_finish(xf, m, s, self.log)
            return record_op(self.name, (x,), args, kwargs, out)
        return super().__call__(*args, **kwargs)


def softmax_into(xp: ModuleType, a: Any, d: int, out: Any, scratch: Scratch,
                 log: bool) -> None:
    """``softmax(a)`` (``log``: ``log_softmax(a)``) along dim ``d`` written into ``out``
    (``a``'s shape and dtype), with the max and the sum along ``d`` (and log_softmax's
    exponentials) as temporaries 0 to 2 from ``scratch``."""
    red = a.shape[:d] + (1,) + a.shape[d + 1:]
    m = scratch.get(xp, red, out.dtype, 0)
    xp.max(a, axis=d, keepdims=True, out=m)
    xp.subtract(a, m, out=out)
    s = scratch.get(xp, red, out.dtype, 1)
    if log:
        e = scratch.get(xp, a.shape, out.dtype, 2)
        xp.exp(out, out=e)
        xp.sum(e, axis=d, keepdims=True, out=s)
        xp.log(s, out=s)
        out -= s
        return
    xp.exp(out, out=out)  # in place: the scores are the largest arrays of attention
    xp.sum(out, axis=d, keepdims=True, out=s)
    out /= s


def _softmax(name: str, log: bool) -> GlobalOp:
    def build(x: Any, dim: Any = -1) -> OpCall:
        x = tensor_arg(name, x)
        d = norm_dim(name, dim, x.ndim)
        if x.shape[d] == 0:
            raise ValueError(f"{name}: dim {d} of a tensor of shape {x.shape} is empty")
        dtype = probe_dtype(name, lambda z: np.exp(z), x)

        # the eager kernel is this form with new arrays, so eager and replayed results
        # are bit-identical
        def into(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...], out: Any,
                 scratch: Scratch) -> None:
            softmax_into(xp, as_dtype(local[0], dtype), d, out, scratch, log)

        # a half-width x computes in float32 (rounded once by local_result)
        kernel = written_into(into, accumulation_dtype(dtype))

        dims = {"d": tuple(DimMatch((k,), k) for k in range(x.ndim) if k != d)}
        return OpCall(name, (x,), SOFTMAX, dims, x.shape, dtype, kernel, params=f"dim={dim!r}",
                      labels=("x",))

    build.__doc__ = f"Build the OpCall of ``{name}``."
    return _Softmax(name, build, log)


softmax = _softmax("softmax", log=False)
log_softmax = _softmax("log_softmax", log=True)
