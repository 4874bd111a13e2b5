"""The one skeleton of every sm.comm buffer call: group, checks, agreement, trace, watch.

A call is written as::

    c = Call("all_reduce", group)         # 1. resolve the group (WORLD for None)
    with c:                               # 2. describe/validate the buffers; a TypeError or
        m = describe_out(arr, "arr", c.name)  #    ValueError is agreed (checked mode) and
                                          #    raised on every rank
    if checks._enabled:
        c.agree(sig)                      # 3. ranks agree on the signature (checked mode)
    if m[3] and c.gpu(_gpu.all_reduce, arr, m, op):
        return                            #    (GPU transports: CUDA IPC)
    red = c.nan_safe(red, op, m[0], arr)  #    (NaN-propagating max/min)
    with stager(m[3]) as st:              # 4. stage; finish on success, always release
        buf = st.out(arr, m, copy_in=True)
        with c.mpi(nbytes, m[0], None, m[3], st.staged):  # 5. trace note + 6. watch
            c.comm.Allreduce(...)
                                          # 7. release (the stager's exit)

so tracing, agreement, the watchdog, staging and the GPU hooks are applied in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import backend
from ..watchdog import watch
from . import checks
from .gpu import route as _gpu
from .group import _WORLD_COMM, WORLD, Group, resolve
from .reduce_op import MPIReduction, ReduceOp
from .tracing import ACTIVE, note

__all__ = ["Call", "nan_safe", "host_only", "average"]


class Call:
    """One call of ``name`` on ``group``: its group ``g`` and communicator ``comm``.

    Used as a context manager around the argument checks: a ``TypeError`` or
    ``ValueError`` raised inside is, in checked mode, exchanged with the other ranks of the
    group so that every rank raises it (see :func:`.checks.agree`); otherwise it propagates
    unchanged.
    """

    __slots__ = ("name", "g", "comm")

    def __init__(self, name: str, group: Group | None) -> None:
        self.name = name
        if group is None:
            self.g, self.comm = WORLD, _WORLD_COMM
        else:
            self.g, self.comm = resolve(group, name)

    def __enter__(self) -> Call:
        return self

    def __exit__(self, et: Any, e: Any, tb: Any) -> None:
        if e is not None and checks._enabled and isinstance(e, (TypeError, ValueError)):
            checks.agree(self.comm, self.name, e)  # raises on every rank

    def agree(self, sig: Sequence[tuple[str, Any]], extra: Any = None) -> list[tuple[Any, Any]]:
        """Checked mode: every rank of the group passed the same ``sig`` (callers test
        ``checks._enabled`` first, so the signature is built only when checking)."""
        return checks.agree(self.comm, self.name, None, sig, extra)

    def gpu(self, route: Callable[..., bool], *args: Any) -> bool:
        """True when the GPU transport ``route`` (a :mod:`.gpu.route` call) did the call."""
        return _gpu.ENABLED and route(*args, self.g, self.comm)

    def nan_safe(self, red: MPIReduction, op: ReduceOp, dtype: np.dtype,
                 inputs: Any) -> MPIReduction:
        """:func:`nan_safe` on this call's group."""
        return nan_safe(red, op, dtype, inputs, self.comm, self.g.ranks)

    def note(self, nbytes: int, dtype: Any = "", peer: int | None = None, device: bool = False,
             staged: bool = False) -> None:
        """Note the call in the active traces (for calls that are not watched: isend, irecv)."""
        if ACTIVE:
            note(self.name, nbytes, self.g, dtype, peer, device, staged)

    def mpi(self, nbytes: int, dtype: Any = "", peer: int | None = None, device: bool = False,
            staged: bool = False) -> Any:
        """Note the call in the active traces; return the watch to hold around the MPI call."""
        if ACTIVE:
            note(self.name, nbytes, self.g, dtype, peer, device, staged)
        return watch(self.name, self.g.ranks)


def host_only(red: MPIReduction, a: Any, m: tuple[Any, ...]) -> bool:
    """User-defined ops, and averaging a GPU array that is not CuPy, need host memory."""
    return red.host_only or (red.average and m[3] and not backend.is_cupy_array(a))


def average(buf: Any, n: int) -> None:
    """Divide a SUM result by the group size (ReduceOp.AVG)."""
    buf /= n


# -- NaN-safe MAX/MIN ---------------------------------------------------------------------------

_NAN_OPS: dict[tuple[ReduceOp, str], MPIReduction] = {}


def _nan_op(op: ReduceOp, dtype: np.dtype) -> MPIReduction:
    """A user-defined MAX/MIN that propagates NaN as ``np.maximum``/``np.minimum`` do."""
    key = (op, dtype.str)
    red = _NAN_OPS.get(key)
    if red is None:
        ufunc = np.maximum if op is ReduceOp.MAX else np.minimum

        def apply(inbuf: Any, inoutbuf: Any, datatype: MPI.Datatype) -> None:
            a = np.frombuffer(inbuf, dtype=dtype)
            b = np.frombuffer(inoutbuf, dtype=dtype)
            ufunc(a, b, out=b)

        red = _NAN_OPS[key] = MPIReduction(MPI.Op.Create(apply, commute=True), host_only=True)
    return red


def _has_nan(a: Any) -> bool:
    ne = a != a  # NaN is the only value unequal to itself (NumPy and CuPy alike)
    return bool(ne.any()) if hasattr(ne, "any") else bool(ne)


def nan_safe(red: MPIReduction, op: ReduceOp, dtype: np.dtype, inputs: Any, comm: Any,
             ranks: Any) -> MPIReduction:
    """``red``, or a NaN-propagating op when a MAX/MIN of floats meets a NaN on any rank.

    MPI's MAX and MIN do not propagate NaN (the result depends on the order in which
    ranks are combined, so ranks can even disagree). One flag is all-reduced first (a few
    microseconds); only when some rank holds a NaN does the reduction run as a
    user-defined op with NumPy's semantics. Collective over ``comm``.
    """
    if op not in (ReduceOp.MAX, ReduceOp.MIN) or dtype.kind != "f" or red.host_only:
        return red
    arrays = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    flag = np.array([any(_has_nan(a) for a in arrays)], dtype=np.uint8)
    with watch("NaN flag of a max/min reduction", ranks):
        comm.Allreduce(MPI.IN_PLACE, [flag, 1, MPI.UNSIGNED_CHAR], op=MPI.MAX)
    return _nan_op(op, dtype) if flag[0] else red
