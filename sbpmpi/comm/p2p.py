"""Point-to-point messages: blocking send/recv and non-blocking isend/irecv.

Peers are world ranks; with ``group=`` they must be members of the group and the
message travels on the group's communicator.
"""

from __future__ import annotations

import functools
import os
import time
from collections import deque
from typing import Any

from mpi4py import MPI

from .buffers import ArrayMeta, HostStager, array_meta, output_array_meta, stager
from .call import Call, call
from .dtypes import dtype_info
from .group import Group, root_rank
from .lifecycle import exit_agreement
from .lifecycle.watchdog import watch
from .trace import ACTIVE

__all__ = ["send", "recv", "isend", "irecv", "Work"]

@functools.cache
def _tag_ub() -> int:
    """The largest tag the MPI library takes (asked once)."""
    ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return int(ub) if ub is not None else 32767


def _tag(tag: Any, op: str) -> int:
    ub = _tag_ub()
    if type(tag) is not int or not 0 <= tag <= ub:
        raise ValueError(f"{op}: tag must be an int in [0, {ub}], got {tag!r}")
    return tag


def _peer(g: Group, comm: MPI.Intracomm, rank: Any, arg: str, op: str, blocking: bool) -> int:
    peer = root_rank(g, rank, arg, op)
    if blocking and peer == comm.Get_rank():
        raise ValueError(f"{op}: {arg}={rank} is this rank; a blocking {op} to itself would "
                         "deadlock (use isend/irecv)")
    return peer


def _check_count(status: MPI.Status, m: ArrayMeta, t: MPI.Datatype, src: Any, op: str) -> None:
    got = status.Get_count(t)
    if got != m.size:
        raise ValueError(f"{op}: received {got} elements from rank {src} into a buffer of "
                         f"{m.size}; sender and receiver must agree on the size")


class Work:
    """A pending isend/irecv: ``wait()`` blocks until it is done, ``test()`` polls.

    A received GPU array that was staged through host memory is filled at completion.
    An irecv from any rank is matched when it is tested or waited (see :func:`_probe`);
    the irecvs from any rank of one communicator and tag take the messages in the order
    they were posted, as MPI's would.
    """

    __slots__ = ("_req", "_stager", "_keep", "_recv", "_done", "_source", "_g", "_any")

    def __init__(self, req: MPI.Request | None, stager: HostStager, keep: Any,
                 recv: tuple[ArrayMeta, MPI.Datatype] | None, g: Group,
                 any_source: _AnySource | None = None) -> None:
        self._req = req
        self._stager = stager
        self._keep = keep
        self._recv = recv
        self._done = False
        self._source: int | None = None
        self._g = g
        self._any = any_source

    def _post_matched(self, block: bool) -> bool:
        """Match the irecvs from any rank posted up to this one (all, when ``block``);
        False when a message for this one has not arrived (``block`` False)."""
        a = self._any
        assert a is not None
        while self._req is None:
            msg = _probe(a.comm, a.tag, block)
            if msg is None:
                return False
            first = a.queue.popleft()  # the oldest posted takes the message
            first._req = msg.Irecv(first._keep_spec())
            first._any = None
        return True

    def _keep_spec(self) -> list[Any]:
        assert self._recv is not None
        meta, datatype = self._recv
        return [self._keep, meta.size, datatype]

    def _complete(self, status: MPI.Status) -> None:
        self._done = True
        try:
            if self._recv is not None:
                self._source = self._g.ranks[status.Get_source()]
                meta, datatype = self._recv
                _check_count(status, meta, datatype, self._source, "irecv")
                self._stager.finish()
        finally:
            self._stager.release()
            self._keep = None

    def wait(self) -> bool:
        """Block until the message is sent or received; returns True."""
        if not self._done:
            status = MPI.Status()
            with watch("wait", self._g.ranks):
                if self._req is None:
                    self._post_matched(block=True)
                assert self._req is not None
                _wait(self._req, status)
            self._complete(status)
        return True

    def test(self) -> bool:
        """True when the message is done (then the receive buffer holds the data)."""
        if not self._done:
            if self._req is None and not self._post_matched(block=False):
                return False
            assert self._req is not None
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


def _wait(req: MPI.Request, status: MPI.Status) -> None:
    """``req.Wait(status)``, polled so that a rank aborting the job meanwhile ends the
    wait with its cause (:func:`.exit_agreement.raise_if_aborted`: ``PeerAbortedError``)
    instead of ``MPI_Abort`` ending this rank without a word. Spins as ``MPI_Wait``
    does, yielding the core after a few tries; the notices are looked at every
    ``_NOTICE_EVERY`` tries (one ``MPI_Testsome``)."""
    if not exit_agreement.active():
        req.Wait(status)
        return
    tries = 0
    while not req.Test(status):
        tries += 1
        if tries % _NOTICE_EVERY == 0:
            exit_agreement.poll()
            exit_agreement.raise_if_aborted("waiting for a point-to-point message")
        if tries > 20:
            os.sched_yield()


_NOTICE_EVERY = 16


