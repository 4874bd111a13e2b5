"""Is the MPI library CUDA-aware? Decided once, at the first GPU transfer.

mpi4py has no query for this, and handing a device pointer to an MPI that is not
CUDA-aware usually crashes, so the decision is conservative, in this order:

1. the setting :data:`sbpmpi.config.cuda_aware` (``SBPMPI_CUDA_AWARE=1`` / ``0``, or
   ``sm.config.update(cuda_aware=...)``: an explicit override), then the setting
   :data:`sbpmpi.config.gpu_transport` when it forces ``mpi`` / ``staged`` (direct /
   staged);
2. what the library reports, identified by ``MPI.Get_library_version()``:
   Cray MPICH: ``MPICH_GPU_SUPPORT_ENABLED=1``; MVAPICH: ``MV2_USE_CUDA=1``;
   Open MPI: ``MPIX_Query_cuda_support()`` and, where the library has it, the run-time
   switch ``opal_cuda_support`` (an MCA parameter, read through the MPI tool interface,
   ``MPI_T``; else ``OMPI_MCA_opal_cuda_support``): Open MPI 4.x answers the query at
   compile time, so a CUDA-built 4.1 with the switch off (as conda-forge ships it) says 1
   while it cannot take device pointers; MPICH: ``MPIR_CVAR_ENABLE_GPU`` not 0 and
   ``MPIX_GPU_query_support(CUDA)`` (or ``MPIX_Query_cuda_support()``); Intel MPI:
   ``I_MPI_OFFLOAD`` >= 1; the ``MPIX_`` functions are looked up with ctypes in the
   loaded MPI library;
3. otherwise not aware: GPU data is staged through pinned host buffers.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import NamedTuple

from mpi4py import MPI

from .. import config
from ..config import switch
from .mpi_library import library_name, library_version

__all__ = ["CudaAwareness", "cuda_awareness", "is_cuda_aware", "detect", "detect_library",
           "library_name", "mpi_symbol", "mpi_t_control", "ControlRead"]


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


_MPI_SUCCESS = 0
_MPI_THREAD_SINGLE = 0  # the same in MPICH and Open MPI


class ControlRead(NamedTuple):
    """What :func:`mpi_t_control` read: the value (None: not read) and how, or why not."""

    value: int | None
    how: str


def mpi_t_control(name: str) -> ControlRead:
    """The value of the MPI tool interface's control variable ``name`` (an integer or
    boolean one) in the loaded library, as an int (any nonzero byte: 1), or None, with how
    it was read or why it could not be."""
    fns = {f: mpi_symbol(f) for f in ("MPI_T_init_thread", "MPI_T_finalize",
                                      "MPI_T_cvar_get_index", "MPI_T_cvar_handle_alloc",
                                      "MPI_T_cvar_read", "MPI_T_cvar_handle_free")}
    missing = [f for f, fn in fns.items() if fn is None]
    if missing:
        return ControlRead(None, f"no MPI_T ({missing[0]} not found)")
    for fn in fns.values():
        fn.restype = ctypes.c_int  # type: ignore[union-attr]
    provided = ctypes.c_int(0)
    if fns["MPI_T_init_thread"](_MPI_THREAD_SINGLE, ctypes.byref(provided)) != _MPI_SUCCESS:  # type: ignore[misc]
        return ControlRead(None, "MPI_T_init_thread failed")
    try:
        index = ctypes.c_int(-1)
        if fns["MPI_T_cvar_get_index"](name.encode(), ctypes.byref(index)) != _MPI_SUCCESS:  # type: ignore[misc]
            return ControlRead(None, f"MPI_T has no control variable {name}")
        handle, count = ctypes.c_void_p(None), ctypes.c_int(0)
        if fns["MPI_T_cvar_handle_alloc"](index, None, ctypes.byref(handle),  # type: ignore[misc]
                                          ctypes.byref(count)) != _MPI_SUCCESS:
            return ControlRead(None, f"MPI_T_cvar_handle_alloc({name}) failed")
        try:
            if count.value != 1:
                return ControlRead(None, f"MPI_T control variable {name} holds "
                                         f"{count.value} values")
            buf = (ctypes.c_ubyte * 64)()  # room for any scalar: an int, a bool, a count
            if fns["MPI_T_cvar_read"](handle, buf) != _MPI_SUCCESS:  # type: ignore[misc]
                return ControlRead(None, f"MPI_T_cvar_read({name}) failed")
            return ControlRead(int(any(buf)), f"MPI_T control variable {name} = {int(any(buf))}")
        finally:
            fns["MPI_T_cvar_handle_free"](ctypes.byref(handle))  # type: ignore[misc]
    finally:
        fns["MPI_T_finalize"]()  # type: ignore[misc]


def _open_mpi_cuda() -> tuple[bool, str]:
    """Open MPI: built with CUDA (``MPIX_Query_cuda_support``) and, where the library has
    the run-time switch ``opal_cuda_support`` (4.x), switched on."""
    built, why = _query_cuda_support()
    if not built:
        return False, why
    switch_on = mpi_t_control("opal_cuda_support")
    if switch_on.value is None:  # no MPI_T, or no such switch (Open MPI 5 asks at run time)
        env = _env_flag("OMPI_MCA_opal_cuda_support")
        if env is None:
            return True, f"{why}; {switch_on.how}"
        switch_on = ControlRead(int(env), "OMPI_MCA_opal_cuda_support="
                                f"{os.environ['OMPI_MCA_opal_cuda_support']}")
    if not switch_on.value:
        return False, f"{why} (built with CUDA), but the run-time switch is off: {switch_on.how}"
    return True, f"{why}; {switch_on.how}"


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
    text = library_version()
    if "CRAY MPICH" in text.upper():
        flag = _env_flag("MPICH_GPU_SUPPORT_ENABLED")
        return CudaAwareness(bool(flag), f"{lib}: MPICH_GPU_SUPPORT_ENABLED="
                             f"{os.environ.get('MPICH_GPU_SUPPORT_ENABLED', 'unset')}")
    if "MVAPICH" in text.upper():
        flag = _env_flag("MV2_USE_CUDA")
        return CudaAwareness(bool(flag), f"{lib}: MV2_USE_CUDA="
                             f"{os.environ.get('MV2_USE_CUDA', 'unset')}")
    if "Open MPI" in text:
        aware, why = _open_mpi_cuda()
        return CudaAwareness(aware, f"{lib}: {why}")
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


@functools.cache
def cuda_awareness() -> CudaAwareness:
    """The cached decision (made on first call, again after either setting changes)."""
    return detect()


def is_cuda_aware() -> bool:
    """True when GPU arrays are handed to MPI directly.

    Forced with ``sm.config.update(cuda_aware=True)`` (or False; None detects again), for
    tests and for sites whose MPI reports wrongly.
    """
    return cuda_awareness().aware


def _forget(_: object) -> None:
    cuda_awareness.cache_clear()


config.on_update("cuda_aware", _forget)
config.on_update("gpu_transport", _forget)
