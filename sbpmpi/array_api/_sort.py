"""A distributed sort along a split axis: local sorts, then merge-split odd-even
transposition (Baudet and Stevenson) over the ranks that split the sorted axis.

Used by ``sort`` and ``argsort`` when the sorted axis is split and no other axis can take
the split (a 1-D array, or the other axes are split already or shorter than the ranks).
The result keeps the input's layout, uneven and empty blocks included: each rank holds
its block plus, during one round, one neighbour's. There are ``p`` rounds over the ``p``
ranks of the chain; in round ``r`` the pairs ``(i, i + 1)`` with ``i % 2 == r % 2``
exchange their blocks (point-to-point; the sizes come from the layout), both merge, the
lower keeps the smallest ``len(block_i)`` elements and the upper the largest
``len(block_{i+1})``. After ``p`` rounds the concatenation is sorted (the 0-1 principle).

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
from ..core.layout import Layout
from ..core.sbp import Split
from ..env import get_rank
from ..tensor import GlobalTensor

__all__ = ["Chain", "merge_split_chain", "merge_split_sort", "takes_split"]

#: Tag of the merge-split messages (values first, then global indices, per round).
TAG = 23


class Chain:
    """The ranks whose blocks of the sorted axis lie one after another, in block order."""

    def __init__(self, layout: Layout, d: int, rank: int) -> None:
        pl = layout.placement
        coord = pl.coord_of(rank)
        assert coord is not None
        axes = [m for m, s in enumerate(layout.sbp) if isinstance(s, Split) and s.dim == d]
        # row-major over the splitting mesh axes is block order: splits nest axis by axis
        key = tuple(slice(None) if m in axes else coord[m] for m in range(pl.ndim))
        self.ranks: tuple[int, ...] = tuple(int(r) for r in np.asarray(pl.ranks[key]).ravel())
        self.sizes: tuple[int, ...] = tuple(layout.local_shape(r)[d] for r in self.ranks)
        self.starts: tuple[int, ...] = tuple(int(n) for n in np.cumsum((0,) + self.sizes[:-1]))
        self.me: int = self.ranks.index(rank)


def merge_split_chain(layout: Layout, d: int) -> tuple[int, ...] | None:
    """The world ranks of this rank's chain along dim ``d`` (None outside the placement)."""
    rank = get_rank()
    if layout.placement.coord_of(rank) is None:
        return None
    return Chain(layout, d, rank).ranks


class _Order(NamedTuple):
    descending: bool
    reverse_ties: bool  # ties by descending global index (sort, descending)


def _keys(xp: ModuleType, a: Any, idx: Any, order: _Order) -> list[Any]:
    """Sort keys, least significant first: each is sorted by a stable pass in turn."""
    keys = [-idx if order.reverse_ties else idx]
    if not order.descending:
        return keys + [a]
    if a.dtype.kind == "f":
        # -a ascending is a descending with NaN last; NaN first, as the flipped kernel
        return keys + [-a, ~xp.isnan(a)]
    return keys + [~a]  # strictly decreasing for bools, signed and unsigned ints


def _merge(xp: ModuleType, a: Any, idx: Any, d: int, order: _Order) -> tuple[Any, Any]:
    """``a`` and its global indices ``idx`` ordered along ``d`` by (key, index)."""
    perm = None
    for k in _keys(xp, a, idx, order):
        kk = k if perm is None else xp.take_along_axis(k, perm, axis=d)
        p = xp.argsort(kk, axis=d, kind="stable")
        perm = p if perm is None else xp.take_along_axis(perm, p, axis=d)
    return xp.take_along_axis(a, perm, axis=d), xp.take_along_axis(idx, perm, axis=d)


def _exchange(xp: ModuleType, a: Any, idx: Any, peer: int, peer_shape: tuple[int, ...]
              ) -> tuple[Any, Any]:
    got_a = xp.empty(peer_shape, dtype=a.dtype)
    got_i = xp.empty(peer_shape, dtype=idx.dtype)
    works = [comm.irecv(got_a, peer, TAG), comm.irecv(got_i, peer, TAG),
             comm.isend(xp.ascontiguousarray(a), peer, TAG),
             comm.isend(xp.ascontiguousarray(idx), peer, TAG)]
    for w in works:
        w.wait()
    return got_a, got_i


def merge_split_sort(x: GlobalTensor, d: int, descending: bool, indices: bool
                     ) -> GlobalTensor:
    """``x`` sorted along its split dim ``d`` (``indices``: the argsort) in the layout of
    ``x``; ``x`` has no partial mesh axis."""
    layout = x.layout
    dtype = np.dtype(np.int64) if indices else x.dtype
    rank = get_rank()
    if layout.placement.coord_of(rank) is None:
        return GlobalTensor(np.empty(layout.local_shape(rank), dtype=dtype), layout, dtype)
    xp = backend.get_xp(layout.placement.type)
    chain = Chain(layout, d, rank)
    order = _Order(descending, descending and not indices)
    a = x.to_local()
    shape = [1] * a.ndim
    shape[d] = a.shape[d]
    idx = xp.broadcast_to(
        xp.arange(chain.starts[chain.me], chain.starts[chain.me] + a.shape[d],
                  dtype=np.int64).reshape(shape), a.shape)
    a, idx = _merge(xp, a, idx, d, order)
    p, me = len(chain.ranks), chain.me
    for r in range(p):
        lower = me if me % 2 == r % 2 else me - 1
        if lower < 0 or lower + 1 >= p:
            continue
        n_low, n_up = chain.sizes[lower], chain.sizes[lower + 1]
        if n_low == 0 or n_up == 0:  # nothing moves: both sides know it from the layout
            continue
        peer = chain.ranks[lower + 1] if me == lower else chain.ranks[lower]
        peer_shape = layout.local_shape(peer)
        got_a, got_i = _exchange(xp, a, idx, peer, peer_shape)
        pair = (a, got_a) if me == lower else (got_a, a)
        pair_i = (idx, got_i) if me == lower else (got_i, idx)
        ma, mi = _merge(xp, xp.concatenate(pair, axis=d), xp.concatenate(pair_i, axis=d),
                        d, order)
        keep = _span(a.ndim, d, 0, n_low) if me == lower else \
            _span(a.ndim, d, n_low, n_low + n_up)
        a, idx = ma[keep], mi[keep]
    out = idx if indices else a
    return GlobalTensor(xp.ascontiguousarray(out).astype(dtype, copy=False), layout, dtype)


def _span(ndim: int, d: int, start: int, stop: int) -> tuple[slice, ...]:
    return tuple(slice(start, stop) if k == d else slice(None) for k in range(ndim))


def takes_split(shape: Sequence[int], layout: Layout, d: int) -> bool:
    """Whether another dim than ``d`` can take the split of ``d`` (then ``sort`` moves the
    split there with an all-to-all): a dim split by no mesh axis, at least as long as the
    ranks that split ``d``."""
    axes = [m for m, s in enumerate(layout.sbp) if isinstance(s, Split) and s.dim == d]
    ranks = int(np.prod([layout.placement.hierarchy[m] for m in axes]))
    split_dims = {s.dim for s in layout.sbp if isinstance(s, Split)}
    return any(k != d and k not in split_dims and n >= ranks for k, n in enumerate(shape))
