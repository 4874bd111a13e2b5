"""Process groups: MPI sub-communicators named by their world ranks, built once and cached."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..core.placement import Placement

__all__ = ["Group", "WORLD", "new_group", "get_group", "placement_group", "mesh_groups",
           "resolve", "root_rank"]


class Group:
    """A set of world ranks and the MPI communicator over them (in the given order).

    ``comm`` is None on a rank that is not a member.
    """

    __slots__ = ("ranks", "comm", "_index")

    def __init__(self, ranks: tuple[int, ...], comm: MPI.Intracomm | None) -> None:
        self.ranks = ranks
        self.comm = comm
        self._index = {r: i for i, r in enumerate(ranks)}

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        """This process's rank in the group, -1 if not a member."""
        return -1 if self.comm is None else self.comm.Get_rank()

    def is_member(self) -> bool:
        return self.comm is not None

    def group_rank(self, world_rank: int) -> int:
        """Rank in this group of ``world_rank``; ValueError if it is not a member."""
        try:
            return self._index[world_rank]
        except KeyError:
            raise ValueError(
                f"rank {world_rank} is not in the group of ranks {list(self.ranks)}"
            ) from None

    def __repr__(self) -> str:
        return f"Group(ranks={list(self.ranks)})"


WORLD = Group(tuple(range(MPI.COMM_WORLD.Get_size())), MPI.COMM_WORLD)
WORLD_COMM: MPI.Intracomm = MPI.COMM_WORLD


@functools.cache
def _group_for(ranks: tuple[int, ...]) -> Group:
    world = MPI.COMM_WORLD
    if ranks == WORLD.ranks:
        return WORLD
    me = world.Get_rank()
    if me not in ranks:
        return Group(ranks, None)
    # Comm_create_group is collective over the members only.
    comm = world.Create_group(world.Get_group().Incl(list(ranks)))
    return Group(ranks, comm)


def get_group(ranks: Sequence[int]) -> Group:
    """Return the cached group over world ``ranks`` (collective over its members on first use)."""
    ranks = tuple(int(r) for r in ranks)
    size = MPI.COMM_WORLD.Get_size()
    bad = [r for r in ranks if not 0 <= r < size]
    if bad:
        raise ValueError(f"group ranks {bad} are out of range for a world of {size}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"group ranks must be distinct, got {list(ranks)}")
    if not ranks:
        raise ValueError("a group needs at least one rank, got an empty list")
    return _group_for(ranks)


def new_group(ranks: Sequence[int] | None = None) -> Group:
    """Return a group over world ``ranks`` (all ranks if None), as ``torch.distributed.new_group``."""
    if ranks is None:
        return WORLD
    return get_group(ranks)


def placement_group(placement: Placement) -> Group:
    """The group of all ranks of ``placement`` in mesh (row-major) order."""
    return get_group(placement.rank_list)


def mesh_groups(placement: Placement) -> tuple[Group | None, ...]:
    """This rank's group along each mesh axis of ``placement`` (None per axis outside it)."""
    me = MPI.COMM_WORLD.Get_rank()
    if me not in placement:
        return (None,) * placement.ndim
    return tuple(get_group(placement.axis_group(me, a)) for a in range(placement.ndim))


def resolve(group: Group | None, op: str) -> tuple[Group, MPI.Intracomm]:
    """The group (WORLD for None) and its communicator; errors if this rank is not a member."""
    if group is None:
        return WORLD, WORLD_COMM
    g = group
    comm = getattr(g, "comm", None)
    if comm is None:
        if not isinstance(g, Group):
            raise TypeError(f"{op}: group must be an sbpmpi.comm.Group or None, "
                            f"got {type(g).__name__}")
        raise ValueError(f"{op}: this rank ({MPI.COMM_WORLD.Get_rank()}) is not a member of "
                         f"{g!r}; only its members may call it")
    return g, comm


def root_rank(g: Group, world_rank: int, arg: str, op: str) -> int:
    """Group rank of the world rank ``world_rank`` given as argument ``arg``."""
    if type(world_rank) is not int and not isinstance(world_rank, np.integer):
        raise TypeError(f"{op}: {arg} must be an int world rank, got {world_rank!r}")
    i = g._index.get(int(world_rank))
    if i is None:
        raise ValueError(f"{op}: {arg}={world_rank} is not a rank of the group "
                         f"{list(g.ranks)} (ranks are world ranks)")
    return i
