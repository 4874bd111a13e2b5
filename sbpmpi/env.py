"""The process environment: world rank and size, local rank, launcher variables.

A script run without ``mpiexec`` is a world of size 1.
"""

from __future__ import annotations

import functools
import os

from mpi4py import MPI

__all__ = [
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_world_size",
    "set_launcher_env",
]


def get_rank() -> int:
    """Return this process's rank in the world."""
    return MPI.COMM_WORLD.Get_rank()


def get_world_size() -> int:
    """Return the number of processes in the world."""
    return MPI.COMM_WORLD.Get_size()


@functools.cache
def _node_comm() -> MPI.Comm:
    return MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=MPI.COMM_WORLD.Get_rank())


def init() -> None:
    """Build the per-node communicator now (collective over the world; done at import).

    Later calls of :func:`get_local_rank` from a subset of ranks (binding a GPU for a
    placement that excludes some ranks, say) then need no communication.
    """
    _node_comm()


def get_local_rank() -> int:
    """Return this process's index among the processes on its machine (MPI shared-memory split)."""
    return _node_comm().Get_rank()


def get_local_world_size() -> int:
    """Return the number of processes on this machine."""
    return _node_comm().Get_size()


def set_launcher_env() -> dict[str, str]:
    """Set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from MPI.

    Returns the variables set, for code (PyTorch, OneFlow) that reads them.
    """
    values = {
        "RANK": str(get_rank()),
        "WORLD_SIZE": str(get_world_size()),
        "LOCAL_RANK": str(get_local_rank()),
        "LOCAL_WORLD_SIZE": str(get_local_world_size()),
    }
    os.environ.update(values)
    return values
