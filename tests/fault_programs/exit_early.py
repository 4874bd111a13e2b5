"""Ranks that reach the end of the program while a peer waits in a collective.

    mpiexec -n N python exit_early.py MODE

``numpy``: ``if rank == 0: print(x.numpy())`` (rank 0 alone in the gather);
``sys_exit``: rank N-1 calls ``sys.exit(0)`` early while the others call ``x.to_global``;
``abort_off``: as ``numpy`` with the abort hook off (SBPMPI_ABORT_ON_ERROR=0);
``caught``: rank 0 catches the error and prints it; ``comm``: rank 0 alone in
``sm.comm.all_reduce`` (met by the watchdog's exit watch); ``ok``: every rank does the same thing
and the job must end normally (exit 0) after the exit-time handshake.
Default settings otherwise: no SBPMPI_TIMEOUT. Every rank must end with the same cause.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.errors import CollectiveMismatchError

mode = sys.argv[1]
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
pl = sm.placement("cpu", list(range(size)))
x = sm.tensor(np.arange(4.0 * size), placement=pl, sbp=sm.sbp.split(0))
y = (x * 2).sum()  # some collective work first, on every rank

if mode in ("numpy", "abort_off"):
    if rank == 0:
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
else:
    raise SystemExit(f"unknown mode {mode}")
