"""``x[key]`` with array indices: one boolean mask, or integer arrays (and ints) per dim.

The shape of the result depends on the key's values, so the key is gathered on every rank
first (its values decide the shape, the same on every rank); then the indexed dims of ``x``
are held whole on each rank (a split there is converted through inference, that is
``runtime.redistribute``) and each rank selects from its shard. The other dims keep their
split. The result's first dim comes out balanced-split on the first mesh axis that split
an indexed dim of ``x`` (a local slice of the selection every rank computed), and
broadcast on the others.

- a boolean array ``mask`` of the leading shape of ``x`` (or 0-d): ``x[mask]`` has shape
  ``(count,) + x.shape[mask.ndim:]``; a mask with a zero-size dim selects nothing;
- integer arrays and ints, one per leading dim (the 2024.12 rules): they broadcast
  together to a shape ``b`` and ``x[key]`` has shape ``b + x.shape[len(key):]``; indices
  may be negative (counted from the end).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..core.sbp import Broadcast, Split
from ..tensor import GlobalTensor
from .call import OpCall, arg_summary, tensor_arg
from .op import GlobalOp, run_call
from .signature import S_D, B, DimMatch, Signature

__all__ = ["getitem_arrays", "is_array_key", "mask_of", "ARRAY_INDEX"]

#: The indexed dims are held whole; the others keep their split or are broadcast.
ARRAY_INDEX = (Signature((S_D,), S_D), Signature((B,), B))


def is_array_key(key: Any) -> bool:
    """True when ``key`` holds a global array (a mask or an integer array)."""
    items = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, GlobalTensor) for k in items)


def mask_of(op: str, key: Any) -> GlobalTensor | None:
    """The boolean global array of ``key``, None if it has none; an IndexError naming
    ``op`` when a mask comes with other indices."""
    items = key if isinstance(key, tuple) else (key,)
    masks = [k for k in items if isinstance(k, GlobalTensor) and k.dtype == np.bool_]
    if not masks:
        return None
    if len(items) != 1:
        raise IndexError(f"{op}: a boolean array index must be the only index, got "
                         f"{arg_summary(key)}")
    return masks[0]


def _mask_shape(x: GlobalTensor, mask: GlobalTensor) -> None:
    if mask.ndim > x.ndim or not all(m in (n, 0) for m, n in zip(mask.shape, x.shape)):
        raise IndexError(f"getitem: boolean index of shape {mask.shape} does not match the "
                         f"leading dims of x of shape {x.shape}")


def _integer_parts(x: GlobalTensor, items: tuple[Any, ...]) -> list[Any]:
    """The key's entries checked: ints and integer global arrays, one per leading dim."""
    if len(items) > x.ndim:
        raise IndexError(f"getitem: too many indices for an array of {x.ndim} dims: "
                         f"{len(items)} were given")
    for k in items:
        ok = (isinstance(k, GlobalTensor) and k.dtype.kind in "iu") or (
            isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)))
        if not ok:
            raise IndexError(f"getitem: with integer array indices, every index must be an "
                             f"int or an integer array (one per leading dim), got "
                             f"{arg_summary(k)}")
    try:
        np.broadcast_shapes(*(k.shape if isinstance(k, GlobalTensor) else () for k in items))
    except ValueError:
        raise IndexError(f"getitem: index arrays of shapes "
                         f"{[k.shape for k in items if isinstance(k, GlobalTensor)]} cannot be "
                         f"broadcast together") from None
    return list(items)


def _build(x: Any, key: Any) -> OpCall:
    """Build the OpCall of ``getitem_arrays``. Collective: the key's arrays are gathered on
    every rank (their values decide the result's shape)."""
    x = tensor_arg("getitem", x)
    items = key if isinstance(key, tuple) else (key,)
    mask = mask_of("getitem", key)
    if mask is not None:
        _mask_shape(x, mask)
        m = mask.numpy()  # the values decide the result's shape
        k = mask.ndim
        if 0 in m.shape:
            m = np.zeros(x.shape[:k], dtype=bool)
        index: tuple[Any, ...] = (m,)
        lead: tuple[int, ...] = (int(m.sum()),)
    else:
        parts = _integer_parts(x, items)
        k = len(parts)
        values = [p.numpy() if isinstance(p, GlobalTensor) else np.asarray(p) for p in parts]
        for d, v in enumerate(values):
            n = x.shape[d]
            if v.size and (v.min() < -n or v.max() >= n):
                raise IndexError(f"getitem: index {int(v.min() if v.min() < -n else v.max())} "
                                 f"is out of bounds for dim {d} of size {n}")
        index = tuple(np.where(v < 0, v + x.shape[d], v) for d, v in enumerate(values))
        lead = tuple(int(n) for n in np.broadcast_shapes(*(v.shape for v in values)))
    out_shape = lead + x.shape[k:]
    dims = {"d": tuple(DimMatch((d,), len(lead) + d - k) for d in range(k, x.ndim))}

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        if 0 in shape:
            return xp.zeros(shape, dtype=local[0].dtype)
        return local[0][tuple(xp.asarray(i) for i in index)]

    return OpCall("getitem_arrays", (x,), ARRAY_INDEX, dims, out_shape, x.dtype, kernel,
                  params="key=<arrays>", labels=("x",))


class _GetItemArrays(GlobalOp):
    """getitem_arrays: the selection, then its first dim split again where ``x`` was split
    along an indexed dim (a local slice)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self.build(*args, **kwargs)
        x = call.operands[0]
        carried = len(call.dims["d"])  # the dims after the indexed ones
        return _balanced(run_call(call), x, x.ndim - carried, len(call.out_shape) - carried)


getitem_arrays = _GetItemArrays("getitem_arrays", _build, ARRAY_INDEX, fast=False, doc=(
    "``x[key]`` for a key with global arrays: one boolean mask, or integer arrays and ints "
    "(see :mod:`sbpmpi.ops.array_index`). Collective: the key is gathered on every rank."))


def _balanced(out: GlobalTensor, x: GlobalTensor, k: int, n_lead: int) -> GlobalTensor:
    """``out`` split on its first dim on the first mesh axis that splits an indexed dim of
    ``x`` and is broadcast in ``out`` (a local slice: nothing is sent)."""
    if n_lead == 0 or out.placement != x.placement:
        return out
    sbp = list(out.sbp)
    for i, (s, o) in enumerate(zip(x.sbp, out.sbp)):
        if isinstance(s, Split) and s.dim < k and isinstance(o, Broadcast):
            sbp[i] = Split(0)
            break  # one mesh axis splits the selection
    return out if tuple(sbp) == tuple(out.sbp) else out.to_global(sbp=tuple(sbp))
