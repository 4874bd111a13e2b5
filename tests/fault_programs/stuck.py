"""A rank stuck in a collective that a peer never joins: the watchdog ends the job.

    SBPMPI_TIMEOUT=1 mpiexec -n 2 python stuck.py MODE

``direct``: rank 0 waits in a barrier wrapped in watchdog.watch; ``comm``: rank 0 waits
in sm.comm.barrier (the watch is wired into sbpmpi.comm; prints NOT-WIRED and exits 0
if the barrier just completes once the late rank arrives). The late rank sleeps
``LATE`` seconds (argument 2, default 30) before joining.
"""

from __future__ import annotations

import sys
import time

from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.comm.lifecycle import abort, watchdog

mode = sys.argv[1]
late = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
abort.install(force=True)
assert watchdog.timeout() is not None, "run with SBPMPI_TIMEOUT set"

if rank == size - 1:
    time.sleep(late)
if mode == "direct":
    with watchdog.watch("barrier", peers=range(size)):
        world.Barrier()
elif mode == "comm":
    sm.comm.barrier()
    if rank == 0:
        print("NOT-WIRED: sm.comm.barrier is not watched", flush=True)
    sys.exit(0)
else:
    raise SystemExit(f"unknown mode {mode}")
print(f"rank {rank}: passed the barrier (should not happen)", flush=True)
