"""Searching, sorting and set functions.

``argmax``, ``argmin`` hold the searched axis whole on each rank (a split there is boxed
first). ``sort`` and ``argsort`` move a split of the sorted axis to another axis (an
all-to-all) where one can take it, else sort in place with a sample sort
(:mod:`._sort`: one all-to-all; the result keeps the input's layout); ``searchsorted`` holds ``x1`` whole and keeps the layout
of ``x2``. Data-dependent shapes (``nonzero``, ``unique_*``) are computed from the value
gathered on every rank and come out split on their first axis (balanced) under the
namespace default, like every array the namespace creates; ``unique_*`` of a 1-D array
split on a 1-D placement runs a sample sort instead (:func:`._sort.sample_unique`).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ..core.sbp import Split
from ..ops.local import axis_op, norm_axes, run_local
from ..ops.reduction import reduced
from ..ops.signature import DimMatch
from ..tensor import GlobalTensor
from ._device import default_sbp, from_value
from ._local import array_arg
from ._sort import Unique, sample_sort, sample_unique, taking_dim

__all__ = ["numpy_unique", "argmax", "argmin", "nonzero", "searchsorted", "sort", "argsort", "unique_all",
           "unique_counts", "unique_inverse", "unique_values"]


def _arg(name: str, x: GlobalTensor, axis: Any, keepdims: bool) -> GlobalTensor:
    array_arg(name, x)
    if x.size == 0:
        raise ValueError(f"{name}: x is empty")
    if axis is None:
        shape = (1,) * x.ndim if keepdims else ()
        return axis_op(name, x, tuple(range(x.ndim)),
                       lambda xp, a: (xp.argmax if name == "argmax" else xp.argmin)(
                           a, keepdims=keepdims), shape, np.int64, {})
    (d,) = norm_axes(name, axis, x.ndim)
    kept = {k: k if keepdims else (k if k < d else k - 1) for k in range(x.ndim) if k != d}
    shape = tuple(1 if k == d else n for k, n in enumerate(x.shape)) if keepdims else \
        tuple(n for k, n in enumerate(x.shape) if k != d)
    return axis_op(name, x, (d,), lambda xp, a: (xp.argmax if name == "argmax" else xp.argmin)(
        a, axis=d, keepdims=keepdims), shape, np.int64, kept)


def argmax(x: GlobalTensor, /, *, axis: int | None = None, keepdims: bool = False
           ) -> GlobalTensor:
    """Index of the first largest element along ``axis`` (of the flattened array when None)."""
    return _arg("argmax", x, axis, keepdims)


def argmin(x: GlobalTensor, /, *, axis: int | None = None, keepdims: bool = False
           ) -> GlobalTensor:
    """Index of the first smallest element along ``axis`` (of the flattened array when None)."""
    return _arg("argmin", x, axis, keepdims)


def nonzero(x: GlobalTensor, /) -> tuple[GlobalTensor, ...]:
    """The indices of the nonzero elements, one int64 array per axis (the value of ``x``
    is gathered on every rank; the results have the namespace's default layout)."""
    array_arg("nonzero", x)
    if x.ndim == 0:
        raise ValueError("nonzero: x must have at least one dim")
    return tuple(from_value(i.astype(np.int64), x.placement) for i in np.nonzero(x.numpy()))


def searchsorted(x1: GlobalTensor, x2: GlobalTensor, /, *, side: str = "left",
                 sorter: GlobalTensor | None = None) -> GlobalTensor:
    """Indices where the elements of ``x2`` go in the sorted 1-D ``x1`` (held whole on
    each rank); the result has the layout of ``x2``."""
    array_arg("searchsorted", x1)
    array_arg("searchsorted", x2)
    if x1.ndim != 1:
        raise ValueError(f"searchsorted: x1 must be 1-D, got shape {x1.shape}")
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if sorter is not None:
        x1 = take_sorted(x1, sorter)
    carried = tuple(DimMatch((None, d), d) for d in range(x2.ndim))
    return run_local("searchsorted", (x1, x2), lambda xp, a, v: xp.searchsorted(a, v, side=side),
                     x2.shape, np.dtype(np.int64), carried)


def take_sorted(x1: GlobalTensor, sorter: GlobalTensor) -> GlobalTensor:
    """``x1[sorter]`` for 1-D arrays (both held whole)."""
    return run_local("take", (x1, sorter), lambda xp, a, s: a[s], x1.shape, x1.dtype, ())


def _sort(name: str, x: GlobalTensor, axis: int, descending: bool, stable: bool
          ) -> GlobalTensor:
    array_arg(name, x)
    if x.ndim == 0:
        raise ValueError(f"{name}: x must have at least one dim")
    (d,) = norm_axes(name, axis, x.ndim)
    n = x.shape[d]
    for flag, arg in ((descending, "descending"), (stable, "stable")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name}: {arg} must be a bool, got {flag!r}")
    x = reduced(x)  # reduced first, as every local op
    if any(isinstance(s, Split) and s.dim == d for s in x.sbp):
        k = taking_dim(x.shape, x.layout, d)
        if k is not None:  # an all-to-all moves the split off the sorted axis; it stays on k
            x = x.to_global(sbp=tuple(Split(k) if isinstance(s, Split) and s.dim == d else s
                                      for s in x.sbp))
        else:
            return sample_sort(x, d, bool(descending), name == "argsort")

    def kernel(xp: ModuleType, a: Any) -> Any:
        if name == "sort":
            out = xp.sort(a, axis=d, kind="stable")
            return xp.flip(out, axis=d) if descending else out
        if not descending:
            return xp.argsort(a, axis=d, kind="stable")
        # the last of equal elements first in the flipped array: first in x
        return n - 1 - xp.flip(xp.argsort(xp.flip(a, axis=d), axis=d, kind="stable"), axis=d)

    return axis_op(name, x, (d,), kernel, x.shape, x.dtype if name == "sort" else np.int64,
                   {k: k for k in range(x.ndim)})


def sort(x: GlobalTensor, /, *, axis: int = -1, descending: bool = False,
         stable: bool = True) -> GlobalTensor:
    """``x`` sorted along ``axis`` (distributed along a split axis: see :mod:`._sort`)."""
    return _sort("sort", x, axis, descending, stable)


def argsort(x: GlobalTensor, /, *, axis: int = -1, descending: bool = False,
            stable: bool = True) -> GlobalTensor:
    """The indices that sort ``x`` along ``axis`` (stable, also when descending)."""
    return _sort("argsort", x, axis, descending, stable)


class UniqueAll(NamedTuple):
    values: GlobalTensor
    indices: GlobalTensor
    inverse_indices: GlobalTensor
    counts: GlobalTensor


class UniqueCounts(NamedTuple):
    values: GlobalTensor
    counts: GlobalTensor


class UniqueInverse(NamedTuple):
    values: GlobalTensor
    inverse_indices: GlobalTensor


def _unique(x: GlobalTensor, equal_nan: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """NumPy's unique of the gathered value; every NaN is its own value (the standard), or
    one value with ``equal_nan`` (NumPy's ``np.unique`` default)."""
    a = x.numpy()
    flat = a.reshape(-1)
    values, index, inverse, counts = np.unique(flat, return_index=True, return_inverse=True,
                                               return_counts=True, equal_nan=equal_nan)
    return values, index.astype(np.int64), inverse.reshape(a.shape).astype(np.int64), \
        counts.astype(np.int64)


def _by_sample_sort(x: GlobalTensor) -> bool:
    """Whether ``unique`` of ``x`` runs as a sample sort: a 1-D array split on a 1-D
    placement of several ranks, whose results take that split (the namespace default)."""
    pl = x.placement
    return (x.ndim == 1 and x.size > 0 and pl.ndim == 1 and len(pl.rank_list) > 1
            and x.sbp == (Split(0),) and default_sbp(1, pl) == x.sbp)


def _distributed_unique(name: str, x: GlobalTensor, inverse: bool) -> Unique | None:
    """The sample sort's ``unique`` of ``x`` where it applies, else None (gathered)."""
    array_arg(name, x)
    x = reduced(x)
    if not _by_sample_sort(x):
        return None
    return sample_unique(x, x.sbp, inverse)


def unique_values(x: GlobalTensor, /) -> GlobalTensor:
    """The distinct values of ``x``, sorted, 1-D (a sample sort for a split 1-D ``x``,
    else gathered on every rank)."""
    u = _distributed_unique("unique_values", x, False)
    if u is not None:
        return u.values
    return from_value(_unique(x)[0], x.placement)


def unique_counts(x: GlobalTensor, /) -> UniqueCounts:
    """The distinct values of ``x`` and how often each occurs."""
    u = _distributed_unique("unique_counts", x, False)
    if u is not None:
        return UniqueCounts(u.values, u.counts)
    v, _, _, c = _unique(x)
    return UniqueCounts(from_value(v, x.placement), from_value(c, x.placement))


def unique_inverse(x: GlobalTensor, /) -> UniqueInverse:
    """The distinct values of ``x`` and, for each element, the index of its value."""
    u = _distributed_unique("unique_inverse", x, True)
    if u is not None:
        assert u.inverse is not None
        return UniqueInverse(u.values, u.inverse)
    v, _, inv, _ = _unique(x)
    return UniqueInverse(from_value(v, x.placement), from_value(inv, x.placement))


def unique_all(x: GlobalTensor, /) -> UniqueAll:
    """The distinct values of ``x``, the first index of each, the inverse and the counts."""
    u = _distributed_unique("unique_all", x, True)
    if u is not None:
        assert u.inverse is not None
        return UniqueAll(u.values, u.indices, u.inverse, u.counts)
    v, i, inv, c = _unique(x)
    return UniqueAll(*(from_value(a, x.placement) for a in (v, i, inv, c)))


def numpy_unique(x: GlobalTensor, return_index: bool, return_inverse: bool,
                 return_counts: bool, equal_nan: bool) -> Any:
    """``np.unique(x, ...)`` (NEP 18; ``axis=None``): the sorted distinct values of the
    flattened ``x`` and, as asked, the first index of each, the inverse (of ``x``'s shape)
    and the counts, as global arrays (gathered on every rank, like ``unique_all``)."""
    array_arg("unique", x)
    v, i, inv, c = _unique(x, equal_nan=equal_nan)
    parts = [v] + [a for a, want in ((i, return_index), (inv, return_inverse),
                                     (c, return_counts)) if want]
    out = tuple(from_value(a, x.placement) for a in parts)
    return out if len(out) > 1 else out[0]
