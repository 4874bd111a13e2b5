"""Halo exchange: each rank's shard padded with its neighbours' data (``x.halo``).

A rank's padded shard is the window ``[start - depth, stop + depth)`` of the whole
array, per tensor dim, with the positions outside ``[0, n)`` filled as ``np.pad``
fills them (``boundary``). Each padded dim is cut into *segments*: runs of positions
taken from one block of that dim (or from the constant). A cell of the padded shard is
a product of one segment per dim, so the pieces a rank receives are the products of
its segments; each comes from the rank holding that combination of blocks (the same
coordinates on the mesh axes that split nothing). So a 2-D decomposition gets its
corners by direct diagonal messages, and every message is posted at once: one phase,
non-blocking, with neighbours only (a depth larger than a neighbour's block reaches
the ranks beyond it).

Both sides compute the receiver's segments with the same pure function: the sender
walks the receiver's pieces in the receiver's order and sends those it owns, so the
messages of one pair match in order (MPI does not overtake messages of one tag).
The plan is cached per (layout, depth, boundary, rank); building it costs
O(depth + neighbours) per dim, never a loop over all ranks.

Boundaries (Dask's names, ``dask.array.map_overlap``):

========== ==========================================================
``none``     no padding at the global edges (the edge ranks' window is smaller)
``periodic`` ``np.pad(mode="wrap")``
``reflect``  ``np.pad(mode="symmetric")`` (the edge element repeated, as Dask)
``nearest``  ``np.pad(mode="edge")``
``constant`` ``np.pad(mode="constant", constant_values=value)``
========== ==========================================================
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .. import backend, comm
from ..backend import host_pool
from ..core.layout import Layout, balanced_range
from ..core.sbp import Split

__all__ = ["BOUNDARIES", "HaloPlan", "Halo", "halo_plan", "start_halo", "normalize_depth",
           "normalize_boundary"]

BOUNDARIES = ("none", "periodic", "reflect", "nearest", "constant")
TAG = 23311  # tag of the halo messages (boxing's point-to-point moves use 23307)


# -- the arguments -----------------------------------------------------------------------

def normalize_depth(depth: Any, ndim: int, what: str = "halo") -> tuple[int, ...]:
    """One non-negative int per dim from an int, a sequence of ``ndim`` ints or a dict
    ``{axis: depth}`` (missing axes get 0, as Dask)."""
    return _per_axis(depth, ndim, what, "depth", 0, _one_depth)


def _one_depth(d: Any, what: str) -> int:
    if isinstance(d, bool) or not isinstance(d, int) and not hasattr(d, "__index__"):
        raise TypeError(f"{what}: depth must be a non-negative int (or one per axis), "
                        f"got {d!r}")
    d = int(d.__index__())
    if d < 0:
        raise ValueError(f"{what}: depth must be >= 0, got {d}")
    return d


def normalize_boundary(boundary: Any, ndim: int, what: str = "halo") -> tuple[str, ...]:
    """One boundary name per dim from a name, a sequence of ``ndim`` names or a dict
    ``{axis: name}`` (missing axes get ``"none"``)."""
    return _per_axis(boundary, ndim, what, "boundary", "none", _one_boundary)


def _per_axis(value: Any, ndim: int, what: str, name: str, missing: Any,
              one: Callable[[Any, str], Any]) -> tuple[Any, ...]:
    """``value`` for every dim, as Dask takes ``depth`` and ``boundary``: one value for all,
    a sequence of ``ndim`` values, or a dict ``{axis: value}`` (other axes ``missing``);
    each value checked by ``one``."""
    if isinstance(value, dict):
        out = [missing] * ndim
        for axis, v in value.items():
            if type(axis) is not int or ndim == 0 or not -ndim <= axis < ndim:
                raise ValueError(f"{what}: {name} has axis {axis!r}, expected an axis of "
                                 f"a {ndim}-d array")
            out[axis % ndim] = one(v, what)
        return tuple(out)
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != ndim:
            raise ValueError(f"{what}: {name}={tuple(value)!r} has {len(value)} "
                             f"entries, expected one per axis of the {ndim}-d array")
        return tuple(one(v, what) for v in value)
    return (one(value, what),) * ndim


def _one_boundary(b: Any, what: str) -> str:
    if b not in BOUNDARIES:
        raise ValueError(f"{what}: boundary={b!r}, expected one of {', '.join(BOUNDARIES)}")
    return str(b)


# -- one tensor dim: its blocks and a block's padded window --------------------------------

@dataclass(frozen=True)
class AxisSplit:
    """How one tensor dim of length ``n`` is cut: by the mesh axes ``mesh_axes`` (outer
    first) of sizes ``parts``; block ``k`` is their coordinates flattened."""

    n: int
    mesh_axes: tuple[int, ...]
    parts: tuple[int, ...]

    @property
    def count(self) -> int:
        return math.prod(self.parts)

    def coords(self, k: int) -> tuple[int, ...]:
        """The mesh coordinates (on ``mesh_axes``) of block ``k``."""
        out = []
        for p in reversed(self.parts):
            k, c = divmod(k, p)
            out.append(c)
        return tuple(reversed(out))

    def block(self, k: int) -> tuple[int, int]:
        """``[start, stop)`` of block ``k`` (as ``core.layout.shard_ranges``)."""
        lo, hi = 0, self.n
        for p, c in zip(self.parts, self.coords(k)):
            a, b = balanced_range(hi - lo, p, c)
            lo, hi = lo + a, lo + b
        return lo, hi

    def owner(self, g: int) -> int:
        """The block holding index ``g`` (``0 <= g < n``)."""
        k, lo, hi = 0, 0, self.n
        for p in self.parts:
            q, r = divmod(hi - lo, p)
            off = g - lo
            c = off // (q + 1) if off < r * (q + 1) else r + (off - r * (q + 1)) // q
            a, b = balanced_range(hi - lo, p, c)
            k, lo, hi = k * p + c, lo + a, lo + b
        return k


@dataclass(frozen=True)
class Segment:
    """Positions ``[dst_start, dst_stop)`` of a padded dim, taken from block ``owner``
    at its local indices ``src`` (a slice, or a tuple where reflected or repeated);
    ``owner`` None: the constant."""

    dst_start: int
    dst_stop: int
    owner: int | None
    src: slice | tuple[int, ...] | None


@dataclass(frozen=True)
class AxisWindow:
    """The padded window of one block along one dim: padding added below and above
    (``lo``, ``hi``: fewer than ``depth`` at a global edge with ``boundary="none"``)
    and its segments, in order."""

    lo: int
    hi: int
    segments: tuple[Segment, ...]


def _source(p: int, n: int, boundary: str) -> int | None:
    """The index of the whole array that padded position ``p`` (global, may lie outside
    ``[0, n)``) shows, as ``np.pad`` fills it; None: the constant."""
    if 0 <= p < n:
        return p
    if boundary == "periodic":
        return p % n
    if boundary == "nearest":
        return min(max(p, 0), n - 1)
    if boundary == "reflect":  # np.pad "symmetric": period 2n, the edge repeated
        m = p % (2 * n)
        return m if m < n else 2 * n - 1 - m
    return None  # constant


@lru_cache(maxsize=4096)
def axis_window(split: AxisSplit, depth: int, boundary: str, k: int) -> AxisWindow:
    """Block ``k``'s padded window along one dim: its halo runs, its own block, and the
    halo runs above."""
    a, b = split.block(k)
    n = split.n
    if boundary == "none":
        lo, hi = min(depth, a), min(depth, n - b)
    else:
        lo, hi = depth, depth
    segs: list[Segment] = []
    segs += _halo_runs(split, boundary, range(a - lo, a), 0)
    if b > a:
        segs.append(Segment(lo, lo + b - a, k, slice(0, b - a)))
    segs += _halo_runs(split, boundary, range(b, b + hi), lo + b - a)
    return AxisWindow(lo, hi, tuple(segs))


def _halo_runs(split: AxisSplit, boundary: str, positions: range, dst0: int) -> list[Segment]:
    """The positions of one halo cut into runs of one owner (or of the constant)."""
    runs: list[Segment] = []
    owner: int | None = -1
    start, idx = dst0, []  # type: ignore[var-annotated]
    for i, p in enumerate(positions):
        g = _source(p, split.n, boundary)
        o = None if g is None else split.owner(g)
        if o != owner and i:
            runs.append(_segment(start, dst0 + i, owner, idx, split))
            start, idx = dst0 + i, []
        owner = o
        idx.append(g)
    if len(positions):
        runs.append(_segment(start, dst0 + len(positions), owner, idx, split))
    return runs


def _segment(start: int, stop: int, owner: int | None, idx: list, split: AxisSplit) -> Segment:
    if owner is None:
        return Segment(start, stop, None, None)
    base = split.block(owner)[0]
    local = tuple(g - base for g in idx)
    if all(j == local[0] + i for i, j in enumerate(local)):  # ascending: a slice
        return Segment(start, stop, owner, slice(local[0], local[0] + len(local)))
    return Segment(start, stop, owner, local)


def _receivers(split: AxisSplit, depth: int, boundary: str, k: int) -> list[int]:
    """The blocks whose padded window may show some of block ``k`` (a superset: the
    caller keeps those whose segments name ``k``). Found by bisection on the block
    bounds, which grow with the block index: no loop over all blocks."""
    count = split.count
    if count == 1 or depth == 0:
        return [k]
    a, b = split.block(k)
    if b == a:
        return [k]  # an empty block shows nothing
    blocks = range(count)
    first = bisect.bisect_right(blocks, a - depth, key=lambda j: split.block(j)[1])
    last = bisect.bisect_left(blocks, b + depth, key=lambda j: split.block(j)[0])
    out = set(range(first, last))
    if boundary in ("periodic", "reflect", "nearest"):  # the edge blocks' halos wrap
        out.update(range(bisect.bisect_left(blocks, depth, key=lambda j: split.block(j)[0])))
        out.update(range(bisect.bisect_right(blocks, split.n - depth,
                                             key=lambda j: split.block(j)[1]), count))
    out.add(k)
    return sorted(out)


# -- the plan of one rank --------------------------------------------------------------------

@dataclass(frozen=True)
class Piece:
    """One box of the padded shard: its slices there, the peer's local index per dim
    (slices or index tuples) and the peer (a world rank; this rank for a local copy)."""

    dst: tuple[slice, ...]
    src: tuple[slice | tuple[int, ...], ...]
    peer: int


@dataclass(frozen=True)
class HaloPlan:
    """What one rank does for one halo: the padded shape, where its shard sits in it,
    the constant's fill, its receives, sends and local copies (each in message order)."""

    padded_shape: tuple[int, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    fill: bool
    recvs: tuple[Piece, ...]
    sends: tuple[Piece, ...]
    local: tuple[Piece, ...]
    member: bool


def _splits(layout: Layout) -> tuple[AxisSplit, ...]:
    axes: list[list[int]] = [[] for _ in layout.shape]
    for mesh_axis, s in enumerate(layout.sbp):
        if isinstance(s, Split):
            axes[s.dim].append(mesh_axis)
    h = layout.placement.hierarchy
    return tuple(AxisSplit(n, tuple(m), tuple(h[i] for i in m))
                 for n, m in zip(layout.shape, axes))


def check_layout(layout: Layout, depth: tuple[int, ...], boundary: tuple[str, ...],
                 what: str) -> None:
    """Refuse, identically on every rank, what has no halo: a partial layout, and a
    wrapped or reflected empty dim (``np.pad`` refuses it too)."""
    if layout.partial_axes():
        raise ValueError(
            f"{what}: the tensor is partial (sbp={tuple(str(s) for s in layout.sbp)}); its "
            "shards are summands, not blocks, so a halo has no meaning. Convert it first, "
            "e.g. x.to_global(sbp=sm.sbp.split(0)) or sm.sbp.broadcast")
    for d, (n, dd, b) in enumerate(zip(layout.shape, depth, boundary)):
        if n == 0 and dd > 0 and b in ("periodic", "reflect", "nearest"):
            raise ValueError(f"{what}: boundary={b!r} cannot extend axis {d} of length 0 "
                             f"(np.pad refuses it too); use 'none' or 'constant'")


@lru_cache(maxsize=256)
def halo_plan(layout: Layout, depth: tuple[int, ...], boundary: tuple[str, ...],
              rank: int) -> HaloPlan:
    """The cached plan of ``rank``'s halo (``check_layout`` first)."""
    coord = layout.placement.coord_of(rank)
    if coord is None:
        return HaloPlan((), (), (), False, (), (), (), False)
    splits = _splits(layout)
    mine = tuple(_block_of(s, coord) for s in splits)
    windows = [axis_window(s, d, b, k) for s, d, b, k in zip(splits, depth, boundary, mine)]
    recvs: list[Piece] = []
    local: list[Piece] = []
    for combo in itertools.product(*(w.segments for w in windows)):
        owners = tuple(seg.owner for seg in combo)
        if None in owners:
            continue  # the constant, filled beforehand
        piece = Piece(tuple(slice(seg.dst_start, seg.dst_stop) for seg in combo),
                      tuple(seg.src for seg in combo),  # type: ignore[misc]
                      _rank_of(layout, splits, coord, owners))
        (local if owners == mine else recvs).append(piece)
    sends: list[Piece] = []
    for theirs in itertools.product(*(_receivers(s, d, b, k)
                                      for s, d, b, k in zip(splits, depth, boundary, mine))):
        if theirs == mine:
            continue
        peer = _rank_of(layout, splits, coord, theirs)
        their_windows = [axis_window(s, d, b, k)
                         for s, d, b, k in zip(splits, depth, boundary, theirs)]
        for combo in itertools.product(*(w.segments for w in their_windows)):
            if tuple(seg.owner for seg in combo) == mine:
                sends.append(Piece(tuple(slice(seg.dst_start, seg.dst_stop) for seg in combo),
                                   tuple(seg.src for seg in combo),  # type: ignore[misc]
                                   peer))
    shape = tuple(w.lo + w.hi + (s.block(k)[1] - s.block(k)[0])
                  for w, s, k in zip(windows, splits, mine))
    return HaloPlan(shape, tuple(w.lo for w in windows), tuple(w.hi for w in windows),
                    "constant" in boundary, tuple(recvs), tuple(sends), tuple(local), True)


def _block_of(split: AxisSplit, coord: tuple[int, ...]) -> int:
    k = 0
    for axis, p in zip(split.mesh_axes, split.parts):
        k = k * p + coord[axis]
    return k


def _rank_of(layout: Layout, splits: Sequence[AxisSplit], coord: tuple[int, ...],
             blocks: tuple[int | None, ...]) -> int:
    c = list(coord)
    for s, k in zip(splits, blocks):
        assert k is not None
        for axis, ck in zip(s.mesh_axes, s.coords(k)):
            c[axis] = ck
    return layout.placement.rank_at(c)


# -- running it ----------------------------------------------------------------------------

def _take(local: Any, src: tuple[slice | tuple[int, ...], ...], xp: Any) -> Any:
    """``local``'s box ``src`` (slices first: a view; reflected dims: ``take``)."""
    out = local[tuple(s if isinstance(s, slice) else slice(None) for s in src)]
    for d, s in enumerate(src):
        if not isinstance(s, slice):
            out = xp.take(out, xp.asarray(s), axis=d)
    return out


def _packed(local: Any, src: tuple[slice | tuple[int, ...], ...], xp: Any) -> Any:
    """A contiguous copy of ``local``'s box ``src`` to send."""
    box = _take(local, src, xp)
    if box.flags.c_contiguous and box is not local and box.base is None:
        return box  # take made a fresh copy
    out = host_pool.empty(xp, box.shape, box.dtype)
    out[...] = box
    return out


class Halo:
    """A halo on its way: ``wait()`` returns the padded shard, ``test()`` polls.

    The receives and sends are posted and the local part copied when it is made, so
    the caller may compute on its shard's interior meanwhile.
    """

    __slots__ = ("_padded", "_recvs", "_sends", "_done")

    def __init__(self, padded: Any, recvs: list[tuple[Any, Any, tuple[slice, ...]]],
                 sends: list[Any]) -> None:
        self._padded = padded
        self._recvs = recvs
        self._sends = sends
        self._done = not recvs and not sends

    def test(self) -> bool:
        """True when every message of this halo is done (``wait()`` then returns at once)."""
        return self._done or all(w.test() for w, _, _ in self._recvs) and all(
            w.test() for w in self._sends)

    def wait(self) -> Any:
        """The padded shard (an array of the shard's namespace), once every halo arrived."""
        if not self._done:
            for work, buf, dst in self._recvs:
                work.wait()
                self._padded[dst] = buf
            for work in self._sends:
                work.wait()
            self._recvs, self._sends, self._done = [], [], True
        return self._padded

    def __repr__(self) -> str:
        return f"<Halo {'done' if self._done else 'pending'} {tuple(self._padded.shape)}>"


def start_halo(local: Any, layout: Layout, depth: tuple[int, ...], boundary: tuple[str, ...],
               value: Any, rank: int) -> Halo:
    """Post ``rank``'s halo exchange of shard ``local`` (validated by ``check_layout``)."""
    plan = halo_plan(layout, depth, boundary, rank)
    if not plan.member:
        return Halo(local, [], [])
    xp = backend.get_xp(backend.device_type_of(local))
    # every array from the host pool: large ones are reused blocks, not fresh pages
    padded = host_pool.empty(xp, plan.padded_shape, local.dtype)
    if plan.fill:
        padded[...] = value
    recvs = []
    for p in plan.recvs:  # receives first: a message never waits for its buffer
        buf = host_pool.empty(xp, tuple(s.stop - s.start for s in p.dst), local.dtype)
        recvs.append((comm.irecv(buf, p.peer, TAG), buf, p.dst))
    sends = [comm.isend(_packed(local, p.src, xp), p.peer, TAG) for p in plan.sends]
    for p in plan.local:
        padded[p.dst] = _take(local, p.src, xp)
    return Halo(padded, recvs, sends)
