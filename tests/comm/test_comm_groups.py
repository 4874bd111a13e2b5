"""Groups: new_group, group= on every call, cached mesh sub-communicators (2x2 mesh at n=4)."""

from __future__ import annotations

import numpy as np
import pytest
from comm_helpers import data
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi import comm as C
from sbpmpi.comm import ReduceOp

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()



def run_group_calls(chk, g, tag: str, be=None) -> None:
    """Every collective on group ``g``, checked against NumPy over the group's world ranks.

    ``be``: the conftest ArrayBackend whose arrays the calls get (NumPy when None).
    """
    mk = be.mk if be is not None else (lambda a: np.array(a, copy=True))
    host = be.host if be is not None else np.asarray
    ranks, p, me = list(g.ranks), g.size, g.rank
    assert me == ranks.index(rank)
    n = 3
    allx = {r: data(r, n, np.float64, 1) for r in ranks}
    x = mk(allx[rank])
    C.all_reduce(x, group=g)
    chk.same(host(x), sum(allx[r] for r in ranks), f"{tag} all_reduce")
    x = mk(allx[rank])
    C.all_reduce(x, op=ReduceOp.MAX, group=g)
    chk.same(host(x), np.max([allx[r] for r in ranks], axis=0), f"{tag} all_reduce max")
    x = mk(allx[rank])
    C.broadcast(x, src=ranks[-1], group=g)
    chk.same(host(x), allx[ranks[-1]], f"{tag} broadcast")
    x = mk(allx[rank])
    C.reduce(x, dst=ranks[-1], op=ReduceOp.PROD, group=g)
    chk.same(host(x), np.prod([allx[r] for r in ranks], axis=0) if rank == ranks[-1]
             else allx[rank], f"{tag} reduce")
    out = mk(np.zeros((p, n)))
    C.all_gather(out, mk(allx[rank]), group=g)
    chk.same(host(out), np.stack([allx[r] for r in ranks]), f"{tag} all_gather (group order)")
    out = mk(np.zeros((p, n))) if rank == ranks[0] else None
    C.gather(mk(allx[rank]), out, dst=ranks[0], group=g)
    if rank == ranks[0]:
        chk.same(host(out), np.stack([allx[r] for r in ranks]), f"{tag} gather")
    big = {r: data(r, p * n, np.float64, 2) for r in ranks}
    x = mk(np.zeros(n))
    C.scatter(x, mk(big[ranks[0]]) if rank == ranks[0] else None, src=ranks[0], group=g)
    chk.same(host(x), big[ranks[0]][me * n:(me + 1) * n], f"{tag} scatter")
    C.reduce_scatter(x, mk(big[rank]), group=g)
    chk.same(host(x), sum(big[r] for r in ranks)[me * n:(me + 1) * n], f"{tag} reduce_scatter")
    out = mk(np.zeros(p * n))
    C.all_to_all(out, mk(big[rank]), group=g)
    chk.same(host(out), np.concatenate([big[r][me * n:(me + 1) * n] for r in ranks]),
             f"{tag} all_to_all")
    counts = [i + 1 for i in range(p)]
    v = {r: data(r, counts[i], np.int32, 3) for i, r in enumerate(ranks)}
    out = mk(np.zeros(sum(counts), np.int32))
    C.all_gather_v(out, mk(v[rank]), counts, group=g)
    chk.same(host(out), np.concatenate([v[r] for r in ranks]), f"{tag} all_gather_v")
    out = mk(np.zeros(counts[me], np.int64))
    tot = {r: data(r, sum(counts), np.int64, 4) for r in ranks}
    C.reduce_scatter_v(out, mk(tot[rank]), counts, group=g)
    off = sum(counts[:me])
    chk.same(host(out), sum(tot[r] for r in ranks)[off:off + counts[me]],
             f"{tag} reduce_scatter_v")
    # ring inside the group; peers are world ranks
    nxt, prv = ranks[(me + 1) % p], ranks[(me - 1) % p]
    got = mk(np.zeros(n))
    w = C.irecv(got, src=prv, tag=1, group=g)
    C.isend(mk(allx[rank]), dst=nxt, tag=1, group=g).wait()
    w.wait()
    chk.same(host(got), allx[prv], f"{tag} isend/irecv ring")
    chk.true(w.source == prv, f"{tag} irecv source {w.source} != {prv}")
    C.barrier(group=g)


@pytest.mark.mpi(min_size=4)
def test_mesh_2x2_sub_communicators(chk, array_backend):
    for mesh in ([[0, 1], [2, 3]], [[3, 1], [2, 0]]):
        pl = sm.placement("cpu", mesh)
        gs = C.mesh_groups(pl)
        if rank not in pl:
            assert gs == (None, None)
            continue
        assert C.mesh_groups(pl) == gs and all(a is b for a, b in zip(C.mesh_groups(pl), gs))
        arr = np.array(mesh)
        i, j = map(int, np.argwhere(arr == rank)[0])
        assert gs[0].ranks == tuple(int(r) for r in arr[:, j])  # column: varies along axis 0
        assert gs[1].ranks == tuple(int(r) for r in arr[i, :])  # row: varies along axis 1
        assert all(g.size == 2 and g.comm is not None for g in gs)
        comm_ids = [id(g.comm) for g in gs]
        for axis, g in enumerate(gs):
            run_group_calls(chk, g, f"mesh {mesh} axis {axis}", array_backend)
        # built once: the same communicators on later calls
        assert [id(g.comm) for g in C.mesh_groups(pl)] == comm_ids
        # an all_reduce along axis 1, then axis 0, sums the whole mesh
        x = np.array([float(rank + 1)])
        C.all_reduce(x, group=gs[1])
        C.all_reduce(x, group=gs[0])
        chk.same(x, np.array([float(sum(r + 1 for r in pl.rank_list))]), f"{mesh} 2-step sum")
        with sm.trace() as t:
            C.all_reduce(np.zeros(2), group=gs[0])
        chk.true(t[0].group_ranks == gs[0].ranks and t[0].group_size == 2, f"trace {t[0]}")


@pytest.mark.mpi(min_size=1)
def test_world_and_reordered_groups(chk, array_backend):
    run_group_calls(chk, C.WORLD, "WORLD", array_backend)
    g = C.new_group(list(range(size))[::-1])
    assert C.new_group(list(range(size))[::-1]) is g
    assert C.new_group() is C.WORLD and C.new_group(range(size)) is C.WORLD
    run_group_calls(chk, g, "reversed", array_backend)
    pl = sm.placement("cpu", list(range(size)))
    assert C.placement_group(pl) is C.WORLD
    (g1,) = C.mesh_groups(pl)
    assert g1 is C.WORLD


@pytest.mark.mpi(min_size=3)
def test_subset_group(chk, array_backend):
    ranks = [size - 1, 0]
    g = C.new_group(ranks)
    if rank in ranks:
        run_group_calls(chk, g, "subset", array_backend)
    else:
        assert g.comm is None and g.rank == -1 and not g.is_member()
    C.barrier()


@pytest.mark.mpi(min_size=1)
def test_group_argument_errors():
    with pytest.raises(ValueError, match="out of range"):
        C.new_group([size])
    with pytest.raises(ValueError, match="distinct"):
        C.new_group([0, 0])
    with pytest.raises(ValueError, match="at least one"):
        C.new_group([])
