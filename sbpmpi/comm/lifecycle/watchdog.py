"""Watchdog: abort a job whose rank is stuck in a collective for too long.

With a timeout set (``SBPMPI_TIMEOUT=<seconds>``, or ``sm.config.update(timeout=...)``: the
setting :data:`sbpmpi.config.timeout`), every blocking call wrapped in
:func:`watch` gets a deadline. A daemon thread checks the deadlines; when one
passes, it prints which op the rank is stuck in, which peers it waits on, and the
stuck thread's stack, then aborts the whole job (exit code 124). Unset (the
default), :func:`watch` returns a shared no-op context manager.

    with watchdog.watch("all_reduce", peers=group.ranks):
        comm.Allreduce(...)
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ... import config

__all__ = ["EXIT_CODE", "timeout", "watch", "watched", "active"]

EXIT_CODE = 124
_TIMEOUT = config.timeout  # read on every watched call

F = TypeVar("F", bound=Callable[..., Any])


def timeout() -> float | None:
    """The watchdog timeout in seconds, or None when off (the setting ``timeout``)."""
    return _TIMEOUT.value


@dataclass(frozen=True)
class _Entry:
    op: str
    peers: tuple[int, ...] | None
    start: float
    deadline: float
    thread_id: int
    thread_name: str


@dataclass
class WatchdogState:
    """This process's watches: the timed blocks open now and the thread that checks their
    deadlines; the exit watches open now, their thread, and whether the exit watch is on
    (decided on first use, again after the setting changes)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    entries: dict[int, _Entry] = field(default_factory=dict)
    ids: Iterator[int] = field(default_factory=itertools.count)
    thread: threading.Thread | None = None
    open: list[_ExitWatch] = field(default_factory=list)
    exit_thread: threading.Thread | None = None
    exit_on: bool | None = None

    def exit_watch_on(self) -> bool:
        if self.exit_on is None:
            from . import exit_agreement

            self.exit_on = exit_agreement.active() and config.exit_watch.value
        return self.exit_on

    def forget_exit_on(self, _: object = None) -> None:
        self.exit_on = None

    def ensure_thread(self) -> None:
        """Start the deadline thread (again, if it died)."""
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=_run, name="sbpmpi-watchdog", daemon=True)
            self.thread.start()

    def start_exit_thread(self) -> None:
        if self.exit_thread is None:
            self.exit_thread = threading.Thread(target=_exit_run, name="sbpmpi-exit-watch",
                                                daemon=True)
            self.exit_thread.start()


STATE = WatchdogState()


class _NullWatch:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _NullWatch()


def _peer_ranks(peers: Any) -> tuple[int, ...] | None:
    if peers is None:
        return None
    ranks = getattr(peers, "ranks", None)  # a comm.Group
    if ranks is not None and not hasattr(ranks, "tolist"):
        peers = ranks
    elif hasattr(peers, "rank_list"):  # a Placement
        peers = peers.rank_list
    if isinstance(peers, int):
        return (peers,)
    return tuple(int(r) for r in peers)


class _Watch:
    __slots__ = ("_op", "_peers", "_seconds", "_id")

    def __init__(self, op: str, peers: Any, seconds: float) -> None:
        self._op = op
        self._peers = _peer_ranks(peers)
        self._seconds = seconds
        self._id = -1

    def __enter__(self) -> None:
        now = time.monotonic()
        th = threading.current_thread()
        entry = _Entry(self._op, self._peers, now, now + self._seconds, th.ident or 0, th.name)
        self._id = next(STATE.ids)
        with STATE.cond:
            STATE.entries[self._id] = entry
            STATE.ensure_thread()
            STATE.cond.notify()

    def __exit__(self, *exc: object) -> None:
        with STATE.cond:
            STATE.entries.pop(self._id, None)


