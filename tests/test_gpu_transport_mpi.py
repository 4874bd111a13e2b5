"""sbpmpi.comm's collectives over the CUDA IPC transport, on MPI ranks, with a stand-in device.

``SBPMPI_GPU_TRANSPORT=ipc`` semantics (``set_gpu_transport("ipc")``) with the device of
``fake_ipc.py``: each rank's "device memory" is shared files, so peers really read each
other's buffers through handle + offset, across processes. Every result is compared with
NumPy on the whole array; the transport's counters show that IPC carried the calls.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from comm_helpers import UFUNC, data, reduction_ok
from fake_cuda import FakeCudaArray
from fake_ipc import FakeIpcDevice
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as C
from sbpmpi.comm import ReduceOp
from sbpmpi.comm.gpu import route

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
pytestmark = [pytest.mark.timeout(120), pytest.mark.mpi(min_size=1)]


def _ipc_device(name: str) -> Iterator[FakeIpcDevice]:
    """A stand-in device installed as the IPC transport's, removed afterwards."""
    d = FakeIpcDevice(name)
    route.set_device(d)
    C.set_gpu_transport("ipc")
    yield d
    route.set_device(None)
    C.set_gpu_transport(None)
    world.Barrier()  # no rank removes its files while a peer may still map them
    d.cleanup()


@pytest.fixture
def dev(monkeypatch):
    """The stand-in device, all ranks on one node (whatever SBPMPI_IPC_NODE_SIZE says)."""
    monkeypatch.delenv("SBPMPI_IPC_NODE_SIZE", raising=False)
    yield from _ipc_device(f"r{rank}")


def stats(group=None) -> dict:
    """The IPC counters of ``group`` (zeros before its first call)."""
    t = route.transports().get((group or C.WORLD).ranks)
    if t is None:
        return {"calls": 0, "fallbacks": 0, "opens": 0}
    assert not isinstance(t, str), t
    return dict(t.stats)


def test_every_collective_over_ipc(chk, dev):
    p = size
    n = 7
    allx = [data(r, n, np.float32, 1) for r in range(p)]
    with sm.trace() as t:
        x = dev.array(allx[rank], offset_pad=64 * rank + 8)
        C.all_reduce(x)
    chk.same(x.get(), np.add.reduce(np.stack(allx), axis=0), "all_reduce")
    chk.true(t[0].device == "cuda" and not t[0].staged, f"trace {t[0]}")
    for dt in (np.float32, np.float16, np.int32, np.bool_, np.complex64, np.float64):
        for op in ReduceOp:
            if not reduction_ok(dt, op):
                continue
            xs = [data(r, 2 * p + 3, dt, 2) for r in range(p)]
            x = dev.array(xs[rank])
            C.all_reduce(x, op=op)
            want = UFUNC[op].reduce(np.stack(xs), axis=0, dtype=np.dtype(dt))
            if op is ReduceOp.AVG:
                want = want / np.dtype(dt).type(p)
            chk.same(x.get(), want, f"all_reduce {np.dtype(dt)} {op}")
            big = [data(r, 3 * p, dt, 3) for r in range(p)]
            out = dev.empty(3, dt)
            C.reduce_scatter(out, dev.array(big[rank]), op=op)
            want = UFUNC[op].reduce(np.stack(big), axis=0, dtype=np.dtype(dt))
            if op is ReduceOp.AVG:
                want = want / np.dtype(dt).type(p)
            chk.same(out.get(), want[3 * rank:3 * rank + 3], f"reduce_scatter {dt} {op}")
    # above DIRECT_ALL_REDUCE_BYTES (and p > 2): reduce-scatter + all-gather on IPC
    n_big = route.DIRECT_ALL_REDUCE_BYTES // 4 + 3
    xs = [data(r, n_big, np.float32, 12) for r in range(p)]
    x = dev.array(xs[rank])
    C.all_reduce(x, op=ReduceOp.MAX)
    chk.same(x.get(), np.maximum.reduce(np.stack(xs), axis=0), "large all_reduce")
    for root in range(p):
        x = dev.array(allx[rank])
        C.broadcast(x, src=root)
        chk.same(x.get(), allx[root], f"broadcast from {root}")
    out = dev.empty((p, n), np.float32)
    C.all_gather(out, dev.array(allx[rank]))
    chk.same(out.get(), np.stack(allx), "all_gather")
    # a non-contiguous device input is copied first (here into host-backed memory the
    # device cannot export: every rank falls back to MPI together)
    base = dev.array(np.arange(12.0).reshape(3, 4) + rank)
    out = dev.empty((p, 3, 2), np.float64)
    before = stats()["fallbacks"]
    C.all_gather(out, base[:, ::2])
    chk.same(out.get(), np.stack([(np.arange(12.0).reshape(3, 4) + r)[:, ::2]
                                  for r in range(p)]), "non-contiguous input")
    chk.true(stats()["fallbacks"] == before + 1, "a non-exportable input falls back")
    bigs = [data(r, p * n, np.int64, 4) for r in range(p)]
    out = dev.empty(p * n, np.int64)
    C.all_to_all(out, dev.array(bigs[rank]))
    chk.same(out.get(), np.concatenate([b[rank * n:(rank + 1) * n] for b in bigs]), "all_to_all")
    s = stats()
    chk.true(s["calls"] > 10 and s["opens"] <= (p - 1) * 64, f"IPC carried the calls: {s}")


