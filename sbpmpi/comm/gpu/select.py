"""Which transport carries GPU arrays, and why: ``ipc``, ``mpi`` or ``staged``.

- ``mpi``: device pointers go to a CUDA-aware MPI library directly.
- ``staged``: through pooled pinned host buffers (any MPI).
- ``ipc``: between ranks of one node, CUDA IPC copies from the peers' device memory
  (:mod:`.ipc`); for a group spanning nodes with the same number (>= 2) of its ranks on
  each, all-reduce and all-gather(v) are hierarchical (IPC on each node, one staged MPI
  exchange between nodes: :mod:`.hier`); calls that cannot use it (other collectives
  across nodes, host arrays, memory that cannot be exported) take the ``mpi`` path where
  the library is CUDA-aware, else ``staged``; every rank of the call agrees.

This module owns the decision and its one setting, :data:`sbpmpi.config.gpu_transport`
(``SBPMPI_GPU_TRANSPORT=ipc|mpi|staged``, or ``sm.config.update(gpu_transport=...)``; None:
the automatic choice). ``mpi`` and ``staged`` act through
:func:`..cuda_aware.cuda_awareness` (the setting ``cuda_aware`` still wins over them).

Order: the setting (an explicit override), else ``mpi`` where the library is CUDA-aware
(see :mod:`..cuda_aware`), else ``staged``. CUDA IPC is not the default yet: it has been
unit-tested against a stand-in device only, and becomes the default on GPU nodes once
measured there.

``ipc`` stays off where device pointers go to MPI (the library is CUDA-aware, or the
setting ``cuda_aware`` says so): such a library maps its peers' GPU buffers with CUDA IPC
itself (Open MPI's smcuda and UCX keep those mappings open in a cache), and CUDA keeps one
mapping of a handle per process (a second open adds a reference to the first), so the two
would share mappings of the same pool allocations, each with its own idea of when they
close. That has not been measured to work, so the transport is ``mpi`` there, with the
reason; ``SBPMPI_CUDA_AWARE=0`` keeps ``ipc`` and stages what it does not carry, so that
MPI never sees a device pointer.

The decision is made once, on first use (only a setting of ``ipc`` asks the library
anything), again after either setting changes, and must be the same on every rank (it
depends on the settings and the MPI library only).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ... import config
from ..cuda_aware import cuda_awareness, detect_library

__all__ = ["TRANSPORTS", "GpuTransport", "detect", "gpu_transport", "ipc_chosen"]

TRANSPORTS = config.gpu_transport.choices


@dataclass(frozen=True)
class GpuTransport:
    """The transport for GPU arrays, why, and whether it was forced."""

    name: str
    reason: str
    forced: bool = False


def ipc_chosen() -> bool:
    """True when the transport is ``ipc`` (only ever chosen by the setting, and kept off
    beside a CUDA-aware MPI: see the module docstring)."""
    return config.gpu_transport.value == "ipc" and gpu_transport().name == "ipc"


def detect() -> GpuTransport:
    """Decide now (see the module docstring for the order)."""
    setting = config.gpu_transport
    if setting.value is not None:
        v = setting.value
        reason = f"{setting.origin()}: explicit override"
        if v == "mpi" and not detect_library().aware:
            reason += ("; the MPI library does not report CUDA support "
                       f"({detect_library().reason}): device pointers may crash it")
        if v == "ipc":
            aware = cuda_awareness()
            if aware.aware:
                return GpuTransport("mpi", (
                    f"{reason} of ipc, which stays off: device pointers go to MPI "
                    f"({aware.reason}), and a CUDA-aware MPI maps its peers' GPU buffers "
                    "with CUDA IPC itself, and CUDA keeps one mapping of a handle per "
                    "process, which the two would share; GPU arrays go to MPI directly "
                    f"({config.cuda_aware.env}=0 keeps ipc and stages the other calls)"),
                    True)
            reason += "; calls that cannot use CUDA IPC (e.g. across nodes) go staged"
        return GpuTransport(v, reason, True)
    aware = cuda_awareness()
    if aware.aware:
        return GpuTransport("mpi", f"GPU arrays go to MPI directly ({aware.reason})")
    return GpuTransport("staged", f"GPU arrays are staged through host memory "
                        f"({aware.reason}); CUDA IPC between the ranks of a node is "
                        f"available with {setting.env}=ipc")


@functools.cache
def gpu_transport() -> GpuTransport:
    """The cached decision (made on first call, again after the setting changes)."""
    return detect()


def _forget(_: object) -> None:
    gpu_transport.cache_clear()


config.on_update("gpu_transport", _forget)
config.on_update("cuda_aware", _forget)  # the automatic choice follows it
