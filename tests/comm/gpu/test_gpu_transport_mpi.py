"""sbpmpi.comm's collectives over the CUDA IPC transport, on MPI ranks, with a stand-in device.

``SBPMPI_GPU_TRANSPORT=ipc`` semantics (``sm.config.override(gpu_transport="ipc")``) with the device of
``fake_ipc.py``: each rank's "device memory" is shared files, so peers really read each
other's buffers through handle + offset, across processes. Every result is compared with
NumPy on the whole array; the transport's counters show that IPC carried the calls. On
pseudo-nodes (``ipc_node_size=2``) each pseudo-node is a host of its own for the stand-in,
which refuses a handle made on another host, as CUDA IPC works within one node only.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import numpy as np
import pytest
from comm_helpers import UFUNC, data, reduction_ok
from conftest import raised_by
from fake_cuda import FakeCudaArray
from fake_ipc import FakeIpcDevice
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as C
from sbpmpi import config
from sbpmpi.comm import ReduceOp
from sbpmpi.comm.gpu import route
from sbpmpi.comm.gpu.hier import Hierarchical, pseudo_node
from sbpmpi.comm.gpu.ipc import IpcTransport

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
pytestmark = [pytest.mark.timeout(120), pytest.mark.mpi(min_size=1)]


def _ipc_device(name: str) -> Iterator[FakeIpcDevice]:
    """A stand-in device installed as the IPC transport's, removed afterwards; on
    pseudo-nodes, on a host of its pseudo-node (a handle of another one is refused)."""
    node = pseudo_node()
    d = FakeIpcDevice(name, host=socket.gethostname() + ("" if node is None else f"/{node}"))
    route.set_device(d)
    with config.override(gpu_transport="ipc"):
        yield d
        route.set_device(None)
    world.Barrier()  # no rank removes its files while a peer may still map them
    d.cleanup()


@pytest.fixture
def dev():
    """The stand-in device, all ranks on one node (whatever SBPMPI_IPC_NODE_SIZE says)."""
    with config.override(ipc_node_size=None):
        yield from _ipc_device(f"r{rank}")


def stats(group=None) -> dict:
    """The IPC counters of ``group`` (zeros before its first call)."""
    t = route.transports().get((group or C.WORLD).ranks)
    if t is None:
        return {"calls": 0, "fallbacks": 0, "opens": 0}
    assert not isinstance(t, str), t
    return dict(t.stats)


def _hosts() -> int:
    """How many hosts the world spans (2 under ``run_tests.py --hosts 2``): IPC stays
    inside a host, so a call of the whole world crosses hosts hierarchically."""
    return len({sm.env.node_of(r) for r in range(size)})


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


def test_subgroups_and_mixed_arrays(chk, dev):
    p = size
    # a sub-group: its own node communicator
    g = C.new_group(list(range(p))[::-1])
    x = dev.array(np.full(4, float(rank + 1)))
    C.all_reduce(x, group=g)
    chk.same(x.get(), np.full(4, p * (p + 1) / 2), "all_reduce on a reversed group")
    chk.true(stats(g)["calls"] == 1, "the group has its own transport")
    # host and device arrays mixed: the MPI path, on every rank alike (counted by WORLD's
    # transport, built by a first call that takes IPC)
    w = dev.array(np.ones(2))
    C.all_reduce(w)
    chk.same(w.get(), np.full(2, float(p)), "all_reduce on WORLD")
    before = stats()["fallbacks"]
    out = dev.empty(p, np.float64)
    C.all_gather(out, np.array([float(rank)]))
    chk.same(out.get(), np.arange(float(p)), "host in, device out")
    chk.true(stats()["fallbacks"] == before + 1, "host in: fell back together")
    if rank == 0:  # one rank's array is not exportable: every rank falls back
        y = FakeCudaArray.from_numpy(np.full(3, 1.0))
    else:
        y = dev.array(np.full(3, 1.0))
    before = stats()["fallbacks"]
    C.all_reduce(y)
    chk.same(y.get(), np.full(3, float(p)), "one rank not exportable")
    chk.true(stats()["fallbacks"] == before + 1, "fell back together")


def test_info_names_ipc(chk, dev):
    x = dev.array(np.ones(2))
    C.all_reduce(x)
    info = C.info()
    chk.true(info["gpu_transport"] == "ipc", str(info))
    chk.true(str(list(range(size))) in info["ipc"], str(info["ipc"]))


@pytest.fixture
def pseudo_nodes():
    """Nodes of two ranks (the setting ipc_node_size=2): the hierarchical path on one machine."""
    with config.override(ipc_node_size=2):
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
        chk.true(isinstance(t, Hierarchical) and t.stats["calls"] >= 18, str(t))
    else:  # 3 ranks: nodes of 2 and 1: no hierarchy, the MPI path
        chk.true(isinstance(t, str) and "same number" in t, str(t))


# ----------------------------------------------------------------------------- CUDA's IPC rules
# The stand-in keeps CUDA's rules (a second open of a handle in one process adds a reference,
# a close more than the opens is refused) and records an allocation freed while a peer maps
# it. These tests run the calls
# boxing makes on a mesh (the 2x2 mesh's rows {0,1}, {2,3}, columns {0,2}, {1,3}, WORLD)
# over arrays packed in the same allocations, flat and across pseudo-nodes.


@pytest.fixture(params=["flat", "pseudo-nodes"])
def rules_dev(request, monkeypatch):
    """The stand-in device, on one node or on pseudo-nodes of two ranks."""
    with sm.config.override(ipc_node_size=None if request.param == "flat" else 2):
        yield from _ipc_device(f"{request.param[0]}{rank}")


def _mesh_groups(p: int) -> list[C.Group]:
    """Rows and columns of a (2, p/2) mesh (of (1, p) for odd p), WORLD and WORLD reversed,
    in one order on every rank."""
    mesh = np.arange(p).reshape((2, p // 2) if p % 2 == 0 else (1, p))
    lists = [list(r) for r in mesh] + [list(c) for c in mesh.T] + [
        list(range(p)), list(range(p))[::-1]]
    return [C.new_group([int(r) for r in ranks]) for ranks in lists]


def _boxing_calls(chk, dev: FakeIpcDevice, g: C.Group, rnd: int) -> None:
    """The calls boxing makes on one mesh axis, on arrays of the shared allocations."""
    q, me = g.size, g.rank
    ranks = list(g.ranks)
    n = 3 * q + 1
    xs = [data(r, n, np.float32, 20 + rnd) for r in ranks]
    x = dev.array(xs[me], offset_pad=8 * me + 8)
    C.all_reduce(x, group=g)
    chk.same(x.get(), np.add.reduce(np.stack(xs), axis=0), f"all_reduce on {ranks} round {rnd}")
    out = dev.empty((q, n), np.float32)
    C.all_gather(out, dev.array(xs[me]), group=g)
    chk.same(out.get(), np.stack(xs), f"all_gather on {ranks} round {rnd}")
    y = dev.empty(3, np.float32)
    big = [data(r, 3 * q, np.float32, 30 + rnd) for r in ranks]
    C.reduce_scatter(y, dev.array(big[me]), op=ReduceOp.MAX, group=g)
    chk.same(y.get(), np.maximum.reduce(np.stack(big), axis=0)[3 * me:3 * me + 3],
             f"reduce_scatter on {ranks} round {rnd}")
    out = dev.empty(3 * q, np.float32)
    C.all_to_all(out, dev.array(big[me]), group=g)
    chk.same(out.get(), np.concatenate([b[3 * me:3 * me + 3] for b in big]),
             f"all_to_all on {ranks} round {rnd}")


def test_mesh_groups_share_the_peer_allocations(chk, rules_dev):
    """Every group maps the same peer allocations: each holds one reference at a time in a
    process (the cache opens it once), is closed as often as it was opened, and no
    allocation is freed while a peer maps it."""
    dev = rules_dev
    groups = _mesh_groups(size)
    for rnd in range(3):
        for g in groups:
            if g.is_member():
                _boxing_calls(chk, dev, g, rnd)
        world.Barrier()
        chk.true(not dev.mapped_by_peers(), f"round {rnd}: peers still map this rank's "
                 f"allocations after the calls returned: {dev.mapped_by_peers()}")
        world.Barrier()  # every rank has looked before any frees
        dev.free()  # the arrays are gone: the pool gives their memory back (free_all_blocks)
        chk.true(not dev.violations, f"round {rnd}: {dev.violations}")
        chk.true(not dev.opened, f"round {rnd}: mappings left open: {len(dev.opened)}")
        chk.true(dev.most_refs <= 1, f"round {rnd}: a mapping held {dev.most_refs} references")
    ipc = [t.stats for t in route.transports().values() if not isinstance(t, str)]
    opens, closes = sum(s["opens"] for s in ipc), sum(s["closes"] for s in ipc)
    chk.true(opens == closes and sum(s["calls"] for s in ipc) > 0, f"IPC counters: {ipc}")


def test_run_collectives_asks_which_transport_carried_the_call(chk, dev):
    """The backend helper of test_comm_collectives, with the IPC route on (as with
    SBPMPI_GPU_TRANSPORT=ipc) and the MPI taken as not CUDA-aware (the staged case)."""
    from comm_helpers import run_collectives

    with sm.config.override(cuda_aware=False):
        run_collectives(chk, dev.array, lambda a: a.get(), False)
    chk.true(stats()["calls"] > 0, f"IPC carried some calls: {stats()}")


def _boom(*args, **kwargs):
    raise MemoryError("out of memory (injected)")


def _raised_everywhere(fn) -> list[tuple[str, str]]:
    """(type name, message) of what ``fn`` raised on each rank ("no error" if nothing).
    Messages may differ (each names its own path), the cause must reach them all."""
    return world.allgather(raised_by(fn))


@pytest.mark.timeout(60)
def test_a_scratch_allocation_failing_on_one_rank_raises_on_every_rank(rules_dev, monkeypatch):
    dev = rules_dev
    if rank == size - 1:
        monkeypatch.setattr(dev, "scratch", _boom)
    xs = [data(r, 9, np.float32, 40) for r in range(size)]
    x = dev.array(xs[rank])
    every = _raised_everywhere(lambda: C.all_reduce(x))
    t = route.transports()[C.WORLD.ranks]
    if size == 1 or isinstance(t, str):  # no scratch (one rank), or no IPC (3 ranks on nodes of 2)
        assert all(kind == "no error" for kind, _ in every), every
        np.testing.assert_array_equal(x.get(), np.add.reduce(np.stack(xs), axis=0))
    else:
        assert all(kind == "IpcError" and "MemoryError: out of memory (injected)" in msg
                   for kind, msg in every), every


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call", ["all_reduce", "all_gather"])
def test_a_hierarchical_leg_failing_on_one_rank_raises_on_every_rank(pseudo_nodes, monkeypatch,
                                                                     call):
    """The inter-node leg's host buffer fails on rank 0 only: its partner on the other node
    (and every rank) raises instead of waiting in the inter-node exchange."""
    from sbpmpi.comm.buffers import PINNED_POOL

    dev = pseudo_nodes
    xs = [data(r, 2 * size + 1, np.float32, 41) for r in range(size)]

    def run() -> np.ndarray:
        x = dev.array(xs[rank])
        if call == "all_reduce":
            C.all_reduce(x)
            return x.get()
        out = dev.empty((size, x.size), np.float32)
        C.all_gather(out, x)
        return out.get()

    want = np.add.reduce(np.stack(xs), axis=0) if call == "all_reduce" else np.stack(xs)
    np.testing.assert_array_equal(run(), want)  # builds the transport
    hier = isinstance(route.transports()[C.WORLD.ranks], Hierarchical)
    if hier and rank == 0:
        monkeypatch.setattr(PINNED_POOL, "acquire", _boom)
    every = _raised_everywhere(run)
    if hier:
        assert all(kind == "IpcError" and "MemoryError: out of memory (injected)" in msg
                   for kind, msg in every), every
    else:
        assert all(kind == "no error" for kind, _ in every), every


@pytest.mark.parametrize("op", [ReduceOp.MAX, ReduceOp.MIN])
def test_nan_propagates_in_max_and_min_flat_and_hierarchical(chk, rules_dev, op):
    """NaN held by one rank (at its own index) wins, as in np.maximum.reduce, on every path."""
    dev = rules_dev
    n = size + 3
    for dt in (np.float32, np.float64, np.float16):
        xs = [data(r, n, dt, 42) for r in range(size)]
        for r, x in enumerate(xs):
            x[r] = np.nan
        xs[0][-1] = np.inf if op is ReduceOp.MAX else -np.inf
        x = dev.array(xs[rank])
        C.all_reduce(x, op=op)
        chk.same(x.get(), UFUNC[op].reduce(np.stack(xs), axis=0), f"all_reduce {op} {dt}")


# ----------------------------------------------------------------------------- the route
# Every rank of a group takes one route for a call (the MPI path, IPC on one node, or
# hierarchical IPC), decided together before anyone enters a phase.


def _ipc_group() -> IpcTransport | Hierarchical | None:
    """WORLD's IPC transport, or None where it has none (3 ranks on nodes of 2)."""
    t = route.transports().get(C.WORLD.ranks)
    return None if t is None or isinstance(t, str) else t


