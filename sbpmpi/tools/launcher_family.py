"""Which MPI launcher an ``mpiexec`` is, and what it needs to run N ranks here.

MPI launchers differ in what they refuse by default. MPICH's Hydra (also Intel MPI
and MVAPICH) runs as root and runs more ranks than cores without being asked. Open MPI
refuses both: as root it needs ``OMPI_ALLOW_RUN_AS_ROOT=1`` and
``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``, and for more ranks than cores it needs
oversubscription, which Open MPI 4 (``orterun``) reads from
``OMPI_MCA_rmaps_base_oversubscribe=1`` and Open MPI 5 (``prterun``) from
``PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe``.

:func:`parse_version` (the family from the text of ``mpiexec --version``) and
:func:`run_env` (the environment variables a run needs) are pure functions;
:func:`detect` and :func:`needed_env` are the thin layer that runs ``--version``
(cached per executable) and looks at this machine. Environment variables are used
rather than command-line flags because they also reach an ``mpiexec`` started from
inside the job (the test suite does that), and a value the user already set wins.

This is a tool module: the launcher and the test runner use it, the library does not.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["LauncherInfo", "parse_version", "run_env", "detect", "physical_cores",
           "in_allocation", "needed_env", "ROOT_ENV"]

ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
_OVERSUBSCRIBE_4 = {"OMPI_MCA_rmaps_base_oversubscribe": "1"}
_OVERSUBSCRIBE_5 = {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
# a job started inside one of these allocations gets its slots from the scheduler
_ALLOCATION_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "COBALT_JOBID", "JOB_ID")


@dataclass(frozen=True)
class LauncherInfo:
    """What ``mpiexec --version`` says about a launcher.

    ``family`` decides the command-line dialect: ``"mpich"`` (Hydra: MPICH, Intel MPI,
    MVAPICH; ``-ppn``, ``-f``), ``"openmpi"`` (``--map-by``, ``--hostfile``),
    ``"slurm"`` (``srun``) or ``"unknown"``. ``runtime`` names the process manager:
    ``"hydra"``, ``"intel"``, ``"orterun"`` (Open MPI up to 4), ``"prterun"`` (Open MPI 5,
    PRRTE), ``"srun"`` or ``""``.
    """

    family: str
    runtime: str
    version: str  # "5.0.2", "" when the text does not say
    description: str  # e.g. "Open MPI 5.0.11 (prterun)"

    @property
    def major(self) -> int | None:
        """First number of ``version``, or None."""
        m = re.match(r"\d+", self.version)
        return int(m.group()) if m else None


_UNKNOWN = LauncherInfo("unknown", "", "", "unknown launcher")


def _number(pattern: str, text: str) -> str:
    m = re.search(pattern, text, re.IGNORECASE | re.MULTILINE)
    return m.group(1) if m else ""


def parse_version(text: str) -> LauncherInfo:
    """The launcher family from the output of ``mpiexec --version`` (or ``srun --version``).

    Pure: the same text always gives the same answer. Text that names no known launcher
    gives family ``"unknown"``.
    """
    t = text or ""
    low = t.lower()
    if "intel(r) mpi" in low or "intel mpi" in low:
        v = _number(r"version\s+([0-9][0-9.]*)", t) or _number(r"library\s+([0-9][0-9.]*)", t)
        return LauncherInfo("mpich", "intel", v, f"Intel MPI {v}".strip())
    if "(prrte)" in low or "prterun" in low:
        v = _number(r"\(prrte\)\s+([0-9][0-9.]*)", t)
        return LauncherInfo("openmpi", "prterun", v, f"PRRTE {v} (prterun)".replace("  ", " "))
    if "open mpi" in low or "openrte" in low or "open-mpi.org" in low:
        v = _number(r"\((?:open mpi|openrte)\)\s+([0-9][0-9.a-z]*)", t)
        major = int(v.split(".")[0]) if v[:1].isdigit() else None
        runtime = "prterun" if major is not None and major >= 5 else "orterun"
        return LauncherInfo("openmpi", runtime, v, f"Open MPI {v} ({runtime})".replace("  ", " "))
    if "hydra" in low or "mpich" in low or "mvapich" in low:
        v = _number(r"^\s*version:\s*([0-9][0-9.a-z]*)", t)
        name = "MVAPICH" if "mvapich" in low else "MPICH"
        return LauncherInfo("mpich", "hydra", v, f"{name} Hydra {v}".strip())
    first = t.strip().splitlines()[0].strip().lower() if t.strip() else ""
    if first.startswith(("slurm", "slurm-wlm")):
        v = _number(r"^\s*slurm(?:-wlm)?\s+([0-9][0-9.\-a-z]*)", t)
        return LauncherInfo("slurm", "srun", v, f"Slurm srun {v}".strip())
    return _UNKNOWN


def run_env(info: LauncherInfo, nprocs: int, *, cores: int, root: bool,
            scheduled: bool = False, environ: Mapping[str, str] | None = None,
            ) -> dict[str, str]:
    """Environment variables ``info``'s launcher needs to start ``nprocs`` ranks here.

    Pure. Open MPI gets the root permission when ``root``, and oversubscription when
    ``nprocs > cores`` and the slots do not come from a scheduler (``scheduled``) or a
    hostfile (pass ``scheduled=True`` then). Other launchers need nothing. Variables
    already in ``environ`` are left out: the user's setting wins.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int, got {nprocs!r}")
    out: dict[str, str] = {}
    if info.family == "openmpi":
        if root:
            out.update(ROOT_ENV)
        if nprocs > max(1, cores) and not scheduled:
            if info.runtime == "prterun":
                out.update(_OVERSUBSCRIBE_5)
            else:
                out.update(_OVERSUBSCRIBE_4)
                if not info.version:  # unknown version: the one that does not apply is unread
                    out.update(_OVERSUBSCRIBE_5)
    env = environ or {}
    return {k: v for k, v in out.items() if k not in env}


