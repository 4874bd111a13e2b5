"""Small metadata exchanges (shapes, dtypes, flags) with pickled Python objects.

Never used for array data: arrays go through the buffer collectives.
"""

from __future__ import annotations

import pickle
from typing import Any

from mpi4py import MPI

from .group import Group, resolve, root_rank
from .tracing import ACTIVE, note

__all__ = ["all_gather_object", "broadcast_object", "all_agree"]


def _pickled_size(obj: Any) -> int:
    try:
        return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return 0


def all_gather_object(obj: Any, group: Group | None = None) -> list[Any]:
    """Return the list of ``obj`` from every rank of ``group``, in group order."""
    g, comm = resolve(group, "all_gather_object")
    if ACTIVE:
        note("all_gather_object", _pickled_size(obj), g)
    return comm.allgather(obj)


def broadcast_object(obj: Any, src: int = 0, group: Group | None = None) -> Any:
    """Return ``obj`` of world rank ``src`` on every rank of ``group``."""
    g, comm = resolve(group, "broadcast_object")
    root = root_rank(g, src, "src", "broadcast_object")
    if ACTIVE:
        note("broadcast_object", _pickled_size(obj) if comm.Get_rank() == root else 0, g,
             peer=src)
    return comm.bcast(obj, root=root)


def all_agree(ok: bool, group: Group | None = None) -> bool:
    """True on every rank iff ``ok`` is true on every rank of ``group`` (one small all-reduce)."""
    g, comm = resolve(group, "all_agree")
    if ACTIVE:
        note("all_agree", 1, g, "bool")
    return bool(comm.allreduce(bool(ok), op=MPI.LAND))
