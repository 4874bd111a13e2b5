"""Serial tests of the GPU transport: copy schedules against NumPy, the IPC protocol's
handle + offset bookkeeping, mapping cache and order of synchronisations and barriers
(ranks as threads over a stand-in device), and the transport selection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from comm_helpers import UFUNC, data, reduction_ok
from fake_ipc import FakeIpcDevice

import sbpmpi as sm
from sbpmpi.comm import ReduceOp, cuda_aware
from sbpmpi.comm.gpu import route, select
from sbpmpi.comm.gpu import schedule as S
from sbpmpi.comm.gpu.device import Allocation
from sbpmpi.comm.gpu.ipc import Buffer, IpcError, IpcTransport, make_offer
from sbpmpi.comm.gpu.mappings import Lease, MappingCache

# ----------------------------------------------------------------------------- schedules


def _simulate(p: int, scheds: list[S.Schedule], mem: list[dict[str, np.ndarray]],
              dtype: np.dtype, op: ReduceOp | None = None) -> None:
    """Run every rank's schedule phase by phase, checking that no rank reads, in a phase,
    bytes another rank writes in that phase. ``mem[r][role]``: uint8 buffers (aliases
    for in-place calls)."""
    nph = max((len(s.phases) for s in scheds), default=0)
    for ph in range(nph):
        moves = [(r, mv) for r in range(p) if ph < len(scheds[r].phases)
                 for mv in scheds[r].phases[ph]]
        writes = [(r, mem[r][mv.dst_buf], mv.dst_off, mv.nbytes) for r, mv in moves]
        for r, mv in moves:
            if mv.src == r:
                continue
            src = mem[mv.src][mv.src_buf]
            for w, wbuf, off, n in writes:
                if w == mv.src and np.shares_memory(wbuf, src):
                    assert mv.src_off + mv.nbytes <= off or off + n <= mv.src_off, (
                        f"phase {ph}: rank {r} reads bytes {mv.src_off}+{mv.nbytes} of rank "
                        f"{mv.src} while it writes {off}+{n}")
        for r, mv in moves:
            s = mem[mv.src][mv.src_buf][mv.src_off:mv.src_off + mv.nbytes]
            d = mem[r][mv.dst_buf][mv.dst_off:mv.dst_off + mv.nbytes]
            assert s.size == d.size == mv.nbytes, f"move {mv} is out of bounds"
            if mv.kind == S.COPY:
                d[...] = s
            else:
                dv = d.view(dtype)
                UFUNC[op](dv, s.view(dtype), out=dv)


def _tmp(s: S.Schedule) -> np.ndarray:
    return np.zeros(max(s.tmp_bytes, 1), np.uint8)


SIZES = [1, 2, 3, 4, 5]


@pytest.mark.parametrize("p", SIZES)
def test_all_gather_v_schedule(p):
    counts = [(3 * r + 1) % 4 for r in range(p)]
    displs = [sum(counts[:r]) + 2 * r for r in range(p)]
    total = max(d + c for c, d in zip(counts, displs)) + 1
    ins = [data(r, counts[r], np.float64, 1) for r in range(p)]
    mem = [{"in": ins[r].view(np.uint8), "out": np.full(total, -1.0).view(np.uint8)}
           for r in range(p)]
    sch = [S.all_gather_v(p, r, [c * 8 for c in counts], [d * 8 for d in displs])
           for r in range(p)]
    _simulate(p, sch, mem, np.dtype(np.float64))
    want = np.full(total, -1.0)
    for r in range(p):
        want[displs[r]:displs[r] + counts[r]] = ins[r]
    for r in range(p):
        np.testing.assert_array_equal(mem[r]["out"].view(np.float64), want)
        assert len(sch[r].phases) <= 1 and sch[r].tmp_bytes == 0


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.bool_, np.float16, np.complex64])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PROD])
def test_reduce_scatter_v_and_all_reduce_schedules(p, dtype, op):
    if not reduction_ok(dtype, op):
        pytest.skip("not a reduction NumPy defines")
    dt = np.dtype(dtype)
    counts = [(r + 2) % 3 + (r == 0) for r in range(p)]
    n = sum(counts)
    ins = [data(r, n, dt, 2) for r in range(p)]
    want = UFUNC[op].reduce(np.stack(ins), axis=0, dtype=dt)
    outs = [np.zeros(c, dt) for c in counts]
    mem = [{"in": ins[r].copy().view(np.uint8), "out": outs[r].view(np.uint8)}
           for r in range(p)]
    sch = [S.reduce_scatter_v(p, r, [c * dt.itemsize for c in counts]) for r in range(p)]
    _simulate(p, sch, mem, dt, op)
    off = 0
    for r in range(p):
        np.testing.assert_array_equal(outs[r], want[off:off + counts[r]])
        off += counts[r]
    for count in (0, 1, n, 4 * p + 3):
        ins = [data(r, count, dt, 3) for r in range(p)]
        want = UFUNC[op].reduce(np.stack(ins), axis=0, dtype=dt)
        for fn in (S.all_reduce, S.all_reduce_direct):
            sch = [fn(p, r, count, dt.itemsize) for r in range(p)]
            bufs = [x.copy() for x in ins]
            mem = []
            for r in range(p):
                b = bufs[r].view(np.uint8)
                mem.append({"in": b, "out": b, "tmp": _tmp(sch[r])})
            _simulate(p, sch, mem, dt, op)
            for r in range(p):
                np.testing.assert_array_equal(bufs[r], want, err_msg=f"{fn.__name__} rank {r}")
                if fn is S.all_reduce:  # reads (p-1)/p of the buffer twice, not p-1 buffers
                    assert sch[r].peer_reads(r) <= 2 * (count // p + 1) * (p - 1) * dt.itemsize
                elif sch[r].phases:  # the last phase is local, closed by a barrier too
                    assert sch[r].barriers() == len(sch[r].phases) == 2
                    assert all(mv.src == r for mv in sch[r].phases[-1])


@pytest.mark.parametrize("p", SIZES)
def test_all_to_all_v_and_broadcast_schedules(p):
    sc = [[(i + 2 * j) % 3 for j in range(p)] for i in range(p)]  # rank i sends sc[i][j] to j
    sd = [[sum(sc[i][:j]) + j for j in range(p)] for i in range(p)]  # with gaps
    ins = [data(i, sd[i][-1] + sc[i][-1] + 1, np.int32, 4) for i in range(p)]
    outs = []
    mem = []
    rd = []
    for j in range(p):
        oc = [sc[i][j] for i in range(p)]
        d = [sum(oc[:i]) for i in range(p)]
        rd.append(d)
        outs.append(np.zeros(sum(oc), np.int32))
        mem.append({"in": ins[j].view(np.uint8), "out": outs[j].view(np.uint8)})
    sch = [S.all_to_all_v(p, j, [[c * 4 for c in row] for row in sc],
                          [[d * 4 for d in row] for row in sd], [d * 4 for d in rd[j]])
           for j in range(p)]
    _simulate(p, sch, mem, np.dtype(np.int32))
    for j in range(p):
        want = np.concatenate([ins[i][sd[i][j]:sd[i][j] + sc[i][j]] for i in range(p)])
        np.testing.assert_array_equal(outs[j], want)
    for root in range(p):
        bufs = [data(r, 7, np.float32, 5) for r in range(p)]
        mem = [{"in": b.view(np.uint8), "out": b.view(np.uint8)} for b in bufs]
        _simulate(p, [S.broadcast(p, r, root, 28) for r in range(p)], mem,
                  np.dtype(np.float32))
        for b in bufs:
            np.testing.assert_array_equal(b, data(root, 7, np.float32, 5))


@pytest.mark.parametrize("nodes,m", [(2, 2), (2, 3), (3, 2)])
def test_the_node_leg_of_all_gather_v_reads_each_peer_at_its_own_displacements(nodes, m):
    """After the cross leg, node rank k holds the blocks of the group ranks with local index
    k at *its* displacements; each rank places the blocks in an order of its own (a
    rotation, with gaps). The node leg leaves every rank with every block at its places."""
    from sbpmpi.comm.gpu.hier import node_all_gather_schedule

    p = nodes * m
    members = [[j * m + k for k in range(m)] for j in range(nodes)]
    counts = [(r % 3 + 1) * 8 for r in range(p)]  # bytes
    displs = []
    for me in range(p):
        d, end = [0] * p, 0
        for r in [(me + i) % p for i in range(p)]:
            d[r], end = end, end + counts[r] + 8
        displs.append(d)
    blocks = [data(r, counts[r], np.uint8, 63) + np.uint8(10 * r + 10) for r in range(p)]
    for j in range(nodes):  # one node: its ranks' outs after the cross leg
        ranks = members[j]
        outs = [np.zeros(max(displs[g]) + max(counts) + 8, np.uint8) for g in ranks]
        for k, g in enumerate(ranks):
            for row in members:  # the cross leg wrote the blocks of local index k
                outs[k][displs[g][row[k]]:][:counts[row[k]]] = blocks[row[k]]
        mem = [{"out": o} for o in outs]
        sch = [node_all_gather_schedule(members, k, counts, displs[g],
                                        [[displs[ranks[q]][row[q]] for row in members]
                                         for q in range(m)]) for k, g in enumerate(ranks)]
        _simulate(m, sch, mem, np.dtype(np.uint8))
        for k, g in enumerate(ranks):
            for r in range(p):
                np.testing.assert_array_equal(outs[k][displs[g][r]:][:counts[r]], blocks[r],
                                              err_msg=f"group rank {g}, block of {r}")


COUNTS = [[0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 2], [0, 3, 0, 3, 0], [2, 1, 0, 1, 2]]


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("counts", COUNTS, ids=lambda c: ",".join(map(str, c)))
def test_every_rank_has_the_same_phases_and_barriers(p, counts):
    """Every rank meets every barrier: a schedule's phase count follows from what all ranks
    share (empty phases where a rank has nothing to move), never from its own blocks."""
    from sbpmpi.comm.gpu.hier import node_all_gather_schedule, node_all_reduce_schedules

    c = counts[:p]
    displs = [sum(c[:r]) for r in range(p)]
    builders = {
        "all_gather_v": lambda me: S.all_gather_v(p, me, c, displs),
        "reduce_scatter_v": lambda me: S.reduce_scatter_v(p, me, c),
        "all_to_all_v": lambda me: S.all_to_all_v(p, me, [c] * p, [displs] * p, displs),
        "broadcast": lambda me: S.broadcast(p, me, 0, c[0]),
        "all_reduce": lambda me: S.all_reduce(p, me, sum(c), 4),
        "all_reduce_direct": lambda me: S.all_reduce_direct(p, me, sum(c), 4),
    }
    if p % 2 == 0 and p > 2:  # two nodes of p/2: the hierarchical node schedules
        m = p // 2
        members = [list(range(m)), list(range(m, p))]
        builders["node_all_gather"] = lambda me: node_all_gather_schedule(
            members, me % m, c, displs, [[displs[row[k]] for row in members] for k in range(m)])
        builders["node_all_reduce"] = lambda me: S.Schedule(
            tuple(ph for half in node_all_reduce_schedules(m, me % m, sum(c), 4)
                  for ph in half.phases))
    for name, build in builders.items():
        scheds = [build(me) for me in range(p)]
        assert len({len(sc.phases) for sc in scheds}) == 1, (name, [sc.phases for sc in scheds])
        assert len({sc.barriers() for sc in scheds}) == 1, name


def test_schedule_arguments_are_checked():
    with pytest.raises(ValueError, match="rank 3 is not in a group of 2"):
        S.all_gather_v(2, 3, [1, 1], [0, 1])
    with pytest.raises(ValueError, match="root 2 is not in a group of 2"):
        S.broadcast(2, 0, 2, 8)
    assert S.blocks(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert S.all_reduce(1, 0, 10, 4).phases == ()


# ----------------------------------------------------------------------------- IPC protocol


class ThreadComm:
    """The node communicator for ranks that are threads of this process (mpi4py's calls
    the protocol uses); every call is logged in the rank's device log."""

    def __init__(self, shared: dict[str, Any], rank: int, size: int, log: list) -> None:
        self.shared, self.rank, self.size, self.log = shared, rank, size, log

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def _exchange(self, item: Any) -> list[Any]:
        b: threading.Barrier = self.shared["barrier"]
        slot = self.shared.setdefault("slots", [None] * self.size)
        b.wait()
        slot[self.rank] = item
        b.wait()
        got = list(slot)
        b.wait()
        return got

    def Allgather(self, send: Any, recv: Any) -> None:  # noqa: N802
        self.log.append(("allgather",))
        got = self._exchange(np.array(send[0], copy=True))
        recv[0][...] = np.concatenate(got)

    def Allreduce(self, _inplace: Any, buf: np.ndarray, op: Any = None) -> None:  # noqa: N802
        self.log.append(("barrier",))
        got = self._exchange(buf.copy())
        buf[...] = np.max(got, axis=0)

    def allgather(self, item: Any) -> list[Any]:
        self.log.append(("allgather-objects",))
        return self._exchange(item)

    def Free(self) -> None:  # noqa: N802
        pass


