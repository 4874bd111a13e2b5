"""This process's place among the ranks on its machine, as the backend needs it.

The backend makes no MPI call: ``import sbpmpi`` tells it here, from the node split of
:mod:`sbpmpi.comm.lifecycle.world`, which GPU to bind (:func:`sbpmpi.backend.bind_device`) and how
many ranks share the machine's memory (the host pool's default limit).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["LocalRanks", "set_local_ranks", "local_ranks"]


class LocalRanks(NamedTuple):
    """This process's index among the ranks on its machine, and their number."""

    rank: int
    size: int


_current: list[LocalRanks] = []


def set_local_ranks(rank: int, size: int) -> None:
    """Record this process's local ``rank`` among ``size`` ranks on its machine."""
    if not 0 <= rank < size:
        raise ValueError(f"local rank {rank} is not in range for {size} ranks on the machine")
    _current[:] = [LocalRanks(rank, size)]


def local_ranks() -> LocalRanks:
    """What :func:`set_local_ranks` recorded.

    Raises
    ------
    RuntimeError
        If nothing was recorded (``import sbpmpi`` records it).
    """
    if not _current:
        raise RuntimeError("backend: this process's local rank is unknown here; "
                           "import sbpmpi first (it records the node split)")
    return _current[0]
