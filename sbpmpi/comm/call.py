"""The one skeleton of every sm.comm call: group, checks, agreement, trace, watch, staging.

A buffer call is written as::

    c = call("all_reduce", group)         # 1. resolve the group (WORLD for None)
    try:                                  # 2. describe and validate the buffers
        m = output_array_meta(arr, "arr", c.name)
    except (TypeError, ValueError) as e:
        c.refuse(e)                       #    (checked mode: raised on every rank)
    if checks._enabled:
        c.agree(sig)                      # 3. ranks agree on the signature (checked mode)
    if m[3] and c.gpu(_gpu.all_reduce, arr, m, op):
        return                            #    GPU transports (CUDA IPC)
    red = c.nan_safe(red, op, m[0], arr)  #    NaN-propagating MAX/MIN
    with stager(m[3]) as st:              # 4. stage; copy back on success; 7. release
        buf = st.out(arr, m, copy_in=True)
        with c.mpi_call(nbytes, m[0], None, m[3], st.staged):  # 5. trace note, 6. watch
            c.comm.Allreduce(...)

so tracing, agreement, the watchdog, staging, the GPU hooks and NaN-safe MAX/MIN are
written once, here and in :mod:`.buffers`. ``call`` hands out one cached :class:`Call` per
(name, group), so the skeleton costs no more than the copies it replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from .. import backend
from . import checks
from .gpu import route as _gpu
from .group import _WORLD_COMM, WORLD, Group, resolve
from .reduce_op import ORDERED, UFUNCS, MPIReduction, ReduceOp, user_op
from .tracing import ACTIVE, note
from .watchdog import watch

__all__ = ["Call", "call", "nan_safe", "host_only", "average"]


class Call:
    """One kind of call (``name``) on one group: its group ``g`` and communicator ``comm``."""

    __slots__ = ("name", "g", "comm", "ranks")

    def __init__(self, name: str, group: Group | None) -> None:
        self.name = name
        if group is None:
            self.g, self.comm = WORLD, _WORLD_COMM
        else:
            self.g, self.comm = resolve(group, name)
        self.ranks = self.g.ranks

    def refuse(self, e: TypeError | ValueError) -> NoReturn:
        """Raise the argument error ``e``; in checked mode every rank of the group raises
        it (see :func:`.checks.agree`)."""
        if checks._enabled:
            checks.agree(self.g, self.name, e)
        raise e

    def agree(self, sig: Sequence[tuple[str, Any]], extra: Any = None) -> list[tuple[Any, Any]]:
        """Checked mode: every rank of the group passed the same ``sig`` (callers test
        ``checks._enabled`` first, so the signature is built only when checking)."""
        return checks.agree(self.g, self.name, None, sig, extra)

    def gpu(self, route: Callable[..., bool], *args: Any) -> bool:
        """True when the GPU transport ``route`` (a :mod:`.gpu.route` call) did the call."""
        return _gpu.ENABLED and route(*args, self.g, self.comm)

    def nan_safe(self, red: MPIReduction, op: ReduceOp, dtype: np.dtype,
                 inputs: Any) -> MPIReduction:
        """:func:`nan_safe` on this call's group."""
        if op not in ORDERED:
            return red
        return nan_safe(red, op, dtype, inputs, self.comm, self.g.ranks)

    def note(self, nbytes: int, dtype: Any = "", peer: int | None = None, device: bool = False,
             staged: bool = False) -> None:
        """Note the call in the active traces (callers test ``if ACTIVE:`` first, so the
        arguments are computed only while tracing)."""
        note(self.name, nbytes, self.g, dtype, peer, device, staged)

    def mpi_call(self, nbytes: int | Callable[[], int] = 0, dtype: Any = "",
                 peer: int | None = None, device: bool = False, staged: bool = False) -> Any:
        """Steps 5 and 6: note the call in the active traces (``nbytes`` may be a function,
        called only while tracing) and return the watchdog's context for the MPI call
        itself, so that no call of the group runs unwatched::

            with c.mpi_call(nbytes, dtype, peer, device, st.staged):
                c.comm.Allreduce(...)
        """
        if ACTIVE:
            note(self.name, nbytes() if callable(nbytes) else nbytes, self.g, dtype, peer,
                 device, staged)
        return watch(self.name, self.ranks)


def host_only(red: MPIReduction, a: Any, m: tuple[Any, ...]) -> bool:
    """User-defined ops, and averaging a GPU array that is not CuPy, need host memory."""
    return red.host_only or (red.average and m[3] and not backend.is_cupy_array(a))


def average(buf: Any, n: int) -> None:
    """Divide a SUM result by the group size (ReduceOp.AVG)."""
    buf /= n


class _WorldCalls(dict[str, Call]):
    def __missing__(self, name: str) -> Call:
        c = self[name] = Call(name, None)
        return c


_WORLD_CALLS = _WorldCalls()
_CALLS: dict[tuple[str, Group | None], Call] = {}


def call(name: str, group: Group | None) -> Call:
    """The :class:`Call` of ``name`` on ``group`` (cached per member group)."""
    if group is None:
        return _WORLD_CALLS[name]
    try:
        return _CALLS[name, group]
    except (KeyError, TypeError):  # TypeError: an unhashable group, refused by Call
        c = Call(name, group)
        _CALLS[name, group] = c
        return c


# -- NaN-safe MAX/MIN ---------------------------------------------------------------------------

_NAN_OPS: dict[tuple[ReduceOp, str], MPIReduction] = {}


def _nan_op(op: ReduceOp, dtype: np.dtype) -> MPIReduction:
    """A user-defined MAX/MIN that propagates NaN as ``np.maximum``/``np.minimum`` do."""
    key = (op, dtype.str)
    red = _NAN_OPS.get(key)
    if red is None:
        red = _NAN_OPS[key] = MPIReduction(user_op(UFUNCS[op], dtype), host_only=True)
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
    if op not in ORDERED or dtype.kind != "f" or red.host_only:
        return red
    arrays = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    flag = np.array([any(_has_nan(a) for a in arrays)], dtype=np.uint8)
    with watch("NaN flag of a max/min reduction", ranks):
        comm.Allreduce(MPI.IN_PLACE, [flag, 1, MPI.UNSIGNED_CHAR], op=MPI.MAX)
    return _nan_op(op, dtype) if flag[0] else red