def _threads(p: int, fn: Any) -> list[Any]:
    shared: dict[str, Any] = {"barrier": threading.Barrier(p, timeout=20)}
    devs = [FakeIpcDevice(f"t{r}") for r in range(p)]
    res: list[Any] = [None] * p
    errs: list[BaseException | None] = [None] * p

    def body(r: int) -> None:
        t = IpcTransport(devs[r], ThreadComm(shared, r, p, devs[r].log))  # type: ignore[arg-type]
        try:
            res[r] = fn(r, devs[r], t)
        except BaseException as e:  # noqa: BLE001 - reported below
            errs[r] = e
    ths = [threading.Thread(target=body, args=(r,)) for r in range(p)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(30)
    for d in devs:
        d.cleanup()
    return [e if e is not None else v for v, e in zip(res, errs)]


def _call(t: IpcTransport, dev: FakeIpcDevice, name: str, bufs: dict[str, Buffer],
          ready: bool, make: Callable[[Any], S.Schedule], reads: tuple[str, ...] = ("in",),
          dtype: Any = None, op: ReduceOp | None = None) -> bool:
    """One call as the route makes it: this rank's offer, then the protocol."""
    offer = make_offer(dev, bufs, reads, ready)
    return t.run(name, offer, make, (), None if dtype is None else np.dtype(dtype), op)


def _gather_call(t: IpcTransport, dev: FakeIpcDevice, x: Any, out: Any, p: int) -> bool:
    nb = x.size * x.dtype.itemsize
    return _call(t, dev, "all_gather", {"in": Buffer(dev.pointer(x), nb),
                                        "out": Buffer(dev.pointer(out), p * nb)},
                 dev.owns(x) and dev.owns(out),
                 lambda _: S.all_gather_v(p, t.rank, [nb] * p, [k * nb for k in range(p)]))


def test_ipc_handles_offsets_cache_and_order():
    p = 3

    def body(r: int, dev: FakeIpcDevice, t: IpcTransport) -> Any:
        x = dev.array(np.arange(5.0) + 10 * r, offset_pad=1000 * (r + 1))  # interior pointer
        out = dev.empty(5 * p, np.float64)
        assert dev.pointer(x) - dev.allocation(dev.pointer(x)).base >= 1000
        assert _gather_call(t, dev, x, out, p)
        first = out.get()
        n_log = len(dev.log)
        x2 = dev.array(np.arange(5.0) - r)  # same allocation: no new export, no new open
        assert _gather_call(t, dev, x2, out, p)
        return first, out.get(), dev.log[:n_log], dev.log[n_log:], dict(t.stats)

    res = _threads(p, body)
    for got in res:
        assert not isinstance(got, BaseException), got
        first, second, log1, log2, stats = got
        np.testing.assert_array_equal(first, np.concatenate([np.arange(5.0) + 10 * k
                                                             for k in range(p)]))
        np.testing.assert_array_equal(second, np.concatenate([np.arange(5.0) - k
                                                              for k in range(p)]))
        kinds = [e[0] for e in log1]
        # synchronise, export once, gather the records (the first barrier), open each peer's
        # allocation once, copy, then synchronise, unmap and meet before returning
        assert kinds[:3] == ["sync", "export", "allgather"], kinds
        assert kinds.count("open") == p - 1 and kinds.count("copy") == p
        assert kinds[-(p + 1):] == ["sync"] + ["close"] * (p - 1) + ["barrier"], kinds
        assert max(i for i, k in enumerate(kinds) if k == "copy") < kinds.index("barrier")
        kinds2 = [e[0] for e in log2]
        # the export is kept; the mappings live for one call: opened and closed again
        assert "export" not in kinds2 and kinds2.count("open") == p - 1, kinds2
        assert stats["opens"] == stats["closes"] == 2 * (p - 1), stats
        assert stats["exports"] == 1 and stats["calls"] == 2


def test_ipc_all_reduce_phases_are_separated_by_barriers():
    p = 2

    def body_of(schedule: Callable[..., Any]) -> Callable[..., Any]:
        def body(r: int, dev: FakeIpcDevice, t: IpcTransport) -> Any:
            x = dev.array(np.arange(6, dtype=np.float32) * (r + 1))
            b = Buffer(dev.pointer(x), 24)
            assert _call(t, dev, "all_reduce", {"in": b, "out": b}, True,
                         lambda _: schedule(p, r, 6, 4), ("out",), np.float32, ReduceOp.SUM)
            return x.get(), [e[0] for e in dev.log]

        return body

    for got, kinds in _threads(p, body_of(S.all_reduce)):
        np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32) * 3)
        # phase 0: reduce-scatter; barrier; phase 1: all-gather; barrier
        i0 = kinds.index("allgather")
        mid = kinds.index("barrier")
        assert "reduce" in kinds[i0:mid] and kinds[mid - 1] == "sync"
        assert "copy" in kinds[mid + 1:] and kinds[-3:] == ["sync", "close", "barrier"]

    for got, kinds in _threads(p, body_of(S.all_reduce_direct)):
        np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32) * 3)
        # reads, unmapping, then a barrier, then the local copy back and the final barrier
        # (where a failure of that copy reaches every rank)
        assert kinds.count("barrier") == 2 and kinds.count("allgather") == 1
        mid = kinds.index("barrier")
        assert kinds[mid - 2:mid] == ["sync", "close"] and "reduce" in kinds[:mid]
        assert kinds[mid + 1:] == ["copy", "sync", "barrier"], kinds


