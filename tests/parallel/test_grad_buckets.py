"""Gradient buckets (``sm.nn.DataParallel``): reduced gradients equal each gradient
all-reduced on its own (bit for bit), the unbucketed path and NumPy; ``no_sync``
accumulation; the trace of a step; argument errors on every rank; a rank that raises in
backward with buckets in flight ends the job (fault programs under their own mpiexec).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import errors_of
from fault_programs.runner import mpiexec, run_mpi
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.comm.trace import Mark

S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
D_IN, D_HID, D_OUT, BATCH = 7, 5, 3, 11  # an uneven batch split at 2, 3 and 4 ranks

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")


def world() -> sm.Placement:
    return sm.placement("cpu", list(range(size)))


class MLP(sm.nn.Module):
    def __init__(self, pl: sm.Placement, w1=None, w2=None) -> None:
        sm.manual_seed(3)
        self.l1 = sm.nn.Linear(D_IN, D_HID, placement=pl, sbp=w1, dtype=np.float64)
        self.l2 = sm.nn.Linear(D_HID, D_OUT, placement=pl, sbp=w2, dtype=np.float64)

    def forward(self, x):
        return self.l2(sm.nn.relu(self.l1(x)))


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, D_IN)), rng.integers(0, D_OUT, BATCH)


def numpy_grads(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Gradients of the mean cross-entropy of ``relu(x @ w1 + b1) @ w2 + b2``."""
    w1, b1, w2, b2 = params
    a = x @ w1 + b1
    h = np.maximum(a, 0)
    z = h @ w2 + b2
    e = np.exp(z - z.max(1, keepdims=True))
    dz = e / e.sum(1, keepdims=True)
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    dh = (dz @ w2.T) * (a > 0)
    return [x.T @ dh, dh.sum(0), h.T @ dz, dz.sum(0)]


def backward(model, x: np.ndarray, y: np.ndarray, xsbp=None) -> None:
    pl = model.parameters()[0].placement
    xt = sm.tensor(x, placement=pl, sbp=xsbp if xsbp is not None else S(0))
    sm.nn.cross_entropy(model(xt), y).backward()


def grads(model) -> list[np.ndarray]:
    return [p.grad.numpy() for p in model.parameters()]


# ---- bucketed gradients against each gradient reduced alone, the unbucketed path, NumPy -------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("caps", [(25.0, 1.0), (0.0, 0.0), (1e-4, 0.0), (0.0, 1e-3)],
                         ids=["ddp-defaults", "one-per-bucket", "two-buckets", "first-alone"])
def test_bucketed_gradients_equal_each_gradient_reduced_alone(caps):
    x, y = batch()
    dp = sm.nn.DataParallel(MLP(world()), bucket_cap_mb=caps[0], first_bucket_mb=caps[1])
    with dp.no_sync():  # local contributions, kept partial: the reference reduces each alone
        backward(dp, x, y)
    alone = []
    for p in dp.parameters():
        assert p.grad.sbp == (P,) and p.grad.layout != p.layout
        local = p.grad.to_local().copy()
        sm.comm.all_reduce(local, group=sm.comm.placement_group(world()))
        alone.append(local)
    dp.zero_grad()
    backward(dp, x, y)
    for p, want in zip(dp.parameters(), alone):
        assert p.grad.layout == p.layout
        np.testing.assert_array_equal(p.grad.to_local(), want)  # bit for bit
    plain = MLP(world())
    backward(plain, x, y)
    ref = numpy_grads([p.numpy() for p in plain.parameters()], x, y)
    for got, unb, want in zip(grads(dp), grads(plain), ref):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
        if size <= 2:  # a sum of two is the same in any order: the planner's path too
            np.testing.assert_array_equal(got, unb)
        else:
            np.testing.assert_allclose(got, unb, rtol=1e-13, atol=1e-15)


