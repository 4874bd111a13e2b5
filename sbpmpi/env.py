"""The process environment: world rank and size, local rank, launcher variables.

``sm.env`` is the public face of :mod:`sbpmpi.comm.world`, which asks MPI. A script run
without ``mpiexec`` is a world of size 1.
"""

from __future__ import annotations

from .comm.world import (
    expect_world,
    get_local_rank,
    get_local_world_size,
    get_rank,
    get_world_size,
    lone_task_warning,
    ranks_hint,
    set_launcher_env,
)

__all__ = [
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "get_local_world_size",
    "set_launcher_env",
    "lone_task_warning",
    "expect_world",
    "ranks_hint",
]
