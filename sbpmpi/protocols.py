"""Python and NumPy protocols of GlobalTensor: truth value, scalars, ufuncs, array functions.

- ``bool(x)``, ``float(x)``, ``int(x)``, ``complex(x)``, ``operator.index(x)`` follow
  NumPy: the value of a one-element (``bool``) or 0-d (the others) tensor, gathered
  collectively; otherwise the error NumPy raises, on every rank (it depends on the
  global shape only, so no rank goes on alone).
- NumPy ufuncs (NEP 13: ``np.exp(x)``, ``np.sin(x)``, ``np.add(x, 1)``,
  ``np.float64(2) * x``) run as the sbpmpi op the op registry names for them and return
  GlobalTensors. ``out=`` a GlobalTensor writes the result into it (NumPy's
  ``same_kind`` casting; it keeps its layout); ``out=`` a NumPy array, ``where=`` and
  ufunc methods (``np.add.reduce``) are refused with a TypeError naming them.
- NumPy functions (NEP 18: ``np.sum(x, axis=0)``, ``np.mean``, ``np.var``, ``np.max``,
  ``np.min``, ``np.transpose``, ``np.reshape``, ``np.concatenate``, ``np.where``,
  ``np.round``, ...) run as the registry's ops (:data:`ADAPTERS` maps NumPy's arguments);
  ``np.shape``, ``np.ndim`` and ``np.size`` read metadata; any other raises a TypeError
  naming it and suggesting ``x.numpy()``.
- ``np.asarray(x)`` gathers the global value on every rank (collective), honouring
  NumPy 2's ``copy=``: ``copy=False`` raises, since the gathered array is always new.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from .ops.registry import REGISTRY
from .tensor import GlobalTensor

__all__ = ["UFUNCS", "FUNCTIONS", "METADATA_FUNCTIONS", "ADAPTERS", "to_bool", "to_scalar",
           "to_index", "array", "array_ufunc", "array_function", "write_into"]


# -- scalars ---------------------------------------------------------------------------------

def _value(x: GlobalTensor) -> Any:
    return x.numpy().reshape(()).item()


def to_bool(x: GlobalTensor) -> bool:
    """``bool(x)`` as NumPy: one element -> its truth value (collective); else ValueError."""
    if x.size == 0:
        raise ValueError(f"The truth value of an empty global tensor (shape {x.shape}) is "
                         f"ambiguous. Use `x.size > 0` to check that a tensor is not empty.")
    if x.size > 1:
        raise ValueError(f"The truth value of a global tensor with more than one element "
                         f"(shape {x.shape}) is ambiguous. Use (x != 0).max() for any() or "
                         f"(x != 0).min() for all().")
    return bool(_value(x))


def to_scalar(x: GlobalTensor, kind: type) -> Any:
    """``float(x)``, ``int(x)``, ``complex(x)`` as NumPy: 0-d only (collective)."""
    if x.ndim != 0:
        raise TypeError(f"only 0-dimensional global tensors can be converted to Python "
                        f"scalars, got shape {x.shape} ({kind.__name__}(x)); use "
                        f"x.reshape(()) for a one-element tensor, or x.item()")
    return kind(_value(x))


def to_index(x: GlobalTensor) -> int:
    """``operator.index(x)`` as NumPy: a 0-d integer tensor only (collective)."""
    if x.ndim != 0 or x.dtype.kind not in "iu":
        raise TypeError(f"only integer scalar global tensors can be converted to a scalar "
                        f"index, got shape {x.shape} and dtype {x.dtype}")
    return operator.index(_value(x))


def array(x: GlobalTensor, dtype: Any = None, copy: Any = None) -> np.ndarray:
    """``np.asarray(x)``: the global value on every rank (collective); ``copy=False`` raises."""
    if copy is False:
        raise ValueError("np.asarray(x, copy=False): a GlobalTensor cannot be viewed as a NumPy "
                         "array without a copy (its value is spread over the ranks); use "
                         "x.numpy() (collective) or copy=None")
    a = x.numpy()
    return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)


# -- ufuncs (NEP 13) ----------------------------------------------------------------------------

#: NumPy ufunc -> the sbpmpi op answering it (from the op registry's entries).
UFUNCS: dict[np.ufunc, Any] = {getattr(np, name): entry.op for entry in REGISTRY.values()
                               for name in entry.ufuncs}


def _unsupported(what: str) -> TypeError:
    return TypeError(f"{what} is not supported on sbpmpi GlobalTensors; gather the value with "
                     f"x.numpy() (collective, every rank gets the whole array) and use NumPy, "
                     f"or use the sbpmpi ops (sm.ops)")


def _out_tensor(name: str, out: Any) -> GlobalTensor | None:
    """The GlobalTensor of ``out=`` (NEP 13 passes a tuple), None when none is given."""
    if isinstance(out, tuple):
        if len(out) != 1:
            raise TypeError(f"{name}(..., out=...): one output array expected, got {len(out)}")
        out = out[0]
    if out is None:
        return None
    if not isinstance(out, GlobalTensor):
        raise TypeError(f"{name}(..., out=...): out must be a GlobalTensor (the result is "
                        f"written into it, in its layout), got {type(out).__name__}; a NumPy "
                        f"array cannot hold a global value: write y = {name}(x) and, for "
                        f"the whole array on every rank, y.numpy()")
    return out


def write_into(name: str, out: GlobalTensor, value: GlobalTensor) -> GlobalTensor:
    """``value`` written into ``out`` as ``np.<ufunc>(..., out=out)`` does: NumPy's
    ``same_kind`` casting, ``value`` broadcast to out's shape, ``out`` keeping its layout
    (collective when the value's layout differs). Returns ``out`` (the same object)."""
    if out.requires_grad:
        raise RuntimeError(f"{name}(..., out=x): x requires grad; writes into a tensor are "
                           f"not recorded by autograd")
    if not np.can_cast(value.dtype, out.dtype, casting="same_kind"):
        raise TypeError(f"{name}(..., out=...): cannot cast the result of dtype {value.dtype} "
                        f"to out's dtype {out.dtype} with casting rule 'same_kind'")
    try:
        shape = np.broadcast_shapes(value.shape, out.shape)
    except ValueError:
        shape = None
    if shape != out.shape:
        raise ValueError(f"{name}(..., out=...): the result of shape {value.shape} does not "
                         f"broadcast to out's shape {out.shape}")
    from . import ops

    if value.dtype != out.dtype:
        value = ops.astype(value, out.dtype)
    if value.shape != out.shape:
        from .array_api import broadcast_to

        value = broadcast_to(value, out.shape)
    if value.layout != out.layout:
        value = value.to_global(placement=out.placement, sbp=out.sbp)
    out._set_data(value.to_local(), value.layout)
    out._set_node(None)
    return out


def array_ufunc(ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """Run ``ufunc(*inputs)`` as the matching sbpmpi op (into ``out=``, a GlobalTensor, when
    given); TypeError for what has none."""
    name = f"np.{ufunc.__name__}"
    if method != "__call__":
        raise _unsupported(f"{name}.{method}")
    extra = sorted(k for k, v in kwargs.items() if k != "out" and not (k == "where" and v is True))
    if extra:
        raise TypeError(f"{name}: keyword argument{'s' if len(extra) > 1 else ''} "
                        f"{', '.join(extra)} {'are' if len(extra) > 1 else 'is'} not supported "
                        f"on GlobalTensors; cast with x.astype(dtype) before or after")
    out = _out_tensor(name, kwargs.get("out"))
    op = UFUNCS.get(ufunc)
    if op is None:
        raise _unsupported(name)
    value = op(*inputs)
    return value if out is None else write_into(name, out, value)


# -- array functions (NEP 18) -------------------------------------------------------------------

def _no(name: str, **given: Any) -> None:
    bad = [k for k, v in given.items() if v is not None and v is not False]
    if bad:
        raise TypeError(f"np.{name}: {', '.join(f'{k}=' for k in bad)} not supported on "
                        f"GlobalTensors; use x.numpy() for the NumPy version")


# How each NumPy function's arguments reach its op (the registry says which op answers).
Adapter = Callable[[str, Any], Callable[..., Any]]


def _reduction(fname: str, op: Any) -> Callable[..., Any]:
    def f(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: Any = False, **kw: Any) -> Any:
        _no(fname, dtype=dtype, out=out, **kw)
        return op(a, axis, keepdim=bool(keepdims))
    return f


def _minmax(fname: str, op: Any) -> Callable[..., Any]:
    def f(a: Any, axis: Any = None, out: Any = None, keepdims: Any = False, **kw: Any) -> Any:
        _no(fname, out=out, **kw)
        return op(a, axis, keepdim=bool(keepdims))
    return f


def _var(fname: str, op: Any) -> Callable[..., Any]:
    def f(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
          keepdims: Any = False, **kw: Any) -> Any:
        _no(fname, dtype=dtype, out=out, **kw)
        return op(a, axis, keepdim=bool(keepdims), correction=ddof)
    return f


def _transpose(fname: str, op: Any) -> Callable[..., Any]:
    def f(a: Any, axes: Any = None) -> Any:
        return op(a) if axes is None else op(a, *axes)
    return f


def _reshape(fname: str, op: Any) -> Callable[..., Any]:
    def f(a: Any, *args: Any, **kw: Any) -> Any:
        shape = kw.pop("shape", kw.pop("newshape", None))
        if args:
            shape, args = args[0], args[1:]
        order = kw.pop("order", args[0] if args else "C")
        _no(fname, **kw)
        if order != "C":
            raise TypeError(f"np.reshape: order={order!r} is not supported on GlobalTensors "
                            f"(C order only)")
        return op(a, shape)
    return f


def _concatenate(fname: str, op: Any) -> Callable[..., Any]:
    def f(arrays: Any, axis: Any = 0, out: Any = None, **kw: Any) -> Any:
        _no(fname, out=out, **kw)
        if axis is None:
            raise TypeError(f"np.{fname}: axis=None (flattening) is not supported on "
                            "GlobalTensors; reshape each to 1-D first")
        return op(list(arrays), axis)
    return f


def _where(fname: str, op: Any) -> Callable[..., Any]:
    def f(cond: Any, *xy: Any) -> Any:
        if len(xy) != 2:
            raise TypeError("np.where(cond) (the indices of true elements) is not supported on "
                            "GlobalTensors; use np.where(cond, x, y), or x.numpy()")
        return op(cond, *xy)
    return f


def _astype(fname: str, op: Any) -> Callable[..., Any]:
    def f(x: Any, dtype: Any, copy: Any = True, **kw: Any) -> Any:
        _no(fname, **kw)
        return op(x, dtype)
    return f


def _round(fname: str, op: Any) -> Callable[..., Any]:
    def f(a: Any, decimals: Any = 0, out: Any = None) -> Any:
        _no(fname, out=out)
        if decimals != 0:
            raise TypeError(f"np.{fname}: decimals={decimals!r} is not supported on "
                            f"GlobalTensors (0 only); scale, round and scale back")
        return op(a)
    return f


def _elementwise(fname: str, op: Any) -> Callable[..., Any]:
    def f(*args: Any, **kw: Any) -> Any:
        _no(fname, **kw)
        return op(*args)
    return f


#: NumPy function name -> how its arguments reach its op (default: positional operands).
ADAPTERS: dict[str, Adapter] = {
    "sum": _reduction, "mean": _reduction, "max": _minmax, "min": _minmax, "amax": _minmax,
    "amin": _minmax, "var": _var, "transpose": _transpose, "reshape": _reshape,
    "concatenate": _concatenate, "concat": _concatenate, "where": _where, "astype": _astype,
    "round": _round,
}

#: NumPy function -> its sbpmpi implementation (from the op registry's entries).
FUNCTIONS: dict[Any, Callable[..., Any]] = {
    getattr(np, name): ADAPTERS.get(name, _elementwise)(name, entry.op)
    for entry in REGISTRY.values() for name in entry.functions}

#: NumPy functions that read metadata only: no op computes them.
METADATA_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim,
    np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
}


def array_function(func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """NEP 18 dispatch: the sbpmpi version of ``func``, or a TypeError naming it."""
    impl = FUNCTIONS.get(func) or METADATA_FUNCTIONS.get(func)
    if impl is None:
        raise _unsupported(f"np.{getattr(func, '__name__', func)}")
    return impl(*args, **kwargs)
