"""AdamW, parameter groups (AdamW, Adam, SGD) and learning-rate schedules against NumPy and
torch's formulas.

Optimizer steps run in every layout (split, broadcast, the 2x2 mesh at n = 4) and must
equal a NumPy transcription of torch's update on the whole arrays; the schedules are
plain arithmetic and are compared with the closed forms of torch's documentation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR

S, B = sm.sbp.split, sm.sbp.broadcast
size = MPI.COMM_WORLD.Get_size()


def world(ndim=1):
    return sm.placement("cpu", [[0, 1], [2, 3]] if ndim == 2 else list(range(size)))


def layouts():
    out = [(world(), S(0)), (world(), B), (world(), S(1))]
    if size == 4:
        out += [(world(2), (S(0), S(1))), (world(2), (B, S(0)))]
    return out


def _loss(ps):
    """sum(p^3 / 3) over the parameters: the gradient of p is p^2."""
    total = None
    for p in ps:
        t = (p * p * p * (1 / 3)).sum()
        total = t if total is None else total + t
    return total


def torch_adamw(p, g, m, v, t, lr, b1, b2, eps, wd):
    """torch.optim.AdamW's update (torch/optim/adamw.py, _single_tensor_adamw)."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / math.sqrt(1 - b2 ** t) + eps
    return p - lr / (1 - b1 ** t) * m / denom, m, v


