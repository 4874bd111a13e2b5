"""Placement by node, as in OneFlow: ``sm.placement(type, {node: [local ranks]})``.

Node ``k`` is the ``k``-th host ordered by its lowest world rank; local rank ``j`` of a
node is its ``j``-th rank in rank order; the placement is 1-D over those world ranks,
node by node. The pure tests give ``core.placement`` a topology of their own (two hosts,
interleaved hosts); the MPI tests use the job's, on one host in the normal suite and at
2 hosts x 2 ranks, 2 x 1 and 2 x 3 under ``run_tests.py --hosts 2``.
"""

from __future__ import annotations

import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core import placement as core_placement


@pytest.fixture
def topology(monkeypatch):
    """Set the nodes of the ranks ``core.placement`` sees (restored after the test)."""
    def use(nodes):
        monkeypatch.setattr(core_placement, "_topology_source", [lambda: nodes])
    return use


def test_one_host(topology):
    topology((0, 0, 0))
    assert sm.placement("cpu", {0: [0, 1]}, world_size=3).rank_list == (0, 1)
    assert sm.placement("cpu", {0: [2, 0]}, world_size=3).rank_list == (2, 0)
    assert sm.placement("cpu", {0: 1}, world_size=3).rank_list == (1,)
    assert sm.placement("cpu", {0: range(3)}, world_size=3).rank_list == (0, 1, 2)


def test_two_hosts_of_two_ranks(topology):
    topology((0, 0, 1, 1))
    p = sm.placement("cpu", {0: [0, 1], 1: [0, 1]}, world_size=4)
    assert p.rank_list == (0, 1, 2, 3) and p.hierarchy == (4,)
    assert p == sm.placement("cpu", [0, 1, 2, 3], world_size=4)
    # nodes in ascending order whatever the mapping's order; local ranks as given
    assert sm.placement("cpu", {1: [1], 0: [0]}, world_size=4).rank_list == (0, 3)
    assert sm.placement("cuda", {1: [1, 0]}, world_size=4).rank_list == (3, 2)


def test_interleaved_hosts(topology):
    # ranks 0, 2 on the first host (it holds rank 0), 1, 3 on the second
    topology((0, 1, 0, 1))
    assert sm.placement("cpu", {0: [0, 1], 1: [0, 1]}, world_size=4).rank_list == (0, 2, 1, 3)
    assert sm.placement("cpu", {1: [1]}, world_size=4).rank_list == (3,)


@pytest.mark.parametrize("nodes,err,says", [
    ({2: [0]}, ValueError, "placement node 2 does not exist: the job runs on 2 nodes "
                           "(nodes 0..1)"),
    ({-1: [0]}, ValueError, "placement node -1 does not exist"),
    ({1: [2]}, ValueError, "placement node 1 has no local rank 2: it runs 2 ranks "
                           "(local ranks 0..1)"),
    ({0: [0, 0]}, ValueError, "must be distinct"),
    ({0: [0.5]}, TypeError, "placement local ranks must be integers, got float 0.5 for node 0"),
    ({"0": [0]}, TypeError, "placement nodes must be integers, got str '0'"),
    ({True: [0]}, TypeError, "placement nodes must be integers, got bool True"),
    ({}, ValueError, "must name at least one rank, got an empty mapping"),
])
def test_nodes_and_local_ranks_that_do_not_exist(topology, nodes, err, says):
    topology((0, 0, 1, 1))
    with pytest.raises(err) as e:
        sm.placement("cpu", nodes, world_size=4)
    assert says in str(e.value)


@pytest.mark.parametrize("nodes,says", [
    ({0: []}, "placement {0: []} names no rank: node 0 has an empty list of local ranks "
              "(expected at least one local rank per node, e.g. {0: [0]})"),
    ({1: (), 0: []}, "nodes 0, 1 have an empty list of local ranks"),
])
def test_nodes_with_empty_lists_of_local_ranks_are_named(topology, nodes, says):
    topology((0, 0, 1, 1))
    with pytest.raises(ValueError) as e:
        sm.placement("cpu", nodes, world_size=4)
    assert says in str(e.value) and "empty mapping" not in str(e.value)


def test_an_empty_list_beside_a_node_with_ranks_names_those_ranks(topology):
    topology((0, 0, 1, 1))
    assert sm.placement("cpu", {0: [], 1: [1]}, world_size=4).rank_list == (3,)


def _job_nodes() -> list[tuple[int, ...]]:
    return [sm.env.node_ranks(k) for k in range(sm.env.get_node_count())]


@pytest.mark.mpi(min_size=1)
def test_placement_by_node_on_this_job():
    hosts = _job_nodes()
    every = sm.placement("cpu", {k: list(range(len(r))) for k, r in enumerate(hosts)})
    assert every.rank_list == tuple(r for ranks in hosts for r in ranks)
    # the first rank of every host, and the last of the first host
    firsts = sm.placement("cpu", {k: [0] for k in range(len(hosts))})
    assert firsts.rank_list == tuple(r[0] for r in hosts)
    assert sm.placement("cpu", {0: [len(hosts[0]) - 1]}).rank_list == (hosts[0][-1],)
    n = MPI.COMM_WORLD.Get_size()
    if sm.env.topology() == (0, 0, 1, 1):  # 2 hosts x 2 ranks
        assert sm.placement("cpu", {0: [0, 1], 1: [0, 1]}).rank_list == (0, 1, 2, 3)
    if sm.env.topology() == (0, 1):  # 2 hosts x 1 rank
        assert sm.placement("cpu", {0: [0], 1: [0]}).rank_list == (0, 1)
    if len(hosts) == 1:  # one host: the OneFlow example
        assert sm.placement("cpu", {0: list(range(n))}).rank_list == tuple(range(n))
    # a tensor placed by node holds the right blocks
    x = sm.arange(10 * every.size, placement=every, sbp=sm.sbp.split(0))
    me = MPI.COMM_WORLD.Get_rank()
    i = every.rank_list.index(me)
    assert x.to_local().tolist() == list(range(10 * i, 10 * i + 10))


@pytest.mark.mpi(min_size=1)
def test_nodes_that_do_not_exist_in_this_job_raise_on_every_rank():
    k = sm.env.get_node_count()
    with pytest.raises(ValueError, match=f"placement node {k} does not exist: the job runs on "
                                         f"{k} node"):
        sm.placement("cpu", {k: [0]})
    m = len(sm.env.node_ranks(0))
    with pytest.raises(ValueError, match=f"placement node 0 has no local rank {m}"):
        sm.placement("cpu", {0: [m]})