def _every_vector_call(chk, mk, host, what: str) -> None:
    """all_reduce, all_gather(_v), reduce_scatter(_v), all_to_all(_v) and broadcast on the
    arrays ``mk`` makes on this rank, compared with NumPy."""
    p = size
    xs = [data(r, 2 * p + 1, np.float64, 50) for r in range(p)]
    x = mk(xs[rank])
    C.all_reduce(x)
    chk.same(host(x), np.add.reduce(np.stack(xs), axis=0), f"{what}: all_reduce")
    x = mk(xs[rank])
    C.all_reduce(x, op=ReduceOp.AVG)
    chk.same(host(x), np.add.reduce(np.stack(xs), axis=0) / p, f"{what}: all_reduce avg")
    out = mk(np.zeros((p, xs[0].size)))
    C.all_gather(out, mk(xs[rank]))
    chk.same(host(out), np.stack(xs), f"{what}: all_gather")
    counts = [(r + 1) % 3 for r in range(p)]
    v = [data(r, counts[r], np.float64, 51) for r in range(p)]
    out = mk(np.zeros(sum(counts)))
    C.all_gather_v(out, mk(v[rank]), counts)
    chk.same(host(out), np.concatenate(v), f"{what}: all_gather_v")
    big = [data(r, 3 * p, np.float64, 52) for r in range(p)]
    y = mk(np.zeros(3))
    C.reduce_scatter(y, mk(big[rank]))
    chk.same(host(y), np.add.reduce(np.stack(big), axis=0)[3 * rank:3 * rank + 3],
             f"{what}: reduce_scatter")
    tot = [data(r, sum(counts), np.float64, 53) for r in range(p)]
    y = mk(np.zeros(counts[rank]))
    C.reduce_scatter_v(y, mk(tot[rank]), counts)
    off = sum(counts[:rank])
    chk.same(host(y), np.add.reduce(np.stack(tot), axis=0)[off:off + counts[rank]],
             f"{what}: reduce_scatter_v")
    out = mk(np.zeros(3 * p))
    C.all_to_all(out, mk(big[rank]))
    chk.same(host(out), np.concatenate([b[3 * rank:3 * rank + 3] for b in big]),
             f"{what}: all_to_all")
    oc = [counts[rank]] * p
    ins = [data(r, counts[r] * p, np.float64, 54) for r in range(p)]
    out = mk(np.zeros(sum(counts)))
    C.all_to_all_v(out, counts, mk(ins[rank]), oc)
    chk.same(host(out), np.concatenate([ins[r][rank * counts[r]:(rank + 1) * counts[r]]
                                        for r in range(p)]), f"{what}: all_to_all_v")
    x = mk(xs[rank])
    C.broadcast(x, src=p - 1)
    chk.same(host(x), xs[p - 1], f"{what}: broadcast")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("checked", [False, True], ids=["plain", "checked"])
