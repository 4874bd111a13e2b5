"""Ranks that reach the end of the program while a peer waits in a collective.

    mpiexec -n N python exit_early.py MODE

``numpy``: ``if rank == 0: print(x.numpy())`` (rank 0 alone in the gather);
``sys_exit``: rank N-1 calls ``sys.exit(0)`` early while the others call ``x.to_global``;
``abort_off``: as ``numpy`` with the abort hook off (SBPMPI_ABORT_ON_ERROR=0);
``caught``: rank 0 catches the error and prints it; ``comm``: rank 0 alone in
``sm.comm.all_reduce`` (met by the watchdog's exit watch); ``ok``: every rank does the same thing
and the job must end normally (exit 0) after the exit-time handshake. ``ok_late`` and
``numpy_late``: as ``ok`` and ``numpy``, rank 0 first progresses MPI for half a second
(polling an unrelated probe), so that the others' notices have arrived before it looks
for them (a receive posted after its message arrived is what MPICH's UCX layer never
completed for MPI_ANY_SOURCE).
Default settings otherwise: no SBPMPI_TIMEOUT. Every rank must end with the same cause.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.errors import CollectiveMismatchError

mode = sys.argv[1]
late = mode.endswith("_late")
mode = mode.removesuffix("_late")
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
pl = sm.placement("cpu", list(range(size)))
x = sm.tensor(np.arange(4.0 * size), placement=pl, sbp=sm.sbp.split(0))
y = (x * 2).sum()  # some collective work first, on every rank


def busy_in_mpi() -> None:
    """``*_late`` modes, rank 0: progress MPI for half a second while the others' notices
    arrive (taken off the network into MPI's queue of unexpected messages)."""
    if late and rank == 0:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.5:
            MPI.COMM_WORLD.Iprobe(source=0, tag=999)


if mode in ("numpy", "abort_off"):
    if rank == 0:
        busy_in_mpi()
        print(x.numpy())
        print(f"rank {rank}: gathered alone (should not happen)", flush=True)
elif mode == "sys_exit":
    if rank == size - 1:
        sys.exit(0)
    x.to_global(sbp=sm.sbp.broadcast)
    print(f"rank {rank}: converted without rank {size - 1} (should not happen)", flush=True)
elif mode == "caught":
    if rank == 0:
        try:
            x.numpy()
        except CollectiveMismatchError as e:
            print(f"rank 0 caught: {e}", flush=True)
elif mode == "comm":  # a raw sm.comm collective on one rank: the exit watch meets it
    if rank == 0:
        sm.comm.all_reduce(np.ones(3), group=None)
        print(f"rank {rank}: reduced alone (should not happen)", flush=True)
elif mode == "ok":
    assert float(y.numpy()) == float(np.arange(4.0 * size).sum() * 2)
    print(f"rank {rank}: ok", flush=True)
    busy_in_mpi()
else:
    raise SystemExit(f"unknown mode {mode}")