def test_ipc_falls_back_together_and_fails_together():
    p = 2

    def fallback(r: int, dev: FakeIpcDevice, t: IpcTransport) -> Any:
        x = dev.array(np.ones(3)) if r == 0 else FakeIpcDevice.__new__(FakeIpcDevice)
        out = dev.empty(6, np.float64)
        ok = r == 0
        nb = 24
        return _call(t, dev, "all_gather", {"in": Buffer(dev.pointer(x) if ok else 0, nb),
                                            "out": Buffer(dev.pointer(out), 2 * nb)}, ok,
                     lambda _: S.all_gather_v(p, r, [nb] * p, [0, nb])), t.stats["fallbacks"]

    assert _threads(p, fallback) == [(False, 1), (False, 1)]

    def broken(r: int, dev: FakeIpcDevice, t: IpcTransport) -> Any:
        if r == 1:
            def no_open(handle: bytes) -> int:
                raise OSError("cudaErrorMapBufferObjectFailed (stand-in)")
            dev.open = no_open  # type: ignore[method-assign]
        x = dev.array(np.ones(3))
        out = dev.empty(6, np.float64)
        return _gather_call(t, dev, x, out, p)

    res = _threads(p, broken)
    assert all(isinstance(e, IpcError) for e in res), res
    # every rank names the rank that failed and its cause
    assert all("node rank 1: OSError: cudaErrorMapBufferObjectFailed" in str(e) for e in res), res


