"""``x.to_global(..., grad_sbp=...)``: the gradient the conversion passes back to ``x``
takes the asked SBP (on ``x``'s placement: split, broadcast or partial_sum), its value
is unchanged, and a bad or disagreeing ``grad_sbp`` (partial_max/min included) raises
the same error on every rank before any communication.

Values are checked against NumPy with :func:`sbpmpi.testing.check_grad` (analytic
gradients) at n = 1..4, uneven splits included; the layout by reading the local shards
of a ``partial_sum`` leaf's gradient (each rank keeps what the asked layout gave it) and
by counting the collectives of backward with ``sm.trace``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core.sbp import Partial, broadcast, partial_max, partial_min, partial_sum, split
from sbpmpi.testing import Input, check_grad

comm = MPI.COMM_WORLD
size, rank = comm.Get_size(), comm.Get_rank()
ONE_D = [broadcast, partial_sum, partial_max, partial_min, split(0), split(1)]


def world() -> sm.Placement:
    return sm.placement("cpu", list(range(size)))


def forward_feasible(sources, dst):
    """A partial converts only to a partial of the same reduction (the forward rule)."""
    return [s for s in sources if not (isinstance(s, Partial) and isinstance(dst, Partial))
            or s == dst]


# ---- values: the gradient is the same whatever grad_sbp asks --------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("grad_sbp", [broadcast, partial_sum, split(0), split(1)], ids=str)
def test_gradient_value_is_unchanged_by_grad_sbp(grad_sbp):
    for dst in (broadcast, split(1), partial_sum):
        check_grad(lambda x, dst=dst: x.to_global(sbp=dst, grad_sbp=grad_sbp) * 3.0,
                   lambda x: x * 3.0, [Input((5, 3))],
                   grad_reference=lambda w, x: [3.0 * w],
                   placements=[world()], sbps=[forward_feasible(ONE_D, dst)],
                   name=f"to_global -> {dst}, grad_sbp {grad_sbp}")


@pytest.mark.mpi(min_size=1)
def test_grad_sbp_is_on_the_source_placement():
    """Across placements, grad_sbp names the SBP on x's placement (the gradient's)."""
    dsts = [sm.placement("cpu", list(range(size))[::-1]), sm.placement("cpu", [size - 1])]
    if size >= 4:
        dsts.append(sm.placement("cpu", [[0, 1], [2, 3]]))
    for dst in dsts:
        sbp = (split(0), broadcast) if dst.ndim == 2 else (split(1),)
        for gs in (split(0), broadcast, partial_sum):
            check_grad(lambda x, dst=dst, sbp=sbp, gs=gs:
                       x.to_global(placement=dst, sbp=sbp, grad_sbp=gs) * 2.0,
                       lambda x: x * 2.0, [Input((4, 3))],
                       grad_reference=lambda w, x: [2.0 * w],
                       placements=[world()], sbps=[[broadcast, split(0), partial_sum]],
                       name=f"to {dst}, grad_sbp {gs}")


@pytest.mark.mpi(min_size=4)
def test_grad_sbp_on_a_mesh():
    if size != 4:
        pytest.skip("the 2x2 mesh test runs at n = 4")
    mesh = sm.placement("cpu", [[0, 1], [2, 3]])
    kinds = [broadcast, partial_sum, split(0), split(1)]
    for k, gs in enumerate([(split(0), broadcast), (broadcast, split(1)),
                            (partial_sum, split(0)), (broadcast, broadcast)]):
        check_grad(lambda x, gs=gs: x.to_global(sbp=(broadcast, split(0)), grad_sbp=gs) * 1.5,
                   lambda x: x * 1.5, [Input((5, 3))],
                   grad_reference=lambda w, x: [1.5 * w],
                   placements=[mesh], sbps=[[(a, b) for a in kinds for b in kinds]],
                   max_combos=6, seed=k, name=f"mesh grad_sbp {gs}")


# ---- layout: the gradient arrives as asked -----------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("grad_sbp", [None, broadcast, split(0), split(-1)], ids=str)
def test_gradient_arrives_in_the_asked_sbp(grad_sbp):
    """A ``partial_sum`` leaf keeps, on each rank, the part of its gradient that the asked
    layout gave that rank: under ``split(d)`` its own block (zeros elsewhere), under
    ``broadcast`` (the default for a partial source: the conjugate) the whole gradient on
    the first rank and zeros on the others. Its global value is the gradient either way."""
    shape = (5, 3)
    w = np.arange(15, dtype=np.float64).reshape(shape) + 1.0
    x = sm.tensor(np.ones(shape), placement=world(), sbp=partial_sum).requires_grad_()
    y = x.to_global(sbp=broadcast, grad_sbp=grad_sbp)
    y.backward(sm.tensor(w, placement=world(), sbp=broadcast))
    want = np.zeros(shape)
    if isinstance(grad_sbp, type(split(0))):
        d = grad_sbp.dim % 2
        block = np.array_split(np.arange(shape[d]), size)[rank]  # first ranks: one more
        own = (block, slice(None)) if d == 0 else (slice(None), block)
        want[own] = w[own]
    elif rank == 0:
        want[...] = w
    assert x.grad.layout == x.layout
    np.testing.assert_array_equal(x.grad.to_local(), want)
    np.testing.assert_array_equal(x.grad.numpy(), w)


@pytest.mark.mpi(min_size=1)
def test_broadcast_grad_sbp_reduces_once_before_the_parameters_that_precede_it():
    """Megatron's f: ``h = (x * v).to_global(sbp=broadcast, grad_sbp=broadcast)`` before
    a column-parallel matmul all-reduces the partial input gradient once, there; ``x`` and
    ``v`` then get broadcast gradients (no reduction of their own). Without grad_sbp the
    partial gradient reaches both leaves: one all-reduce each."""
    rng = np.random.default_rng(3)
    xs, vs, ws = rng.standard_normal((5, 4)), rng.standard_normal(4), rng.standard_normal((4, 7))
    got = {}
    for grad_sbp in (broadcast, None):
        x = sm.tensor(xs, placement=world(), sbp=broadcast).requires_grad_()
        v = sm.tensor(vs, placement=world(), sbp=broadcast).requires_grad_()
        w = sm.tensor(ws, placement=world(), sbp=split(1)).requires_grad_()
        h = (x * v).to_global(sbp=broadcast, grad_sbp=grad_sbp)
        loss = sm.matmul(h, w).sum()
        with sm.trace() as t:
            loss.backward()
        got[grad_sbp] = [(r.op, r.nbytes // 8) for r in t.records]
        gh = np.ones((5, 7)) @ ws.T  # d loss / d h
        np.testing.assert_allclose(x.grad.numpy(), gh * vs, rtol=1e-12)
        np.testing.assert_allclose(v.grad.numpy(), (gh * xs).sum(0), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), (xs * vs).T @ np.ones((5, 7)), rtol=1e-12)
    if size == 1:
        assert got == {broadcast: [], None: []}
    else:
        assert got[broadcast] == [("all_reduce", 20)]
        assert sorted(got[None]) == [("all_reduce", 4), ("all_reduce", 20)]


# ---- arguments --------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_grad_sbp_accepts_the_forms_of_sbp():
    """One SBP, a tuple or a list, a negative split dim: the same gradient layout."""
    grads = []
    for gs in (split(1), (split(1),), [split(-1)]):
        x = sm.tensor(np.ones((3, 5)), placement=world(), sbp=partial_sum).requires_grad_()
        x.to_global(sbp=broadcast, grad_sbp=gs).sum().backward()
        grads.append(x.grad.to_local())
    assert all(np.array_equal(g, grads[0]) for g in grads)


@pytest.mark.mpi(min_size=1)
def test_function_form_passes_grad_sbp_and_refuses_it_for_a_local_array():
    """``sm.to_global(x, ..., grad_sbp=)`` is ``x.to_global``'s: the same gradient layout;
    a local array has no gradient, so ``grad_sbp`` with one is a TypeError."""
    grads = []
    for convert in (lambda x: x.to_global(sbp=broadcast, grad_sbp=split(1)),
                    lambda x: sm.to_global(x, sbp=broadcast, grad_sbp=split(1))):
        x = sm.tensor(np.ones((3, 5)), placement=world(), sbp=partial_sum).requires_grad_()
        convert(x).sum().backward()
        grads.append(x.grad.to_local())
    np.testing.assert_array_equal(grads[0], grads[1])
    err, msg = errors_of(lambda: sm.to_global(np.ones(3), placement=world(), sbp=split(0),
                                              grad_sbp=broadcast))
    assert err == "TypeError" and "grad_sbp" in msg and "ndarray" in msg, (err, msg)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("requires_grad", [True, False])
@pytest.mark.parametrize("bad, kind", [
    (split(2), "ValueError"), ((broadcast, broadcast), "ValueError"),
    ("broadcast", "TypeError"), ([broadcast, 3], "ValueError"), (partial_max, "ValueError"),
    ((partial_min,), "ValueError")], ids=str)
def test_bad_grad_sbp_raises_on_every_rank_before_communicating(bad, kind, requires_grad):
    x = sm.tensor(np.ones((4, 3)), placement=world(), sbp=split(0))
    x.requires_grad_(requires_grad)
    with sm.trace() as t:
        err, msg = errors_of(lambda: x.to_global(sbp=broadcast, grad_sbp=bad))
    assert err == kind, (err, msg)
    assert "grad_sbp" in msg and repr(bad) in msg, msg
    assert len(t.records) == 0  # the all-gather to broadcast never started


@pytest.mark.mpi(min_size=2)
def test_ranks_asking_different_grad_sbp_get_the_mismatch():
    x = sm.tensor(np.ones((4, 3)), placement=world(), sbp=split(0)).requires_grad_()
    mine = broadcast if rank == 0 else split(0)
    err, msg = errors_of(lambda: x.to_global(sbp=broadcast, grad_sbp=mine))
    assert err == "CollectiveMismatchError", (err, msg)
    err, msg = errors_of(lambda: x.to_global(sbp=broadcast, grad_sbp=None if rank else split(0)))
    assert err == "CollectiveMismatchError", (err, msg)
    # the same request in two spellings is one request
    same = split(-1) if rank == 0 else [split(1)]
    assert errors_of(lambda: x.to_global(sbp=broadcast, grad_sbp=same)) == ("no error", "")
