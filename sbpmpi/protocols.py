"""Python and NumPy protocols of GlobalTensor: truth value, scalars, ufuncs, array functions.

- ``bool(x)``, ``float(x)``, ``int(x)``, ``complex(x)``, ``operator.index(x)`` follow
  NumPy: the value of a one-element (``bool``) or 0-d (the others) tensor, gathered
  collectively; otherwise the error NumPy raises, on every rank (it depends on the
  global shape only, so no rank goes on alone).
- NumPy ufuncs (NEP 13: ``np.exp(x)``, ``np.add(x, 1)``, ``np.float64(2) * x``) run as
  sbpmpi ops and return GlobalTensors; ``out=``, ``where=`` and ufunc methods
  (``np.add.reduce``) are refused with a TypeError naming them.
- NumPy functions (NEP 18: ``np.sum(x, axis=0)``, ``np.mean``, ``np.max``, ``np.min``,
  ``np.transpose``, ``np.reshape``, ``np.concatenate``, ``np.where``, ...) run as sbpmpi
  ops; any other raises a TypeError naming it and suggesting ``x.numpy()``.
- ``np.asarray(x)`` gathers the global value on every rank (collective), honouring
  NumPy 2's ``copy=``: ``copy=False`` raises, since the gathered array is always new.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from .tensor import GlobalTensor

__all__ = ["UFUNCS", "FUNCTIONS", "to_bool", "to_scalar", "to_index", "array", "array_ufunc",
           "array_function"]


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

#: NumPy ufunc -> sbpmpi op name
UFUNCS: dict[np.ufunc, str] = {
    np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div",
    np.power: "pow", np.maximum: "maximum", np.minimum: "minimum", np.matmul: "matmul",
    np.equal: "eq", np.not_equal: "ne", np.less: "lt", np.less_equal: "le",
    np.greater: "gt", np.greater_equal: "ge", np.negative: "neg", np.absolute: "abs",
    np.exp: "exp", np.log: "log", np.sqrt: "sqrt", np.tanh: "tanh",
}


def _unsupported(what: str) -> TypeError:
    return TypeError(f"{what} is not supported on sbpmpi GlobalTensors; gather the value with "
                     f"x.numpy() (collective, every rank gets the whole array) and use NumPy, "
                     f"or use the sbpmpi ops (sm.ops)")


def array_ufunc(ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """Run ``ufunc(*inputs)`` as the matching sbpmpi op; TypeError for what has none."""
    from . import ops

    name = f"np.{ufunc.__name__}"
    if method != "__call__":
        raise _unsupported(f"{name}.{method}")
    if kwargs.get("out") is not None:
        raise TypeError(f"{name}(..., out=...): out= is not supported on GlobalTensors (the "
                        f"result is a new GlobalTensor); write y = {name}(x) instead")
    extra = sorted(k for k, v in kwargs.items() if k != "out" and not (k == "where" and v is True))
    if extra:
        raise TypeError(f"{name}: keyword argument{'s' if len(extra) > 1 else ''} "
                        f"{', '.join(extra)} {'are' if len(extra) > 1 else 'is'} not supported "
                        f"on GlobalTensors; cast with x.astype(dtype) before or after")
    op = UFUNCS.get(ufunc)
    if op is None:
        raise _unsupported(name)
    return getattr(ops, op)(*inputs)


# -- array functions (NEP 18) -------------------------------------------------------------------

def _no(name: str, **given: Any) -> None:
    bad = [k for k, v in given.items() if v is not None and v is not False]
    if bad:
        raise TypeError(f"np.{name}: {', '.join(f'{k}=' for k in bad)} not supported on "
                        f"GlobalTensors; use x.numpy() for the NumPy version")


def _reduction(op: str) -> Callable[..., Any]:
    def f(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
          keepdims: Any = False, **kw: Any) -> Any:
        from . import ops

        _no(op, dtype=dtype, out=out, **kw)
        return getattr(ops, op)(a, axis, keepdim=bool(keepdims))
    return f


def _minmax(op: str) -> Callable[..., Any]:
    def f(a: Any, axis: Any = None, out: Any = None, keepdims: Any = False, **kw: Any) -> Any:
        from . import ops

        _no(op, out=out, **kw)
        return getattr(ops, op)(a, axis, keepdim=bool(keepdims))
    return f


def _transpose(a: Any, axes: Any = None) -> Any:
    from . import ops

    return ops.transpose(a) if axes is None else ops.transpose(a, *axes)


def _reshape(a: Any, *args: Any, **kw: Any) -> Any:
    from . import ops

    shape = kw.pop("shape", kw.pop("newshape", None))
    if args:
        shape, args = args[0], args[1:]
    order = kw.pop("order", args[0] if args else "C")
    _no("reshape", **kw)
    if order != "C":
        raise TypeError(f"np.reshape: order={order!r} is not supported on GlobalTensors "
                        f"(C order only)")
    return ops.reshape(a, shape)


def _concatenate(arrays: Any, axis: Any = 0, out: Any = None, **kw: Any) -> Any:
    from . import ops

    _no("concatenate", out=out, **kw)
    if axis is None:
        raise TypeError("np.concatenate: axis=None (flattening) is not supported on "
                        "GlobalTensors; reshape each to 1-D first")
    return ops.cat(list(arrays), axis)


def _where(cond: Any, *xy: Any) -> Any:
    from . import ops

    if len(xy) != 2:
        raise TypeError("np.where(cond) (the indices of true elements) is not supported on "
                        "GlobalTensors; use np.where(cond, x, y), or x.numpy()")
    return ops.where(cond, *xy)


def _astype(x: Any, dtype: Any, copy: Any = True, **kw: Any) -> Any:
    from . import ops

    _no("astype", **kw)
    return ops.astype(x, dtype)


def _ufunc_function(name: str) -> Callable[..., Any]:
    def f(*args: Any, **kw: Any) -> Any:
        return array_ufunc(getattr(np, name), "__call__", *args, **kw)
    return f


#: NumPy function -> its sbpmpi implementation
FUNCTIONS: dict[Any, Callable[..., Any]] = {
    np.sum: _reduction("sum"), np.mean: _reduction("mean"),
    np.max: _minmax("max"), np.min: _minmax("min"),
    np.amax: _minmax("max"), np.amin: _minmax("min"),
    np.transpose: _transpose, np.reshape: _reshape, np.concatenate: _concatenate,
    np.where: _where, np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim,
    np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
}
if hasattr(np, "astype"):  # NumPy >= 2.1
    FUNCTIONS[np.astype] = _astype
if hasattr(np, "concat"):  # NumPy >= 2.0
    FUNCTIONS[np.concat] = _concatenate


def array_function(func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """NEP 18 dispatch: the sbpmpi version of ``func``, or a TypeError naming it."""
    impl = FUNCTIONS.get(func)
    if impl is None:
        raise _unsupported(f"np.{getattr(func, '__name__', func)}")
    return impl(*args, **kwargs)
