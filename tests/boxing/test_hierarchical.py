"""Boxing across hosts: the topology in the cost table, hierarchical plans, their results.

Pure: the cost of a collective whose group spans hosts (the slower link for the bytes
that cross), the split of groups by host, the planner's choice between the flat and the
hierarchical form, ``explain``'s account, and plans on one host unchanged by a topology.
MPI: hierarchical plans against NumPy on the whole array, with uneven splits, for a
topology given in the table (two hosts of ``n/2`` ranks, or interleaved hosts; these run
on one machine in the normal suite) and for the job's own hosts (``run_tests.py
--hosts 2``: 2 hosts x 2 ranks, and 2 x 3).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.boxing.cost import (
    DEFAULT_NETWORK,
    DEFAULT_TABLE,
    Topology,
    crossing_parties,
    factor,
    group_seconds,
    primitive_seconds,
    rounds,
)
from sbpmpi.boxing.explanation import Explanation
from sbpmpi.boxing.planner import axis_steps, candidate_plans, hierarchical_step, host_split
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import Split
from sbpmpi.runtime import cost_table

S, B = sm.sbp.split, sm.sbp.broadcast
P, PMAX, PMIN = sm.sbp.partial_sum, sm.sbp.partial_max, sm.sbp.partial_min
TWO_HOSTS = Topology((0, 0, 1, 1))
MIB = 1 << 20


def pl(ranks, world=8, device="cpu"):
    return sm.placement(device, ranks, world_size=world)


# -- the cost of a collective across hosts ---------------------------------------------------

def test_groups_inside_one_host_cost_what_they_cost_without_a_topology():
    one_host = DEFAULT_TABLE.with_topology(Topology((0,) * 8))
    two = DEFAULT_TABLE.with_topology(TWO_HOSTS)
    for prim in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast"):
        for n in (0, 64, 16 * MIB):
            flat = primitive_seconds(prim, 4, n)
            assert group_seconds(prim, [(0, 1, 2, 3)], n, table=one_host) == flat
            assert group_seconds(prim, [(0, 1, 2, 3)], n) == flat  # no topology
            assert group_seconds(prim, [(0, 1), (2, 3)], n, table=two) == \
                primitive_seconds(prim, 2, n)


def test_the_bytes_that_cross_are_charged_to_the_network():
    two = DEFAULT_TABLE.with_topology(TWO_HOSTS)
    n = 16 * MIB
    # each rank sends 2(p-1)/p n to the 3 others, 2 of them on the other host; the 2 ranks
    # of a host share its link: 2 * 1.5n * 2/3 = 2n cross it
    load = 2 * factor("all_reduce", 4) * n * 2 / 3
    assert TWO_HOSTS.link_bytes([(0, 1, 2, 3)], factor("all_reduce", 4) * n) == pytest.approx(load)
    net = DEFAULT_NETWORK.all_reduce
    # the rounds that cross hosts: those of 2 parties (the group spans 2 hosts, its ranks
    # host by host), as recursive doubling on 4 ranks crosses in one of its 2 rounds
    want = max(primitive_seconds("all_reduce", 4, n),
               net.alpha * rounds("all_reduce", 2) + net.beta * load)
    assert group_seconds("all_reduce", [(0, 1, 2, 3)], n, table=two) == pytest.approx(want)
    # the columns across hosts: two groups of one rank per host, sharing each link
    across = group_seconds("all_reduce", [(0, 2), (1, 3)], n, table=two)
    assert across == pytest.approx(net.alpha + net.beta * 2 * n)


def test_the_rounds_that_cross_count_the_hosts_a_group_spans():
    four = Topology((0, 0, 1, 1, 2, 2, 3, 3))
    assert crossing_parties("all_reduce", [(0, 1, 2, 3)], four) == 2
    assert crossing_parties("all_gather", [(0, 2, 4, 6), (1, 3, 5, 7)], four) == 4
    assert crossing_parties("all_reduce", [(0, 1), (2, 3)], four) == 1
    # all_to_all: a rank's messages to other hosts (6 of 7 on 4 hosts of 2)
    assert crossing_parties("all_to_all", [tuple(range(8))], four) == 6
    # so a flat collective of a few bytes is charged the latency of one crossing round,
    # not of every round of its group
    t = DEFAULT_TABLE.with_topology(four)
    net = DEFAULT_NETWORK.all_gather
    assert group_seconds("all_gather", [(0, 1, 2, 3)], 64, table=t) == pytest.approx(max(
        primitive_seconds("all_gather", 4, 64),
        net.alpha * rounds("all_gather", 2) + net.beta * four.link_bytes([(0, 1, 2, 3)], 48)))


def test_groups_are_split_by_host_only_where_every_host_holds_as_many_ranks():
    assert host_split([(0, 1, 2, 3)], TWO_HOSTS) == (((0, 1), (2, 3)),)
    assert host_split([(0, 1, 2, 3)], None) is None
    assert host_split([(0, 1), (2, 3)], TWO_HOSTS) is None       # inside one host
    assert host_split([(0, 2), (1, 3)], TWO_HOSTS) is None       # one rank per host
    assert host_split([(0, 1, 2)], TWO_HOSTS) is None            # 2 + 1
    inter = Topology((0, 1, 0, 1, 0, 1))
    assert host_split([(0, 1, 2, 3, 4, 5)], inter) == (((0, 2, 4), (1, 3, 5)),)
    assert host_split([(3, 2, 1, 0)], TWO_HOSTS) == (((3, 2), (1, 0)),)  # group order kept


@pytest.mark.parametrize("frm,to,kind", [(P, B, "all_reduce"), (S(0), B, "all_gather"),
                                         (P, S(0), "reduce_scatter")])
def test_hierarchical_plans_win_where_the_link_between_hosts_is_slow(frm, to, kind):
    two = DEFAULT_TABLE.with_topology(TWO_HOSTS)
    p4 = pl([0, 1, 2, 3], 4)
    a, b = Layout((4096, 512), p4, (frm,)), Layout((4096, 512), p4, (to,))  # 16 MiB
    chosen = candidate_plans(a, b, 8, two).chosen
    assert [s.name for s in chosen.steps] == [f"hier_{kind}"]
    (st,) = chosen.steps
    assert st.hosts == (((0, 1), (2, 3)),) and st.groups == ((0, 1, 2, 3),)
    flat = next(p for p in candidate_plans(a, b, 8, two).rejected
                if [s.name for s in p.steps] == [kind])
    assert chosen.seconds < flat.seconds
    # a network far faster than shared memory: the flat collective, as on one host
    h = DEFAULT_TABLE.host
    fast = two.with_topology(TWO_HOSTS, network=sm.boxing.cost.DeviceCosts.uniform(
        h.all_reduce.alpha / 10, h.all_reduce.beta / 10, h.copy.alpha, h.copy.beta))
    assert candidate_plans(a, b, 8, fast).chosen == candidate_plans(a, b, 8, DEFAULT_TABLE).chosen


def test_a_hierarchical_step_is_costed_leg_by_leg():
    two = DEFAULT_TABLE.with_topology(TWO_HOSTS)
    p4 = pl([0, 1, 2, 3], 4)
    src = Layout((1024, 1024), p4, (P,))
    (flat,) = axis_steps("all_reduce", src, 0, B, 8, DEFAULT_TABLE)
    assert axis_steps("all_reduce", src, 0, B, 8, two)[1] == hierarchical_step(flat, 8, two)
    hier = hierarchical_step(flat, 8, two)
    assert hier is not None
    n = 8 * MIB
    legs = (group_seconds("reduce_scatter", [(0, 1), (2, 3)], n, table=two)
            + group_seconds("all_reduce", [(0, 2), (1, 3)], n / 2, table=two)
            + group_seconds("all_gather", [(0, 1), (2, 3)], n, table=two))
    copy = two.host.copy.beta * n  # the reduction runs on a copy of the input
    assert hier.seconds == pytest.approx(legs + copy + 3 * two.host.step)
    assert hierarchical_step(flat, 8, DEFAULT_TABLE) is None


def test_mesh_axes_across_hosts():
    """A 2-D mesh, data parallel across hosts (axis 0), tensor parallel inside (axis 1)."""
    two = DEFAULT_TABLE.with_topology(TWO_HOSTS)
    mesh = pl([[0, 1], [2, 3]], 4)
    # axis 0's groups hold one rank per host: flat collectives, charged to the network
    a, b = Layout((4096, 512), mesh, (P, S(1))), Layout((4096, 512), mesh, (B, S(1)))
    chosen = candidate_plans(a, b, 8, two).chosen
    assert all(not s.hosts and s.groups == ((0, 2), (1, 3)) for s in chosen.steps), chosen
    assert chosen.seconds > candidate_plans(a, b, 8, DEFAULT_TABLE).chosen.seconds
    # (P, P) -> (B, B): the mesh's own axes give the hierarchy (inside a host on axis 1,
    # across on axis 0 on half the data), cheaper than one all-reduce over the 4 ranks
    a, b = Layout((4096, 512), mesh, (P, P)), Layout((4096, 512), mesh, (B, B))
    chosen = candidate_plans(a, b, 8, two).chosen
    (flat,) = axis_steps("all_reduce", a, 0, B, 8, DEFAULT_TABLE.with_topology(TWO_HOSTS), 2)[:1]
    assert chosen.seconds < flat.seconds, chosen
    across = [s for s in chosen.steps if s.groups == ((0, 2), (1, 3))]
    assert across and all(s.send_bytes <= 8 * MIB for s in across), chosen  # half of 16


def test_explain_shows_the_hosts_and_the_legs():
    two = DEFAULT_TABLE.with_topology(TWO_HOSTS)
    p4 = pl([0, 1, 2, 3], 4)
    a, b = Layout((4096, 512), p4, (P,)), Layout((4096, 512), p4, (B,))
    text = str(Explanation(candidate_plans(a, b, 8, two), np.dtype("f8"), two))
    assert "hosts: node 0 ranks 0,1; node 1 ranks 2,3" in text
    assert "hier_all_reduce" in text
    assert "inside hosts [0, 1] [2, 3]; across [0, 2] [1, 3]" in text
    assert "all_reduce(axis 0: P -> B)" in text  # the flat plan, rejected
    one = str(Explanation(candidate_plans(a, b, 8, DEFAULT_TABLE), np.dtype("f8"), DEFAULT_TABLE))
    assert "hosts:" not in one and "hier_" not in one
    assert "between hosts (2 hosts; defaults)" in str(two)
    assert "between hosts" not in str(DEFAULT_TABLE)


def _conversions():
    """Layout pairs over many placements, SBPs and shapes (even and uneven)."""
    places = [pl([0, 1, 2, 3]), pl([0, 1, 2]), pl([1, 3]), pl([[0, 1], [2, 3]]),
              pl([[0, 1, 2], [3, 4, 5]]), pl([4, 5, 6, 7])]
    for shape in ((8, 6), (7, 5), (3,)):
        vals = [B, P, PMAX] + [S(d) for d in range(len(shape))]
        for p in places:
            for s1, s2 in itertools.product(itertools.product(vals, repeat=p.ndim), repeat=2):
                yield Layout(shape, p, s1), Layout(shape, p, s2)
        for p1, p2 in ((places[0], places[1]), (places[2], places[5])):
            for s1, s2 in itertools.product(vals, repeat=2):
                yield Layout(shape, p1, (s1,)), Layout(shape, p2, (s2,))


def test_plans_on_one_host_are_unchanged_by_a_topology():
    """Every plan (steps, costs, rejected candidates) is the same with the topology of a
    job on one host as without one."""
    for base in (DEFAULT_TABLE, sm.boxing.cost.table_for_transport("staged")):
        one = base.with_topology(Topology((0,) * 8))
        n = 0
        for a, b in _conversions():
            try:
                want = candidate_plans(a, b, 8, base)
            except ValueError:
                continue
            assert candidate_plans(a, b, 8, one) == want, (a, b)
            n += 1
        assert n > 1000


# -- the cost table in use and the cache ------------------------------------------------------

def test_the_cache_keeps_the_network_row(tmp_path):
    from sbpmpi.runtime.cost_cache import read_cache, table_from, write_cache_entry

    net = DEFAULT_NETWORK.with_("all_reduce", alpha=5e-5, beta=1e-9)
    table = sm.boxing.CostTable(DEFAULT_TABLE.host, DEFAULT_TABLE.device, "measured",
                                network=net, topology=TWO_HOSTS)
    path = str(tmp_path / "c.json")
    write_cache_entry("k | 4 ranks on 2 hosts", table, path)
    entry = read_cache(path)["k | 4 ranks on 2 hosts"]
    back = table_from(entry, "k")
    assert back.network == net and back.host == table.host and back.topology is None
    plain = sm.boxing.CostTable(DEFAULT_TABLE.host, DEFAULT_TABLE.device, "one host")
    write_cache_entry("k1", plain, path)
    assert "network" not in read_cache(path)["k1"]
    assert table_from(read_cache(path)["k1"], "k1").network is None


@pytest.mark.mpi(min_size=1)
def test_the_table_in_use_carries_the_jobs_hosts():
    nodes = sm.env.topology()
    t = sm.boxing.get_cost_table()
    if sm.env.get_node_count() == 1:
        assert t.topology is None
    else:
        assert t.topology == Topology(nodes) and t.network_costs == DEFAULT_NETWORK
    prev = sm.boxing.set_cost_table(DEFAULT_TABLE)
    try:
        got = sm.boxing.get_cost_table()
        assert (got.topology is None) == (sm.env.get_node_count() == 1)
        assert got.host == DEFAULT_TABLE.host
    finally:
        sm.boxing.set_cost_table(prev)


# -- results against NumPy ----------------------------------------------------------------------

@pytest.fixture
def on_hosts():
    """Install a table with the given topology; the previous table comes back after."""
    prev = []

    def use(nodes, network=None):
        if not prev:
            prev.append(cost_table.get_cost_table())
        cost_table.set_cost_table(DEFAULT_TABLE.with_topology(Topology(tuple(nodes)), network))
    yield use
    if prev:
        cost_table.set_cost_table(prev[0])


SHAPES = [(7, 5), (13,), (3, 4, 5), (1, 3), (0, 2), (64, 33)]
# a link between hosts slow enough (100 kB/s) that the hierarchical form is the cheaper
# even for the few bytes of these shapes: the plans under test are the hierarchical ones
SLOW_NETWORK = sm.boxing.cost.DeviceCosts.uniform(alpha=30e-6, beta=1 / 1e5, copy_alpha=1e-6,
                                                  copy_beta=1 / 8e9, p2p_alpha=25e-6, step=2e-6)
DESTS = [B, S(0), S(-1)]


def _whole(parts, op):
    return {"sum": sum(parts[1:], parts[0]), "max": np.maximum.reduce(parts),
            "min": np.minimum.reduce(parts)}[op]


def _check_partial_and_split(n, dtype, want_hier):
    """P -> B, S(0), S(last) and S(d) -> B over all ranks against NumPy; the chosen plans
    are hierarchical where ``want_hier``."""
    rank = MPI.COMM_WORLD.Get_rank()
    place = sm.placement("cpu", list(range(n)))
    rng = np.random.default_rng(7)
    for shape in SHAPES:
        for op, part in (("sum", P), ("max", PMAX), ("min", PMIN)):
            parts = [(rng.standard_normal(shape) * 100).astype(dtype) for _ in range(n)]
            whole = _whole(parts, op)
            x = sm.to_global(parts[rank], placement=place, sbp=part)
            for to in DESTS:
                to = S(len(shape) + to.dim) if isinstance(to, Split) and to.dim < 0 else to
                plan = sm.explain(x, sbp=to).plan
                if want_hier and math.prod(shape) >= n:
                    assert any(s.name.startswith("hier_") for s in plan.steps), plan.summary()
                y = x.to_global(sbp=to)
                if op == "sum" and np.dtype(dtype).kind == "f":  # another order of additions
                    np.testing.assert_allclose(y.numpy(), whole, rtol=1e-12, atol=1e-9,
                                               err_msg=f"{op} -> {to}")
                else:
                    np.testing.assert_array_equal(y.numpy(), whole, err_msg=f"{op} -> {to}")
        for d in range(len(shape)):
            whole = (rng.standard_normal(shape) * 100).astype(dtype)
            x = sm.tensor(whole, placement=place, sbp=S(d))
            plan = sm.explain(x, sbp=B).plan
            if want_hier and shape[d] >= n:
                assert plan.steps[0].name.startswith("hier_all_gather"), plan.summary()
            np.testing.assert_array_equal(x.to_global(sbp=B).to_local(), whole)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("hosts", ["halves", "interleaved"])
@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_hierarchical_plans_equal_numpy(on_hosts, hosts, dtype):
    n = MPI.COMM_WORLD.Get_size()
    if n % 2:
        pytest.skip("two hosts of n/2 ranks need an even n")
    nodes = [r // (n // 2) for r in range(n)] if hosts == "halves" else [r % 2 for r in range(n)]
    on_hosts(nodes, SLOW_NETWORK)
    _check_partial_and_split(n, dtype, want_hier=True)


@pytest.mark.mpi(min_size=4)
def test_a_2d_mesh_across_hosts_equals_numpy(on_hosts):
    """Data parallel across hosts, tensor parallel inside: every conversion of the mesh."""
    n = MPI.COMM_WORLD.Get_size()
    if n != 4:
        pytest.skip("a 2 x 2 mesh")
    on_hosts([0, 0, 1, 1])
    rank = MPI.COMM_WORLD.Get_rank()
    mesh = sm.placement("cpu", [[0, 1], [2, 3]])
    rng = np.random.default_rng(3)
    vals = [B, P, S(0), S(1)]
    for s1, s2 in itertools.product(itertools.product(vals, repeat=2), repeat=2):
        whole = rng.standard_normal((9, 7))
        parts = [rng.standard_normal((9, 7)) for _ in range(4)]
        # a partial source: the parts of the ranks sum to the value
        x = sm.tensor(whole, placement=mesh, sbp=s1) if P not in s1 else None
        if x is None:
            x = sm.to_global(parts[rank], placement=mesh, sbp=(P, P)).to_global(sbp=s1)
            whole = sum(parts)
        y = x.to_global(sbp=s2)
        np.testing.assert_allclose(y.numpy(), whole, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{s1} -> {s2}")


@pytest.mark.mpi(min_size=2)
def test_the_jobs_hosts_give_hierarchical_plans_where_they_are_even():
    """On the job's own hosts (the table in use, no topology installed by the test)."""
    n = MPI.COMM_WORLD.Get_size()
    split = host_split([tuple(range(n))], sm.boxing.get_cost_table().topology)
    place = sm.placement("cpu", list(range(n)))
    x = sm.zeros(512, 1024, placement=place, sbp=P)  # 4 MiB
    text = str(sm.explain(x, sbp=B))
    if split is None:
        assert "hier_" not in text
    else:
        assert "hosts: node 0 ranks" in text and "hier_all_reduce" in text, text
    _check_partial_and_split(n, np.float64, want_hier=False)
