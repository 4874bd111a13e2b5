"""A distributed sort along a split axis: local sorts, then merge-split odd-even
transposition (Baudet and Stevenson) over the ranks that split the sorted axis.

Used by ``sort`` and ``argsort`` when the sorted axis is split and no other axis can take
the split (a 1-D array, or the other axes are split already or shorter than the ranks).
The result keeps the input's layout, uneven and empty blocks included: each rank holds
its block (padded to the largest) plus, during one round, one neighbour's. There are
``p`` rounds over the ``p`` ranks of the chain; in round ``r`` the pairs ``(i, i + 1)``
with ``i % 2 == r % 2`` exchange their blocks (point-to-point; the sizes come from the
layout), both merge, the lower keeps the smaller half and the upper the larger. With
blocks of equal size the concatenation is sorted after ``p`` rounds (Baudet and
Stevenson, by the 0-1 principle); with unequal blocks it may not be (blocks 2, 1, 1, 1
holding 4 3 | 2 | 1 | 0 end as 0 2 | 1 | 3 | 4), so uneven blocks are padded to the
largest with elements that sort after all others, and one final exchange puts the real
elements, then the first ones, back in the input's blocks.

Elements are ordered by (key, global index) lexicographically, so ties come out as the
stable kernel of :mod:`._searching` puts them: ascending keeps the original order (NaN
last); descending is NumPy's ascending order flipped (NaN first), so ``sort`` puts equal
elements in reverse original order (seen on signed zeros) and ``argsort`` in original
order (the standard's stability rule).
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

__all__ = ["Chain", "merge_split_sort", "taking_dim"]

#: Tag of the merge-split messages (MPI keeps their order between two ranks).
TAG = 23


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


class _Order(NamedTuple):
    descending: bool
    reverse_ties: bool  # ties by descending global index (sort, descending)


class _Block(NamedTuple):
    """A block along the sorted dim: values, global indices, and which are padding."""

    values: Any
    index: Any
    pad: Any


def _keys(xp: ModuleType, a: Any, idx: Any, pad: Any, order: _Order) -> list[Any]:
    """Sort keys, least significant first: each is sorted by a stable pass in turn; the
    padding goes after every element."""
    keys = [-idx if order.reverse_ties else idx]
    if not order.descending:
        keys.append(a)
    elif a.dtype.kind == "f":
        # -a ascending is a descending with NaN last; NaN first, as the flipped kernel
        keys += [-a, ~xp.isnan(a)]
    else:
        keys.append(~a)  # strictly decreasing for bools, signed and unsigned ints
    return keys + [pad]


def _merge(xp: ModuleType, block: _Block, d: int, order: _Order) -> _Block:
    """``block`` ordered along ``d`` by (padding, key, global index)."""
    perm = None
    for k in _keys(xp, block.values, block.index, block.pad, order):
        kk = k if perm is None else xp.take_along_axis(k, perm, axis=d)
        p = xp.argsort(kk, axis=d, kind="stable")
        perm = p if perm is None else xp.take_along_axis(perm, p, axis=d)
    return _Block(*(xp.take_along_axis(a, perm, axis=d) for a in block))


def _exchange(xp: ModuleType, block: _Block, peer: int) -> _Block:
    """Swap ``block`` with ``peer``'s block of the same shape."""
    got = _Block(*(xp.empty(a.shape, dtype=a.dtype) for a in block))
    works = [comm.irecv(a, peer, TAG) for a in got]
    works += [comm.isend(xp.ascontiguousarray(a), peer, TAG) for a in block]
    for w in works:
        w.wait()
    return got


def _ranges_overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def _unpad(xp: ModuleType, out: Any, chain: Chain, width: int, d: int) -> Any:
    """The first ``n`` elements of the padded sorted sequence (``width`` per rank) put back
    in the chain's blocks: each rank sends the parts of its padded block that other blocks
    hold (pure metadata: every rank computes the same plan)."""
    me = chain.me
    held = (me * width, (me + 1) * width)
    target = (chain.starts[me], chain.starts[me] + chain.sizes[me])
    shape = list(out.shape)
    shape[d] = chain.sizes[me]
    mine = xp.empty(tuple(shape), dtype=out.dtype)
    works, later = [], []
    for j, r in enumerate(chain.ranks):
        send = _ranges_overlap(held, (chain.starts[j], chain.starts[j] + chain.sizes[j]))
        recv = _ranges_overlap((j * width, (j + 1) * width), target)
        if send is not None:
            part = out[_span(out.ndim, d, send[0] - held[0], send[1] - held[0])]
            if j == me:
                mine[_span(out.ndim, d, send[0] - target[0], send[1] - target[0])] = part
            else:
                works.append(comm.isend(xp.ascontiguousarray(part), r, TAG))
        if recv is not None and j != me:
            rshape = list(shape)
            rshape[d] = recv[1] - recv[0]
            buf = xp.empty(tuple(rshape), dtype=out.dtype)
            works.append(comm.irecv(buf, r, TAG))
            later.append((recv, buf))
    for w in works:
        w.wait()
    for (lo, hi), buf in later:
        mine[_span(out.ndim, d, lo - target[0], hi - target[0])] = buf
    return mine


