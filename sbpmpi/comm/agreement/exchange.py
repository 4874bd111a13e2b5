"""One agreement mechanism: do the ranks of a group agree, and if not, what did each do?

Both cross-rank checks use it: the op-level consistency check
(:mod:`sbpmpi.runtime.consistency`: what each rank is about to do) and comm's checked mode
(:mod:`.checks`: each call's verdict on its arguments and their signature). Every
agreement is the same exchange, so ranks in different kinds of check still meet in the
same MPI calls and get an explanation instead of a hang:

1. :func:`agree`: one non-blocking all-reduce (MAX) of two int64, a 63-bit fingerprint
   ``fp`` and ``-fp``: every rank learns whether all fingerprints are equal (``max(fp) ==
   -max(-fp)``). While it is in flight the rank polls for peers that reached the end of
   the program (:func:`sbpmpi.comm.lifecycle.exit_agreement.wait`), so a check that can never
   complete ends with the cause on every rank.
2. Only when they differ, one all-gather of each rank's ``(text, detail)``: the caller
   explains the mismatch from them.

The collective decisions live here as well: :func:`all_ok`, :func:`raise_if_any`,
:func:`decide_on_root`, :func:`gather` and :class:`collective_errors`. Every exchange runs
under the watchdog and is recorded in the active ``sm.trace`` traces as an agreement
(``Trace.agreements``: ops ``"agreement"``, ``"agreement_gather"``,
``"agreement_broadcast"``), apart from the calls that move data. They carry metadata only
(fingerprints, flags, short texts), never tensor data.
"""

from __future__ import annotations

import hashlib
import importlib
import pickle
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

import numpy as np
from mpi4py import MPI

from ...errors import CollectiveMismatchError, PeerAbortedError
from ..group import WORLD, Group
from ..lifecycle import exit_agreement
from ..lifecycle.watchdog import watch
from ..trace import ACTIVE, CommRecord, record_agreement

__all__ = ["MASK63", "CHECK_LABEL", "fingerprint_of", "members", "covers_world", "agree",
           "agree_flagged", "Agreement", "gather", "all_ok",
           "raise_if_any", "decide_on_root", "collective_errors", "build_error",
           "raised_on_every_rank"]

MASK63 = (1 << 63) - 1
#: Watch labels of exchanges that poll for finished peers themselves start with this (the
#: watchdog's exit watch leaves them alone).
CHECK_LABEL = "consistency check"
T = TypeVar("T")


