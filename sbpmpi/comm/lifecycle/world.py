"""The process's place in the world: world rank and size, and its machine's ranks.

The one module that asks MPI where this process stands. A script run without
``mpiexec`` is a world of size 1. :func:`init` builds the per-node communicator and
learns the host (node) of every rank at ``import sbpmpi`` (collective over the world);
``sm.env`` shows these functions under their public names. Hosts are numbered as in
OneFlow's placement by node: node ``k`` is the ``k``-th host ordered by its lowest world
rank, and a rank's local rank is its index among its host's ranks in rank order. :func:`expect_world` tells a program run on too few ranks how to
run it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
from mpi4py import MPI

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
    "init",
    "lone_task_warning",
    "set_launcher_env",
    "ranks_hint",
    "expect_world",
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


@functools.cache
def topology() -> tuple[int, ...]:
    """The node (host) of every world rank, in rank order (collective on first use;
    :func:`init` makes it at import)."""
    node = _node_comm()
    # the node's lowest world rank names it: the split is keyed by world rank
    leader = node.bcast(MPI.COMM_WORLD.Get_rank(), root=0)
    leaders = MPI.COMM_WORLD.allgather(leader)
    order = {r: k for k, r in enumerate(sorted(set(leaders)))}
    return tuple(order[r] for r in leaders)


def init() -> None:
    """Build the per-node communicator and learn every rank's node now (collective over
    the world; done at import).

    Later calls of :func:`get_local_rank` or :func:`node_of` from a subset of ranks
    (binding a GPU for a placement that excludes some ranks, say) then need no
    communication. Also warns when a launcher started several tasks that MPI sees as
    worlds of one.
    """
    _node_comm()
    topology()
    warning = lone_task_warning(os.environ, MPI.COMM_WORLD.Get_size())
    if warning:
        print(warning, file=sys.stderr, flush=True)


def lone_task_warning(environ: Mapping[str, str], world_size: int) -> str | None:
    """The warning for a task that ``srun`` started as one of several while MPI sees a
    world of one process (the PMI plugin does not match the MPI library), else None.

    Each task would otherwise run the whole program alone as rank 0, silently.
    """
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if world_size != 1 or not tasks.isdigit() or int(tasks) <= 1:
        return None
    return (f"sbpmpi: warning: srun started {tasks} tasks, but MPI sees a world of 1 "
            f"process in each (task {environ.get('SLURM_PROCID', '?')}): every task runs "
            f"the program alone as rank 0. srun's PMI plugin does not match the MPI "
            f"library: use srun --mpi=pmi2 (MPICH, Intel MPI) or --mpi=pmix (Open MPI), "
            f"or scripts/slurm/cpu.sbatch, which chooses it (`srun --mpi=list` shows what "
            f"Slurm has).")


def get_local_rank() -> int:
    """Return this process's index among the processes on its machine (MPI shared-memory split)."""
    return _node_comm().Get_rank()


def get_local_world_size() -> int:
    """Return the number of processes on this machine."""
    return _node_comm().Get_size()


def get_node_rank() -> int:
    """Return the index of this process's node (host): node ``k`` is the ``k``-th host
    ordered by its lowest world rank."""
    return topology()[get_rank()]


def get_node_count() -> int:
    """Return the number of nodes (hosts) the world spans."""
    return max(topology()) + 1


def _integer(name: str, value: Any) -> int:
    """``value`` as an int: a Python or NumPy integer (``pl.ranks[0]``), not a bool."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def node_of(rank: int) -> int:
    """Return the node (host) of world ``rank`` (an int or NumPy integer)."""
    nodes = topology()
    rank = _integer("rank", rank)
    if not 0 <= rank < len(nodes):
        raise ValueError(f"rank {rank} is out of range for a world of {len(nodes)} "
                         f"process{'es' if len(nodes) != 1 else ''}")
    return nodes[rank]


def node_ranks(node: int) -> tuple[int, ...]:
    """Return the world ranks on ``node`` (an int or NumPy integer), in rank order (local
    rank ``j`` is the ``j``-th)."""
    nodes = topology()
    count = max(nodes) + 1
    node = _integer("node", node)
    if not 0 <= node < count:
        raise ValueError(f"node {node} does not exist: the job runs on {count} "
                         f"node{'s' if count != 1 else ''} (nodes 0..{count - 1})")
    return tuple(r for r, k in enumerate(nodes) if k == node)


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


def ranks_hint(needed: int, program: str | None = None) -> str:
    """``"run under mpiexec -n N python prog.py (...)"``: the advice for a world too small."""
    prog = program or (sys.argv[0] if sys.argv and sys.argv[0] else "prog.py")
    return (f"run under mpiexec -n {needed} python {prog} "
            f"(or python -m sbpmpi.launch -n {needed} {prog})")


def expect_world(wanted: int, minimum: int = 1, what: str | None = None) -> int:
    """For a program written for ``wanted`` ranks: say so when it got fewer.

    With fewer than ``minimum`` ranks, rank 0 prints ``<what> needs N ranks, got W: run
    under mpiexec -n N ...`` to stderr and every rank exits with status 2 (the same
    decision everywhere: no rank is left waiting). On a world of one process when
    ``wanted > 1`` -- most often a forgotten ``mpiexec`` -- it prints a note with the same
    advice and carries on. Returns the world size. Called by the examples (as ``sm.launch.expect_world``).
    """
    world, rank = get_world_size(), get_rank()
    name = what or os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "this program")
    if world < minimum:
        if rank == 0:
            print(f"{name} needs {minimum} ranks, got {world}: {ranks_hint(max(minimum, wanted))}",
                  file=sys.stderr, flush=True)
        sys.exit(2)
    if world == 1 and wanted > 1:
        print(f"note: {name} runs on a world of 1 process, so nothing is split or "
              f"communicated; {ranks_hint(wanted)}", file=sys.stderr, flush=True)
    return int(world)
