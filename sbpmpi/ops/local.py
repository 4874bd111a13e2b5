"""Functions that are not registered ops, computed on local shards: the machinery of the
Array API namespace (``sbpmpi.array_api``) and of ``sm.linalg``.

Each is an :class:`~sbpmpi.ops.OpCall` whose signature table has two rows: split a dim
the function carries whole (``S(d)`` on every operand holding it) and broadcast. Dims
the function mixes (a reduced axis, a sorted axis, a flipped axis, the matrix dims of a
factorization) are never split, so inference boxes an operand split along one (through
``runtime.redistribute``) and partial operands are reduced first. The kernels are NumPy's
(CuPy's) own functions on the local shards, so special cases (NaN, infinities, signed
zeros) are theirs. Also here: the SBP of a new array of the namespace and the index
vectors that masks (``eye``, ``tril``, ``linalg.trace``) compare.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from .. import config, creation
from ..core.dtypes import float32, is_half
from ..core.placement import Placement
from ..core.sbp import SBP, broadcast, split
from ..tensor import GlobalTensor
from .call import OpCall, tensor_arg
from .op import run_call
from .shape import reshape
from .signature import S_D, B, DimMatch, Signature

__all__ = ["run_local", "axis_op", "norm_axes", "broadcast_to", "broadcast_arrays", "default_sbp",
           "index_along"]


def _table(n: int) -> tuple[Signature, ...]:
    return (Signature((S_D,) * n, S_D), Signature((B,) * n, B))


def run_local(name: str, operands: Sequence[Any], kernel: Callable[..., Any],
              out_shape: tuple[int, ...], dtype: np.dtype,
              carried: tuple[DimMatch, ...]) -> GlobalTensor:
    """Run ``kernel(xp, *local_operands)`` on each rank's shards; ``carried``: the dims
    each output dim is (may stay split in). A kernel's result is broadcast to the local
    output shape when it has fewer elements (``broadcast_to``)."""
    ops_ = tuple(operands)

    def k(xp: ModuleType, local: Sequence[Any], shape: tuple[int, ...]) -> Any:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = xp.asarray(kernel(xp, *local))
            if res.shape != shape:  # a kernel may leave broadcasting to the output to here
                res = xp.broadcast_to(res, shape)
            if is_half(dtype) and res.dtype == float32:
                return res  # computed from widened operands: local_result rounds it once
            return res.astype(dtype, copy=True)

    call = OpCall(name, ops_, _table(len(ops_)), {"d": carried}, tuple(out_shape),
                  np.dtype(dtype), k, labels=tuple(f"x{i + 1}" for i in range(len(ops_))))
    return run_call(call)


def norm_axes(name: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None: all, an int, or a tuple of ints) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"{name}: axis must be an int, a tuple of ints or None, got {axis!r}")
        if not -ndim <= a < max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise IndexError(f"{name}: axis {a} is out of range for an array of {ndim} dims")
        out.append(int(a) % max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: axis {axis!r} names an axis more than once")
    return tuple(sorted(out))


def axis_op(name: str, x: GlobalTensor, whole: tuple[int, ...], kernel: Callable[..., Any],
            out_shape: tuple[int, ...], dtype: Any, kept: dict[int, int],
            *others: GlobalTensor) -> GlobalTensor:
    """``kernel(xp, local_x, *local_others)`` with the dims ``whole`` of ``x`` held whole on
    each rank; ``kept`` maps the other dims of ``x`` to output dims (``others`` have the
    shape of ``x``)."""
    tensor_arg(name, x)
    n = 1 + len(others)
    carried = tuple(DimMatch((d,) * n, j) for d, j in kept.items() if d not in whole)
    return run_local(name, (x, *others), kernel, out_shape, np.dtype(dtype), carried)


def default_sbp(ndim: int, device: Placement) -> tuple[SBP, ...]:
    """The SBP of a new array of ``ndim`` dims on ``device``: the first mesh axis splits
    dim 0 under ``array_api_sbp="split"`` (when there is a dim 0); every other axis
    broadcasts."""
    first = split(0) if ndim > 0 and config.array_api_sbp.value in (None, "split") else broadcast
    return (first,) + (broadcast,) * (device.ndim - 1)


def index_along(n: int, dev: Placement, column: bool) -> GlobalTensor:
    """Global index arrays ``0..n-1``, as a column ``(n, 1)`` or a row ``(1, n)``."""
    i = creation.arange(n, placement=dev, sbp=default_sbp(1, dev), dtype=np.int64)
    return reshape(i, (n, 1) if column else (1, n))  # type: ignore[no-any-return]


def broadcast_to(x: GlobalTensor, /, shape: tuple[int, ...]) -> GlobalTensor:
    """``x`` broadcast to ``shape`` (NumPy's rules)."""
    tensor_arg("broadcast_to", x)
    shape = tuple(int(n) for n in shape)
    try:
        out = tuple(int(n) for n in np.broadcast_shapes(x.shape, shape))
    except ValueError:
        out = None
    if out != shape:
        raise ValueError(f"broadcast_to: an array of shape {x.shape} cannot be broadcast to "
                         f"{shape}")
    lead = len(shape) - x.ndim
    carried = tuple(DimMatch((d,), d + lead) for d in range(x.ndim) if x.shape[d] == shape[d + lead])
    # the kernel adds the leading dims; run_local broadcasts to the local output shape
    return run_local("broadcast_to", (x,), lambda xp, a: a.reshape((1,) * lead + a.shape),
                     shape, x.dtype, carried)


def broadcast_arrays(*arrays: GlobalTensor) -> list[GlobalTensor]:
    """The arrays broadcast to their common shape."""
    xs = [tensor_arg("broadcast_arrays", a) for a in arrays]
    try:
        shape = tuple(int(n) for n in np.broadcast_shapes(*(a.shape for a in xs)))
    except ValueError:
        raise ValueError(f"broadcast_arrays: shapes {[a.shape for a in xs]} cannot be "
                         f"broadcast together") from None
    return [a if a.shape == shape else broadcast_to(a, shape) for a in xs]
