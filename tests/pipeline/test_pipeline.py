"""sm.pipeline on a small model: every schedule's loss and gradients equal the unpipelined
model's (one placement, the micro-batches one after another, the mean of their losses),
with uneven micro-batches, stages on one rank or on tensor-parallel sub-meshes; the
activations a stage holds (GPipe: all M; 1F1B: at most p - s); the trace's intervals;
argument errors, the same on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import errors_of
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.pipeline import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    microbatch_bounds,
)

S, B = sm.sbp.split, sm.sbp.broadcast
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
WIDTHS = (5, 7, 6, 4, 3)  # four layers: in 5, out 3
BATCH = 11  # uneven micro-batches: 3 of 11 rows -> 4, 4, 3
SCHEDULES = [ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B]


class Layer(sm.nn.Module):
    """``tanh(x @ w + b)``; ``tp``: ``w`` split by columns, the output gathered back."""

    def __init__(self, i: int, o: int, pl: sm.Placement, tp: bool) -> None:
        axes = pl.ndim
        wsbp = (B,) * (axes - 1) + (S(1) if tp else B,)
        self.lin = sm.nn.Linear(i, o, placement=pl, sbp=wsbp, bias_sbp=wsbp[:-1] + (
            S(0) if tp else B,), dtype=np.float64)
        self.out_sbp = (B,) * axes

    def forward(self, x: sm.GlobalTensor) -> sm.GlobalTensor:
        return sm.tanh(self.lin(x)).to_global(sbp=self.out_sbp)


def layers(placements: list[sm.Placement], tp: bool = False,
           widths: tuple[int, ...] = WIDTHS) -> list[Layer]:
    """The layers (four of ``WIDTHS``), layer i on ``placements[i % len]``, drawn from one
    seed (the same weights wherever they live)."""
    sm.manual_seed(7)
    return [Layer(widths[i], widths[i + 1], placements[i % len(placements)], tp)
            for i in range(len(widths) - 1)]


def mse(y: sm.GlobalTensor, t: sm.GlobalTensor) -> sm.GlobalTensor:
    d = y - t
    return (d * d).mean()


def data(widths: tuple[int, ...] = WIDTHS, batch: int = BATCH
         ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.normal(size=(batch, widths[0])), rng.normal(size=(batch, widths[-1]))


def reference(m: int, model: list[sm.nn.Module] | None = None,
              xt: tuple[np.ndarray, np.ndarray] | None = None
              ) -> tuple[float, list[np.ndarray]]:
    """The unpipelined model (default: ``layers`` on the whole world): the mean of the
    micro-batches' losses and its gradients."""
    world = sm.placement("cpu", list(range(size)))
    model = layers([world]) if model is None else model
    x, t = data() if xt is None else xt
    xs, ts = (sm.tensor(a, placement=world, sbp=B) for a in (x, t))
    total = None
    for a, b in microbatch_bounds(len(x), m):
        h = xs[a:b]
        for layer in model:
            h = layer(h)
        loss = mse(h, ts[a:b])
        total = loss if total is None else total + loss
    assert total is not None
    mean = total / m
    mean.backward()
    return float(mean.item()), [p.grad.numpy() for layer in model for p in layer.parameters()]


def lines(p: int) -> list[sm.Placement]:
    """``p`` placements of the world's ranks (as even as they go, p <= size)."""
    groups = np.array_split(np.arange(size), p)
    return [sm.placement("cpu", g.tolist()) for g in groups]


def pipeline(schedule: type, model: list[sm.nn.Module], placements: list[sm.Placement],
             m: int) -> tuple[object, list[PipelineStage]]:
    """``model``'s modules as stages, stage i on ``placements[i % len]``."""
    stages = [PipelineStage(mod, i, len(model), placements[i % len(placements)])
              for i, mod in enumerate(model)]
    return schedule(stages, m, mse), stages


def run(schedule: type, placements: list[sm.Placement], m: int, tp: bool = False
        ) -> tuple[float, list[np.ndarray], list[PipelineStage], list]:
    model = layers(placements, tp)
    sched, stages = pipeline(schedule, model, placements, m)
    x, t = data()
    xs = sm.tensor(x, placement=placements[0], sbp=(B,) * placements[0].ndim)
    last = stages[-1].placement
    ts = sm.tensor(t, placement=last, sbp=(B,) * last.ndim)
    losses: list = []
    loss = sched.step(xs, target=ts, losses=losses)
    assert loss.shape == () and loss.placement == sched.job_placement
    assert all(s == B for s in loss.sbp)
    return (float(loss.item()), [p.grad.numpy() for layer in model for p in layer.parameters()],
            stages, losses)


