"""Ranks that disagree on a collective step.

    mpiexec -n 2 python mismatch.py MODE

``ops``: rank 0 adds, the others multiply (checked with consistency.check_collective
before the op); ``shapes``: to_global from local shards that cannot form one tensor
(checked by to_global's own shape exchange); ``to_global``: ranks convert the same
tensor to different SBPs (caught by the check the lead wires into boxing; prints
NOT-WIRED and exits 0 while it is not wired). Every rank raises the same error; the
abort hook ends the job.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.comm.lifecycle import abort
from sbpmpi.runtime import consistency

mode = sys.argv[1]
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
abort.install(force=True)
pl = sm.placement("cpu", list(range(size)))

if mode == "ops":
    x = sm.tensor(np.ones((4, 3)), placement=pl, sbp=sm.sbp.split(0))
    op = "add" if rank == 0 else "mul"
    consistency.check_collective(op, (x, x))
    print(f"rank {rank}: {op} passed the check (should not happen)", flush=True)
elif mode == "shapes":
    local = np.zeros((2, 3 + (rank == size - 1)))
    sm.to_global(local, placement=pl, sbp=sm.sbp.split(0))
    print(f"rank {rank}: to_global passed (should not happen)", flush=True)
elif mode == "to_global":
    x = sm.tensor(np.arange(12.0).reshape(4, 3), placement=pl, sbp=sm.sbp.split(0))
    before = consistency.stats()["checks"]
    x.to_global(sbp=sm.sbp.broadcast)
    if consistency.stats()["checks"] == before:
        print("NOT-WIRED: x.to_global does not call consistency.check_collective", flush=True)
        sys.exit(0)
    x.to_global(sbp=sm.sbp.broadcast if rank == 0 else sm.sbp.split(1))
    print(f"rank {rank}: to_global passed (should not happen)", flush=True)
else:
    raise SystemExit(f"unknown mode {mode}")