def merge_split_sort(x: GlobalTensor, d: int, descending: bool, indices: bool
                     ) -> GlobalTensor:
    """``x`` sorted along its split dim ``d`` (``indices``: the argsort) in the layout of
    ``x``; ``x`` has no partial mesh axis.

    Blocks of unequal sizes are padded to the largest (padding sorts last), for which
    ``p`` rounds are proven to sort; the real elements, then first in the sequence, go
    back to the input's blocks in one exchange at the end.
    """
    layout = x.layout
    dtype = np.dtype(np.int64) if indices else x.dtype
    rank = get_rank()
    if layout.placement.coord_of(rank) is None:
        return GlobalTensor(np.empty(layout.local_shape(rank), dtype=dtype), layout, dtype)
    xp = backend.get_xp(layout.placement.type)
    chain = Chain(layout, d, rank)
    order = _Order(descending, descending and not indices)
    p, me = len(chain.ranks), chain.me
    width = max(chain.sizes)
    even = min(chain.sizes) == width
    a = x.to_local()
    n_me = a.shape[d]
    shape = list(a.shape)
    shape[d] = width
    if not even:
        a = xp.concatenate([a, xp.zeros(tuple(shape[:d] + [width - n_me] + shape[d + 1:]),
                                        dtype=a.dtype)], axis=d)
    line = [1] * a.ndim
    line[d] = width
    # global index of each real element; the padding gets ids after all of them
    ids = xp.arange(width, dtype=np.int64)
    ids = xp.where(ids < n_me, chain.starts[me] + ids, chain.total + me * width + ids)
    block = _Block(a, xp.broadcast_to(ids.reshape(line), a.shape),
                   xp.broadcast_to((xp.arange(width) >= n_me).reshape(line), a.shape))
    block = _merge(xp, block, d, order)
    for r in range(p if width else 0):
        lower = me if me % 2 == r % 2 else me - 1
        if lower < 0 or lower + 1 >= p:
            continue
        peer = chain.ranks[lower + 1] if me == lower else chain.ranks[lower]
        got = _exchange(xp, block, peer)
        pair = (block, got) if me == lower else (got, block)
        merged = _merge(xp, _Block(*(xp.concatenate(ab, axis=d) for ab in zip(*pair))),
                        d, order)
        keep = _span(a.ndim, d, 0, width) if me == lower else _span(a.ndim, d, width, 2 * width)
        block = _Block(*(m[keep] for m in merged))
    out = block.index if indices else block.values
    if not even:
        out = _unpad(xp, out, chain, width, d)
    return GlobalTensor(xp.ascontiguousarray(out).astype(dtype, copy=False), layout, dtype)


def _span(ndim: int, d: int, start: int, stop: int) -> tuple[slice, ...]:
    return tuple(slice(start, stop) if k == d else slice(None) for k in range(ndim))


def taking_dim(shape: Sequence[int], layout: Layout, d: int) -> int | None:
    """The dim that takes the split of ``d`` before a sort along ``d`` (an all-to-all):
    the longest dim split by no mesh axis and at least as long as the ranks that split
    ``d`` (the first of equal ones); None where there is none (then merge-split)."""
    axes = [m for m, s in enumerate(layout.sbp) if isinstance(s, Split) and s.dim == d]
    ranks = int(np.prod([layout.placement.hierarchy[m] for m in axes]))
    split_dims = {s.dim for s in layout.sbp if isinstance(s, Split)}
    free = [k for k, n in enumerate(shape) if k != d and k not in split_dims and n >= ranks]
    return max(free, key=lambda k: (shape[k], -k)) if free else None