@pytest.mark.mpi(min_size=1)
def test_bucket_layout_follows_reverse_parameter_order_and_sizes():
    dp = sm.nn.DataParallel(MLP(world()), bucket_cap_mb=1e-4, first_bucket_mb=0.0)
    # b2 alone (the first bucket closes at once), then W2 (120 B >= 104 B), then b1 + W1
    assert dp.reducer.layout() == [["(3,)"], ["(5, 3)"], ["(5,)", "(7, 5)"]]
    assert sm.nn.DataParallel(MLP(world())).reducer.layout() == [
        ["(3,)", "(5, 3)", "(5,)", "(7, 5)"]]
    assert [n for n, _ in dp.named_parameters()] == [
        "module.l1.weight", "module.l1.bias", "module.l2.weight", "module.l2.bias"]


@pytest.mark.mpi(min_size=1)
def test_training_with_buckets_equals_the_unbucketed_run():
    losses = []
    for bucketed in (False, True):
        model = MLP(world())
        net = sm.nn.DataParallel(model, bucket_cap_mb=1e-4) if bucketed else model
        opt = sm.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
        run = []
        for step in range(4):
            x, y = batch(step)
            opt.zero_grad()
            xt = sm.tensor(x, placement=world(), sbp=S(0))
            loss = sm.nn.cross_entropy(net(xt), y)
            loss.backward()
            opt.step()
            run.append(float(loss.numpy()))
        losses.append((run, [p.numpy() for p in net.parameters()]))
    np.testing.assert_allclose(losses[1][0], losses[0][0], rtol=1e-12)
    for a, b in zip(losses[1][1], losses[0][1]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        if size <= 2:
            np.testing.assert_array_equal(a, b)


@pytest.mark.mpi(min_size=1)
def test_gradients_accumulate_over_backwards_without_zero_grad():
    (x1, y1), (x2, y2) = batch(1), batch(2)
    dp = sm.nn.DataParallel(MLP(world()), bucket_cap_mb=0.0)
    backward(dp, x1, y1)
    first = [g.copy() for g in grads(dp)]
    backward(dp, x2, y2)  # the first .grad views are copied out before the buckets refill
    params = [p.numpy() for p in dp.parameters()]
    for a, got, g1, g2 in zip(first, grads(dp), numpy_grads(params, x1, y1),
                              numpy_grads(params, x2, y2)):
        np.testing.assert_allclose(a, g1, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got, g1 + g2, rtol=1e-12, atol=1e-14)
    for p in dp.parameters():
        assert p.grad.layout == p.layout


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("how", ["module", "model"])
def test_no_sync_accumulates_and_the_next_backward_reduces_the_sum_once(how):
    (x1, y1), (x2, y2), (x3, y3) = batch(1), batch(2), batch(3)
    dp = sm.nn.DataParallel(MLP(world()), bucket_cap_mb=1e-4)
    params = [p.numpy() for p in dp.parameters()]
    with sm.trace() as t:
        with (sm.nn.no_sync() if how == "module" else dp.no_sync()):
            backward(dp, x1, y1)
            backward(dp, x2, y2)
    assert not any(r.nonblocking for r in t), t  # nothing reduced
    for p, g1, g2 in zip(dp.parameters(), numpy_grads(params, x1, y1),
                         numpy_grads(params, x2, y2)):
        assert p.grad.sbp == (P,)  # honest: the global value is the sum so far
        np.testing.assert_allclose(p.grad.numpy(), g1 + g2, rtol=1e-12, atol=1e-14)
    with sm.trace() as t:
        backward(dp, x3, y3)
    # one reduction per bucket (none for a single rank: nothing to sum over)
    assert sum(r.nonblocking for r in t) == (len(dp.reducer.layout()) if size > 1 else 0)
    for p, g1, g2, g3 in zip(dp.parameters(), numpy_grads(params, x1, y1),
                             numpy_grads(params, x2, y2), numpy_grads(params, x3, y3)):
        assert p.grad.layout == p.layout
        np.testing.assert_allclose(p.grad.numpy(), g1 + g2 + g3, rtol=1e-12, atol=1e-14)


@pytest.mark.mpi(min_size=1)
def test_zero_grad_after_no_sync_discards_the_local_sum():
    (x1, y1), (x2, y2) = batch(1), batch(2)
    dp = sm.nn.DataParallel(MLP(world()))
    with sm.nn.no_sync():
        backward(dp, x1, y1)
    dp.zero_grad()
    backward(dp, x2, y2)
    want = numpy_grads([p.numpy() for p in dp.parameters()], x2, y2)
    for got, w in zip(grads(dp), want):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-14)


