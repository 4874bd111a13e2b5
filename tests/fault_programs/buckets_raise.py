"""A rank that raises inside backward while gradient buckets are in flight.

    mpiexec -n N python buckets_raise.py [STEP]

A DataParallel MLP with small buckets: the bucket of the last layer starts when its
gradients are made; then the ``relu`` backward rule raises on rank 1 only. Rank 1 must
complete the bucket already started before the error propagates (it prints whether a
request is left in flight); the other ranks must not hang in the next bucket: under the
abort hook the job ends at once, with it off the exit-time agreement makes every rank
raise with the cause. With ``STEP`` > 1 the rule fails in that backward: the buckets'
layout was agreed in the first, so no bucket start exchanges anything; the ranks waiting
on the bucket rank 1 never starts are ended by the exit watch instead.
"""

from __future__ import annotations

import sys

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
        self.l2 = sm.nn.Linear(5, 3, placement=pl, dtype=np.float64)

    def forward(self, x):
        return self.l2(sm.nn.relu(self.l1(x)))


def failing_relu(node, gy):
    raise RuntimeError(f"relu rule failed on rank {rank}")


fail_at = int(sys.argv[1]) if len(sys.argv) > 1 else 1
dp = sm.nn.DataParallel(MLP(), bucket_cap_mb=1e-4, first_bucket_mb=1e-4)
x = sm.tensor(np.ones((2 * size, 6)), placement=pl, sbp=S(0))
for _ in range(fail_at - 1):
    sm.nn.cross_entropy(dp(x), np.zeros(2 * size, dtype=np.int64)).backward()
loss = sm.nn.cross_entropy(dp(x), np.zeros(2 * size, dtype=np.int64))
if rank == 1:
    rule_for = engine.rule_for  # the engine's lookup of a node's rule, made to fail for relu
    engine.rule_for = lambda name: failing_relu if name == "relu" else rule_for(name)
with sm.trace() as t:
    try:
        loss.backward()
    except RuntimeError:
        if any(r.nonblocking for r in t):
            print(f"rank {rank}: bucket started before the failure", flush=True)
        if not dp.reducer.in_flight:
            print(f"rank {rank}: no request left in flight", flush=True)
        raise
print(f"rank {rank}: backward finished (should not happen)", flush=True)