def check(got: tuple, want: tuple[float, list[np.ndarray]]) -> None:
    loss, grads = got[0], got[1]
    assert abs(loss - want[0]) <= 1e-12 * abs(want[0])
    for g, w in zip(grads, want[1]):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.__name__)
@pytest.mark.parametrize("m", [1, 3, 4])
def test_gradients_equal_the_unpipelined_models(schedule, m):
    """Four stages on min(size, 2) or size placements, 3 micro-batches of 11 rows
    (4, 4, 3): the mean loss and every gradient as the one-placement model's."""
    want = reference(m)
    for p in sorted({1, min(size, 2), size}):
        if schedule is ScheduleInterleaved1F1B and (4 % p or m % p):
            continue
        pls = lines(p)
        check(run(schedule, pls, m), want)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.__name__)
def test_tensor_parallel_stages(schedule):
    """Two placements of a 2 x 2 mesh's rows (pp = 2 x tp = 2): weights split by columns
    in each stage."""
    want = reference(4)
    mesh = np.arange(4).reshape(2, 2)
    pls = [sm.placement("cpu", [mesh[s].tolist()]) for s in range(2)]
    check(run(schedule, pls, 4, tp=True), want)


@pytest.mark.mpi(min_size=1)
def test_micro_batch_losses_and_their_mean():
    got = run(Schedule1F1B, lines(min(size, 2)), 3)
    x, t = data()
    assert len(got[3]) == 3
    means = [float(loss.item()) for loss in got[3]]
    assert got[0] == pytest.approx(sum(means) / 3, rel=1e-14)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("schedule, bound", [(ScheduleGPipe, "m"), (Schedule1F1B, "p-s")])
def test_activations_held_per_stage(schedule, bound):
    """GPipe holds every micro-batch; 1F1B at most p - s of them on stage s."""
    m = 6
    got = run(schedule, lines(1), m)
    p = len(got[2])
    for s, stage in enumerate(got[2]):
        assert stage.peak_held == (m if bound == "m" else min(p - s, m))


@pytest.mark.mpi(min_size=2)
def test_trace_has_every_stages_intervals():
    pls = lines(2)
    with sm.trace() as t:
        got = run(Schedule1F1B, pls, 3)
    mine = [s.stage_index for s in got[2] if s.is_member]
    kinds = {(iv.kind, iv.stage) for iv in t.intervals}
    for s in mine:
        assert ("forward", s) in kinds and ("backward", s) in kinds
    assert all(iv.stage in mine for iv in t.intervals)
    assert sum(1 for iv in t.intervals if iv.kind == "forward") == 3 * len(mine)
    every = [iv for ivs in comm.allgather(t.intervals) for iv in ivs]
    assert 0.0 <= sm.pipeline.bubble_fraction(every) < 1.0


# ---- argument errors, the same on every rank ----------------------------------------------

def world() -> sm.Placement:
    return sm.placement("cpu", list(range(size)))


@pytest.mark.mpi(min_size=1)
def test_stage_arguments():
    layer = layers([world()])[0]
    other = sm.placement("cpu", [0])
    assert errors_of(lambda: PipelineStage(layer, 2, 2, world()))[0] == "ValueError"
    assert errors_of(lambda: PipelineStage(object(), 0, 1, world()))[0] == "TypeError"
    assert errors_of(lambda: PipelineStage(layer, 0, 1, "cpu"))[0] == "TypeError"
    if size > 1:
        kind, msg = errors_of(lambda: PipelineStage(layer, 0, 1, other))
        assert kind == "ValueError" and "lin.weight" in msg


@pytest.mark.mpi(min_size=1)
def test_schedule_arguments():
    model = layers([world()])
    stages = [PipelineStage(layer, i, 4, world()) for i, layer in enumerate(model)]
    assert errors_of(lambda: ScheduleGPipe(stages[::-1], 2, mse))[0] == "ValueError"
    assert errors_of(lambda: ScheduleGPipe(stages, 0, mse))[0] == "ValueError"
    assert errors_of(lambda: ScheduleGPipe(stages, 2, None))[0] == "TypeError"
    sched = Schedule1F1B(stages, 4, mse)
    x = sm.tensor(np.ones((3, WIDTHS[0])), placement=world(), sbp=B)
    kind, msg = errors_of(lambda: sched.step(x, target=np.ones((3, 3))))
    assert kind == "ValueError" and "3 rows cannot be split into 4" in msg
    kind, msg = errors_of(lambda: sched.step(x, target=np.ones((4, 3))))
    assert kind == "ValueError" and "same batch size" in msg
    assert errors_of(lambda: sched.step(np.ones((4, 5)), target=None))[0] == "ValueError"


