"""sbpmpi.comm buffer calls under MPI: scenario S12, every op x ReduceOp x dtype, sizes.

Every rank's input is a deterministic function of its rank, so each rank can build
all inputs and compute the expected result with NumPy; a wrong order or a missing
contribution changes the result.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from comm_helpers import NUMERIC, OPAQUE, checker, data, reduction_ok, reference
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as C
from sbpmpi.comm import ReduceOp

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


@pytest.fixture
def chk():
    yield from checker()

# ----------------------------------------------------------------------------- S12


@pytest.mark.mpi(min_size=2)
def test_s12_send_recv(chk):
    if rank == 0:
        C.send(np.array([1.0]), dst=1)
    elif rank == 1:
        x = np.zeros(1)
        chk.true(C.recv(x, src=0) == 0, "recv returns the sender")
        chk.same(x, np.array([1.0]))
    # non-blocking: the receive buffer holds the value after wait()
    if rank == 0:
        w = C.isend(np.array([1.0]), dst=1)
        chk.true(w.wait() is True and w.test(), "isend wait/test")
    elif rank == 1:
        x = np.zeros(1)
        w = C.irecv(x, src=0)
        w.wait()
        chk.true(w.source == 0 and w.is_completed(), "irecv source/is_completed")
        chk.same(x, np.array([1.0]))
    C.barrier()


@pytest.mark.mpi(min_size=1)
def test_s12_broadcast(chk):
    x = np.array([1.0]) if rank == 0 else np.array([0.0])
    C.broadcast(x, src=0)
    chk.same(x, np.array([1.0]))


@pytest.mark.mpi(min_size=2)
def test_s12_reduce(chk):
    x = np.array([1.0])
    C.reduce(x, dst=1, op=ReduceOp.SUM)
    chk.same(x, np.array([float(size)]) if rank == 1 else np.array([1.0]))


@pytest.mark.mpi(min_size=1)
def test_s12_all_reduce(chk):
    vals = [1.0, 2.0, -3.0] if size == 3 else [float(r + 1) for r in range(size)]
    x = np.array([vals[rank]])
    C.all_reduce(x, op=ReduceOp.SUM)
    chk.same(x, np.array([sum(vals)]))
    if size == 3:
        chk.true(x[0] == 0.0, "tutorial value")


@pytest.mark.mpi(min_size=2)
def test_s12_gather_all_gather(chk):
    lst = [np.zeros(1) for _ in range(size)] if rank == 1 else None
    C.gather(np.array([float(rank)]), gather_list=lst, dst=1)
    if rank == 1:
        for r, a in enumerate(lst):
            chk.same(a, np.array([float(r)]))
    out = [np.zeros(1) for _ in range(size)]
    C.all_gather(out, np.array([float(rank)]))
    for r, a in enumerate(out):
        chk.same(a, np.array([float(r)]))


@pytest.mark.mpi(min_size=1)
def test_s12_scatter(chk):
    lst = [np.array([float(i + 1)]) for i in range(size)] if rank == 0 else None
    x = np.zeros(1)
    C.scatter(x, scatter_list=lst, src=0)
    chk.same(x, np.array([float(rank + 1)]))


@pytest.mark.mpi(min_size=1)
def test_s12_reduce_scatter(chk):
    x = np.zeros(1)
    C.reduce_scatter(x, [np.array([float(i)]) for i in range(size)], op=ReduceOp.SUM)
    chk.same(x, np.array([float(size * rank)]))
    if size == 2:
        chk.true(x[0] == (0.0 if rank == 0 else 2.0), "tutorial value")


# ----------------------------------------------------------------------------- reductions


@pytest.mark.mpi(min_size=1)
def test_reductions_every_op_and_dtype(chk):
    n = 7
    counts = [(i % 3) + 1 for i in range(size)]  # uneven blocks for reduce_scatter_v
    done = 0
    for dt in NUMERIC:
        for op in ReduceOp:
            msg = f"{np.dtype(dt)} {op}"
            if not reduction_ok(dt, op):
                with pytest.raises(TypeError):
                    C.all_reduce(data(rank, n, dt), op=op)
                continue
            # all_reduce
            x = data(rank, n, dt)
            C.all_reduce(x, op=op)
            want = reference(np.stack([data(r, n, dt) for r in range(size)]), op, size)
            chk.same(x, want, "all_reduce " + msg)
            # reduce to the last rank; others unchanged
            dst = size - 1
            x = data(rank, n, dt, seed=1)
            C.reduce(x, dst=dst, op=op)
            want = reference(np.stack([data(r, n, dt, 1) for r in range(size)]), op, size)
            chk.same(x, want if rank == dst else data(rank, n, dt, 1), "reduce " + msg)
            # reduce_scatter: block r of the reduction
            full = data(rank, 3 * size, dt, seed=2)
            out = np.empty(3, dtype=dt)
            C.reduce_scatter(out, full, op=op)
            want = reference(np.stack([data(r, 3 * size, dt, 2) for r in range(size)]), op, size)
            chk.same(out, want[3 * rank:3 * rank + 3], "reduce_scatter " + msg)
            # reduce_scatter_v with uneven blocks
            tot = sum(counts)
            full = data(rank, tot, dt, seed=3)
            out = np.empty(counts[rank], dtype=dt)
            C.reduce_scatter_v(out, full, counts, op=op)
            want = reference(np.stack([data(r, tot, dt, 3) for r in range(size)]), op, size)
            off = sum(counts[:rank])
            chk.same(out, want[off:off + counts[rank]], "reduce_scatter_v " + msg)
            done += 1
    assert done == 16 * 5 - 9 - 6  # all pairs but AVG on bool/ints, MAX/MIN on complex


@pytest.mark.mpi(min_size=1)
def test_float16_reductions_round_like_numpy(chk):
    # non-integer float16 values: partial results round, so compare with a tolerance
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(101).astype(np.float16)
    allx = np.stack([np.random.default_rng(r).standard_normal(101).astype(np.float16)
                     for r in range(size)])
    for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX, ReduceOp.MIN):
        y = x.copy()
        C.all_reduce(y, op=op)
        want = reference(allx.astype(np.float64), op, size)
        chk.true(y.dtype == np.float16, "dtype kept")
        chk.true(np.allclose(y.astype(np.float64), want, rtol=4e-3, atol=4e-3 * size),
                 f"float16 {op}: {y} vs {want}")


@pytest.mark.mpi(min_size=1)
def test_bool_reductions_are_logical(chk):
    x = np.array([rank == 0, True, False, rank % 2 == 1])
    allx = np.stack([np.array([r == 0, True, False, r % 2 == 1]) for r in range(size)])
    for op, want in [(ReduceOp.SUM, allx.any(0)), (ReduceOp.MAX, allx.any(0)),
                     (ReduceOp.PROD, allx.all(0)), (ReduceOp.MIN, allx.all(0))]:
        y = x.copy()
        C.all_reduce(y, op=op)
        chk.same(y, want, str(op))


# ----------------------------------------------------------------------------- data movement


def _movement_cases(chk, dt, n, seed=0):
    """Run every data-movement call on dtype ``dt`` with ``n`` elements per rank."""
    dt = np.dtype(dt)
    allx = [data(r, n, dt, seed) for r in range(size)]
    mine = allx[rank]
    # broadcast from every root
    for src in range(size):
        x = mine.copy()
        C.broadcast(x, src=src)
        chk.same(x, allx[src], f"broadcast {dt} src={src}")
    # gather (array form) to the last rank
    dst = size - 1
    out = np.empty((size, n), dtype=dt) if rank == dst else None
    C.gather(mine, out, dst=dst)
    if rank == dst:
        chk.same(out, np.stack(allx), f"gather {dt}")
    # all_gather (array and list forms)
    out = np.empty((size, n), dtype=dt)
    C.all_gather(out, mine)
    chk.same(out, np.stack(allx), f"all_gather {dt}")
    outl = [np.empty(n, dtype=dt) for _ in range(size)]
    C.all_gather(outl, mine)
    chk.same(np.stack(outl), np.stack(allx), f"all_gather list {dt}")
    # scatter from rank 0 (array form) and from the last rank (list form)
    big = [data(r, size * n, dt, seed + 1) for r in range(size)]
    x = np.empty(n, dtype=dt)
    C.scatter(x, big[0] if rank == 0 else None, src=0)
    chk.same(x, big[0][rank * n:(rank + 1) * n], f"scatter {dt}")
    lst = [big[dst][i * n:(i + 1) * n].copy() for i in range(size)] if rank == dst else None
    C.scatter(x, lst, src=dst)
    chk.same(x, big[dst][rank * n:(rank + 1) * n], f"scatter list {dt}")
    # all_to_all: block j of rank i goes to block i of rank j
    out = np.empty(size * n, dtype=dt)
    C.all_to_all(out, big[rank])
    want = np.concatenate([big[i][rank * n:(rank + 1) * n] for i in range(size)])
    chk.same(out, want, f"all_to_all {dt}")
    outl = [np.empty(n, dtype=dt) for _ in range(size)]
    C.all_to_all(outl, [big[rank][j * n:(j + 1) * n] for j in range(size)])
    chk.same(np.concatenate(outl), want, f"all_to_all list {dt}")


def _v_cases(chk, dt, seed=0):
    """The v-variants with uneven counts (rank r contributes r % 3 + k elements)."""
    dt = np.dtype(dt)
    counts = [(r % 3) + (1 if r == 0 else 0) for r in range(size)]  # includes zeros
    allx = [data(r, counts[r], dt, seed) for r in range(size)]
    flat = np.concatenate(allx)
    # all_gather_v packed, and with gaps (displs)
    out = np.empty(sum(counts), dtype=dt)
    C.all_gather_v(out, allx[rank], counts)
    chk.same(out, flat, f"all_gather_v {dt}")
    displs = [sum(counts[:r]) + 2 * r for r in range(size)]
    out = np.zeros(sum(counts) + 2 * size, dtype=dt)
    C.all_gather_v(out, allx[rank], counts, displs)
    for r in range(size):
        chk.same(out[displs[r]:displs[r] + counts[r]], allx[r], f"all_gather_v displs {dt}")
    # gather_v to the last rank
    dst = size - 1
    out = np.empty(sum(counts), dtype=dt) if rank == dst else None
    C.gather_v(allx[rank], out, counts, dst=dst)
    if rank == dst:
        chk.same(out, flat, f"gather_v {dt}")
    # scatter_v from rank 0: rank r gets its block
    src_data = data(0, sum(counts), dt, seed + 5)
    x = np.empty(counts[rank], dtype=dt)
    C.scatter_v(x, src_data if rank == 0 else None, counts, src=0)
    off = sum(counts[:rank])
    chk.same(x, src_data[off:off + counts[rank]], f"scatter_v {dt}")
    # all_to_all_v: rank i sends (i + j) % 3 elements to rank j
    sc = [[(i + j) % 3 for j in range(size)] for i in range(size)]
    ins = [data(i, sum(sc[i]), dt, seed + 9) for i in range(size)]
    out_counts = [sc[i][rank] for i in range(size)]
    out = np.empty(sum(out_counts), dtype=dt)
    C.all_to_all_v(out, out_counts, ins[rank], sc[rank])
    want = np.concatenate([ins[i][sum(sc[i][:rank]):sum(sc[i][:rank + 1])]
                           for i in range(size)])
    chk.same(out, want, f"all_to_all_v {dt}")


@pytest.mark.mpi(min_size=1)
def test_movement_every_dtype(chk):
    for dt in NUMERIC + OPAQUE:
        _movement_cases(chk, dt, 3)
        _v_cases(chk, dt)


@pytest.mark.mpi(min_size=1)
def test_sizes_zero_one_and_several_mib(chk):
    for n in (0, 1):
        _movement_cases(chk, np.float64, n)
        x = data(rank, n, np.int32)
        C.all_reduce(x)
        chk.same(x, np.sum([data(r, n, np.int32) for r in range(size)], axis=0,
                              dtype=np.int32))
    x = np.array(rank + 1.5)  # 0-d
    C.all_reduce(x, op=ReduceOp.MAX)
    chk.same(x, np.array(size + 0.5))
    # several MiB: 4 MiB per rank
    n = (4 << 20) // 8
    x = np.full(n, rank + 1.0)
    x[::1000] = np.arange(0, n, 1000) * (rank + 1)
    C.all_reduce(x)
    want = np.full(n, size * (size + 1) / 2)
    want[::1000] = np.arange(0, n, 1000) * (size * (size + 1) / 2)
    chk.same(x, want)
    b = np.arange(n, dtype=np.float64) * (rank + 1)
    C.broadcast(b, src=size - 1)
    chk.same(b, np.arange(n, dtype=np.float64) * size)
    m = (2 << 20) // 4
    out = np.empty(size * m, dtype=np.float32)
    C.all_gather_v(out, np.full(m, rank, np.float32), [m] * size)
    chk.same(out, np.repeat(np.arange(size, dtype=np.float32), m))


@pytest.mark.mpi(min_size=1)
def test_non_contiguous_inputs_are_copied(chk):
    base = [np.arange(24, dtype=np.float64).reshape(4, 6) * (r + 1) for r in range(size)]
    views = [b[:, ::2] for b in base]  # shape (4, 3), non-contiguous
    mine = views[rank]
    assert not mine.flags.c_contiguous
    out = np.empty((size, 4, 3))
    C.all_gather(out, mine)
    chk.same(out, np.stack(views))
    lst = [np.empty((4, 3)) for _ in range(size)]
    C.gather(mine, lst if rank == 0 else None, dst=0)
    if rank == 0:
        chk.same(np.stack(lst), np.stack(views))
    x = np.empty(12)
    blocks = np.stack(views).transpose(0, 2, 1)  # (size, 3, 4), non-contiguous
    C.scatter(x, blocks if rank == 0 else None, src=0)
    chk.same(x, blocks[rank].ravel())
    def big(r):  # negative stride, non-contiguous
        return (np.arange(2 * size * 3, dtype=np.float64) * (r + 1))[::-2]

    out = np.empty(3)
    C.reduce_scatter(out, big(rank))
    chk.same(out, sum(big(r) for r in range(size))[3 * rank:3 * rank + 3])
    out = np.empty(size * 3)
    C.all_to_all(out, big(rank))
    chk.same(out, np.concatenate([big(i)[3 * rank:3 * rank + 3] for i in range(size)]))
    counts = [2] * size
    out = np.empty(2 * size)
    C.all_gather_v(out, np.arange(4.0)[::2] + rank, counts)
    chk.same(out, np.concatenate([np.arange(4.0)[::2] + r for r in range(size)]))


@pytest.mark.mpi(min_size=2)
def test_point_to_point_ring_every_dtype(chk):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for i, dt in enumerate(NUMERIC + OPAQUE):
        mine = data(rank, 5, dt)
        got = np.empty(5, dtype=np.dtype(dt))
        rq = C.irecv(got, src=prv, tag=i)
        sq = C.isend(mine, dst=nxt, tag=i)
        sq.wait()
        while not rq.test():
            pass
        chk.same(got, data(prv, 5, dt), f"ring {np.dtype(dt)}")
    # blocking: even ranks send first (no deadlock for any size)
    x = np.arange(6.0)[::2] * (rank + 1)  # non-contiguous send buffer
    y = np.empty(3)
    if rank % 2 == 0:
        if nxt != rank:
            C.send(x, dst=nxt, tag=3)
        if prv != rank:
            C.recv(y, src=prv, tag=3)
    else:
        C.recv(y, src=prv, tag=3)
        C.send(x, dst=nxt, tag=3)
    chk.same(y, np.arange(6.0)[::2] * (prv + 1))
    # receive from any source
    if rank == 0:
        z = np.empty(1)
        senders = sorted(C.recv(z, tag=9) for _ in range(size - 1))
        chk.true(senders == list(range(1, size)), f"senders {senders}")
    else:
        C.send(np.array([float(rank)]), dst=0, tag=9)


@pytest.mark.mpi(min_size=1)
def test_isend_irecv_to_self(chk):
    x = np.zeros(4)
    r = C.irecv(x, src=rank, tag=5)
    s = C.isend(np.arange(4.0) + rank, dst=rank, tag=5)
    s.wait()
    r.wait()
    chk.same(x, np.arange(4.0) + rank)


@pytest.mark.mpi(min_size=1)
def test_barrier_and_objects(chk):
    C.barrier()
    assert C.all_gather_object({"r": rank}) == [{"r": r} for r in range(size)]
    assert C.broadcast_object(("x", rank), src=size - 1) == ("x", size - 1)
    assert C.all_agree(True) is True
    assert C.all_agree(rank != size - 1) is False


@pytest.mark.mpi(min_size=1)
def test_sm_comm_namespace(chk):
    assert sm.comm is C
    for name in C.__all__:
        assert hasattr(C, name), name


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(not os.environ.get("SBPMPI_TEST_LARGE"),
                    reason="needs ~5 GiB per rank; set SBPMPI_TEST_LARGE=1")
def test_large_count_over_2_31_elements(chk):
    n = 2**31 + 16  # more elements than a C int can count: MPI's large-count calls
    x = np.zeros(n, np.uint8)
    if rank == 0:
        x[:: 2**20] = np.arange(x[:: 2**20].size) % 251
        x[-16:] = np.arange(16) + 7
    C.broadcast(x, src=0)
    want = np.zeros(n, np.uint8)
    want[:: 2**20] = np.arange(want[:: 2**20].size) % 251
    want[-16:] = np.arange(16) + 7
    chk.true(np.array_equal(x, want), "broadcast of 2**31 + 16 elements")
    del want
    if rank == 1:
        x[-1] = 99
        C.send(x, dst=0, tag=2)
    elif rank == 0:
        C.recv(x, src=1, tag=2)
        chk.true(x[-1] == 99 and x[-16] == 7, "send/recv of 2**31 + 16 elements")
