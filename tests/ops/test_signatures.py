"""Signature tables, their resolution, inference and argument checks: metadata only, no MPI.

Tensors here are GlobalTensors with empty shards on placements of a pretend world of
4 ranks: inference and validation never look at data or communicate. Large searches
(3-D meshes, 4-D tensors) are pruned and still choose well.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from cost_oracle import independent_total

import sbpmpi as sm
from sbpmpi import boxing
from sbpmpi.boxing.reference import assemble
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import Broadcast, Partial, Split, broadcast, partial_sum, split
from sbpmpi.ops import infer
from sbpmpi.ops.elementwise import ADD, MUL, NEG
from sbpmpi.ops.linalg import MATMUL
from sbpmpi.ops.reduction import MAX, SUM
from sbpmpi.ops.shape import reshape_matches
from sbpmpi.ops.signature import (
    PMAX,
    S_D,
    B,
    DimMatch,
    P,
    S,
    Signature,
    admissible,
    format_table,
    resolve,
)
from sbpmpi.tensor import GlobalTensor
from sbpmpi.testing import (
    SMALL_SEARCH,
    input_sbps,
    make_shards,
    sbp_combos,
    signature_search_cases,
    tolerance,
)

W = 4  # pretend world size


def pl(ranks, type="cpu"):
    return sm.placement(type, ranks, world_size=W)


def fake(shape, sbp, ranks=(0, 1), dtype=np.float64, type="cpu"):
    """A GlobalTensor with the given layout and no data (enough for inference)."""
    lay = Layout.make(shape, pl(list(ranks), type), sbp)
    return GlobalTensor(np.empty(0, dtype=dtype), lay, dtype)


def strs(rows):
    return [str(r) for r in rows]


# ---- tables are plain, readable data -------------------------------------------------------

def test_matmul_table_is_s8():
    rows = resolve(MATMUL, {"batch": ()}, [2, 2], 2)
    assert strs(rows) == ["(S(0), B) -> S(0)", "(B, S(1)) -> S(1)", "(S(1), S(0)) -> P",
                          "(P, B) -> P", "(B, P) -> P", "(B, B) -> B"]
    assert str(MATMUL[0]) == "(S(-2), B) -> S(-2)"
    assert str(MATMUL[-1]) == "(S(batch), S(batch)) -> S(batch)"
    assert sm.matmul.table is MATMUL
    text = format_table("matmul", MATMUL)
    assert text.splitlines()[0] == "matmul:" and "(S(-1), S(-2)) -> P" in text


def test_tables_are_frozen_and_have_a_broadcast_row():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MATMUL[0].output = broadcast  # type: ignore[misc]
    for name, op in sm.ops.OPS.items():
        assert isinstance(op.table, tuple) and op.table, name
        assert all(isinstance(sig, Signature) for sig in op.table), name
        assert any(all(isinstance(p, Broadcast) for p in sig.inputs)
                   and isinstance(sig.output, Broadcast) for sig in op.table), name
        # sm.<name> is the op exactly when the registry makes it public
        assert (getattr(sm, name, None) is op) == sm.ops.REGISTRY[name].public, name


def test_signature_checks_its_fields():
    with pytest.raises(ValueError, match="condition"):
        Signature((B,), B, when="int")
    from sbpmpi.ops.signature import AnySplit
    with pytest.raises(ValueError, match="one wildcard"):
        Signature((AnySplit("d"), AnySplit("r")), B)
    assert str(Signature((PMAX, B), PMAX, when="float")) == "(P(max), B) -> P(max)  [float]"


# ---- resolution ------------------------------------------------------------------------------

def test_batched_matmul_rows():
    a, b = fake((2, 3, 4), split(0)), fake((4, 5), broadcast)
    call = sm.matmul.build(a, b)
    rows = strs(resolve(call.table, call.dims, [3, 2], 3))
    assert rows == ["(S(1), B) -> S(1)", "(B, S(1)) -> S(2)", "(S(2), S(0)) -> P", "(P, B) -> P",
                    "(B, P) -> P", "(B, B) -> B", "(S(0), B) -> S(0)"]
    call = sm.matmul.build(fake((2, 3, 4), split(0)), fake((2, 4, 5), split(0)))
    assert "(S(0), S(0)) -> S(0)" in strs(resolve(call.table, call.dims, [3, 3], 3))
    call = sm.matmul.build(fake((1, 3, 4), split(0)), fake((2, 4, 5), split(0)))
    assert "(B, S(0)) -> S(0)" in strs(resolve(call.table, call.dims, [3, 3], 3))


def test_elementwise_broadcast_rows():
    call = sm.add.build(fake((3, 1), broadcast), fake((1, 4), broadcast))
    rows = strs(resolve(call.table, call.dims, [2, 2], 2))
    assert rows[:2] == ["(S(0), B) -> S(0)", "(B, S(1)) -> S(1)"]
    call = sm.add.build(fake((3, 4), broadcast), fake((4,), broadcast))
    assert strs(resolve(call.table, call.dims, [2, 1], 2))[:2] == [
        "(S(0), B) -> S(0)", "(S(1), S(0)) -> S(1)"]


def test_scalar_operand_is_a_fixed_broadcast():
    call = sm.add.build(fake((3, 4), partial_sum), 1.5)
    rows = strs(resolve(call.table, call.dims, [2, 0], 2, fixed=[False, True]))
    assert "(P, P) -> P" not in rows and "(P, B) -> P" not in rows
    assert "(P(max), B) -> P(max)" in rows and "(S(0), B) -> S(0)" in rows
    call = sm.mul.build(2.0, fake((3, 4), partial_sum))
    rows = strs(resolve(call.table, call.dims, [0, 2], 2, fixed=[True, False]))
    assert "(B, P) -> P" in rows and "(P, B) -> P" not in rows


def test_reduction_rows():
    call = sm.sum.build(fake((3, 4), broadcast), 1)
    assert strs(resolve(call.table, call.dims, [2], 1)) == [
        "(S(0),) -> S(0)", "(S(1),) -> P", "(B,) -> B", "(P,) -> P"]
    call = sm.max.build(fake((2, 3, 4), broadcast), (0, 2), keepdim=True)
    assert strs(resolve(call.table, call.dims, [3], 3)) == [
        "(S(1),) -> S(1)", "(S(0),) -> P(max)", "(S(2),) -> P(max)", "(B,) -> B",
        "(P(max),) -> P(max)"]
    assert MAX[1].output == PMAX and SUM[1].output == P


def test_admissible_keeps_partials_exact():
    rows = resolve(MUL, {"d": ()}, [2, 2], 2)
    pb = next(r for r in rows if str(r) == "(P, B) -> P")
    f64, f32, i32 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int32)
    assert admissible(pb, [f64, f64], f64)
    assert not admissible(pb, [i32, f64], f64)       # int partial sum promoted to float
    assert not admissible(pb, [np.dtype(bool), i32], np.dtype(np.int64))  # "or" vs "+"
    rows = resolve(ADD, {"d": ()}, [2, 2], 2)
    mb = next(r for r in rows if str(r) == "(P(max), B) -> P(max)")
    assert admissible(mb, [f32, f32], f32)
    assert not admissible(mb, [i32, i32], i32)       # identity iinfo.min + b wraps
    neg = resolve(NEG, {"d": ()}, [2], 2)
    assert [str(r) for r in neg if not admissible(r, [i32], i32)] == [
        "(P(max),) -> P(min)", "(P(min),) -> P(max)"]


def test_dims_a_reshape_keeps():
    assert reshape_matches((3, 4), (3, 2, 2)) == (DimMatch((0,), 0),)
    assert reshape_matches((2, 3, 4), (6, 4)) == (DimMatch((2,), 1),)
    assert reshape_matches((4, 5), (20,)) == ()
    assert reshape_matches((4, 5), (4, 5, 1)) == (DimMatch((0,), 0), DimMatch((1,), 1))


def test_dims_getitem_keeps():
    x = fake((4, 5), broadcast)
    assert sm.ops.getitem.build(x, (slice(None), 1)).dims["d"] == (DimMatch((0,), 0),)
    assert sm.ops.getitem.build(x, slice(1, 3)).dims["d"] == (DimMatch((1,), 1),)
    assert sm.ops.getitem.build(x, (None, Ellipsis, slice(0, 5))).dims["d"] == (
        DimMatch((0,), 1), DimMatch((1,), 2))
    assert sm.ops.getitem.build(x, (slice(None, None, -1),)).dims["d"] == (DimMatch((1,), 1),)
    call = sm.ops.getitem.build(x, (slice(None, None, 2), -1))
    assert call.out_shape == (2,) and call.dims["d"] == ()


# ---- inference -------------------------------------------------------------------------------

def _check_choice(inf):
    totals = [independent_total(inf.call, c) for c in inf.candidates]
    for c, t in zip(inf.candidates, totals):
        assert c.total == pytest.approx(t, rel=1e-12, abs=1e-18)
    best = min(totals)
    tied = [k for k, t in enumerate(totals) if t <= best * (1 + 1e-9) + 1e-15]
    want = min(tied, key=lambda k: (inf.candidates[k].n_boxed, k))
    assert inf.chosen == want, str(inf)
    return inf.best


@pytest.mark.parametrize("ranks", [[0, 1], [0, 1, 2], [3, 2, 1, 0]])
def test_data_and_model_parallel_matmul_choices(ranks):
    x = fake((4, 5), split(0), ranks)
    w = fake((5, 8), broadcast, ranks)
    best = _check_choice(infer(sm.matmul.build(x, w)))
    assert best.output.sbp == (split(0),) and best.total == 0          # data parallel
    xb = fake((4, 5), broadcast, ranks)
    w0 = fake((5, 8), split(1), ranks)
    best = _check_choice(infer(sm.matmul.build(xb, w0)))
    assert best.output.sbp == (split(1),) and best.total == 0          # model parallel
    y0 = fake((4, 8), split(1), ranks)                                  # second model-parallel layer
    w1 = fake((8, 6), split(1), ranks)
    best = _check_choice(infer(sm.matmul.build(y0, w1)))
    assert best.total > 0


def test_partial_output_is_charged():
    # a tall contraction with a small output: the contracted-split signature wins even with
    # the all-reduce charged; with a big output it loses
    for (m, k, n) in [(2, 512, 2), (512, 4, 512)]:
        a = fake((m, k), split(1), [0, 1, 2, 3])
        b = fake((k, n), split(0), [0, 1, 2, 3])
        inf = infer(sm.matmul.build(a, b))
        best = _check_choice(inf)
        cand = next(c for c in inf.candidates if c.signature == "(S(1), S(0)) -> P")
        assert cand.partial > 0 and cand.boxing == (0.0, 0.0)
        assert (best is cand) == (m * n < k)


def test_partial_inputs_stay_lazy_only_where_exact():
    x = fake((4, 6), partial_sum, [0, 1, 2])
    y = fake((4, 6), partial_sum, [0, 1, 2])
    for call, lazy in [
        (sm.mul.build(x, 2.0), True),               # linear: P * B -> P, nothing moves
        (sm.div.build(x, 4.0), True),
        (sm.add.build(x, y), True),                 # P + P -> P
        (sm.sum.build(x, 0), True),                 # a sum of a partial sum
        (sm.ops.getitem.build(x, slice(0, 2)), True),
        (sm.add.build(x, 1.0), False),              # x1 + x2 + c != (x1 + c) + (x2 + c)
        (sm.exp.build(x), False),
        (sm.mul.build(fake((4, 6), partial_sum, [0, 1, 2], dtype=np.int32), 0.5), False),
    ]:
        inf = infer(call)
        _check_choice(inf)
        out_partial = any(isinstance(s, Partial) for s in inf.best.output.sbp)
        if lazy:
            assert out_partial and inf.best.n_boxed == 0 and inf.best.total == 0, str(inf)
        else:  # no candidate may use the partial input as it is
            assert all(c.moved[0] for c in inf.candidates), str(inf)
    # (x1 + x2) * (y1 + y2) needs one of them whole
    inf = infer(sm.mul.build(x, y))
    assert all(any(c.moved) for c in inf.candidates)


def test_ties_prefer_fewer_boxings_then_table_order():
    a, b = fake((4, 5), broadcast), fake((5, 3), broadcast)
    inf = infer(sm.matmul.build(a, b))
    _check_choice(inf)
    assert inf.best.signature == "(B, B) -> B"
    x, y = fake((4, 4), split(0)), fake((4, 4), split(1))
    inf = infer(sm.add.build(x, y))
    _check_choice(inf)
    assert inf.best.signature == "(S(0), S(0)) -> S(0)"                # dim order on a tie


def test_many_layouts_choose_the_cheapest():
    rng = np.random.default_rng(0)
    ranks = [[0, 1], [2, 3]]
    sbps = input_sbps(pl(ranks), 2)
    for _ in range(30):
        sa, sb = (sbps[i] for i in rng.integers(0, len(sbps), size=2))
        a = fake((4, 6), sa, ranks)
        _check_choice(infer(sm.matmul.build(a, fake((6, 4), sb, ranks))))
        _check_choice(infer(sm.add.build(a, fake((4, 6), sb, ranks))))
        _check_choice(infer(sm.sum.build(a, 1)))


def test_nd_mesh_is_a_product_of_axis_signatures():
    mesh = [[0, 1], [2, 3]]
    x = fake((4, 5), (split(0), broadcast), mesh)
    w = fake((5, 6), (broadcast, split(1)), mesh)
    inf = infer(sm.matmul.build(x, w))
    assert len(inf.candidates) == 6 ** 2
    assert inf.best.output.sbp == (split(0), split(1))                  # 2-D SBP
    assert inf.best.signature == "(S(0), B) -> S(0) x (B, S(1)) -> S(1)" and inf.best.total == 0


def test_inputs_on_different_placements_move_to_one():
    x = fake((4, 5), split(0), [0, 1])
    w = fake((5, 6), broadcast, [2, 3])
    inf = infer(sm.matmul.build(x, w))
    pls = {c.placement for c in inf.candidates}
    assert pls == {x.placement, w.placement}
    _check_choice(inf)
    assert inf.best.output.placement in pls


def test_device_types_cannot_mix():
    x = fake((4, 5), split(0), [0, 1])
    w = fake((5, 6), broadcast, [0, 1], type="cuda")
    with pytest.raises(TypeError, match="different device types"):
        infer(sm.matmul.build(x, w))
    with pytest.raises(TypeError, match="different device types"):
        sm.ops.run_call(sm.add.build(x, fake((4, 5), broadcast, [0, 1], type="cuda")))


# ---- argument checks (raised before any communication) ------------------------------------

@pytest.mark.parametrize("fn, err, match", [
    (lambda: sm.matmul(fake((4, 5), broadcast), fake((6, 2), broadcast)), ValueError,
     r"contracted dims differ \(a's last dim 5 != b's second-to-last dim 6\)"),
    (lambda: sm.matmul(fake((), broadcast), fake((5, 2), broadcast)), ValueError,
     "at least 1 dim"),
    (lambda: sm.matmul(fake((4, 5), broadcast), fake((6,), broadcast)), ValueError,
     r"contracted dims differ \(a's last dim 5 != b's only dim 6\)"),
    (lambda: sm.matmul(fake((2, 4, 5), broadcast), fake((3, 5, 2), broadcast)), ValueError,
     "batch dims"),
    (lambda: sm.matmul(fake((4, 5), broadcast), 2.0), TypeError, "takes no scalars"),
    (lambda: sm.add(fake((3, 4), broadcast), fake((3,), broadcast)), ValueError,
     r"operand shapes a \(3, 4\), b \(3,\) cannot be broadcast"),
    (lambda: sm.add(fake((3, 4), broadcast), np.ones(4)), TypeError, "sm.tensor"),
    (lambda: sm.add(1, 2), TypeError, "at least one operand must be a GlobalTensor"),
    (lambda: sm.neg(fake((3,), broadcast, dtype=bool)), TypeError, "neg: not defined"),
    (lambda: sm.sum(fake((3, 4), broadcast), 2), ValueError,
     "sum: dim 2 is out of range for a tensor of 2 dims"),
    (lambda: sm.sum(fake((3, 4), broadcast), (0, -2)), ValueError, "more than once"),
    (lambda: sm.mean(fake((3, 4), broadcast), 1.5), TypeError, "dim must be an int"),
    (lambda: sm.max(fake((3, 0), broadcast), 1), ValueError, "size 0"),
    (lambda: sm.softmax(fake((3, 4), broadcast), 3), ValueError, "out of range"),
    (lambda: sm.reshape(fake((3, 4), broadcast), 5, -1), ValueError, r"into \(5, -1\)"),
    (lambda: sm.reshape(fake((3, 4), broadcast), 2, 2), ValueError, "cannot reshape"),
    (lambda: sm.transpose(fake((3, 4), broadcast), 0, 0), ValueError, "permutation"),
    (lambda: sm.transpose(fake((3, 4), broadcast), 0), ValueError, "each of the 2 dims"),
    (lambda: fake((3, 4), broadcast)[3], IndexError, "out of bounds for dim 0 of size 3"),
    (lambda: fake((3, 4), broadcast)[0, 0, 0], IndexError, "too many indices"),
    (lambda: fake((3, 4), broadcast)[[0, 1]], TypeError, "no arrays"),
    (lambda: fake((3, 4), broadcast)[::0], ValueError, "step cannot be zero"),
    (lambda: sm.cat([fake((3, 4), broadcast), fake((3, 5), broadcast)], 0), ValueError,
     "may differ only in dim 0"),
    (lambda: sm.cat(fake((3, 4), broadcast), 0), TypeError, "list or tuple"),
    (lambda: sm.astype(fake((3, 4), broadcast), "nonsense"), TypeError, "not a NumPy dtype"),
    (lambda: sm.where(fake((3, 4), broadcast, dtype=bool), fake((2, 4), broadcast), 0.0),
     ValueError, "cannot be broadcast"),
    (lambda: sm.pow(fake((3,), broadcast, dtype=np.int64), -1), ValueError,
     "pow: not defined"),
])
def test_bad_arguments_raise_clear_errors(fn, err, match):
    with pytest.raises(err, match=match):
        fn()


# ---- explain ---------------------------------------------------------------------------------

def test_explain_an_op_call():
    y0 = fake((4, 8), split(1), [0, 1, 2])
    w1 = fake((8, 6), split(1), [0, 1, 2])
    inf = sm.explain(sm.matmul, y0, w1)
    text = str(inf)
    assert text.startswith("matmul(a: (4, 8) float64 S(1) on [0, 1, 2]")
    for c in inf.candidates:
        assert c.signature in text
    chosen = [ln for ln in text.splitlines() if ln.startswith("*")]
    assert len(chosen) == 1 and inf.best.signature in chosen[0]
    assert "chosen: #" in text
    assert str(sm.explain("matmul", y0, w1)) == text
    assert "(P, B) -> P" in inf.table()
    with pytest.raises(ValueError, match="unknown op"):
        sm.explain("nope", y0)
    with pytest.raises(TypeError, match="sbpmpi op"):
        sm.explain(np.matmul, y0, w1)


def test_explain_a_conversion():
    x = fake((4, 8), split(1), [0, 1, 2])
    out = sm.explain(x, sbp=broadcast)
    assert str(out)
    if not hasattr(boxing, "explain_conversion"):
        assert "modelled cost" in str(out)


# ---- the harness's own pieces ------------------------------------------------------------------

def test_make_shards_assemble_to_the_value():
    rng = np.random.default_rng(5)
    values = [np.arange(12.0).reshape(3, 4) / 8, np.arange(-6, 6).reshape(3, 4).astype(np.int32),
              (np.arange(12) % 3 == 0).reshape(3, 4)]
    for ranks in ([0, 1, 2], [[0, 1], [2, 3]]):
        p = pl(ranks)
        for v in values:
            for nd in input_sbps(p, 2, v.dtype):
                lay = Layout.make(v.shape, p, nd)
                shards = make_shards(v, lay, rng)
                assert set(shards) == set(p.rank_list)
                for r, s in shards.items():
                    assert s.shape == lay.local_shape(r) and s.dtype == v.dtype
                np.testing.assert_array_equal(assemble(np, lay, shards), v, err_msg=str(nd))
                if nd == (partial_sum,) and v.dtype.kind == "f":
                    assert any(np.any(shards[r] != 0) for r in p.rank_list[1:])
                for axis, s in enumerate(nd):  # copies along a broadcast axis are identical
                    if isinstance(s, Broadcast):
                        for r in p.rank_list:
                            c = list(p.coord_of(r))
                            c[axis] = 0
                            np.testing.assert_array_equal(shards[r], shards[p.rank_at(c)])


def test_sbp_combos_sample_keeps_every_option():
    opts = [list(range(6)), list(range(6)), list(range(3))]
    full = sbp_combos(opts)
    assert len(full) == 108 and full == list(itertools.product(*opts))
    few = sbp_combos(opts, max_combos=20, seed=3)
    assert len(few) == 20 and len(set(few)) == 20 and set(few) <= set(full)
    for i, o in enumerate(opts):
        assert {c[i] for c in few} == set(o)
    assert few == sbp_combos(opts, max_combos=20, seed=3)


def test_tolerance_per_dtype():
    assert tolerance(np.int32) == (0.0, 0.0) and tolerance(bool) == (0.0, 0.0)
    assert tolerance(np.float16)[0] > tolerance(np.float32)[0] > tolerance(np.float64)[0]
    assert tolerance(np.complex128) == tolerance(np.float64)


def test_splits_in_tables_are_concrete_or_wildcards():
    for op in sm.ops.OPS.values():
        for sig in op.table:
            for p in (*sig.inputs, sig.output):
                assert isinstance(p, (Split, Broadcast, Partial)) or p == S_D or \
                    type(p).__name__ == "AnySplit"
    assert S(-1) == Split(-1)


# -- signature choice on large meshes ---------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in signature_search_cases() if n != SMALL_SEARCH])
def test_large_signature_searches_are_pruned_and_choose_well(name):
    from sbpmpi.ops import inference

    call = signature_search_cases()[name]()
    inference.clear_cache()
    pruned = inference.infer(call)
    assert pruned.estimated and len(pruned.candidates) <= inference.PRUNE_KEEP
    assert "large search" in str(pruned)
    # against the exhaustive search (every combination planned exactly)
    saved = inference.PRUNE_ABOVE
    inference.PRUNE_ABOVE = 10**9
    try:
        inference.clear_cache()
        full = inference.infer(call)
    finally:
        inference.PRUNE_ABOVE = saved
        inference.clear_cache()
    assert not full.estimated and len(full.candidates) > inference.PRUNE_ABOVE
    exact = {c.signature: c.total for c in full.candidates}
    assert exact[pruned.best.signature] <= 1.5 * full.best.total + 1e-12


def test_small_searches_stay_exhaustive():
    from sbpmpi.ops import inference

    call = signature_search_cases()[SMALL_SEARCH]()
    inference.clear_cache()
    inf = inference.infer(call)
    assert not inf.estimated and "large search" not in str(inf)


# ---- the pruned search's pieces, each alone -------------------------------------------------

def test_axis_change_and_reduce_costs_are_the_single_step_of_that_axis():
    from sbpmpi.boxing import get_cost_table
    from sbpmpi.ops.inference import axis_change_cost, axis_reduce_cost
    from sbpmpi.runtime import conversion_cost

    table = get_cost_table()
    x = fake((6, 4), split(0), [0, 1, 2])
    b = Layout(x.shape, x.placement, (broadcast,))
    assert axis_change_cost(x.layout, 0, broadcast, 8, table) == pytest.approx(
        conversion_cost(x.layout, b, 8))
    assert axis_change_cost(b, 0, split(0), 8, table) == pytest.approx(
        conversion_cost(b, x.layout, 8))
    p = fake((6, 4), partial_sum, [0, 1, 2]).layout
    reduce = axis_reduce_cost(p, 0, 8, table)
    assert reduce == pytest.approx(conversion_cost(p, b, 8)) and reduce > 0
    pmax = Layout(p.shape, p.placement, (Partial("max"),))
    # no single step: through broadcast on that axis (the search then drops the combination
    # if boxing refuses the whole conversion, see combo_rank)
    assert axis_change_cost(pmax, 0, partial_sum, 8, table) == pytest.approx(
        axis_change_cost(pmax, 0, broadcast, 8, table)
        + axis_change_cost(b, 0, partial_sum, 8, table))


def test_axis_estimates_needed_layouts_and_combo_rank():
    from sbpmpi.boxing import get_cost_table
    from sbpmpi.ops.inference import (
        axis_change_cost,
        axis_estimates,
        axis_reduce_cost,
        combo_rank,
        may_be_refused,
        needed_layouts,
    )

    table = get_cost_table()
    mesh = [[0, 1], [2, 3]]
    a = fake((4, 6), (split(0), broadcast), mesh)
    w = fake((6, 8), (broadcast, split(1)), mesh)
    call = sm.matmul.build(a, w)
    rows = resolve(call.table, call.dims, [2, 2], 2)
    est = axis_estimates(call, a.placement, rows, table)
    assert len(est) == 2 and all(len(per) == len(rows) for per in est)
    for ax in range(2):
        for k, r in enumerate(rows):
            e = est[ax][k]
            assert e.boxing == tuple(axis_change_cost(o.layout, ax, r.inputs[i], 8, table)
                                     for i, o in enumerate((a, w)))
            if isinstance(r.output, Partial):  # no partial operand: the whole all-reduce
                out = Layout(call.out_shape, a.placement,
                             tuple(r.output if b == ax else broadcast for b in range(2)))
                assert e.charge == pytest.approx(axis_reduce_cost(out, ax, 8, table))
                assert e.charge > 0
            else:
                assert e.charge == 0.0
    k0 = next(k for k, r in enumerate(rows) if str(r) == "(S(0), B) -> S(0)")
    k1 = next(k for k, r in enumerate(rows) if str(r) == "(B, S(1)) -> S(1)")
    need = needed_layouts(call, a.placement, rows, (k0, k1))
    assert need == (a.layout, w.layout)  # the operands as they are: nothing moves
    rank = combo_rank(call, a.placement, rows, est, (k0, k1), False)
    assert rank.total == 0.0 and rank.moved == 0 and rank.order == k0 * len(rows) + k1
    other = combo_rank(call, a.placement, rows, est, (k1, k0), False)
    assert other.total > 0 and other.moved == 2
    assert not may_be_refused(call, rows)
    p = fake((4, 6), (partial_sum, broadcast), mesh)
    pcall = sm.matmul.build(p, w)
    assert may_be_refused(pcall, resolve(pcall.table, pcall.dims, [2, 2], 2))
