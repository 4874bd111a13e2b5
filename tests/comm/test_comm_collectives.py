"""sbpmpi.comm collectives (fixed-size blocks) under MPI: one value per rank (as in
examples/s12_collectives.py), every op x ReduceOp x dtype, sizes, non-contiguous buffers,
staging, and every collective on every array backend.

Every rank's input is a deterministic function of its rank, so each rank can build
all inputs and compute the expected result with NumPy; a wrong order or a missing
contribution changes the result.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from comm_helpers import NUMERIC, OPAQUE, data, reduction_ok, reference, run_collectives
from fake_cuda import FakeCudaArray
from mpi4py import MPI

from sbpmpi import backend, config
from sbpmpi import comm as C
from sbpmpi.comm import ReduceOp
from sbpmpi.comm.buffers import PINNED_POOL

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


@pytest.mark.mpi(min_size=1)
def test_broadcast_one_value_from_rank_0(chk):
    x = np.array([1.0]) if rank == 0 else np.array([0.0])
    C.broadcast(x, src=0)
    chk.same(x, np.array([1.0]))


@pytest.mark.mpi(min_size=2)
def test_reduce_sum_to_rank_1(chk):
    x = np.array([1.0])
    C.reduce(x, dst=1, op=ReduceOp.SUM)
    chk.same(x, np.array([float(size)]) if rank == 1 else np.array([1.0]))


@pytest.mark.mpi(min_size=1)
def test_all_reduce_sum_of_one_value_per_rank(chk):
    vals = [1.0, 2.0, -3.0] if size == 3 else [float(r + 1) for r in range(size)]
    x = np.array([vals[rank]])
    C.all_reduce(x, op=ReduceOp.SUM)
    chk.same(x, np.array([sum(vals)]))
    if size == 3:
        chk.true(x[0] == 0.0, "tutorial value")


@pytest.mark.mpi(min_size=2)
def test_gather_and_all_gather_one_value_per_rank(chk):
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
def test_scatter_one_value_per_rank(chk):
    lst = [np.array([float(i + 1)]) for i in range(size)] if rank == 0 else None
    x = np.zeros(1)
    C.scatter(x, scatter_list=lst, src=0)
    chk.same(x, np.array([float(rank + 1)]))


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_sum_of_one_value_per_rank(chk):
    x = np.zeros(1)
    C.reduce_scatter(x, [np.array([float(i)]) for i in range(size)], op=ReduceOp.SUM)
    chk.same(x, np.array([float(size * rank)]))
    if size == 2:
        chk.true(x[0] == (0.0 if rank == 0 else 2.0), "tutorial value")


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


@pytest.mark.mpi(min_size=1)
def test_movement_every_dtype(chk):
    for dt in NUMERIC + OPAQUE:
        _movement_cases(chk, dt, 3)


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


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
def test_every_collective_on_every_backend(chk, array_backend):
    be = array_backend
    if be.is_device:
        assert C.is_cuda_aware() is be.aware
    assert backend.is_device_array(be.mk(np.zeros(1))) is be.is_device
    run_collectives(chk, be.mk, be.host, be.aware)


@pytest.mark.mpi(min_size=1)
def test_sizes_non_contiguous_and_mixed_on_every_backend(chk, array_backend):
    dev, host = array_backend.mk, array_backend.host
    for n in (0, 1, (2 << 20) // 8):
        x = dev(np.full(n, rank + 1.0))
        C.all_reduce(x)
        chk.same(host(x), np.full(n, size * (size + 1) / 2), f"all_reduce n={n}")
    # a non-contiguous device input is copied; a non-contiguous device output is refused
    base = dev(np.arange(12.0).reshape(3, 4) + rank)
    nc = base[:, ::2]
    out = dev(np.zeros((size, 3, 2)))
    C.all_gather(out, nc)
    chk.same(host(out), np.stack([(np.arange(12.0).reshape(3, 4) + r)[:, ::2]
                                  for r in range(size)]), "non-contiguous device input")
    with pytest.raises(ValueError, match="must be C-contiguous"):
        C.all_reduce(nc)
    # host input, device output and the other way round
    out = dev(np.zeros(size))
    C.all_gather(out, np.array([float(rank)]))
    chk.same(host(out), np.arange(float(size)), "host in, device out")
    out = np.zeros(size)
    C.all_gather(out, dev(np.array([float(rank)])))
    chk.same(out, np.arange(float(size)), "device in, host out")
    # a non-contiguous input made by slicing a backend array (CuPy, the fake CUDA array, NumPy)
    out = dev(np.zeros(4 * size))
    C.all_gather(out, dev(np.arange(8.0) + rank)[::2])
    chk.same(host(out), np.concatenate([np.arange(8.0)[::2] + r for r in range(size)]),
             "non-contiguous input sliced from a backend array")


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
def test_staging_buffers_are_reused(chk):
    with config.override(cuda_aware=False):
        x = FakeCudaArray.from_numpy(np.ones(1000))
        C.all_reduce(x)  # warm the pool for this size
        allocs, reuses = PINNED_POOL.allocations, PINNED_POOL.reuses
        for _ in range(5):
            x = FakeCudaArray.from_numpy(np.ones(1000))
            C.all_reduce(x)
            chk.same(x.get(), np.full(1000, float(size)), "staged all_reduce")
        chk.true(PINNED_POOL.allocations == allocs, "no new pinned buffers for repeated calls")
        chk.true(PINNED_POOL.reuses >= reuses + 5, "the pool hands out cached buffers")
        info = C.info()
        chk.true(info["cuda_aware"] is False and "pinned" in info["staging"], str(info))