def test_ipc_scratch_failing_on_one_rank_raises_on_every_rank_with_the_cause():
    p = 3

    def body(r: int, dev: FakeIpcDevice, t: IpcTransport) -> Any:
        if r == 1:
            def no_memory(nbytes: int) -> Any:
                raise MemoryError("cudaErrorMemoryAllocation (stand-in)")
            dev.scratch = no_memory  # type: ignore[method-assign]
        x = dev.array(np.arange(4.0))
        b = Buffer(dev.pointer(x), 32)
        try:
            return _call(t, dev, "all_reduce", {"in": b, "out": b}, True,
                         lambda _: S.all_reduce_direct(p, r, 4, 8), ("out",), np.float64,
                         ReduceOp.SUM)
        finally:
            assert not t.mappings.mapped  # released on the way out, even after a failure

    res = _threads(p, body)
    assert all(isinstance(e, IpcError) for e in res), res
    assert all("node rank 1: MemoryError: cudaErrorMemoryAllocation" in str(e) for e in res), res


def test_a_failure_in_the_local_last_phase_raises_on_every_rank():
    """The direct all-reduce's copy back (its last phase, local) fails on rank 1: every rank
    raises with that cause at the final barrier, instead of rank 1 alone."""
    p = 3

    def body(r: int, dev: FakeIpcDevice, t: IpcTransport) -> Any:
        x = dev.array(np.arange(4.0) + r)
        b = Buffer(dev.pointer(x), 32)
        if r == 1:
            copy = dev.copy

            def failing(dst: int, src: int, nbytes: int) -> None:
                if dst == b.ptr:  # the copy back into the buffer
                    raise RuntimeError("cudaMemcpyAsync failed (injected)")
                copy(dst, src, nbytes)
            dev.copy = failing  # type: ignore[method-assign]
        return _call(t, dev, "all_reduce", {"in": b, "out": b}, True,
                     lambda _: S.all_reduce_direct(p, r, 4, 8), ("out",), np.float64,
                     ReduceOp.SUM)

    res = _threads(p, body)
    assert all(isinstance(e, IpcError) for e in res), res
    assert all("node rank 1: RuntimeError: cudaMemcpyAsync failed (injected)" in str(e)
               for e in res), res


