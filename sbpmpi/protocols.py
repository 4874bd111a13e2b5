"""Python and NumPy protocols of GlobalTensor: truth value, scalars, ufuncs, array functions.

- ``bool(x)``, ``float(x)``, ``int(x)``, ``complex(x)``, ``operator.index(x)`` follow
  NumPy: the value of a one-element (``bool``) or 0-d (the others) tensor, gathered
  collectively; otherwise the error NumPy raises, on every rank (it depends on
  the global shape only, so no rank goes on alone).
- NumPy ufuncs (NEP 13: ``np.exp(x)``, ``np.sin(x)``, ``np.add(x, 1)``,
  ``np.float64(2) * x``) run as the sbpmpi op the op registry names for them and return
  GlobalTensors. ``out=`` a GlobalTensor writes the result into it (NumPy's
  ``same_kind`` casting; it keeps its layout); ``out=`` a NumPy array, ``where=`` and
  ufunc methods (``np.add.reduce``) are refused with a TypeError naming them.
- NumPy functions (NEP 18: ``np.sum(x, axis=0)``, ``np.mean``, ``np.var``, ``np.max``,
  ``np.min``, ``np.transpose``, ``np.reshape``, ``np.concatenate``, ``np.where``,
  ``np.round``, ...) run as the registry's ops; those no single op answers (``np.unique``,
  ``np.atleast_2d``, ``np.sort``, ``np.einsum``, ...: the registry's ``COMPOSED`` rows)
  run as the function above the ops that the registry names for them. :data:`ADAPTERS`
  maps NumPy's arguments, :data:`FUNCTIONS` is made from the registry; ``np.shape``,
  ``np.ndim`` and ``np.size`` read metadata; any other raises a TypeError naming it and
  suggesting ``x.numpy()``.
- ``np.asarray(x)`` gathers the global value on every rank (collective), honouring
  NumPy 2's ``copy=``: ``copy=False`` raises, since the gathered array is always new.
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .ops.registry import COMPOSED, REGISTRY, ComposedFunction
from .tensor import GlobalTensor

__all__ = ["UFUNCS", "FUNCTIONS", "METADATA_FUNCTIONS", "ADAPTERS", "to_bool", "to_scalar",
           "to_index", "array", "array_ufunc", "array_function", "write_into", "iterate"]


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


def iterate(x: GlobalTensor) -> Iterator[GlobalTensor]:
    """``iter(x)``: ``x[0]``, ``x[1]``, ... as NumPy iterates over dim 0 (``x`` has a dim).

    Where no mesh axis splits dim 0 each item is a view of ``x`` (no communication). Where
    one does, the rows are gathered once on the first step (one conversion of dim 0's
    splits to broadcast, instead of one per item) and each item is a write-through copy of
    ``x[i]``: a write into it reaches ``x`` as a view's would."""
    from .core.sbp import Split, broadcast

    if not any(isinstance(s, Split) and s.dim == 0 for s in x.sbp):
        for i in range(x.shape[0]):
            yield x[i]
        return
    rows = x.to_global(sbp=[broadcast if isinstance(s, Split) and s.dim == 0 else s
                            for s in x.sbp])
    for i in range(x.shape[0]):
        item = rows[i]
        item._mark_write_through(x, i)
        yield item


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
    if out._copy_of is None:
        out._check_writable(f"{name}(..., out=x)")
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
    if out._copy_of is not None:  # out is the copy x[key]: the values go to x too
        from .ops.operators import write_through

        write_through(out, f"{name}(..., out=x)", lambda current: value)
        return out
    if value.layout != out.layout:
        value = value.to_global(placement=out.placement, sbp=out.sbp)
    out._write_data(value.to_local())  # into out's buffer: its views see the values
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


# -- NumPy functions composed of ops (NEP 18) ---------------------------------------------------
#
# The registry's COMPOSED rows: ``np.unique``, ``np.atleast_1d``, ``np.sort``, ... answered by
# a function above the ops (``sbpmpi.array_api``'s, mostly) that calls registered ops. SciPy
# and scikit-learn call them on arrays their array-API paths do not convert
# (``scipy.signal.lfilter``'s ``np.atleast_1d``, ``np.unique`` in label handling). Each
# adapter below maps NumPy's arguments to the target's, as the ops' adapters above do.

def _target(row: ComposedFunction) -> Callable[..., Any]:
    """The function ``row.target`` (``"module:qualified.name"``), imported on first call:
    the targets sit beside or above this module (``sbpmpi.array_api`` imports it)."""
    module, _, qualname = row.target.partition(":")
    found: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not found:
            f: Any = importlib.import_module(module)
            for part in qualname.split("."):
                f = getattr(f, part)
            found.append(f)
        return found[0](*args, **kwargs)
    call.__name__ = call.__qualname__ = qualname
    return call


