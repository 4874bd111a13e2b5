"""A rank that raises inside a pipeline stage's forward or backward, with transfers
between the stages in flight.

    mpiexec -n N python pipeline_raise.py forward|backward [SCHEDULE]

N stages, one per rank, 4 micro-batches (interleaved: 2N) (``SCHEDULE``: gpipe, 1f1b or interleaved with
two stages per rank). ``forward``: the last stage's forward raises on its rank (the last)
at micro-batch 2, while the earlier stages' activations of micro-batches 2 and 3 are on
their way. ``backward``: the first stage's ``tanh`` backward rule raises on rank 0, while
later stages' gradients are on their way. The job must end in seconds with the cause,
no rank hanging in a wait.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.autograd import engine

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
where = sys.argv[1]
schedule = sys.argv[2] if len(sys.argv) > 2 else "1f1b"
virtual = 2 if schedule == "interleaved" else 1
B = sm.sbp.broadcast
M = 2 * size if schedule == "interleaved" else 4  # a multiple of the placements
placements = [sm.placement("cpu", [r]) for r in range(size)]
nstages = size * virtual
fail_rank = size - 1 if where == "forward" else 0


class Layer(sm.nn.Module):
    def __init__(self, pl: sm.Placement, fails: bool) -> None:
        self.lin = sm.nn.Linear(6, 6, placement=pl, dtype=np.float64)
        self.fails, self.calls = fails, 0

    def forward(self, x):
        if self.fails and sm.comm.trace.ACTIVE:  # in the traced (second) step
            self.calls += 1
        if self.fails and rank == fail_rank and self.calls == 3:
            t = sm.comm.trace.ACTIVE[0]
            started = sum(1 for r in t if r.op in ("isend", "irecv"))
            print(f"rank {rank}: {started} messages started before the failure", flush=True)
            raise RuntimeError(f"stage forward failed on rank {rank}")
        return sm.tanh(self.lin(x))


def failing_tanh(node, gy):
    t = sm.comm.trace.ACTIVE[0]
    started = sum(1 for r in t if r.op in ("isend", "irecv"))
    print(f"rank {rank}: {started} messages started before the failure", flush=True)
    raise RuntimeError(f"stage backward failed on rank {rank}")


layers = [Layer(placements[s % size], where == "forward" and s == nstages - 1)
          for s in range(nstages)]
stages = [sm.pipeline.PipelineStage(m, s, nstages, m.lin.weight.placement)
          for s, m in enumerate(layers)]
cls = {"gpipe": sm.pipeline.ScheduleGPipe, "1f1b": sm.pipeline.Schedule1F1B,
       "interleaved": sm.pipeline.ScheduleInterleaved1F1B}[schedule]
sched = cls(stages, M, lambda y, t: (y * y).mean())
x = sm.tensor(np.ones((8, 6)), placement=placements[0], sbp=B)
sched.step(x)  # a first step: every conversion planned and agreed
if where == "backward" and rank == 0:
    rule_for = engine.rule_for  # the engine's lookup of a node's rule, made to fail for tanh
    engine.rule_for = lambda name: failing_tanh if name == "tanh" else rule_for(name)
with sm.trace():
    sched.step(x)
print(f"rank {rank}: step finished (should not happen)", flush=True)
