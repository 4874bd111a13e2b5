"""TSQR: the R factors of the row blocks of a tall matrix reduced up a binary tree of ranks.

The ranks that hold a tall matrix's row blocks form a :class:`Team`, in row order. Each
factors its block (``A_i = Q_i R_i``, :mod:`.blocks`); then, level by level, rank ``i``
of each pair ``(i, i + 2^l)`` receives its partner's R, factors the two stacked
(``[R_i; R_j] = Q' R'``) and keeps ``Q'`` (2n x n at most). The tree's root holds the R
of the whole matrix. What is computed from it (a sign fix, an SVD, a solution) is
computed there once and sent back down the same tree with the root's transform ``T``:
a rank sends each child the lower rows of ``Q' T`` and keeps the upper ones, so every
rank ends with the n x c transform ``W_i`` that makes its rows of the result
``Q_i @ W_i``. Each rank holds O(n^2 log p) beyond its block; 2 log2 p messages of
O(n^2) each pass through the root's path. Everything every rank gets back (R, singular
values, solutions) was computed once, on the root, so the ranks agree bit for bit.

Householder QR is backward stable whatever the condition number, and so is this tree
(Demmel, Grigori, Hoemmen, Langou 2012); CholeskyQR2, twice as fast on a CPU, loses
orthogonality once the condition number passes ``eps**-0.5`` and is not used.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from .. import comm
from ..core.layout import Layout

__all__ = ["Team", "team_of", "Root", "Leaf", "reduce_r", "on_first", "real_dtype"]

# message tags of the tree: R factors up, the root's payload and the transforms down
_UP, _PAYLOAD, _TRANSFORM = 7301, 7302, 7303


class Team(NamedTuple):
    """The ranks holding the row blocks of a tall matrix, in row order."""

    ranks: tuple[int, ...]
    rows: tuple[int, ...]  # rows of each rank's block
    me: int | None  # this rank's index in ``ranks``; None outside the team

    @property
    def size(self) -> int:
        return len(self.ranks)


def team_of(layout: Layout, dim: int, me: int) -> Team:
    """The team of ``layout`` (a matrix split along ``dim`` on every mesh axis): its
    ranks ordered by where their block of ``dim`` starts."""
    blocks = []
    for r in layout.placement.rank_list:
        ranges = layout.local_ranges(r)
        assert ranges is not None
        start, stop = ranges[dim]
        blocks.append((start, r, stop - start))
    blocks.sort()
    ranks = tuple(r for _, r, _ in blocks)
    return Team(ranks, tuple(n for _, _, n in blocks), ranks.index(me) if me in ranks else None)


class Root(NamedTuple):
    """What the tree's root makes of the whole R: ``payload`` (1-D, the same length on
    every rank) goes to every rank; ``transform`` (k x c, None when no Q is wanted) is
    carried down the tree into each rank's ``W_i``."""

    payload: Any
    transform: Any | None


class Leaf(NamedTuple):
    """One rank's share of the result: the root's payload, and ``w`` (k_i x c) such that
    its rows of ``Q @ transform`` are ``Q_i @ w`` (None when no Q is wanted)."""

    payload: Any
    w: Any | None


class _Merge(NamedTuple):
    """A child merged into this rank's R: its index, the rows of this rank's R and of the
    child's before the merge, and the merge's Q (None: one of them had no rows)."""

    child: int
    mine: int
    theirs: int
    q: Any | None


def _subtree_r_rows(team: Team, start: int, width: int, n: int) -> int:
    return min(sum(team.rows[start:start + width]), n)


def reduce_r(xp: ModuleType, r: Any, team: Team, n: int,
             at_root: Callable[[Any], Root], *, payload_size: int, columns: int,
             want_w: bool) -> Leaf:
    """Reduce this rank's R (``r``, k_i x n) up the team's tree, run ``at_root`` on the
    whole R at the root (team index 0), and bring its payload (``payload_size``
    elements) and, when ``want_w``, this rank's rows of its transform (``columns`` wide)
    back down. Every rank of the team calls it; ranks outside do not."""
    i = team.me
    assert i is not None
    dtype = r.dtype
    merges: list[_Merge] = []
    parent = None
    bit = 1
    while bit < team.size:
        if i % (2 * bit):  # this rank's subtree is complete: hand its R up
            parent = i - bit
            if r.shape[0]:
                comm.send(xp.ascontiguousarray(r), team.ranks[parent], tag=_UP)
            break
        j = i + bit
        if j < team.size:
            theirs = _subtree_r_rows(team, j, bit, n)
            mine = r.shape[0]
            q = None
            if theirs:
                rj = xp.empty((theirs, n), dtype=dtype)
                comm.recv(rj, team.ranks[j], tag=_UP)
                if mine:
                    q, r = xp.linalg.qr(xp.concatenate([r, rj]), mode="reduced")
                else:
                    r = rj
            merges.append(_Merge(j, mine, theirs, q))
        bit *= 2
    t: Any = None
    if parent is None:
        root = at_root(r)
        payload, t = root.payload, root.transform
        if want_w and t is None:
            raise ValueError("linalg: the root made no transform, but one was asked for")
    else:
        payload = xp.empty((payload_size,), dtype=dtype)
        if payload_size:
            comm.recv(payload, team.ranks[parent], tag=_PAYLOAD)
        if want_w:
            t = xp.empty((r.shape[0], columns), dtype=dtype)
            if r.shape[0]:
                comm.recv(t, team.ranks[parent], tag=_TRANSFORM)
    for m in reversed(merges):
        if payload_size:
            comm.send(xp.ascontiguousarray(payload), team.ranks[m.child], tag=_PAYLOAD)
        if want_w:
            full = t if m.q is None else m.q @ t
            if m.theirs:
                comm.send(xp.ascontiguousarray(full[m.mine:]), team.ranks[m.child],
                          tag=_TRANSFORM)
            t = full[:m.mine]
    return Leaf(payload, t)


def on_first(name: str, xp: ModuleType, local: Any, team: Team,
             fn: Callable[[Any], Any], size: int) -> Any:
    """``fn(S)`` (flattened to ``size`` elements of ``local``'s dtype) where ``S`` is the
    sum over the team of each rank's ``local``: ``S`` reduced to the team's first rank,
    ``fn`` run there once and its result broadcast, so every rank gets the same bits. A
    LinAlgError of ``fn`` is raised on every rank."""
    dtype = local.dtype
    total = xp.array(local, copy=True, order="C")
    group = comm.get_group(team.ranks) if team.size > 1 else None
    if group is not None:
        comm.reduce(total, dst=team.ranks[0], group=group)
    out = xp.zeros((size + 1,), dtype=dtype)
    if team.me == 0:
        try:
            out[1:] = xp.reshape(fn(total), (-1,)).astype(dtype)
        except np.linalg.LinAlgError:
            out[0] = 1
    if group is not None:
        comm.broadcast(out, src=team.ranks[0], group=group)
    if bool(out[0] != 0):
        raise np.linalg.LinAlgError(f"linalg.{name}: a factorization did not converge")
    return out[1:]


def real_dtype(dtype: Any) -> np.dtype:
    """The real dtype of ``dtype``'s precision."""
    return np.empty((), dtype=dtype).real.dtype