@pytest.mark.mpi(min_size=2)
def test_interleaved_needs_stages_round_the_placements():
    pls = lines(2)
    model = layers(pls)
    stages = [PipelineStage(layer, i, 4, layer.lin.weight.placement)
              for i, layer in enumerate(model)]
    kind, msg = errors_of(lambda: ScheduleInterleaved1F1B(stages, 3, mse))
    assert kind == "ValueError" and "multiple of the number of placements 2" in msg
    model = layers([pls[0], pls[0], pls[1], pls[1]])
    stages = [PipelineStage(layer, i, 4, layer.lin.weight.placement)
              for i, layer in enumerate(model)]
    kind, msg = errors_of(lambda: ScheduleInterleaved1F1B(stages, 2, mse))
    assert kind == "ValueError" and "stage 1 must live on placement 1" in msg


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("src_sbp, dst_sbp", [((B,), (B,)), ((S(0),), (S(1),)),
                                              ((S(1),), (B,))])
def test_a_transfer_between_placements_is_posted_then_waited(src_sbp, dst_sbp):
    """runtime.start_redistribute of a point-to-point conversion (two placements): the
    messages are posted (isend/irecv in the trace) and wait() gives the
    shard redistribute gives; ranks outside both get an empty shard."""
    from sbpmpi.runtime import redistribute, start_redistribute

    a, b = lines(2)
    value = np.arange(7 * 5, dtype=np.float64).reshape(7, 5)
    x = sm.tensor(value, placement=a, sbp=src_sbp)
    dst = sm.layout.Layout.make((7, 5), b, dst_sbp)
    with sm.trace() as t:
        pending = start_redistribute(x.to_local(), x.layout, dst, x.dtype)
    posted = comm.allgather(sum(1 for r in t if r.op in ("isend", "irecv")))
    got = pending.wait()  # every rank reaches its wait, whatever the assertions below say
    want = redistribute(x.to_local(), x.layout, dst, x.dtype)
    assert all(posted[r] for r in b.rank_list)  # started there, not waited for
    assert not any(posted[r] for r in range(size) if r not in a and r not in b)
    np.testing.assert_array_equal(got, want)
    y = sm.GlobalTensor(got, dst, x.dtype)
    np.testing.assert_array_equal(y.numpy(), value)


# ---- failed steps, parameter-free stages, forward-only steps, capture ------------------------

class Act(sm.nn.Module):
    """A stage without parameters."""

    def forward(self, x: sm.GlobalTensor) -> sm.GlobalTensor:
        return sm.tanh(x)


def inputs_of(sched, xt: tuple[np.ndarray, np.ndarray]) -> tuple[sm.GlobalTensor, ...]:
    """The batch on the first stage's placement and the target on the last one's."""
    first, last = sched.stages[0].placement, sched.stages[-1].placement
    return (sm.tensor(xt[0], placement=first, sbp=(B,) * first.ndim),
            sm.tensor(xt[1], placement=last, sbp=(B,) * last.ndim))


def grads_of(model: list[sm.nn.Module]) -> list[np.ndarray]:
    return [p.grad.numpy() for mod in model for p in mod.parameters()]


def zero_grads(model: list[sm.nn.Module]) -> None:
    for mod in model:
        for p in mod.parameters():
            p.grad = None


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.__name__)
def test_a_caught_failed_step_leaves_no_transfer_behind(schedule):
    """A ``loss_fn`` given a mis-shaped target raises at the first loss on every rank,
    with transfers between the stages in flight (a placement per rank, 64 wide): caught,
    then a correct step, three times over; each correct step's loss and gradients are
    the unpipelined model's. (The crash of the old code, its transfers left posted on
    freed buffers, shows in a job of its own: test_pipeline_faults.py.)"""
    widths, batch, m = (64, 64, 64, 64, 64), 32, 4
    xt = data(widths, batch)
    want = reference(m, layers([world()], widths=widths), xt)
    # interleaved: the 4 stages round 2 placements at n = 3
    pls = lines(2 if schedule is ScheduleInterleaved1F1B and 4 % size else size)
    model = layers(pls, widths=widths)
    sched, _ = pipeline(schedule, model, pls, m)
    x, t = inputs_of(sched, xt)
    last = sched.stages[-1].placement
    bad = sm.tensor(np.zeros((batch, widths[-1] - 1)), placement=last, sbp=(B,) * last.ndim)
    for _ in range(3):
        kind, msg = errors_of(lambda: sched.step(x, target=bad))
        assert kind == "ValueError" and "cannot be broadcast" in msg, (kind, msg)
        zero_grads(model)
        check((float(sched.step(x, target=t).item()), grads_of(model)), want)


