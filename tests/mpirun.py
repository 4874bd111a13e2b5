"""How the tests start an MPI job themselves: ``mpiexec -n N`` of the MPI mpi4py uses,
with the mpiexec arguments of ``$SBPMPI_MPIEXEC_ARGS`` and what the launcher family needs
(Open MPI as root, more ranks than cores), as ``python -m sbpmpi.launch`` does."""

from __future__ import annotations

import os
from pathlib import Path

from sbpmpi.tools import launch, launcher_family

ROOT = Path(__file__).resolve().parent.parent


def mpiexec(n: int) -> list[str]:
    """``[mpiexec, -n, N, *args]``: put the program after it."""
    return [launch.find_mpiexec().path, "-n", str(n), *launch.mpiexec_args_from([])]


def job_env(n: int, timeout: float, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a job of ``n`` ranks: this one, with this tree first on
    PYTHONPATH, MPIEXEC_TIMEOUT a little under ``timeout``, and what the launcher needs."""
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(int(timeout) - 20), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(launcher_family.needed_env(launch.find_mpiexec().path, max(n, 1),
                                          environ=env)[1])
    env.update(extra or {})
    return env
