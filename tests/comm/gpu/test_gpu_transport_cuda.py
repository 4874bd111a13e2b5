"""The CUDA IPC transport on a real GPU with CuPy (skipped without one).

Every call of sbpmpi.comm on CuPy arrays with the transport ``ipc``
(``sm.config.override(gpu_transport="ipc")``): CuPy's pool packs the arrays into shared
allocations and carves new arrays out of freed blocks, so the handles are those of base
allocations plus offsets, and two arrays of one call can lie in one allocation; no mapping
outlives its call, so freeing the pool's blocks gives the memory back and allocating again
gives correct results. Results are compared with NumPy. Where WORLD has no IPC path (3
ranks on pseudo-nodes of 2: ``SBPMPI_IPC_NODE_SIZE=2``) the values are still checked (the
MPI path) and the IPC assertions are skipped, with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from comm_helpers import data, run_all
from mpi4py import MPI

from sbpmpi import backend, config
from sbpmpi import comm as C
from sbpmpi.comm.gpu import route
from sbpmpi.comm.gpu.hier import Hierarchical
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


def _world_transport() -> IpcTransport | Hierarchical | str:
    t = route.transports().get(C.WORLD.ranks)
    assert t is not None, "no call of WORLD asked for IPC"
    return t


def _stats_or_skip() -> dict:
    """WORLD's IPC counters; the test is skipped (after its value checks) without IPC."""
    t = _world_transport()
    if isinstance(t, str):
        pytest.skip(f"no IPC on WORLD ({t}): the MPI path was checked")
    return dict(t.stats)


def _has_ipc() -> bool:
    """Whether WORLD has an IPC path (a first call builds its transport)."""
    import cupy as cp

    x = cp.ones(2, cp.float32)
    C.all_reduce(x)
    assert cp.asnumpy(x).tolist() == [size, size]
    return not isinstance(_world_transport(), str)


def test_cupy_every_call_over_ipc(chk, ipc):
    import cupy as cp

    run_all(chk, lambda a: cp.asarray(a), lambda a: cp.asnumpy(a), False, ipc=_has_ipc())
    s = _stats_or_skip()
    chk.true(s["calls"] >= 10 and s["fallbacks"] == 0, f"IPC carried the collectives: {s}")


def test_cupy_interior_pointers_and_freed_pool(chk, ipc):
    import cupy as cp

    p = size
    pool = cp.get_default_memory_pool()
    ipc_path = _has_ipc()
    calls0 = 0 if not ipc_path else _world_transport().stats["calls"]  # type: ignore[union-attr]
    dev = route.get_device()
    assert dev is not None
    for it in range(3):
        world.Barrier()
        pool.free_all_blocks()
        block = cp.empty(8 << 20, cp.uint8)  # one allocation of the pool ...
        del block  # ... back in the pool: the next arrays are carved out of it
        pad = cp.empty(37 * (rank + 1) + it, cp.uint8)  # the arrays sit at inner offsets
        n = 1000 + it
        x = cp.asarray(data(rank, n, np.float32, it))[it:]
        out = cp.empty((p, x.size), cp.float32)
        ax, ao = dev.allocation(int(x.data.ptr)), dev.allocation(int(out.data.ptr))
        chk.true(ax is not None and ax == ao and int(x.data.ptr) > ax.base,
                 f"round {it}: input and output carved from one allocation: {ax} {ao}")
        C.all_gather(out, x)
        chk.same(cp.asnumpy(out), np.stack([data(r, n, np.float32, it)[it:]
                                            for r in range(p)]), f"all_gather round {it}")
        big = cp.asarray(data(rank, p * (8 << 20) // 4, np.float32, 9))  # its own allocation
        y = cp.empty((8 << 20) // 4, cp.float32)
        C.reduce_scatter(y, big)
        want = sum(data(r, p * (8 << 20) // 4, np.float32, 9) for r in range(p))
        chk.same(cp.asnumpy(y), want[rank * y.size:(rank + 1) * y.size], f"reduce_scatter {it}")
        del pad, x, out, big, y
        t = _world_transport()
        chk.true(isinstance(t, str) or not t.mapped,
                 "no peer allocation stays mapped between calls")
        world.Barrier()
        pool.free_all_blocks()  # allocations go; addresses are reused
    s = _stats_or_skip()
    hier = isinstance(_world_transport(), Hierarchical)
    # across pseudo-nodes (SBPMPI_IPC_NODE_SIZE) reduce-scatter takes the MPI path
    chk.true(s["fallbacks"] == 0 and s["calls"] - calls0 == (3 if hier else 6), str(s))
