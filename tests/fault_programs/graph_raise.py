"""A rank that raises inside a replay of a captured step (``sm.graph``): the step's
embedding gets an id out of range in the rows of the last rank only, at the third replay,
while the other ranks go on to their next collective.

    mpiexec -n N python graph_raise.py

The job must end in seconds with the cause (the embedding's IndexError on the last rank),
no rank hanging in a collective.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import sbpmpi as sm

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
VOCAB, DIM, ROWS = 7, 4, 3 * size
S, B = sm.sbp.split, sm.sbp.broadcast
pl = sm.placement("cpu", list(range(size)))
sm.manual_seed(0)
table = sm.randn(VOCAB, DIM, placement=pl, sbp=B, dtype=np.float64, requires_grad=True)
head = sm.randn(DIM, VOCAB, placement=pl, sbp=B, dtype=np.float64, requires_grad=True)
opt = sm.optim.SGD([table, head], lr=0.1)


@sm.graph
def step(ids_host, labels_host):
    opt.zero_grad()
    ids = sm.tensor(ids_host, placement=pl, sbp=S(0))
    labels = sm.tensor(labels_host, placement=pl, sbp=S(0))
    loss = sm.nn.cross_entropy(sm.matmul(sm.nn.embedding(ids, table), head), labels)
    loss.backward()
    opt.step()
    return loss


rng = np.random.default_rng(1)
labels = rng.integers(0, VOCAB, ROWS)
for call in range(6):
    ids = rng.integers(0, VOCAB, ROWS)
    if call == 4:  # the third replay: the last row (the last rank's) out of range
        ids[-1] = 99
    print(f"rank {rank}: call {call}: loss {float(step(ids, labels).numpy()):.6f}", flush=True)
print(f"rank {rank}: should not happen: every call returned", flush=True)
