"""The ``mpiexec`` command line for an SPMD program, and running it.

:func:`build_command` writes the command (per-node and host-file options in the spelling
of the launcher's family), :func:`mpiexec_args_from` the user's extra arguments,
:func:`launch` runs it with :func:`child_env` as its environment.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

from .. import config

__all__ = ["build_command", "mpiexec_args_from", "child_env", "launch"]

# Variables an MPI launcher gives each process; a launcher started from inside an MPI
# process (a singleton, or a rank of another job) must not pass them on to its mpiexec.
_IDENTITY_VARS = (
    "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "PMI_ID", "PMI_SPAWNED", "PMI_HOSTNAME",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMIX_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_URI",
    "PMIX_SERVER_URI2", "PMIX_SERVER_URI3", "PMIX_SERVER_URI4", "PMIX_SERVER_URI21",
    "PMIX_SERVER_URI41", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK",
    "OMPI_UNIVERSE_SIZE",
)


def _per_node_args(family: str, n: int) -> list[str]:
    if family == "openmpi":
        return ["--map-by", f"ppr:{n}:node"]
    if family == "slurm":
        return ["--ntasks-per-node", str(n)]
    return ["-ppn", str(n)]


def _hostfile_args(family: str, hostfile: str) -> list[str]:
    if family == "openmpi":
        return ["--hostfile", hostfile]
    if family == "slurm":
        return ["--nodefile", hostfile]
    return ["-f", hostfile]


def build_command(
    program: str,
    args: Sequence[str] = (),
    nprocs: int = 1,
    *,
    mpiexec: str = "mpiexec",
    family: str = "mpich",
    module: bool = False,
    code: bool = False,
    nproc_per_node: int | None = None,
    hostfile: str | None = None,
    mpiexec_args: Sequence[str] = (),
    python: str | None = None,
    bootstrap: bool = True,
) -> list[str]:
    """The ``mpiexec`` command line that runs ``program`` on ``nprocs`` ranks.

    ``program`` is a script path, a module name with ``module``, or Python source with
    ``code`` (as ``python -m`` and ``python -c``). With ``bootstrap`` (the default) each
    rank starts as ``python -m sbpmpi.launch --bootstrap`` which sets the launcher
    variables, then runs the program.
    """
    if module and code:
        raise ValueError("module and code exclude each other: the program is one or the other")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"number of processes must be a positive int, got {nprocs!r}")
    if nproc_per_node is not None and (not isinstance(nproc_per_node, int) or nproc_per_node < 1):
        raise ValueError(f"processes per node must be a positive int, got {nproc_per_node!r}")
    if not program:
        raise ValueError("no program given: expected a script path, a module name with -m, "
                         "or code with -c")
    cmd = [mpiexec, "-n", str(nprocs)]
    if nproc_per_node is not None:
        cmd += _per_node_args(family, nproc_per_node)
    if hostfile is not None:
        cmd += _hostfile_args(family, hostfile)
    cmd += list(mpiexec_args)
    cmd.append(python or sys.executable)
    if bootstrap:
        cmd += ["-m", "sbpmpi.launch", "--bootstrap"]
    if module:
        cmd += ["-m", program]
    elif code:
        cmd += ["-c", program]
    else:
        cmd.append(program)
    cmd += list(args)
    return cmd


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for the ``mpiexec`` it starts, with ``extra`` added.

    Without the variables an MPI launcher gives each process (a launcher started from
    inside an MPI process must not pass them on), and with this sbpmpi on ``PYTHONPATH``.
    """
    env = {k: v for k, v in os.environ.items() if k not in _IDENTITY_VARS}
    env.update(extra or {})
    # the child ranks must import the same sbpmpi as this launcher
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = env.get("PYTHONPATH", "").split(os.pathsep) if env.get("PYTHONPATH") else []
    if here not in paths and os.path.basename(here) not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = os.pathsep.join([here, *paths])
    return env


def launch(cmd: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` (from ``build_command``) with ``env`` added to this environment, and
    return its exit status."""
    proc = subprocess.Popen(list(cmd), env=child_env(env))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.wait()
        return 130


def mpiexec_args_from(values: Sequence[str]) -> list[str]:
    """The setting ``mpiexec_args`` (``$SBPMPI_MPIEXEC_ARGS``) then each ``--mpiexec-args``
    value, split like a shell."""
    out = shlex.split(config.mpiexec_args.value)
    for v in values:
        out += shlex.split(v)
    return out