def test_host_and_device_arrays_on_different_ranks(chk, rules_dev, checked):
    """Rank 0 passes host arrays, the others device arrays (then the other way round), on
    the first call of the group (no transport yet) and after: every rank takes the MPI path
    together (staged on the device ranks) and every value is NumPy's."""
    dev = rules_dev
    with sm.config.override(comm_check=checked):
        for rnd, host_rank in enumerate([0, 0, size - 1]):
            def mk(a, host_rank=host_rank):
                return np.array(a, copy=True) if rank == host_rank else dev.array(a)

            def host(a):
                return a if isinstance(a, np.ndarray) else a.get()

            _every_vector_call(chk, mk, host, f"round {rnd}, host arrays on rank {host_rank}")
            _every_vector_call(chk, dev.array, lambda a: a.get(), f"round {rnd}, all on device")
    chk.true(size == 1 or _ipc_group() is None or _ipc_group().stats["calls"] > 0,  # type: ignore[union-attr]
             "IPC carried the all-device calls")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("counts_of", [
    lambda p: [1] + [0] * (p - 1),  # one row split over the ranks (an S(0)->B of one row)
    lambda p: [0] * (p - 1) + [2],
    lambda p: [(r % 2) * 3 for r in range(p)],  # only odd ranks hold rows
    lambda p: [0] * p,
], ids=["first", "last", "odd", "none"])
def test_empty_local_blocks(chk, rules_dev, counts_of):
    """Counts where some ranks, or every rank of one local index (pseudo-nodes), hold
    nothing: the same number of phases and barriers on every rank, and NumPy's values."""
    dev = rules_dev
    counts = counts_of(size)
    for rnd in range(2):  # the first call builds the transport
        v = [np.full(counts[r], r + 1.0) for r in range(size)]
        out = dev.array(np.full(sum(counts) + 1, -1.0))
        C.all_gather_v(out, dev.array(v[rank]), counts)
        chk.same(out.get(), np.concatenate(v + [np.array([-1.0])]), f"all_gather_v round {rnd}")
        tot = [data(r, sum(counts), np.float32, 55) for r in range(size)]
        y = dev.empty(counts[rank], np.float32)
        C.reduce_scatter_v(y, dev.array(tot[rank]), counts)
        off = sum(counts[:rank])
        chk.same(y.get(), np.add.reduce(np.stack(tot), axis=0)[off:off + counts[rank]],
                 f"reduce_scatter_v round {rnd}")
        oc = [counts[rank]] * size
        ins = [np.arange(counts[r] * size, dtype=np.int32) + 100 * r for r in range(size)]
        out = dev.empty(sum(counts), np.int32)
        C.all_to_all_v(out, counts, dev.array(ins[rank]), oc)
        chk.same(out.get(), np.concatenate([ins[r][rank * counts[r]:(rank + 1) * counts[r]]
                                            for r in range(size)]), f"all_to_all_v round {rnd}")
        x = dev.array(np.full(counts[0], float(rank)))
        C.broadcast(x, src=0)
        chk.same(x.get(), np.zeros(counts[0]), f"broadcast round {rnd}")
        x = dev.array(np.full(sum(counts), float(rank)))
        C.all_reduce(x)
        chk.same(x.get(), np.full(sum(counts), size * (size - 1) / 2), f"all_reduce round {rnd}")


