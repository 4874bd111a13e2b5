"""Record the communication calls ``sbpmpi.comm`` makes on this rank.

    with sm.trace() as t:
        y = sm.boxing.box(x, sbp=sm.sbp.broadcast)
    print(t)                    # one table row per call
    t.count("all_gather_v")     # -> 1

Every buffer call of ``sbpmpi.comm`` (and the object calls) appends one frozen
:class:`CommRecord` to every active trace. The small metadata exchanges of the
cross-rank agreement (:mod:`sbpmpi.comm.agreement`: the consistency check, checked
mode, collective decisions) are kept apart, in ``Trace.agreements``, so that the records
show the calls that move data. When no trace is active the cost is one truth test of a
module-level list.

Every record and every :class:`Mark` (a point in the program that a layer above names,
e.g. the autograd engine's ``"backward relu"`` before each backward rule) carries a
sequence number, so ``Trace.timeline()`` shows the calls between the marks: a
non-blocking all-reduce (``nonblocking=True``) started before ``"backward end"`` is
communication that overlaps the rest of backward.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .group import Group

__all__ = ["CommRecord", "Mark", "Interval", "Trace", "trace", "record", "record_agreement",
           "note", "mark", "record_interval", "next_seq"]

# One counter for the records and marks of every trace: their order within a trace.
_seq = itertools.count()


def next_seq() -> int:
    """The next sequence number (records and marks are numbered in creation order)."""
    return next(_seq)


@dataclass(frozen=True)
class CommRecord:
    """One communication call on this rank.

    Attributes
    ----------
    op : str
        The ``sbpmpi.comm`` function, e.g. ``"all_reduce"``, ``"all_gather_v"``, ``"send"``.
    nbytes : int
        Bytes of array data this rank hands to MPI as input: the whole input buffer of
        a collective (e.g. ``arr`` of all_reduce, the full input of reduce_scatter or
        all_to_all), the root's buffer for broadcast and scatter (0 on other ranks), the
        sent buffer for send/isend (0 for recv/irecv and barrier), the pickled size for
        object calls.
    group_size : int
        Number of ranks of the communicator used.
    dtype : str
        NumPy dtype name of the data (``""`` for barrier and object calls).
    group_ranks : tuple of int
        World ranks of the group, in group order.
    peer : int or None
        Root (src/dst world rank) of rooted calls and the peer of point-to-point calls.
    device : str
        ``"cpu"`` or ``"cuda"``: where the caller's buffers live.
    staged : bool
        True when GPU data went through pinned host buffers.
    nonblocking : bool
        True for a call that was started here and completes later (``async_op=True``):
        the record marks its start.
    seq : int
        Its place among the records and marks of the trace (not compared).
    """

    op: str
    nbytes: int
    group_size: int
    dtype: str = ""
    group_ranks: tuple[int, ...] = ()
    peer: int | None = None
    device: str = "cpu"
    staged: bool = False
    nonblocking: bool = False
    seq: int = field(default_factory=next_seq, compare=False)


@dataclass(frozen=True)
class Mark:
    """A named point in the program (``text``), numbered like the records (``seq``)."""

    text: str
    seq: int = field(default_factory=next_seq, compare=False)


@dataclass(frozen=True)
class Interval:
    """A span of time on this rank that a layer above names: a pipeline stage's
    ``"forward"``, ``"backward"``, ``"send"`` (starting a transfer to the next or previous
    stage) or ``"wait"`` (blocked until a transfer has arrived) of one micro-batch.

    ``start`` and ``end`` are ``time.perf_counter()`` seconds on this rank.
    """

    kind: str
    stage: int
    microbatch: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Trace:
    """The records collected by one ``with trace():`` block, in call order.

    ``records`` holds the comm calls; ``agreements`` the agreement exchanges (op
    ``"agreement"``: a 16-byte fingerprint or verdict all-reduce; ``"agreement_gather"``
    and ``"agreement_broadcast"``: the descriptions or a root's verdict), not counted by
    ``len``, ``count`` and the others. ``intervals`` holds the timed spans of the layers
    above (:class:`Interval`: ``sm.pipeline``'s forward, backward, send and wait).
    """

    def __init__(self) -> None:
        self.records: list[CommRecord] = []
        self.agreements: list[CommRecord] = []
        self.marks: list[Mark] = []
        self.intervals: list[Interval] = []

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[CommRecord]:
        return iter(self.records)

    def __getitem__(self, i: int) -> CommRecord:
        return self.records[i]

    def __bool__(self) -> bool:
        return True

    def count(self, op: str | None = None) -> int:
        """Number of calls of ``op`` (all calls if None)."""
        if op is None:
            return len(self.records)
        return sum(1 for r in self.records if r.op == op)

    def nbytes(self, op: str | None = None) -> int:
        """Total ``nbytes`` over the calls of ``op`` (all calls if None)."""
        return sum(r.nbytes for r in self.records if op is None or r.op == op)

    def ops(self) -> list[str]:
        """The op names in call order."""
        return [r.op for r in self.records]

    def summary(self) -> dict[str, int]:
        """Calls per op name."""
        return dict(Counter(r.op for r in self.records))

    def clear(self) -> None:
        self.records.clear()
        self.agreements.clear()
        self.marks.clear()
        self.intervals.clear()

    def events(self) -> list[CommRecord | Mark]:
        """The records and marks merged in program order (by ``seq``)."""
        return sorted([*self.records, *self.marks], key=lambda e: e.seq)

    def timeline(self) -> str:
        """One line per record and mark, in program order: marks as ``-- text``, calls as
        ``op nbytes [group]`` with ``(started)`` for a non-blocking one."""
        lines = []
        for e in self.events():
            if isinstance(e, Mark):
                lines.append(f"-- {e.text}")
            else:
                ranks = ",".join(map(str, e.group_ranks)) if e.group_ranks else str(e.group_size)
                lines.append(f"{e.op} {e.nbytes} B [{ranks}]"
                             + (" (started)" if e.nonblocking else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Trace of {len(self.records)} calls: {self.summary()}>"

    def __str__(self) -> str:
        head = ("#", "op", "nbytes", "group", "dtype", "peer", "device")
        rows = [head]
        for i, r in enumerate(self.records):
            ranks = ",".join(map(str, r.group_ranks)) if r.group_ranks else str(r.group_size)
            dev = r.device + ("+staged" if r.staged else "")
            rows.append((str(i), r.op, str(r.nbytes), f"[{ranks}]", r.dtype,
                         "" if r.peer is None else str(r.peer), dev))
        widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                 for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(f"{len(self.records)} calls, {self.nbytes()} bytes sent")
        return "\n".join(lines)


# The traces currently recording (innermost last); comm tests its truth before recording.
ACTIVE: list[Trace] = []


def record(rec: CommRecord) -> None:
    """Append ``rec`` to every active trace (called by sbpmpi.comm)."""
    for t in ACTIVE:
        t.records.append(rec)


def note(op: str, nbytes: int, g: Group, dtype: object = "", *, peer: int | None = None,
         device: bool = False, staged: bool = False, nonblocking: bool = False) -> None:
    """Record one call of ``g`` (callers test ``if ACTIVE:`` first, so this costs nothing
    untraced)."""
    record(CommRecord(op, int(nbytes), g.size, str(dtype), g.ranks, peer,
                      "cuda" if device else "cpu", staged, nonblocking))


def mark(text: str) -> None:
    """Append a :class:`Mark` named ``text`` to every active trace (callers test
    ``if ACTIVE:`` first)."""
    m = Mark(text)
    for t in ACTIVE:
        t.marks.append(m)


def record_interval(iv: Interval) -> None:
    """Append ``iv`` to every active trace's ``intervals``."""
    for t in ACTIVE:
        t.intervals.append(iv)


def record_agreement(rec: CommRecord) -> None:
    """Append ``rec``, an agreement exchange, to every active trace's ``agreements``."""
    for t in ACTIVE:
        t.agreements.append(rec)


class trace:  # noqa: N801 - used as ``sm.trace()``, a context manager
    """Context manager collecting a :class:`Trace` of this rank's comm calls.

    Traces nest: a call is recorded in every active trace.
    """

    def __init__(self) -> None:
        self._t = Trace()

    def __enter__(self) -> Trace:
        ACTIVE.append(self._t)
        return self._t

    def __exit__(self, *exc: object) -> None:
        ACTIVE.remove(self._t)
