"""Gradients of every global op and of to_global against NumPy (sbpmpi.testing.check_grad).

Each case runs backward for input SBPs on the placement of all ranks, the reversed one
(rank order) and, at n = 4, the 2x2 mesh, with partial inputs made of random operands,
and compares every ``x.grad`` (value and layout: x's placement and SBP) with central
finite differences of the NumPy reference in float64. On 1-D placements the sample of
``COMBOS`` input-SBP combinations keeps every SBP kind of every input (split of each
dim, broadcast, partial sum/max/min); on the mesh ``MESH_COMBOS`` is a seeded part of
the 2-D cover (``MESH_FULL`` cases keep the whole cover: every 2-D SBP of every input);
composite ``LIGHT`` cases run fewer on 1-D placements.
``SBPMPI_TEST_FULL=1`` runs every combination instead.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core.sbp import Partial, broadcast, partial_max, partial_min, partial_sum, split
from sbpmpi.testing import Input, check_grad, default_placements

size = MPI.COMM_WORLD.Get_size()
FULL = os.environ.get("SBPMPI_TEST_FULL") == "1"
COMBOS = 8        # per 1-D placement: covers the 6 (2-D input) or 7 (3-D) SBPs of each input
MESH_COMBOS = 4   # per mesh placement, a seeded part of the cover
MESH_FULL = {"matmul", "max_dim1"}
LIGHT = {"chain": 4}  # composite cases: fewer combinations (their ops run in full above)
MESH_COVER = 36


def distinct(shape, seed=0, positive=False):
    """Values without ties or zeros (max/min/relu/abs are not differentiable there)."""
    n = int(np.prod(shape))
    r = np.random.default_rng(seed).permutation(n).astype(np.float64)
    v = (r + 1) / 4.0 if positive else (r - n / 2 + 0.5) / 4.0
    return v.reshape(shape)


def _softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


F = Input((3, 4))
LABELS = np.array([3, 0, 1, 3, 2])
POS = Input((3, 4), low=0.5, high=2.0)
D = distinct((3, 4))

# (id, op, NumPy reference, inputs)
CASES = [
    ("matmul", sm.matmul, np.matmul, [Input((3, 4)), Input((4, 5))]),
    ("matmul_batched", sm.matmul, np.matmul, [Input((2, 3, 4)), Input((2, 4, 3))]),
    ("matmul_bcast_batch", sm.matmul, np.matmul, [Input((2, 3, 4)), Input((4, 2))]),
    ("add", sm.add, np.add, [F, F]),
    ("add_bcast", sm.add, np.add, [Input((3, 4)), Input((4,))]),
    ("add_bcast_col", lambda a, b: a + b, np.add, [Input((3, 1)), Input((1, 4))]),
    ("add_scalar", lambda a: 1.5 + a, lambda a: 1.5 + a, [F]),
    ("sub", sm.sub, np.subtract, [F, Input((4,))]),
    ("rsub_scalar", lambda a: 1.0 - a, lambda a: 1.0 - a, [F]),
    ("mul", sm.mul, np.multiply, [F, F]),
    ("mul_bcast", sm.mul, np.multiply, [Input((4,)), Input((3, 4))]),
    ("div", sm.div, np.true_divide, [F, POS]),
    ("rdiv_scalar", lambda a: 2.0 / a, lambda a: 2.0 / a, [POS]),
    ("pow", sm.pow, np.power, [POS, Input((3, 4), low=-1, high=2)]),
    ("pow_scalar", lambda a: a ** 3, lambda a: a ** 3, [F]),
    ("rpow_scalar", lambda a: 2.0 ** a, lambda a: 2.0 ** a, [F]),
    ("maximum", sm.maximum, np.maximum, [D, distinct((3, 4), 1)]),
    ("minimum_bcast", sm.minimum, np.minimum, [D, distinct((4,), 2)]),
    ("where", sm.where, np.where, [Input((3, 4), np.bool_), F, Input((4,))]),
    ("neg", lambda a: -a, np.negative, [F]),
    ("abs", abs, np.abs, [D]),
    ("exp", sm.exp, np.exp, [F]),
    ("log", sm.log, np.log, [POS]),
    ("sqrt", sm.sqrt, np.sqrt, [POS]),
    ("tanh", sm.tanh, np.tanh, [F]),
    ("relu", sm.relu, lambda a: np.maximum(a, 0), [D]),
    ("sigmoid", sm.sigmoid, _sigmoid, [F]),
    ("sum_all", sm.sum, np.sum, [F]),
    ("sum_dim0", lambda x: x.sum(0), lambda x: x.sum(0), [F]),
    ("sum_dim1_keep", lambda x: x.sum(1, keepdim=True), lambda x: x.sum(1, keepdims=True), [F]),
    ("sum_dims_3d", lambda x: sm.sum(x, (0, 2)), lambda x: x.sum((0, 2)), [Input((2, 3, 4))]),
    ("mean_all", sm.mean, np.mean, [F]),
    ("mean_dim1", lambda x: x.mean(1), lambda x: x.mean(1), [F]),
    ("max_dim1", lambda x: x.max(1), lambda x: x.max(1), [D]),
    ("max_all", sm.max, np.max, [D]),
    ("min_dim0_keep", lambda x: x.min(0, keepdim=True), lambda x: x.min(0, keepdims=True), [D]),
    ("softmax1", lambda x: sm.softmax(x, 1), lambda x: _softmax(x, 1), [F]),
    ("softmax0", lambda x: sm.softmax(x, 0), lambda x: _softmax(x, 0), [F]),
    ("log_softmax", lambda x: sm.log_softmax(x, -1), lambda x: np.log(_softmax(x, -1)), [F]),
    ("T", lambda x: x.T, lambda x: x.T, [F]),
    ("transpose_3d", lambda x: x.transpose(1, 2, 0), lambda x: x.transpose(1, 2, 0),
     [Input((2, 3, 4))]),
    ("reshape", lambda x: x.reshape(4, 3), lambda x: x.reshape(4, 3), [F]),
    ("reshape_keep0", lambda x: x.reshape(3, 2, 2), lambda x: x.reshape(3, 2, 2), [F]),
    ("getitem", lambda x: x[1:, ::2], lambda x: x[1:, ::2], [F]),
    ("getitem_int_none", lambda x: x[None, 1, ...], lambda x: x[None, 1, ...], [F]),
    ("getitem_rows", lambda x: x[:, 1:3], lambda x: x[:, 1:3], [F]),
    ("astype", lambda x: x.astype(np.float32).astype(np.float64) * 2.0,
     lambda x: x * 2.0, [F]),
    ("cat0", lambda a, b: sm.cat([a, b], 0), lambda a, b: np.concatenate([a, b], 0),
     [F, Input((2, 4))]),
    ("cat1", lambda a, b: sm.cat([a, b], dim=1), lambda a, b: np.concatenate([a, b], 1),
     [F, Input((3, 2))]),
    ("cross_entropy", lambda z: sm.nn.cross_entropy(z, LABELS),
     lambda z: -np.log(_softmax(z, 1))[np.arange(5), LABELS].mean(), [Input((5, 4))]),
    ("chain", lambda a, b: sm.tanh(a @ b).sum(1) * a.sum(1), lambda a, b: np.tanh(a @ b).sum(1)
     * a.sum(1), [F, Input((4, 2))]),
]


def placements():
    n = size
    keep = [list(range(n)), list(range(n))[::-1], [[0, 1], [2, 3]]]
    return [pl for pl in default_placements() if pl.ranks.tolist() in keep]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_gradient(case):
    name, op, ref, inputs = case
    total = 0
    for pl in placements():
        if pl.ndim > 1:
            combos = MESH_COVER if name in MESH_FULL else MESH_COMBOS
        elif pl.rank_list != tuple(sorted(pl.rank_list)):
            combos = 2  # rank order only
        else:
            combos = LIGHT.get(name, COMBOS)
        report = check_grad(op, ref, inputs, placements=[pl], name=name,
                            max_combos=None if FULL else combos, seed=len(name))
        total += report.cases
    assert total >= len(placements())


ONE_D = [broadcast, partial_sum, partial_max, partial_min, split(0), split(1)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dst", ONE_D, ids=str)
def test_conversion_gradient_every_pair(dst):
    """x.to_global(sbp=dst) from every source SBP: the gradient is x's layout and exact."""
    pl = sm.placement("cpu", list(range(size)))
    # a partial converts only to a partial of the same reduction (forward rule)
    srcs = [s for s in ONE_D if not (isinstance(s, Partial) and isinstance(dst, Partial))
            or s == dst]
    check_grad(lambda x: x.to_global(sbp=dst) * 1.0, lambda x: x * 1.0, [Input((5, 3))],
               placements=[pl], sbps=[srcs], name=f"to_global -> {dst}")