@pytest.mark.timeout(60)
def test_one_rank_that_cannot_export_sends_the_group_down_the_mpi_path(chk, rules_dev,
                                                                       monkeypatch):
    """One rank's export fails (cudaIpcGetMemHandle refusing), then one rank's array lies in
    memory IPC cannot share (cudaMallocAsync): the whole group takes the MPI path, on one
    node and across pseudo-nodes, and the next call takes IPC again."""
    dev = rules_dev
    w = dev.array(np.ones(6))
    C.all_reduce(w)  # builds the transport
    chk.same(w.get(), np.full(6, float(size)), "first all_reduce")
    t = _ipc_group()
    before = t.stats["fallbacks"] if t is not None else 0
    n = 600_000  # an allocation of its own: exported in the call
    if rank == 0:
        def refuse(base: int) -> bytes:
            raise RuntimeError("cudaIpcGetMemHandle failed (injected)")
        monkeypatch.setattr(dev, "export", refuse)
    x = dev.array(np.full(n, rank + 1.0))
    C.all_reduce(x)
    chk.same(x.get()[[0, -1]], np.full(2, size * (size + 1) / 2), "export failing on rank 0")
    monkeypatch.undo()
    y = dev.array(np.full(5, rank + 1.0), ipc=rank != size - 1)  # stream-ordered on one rank
    out = dev.empty((size, 5), np.float64)
    C.all_gather(out, y)
    chk.same(out.get(), np.repeat(np.arange(1.0, size + 1)[:, None], 5, axis=1),
             "one array in memory IPC cannot share")
    if t is not None and size > 1:
        chk.true(t.stats["fallbacks"] == before + 2, f"fell back twice together: {t.stats}")
        calls = t.stats["calls"]
        z = dev.array(np.ones(3))
        C.all_reduce(z)
        chk.same(z.get(), np.full(3, float(size)), "IPC again")
        chk.true(t.stats["calls"] == calls + 1, f"the next call took IPC: {t.stats}")


