"""Boxing planner and cost table, without MPI and without arrays.

Plans are checked by applying their steps symbolically (modelled_result) and by the
block-coverage of their point-to-point schedules; the cost table by its formulas.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import sbpmpi as sm
from sbpmpi.boxing import conversion_cost
from sbpmpi.boxing.cost import (
    DEFAULT_TABLE,
    AlphaBeta,
    CostTable,
    DeviceCosts,
    factor,
    primitive_seconds,
    rounds,
)
from sbpmpi.boxing.plan import (
    STEP_KINDS,
    check_conversion,
    modelled_result,
    span_kind,
    transition_kind,
    why_meaningless,
)
from sbpmpi.boxing.planner import candidate_plans, plan_conversion
from sbpmpi.boxing.schedule import is_contiguous_box, slots_of, transfer_schedule
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import (
    Broadcast,
    Partial,
    Split,
    broadcast,
    partial_max,
    partial_min,
    partial_sum,
    split,
)
from sbpmpi.runtime.calibrate import Sample, _fit

W = 8  # world size assumed by the placements below (no MPI needed)


def pl(ranks, type="cpu"):
    return sm.placement(type, ranks, world_size=W)


def one_d_sbps(ndim, ops=("sum", "max", "min")):
    return [broadcast] + [Partial(o) for o in ops] + [split(d) for d in range(ndim)]


def kinds(plan):
    return [s.kind for s in plan.steps]


def L(shape, placement, sbp):
    return Layout.make(shape, placement, sbp)


BIG = (1024, 512)  # 2 MiB of float32: bandwidth decides


# -- chosen plans -------------------------------------------------------------------------------

def _chosen_or_candidate(src, dst, textbook):
    """The textbook plan is chosen, or is a candidate no cheaper than the chosen one."""
    ch = candidate_plans(src, dst, 4)
    if kinds(ch.chosen) == textbook:
        return True
    alt = [p for p in ch.rejected if kinds(p) == textbook]
    assert alt and alt[0].seconds >= ch.chosen.seconds, (src, dst, ch.chosen.summary())
    return False


@pytest.mark.parametrize("p", [2, 3, 4])
def test_textbook_plans_on_one_axis(p):
    P = pl(list(range(p)))
    # leading-dim splits: the textbook collective, no copies
    assert kinds(plan_conversion(L(BIG, P, split(0)), L(BIG, P, broadcast), 4)) == ["all_gather"]
    assert kinds(plan_conversion(L(BIG, P, partial_sum), L(BIG, P, split(0)), 4)) == \
        ["reduce_scatter"]
    assert kinds(plan_conversion(L(BIG, P, split(0)), L(BIG, P, split(1)), 4)) == ["all_to_all"]
    assert kinds(plan_conversion(L(BIG, P, split(1)), L(BIG, P, split(0)), 4)) == ["all_to_all"]
    for d in (0, 1):
        assert kinds(plan_conversion(L(BIG, P, broadcast), L(BIG, P, split(d)), 4)) == \
            ["local_slice"]
        assert kinds(plan_conversion(L(BIG, P, split(d)), L(BIG, P, partial_max), 4)) == \
            ["local_pad"]
    assert kinds(plan_conversion(L(BIG, P, broadcast), L(BIG, P, partial_sum), 4)) == \
        ["local_fill"]
    assert kinds(plan_conversion(L(BIG, P, partial_min), L(BIG, P, broadcast), 4)) in (
        ["all_reduce"], ["reduce_scatter", "all_gather"])
    assert plan_conversion(L(BIG, P, partial_sum), L(BIG, P, partial_sum), 4).steps == ()
    # a non-leading split costs a pack/unpack copy, so a detour may be modelled cheaper
    _chosen_or_candidate(L(BIG, P, split(1)), L(BIG, P, broadcast), ["all_gather"])
    _chosen_or_candidate(L(BIG, P, partial_sum), L(BIG, P, split(1)), ["reduce_scatter"])


def test_single_rank_axes_only_relabel():
    P = pl([[0], [1], [2]])  # 3x1 mesh: axis 1 has one rank
    src = L((6, 4), P, (split(0), split(1)))
    dst = L((6, 4), P, (split(0), broadcast))
    assert kinds(plan_conversion(src, dst, 8)) == ["relabel"]
    src = L((6, 4), P, (split(0), partial_sum))
    assert kinds(plan_conversion(src, dst, 8)) == ["relabel"]


def test_nd_conversion_picks_the_cheaper_axis_order():
    M = pl([[0, 1], [2, 3]])
    # slicing axis 1 first halves what axis 0 must gather
    plan = plan_conversion(L(BIG, M, (split(0), broadcast)), L(BIG, M, (broadcast, split(1))), 4)
    assert [(s.kind, s.axis) for s in plan.steps] == [("local_slice", 1), ("all_gather", 0)]
    ch = candidate_plans(L(BIG, M, (split(0), split(1))), L(BIG, M, (broadcast, broadcast)), 4)
    orders = {tuple((s.kind, s.axis) for s in p.steps) for p in (ch.chosen, *ch.rejected)}
    assert (("all_gather", 0), ("all_gather", 1)) in orders
    assert (("all_gather", 1), ("all_gather", 0)) in orders


def test_consecutive_axes_run_as_one_collective():
    M = pl([[0, 1], [2, 3]])
    P, B, S0 = partial_sum, broadcast, split(0)
    plan = plan_conversion(L(BIG, M, (P, P)), L(BIG, M, (B, B)), 4)
    assert [(s.kind, s.axes) for s in plan.steps] == [("reduce_scatter", (0, 1)),
                                                      ("all_gather", (0, 1))]
    assert plan.steps[0].groups == ((0, 1, 2, 3),)
    plan = plan_conversion(L(BIG, M, (S0, S0)), L(BIG, M, (B, B)), 4)
    assert [(s.kind, s.axes) for s in plan.steps] == [("all_gather", (0, 1))]
    C = pl([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])  # 2x2x2
    plan = plan_conversion(L(BIG, C, (B, P, P)), L(BIG, C, (B, S0, S0)), 4)
    assert [(s.kind, s.axes) for s in plan.steps] == [("reduce_scatter", (1, 2))]
    assert plan.steps[0].groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    plan = plan_conversion(L(BIG, C, (S0, S0, S0)), L(BIG, C, (B, B, B)), 4)
    assert [(s.kind, s.axes) for s in plan.steps] == [("all_gather", (0, 1, 2))]
    # a later split of the same dim, or another op further in, forbids the flat step
    assert span_kind((S0, S0, S0), C.hierarchy, 0, 1, B) is None
    assert span_kind((P, P, partial_max), C.hierarchy, 0, 1, B) is None
    assert span_kind((P, P, B), C.hierarchy, 0, 1, B) == "all_reduce"


def test_same_dim_split_on_two_axes_is_planned_correctly():
    # (S0, S0): axis 1 subdivides axis 0's blocks, so axis 0 cannot change alone
    M = pl([[0, 1], [2, 3]])
    src, dst = L((8, 3), M, (split(0), split(0))), L((8, 3), M, (broadcast, split(0)))
    assert transition_kind(src.sbp, M.hierarchy, 0, broadcast) is None
    for plan in (candidate_plans(src, dst, 4).chosen, *candidate_plans(src, dst, 4).rejected):
        assert modelled_result(plan) == dst


def test_mixed_partial_ops_reduce_inner_axis_first():
    M = pl([[0, 1], [2, 3]])
    src = L((4, 4), M, (partial_sum, partial_max))
    assert transition_kind(src.sbp, M.hierarchy, 0, broadcast) is None
    assert transition_kind(src.sbp, M.hierarchy, 1, broadcast) == "all_reduce"
    plan = plan_conversion(src, L((4, 4), M, (broadcast, broadcast)), 4)
    first_reduction = next(s for s in plan.steps if s.kind in ("all_reduce", "reduce_scatter"))
    assert first_reduction.axis == 1
    assert modelled_result(plan) == L((4, 4), M, (broadcast, broadcast))


def test_between_placements_moves_the_smaller_side():
    a, b = pl([0, 1]), pl([2, 3])
    plan = plan_conversion(L(BIG, a, split(0)), L(BIG, b, broadcast), 4)
    # sending halves point to point and gathering on the destination beats gathering first
    assert "send_recv" in kinds(plan)
    assert kinds(plan)[0] != "all_gather"
    assert modelled_result(plan) == L(BIG, b, broadcast)


def test_broadcast_step_fans_out_from_one_rank():
    src, dst = L(BIG, pl([0]), broadcast), L(BIG, pl(list(range(8))), broadcast)
    plan = plan_conversion(src, dst, 4)
    assert kinds(plan) == ["broadcast"]
    assert plan.steps[0].root == 0 and plan.steps[0].groups == (tuple(range(8)),)


def test_cpu_cuda_conversion_is_a_local_copy():
    src, dst = L((4, 6), pl([0, 1]), split(0)), L((4, 6), pl([0, 1], "cuda"), split(0))
    plan = plan_conversion(src, dst, 8)
    assert kinds(plan) == ["send_recv"]
    assert plan.steps[0].send_bytes == 0 and plan.steps[0].messages == 0
    assert all(t.src == t.dst for t in transfer_schedule(src, dst))


# -- two calibrations flip the choice --------------------------------------------------------------

def _table(**overrides):
    host = DEFAULT_TABLE.host
    for prim, (alpha, beta) in overrides.items():
        host = host.with_(prim, alpha, beta)
    return CostTable(host, DEFAULT_TABLE.device, source="test")


def test_two_calibrations_flip_p_to_b():
    P = pl([0, 1, 2, 3])
    src, dst = L(BIG, P, partial_sum), L(BIG, P, broadcast)
    fast_allreduce = _table(all_reduce=(1e-6, 1e-12), reduce_scatter=(1e-5, 1e-9))
    slow_allreduce = _table(all_reduce=(1e-4, 1e-8))
    assert kinds(plan_conversion(src, dst, 4, fast_allreduce)) == ["all_reduce"]
    assert kinds(plan_conversion(src, dst, 4, slow_allreduce)) == ["reduce_scatter", "all_gather"]
    # the loser is listed among the rejected candidates with a higher cost
    ch = candidate_plans(src, dst, 4, fast_allreduce)
    rs_ag = [p for p in ch.rejected if kinds(p) == ["reduce_scatter", "all_gather"]]
    assert rs_ag and rs_ag[0].seconds > ch.chosen.seconds


def test_two_calibrations_flip_split_to_split():
    P = pl([0, 1, 2, 3])
    src, dst = L(BIG, P, split(0)), L(BIG, P, split(1))
    assert kinds(plan_conversion(src, dst, 4, _table())) == ["all_to_all"]
    slow_a2a = _table(all_to_all=(1e-3, 1e-7), p2p=(1e-3, 1e-7))
    assert kinds(plan_conversion(src, dst, 4, slow_a2a)) == ["all_gather", "local_slice"]


def test_cost_table_changes_modelled_cost():
    P = pl([0, 1, 2, 3])
    src, dst = L(BIG, P, split(0)), L(BIG, P, broadcast)
    slow = _table(all_gather=(1e-5, 1e-8))
    assert plan_conversion(src, dst, 4, slow).seconds > plan_conversion(src, dst, 4).seconds


# -- modelled results over the whole matrix --------------------------------------------------------

SHAPES = [(4, 6), (5, 7), (2, 3), (0, 3), (7,), ()]


def _placements():
    yield "same 1-d", pl([0, 1, 2]), pl([0, 1, 2])
    yield "same 2x2", pl([[0, 1], [2, 3]]), pl([[0, 1], [2, 3]])
    yield "disjoint", pl([0, 1]), pl([2, 3, 4])
    yield "overlapping", pl([0, 1, 2]), pl([1, 2, 3])
    yield "reversed", pl([0, 1, 2, 3]), pl([3, 2, 1, 0])
    yield "mesh shape", pl([[0, 1], [2, 3]]), pl([[3, 1, 2]])
    yield "2x2 to 1-d", pl([[0, 1], [2, 3]]), pl([4, 5])
    yield "2x2x2", pl([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]), pl([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    yield "cpu to cuda", pl([0, 1]), pl([1, 0], "cuda")


@pytest.mark.parametrize("name,p1,p2", list(_placements()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_plan_models_its_destination(name, p1, p2):
    for shape in SHAPES:
        nd = len(shape)
        s1s = list(itertools.product(one_d_sbps(nd), repeat=p1.ndim))
        s2s = list(itertools.product(one_d_sbps(nd), repeat=p2.ndim))
        if p1.ndim * p2.ndim > 4:  # keep it fast: 3-d meshes sample fewer pairs
            pairs = list(itertools.product(s1s, s2s))[::97]
        elif p1.ndim * p2.ndim > 1 and len(shape) > 1:  # 2-d meshes sample pairs
            pairs = list(itertools.product(s1s, s2s))[::7]
        else:
            pairs = list(itertools.product(s1s, s2s))
        for s1, s2 in pairs:
            src, dst = L(shape, p1, s1), L(shape, p2, s2)
            if why_meaningless(src, dst) is not None:
                with pytest.raises(ValueError, match="cannot convert partial"):
                    check_conversion(src, dst)
                assert conversion_cost(src, dst, 4) == math.inf
                continue
            ch = candidate_plans(src, dst, 4)
            for plan in (ch.chosen, *ch.rejected):
                assert modelled_result(plan) == dst, (name, shape, s1, s2, plan.summary())
                for st in plan.steps:
                    assert st.kind in STEP_KINDS
                    assert st.apply(st.src) == st.dst
                    assert st.seconds > 0
            assert ch.chosen.seconds <= min((p.seconds for p in ch.rejected), default=math.inf)
            assert conversion_cost(src, dst, 4) == pytest.approx(ch.chosen.seconds)
            if src == dst:
                assert ch.chosen.steps == ()


def test_plans_are_deterministic_and_cached():
    M = pl([[0, 1], [2, 3]])
    src, dst = L((5, 7), M, (partial_sum, split(1))), L((5, 7), pl([3, 1, 0]), split(0))
    a = candidate_plans(src, dst, 4)
    b = candidate_plans(src, dst, 4)
    assert a is b
    from sbpmpi.boxing import planner as plan_mod

    plan_mod._choice.cache_clear()
    c = candidate_plans(src, dst, 4)
    assert c == a  # same result from scratch (hash-order independent)


# -- point-to-point schedules ------------------------------------------------------------------------

def _coverage(src, dst):
    """Per destination rank and slot: how often each element of its block is received."""
    cov = {}
    for r in dst.placement.rank_list:
        shape = dst.local_shape(r)
        cov[r] = [np.zeros(shape, dtype=int) for _ in range(max(slots_of(src, dst, r), 1))]
    for t in transfer_schedule(src, dst):
        assert t.src in src.placement and t.dst in dst.placement
        b1, b2 = src.local_ranges(t.src), dst.local_ranges(t.dst)
        for (a, b), (a1, b1_), (a2, b2_) in zip(t.box, b1, b2):
            assert a1 <= a < b <= b1_ and a2 <= a < b <= b2_
        cov[t.dst][t.slot][tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(t.box, b2))] += 1
    return cov


def test_transfer_schedules_tile_every_destination_block_once():
    layouts = [
        (pl([0, 1, 2]), pl([3, 4])), (pl([[0, 1], [2, 3]]), pl([4, 1, 0])),
        (pl([0, 1]), pl([[1, 0], [2, 3]])), (pl([0, 1, 2, 3]), pl([0, 1, 2, 3])),
    ]
    for p1, p2 in layouts:
        for shape in [(5, 7), (2, 3), (0, 4), ()]:
            for s1 in itertools.product(one_d_sbps(len(shape), ("sum",)), repeat=p1.ndim):
                for s2 in itertools.product(one_d_sbps(len(shape), ("sum",)), repeat=p2.ndim):
                    src, dst = L(shape, p1, s1), L(shape, p2, s2)
                    q1 = math.prod(p1.hierarchy[a] for a in src.partial_axes())
                    q2 = math.prod(p2.hierarchy[a] for a in dst.partial_axes())
                    # contributions are spread over the destination's partial ranks exactly once
                    total = sum(slots_of(src, dst, r) for r in p2.rank_list)
                    replicas = p2.size // q2
                    assert total == replicas * q1
                    assert all(slots_of(src, dst, r) in (q1 // q2, -(-q1 // q2))
                               for r in p2.rank_list)
                    for r, slots in _coverage(src, dst).items():
                        for k, c in enumerate(slots):
                            if k < slots_of(src, dst, r):
                                assert (c == 1).all(), (src, dst, r, k)
                            else:
                                assert (c == 0).all()


def test_contiguous_boxes():
    assert is_contiguous_box(((0, 2), (0, 5)), (4, 5))
    assert is_contiguous_box(((1, 2), (1, 3)), (4, 5))
    assert not is_contiguous_box(((0, 2), (1, 3)), (4, 5))
    assert is_contiguous_box(((0, 0), (1, 3)), (4, 5))
    assert is_contiguous_box(((0, 1), (2, 3), (0, 4)), (3, 4, 4))
    assert not is_contiguous_box(((0, 2), (2, 3), (0, 4)), (3, 4, 4))
    assert is_contiguous_box((), ())


# -- meaning, errors, printing --------------------------------------------------------------------

def test_meaningless_partial_conversions_are_errors():
    P = pl([0, 1])
    for a, b in [(partial_max, partial_sum), (partial_sum, partial_min), (partial_min, partial_max)]:
        with pytest.raises(ValueError, match=f"cannot convert partial_{a.op} to partial_{b.op}"):
            check_conversion(L((3,), P, a), L((3,), P, b))
        assert conversion_cost(L((3,), P, a), L((3,), P, b), 4) == math.inf
    # the same op on other placements is fine, and mixed ops may become non-partial
    check_conversion(L((3,), P, partial_max), L((3,), pl([2, 3, 4]), partial_max))
    M = pl([[0, 1], [2, 3]])
    check_conversion(L((3,), M, (partial_sum, partial_max)), L((3,), M, (broadcast, split(0))))
    check_conversion(L((3,), P, split(0)), L((3,), M, (partial_sum, partial_max)))
    with pytest.raises(ValueError, match="keeps the global shape"):
        check_conversion(L((3,), P, split(0)), L((4,), P, split(0)))


def test_plan_and_step_print_as_tables():
    P = pl([0, 1, 2, 3])
    ch = candidate_plans(L(BIG, P, partial_sum), L(BIG, P, split(1)), 4)
    text = str(ch.chosen)
    assert "reduce_scatter" in text and "est. time" in text and "send/rank" in text
    assert "[0, 1, 2, 3]" in text
    for p in ch.rejected:
        assert p.summary() and p.seconds >= ch.chosen.seconds
    st = ch.chosen.steps[0]
    assert st.send_bytes == math.ceil(3 / 4 * BIG[0] * BIG[1] * 4)
    with pytest.raises(ValueError, match="expects"):
        st.apply(L(BIG, P, broadcast))


def test_uneven_steps_are_named_v():
    P = pl([0, 1, 2])
    plan = plan_conversion(L((7, 1000), P, split(0)), L((7, 1000), P, broadcast), 4)
    assert plan.steps[0].name == "all_gather_v"
    plan = plan_conversion(L((6, 1000), P, split(0)), L((6, 1000), P, broadcast), 4)
    assert plan.steps[0].name == "all_gather"


# -- cost table -----------------------------------------------------------------------------------

def test_cost_formulas_are_the_ring_volumes():
    T = 1 << 20
    for p in (2, 3, 4, 8):
        assert factor("all_gather", p) * T == pytest.approx((p - 1) / p * T)
        assert factor("all_reduce", p) * T == pytest.approx(2 * (p - 1) / p * T)
        assert factor("reduce_scatter", p) * T == pytest.approx((p - 1) / p * T)
        assert factor("all_to_all", p) * T == pytest.approx((p - 1) / p ** 2 * T)
        assert factor("p2p", p) == 1
        ab = DEFAULT_TABLE.host.all_gather
        assert primitive_seconds("all_gather", p, T) == pytest.approx(
            ab.alpha * rounds("all_gather", p) + ab.beta * (p - 1) / p * T)
    assert primitive_seconds("all_reduce", 1, T) == 0
    assert DEFAULT_TABLE.device != DEFAULT_TABLE.host
    assert primitive_seconds("all_gather", 4, T, "cuda") != primitive_seconds("all_gather", 4, T)
    text = str(DEFAULT_TABLE)
    assert "all_to_all" in text and "GB/s" in text


def test_cost_table_rejects_nonsense():
    with pytest.raises(ValueError, match="alpha must be a positive"):
        AlphaBeta(-1.0, 1e-9)
    with pytest.raises(ValueError, match="device type"):
        DEFAULT_TABLE.params("tpu")
    with pytest.raises(TypeError, match="CostTable"):
        sm.boxing.set_cost_table("fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="primitive"):
        DEFAULT_TABLE.host.get("gossip")


def test_calibration_fit_recovers_alpha_and_beta():
    alpha, beta = 3e-6, 2e-10
    p = 4
    for prim in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast"):
        r, f = rounds(prim, p), factor(prim, p)
        small, large = alpha * r + beta * f * 64, alpha * r + beta * f * (1 << 22)
        ab = _fit(prim, p, Sample(small, 64), Sample(large, 1 << 22), AlphaBeta(1, 1))
        assert ab.alpha == pytest.approx(alpha) and ab.beta == pytest.approx(beta)
    old = AlphaBeta(1e-6, 1e-9)
    assert _fit("all_gather", 1, Sample(1e-6, 64), Sample(1e-3, 1 << 22), old) is old


def test_set_cost_table_changes_conversion_cost():
    P = pl([0, 1, 2, 3])
    src, dst = L(BIG, P, split(0)), L(BIG, P, broadcast)
    base = conversion_cost(src, dst, 4)
    slow = CostTable(DeviceCosts.uniform(1e-4, 1e-8, 1e-5, 1e-9), DEFAULT_TABLE.device, "slow")
    prev = sm.boxing.set_cost_table(slow)
    try:
        assert conversion_cost(src, dst, 4) > base
    finally:
        sm.boxing.set_cost_table(prev)
    assert conversion_cost(src, dst, 4) == base
    assert conversion_cost(src, src, 4) == 0.0


def test_larger_tensors_cost_more():
    P = pl([0, 1, 2])
    for s1, s2 in [(split(0), broadcast), (partial_sum, broadcast), (split(0), split(1))]:
        small = conversion_cost(L((30, 30), P, s1), L((30, 30), P, s2), 4)
        large = conversion_cost(L((3000, 300), P, s1), L((3000, 300), P, s2), 4)
        assert 0 < small < large


def test_partial_broadcast_values_are_kinds():
    assert isinstance(broadcast, Broadcast) and isinstance(split(1), Split)
