"""The process's place in the world (sbpmpi.comm.world), shown as sm.env, at n = 1..4.

Rank, size and the node split are compared with what mpi4py says directly; the backend,
which makes no MPI call, must have been told the same local rank and rank count.
"""

from __future__ import annotations

import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.backend import node
from sbpmpi.comm import world

PUBLIC = ("get_rank", "get_world_size", "get_local_rank", "get_local_world_size",
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