@pytest.mark.mpi(min_size=1)
def test_a_parameter_without_gradient_keeps_none_and_the_others_are_reduced():
    x, y = batch()
    model = MLP(world())
    model.unused = sm.tensor(np.ones(4), placement=world(), sbp=B, requires_grad=True)
    dp = sm.nn.DataParallel(model, bucket_cap_mb=0.0)
    backward(dp, x, y)
    assert model.unused.grad is None
    want = numpy_grads([p.numpy() for p in dp.parameters()][:4], x, y)
    for got, w in zip(grads(model.l1) + grads(model.l2), want):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-14)


@pytest.mark.mpi(min_size=4)
def test_buckets_on_the_data_parallel_axis_of_a_2d_mesh():
    mesh = sm.placement("cpu", [[0, 1], [2, 3]])  # axis 0: data parallel, axis 1: tensor
    x, y = batch()
    dp = sm.nn.DataParallel(MLP(mesh, w1=(B, S(1)), w2=(B, S(0))), axis=0,
                            bucket_cap_mb=0.0)
    backward(dp, x, y, xsbp=(S(0), B))
    plain = MLP(mesh, w1=(B, S(1)), w2=(B, S(0)))
    backward(plain, x, y, xsbp=(S(0), B))
    ref = numpy_grads([p.numpy() for p in plain.parameters()], x, y)
    for p, unb, want in zip(dp.parameters(), grads(plain), ref):
        assert p.grad.layout == p.layout
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(p.grad.numpy(), unb)  # two-rank groups: exact


@pytest.mark.mpi(min_size=1)
def test_a_parameter_split_on_the_data_axis_keeps_the_unbucketed_path():
    x, y = batch()
    dp = sm.nn.DataParallel(MLP(world(), w1=S(1)), bucket_cap_mb=0.0, first_bucket_mb=0.0)
    assert dp.reducer.layout() == [["(3,)"], ["(5, 3)"]]  # W1 split(1), b1 split(0): apart
    backward(dp, x, y)
    want = numpy_grads([p.numpy() for p in dp.parameters()], x, y)
    for p, w in zip(dp.parameters(), want):
        assert p.grad.layout == p.layout
        np.testing.assert_allclose(p.grad.numpy(), w, rtol=1e-12, atol=1e-14)