@pytest.mark.timeout(60)
def test_copies_out_of_peer_mappings_complete_before_the_mappings_close(rules_dev,
                                                                        monkeypatch):
    """A move fails after a copy out of a peer's mapping was queued: the copy completes
    before the mapping closes and before any barrier lets the peer free its buffer, and
    every rank of the node raises with the cause."""
    dev = rules_dev
    xs = [data(r, 9, np.float32, 56) for r in range(size)]
    x = dev.array(xs[rank])
    C.all_reduce(x)  # builds the transport
    t = _ipc_group()
    if rank == 1:
        def broken(*args, **kwargs):
            raise RuntimeError("reduction kernel failed (injected)")
        monkeypatch.setattr(dev, "reduce", broken)
    y = dev.array(xs[rank])
    got = _raised_everywhere(lambda: C.all_reduce(y))
    violations = world.allgather(dev.violations)
    assert not any(violations), violations
    if t is None or size == 1:  # no IPC: no device reduction at all
        assert all(kind == "no error" for kind, _ in got), got
        np.testing.assert_array_equal(y.get(), np.add.reduce(np.stack(xs), axis=0))
    else:  # every rank (across pseudo-nodes too, through the inter-node leg) names the cause
        assert all(kind == "IpcError" and "reduction kernel failed (injected)" in msg
                   for kind, msg in got), got
        assert not t.mapped, t.mapped