def test_the_pieces_of_one_ipc_call():
    """The named pieces of IpcTransport.run, each alone: when a rank stops reading peers
    (its lease goes at that barrier), how many barriers a schedule holds, and where a
    move reads (own buffers as they are; a peer's mapped once per call, at its offset)."""
    from sbpmpi.comm.gpu.ipc import Sources, reads_peers_from

    direct = S.all_reduce_direct(3, 1, 10, 4)
    assert reads_peers_from(direct, 1) == [True, False, False] and direct.barriers() == 2
    two_step = S.all_reduce(3, 1, 10, 4)
    assert reads_peers_from(two_step, 1) == [True, True, False] and two_step.barriers() == 2
    assert S.broadcast(3, 0, 0, 8).barriers() == S.broadcast(3, 1, 0, 8).barriers() == 1
    assert reads_peers_from(S.broadcast(3, 0, 0, 8), 0) == [False, False]
    dev = _StubDevice()
    lease = Lease(MappingCache(dev))  # type: ignore[arg-type]
    recs = np.zeros(2, dtype=[("proc", "<i8"), ("id", "<i8", (2,)), ("off", "<u8", (2,)),
                              ("handle", "u1", (2, 64))])
    recs["proc"][1], recs["id"][1], recs["off"][1] = 77, (5, 5), (16, 48)  # one allocation
    src = Sources(0, {"in": 1000, "out": 2000}, recs, lease)
    assert src.pointer(0, "out") == 2000 and not dev.opened
    base = src.pointer(1, "in") - 16
    assert src.pointer(1, "out") == base + 48 and src.pointer(1, "in") == base + 16
    assert len(dev.opened) == 1 and lease.keys == [(77, 5), (77, 5)]  # one open, two refs
    lease.release()
    assert dev.closed == [base]


def test_schedules_that_disagree_raise_on_every_rank_instead_of_hanging():
    """A bug that gave ranks different numbers of phases stops every rank at the first
    barrier with the reason, instead of leaving ranks waiting at different barriers."""
    p = 3

    def body(r: int, dev: FakeIpcDevice, t: IpcTransport) -> Any:
        x = dev.array(np.arange(4.0) + r)
        out = dev.empty(12, np.float64)
        one = S.all_gather_v(p, r, [32] * p, [0, 32, 64])
        sched = S.Schedule(one.phases + ((),) * r)  # 1, 2, 3 phases
        try:
            return _call(t, dev, "all_gather", {"in": Buffer(dev.pointer(x), 32),
                                                "out": Buffer(dev.pointer(out), 96)},
                         True, lambda _: sched)
        finally:
            assert not t.mappings.mapped and not dev.violations

    res = _threads(p, body)
    assert all(isinstance(e, IpcError) and "hold from 1 to 3 barriers" in str(e) for e in res), res


def test_the_stand_in_queues_work_and_keeps_a_failed_close_open():
    """The stand-in's stream: copies happen at synchronize; closing a mapping that queued
    copies still read is a violation; a failing close leaves the mapping open (a second
    open of its handle adds a reference to it, closed in turn); memory made with ipc=False,
    like stream-ordered memory, cannot be shared; blocks given back are carved again."""
    exporter, peer = FakeIpcDevice("exq"), FakeIpcDevice("peq")
    try:
        x = exporter.array(np.arange(4.0))
        handle = exporter.export(exporter.allocation(exporter.pointer(x)).base)
        base = peer.open(handle)
        off = exporter.pointer(x) - exporter.allocation(exporter.pointer(x)).base
        y = peer.array(np.zeros(4))
        peer.copy(peer.pointer(y), base + off, 32)
        assert not y.get().any()  # queued, not done
        peer.synchronize()
        np.testing.assert_array_equal(y.get(), np.arange(4.0))
        peer.copy(peer.pointer(y), base + off + 8, 8)
        peer.failing_closes = 1
        with pytest.raises(RuntimeError, match="injected"):
            peer.close(base)
        assert peer.open(handle) == base  # still open: one more reference
        peer.close(base)  # that reference: the mapping stays, the copy still queued
        assert not peer.violations and base in peer.opened
        peer.close(base)  # closed with the copy still queued
        assert len(peer.violations) == 1 and "queued copies" in peer.violations[0]
        assert not peer.queue
        z = exporter.array(np.ones(2), ipc=False)
        assert exporter.allocation(exporter.pointer(z)) is None and not exporter.owns(z)
        big = exporter.array(np.zeros(600_000))
        aid = exporter.allocation(exporter.pointer(big)).id
        exporter.give_back(big)
        a, b = exporter.array(np.ones(10)), exporter.empty(7, np.float32)
        assert exporter.allocation(exporter.pointer(a)).id == aid
        assert exporter.pointer(b) - exporter.pointer(a) == 256  # carved right after
    finally:
        peer.cleanup()
        exporter.cleanup()


def test_the_stand_in_refuses_a_handle_of_another_host():
    exporter, here, there = (FakeIpcDevice("h1", host="node-a"), FakeIpcDevice("h2", host="node-a"),
                             FakeIpcDevice("h3", host="node-b"))
    try:
        x = exporter.array(np.arange(3.0))
        handle = exporter.export(exporter.allocation(exporter.pointer(x)).base)
        with pytest.raises(RuntimeError, match="made on another host"):
            there.open(handle)
        here.close(here.open(handle))
    finally:
        for d in (exporter, here, there):
            d.cleanup()


