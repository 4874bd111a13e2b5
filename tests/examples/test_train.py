"""Training on global tensors: autograd semantics, optimizers and nn against NumPy,
errors on every rank, the data-parallel step's communication, checkpoints that resume
on another world size and layout, and examples/train_mlp.py in its three layouts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import errors_of, run_program
from mpi4py import MPI

import sbpmpi as sm

S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240


def world(ndim: int = 1) -> sm.Placement:
    if ndim == 2:
        return sm.placement("cpu", [[0, 1], [2, 3]])
    return sm.placement("cpu", list(range(size)))


def layouts_1d_and_mesh():
    out = [(world(), S(0)), (world(), B), (world(), S(1))]
    if size == 4:
        out += [(world(2), (S(0), S(1))), (world(2), (B, S(0)))]
    return out


# ---- autograd semantics ----------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_gradients_accumulate_until_zeroed():
    v = np.arange(12.0).reshape(3, 4)
    x = sm.tensor(v, placement=world(), sbp=S(0), requires_grad=True)
    assert x.requires_grad and x.is_leaf and x.grad is None
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * v)
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * v + 3)
    assert x.grad.layout == x.layout
    x.grad = None
    (x.sum(1) * x.sum(1)).sum().backward()  # x used twice in one graph
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.repeat(v.sum(1, keepdims=True), 4, 1))


@pytest.mark.mpi(min_size=1)
def test_no_grad_and_detach():
    v = np.linspace(-1, 1, 8).reshape(2, 4)
    x = sm.tensor(v, placement=world(), sbp=B).requires_grad_()
    with sm.no_grad():
        y = sm.exp(x)
        assert not sm.is_grad_enabled()
        with sm.enable_grad():
            z = x * 2.0
    assert sm.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None and y.is_leaf
    assert z.requires_grad and z.grad_fn is not None and not z.is_leaf

    @sm.no_grad()
    def f(t):
        return t * t

    assert not f(x).requires_grad
    d = x.detach()
    assert not d.requires_grad and d.to_local() is x.to_local()  # shares the data
    (x * d).sum().backward()  # d is a constant: the gradient is d, not 2x
    np.testing.assert_allclose(x.grad.numpy(), v)
    # non-differentiable results are not recorded
    assert not (x > 0).requires_grad and not x.astype(np.int64).requires_grad


@pytest.mark.mpi(min_size=1)
def test_backward_with_gradient_and_partial_loss():
    v = np.arange(6.0).reshape(2, 3)
    w = np.array([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]])
    x = sm.tensor(v, placement=world(), sbp=S(1), requires_grad=True)
    y = sm.tanh(x)
    y.backward(sm.tensor(w, placement=world(), sbp=S(0)))
    np.testing.assert_allclose(x.grad.numpy(), w * (1 - np.tanh(v) ** 2))
    # a partial-sum loss: the rules pass the gradient of its global value on
    x2 = sm.tensor(v, placement=world(), sbp=S(0), requires_grad=True)
    loss = (x2 * x2).sum()
    assert size == 1 or any(isinstance(s, sm.sbp.Partial) for s in loss.sbp)
    loss.backward()
    np.testing.assert_allclose(x2.grad.numpy(), 2 * v)


@pytest.mark.mpi(min_size=2)
def test_conjugate_gradient_sbps():
    """Broadcast weight, split batch: the weight's gradient is partial before the leaf box;
    a partial input gets a broadcast gradient; split stays split."""
    pl = world()
    xv, wv = np.arange(12.0).reshape(4, 3), np.ones((3, 2))
    x = sm.tensor(xv, placement=pl, sbp=S(0), requires_grad=True)
    w = sm.tensor(wv, placement=pl, sbp=B, requires_grad=True)
    y = x @ w
    node = y.grad_fn
    g = sm.ones(4, 2, placement=pl, sbp=S(0), dtype=np.float64)
    from sbpmpi.autograd.rules import rule_for

    with sm.no_grad():
        gx, gw = rule_for("matmul")(node, g)
    assert gx.sbp == (S(0),) and gw.sbp == (P,)
    y.backward(g)
    assert w.grad.sbp == (B,) and x.grad.sbp == (S(0),)
    np.testing.assert_allclose(w.grad.numpy(), xv.T @ np.ones((4, 2)))
    p = sm.tensor(xv, placement=pl, sbp=P, requires_grad=True)
    b = p.to_global(sbp=B)
    assert b.grad_fn.name == "to_global"
    with sm.no_grad():
        (gp,) = rule_for("to_global")(b.grad_fn, sm.ones(4, 3, placement=pl, sbp=S(1),
                                                     dtype=np.float64))
    assert gp.sbp == (B,)


# ---- errors ----------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_errors_on_every_rank():
    pl = world()
    x = sm.tensor(np.ones((4, 3)), placement=pl, sbp=S(0), requires_grad=True)
    y = x * 2.0
    kind, msg = errors_of(lambda: y.backward())
    assert kind == "RuntimeError" and "single-element" in msg and "(4, 3)" in msg
    kind, msg = errors_of(lambda: y.backward(sm.ones(3, 4, placement=pl, sbp=B,
                                                     dtype=np.float64)))
    assert kind == "ValueError" and "(3, 4)" in msg and "(4, 3)" in msg
    kind, msg = errors_of(lambda: sm.arange(5, placement=pl, sbp=B, requires_grad=True))
    assert kind == "TypeError" and "int64" in msg and "floating" in msg
    ints = sm.zeros(3, placement=pl, sbp=B, dtype=np.int32)
    kind, msg = errors_of(lambda: ints.requires_grad_())
    assert kind == "TypeError" and "int32" in msg
    kind, msg = errors_of(lambda: sm.optim.SGD([x, y], lr=0.1))
    assert kind == "ValueError" and "params[1] is not a leaf" in msg
    kind, msg = errors_of(lambda: sm.optim.Adam([sm.zeros(3, placement=pl, sbp=P,
                                                          requires_grad=True)]))
    assert kind == "ValueError" and "partial" in msg
    kind, msg = errors_of(lambda: sm.optim.SGD([sm.zeros(3, placement=pl, sbp=B)], lr=0.1))
    assert kind == "ValueError" and "does not require grad" in msg
    kind, msg = errors_of(lambda: sm.optim.SGD([x], lr=-1.0))
    assert kind == "ValueError" and "lr" in msg
    kind, msg = errors_of(lambda: sm.zeros(3, placement=pl, sbp=B).backward())
    assert kind == "RuntimeError" and "does not require grad" in msg
    kind, msg = errors_of(lambda: sm.nn.cross_entropy(y, np.zeros(3, dtype=np.int64)))
    assert kind == "ValueError" and "labels" in msg


# ---- optimizers and nn -----------------------------------------------------------------------

def _quadratic(p):
    return (p * p * 0.5).sum()  # gradient: p


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_optimizer_against_numpy(opt_name):
    for pl, sbp in layouts_1d_and_mesh():
        v = np.linspace(-2, 3, 20).reshape(4, 5)
        p = sm.tensor(v, placement=pl, sbp=sbp, requires_grad=True)
        if opt_name == "sgd":
            opt = sm.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
        else:
            opt = sm.optim.Adam([p], lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.01)
        want, m, s = v.copy(), np.zeros_like(v), np.zeros_like(v)
        for t in range(1, 4):
            opt.zero_grad()
            _quadratic(p).backward()
            opt.step()
            g = want + 0.01 * want
            if opt_name == "sgd":
                m = 0.9 * m + g
                want = want - 0.1 * m
            else:
                m = 0.8 * m + 0.2 * g
                s = 0.9 * s + 0.1 * g * g
                want = want - 0.1 / (1 - 0.8 ** t) * m / (np.sqrt(s / (1 - 0.9 ** t)) + 1e-6)
        np.testing.assert_allclose(p.numpy(), want, rtol=1e-12, atol=1e-12)
        assert p.layout.sbp == sm.Layout.make(p.shape, pl, sbp).sbp
        for k, st in opt.state_dict().items():
            if st.shape == p.shape:
                assert st.layout == p.layout, k


@pytest.mark.mpi(min_size=1)
def test_optimizer_state_dict_round_trip():
    pl = world()
    p = sm.tensor(np.arange(6.0), placement=pl, sbp=S(0), requires_grad=True)
    opt = sm.optim.Adam([p], lr=0.05)
    _quadratic(p).backward()
    opt.step()
    state = opt.state_dict()
    q = sm.tensor(np.arange(6.0), placement=pl, sbp=B, requires_grad=True)
    opt2 = sm.optim.Adam([q], lr=1.0, betas=(0.5, 0.5))
    opt2.load_state_dict(state)
    assert opt2.lr == 0.05 and opt2.betas == (0.9, 0.999) and opt2.steps == [1]
    np.testing.assert_allclose(opt2.state[0]["exp_avg"].numpy(),
                               opt.state[0]["exp_avg"].numpy())
    assert opt2.state[0]["exp_avg"].layout == q.layout
    opt.zero_grad(set_to_none=False)
    assert p.grad.layout == p.layout and not p.grad.numpy().any()
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.mpi(min_size=1)
def test_linear_and_cross_entropy_against_numpy():
    for pl, wsbp in layouts_1d_and_mesh():
        sm.manual_seed(3)
        lin = sm.nn.Linear(5, 4, placement=pl, sbp=wsbp, dtype=np.float64)
        assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
        w, b = lin.weight.numpy(), lin.bias.numpy()
        assert np.all(np.abs(w) <= 1 / np.sqrt(5)) and w.std() > 0
        xv = np.linspace(-1, 1, 30).reshape(6, 5)
        labels = np.array([0, 3, 1, 2, 3, 0])
        xs = (S(0),) + (B,) * (pl.ndim - 1)
        x = sm.tensor(xv, placement=pl, sbp=xs, requires_grad=True)
        loss = sm.nn.cross_entropy(lin(x), labels)
        loss.backward()
        z = xv @ w + b
        logp = z - z.max(1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
        np.testing.assert_allclose(loss.item(), -logp[np.arange(6), labels].mean(), rtol=1e-12)
        dz = np.exp(logp)
        dz[np.arange(6), labels] -= 1
        dz /= 6
        np.testing.assert_allclose(lin.weight.grad.numpy(), xv.T @ dz, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(lin.bias.grad.numpy(), dz.sum(0), rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(x.grad.numpy(), dz @ w.T, rtol=1e-10, atol=1e-14)
        assert lin.weight.grad.layout == lin.weight.layout
        assert lin.bias.grad.layout == lin.bias.layout


@pytest.mark.mpi(min_size=2)
def test_data_parallel_step_communicates_only_gradient_all_reduces():
    pl = world()
    sm.manual_seed(0)
    fc1 = sm.nn.Linear(8, 16, placement=pl, sbp=B, dtype=np.float64)
    fc2 = sm.nn.Linear(16, 4, placement=pl, sbp=B, dtype=np.float64)
    params = fc1.parameters() + fc2.parameters()
    opt = sm.optim.SGD(params, lr=0.1)
    x = sm.randn(32, 8, placement=pl, sbp=S(0), dtype=np.float64)
    y = sm.tensor(np.arange(32) % 4, placement=pl, sbp=S(0))

    def step():
        opt.zero_grad()
        sm.nn.cross_entropy(fc2(sm.nn.relu(fc1(x))), y).backward()
        opt.step()

    step()
    with sm.trace() as t:
        step()
    # and the loss's count of labels that are not ignore_index (one int64: the labels
    # are split with the batch, so the mean over the counted rows needs their number)
    assert t.ops() == ["all_reduce"] * (len(params) + 1), str(t)
    assert sorted(r.nbytes for r in t) == sorted([p.nbytes for p in params] + [8])


@pytest.mark.mpi(min_size=1)
def test_training_state_resumes_in_another_layout(shared_dir):
    """Save in data parallel on all ranks; resume tensor parallel (and on rank 0 alone):
    the next two steps' losses are those of the run that went on."""

    def build(pl, w1, w2, seed):
        sm.manual_seed(seed)
        return [sm.nn.Linear(6, 8, placement=pl, sbp=w1, dtype=np.float64),
                sm.nn.Linear(8, 3, placement=pl, sbp=w2, dtype=np.float64)]

    class Net(sm.nn.Module):
        def __init__(self, pl, w1, w2, seed):
            self.layers = build(pl, w1, w2, seed)
            self.pl = pl

        def forward(self, x):
            return self.layers[1](sm.nn.relu(self.layers[0](x)))

    def run(net, opt, k):
        rng = np.random.default_rng(k)
        x = sm.tensor(rng.standard_normal((10, 6)), placement=net.pl, sbp=B)
        opt.zero_grad()
        loss = sm.nn.cross_entropy(net(x), rng.integers(0, 3, size=10))
        loss.backward()
        opt.step()
        return loss.item()

    a = Net(world(), B, B, 0)
    opt = sm.optim.SGD(a.parameters(), lr=0.2, momentum=0.9)
    for k in range(2):
        run(a, opt, k)
    sm.checkpoint.save_training_state(os.path.join(shared_dir, "s"), a, opt)
    want = [run(a, opt, 2), run(a, opt, 3)]
    for pl, w1, w2 in [(world(), S(1), S(0)), (sm.placement("cpu", [0]), B, B)]:
        b = Net(pl, w1, w2, 5)
        opt_b = sm.optim.SGD(b.parameters(), lr=0.5, momentum=0.1)
        sm.checkpoint.load_training_state(os.path.join(shared_dir, "s"), b, opt_b)
        assert b.layers[0].weight.sbp == (w1,)
        got = [run(b, opt_b, 2), run(b, opt_b, 3)]
        np.testing.assert_allclose(got, want, rtol=1e-12)


