"""An uncaught exception on one rank while the others wait in a collective.

    mpiexec -n 2 python uncaught.py MODE

MODE ``main``: rank 1 raises ValueError; ``thread``: a worker thread of rank 0 raises
RuntimeError; ``exit``: rank 1 calls sys.exit(3) (run under ``python -m sbpmpi.abort``);
``auto``: like ``main`` but relies on ``import sbpmpi`` to install the hook (prints
NOT-WIRED and exits 0 if it did not); ``late_thread``: a daemon thread of rank 0 raises
while the program ends (inside the abort's quarter-second pause: the job must not exit
0). Without the abort the other ranks would wait in the barrier forever.
"""

from __future__ import annotations

import sys
import threading
import time

from mpi4py import MPI

import sbpmpi
from sbpmpi.comm.lifecycle import abort

mode = sys.argv[1]
world = MPI.COMM_WORLD
rank = world.Get_rank()

if mode == "auto":
    if not abort.installed():
        print("NOT-WIRED: import sbpmpi did not install the abort hook", flush=True)
        sys.exit(0)
elif mode != "exit":
    assert abort.install(), "abort.install() refused under mpiexec with more than one rank"
assert sbpmpi.env.get_world_size() > 1

if mode in ("main", "auto"):
    if rank == 1:
        raise ValueError(f"bad value on rank {rank}")
    world.Barrier()
elif mode == "thread":
    if rank == 0:
        def work() -> None:
            time.sleep(0.2)
            raise RuntimeError("worker thread failed")

        threading.Thread(target=work, name="worker").start()
    else:
        time.sleep(30)  # rank 0 waits in the barrier meanwhile
    world.Barrier()
elif mode == "exit":
    if rank == 1:
        sys.exit(3)
    world.Barrier()
elif mode == "late_thread":
    world.Barrier()
    if rank == 0:  # fails while rank 0 waits at exit for the others, which end soon after
        def late() -> None:
            time.sleep(0.02)
            raise RuntimeError("late failure in a daemon thread")

        threading.Thread(target=late, name="late", daemon=True).start()
    else:
        time.sleep(0.15)
    print(f"rank {rank}: reached the end", flush=True)
    sys.exit(0)
else:
    raise SystemExit(f"unknown mode {mode}")
print(f"rank {rank}: passed the barrier (should not happen)", flush=True)