def test_vector_collectives_over_ipc(chk, dev):
    p = size
    counts = [(r * 2 + 1) % 4 for r in range(p)]  # uneven, some zero
    v = [data(r, counts[r], np.float64, 5) for r in range(p)]
    out = dev.empty(sum(counts), np.float64)
    C.all_gather_v(out, dev.array(v[rank]), counts)
    chk.same(out.get(), np.concatenate(v), "all_gather_v")
    gd = [sum(counts[:r]) + 2 * r + 1 for r in range(p)]
    filler = np.full(sum(counts) + 2 * p + 1, -7.0)
    out = dev.array(filler)
    C.all_gather_v(out, dev.array(v[rank]), counts, gd)
    want = filler.copy()
    for r in range(p):
        want[gd[r]:gd[r] + counts[r]] = v[r]
    chk.same(out.get(), want, "all_gather_v with gaps")
    for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG):
        tot = [data(r, sum(counts), np.float32, 6) for r in range(p)]
        x = dev.empty(counts[rank], np.float32)
        C.reduce_scatter_v(x, dev.array(tot[rank]), counts, op=op)
        want = UFUNC[op].reduce(np.stack(tot), axis=0)
        if op is ReduceOp.AVG:
            want = want / np.float32(p)
        off = sum(counts[:rank])
        chk.same(x.get(), want[off:off + counts[rank]], f"reduce_scatter_v {op}")
    sc = [[(i + j) % 2 + 1 for j in range(p)] for i in range(p)]
    ins = [data(i, sum(sc[i]), np.int16, 7) for i in range(p)]
    oc = [sc[i][rank] for i in range(p)]
    out = dev.empty(sum(oc), np.int16)
    C.all_to_all_v(out, oc, dev.array(ins[rank]), sc[rank])
    chk.same(out.get(), np.concatenate([ins[i][sum(sc[i][:rank]):sum(sc[i][:rank + 1])]
                                        for i in range(p)]), "all_to_all_v")
    # displacements with gaps on both sides
    idd = [sum(sc[rank][:j]) + j for j in range(p)]
    src = np.zeros(idd[-1] + sc[rank][-1], np.int16)
    for j in range(p):
        src[idd[j]:idd[j] + sc[rank][j]] = ins[rank][sum(sc[rank][:j]):sum(sc[rank][:j + 1])]
    od = [sum(oc[:i]) + 2 * i for i in range(p)]
    out = dev.array(np.full(od[-1] + oc[-1] + 1, -1, np.int16))
    C.all_to_all_v(out, oc, dev.array(src), sc[rank], od, idd)
    want = np.full(od[-1] + oc[-1] + 1, -1, np.int16)
    for i in range(p):
        want[od[i]:od[i] + oc[i]] = ins[i][sum(sc[i][:rank]):sum(sc[i][:rank + 1])]
    chk.same(out.get(), want, "all_to_all_v with displacements")