def _prepare(op: str, arr: Any, rank: int | None, tag: Any, group: Group | None,
             receive: bool, blocking: bool) -> tuple[Call, ArrayMeta, MPI.Datatype, int]:
    """(call, buffer metadata, MPI datatype, peer's group rank) of one point-to-point call."""
    c = call(op, group)
    m = output_array_meta(arr, "arr", op) if receive else array_meta(arr, "arr", op)
    t = dtype_info(m.dtype).mpi
    if receive and rank is None:  # receive from any rank
        peer = MPI.ANY_SOURCE
    else:
        peer = _peer(c.g, c.comm, rank, "src" if receive else "dst", op, blocking)
    _tag(tag, op)
    return c, m, t, peer


def send(arr: Any, dst: int, tag: int = 0, group: Group | None = None) -> None:
    """Send ``arr`` to world rank ``dst`` (blocking)."""
    c, m, t, peer = _prepare("send", arr, dst, tag, group, False, True)
    with stager(m.on_gpu) as st:
        buf = st.inp(arr, m)
        with c.mpi_call(m.nbytes, m.dtype, dst, m.on_gpu, st.staged):
            c.comm.Send([buf, m.size, t], dest=peer, tag=tag)


def recv(arr: Any, src: int | None = None, tag: int = 0, group: Group | None = None) -> int:
    """Receive into ``arr`` from world rank ``src`` (any rank if None); returns the sender."""
    c, m, t, peer = _prepare("recv", arr, src, tag, group, True, True)
    with stager(m.on_gpu) as st:
        buf = st.out(arr, m)
        status = MPI.Status()
        with c.mpi_call(0, m.dtype, src, m.on_gpu, st.staged):
            if peer == MPI.ANY_SOURCE:
                # the irecvs from any rank posted before take their messages first
                earlier = _ANY.get((c.comm.py2f(), tag))
                if earlier is not None and earlier.queue:
                    earlier.queue[-1]._post_matched(block=True)
                msg = _probe(c.comm, tag, block=True)
                assert msg is not None
                msg.Recv([buf, m.size, t], status=status)
            else:
                c.comm.Recv([buf, m.size, t], source=peer, tag=tag, status=status)
        sender = c.g.ranks[status.Get_source()]
        _check_count(status, m, t, sender, "recv")
    return sender


def _probe(comm: MPI.Intracomm, tag: int, block: bool) -> MPI.Message | None:
    """The next message of ``tag`` from any rank, found by a matched probe (polled until
    one arrives when ``block``; None at once when none has arrived and not ``block``).

    A receive from ``MPI_ANY_SOURCE`` posted after its message has arrived never completes
    under MPICH's UCX network layer (the mpich wheel's default between hosts; seen with
    MPICH 5.0.2 and UCX 1.20), while a probe finds the message and a receive of the probed
    message completes. So ``recv`` and ``irecv`` from any rank never post such a receive:
    they receive the probed message. The probe is polled, yielding the core after the
    first thousand tries, so the watchdog of the call still sees a stuck receive.
    """
    tries = 0
    while True:
        msg = comm.Improbe(source=MPI.ANY_SOURCE, tag=tag)
        if msg is not None or not block:
            return msg
        tries += 1
        if tries > 1000:
            time.sleep(50e-6)


class _AnySource:
    """The irecvs from any rank of one communicator and tag not yet matched, oldest first."""

    __slots__ = ("comm", "tag", "queue")

    def __init__(self, comm: MPI.Intracomm, tag: int) -> None:
        self.comm, self.tag = comm, tag
        self.queue: deque[Work] = deque()


# keyed by the communicator's handle (mpi4py's communicators are not hashable) and the tag
_ANY: dict[tuple[int, int], _AnySource] = {}


def _any_source(comm: MPI.Intracomm, tag: int) -> _AnySource:
    key = (comm.py2f(), tag)
    a = _ANY.get(key)
    if a is None or not a.queue:
        a = _ANY[key] = _AnySource(comm, tag)
    return a


# isend/irecv are not watched (posting returns at once); Work.wait is. The Work holds the
# staging buffers until completion, so they are released here only when posting fails.


def isend(arr: Any, dst: int, tag: int = 0, group: Group | None = None) -> Work:
    """Start sending ``arr`` to world rank ``dst``; do not modify ``arr`` before ``wait()``."""
    return _post("isend", arr, dst, tag, group, False)


def irecv(arr: Any, src: int | None = None, tag: int = 0, group: Group | None = None) -> Work:
    """Start receiving into ``arr`` from world rank ``src`` (any if None); read it after ``wait()``."""
    return _post("irecv", arr, src, tag, group, True)


def _post(name: str, arr: Any, rank: int | None, tag: int, group: Group | None,
          receive: bool) -> Work:
    """isend (``receive`` False) and irecv: post the message, return its :class:`Work`."""
    c, m, t, peer = _prepare(name, arr, rank, tag, group, receive, False)
    st = stager(m.on_gpu)
    try:
        buf = st.out(arr, m) if receive else st.inp(arr, m)
        if ACTIVE:
            c.note(0 if receive else m.nbytes, m.dtype, rank, m.on_gpu, st.staged)
        if receive and peer == MPI.ANY_SOURCE:  # matched later: see _probe
            a = _any_source(c.comm, tag)
            w = Work(None, st, buf, (m, t), c.g, a)
            a.queue.append(w)
            return w
        if receive:
            return Work(c.comm.Irecv([buf, m.size, t], source=peer, tag=tag), st, buf, (m, t),
                        c.g)
        return Work(c.comm.Isend([buf, m.size, t], dest=peer, tag=tag), st, buf, None, c.g)
    except BaseException:
        st.release()
        raise
