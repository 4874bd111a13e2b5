"""Collective communication on NumPy and CuPy arrays, named as in torch.distributed.

This package is the only part of sbpmpi that hands array data to MPI. Every call acts
in place on the arrays passed; ranks given as ``src``/``dst`` are world ranks and
``group=`` (default WORLD) picks the communicator.

The rooms, one per concept:

- the call machinery: :mod:`.call` (the one skeleton every call follows: group, checks,
  agreement, trace, watchdog, staging), :mod:`.group` (groups, mesh sub-communicators),
  :mod:`.dtypes` (dtype -> MPI datatype), :mod:`.reduce_op` (ReduceOp -> MPI op),
  :mod:`.nan_reduction` (NaN-propagating MAX/MIN), :mod:`.buffers` (contiguity, GPU
  staging), :mod:`.trace` (``sm.trace``), :mod:`.cuda_aware`, :mod:`.mpi_library`
  (library version, MAX_COUNT), :mod:`.info` (the whole setup);
- :mod:`.collectives` (regular and vector collectives, the handle of a non-blocking one,
  object exchange), :mod:`.p2p` (point-to-point), :mod:`.file_io` (MPI-IO);
- :mod:`.agreement` (the one cross-rank agreement: a fingerprint all-reduce, the
  descriptions gathered on a mismatch, collective decisions; checked mode; the settings'
  agreement at import);
- :mod:`.lifecycle` (the world: rank, size, the node split, public as ``sm.env``; the abort
  hook, the watchdog, the exit-time agreement);
- :mod:`.gpu` (the GPU transports: CUDA IPC on a node, and which one is used).
"""

from .agreement.checks import checking
from .collectives import (
    CollectiveWork,
    all_agree,
    all_gather,
    all_gather_object,
    all_gather_v,
    all_reduce,
    all_to_all,
    all_to_all_v,
    barrier,
    broadcast,
    broadcast_object,
    gather,
    gather_v,
    reduce,
    reduce_scatter,
    reduce_scatter_v,
    scatter,
    scatter_v,
)
from .cuda_aware import is_cuda_aware
from .gpu import gpu_transport
from .group import WORLD, Group, get_group, mesh_groups, new_group, placement_group
from .info import info
from .p2p import Work, irecv, isend, recv, send
from .reduce_op import ReduceOp

__all__ = [
    "ReduceOp", "Group", "WORLD", "new_group", "get_group", "placement_group", "mesh_groups",
    "all_gather_object", "broadcast_object", "all_agree",
    "send", "recv", "isend", "irecv", "Work", "CollectiveWork",
    "barrier", "broadcast", "reduce", "all_reduce", "gather", "all_gather", "scatter",
    "reduce_scatter", "all_to_all",
    "all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v", "all_to_all_v",
    "info", "is_cuda_aware", "checking", "gpu_transport",
]