@pytest.mark.mpi(min_size=1)
def test_conversion_gradient_across_placements():
    n = size
    src = sm.placement("cpu", list(range(n)))
    dsts = [sm.placement("cpu", list(range(n))[::-1]), sm.placement("cpu", [n - 1])]
    if n >= 4:
        dsts.append(sm.placement("cpu", [[0, 1], [2, 3]]))
    for dst in dsts:
        sbp = [split(0), broadcast][:dst.ndim] if dst.ndim == 2 else [split(1)]
        check_grad(lambda x, dst=dst, sbp=sbp: x.to_global(placement=dst, sbp=sbp) * 2.0, lambda x: x * 2.0,
                   [Input((4, 3))], placements=[src], sbps=[ONE_D], name=f"to {dst}")


@pytest.mark.mpi(min_size=4)
def test_conversion_gradient_on_mesh():
    if size != 4:
        pytest.skip("the 2x2 mesh test runs at n = 4")
    pl = sm.placement("cpu", [[0, 1], [2, 3]])
    kinds = [broadcast, partial_sum, partial_max, split(0), split(1)]
    srcs = [(a, b) for a in kinds for b in kinds]
    for k, dst in enumerate([(split(0), broadcast), (broadcast, partial_sum), (split(1), split(0)),
                             (partial_sum, partial_sum)]):
        # the forward conversion needs one reduction: no partial of another kind in dst
        ok = [s for s in srcs if not any(isinstance(a, Partial) and isinstance(b, Partial)
                                         and a != b for a in s for b in dst)]
        check_grad(lambda x, dst=dst: x.to_global(sbp=dst) * 1.0, lambda x: x * 1.0,
                   [Input((4, 4))],
                   placements=[pl], sbps=[ok], max_combos=10, seed=k,
                   name=f"to_global -> {dst}")


