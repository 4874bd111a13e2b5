"""Buffer collectives on NumPy arrays (host path). Placeholder core; see issue 3."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .group import WORLD, Group
from .reduce_op import ReduceOp

_MPI_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.PROD: MPI.PROD, ReduceOp.MAX: MPI.MAX,
            ReduceOp.MIN: MPI.MIN}


def _comm(group: Group | None):
    g = WORLD if group is None else group
    if g.comm is None:
        raise ValueError(f"this rank is not a member of {g!r}")
    return g, g.comm


def barrier(group: Group | None = None) -> None:
    _comm(group)[1].Barrier()


def broadcast(arr: np.ndarray, src: int, group: Group | None = None) -> None:
    g, comm = _comm(group)
    comm.Bcast(arr, root=g.group_rank(src))


def all_reduce(arr: np.ndarray, op: ReduceOp = ReduceOp.SUM, group: Group | None = None) -> None:
    _, comm = _comm(group)
    comm.Allreduce(MPI.IN_PLACE, arr, op=_MPI_OPS[op])


def all_gather_v(out: np.ndarray, arr: np.ndarray, counts, group: Group | None = None) -> None:
    _, comm = _comm(group)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    comm.Allgatherv(arr, [out, (list(map(int, counts)), displs)])
