"""The one skeleton of every sm.comm call: group, checks, agreement, trace, watch, staging.

A buffer call is written as::

    c = call("all_reduce", group)         # 1. resolve the group (WORLD for None)
    try:                                  # 2. describe and validate the buffers
        m = output_array_meta(arr, "arr", c.name)
    except (TypeError, ValueError) as e:
        c.refuse(e)                       #    (checked mode: raised on every rank)
    sig = _sig(...) if checks.checking() else None
    if c.gpu(_gpu.all_reduce, m.on_gpu, sig, arr, m, op):
        return                            # 3. agree on the signature (checked mode) and,
                                          #    with the ipc transport, on the route
    red = c.nan_safe(red, op, m.dtype, arr)  #    NaN-propagating MAX/MIN
    with stager(m.on_gpu) as st:              # 4. stage; copy back on success; 7. release
        buf = st.out(arr, m, copy_in=True)
        with c.mpi_call(nbytes, m.dtype, None, m.on_gpu, st.staged):  # 5. trace note, 6. watch
            c.comm.Allreduce(...)

so tracing, agreement, the watchdog, staging, the GPU hooks and NaN-safe MAX/MIN are
written once, here and in :mod:`.buffers`. ``call`` hands out one cached :class:`Call` per
(name, group), so the skeleton costs no more than the copies it replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from .. import backend
from .agreement import checks
from .agreement import exchange as agreement
from .buffers import ArrayMeta
from .gpu import route as _gpu
from .group import WORLD, WORLD_COMM, Group, resolve
from .lifecycle.watchdog import watch
from .nan_reduction import nan_safe
from .reduce_op import ORDERED, MPIReduction, ReduceOp
from .trace import ACTIVE, note

__all__ = ["Call", "call", "nan_safe", "host_only", "average"]


class Call:
    """One kind of call (``name``) on one group: its group ``g`` and communicator ``comm``."""

    __slots__ = ("name", "g", "comm", "ranks")

    def __init__(self, name: str, group: Group | None) -> None:
        self.name = name
        if group is None:
            self.g, self.comm = WORLD, WORLD_COMM
        else:
            self.g, self.comm = resolve(group, name)
        self.ranks = self.g.ranks

    def refuse(self, e: TypeError | ValueError) -> NoReturn:
        """Raise the argument error ``e``; in checked mode every rank of the group raises
        it (see :func:`.agreement.checks.agree`)."""
        if checks.checking():
            checks.agree(self.g, self.name, e)
        raise e

    def agree(self, sig: Sequence[tuple[str, Any]], extra: Any = None) -> list[tuple[Any, Any]]:
        """Checked mode: every rank of the group passed the same ``sig`` (callers test
        ``checks.checking()`` first, so the signature is built only when checking)."""
        return checks.agree(self.g, self.name, None, sig, extra)

    def gpu(self, route: Callable[..., bool], device: bool,
            sig: Sequence[tuple[str, Any]] | None, *args: Any, **kwargs: Any) -> bool:
        """Step 3: True when the GPU transport ``route`` (a :mod:`.gpu.route` call) carried
        the call, on every rank of the group alike.

        ``device``: every array of the call on this rank is a GPU array; ``sig``: the
        checked-mode signature (None when not checking), agreed here. While the ``ipc``
        transport is on, every rank (host arrays too) asks ``route``, and the group decides
        the route in one exchange, which in checked mode is the signature agreement itself;
        inside a step the ranks agreed on as a whole (:func:`.agreement.checks.agreed`, a layout
        conversion), host arrays are host arrays on every rank, and need no exchange.
        """
        if not _gpu.STATE.enabled:
            if sig is not None:
                checks.agree(self.g, self.name, None, sig)
            return False
        if not device and checks.within_agreed():
            return False  # an agreed step: every rank's arrays are host arrays, as here
        vote = _RouteVote(self, sig)
        done = route(_gpu.GroupCall(vote, device, self.g, self.comm), *args, **kwargs)
        if sig is not None and not vote.asked:  # the route was known: no vote was needed
            checks.agree(self.g, self.name, None, sig)
        return bool(done)

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
        note(self.name, nbytes, self.g, dtype, peer=peer, device=device, staged=staged)

    def mpi_call(self, nbytes: int | Callable[[], int] = 0, dtype: Any = "",
                 peer: int | None = None, device: bool = False, staged: bool = False,
                 nonblocking: bool = False) -> Any:
        """Steps 5 and 6: note the call in the active traces (``nbytes`` may be a function,
        called only while tracing) and return the watchdog's context for the MPI call
        itself, so that no call of the group runs unwatched::

            with c.mpi_call(nbytes, dtype, peer, device, st.staged):
                c.comm.Allreduce(...)

        A non-blocking call (``nonblocking=True``) is noted when it starts; its
        :class:`~sbpmpi.comm.collectives.work.CollectiveWork` keeps the context and enters
        it around the wait.
        """
        if ACTIVE:
            note(self.name, nbytes() if callable(nbytes) else nbytes, self.g, dtype, peer=peer,
                 device=device, staged=staged, nonblocking=nonblocking)
        return watch(self.name, self.ranks)


class _RouteVote:
    """The group's decision of one call's route (:mod:`.gpu.route`'s ``agree``): whether
    every rank of the group is ready for the IPC path, in one exchange (the signature
    agreement in checked mode)."""

    __slots__ = ("call", "sig", "asked")

    def __init__(self, call: Call, sig: Sequence[tuple[str, Any]] | None) -> None:
        self.call, self.sig, self.asked = call, sig, False

    def __call__(self, ready: bool) -> bool:
        self.asked = True
        c = self.call
        if self.sig is None:
            return agreement.all_ok(ready, c.g)
        return not checks.agree_flag(c.g, c.name, self.sig, not ready)


def host_only(red: MPIReduction, a: Any, m: ArrayMeta) -> bool:
    """User-defined ops, and averaging a GPU array that is not CuPy, need host memory."""
    return red.host_only or (red.average and m.on_gpu and not backend.is_cupy_array(a))


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
