"""The CUDA IPC transport on a real GPU with CuPy (skipped without one).

Every call of sbpmpi.comm on CuPy arrays with the transport ``ipc``
(``sm.config.override(gpu_transport="ipc")``): CuPy's pool packs the arrays into shared
allocations, so the handles are those of base allocations plus offsets; no mapping
outlives its call, so freeing the pool's blocks gives the memory back and allocating again
gives correct results. Results are compared with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from comm_helpers import data, run_all
from mpi4py import MPI

from sbpmpi import backend, config
from sbpmpi import comm as C
from sbpmpi.comm.gpu import route
from sbpmpi.comm.gpu.ipc import IpcTransport

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
pytestmark = [pytest.mark.timeout(300), pytest.mark.mpi(min_size=1)]


@pytest.fixture
def ipc():
    if not backend.cupy_available():
        pytest.skip("no CuPy / no GPU")
    backend.bind_device()
    route.set_device(None)
    with config.override(gpu_transport="ipc"):
        yield
    route.set_device(None)


def _stats() -> dict:
    t = route.transports().get(C.WORLD.ranks)
    assert t is not None
    if isinstance(t, str):
        pytest.fail(f"no IPC on WORLD: {t}")
    return dict(t.stats)


def test_cupy_every_call_over_ipc(chk, ipc):
    import cupy as cp

    run_all(chk, lambda a: cp.asarray(a), lambda a: cp.asnumpy(a), False, ipc=True)
    s = _stats()
    chk.true(s["calls"] >= 10 and s["fallbacks"] == 0, f"IPC carried the collectives: {s}")


def test_cupy_interior_pointers_and_freed_pool(chk, ipc):
    import cupy as cp

    p = size
    for it in range(3):
        # small arrays at different offsets of the pool's shared allocations
        pads = [cp.empty(37 * (rank + 1) + it, cp.uint8) for _ in range(2)]
        x = cp.asarray(data(rank, 1000 + it, np.float32, it))[it:]
        out = cp.empty((p, x.size), cp.float32)
        C.all_gather(out, x)
        chk.same(cp.asnumpy(out), np.stack([data(r, 1000 + it, np.float32, it)[it:]
                                            for r in range(p)]), f"all_gather round {it}")
        big = cp.asarray(data(rank, p * (8 << 20) // 4, np.float32, 9))  # its own allocation
        y = cp.empty((8 << 20) // 4, cp.float32)
        C.reduce_scatter(y, big)
        want = sum(data(r, p * (8 << 20) // 4, np.float32, 9) for r in range(p))
        chk.same(cp.asnumpy(y), want[rank * y.size:(rank + 1) * y.size], f"reduce_scatter {it}")
        del pads, x, out, big, y
        chk.true(not route.transports()[C.WORLD.ranks].mapped,  # type: ignore[union-attr]
                 "no peer allocation stays mapped between calls")
        world.Barrier()
        cp.get_default_memory_pool().free_all_blocks()  # allocations go; addresses are reused
    s = _stats()
    hier = not isinstance(route.transports()[C.WORLD.ranks], IpcTransport)
    # across pseudo-nodes (SBPMPI_IPC_NODE_SIZE) reduce-scatter takes the MPI path
    chk.true(s["fallbacks"] == 0 and s["calls"] == (3 if hier else 6), str(s))
