"""A rank that raises inside backward while ZeRO stage 3 prefetches a layer's parameters.

    mpiexec -n N python zero_raise.py

A three-layer MLP under ``sm.nn.shard(..., stage=3)``: when backward reaches the last
layer it gathers that layer's parameters again and starts the all-gather of the layer
before (a non-blocking call); then the ``relu`` backward rule raises on rank 1 only. The
job must end at once with the cause (the abort hook), no rank hanging in the next
collective.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.autograd import engine

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
pl = sm.placement("cpu", list(range(size)))
S = sm.sbp.split


class MLP(sm.nn.Module):
    def __init__(self) -> None:
        self.l1 = sm.nn.Linear(6, 5, placement=pl, dtype=np.float64)
        self.l2 = sm.nn.Linear(5, 4, placement=pl, dtype=np.float64)
        self.l3 = sm.nn.Linear(4, 3, placement=pl, dtype=np.float64)

    def forward(self, x):
        return self.l3(sm.nn.relu(self.l2(sm.nn.relu(self.l1(x)))))


def failing_relu(node, gy):
    raise RuntimeError(f"relu rule failed on rank {rank}")


net = MLP()
model, opt = sm.nn.shard(net, sm.optim.Adam(net.parameters()), stage=3)
x = sm.tensor(np.ones((2 * size, 6)), placement=pl, sbp=S(0))
y = np.zeros(2 * size, dtype=np.int64)
opt.zero_grad()
sm.nn.cross_entropy(model(x), y).backward()  # a first step shows the layers' order
opt.step()
loss = sm.nn.cross_entropy(model(x), y)
if rank == 1:
    rule_for = engine.rule_for  # the engine's lookup of a node's rule, made to fail for relu
    engine.rule_for = lambda name: failing_relu if name == "relu" else rule_for(name)
with sm.trace() as t:
    try:
        loss.backward()
    except RuntimeError:
        if any(r.nonblocking for r in t):
            print(f"rank {rank}: prefetch started before the failure", flush=True)
        raise
print(f"rank {rank}: backward finished (should not happen)", flush=True)