@pytest.mark.timeout(60)
def test_a_failed_close_is_remembered(chk, rules_dev):
    """A close that fails leaves the mapping open in CUDA: the call raises on every rank of
    the node, and the next call that reads that allocation uses the open mapping instead of
    opening its handle again (which would add a reference the cache never closes), then
    closes it."""
    dev = rules_dev
    xs = [data(r, 7, np.float64, 57) for r in range(size)]
    x = dev.array(xs[rank])
    C.all_reduce(x)  # builds the transport
    t = _ipc_group()
    dev.failing_closes = 1  # this rank's next close fails, leaving the mapping open
    y = dev.array(xs[rank])
    got = _raised_everywhere(lambda: C.all_reduce(y))
    reads_peers = t is not None and size > 1
    if reads_peers:
        assert got[rank][0] == "IpcError" and "cudaIpcCloseMemHandle failed" in got[rank][1], got
        assert len(dev.opened) == 1 and len(t.mapped) == 1  # type: ignore[union-attr]
    else:
        assert got[rank][0] == "no error", got
    dev.failing_closes = 0
    z = dev.array(xs[rank])  # the same allocation: the remembered mapping serves
    C.all_reduce(z)
    chk.same(z.get(), np.add.reduce(np.stack(xs), axis=0), "the call after a failed close")
    chk.true(not dev.opened and (t is None or not t.mapped), "every mapping closed at last")
    chk.true(not dev.violations, str(dev.violations))


@pytest.mark.timeout(60)
def test_arrays_carved_from_one_pool_allocation(chk, rules_dev):
    """A block given back to the pool is carved into new arrays (as CuPy splits a freed
    block): two arrays of one allocation, at offsets the exported handle never saw, read
    by peers in one call (input and output), with the handle made once."""
    dev = rules_dev
    big = dev.array(np.zeros(300_000))  # 2.4 MB: an allocation of its own
    C.all_reduce(big)
    aid = dev.allocation(dev.pointer(big)).id
    exports = world.allgather(sum(1 for e in dev.log if e == ("export", aid)))
    dev.give_back(big)
    del big
    xs = [data(r, 1000 + r, np.float64, 58) for r in range(size)]
    x = dev.array(xs[rank])  # carved at the start of the freed block
    out = dev.empty(sum(len(v) for v in xs), np.float64)  # carved right after it
    chk.true(dev.allocation(dev.pointer(x)).id == dev.allocation(dev.pointer(out)).id == aid,
             "both arrays lie in the one allocation")
    C.all_gather_v(out, x, [len(v) for v in xs])
    chk.same(out.get(), np.concatenate(xs), "all_gather_v of arrays of one allocation")
    y = dev.array(data(rank, 4, np.float64, 59))
    C.all_reduce(y)
    chk.same(y.get(), sum(data(r, 4, np.float64, 59) for r in range(size)), "all_reduce after")
    again = world.allgather(sum(1 for e in dev.log if e == ("export", aid)))
    chk.true(again == exports, f"the allocation's handle was made once: {exports} {again}")
    chk.true(not dev.violations and not dev.opened, str(dev.violations))


