"""Placement: the device type and the N-d mesh of ranks that hold a global tensor."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Placement", "placement", "DEVICE_TYPES"]

DEVICE_TYPES = ("cpu", "cuda")


_world_size_source: list[Callable[[], int]] = []


def set_world_size_source(source: Callable[[], int]) -> None:
    """Where a placement built without ``world_size=`` learns the world size.

    ``sbpmpi`` sets it to :func:`sbpmpi.env.get_world_size` at import; this module makes
    no MPI call itself.
    """
    _world_size_source[:] = [source]


def _world_size() -> int:
    if not _world_size_source:
        raise RuntimeError("placement: the world size is unknown here; pass world_size=")
    return _world_size_source[0]()


_topology_source: list[Callable[[], Sequence[int]]] = []


def set_topology_source(source: Callable[[], Sequence[int]]) -> None:
    """Where a placement by node (``{node: [local ranks]}``) learns the node of every
    world rank; ``sbpmpi`` sets it to :func:`sbpmpi.env.topology` at import."""
    _topology_source[:] = [source]


def node_major_ranks(nodes: Mapping[Any, Any]) -> list[int]:
    """The world ranks of a placement by node, ``{node: [local ranks]}`` as in OneFlow:
    nodes in ascending order, each node's local ranks in the order given.

    Node ``k`` is the ``k``-th host ordered by its lowest world rank; local rank ``j`` of a
    node is the ``j``-th of its ranks in rank order. A node or local rank that does not
    exist is a ValueError naming it.
    """
    if not _topology_source:
        raise RuntimeError("placement: the nodes of the ranks are unknown here; "
                           "import sbpmpi first (it records them)")
    of = list(_topology_source[0]())
    count = max(of) + 1 if of else 0
    for node in nodes:
        if not _is_int(node):
            raise TypeError(f"placement nodes must be integers, got {type_name(node)} "
                            f"{node!r} in {dict(nodes)!r}")
    ranks: list[int] = []
    for node in sorted(nodes):
        if not 0 <= node < count:
            raise ValueError(f"placement node {node} does not exist: the job runs on {count} "
                             f"node{'s' if count != 1 else ''} (nodes 0..{count - 1})")
        here = [r for r, k in enumerate(of) if k == node]
        local = nodes[node]
        local = [local] if _is_int(local) else list(local)
        for j in local:
            if not _is_int(j):
                raise TypeError(f"placement local ranks must be integers, got {type_name(j)} "
                                f"{j!r} for node {node}")
            if not 0 <= j < len(here):
                raise ValueError(f"placement node {node} has no local rank {j}: it runs "
                                 f"{len(here)} rank{'s' if len(here) != 1 else ''} (local "
                                 f"ranks 0..{len(here) - 1})")
            ranks.append(here[j])
    if not ranks:
        raise ValueError(_no_rank_message(nodes))
    return ranks


def _no_rank_message(nodes: Mapping[Any, Any]) -> str:
    """Why the placement by node ``nodes`` names no rank: no node, or only empty lists."""
    if not nodes:
        return "placement ranks must name at least one rank, got an empty mapping"
    empty = sorted(nodes)
    which = (f"node {empty[0]} has" if len(empty) == 1
             else f"nodes {', '.join(map(str, empty))} have")
    return (f"placement {dict(nodes)!r} names no rank: {which} an empty list of local ranks "
            f"(expected at least one local rank per node, e.g. {{{empty[0]}: [0]}})")


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


class Placement:
    """Device type plus an N-d mesh of world ranks.

    Parameters
    ----------
    type : {"cpu", "cuda"}
        Backend of the shards: NumPy on ``"cpu"``, CuPy on ``"cuda"``.
    ranks : int, sequence, ndarray or mapping
        World ranks; a nested sequence gives an N-d mesh (``[[0, 1], [2, 3]]`` is 2x2).
        The order is kept: the first block of a split goes to ``ranks.flat[0]``. A
        mapping ``{node: [local ranks]}`` places by node as in OneFlow (node ``k``: the
        ``k``-th host ordered by its lowest world rank; local rank ``j``: the ``j``-th of
        its ranks): a 1-D placement of those world ranks, node by node
        (:func:`node_major_ranks`).
    world_size : int, optional
        Bound for the ranks; the current world size by default.
    """

    __slots__ = ("_type", "_ranks", "_key", "_hash", "_index", "_groups")

    def __init__(self, type: str, ranks: Any, *, world_size: int | None = None) -> None:
        if not isinstance(type, str) or type not in DEVICE_TYPES:
            raise ValueError(
                f"placement type {type!r} is not supported; expected one of {DEVICE_TYPES}"
            )
        if isinstance(ranks, Mapping):
            ranks = node_major_ranks(ranks)
        try:
            np.array(ranks)  # NumPy refuses ragged nesting here
            arr = np.array(ranks, dtype=object)
        except (ValueError, TypeError) as e:
            raise ValueError(f"placement ranks {ranks!r} do not form a rectangular mesh") from e
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.size == 0:
            raise ValueError("placement ranks must name at least one rank, got an empty list")
        for r in arr.flat:
            if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, np.integer)):
                raise TypeError(
                    f"placement ranks must be integers, got {type_name(r)} {r!r} in {ranks!r}"
                )
        arr = arr.astype(np.int64)
        if world_size is None:
            world_size = _world_size()
        bad = [int(r) for r in arr.flat if not 0 <= r < world_size]
        if bad:
            hint = (f"; run under mpiexec -n {max(bad) + 1} (was mpiexec forgotten?)"
                    if world_size == 1 else "")
            raise ValueError(
                f"placement ranks {bad} are out of range for a world of {world_size} "
                f"process{'es' if world_size != 1 else ''} (valid ranks are 0..{world_size - 1})"
                f"{hint}"
            )
        uniq, counts = np.unique(arr, return_counts=True)
        if (counts > 1).any():
            raise ValueError(
                f"placement ranks must be distinct, but {uniq[counts > 1].tolist()} "
                f"appear more than once in {arr.tolist()}"
            )
        arr.setflags(write=False)
        self._type = type
        self._ranks = arr
        self._key = (type, arr.shape, tuple(int(r) for r in arr.flat))
        self._hash = hash(self._key)  # once: placements key the plan caches (O(ranks) to hash)
        self._index = {int(r): i for i, r in enumerate(arr.flat)}
        # (axis, span) -> (the groups along those mesh axes, each rank's group)
        self._groups: dict[tuple[int, int], tuple[tuple[tuple[int, ...], ...],
                                                  dict[int, tuple[int, ...]]]] = {}

    @classmethod
    def all(cls, type: str) -> Placement:
        """Return the 1-D placement over every rank of the world."""
        return cls(type, list(range(_world_size())))

    @property
    def type(self) -> str:
        """Device type, ``"cpu"`` or ``"cuda"``."""
        return self._type

    device_type = type

    @property
    def ranks(self) -> np.ndarray:
        """The mesh of world ranks (read-only ndarray)."""
        return self._ranks

    @property
    def hierarchy(self) -> tuple[int, ...]:
        """Shape of the mesh."""
        return tuple(self._ranks.shape)

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return self._ranks.ndim

    @property
    def size(self) -> int:
        """Number of ranks in the placement."""
        return self._ranks.size

    @property
    def rank_list(self) -> tuple[int, ...]:
        """The ranks in mesh (row-major) order."""
        return self._key[2]

    def __contains__(self, rank: object) -> bool:
        return rank in self._index

    def coord_of(self, rank: int) -> tuple[int, ...] | None:
        """Mesh coordinate of ``rank``, or None if it is not in the placement."""
        i = self._index.get(rank)  # type: ignore[call-overload]
        if i is None:
            return None
        coord = []
        for n in reversed(self._ranks.shape):  # row-major, as np.unravel_index
            i, c = divmod(i, n)
            coord.append(c)
        return tuple(reversed(coord))

    def rank_at(self, coord: Sequence[int]) -> int:
        """World rank at mesh coordinate ``coord``."""
        return int(self._ranks[tuple(coord)])

    def axis_groups(self, axis: int, span: int = 1) -> tuple[tuple[int, ...], ...]:
        """All groups of ranks along mesh axes ``axis .. axis + span - 1``: each holds the
        ranks that share every other mesh coordinate, row-major over those axes (for one
        axis, a row or column of the mesh). The communicators of a step on those axes."""
        return self._axis_groups(axis, span)[0]

    def axis_group(self, rank: int, axis: int, span: int = 1) -> tuple[int, ...]:
        """The group of :meth:`axis_groups` that holds ``rank``: the ranks that share every
        mesh coordinate with ``rank`` except along ``axis .. axis + span - 1``."""
        group = self._axis_groups(axis, span)[1].get(rank)
        if group is None:
            raise ValueError(f"rank {rank} is not in {self!r}")
        return group

    def _axis_groups(self, axis: int, span: int) -> tuple[tuple[tuple[int, ...], ...],
                                                          dict[int, tuple[int, ...]]]:
        got = self._groups.get((axis, span))
        if got is None:
            if -self.ndim <= axis < 0:
                return self._axis_groups(axis + self.ndim, span)
            r = self._ranks
            moved = np.moveaxis(r, list(range(axis, axis + span)),
                                list(range(r.ndim - span, r.ndim)))
            rows = moved.reshape(-1, math.prod(self.hierarchy[axis:axis + span]))
            groups = tuple(map(tuple, rows.tolist()))
            got = self._groups[axis, span] = (groups, {x: g for g in groups for x in g})
        return got

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Placement) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"placement(type={self._type!r}, ranks={self._ranks.tolist()})"

    def __reduce__(self) -> tuple:
        return (_rebuild, (self._type, self._ranks.tolist()))


def _rebuild(type: str, ranks: list) -> Placement:
    return Placement(type, ranks, world_size=1 + max(np.array(ranks).flat))


def type_name(x: object) -> str:
    return type(x).__name__


placement = Placement
