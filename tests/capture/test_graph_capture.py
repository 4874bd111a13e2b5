"""``sm.graph`` and ``sm.nn.Graph`` on an MLP step in the layouts of examples/train_mlp.py:
captured and eager steps bit-identical over 50 steps (SGD with momentum, Adam, a changing
last batch); a changed shape or layout captures again; graph breaks raise naming the op
and the line and are listed by ``sm.explain``; a replaced parameter array recaptures; a
replay's collectives are the eager step's and its allocations do not grow."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from conftest import errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.capture import GraphBreak

S, B = sm.sbp.split, sm.sbp.broadcast
size = MPI.COMM_WORLD.Get_size()
D_IN, D_HID, D_OUT = 7, 6, 3


def layout(kind: str) -> dict:
    if kind == "2d":
        pl = sm.placement("cpu", np.arange(size).reshape(size // 2, 2).tolist())
        return dict(placement=pl, x=(S(0), B), w1=(B, S(1)), w2=(B, S(0)))
    pl = sm.placement("cpu", list(range(size)))
    if kind == "dp":
        return dict(placement=pl, x=(S(0),), w1=(B,), w2=(B,))
    return dict(placement=pl, x=(B,), w1=(S(1),), w2=(S(0),))


def kinds() -> list[str]:
    return ["dp", "tp"] + (["2d"] if size >= 4 and size % 2 == 0 else [])


class MLP(sm.nn.Module):
    def __init__(self, lay: dict, dtype=np.float64) -> None:
        sm.manual_seed(5)
        pl = lay["placement"]
        self.fc1 = sm.nn.Linear(D_IN, D_HID, placement=pl, sbp=lay["w1"], dtype=dtype)
        self.fc2 = sm.nn.Linear(D_HID, D_OUT, placement=pl, sbp=lay["w2"], dtype=dtype)

    def forward(self, x):
        return self.fc2(sm.nn.relu(self.fc1(x)))


def data(steps: int, batch: int = 11, last: int | None = None):
    rng = np.random.default_rng(1)
    out = []
    for t in range(steps):
        n = last if (last and t == steps - 1) else batch
        out.append((rng.standard_normal((n, D_IN)), rng.integers(0, D_OUT, n)))
    return out


def make(kind: str, optim: str):
    lay = layout(kind)
    model = MLP(lay)
    opt = (sm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optim == "sgd"
           else sm.optim.Adam(model.parameters(), lr=0.01))
    return lay, model, step_of(model, opt)


def step_of(model, opt):
    """The training step of ``model`` with ``opt``: forward, cross-entropy, backward,
    update."""
    def step(x, y):
        opt.zero_grad()
        loss = sm.nn.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def run(kind: str, optim: str, captured: bool, batches):
    lay, model, step = make(kind, optim)
    f = sm.graph(step) if captured else step
    ysbp = tuple(s if isinstance(s, sm.sbp.Split) else B for s in lay["x"])
    losses = []
    for xb, yb in batches:
        x = sm.tensor(xb, placement=lay["placement"], sbp=lay["x"])
        y = sm.tensor(yb, placement=lay["placement"], sbp=ysbp)
        losses.append(f(x, y).numpy())
    return np.array(losses), [p.numpy() for p in model.parameters()], f


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("optim", ["sgd", "adam"])
@pytest.mark.parametrize("kind", ["dp", "tp", "2d"])
def test_captured_mlp_steps_are_bit_identical_to_eager(kind, optim):
    if kind not in kinds():
        pytest.skip(f"{kind} does not fit {size} ranks")
    batches = data(50, last=5)  # the last batch is smaller: a new signature
    want, pw, _ = run(kind, optim, False, batches)
    got, pg, f = run(kind, optim, True, batches)
    assert np.array_equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(pg, pw))
    # the reference: NumPy on the whole arrays (SGD with momentum 0.9)
    if optim == "sgd":
        w1, b1, w2, b2 = [p.copy() for p in run(kind, optim, False, [])[1]]
        m = [np.zeros_like(a) for a in (w1, b1, w2, b2)]
        for (x, y), got_loss in zip(batches, got):
            a = x @ w1 + b1
            h = np.maximum(a, 0)
            z = h @ w2 + b2
            zs = z - z.max(1, keepdims=True)
            logp = zs - np.log(np.exp(zs).sum(1, keepdims=True))
            assert np.isclose(got_loss, -logp[np.arange(len(y)), y].mean(), rtol=1e-10)
            dz = np.exp(logp)
            dz[np.arange(len(y)), y] -= 1
            dz /= len(y)
            dh = (dz @ w2.T) * (a > 0)
            for i, (p, g) in enumerate(zip((w1, b1, w2, b2), (x.T @ dh, dh.sum(0), h.T @ dz,
                                                                dz.sum(0)))):
                m[i] = 0.9 * m[i] + g
                p -= 0.1 * m[i]
    ex = str(sm.explain(f))
    assert "2 signature(s)" in ex and "replayed 47 time(s)" in ex, ex


@pytest.mark.mpi(min_size=1)
def test_a_changed_shape_or_layout_captures_again():
    lay, model, step = make("dp", "adam")
    f = sm.graph(step)
    pl = lay["placement"]
    rng = np.random.default_rng(0)

    def call(n, sbp):
        x = sm.tensor(rng.standard_normal((n, D_IN)), placement=pl, sbp=sbp)
        y = sm.tensor(rng.integers(0, D_OUT, n), placement=pl, sbp=sbp)
        return f(x, y)

    for _ in range(3):
        call(8, (S(0),))
    assert f.captures == 2
    call(9, (S(0),))  # another shape
    assert f.captures == 3
    call(8, (B,))  # another layout
    assert f.captures == 4
    call(8, (S(0),))  # the first signature still replays
    assert f.captures == 4
    assert len(f.explain().signatures) == 3


@pytest.mark.mpi(min_size=1)
def test_nn_graph_with_build_is_onefloW_style():
    lay, model, step = make("tp", "sgd")

    class TrainGraph(sm.nn.Graph):
        def build(self, x, y):
            return step(x, y)

    g = TrainGraph()
    batches = data(6)
    pl = lay["placement"]
    got = [g(sm.tensor(x, placement=pl, sbp=(B,)), sm.tensor(y, placement=pl, sbp=(B,))).numpy()
           for x, y in batches]
    lay2, model2, step2 = make("tp", "sgd")
    want = [step2(sm.tensor(x, placement=pl, sbp=(B,)),
                  sm.tensor(y, placement=pl, sbp=(B,))).numpy() for x, y in batches]
    assert np.array_equal(got, want)
    assert "replayed 4 time(s)" in str(sm.explain(g))


# ---- graph breaks ------------------------------------------------------------------------

def _inputs(lay, n=8):
    rng = np.random.default_rng(2)
    pl = lay["placement"]
    return (sm.tensor(rng.standard_normal((n, D_IN)), placement=pl, sbp=lay["x"]),
            sm.tensor(rng.integers(0, D_OUT, n), placement=pl,
                      sbp=tuple(s if isinstance(s, sm.sbp.Split) else B for s in lay["x"])))


@pytest.mark.mpi(min_size=1)
def test_a_host_read_raises_on_capture_naming_the_line():
    lay, model, _ = make("dp", "sgd")

    @sm.graph
    def step(x, y):
        loss = sm.nn.cross_entropy(model(x), y)
        if loss.item() > 100:  # data-dependent control flow
            return None
        return loss

    with pytest.raises(GraphBreak, match=r"test_graph_capture.py:\d+ \(if loss.item\(\) > 100"):
        step(*_inputs(lay))
    assert "graph break" in str(sm.explain(step))


@pytest.mark.mpi(min_size=1)
def test_python_state_in_the_step_raises_on_the_second_capture():
    lay, model, _ = make("dp", "sgd")
    count = [0]

    @sm.graph
    def step(x, y):
        count[0] += 1
        return sm.nn.cross_entropy(model(x) * float(count[0]), y)  # a Python counter

    x, y = _inputs(lay)
    step(x, y)
    with pytest.raises(GraphBreak, match=r"kernel mul at .*test_graph_capture.py:\d+"):
        step(x, y)
    assert "mul" in str(sm.explain(step))


@pytest.mark.mpi(min_size=1)
def test_data_the_step_was_not_given_raises():
    lay, model, _ = make("dp", "sgd")
    rng = np.random.default_rng(3)

    @sm.graph
    def step(x):
        noise = sm.tensor(rng.standard_normal(x.shape), placement=x.placement, sbp=x.sbp)
        return (model(x + noise)).sum()

    x, _ = _inputs(lay)
    step(x)
    with pytest.raises(GraphBreak, match="made outside the graph and differs"):
        step(x)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("caps", [(25.0, 1.0), (0.0, 0.0)], ids=["ddp-defaults", "one-each"])
def test_data_parallel_buckets_are_captured_bit_identical(caps):
    """The reducer's hooks are replayed as host calls: its bucket writes and non-blocking
    all-reduces, at the same points of backward."""
    results, traces = [], []
    for captured in (False, True):
        lay, model, _ = make("dp", "adam")
        dp = sm.nn.DataParallel(model, bucket_cap_mb=caps[0], first_bucket_mb=caps[1])
        opt = sm.optim.Adam(model.parameters(), lr=0.01)

        def step(x, y, opt=opt, dp=dp):
            opt.zero_grad()
            loss = sm.nn.cross_entropy(dp(x), y)
            loss.backward()
            opt.step()
            return loss

        f = sm.graph(step) if captured else step
        pl = lay["placement"]
        losses = []
        for xb, yb in data(12):
            x = sm.tensor(xb, placement=pl, sbp=(S(0),))
            y = sm.tensor(yb, placement=pl, sbp=(S(0),))
            with sm.trace() as tr:
                losses.append(f(x, y).numpy())
        traces.append([(r.op, r.nbytes, r.nonblocking) for r in tr.records])
        results.append((np.array(losses), [p.numpy() for p in model.parameters()]))
        dp.close()
    (want, pw), (got, pg) = results
    assert np.array_equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(pg, pw))
    assert traces[1] == traces[0]
    if size > 1:
        assert any(nb for _, _, nb in traces[0])  # the buckets' all-reduces overlap


def _zero_step(stage: int, captured: bool):
    lay, model, _ = make("dp", "adam")
    model, opt = sm.nn.shard(model, sm.optim.Adam(model.parameters(), lr=0.01), stage=stage)
    step = step_of(model, opt)
    return lay, model, (sm.graph(step) if captured else step)


@pytest.mark.mpi(min_size=1)
def test_zero_stage_1_is_captured_bit_identical():
    """ZeRO 1: gradients left unreduced in backward (no collective), the sharded
    optimizer's step (reduce-scatter, the state slices' update, all-gather) replayed as
    a host call that updates the parameters and state slices in place."""
    results, traces = [], []
    for captured in (False, True):
        lay, model, f = _zero_step(1, captured)
        losses = []
        for xb, yb in data(12):
            x = sm.tensor(xb, placement=lay["placement"], sbp=(S(0),))
            y = sm.tensor(yb, placement=lay["placement"], sbp=(S(0),))
            with sm.trace() as tr:
                losses.append(f(x, y).numpy())
        traces.append([(r.op, r.nbytes) for r in tr.records])
        results.append((np.array(losses), [p.numpy() for p in model.parameters()]))
    (want, pw), (got, pg) = results
    assert np.array_equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(pg, pw))
    assert traces[1] == traces[0]
    assert f.explain().signatures[0][1].startswith("replayed 10 time(s)")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_stages_2_and_3_raise_on_capture(stage):
    """Their all-gathers (after the step, in forward hooks) are not conversions: a
    graph break on capture, never a replay without them."""
    lay, model, f = _zero_step(stage, True)
    x, y = _inputs(lay)
    with pytest.raises(GraphBreak, match="all_gather outside a conversion"):
        f(x, y)
    assert "all_gather" in str(f.explain())


@pytest.mark.mpi(min_size=2)
def test_a_collective_outside_a_conversion_raises():
    lay, model, _ = make("dp", "sgd")

    @sm.graph
    def step(x):
        buf = np.ones(3)
        sm.comm.all_reduce(buf)
        return model(x).sum()

    with pytest.raises(GraphBreak, match="all_reduce outside a conversion"):
        step(_inputs(lay)[0])


@pytest.mark.mpi(min_size=3)
def test_a_message_on_some_ranks_breaks_the_capture_on_every_rank():
    """Ranks 0 and 1 exchange a message in the step, the others make none: every rank
    raises the same GraphBreak (the ranks without a message would otherwise capture,
    and a caller falling back to the eager step on the others would hang)."""
    lay, model, _ = make("dp", "sgd")
    rank = MPI.COMM_WORLD.Get_rank()

    @sm.graph
    def step(x):
        buf = np.ones(3)
        if rank == 0:
            sm.comm.send(buf, 1)
        elif rank == 1:
            sm.comm.recv(buf, 0)
        return model(x).sum()

    kind, msg = errors_of(lambda: step(_inputs(lay)[0]))
    assert kind == "GraphBreak" and "sm.graph capture: rank 0: " in msg, (kind, msg)
    assert "send outside a conversion" in msg and "recv outside a conversion" in msg, msg


@pytest.mark.mpi(min_size=1)
def test_returning_a_python_value_raises():
    lay, model, _ = make("dp", "sgd")
    step = sm.graph(lambda x: 3.0)
    with pytest.raises(GraphBreak, match="returns a float"):
        step(_inputs(lay)[0])


# ---- state, collectives, allocation ----------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_a_replaced_parameter_array_captures_again():
    lay, model, step = make("dp", "sgd")
    f = sm.graph(step)
    x, y = _inputs(lay)
    for _ in range(3):
        f(x, y)
    assert f.captures == 2
    w = model.fc1.weight
    w._set_data(w.to_local().copy())  # as a checkpoint loaded into a new array would
    f(x, y)
    assert f.captures == 3


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["dp", "tp"])
def test_a_replay_makes_the_eager_collectives(kind):
    """The steady state's (the fifth call: two captures, then replays with their buffers
    planned) collectives, bytes, groups and blocking form equal the eager step's."""
    counts = []
    for captured in (False, True):
        lay, model, step = make(kind, "adam")
        f = sm.graph(step) if captured else step
        x, y = _inputs(lay, 64)
        for _ in range(5):
            with sm.trace() as t:
                f(x, y)
        counts.append([(r.op, r.nbytes, r.group_ranks, r.nonblocking) for r in t.records])
    assert counts[0] == counts[1]
    assert (len(counts[0]) > 0) == (size > 1)


@pytest.mark.mpi(min_size=1)
def test_steady_state_replay_allocates_no_more_than_the_eager_step_and_does_not_grow():
    lay, model, step = make("dp", "adam")
    f = sm.graph(step)
    x, y = _inputs(lay, 64)

    def measure(fn, calls=5):
        peaks = []
        for _ in range(calls):
            tracemalloc.start()
            fn(x, y)
            cur, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            peaks.append((cur, peak))
        return peaks

    for _ in range(3):
        f(x, y)  # captured twice, replayed once
    replay = measure(f)
    eager = measure(step)
    # what a replay keeps after it returns (the loss, the gradients) is the same each time
    # (up to a few bytes of MPI's and Python's own bookkeeping)
    held = [c for c, _ in replay]
    assert max(held) - min(held) < 512, replay
    assert max(p for _, p in replay) <= max(p for _, p in eager), (replay, eager)