# ----------------------------------------------------------------------------- every rank alike
# Arguments that differ by rank, and failures in the last phase, as MPI and the staged path
# see them: right values, or an error on every rank (issue 41).


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra", [2, -1], ids=["sends-more", "sends-fewer"])
def test_all_to_all_v_counts_that_disagree_raise_on_every_rank(dev, extra):
    """Group rank 0 sends the last rank ``extra`` elements more than that rank's
    ``out_counts[0]``, whose block is the last of its ``out``: every rank raises checked
    mode's ValueError, before any copy (the IPC copy took the sender's count and wrote past
    ``out``, into the next array of the allocation, and every rank returned)."""
    if _hosts() > 1:
        pytest.skip("the world spans hosts: all_to_all_v takes MPI across them, whose "
                    "count mismatches checked mode finds (SBPMPI_COMM_CHECK)")
    p = size
    sent = [[i + j + 1 for j in range(p)] for i in range(p)]  # what i sends j, as j expects
    ic = list(sent[rank])
    if rank == 0:
        ic[p - 1] += extra
    oc = [sent[i][rank] for i in range(p)]
    width = 32  # 256 bytes: `out` fills its pool slot, `guard` is the next one
    od = [width - oc[0]] + [sum(oc[1:i]) for i in range(1, p)]  # rank 0's block last
    arr = dev.array(np.arange(sum(ic), dtype=np.float64) + 100 * rank)
    out = dev.array(np.full(width, -1.0))
    guard = dev.array(np.full(8, -2.0))
    assert dev.pointer(guard) == dev.pointer(out) + 256  # adjacent in one allocation
    with sm.config.override(comm_check=False):  # the IPC path's own check, not checked mode
        got = _raised_everywhere(lambda: C.all_to_all_v(out, oc, arr, ic, out_displs=od))
    want = (f"all_to_all_v: group rank 0 sends in_counts[{p - 1}] = {sent[0][p - 1] + extra} "
            f"elements to group rank {p - 1}, which expects out_counts[0] = {sent[0][p - 1]}")
    assert got == [("ValueError", want)] * p, got
    np.testing.assert_array_equal(out.get(), np.full(width, -1.0))  # nothing copied
    np.testing.assert_array_equal(guard.get(), np.full(8, -2.0))
    assert not dev.opened and not dev.violations
    ic[p - 1] -= extra * (rank == 0)  # the counts agree again: the call goes through IPC
    arr = dev.array(np.arange(sum(ic), dtype=np.float64) + 100 * rank)
    calls = stats()["calls"]
    C.all_to_all_v(out, oc, arr, ic, out_displs=od)
    starts = [sum(sent[i][:rank]) for i in range(p)]  # where i's block for this rank starts
    for i in range(p):
        np.testing.assert_array_equal(out.get()[od[i]:od[i] + oc[i]],
                                      np.arange(starts[i], starts[i] + oc[i]) + 100.0 * i)
    assert stats()["calls"] == calls + 1


@pytest.mark.timeout(60)
def test_all_gather_v_with_displacements_that_differ_by_rank(chk, rules_dev):
    """Each rank places the blocks in an order of its own (its rotation of the ranks, with
    a gap after each block), as MPI's Allgatherv allows: every rank gets every block at its
    own places, flat and across pseudo-nodes (whose node leg read a peer's blocks at this
    rank's displacements, where the peer had written them at its own)."""
    dev, p = rules_dev, size
    counts = [r % 3 + 1 for r in range(p)]
    displs, end = [0] * p, 0
    for r in [(rank + k) % p for k in range(p)]:
        displs[r], end = end, end + counts[r] + 1
    v = [data(r, counts[r], np.float64, 61) for r in range(p)]
    want = np.full(end, -1.0)
    for r in range(p):
        want[displs[r]:displs[r] + counts[r]] = v[r]
    for rnd in range(2):  # the first call builds the transport
        out = dev.array(np.full(end, -1.0))
        C.all_gather_v(out, dev.array(v[rank]), counts, displs)
        chk.same(out.get(), want, f"all_gather_v with this rank's displacements, round {rnd}")
    t = _ipc_group()
    pseudo = config.ipc_node_size.value == 2
    if _hosts() > 1:  # real hosts: hierarchical whatever the pseudo-nodes
        chk.true(isinstance(t, Hierarchical), str(t))
    elif pseudo and p == 4:  # two pseudo-nodes of two: hierarchical
        chk.true(isinstance(t, Hierarchical) and t.stats["calls"] >= 2, str(t))
    elif not pseudo or p <= 2:  # one node, or one pseudo-node: flat IPC
        chk.true(isinstance(t, IpcTransport) and t.stats["calls"] >= 2, str(t))


@pytest.mark.timeout(60)
def test_a_failure_in_the_last_local_phase_raises_on_every_rank(dev, monkeypatch):
    """The direct all-reduce's last phase is local (each rank copies its reduction back into
    its buffer): that copy failing on the last rank raises on every rank of the node, with
    the cause (it raised on the failing rank only; the others returned)."""
    xs = [data(r, 9, np.float64, 62) for r in range(size)]
    w = dev.array(xs[rank])
    C.all_reduce(w)  # builds the transport
    np.testing.assert_array_equal(w.get(), np.add.reduce(np.stack(xs), axis=0))
    t = _ipc_group()
    x = dev.array(xs[rank])
    if rank == size - 1:
        copy = dev.copy

        def failing_copy(dst: int, src: int, nbytes: int) -> None:
            if dst == dev.pointer(x):  # into the buffer: the copy back from scratch
                raise RuntimeError("cudaMemcpyAsync failed (injected)")
            copy(dst, src, nbytes)
        monkeypatch.setattr(dev, "copy", failing_copy)
    got = _raised_everywhere(lambda: C.all_reduce(x))
    violations = world.allgather(dev.violations)
    assert not any(violations), violations
    if size == 1:  # nothing to copy
        assert got == [("no error", "")], got
        np.testing.assert_array_equal(x.get(), np.add.reduce(np.stack(xs), axis=0))
    elif _hosts() > 1:  # hierarchical across the hosts: the same error on every rank
        assert len(set(got)) == 1 and got[0][0] == "IpcError", got
        assert "RuntimeError: cudaMemcpyAsync failed (injected)" in got[0][1], got
        assert isinstance(t, Hierarchical) and not dev.opened
    else:
        assert all(kind == "IpcError" and f"rank {size - 1}" in msg
                   and "RuntimeError: cudaMemcpyAsync failed (injected)" in msg
                   for kind, msg in got), got
        assert isinstance(t, IpcTransport) and not t.mapped and not dev.opened


