"""Is the MPI library CUDA-aware? Decided once, at the first GPU transfer.

mpi4py has no query for this, and handing a device pointer to an MPI that is not
CUDA-aware usually crashes, so the decision is conservative, in this order:

1. the setting :data:`sbpmpi.config.cuda_aware` (``SBPMPI_CUDA_AWARE=1`` / ``0``, or
   ``sm.config.update(cuda_aware=...)``: an explicit override), then the setting
   :data:`sbpmpi.config.gpu_transport` when it forces ``mpi`` / ``staged`` (direct /
   staged);
2. what the library reports, identified by ``MPI.Get_library_version()``:
   Cray MPICH: ``MPICH_GPU_SUPPORT_ENABLED=1``; MVAPICH: ``MV2_USE_CUDA=1``;
   Open MPI: ``MPIX_Query_cuda_support()``; MPICH: ``MPIR_CVAR_ENABLE_GPU`` not 0 and
   ``MPIX_GPU_query_support(CUDA)`` (or ``MPIX_Query_cuda_support()``); Intel MPI:
   ``I_MPI_OFFLOAD`` >= 1; the ``MPIX_`` functions are looked up with ctypes in the
   loaded MPI library;
3. otherwise not aware: GPU data is staged through pinned host buffers.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from mpi4py import MPI

from .. import config
from ..config import switch
from .mpi_library import library_name

__all__ = ["CudaAwareness", "cuda_awareness", "is_cuda_aware", "detect", "detect_library",
           "library_name", "mpi_symbol"]


@dataclass(frozen=True)
class CudaAwareness:
    """The decision and why it was made."""

    aware: bool
    reason: str


def mpi_symbol(name: str) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The C function ``name`` of the loaded MPI library, or None (every query of the
    library goes through this name: tests replace it to stand for another library)."""
    candidates = [MPI.__file__]
    try:
        with open("/proc/self/maps") as f:
            candidates += sorted({line.split()[-1] for line in f
                                  if "mpi" in line.lower() and ".so" in line})
    except OSError:
        pass
    for path in candidates:
        try:
            return getattr(ctypes.CDLL(path), name)
        except (OSError, AttributeError):
            continue
    return None


def _env_flag(name: str) -> bool | None:
    """An MPI library's on/off variable ``name`` (a switch word or a number > 0)."""
    v = os.environ.get(name)
    on = switch(v)
    if on is not None or v is None:
        return on
    try:
        return int(v) > 0
    except ValueError:
        return None


def _query_cuda_support() -> tuple[bool | None, str]:
    fn = mpi_symbol("MPIX_Query_cuda_support")
    if fn is None:
        return None, "MPIX_Query_cuda_support not found"
    fn.restype = ctypes.c_int
    fn.argtypes = []
    res = bool(fn())
    return res, f"MPIX_Query_cuda_support() returned {int(res)}"


def _mpich_gpu_query() -> tuple[bool | None, str]:
    fn = mpi_symbol("MPIX_GPU_query_support")
    if fn is None:
        return _query_cuda_support()
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    out = ctypes.c_int(0)
    if fn(0, ctypes.byref(out)) != 0:  # 0 = MPIX_GPU_SUPPORT_CUDA
        return None, "MPIX_GPU_query_support failed"
    return bool(out.value), f"MPIX_GPU_query_support(CUDA) returned {out.value}"


def detect() -> CudaAwareness:
    """Decide CUDA-awareness now (see the module docstring for the order)."""
    aware = config.cuda_aware
    if aware.value is not None:
        return CudaAwareness(aware.value, f"{aware.origin()}: explicit override")
    transport = config.gpu_transport
    if transport.value in ("mpi", "staged"):
        return CudaAwareness(transport.value == "mpi", f"{transport.origin()}: explicit "
                             "override of the transport")
    return detect_library()


def detect_library() -> CudaAwareness:
    """What the MPI library itself reports (no environment overrides of sbpmpi)."""
    lib = library_name()
    text = MPI.Get_library_version()
    if "CRAY MPICH" in text.upper():
        flag = _env_flag("MPICH_GPU_SUPPORT_ENABLED")
        return CudaAwareness(bool(flag), f"{lib}: MPICH_GPU_SUPPORT_ENABLED="
                             f"{os.environ.get('MPICH_GPU_SUPPORT_ENABLED', 'unset')}")
    if "MVAPICH" in text.upper():
        flag = _env_flag("MV2_USE_CUDA")
        return CudaAwareness(bool(flag), f"{lib}: MV2_USE_CUDA="
                             f"{os.environ.get('MV2_USE_CUDA', 'unset')}")
    if "Open MPI" in text:
        res, why = _query_cuda_support()
        return CudaAwareness(bool(res), f"{lib}: {why}")
    if "Intel(R) MPI" in text:
        flag = _env_flag("I_MPI_OFFLOAD")
        return CudaAwareness(bool(flag), f"{lib}: I_MPI_OFFLOAD="
                             f"{os.environ.get('I_MPI_OFFLOAD', 'unset')}")
    if "MPICH" in text:
        if _env_flag("MPIR_CVAR_ENABLE_GPU") is False:
            return CudaAwareness(False, f"{lib}: MPIR_CVAR_ENABLE_GPU=0")
        res, why = _mpich_gpu_query()
        return CudaAwareness(bool(res), f"{lib}: {why}")
    return CudaAwareness(False, f"{lib}: no known CUDA-support query; assuming not CUDA-aware")


_decision: CudaAwareness | None = None


def cuda_awareness() -> CudaAwareness:
    """The cached decision (made on first call, again after either setting changes)."""
    global _decision
    if _decision is None:
        _decision = detect()
    return _decision


def is_cuda_aware() -> bool:
    """True when GPU arrays are handed to MPI directly.

    Forced with ``sm.config.update(cuda_aware=True)`` (or False; None detects again), for
    tests and for sites whose MPI reports wrongly.
    """
    d = _decision
    return (d if d is not None else cuda_awareness()).aware


def _forget(_: object) -> None:
    global _decision
    _decision = None


config.on_update("cuda_aware", _forget)
config.on_update("gpu_transport", _forget)