def _xp() -> Any:
    from . import array_api

    return array_api


def _flat_axis(a: Any, axis: Any) -> tuple[Any, Any]:
    """(array, axis): NumPy's ``axis=None`` of the order functions flattens first."""
    if axis is None:
        return _xp().reshape(a, (-1,)), -1
    return a, axis


def _atleast_shape(shape: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """The shape ``np.atleast_<ndim>d`` gives an array of ``shape`` (NumPy's rule: a 1-D
    ``(N,)`` becomes ``(1, N)`` and ``(1, N, 1)``, a 2-D ``(M, N)`` becomes ``(M, N, 1)``)."""
    if len(shape) >= ndim:
        return shape
    if len(shape) == 0:
        return (1,) * ndim
    if ndim == 2 or len(shape) == 2:
        return (1,) + shape if ndim == 2 else shape + (1,)
    return (1,) + shape + (1,)


def _atleast(fname: str, f: Any) -> Callable[..., Any]:
    ndim = int(fname[len("atleast_")])

    def impl(*arys: Any) -> Any:
        out = [f(a, _atleast_shape(a.shape, ndim)) if isinstance(a, GlobalTensor)
               and a.ndim < ndim else a if isinstance(a, GlobalTensor)
               else getattr(np, fname)(a) for a in arys]
        return out[0] if len(out) == 1 else tuple(out)
    return impl


def _unique(fname: str, f: Any) -> Callable[..., Any]:
    def impl(ar: Any, return_index: bool = False, return_inverse: bool = False,
             return_counts: bool = False, axis: Any = None, *, equal_nan: bool = True,
             sorted: bool = True) -> Any:  # noqa: A002 - NumPy's name
        if axis is not None:
            raise TypeError(f"np.unique: axis={axis!r} (unique rows or columns) is not "
                            f"supported on GlobalTensors (axis=None only); use x.numpy() "
                            f"for the NumPy version")
        # sorted=False lets NumPy return the values in any order: sorted is one of them
        return f(ar, bool(return_index), bool(return_inverse), bool(return_counts),
                 bool(equal_nan))
    return impl


def _sorting(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *,
             stable: Any = None) -> Any:
        _no(fname, order=order)
        a, axis = _flat_axis(a, axis)
        return f(a, axis=axis, stable=True if stable is None else bool(stable))
    return impl


def _arg_extreme(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> Any:
        _no(fname, out=out)
        return f(a, axis=axis, keepdims=bool(keepdims))
    return impl


def _accumulate(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, axis: Any = None, dtype: Any = None, out: Any = None) -> Any:
        _no(fname, out=out)
        a, axis = _flat_axis(a, axis)
        return f(a, axis=axis, dtype=dtype)
    return impl


def _prod(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
             keepdims: Any = False, **kw: Any) -> Any:
        _no(fname, out=out, **kw)
        return f(a, axis=axis, dtype=dtype, keepdims=bool(keepdims))
    return impl


def _std(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
             keepdims: Any = False, **kw: Any) -> Any:
        _no(fname, out=out, **kw)
        if dtype is not None:
            a = _xp().astype(a, dtype)
        return f(a, axis=axis, correction=ddof, keepdims=bool(keepdims))
    return impl


def _logical(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, axis: Any = None, out: Any = None, keepdims: Any = False,
             **kw: Any) -> Any:
        _no(fname, out=out, **kw)
        return f(a, axis=axis, keepdims=bool(keepdims))
    return impl


def _positional(*names: str) -> Adapter:
    """The adapter of NumPy's ``np.<fname>(a, p1, p2, ...)`` -> ``f(a, ...)``: a name
    written ``"/p"`` is passed by position (the standard's positional-only parameters), the
    others by keyword; any other keyword is refused, ``None`` values are left to ``f``'s
    defaults."""
    plain = [n.lstrip("/") for n in names]

    def adapter(fname: str, f: Any) -> Callable[..., Any]:
        def impl(a: Any, *args: Any, **kw: Any) -> Any:
            if len(args) > len(names):
                raise TypeError(f"np.{fname}: at most {len(names) + 1} positional arguments "
                                f"on GlobalTensors, got {len(args) + 1}")
            given = dict(zip(plain, args))
            for k, v in kw.items():
                if k not in plain:
                    _no(fname, **{k: v})
                    continue
                given[k] = v
            pos = [given.pop(n.lstrip("/")) for n in names if n.startswith("/")
                   and n.lstrip("/") in given]
            return f(a, *pos, **{k: v for k, v in given.items() if v is not None})
        return impl
    return adapter


def _squeeze(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, axis: Any = None) -> Any:
        if axis is None:
            axis = tuple(d for d, n in enumerate(a.shape) if n == 1)
        return f(a, axis=axis)
    return impl


def _expand_dims(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, axis: Any) -> Any:
        axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        n = a.ndim + len(axes)
        for ax in sorted(int(x) % n if -n <= x < n else x for x in axes):
            a = f(a, axis=ax)
        return a
    return impl


def _stack(fname: str, f: Any) -> Callable[..., Any]:
    def impl(arrays: Any, axis: Any = 0, out: Any = None, **kw: Any) -> Any:
        _no(fname, out=out, **kw)
        return f(list(arrays), axis=axis)
    return impl


def _moveaxis(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, source: Any, destination: Any) -> Any:
        return f(a, source, destination)
    return impl


def _take(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, indices: Any, axis: Any = None, out: Any = None,
             mode: Any = "raise") -> Any:
        _no(fname, out=out)
        if mode != "raise":
            raise TypeError(f"np.take: mode={mode!r} is not supported on GlobalTensors "
                            f"('raise' only)")
        if not isinstance(indices, GlobalTensor):
            indices = _xp().asarray(np.asarray(indices), device=a.placement)
        if axis is None:
            a, axis = _xp().reshape(a, (-1,)), 0
        return f(a, indices, axis=axis)
    return impl


def _shape_argument(fname: str, f: Any) -> Callable[..., Any]:
    """``np.tile(a, reps)``, ``np.broadcast_to(a, shape)``: an int or a sequence of ints."""
    def impl(a: Any, shape: Any, subok: Any = False) -> Any:
        _no(fname, subok=subok)
        return f(a, tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),))
    return impl


