"""Manipulation functions: reshape, permute, expand, squeeze, concat, stack, flip, roll,
broadcast, repeat, tile, unstack.

Those with an sbpmpi op (transpose, reshape, getitem, cat) use it, so a split survives
where the op carries the dim whole; the others hold the dims they move whole on each
rank (see :mod:`._local`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..ops.local import axis_op, broadcast_arrays, broadcast_to, norm_axes, run_local
from ..ops.signature import DimMatch
from ..tensor import GlobalTensor
from ._local import array_arg

__all__ = ["take", "take_along_axis", "diff", "reshape", "permute_dims", "expand_dims", "squeeze", "concat", "stack", "flip",
           "roll", "broadcast_to", "broadcast_arrays", "moveaxis", "repeat", "tile", "unstack"]


def reshape(x: GlobalTensor, /, shape: tuple[int, ...], *, copy: Any = None) -> GlobalTensor:
    """``x`` with a new ``shape`` (row-major; one ``-1`` allowed); always a new array."""
    array_arg("reshape", x)
    if copy is False:
        raise ValueError("reshape: copy=False is not supported (a global array is reshaped "
                         "into a new array)")
    return ops.reshape(x, tuple(shape))  # type: ignore[no-any-return]


def permute_dims(x: GlobalTensor, /, axes: tuple[int, ...]) -> GlobalTensor:
    """``x`` with its axes in the order ``axes``."""
    array_arg("permute_dims", x)
    if x.ndim == 0:
        if tuple(axes) != ():
            raise ValueError(f"permute_dims: axes {axes} for a 0-d array")
        return ops.reshape(x, ())  # type: ignore[no-any-return]
    return ops.transpose(x, *axes)  # type: ignore[no-any-return]


def expand_dims(x: GlobalTensor, /, axis: int = 0) -> GlobalTensor:
    """``x`` with a new axis of size 1 at ``axis`` (in ``[-ndim - 1, ndim]``)."""
    array_arg("expand_dims", x)
    n = x.ndim
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"expand_dims: axis must be an int, got {axis!r}")
    if not -n - 1 <= axis <= n:
        raise IndexError(f"expand_dims: axis {axis} is out of range for an array of {n} dims")
    a = int(axis) % (n + 1)
    return ops.getitem(x, (slice(None),) * a + (None, Ellipsis))  # type: ignore[no-any-return]


def squeeze(x: GlobalTensor, /, axis: int | tuple[int, ...]) -> GlobalTensor:
    """``x`` without the axes ``axis`` (each of size 1)."""
    array_arg("squeeze", x)
    axes = norm_axes("squeeze", axis, x.ndim)
    for d in axes:
        if x.shape[d] != 1:
            raise ValueError(f"squeeze: axis {d} has size {x.shape[d]}, not 1")
    return ops.reshape(x, tuple(n for d, n in enumerate(x.shape) if d not in axes)
                       )  # type: ignore[no-any-return]


def _arrays(name: str, arrays: Any) -> list[GlobalTensor]:
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError(f"{name}: arrays must be a non-empty list or tuple of global arrays")
    return [array_arg(name, a) for a in arrays]


def concat(arrays: Any, /, *, axis: int | None = 0) -> GlobalTensor:
    """The arrays joined along ``axis`` (flattened first when None), in their promoted
    dtype."""
    from ._dtypes import result_type

    xs = _arrays("concat", arrays)
    dt = result_type(*xs)
    if axis is None:
        xs = [ops.reshape(a, (-1,)) for a in xs]
        axis = 0
    xs = [a if a.dtype == dt else ops.astype(a, dt) for a in xs]
    if xs[0].ndim == 0:
        raise ValueError("concat: arrays must have at least one dim (or use axis=None)")
    return ops.cat(xs, axis)  # type: ignore[no-any-return]


def stack(arrays: Any, /, *, axis: int = 0) -> GlobalTensor:
    """The arrays (of one shape) joined along a new ``axis``."""
    xs = _arrays("stack", arrays)
    for i, a in enumerate(xs):
        if a.shape != xs[0].shape:
            raise ValueError(f"stack: arrays[{i}] has shape {a.shape} but arrays[0] has "
                             f"{xs[0].shape}")
    return concat([expand_dims(a, axis=axis) for a in xs], axis=axis)


def flip(x: GlobalTensor, /, *, axis: Any = None) -> GlobalTensor:
    """``x`` with the order of elements along ``axis`` (all axes when None) reversed."""
    array_arg("flip", x)
    axes = norm_axes("flip", axis, x.ndim) if x.ndim else ()
    return axis_op("flip", x, axes, lambda xp, a: xp.flip(a, axis=axes), x.shape, x.dtype,
                   {d: d for d in range(x.ndim)})


def roll(x: GlobalTensor, /, shift: Any, *, axis: Any = None) -> GlobalTensor:
    """``x`` with elements shifted by ``shift`` along ``axis`` (the flattened array when
    None), wrapping around."""
    array_arg("roll", x)
    if axis is None:
        axes = tuple(range(x.ndim))
        return axis_op("roll", x, axes,
                       lambda xp, a: xp.roll(a.reshape(-1), shift).reshape(a.shape),
                       x.shape, x.dtype, {})
    items = axis if isinstance(axis, tuple) else (axis,)
    whole = tuple(sorted({norm_axes("roll", a, x.ndim)[0] for a in items}))
    return axis_op("roll", x, whole, lambda xp, a: xp.roll(a, shift, axis=axis), x.shape,
                   x.dtype, {d: d for d in range(x.ndim)})


def moveaxis(x: GlobalTensor, source: Any, destination: Any, /) -> GlobalTensor:
    """``x`` with the axes ``source`` moved to ``destination`` (the others keep order)."""
    array_arg("moveaxis", x)
    src = source if isinstance(source, tuple) else (source,)
    dst = destination if isinstance(destination, tuple) else (destination,)
    if len(src) != len(dst):
        raise ValueError(f"moveaxis: source {source} and destination {destination} must "
                         f"have the same number of axes")
    s = [norm_axes("moveaxis", a, x.ndim)[0] for a in src]
    d = [norm_axes("moveaxis", a, x.ndim)[0] for a in dst]
    if len(set(s)) != len(s) or len(set(d)) != len(d):
        raise ValueError("moveaxis: repeated axis in source or destination")
    order = [a for a in range(x.ndim) if a not in s]
    for dest, srcd in sorted(zip(d, s)):
        order.insert(dest, srcd)
    return permute_dims(x, tuple(order))


def repeat(x: GlobalTensor, repeats: Any, /, *, axis: int | None = None) -> GlobalTensor:
    """Each element of ``x`` repeated ``repeats`` times (an int, or a global array of one
    count per element along ``axis``; its values are gathered on every rank)."""
    array_arg("repeat", x)
    counts = repeats.numpy() if isinstance(repeats, GlobalTensor) else repeats
    if isinstance(counts, (bool, np.bool_)) or not (
            isinstance(counts, (int, np.integer)) or np.asarray(counts).dtype.kind in "iu"):
        raise TypeError(f"repeat: repeats must be an int or an integer array, got {repeats!r}")
    if np.any(np.asarray(counts) < 0):
        raise ValueError("repeat: repeats must not be negative")
    src = x if axis is not None else ops.reshape(x, (-1,))
    (d,) = norm_axes("repeat", 0 if axis is None else axis, src.ndim)
    total = int(np.sum(np.broadcast_to(np.asarray(counts), (src.shape[d],))))
    shape = tuple(total if k == d else n for k, n in enumerate(src.shape))
    return axis_op("repeat", src, (d,), lambda xp, a: xp.repeat(a, xp.asarray(counts), axis=d),
                   shape, x.dtype, {k: k for k in range(src.ndim)})


def tile(x: GlobalTensor, repetitions: tuple[int, ...], /) -> GlobalTensor:
    """``x`` repeated ``repetitions`` times along each axis."""
    array_arg("tile", x)
    reps = tuple(int(r) for r in repetitions)
    n = max(len(reps), x.ndim)
    full_shape = (1,) * (n - x.ndim) + x.shape
    full_reps = (1,) * (n - len(reps)) + reps
    out = tuple(a * b for a, b in zip(full_shape, full_reps))
    lead = n - x.ndim
    kept = {d: d + lead for d in range(x.ndim) if full_reps[d + lead] == 1}
    whole = tuple(d for d in range(x.ndim) if d + lead not in kept.values())
    return axis_op("tile", x, whole, lambda xp, a: xp.tile(a, reps), out, x.dtype, kept)


def unstack(x: GlobalTensor, /, *, axis: int = 0) -> tuple[GlobalTensor, ...]:
    """The slices of ``x`` along ``axis``, as a tuple."""
    array_arg("unstack", x)
    if x.ndim == 0:
        raise ValueError("unstack: x must have at least one dim")
    (d,) = norm_axes("unstack", axis, x.ndim)
    return tuple(ops.getitem(x, (slice(None),) * d + (i,)) for i in range(x.shape[d]))


def take(x: GlobalTensor, indices: GlobalTensor, /, *, axis: int | None = None) -> GlobalTensor:
    """The elements of ``x`` at ``indices`` (1-D integers, gathered on every rank) along
    ``axis`` (optional for 1-D ``x``); ``axis`` is held whole on each rank."""
    array_arg("take", x)
    if not isinstance(indices, GlobalTensor) or indices.ndim != 1 or \
            indices.dtype.kind not in "iu":
        raise TypeError("take: indices must be a 1-D global array of integers")
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"take: axis is required for an array of {x.ndim} dims")
        axis = 0
    (d,) = norm_axes("take", axis, x.ndim)
    idx = indices.numpy()
    n = x.shape[d]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"take: indices out of range for axis {d} of size {n}")
    shape = tuple(idx.size if k == d else s for k, s in enumerate(x.shape))
    return axis_op("take", x, (d,), lambda xp, a: xp.take(a, xp.asarray(idx), axis=d), shape,
                   x.dtype, {k: k for k in range(x.ndim)})


def take_along_axis(x: GlobalTensor, indices: GlobalTensor, /, *, axis: int = -1
                    ) -> GlobalTensor:
    """The elements of ``x`` at ``indices`` along ``axis`` (NumPy's ``take_along_axis``;
    the other axes broadcast); ``axis`` is held whole on each rank, the others keep their
    split."""
    array_arg("take_along_axis", x)
    if not isinstance(indices, GlobalTensor) or indices.dtype.kind not in "iu" \
            or indices.ndim != x.ndim:
        raise TypeError("take_along_axis: indices must be a global array of integers with "
                        "as many dims as x")
    if x.ndim == 0:
        raise ValueError("take_along_axis: x must have at least one dim")
    (d,) = norm_axes("take_along_axis", axis, x.ndim)
    others = [k for k in range(x.ndim) if k != d]
    try:
        common = np.broadcast_shapes(tuple(x.shape[k] for k in others),
                                     tuple(indices.shape[k] for k in others))
    except ValueError:
        raise ValueError(f"take_along_axis: x of shape {x.shape} and indices of shape "
                         f"{indices.shape} do not broadcast outside axis {d}") from None
    shape = list(indices.shape)
    for k, n in zip(others, common):
        shape[k] = int(n)
    carried = tuple(DimMatch(tuple(k if a.shape[k] == shape[k] else None for a in (x, indices)),
                             k) for k in others)
    return run_local("take_along_axis", (x, indices),
                     lambda xp, a, i: xp.take_along_axis(a, i, axis=d), tuple(shape), x.dtype,
                     carried)


def diff(x: GlobalTensor, /, *numpy_order: int, axis: int = -1, n: int = 1,
         prepend: GlobalTensor | None = None, append: GlobalTensor | None = None
         ) -> GlobalTensor:
    """The ``n``-th differences along ``axis`` (after joining ``prepend`` and ``append``).

    ``n`` and ``axis`` are keywords in the standard; ``diff(x, n)`` and ``diff(x, n, axis)``
    (NumPy's order, which scikit-learn's ``roc_curve`` calls) are accepted too."""
    array_arg("diff", x)
    if len(numpy_order) > 2:
        raise TypeError(f"diff: at most 2 positional arguments after x (n, axis), got "
                        f"{len(numpy_order)}")
    if numpy_order:
        n = numpy_order[0]
        if len(numpy_order) == 2:
            axis = numpy_order[1]
    if x.ndim == 0:
        raise ValueError("diff: x must have at least one dim")
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"diff: n must be a non-negative int, got {n!r}")
    (d,) = norm_axes("diff", axis, x.ndim)
    parts = [p for p in (prepend, x, append) if p is not None]
    src = concat(parts, axis=d) if len(parts) > 1 else x
    length = max(src.shape[d] - n, 0)
    shape = tuple(length if k == d else s for k, s in enumerate(src.shape))
    return axis_op("diff", src, (d,), lambda xp, a: xp.diff(a, n=n, axis=d), shape, src.dtype,
                   {k: k for k in range(src.ndim)})