def fingerprint_of(text: str, seed: bytes = b"") -> int:
    """The 63-bit fingerprint of ``seed + text`` (blake2b), equal across processes."""
    digest = hashlib.blake2b(seed + text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & MASK63


def members(group: Group | None) -> tuple[Any, tuple[int, ...]]:
    """The communicator of ``group`` (None for WORLD) and its world ranks; ``(None, ranks)``
    on a rank outside the group."""
    if group is None:
        return WORLD.comm, WORLD.ranks
    return group.comm, tuple(group.ranks)


def covers_world(group: Group | None) -> bool:
    """True when every rank of the world takes part in an exchange on ``group``."""
    return group is None or len(group.ranks) == len(WORLD.ranks)


def _note(op: str, nbytes: int, ranks: tuple[int, ...], peer: int | None = None) -> None:
    record_agreement(CommRecord(op, nbytes, len(ranks), "", ranks, peer))


def _pickled(obj: Any) -> int:
    try:
        return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return 0


class Agreement(NamedTuple):
    """The result of :func:`agree_flagged`."""

    explanations: list[Any] | None  # None when every fingerprint was equal
    any_flag: bool  # some rank raised its flag (meaningful when the fingerprints agree)


def agree(fp: int, what: str, text: str, explain: Callable[[], Any],
          group: Group | None = None) -> list[Any] | None:
    """None when every rank of ``group`` passed the same fingerprint ``fp``; else the list
    of every rank's ``explain()`` (in group order), the same on every rank.

    Parameters
    ----------
    fp : int
        This rank's 63-bit fingerprint (``0 <= fp < 2**63``).
    what : str
        The step checked, for the watchdog (``"consistency check before <what>"``).
    text : str
        What this rank is doing, for the peers when one of them has finished.
    explain : callable
        Called on a mismatch only: this rank's part of the explanation (must pickle).
    group : comm.Group, optional
        The ranks that take part (WORLD by default); call it on members only.

    Raises
    ------
    CollectiveMismatchError
        On every rank of the group, when a peer reached the end of the program (or is stuck
        in a failed check) so that the exchange can never complete.
    """
    return _agree(_pair(fp, -fp), what, text, explain, group, False).explanations


def agree_flagged(fp: int, what: str, text: str, explain: Callable[[], Any],
                  group: Group | None = None, flag: bool = False) -> Agreement:
    """:func:`agree` carrying one flag of every rank in the same 16 bytes (the GPU route
    decision of comm's checked mode rides on its signature agreement).

    The flag takes the fingerprint's lowest bit: the MAX of ``fp`` with that bit replaced
    by the flag is the largest fingerprint plus whether any rank raised the flag, and the
    MAX of ``-fp`` (bit cleared) is minus the smallest, so the fingerprints still compare
    on their other 62 bits.
    """
    even = fp & ~1
    return _agree(_pair(even | int(flag), -even), what, text, explain, group, True)


_PAIRS = threading.local()


def _pair(a: int, b: int) -> np.ndarray:
    """``[a, b]`` as int64 in this thread's one buffer of the exchanges: a check made once
    per replay of a captured step (``sm.graph``) allocates nothing. An exchange reads its
    result before the next one starts, so one buffer per thread serves them all."""
    buf = getattr(_PAIRS, "buf", None)
    if buf is None:
        buf = _PAIRS.buf = np.empty(2, dtype=np.int64)
    buf[0] = a
    buf[1] = b
    return buf  # type: ignore[no-any-return]


def _agree(buf: np.ndarray, what: str, text: str, explain: Callable[[], Any],
           group: Group | None, flagged: bool) -> Agreement:
    """The exchange of :func:`agree` and :func:`agree_flagged` (``buf``: [fp, -fp], with
    the flag in the low bit of ``fp`` when ``flagged``)."""
    comm, ranks = members(group)
    if len(ranks) == 1:
        return Agreement(None, flagged and bool(buf[0] & 1))
    if ACTIVE:
        _note("agreement", 16, ranks)
    # the wait below notices a peer that reached the end of the program: only a timeout
    # (SBPMPI_TIMEOUT) needs a watch here
    with watch(f"{CHECK_LABEL} before {what}", ranks, watches_exits=True):
        # non-blocking, so that a peer that reached the end of the program is noticed
        try:
            failed = exit_agreement.wait(comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX),
                                         ranks, text)
        except PeerAbortedError:
            _PAIRS.buf = None  # as below: the exchange may still write into this one
            raise
        if failed is not None:
            _PAIRS.buf = None  # the unfinished exchange may still write into this one
            raise CollectiveMismatchError(failed)
        if int(buf[0]) == -int(buf[1]):
            return Agreement(None, False)
        if flagged and int(buf[0]) >> 1 == -int(buf[1]) >> 1:  # equal but for the flag
            return Agreement(None, bool(buf[0] & 1))
        mine = explain()
        if ACTIVE:
            _note("agreement_gather", _pickled(mine), ranks)
        return Agreement(comm.allgather(mine), False)


def gather(obj: Any, what: str, group: Group | None = None) -> list[Any]:
    """Every rank's ``obj`` (small metadata that pickles), in group order (collective)."""
    comm, ranks = members(group)
    if comm is None:
        raise ValueError(f"{what}: this rank is not a member of {group!r}")
    if len(ranks) == 1:
        return [obj]
    if ACTIVE:
        _note("agreement_gather", _pickled(obj), ranks)
    with watch(what, ranks):
        return comm.allgather(obj)  # type: ignore[no-any-return]


# -- collective decisions ---------------------------------------------------------------------

def all_ok(ok: bool, group: Group | None = None, *, label: str = "collective decision") -> bool:
    """True on every rank iff ``ok`` is true on every rank of ``group`` (one small all-reduce,
    watched as ``label``)."""
    comm, ranks = members(group)
    if comm is None:
        raise ValueError(f"this rank is not a member of {group!r}")
    if len(ranks) == 1:
        return bool(ok)
    buf = _pair(0 if ok else 1, 0)  # the shape of agree's exchange
    if ACTIVE:
        _note("agreement", 16, ranks)
    with watch(label, ranks):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
    return int(buf[0]) == 0


def _error_class(module: str, qualname: str) -> type[BaseException] | None:
    mod = sys.modules.get(module)
    if mod is None and module.startswith("sbpmpi"):
        try:
            mod = importlib.import_module(module)
        except Exception:
            mod = None
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, Exception):
        return obj
    return None


class _Failure(NamedTuple):
    """An exception as it travels between ranks: enough to raise its type elsewhere."""

    module: str
    qualname: str
    message: str

    @classmethod
    def of(cls, e: BaseException) -> _Failure:
        return cls(type(e).__module__, type(e).__qualname__, str(e))


