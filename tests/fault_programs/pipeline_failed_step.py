"""Steps that raise partway, caught, each followed by a correct step.

    mpiexec -n N python pipeline_failed_step.py [SCHEDULE]

A placement per rank (interleaved: two stages on each), layers ``tanh(x W + b)`` 64 wide,
a batch of 64 rows in 4 micro-batches (interleaved: 2N). The ``loss_fn`` is given a
target one column short: it raises at the first micro-batch's loss, on every rank,
while the earlier stages' activations are on their way. The program catches it and
runs a correct step, twenty times. The transfers the failed step left posted on buffers
it freed used to be written into freed memory (SIGSEGV or "corrupted double-linked
list" at n = 2..4); each correct step's loss must be NumPy's.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import sbpmpi as sm

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
schedule = sys.argv[1] if len(sys.argv) > 1 else "1f1b"
virtual = 2 if schedule == "interleaved" else 1
WIDTH, BATCH, STEPS = 64, 64, 20
M = 2 * size if schedule == "interleaved" else 4
B = sm.sbp.broadcast
placements = [sm.placement("cpu", [r]) for r in range(size)]
nstages = size * virtual


class Layer(sm.nn.Module):
    def __init__(self, pl: sm.Placement) -> None:
        self.lin = sm.nn.Linear(WIDTH, WIDTH, placement=pl, dtype=np.float64)

    def forward(self, x):
        return sm.tanh(self.lin(x))


def mse(y, t):
    d = y - t
    return (d * d).mean()


sm.manual_seed(0)
layers = [Layer(placements[s % size]) for s in range(nstages)]
stages = [sm.pipeline.PipelineStage(m, s, nstages, m.lin.weight.placement)
          for s, m in enumerate(layers)]
cls = {"gpipe": sm.pipeline.ScheduleGPipe, "1f1b": sm.pipeline.Schedule1F1B,
       "interleaved": sm.pipeline.ScheduleInterleaved1F1B}[schedule]
sched = cls(stages, M, mse)
rng = np.random.default_rng(1)
x_np, t_np = rng.normal(size=(BATCH, WIDTH)), rng.normal(size=(BATCH, WIDTH))
x = sm.tensor(x_np, placement=placements[0], sbp=B)
last = stages[-1].placement
t = sm.tensor(t_np, placement=last, sbp=B)
bad = sm.tensor(np.zeros((BATCH, WIDTH - 1)), placement=last, sbp=B)

# NumPy's loss: the mean over the micro-batches of each one's mean squared error
weights = [(m.lin.weight.numpy(), m.lin.bias.numpy()) for m in layers]
want = []
for a, b in sm.pipeline.microbatch_bounds(BATCH, M):
    h = x_np[a:b]
    for w, bias in weights:
        h = np.tanh(h @ w + bias)
    want.append(((h - t_np[a:b]) ** 2).mean())
want_loss = float(np.mean(want))

for k in range(STEPS):
    try:
        sched.step(x, target=bad)
        raise SystemExit(f"rank {rank}: the step with a bad target returned (should not happen)")
    except ValueError as e:
        assert "cannot be broadcast" in str(e), e
    got = float(sched.step(x, target=t).item())
    if abs(got - want_loss) > 1e-12 * abs(want_loss):
        raise SystemExit(f"rank {rank}: step {k}: loss {got!r}, NumPy's {want_loss!r}")
print(f"rank {rank}: {STEPS} correct steps after caught failures, losses as NumPy's",
      flush=True)