def test_the_stand_in_keeps_cuda_ipc_rules():
    exporter, peer = FakeIpcDevice("exp"), FakeIpcDevice("peer")
    try:
        x = exporter.array(np.arange(3.0))
        handle = exporter.export(exporter.allocation(exporter.pointer(x)).base)
        with pytest.raises(RuntimeError, match="own allocation"):
            exporter.open(handle)
        base = peer.open(handle)
        # as cudaIpcOpenMemHandle in one context: the same pointer, one more reference
        assert peer.open(handle) == base and peer.most_refs == 2
        assert exporter.mapped_by_peers() == [f"a{exporter.allocs[0].id}.map-{peer.token}"]
        peer.close(base)  # one reference left: still mapped
        assert base in peer.opened and len(exporter.mapped_by_peers()) == 1
        exporter.free()
        assert len(exporter.violations) == 1 and peer.token in exporter.violations[0]
        peer.close(base)  # the last reference: unmapped
        assert base not in peer.opened
        with pytest.raises(RuntimeError, match="closed twice"):
            peer.close(base)
        y = exporter.array(np.arange(3.0))  # a new allocation, opened and closed before free
        b2 = peer.open(exporter.export(exporter.allocation(exporter.pointer(y)).base))
        peer.close(b2)
        exporter.free()
        assert len(exporter.violations) == 1
    finally:
        peer.cleanup()
        exporter.cleanup()


class _StubDevice:
    def __init__(self) -> None:
        self.opened: list[bytes] = []
        self.closed: list[int] = []
        self.n = 0

    def open(self, handle: bytes) -> int:
        self.opened.append(handle)
        self.n += 1
        return 1 << 40 | self.n << 20

    def close(self, mapped: int) -> None:
        self.closed.append(mapped)

    def allocation(self, ptr: int) -> Allocation:
        return Allocation(ptr & ~0xFFFF, 0x10000, ptr >> 16)

    def export(self, base: int) -> bytes:
        return b"h%d" % base


def test_one_reference_counted_mapping_cache_per_process():
    dev = _StubDevice()
    t1 = IpcTransport(dev, None)  # type: ignore[arg-type]
    t2 = IpcTransport(dev, None)  # type: ignore[arg-type]  # another group, same process
    cache = t1.mappings
    assert t2.mappings is cache and MappingCache.of(dev) is cache  # type: ignore[arg-type]
    assert IpcTransport(_StubDevice(), None).mappings is not cache  # type: ignore[arg-type]
    one, two = Lease(cache), Lease(cache)
    a = one.map(11, 7, b"a")
    assert one.map(11, 7, b"a") == a and two.map(11, 7, b"a") == a  # one open for all
    b = one.map(12, 7, b"b")  # another exporting process: its own allocation 7
    assert dev.opened == [b"a", b"b"] and b != a and len(cache) == 2
    one.release()
    assert dev.closed == [b] and len(cache) == 1  # the other lease still holds (11, 7)
    two.release()
    assert dev.closed == [b, a] and len(cache) == 0 and one.opens == 2 and one.closes == 1
    with pytest.raises(KeyError):
        cache.release((11, 7))  # released twice: refused, never a second close
    # exports: once per allocation; a new allocation over a freed one replaces it
    h1 = cache.export(0x50010)
    assert h1 is not None and h1[2]
    h2 = cache.export(0x50020)
    assert h2 is not None and h2[:2] == h1[:2] and not h2[2]
    dev.allocation = lambda ptr: Allocation(0x50000, 0x10000, 99)  # type: ignore[method-assign]
    h3 = cache.export(0x50010)
    assert h3 is not None and h3[2] and list(cache.exported) == [99]
    one.map(11, 8, b"c")
    cache.close_all()
    assert len(cache) == 0 and not cache.exported and len(dev.closed) == 3


# ----------------------------------------------------------------------------- selection


@pytest.fixture
def env(monkeypatch):
    """Both settings automatic for the test; as they were after it."""
    with sm.config.override(gpu_transport=None, cuda_aware=None):
        yield monkeypatch
        monkeypatch.undo()


def test_transport_selection_and_reasons(env):
    env.setattr(select, "cuda_awareness", lambda: cuda_aware.CudaAwareness(False, "lib says no"))
    d = select.detect()
    assert d.name == "staged" and not d.forced and "lib says no" in d.reason
    assert "SBPMPI_GPU_TRANSPORT=ipc" in d.reason
    env.setattr(select, "cuda_awareness", lambda: cuda_aware.CudaAwareness(True, "lib says yes"))
    d = select.detect()
    assert d.name == "mpi" and "lib says yes" in d.reason
    env.setenv("SBPMPI_GPU_TRANSPORT", "IPC ")
    sm.config.reset("gpu_transport")  # the environment's value, read again
    d = select.detect()
    # beside a CUDA-aware MPI (which maps its peers' buffers itself) ipc stays off
    assert d.name == "mpi" and d.forced and "explicit override" in d.reason
    assert "SBPMPI_GPU_TRANSPORT=ipc (environment)" in d.reason and "stays off" in d.reason
    assert "lib says yes" in d.reason and "SBPMPI_CUDA_AWARE=0 keeps ipc" in d.reason
    env.setattr(select, "cuda_awareness", lambda: cuda_aware.CudaAwareness(False, "lib says no"))
    d = select.detect()
    assert d.name == "ipc" and d.forced and "explicit override" in d.reason
    assert "SBPMPI_GPU_TRANSPORT=ipc (environment)" in d.reason and "go staged" in d.reason
    sm.config.update(gpu_transport="Staged")
    d = select.detect()
    assert d.name == "staged" and d.forced and "gpu_transport='staged' (set in the program)" \
        in d.reason
    with pytest.raises(ValueError, match=r"SBPMPI_GPU_TRANSPORT='nccl' is not understood; "
                                         r"expected one of ipc, mpi, staged"):
        sm.config.gpu_transport.parse("nccl")
    with pytest.raises(ValueError, match="gpu_transport='tcp' is not allowed"):
        sm.config.update(gpu_transport="tcp")
    with pytest.raises(TypeError, match="gpu_transport=1 is not allowed"):
        sm.config.update(gpu_transport=1)


