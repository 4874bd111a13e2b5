"""The process environment: world rank and size, local rank, nodes (hosts), launcher variables.

``sm.env`` is the public face of :mod:`sbpmpi.comm.lifecycle.world`, which asks MPI. A script run
without ``mpiexec`` is a world of size 1.
"""

from __future__ import annotations

from .comm.lifecycle.world import (
    expect_world,
    get_local_rank,
    get_local_world_size,
    get_node_count,
    get_node_rank,
    get_rank,
    get_world_size,
    lone_task_warning,
    node_of,
    node_ranks,
    ranks_hint,
    set_launcher_env,
    topology,
)

__all__ = [
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_node_count",
    "node_of",
    "node_ranks",
    "topology",
    "set_launcher_env",
    "lone_task_warning",
    "expect_world",
    "ranks_hint",
]