# ---- each DataParallel owns its state ---------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_two_data_parallel_models_one_in_no_sync_the_other_not():
    """Two wrappers in one program, one backward through both: the one in ``no_sync``
    keeps its local sums, the other reduces; the next backward reduces the first's
    accumulated sum once. No state is shared between them."""
    (x1, y1), (x2, y2) = batch(1), batch(2)
    a = sm.nn.DataParallel(MLP(world()), bucket_cap_mb=1e-4)
    b = sm.nn.DataParallel(MLP(world(), w1=S(1)), bucket_cap_mb=0.0)  # other buckets too
    pa, pb = [p.numpy() for p in a.parameters()], [p.numpy() for p in b.parameters()]

    def both(x, y):
        xt = sm.tensor(x, placement=world(), sbp=S(0))
        (sm.nn.cross_entropy(a(xt), y) + sm.nn.cross_entropy(b(xt), y)).backward()

    with sm.trace() as t:
        with a.no_sync():
            both(x1, y1)
    # only b's buckets are reduced (none on one rank: nothing to sum over)
    assert sum(r.nonblocking for r in t) == (len(b.reducer.layout()) if size > 1 else 0), t
    for p, want in zip(a.parameters(), numpy_grads(pa, x1, y1)):
        assert p.grad.sbp == (P,)  # a's local sums, kept
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-12, atol=1e-14)
    for p, want in zip(b.parameters(), numpy_grads(pb, x1, y1)):
        assert p.grad.layout == p.layout
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-12, atol=1e-14)
    with sm.trace() as t:
        both(x2, y2)
    assert sum(r.nonblocking for r in t) == (
        len(a.reducer.layout()) + len(b.reducer.layout()) if size > 1 else 0), t
    for model, params in ((a, pa), (b, pb)):
        for p, g1, g2 in zip(model.parameters(), numpy_grads(params, x1, y1),
                             numpy_grads(params, x2, y2)):
            assert p.grad.layout == p.layout
            np.testing.assert_allclose(p.grad.numpy(), g1 + g2, rtol=1e-12, atol=1e-14)
    assert a.reducer.in_flight == b.reducer.in_flight == 0


@pytest.mark.mpi(min_size=1)
def test_closing_or_dropping_a_data_parallel_removes_its_hooks():
    import gc

    from sbpmpi.autograd.hooks import leaf_hooks

    x, y = batch()
    model = MLP(world())
    dp = sm.nn.DataParallel(model, bucket_cap_mb=0.0)
    assert all(len(leaf_hooks(p)) == 1 for p in model.parameters())
    dp.close()
    dp.close()  # a second close does nothing
    assert all(leaf_hooks(p) == () for p in model.parameters())
    with sm.trace() as t:
        backward(dp, x, y)  # the unbucketed path: blocking all-reduces at the leaves
    assert not any(r.nonblocking for r in t), t
    want = numpy_grads([p.numpy() for p in model.parameters()], x, y)
    for p, w in zip(model.parameters(), want):
        assert p.grad.layout == p.layout
        np.testing.assert_allclose(p.grad.numpy(), w, rtol=1e-12, atol=1e-14)
    again = sm.nn.DataParallel(model)  # the parameters are free to be wrapped again
    assert all(len(leaf_hooks(p)) == 1 for p in model.parameters())
    del again
    gc.collect()
    assert all(leaf_hooks(p) == () for p in model.parameters())


# ---- the trace of one step -------------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
def test_trace_shows_bucket_all_reduces_starting_between_backward_rules():
    x, y = batch()
    dp = sm.nn.DataParallel(MLP(world()), bucket_cap_mb=1e-4, first_bucket_mb=1e-4)
    with sm.trace() as t:
        backward(dp, x, y)
    events = t.events()
    texts = [e.text if isinstance(e, Mark) else (e.op, e.nonblocking) for e in events]
    end = texts.index("backward end")
    started = [i for i, e in enumerate(texts) if e == ("all_reduce", True)]
    assert len(started) == len(dp.reducer.layout()) == 2, t.timeline()
    # the first bucket (b2, W2) starts right after the rule that gave W2's gradient, and
    # before the rules of the first layer run
    assert started[0] < end and texts[started[0] - 1] == "backward matmul", t.timeline()
    assert "backward relu" in texts[started[0]:end], t.timeline()
    assert started[1] < end, t.timeline()  # W1's bucket: started by its own rule
    assert not any(r.op == "all_reduce" and not r.nonblocking for r in t), t.timeline()


# ---- a fixed bucket layout is agreed once ---------------------------------------------------

