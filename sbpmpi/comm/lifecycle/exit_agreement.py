"""Exit-time agreement: the end of the program is a collective step like any other.

A rank that reaches interpreter exit (the end of the script, ``sys.exit``, or an
uncaught exception with abort off) sends a "finished" notice to every other rank and
waits, without burning a core, until every rank has finished. A rank waiting in a
consistency check (:func:`sbpmpi.runtime.consistency.check_collective`, which runs before
every op, conversion, ``x.numpy()``, save and load) polls for these notices while its
exchange is in flight; when a rank of its group has finished, the check can never
complete, so it tells the others what it was doing, collects what every rank of the
group was doing for a moment, and every rank ends with the same cause::

    ranks disagree on a collective step:
      rank 0: x.numpy(tensor((4,), float64, sbp=(S(0)), placement=cpu[0, 1, 2]))
      ranks 1, 2: reached the end of the program

The waiting ranks raise it as :class:`~sbpmpi.errors.CollectiveMismatchError`; the
finished ranks print it and exit with code 1, so the job ends within seconds under
the default settings.

A rank that aborts the job (:func:`sbpmpi.comm.lifecycle.abort.abort`) sends its cause as an
"aborted" notice first (:func:`announce_abort`) and waits up to :data:`ANNOUNCE_WAIT`
seconds for the others to take it: a rank waiting in a check or for a point-to-point
message raises :class:`~sbpmpi.errors.PeerAbortedError` with that cause, and one
blocked in an ``sm.comm`` collective has the exit watch print it, so ``MPI_Abort`` does
not end it without a word.

The notices travel on a duplicate of the world communicator made at ``import sbpmpi``
(collective), so they never match a user's messages. Every receive names its source:
one 16-byte receive is posted per peer for the head of its next notice (kind, length),
and the text follows from the same peer under a second tag. A receive from
``MPI_ANY_SOURCE`` posted after its message had arrived never completes under MPICH
with its UCX network layer (across hosts, or on one with ``MPIR_CVAR_NOLOCAL=1``),
and every program would hang at exit. A check that is not answered at once costs one
``MPI_Testsome`` over these receives per poll in addition to its all-reduce; nothing
else is sent while the program runs.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from ...errors import PeerAbortedError
from ..agreement.mismatch import SAME_CALLS, mismatch_message
from . import abort

__all__ = ["init", "active", "FINISHED_TEXT", "wait", "fail", "finished_ranks", "poll", "states",
           "GRACE", "enter", "cannot_meet", "announce_abort", "aborted_peer",
           "raise_if_aborted", "ANNOUNCE_WAIT"]

FINISHED_TEXT = "reached the end of the program"
GRACE = 3.0  # seconds a failing check waits to hear what the other ranks of its group do
_TAG = 0x5BB1  # the head of a notice: int64 (kind, length of its text)
_TEXT_TAG = 0x5BB2  # the text of a notice, from the same peer
_KINDS = ("finished", "stuck", "verdict", "aborted")  # a notice's kind, by its code in the head

_MAX_NOTICE = 1 << 16  # bytes; longer texts are cut


@dataclass
class ExitState:
    """This rank's side of the exit agreement: its communicator, the notices it has
    received and sent, and the verdict once a failure has been agreed on."""

    comm: Any = None  # the duplicate of the world communicator (None for one process)
    # world rank -> what it is doing for good (finished / stuck in X)
    states: dict[int, str] = field(default_factory=dict)
    verdict: str | None = None  # the final message, once a failure has been agreed on
    broken: bool = False  # this rank raised an exit-time mismatch: it must not wait at exit
    sends: list[Any] = field(default_factory=list)  # notices in flight, with their buffers
    # One receive per peer, indexed by world rank (REQUEST_NULL for this rank): the head of
    # the peer's next notice, or, once the head has come, its text.
    reqs: list[Any] = field(default_factory=list)
    heads: Any = None  # int64 (size, 2): the heads' buffers
    # peer -> (kind, buffer) of a text in flight
    texts: dict[int, tuple[str, bytearray]] = field(default_factory=dict)
    # the receives are tested by the main and the watchdog thread
    lock: threading.RLock = field(default_factory=threading.RLock)
    # verdicts to finished ranks, matched before this rank exits
    verdict_sends: list[Any] = field(default_factory=list)
    # Checks and sm.comm collectives entered per group (the key names the kind and the
    # group's world ranks). A finished rank sends its counts, so a peer whose check that
    # rank took part in sees it and keeps waiting: the exchange will complete (the finished
    # rank contributed before it finished), where a check numbered above the finished
    # rank's count for the group never can.
    checks: dict[str, int] = field(default_factory=dict)
    peer_checks: dict[int, dict[str, int] | None] = field(default_factory=dict)
    aborted: dict[int, str] = field(default_factory=dict)  # world rank -> its abort's cause

    def take_verdict(self, text: str) -> None:
        """Keep the first verdict heard."""
        if self.verdict is None:
            self.verdict = text


STATE = ExitState()
ANNOUNCE_WAIT = 2.0  # seconds an aborting rank waits for its peers to receive its cause


def init() -> None:
    """Duplicate the world communicator and register the exit handler (collective, at import)."""
    if STATE.comm is not None or MPI.COMM_WORLD.Get_size() == 1:
        return
    STATE.comm = MPI.COMM_WORLD.Dup()
    me, size = STATE.comm.Get_rank(), STATE.comm.Get_size()
    STATE.heads = np.zeros((size, 2), dtype=np.int64)
    STATE.reqs[:] = [MPI.REQUEST_NULL] * size
    for p in range(size):
        if p != me:
            _post_head(p)
    atexit.register(_at_exit)
    abort.ANNOUNCERS.append(announce_abort)


def _post_head(peer: int) -> None:
    STATE.reqs[peer] = STATE.comm.Irecv([STATE.heads[peer], MPI.INT64_T], source=peer, tag=_TAG)


def _arrived() -> None:
    """Take every notice that has arrived (call under ``STATE.lock``)."""
    while True:
        done = MPI.Request.Testsome(STATE.reqs)
        if not done:  # None: no receive posted; []: none completed
            return
        for p in done:
            text = STATE.texts.pop(p, None)
            if text is None:  # the head: post the receive of the text it announces
                code, length = (int(v) for v in STATE.heads[p])
                buf = bytearray(length)
                STATE.texts[p] = (_KINDS[code], buf)
                STATE.reqs[p] = STATE.comm.Irecv([buf, MPI.BYTE], source=p, tag=_TEXT_TAG)
            else:
                _post_head(p)
                _take(p, text[0], bytes(text[1]).decode(errors="replace"))


def _take(src: int, kind: str, text: str) -> None:
    """Record the notice of kind ``kind`` that rank ``src`` sent."""
    if kind == "verdict":
        STATE.take_verdict(text)
    elif kind == "aborted":
        STATE.aborted.setdefault(src, text)
    elif kind == "finished":
        text, _, counts = text.partition("\0")
        try:
            STATE.peer_checks[src] = {k: int(v) for k, v in json.loads(counts).items()}
        except ValueError:  # cut at _MAX_NOTICE: fall back to waiting GRACE seconds
            STATE.peer_checks[src] = None
        STATE.states.setdefault(src, text)
    else:
        STATE.states.setdefault(src, text)


def active() -> bool:
    """True when the agreement runs (a world of more than one process, after ``init``)."""
    return STATE.comm is not None


def fail(text: str, ranks: Sequence[int]) -> str:
    """Agree that a call of world ``ranks`` (this rank doing ``text``) cannot complete.

    For a blocking call that cannot poll (an ``sm.comm`` call, seen by the watchdog
    thread): tells every rank, collects what the others of ``ranks`` are doing for a
    moment, hands the verdict to the finished ranks and returns it.
    """
    message = _fail(text, ranks)
    deadline = time.monotonic() + 2.0
    while not MPI.Request.Testall(STATE.verdict_sends) and time.monotonic() < deadline:
        time.sleep(0.002)
    return message


def states() -> dict[int, str]:
    """What the ranks this rank has heard from are doing for good (world rank -> text)."""
    return dict(STATE.states)


def finished_ranks() -> list[int]:
    """World ranks known to have reached the end of the program."""
    return sorted(r for r, t in STATE.states.items() if t == FINISHED_TEXT)


def poll() -> None:
    """Receive the notices that have arrived (cheap: one ``MPI_Testsome`` when none has)."""
    if STATE.comm is None:
        return
    with STATE.lock:
        _arrived()


def announce_abort(cause: str) -> None:
    """Tell every other rank that this one is aborting the job with ``cause`` (called by
    :func:`sbpmpi.comm.lifecycle.abort.abort` before ``MPI_Abort``), and wait up to
    :data:`ANNOUNCE_WAIT` seconds until each has received it: a rank waiting for a
    message or a check polls for it and raises :class:`~sbpmpi.errors.PeerAbortedError`
    with the cause, so its output says why the job ended before ``MPI_Abort`` ends it.

    Nothing is sent by a rank ending with an agreed failure (its peers have the verdict)
    or aborting because a peer is (the peers have that one's cause).
    """
    if STATE.comm is None or STATE.broken:
        return
    with STATE.lock:
        _arrived()
        if STATE.aborted:
            return
        me = STATE.comm.Get_rank()
        reqs = _notify("aborted", cause, [r for r in range(STATE.comm.Get_size()) if r != me],
                       synchronous=True)
    deadline = time.monotonic() + ANNOUNCE_WAIT
    while not MPI.Request.Testall(reqs) and time.monotonic() < deadline:
        time.sleep(0.002)


def aborted_peer() -> tuple[int, str] | None:
    """``(rank, cause)`` of the lowest rank known to be aborting the job, else None."""
    if not STATE.aborted:
        return None
    r = min(STATE.aborted)
    return r, STATE.aborted[r]


def raise_if_aborted(doing: str) -> None:
    """Raise :class:`~sbpmpi.errors.PeerAbortedError` if a rank's abort notice has come
    (this rank ``doing`` something that rank will never answer). Call under ``STATE.lock``
    after :func:`_arrived`, or after :func:`poll`."""
    if STATE.aborted:
        r, cause = min(STATE.aborted.items())
        raise PeerAbortedError(f"rank {r} is aborting the job: {cause} (this rank was "
                               f"{doing})")


def _notify(kind: str, text: str, ranks: Sequence[int], synchronous: bool = False) -> list[Any]:
    """Send a notice to ``ranks`` (its head, then its text); the requests to wait on.

    ``synchronous``: the text is sent with ``MPI_Issend``, so that its request completes
    only once the peer has received it."""
    me = STATE.comm.Get_rank()
    data = text.encode()[:_MAX_NOTICE]
    head = np.array([_KINDS.index(kind), len(data)], dtype=np.int64)
    send = STATE.comm.Issend if synchronous else STATE.comm.Isend
    reqs = []
    for r in ranks:
        if r != me:
            reqs.append(STATE.comm.Isend([head, MPI.INT64_T], dest=r, tag=_TAG))
            reqs.append(send([data, MPI.BYTE], dest=r, tag=_TEXT_TAG))
    STATE.sends.append((reqs, data, head))
    return reqs


def _compose(texts: dict[int, str], ranks: Sequence[int]) -> str:
    rs = tuple(ranks)
    return mismatch_message(
        [texts.get(r, "did not answer (busy outside sbpmpi's checks, e.g. in an sm.comm call "
                      "or computing)") for r in rs], rs,
        SAME_CALLS[:-1] + "; a rank that reaches the end of the program cannot meet a "
        "collective call of its peers (a collective inside `if rank == ...`, or an early "
        "sys.exit on some ranks).")


def enter(kind: str, ranks: Sequence[int]) -> tuple[str, int]:
    """Count one more call of ``kind`` ("check" or "comm") among world ``ranks``.

    Returns its key and number; every rank of a correct program numbers the calls of a
    group alike, so a finished peer's counts tell whether it took part in this call.
    """
    key = _key(kind, ranks if isinstance(ranks, tuple) else tuple(ranks))
    seq = STATE.checks[key] = STATE.checks.get(key, 0) + 1
    return key, seq


@functools.lru_cache(maxsize=4096)
def _key(kind: str, ranks: tuple[int, ...]) -> str:
    """The counter key of a group: built once per group, not on every call."""
    return f"{kind}:{','.join(map(str, ranks))}"


def cannot_meet(rank: int, key: str, seq: int, strict: bool = False) -> bool:
    """True when ``rank`` can never take part in check number ``seq`` of group ``key``.

    A finished rank took part iff its count for the group reaches ``seq``; one whose
    counts did not fit in its notice is unknown (True, unless ``strict``). A rank stuck
    in a failed check never takes part.
    """
    state = STATE.states.get(rank)
    if state is None:
        return False
    if state != FINISHED_TEXT:
        return True
    counts = STATE.peer_checks.get(rank)
    if counts is None:
        return not strict
    return counts.get(key, 0) < seq


def _fail(text: str, ranks: Sequence[int]) -> str:
    """Agree on the failure of a check of ``ranks`` that cannot complete; return the message."""
    STATE.broken = True
    me = STATE.comm.Get_rank()
    STATE.states[me] = text
    _notify("stuck", text, [r for r in range(STATE.comm.Get_size()) if r != me])
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline and any(r not in STATE.states for r in ranks):
        poll()
        time.sleep(0.002)
    message = _compose(STATE.states, ranks)
    STATE.verdict = message
    STATE.verdict_sends.extend(_notify("verdict", message, finished_ranks(), synchronous=True))
    return message


def wait(request: Any, ranks: Sequence[int], text: str) -> str | None:
    """Complete ``request`` (a check's exchange among world ``ranks``), watching for exits.

    Returns None when it completes, or the agreed failure message when a rank of
    ``ranks`` has finished (or is stuck failing) so that it never can. Polls the exchange
    and the posted notice receive (two ``MPI_Test``), yielding the core after a few polls
    so that peers sharing it progress; a long wait sleeps a millisecond between polls.
    """
    if STATE.comm is None:
        request.Wait()
        return None
    key, seq = enter("check", ranks)
    spins = 0
    gone_since: float | None = None
    while not request.Test():
        with STATE.lock:
            _arrived()
        if STATE.aborted:
            raise_if_aborted(f"in {text}")
        if STATE.states and any(cannot_meet(r, key, seq) for r in ranks):
            if gone_since is None:
                gone_since = time.monotonic()
            # only peers of unknown count: give the exchange GRACE seconds to complete
            if any(cannot_meet(r, key, seq, strict=True) for r in ranks) \
                    or time.monotonic() - gone_since > GRACE:
                return _fail(text, ranks)
        spins += 1
        if spins > 20:
            if spins < 50000:
                os.sched_yield()
            else:
                time.sleep(0.001)
    return None


def _exit_failed(message: str) -> None:
    """Print ``message``, give the peers a moment to print theirs, and exit with code 1.

    ``os._exit``: MPI_Finalize would wait for the check that can never complete; the
    launcher ends the job once a rank exits non-zero, so the pause lets its forwarder
    and the other ranks deliver their messages first.
    """
    try:
        sys.stdout.flush()
        if message:
            sys.stderr.write(message if message.endswith("\n") else message + "\n")
        sys.stderr.flush()
    except Exception:
        pass
    time.sleep(0.5)
    os._exit(1)


def _at_exit() -> None:
    """Tell every rank this one has finished; wait until all have, or until one is stuck."""
    comm = STATE.comm
    if comm is None or MPI.Is_finalized():
        return
    abort.wait_if_aborting()  # a thread is aborting the job: this rank must not finish
    me, size = comm.Get_rank(), comm.Get_size()
    if STATE.broken:  # this rank already ended with an agreed failure: do not wait for anyone
        deadline = time.monotonic() + 2.0  # but let the finished ranks read the verdict
        while not MPI.Request.Testall(STATE.verdict_sends) and time.monotonic() < deadline:
            time.sleep(0.002)
        _exit_failed("")
    poll()
    mine = _notify("finished", f"{FINISHED_TEXT}\0{json.dumps(STATE.checks)}", range(size),
                   synchronous=True)
    stuck_since: float | None = None
    delay = 0.0005
    while True:
        abort.wait_if_aborting()
        poll()
        if STATE.verdict is not None:
            _exit_failed(f"sbpmpi: rank {me}: CollectiveMismatchError: {STATE.verdict}")
        if STATE.aborted:
            r, cause = min(STATE.aborted.items())
            _exit_failed(f"sbpmpi: rank {me}: PeerAbortedError: rank {r} is aborting the "
                         f"job: {cause} (this rank had {FINISHED_TEXT})")
        stuck = [r for r, t in STATE.states.items() if t != FINISHED_TEXT]
        if stuck:  # a peer's check failed because of us; its verdict is on the way
            if stuck_since is None:
                stuck_since = time.monotonic()
            elif time.monotonic() - stuck_since > GRACE + 2.0:
                _exit_failed(f"sbpmpi: rank {me}: CollectiveMismatchError: "
                             f"{_compose(STATE.states | {me: FINISHED_TEXT}, range(size))}")
        elif len(STATE.states) == size - 1 and MPI.Request.Testall(mine):
            with STATE.lock:  # every rank finished and has our notice: MPI_Finalize can go ahead
                for req in STATE.reqs:
                    if req != MPI.REQUEST_NULL:
                        req.Cancel()
                MPI.Request.Waitall(STATE.reqs)
            return
        time.sleep(delay)
        delay = min(delay * 1.5, 0.02)