def test_forced_mpi_and_staged_decide_the_staging(env):
    env.setenv("SBPMPI_GPU_TRANSPORT", "mpi")
    sm.config.reset("gpu_transport")
    d = cuda_aware.detect()
    assert d.aware and "SBPMPI_GPU_TRANSPORT=mpi" in d.reason
    sm.config.update(gpu_transport="staged")
    assert not cuda_aware.detect().aware
    sm.config.update(cuda_aware=True)  # the setting cuda_aware still wins
    assert cuda_aware.detect().aware
    sm.config.update(cuda_aware=None, gpu_transport="mpi")
    if not cuda_aware.detect_library().aware:
        assert "may crash" in select.detect().reason
    # the decisions are made again at each change: the cached ones follow
    sm.config.update(gpu_transport="staged")
    assert not cuda_aware.is_cuda_aware() and not route.STATE.enabled
    assert select.gpu_transport().name == "staged"
    sm.config.update(gpu_transport="ipc")
    assert route.STATE.enabled and select.gpu_transport().name == "ipc"
    sm.config.update(gpu_transport="mpi")
    assert cuda_aware.is_cuda_aware() and not route.STATE.enabled
    with sm.config.override(gpu_transport="ipc"):
        assert route.STATE.enabled
    assert not route.STATE.enabled and select.gpu_transport().name == "mpi"


def test_ipc_stays_off_where_device_pointers_go_to_mpi(env):
    """A CUDA-aware MPI maps its peers' GPU buffers with CUDA IPC itself (and CUDA keeps one
    mapping of a handle per process, which the two would share): with the setting ipc, the
    transport is mpi there, and the route is off; told that MPI takes no device pointers,
    ipc is on."""
    sm.config.update(gpu_transport="ipc", cuda_aware=True)
    assert select.gpu_transport().name == "mpi" and not route.STATE.enabled
    assert "stays off" in sm.comm.info()["gpu_transport_reason"]
    sm.config.update(cuda_aware=False)
    assert select.gpu_transport().name == "ipc" and route.STATE.enabled
    sm.config.update(cuda_aware=True)
    assert not route.STATE.enabled and not cuda_aware.detect_library().aware  # this test's MPI


def test_info_reports_the_transport(env):
    sm.config.update(gpu_transport="ipc")
    info = sm.comm.info()
    assert info["gpu_transport"] == "ipc" and "set in the program" in info["gpu_transport_reason"]
    sm.config.update(gpu_transport=None)
    info = sm.comm.info()
    assert info["gpu_transport"] in ("mpi", "staged") and info["gpu_transport_reason"]


def test_route_is_off_by_default_without_the_variable(env):
    sm.config.update(gpu_transport=None)
    assert select.gpu_transport().name != "ipc" and not route.STATE.enabled


def test_an_invalid_transport_is_refused_when_read(env):
    from fake_cuda import FakeCudaArray

    env.setenv("SBPMPI_GPU_TRANSPORT", "nccl")
    with pytest.raises(ValueError, match="SBPMPI_GPU_TRANSPORT='nccl' is not understood"):
        sm.config.reset("gpu_transport")  # as at import: the program does not start
    assert sm.config.gpu_transport.value is None and not route.STATE.enabled  # unchanged
    x = FakeCudaArray.from_numpy(np.ones(3))
    sm.comm.all_reduce(x)  # the automatic transport
    np.testing.assert_array_equal(x.get(), np.ones(3) * sm.comm.WORLD.size)


def test_allocations_without_an_id_are_keyed_by_handle():
    dev = _StubDevice()
    dev.allocation = lambda ptr: Allocation(ptr & ~0xFFFF, 0x10000, -1)  # type: ignore[method-assign]
    cache = MappingCache(dev)  # type: ignore[arg-type]
    assert all(cache.export(ptr)[2] for ptr in (0x50010, 0x50020))  # type: ignore[index]
    assert not cache.exported  # never kept
    lease = Lease(cache)
    a = lease.map(1, -1, b"a")
    assert lease.map(1, -1, b"a") == a and len(dev.opened) == 1
    b = lease.map(1, -1, b"b")  # same range, new handle: another allocation
    assert b != a and len(dev.opened) == 2
    lease.release()
    assert sorted(dev.closed) == sorted([a, b])


# ----------------------------------------------------------------------------- CupyDevice


class _CFunc:
    """A ctypes function stand-in: argtypes/restype are set by the caller."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.argtypes, self.restype = fn, None, None

    def __call__(self, *args: Any) -> Any:
        assert self.argtypes is not None and len(args) == len(self.argtypes)
        return self.fn(*args)


class _FakeDriver:
    """libcuda.so.1's two calls, over a table of fake allocations."""

    def __init__(self, allocs: dict[int, tuple[int, int, int]]) -> None:
        self.allocs = allocs  # base -> (size, buffer id, ipc capable)
        self.cuMemGetAddressRange_v2 = _CFunc(self._range)
        self.cuPointerGetAttribute = _CFunc(self._attr)

    def _find(self, ptr: int) -> tuple[int, int, int, int] | None:
        for base, (size, bid, cap) in self.allocs.items():
            if base <= ptr < base + size:
                return base, size, bid, cap
        return None

    def _range(self, base_ref: Any, size_ref: Any, ptr: int) -> int:
        hit = self._find(ptr)
        if hit is None:
            return 1  # CUDA_ERROR_INVALID_VALUE
        base_ref._obj.value, size_ref._obj.value = hit[0], hit[1]
        return 0

    def _attr(self, out_ref: Any, attr: int, ptr: int) -> int:
        hit = self._find(ptr)
        if hit is None:
            return 1
        if attr == 7:  # BUFFER_ID
            if hit[2] < 0:
                return 1  # an old driver
            out_ref._obj.value = hit[2]
        elif attr == 10:  # IS_LEGACY_CUDA_IPC_CAPABLE
            out_ref._obj.value = hit[3]
        return 0


