"""NaN-safe MAX and MIN over MPI: one flag first, NumPy's semantics when a NaN is present.

Used by the calls of :mod:`.call` and by the inter-node leg of the hierarchical GPU
transport (:mod:`.gpu.hier`); a leaf module, so both can import it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import backend
from ..backend import device_copy
from .lifecycle.watchdog import watch
from .reduce_op import ORDERED, UFUNCS, MPIReduction, ReduceOp, user_op

__all__ = ["nan_safe"]

_NAN_OPS: dict[tuple[ReduceOp, str], MPIReduction] = {}


def _nan_op(op: ReduceOp, dtype: np.dtype) -> MPIReduction:
    """A user-defined MAX/MIN that propagates NaN as ``np.maximum``/``np.minimum`` do."""
    key = (op, dtype.str)
    red = _NAN_OPS.get(key)
    if red is None:
        red = _NAN_OPS[key] = MPIReduction(user_op(UFUNCS[op], dtype), host_only=True)
    return red


def _has_nan(a: Any) -> bool:
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        # the max propagates NaN: one pass and no array of the input's size (a replay of
        # a captured step allocates nothing here; ``a != a`` would make one)
        if a.size == 0:
            return False
        top = _scratch(a.dtype)
        np.max(a, out=top)
        v = top.item()
        return bool(v != v)
    ne = a != a  # NaN is the only value unequal to itself (NumPy and CuPy alike)
    if hasattr(ne, "any"):
        return bool(ne.any())
    if backend.is_device_array(a):  # a GPU array without arithmetic: a host copy says
        dtype, shape, contiguous = device_copy.device_array_meta(a)
        src = a if contiguous else device_copy.ascontiguous_device(a)
        device_copy.sync_for_transfer(src)
        host = np.empty(shape, dtype)
        device_copy.copy_device_to_host(src, host)
        return bool(np.isnan(host).any())
    return bool(ne)


def nan_safe(red: MPIReduction, op: ReduceOp, dtype: np.dtype, inputs: Any, comm: Any,
             ranks: Any) -> MPIReduction:
    """``red``, or a NaN-propagating op when a MAX/MIN of floats meets a NaN on any rank.

    MPI's MAX and MIN do not propagate NaN (the result depends on the order in which
    ranks are combined, so ranks can even disagree). One flag is all-reduced first (a few
    microseconds); only when some rank holds a NaN does the reduction run as a
    user-defined op with NumPy's semantics. Collective over ``comm``.
    """
    if op not in ORDERED or dtype.kind != "f" or red.host_only:
        return red
    arrays = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    flag = _scratch(np.dtype(np.uint8))
    flag[()] = any(_has_nan(a) for a in arrays)
    with watch("NaN flag of a max/min reduction", ranks):
        comm.Allreduce(MPI.IN_PLACE, [flag, 1, MPI.UNSIGNED_CHAR], op=MPI.MAX)
    return _nan_op(op, dtype) if flag[()] else red


_SCRATCH = threading.local()


def _scratch(dtype: np.dtype) -> np.ndarray:
    """This thread's 0-d array of ``dtype``, made once (the flag and the probe's max)."""
    arrays = getattr(_SCRATCH, "arrays", None)
    if arrays is None:
        arrays = _SCRATCH.arrays = {}
    a = arrays.get(dtype.str)
    if a is None:
        a = arrays[dtype.str] = np.empty((), dtype)
    return a  # type: ignore[no-any-return]