def test_subgroups_mixed_arrays_and_exchange(chk, dev):
    p = size
    # a sub-group: its own node communicator
    g = C.new_group(list(range(p))[::-1])
    x = dev.array(np.full(4, float(rank + 1)))
    C.all_reduce(x, group=g)
    chk.same(x.get(), np.full(4, p * (p + 1) / 2), "all_reduce on a reversed group")
    chk.true(stats(g)["calls"] == 1, "the group has its own transport")
    # host and device arrays mixed: the MPI path, on every rank alike
    out = dev.empty(p, np.float64)
    C.all_gather(out, np.array([float(rank)]))
    chk.same(out.get(), np.arange(float(p)), "host in, device out")
    if rank == 0:  # one rank's array is not exportable: every rank falls back
        y = FakeCudaArray.from_numpy(np.full(3, 1.0))
    else:
        y = dev.array(np.full(3, 1.0))
    before = stats()["fallbacks"]
    C.all_reduce(y)
    chk.same(y.get(), np.full(3, float(p)), "one rank not exportable")
    chk.true(stats()["fallbacks"] == before + 1, "fell back together")
    # point-to-point moves between ranks (the exchange boxing's moves map onto)
    from sbpmpi.comm.buffers import array_meta
    from sbpmpi.comm.gpu.schedule import P2P

    a = dev.array(np.arange(4, dtype=np.int32) + 10 * rank)
    o = dev.empty(2, np.int32)
    moves = [P2P(src=r, src_off=4, dst=(r + 1) % p, dst_off=0, nbytes=8) for r in range(p)]
    done = route.exchange(o, a, array_meta(a, "a", "t"), moves, 8, C.WORLD, world)
    if done:
        chk.same(o.get(), np.arange(4, dtype=np.int32)[1:3] + 10 * ((rank - 1) % p), "exchange")
    else:  # only across (pseudo-)nodes (SBPMPI_IPC_NODE_SIZE): no hierarchical exchange
        from sbpmpi.comm.gpu.ipc import IpcTransport

        t = route.transports()[C.WORLD.ranks]
        chk.true(not isinstance(t, IpcTransport), f"exchange refused on one node: {t}")


def test_info_names_ipc(chk, dev):
    x = dev.array(np.ones(2))
    C.all_reduce(x)
    info = C.info()
    chk.true(info["gpu_transport"] == "ipc", str(info))
    chk.true(str(list(range(size))) in info["ipc"], str(info["ipc"]))


@pytest.fixture
def pseudo_nodes(monkeypatch):
    """Nodes of two ranks (SBPMPI_IPC_NODE_SIZE=2): the hierarchical path on one machine."""
    monkeypatch.setenv("SBPMPI_IPC_NODE_SIZE", "2")
    yield from _ipc_device(f"h{rank}")


def test_hierarchical_ipc_then_mpi(chk, pseudo_nodes):
    dev, p = pseudo_nodes, size
    t_before = route.transports().get(C.WORLD.ranks)
    assert t_before is None
    for dt, op in ((np.float32, ReduceOp.SUM), (np.int32, ReduceOp.MAX),
                   (np.float64, ReduceOp.AVG), (np.bool_, ReduceOp.MIN)):
        for n in (0, 1, 5, 2 * p + 1):
            xs = [data(r, n, dt, 8) for r in range(p)]
            x = dev.array(xs[rank])
            C.all_reduce(x, op=op)
            want = UFUNC[op].reduce(np.stack(xs), axis=0, dtype=np.dtype(dt))
            if op is ReduceOp.AVG:
                want = want / np.dtype(dt).type(p)
            chk.same(x.get(), want, f"hierarchical all_reduce {dt} {op} n={n}")
    allx = [data(r, 6, np.float32, 9) for r in range(p)]
    out = dev.empty((p, 6), np.float32)
    C.all_gather(out, dev.array(allx[rank]))
    chk.same(out.get(), np.stack(allx), "hierarchical all_gather")
    counts = [(2 * r + 1) % 4 for r in range(p)]
    v = [data(r, counts[r], np.int64, 10) for r in range(p)]
    gd = [sum(counts[:r]) + r for r in range(p)]
    out = dev.array(np.full(sum(counts) + p, -1, np.int64))
    C.all_gather_v(out, dev.array(v[rank]), counts, gd)
    want = np.full(sum(counts) + p, -1, np.int64)
    for r in range(p):
        want[gd[r]:gd[r] + counts[r]] = v[r]
    chk.same(out.get(), want, "hierarchical all_gather_v")
    # reduce-scatter has no hierarchical form yet: the MPI path, correct
    big = [data(r, 2 * p, np.float32, 11) for r in range(p)]
    y = dev.empty(2, np.float32)
    C.reduce_scatter(y, dev.array(big[rank]))
    chk.same(y.get(), np.add.reduce(np.stack(big), axis=0)[2 * rank:2 * rank + 2],
             "reduce_scatter beside the hierarchy")
    t = route.transports()[C.WORLD.ranks]
    if p in (1, 2):  # one (pseudo-)node: plain IPC
        chk.true(not isinstance(t, str) and t.stats["calls"] > 0, str(t))
    elif p == 4:  # two nodes of two ranks
        from sbpmpi.comm.gpu.hier import Hierarchical

        chk.true(isinstance(t, Hierarchical) and t.stats["calls"] >= 18, str(t))
    else:  # 3 ranks: nodes of 2 and 1: no hierarchy, the MPI path
        chk.true(isinstance(t, str) and "same number" in t, str(t))