def _fake_cupy(calls: list) -> Any:
    import ctypes
    import types

    class Arr(np.ndarray):
        device = types.SimpleNamespace(id=0)
        @property
        def data(self):  # type: ignore[override]
            return types.SimpleNamespace(ptr=self.ctypes.data)

    class Stream:
        ptr = 1234

        def synchronize(self) -> None:
            calls.append(("sync",))

    def memcpy_async(dst: int, src: int, n: int, kind: int, stream: int) -> None:
        calls.append(("memcpyAsync", n, kind, stream))
        ctypes.memmove(dst, src, n)

    def unowned(ptr: int, size: int, owner: Any, device_id: int) -> Any:
        calls.append(("UnownedMemory", size, device_id))
        return types.SimpleNamespace(ptr=ptr, size=size)

    def ndarray(shape: Any, dtype: Any, memptr: Any) -> np.ndarray:
        n = memptr.mem.size
        return np.frombuffer((ctypes.c_char * n).from_address(memptr.mem.ptr),
                             dtype=dtype).reshape(shape)

    runtime = types.SimpleNamespace(
        ipcGetMemHandle=lambda base: calls.append(("get", base)) or bytes(range(64)),
        ipcOpenMemHandle=lambda h, flags: calls.append(("open", h, flags)) or 0xABC000,
        ipcCloseMemHandle=lambda p: calls.append(("close", p)),
        memcpyAsync=memcpy_async,
        deviceSynchronize=lambda: calls.append(("deviceSynchronize",)))
    cuda = types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(id=0), runtime=runtime,
        get_current_stream=lambda: Stream(), UnownedMemory=unowned,
        MemoryPointer=lambda mem, off: types.SimpleNamespace(mem=mem, off=off))
    return types.SimpleNamespace(
        Arr=Arr, cuda=cuda, ndarray=ndarray, add=np.add, multiply=np.multiply, maximum=np.maximum,
        minimum=np.minimum, empty=lambda n, dtype: np.empty(n, dtype).view(Arr))


def test_cupy_device_calls_cuda_as_documented(monkeypatch):
    """CupyDevice against stand-ins of CuPy and libcuda that check the calls' shapes (the
    real ones need a GPU): driver queries, export/open/close, async copies on the current
    stream, device-side reductions on views of raw pointers."""
    import ctypes
    import sys
    import types

    from sbpmpi.comm.gpu import device as D

    calls: list = []
    a = np.arange(8, dtype=np.float32)
    b = np.full(8, 10, dtype=np.float32)
    base = a.ctypes.data
    drv = _FakeDriver({base: (32, 77, 1), b.ctypes.data: (32, -1, 1), 1 << 44: (64, 5, 0)})
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(calls))
    monkeypatch.setattr(D.ctypes, "CDLL", lambda name: drv if name == "libcuda.so.1" else
                        ctypes.CDLL(name))
    dev = D.CupyDevice()
    assert dev.allocation(base + 8) == Allocation(base, 32, 77)
    assert dev.allocation(b.ctypes.data).id == -1  # no buffer id: the protocol keys by handle
    assert dev.allocation(1 << 44) is None  # not IPC capable (stream-ordered memory)
    assert dev.allocation(12) is None
    h = dev.export(base)
    assert h == bytes(range(64)) and ("get", base) in calls
    assert dev.open(h) == 0xABC000 and ("open", h, 1) in calls  # lazy peer access
    dev.close(0xABC000)
    assert ("close", 0xABC000) in calls
    dev.copy(b.ctypes.data, base + 4, 8)
    np.testing.assert_array_equal(b[:2], [1, 2])
    assert ("memcpyAsync", 8, 4, 1234) in calls  # cudaMemcpyDefault on the current stream
    dev.reduce(a.ctypes.data, b.ctypes.data, 32, np.dtype(np.float32), ReduceOp.MAX)
    want = np.maximum(np.arange(8, dtype=np.float32), [1, 2] + [10] * 6)
    np.testing.assert_array_equal(a, want)
    dev.divide(a.ctypes.data, 32, np.dtype(np.float32), 2)
    np.testing.assert_array_equal(a, want / 2)
    assert ("UnownedMemory", 32, 0) in calls
    ptr, keep = dev.scratch(16)
    assert ptr == keep.ctypes.data and keep.nbytes >= 16
    dev.synchronize()  # the whole device: the buffers may come from any stream
    assert calls[-1] == ("deviceSynchronize",) and ("sync",) not in calls
    # owns: a CuPy array of this device, in memory IPC can share
    fake = sys.modules["cupy"]
    monkeypatch.setattr(D.backend, "is_cupy_array", lambda x: isinstance(x, fake.Arr))
    c = np.zeros(8, np.float32)
    drv.allocs[c.ctypes.data] = (32, 78, 0)  # stream-ordered (cudaMallocAsync) memory
    other = a.view(fake.Arr)
    other.device = types.SimpleNamespace(id=1)
    assert dev.owns(a.view(fake.Arr)) and dev.owns(np.zeros(0, np.float32).view(fake.Arr))
    assert not dev.owns(c.view(fake.Arr)) and not dev.owns(other) and not dev.owns(a)
