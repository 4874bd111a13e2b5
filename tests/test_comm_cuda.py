"""The GPU-array code path of sbpmpi.comm, without a GPU, and with CuPy where there is one.

``FakeCudaArray`` exposes ``__cuda_array_interface__`` over host memory: with
``set_cuda_aware(True)`` its pointer goes to MPI directly; with ``False`` it is staged
through the pinned-buffer pool (copies by ctypes.memmove). Both must give the NumPy
reference results. The CuPy test runs only where CuPy sees a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from comm_helpers import checker, data
from fake_cuda import FakeCudaArray
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import backend
from sbpmpi import comm as C
from sbpmpi.comm import ReduceOp, cuda_aware
from sbpmpi.comm.buffers import POOL

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def chk():
    yield from checker()


@pytest.fixture(params=[True, False], ids=["aware", "staged"])
def aware(request):
    C.set_cuda_aware(request.param)
    yield request.param
    C.set_cuda_aware(None)


def dev(a):
    return FakeCudaArray.from_numpy(a)


def run_all(chk, mk, host, aware: bool, n: int = 5, ipc: bool = False) -> None:
    """Every call on device arrays made by ``mk`` (numpy -> device), read back by ``host``.

    ``ipc``: the collectives go over CUDA IPC (never staged), not the MPI path.
    """
    p = size
    allx = [data(r, n, np.float32, 1) for r in range(p)]
    with sm.trace() as t:
        x = mk(allx[rank])
        C.all_reduce(x)
    chk.same(host(x), sum(allx), "all_reduce")
    chk.true(t[0].device == "cuda" and t[0].staged == (not aware and not ipc), f"trace {t[0]}")
    for op in ReduceOp:
        x = mk(allx[rank])
        C.all_reduce(x, op=op)
        want = {ReduceOp.SUM: sum(allx), ReduceOp.PROD: np.prod(allx, axis=0),
                ReduceOp.MAX: np.max(allx, axis=0), ReduceOp.MIN: np.min(allx, axis=0),
                ReduceOp.AVG: np.add.reduce(np.stack(allx), axis=0) / np.float32(p)}[op]
        chk.same(host(x), want, f"all_reduce {op}")
    h16 = [data(r, n, np.float16, 2) for r in range(p)]
    with sm.trace() as t:
        x = mk(h16[rank])
        C.all_reduce(x)  # a user-defined MPI op: staged even when aware
    chk.same(host(x), np.add.reduce(np.stack(h16), axis=0, dtype=np.float16), "float16 sum")
    chk.true(t[0].staged != ipc, "float16 reductions: host memory on MPI, device on IPC")
    x = mk(allx[rank])
    C.broadcast(x, src=p - 1)
    chk.same(host(x), allx[p - 1], "broadcast")
    x = mk(allx[rank])
    C.reduce(x, dst=0, op=ReduceOp.MAX)
    chk.same(host(x), np.max(allx, axis=0) if rank == 0 else allx[rank], "reduce")
    out = mk(np.zeros((p, n), np.float32))
    C.all_gather(out, mk(allx[rank]))
    chk.same(host(out), np.stack(allx), "all_gather")
    outl = [mk(np.zeros(n, np.float32)) for _ in range(p)]
    C.all_gather(outl, mk(allx[rank]))
    chk.same(np.stack([host(o) for o in outl]), np.stack(allx), "all_gather list")
    out = mk(np.zeros((p, n), np.float32)) if rank == 0 else None
    C.gather(mk(allx[rank]), out, dst=0)
    if rank == 0:
        chk.same(host(out), np.stack(allx), "gather")
    big = [data(r, p * n, np.float32, 3) for r in range(p)]
    x = mk(np.zeros(n, np.float32))
    C.scatter(x, mk(big[0]) if rank == 0 else None, src=0)
    chk.same(host(x), big[0][rank * n:(rank + 1) * n], "scatter")
    C.scatter(x, [mk(big[0][i * n:(i + 1) * n]) for i in range(p)] if rank == 0 else None)
    chk.same(host(x), big[0][rank * n:(rank + 1) * n], "scatter list")
    C.reduce_scatter(x, mk(big[rank]), op=ReduceOp.AVG)
    chk.same(host(x), (np.add.reduce(np.stack(big), axis=0) / np.float32(p))[rank * n:(rank + 1) * n],
             "reduce_scatter avg")
    out = mk(np.zeros(p * n, np.float32))
    C.all_to_all(out, mk(big[rank]))
    chk.same(host(out), np.concatenate([b[rank * n:(rank + 1) * n] for b in big]), "all_to_all")
    counts = [r % 3 for r in range(p)]
    v = [data(r, counts[r], np.float64, 4) for r in range(p)]
    out = mk(np.zeros(sum(counts)))
    C.all_gather_v(out, mk(v[rank]), counts)
    chk.same(host(out), np.concatenate(v), "all_gather_v")
    # with gaps between the blocks: the gaps keep their values
    gd = [sum(counts[:r]) + 2 * r + 1 for r in range(p)]
    filler = np.full(sum(counts) + 2 * p + 1, -7.0)
    out = mk(filler)
    C.all_gather_v(out, mk(v[rank]), counts, gd)
    want = filler.copy()
    for r in range(p):
        want[gd[r]:gd[r] + counts[r]] = v[r]
    chk.same(host(out), want, "all_gather_v with gaps")
    out = mk(filler) if rank == 0 else None
    C.gather_v(mk(v[rank]), out, counts, gd, dst=0)
    if rank == 0:
        chk.same(host(out), want, "gather_v with gaps")
    out = mk(np.zeros(sum(counts))) if rank == 0 else None
    C.gather_v(mk(v[rank]), out, counts, dst=0)
    if rank == 0:
        chk.same(host(out), np.concatenate(v), "gather_v")
    x = mk(np.zeros(counts[rank]))
    C.scatter_v(x, mk(np.concatenate(v)) if rank == 0 else None, counts, src=0)
    chk.same(host(x), v[rank], "scatter_v")
    tot = [data(r, sum(counts), np.float64, 5) for r in range(p)]
    x = mk(np.zeros(counts[rank]))
    C.reduce_scatter_v(x, mk(tot[rank]), counts)
    off = sum(counts[:rank])
    chk.same(host(x), sum(tot)[off:off + counts[rank]], "reduce_scatter_v")
    sc = [[(i + j) % 2 + 1 for j in range(p)] for i in range(p)]
    ins = [data(i, sum(sc[i]), np.int16, 6) for i in range(p)]
    oc = [sc[i][rank] for i in range(p)]
    out = mk(np.zeros(sum(oc), np.int16))
    C.all_to_all_v(out, oc, mk(ins[rank]), sc[rank])
    chk.same(host(out), np.concatenate([ins[i][sum(sc[i][:rank]):sum(sc[i][:rank + 1])]
                                        for i in range(p)]), "all_to_all_v")
    # point to point ring
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    got = mk(np.zeros(n, np.float32))
    w = C.irecv(got, src=prv, tag=4)
    C.isend(mk(allx[rank]), dst=nxt, tag=4).wait()
    w.wait()
    chk.same(host(got), allx[prv], "isend/irecv")
    if p > 1:
        got = mk(np.zeros(n, np.float32))
        if rank % 2 == 0:
            C.send(mk(allx[rank]), dst=nxt)
            C.recv(got, src=prv)
        else:
            C.recv(got, src=prv)
            C.send(mk(allx[rank]), dst=nxt)
        chk.same(host(got), allx[prv], "send/recv")


@pytest.mark.mpi(min_size=1)
def test_fake_cuda_every_call(chk, aware):
    assert C.is_cuda_aware() is aware
    assert backend.is_device_array(dev(np.zeros(1)))
    run_all(chk, dev, lambda a: a.get(), aware)


@pytest.mark.mpi(min_size=1)
def test_fake_cuda_sizes_non_contiguous_and_mixed(chk, aware):
    for n in (0, 1, (2 << 20) // 8):
        x = dev(np.full(n, rank + 1.0))
        C.all_reduce(x)
        chk.same(x.get(), np.full(n, size * (size + 1) / 2), f"all_reduce n={n}")
    # a non-contiguous device input is copied; a non-contiguous device output is refused
    base = dev(np.arange(12.0).reshape(3, 4) + rank)
    nc = base[:, ::2]
    out = dev(np.zeros((size, 3, 2)))
    C.all_gather(out, nc)
    chk.same(out.get(), np.stack([(np.arange(12.0).reshape(3, 4) + r)[:, ::2]
                                  for r in range(size)]), "non-contiguous device input")
    with pytest.raises(ValueError, match="must be C-contiguous"):
        C.all_reduce(nc)
    # host input, device output and the other way round
    out = dev(np.zeros(size))
    C.all_gather(out, np.array([float(rank)]))
    chk.same(out.get(), np.arange(float(size)), "host in, device out")
    out = np.zeros(size)
    C.all_gather(out, dev(np.array([float(rank)])))
    chk.same(out, np.arange(float(size)), "device in, host out")


@pytest.mark.mpi(min_size=1)
def test_staging_buffers_are_reused(chk):
    C.set_cuda_aware(False)
    try:
        x = dev(np.ones(1000))
        C.all_reduce(x)  # warm the pool for this size
        allocs, reuses = POOL.allocations, POOL.reuses
        for _ in range(5):
            x = dev(np.ones(1000))
            C.all_reduce(x)
            chk.same(x.get(), np.full(1000, float(size)), "staged all_reduce")
        chk.true(POOL.allocations == allocs, "no new pinned buffers for repeated calls")
        chk.true(POOL.reuses >= reuses + 5, "the pool hands out cached buffers")
        info = C.info()
        chk.true(info["cuda_aware"] is False and "pinned" in info["staging"], str(info))
    finally:
        C.set_cuda_aware(None)


@pytest.mark.mpi(min_size=1)
def test_cupy_arrays(chk, aware):
    if not backend.cupy_available():
        pytest.skip("no CuPy / no GPU")
    if aware:
        lib = cuda_aware.detect()  # what the library says, not the fixture's forced choice
        if not lib.aware:
            pytest.skip(f"the MPI library is not CUDA-aware ({lib.reason}): handing it device "
                        "pointers would crash; the staged case covers this MPI")
    import cupy as cp

    backend.bind_device()
    run_all(chk, lambda a: cp.asarray(a), lambda a: cp.asnumpy(a), aware)
    # a non-contiguous CuPy input
    x = cp.arange(8.0)[::2] + rank
    out = cp.zeros(4 * size)
    C.all_gather(out, x)
    chk.same(cp.asnumpy(out), np.concatenate([np.arange(8.0)[::2] + r for r in range(size)]),
             "cupy non-contiguous input")