@pytest.mark.mpi(min_size=1)
def test_forward_temporaries_freed_before_backward():
    """A layer's ``x @ W`` before ``+ b`` and ``relu``'s input are not kept for backward
    (their rules read no data of them): their arrays die when the program drops them, as
    in a hand-written NumPy step, and the gradients still equal NumPy's (uneven rows)."""
    import gc
    import weakref

    pl = sm.placement("cpu", list(range(size)))
    rng = np.random.default_rng(3)
    x0, w0, b0 = rng.standard_normal((2 * size + 1, 5)), rng.standard_normal((5, 4)), \
        rng.standard_normal(4)
    x = sm.tensor(x0, placement=pl, sbp=(split(0),))
    w = sm.tensor(w0, placement=pl, sbp=(broadcast,), requires_grad=True)
    b = sm.tensor(b0, placement=pl, sbp=(broadcast,), requires_grad=True)
    xw = x @ w
    pre = xw + b
    h = sm.relu(pre)
    freed = [weakref.ref(t.to_local()) for t in (xw, pre)]
    del xw, pre
    gc.collect()
    assert all(r() is None for r in freed)
    sm.sum(h * h).backward()
    a = x0 @ w0 + b0
    gh = 2 * np.maximum(a, 0) * (a > 0)
    np.testing.assert_allclose(w.grad.numpy(), x0.T @ gh, rtol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), gh.sum(0), rtol=1e-12)
