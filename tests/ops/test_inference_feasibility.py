"""Signature inference never picks a conversion boxing refuses: random ops, mixed partials.

Inference and the planner share one feasibility rule (``sbpmpi.ops.inference.refusal``,
the rule ``boxing.plan.check_conversion`` applies). Here random op calls (and chains of
two) on random placements of up to 3-D meshes, with inputs whose SBPs mix partial kinds,
run on every rank and are compared with NumPy on the whole arrays. Hypothesis draws the
same examples on every rank (derandomized, no database), and every check is collective.
Operands on different placements move to the one inference picks, partial inputs stay
partial only where that is exact, and ``sm.explain`` prints the same on every rank.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import assert_same_on_all_ranks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core.layout import Layout
from sbpmpi.core.sbp import PARTIALS, broadcast, split
from sbpmpi.ops import infer
from sbpmpi.ops.inference import refusal
from sbpmpi.testing import assert_close, make_input, metadata_tensor

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
PMAX, PMIN, PSUM = PARTIALS["max"], PARTIALS["min"], PARTIALS["sum"]


def _meshes(k: int) -> list[tuple[int, ...]]:
    """Every mesh shape of 1, 2 or 3 dims holding ``k`` ranks (size-1 axes included)."""
    out: list[tuple[int, ...]] = [(k,)]
    for a in range(1, k + 1):
        if k % a == 0:
            out.append((a, k // a))
            for b in range(1, k // a + 1):
                if (k // a) % b == 0:
                    out.append((a, b, k // a // b))
    return out


@st.composite
def placements(draw: st.DrawFn) -> sm.Placement:
    ranks = draw(st.permutations(list(range(size))))
    k = draw(st.integers(1, size))
    mesh = draw(st.sampled_from(_meshes(k)))
    return sm.placement("cpu", np.array(ranks[:k]).reshape(mesh).tolist())


def _sbp(draw: st.DrawFn, pl: sm.Placement, ndim: int) -> tuple:
    one = [broadcast, PSUM, PMAX, PMIN] + [split(d) for d in range(ndim)]
    return tuple(draw(st.sampled_from(one)) for _ in range(pl.ndim))


#: name -> (number of tensor operands, the global op on tensors, NumPy on arrays)
BINARY = {
    "add": (sm.add, np.add), "sub": (sm.sub, np.subtract), "mul": (sm.mul, np.multiply),
    "maximum": (sm.maximum, np.maximum), "minimum": (sm.minimum, np.minimum),
}
UNARY = {
    "neg": (sm.neg, np.negative), "exp": (sm.exp, np.exp), "tanh": (sm.tanh, np.tanh),
    "sum0": (lambda x: sm.sum(x, 0), lambda v: np.sum(v, 0)),
    "max1": (lambda x: sm.max(x, 1, keepdim=True), lambda v: np.max(v, 1, keepdims=True)),
    "min": (lambda x: sm.min(x), np.min),
    "t": (sm.transpose, np.transpose),
    "matmul_t": (lambda x: sm.matmul(x, sm.transpose(x)), lambda v: v @ v.T),
}


@st.composite
def calls(draw: st.DrawFn):
    shape = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    pl = draw(placements())
    first = draw(st.sampled_from(sorted(BINARY)))
    then = draw(st.sampled_from([None, *sorted(BINARY), *sorted(UNARY)]))
    sbps = [_sbp(draw, pl, 2) for _ in range(3)]
    seed = draw(st.integers(0, 2**16))
    return shape, pl, first, then, sbps, seed


def _run(shape, pl, first, then, sbps, seed):
    rng = np.random.default_rng(seed)
    vals = [rng.integers(-16, 17, size=shape) / 8.0 for _ in range(3)]
    xs = [make_input(v, pl, s, np.random.default_rng([seed, i]))
          for i, (v, s) in enumerate(zip(vals, sbps))]
    f, ref = BINARY[first]
    y, want = f(xs[0], xs[1]), ref(vals[0], vals[1])
    if then in BINARY:
        g, gref = BINARY[then]
        y, want = g(y, xs[2]), gref(want, vals[2])
    elif then is not None:
        g, gref = UNARY[then]
        y, want = g(y), gref(want)
    return y.numpy(), np.asarray(want)


def _collective_assert(fn) -> None:
    try:
        fn()
        err = ""
    except Exception as e:  # every rank learns of a failure on any rank
        err = f"{type(e).__name__}: {e}"
    errs = [f"rank {r}: {e}" for r, e in enumerate(world.allgather(err)) if e]
    assert not errs, "; ".join(errs)


@pytest.mark.mpi(min_size=1)
@settings(max_examples=30, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck), print_blob=False)
@given(case=calls())
def test_random_op_chains_with_mixed_partials_match_numpy(case):
    shape, pl, first, then, sbps, seed = case

    def check():
        got, want = _run(shape, pl, first, then, sbps, seed)
        assert_close(got, want, f"{first} then {then} on {pl.ranks.tolist()} with {sbps}")

    _collective_assert(check)


# ---- the two cases the adversarial checks found --------------------------------------------

@pytest.mark.mpi(min_size=4)
def test_maximum_of_mixed_partials_on_a_3d_mesh():
    """(S(0), B, P(max)) and (P(max), P(min), S(1)) on [[[0, 1]], [[2, 3]]]."""
    pl = sm.placement("cpu", [[[0, 1]], [[2, 3]]])
    rng = np.random.default_rng(0)
    va, vb = (rng.integers(-16, 17, size=(4, 5)) / 8.0 for _ in range(2))
    a = make_input(va, pl, (split(0), broadcast, PMAX), np.random.default_rng(1))
    b = make_input(vb, pl, (PMAX, PMIN, split(1)), np.random.default_rng(2))
    _collective_assert(lambda: assert_close(sm.maximum(a, b).numpy(), np.maximum(va, vb),
                                            "maximum"))


@pytest.mark.mpi(min_size=2)
def test_partial_sum_chain_into_maximum_on_a_1x1x2_mesh():
    """A partial_sum made by one op meets a partial_max in the next on [[[0, 1]]]."""
    pl = sm.placement("cpu", [[[0, 1]]])
    rng = np.random.default_rng(3)
    va, vb, vc = (rng.integers(-16, 17, size=(3, 5)) / 8.0 for _ in range(3))
    a = make_input(va, pl, (broadcast, PSUM, split(0)), np.random.default_rng(4))
    b = make_input(vb, pl, (broadcast, broadcast, split(1)), np.random.default_rng(5))
    c = make_input(vc, pl, (broadcast, broadcast, PMAX), np.random.default_rng(6))

    def check():
        s = sm.add(a, b)  # partial_sum on mesh axis 1 stays lazy
        assert_close(sm.maximum(c, s).numpy(), np.maximum(vc, va + vb), "maximum")
        assert_close(sm.maximum(s, c).numpy(), np.maximum(va + vb, vc), "maximum")

    _collective_assert(check)


# ---- metadata only: every chosen conversion is one boxing accepts ----------------------------

MESHES = ([[[0, 1]], [[2, 3]]], [[[0, 1]]], [[[0], [1]], [[2], [3]]], [[0, 1], [2, 3]])


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_inference_chooses_only_conversions_boxing_accepts(mesh):
    nd = np.asarray(mesh).ndim
    one = [broadcast, PSUM, PMAX, PMIN, split(0), split(1)]
    combos = list(itertools.product(one, repeat=nd))
    rng = np.random.default_rng(7)
    picks = [(combos[i], combos[j]) for i, j in rng.integers(len(combos), size=(12, 2))]
    for op in (sm.maximum, sm.add, sm.mul):
        for sa, sb in picks:
            a = metadata_tensor((4, 5), sa, mesh, world_size=4)
            b = metadata_tensor((4, 5), sb, mesh, world_size=4)
            inf = infer(op.build(a, b))
            for c in inf.candidates:
                for x, lay in zip((a, b), c.inputs):
                    assert refusal(x.layout, lay) is None, (op.name, sa, sb, c.signature)


def test_no_feasible_row_names_the_op_and_layouts():
    """A table whose only rows need refused conversions: a clear error, no communication."""
    from sbpmpi.ops.call import OpCall
    from sbpmpi.ops.signature import Signature

    a = metadata_tensor((4,), (PMAX,), [0, 1], world_size=4)
    call = OpCall("only_sum", (a,), (Signature((PSUM,), PSUM),), {}, (4,), a.dtype,
                  lambda xp, local, shape: local[0])
    with pytest.raises(ValueError, match=r"only_sum: no signature can be reached.*P\(max\)"):
        infer(call)


def test_refusal_is_the_rule_boxing_applies():
    pl = sm.placement("cpu", [[0, 1]], world_size=4)
    src = Layout.make((4,), pl, (PMAX, PMIN))
    assert refusal(src, src) is None
    assert refusal(src, Layout.make((4,), pl, (broadcast, broadcast))) is None
    why = refusal(src, Layout.make((4,), pl, (PMAX, PMAX)))
    assert why is not None and "partial_max/partial_min to partial_max" in why
    with pytest.raises(ValueError, match="partial_max/partial_min to partial_max"):
        sm.boxing.plan_conversion(src, Layout.make((4,), pl, (PMAX, PMAX)), 8)


# -- operands on different placements, partial inputs, explain under MPI ----------------------

S0, S1 = sm.sbp.split(0), sm.sbp.split(1)


def full():
    return sm.placement("cpu", list(range(size)))


@pytest.mark.mpi(min_size=2)
def test_operands_on_different_placements():
    rng = np.random.default_rng(2)
    a_val, b_val = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    pls = [full(), sm.placement("cpu", list(range(size))[::-1]), sm.placement("cpu", [size - 1]),
           sm.placement("cpu", list(range(1, size)))]
    for pa in pls:
        for pb in pls:
            a = sm.tensor(a_val, placement=pa, sbp=S0)
            b = sm.tensor(b_val, placement=pb, sbp=sm.sbp.broadcast)
            inf = sm.explain(sm.matmul, a, b)
            y = sm.matmul(a, b)
            assert y.placement in (pa, pb) and y.placement == inf.best.placement
            np.testing.assert_allclose(y.numpy(), a_val @ b_val, rtol=1e-12)
            z = sm.add(a, sm.tensor(a_val, placement=pb, sbp=S1))
            np.testing.assert_allclose(z.numpy(), 2 * a_val, rtol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_partial_inputs_are_never_wrong():
    pl = full()
    rng = np.random.default_rng(3)
    v = rng.standard_normal((4, 6))
    parts = [rng.standard_normal((4, 6)) for _ in range(size)]
    parts[0] = v - sum(parts[1:])
    x = sm.to_global(parts[rank], placement=pl, sbp=sm.sbp.partial_sum)
    with sm.trace() as t:
        y = x * 2.0                    # linear: stays partial, nothing moves
    assert y.sbp == (sm.sbp.partial_sum,) and len(t) == 0, str(t)
    np.testing.assert_allclose(y.numpy(), 2 * v, rtol=1e-12)
    for f, ref in [(lambda a: a + 1.0, lambda a: a + 1.0), (sm.exp, np.exp),
                   (sm.relu, lambda a: np.maximum(a, 0)),
                   (lambda a: a.softmax(0), lambda a: np.exp(a) / np.exp(a).sum(0))]:
        out = f(x)                     # not linear: the partial input is boxed first
        assert sm.sbp.partial_sum not in out.sbp
        np.testing.assert_allclose(out.numpy(), ref(v), rtol=1e-12)
    # x * x is linear in one factor: (x1 + x2) * x may stay partial
    np.testing.assert_allclose((x * x).numpy(), v * v, rtol=1e-12)
    s = (x * 3.0).sum()                # a sum of a partial sum: one small reduction at the end
    np.testing.assert_allclose(s.item(), 3 * v.sum(), rtol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_explain_is_the_same_on_every_rank():
    pl = full()
    y0 = sm.randn(4, 8, placement=pl, sbp=S1)
    w1 = sm.randn(8, 6, placement=pl, sbp=S1)
    text = str(sm.explain(sm.matmul, y0, w1))
    assert_same_on_all_ranks(text)
    assert text.count("\n*") == 1
    assert_same_on_all_ranks(str(sm.explain(y0, sbp=sm.sbp.broadcast)))
