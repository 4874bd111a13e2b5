"""``sm.map_overlap``: a function of each rank's shard and its neighbours' borders.

Dask's ``map_overlap`` on global tensors: every rank's shard is padded by ``depth``
along every axis with its neighbours' data (``x.halo``, one non-blocking exchange with
neighbours only), ``fn`` runs on the padded shards, and its result, trimmed of the
padding, is this rank's shard of the result, in the inputs' layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .env import get_rank
from .grad_mode import is_grad_enabled
from .runtime import halo as _halo
from .runtime.consistency import check_collective
from .tensor import GlobalTensor

__all__ = ["map_overlap"]


def map_overlap(fn: Callable[..., Any], *tensors: GlobalTensor, depth: Any,
                boundary: Any = "none", value: Any = 0.0, dtype: Any = None) -> GlobalTensor:
    """Apply ``fn`` to each rank's shards padded with their neighbours' borders.

    Parameters
    ----------
    fn : callable
        Called once per rank of the placement with the padded shard of each tensor
        (NumPy or CuPy arrays, in order). It returns either an array of the padded shape,
        of which the padding is trimmed (Dask's ``trim=True``), or one of the shard's
        shape, kept as it is.
    *tensors : GlobalTensor
        One or more tensors of the same shape, placement and sbp (not partial).
    depth : int, sequence of int or dict
        Elements shared with the neighbours along each axis: one int for every axis, one
        per axis, or ``{axis: depth}`` (other axes 0), as Dask. A depth larger than a
        neighbour's block takes the data from the ranks beyond it.
    boundary : str, sequence or dict
        What pads the global edges, per axis or for all: ``"none"`` (nothing: the edge
        ranks get a smaller padded shard, and only the padding actually added is trimmed),
        ``"periodic"`` (``np.pad`` mode ``"wrap"``), ``"reflect"`` (Dask's meaning, which
        is ``np.pad`` mode ``"symmetric"``: the edge element repeated), ``"nearest"``
        (``"edge"``), ``"constant"`` (``value``).
    value : scalar
        The fill of ``boundary="constant"``.
    dtype : numpy dtype, optional
        The result's dtype (``fn``'s result is cast to it); by default that of ``fn``'s
        result, and the inputs' dtype on ranks outside the placement (pass it where
        ``fn`` changes the dtype and the placement leaves ranks out).

    Returns
    -------
    GlobalTensor
        In the inputs' layout; its shard is a view of ``fn``'s result (trimmed, not
        copied), so ``fn`` should return a new array, not one it keeps. Equal to ``fn`` applied to ``np.pad`` of the whole array
        and trimmed, for any layout, when ``fn`` is a stencil of reach at most ``depth``.

    Raises
    ------
    ValueError
        Tensors of different layouts, a partial layout, a bad depth or boundary (on every
        rank, before any message); ``fn`` returning another shape (on that rank).
    RuntimeError
        An input requires grad: autograd does not go through ``map_overlap`` yet.
    """
    if not callable(fn):
        raise TypeError(f"map_overlap: fn must be callable, got {type(fn).__name__}")
    if not tensors:
        raise TypeError("map_overlap: expected at least one GlobalTensor after fn")
    for i, t in enumerate(tensors):
        if not isinstance(t, GlobalTensor):
            raise TypeError(f"map_overlap: argument {i + 1} is a {type(t).__name__}, "
                            "expected a GlobalTensor (sm.tensor / x.to_global make one)")
    layout = tensors[0].layout
    for i, t in enumerate(tensors[1:], start=2):
        if t.layout != layout:
            raise ValueError(f"map_overlap: argument {i} is laid out as {t.layout}, argument "
                             f"1 as {layout}; convert them to one layout first (to_global)")
    if is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(
            "map_overlap: autograd does not go through map_overlap yet (an input requires "
            "grad); call it under sm.no_grad() or on x.detach(), or write the stencil with "
            "sbpmpi ops (slicing and concatenation) on the global tensor")
    d = _halo.normalize_depth(depth, layout.ndim, "map_overlap")
    b = _halo.normalize_boundary(boundary, layout.ndim, "map_overlap")
    _halo.check_layout(layout, d, b, "map_overlap")
    out_dtype = None if dtype is None else np.dtype(dtype)
    check_collective("map_overlap", (*tensors, d, b, value, out_dtype))
    me = get_rank()
    if layout.placement.coord_of(me) is None:  # outside the placement: an empty shard
        dt = out_dtype or tensors[0].dtype
        return GlobalTensor(tensors[0].to_local().astype(dt), layout, dt)
    halos = [_halo.start_halo(t.to_local(), layout, d, b, value, me) for t in tensors]
    result = fn(*(h.wait() for h in halos))
    local = _trimmed(result, _halo.halo_plan(layout, d, b, me), tensors[0].to_local().shape)
    if out_dtype is not None and local.dtype != out_dtype:
        local = local.astype(out_dtype)
    return GlobalTensor(local, layout, local.dtype)


def _trimmed(result: Any, plan: _halo.HaloPlan, shard_shape: tuple[int, ...]) -> Any:
    """``fn``'s result as this rank's shard: the padding trimmed from a padded result."""
    shape = tuple(getattr(result, "shape", ()))
    if shape == plan.padded_shape:
        key = tuple(slice(lo, lo + n) for lo, n in zip(plan.lo, shard_shape))
        # a view, not a copy: the padded result is fn's own array (a copy would cost a
        # pass over the shard per step); the shard keeps fn's result alive
        return result[key]
    if shape == tuple(shard_shape):
        return result
    raise ValueError(
        f"map_overlap: fn returned {type(result).__name__} of shape {shape} on rank "
        f"{get_rank()}; expected the padded shape {plan.padded_shape} (trimmed to the "
        f"shard) or the shard's shape {tuple(shard_shape)}")