# -- the exit watch: on by default, no timeout --------------------------------------------------
# A blocking call (an sm.comm collective) cannot poll for the "finished" notices of
# sbpmpi.comm.lifecycle.exit_agreement itself. Without a timeout, watch() registers it in a list that a
# daemon thread looks at every EXIT_POLL seconds: when a call has been open for more than
# EXIT_AFTER seconds and one of its peers has reached the end of the program, the call can
# never complete, so the thread agrees on the cause with the other ranks and aborts the job.
# Cost per call: one small object and a list append/remove (under a microsecond).
EXIT_POLL = 0.25
EXIT_AFTER = 1.0
config.on_update("exit_watch", STATE.forget_exit_on)


def _world_size() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_size())


# Point-to-point calls wait on one partner that a group's numbering cannot tell: the exit
# watch fires for them only when every other rank of the group has finished.
_P2P = ("send", "recv", "wait")


class _ExitWatch:
    __slots__ = ("op", "peers", "start", "key", "seq")

    def __init__(self, op: str, peers: Any) -> None:
        from . import exit_agreement

        self.op = op
        self.peers = _peer_ranks(peers) or tuple(range(_world_size()))
        self.key, self.seq = ("", 0) if op in _P2P else exit_agreement.enter("comm", self.peers)

    def __enter__(self) -> None:
        self.start = time.monotonic()
        STATE.open.append(self)
        if STATE.exit_thread is None:
            STATE.start_exit_thread()

    def __exit__(self, *exc: object) -> None:
        try:
            STATE.open.remove(self)
        except ValueError:
            pass


def _exit_run() -> None:
    from mpi4py import MPI

    from . import exit_agreement

    while True:
        time.sleep(EXIT_POLL)
        now = time.monotonic()
        late = [w for w in list(STATE.open) if now - w.start > EXIT_AFTER]
        if not late:
            continue
        exit_agreement.poll()
        peer = exit_agreement.aborted_peer()
        if peer is not None:  # a rank is aborting the job: say why before MPI_Abort comes
            _fire_aborted(late[0], *peer)
        gone = set(exit_agreement.states())
        me = MPI.COMM_WORLD.Get_rank()
        for w in late:
            if not w.key:  # point to point: only once every partner it could have is gone
                if all(r in gone for r in w.peers if r != me) and len(w.peers) > 1:
                    _fire_exit(w, w.peers)
            elif any(exit_agreement.cannot_meet(r, w.key, w.seq) for r in w.peers):
                _fire_exit(w, w.peers)


def _fire_exit(w: _ExitWatch, peers: tuple[int, ...]) -> None:
    from mpi4py import MPI

    from . import exit_agreement
    from .abort import abort

    rank = MPI.COMM_WORLD.Get_rank()
    text = f"{w.op} (sm.comm, waiting on ranks {list(peers)})"
    message = exit_agreement.fail(text, peers)
    abort(f"sbpmpi: rank {rank}: CollectiveMismatchError: {message}\nsbpmpi: rank {rank}: "
          f"aborting all {MPI.COMM_WORLD.Get_size()} ranks (MPI_Abort)", 1)


def _fire_aborted(w: _ExitWatch, rank: int, cause: str) -> None:
    """A blocking call that cannot poll, open while rank ``rank`` aborts the job: print
    that rank's cause as this rank's and abort (the job is ending either way)."""
    from mpi4py import MPI

    from .abort import abort

    me = MPI.COMM_WORLD.Get_rank()
    abort(f"sbpmpi: rank {me}: PeerAbortedError: rank {rank} is aborting the job: {cause} "
          f"(this rank was in {w.op} (sm.comm, waiting on ranks {list(w.peers)}))\n"
          f"sbpmpi: rank {me}: aborting all {MPI.COMM_WORLD.Get_size()} ranks (MPI_Abort)", 1)