def exchanges_per_backward(dp, steps: int) -> list[int]:
    """Agreement exchanges of each of ``steps`` backwards (two bucket starts each),
    checking the gradients against NumPy."""
    exchanges = []
    for step in range(steps):
        x, y = batch(step)
        dp.zero_grad()
        loss = sm.nn.cross_entropy(dp(sm.tensor(x, placement=world(), sbp=S(0))), y)
        with sm.trace() as t:
            loss.backward()
        exchanges.append(len(t.agreements))
        assert sum(r.nonblocking for r in t) == 2, t.timeline()
        params = [p.numpy() for p in dp.parameters()]
        for p, want in zip(dp.parameters(), numpy_grads(params, x, y)):
            np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-12, atol=1e-14)
    return exchanges


@pytest.mark.mpi(min_size=2)
def test_a_bucket_layout_is_agreed_once_not_at_every_step():
    dp = sm.nn.DataParallel(MLP(world()), bucket_cap_mb=1e-4, first_bucket_mb=1e-4)
    assert len(dp.reducer.layout()) == 2
    exchanges = exchanges_per_backward(dp, 3)
    # the first backward agrees on each bucket; the later ones reduce the same buckets
    # with no exchange of their own
    assert exchanges[0] == exchanges[1] + 2 == exchanges[2] + 2, exchanges


@pytest.mark.mpi(min_size=2)
def test_in_debug_mode_every_bucket_start_is_checked():
    dp = sm.nn.DataParallel(MLP(world()), bucket_cap_mb=1e-4, first_bucket_mb=1e-4)
    with sm.config.override(debug=True):
        exchanges = exchanges_per_backward(dp, 2)
    assert exchanges[0] == exchanges[1], exchanges


# ---- argument errors, identical on every rank ------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_data_parallel_arguments_are_checked_on_every_rank():
    model = MLP(world())
    assert errors_of(lambda: sm.nn.DataParallel(model, bucket_cap_mb=-1)) == (
        "ValueError", "DataParallel: bucket_cap_mb must be a non-negative number of MiB, "
        "got -1")
    assert errors_of(lambda: sm.nn.DataParallel(model, first_bucket_mb="1")) == (
        "ValueError", "DataParallel: first_bucket_mb must be a non-negative number of MiB, "
        "got '1'")
    assert errors_of(lambda: sm.nn.DataParallel([model])) == (
        "TypeError", "DataParallel: module must be an sm.nn.Module, got list")
    assert errors_of(lambda: sm.nn.DataParallel(model, axis=1)) == (
        "ValueError", "Reducer: axis must be a mesh axis of params[0]'s 1-d placement "
        "(0..0), got 1")
    dp = sm.nn.DataParallel(model)
    kind, text = errors_of(lambda: sm.nn.DataParallel(model))
    assert kind == "ValueError" and "already has a gradient bucket" in text
    del dp


# ---- faults: a rank raising in backward with buckets in flight -------------------------------

@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_raising_in_backward_with_buckets_in_flight_ends_the_job(n):
    res = run_mpi(n, "buckets_raise.py", timeout=60)
    assert res.rc != 0, res
    assert res.seconds < 30, res
    assert "sbpmpi: rank 1: uncaught RuntimeError: relu rule failed on rank 1" in res.out, res
    assert "rank 1: bucket started before the failure" in res.out, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
def test_with_abort_off_every_rank_reports_the_failed_rank():
    res = run_mpi(3, "buckets_raise.py", env={"SBPMPI_ABORT_ON_ERROR": "0"}, timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert "RuntimeError: relu rule failed on rank 1" in res.out, res
    assert "CollectiveMismatchError: ranks disagree on a collective step" in res.out, res
    assert "ranks 0, 2: gradient bucket(" in res.out, res
    assert "rank 1: reached the end of the program" in res.out, res
    for r in range(3):  # the bucket every rank started was completed before raising
        assert f"rank {r}: no request left in flight" in res.out, res
    assert "should not happen" not in res.out, res


@needs_mpiexec
@pytest.mark.parametrize("abort", ["1", "0"])
def test_a_rank_raising_after_the_layout_was_agreed_ends_the_job(abort):
    """The rule fails in the second backward: no bucket start exchanges anything then,
    so the ranks waiting on the bucket rank 1 never starts are ended by the exit watch,
    with the cause."""
    res = run_mpi(3, "buckets_raise.py", "2", env={"SBPMPI_ABORT_ON_ERROR": abort},
                  timeout=60)
    assert res.rc != 0 and res.seconds < 30, res
    assert "RuntimeError: relu rule failed on rank 1" in res.out, res
    assert "rank 1: bucket started before the failure" in res.out, res
    assert "rank 1: no request left in flight" in res.out, res
    if abort == "0":
        assert "ranks 0, 2: all_reduce (sm.comm, waiting on ranks [0, 1, 2])" in res.out, res
        assert "rank 1: reached the end of the program" in res.out, res
    assert "should not happen" not in res.out, res


# ---- parameters used twice; gradients the rules already reduced -----------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("rows, width", [(BATCH, D_IN), (2 * size, 96)],
                         ids=["partial-gradients", "rules-reduce-first"])
