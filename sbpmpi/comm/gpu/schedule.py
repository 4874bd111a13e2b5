"""Copy schedules: the collectives boxing uses, as device copies between ranks of one node.

Pure functions of metadata. Every rank *pulls*: a :class:`Move` reads bytes of a buffer
of rank ``src`` (this rank's own buffers or a peer's, mapped by CUDA IPC) and writes or
reduces them into one of this rank's buffers. Buffers are named by role: ``"in"`` (what
the rank contributes), ``"out"`` (what it receives; the same memory as ``"in"`` for
in-place calls) and ``"tmp"`` (local scratch of ``Schedule.tmp_bytes``, never read by a
peer). Offsets and sizes are in bytes.

A :class:`Schedule` is a sequence of phases. The executor makes every rank's device work
finish and meet at a node barrier *before* each phase (so no rank reads a buffer before it
is written) and once more after the last (so no rank overwrites or frees a buffer a peer
still reads, and a failure in the last phase, even a local one, raises on every rank). Within a phase the moves of one rank run in order (one CUDA stream); a
schedule never reads, in a phase, bytes that *another* rank writes in that phase.

Every rank meets every barrier, so **the number of phases is a function of what all ranks
share** (the group size, the counts of every rank), never of this rank's own blocks: a
rank with nothing to move still has its (empty) phases. The executor checks it at the
first barrier (:meth:`Schedule.barriers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...core.layout import block_starts

__all__ = ["Move", "Schedule", "COPY", "REDUCE", "blocks", "all_gather_v", "reduce_scatter_v",
           "all_reduce", "all_reduce_direct", "all_to_all_v", "broadcast"]

COPY = "copy"
REDUCE = "reduce"


@dataclass(frozen=True)
class Move:
    """``dst_buf[dst_off:][:nbytes]`` (this rank) = or op= ``src_buf[src_off:][:nbytes]`` of ``src``."""

    kind: str  # COPY or REDUCE (dst = op(dst, src), elementwise in the call's dtype)
    src: int  # rank in the node group that owns the source buffer
    src_buf: str
    src_off: int
    dst_buf: str
    dst_off: int
    nbytes: int


@dataclass(frozen=True)
class Schedule:
    """The moves of one rank, phase by phase; ``exports``: its buffers that peers read."""

    phases: tuple[tuple[Move, ...], ...]
    exports: tuple[str, ...] = ("in",)
    tmp_bytes: int = 0

    def moves(self) -> list[Move]:
        return [m for ph in self.phases for m in ph]

    def barriers(self) -> int:
        """The node barriers the executor holds for this schedule: one between phases and
        one after the last; at least one (the call's end)."""
        return max(len(self.phases), 1)

    def peer_reads(self, me: int) -> int:
        """Bytes this rank reads from other ranks' memory."""
        return sum(m.nbytes for m in self.moves() if m.src != me)


def _check(p: int, me: int) -> None:
    if p < 1 or not 0 <= me < p:
        raise ValueError(f"rank {me} is not in a group of {p}")


def _order(p: int, me: int) -> list[int]:
    """Peers starting after ``me``: rank k reads from k+1 first, spreading the load."""
    return [(me + i) % p for i in range(1, p)] + [me]


def blocks(n: int, p: int) -> list[tuple[int, int]]:
    """(start, stop) of ``p`` balanced blocks of ``n`` elements; the first n % p get one more."""
    q, r = divmod(n, p)
    out, s = [], 0
    for i in range(p):
        e = s + q + (i < r)
        out.append((s, e))
        s = e
    return out


def all_gather_v(p: int, me: int, nbytes: Sequence[int], displs: Sequence[int]) -> Schedule:
    """Rank k's ``in`` (``nbytes[k]``) goes to ``out[displs[k]:]`` on every rank."""
    _check(p, me)
    ph = tuple(Move(COPY, k, "in", 0, "out", displs[k], nbytes[k])
               for k in _order(p, me) if nbytes[k])
    return Schedule((ph,))


def reduce_scatter_v(p: int, me: int, nbytes: Sequence[int]) -> Schedule:
    """Block ``me`` of the packed ``in`` of every rank, reduced in rank order, into ``out``.

    Rank order (out = in_0, then out op= in_1, in_2, ...) gives the same bits as a NumPy
    reduction over the stacked inputs.
    """
    _check(p, me)
    off, n = block_starts(nbytes)[me], nbytes[me]
    ph: tuple[Move, ...] = ()
    if n:  # an empty block: an empty phase (the others' phase count)
        ph = (Move(COPY, 0, "in", off, "out", 0, n),) + tuple(
            Move(REDUCE, k, "in", off, "out", 0, n) for k in range(1, p))
    return Schedule((ph,))


def all_reduce(p: int, me: int, count: int, itemsize: int) -> Schedule:
    """In place (``in`` is ``out``): reduce-scatter into ``tmp``, write back, then all-gather.

    Phase 0: rank ``me`` reduces block ``me`` of all ranks (rank order) into ``tmp`` and
    copies it into its own block ``me`` (no peer reads that block in phase 0). Phase 1:
    every rank copies block k from rank k. Each block is computed once, so every rank
    holds the same bits.
    """
    _check(p, me)
    if p == 1 or count == 0:
        return Schedule((), exports=("out",))
    bl = [(a * itemsize, b * itemsize) for a, b in blocks(count, p)]
    a, b = bl[me]
    n = b - a
    ph0: tuple[Move, ...] = ()
    if n:
        ph0 = (Move(COPY, 0, "out", a, "tmp", 0, n),) + tuple(
            Move(REDUCE, k, "out", a, "tmp", 0, n) for k in range(1, p)) + (
            Move(COPY, me, "tmp", 0, "out", a, n),)
    ph1 = tuple(Move(COPY, k, "out", bl[k][0], "out", bl[k][0], bl[k][1] - bl[k][0])
                for k in _order(p, me)[:-1] if bl[k][1] > bl[k][0])
    return Schedule((ph0, ph1), exports=("out",), tmp_bytes=n)


def all_reduce_direct(p: int, me: int, count: int, itemsize: int) -> Schedule:
    """In place, for latency-bound sizes: every rank reduces all the buffers (rank order)
    into ``tmp``; after a barrier (no rank reads a peer any more) it copies ``tmp`` back.

    The copy back reads no peer, but the call still closes with a barrier: it is where a
    failure of that copy on one rank reaches the others. The same barriers as
    :func:`all_reduce`, with p + 1 device operations instead of 2p; each rank reads (p-1)
    whole buffers instead of 2(p-1)/p of one (the same bytes at p = 2).
    """
    _check(p, me)
    n = count * itemsize
    if p == 1 or n == 0:
        return Schedule((), exports=("out",))
    ph0 = (Move(COPY, 0, "out", 0, "tmp", 0, n),) + tuple(
        Move(REDUCE, k, "out", 0, "tmp", 0, n) for k in range(1, p))
    ph1 = (Move(COPY, me, "tmp", 0, "out", 0, n),)
    return Schedule((ph0, ph1), exports=("out",), tmp_bytes=n)


def all_to_all_v(p: int, me: int, send_nbytes: Sequence[Sequence[int]],
                 send_displs: Sequence[Sequence[int]], recv_displs: Sequence[int]) -> Schedule:
    """Rank k sends ``in[send_displs[k][j]:][:send_nbytes[k][j]]`` to rank j, which stores
    it at ``out[recv_displs[k]:]`` (``recv_displs``: this rank's, one per source rank)."""
    _check(p, me)
    ph = tuple(Move(COPY, k, "in", send_displs[k][me], "out", recv_displs[k], send_nbytes[k][me])
               for k in _order(p, me) if send_nbytes[k][me])
    return Schedule((ph,))


def broadcast(p: int, me: int, root: int, nbytes: int) -> Schedule:
    """``out`` of every rank = ``in`` of ``root`` (in place on the root)."""
    _check(p, me)
    if not 0 <= root < p:
        raise ValueError(f"root {root} is not in a group of {p}")
    if me == root or not nbytes:
        return Schedule(((),))  # the root moves nothing, in the others' one phase
    return Schedule(((Move(COPY, root, "in", 0, "out", 0, nbytes),),))

