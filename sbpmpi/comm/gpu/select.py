"""Which transport carries GPU arrays, and why: ``ipc``, ``mpi`` or ``staged``.

- ``mpi``: device pointers go to a CUDA-aware MPI library directly.
- ``staged``: through pooled pinned host buffers (any MPI).
- ``ipc``: between ranks of one node, CUDA IPC copies from the peers' device memory
  (:mod:`.ipc`); for a group spanning nodes with the same number (>= 2) of its ranks on
  each, all-reduce and all-gather(v) are hierarchical (IPC on each node, one staged MPI
  exchange between nodes: :mod:`.hier`); calls that cannot use it (other collectives
  across nodes, host arrays, memory that cannot be exported) take the ``mpi`` path where
  the library is CUDA-aware, else ``staged``; every rank of the call agrees.

``mpi`` and ``staged`` forced by the environment act through
:func:`..cuda_aware.cuda_awareness` (``SBPMPI_CUDA_AWARE`` still wins over them, and
``set_cuda_aware`` over both).

Order: ``SBPMPI_GPU_TRANSPORT=ipc|mpi|staged`` (an explicit override), else ``mpi`` where
the library is CUDA-aware (see :mod:`..cuda_aware`), else ``staged``. CUDA IPC is not the
default yet: it has been unit-tested against a stand-in device only, and becomes the
default on GPU nodes once measured there. The decision is made once, on first use, and
must be the same on every rank (it depends on the environment and the MPI library only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..cuda_aware import cuda_awareness, detect_library, set_cuda_aware

__all__ = ["ENV", "TRANSPORTS", "GpuTransport", "detect", "gpu_transport", "set_gpu_transport"]

ENV = "SBPMPI_GPU_TRANSPORT"
TRANSPORTS = ("ipc", "mpi", "staged")


@dataclass(frozen=True)
class GpuTransport:
    """The transport for GPU arrays, why, and whether it was forced."""

    name: str
    reason: str
    forced: bool = False


def _validate(value: str, arg: str) -> str:
    v = value.strip().lower()
    if v not in TRANSPORTS:
        raise ValueError(f"{arg}={value!r} is not one of {', '.join(TRANSPORTS)} "
                         f"(or unset for the automatic choice)")
    return v


def detect() -> GpuTransport:
    """Decide now (see the module docstring for the order)."""
    raw = os.environ.get(ENV)
    if raw is not None and raw.strip():
        v = _validate(raw, ENV)
        reason = f"{ENV}={v} (explicit override)"
        if v == "mpi" and not detect_library().aware:
            reason += ("; the MPI library does not report CUDA support "
                       f"({detect_library().reason}): device pointers may crash it")
        if v == "ipc":
            fb = "mpi" if cuda_awareness().aware else "staged"
            reason += f"; calls that cannot use CUDA IPC (e.g. across nodes) go {fb}"
        return GpuTransport(v, reason, True)
    aware = cuda_awareness()
    if aware.aware:
        return GpuTransport("mpi", f"GPU arrays go to MPI directly ({aware.reason})")
    return GpuTransport("staged", f"GPU arrays are staged through host memory "
                        f"({aware.reason}); CUDA IPC between the ranks of a node is "
                        f"available with {ENV}=ipc")


_decision: GpuTransport | None = None


def gpu_transport() -> GpuTransport:
    """The cached decision (made on first call)."""
    global _decision
    if _decision is None:
        _decision = detect()
    return _decision


def set_gpu_transport(name: str | None) -> GpuTransport:
    """Force the transport (``"ipc"``, ``"mpi"``, ``"staged"``) or re-detect it (None).

    Every rank must make the same choice.
    """
    global _decision
    if name is None:
        set_cuda_aware(None)
        _decision = detect()
    else:
        if not isinstance(name, str):
            raise TypeError(f"name must be 'ipc', 'mpi', 'staged' or None, got {name!r}")
        v = _validate(name, "name")
        if v != "ipc":
            set_cuda_aware(v == "mpi")
        _decision = GpuTransport(v, f"set_gpu_transport({v!r})", True)
    from . import route

    route.configure(_decision.name == "ipc")
    return _decision