class _Verdict(NamedTuple):
    """What the root of :func:`decide_on_root` sends: its result, or how ``fn`` failed."""

    result: Any
    failure: _Failure | None


def build_error(module: str, qualname: str, text: str) -> BaseException:
    """An exception of the class ``module.qualname`` with message ``text`` where it can be
    built from a message; ``RuntimeError("<qualname>: <text>")`` otherwise."""
    cls = _error_class(module, qualname)
    try:
        return cls(text) if cls is not None else RuntimeError(f"{qualname}: {text}")
    except Exception:
        return RuntimeError(f"{qualname}: {text}")


_EVERY_RANK = "_sbpmpi_every_rank"  # the mark of an error a collective decision raised


def _everywhere(exc: BaseException) -> BaseException:
    try:
        setattr(exc, _EVERY_RANK, True)
    except AttributeError:  # an exception type without a __dict__
        pass
    return exc


def raised_on_every_rank(e: BaseException) -> bool:
    """True for an error that :func:`raise_if_any` or :func:`decide_on_root` raised: every
    rank of the group raised it alike, so no further agreement is needed to act on it."""
    return bool(getattr(e, _EVERY_RANK, False))


def raise_if_any(error: BaseException | None, what: str, group: Group | None = None, *,
                 label: str = "collective decision") -> None:
    """Collective: if any rank of ``group`` passes an error, raise one on every rank.

    Every rank raises the same type (that of the lowest failing rank, when it can be built
    from a message; RuntimeError otherwise) with the same message
    ``"<what>: rank R: <message>"``, chained to the local error where there is one.
    ``label``: what the watchdog and the exchange's watch call the all-reduce.
    """
    if all_ok(error is None, group, label=label):
        return
    mine = None if error is None else _Failure.of(error)
    infos = gather(mine, f"collective decision of {what}", group)
    _, ranks = members(group)
    failed: list[tuple[int, _Failure]] = [(r, i) for r, i in zip(ranks, infos) if i is not None]
    r0, first = failed[0]
    text = f"{what}: rank {r0}: {first.message}"
    others = [r for r, _ in failed[1:]]
    if others:
        same = all(i.message == first.message for _, i in failed[1:])
        text += (f" (and the same on rank{'s' if len(others) > 1 else ''} "
                 f"{', '.join(map(str, others))})" if same else
                 "".join(f"\n{what}: rank {r}: {i.message}" for r, i in failed[1:4]))
    exc = _everywhere(build_error(first.module, first.qualname, text))
    if error is not None:
        raise exc from error
    raise exc


def decide_on_root(fn: Callable[[], T], what: str, root: int = 0,
                   group: Group | None = None) -> T:
    """Collective: run ``fn`` on world rank ``root`` only; return its result on every rank.

    If ``fn`` raises, every rank raises the same type with the message
    ``"<what>: <message>"``. For checks only one rank should make (a file's header, a
    directory's state) so that all ranks take the same branch. The result must pickle.
    """
    comm, ranks = members(group)
    if comm is None:
        raise ValueError(f"this rank is not a member of {group!r}")
    me = MPI.COMM_WORLD.Get_rank()
    local_error: BaseException | None = None
    verdict: Any = None
    if me == root:
        try:
            verdict = _Verdict(fn(), None)
        except Exception as e:
            local_error = e
            verdict = _Verdict(None, _Failure.of(e))
    if len(ranks) > 1:
        root_in_group = root if group is None else group.group_rank(root)
        if ACTIVE:
            _note("agreement_broadcast", _pickled(verdict) if me == root else 0, ranks, root)
        with watch(f"{what}: waiting for rank {root}'s verdict", ranks):
            verdict = comm.bcast(verdict, root=root_in_group)
    failure = verdict.failure
    if failure is None:
        return verdict.result  # type: ignore[no-any-return]
    exc = _everywhere(build_error(failure.module, failure.qualname, f"{what}: {failure.message}"))
    if local_error is not None:
        raise exc from local_error
    raise exc


class collective_errors:  # noqa: N801 - a context manager, used like a function
    """Context manager: an exception inside the block on any rank raises on every rank.

    Every rank of ``group`` must enter and leave the block; leaving it is collective
    (one small all-reduce). Use it around local work that can fail on some ranks only
    (reading a file, checking a shard) before the next collective.

        with agreement.collective_errors("sm.load"):
            header = read_header(path) if rank == 0 else None
    """

    def __init__(self, what: str, group: Group | None = None) -> None:
        self.what = what
        self.group = group

    def __enter__(self) -> collective_errors:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and not isinstance(exc, Exception):
            return  # KeyboardInterrupt, SystemExit: propagate without communicating
        raise_if_any(exc, self.what, self.group)
