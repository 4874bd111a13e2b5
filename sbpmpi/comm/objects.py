"""Small metadata exchanges (shapes, dtypes, flags) with pickled Python objects.

Never used for array data: arrays go through the buffer collectives.
"""

from __future__ import annotations

from typing import Any

from .group import WORLD, Group

__all__ = ["all_gather_object", "broadcast_object", "all_agree"]


def _comm(group: Group | None):
    g = WORLD if group is None else group
    if g.comm is None:
        raise ValueError(f"this rank is not a member of {g!r}")
    return g, g.comm


def all_gather_object(obj: Any, group: Group | None = None) -> list[Any]:
    """Return the list of ``obj`` from every rank of ``group``, in group order."""
    _, comm = _comm(group)
    return comm.allgather(obj)


def broadcast_object(obj: Any, src: int = 0, group: Group | None = None) -> Any:
    """Return ``obj`` of world rank ``src`` on every rank of ``group``."""
    g, comm = _comm(group)
    return comm.bcast(obj, root=g.group_rank(src))


def all_agree(ok: bool, group: Group | None = None) -> bool:
    """True on every rank iff ``ok`` is true on every rank of ``group`` (one small all-reduce)."""
    from mpi4py import MPI

    _, comm = _comm(group)
    return bool(comm.allreduce(bool(ok), op=MPI.LAND))
