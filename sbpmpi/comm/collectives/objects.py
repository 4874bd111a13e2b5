"""Small metadata exchanges (shapes, dtypes, flags) with pickled Python objects.

Never used for array data: arrays go through the buffer collectives.
"""

from __future__ import annotations

import pickle
from typing import Any

from mpi4py import MPI

from ..call import call
from ..group import Group, root_rank

__all__ = ["all_gather_object", "broadcast_object", "all_agree"]


def _pickled_size(obj: Any) -> int:
    try:
        return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return 0


def all_gather_object(obj: Any, group: Group | None = None) -> list[Any]:
    """Return the list of ``obj`` from every rank of ``group``, in group order."""
    c = call("all_gather_object", group)
    with c.mpi_call(lambda: _pickled_size(obj)):
        return c.comm.allgather(obj)


def broadcast_object(obj: Any, src: int = 0, group: Group | None = None) -> Any:
    """Return ``obj`` of world rank ``src`` on every rank of ``group``."""
    c = call("broadcast_object", group)
    root = root_rank(c.g, src, "src", c.name)
    with c.mpi_call(lambda: _pickled_size(obj) if c.comm.Get_rank() == root else 0, peer=src):
        return c.comm.bcast(obj, root=root)


def all_agree(ok: bool, group: Group | None = None) -> bool:
    """True on every rank iff ``ok`` is true on every rank of ``group`` (one small all-reduce)."""
    c = call("all_agree", group)
    with c.mpi_call(1, "bool"):
        return bool(c.comm.allreduce(bool(ok), op=MPI.LAND))
