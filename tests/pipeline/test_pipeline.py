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


def layers(placements: list[sm.Placement], tp: bool = False) -> list[Layer]:
    """The four layers, layer i on ``placements[i % len]``, drawn from one seed (the same
    weights wherever they live)."""
    sm.manual_seed(7)
    return [Layer(WIDTHS[i], WIDTHS[i + 1], placements[i % len(placements)], tp)
            for i in range(len(WIDTHS) - 1)]


def mse(y: sm.GlobalTensor, t: sm.GlobalTensor) -> sm.GlobalTensor:
    d = y - t
    return (d * d).mean()


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.normal(size=(BATCH, WIDTHS[0])), rng.normal(size=(BATCH, WIDTHS[-1]))


def reference(m: int) -> tuple[float, list[np.ndarray]]:
    """The unpipelined model on the whole world: the mean of the micro-batches' losses and
    its gradients."""
    world = sm.placement("cpu", list(range(size)))
    model = layers([world])
    x, t = data()
    xs, ts = (sm.tensor(a, placement=world, sbp=B) for a in (x, t))
    total = None
    for a, b in microbatch_bounds(BATCH, m):
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


def run(schedule: type, placements: list[sm.Placement], m: int, tp: bool = False
        ) -> tuple[float, list[np.ndarray], list[PipelineStage], list]:
    model = layers(placements, tp)
    stages = [PipelineStage(layer, i, len(model), layer.lin.weight.placement)
              for i, layer in enumerate(model)]
    sched = schedule(stages, m, mse)
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