# ---- programs under mpiexec (serial tests) ------------------------------------------------------

def _run(n, *args):
    return run_program(n, *args, timeout=TIMEOUT)


EXAMPLE = ROOT / "examples" / "train_mlp.py"


@pytest.mark.parametrize("n,args", [
    (2, ["--layout", "dp"]),
    (3, ["--layout", "tp", "--optim", "adam"]),
    (4, ["--layout", "2d"]),
    (2, ["--layout", "tp", "--dtype", "float32", "--data", "synthetic"]),
    (2, ["--layout", "dp", "--optim", "adam", "--graph"]),
], ids=["dp-n2", "tp-adam-n3", "2d-n4", "tp-f32-synthetic-n2", "dp-adam-graph-n2"])
def test_train_mlp_matches_numpy(n, args):
    out = _run(n, EXAMPLE, "--epochs", "2", *args)
    assert "TRAIN_MLP OK" in out.splitlines(), out[-3000:]
    assert out.count("epoch ") == 2


@pytest.mark.parametrize("save,resume", [((4, "2d"), (3, "tp")), ((2, "dp"), (1, "dp"))],
                         ids=["n4-2d-to-n3-tp", "n2-dp-to-n1"])
def test_resume_on_another_world_size(tmp_path, save, resume):
    prog = ROOT / "tests" / "train_programs" / "resume.py"
    assert "SAVED" in _run(save[0], prog, "save", tmp_path, save[1])
    assert "RESUME OK" in _run(resume[0], prog, "resume", tmp_path, resume[1])