# -- the thin layer that looks at this machine -----------------------------------------------

@lru_cache(maxsize=32)
def _detect_cached(path: str, mtime: float, timeout: float) -> LauncherInfo:
    try:
        p = subprocess.run([path, "--version"], capture_output=True, text=True,
                           timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return _UNKNOWN
    return parse_version(p.stdout + "\n" + p.stderr)


def detect(path: str, timeout: float = 20.0) -> LauncherInfo:
    """Run ``path --version`` once per executable (cached) and parse it."""
    real = os.path.realpath(path)
    try:
        mtime = os.stat(real).st_mtime
    except OSError:
        return _UNKNOWN
    return _detect_cached(real, mtime, timeout)


def physical_cores() -> int:
    """Physical cores this process may run on (what Open MPI counts as slots)."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set(range(os.cpu_count() or 1))
    try:
        cores: set[tuple[str, str]] = set()
        cpu, phys = -1, "0"
        with open("/proc/cpuinfo", encoding="utf8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor":
                    cpu, phys = int(value), "0"
                elif key == "physical id":
                    phys = value
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, value))
        if cores:
            return len(cores)
    except (OSError, ValueError):
        pass
    return max(1, len(allowed))


def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a batch allocation (Slurm, PBS, LSF, ...)."""
    env = os.environ if environ is None else environ
    return any(env.get(k) for k in _ALLOCATION_VARS)


def needed_env(path: str, nprocs: int, *, hostfile: bool = False,
               environ: Mapping[str, str] | None = None) -> tuple[LauncherInfo, dict[str, str]]:
    """Detect ``path``'s launcher and return it with the variables a run of ``nprocs`` needs."""
    env = os.environ if environ is None else environ
    info = detect(path)
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    return info, run_env(info, nprocs, cores=physical_cores(), root=root,
                         scheduled=hostfile or in_allocation(env), environ=env)
