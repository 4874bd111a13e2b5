"""The transformer's nn pieces against NumPy: embedding (vocabulary-parallel too), layer
norm, dropout masks independent of the layout, containers and their names, train/eval,
weight tying, and gradient-norm clipping with one all-reduce.

Values and gradients are compared on the whole arrays at every world size (uneven
splits: 7 rows, 5 columns, ...); gradients by ``sbpmpi.testing.check_grad`` over every
input SBP kind on 1-D placements (all ranks and reversed) and a sample of the 2x2 mesh's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.core import random as counter_random
from sbpmpi.testing import Input, check_grad, check_op, default_placements, make_input

S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum
size = MPI.COMM_WORLD.Get_size()
COMBOS = 12       # per 1-D placement: covers every SBP kind of each input
MESH_COMBOS = 8   # per 2x2 mesh: a seeded sample (4 for layer norm's three inputs)


def placements():
    keep = [list(range(size)), list(range(size))[::-1], [[0, 1], [2, 3]]]
    return [pl for pl in default_placements() if pl.ranks.tolist() in keep]


def world(ndim=1):
    return sm.placement("cpu", [[0, 1], [2, 3]] if ndim == 2 else list(range(size)))


def layouts():
    """Weight layouts: 1-D over all ranks, and the 2x2 mesh at n = 4."""
    out = [(world(), S(0)), (world(), S(1)), (world(), B)]
    if size == 4:
        out += [(world(2), (S(0), S(1))), (world(2), (B, S(0))), (world(2), (S(1), B))]
    return out


def combos(pl, mesh=MESH_COMBOS):
    """Combinations of input SBPs to run on ``pl``: all kinds on the 1-D placement of all
    ranks, a few on the reversed one (rank order only) and a sample on the mesh."""
    if pl.ndim > 1:
        return mesh
    return COMBOS if pl.rank_list == tuple(sorted(pl.rank_list)) else 3


# ---- embedding ---------------------------------------------------------------------------------

V, D = 7, 5
IDS = np.array([[0, 6, 3, 3], [5, 1, 0, 6], [2, 2, 4, 1]])


def _scatter_add(ids, g, vocab):
    out = np.zeros((vocab, g.shape[-1]))
    np.add.at(out, ids.reshape(-1), g.reshape(-1, g.shape[-1]))
    return out


@pytest.mark.mpi(min_size=1)
def test_embedding_values_every_layout():
    for pl in placements():
        check_op(sm.nn.embedding, lambda ids, w: w[ids], [IDS, Input((V, D))],
                 placements=[pl], max_combos=combos(pl))


@pytest.mark.mpi(min_size=1)
def test_embedding_gradient_every_layout():
    for pl in placements():
        check_grad(sm.nn.embedding, lambda ids, w: w[ids], [IDS, Input((V, D))],
                   grad_reference=lambda wgt, ids, w: [_scatter_add(ids, wgt, V)],
                   placements=[pl], max_combos=combos(pl), name="embedding")


@pytest.mark.mpi(min_size=1)
def test_embedding_vocab_parallel_output_is_partial_and_grad_stays_split():
    """Vocabulary split: no gather of the weight, neither forward nor backward."""
    pl = world()
    wv = np.arange(V * D, dtype=np.float64).reshape(V, D) / 8
    w = sm.tensor(wv, placement=pl, sbp=S(0), requires_grad=True)
    ids = sm.tensor(IDS, placement=pl, sbp=B)
    with sm.trace() as t:
        y = sm.nn.embedding(ids, w)
    assert y.sbp == (P,) and t.ops() == []
    np.testing.assert_array_equal(y.numpy(), wv[IDS])
    g = np.linspace(-1, 1, y.size).reshape(y.shape)
    with sm.trace() as t:
        y.backward(sm.tensor(g, placement=pl, sbp=B))
    assert t.ops() == [], str(t)
    assert w.grad.layout == w.layout
    np.testing.assert_allclose(w.grad.numpy(), _scatter_add(IDS, g, V), rtol=1e-14)


@pytest.mark.mpi(min_size=1)
def test_embedding_module_and_errors():
    for pl, sbp in layouts():
        sm.manual_seed(4)
        emb = sm.nn.Embedding(V, D, placement=pl, sbp=sbp, dtype=np.float64)
        assert [n for n, _ in emb.named_parameters()] == ["weight"]
        assert emb.weight.sbp == sm.Layout.make((V, D), pl, sbp).sbp
        w = emb.weight.numpy()
        sm.manual_seed(4)
        np.testing.assert_array_equal(w, sm.randn(V, D, placement=pl, sbp=(B,) * pl.ndim,
                                                  dtype=np.float64).numpy())
        ids = sm.tensor(IDS, placement=pl, sbp=(S(0),) + (B,) * (pl.ndim - 1))
        np.testing.assert_array_equal(emb(ids).numpy(), w[IDS])
    pl = world()
    w = sm.zeros(V, D, placement=pl, sbp=B)
    kind, msg = errors_of(lambda: sm.nn.embedding(sm.zeros(3, placement=pl, sbp=B), w))
    assert kind == "TypeError" and "integers" in msg
    kind, msg = errors_of(lambda: sm.nn.embedding(sm.tensor(np.array([1, 7]), placement=pl,
                                                            sbp=B), w))
    assert kind == "IndexError" and "7" in msg and "7 rows" in msg
    kind, msg = errors_of(lambda: sm.nn.Embedding(0, 3, placement=pl))
    assert kind == "ValueError" and "num_embeddings" in msg
    kind, msg = errors_of(lambda: sm.nn.Embedding(3, 3, placement=pl, sbp=P))
    assert kind == "ValueError" and "partial" in msg


# ---- layer norm --------------------------------------------------------------------------------

def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _layer_norm_grad(dy, x, w, b, eps=1e-5):
    """Analytic: dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))."""
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mu) * rstd
    dxhat = dy * w
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    return [dx, (dy * xhat).sum(lead), dy.sum(lead)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 5)], ids=["2d", "3d_sequence"])
def test_layer_norm_values_and_gradient(shape):
    inputs = [Input(shape), Input(shape[-1:], low=0.5), Input(shape[-1:])]
    for pl in placements():
        check_op(sm.nn.layer_norm, _layer_norm, inputs, placements=[pl],
                 max_combos=combos(pl, mesh=4))
        check_grad(sm.nn.layer_norm, _layer_norm, inputs, grad_reference=_layer_norm_grad,
                   placements=[pl], max_combos=combos(pl, mesh=4), name="layer_norm")


@pytest.mark.mpi(min_size=1)
def test_layer_norm_float32_values_and_gradient():
    """float32 stays float32 on both paths (fused: whole rows; composed: last dim split)."""
    shape = (7, 5)
    inputs = [Input(shape, np.float32), Input(shape[-1:], np.float32, low=0.5),
              Input(shape[-1:], np.float32)]
    for pl in placements():
        check_op(sm.nn.layer_norm, _layer_norm, inputs, placements=[pl],
                 max_combos=combos(pl, mesh=4))
        check_grad(sm.nn.layer_norm, _layer_norm, inputs, grad_reference=_layer_norm_grad,
                   placements=[pl], max_combos=combos(pl, mesh=4), name="layer_norm",
                   rtol=1e-4, atol=1e-5)
        y = sm.nn.layer_norm(sm.ones(shape, placement=pl, sbp=(B,) * pl.ndim, dtype=np.float32))
        assert y.dtype == np.float32


def _normalize(x, eps=1e-5):
    return _layer_norm(x, 1.0, 0.0, eps)


def _normalize_grad(g, x, eps=1e-5):
    return _layer_norm_grad(g, x, 1.0, 0.0, eps)[:1]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(6,), (7, 5), (2, 3, 5)], ids=["1d", "2d", "3d"])
def test_normalize_values_and_gradient(shape, dtype):
    """The fused op on its own, every input SBP kind: a split last dim or a partial input
    is boxed to whole rows (the result is never split there)."""
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {}
    inputs = [Input(shape, dtype)]
    for pl in placements():
        for eps in (1e-5, 0.25):
            check_op(sm.ops.normalize, _normalize, inputs, kwargs={"eps": eps},
                     placements=[pl], max_combos=combos(pl))
            check_grad(sm.ops.normalize, _normalize, inputs, kwargs={"eps": eps},
                       grad_reference=lambda g, x, e=eps: _normalize_grad(g, x, e),
                       placements=[pl],
                       max_combos=combos(pl), name="normalize", **tol)
        last = len(shape) - 1
        y = sm.ops.normalize(sm.tensor(np.ones(shape, dtype), placement=pl,
                                       sbp=(S(last),) * pl.ndim))
        assert y.dtype == dtype and S(last) not in y.sbp


@pytest.mark.mpi(min_size=1)
def test_normalize_backward_matches_numpy():
    """The gradient op directly, g and x in different layouts (boxed to a common row)."""
    rng = np.random.default_rng(3)
    xv, gv = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    want = _normalize_grad(gv, xv, 0.1)[0]
    pl = world()
    for gs, xs in ((B, B), (S(0), B), (S(1), S(0)), (P, S(0)), (S(0), S(1))):
        g = sm.tensor(gv, placement=pl, sbp=B).to_global(sbp=gs)  # a partial g too
        got = sm.ops.normalize_backward(g, sm.tensor(xv, placement=pl, sbp=xs), eps=0.1)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{gs} {xs}")


@pytest.mark.mpi(min_size=1)
def test_normalize_rejects_bad_arguments():
    pl = world()
    x = sm.ones((3, 4), placement=pl, sbp=B, dtype=np.float64)
    for call, kind, words in (
            (lambda: sm.ops.normalize(x, eps=-1.0), "ValueError", "eps"),
            (lambda: sm.ops.normalize(x, eps="a"), "ValueError", "eps"),
            (lambda: sm.ops.normalize(sm.ones((3, 0), placement=pl, sbp=B)), "ValueError", "last dim"),
            (lambda: sm.ops.normalize(sm.ones((3, 4), placement=pl, sbp=B, dtype=np.complex128)),
             "TypeError", "real"),
            (lambda: sm.ops.normalize_backward(sm.ones((3, 5), placement=pl, sbp=B), x), "ValueError",
             "must match")):
        got, msg = errors_of(call)
        assert got == kind and words in msg, (got, msg)


@pytest.mark.mpi(min_size=2)
def test_layer_norm_communicates_moments_only():
    """Last dim split: two all-reduces of the moments (shape (..., 1)) forward, no gather;
    a split sequence dim: nothing."""
    pl = world()
    xv = np.random.default_rng(0).standard_normal((4, 3, 6))
    ln = sm.nn.LayerNorm(6, placement=pl, sbp=S(0), dtype=np.float64)
    x = sm.tensor(xv, placement=pl, sbp=S(2))
    with sm.trace() as t:
        y = ln(x)
    assert t.ops() == ["all_reduce"] * 2 and all(r.nbytes <= 4 * 3 * 8 for r in t), str(t)
    assert y.sbp == (S(2),)
    np.testing.assert_allclose(y.numpy(), _layer_norm(xv, 1.0, 0.0), rtol=1e-12, atol=1e-12)
    ln = sm.nn.LayerNorm(6, placement=pl, dtype=np.float64)
    x = sm.tensor(xv, placement=pl, sbp=S(1)).requires_grad_()
    with sm.trace() as t:
        y = ln(x)
    assert t.ops() == [] and y.sbp == (S(1),)
    # whole rows: one fused op forward, one backward, nothing communicated for x
    assert y.grad_fn is not None
    with sm.trace() as t:
        y.backward(sm.ones(y.shape, placement=pl, sbp=S(1), dtype=np.float64))
    assert x.grad is not None and x.grad.sbp == (S(1),)
    assert all(r.nbytes <= 6 * 8 for r in t), str(t)  # the parameters' grads only
    assert ln.bias is not None
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]
    assert sm.nn.LayerNorm(6, bias=False, placement=pl).bias is None


# ---- dropout -----------------------------------------------------------------------------------

def _whole_mask(shape, p, seed, call=0):
    """The mask drawn by the counter-based generator on the whole array, in one process."""
    u = counter_random.uniform(np, shape, [(0, n) for n in shape], seed, call)
    return (u < 1 - p) / (1 - p)


@pytest.mark.mpi(min_size=1)
def test_dropout_mask_is_independent_of_layout_and_world_size():
    shape, p = (7, 5, 3), 0.3
    want = _whole_mask(shape, p, seed=11)
    cases = [(world(), sbp) for sbp in (B, S(0), S(1), S(2), P)]
    if size == 4:
        cases += [(world(2), (S(0), S(2))), (world(2), (B, S(1))), (world(2), (P, S(0)))]
    cases.append((sm.placement("cpu", [size - 1]), B))
    for pl, sbp in cases:
        sm.manual_seed(11)
        x = sm.ones(shape, placement=pl, sbp=sbp, dtype=np.float64)
        y = sm.nn.dropout(x, p)
        np.testing.assert_array_equal(y.numpy(), want, err_msg=f"{pl} {sbp}")
    kept = (want > 0).mean()
    assert abs(kept - (1 - p)) < 0.08, kept  # 105 draws of Bernoulli(0.7)


@pytest.mark.mpi(min_size=1)
def test_dropout_gradient_and_extremes():
    mask = _whole_mask((3, 4), 0.4, seed=2)

    def op(x):
        sm.manual_seed(2)
        return sm.nn.dropout(x, 0.4)

    for pl in placements():
        check_grad(op, lambda x: x * mask, [Input((3, 4))],
                   grad_reference=lambda w, x: [w * mask], placements=[pl],
                   max_combos=combos(pl), name="dropout")
    x = sm.tensor(np.arange(6.0), placement=world(), sbp=S(0))
    assert sm.nn.dropout(x, 0.5, training=False) is x
    assert sm.nn.dropout(x, 0.0) is x
    assert not sm.nn.dropout(x, 1.0).numpy().any()
    kind, msg = errors_of(lambda: sm.nn.dropout(x, 1.5))
    assert kind == "ValueError" and "1.5" in msg


# ---- modules: containers, names, train/eval ----------------------------------------------------

class Block(sm.nn.Module):
    def __init__(self, pl):
        self.norm = sm.nn.LayerNorm(4, placement=pl, dtype=np.float64)
        self.fc = sm.nn.Linear(4, 4, placement=pl, dtype=np.float64)
        self.drop = sm.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(self.norm(x)))


class Net(sm.nn.Module):
    def __init__(self, pl):
        self.blocks = sm.nn.ModuleList([Block(pl) for _ in range(2)])
        self.head = sm.nn.Sequential(sm.nn.Linear(4, 3, placement=pl, dtype=np.float64),
                                     sm.nn.Dropout(0.1),
                                     sm.nn.Linear(3, 2, bias=False, placement=pl,
                                                  dtype=np.float64))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@pytest.mark.mpi(min_size=1)
def test_containers_name_parameters_as_torch():
    net = Net(world())
    block = ["norm.weight", "norm.bias", "fc.weight", "fc.bias"]
    want = [f"blocks.{i}.{n}" for i in range(2) for n in block] + \
        ["head.0.weight", "head.0.bias", "head.2.weight"]
    assert list(net.state_dict()) == want
    assert len(net.parameters()) == len(want)
    assert len(net.blocks) == 2 and net.blocks[1] is list(net.blocks)[1]
    assert isinstance(net.blocks[:1], sm.nn.ModuleList) and len(net.blocks[:1]) == 1
    assert [type(m).__name__ for m in net.head] == ["Linear", "Dropout", "Linear"]
    seq = sm.nn.Sequential()
    seq.append(sm.nn.Linear(2, 2, placement=world())).extend([sm.nn.Dropout()])
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias"]
    kind, msg = errors_of(lambda: sm.nn.ModuleList([net, 3]))
    assert kind == "TypeError" and "entry 1" in msg and "int" in msg


@pytest.mark.mpi(min_size=1)
def test_sequential_forward_and_train_eval():
    pl = world()
    sm.manual_seed(1)
    net = Net(pl)
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    assert len(list(net.modules())) == 1 + 1 + 2 * 4 + 1 + 3
    xv = np.linspace(-1, 1, 20).reshape(5, 4)
    x = sm.tensor(xv, placement=pl, sbp=S(0))
    h = xv
    for b in net.blocks:
        h = _layer_norm(h, b.norm.weight.numpy(), b.norm.bias.numpy())
        h = h @ b.fc.weight.numpy() + b.fc.bias.numpy()
    h = h @ net.head[0].weight.numpy() + net.head[0].bias.numpy()
    np.testing.assert_allclose(net(x).numpy(), h @ net.head[2].weight.numpy(), rtol=1e-12)
    net.train()
    assert all(m.training for m in net.modules())
    sm.manual_seed(3)
    a = net(x).numpy()
    sm.manual_seed(3)
    np.testing.assert_array_equal(net(x).numpy(), a)  # same seed, same masks
    assert not np.allclose(a, net(x).numpy())  # the next call draws new masks


# ---- weight tying ------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_tied_embedding_and_output_projection_sum_both_gradients():
    ids = np.array([[1, 6, 0], [3, 3, 5]])
    labels = np.array([6, 0, 2, 3, 4, 1])
    for pl, sbp in layouts():
        sm.manual_seed(9)

        class Tied(sm.nn.Module):
            def __init__(self, pl=pl, sbp=sbp):
                self.tok = sm.nn.Embedding(V, D, placement=pl, sbp=sbp, dtype=np.float64)
                self.norm = sm.nn.LayerNorm(D, placement=pl, dtype=np.float64)

            def forward(self, x):
                h = self.norm(self.tok(x))
                return sm.matmul(h, self.tok.weight.T)  # the projection shares the weight

        net = Tied()
        assert list(net.state_dict()) == ["tok.weight", "norm.weight", "norm.bias"]
        w = net.tok.weight.numpy()
        x = sm.tensor(ids, placement=pl, sbp=(S(0),) + (B,) * (pl.ndim - 1))
        loss = sm.nn.cross_entropy(net(x).reshape(6, V), labels)
        loss.backward()
        e = w[ids].reshape(6, D)
        mu = e.mean(1, keepdims=True)
        rstd = 1 / np.sqrt(((e - mu) ** 2).mean(1, keepdims=True) + 1e-5)
        h = (e - mu) * rstd
        z = h @ w.T
        logp = z - z.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        np.testing.assert_allclose(loss.item(), -logp[np.arange(6), labels].mean(), rtol=1e-12)
        dz = np.exp(logp)
        dz[np.arange(6), labels] -= 1
        dz /= 6
        dh = dz @ w
        de = rstd * (dh - dh.mean(1, keepdims=True) - h * (dh * h).mean(1, keepdims=True))
        want = dz.T @ h + _scatter_add(ids.reshape(-1), de, V)
        assert net.tok.weight.grad.layout == net.tok.weight.layout
        np.testing.assert_allclose(net.tok.weight.grad.numpy(), want, rtol=1e-10, atol=1e-13)


# ---- gradient clipping -------------------------------------------------------------------------

def _params_with_grads(rng):
    """Parameters in every layout kind, with random gradients (a partial one made of random
    operands); the NumPy gradients."""
    specs = [(world(), S(0), (5, 3)), (world(), B, (4,)), (world(), S(1), (2, 7)),
             (world(), P, (3, 3))]
    if size == 4:
        specs += [(world(2), (S(0), B), (5, 2)), (world(2), (B, B), (3,)),
                  (world(2), (S(1), S(0)), (3, 5))]
    if size > 1:
        specs.append((sm.placement("cpu", [size - 1]), B, (2, 2)))
    params, grads = [], []
    for pl, sbp, shape in specs:
        g = rng.standard_normal(shape)
        p = sm.zeros(shape, placement=pl, sbp=sbp, dtype=np.float64, requires_grad=True)
        p.grad = make_input(g, pl, sbp, rng)
        params.append(p)
        grads.append(g)
    return params, grads


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf], ids=str)
def test_clip_grad_norm_against_numpy(norm_type):
    for max_norm in (0.5, 1e6):
        params, grads = _params_with_grads(np.random.default_rng(5))
        flat = np.concatenate([g.ravel() for g in grads])
        want = np.linalg.norm(flat, ord=norm_type)
        total = sm.nn.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        assert total.shape == () and all(s == B for s in total.sbp)
        np.testing.assert_allclose(total.item(), want, rtol=1e-12)
        coef = min(1.0, max_norm / (want + 1e-6))
        for p, g in zip(params, grads):
            assert p.grad.layout == p.layout
            np.testing.assert_allclose(p.grad.numpy(), g * coef, rtol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_clip_grad_norm_one_all_reduce_for_all_parameters():
    params, grads = _params_with_grads(np.random.default_rng(6))
    params = [p for p in params if not any(isinstance(s, type(P)) for s in p.sbp)]
    with sm.trace() as t:
        total = sm.nn.clip_grad_norm_(params, 0.1)
    want = 1 if size > 1 else 0  # one rank: nothing to reduce
    assert t.ops() == ["all_reduce"] * want and all(r.nbytes == 8 for r in t), str(t)
    assert total.item() > 0.1
    kind, msg = errors_of(lambda: sm.nn.clip_grad_norm_(params, -1.0))
    assert kind == "ValueError" and "max_norm" in msg
    params[0].grad = sm.full(params[0].shape, np.inf, placement=params[0].placement,
                             sbp=params[0].sbp, dtype=np.float64)
    kind, msg = errors_of(lambda: sm.nn.clip_grad_norm_(params, 1.0, error_if_nonfinite=True))
    assert kind == "RuntimeError" and "inf" in msg