def test_a_parameter_used_twice_and_gradients_reduced_by_the_rules(rows, width):
    """``x @ w`` twice: the bucket starts after w's second gradient. With few rows and a
    wide ``w`` the matmul rule may move the inputs and give w's gradient already reduced
    (not partial): it is not reduced again (no more bytes than the unbucketed path)."""
    rng = np.random.default_rng(4)
    xv, wv = rng.standard_normal((rows, width)), rng.standard_normal((width, width))
    sent, got = [], []
    for bucketed in (False, True):
        model = sm.nn.Module()
        model.w = sm.tensor(wv, placement=world(), sbp=B, requires_grad=True)
        if bucketed:
            dp = sm.nn.DataParallel(model, bucket_cap_mb=0.0, first_bucket_mb=0.0)
            assert dp.reducer.layout() == [[str(wv.shape)]]
        x = sm.tensor(xv, placement=world(), sbp=S(0))
        with sm.trace() as t:
            ((x @ model.w) * (x @ model.w)).sum().backward()
        sent.append(t.nbytes())
        got.append(model.w.grad.numpy())
        assert model.w.grad.layout == model.w.layout
    want = 2 * xv.T @ (xv @ wv)
    np.testing.assert_allclose(got[1], want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], got[0], rtol=1e-13, atol=1e-13)
    assert sent[1] <= sent[0], sent


@pytest.mark.mpi(min_size=1)
def test_gradients_the_rules_reduced_over_several_rounds():
    """The rules-reduce-first case of the test above over rounds: a fresh gradient per
    round (``.grad`` set to None between them), then two rounds accumulated into one
    ``.grad``; each against NumPy. The already-reduced part is summed in a buffer the
    bucket slot keeps across rounds and added into the bucket's view (``.grad``'s shard,
    as for every bucketed gradient): nothing of one round may leak into the next."""
    rng = np.random.default_rng(5)
    rows, width = 2 * size, 96
    wv = rng.standard_normal((width, width))
    model = sm.nn.Module()
    model.w = sm.tensor(wv, placement=world(), sbp=B, requires_grad=True)
    sm.nn.DataParallel(model, bucket_cap_mb=0.0, first_bucket_mb=0.0)
    xs = [rng.standard_normal((rows, width)) for _ in range(5)]

    def backward(xv):
        x = sm.tensor(xv, placement=world(), sbp=S(0))
        ((x @ model.w) * (x @ model.w)).sum().backward()

    for xv in xs[:3]:
        model.w.grad = None
        backward(xv)
        np.testing.assert_allclose(model.w.grad.numpy(), 2 * xv.T @ (xv @ wv), rtol=1e-12,
                                   atol=1e-12)
    model.w.grad = None
    backward(xs[3])
    backward(xs[4])  # accumulated into the first round's .grad
    want = 2 * xs[3].T @ (xs[3] @ wv) + 2 * xs[4].T @ (xs[4] @ wv)
    np.testing.assert_allclose(model.w.grad.numpy(), want, rtol=1e-12, atol=1e-12)
