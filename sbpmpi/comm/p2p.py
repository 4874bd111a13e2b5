"""Point-to-point messages: blocking send/recv and non-blocking isend/irecv.

Peers are world ranks; with ``group=`` they must be members of the group and the
message travels on the group's communicator.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from ..watchdog import watch
from .buffers import ArrayMeta, HostStager, describe, describe_out, stager
from .dtypes import dtype_info
from .group import Group, resolve, root_rank
from .tracing import ACTIVE, note

__all__ = ["send", "recv", "isend", "irecv", "Work"]

_TAG_UB: int | None = None


def _tag(tag: Any, op: str) -> int:
    global _TAG_UB
    if _TAG_UB is None:
        ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        _TAG_UB = int(ub) if ub is not None else 32767
    if type(tag) is not int or not 0 <= tag <= _TAG_UB:
        raise ValueError(f"{op}: tag must be an int in [0, {_TAG_UB}], got {tag!r}")
    return tag


def _peer(g: Group, comm: MPI.Intracomm, rank: Any, arg: str, op: str, blocking: bool) -> int:
    peer = root_rank(g, rank, arg, op)
    if blocking and peer == comm.Get_rank():
        raise ValueError(f"{op}: {arg}={rank} is this rank; a blocking {op} to itself would "
                         "deadlock (use isend/irecv)")
    return peer


def _check_count(status: MPI.Status, m: ArrayMeta, t: MPI.Datatype, src: Any, op: str) -> None:
    got = status.Get_count(t)
    if got != m[1]:
        raise ValueError(f"{op}: received {got} elements from rank {src} into a buffer of "
                         f"{m[1]}; sender and receiver must agree on the size")


class Work:
    """A pending isend/irecv: ``wait()`` blocks until it is done, ``test()`` polls.

    A received GPU array that was staged through host memory is filled at completion.
    """

    __slots__ = ("_req", "_stager", "_keep", "_recv", "_done", "_source", "_g")

    def __init__(self, req: MPI.Request, stager: HostStager, keep: Any,
                 recv: tuple[ArrayMeta, MPI.Datatype] | None, g: Group) -> None:
        self._req = req
        self._stager = stager
        self._keep = keep
        self._recv = recv
        self._done = False
        self._source: int | None = None
        self._g = g

    def _complete(self, status: MPI.Status) -> None:
        self._done = True
        try:
            if self._recv is not None:
                self._source = self._g.ranks[status.Get_source()]
                _check_count(status, self._recv[0], self._recv[1], self._source, "irecv")
                self._stager.finish()
        finally:
            self._stager.release()
            self._keep = None

    def wait(self) -> bool:
        """Block until the message is sent or received; returns True."""
        if not self._done:
            status = MPI.Status()
            with watch("wait", self._g.ranks):
                self._req.Wait(status)
            self._complete(status)
        return True

    def test(self) -> bool:
        """True when the message is done (then the receive buffer holds the data)."""
        if not self._done:
            status = MPI.Status()
            if self._req.Test(status):
                self._complete(status)
        return self._done

    def is_completed(self) -> bool:
        """Same as :meth:`test` (torch.distributed's name)."""
        return self.test()

    @property
    def source(self) -> int | None:
        """World rank the received message came from (after completion of an irecv)."""
        return self._source

    def __repr__(self) -> str:
        kind = "irecv" if self._recv is not None else "isend"
        return f"<Work {kind} {'done' if self._done else 'pending'}>"


def send(arr: Any, dst: int, tag: int = 0, group: Group | None = None) -> None:
    """Send ``arr`` to world rank ``dst`` (blocking)."""
    g, comm = resolve(group, "send")
    m = describe(arr, "arr", "send")
    t = dtype_info(m[0]).mpi
    peer = _peer(g, comm, dst, "dst", "send", True)
    _tag(tag, "send")
    st = stager(m[3])
    try:
        buf = st.inp(arr, m)
        if ACTIVE:
            note("send", m[1] * m[0].itemsize, g, m[0], dst, m[3], st.staged)
        with watch("send", g.ranks):
            comm.Send([buf, m[1], t], dest=peer, tag=tag)
    finally:
        st.release()


def recv(arr: Any, src: int | None = None, tag: int = 0, group: Group | None = None) -> int:
    """Receive into ``arr`` from world rank ``src`` (any rank if None); returns the sender."""
    g, comm = resolve(group, "recv")
    m = describe_out(arr, "arr", "recv")
    t = dtype_info(m[0]).mpi
    peer = MPI.ANY_SOURCE if src is None else _peer(g, comm, src, "src", "recv", True)
    _tag(tag, "recv")
    st = stager(m[3])
    try:
        buf = st.out(arr, m)
        if ACTIVE:
            note("recv", 0, g, m[0], src, m[3], st.staged)
        status = MPI.Status()
        with watch("recv", g.ranks):
            comm.Recv([buf, m[1], t], source=peer, tag=tag, status=status)
        sender = g.ranks[status.Get_source()]
        _check_count(status, m, t, sender, "recv")
        st.finish()
    finally:
        st.release()
    return sender


def isend(arr: Any, dst: int, tag: int = 0, group: Group | None = None) -> Work:
    """Start sending ``arr`` to world rank ``dst``; do not modify ``arr`` before ``wait()``."""
    g, comm = resolve(group, "isend")
    m = describe(arr, "arr", "isend")
    t = dtype_info(m[0]).mpi
    peer = _peer(g, comm, dst, "dst", "isend", False)
    _tag(tag, "isend")
    st = stager(m[3])
    try:
        buf = st.inp(arr, m)
        if ACTIVE:
            note("isend", m[1] * m[0].itemsize, g, m[0], dst, m[3], st.staged)
        req = comm.Isend([buf, m[1], t], dest=peer, tag=tag)
    except BaseException:
        st.release()
        raise
    return Work(req, st, buf, None, g)


def irecv(arr: Any, src: int | None = None, tag: int = 0, group: Group | None = None) -> Work:
    """Start receiving into ``arr`` from world rank ``src`` (any if None); read it after ``wait()``."""
    g, comm = resolve(group, "irecv")
    m = describe_out(arr, "arr", "irecv")
    t = dtype_info(m[0]).mpi
    peer = MPI.ANY_SOURCE if src is None else _peer(g, comm, src, "src", "irecv", False)
    _tag(tag, "irecv")
    st = stager(m[3])
    try:
        buf = st.out(arr, m)
        if ACTIVE:
            note("irecv", 0, g, m[0], src, m[3], st.staged)
        req = comm.Irecv([buf, m[1], t], source=peer, tag=tag)
    except BaseException:
        st.release()
        raise
    return Work(req, st, buf, (m, t), g)
