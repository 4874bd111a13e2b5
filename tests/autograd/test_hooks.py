"""The hooks other code uses to take part without being known: the backward engine's
(``sm.autograd.register_leaf_hook``, ``register_backward_end_hook``,
``register_poll_hook``) and ``sm.nn.Module``'s forward hooks. A leaf hook sees each
gradient contribution once (checked against NumPy), the last flagged; the end hook runs
once per backward, told whether it failed; a poll runs before each rule; a removed hook
is not called again; argument errors are the same on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.comm.trace import Mark

S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
AV = np.arange(15.0).reshape(5, 3) / 7  # 5 rows: uneven over 2, 3 and 4 ranks
BV = np.linspace(-1.0, 1.0, 15).reshape(5, 3)


def world() -> sm.Placement:
    return sm.placement("cpu", list(range(size)))


def leaves(sbp=B):
    a = sm.tensor(AV, placement=world(), sbp=sbp, requires_grad=True)
    b = sm.tensor(BV, placement=world(), sbp=sbp, requires_grad=True)
    return a, b


def loss_of(a, b):
    """``sum(a * b) + sum(2 a)``: ``a`` gets two gradients (b and 2), ``b`` one (a)."""
    return (a * b).sum() + (a * 2.0).sum()


class Seen:
    """A leaf hook that records each call: (grad's global value or None, last)."""

    def __init__(self, take: bool = False) -> None:
        self.calls: list[tuple[np.ndarray | None, bool]] = []
        self.take = take

    def __call__(self, leaf, grad, last):
        self.calls.append((None if grad is None else grad.numpy(), last))
        return self.take


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sbp", [B, S(0)], ids=["broadcast", "split"])
def test_a_leaf_hook_sees_each_gradient_once_and_the_last_flagged(sbp):
    a, b = leaves(sbp)
    seen_a, seen_b = Seen(), Seen(take=True)
    ha = sm.autograd.register_leaf_hook(a, seen_a)
    hb = sm.autograd.register_leaf_hook(b, seen_b)
    loss_of(a, b).backward()
    assert [last for _, last in seen_a.calls] == [False, True]
    # the two contributions, each once (in the order the rules give them)
    got = sorted((g for g, _ in seen_a.calls), key=lambda g: float(g.sum()))
    for g, want in zip(got, (BV, np.full_like(BV, 2.0))):  # sums 0 and 30
        np.testing.assert_allclose(g, want, rtol=1e-15)
    np.testing.assert_allclose(a.grad.numpy(), BV + 2.0, rtol=1e-15)  # not taken: .grad
    assert len(seen_b.calls) == 1 and seen_b.calls[0][1]
    np.testing.assert_allclose(seen_b.calls[0][0], AV, rtol=1e-15)
    assert b.grad is None  # taken over: the engine left .grad alone
    # a leaf as the root: its one gradient, the last
    g = sm.tensor(BV, placement=world(), sbp=sbp)
    seen_a.calls.clear()
    a.backward(g)
    assert len(seen_a.calls) == 1 and seen_a.calls[0][1]
    np.testing.assert_allclose(seen_a.calls[0][0], BV, rtol=1e-15)
    ha.remove()
    hb.remove()


class Twice(sm.nn.Module):
    """``sum(x w) + sum(2 x w)``: the weight used twice."""

    def __init__(self) -> None:
        self.w = sm.tensor(BV, placement=world(), sbp=B, requires_grad=True)

    def forward(self, x):
        return (x * self.w).sum() + (x * self.w * 2.0).sum()


@pytest.mark.mpi(min_size=1)
def test_a_gradient_that_does_not_come_is_counted_with_none():
    """ZeRO stage 1 records the weight once per forward; that op's rule adds the gradient
    to ``.grad`` itself (unreduced) and gives the engine none for the leaf: the leaf
    hook is still called, with None, and the last call flagged."""
    net = Twice()
    model, _ = sm.nn.shard(net, sm.optim.SGD(net.parameters(), lr=0.1), stage=1)
    seen = Seen()
    h = sm.autograd.register_leaf_hook(net.w, seen)
    model(sm.tensor(AV, placement=world(), sbp=S(0))).backward()
    assert seen.calls == [(None, True)]
    np.testing.assert_allclose(net.w.grad.numpy(), 3 * AV, rtol=1e-15)
    h.remove()


@pytest.mark.mpi(min_size=1)
def test_end_of_backward_runs_once_per_backward_and_a_poll_before_each_rule():
    a, b = leaves()
    ends: list[bool] = []
    polls: list[int] = []
    he = sm.autograd.register_backward_end_hook(ends.append)
    hp = sm.autograd.register_poll_hook(lambda: polls.append(1))
    with sm.trace() as t:
        loss_of(a, b).backward()
    rules = [e.text for e in t.events() if isinstance(e, Mark) and e.text.startswith(
        "backward ") and e.text != "backward end"]
    assert ends == [False]
    assert len(polls) == len(rules) > 0, (polls, rules)
    loss_of(a, b).backward()
    assert ends == [False, False]
    np.testing.assert_allclose(a.grad.numpy(), 2 * (BV + 2.0), rtol=1e-15)
    he.remove()
    hp.remove()
    he.remove()  # a second remove does nothing
    loss_of(a, b).backward()
    assert ends == [False, False] and len(polls) == len(rules) * 2


@pytest.mark.mpi(min_size=1)
def test_a_failed_backward_tells_every_end_hook_and_raises_its_own_error():
    a, b = leaves()
    ends: list[tuple[str, bool]] = []

    def failing(leaf, grad, last):
        raise RuntimeError("leaf hook failed")

    hooks = [sm.autograd.register_backward_end_hook(lambda f: ends.append(("one", f))),
             sm.autograd.register_backward_end_hook(lambda f: ends.append(("two", f))),
             sm.autograd.register_leaf_hook(b, failing)]
    with pytest.raises(RuntimeError, match="leaf hook failed"):
        loss_of(a, b).backward()
    assert ends == [("one", True), ("two", True)]
    for h in hooks:
        h.remove()


@pytest.mark.mpi(min_size=1)
def test_an_end_hook_that_raises_makes_the_later_ones_see_a_failure():
    a, b = leaves()
    seen: list[bool] = []

    def raising(failed):
        raise ValueError("end hook failed")

    hooks = [sm.autograd.register_backward_end_hook(raising),
             sm.autograd.register_backward_end_hook(seen.append)]
    with pytest.raises(ValueError, match="end hook failed"):
        loss_of(a, b).backward()
    assert seen == [True]
    for h in hooks:
        h.remove()
    loss_of(a, b).backward()  # removed: nothing raises
    assert seen == [True]


@pytest.mark.mpi(min_size=1)
def test_a_removed_leaf_hook_is_not_called_and_grad_is_accumulated_again():
    a, b = leaves()
    seen = Seen(take=True)
    h = sm.autograd.register_leaf_hook(a, seen)
    assert sm.autograd.hooks.leaf_hooks(a) == (seen,)
    loss_of(a, b).backward()
    assert len(seen.calls) == 2 and a.grad is None
    h.remove()
    assert sm.autograd.hooks.leaf_hooks(a) == ()
    loss_of(a, b).backward()
    assert len(seen.calls) == 2
    np.testing.assert_allclose(a.grad.numpy(), BV + 2.0, rtol=1e-15)


@pytest.mark.mpi(min_size=1)
def test_hook_arguments_are_checked_on_every_rank():
    a, b = leaves()
    c = a * 2.0
    assert errors_of(lambda: sm.autograd.register_leaf_hook(AV, print)) == (
        "TypeError", "register_leaf_hook: leaf must be a GlobalTensor, got ndarray")
    assert errors_of(lambda: sm.autograd.register_leaf_hook(c, print)) == (
        "ValueError", "register_leaf_hook: leaf must be a leaf that requires grad (shape "
        "(5, 3), requires_grad=True, is_leaf=False)")
    assert errors_of(lambda: sm.autograd.register_leaf_hook(a, 3)) == (
        "TypeError", "register_leaf_hook: hook must be callable, got int")
    assert errors_of(lambda: sm.autograd.register_backward_end_hook(None)) == (
        "TypeError", "register_backward_end_hook: hook must be callable, got NoneType")
    assert errors_of(lambda: sm.autograd.register_poll_hook("x")) == (
        "TypeError", "register_poll_hook: hook must be callable, got str")


# ---- nn.Module's forward hooks --------------------------------------------------------------

class Affine(sm.nn.Module):
    def __init__(self, scale: float) -> None:
        self.scale = scale

    def forward(self, x, shift=0.0):
        if x is None:
            raise ValueError("no input")
        return x * self.scale + shift


def test_forward_hooks_run_around_forward_and_may_replace_args_and_output():
    m = Affine(2.0)
    order: list[str] = []

    def pre(module, args):
        order.append("pre")
        return (args[0] + 1.0,)

    def post(module, args, out):
        order.append("post")
        return out * 10.0

    hpre = m.register_forward_pre_hook(pre)
    hpost = m.register_forward_hook(post)
    assert m(1.0, shift=0.5) == ((1.0 + 1.0) * 2.0 + 0.5) * 10.0
    assert order == ["pre", "post"]
    assert m.register_forward_pre_hook(lambda mod, args: None) is not None  # None: args kept
    assert m(1.0) == 40.0
    hpre.remove()
    hpost.remove()
    hpost.remove()
    assert m(1.0) == 2.0 and order == ["pre", "post", "pre", "post"]
    assert "forward" not in vars(m)  # the class's forward: nothing patched


def test_an_always_call_forward_hook_runs_when_forward_raises():
    m = Affine(2.0)
    seen: list[object] = []
    m.register_forward_hook(lambda mod, args, out: seen.append(("always", out)),
                            always_call=True)
    m.register_forward_hook(lambda mod, args, out: seen.append(("plain", out)))
    with pytest.raises(ValueError, match="no input"):
        m(None)
    assert seen == [("always", None)]
    assert m(1.0) == 2.0 and seen[1:] == [("always", 2.0), ("plain", 2.0)]

    def broken(mod, args, out):
        raise KeyError("hook")

    m.register_forward_hook(broken, always_call=True)
    with pytest.warns(RuntimeWarning, match="always_call=True raised KeyError"):
        with pytest.raises(ValueError, match="no input"):  # forward's error, not the hook's
            m(None)


def test_forward_hook_arguments_are_checked():
    m = Affine(1.0)
    with pytest.raises(TypeError, match="register_forward_pre_hook: hook must be callable, "
                                        "got int"):
        m.register_forward_pre_hook(1)
    with pytest.raises(TypeError, match="register_forward_hook: always_call must be a bool, "
                                        "got str 'yes'"):
        m.register_forward_hook(print, always_call="yes")


def test_named_modules_gives_each_module_once_with_its_path():
    class Net(sm.nn.Module):
        def __init__(self) -> None:
            self.blocks = sm.nn.ModuleList([Affine(1.0), Affine(2.0)])
            self.pair = [Affine(3.0)]
            self.again = self.blocks[0]  # shared: listed under its first path only

    net = Net()
    paths = [p for p, _ in net.named_modules()]
    assert paths == ["", "blocks", "blocks.0", "blocks.1", "pair.0"]
    assert dict(net.named_modules())["blocks.1"] is net.blocks[1]