def act_first(placements: list[sm.Placement]) -> list[sm.nn.Module]:
    """A parameter-free first stage (tanh), then three layers 5 -> 7 -> 6 -> 3."""
    return [Act(), *layers(placements[1:] + placements[:1], widths=(5, 7, 6, 3))]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.__name__)
def test_a_first_stage_without_parameters(schedule):
    """Stage 0 is ``tanh`` alone: nothing there needs a gradient, so its backward is
    skipped and no gradient is sent to it; loss and gradients as the unpipelined
    model's, on 1, 2 and ``size`` placements."""
    want = reference(4, act_first([world()]))
    for p in sorted({1, min(size, 2), size}):
        if schedule is ScheduleInterleaved1F1B and 4 % p:
            continue
        pls = lines(p)
        model = act_first(pls)
        sched, _ = pipeline(schedule, model, pls, 4)
        x, t = inputs_of(sched, data())
        check((float(sched.step(x, target=t).item()), grads_of(model)), want)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.__name__)
def test_a_forward_only_step_under_no_grad_and_eval(schedule):
    """``step`` under ``sm.no_grad()`` and ``eval`` run the forwards only: they return
    the last stage's outputs of the whole batch (the unpipelined model's), give each
    micro-batch's loss to ``losses``, and leave every ``.grad`` as it was (None)."""
    x_np, t_np = data()
    bounds = microbatch_bounds(BATCH, 4)
    world_model = layers([world()])
    h = sm.tensor(x_np, placement=world(), sbp=B)
    for layer in world_model:
        h = layer(h)
    want = h.numpy()
    want_losses = [float(((want[a:b] - t_np[a:b]) ** 2).mean()) for a, b in bounds]
    pls = lines(min(size, 2))
    model = layers(pls)
    sched, _ = pipeline(schedule, model, pls, 4)
    x, t = inputs_of(sched, (x_np, t_np))
    for run_eval in (lambda **kw: _no_grad_step(sched, x, **kw),
                     lambda **kw: sched.eval(x, **kw)):
        out = run_eval()
        assert out.shape == want.shape and out.placement == sched.stages[-1].placement
        assert not out.requires_grad
        np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=1e-12)
        losses: list = []
        run_eval(target=t, losses=losses)
        assert [lo.shape for lo in losses] == [()] * 4
        np.testing.assert_allclose([float(lo.item()) for lo in losses], want_losses,
                                   rtol=1e-12)
        assert all(p.grad is None for layer in model for p in layer.parameters())
    # and training still works after them
    check((float(sched.step(x, target=t).item()), grads_of(model)), reference(4))


def _no_grad_step(sched, x, **kw):
    with sm.no_grad():
        return sched.step(x, **kw)


@pytest.mark.mpi(min_size=1)
def test_a_captured_step_breaks_alike_on_every_rank():
    """``sm.graph`` around ``schedule.step``: GraphBreak, the same on every rank, those in
    no stage included (stages on ranks 0 and 1 only), before any transfer; the caller
    falls back to the eager step, which gives the unpipelined model's loss."""
    pls = [sm.placement("cpu", [r]) for r in sorted({0, min(1, size - 1)})]
    model = layers(pls)
    sched, _ = pipeline(Schedule1F1B, model, pls, 4)
    x, t = inputs_of(sched, data())
    step = sm.graph(lambda a, b: sched.step(a, target=b))
    for _ in range(3):
        kind, msg = errors_of(lambda: step(x, t))
        assert kind == "GraphBreak" and "Schedule1F1B.step" in msg, (kind, msg)
        assert "cannot be captured" in msg
    zero_grads(model)
    check((float(sched.step(x, target=t).item()), grads_of(model)), reference(4))
