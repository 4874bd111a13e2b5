"""Launching SPMD programs: ``python -m sbpmpi.launch -n N prog.py [args]``.

For users of ``torchrun`` / ``oneflow.distributed.launch``: this finds the ``mpiexec``
of the MPI library that mpi4py is linked to and runs ``N`` copies of the program under
it. Inside each copy the launcher variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` are set from MPI, and an
uncaught exception on any rank ends the whole job (``MPI_Abort``) instead of leaving
the other ranks waiting in a collective.

Plain ``mpiexec -n N python prog.py`` and ``srun python prog.py`` work too; the
launcher only saves finding the right ``mpiexec`` and sets the variables.

Examples
--------
::

    python -m sbpmpi.launch -n 4 examples/s10_2d_sbp.py
    python -m sbpmpi.launch -n 2 -m mypackage.train --epochs 3
    python -m sbpmpi.launch -n 2 -c "import sbpmpi as sm; print(sm.env.get_rank())"
    python -m sbpmpi.launch --dry-run -n 8 --hostfile hosts train.py
    python -m sbpmpi.launch -n 4 --mpiexec-args "--bind-to core" train.py

The launcher also knows what each MPI's ``mpiexec`` needs (:mod:`sbpmpi.tools.launcher_family`):
under Open MPI it allows running as root and running more ranks than cores, which
MPICH does without being asked.

This module is the command line; the work is done by :mod:`sbpmpi.tools.mpiexec` (finding
MPI and its ``mpiexec``), :mod:`sbpmpi.tools.command` (the command line and running it)
and :mod:`sbpmpi.tools.bootstrap` (inside each rank). ``sm.launch`` shows their public
names here, with :func:`expect_world` and :func:`ranks_hint` of :mod:`sbpmpi.comm.lifecycle.world`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from ..comm.lifecycle.world import expect_world, ranks_hint
from . import launcher_family
from .bootstrap import bootstrap
from .command import build_command, child_env, launch, mpiexec_args_from
from .mpiexec import Mpiexec, MpiLibrary, find_mpiexec, mpi_library, mpiexec_family

__all__ = [
    "MpiLibrary",
    "Mpiexec",
    "mpi_library",
    "mpiexec_family",
    "find_mpiexec",
    "build_command",
    "child_env",
    "launch",
    "bootstrap",
    "main",
    "ranks_hint",
    "expect_world",
    "mpiexec_args_from",
]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sbpmpi.launch",
        usage="python -m sbpmpi.launch [options] (prog.py | -m module | -c code) [args ...]",
        description="Run an SPMD program on N MPI ranks with the mpiexec of the MPI that "
                    "mpi4py uses; RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR "
                    "and MASTER_PORT are set in every rank, and a failing rank aborts the job. "
                    "Under Open MPI it adds what running as root or more ranks than cores "
                    "needs (see --dry-run).",
    )
    ap.add_argument("-n", "--np", "--nproc", dest="n", type=int, default=None,
                    help="total number of processes (default: nnodes * nproc-per-node, or 1)")
    ap.add_argument("--nproc-per-node", "--nproc_per_node", dest="ppn", type=int, default=None,
                    help="processes per node (as torchrun)")
    ap.add_argument("--nnodes", type=int, default=None,
                    help="number of nodes; with --nproc-per-node gives the total")
    ap.add_argument("--hostfile", default=None, help="file of host names for mpiexec")
    ap.add_argument("--mpiexec", default=None,
                    help="the mpiexec to use (default: the one of mpi4py's MPI library; "
                         "also $SBPMPI_MPIEXEC)")
    ap.add_argument("--mpiexec-args", action="append", default=[], metavar="ARGS",
                    help="extra arguments for mpiexec, one string split like a shell "
                         "(e.g. '--bind-to core' or --mpiexec-args=--oversubscribe); may be "
                         "repeated; $SBPMPI_MPIEXEC_ARGS comes first")
    ap.add_argument("--no-bootstrap", action="store_true",
                    help="run the program directly (no launcher variables, no abort on error)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the environment it adds and the command, and exit")
    ap.add_argument("-m", dest="module", action="store_true",
                    help="the program is a module name, run as python -m")
    ap.add_argument("-c", dest="code", action="store_true",
                    help="the program is Python source, run as python -c")
    ap.add_argument("program", help="script path (module name with -m, code with -c)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")
    return ap


_TAKES_VALUE = ("-n", "--np", "--nproc", "--nproc-per-node", "--nproc_per_node", "--nnodes",
                "--hostfile", "--mpiexec", "--mpiexec-args")


def _glue_option_values(argv: list[str]) -> list[str]:
    """``--mpiexec-args --oversubscribe`` -> ``--mpiexec-args=--oversubscribe``.

    argparse takes a value that starts with ``-`` for an option; gluing it with ``=``
    makes it a value. Only the launcher's own options (before the program) are looked at.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--" or not a.startswith("-") or a in ("-m", "-c"):
            return out + argv[i:]  # the program (or -m/-c and the program) and its args
        if a == "--mpiexec-args" and i + 1 < len(argv):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        if a in _TAKES_VALUE and i + 1 < len(argv):
            out.append(argv[i + 1])
            i += 1
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--bootstrap"]:
        bootstrap(argv[1:])
        return 0
    ap = _parser()
    a = ap.parse_args(_glue_option_values(argv))
    n = a.n
    if n is None:
        n = (a.nnodes or 1) * (a.ppn or 1)
    if n < 1:
        ap.error(f"-n must be at least 1, got {n}")
    if a.module and a.code:
        ap.error("-m and -c exclude each other")
    if not (a.module or a.code) and not os.path.exists(a.program):
        ap.error(f"program {a.program!r} does not exist (use -m for a module name, -c for code)")
    try:
        mpiexec_args = mpiexec_args_from(a.mpiexec_args)
    except ValueError as e:
        ap.error(f"--mpiexec-args / SBPMPI_MPIEXEC_ARGS: {e}")
    try:
        exe = find_mpiexec(a.mpiexec, check_family=True)
    except FileNotFoundError as e:
        print(f"sbpmpi.launch: {e}", file=sys.stderr)
        return 2
    info, extra_env = launcher_family.needed_env(exe.path, n, hostfile=a.hostfile is not None)
    fam = info.family if info.family != "unknown" else mpi_library().family
    cmd = build_command(a.program, a.args, n, mpiexec=exe.path, family=fam, module=a.module,
                        code=a.code, nproc_per_node=a.ppn, hostfile=a.hostfile,
                        mpiexec_args=mpiexec_args, bootstrap=not a.no_bootstrap)
    if a.dry_run:
        print(f"# mpiexec: {exe}; {info.description}")
        if extra_env:
            print("# environment added: " + " ".join(f"{k}={v}" for k, v in extra_env.items()))
        print(shlex.join(cmd))
        return 0
    return launch(cmd, extra_env)


if __name__ == "__main__":
    sys.exit(main())
