"""``setitem``: the value of ``x[key] = value`` as a new global tensor in the layout of ``x``.

``GlobalTensor.__setitem__`` gives ``x`` the result (the same object; its shard is a new
buffer, so arrays that shared the old one keep their values). Each rank writes the part
of the selection its shard holds; the value (and a boolean mask) are converted to
broadcast on the placement of ``x`` by inference, that is through ``runtime.redistribute``:
every rank of ``x`` receives the whole value. A partial ``x`` is reduced first (its
partial mesh axes become broadcast). Keys: ints, slices, ``None`` and ``...``
(NumPy's basic indexing), or one boolean array of the leading shape of ``x``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ..core.sbp import broadcast
from ..env import get_rank
from ..tensor import GlobalTensor
from .array_index import mask_of
from .call import OpCall, arg_summary, is_scalar, tensor_arg
from .op import GlobalOp, run_call
from .reduction import reduced
from .shape import index_key
from .signature import S_D, B, DimMatch, Signature

__all__ = ["setitem", "SETITEM"]

#: x keeps its split or is broadcast; the value and a mask are broadcast.
SETITEM = (Signature((S_D, B, B), S_D), Signature((B, B, B), B))


class Selection(NamedTuple):
    """What a key selects: per dim of ``x``, the global indices it writes (basic keys), or
    a boolean mask of the leading dims; and the shape the value broadcasts to."""

    indices: tuple[np.ndarray, ...] | None
    mask: GlobalTensor | None
    shape: tuple[int, ...]


def _selection(x: GlobalTensor, key: Any) -> Selection:
    """The key checked against the shape of ``x`` (metadata only: the same on every rank)."""
    mask = mask_of("setitem", key)
    if mask is not None:
        if mask.ndim > x.ndim or mask.shape != x.shape[:mask.ndim]:
            raise IndexError(f"setitem: boolean index of shape {mask.shape} does not match "
                             f"the leading dims of x of shape {x.shape}")
        return Selection(None, mask, (-1,) + x.shape[mask.ndim:])
    items = key if isinstance(key, tuple) else (key,)
    for k in items:
        if isinstance(k, GlobalTensor):
            raise IndexError(f"setitem: array index {arg_summary(k)} is not supported (ints, "
                             f"slices, None, ... or one boolean array)")
    norm, _ = index_key(key, x.shape)
    indices = []
    d = 0
    for k in norm:
        if k is None:
            continue
        n = x.shape[d]
        indices.append(np.arange(n)[k].reshape(-1))
        d += 1
    shape = tuple(np.broadcast_to(np.empty((), dtype=np.int8), x.shape)[norm].shape)
    return Selection(tuple(indices), None, shape)


def _value(x: GlobalTensor, value: Any) -> Any:
    """``value`` as an operand: a scalar of the dtype of ``x``, or a global array on the
    placement of ``x`` (cast to its dtype)."""
    if isinstance(value, GlobalTensor):
        if value.dtype.kind == "c" and x.dtype.kind != "c":
            raise TypeError(f"setitem: a complex value ({value.dtype}) cannot be written into "
                            f"x of dtype {x.dtype}")
        if value.requires_grad:
            raise RuntimeError("setitem: value requires grad; x[key] = value is not recorded "
                               "by autograd")
        return value
    if not is_scalar(value):
        raise TypeError(f"setitem: value must be a global array or a Python scalar, got "
                        f"{arg_summary(value)}")
    if isinstance(value, complex) and x.dtype.kind != "c":
        raise TypeError(f"setitem: a complex value {value!r} cannot be written into x of "
                        f"dtype {x.dtype}")
    if x.dtype.kind in "iu" and isinstance(value, (int, np.integer)) and \
            not isinstance(value, (bool, np.bool_)):
        info = np.iinfo(x.dtype)
        if not info.min <= value <= info.max:
            raise OverflowError(f"setitem: value {value} is out of bounds for {x.dtype}")
    return np.asarray(value).astype(x.dtype)[()]


def _broadcast_value(vshape: tuple[int, ...], target: tuple[int, ...], count: int | None
                     ) -> tuple[int, ...]:
    """The shape the value broadcasts to (``-1`` in ``target``: the mask's count)."""
    want = tuple(count if n == -1 and count is not None else n for n in target)
    while len(vshape) > len(want) and vshape[0] == 1:  # NumPy drops leading ones
        vshape = vshape[1:]
    probe = tuple(1 if n == -1 else n for n in want)
    try:
        got = tuple(int(n) for n in np.broadcast_shapes(vshape, probe))
    except ValueError:
        got = None
    if got is None or (-1 not in want and got != want) or len(vshape) > len(want):
        raise ValueError(f"setitem: a value of shape {vshape} cannot be broadcast to the "
                         f"selection's shape {want}")
    return want


def _build(x: Any, key: Any, value: Any) -> OpCall:
    """Build the OpCall of ``setitem``. Collective: a partial ``x`` is reduced, the value
    and a boolean mask are converted to broadcast, and a mask's count is read here."""
    x = tensor_arg("setitem", x)
    if x.requires_grad:
        raise RuntimeError("setitem: x requires grad; x[key] = value is not recorded by "
                           "autograd (write into a tensor that does not require grad, or "
                           "use where)")
    sel = _selection(x, key)
    val = _value(x, value)
    vshape = val.shape if isinstance(val, GlobalTensor) else ()
    # the count of a mask is known after its gather; check what does not depend on it now
    _broadcast_value(vshape, sel.shape, None)
    x = reduced(x)
    operands: list[Any] = [x, val, sel.mask if sel.mask is not None else np.bool_(True)]
    for i in (1, 2):
        o = operands[i]
        if isinstance(o, GlobalTensor) and o.placement != x.placement:
            operands[i] = o.to_global(placement=x.placement,
                                      sbp=(broadcast,) * x.placement.ndim)
    if sel.mask is not None:
        # data-dependent: the same on every rank, so is the check that uses it
        count = int(operands[2].numpy().sum())
        target = _broadcast_value(vshape, sel.shape, count)
    else:
        target = sel.shape
    ranges = x.layout.local_ranges(get_rank())
    dtype = x.dtype

    def kernel(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        a, v, m = local
        out = a.copy()
        if ranges is None or out.size == 0:
            return out
        v = xp.asarray(v, dtype=dtype)
        v = xp.broadcast_to(v.reshape(v.shape[max(v.ndim - len(target), 0):]), target)
        if sel.indices is not None:
            return _write_basic(xp, out, v, sel.indices, ranges)
        return _write_masked(xp, out, v, m, ranges)

    dims = {"d": tuple(DimMatch((d, None, None), d) for d in range(x.ndim))}
    return OpCall("setitem", tuple(operands), SETITEM, dims, x.shape, dtype, kernel,
                  params=f"key={key!r}", labels=("x", "value", "mask"))


class _SetItem(GlobalOp):
    """setitem: the kernel writes the boxes of the layout of ``x`` it was built for, so the
    result must come out in that layout."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self.build(*args, **kwargs)
        out = run_call(call)
        x = call.operands[0]
        if out.layout != x.layout:
            raise RuntimeError(f"setitem: internal error: the result's layout {out.layout} is "
                               f"not that of x {x.layout}")
        return out


setitem = _SetItem("setitem", _build, SETITEM, fast=False, doc=(
    "``setitem(x, key, value)``: the value of ``x`` after ``x[key] = value``, in the layout "
    "of ``x`` (a partial ``x`` is reduced first). Collective: the value, and a boolean "
    "mask, are converted to broadcast on the placement of ``x``."))


def _write_basic(xp: ModuleType, out: Any, v: Any, indices: tuple[np.ndarray, ...],
                 ranges: tuple[tuple[int, int], ...]) -> Any:
    """Write ``v`` (the selection's shape) at the global ``indices`` (one array per dim)
    that fall in this shard's box ``ranges``."""
    full = v.reshape(tuple(len(i) for i in indices))  # None dims dropped, int dims kept as 1
    here, picks = [], []
    for idx, (lo, hi) in zip(indices, ranges):
        inside = (idx >= lo) & (idx < hi)
        here.append(xp.asarray(idx[inside] - lo))
        picks.append(xp.asarray(np.nonzero(inside)[0]))
    if all(len(h) for h in here):
        out[xp.ix_(*here)] = full[xp.ix_(*picks)]
    return out


def _write_masked(xp: ModuleType, out: Any, v: Any, mask: Any,
                  ranges: tuple[tuple[int, int], ...]) -> Any:
    """Write the rows of ``v`` (one per True of the whole ``mask``, in row-major order) at
    the Trues inside this shard's box."""
    k = mask.ndim
    order = (xp.cumsum(mask.reshape(-1)) - 1).reshape(mask.shape)
    box = tuple(slice(lo, hi) for lo, hi in ranges)
    here = mask[box[:k]]
    rows = order[box[:k]][here]
    out[here] = v[(rows,) + box[k:]]
    return out