def watch(op: str, peers: Iterable[int] | Any = None, seconds: float | None = None,
          watches_exits: bool = False) -> Any:
    """Context manager: abort the job if the block takes longer than the timeout.

    Parameters
    ----------
    op : str
        What the block does, e.g. ``"all_reduce"``; printed if it times out.
    peers : sequence of int, Group or Placement, optional
        World ranks the call waits on (all ranks of the world if None).
    seconds : float, optional
        Overrides the setting ``timeout`` for this block.
    watches_exits : bool
        The block notices peers that reached the end of the program itself (the
        agreement's polled wait): without a timeout it needs no exit watch.
    """
    t = _TIMEOUT.value if seconds is None else seconds
    if t is None:
        if watches_exits:
            return _NULL
        on = STATE.exit_on
        return _ExitWatch(op, peers) if on or (on is None and STATE.exit_watch_on()) else _NULL
    return _Watch(op, peers, t)


def watched(op: str) -> Callable[[F], F]:
    """Decorator form of :func:`watch` (peers: the world)."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            with watch(op):
                return fn(*args, **kw)

        return wrapper  # type: ignore[return-value]

    return deco


def active() -> list[tuple[str, tuple[int, ...] | None, float]]:
    """The watched blocks now open, as ``(op, peers, seconds so far)``, oldest first."""
    now = time.monotonic()
    with STATE.cond:
        items = sorted(STATE.entries.values(), key=lambda e: e.start)
    return [(e.op, e.peers, now - e.start) for e in items]


def _run() -> None:
    cond, entries = STATE.cond, STATE.entries
    while True:
        with cond:
            while True:
                if not entries:
                    cond.wait()
                    continue
                now = time.monotonic()
                late = min(entries.values(), key=lambda e: e.deadline)
                if late.deadline > now:
                    # a timer takes no more than TIMEOUT_MAX (config refuses longer timeouts;
                    # watch(seconds=...) may still pass one): wake up and look again
                    cond.wait(min(late.deadline - now, threading.TIMEOUT_MAX))
                    continue
                stack = [e for e in entries.values() if e.thread_id == late.thread_id]
                break
        _fire(late, sorted(stack, key=lambda e: e.start))


def _describe_peers(peers: tuple[int, ...] | None, size: int) -> str:
    if peers is None:
        return f"all {size} ranks of the world"
    return f"ranks {list(peers)}"


def _finished_peers(peers: tuple[int, ...] | None, size: int) -> list[int]:
    """Peers known to have reached the end of the program (sbpmpi.comm.lifecycle.exit_agreement)."""
    try:
        from . import exit_agreement

        exit_agreement.poll()
        done = set(exit_agreement.finished_ranks())
    except Exception:
        return []
    return [r for r in (peers if peers is not None else range(size)) if r in done]


def _fire(late: _Entry, stack: list[_Entry]) -> None:
    from mpi4py import MPI

    from .abort import abort

    rank = MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() else 0
    size = MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 1
    waited = time.monotonic() - late.start
    lines = [
        f"sbpmpi: rank {rank}: watchdog: stuck for {waited:.1f} s in {late.op!r} waiting on "
        f"{_describe_peers(late.peers, size)} ({_TIMEOUT.env}={late.deadline - late.start:g})",
        f"sbpmpi: rank {rank}: a peer has crashed, hangs, or called a different collective "
        f"at this step",
    ]
    if len(stack) > 1:
        lines.append(f"sbpmpi: rank {rank}: inside: " + " > ".join(e.op for e in stack))
    gone = _finished_peers(late.peers, size)
    if gone:
        lines.append(f"sbpmpi: rank {rank}: rank{'s' if len(gone) > 1 else ''} "
                     f"{', '.join(map(str, gone))} already reached the end of the program")
    frame = sys._current_frames().get(late.thread_id)
    if frame is not None:
        lines.append(f"stack of thread {late.thread_name!r} (most recent call last):")
        lines.append("".join(traceback.format_stack(frame)).rstrip("\n"))
    lines.append(f"sbpmpi: rank {rank}: aborting all {size} ranks (MPI_Abort, exit code "
                 f"{EXIT_CODE})")
    abort("\n".join(lines), EXIT_CODE)