def _source_of(dev: FakeIpcDevice, ptr: int, staged: list[np.ndarray]) -> str:
    """Where a copy reads: a node peer's mapping, one of the inter-node leg's pinned host
    buffers (``staged``), or this rank's own memory (device memory, scratch)."""
    if any(b <= ptr < b + o.bytes.nbytes for b, o in dev.opened.items()):
        return "peer"
    if any(h.ctypes.data <= ptr < h.ctypes.data + h.nbytes for h in staged):
        return "host"
    return "own"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", ["peer", "host"])
@pytest.mark.parametrize("call", ["all_reduce", "all_gather_v"])
def test_a_failure_after_the_inter_node_leg_raises_on_every_rank(pseudo_nodes, monkeypatch,
                                                                 call, source):
    """On the last rank, the first copy into the result after the inter-node exchange fails:
    the copy back from host memory (``source="host"``) or of a node peer's block in the last
    node phase (``"peer"``). Every rank of the group, on both nodes, raises the same error,
    naming the failing node's ranks and the cause (the other node returned)."""
    from sbpmpi.comm.buffers import PINNED_POOL

    dev, p = pseudo_nodes, size
    counts = [2 * r + 3 for r in range(p)]  # every block non-empty, uneven
    displs = [sum(counts[:r]) + r for r in range(p)]
    n = sum(counts) + p
    xs = [data(r, 2 * p + 1 if call == "all_reduce" else counts[r], np.float64, 63)
          for r in range(p)]
    if call == "all_reduce":
        want = np.add.reduce(np.stack(xs), axis=0)
    else:
        want = np.full(n, -1.0)
        for r in range(p):
            want[displs[r]:displs[r] + counts[r]] = xs[r]
    into = [0, 0]  # the result's device bytes in the current call

    def run() -> np.ndarray:
        x = dev.array(xs[rank])
        res = x if call == "all_reduce" else dev.array(np.full(n, -1.0))
        into[:] = [dev.pointer(res), dev.pointer(res) + res.size * res.dtype.itemsize]
        if call == "all_reduce":
            C.all_reduce(x)
        else:
            C.all_gather_v(res, x, counts, displs)
        return res.get()

    np.testing.assert_array_equal(run(), want)  # builds the transport
    t = route.transports()[C.WORLD.ranks]
    if not isinstance(t, Hierarchical):  # one (pseudo-)node, or nodes of 2 and 1
        pytest.skip(f"no hierarchical path at {p} ranks on pseudo-nodes of 2 ({t})")
    fired: list[int] = []
    if rank == p - 1:
        copy, acquire = dev.copy, PINNED_POOL.acquire
        staged: list[np.ndarray] = []

        def recorded_acquire(nbytes: int) -> np.ndarray:
            staged.append(acquire(nbytes))
            return staged[-1]

        def failing_copy(dst: int, src: int, nbytes: int) -> None:
            if (not fired and into[0] <= dst < into[1]
                    and _source_of(dev, src, staged) == source):
                fired.append(src)
                raise RuntimeError(f"cudaMemcpyAsync from {source} failed (injected)")
            copy(dst, src, nbytes)
        monkeypatch.setattr(dev, "copy", failing_copy)
        monkeypatch.setattr(PINNED_POOL, "acquire", recorded_acquire)
    got = _raised_everywhere(run)
    assert world.allgather(bool(fired)) == [False] * (p - 1) + [True]
    violations = world.allgather(dev.violations)
    assert not any(violations), violations
    kind, msg = got[-1]
    assert kind == "IpcError" and f"the node of group ranks {p - 2}, {p - 1}: " in msg, got
    assert f"RuntimeError: cudaMemcpyAsync from {source} failed (injected)" in msg, got
    assert all(g == got[-1] for g in got), got  # the same error on every rank
    assert not t.mapped and not dev.opened, (t.mapped, dev.opened)
    monkeypatch.undo()
    np.testing.assert_array_equal(run(), want)  # the transport still works
