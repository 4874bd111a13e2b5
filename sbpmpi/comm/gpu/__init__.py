"""GPU transports of sbpmpi.comm: CUDA IPC between the ranks of a node, and the choice.

:mod:`.schedule` (collectives as copy schedules, pure), :mod:`.device` (what the protocol
asks of a device; CuPy's implementation), :mod:`.ipc` (the protocol: handles of base
allocations plus offsets, the mapping cache, synchronisation and node barriers),
:mod:`.hier` (IPC on each node plus one MPI exchange between nodes), :mod:`.select`
(the decision: the setting ``gpu_transport`` and the automatic choice), :mod:`.route` (the entry points the
collectives call).
"""

from .select import TRANSPORTS, GpuTransport, gpu_transport

__all__ = ["TRANSPORTS", "GpuTransport", "gpu_transport"]
