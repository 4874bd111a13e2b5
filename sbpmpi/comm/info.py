"""What the communication layer runs on: MPI library, CUDA-awareness, staging, GPUs.

:func:`info` gathers what the modules below it decide: the MPI library's facts
(:mod:`.mpi_library`), CUDA-awareness (:mod:`.cuda_aware`), the pinned staging pool
(:mod:`.buffers`), checked mode (:mod:`.checks`) and the GPU transport (:mod:`.gpu`). It
imports them all, so no module of ``comm`` imports it (they import :mod:`.mpi_library`).
"""

from __future__ import annotations

from typing import Any

import mpi4py
from mpi4py import MPI

from .. import backend
from ..backend import device_copy
from .agreement.checks import checking
from .buffers import PINNED_POOL
from .cuda_aware import cuda_awareness
from .gpu import route
from .gpu.select import gpu_transport
from .mpi_library import library_line, library_name, max_count

# the MPI library's facts are also importable from here, where they lived before
__all__ = ["info", "library_line", "library_name", "max_count"]


def info(all_ranks: bool = False) -> dict[str, Any]:
    """This rank's communication setup as a dict.

    Keys: ``mpi_library`` (first line of ``MPI.Get_library_version()``), ``mpi_version``
    (standard version), ``mpi4py``, ``rank``, ``world_size``, ``cuda_aware`` (bool),
    ``cuda_aware_reason``, ``staging`` (how GPU arrays reach MPI), ``pinned_pool``
    (staging buffer statistics), ``gpus_visible``, ``gpu`` (device id this rank uses, or
    None), ``cupy_allocator`` (keep CuPy's default ``MemoryPool`` with a CUDA-aware MPI:
    stream-ordered allocations break CUDA IPC), ``checked_mode``, ``gpu_transport``
    (``"ipc"``, ``"mpi"`` or ``"staged"``), ``gpu_transport_reason`` and ``ipc`` (per group
    that used it: calls, fallbacks, exports, opened mappings; or why it has no IPC). With ``all_ranks=True`` (collective over WORLD), also
    ``ranks``: the per-rank dicts of every rank.
    """
    aware = cuda_awareness()
    gpus = backend.cuda_device_count()
    gpu = backend.current_device() if gpus else None
    d: dict[str, Any] = {
        "mpi_library": library_name(),
        "mpi_version": "{}.{}".format(*MPI.Get_version()),
        "mpi4py": mpi4py.__version__,
        "rank": MPI.COMM_WORLD.Get_rank(),
        "world_size": MPI.COMM_WORLD.Get_size(),
        "cuda_aware": aware.aware,
        "cuda_aware_reason": aware.reason,
        "staging": ("none: GPU arrays go to MPI directly (user-defined reductions are staged)"
                    if aware.aware else
                    "pinned host buffers, reused across calls"
                    + ("" if backend.cupy_available() else " (no CuPy: ordinary host memory)")),
        "pinned_pool": {"allocations": PINNED_POOL.allocations, "reuses": PINNED_POOL.reuses,
                        "cached_bytes": PINNED_POOL.cached_bytes()},
        "gpus_visible": gpus,
        "gpu": gpu,
        "cupy_allocator": device_copy.cupy_allocator_name(),
        "checked_mode": checking(),
    }
    tr = gpu_transport()
    d["gpu_transport"] = tr.name
    d["gpu_transport_reason"] = tr.reason
    if tr.name == "ipc":
        d["ipc"] = {str(list(ranks)): t if isinstance(t, str) else
                    dict(t.stats, mapped=len(t.mapped), device=t.device.name,
                         kind="hierarchical" if hasattr(t, "cross") else "one node")
                    for ranks, t in route.transports().items()}
    if all_ranks:
        per_rank = MPI.COMM_WORLD.allgather(
            {k: d[k] for k in ("rank", "cuda_aware", "gpus_visible", "gpu")})
        d["ranks"] = per_rank
    return d
