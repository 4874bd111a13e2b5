"""Small metadata exchanges (shapes, dtypes, flags) with pickled Python objects.

Never used for array data: arrays go through the buffer collectives.
"""

from __future__ import annotations

import pickle
from typing import Any

from mpi4py import MPI

from ..safety.watchdog import watch
from .call import call
from .group import Group, root_rank
from .tracing import ACTIVE

__all__ = ["all_gather_object", "broadcast_object", "all_agree"]


def _pickled_size(obj: Any) -> int:
    try:
        return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return 0


def all_gather_object(obj: Any, group: Group | None = None) -> list[Any]:
    """Return the list of ``obj`` from every rank of ``group``, in group order."""
    c = call("all_gather_object", group)
    if ACTIVE:
        c.note(_pickled_size(obj))
    with watch(c.name, c.ranks):
        return c.comm.allgather(obj)


def broadcast_object(obj: Any, src: int = 0, group: Group | None = None) -> Any:
    """Return ``obj`` of world rank ``src`` on every rank of ``group``."""
    c = call("broadcast_object", group)
    root = root_rank(c.g, src, "src", c.name)
    if ACTIVE:
        c.note(_pickled_size(obj) if c.comm.Get_rank() == root else 0, peer=src)
    with watch(c.name, c.ranks):
        return c.comm.bcast(obj, root=root)


def all_agree(ok: bool, group: Group | None = None) -> bool:
    """True on every rank iff ``ok`` is true on every rank of ``group`` (one small all-reduce)."""
    c = call("all_agree", group)
    if ACTIVE:
        c.note(1, "bool")
    with watch(c.name, c.ranks):
        return bool(c.comm.allreduce(bool(ok), op=MPI.LAND))