def _like(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, *args: Any, dtype: Any = None, order: Any = "K", subok: Any = True,
             shape: Any = None, **kw: Any) -> Any:
        _no(fname, shape=shape, **kw)
        if fname == "full_like":
            fill, rest = args[0], args[1:]
            return f(a, fill, dtype=rest[0] if rest else dtype)
        return f(a, dtype=args[0] if args else dtype)
    return impl


def _clip(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, *,
             min: Any = None, max: Any = None, **kw: Any) -> Any:  # noqa: A002 - NumPy's
        _no(fname, out=out, **kw)
        return f(a, a_min if a_min is not None else min, a_max if a_max is not None else max)
    return impl


def _copy(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any, order: Any = "K", subok: Any = False) -> Any:
        return f(a)
    return impl


def _einsum(fname: str, f: Any) -> Callable[..., Any]:
    def impl(subscripts: Any, *operands: Any, out: Any = None, optimize: Any = False,
             **kw: Any) -> Any:
        _no(fname, out=out, **kw)  # optimize: the contraction order is ours (left to right)
        return f(subscripts, *operands)
    return impl


def _nonzero(fname: str, f: Any) -> Callable[..., Any]:
    def impl(a: Any) -> Any:
        return f(a)
    return impl


ADAPTERS.update({
    "unique": _unique, "atleast_1d": _atleast, "atleast_2d": _atleast, "atleast_3d": _atleast,
    "expand_dims": _expand_dims, "squeeze": _squeeze, "stack": _stack, "moveaxis": _moveaxis,
    "flip": _positional("axis"), "roll": _positional("/shift", "axis"),
    "tile": _shape_argument, "repeat": _positional("/repeats", "axis"),
    "broadcast_to": _shape_argument, "sort": _sorting, "argsort": _sorting,
    "argmax": _arg_extreme, "argmin": _arg_extreme, "cumsum": _accumulate,
    "cumprod": _accumulate, "prod": _prod, "std": _std, "all": _logical, "any": _logical,
    "count_nonzero": _positional("axis", "keepdims"),
    "diff": _positional("n", "axis", "prepend", "append"), "take": _take,
    "take_along_axis": _positional("/indices", "axis"),
    "searchsorted": _positional("/v", "side", "sorter"), "nonzero": _nonzero,
    "tensordot": _positional("/b", "axes"), "zeros_like": _like, "ones_like": _like,
    "empty_like": _like, "full_like": _like, "copy": _copy, "clip": _clip, "einsum": _einsum,
})

#: NumPy function -> its sbpmpi implementation, made from the op registry: the ops'
#: NumPy functions (``entry.functions``) and the functions composed of ops
#: (``registry.COMPOSED``), each through its adapter.
FUNCTIONS: dict[Any, Callable[..., Any]] = {
    **{getattr(np, name): ADAPTERS.get(name, _elementwise)(name, entry.op)
       for entry in REGISTRY.values() for name in entry.functions},
    **{getattr(np, name): ADAPTERS[name](name, _target(row)) for name, row in COMPOSED.items()},
}

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
