"""Pure layout arithmetic: which slice of the global tensor each rank holds.

No MPI and no arrays here: everything is a function of (global shape, mesh shape,
ND-SBP, mesh coordinate). Splits are balanced: ``n`` rows over ``p`` parts give
the first ``n % p`` parts one extra row. ND splits apply mesh axis by mesh axis,
each splitting the range left by the axes before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .placement import Placement
from .sbp import SBP, NdSbp, Partial, Split, normalize_nd_sbp

__all__ = [
    "balanced_range",
    "balanced_sizes",
    "block_starts",
    "shard_ranges",
    "shard_slices",
    "shard_shape",
    "empty_shape",
    "Layout",
]


def balanced_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """Return ``[start, stop)`` of block ``index`` when ``n`` items are cut into ``parts``."""
    q, r = divmod(n, parts)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


def balanced_sizes(n: int, parts: int) -> tuple[int, ...]:
    """Return the sizes of all ``parts`` blocks of ``n`` items."""
    q, r = divmod(n, parts)
    return tuple(q + (1 if i < r else 0) for i in range(parts))


def shard_ranges(
    shape: Sequence[int], hierarchy: Sequence[int], nd_sbp: NdSbp, coord: Sequence[int]
) -> tuple[tuple[int, int], ...]:
    """Return the ``(start, stop)`` per tensor dim held at mesh coordinate ``coord``."""
    ranges = [(0, int(n)) for n in shape]
    for axis, s in enumerate(nd_sbp):
        if isinstance(s, Split):
            lo, hi = ranges[s.dim]
            a, b = balanced_range(hi - lo, hierarchy[axis], coord[axis])
            ranges[s.dim] = (lo + a, lo + b)
    return tuple(ranges)


def shard_slices(
    shape: Sequence[int], hierarchy: Sequence[int], nd_sbp: NdSbp, coord: Sequence[int]
) -> tuple[slice, ...]:
    """Return the global slice held at mesh coordinate ``coord``."""
    return tuple(slice(a, b) for a, b in shard_ranges(shape, hierarchy, nd_sbp, coord))


def shard_shape(
    shape: Sequence[int], hierarchy: Sequence[int], nd_sbp: NdSbp, coord: Sequence[int]
) -> tuple[int, ...]:
    """Return the local shape held at mesh coordinate ``coord``."""
    return tuple(b - a for a, b in shard_ranges(shape, hierarchy, nd_sbp, coord))


def block_starts(sizes: Sequence[int]) -> list[int]:
    """Where each block starts when blocks of ``sizes`` lie one after another (the packed
    displacements of a v-collective: exclusive prefix sums)."""
    starts, s = [], 0
    for n in sizes:
        starts.append(s)
        s += n
    return starts


def empty_shape(ndim: int) -> tuple[int, ...]:
    """Shape of the empty shard held by a rank outside the placement."""
    return (0,) * max(ndim, 1)


@dataclass(frozen=True)
class Layout:
    """Global shape, placement and ND-SBP of a global tensor (no dtype, no data)."""

    shape: tuple[int, ...]
    placement: Placement
    sbp: NdSbp

    @classmethod
    def make(cls, shape: Sequence[int], placement: Placement, sbp: SBP | Sequence[SBP]) -> Layout:
        """Validate and normalise ``sbp`` against ``shape`` and ``placement``."""
        shape = tuple(int(n) for n in shape)
        return cls(shape, placement, normalize_nd_sbp(sbp, placement.ndim, len(shape)))

    def converted(self, placement: Placement | None = None,
                  sbp: SBP | Sequence[SBP] | None = None) -> Layout:
        """The layout ``x.to_global(placement=placement, sbp=sbp)`` gives a tensor laid out
        as ``self``: the same shape; an omitted placement or sbp is kept (sbp is required
        when the mesh's number of dims changes)."""
        if placement is None:
            placement = self.placement
        if not isinstance(placement, Placement):
            raise TypeError(f"placement must be an sm.placement, got {type(placement).__name__}")
        if sbp is None:
            if placement.ndim != self.placement.ndim:
                raise ValueError(
                    f"sbp is required when the mesh changes from {self.placement.ndim}-d to "
                    f"{placement.ndim}-d")
            sbp = self.sbp
        return Layout.make(self.shape, placement, sbp)

    def __hash__(self) -> int:
        # immutable, so hashed once: layouts key every cache of the op and boxing paths
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.shape, self.placement, self.sbp))
        return h  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, object]:
        # the cached hash is per process (str hashing is salted): never pickle it
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def coord(self, rank: int) -> tuple[int, ...] | None:
        return self.placement.coord_of(rank)

    def local_ranges(self, rank: int) -> tuple[tuple[int, int], ...] | None:
        """``(start, stop)`` per dim held by ``rank``; None outside the placement."""
        c = self.placement.coord_of(rank)
        if c is None:
            return None
        return shard_ranges(self.shape, self.placement.hierarchy, self.sbp, c)

    def local_slice(self, rank: int) -> tuple[slice, ...] | None:
        """Global slice held by ``rank``; None outside the placement."""
        r = self.local_ranges(rank)
        return None if r is None else tuple(slice(a, b) for a, b in r)

    def local_shape(self, rank: int) -> tuple[int, ...]:
        """Local shard shape of ``rank`` (an empty shape outside the placement)."""
        r = self.local_ranges(rank)
        if r is None:
            return empty_shape(self.ndim)
        return tuple(b - a for a, b in r)

    def partial_axes(self) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self.sbp) if isinstance(s, Partial))

    def identity_op(self, rank: int) -> str | None:
        """Which reduction's identity ``rank`` holds when a known value is laid out as partial.

        None means the rank holds the value itself: it sits at index 0 of every partial
        mesh axis. Otherwise it is the op of the innermost partial axis where its
        coordinate is not 0, so that every partial reduction stays exact (no overflow of
        stacked identities in integer dtypes).
        """
        c = self.placement.coord_of(rank)
        if c is None:
            return None
        op = None
        for a in self.partial_axes():
            if c[a] != 0:
                op = self.sbp[a].op  # type: ignore[union-attr]
        return op

    def __str__(self) -> str:
        sbp = ", ".join(str(s) for s in self.sbp)
        return f"{self.shape} on {self.placement.ranks.tolist()} ({self.placement.type}) sbp=({sbp})"
