"""Collective communication on NumPy and CuPy arrays, named as in torch.distributed.

This package is the only part of sbpmpi that hands array data to MPI.
"""

from .collectives import all_gather_v, all_reduce, barrier, broadcast
from .group import WORLD, Group, get_group, mesh_groups, new_group, placement_group
from .objects import all_agree, all_gather_object, broadcast_object
from .reduce_op import ReduceOp

__all__ = [
    "ReduceOp", "Group", "WORLD", "new_group", "get_group", "placement_group", "mesh_groups",
    "all_gather_object", "broadcast_object", "all_agree",
    "barrier", "broadcast", "all_reduce", "all_gather_v",
]
