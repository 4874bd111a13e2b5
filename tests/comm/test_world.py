"""The process's place in the world (sbpmpi.comm.lifecycle.world), shown as sm.env, at n = 1..4.

Rank, size and the node split are compared with what mpi4py says directly; the backend,
which makes no MPI call, must have been told the same local rank and rank count. The
nodes (hosts) of the ranks are checked against MPI's shared-memory split on every rank:
on one host all ranks are node 0; across hosts (``run_tests.py --hosts``) node ``k`` is
the ``k``-th host by its lowest rank.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.backend import node
from sbpmpi.comm.lifecycle import world

PUBLIC = ("get_rank", "get_world_size", "get_local_rank", "get_local_world_size",
          "get_node_rank", "get_node_count", "node_of", "node_ranks", "topology",
          "set_launcher_env", "lone_task_warning", "expect_world", "ranks_hint")


def test_env_shows_the_functions_of_comm_world():
    for name in PUBLIC:
        assert getattr(sm.env, name) is getattr(world, name), name
        assert name in sm.env.__all__ and name in dir(sm.env)
    assert sm.launch.expect_world is world.expect_world
    assert sm.launch.ranks_hint is world.ranks_hint
    with pytest.raises(AttributeError, match="'sbpmpi.env' has no attribute 'get_ranks'"):
        sm.env.get_ranks  # noqa: B018


@pytest.mark.parametrize("rank,size", [(-1, 2), (2, 2), (0, 0)])
def test_local_ranks_out_of_range_are_refused(rank, size):
    with pytest.raises(ValueError, match=f"local rank {rank} is not in range for {size} ranks"):
        node.set_local_ranks(rank, size)


@pytest.mark.mpi(min_size=1)
def test_rank_size_and_node_split_match_mpi():
    w = MPI.COMM_WORLD
    shared = w.Split_type(MPI.COMM_TYPE_SHARED, key=w.Get_rank())
    try:
        want = (w.Get_rank(), w.Get_size(), shared.Get_rank(), shared.Get_size())
    finally:
        shared.Free()
    got = (sm.env.get_rank(), sm.env.get_world_size(), sm.env.get_local_rank(),
           sm.env.get_local_world_size())
    assert got == want
    assert node.local_ranks() == node.LocalRanks(want[2], want[3])
    every = w.allgather(got)
    assert sorted(r for r, *_ in every) == list(range(want[1]))  # each rank once
    assert {s for _, s, *_ in every} == {want[1]}


def _shared_groups() -> list[tuple[int, ...]]:
    """The world ranks of each shared-memory group (host), ordered by lowest rank, as MPI
    says directly."""
    w = MPI.COMM_WORLD
    shared = w.Split_type(MPI.COMM_TYPE_SHARED, key=w.Get_rank())
    try:
        mine = tuple(shared.allgather(w.Get_rank()))
    finally:
        shared.Free()
    return sorted(set(w.allgather(mine)))


@pytest.mark.mpi(min_size=1)
def test_nodes_are_the_hosts_ordered_by_lowest_rank():
    hosts = _shared_groups()
    want = [0] * MPI.COMM_WORLD.Get_size()
    for k, ranks in enumerate(hosts):
        for r in ranks:
            want[r] = k
    assert sm.env.topology() == tuple(want)
    assert sm.env.get_node_count() == len(hosts)
    assert sm.env.get_node_rank() == want[MPI.COMM_WORLD.Get_rank()]
    assert [sm.env.node_of(r) for r in range(len(want))] == want
    for k, ranks in enumerate(hosts):
        assert sm.env.node_ranks(k) == ranks
        # local rank j of a node is its j-th rank
        if MPI.COMM_WORLD.Get_rank() in ranks:
            assert ranks.index(MPI.COMM_WORLD.Get_rank()) == sm.env.get_local_rank()
    # the hosts' names agree: one processor name per node
    names = MPI.COMM_WORLD.allgather(MPI.Get_processor_name())
    assert len({names[r] for r in range(len(want))}) == len(hosts), names


@pytest.mark.mpi(min_size=1)
def test_numpy_integers_name_ranks_and_nodes():
    """``node_of(pl.ranks[0])``: a placement's ranks are NumPy integers, and both
    functions take them as ``sm.placement`` does."""
    n = MPI.COMM_WORLD.Get_size()
    pl = sm.placement("cpu", list(range(n)))
    assert isinstance(pl.ranks[0], np.integer)
    assert sm.env.node_of(pl.ranks[0]) == 0  # rank 0 is on node 0 by definition
    assert [sm.env.node_of(r) for r in pl.ranks.flat] == list(sm.env.topology())
    for r, typ in zip(range(n), (np.int64, np.int32, np.uint8, np.int16)):
        assert sm.env.node_of(typ(r)) == sm.env.node_of(r)
    assert sm.env.node_ranks(np.int64(0)) == sm.env.node_ranks(0)
    with pytest.raises(TypeError, match="rank must be an int, got bool"):
        sm.env.node_of(np.bool_(True))
    with pytest.raises(TypeError, match="rank must be an int, got float64"):
        sm.env.node_of(np.float64(0))
    with pytest.raises(ValueError, match=f"rank {n} is out of range"):
        sm.env.node_of(np.int64(n))


@pytest.mark.mpi(min_size=1)
def test_nodes_and_ranks_that_do_not_exist_are_refused():
    n, k = MPI.COMM_WORLD.Get_size(), sm.env.get_node_count()
    with pytest.raises(ValueError, match=f"rank {n} is out of range for a world of {n}"):
        sm.env.node_of(n)
    with pytest.raises(ValueError, match=f"node {k} does not exist: the job runs on {k} node"):
        sm.env.node_ranks(k)
    with pytest.raises(TypeError, match="rank must be an int, got str '0'"):
        sm.env.node_of("0")
    with pytest.raises(TypeError, match="node must be an int, got bool True"):
        sm.env.node_ranks(True)
