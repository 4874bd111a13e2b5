"""A distributed sort along a split axis: sample sort, one all-to-all.

Used by ``sort`` and ``argsort`` when the sorted axis is split and no other axis can take
the split (a 1-D array, or the other axes are split already or shorter than the ranks).
The result keeps the input's layout, uneven and empty blocks included. Per group of the
ranks whose blocks of the sorted dim lie one after another (the *chain*; the other mesh
axes run their own groups), with ``p`` ranks and ``n`` elements along the dim:

1. each rank sorts its block along the dim (stable), one row per position of the other
   dims (a *fiber*);
2. each rank takes up to ``min(OVERSAMPLE * p, MAX_SAMPLES)`` regular samples of its
   sorted rows; they are gathered on the chain's first rank (``gather_v``), which picks
   ``p - 1`` splitters, weighted quantiles of the samples, and broadcasts them
   (``broadcast``, ``p - 1`` values);
3. each rank cuts its sorted rows at the splitters; one ``all_to_all`` of two ints per
   pair (where each piece starts, how long it is) tells each rank what it receives from
   whom, one ``all_gather`` of one int per rank every bucket's size;
4. one ``all_to_all_v`` sends each piece to the rank of its bucket (argsort: the values
   and their global indices packed in one byte buffer); each rank merges what it got
   (a stable sort of the concatenated sorted runs);
5. point-to-point messages put the sorted sequence back in the input's blocks: a rank's
   bucket is a contiguous range of the result per fiber, so it goes to the few ranks
   whose blocks overlap it (in 1-D its own and the neighbouring ones).

Four small collectives and one all-to-all of the data, then one point-to-point exchange,
whatever ``p``. What a rank sends and receives in the sample, splitter and count phases
is ``O(p)`` (the first rank receives at most ``MAX_SAMPLES`` samples per rank; nothing is
all-gathered from every rank to every rank but one int); a rank sends its block twice
(all-to-all, then back to the layout).

Elements are ordered by (fiber, key, global index) lexicographically, so splitters cut
runs of equal keys deterministically and ties come out as the stable kernel of
:mod:`._searching` puts them: the runs are concatenated in block order before the stable
merge, so equal elements keep their original order (the global indices themselves only
travel for ``argsort``). NaN sorts last, as NumPy's sort (complex: NumPy's lexicographic
order). Descending: ``sort`` is the ascending result flipped (NaN first, equal elements
in reverse original order); ``argsort`` sorts the flipped array ascending and flips the
result, so equal elements keep their original order (the standard's stability rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from .. import backend, comm
from ..core.layout import Layout, block_starts
from ..core.sbp import Split
from ..env import get_rank
from ..tensor import GlobalTensor

__all__ = ["Chain", "OVERSAMPLE", "sample_sort", "sample_unique", "taking_dim"]

#: Tag of the point-to-point messages that put the result in the input's blocks.
TAG = 23
#: Samples per rank and per rank of the chain: more samples, better balanced buckets.
OVERSAMPLE = 16
#: At most this many samples per rank, so that the rank picking the splitters gathers
#: ``O(p)`` of them (each splitter is then off its quantile by at most ``n / 2048``).
MAX_SAMPLES = 1024


class Chain:
    """The ranks whose blocks of the sorted dim ``d`` lie one after another, in block
    order, with this rank's other mesh coordinates: ``ranks`` (world ranks), ``sizes`` and
    ``starts`` of their blocks along ``d``, ``total`` (the length of ``d``) and ``me``
    (this rank's place among them)."""

    def __init__(self, layout: Layout, d: int, rank: int) -> None:
        pl = layout.placement
        coord = pl.coord_of(rank)
        assert coord is not None
        axes = [m for m, s in enumerate(layout.sbp) if isinstance(s, Split) and s.dim == d]
        # row-major over the splitting mesh axes is block order: splits nest axis by axis
        key = tuple(slice(None) if m in axes else coord[m] for m in range(pl.ndim))
        self.ranks: tuple[int, ...] = tuple(int(r) for r in np.asarray(pl.ranks[key]).ravel())
        self.sizes: tuple[int, ...] = tuple(layout.local_shape(r)[d] for r in self.ranks)
        self.starts: tuple[int, ...] = tuple(block_starts(self.sizes))
        self.total: int = sum(self.sizes)
        self.me: int = self.ranks.index(rank)


class _Rows(NamedTuple):
    """This rank's block as sorted rows (one per fiber): ``values``, their virtual global
    indices ``vidx`` (of the flipped array for a descending argsort) and the real ones
    ``gidx``."""

    values: Any
    vidx: Any
    gidx: Any


class _Splitters(NamedTuple):
    """``p - 1`` splitters, ascending by (fiber, value, virtual global index)."""

    fiber: np.ndarray
    values: np.ndarray
    vidx: np.ndarray


def _host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _pack(xp: ModuleType, values: Any, ints: Any) -> Any:
    """Rows of bytes: each value followed by its int64, so one message carries both."""
    w = values.dtype.itemsize
    out = xp.empty((values.size, w + 8), dtype=np.uint8)
    out[:, :w] = xp.ascontiguousarray(values).view(np.uint8).reshape(-1, w)
    out[:, w:] = xp.ascontiguousarray(ints.astype(np.int64)).view(np.uint8).reshape(-1, 8)
    return out


def _unpack(xp: ModuleType, rows: Any, dtype: np.dtype) -> tuple[Any, Any]:
    w = dtype.itemsize
    values = xp.ascontiguousarray(rows[:, :w]).view(dtype).reshape(-1)
    ints = xp.ascontiguousarray(rows[:, w:]).view(np.int64).reshape(-1)
    return values, ints


def _stable_order(xp: ModuleType, values: Any, fiber: Any | None) -> Any:
    """The permutation sorting by (fiber, value), stable."""
    perm = xp.argsort(values, kind="stable")
    if fiber is not None:
        perm = perm[xp.argsort(fiber[perm], kind="stable")]
    return perm


def _local_sort(xp: ModuleType, rows: Any, vstart: int, n: int, flip_in: bool) -> _Rows:
    perm = xp.argsort(rows, axis=1, kind="stable")
    vidx = vstart + perm
    return _Rows(xp.take_along_axis(rows, perm, axis=1), vidx, n - 1 - vidx if flip_in else vidx)


def _sample_counts(fibers: int, sizes: Sequence[int], p: int) -> list[int]:
    return [min(fibers * m, OVERSAMPLE * p, MAX_SAMPLES) for m in sizes]


def _packed_width(dtype: np.dtype) -> int:
    """Bytes of one packed (value, int64) row (:func:`_pack`)."""
    return dtype.itemsize + 8


def _splitters(xp: ModuleType, rows: _Rows, chain: Chain, group: comm.Group, n: int
               ) -> _Splitters:
    """Regular samples of every rank's sorted rows, gathered on the chain's first rank;
    it picks the weighted quantiles and broadcasts them (``p - 1`` splitters)."""
    p, me = len(chain.ranks), chain.me
    fibers, m = rows.values.shape
    dtype = rows.values.dtype
    counts = _sample_counts(fibers, chain.sizes, p)
    c, total = counts[me], fibers * m
    at = (2 * np.arange(c, dtype=np.int64) + 1) * total // (2 * c) if c else \
        np.zeros(0, dtype=np.int64)
    at_x = xp.asarray(at)
    key = xp.asarray(at // max(m, 1)) * n + rows.vidx.reshape(-1)[at_x]
    mine = _pack(xp, rows.values.reshape(-1)[at_x], key)
    width = _packed_width(dtype)
    root = chain.ranks[0]
    got = xp.empty((sum(counts), width), dtype=np.uint8) if me == 0 else None
    comm.gather_v(mine, got, [k * width for k in counts], dst=root, group=group)
    picked = xp.empty((p - 1, width), dtype=np.uint8)
    if me == 0:
        assert got is not None
        picked[...] = xp.asarray(_pick(_host(got), dtype, counts, chain.sizes, fibers, n, p))
    comm.broadcast(picked, root, group=group)
    values, keys = (_host(a) for a in _unpack(xp, picked, dtype))
    return _Splitters(keys // n, values, keys % n)


def _pick(got: np.ndarray, dtype: np.dtype, counts: Sequence[int], sizes: Sequence[int],
          fibers: int, n: int, p: int) -> np.ndarray:
    """The ``p - 1`` splitters among the gathered samples (packed rows): the weighted
    quantiles of (fiber, value, virtual global index), each sample weighing the elements
    of its rank it stands for."""
    values, keys = _unpack(np, got, dtype)
    fiber, vidx = keys // n, keys % n
    weight = np.repeat([fibers * s / k if k else 0.0 for s, k in zip(sizes, counts)], counts)
    order = np.lexsort((vidx, values, fiber))
    cum = np.cumsum(weight[order])
    want = np.arange(1, p) * (fibers * n / p)
    pick = order[np.minimum(np.searchsorted(cum, want, side="left"), len(order) - 1)]
    return got[pick]


def _cuts(xp: ModuleType, rows: _Rows, sp: _Splitters) -> list[int]:
    """Where each splitter cuts this rank's sorted rows, read fiber by fiber: the number
    of elements before it in (fiber, value, virtual global index) order."""
    m = rows.values.shape[1]
    out = []
    for f, v, g in zip(sp.fiber.tolist(), sp.values, sp.vidx.tolist()):
        row = rows.values[f]
        lo = int(xp.searchsorted(row, v, side="left"))
        hi = int(xp.searchsorted(row, v, side="right"))
        # equal values sit in ascending global index (the local sort is stable)
        out.append(f * m + lo + int(xp.searchsorted(rows.vidx[f, lo:hi], g, side="left")))
    return out


class _Plan(NamedTuple):
    """Who sends what, as far as this rank needs it (``O(p)``): ``send`` (elements to
    each bucket), ``recv`` (elements from each chain rank), ``recv_from`` (where in its
    sorted rows, read fiber by fiber, the piece chain rank ``i`` sends here starts) and
    ``held`` (every bucket's size)."""

    send: np.ndarray  # (p,)
    recv: np.ndarray  # (p,)
    recv_from: np.ndarray  # (p,)
    held: np.ndarray  # (p,)


def _plan(xp: ModuleType, cuts: list[int], chain: Chain, group: comm.Group, fibers: int
          ) -> _Plan:
    """One all-to-all of two ints per pair (where each piece starts and how long it is),
    one all-gather of each bucket's size: ``O(p)`` ints per rank."""
    p, me = len(chain.ranks), chain.me
    cut = np.array([0, *cuts, fibers * chain.sizes[me]], dtype=np.int64)
    mine = np.stack([cut[:-1], np.diff(cut)], axis=1)  # (p, 2): start, count per bucket
    got = np.empty((p, 2), dtype=np.int64)
    comm.all_to_all(got, mine, group=group)
    held = np.empty(p, dtype=np.int64)
    comm.all_gather(held, got[:, 1].sum(keepdims=True), group=group)
    return _Plan(mine[:, 1].copy(), got[:, 1].copy(), got[:, 0].copy(), held)


def _exchange(xp: ModuleType, rows: _Rows, plan: _Plan, chain: Chain, group: comm.Group,
              indices: bool, flip_in: bool) -> tuple[Any, Any]:
    """The one all-to-all: this rank's bucket, merged (values, and the real global indices
    for argsort), in (fiber, value, virtual global index) order."""
    p = len(chain.ranks)
    dtype = rows.values.dtype
    values = rows.values.reshape(-1)
    payload = _pack(xp, values, rows.gidx.reshape(-1)) if indices else values
    width = payload.shape[1] if indices else 1
    recv_counts = plan.recv
    got = xp.empty((int(recv_counts.sum()),) + payload.shape[1:], dtype=payload.dtype)
    comm.all_to_all_v(got, [int(k) * width for k in recv_counts], payload,
                      [int(k) * width for k in plan.send], group=group)
    vals, gidx = _unpack(xp, got, dtype) if indices else (got, None)
    # runs in virtual block order, so that the stable merge keeps equal elements in order
    runs = list(zip(block_starts(recv_counts.tolist()), recv_counts.tolist(), range(p)))
    if flip_in:
        runs.reverse()
    fibers = rows.values.shape[0]
    fiber = None
    if fibers > 1:
        fiber = xp.concatenate([xp.arange(plan.recv_from[i], plan.recv_from[i] + k) //
                                max(chain.sizes[i], 1) for _, k, i in runs]
                               ) if runs else xp.zeros(0, dtype=np.int64)
    if flip_in:
        pick = xp.concatenate([xp.arange(s, s + k) for s, k, _ in runs])
        vals = vals[pick]
        gidx = gidx[pick] if gidx is not None else None
    perm = _stable_order(xp, vals, fiber)
    return vals[perm], (gidx[perm] if gidx is not None else None)


def _target_count(at: np.ndarray, n: int, lo: int, hi: int) -> np.ndarray:
    """How many sorted positions before ``at`` (fiber * n + position) fall in [lo, hi) of
    their fiber."""
    return (at // n) * (hi - lo) + np.clip(at % n - lo, 0, hi - lo)


class _Target(NamedTuple):
    """Blocks of a 1-D sequence of ``n`` (per fiber) over the chain's ranks."""

    starts: np.ndarray
    sizes: np.ndarray
    n: int


def _to_layout(xp: ModuleType, out: Any, held: np.ndarray, chain: Chain, target: _Target,
               fibers: int, flip_out: bool) -> Any:
    """The buckets (``held[j]`` elements on chain rank ``j``, one after another) put in the
    target's blocks (pure metadata: every rank computes the same plan): sorted position
    q of fiber f goes to index q of the dim (n - 1 - q with ``flip_out``)."""
    me, n = chain.me, target.n
    p = len(chain.ranks)
    first = np.concatenate([[0], np.cumsum(held)])  # bucket j holds [first[j], first[j+1])
    starts, sizes = target.starts, target.sizes
    # where my elements go
    at = first[me] + np.arange(held[me], dtype=np.int64)
    q = at % n
    k = n - 1 - q if flip_out else q
    dest = np.searchsorted(starts, k, side="right") - 1
    order = np.argsort(dest, kind="stable")
    send_counts = np.bincount(dest, minlength=p)
    sends = xp.asarray(out)[xp.asarray(order)]
    # what I get: the sorted positions of my block, fiber by fiber, from the buckets
    lo, hi = (n - starts[me] - sizes[me], n - starts[me]) if flip_out else \
        (starts[me], starts[me] + sizes[me])
    recv_counts = _target_count(first[1:], n, lo, hi) - _target_count(first[:-1], n, lo, hi)
    got = xp.empty(int(recv_counts.sum()), dtype=out.dtype)
    send_at, recv_at = block_starts(send_counts.tolist()), block_starts(recv_counts.tolist())
    works = []
    for j, r in enumerate(chain.ranks):
        if j == me:
            if send_counts[j]:
                got[recv_at[j]:recv_at[j] + recv_counts[j]] = \
                    sends[send_at[j]:send_at[j] + send_counts[j]]
            continue
        if recv_counts[j]:
            works.append(comm.irecv(got[recv_at[j]:recv_at[j] + recv_counts[j]], r, TAG))
        if send_counts[j]:
            works.append(comm.isend(
                xp.ascontiguousarray(sends[send_at[j]:send_at[j] + send_counts[j]]), r, TAG))
    for w in works:
        w.wait()
    block = got.reshape(fibers, hi - lo)
    return block[:, ::-1] if flip_out else block


def sample_sort(x: GlobalTensor, d: int, descending: bool, indices: bool) -> GlobalTensor:
    """``x`` sorted along its split dim ``d`` (``indices``: the argsort) in the layout of
    ``x``; ``x`` has no partial mesh axis."""
    layout = x.layout
    dtype = np.dtype(np.int64) if indices else x.dtype
    rank = get_rank()
    if layout.placement.coord_of(rank) is None:
        return GlobalTensor(np.empty(layout.local_shape(rank), dtype=dtype), layout, dtype)
    xp = backend.get_xp(layout.placement.type)
    chain = Chain(layout, d, rank)
    p, me, n = len(chain.ranks), chain.me, chain.total
    flip_in = descending and indices  # argsort descending: the flipped array, ascending
    a = xp.moveaxis(x.to_local(), d, -1)
    moved = a.shape
    rows = a.reshape(int(np.prod(moved[:-1])), moved[-1])
    fibers = rows.shape[0]
    if flip_in:
        rows = rows[:, ::-1]
    # virtual block order: reversed for a flipped array
    vstart = n - chain.starts[me] - chain.sizes[me] if flip_in else chain.starts[me]
    mine = _local_sort(xp, rows, vstart, n, flip_in)
    if p == 1 or n == 0 or fibers == 0:  # nothing to exchange
        out = mine.gidx if indices else mine.values
        out = out[:, ::-1] if descending else out
    else:
        group = comm.get_group(chain.ranks)
        sp = _splitters(xp, mine, chain, group, n)
        plan = _plan(xp, _cuts(xp, mine, sp), chain, group, fibers)
        vals, gidx = _exchange(xp, mine, plan, chain, group, indices, flip_in)
        target = _Target(np.asarray(chain.starts), np.asarray(chain.sizes), n)
        out = _to_layout(xp, gidx if indices else vals, plan.held, chain, target,
                         fibers, descending)
    out = xp.moveaxis(xp.ascontiguousarray(out).reshape(moved), -1, d)
    return GlobalTensor(xp.ascontiguousarray(out).astype(dtype, copy=False), layout, dtype)


def taking_dim(shape: Sequence[int], layout: Layout, d: int) -> int | None:
    """The dim that takes the split of ``d`` before a sort along ``d`` (an all-to-all):
    the longest dim split by no mesh axis and at least as long as the ranks that split
    ``d`` (the first of equal ones); None where there is none (then sample sort)."""
    axes = [m for m, s in enumerate(layout.sbp) if isinstance(s, Split) and s.dim == d]
    ranks = int(np.prod([layout.placement.hierarchy[m] for m in axes]))
    split_dims = {s.dim for s in layout.sbp if isinstance(s, Split)}
    free = [k for k, n in enumerate(shape) if k != d and k not in split_dims and n >= ranks]
    return max(free, key=lambda k: (shape[k], -k)) if free else None


class Unique(NamedTuple):
    """The distinct values of a 1-D array, the first index of each, the inverse (in the
    input's layout) and the counts."""

    values: GlobalTensor
    indices: GlobalTensor
    inverse: GlobalTensor | None
    counts: GlobalTensor


def _inverse(xp: ModuleType, gidx: Any, ids: Any, plan: _Plan, chain: Chain,
             group: comm.Group) -> Any:
    """Each element's distinct-value number sent back to its place: the all-to-all
    reversed (this bucket returns to chain rank i the ``plan.recv[i]`` elements it got)."""
    me = chain.me
    starts = np.asarray(chain.starts)
    dest = np.searchsorted(starts, _host(gidx), side="right") - 1
    order = xp.asarray(np.argsort(dest, kind="stable"))
    pairs = xp.stack([gidx[order], ids[order]], axis=1)
    got = xp.empty((int(plan.send.sum()), 2), dtype=np.int64)
    comm.all_to_all_v(got, [2 * int(k) for k in plan.send], pairs,
                      [2 * int(k) for k in plan.recv], group=group)
    out = xp.empty(chain.sizes[me], dtype=np.int64)
    out[got[:, 0] - chain.starts[me]] = got[:, 1]
    return out


def sample_unique(x: GlobalTensor, sbp: Any, inverse: bool) -> Unique:
    """``unique`` of a 1-D ``x`` split on a 1-D placement (its ``p`` ranks are the chain):
    the sample sort's buckets (values and global indices), then each value that differs
    from the one before it starts a distinct value (every NaN does: the standard's rule);
    two small gathers (each bucket's last value, then its count of distinct values and the
    position of its first) give every rank the numbering; the results go to the blocks of
    ``sbp`` (the namespace default) point-to-point; ``inverse``: one more all-to-all
    returns each element's number to its place (the inverse keeps ``x``'s layout, the
    default one)."""
    layout = x.layout
    xp = backend.get_xp(layout.placement.type)
    rank = get_rank()
    chain = Chain(layout, 0, rank)
    p, me, n = len(chain.ranks), chain.me, chain.total
    group = comm.get_group(chain.ranks)
    mine = _local_sort(xp, x.to_local().reshape(1, -1), chain.starts[me], n, False)
    sp = _splitters(xp, mine, chain, group, n)
    plan = _plan(xp, _cuts(xp, mine, sp), chain, group, 1)
    vals, gidx = _exchange(xp, mine, plan, chain, group, True, False)
    held = plan.held
    lasts = xp.empty((p, 1), dtype=vals.dtype)
    comm.all_gather(lasts, vals[-1:] if held[me] else xp.zeros(1, dtype=vals.dtype),
                    group=group)
    before = [j for j in range(me) if held[j]]
    new = xp.ones(int(held[me]), dtype=bool)
    new[1:] = vals[1:] != vals[:-1]
    if before and held[me]:
        new[0] = bool(vals[0] != lasts[before[-1], 0])
    at = np.flatnonzero(_host(new))
    first = int(held[:me].sum())
    counts_first = np.array([at.size, first + at[0] if at.size else -1], dtype=np.int64)
    table = np.empty((p, 2), dtype=np.int64)
    comm.all_gather(table, counts_first, group=group)
    later = [int(f) for f in table[me + 1:, 1] if f >= 0]
    ends = np.append(first + at[1:], later[0] if later else n)
    counts = ends - (first + at)
    u = int(table[:, 0].sum())
    out_layout = Layout.make((u,), layout.placement, sbp)
    sizes = np.array([out_layout.local_shape(r)[0] for r in chain.ranks], dtype=np.int64)
    target = _Target(np.asarray(block_starts(sizes.tolist()), dtype=np.int64), sizes, u)
    held_u = table[:, 0]

    def put(a: Any, dtype: np.dtype) -> GlobalTensor:
        block = _to_layout(xp, xp.asarray(a), held_u, chain, target, 1, False).reshape(-1)
        return GlobalTensor(xp.ascontiguousarray(block).astype(dtype, copy=False),
                            out_layout, dtype)

    at_x = xp.asarray(at)
    inv = None
    if inverse:
        ids = int(table[:me, 0].sum()) + xp.cumsum(new.astype(np.int64)) - 1
        inv = GlobalTensor(_inverse(xp, gidx, ids, plan, chain, group), layout,
                           np.dtype(np.int64))
    return Unique(put(vals[at_x], x.dtype), put(gidx[at_x], np.dtype(np.int64)), inv,
                  put(counts, np.dtype(np.int64)))
