"""sbpmpi.comm v-collectives (per-rank counts, displacements) under MPI, every dtype and every
array backend, against NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from comm_helpers import NUMERIC, OPAQUE, data, run_vcollectives
from mpi4py import MPI

from sbpmpi import comm as C

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


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
def test_v_every_dtype(chk):
    for dt in NUMERIC + OPAQUE:
        _v_cases(chk, dt)


@pytest.mark.mpi(min_size=1)
@pytest.mark.timeout(120)
def test_every_v_collective_on_every_backend(chk, array_backend):
    run_vcollectives(chk, array_backend.mk, array_backend.host)