@pytest.mark.mpi(min_size=1)
def test_adamw_with_groups_against_torch_formula():
    for pl, sbp in layouts():
        wv = np.linspace(-2, 3, 35).reshape(7, 5)
        bv = np.linspace(-1, 1, 5)
        w = sm.tensor(wv, placement=pl, sbp=sbp, requires_grad=True)
        bsbp = tuple(S(0) if s == S(1) else B for s in w.sbp)
        b = sm.tensor(bv, placement=pl, sbp=bsbp, requires_grad=True)
        opt = sm.optim.AdamW([{"params": [w]}, {"params": [b], "weight_decay": 0.0,
                                                 "lr": 0.05}],
                             lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
        assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
        assert opt.param_groups[1]["betas"] == (0.8, 0.9)
        want = {"w": (wv, 0 * wv, 0 * wv, 0.1, 0.1), "b": (bv, 0 * bv, 0 * bv, 0.05, 0.0)}
        for t in range(1, 5):
            opt.zero_grad()
            _loss([w, b]).backward()
            opt.step()
            for k, (p, m, v, lr, wd) in want.items():
                p, m, v = torch_adamw(p, p * p, m, v, t, lr, 0.8, 0.9, 1e-6, wd)
                want[k] = (p, m, v, lr, wd)
        np.testing.assert_allclose(w.numpy(), want["w"][0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(b.numpy(), want["b"][0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(opt.state[0]["exp_avg_sq"].numpy(), want["w"][2], rtol=1e-12)
        assert w.layout.sbp == sm.Layout.make(w.shape, pl, sbp).sbp
        assert opt.state[1]["exp_avg"].layout == b.layout


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_groups_of_sgd_and_adam(opt_name):
    pl = world()
    v1, v2 = np.linspace(-1, 2, 6), np.linspace(0.5, 1.5, 4)
    p1 = sm.tensor(v1, placement=pl, sbp=S(0), requires_grad=True)
    p2 = sm.tensor(v2, placement=pl, sbp=B, requires_grad=True)
    groups = [{"params": [p1]}, {"params": [p2], "weight_decay": 0.0, "lr": 0.02}]
    if opt_name == "sgd":
        opt = sm.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=0.05)
        assert list(opt.state[1]) == ["momentum_buffer"]
    else:
        opt = sm.optim.Adam(groups, lr=0.1, weight_decay=0.05)
    state = [[v1, 0 * v1, 0 * v1, 0.1, 0.05], [v2, 0 * v2, 0 * v2, 0.02, 0.0]]
    for t in range(1, 4):
        opt.zero_grad()
        _loss([p1, p2]).backward()
        opt.step()
        for s in state:
            p, m, v, lr, wd = s
            g = p * p + wd * p
            if opt_name == "sgd":
                m = 0.9 * m + g
                p = p - lr * m
            else:
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                p = p - lr / (1 - 0.9 ** t) * m / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
            s[:3] = p, m, v
    np.testing.assert_allclose(p1.numpy(), state[0][0], rtol=1e-12)
    np.testing.assert_allclose(p2.numpy(), state[1][0], rtol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_group_state_dict_round_trip_and_errors():
    pl = world()
    p1 = sm.tensor(np.arange(6.0), placement=pl, sbp=S(0), requires_grad=True)
    p2 = sm.tensor(np.arange(3.0), placement=pl, sbp=B, requires_grad=True)
    opt = sm.optim.AdamW([{"params": [p1]}, {"params": [p2], "weight_decay": 0.0}], lr=0.05)
    _loss([p1, p2]).backward()
    opt.step()
    state = opt.state_dict()
    assert {"lr", "weight_decay", "groups.1.lr", "groups.1.weight_decay", "0.exp_avg",
            "1.step"} <= set(state)
    q1 = sm.tensor(np.zeros(6), placement=pl, sbp=B, requires_grad=True)
    q2 = sm.tensor(np.zeros(3), placement=pl, sbp=B, requires_grad=True)
    opt2 = sm.optim.AdamW([{"params": [q1]}, {"params": [q2], "weight_decay": 0.5}], lr=1.0)
    opt2.load_state_dict(state)
    assert [g["weight_decay"] for g in opt2.param_groups] == [0.01, 0.0]
    assert opt2.lr == 0.05 and opt2.steps == [1, 1]
    np.testing.assert_allclose(opt2.state[0]["exp_avg"].numpy(), opt.state[0]["exp_avg"].numpy())
    opt2.lr = 0.5  # sets every group, as before groups existed
    assert [g["lr"] for g in opt2.param_groups] == [0.5, 0.5]
    kind, msg = errors_of(lambda: sm.optim.AdamW([{"params": [p1], "wd": 0.1}]))
    assert kind == "ValueError" and "'wd'" in msg and "weight_decay" in msg
    kind, msg = errors_of(lambda: sm.optim.SGD([{"params": [p1]}, p2], lr=0.1))
    assert kind == "TypeError" and "mix" in msg
    kind, msg = errors_of(lambda: sm.optim.AdamW([{"params": [p1]}, {"params": [p1]}]))
    assert kind == "ValueError" and "more than once" in msg
    kind, msg = errors_of(lambda: sm.optim.AdamW([{"params": [p1], "betas": (0.9, 1.0)}]))
    assert kind == "ValueError" and "betas[1]" in msg


# ---- learning-rate schedules (no communication: serial tests) ------------------------------------

def _opt(lrs=(0.1,)):
    pl = sm.placement("cpu", [0])
    groups = [{"params": [sm.zeros(2, placement=pl, sbp=B, requires_grad=True)], "lr": lr}
              for lr in lrs]
    return sm.optim.AdamW(groups)


def _run(sched, steps):
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr())
        sched.optimizer.step()
        sched.step()
    return out


def test_linear_warmup_and_lambda():
    opt = _opt((0.1, 0.2))
    got = _run(LinearLR(opt, start_factor=0.25, total_iters=4), 7)
    for e, lrs in enumerate(got):
        f = 0.25 + 0.75 * min(e, 4) / 4
        np.testing.assert_allclose(lrs, [0.1 * f, 0.2 * f], rtol=1e-15)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.2])
    opt = _opt((0.1, 0.2))
    got = _run(LambdaLR(opt, [lambda e: 0.5 ** e, lambda e: e + 1]), 4)
    assert got == [[0.1 * 0.5 ** e, 0.2 * (e + 1)] for e in range(4)]


def test_cosine_and_warmup_then_cosine():
    opt = _opt()
    got = _run(CosineAnnealingLR(opt, T_max=6, eta_min=0.01), 7)
    want = [0.01 + 0.09 * (1 + math.cos(math.pi * e / 6)) / 2 for e in range(7)]
    np.testing.assert_allclose([g[0] for g in got], want, rtol=1e-14)
    opt = _opt()
    warm = LinearLR(opt, start_factor=0.1, total_iters=3)
    cos = CosineAnnealingLR(opt, T_max=5)
    sched = SequentialLR(opt, [warm, cos], milestones=[3])
    got = [g[0] for g in _run(sched, 9)]
    want = [0.1 * (0.1 + 0.9 * e / 3) for e in range(3)] + \
        [0.05 * (1 + math.cos(math.pi * e / 5)) for e in range(6)]
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-17)
    assert opt.param_groups[0]["initial_lr"] == 0.1


def test_scheduler_state_dict_resumes():
    opt = _opt()
    sched = CosineAnnealingLR(opt, T_max=10)
    _run(sched, 4)
    state = sched.state_dict()
    assert state["last_epoch"] == 4 and state["base_lrs"] == [0.1]
    opt2 = _opt((0.7,))
    sched2 = CosineAnnealingLR(opt2, T_max=10)
    sched2.load_state_dict(state)
    sched.step()
    sched2.step()
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_scheduler_errors():
    opt = _opt()
    with pytest.raises(ValueError, match="total_iters"):
        LinearLR(opt, total_iters=0)
    with pytest.raises(ValueError, match="milestones"):
        SequentialLR(opt, [LinearLR(opt), CosineAnnealingLR(opt, 5)], milestones=[])
    with pytest.raises(TypeError, match="param_groups"):
        CosineAnnealingLR(object(), T_max=3)
